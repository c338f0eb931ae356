"""The families the dashboard draws, as data: one :class:`Panel` per chart, in page order."""

from __future__ import annotations

import dataclasses

__all__ = ["PANELS", "Panel"]


@dataclasses.dataclass(frozen=True)
class Panel:
    """One chart: the leaves it draws (under any namespace: ``train/``, ``val/``, ``optim/``).

    ``right`` leaves go on a second y axis (another unit). ``log`` asks for a log y axis, used when
    every value is positive and they span more than :data:`LOG_SPAN` (KL mean vs max). ``band`` is
    ``(mean_leaf, std_leaf)`` drawn as mean +- std, kept at each step within ``band_within``
    ``(min_leaf, max_leaf)`` where those are logged: a 0/1 reward's mean +- std runs past 0 and 1,
    values no sample had. A panel whose ``gate`` key is present but never positive is left out
    (score centering off). ``hline`` is a reference level (DPO chance).
    """

    title: str
    leaves: tuple[str, ...]
    right: tuple[str, ...] = ()
    log: bool = False
    band: tuple[str, str] | None = None
    band_within: tuple[str, str] | None = None
    gate: str | None = None
    hline: float | None = None
    budget_line: bool = False


PANELS: tuple[Panel, ...] = (
    Panel("Reward", ("reward_mean", "reward_avg", "reward_min", "reward_max"), band=("reward_mean", "reward_std"),
          band_within=("reward_min", "reward_max")),
    Panel("Groups (GRPO)", ("grpo_group_count", "grpo_informative_group_count", "grpo_all_zero_group_count",
                            "grpo_all_one_group_count")),
    Panel("Loss", ("loss_avg", "policy_total_loss", "policy_loss", "value_loss", "critic_loss")),
    Panel("Gradient norm (pre-clip)", ("grad_norm",), log=True),
    Panel("KL to reference", ("kl_mean", "kl_max", "reference_kl_mean"), log=True, gate="kl_beta"),
    Panel("Clipping and importance ratio", ("clip_frac", "ratio_absdev", "seq_clip_frac", "clip_fraction",
                                            "value_clip_fraction", "initial_clip_fraction")),
    Panel("Response length and truncation", ("response_len_mean", "response_len_max"),
          right=("rollout_truncated_frac",), budget_line=True),
    Panel("Train/rollout logprob gap", ("logprob_gap_mean", "mean_rank_logprob_gap_p99"),
          right=("logprob_gap_gt0p5_frac",), gate="logprob_gap_token_count"),
    Panel("Score centering", ("sc_rho_mean", "sc_rho_max"), right=("sc_out_of_head_frac",), log=True,
          gate="sc_token_count"),
    Panel("DPO accuracy", ("dpo_accuracy",), hline=0.5),
    Panel("DPO implicit rewards", ("dpo_reward_margin", "dpo_reward_winner", "dpo_reward_loser")),
    Panel("PPO optimizer counters", ("policy_optimizer_step", "critic_optimizer_step"), right=("actor_warmup",)),
    Panel("PPO value and advantage", ("value_mean", "return_mean", "advantage_mean")),
    Panel("Learning rate", ("learning_rate", "policy_lr", "critic_lr"), log=True),
    Panel("Throughput", ("tokens_per_s",), right=("window_s",)),
)
"""The families drawn when present, in page order (two per row)."""
