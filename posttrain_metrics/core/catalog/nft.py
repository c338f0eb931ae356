"""NFT: every key is a plain mean (the reference: reduction MEAN, not TOKEN_SUM)."""

from __future__ import annotations

from ..adapter import Metric, MetricAdapter
from ..reduction import Reduction as R
from .shared import loss_avg

__all__ = ["NFT"]


def _m(leaf: str, meaning: str, **kw: object) -> Metric:
    return Metric(leaf, R.MEAN, meaning, **kw)  # type: ignore[arg-type]


NFT = MetricAdapter(
    "nft",
    internal_prefix="nft_",
    phases=("train",),
    metrics=[
        loss_avg("nft_", R.MEAN),
        _m("policy_loss", "Policy component of the NFT loss"),
        _m("kl_loss", "KL component of the NFT loss"),
        _m("advantage_mean", "Mean advantage"),
        _m("optimality_mean", "First moment of the optimality ratio"),
        _m("optimality_second_moment", "Second moment of the optimality ratio"),
        _m("optimality_std", "Standard deviation of the optimality weights"),
        _m("positive_error", "Error on the positive branch"),
        _m("negative_error", "Error on the negative branch"),
        _m("reward_mean", "Mean reward", headline=True),
    ],
)
