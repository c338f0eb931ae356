"""What the publish, export and memory benchmarks share: realistic chunks, statistics, the machine."""

from __future__ import annotations

import contextlib
import os
import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "tests") not in sys.path:
    sys.path.insert(0, str(ROOT / "tests"))  # the realistic chunks and the MLflow server of the tests

from _runs import GRPO_ADAPTERS, grpo_chunk  # noqa: E402

from posttrain_metrics import Frame, MetricReducer  # noqa: E402

__all__ = ["CHUNKS", "GRPO_ADAPTERS", "ROOT", "full_chunk", "load", "machine", "make_windows", "reduced_frames",
           "stats"]

CHUNKS = 4

# Quiet vendors: no W&B banners, no MLflow "View run at" links in the tables.
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")


def full_chunk(rng: random.Random, step: int, last: bool) -> dict[str, object]:
    """``tests/_runs.grpo_chunk`` plus the optional keys it leaves out (sequence clipping, routing
    replay, the sampling-correction family, dynamic sampling), so that every declared key of the
    grpo + reward + trainer adapters is published: K = 61 public keys with the label indicators."""
    chunk: dict[str, object] = grpo_chunk(rng, step, last)
    tokens = int(chunk["grpo_valid_token_count"])  # type: ignore[call-overload]
    chunk.update(
        grpo_seq_clip_frac=rng.uniform(0, 0.3), grpo_seq_log_ratio_abs=rng.uniform(0, 0.1),
        grpo_routing_replay_pinned_tokens=rng.randint(0, tokens), grpo_routing_replay_pinned_blocks=rng.uniform(0, 4),
        grpo_sc_token_count=tokens, grpo_sc_head_mass_q=rng.uniform(0.8, 1), grpo_sc_head_mass_p=rng.uniform(0.8, 1),
        grpo_sc_rho_mean=rng.uniform(0.9, 1.1), grpo_sc_rho_max=rng.uniform(1, 3), grpo_sc_kl_head=rng.uniform(0, 0.1),
        grpo_sc_correction_abs=rng.uniform(0, 0.1), grpo_sc_token_weight=rng.uniform(0.5, 1),
        grpo_sc_out_of_head_frac=rng.uniform(0, 0.05),
    )
    if last:
        chunk.update(
            grpo_dynamic_sampling_extra_rollouts=rng.randint(0, 8),
            grpo_dynamic_sampling_refill_dispatches=rng.randint(0, 3),
            grpo_dynamic_sampling_idle_cells=rng.randint(0, 4),
            grpo_dynamic_sampling_batch_informative_groups=rng.randint(1, 4),
            grpo_dynamic_sampling_avoided_prompts=rng.randint(0, 2),
            grpo_dynamic_sampling_dropped_trajectories=rng.randint(0, 2),
        )
    return chunk


def make_windows(steps: int, seed: int = 0) -> list[list[dict[str, object]]]:
    """Every step's ``CHUNKS`` chunks, built before timing (producing them is the trainer's work)."""
    rng = random.Random(seed)
    return [[full_chunk(rng, step, c == CHUNKS - 1) for c in range(CHUNKS)] for step in range(1, steps + 1)]


def reduced_frames(steps: int, seed: int = 0) -> list[Frame]:
    """``steps`` frames reduced by the real ``MetricReducer`` (one rank) from ``make_windows``."""
    reducer = MetricReducer(GRPO_ADAPTERS)
    frames = []
    for step, chunks in enumerate(make_windows(steps, seed), 1):
        for chunk in chunks:
            reducer.add(chunk)
        frames.append(reducer.reduce(step))
    return frames


def stats(samples: list[float]) -> tuple[float, float]:
    """Median and p90."""
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def machine() -> str:
    """Cores, CPU model, Python and torch versions (if importable), and the load average now."""
    model = "unknown CPU"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    try:
        import torch

        torch_version = str(torch.__version__)
    except ImportError:
        torch_version = "not installed"
    return (f"{os.cpu_count()} cores, {model}; python {sys.version.split()[0]}, torch {torch_version}; "
            f"load average {load()}")
