"""Held-out rollout reward (val/ only).

The reference gives these no weight key, so the mean is a plain mean over contributions and the std
is pooled with one unit of count per contribution (the honest pooled figure for equal-sized
contributions, unlike a mean of stds).
"""

from __future__ import annotations

from ..adapter import Metric, MetricAdapter
from ..reduction import Reduction as R

__all__ = ["VALIDATION"]

VALIDATION = MetricAdapter(
    "validation",
    phases=("val",),
    metrics=[
        Metric("reward_avg", R.MEAN, "Held-out rollout reward", headline=True),
        Metric("reward_std", R.POOLED_STD, "Std of the held-out rollout reward, pooled", mean="reward_avg"),
    ],
)
