"""How a metric composes across the chunks of an optimizer window and across data-parallel ranks."""

from __future__ import annotations

import enum

__all__ = ["Reduction", "RunAggregate"]


class Reduction(enum.Enum):
    """The closed set of aggregation rules. Each member's docstring is its specification.

    Chunks are the gradient-accumulation micro-batches of one optimizer window on one rank; ranks are
    the data-parallel processes. Every rule except ``LAST``, ``AGREED`` and ``CATEGORICAL`` (which
    read each rank's last chunk) is invariant to how the contributions are partitioned into chunks
    and ranks, and so is the all-or-nothing family check (judged over every chunk of every rank).
    """

    WEIGHTED_MEAN = "weighted_mean"
    """``sum(value * weight) / sum(weight)`` over every chunk of every rank, the weight being another
    key of the same adapter reported in the same chunk. Total weight 0 gives ``0.0`` (the weight key
    then reads 0: that is how a reader tells "no data" from "zero"). A zero-weight contribution adds
    nothing, so a NaN placeholder with zero weight cannot poison the figure."""

    SUM = "sum"
    """Sum over every chunk of every rank. Integer (and bool) inputs come back as ``int``."""

    MAX = "max"
    """Maximum over every chunk of every rank, never a mean of maxima. Integer inputs come back as
    ``int``, bools as ``bool``. A NaN contribution makes the result NaN. When the metric declares a
    count (``weight=``, the family's count such as ``rollout_count``), a contribution whose count is
    0 holds no sample and so no extremum: its placeholder is ignored, exactly as a zero weight drops
    out of a weighted mean; if no contribution counted anything the key is absent."""

    MIN = "min"
    """Minimum over every chunk of every rank; types and counts as for ``MAX``."""

    MEAN = "mean"
    """Plain arithmetic mean over all chunk contributions of all ranks."""

    LAST = "last"
    """The last chunk of the window that carried the key on each rank, then the mean across ranks
    (ranks hold the same value for a global gradient norm or a learning rate, up to rounding). When
    every rank holds the same value it comes back exactly, with its type (``int``, ``bool``). A NaN
    in an earlier chunk is superseded by the later chunk's value, as any earlier value is."""

    AGREED = "agreed"
    """An exact counter or flag that every data-parallel rank holds identically by construction
    (optimizer steps, attempt ids, skip counters, phase flags): the last chunk that carried it on
    each rank, and every rank must report the same value. A disagreement is a desynchronised run and
    a ``MetricsError`` on every rank, never an average. Comes back with its type (a flag passed as a
    ``bool`` stays ``bool``, one passed as ``0``/``1`` stays ``int``)."""

    POOLED_STD = "pooled_std"
    """Population standard deviation of the union of all contributions, from each contribution's
    mean (a declared key), std (this key) and count (a declared key, or 1 per contribution when the
    metric declares none): ``sqrt(sum(n*(s^2 + m^2)) / N - (sum(n*m) / N)^2)``. When the metric
    declares a second moment too (``second_moment=``, NFT's optimality weights), each contribution
    that reports it has ``s^2 + m^2`` equal to that second moment, so the published std always agrees
    with the published moments: ``std^2 = E[x^2] - E[x]^2`` over the same contributions, whatever
    std convention the producer used (its reported std is then not used, only refused if negative;
    a chunk that reports both moments and no std contributes them all the same)."""

    CATEGORICAL = "categorical"
    """A label from a declared set (an update's outcome): the last chunk's label on each rank; ranks
    must agree, and disagreement is a ``MetricsError`` on every rank."""

    @property
    def partition_invariant(self) -> bool:
        """Whether the result is independent of how contributions are split into chunks and ranks."""
        return self not in (Reduction.LAST, Reduction.AGREED, Reduction.CATEGORICAL)


class RunAggregate(enum.Enum):
    """What an exact counter or flag (an ``AGREED`` key) reads as over a whole run (``run/<key>`` in
    every tracker). Its value per window means different things, so the catalogue declares which:
    the last value of a flag says nothing about the run ("no step was skipped" after seven skips)."""

    LAST = "last"
    """A running counter or a setting (``optimizer_step``, ``attempt_id``, ``nonfinite_skips_total``,
    ``finite_gradient_check_enabled``): its last value is already the run's figure."""

    WINDOWS = "windows"
    """A per-window flag (``step_skipped``, ``actor_warmup``): the number of windows where it held
    (a true or nonzero value; a NaN holds nothing)."""

    TOTAL = "total"
    """A per-window count of the window's own events (``updates_skipped``): the sum over the run's
    windows."""

    MAX = "max"
    """A running streak that resets (``nonfinite_skips_consecutive``): the longest it got; the last
    value reads 0 once the streak ended."""
