"""Keys several objective adapters share (the reference's "Shared across algorithms")."""

from __future__ import annotations

from ..adapter import Metric
from ..reduction import Reduction as R

__all__ = ["loss_avg", "token_counts", "weight_sum"]


def loss_avg(prefix: str, reduction: R, weight: str | None = None) -> Metric:
    """``train/loss_avg``, published from the source ``<prefix>loss``."""
    return Metric(
        "loss_avg",
        reduction,
        "The objective's reduced loss over the window",
        weight=weight,
        headline=True,
        source=f"{prefix}loss",
    )


weight_sum = Metric(
    "weight_sum", R.SUM, "DP-global count of valid units the objective normalised its loss by", count=True
)

token_counts = (
    Metric("valid_sequence_count", R.SUM, "Sequences that carried learnable signal", unit="sequences", count=True),
    Metric("valid_token_count", R.SUM, "Completion tokens that carried learnable signal", unit="tokens", count=True),
)
