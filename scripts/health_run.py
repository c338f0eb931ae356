"""A small GRPO run whose KL spikes at step 18: live health finds it in every tracker and stops the run.

    python scripts/health_run.py runs/health      # then: python scripts/screenshots.py --health runs/health

The source of docs/health.md's screenshots. One rank, a generic training loop (examples/grpo_loop.py's
calls) over seeded stand-in statistics: the reward climbs, the KL to the reference creeps up, and at
step 18 one token owns the KL term (``kl_max`` 6 nats against a mean of 0.004) while the gradient
norm jumps to 12 (about 10x its recent median), which is the doctor's ``kl_spike``. The callback runs
with ``health: {kl_spike: stop, default: warn}`` and the journal, console, TensorBoard, MLflow
(``<run>/mlflow.db``) and W&B offline (``<run>/wandb/``) sinks, so the publisher process publishes
the finding to each tracker and writes the stop decision, and the run stops at step 19.

Deterministic: the statistics come from ``random.Random(0)``, the run id is fixed, and at the spike
the loop waits until rank 0 holds the publisher's stop decision (``metrics.stop_decision``) before it
starts step 19, so the stop lands at step 19 on any machine. A real trainer does not wait: it stops
after step N + 1 to N + a few (docs/health.md, "How a stop reaches every rank"). Nothing else fires:
``rl.n_mini`` and ``rollout.max_tokens`` are in the config, every group is informative.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from posttrain_metrics.callbacks import MetricsCallback

SPIKE = 18
STEPS = 40
RUN_ID = "healthklspike018"
CONFIG = {"model": "toy-policy", "rl": {"algorithm": "grpo", "n_mini": 2, "kl_beta": 0.04},
          "rollout": {"max_tokens": 256, "group_size": 8}}


def window(rng: random.Random, step: int) -> list[dict[str, object]]:
    """One optimizer step's statistics: two accumulation chunks and the step's own values."""
    progress = step / STEPS
    chunks: list[dict[str, object]] = []
    for _ in range(2):
        tokens = rng.randint(900, 1300)
        kl_mean = 0.002 + 0.004 * progress + rng.uniform(0, 0.001)
        chunks.append({
            "grpo_loss": rng.uniform(-0.05, 0.05), "grpo_weight_sum": tokens, "grpo_valid_token_count": tokens,
            "grpo_valid_sequence_count": 8, "grpo_clip_frac": rng.uniform(0.01, 0.08),
            "grpo_ratio_absdev": rng.uniform(0.005, 0.03), "grpo_kl_mean": kl_mean,
            "grpo_kl_max": kl_mean * rng.uniform(15, 40), "grpo_kl_beta": 0.04, "grpo_response_count": 8,
            "grpo_response_len_mean": rng.uniform(110, 150), "grpo_response_len_max": rng.randint(180, 240),
            "grpo_rollout_truncated_frac": 0.0, "update_outcome": "accumulating",
        })
    reward = min(0.9, 0.3 + 0.5 * progress + rng.uniform(-0.04, 0.04))
    chunks[-1].update(
        update_outcome="applied", reward_mean=reward, reward_std=(reward * (1 - reward)) ** 0.5, reward_min=0.0,
        reward_max=1.0, rollout_count=16, grpo_group_count=2, grpo_informative_group_count=2,
        grpo_tied_group_count=0, grpo_all_zero_group_count=0, grpo_all_one_group_count=0,
        grad_norm=rng.uniform(0.8, 1.6), learning_rate=1e-6, optimizer_step=step,
    )
    if step == SPIKE:  # one token owns the KL term, and the gradient jumps with it
        for chunk in chunks:
            chunk.update(grpo_kl_mean=0.004, grpo_kl_max=6.0)
        chunks[-1]["grad_norm"] = 12.0
    return chunks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, help="the run folder (emptied first)")
    args = parser.parse_args()
    out = args.out.resolve()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    sinks: list[dict[str, Any]] = [
        {"type": "journal"}, {"type": "console"}, {"type": "tensorboard"},
        {"type": "mlflow", "experiment_name": "posttrain-metrics-health"},
        {"type": "wandb", "mode": "offline", "project": "posttrain-metrics-health", "settings": {"quiet": True}},
    ]
    metrics = MetricsCallback(adapters=["grpo", "reward", "trainer"], sinks=sinks, out_dir=out,
                              run_name="health-kl-spike", run_id=RUN_ID, total_steps=STEPS,
                              health={"kl_spike": "stop", "default": "warn"})
    rng = random.Random(0)
    last = 0
    with metrics:
        metrics.on_run_start(CONFIG)
        for step in range(1, STEPS + 1):
            for chunk in window(rng, step):
                metrics.on_chunk_end(chunk)
            metrics.on_window_end(step)
            last = step
            if metrics.should_stop:
                break
            deadline = time.monotonic() + (120 if step == SPIKE else 0.1)
            while time.monotonic() < deadline:  # a training step's time; at the spike, the publisher's verdict
                if step == SPIKE and metrics.stop_decision is not None:
                    time.sleep(0.05)  # the watcher sets the reducer's flag right after the decision
                    break
                time.sleep(0.05)
            if step == SPIKE and metrics.stop_decision is None:
                print(f"health_run: no stop decision 120 s after step {SPIKE}", file=sys.stderr)
                return 1
    print(f"health_run: stopped after step {last} by {metrics.stopped_by}; run folder {out}")
    return 0 if last == SPIKE + 1 and metrics.stopped_by == "kl_spike" else 1


if __name__ == "__main__":
    raise SystemExit(main())
