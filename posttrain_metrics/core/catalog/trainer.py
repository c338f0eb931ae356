"""Trainer keys: gradient norm, learning rate, step time and the optimizer outcome keys."""

from __future__ import annotations

from ..adapter import Metric, MetricAdapter
from ..reduction import Reduction as R

__all__ = ["OUTCOMES", "SKIP_REASONS", "TRAINER"]

OUTCOMES = ("accumulating", "applied", "skipped", "discarded")
SKIP_REASONS = ("nonfinite_loss", "nonfinite_gradient")


def _optim(leaf: str, meaning: str, **kw: object) -> Metric:
    """An exact optimizer counter or flag: identical on every data-parallel rank by construction."""
    return Metric(leaf, R.AGREED, meaning, namespace="optim", **kw)  # type: ignore[arg-type]


TRAINER = MetricAdapter(
    "trainer",
    phases=("train",),
    metrics=[
        Metric("grad_norm", R.LAST, "Total gradient norm before clipping, of the window's last update", headline=True),
        Metric("learning_rate", R.MEAN, "Learning rate the applied update used"),
        Metric("e2e_step_s", R.MEAN, "Wall time for one collected batch, end to end", namespace="timer", unit="s"),
        Metric("update_outcome", R.CATEGORICAL, "What the optimizer did with this window", namespace="optim", labels=OUTCOMES, headline=True),
        Metric("skip_reason", R.CATEGORICAL, "Why an update was skipped", namespace="optim", labels=SKIP_REASONS),
        _optim("step_skipped", "Whether this attempt skipped"),
        _optim("attempt_id", "Monotonic id of the update attempt", count=True),
        _optim("optimizer_step", "Optimizer steps committed so far", unit="steps", count=True),
        _optim("nonfinite_skips_total", "Updates rejected for a non-finite loss or gradient, cumulative", count=True),
        _optim("nonfinite_skips_consecutive", "Non-finite rejections in a row", count=True),
        _optim("zero_grad_skips_total", "Updates skipped because the gradient was exactly zero (expected in GRPO)", count=True),
        _optim("finite_gradient_check_enabled", "Whether force_finite_grads is on"),
    ],
)
