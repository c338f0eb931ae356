"""The GRPO reward and grouping report (bare leaves, no internal prefix)."""

from __future__ import annotations

from ..adapter import Metric, MetricAdapter
from ..reduction import Reduction as R

__all__ = ["REWARD"]

N = "rollout_count"


def _groups(leaf: str, meaning: str, **kw: object) -> Metric:
    return Metric(leaf, R.SUM, meaning, unit="groups", count=True, **kw)  # type: ignore[arg-type]


REWARD = MetricAdapter(
    "reward",
    phases=("train",),
    metrics=[
        Metric("reward_mean", R.WEIGHTED_MEAN, "Sample-weighted mean reward of the batch", weight=N, headline=True),
        Metric("reward_std", R.POOLED_STD, "Std of the batch's rewards, pooled over chunks and ranks", weight=N, mean="reward_mean"),
        Metric("reward_min", R.MIN, "Lowest reward of the batch", weight=N),
        Metric("reward_max", R.MAX, "Highest reward of the batch", weight=N),
        Metric(N, R.SUM, "Trajectories scored", unit="trajectories", count=True),
        _groups("grpo_group_count", "Groups scored this step, every draw included"),
        _groups("grpo_informative_group_count", "Groups whose rewards were not all equal: the only ones with signal", headline=True),
        _groups("grpo_tied_group_count", "Groups whose rewards tied (zero advantage)"),
        _groups("grpo_all_zero_group_count", "Groups scoring uniformly 0"),
        _groups("grpo_all_one_group_count", "Groups scoring uniformly 1"),
        # dynamic sampling (present only when it is on). Rounds and dispatches are per-shard
        # durations that every shard spends together, so they take the MAX; cells, prompts and
        # trajectories are disjoint per shard, so they are summed.
        Metric("grpo_dynamic_sampling_extra_rollouts", R.MAX, "Extra refill rounds the step spent topping up informative groups", unit="rounds", count=True),
        Metric("grpo_dynamic_sampling_refill_dispatches", R.MAX, "rollout.generate calls beyond the base draw", unit="calls", count=True),
        Metric("grpo_dynamic_sampling_idle_cells", R.SUM, "Deliberately idle cells across extra refill rounds", unit="cells", count=True),
        _groups("grpo_dynamic_sampling_batch_informative_groups", "Informative groups in the trained batch"),
        Metric("grpo_dynamic_sampling_avoided_prompts", R.SUM, "Prompt draws skipped by selective refills", unit="prompts", count=True),
        Metric("grpo_dynamic_sampling_dropped_trajectories", R.SUM, "Scored trajectories collected but not trained on", unit="trajectories", count=True),
    ],
)
