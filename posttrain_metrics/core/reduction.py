"""How a metric composes across the chunks of an optimizer window and across data-parallel ranks."""

from __future__ import annotations

import enum

__all__ = ["Reduction"]


class Reduction(enum.Enum):
    """The closed set of aggregation rules. Each member's docstring is its specification.

    Chunks are the gradient-accumulation micro-batches of one optimizer window on one rank; ranks are
    the data-parallel processes. Every rule except ``LAST`` and ``CATEGORICAL`` is invariant to how
    the contributions are partitioned into chunks and ranks.
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
    ``int``, bools as ``bool``. A NaN contribution makes the result NaN."""

    MIN = "min"
    """Minimum over every chunk of every rank; types as for ``MAX``."""

    MEAN = "mean"
    """Plain arithmetic mean over all chunk contributions of all ranks."""

    LAST = "last"
    """The last chunk of the window on each rank, then the mean across ranks (ranks hold the same
    value for a global gradient norm or a learning rate). When every rank holds the same value it
    comes back exactly, with its type (``int`` counter, ``bool`` flag)."""

    POOLED_STD = "pooled_std"
    """Population standard deviation of the union of all contributions, from each contribution's
    mean (a declared key), std (this key) and count (a declared key, or 1 per contribution when the
    metric declares none): ``sqrt(sum(n*(s^2 + m^2)) / N - (sum(n*m) / N)^2)``."""

    CATEGORICAL = "categorical"
    """A label from a declared set (an update's outcome): the last chunk's label on each rank; ranks
    must agree, and disagreement is a ``MetricsError`` on every rank."""

    @property
    def partition_invariant(self) -> bool:
        """Whether the result is independent of how contributions are split into chunks and ranks."""
        return self not in (Reduction.LAST, Reduction.CATEGORICAL)
