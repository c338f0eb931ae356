"""Flow-matching behaviour cloning (GR00T-style): train/ and val/."""

from __future__ import annotations

from ..adapter import Metric, MetricAdapter
from ..reduction import Reduction as R
from .shared import loss_avg

__all__ = ["FLOW_BC"]

FLOW_BC = MetricAdapter(
    "flow_bc",
    internal_prefix="flow_bc_",
    phases=("train", "val"),
    ignored=("flow_bc_weight_sum",),
    metrics=[
        loss_avg("flow_bc_", R.MEAN),
        Metric("flow_bc_masked_elements", R.SUM, "Supervised action elements (sum of action_mask)", unit="elements", count=True),
    ],
)
