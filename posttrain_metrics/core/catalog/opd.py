"""On-policy distillation: the direct same-token form and the advantage form."""

from __future__ import annotations

from ..adapter import Metric, MetricAdapter
from ..reduction import Reduction as R
from .shared import loss_avg, token_counts, weight_sum

__all__ = ["OPD_ADVANTAGE", "OPD_DIRECT"]


def _tok(leaf: str, meaning: str) -> Metric:
    return Metric(leaf, R.WEIGHTED_MEAN, meaning, weight="valid_token_count")


_COMMON = (
    loss_avg("opd_", R.WEIGHTED_MEAN, weight="weight_sum"),
    weight_sum,
    *token_counts,
    _tok("opd_divergence", "Policy-teacher divergence per token"),
)

OPD_DIRECT = MetricAdapter("opd_direct", internal_prefix="opd_", phases=("train",), metrics=_COMMON)

OPD_ADVANTAGE = MetricAdapter(
    "opd_advantage",
    internal_prefix="opd_",
    phases=("train",),
    metrics=[
        *_COMMON,
        _tok("opd_advantage", "Advantage term per token"),
        _tok("opd_teacher_credit", "Teacher-supplied credit per token"),
    ],
)
