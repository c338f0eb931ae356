"""Trainer keys: gradient norm, learning rate, step time and the optimizer outcome keys.

A window (one published step) can hold several optimizer updates (``n_mini > 1``): the categorical
``optim/update_outcome`` keeps the last update's label, and ``optim/updates_<outcome>`` count the
window's updates by outcome, so a window that applied one update and skipped the next reads
``applied 1, skipped 1``, not ``SKIPPED``.

Why those counts are ``AGREED`` and not ``SUM``: every data-parallel rank takes the same decision on
the same all-reduced gradient, so every rank sees the same updates. A ``SUM`` over ranks would
count each update once per rank (world size times too many). The trainer already counts its updates
exactly (``optimizer_step`` is such a counter); it reports the window's count so far on the chunk
that ends each update (or once, on the window's last chunk), the window's last report is its count,
and ranks that disagree are desynchronised: a ``MetricsError`` on every rank, like ``optimizer_step``.

Each counter and flag declares its run aggregate (``run/<key>``, :class:`RunAggregate`): the last
value of a running counter or a setting (``optimizer_step``, ``attempt_id``, the ``*_total`` skip
counters, ``finite_gradient_check_enabled``), the number of windows where a per-window flag held
(``step_skipped``), the longest streak of ``nonfinite_skips_consecutive``, and the run's total of a
window's own count (``updates_skipped``).
"""

from __future__ import annotations

from ..adapter import Metric, MetricAdapter
from ..reduction import Reduction as R
from ..reduction import RunAggregate as Run

__all__ = ["COUNTED_OUTCOMES", "OUTCOMES", "SKIP_REASONS", "TRAINER", "update_count_leaf"]

OUTCOMES = ("accumulating", "applied", "skipped", "discarded")
SKIP_REASONS = ("nonfinite_loss", "nonfinite_gradient")
COUNTED_OUTCOMES = ("applied", "skipped", "discarded")
"""The outcomes of an update (``accumulating`` is a chunk mid-window, not an update)."""


def update_count_leaf(outcome: str) -> str:
    """The leaf that counts a window's updates with ``outcome``: ``updates_skipped``."""
    return f"updates_{outcome}"


def _optim(leaf: str, run: Run, meaning: str, **kw: object) -> Metric:
    """An exact optimizer counter or flag: identical on every data-parallel rank by construction,
    with its run aggregate."""
    return Metric(leaf, R.AGREED, meaning, namespace="optim", run=run, **kw)  # type: ignore[arg-type]


TRAINER = MetricAdapter(
    "trainer",
    phases=("train",),
    metrics=[
        Metric("grad_norm", R.LAST, "Total gradient norm before clipping, of the window's last update", headline=True),
        Metric("learning_rate", R.MEAN, "Learning rate the applied update used"),
        Metric("e2e_step_s", R.MEAN, "Wall time for one collected batch, end to end", namespace="timer", unit="s"),
        Metric("update_outcome", R.CATEGORICAL, "What the optimizer did with this window", namespace="optim", labels=OUTCOMES, headline=True),
        Metric("skip_reason", R.CATEGORICAL, "Why an update was skipped", namespace="optim", labels=SKIP_REASONS),
        _optim("step_skipped", Run.WINDOWS, "Whether this attempt skipped"),
        _optim("attempt_id", Run.LAST, "Monotonic id of the update attempt", count=True),
        _optim("optimizer_step", Run.LAST, "Optimizer steps committed so far", unit="steps", count=True),
        _optim("nonfinite_skips_total", Run.LAST, "Updates rejected for a non-finite loss or gradient, cumulative", count=True),
        _optim("nonfinite_skips_consecutive", Run.MAX, "Non-finite rejections in a row", count=True),
        _optim("zero_grad_skips_total", Run.LAST, "Updates skipped because the gradient was exactly zero (expected in GRPO)", count=True),
        _optim("finite_gradient_check_enabled", Run.LAST, "Whether force_finite_grads is on"),
        _optim(update_count_leaf("applied"), Run.TOTAL, "Updates of this window the optimizer applied (the window's count, "
               "reported so far on each update's last chunk)", unit="updates", count=True),
        _optim(update_count_leaf("skipped"), Run.TOTAL, "Updates of this window that were skipped (zero or non-finite "
               "gradient, non-finite loss)", unit="updates", count=True),
        _optim(update_count_leaf("discarded"), Run.TOTAL, "Updates of this window dropped by the poisoned-window countdown",
               unit="updates", count=True),
    ],
)
