"""DPO: published under train/ and val/; all keys are plain means (none is weighted)."""

from __future__ import annotations

from ..adapter import Metric, MetricAdapter
from ..reduction import Reduction as R
from .shared import loss_avg

__all__ = ["DPO"]


def _m(leaf: str, meaning: str, **kw: object) -> Metric:
    return Metric(leaf, R.MEAN, meaning, **kw)  # type: ignore[arg-type]


DPO = MetricAdapter(
    "dpo",
    internal_prefix="dpo_",
    phases=("train", "val"),
    ignored=("dpo_weight_sum",),
    metrics=[
        loss_avg("dpo_", R.MEAN),
        _m("dpo_reward_margin", "Implicit reward gap between winner and loser"),
        _m("dpo_reward_winner", "Implicit reward of the preferred sample"),
        _m("dpo_reward_loser", "Implicit reward of the rejected sample"),
        _m("dpo_accuracy", "Fraction of pairs the policy ranks correctly (starts near 0.5)", unit="fraction", headline=True),
        _m("dpo_err_pol_w", "Policy denoising error on the winner"),
        _m("dpo_err_ref_w", "Reference denoising error on the winner"),
        _m("dpo_err_pol_l", "Policy denoising error on the loser"),
        _m("dpo_err_ref_l", "Reference denoising error on the loser"),
        _m("dpo_raw_model_loss", "Policy loss before the preference combination"),
        _m("dpo_raw_ref_loss", "Reference loss before the preference combination"),
    ],
)
