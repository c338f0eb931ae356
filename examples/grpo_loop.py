"""The README's training loop, complete: `python examples/grpo_loop.py [--out DIR]` runs it as is."""

import argparse
import random
from pathlib import Path

import yaml

from posttrain_metrics.callbacks import build_callback

parser = argparse.ArgumentParser()
parser.add_argument("--config", default=str(Path(__file__).with_name("grpo_callback.yaml")))
parser.add_argument("--out", help="override out_dir (default: the config's)")
args = parser.parse_args()
cfg = yaml.safe_load(Path(args.config).read_text())
if args.out:
    cfg["metrics"]["out_dir"] = args.out
rng = random.Random(0)


# --8<-- [start:loop]
def objective(tokens: int) -> dict[str, float | int]:
    """Stand-in for your GRPO loss: the stats it returns per accumulation chunk (tensors work too)."""
    rewards = [float(rng.random() < 0.5) for _ in range(8)]
    mean = sum(rewards) / len(rewards)
    return {"grpo_loss": rng.uniform(-0.1, 0.1), "grpo_weight_sum": tokens, "grpo_valid_token_count": tokens,
            "grpo_clip_frac": rng.uniform(0.0, 0.2), "grpo_kl_mean": 0.01, "grpo_kl_max": 0.05,
            "reward_mean": mean, "reward_std": (mean * (1 - mean)) ** 0.5, "rollout_count": len(rewards)}


metrics = build_callback(cfg["metrics"])            # or hydra.utils.instantiate(cfg.metrics)
with metrics:                                        # closes the sinks, FAILED if training raises
    metrics.on_run_start(cfg)                        # config flattened, secrets redacted
    for step in range(1, 21):
        for tokens in (120, 80):                     # gradient-accumulation chunks
            metrics.on_chunk_end(objective(tokens))  # source names: posttrain-metrics keys grpo
        metrics.on_chunk_end({"grad_norm": 0.7, "learning_rate": 1e-6, "update_outcome": "applied"})
        metrics.on_window_end(step)                  # exact global frame: 1 collective, 1 host copy
        if step % 10 == 0:
            metrics.on_validation_end(step, {"reward_avg": 0.5, "reward_std": 0.5})
# --8<-- [end:loop]
