"""NFT: plain means (the reference: reduction MEAN, not TOKEN_SUM), the shared ``weight_sum``, and
``optimality_std`` derived from the two moments published beside it, so that over the whole window
and every rank ``optimality_std**2 == optimality_second_moment - optimality_mean**2`` (a mean of
per-chunk stds would publish 0.0 for two ranks with weights {1, 1} and {3, 3}; the answer is 1.0)."""

from __future__ import annotations

from ..adapter import Metric, MetricAdapter
from ..reduction import Reduction as R
from .shared import loss_avg, weight_sum

__all__ = ["NFT"]


def _m(leaf: str, meaning: str, **kw: object) -> Metric:
    return Metric(leaf, R.MEAN, meaning, **kw)  # type: ignore[arg-type]


NFT = MetricAdapter(
    "nft",
    internal_prefix="nft_",
    phases=("train",),
    metrics=[
        loss_avg("nft_", R.MEAN),
        weight_sum,
        _m("policy_loss", "Policy component of the NFT loss"),
        _m("kl_loss", "KL component of the NFT loss"),
        _m("advantage_mean", "Mean advantage"),
        _m("optimality_mean", "First moment of the optimality ratio"),
        _m("optimality_second_moment", "Second moment of the optimality ratio"),
        Metric("optimality_std", R.POOLED_STD, "Standard deviation of the optimality weights over the window "
               "and every rank, from the published moments", mean="optimality_mean",
               second_moment="optimality_second_moment"),
        _m("positive_error", "Error on the positive branch"),
        _m("negative_error", "Error on the negative branch"),
        _m("reward_mean", "Mean reward", headline=True),
    ],
)
