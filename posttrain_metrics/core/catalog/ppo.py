"""PPO: policy and critic role windows, prepared-batch statistics and consistency diagnostics.

PPO publishes one frame after both windows. Policy-window keys are weighted by the policy
micro-batches' tokens (``policy_token_count``), critic-window keys by the critic's
(``critic_token_count``); prepared-batch and consistency keys by ``valid_action_tokens``. Those two
role token counts are ours: the reference says "token-weighted" without naming the weight. During a
critic-only warmup iteration the policy window does not run, so its keys are absent from the frame.
The reference leaves the diagnostic suffixes open; we publish ``_mean`` (token-weighted), ``_max``
and ``_min`` (over every token of every rank).
"""

from __future__ import annotations

from ..adapter import Metric, MetricAdapter
from ..reduction import Reduction as R
from ..reduction import RunAggregate as Run

__all__ = ["PPO"]

POL = "policy_token_count"
CRI = "critic_token_count"
TOK = "valid_action_tokens"


def _w(leaf: str, meaning: str, weight: str, **kw: object) -> Metric:
    return Metric(leaf, R.WEIGHTED_MEAN, meaning, weight=weight, **kw)  # type: ignore[arg-type]


def _diagnostic(stem: str, what: str) -> tuple[Metric, ...]:
    return (
        _w(f"{stem}_mean", f"Token mean of {what}", TOK),
        Metric(f"{stem}_max", R.MAX, f"Largest per-token {what}", weight=TOK),
        Metric(f"{stem}_min", R.MIN, f"Smallest per-token {what}", weight=TOK),
    )


PPO = MetricAdapter(
    "ppo",
    internal_prefix="ppo_",
    phases=("train",),
    metrics=[
        # policy window (absent during critic warmup)
        Metric(POL, R.SUM, "Tokens the policy update window trained on", unit="tokens"),
        _w("policy_total_loss", "Total policy loss, every term included", POL, headline=True),
        _w("policy_loss", "Clipped-surrogate policy loss", POL),
        _w("clip_fraction", "Fraction of tokens the PPO ratio clip bound", POL, unit="fraction"),
        _w("ratio_mean", "Mean importance ratio", POL),
        _w("entropy", "Policy entropy term", POL, unit="nats"),
        _w("jsd_loss", "Reference Jensen-Shannon term", POL),
        Metric("policy_lr", R.LAST, "Policy learning rate left for the next update"),
        Metric("policy_optimizer_step", R.AGREED, "Durable policy minibatch optimizer counter", namespace="optim", unit="steps", count=True, run=Run.LAST),
        # critic window
        Metric(CRI, R.SUM, "Tokens the critic update window trained on", unit="tokens"),
        _w("value_loss", "Unscaled value loss", CRI, headline=True),
        _w("critic_loss", "Coefficient-scaled critic loss", CRI),
        _w("value_clip_fraction", "Fraction of tokens the value clip bound", CRI, unit="fraction"),
        Metric("critic_lr", R.LAST, "Critic learning rate left for the next update"),
        Metric("critic_optimizer_step", R.AGREED, "Durable critic minibatch optimizer counter", namespace="optim", unit="steps", count=True, run=Run.LAST),
        # prepared batch
        Metric(TOK, R.SUM, "Valid action tokens in the prepared batch", unit="tokens"),
        _w("reward_mean", "Prepared-batch reward over valid action tokens", TOK, headline=True),
        _w("advantage_mean", "Normalised policy advantage over valid action tokens", TOK),
        Metric("advantage_std", R.POOLED_STD, "Std of the normalised policy advantage, pooled", weight=TOK, mean="advantage_mean"),
        _w("value_advantage_mean", "GAE value-target advantage", TOK),
        _w("return_mean", "Value-target return", TOK),
        _w("value_mean", "Old value estimate", TOK),
        _w("reference_kl_mean", "Sampled KL to the reference", TOK, unit="nats"),
        Metric("actor_warmup", R.AGREED, "1.0 on a critic-only warmup iteration, else 0.0 (the same on every rank)",
               run=Run.WINDOWS),
        # consistency diagnostics
        *_diagnostic("behavior_logprob_delta", "policy-minus-rollout logprob before the update"),
        *_diagnostic("initial_ratio", "importance ratio before the update"),
        _w("initial_clip_fraction", "Fraction of tokens the clip would bind before the update", TOK, unit="fraction"),
        _w("initial_importance_ess", "Normalised effective sample size of the initial importance weights", TOK),
        *_diagnostic("reference_behavior_logprob_delta", "reference-minus-rollout logprob"),
        *_diagnostic("policy_reference_logprob_delta", "policy-minus-reference logprob"),
    ],
)

POLICY_WINDOW_LEAVES = frozenset(
    {POL, "policy_total_loss", "policy_loss", "clip_fraction", "ratio_mean", "entropy", "jsd_loss",
     "policy_lr", "policy_optimizer_step"}
)
"""Leaves a critic-warmup iteration does not publish."""
