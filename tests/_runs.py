"""Synthetic but realistic runs, reduced by the real engine, shared by the sink tests.

Each builder returns frames produced by ``reduce_metrics`` from per-rank chunk dicts, so sinks are
tested on exactly what the core publishes.
"""

from __future__ import annotations

import math
import random

from posttrain_metrics import Frame, reduce_metrics

GRPO_ADAPTERS = ["grpo", "reward", "trainer"]


def grpo_chunk(rng: random.Random, step: int, last: bool) -> dict[str, object]:
    tokens = rng.randint(20, 200)
    chunk: dict[str, object] = {
        "grpo_loss": rng.uniform(-0.2, 0.2),
        "grpo_weight_sum": tokens,
        "grpo_valid_token_count": tokens,
        "grpo_valid_sequence_count": rng.randint(2, 8),
        "grpo_clip_frac": rng.uniform(0, 0.2),
        "grpo_ratio_absdev": rng.uniform(0, 0.1),
        "grpo_kl_mean": rng.uniform(0, 0.05),
        "grpo_kl_max": rng.uniform(0.05, 2.0),
        "grpo_kl_beta": 0.04,
        "grpo_response_count": 8,
        "grpo_response_len_mean": rng.uniform(3, 12),
        "grpo_response_len_max": rng.randint(12, 16),
        "grpo_rollout_truncated_frac": rng.choice([0.0, 0.125]),
        "grpo_logprob_gap_mean": rng.uniform(0, 0.01),
        "grpo_mean_rank_logprob_gap_p99": rng.uniform(0.01, 0.05),
        "grpo_logprob_gap_gt0p5_frac": 0.0,
        "grpo_logprob_gap_token_count": tokens,
        "update_outcome": "applied" if last else "accumulating",
    }
    if last:
        chunk.update(
            reward_mean=min(1.0, 0.2 + step * 0.05 + rng.uniform(-0.05, 0.05)),
            reward_std=rng.uniform(0.3, 0.5),
            reward_min=0.0,
            reward_max=1.0,
            rollout_count=16,
            grpo_group_count=4,
            grpo_informative_group_count=rng.randint(1, 4),
            grpo_tied_group_count=0,
            grpo_all_zero_group_count=0,
            grpo_all_one_group_count=0,
            grad_norm=rng.uniform(0.5, 2.0),
            learning_rate=1e-3,
            e2e_step_s=rng.uniform(0.1, 0.2),
            optimizer_step=step,
            attempt_id=step,
            step_skipped=False,
            zero_grad_skips_total=0,
            nonfinite_skips_total=0,
            nonfinite_skips_consecutive=0,
            finite_gradient_check_enabled=True,
        )
    return chunk


def grpo_run(steps: int = 6, ranks: int = 2, chunks: int = 2, seed: int = 0) -> list[Frame]:
    """A GRPO run (objective + reward report + trainer keys) with 2 ranks and 2 chunks per window.
    Step 3, when it exists, is a zero-gradient skip."""
    rng = random.Random(seed)
    frames = []
    for step in range(1, steps + 1):
        per_rank = [[grpo_chunk(rng, step, c == chunks - 1) for c in range(chunks)] for _ in range(ranks)]
        if step == 3:
            for rank_chunks in per_rank:
                rank_chunks[-1].update(update_outcome="skipped", step_skipped=True, zero_grad_skips_total=1)
        metrics = reduce_metrics(GRPO_ADAPTERS, per_rank)
        frames.append(Frame(step, metrics, "train", 1_700_000_000.0 + step))
    return frames


def ppo_run(steps: int = 4, warmup: int = 2, seed: int = 0) -> list[Frame]:
    """A PPO run whose first ``warmup`` iterations are critic-only: no policy keys there."""
    rng = random.Random(seed)
    frames = []
    for step in range(1, steps + 1):
        per_rank = []
        for _ in range(2):
            chunks: list[dict[str, object]] = [{
                "ppo_valid_action_tokens": 100, "ppo_reward_mean": rng.random(), "ppo_advantage_mean": 0.0,
                "ppo_advantage_std": 1.0, "ppo_value_mean": rng.random(), "ppo_return_mean": rng.random(),
                "ppo_actor_warmup": 1.0 if step <= warmup else 0.0,
            }, {
                "ppo_critic_token_count": 100, "ppo_value_loss": rng.random(), "ppo_critic_loss": rng.random(),
                "ppo_critic_lr": 1e-4, "ppo_critic_optimizer_step": step * 2,
            }]
            if step > warmup:
                chunks.append({
                    "ppo_policy_token_count": 100, "ppo_policy_loss": rng.random(),
                    "ppo_policy_total_loss": rng.random(), "ppo_clip_fraction": rng.random() / 4,
                    "ppo_ratio_mean": 1.0, "ppo_policy_lr": 1e-5,
                    "ppo_policy_optimizer_step": (step - warmup) * 2,
                })
            per_rank.append(chunks)
        frames.append(Frame(step, reduce_metrics("ppo", per_rank), "train", 1_700_000_000.0 + step))
    return frames


def dpo_run(steps: int = 3, seed: int = 0) -> list[Frame]:
    """DPO with a validation frame after every training frame (same step)."""
    rng = random.Random(seed)
    frames = []
    for step in range(1, steps + 1):
        for phase in ("train", "val"):
            per_rank = [[{"dpo_loss": rng.random(), "dpo_accuracy": 0.5 + step / 10, "dpo_reward_margin": rng.random(),
                          "dpo_weight_sum": 8}] for _ in range(2)]
            frames.append(Frame(step, reduce_metrics("dpo", per_rank, phase=phase), phase, 1_700_000_000.0 + step))
    return frames


def nonfinite_frame(step: int = 1) -> Frame:
    """A GRPO frame where loss is NaN, kl_max is +inf and kl_mean is -inf (a producer's bad day)."""
    metrics = dict(grpo_run(steps=1)[0].metrics)
    metrics.update({"train/loss_avg": math.nan, "train/kl_max": math.inf, "train/kl_mean": -math.inf})
    return Frame(step, metrics, "train", 1_700_000_100.0)
