"""Synthetic but realistic runs, reduced by the real engine, shared by the sink tests.

Each builder returns frames produced by ``reduce_metrics`` from per-rank chunk dicts, so sinks are
tested on exactly what the core publishes.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

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


# -- a run small enough to compute by hand ------------------------------------------------------------
#
# Three GRPO frames with round numbers. Every run aggregate of it is worked out by hand in HAND_RUN
# below (the arithmetic in each comment), so a sink test can compare what the tracker holds with
# literals, never with what our own summary code computes.


def hand_frames() -> list[Frame]:
    return [
        Frame(1, {
            "train/loss_avg": 0.5, "train/weight_sum": 10, "train/valid_token_count": 10,
            "train/clip_frac": 0.5, "train/kl_mean": 0.5, "train/kl_max": 0.25, "train/kl_beta": 0.04,
            "train/reward_mean": 0.5, "train/reward_std": 0.5, "train/rollout_count": 4,
            "train/reward_min": 0.0, "train/reward_max": 1.0, "train/response_len_max": 12,
            "train/grad_norm": 2.0, "timer/e2e_step_s": 1.0, "optim/update_outcome": "applied",
        }, "train", 1_700_000_001.0),
        Frame(2, {
            "train/loss_avg": 0.0, "train/weight_sum": 30, "train/valid_token_count": 30,
            "train/clip_frac": 0.25, "train/kl_mean": 0.25, "train/kl_max": 0.75, "train/kl_beta": 0.04,
            "train/reward_mean": 1.0, "train/reward_std": 0.0, "train/rollout_count": 4,
            "train/reward_min": 1.0, "train/reward_max": 1.0, "train/response_len_max": 16,
            "train/grad_norm": 0.0, "timer/e2e_step_s": 3.0, "optim/update_outcome": "skipped",
        }, "train", 1_700_000_002.0),
        # a producer's bad day: loss NaN, kl_max +inf, kl_mean -inf; no reward report this step
        Frame(3, {
            "train/loss_avg": math.nan, "train/weight_sum": 20, "train/valid_token_count": 20,
            "train/clip_frac": 0.125, "train/kl_mean": -math.inf, "train/kl_max": math.inf, "train/kl_beta": 0.04,
            "train/response_len_max": 14,
            "train/grad_norm": 1.5, "timer/e2e_step_s": 2.0, "optim/update_outcome": "applied",
        }, "train", 1_700_000_003.0),
    ]


HAND_RUN: dict[str, object] = {
    # token-weighted, NaN left out with its weight: (0.5*10 + 0.0*30) / (10 + 30) = 5/40
    "train/loss_avg": 0.125,
    "train/weight_sum": 60,  # 10 + 30 + 20, an int total
    "train/valid_token_count": 60,  # 10 + 30 + 20
    # by valid_token_count: (0.5*10 + 0.25*30 + 0.125*20) / 60 = (5 + 7.5 + 2.5) / 60 = 15/60
    "train/clip_frac": 0.25,
    # by valid_token_count, -inf left out with its weight: (0.5*10 + 0.25*30) / 40 = 12.5/40
    "train/kl_mean": 0.3125,
    "train/kl_max": math.inf,  # max(0.25, 0.75, +inf): an infinite maximum is the run's maximum
    "train/kl_beta": 0.04,  # mean of 0.04, 0.04, 0.04
    "train/reward_mean": 0.75,  # by rollout_count: (0.5*4 + 1.0*4) / 8 = 6/8
    # pooled over 8 rollouts: E[x^2] = (4*(0.5^2 + 0.5^2) + 4*(0.0^2 + 1.0^2)) / 8 = (2 + 4)/8 = 0.75,
    # E[x] = 0.75, var = 0.75 - 0.75^2 = 0.1875 = 3/16, std = sqrt(3)/4
    "train/reward_std": math.sqrt(3) / 4,
    "train/rollout_count": 8,  # 4 + 4
    "train/reward_min": 0.0,  # min(0.0, 1.0), a float key
    "train/reward_max": 1.0,  # max(1.0, 1.0)
    "train/response_len_max": 16,  # max(12, 16, 14), an int
    "train/grad_norm": 1.5,  # LAST: step 3's value
    "timer/e2e_step_s": 2.0,  # mean of 1.0, 3.0, 2.0
    "optim/update_outcome/accumulating": 0,  # counts of windows per label: applied, skipped, applied
    "optim/update_outcome/applied": 2,
    "optim/update_outcome/skipped": 1,
    "optim/update_outcome/discarded": 0,
}
HAND_NONFINITE = {"train/loss_avg": 1, "train/kl_mean": 1, "train/kl_max": 1}  # step 3's NaN, -inf, +inf

# What a tracker shows per step: numbers as they are, each label as one 0/1 indicator per declared
# label (written out here from the catalogue's declaration, not derived by our display code).
HAND_INDICATORS = {
    "optim/update_outcome/accumulating": [0, 0, 0],
    "optim/update_outcome/applied": [1, 0, 1],  # applied, skipped, applied
    "optim/update_outcome/skipped": [0, 1, 0],
    "optim/update_outcome/discarded": [0, 0, 0],
}

DECLARED_LABELS = {
    "optim/update_outcome": ("accumulating", "applied", "skipped", "discarded"),
    "optim/skip_reason": ("nonfinite_loss", "nonfinite_gradient"),
}
"""The label keys of the trainer adapter and their labels, copied from the catalogue by hand."""


def tracked(frame: Frame) -> dict[str, float | int | str]:
    """The frame as a tracker must show it, computed independently of the publisher: a bool as 0/1,
    a label as its string plus one 0/1 indicator per label of DECLARED_LABELS, everything else as is."""
    out: dict[str, float | int | str] = {}
    for key, value in frame.metrics.items():
        if isinstance(value, bool):
            out[key] = 1 if value else 0
        elif isinstance(value, str):
            out[key] = value
            for label in DECLARED_LABELS[key]:
                out[f"{key}/{label}"] = 1 if value == label else 0
        else:
            out[key] = value
    return out


class CloseCountingSink:
    """A sink that records every ``close`` call it gets: unlike MemorySink (whose own guard hides a
    second call), a close that runs twice shows here as two entries."""

    name = "counting"
    stores_nonfinite = frozenset({"nan", "inf"})

    def __init__(self) -> None:
        self.frames: list[Frame] = []
        self.closes: list[bool] = []  # the ``failed`` flag of each close call, in order

    def start(self, run: object) -> None:
        pass

    def write(self, frame: Frame) -> None:
        self.frames.append(frame)

    def close(self, *, failed: bool = False) -> None:
        self.closes.append(failed)


def tensorboard_run(out_dir: Path) -> Path:
    """The run directory the callback's default TensorBoard sink wrote: ``out_dir/tensorboard/<name>-<run id>``
    (one per run; the test's out_dir holds one run)."""
    return only_run(Path(out_dir) / "tensorboard")


def only_run(folder: Path) -> Path:
    """The one run folder (``<name>-<run id>``) in a TensorBoard folder: what ``export --to tensorboard
    DIR`` writes."""
    [run] = [p for p in Path(folder).iterdir() if p.is_dir()]
    return run


def run_ranks(target: Any, store: Path, world: int = 2, timeout: float = 240.0,
              args: Sequence[Any] = ()) -> dict[int, Any]:
    """Run ``target(rank, store, results, *args)`` in ``world`` spawned processes (each puts ``(rank,
    out)`` on ``results``) and return every rank's ``out``; a rank that exits or never reports fails
    the test, naming it."""
    import queue
    import time

    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, str(store), results, *args), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    got: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(got) < world:
            assert time.monotonic() < deadline, f"only ranks {sorted(got)} reported within {timeout:g} s"
            try:
                rank, out = results.get(timeout=0.5)
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode is not None and r not in got]
                assert not dead, f"ranks {dead} exited ({[procs[r].exitcode for r in dead]}) unreported"
                continue
            got[rank] = out
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return got


# A label that a later frame of its phase no longer carries (skip_reason at step 2 only).
LABELLED = [
    Frame(1, {"train/loss_avg": 0.5, "optim/update_outcome": "applied"}, "train", 1_700_000_001.0),
    Frame(2, {"train/loss_avg": 0.4, "optim/update_outcome": "skipped", "optim/skip_reason": "nonfinite_loss"},
          "train", 1_700_000_002.0),
    Frame(2, {"val/loss_avg": 0.3}, "val", 1_700_000_002.5),  # another phase: says nothing about the reason
    Frame(3, {"train/loss_avg": 0.3, "optim/update_outcome": "applied"}, "train", 1_700_000_003.0),
]


def gloo_rank(scenario: Any, rank: int, store: str, results: Any, world: int = 2) -> None:
    """One rank for :func:`run_ranks` (bind it with ``functools.partial(gloo_rank, scenario, world=n)``):
    join a gloo group of ``world`` ranks over the file ``store``, run ``scenario(rank, world)`` (a dict
    of what the rank saw), leave in step; a crash is reported as ``{"crash": traceback}``."""
    import datetime
    import os
    import traceback

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out: dict[str, Any] = {}
    try:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=60))
        out = scenario(rank, world)
        dist.barrier()
        dist.destroy_process_group()
    except Exception:
        out["crash"] = traceback.format_exc()
    results.put((rank, out))


def expected_series(frames: Sequence[Frame]) -> dict[str, list[tuple[int, float]]]:
    """Per numeric key, the (step, value) points a tracker must hold: label indicators added, bools as
    0/1, absent keys absent (from :func:`tracked`, independent of the publisher)."""
    out: dict[str, list[tuple[int, float]]] = {}
    for frame in frames:
        for key, value in tracked(frame).items():
            if not isinstance(value, str):
                out.setdefault(key, []).append((frame.step, float(value)))
    return out


def wait_for(what: str, condition: Any, timeout: float = 120, proc: subprocess.Popen[bytes] | None = None,
             log: Path | None = None) -> None:
    """Poll ``condition`` until it holds; an AssertionError naming ``what`` after ``timeout`` seconds, or
    at once with the end of ``log`` when the trainer ``proc`` exited first."""
    deadline = time.monotonic() + timeout
    while not condition():
        if proc is not None and proc.poll() is not None and log is not None:
            raise AssertionError(f"the trainer exited ({proc.returncode}) before {what}: {log.read_text()[-3000:]}")
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.02)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def need(module: str, extra: str) -> Any:
    """``module`` imported, or the test fails (never skips) naming the extra that installs it."""
    import importlib

    import pytest

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        pytest.fail(f"{module} is missing ({exc}); fix: pip install 'posttrain-metrics[{extra}]'", pytrace=False)


COLLECTIVES = (
    "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor", "all_gather_single",
    "all_gather_object",
    "broadcast", "broadcast_object_list", "barrier", "monitored_barrier", "reduce", "reduce_scatter",
    "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "gather", "gather_object", "scatter",
    "scatter_object_list", "send", "recv", "isend", "irecv", "batch_isend_irecv",
)
"""Every torch.distributed call that talks to other ranks."""


@contextlib.contextmanager
def counting_collectives(calls: list[str]) -> Iterator[None]:
    """Append the name of every collective call to ``calls`` while inside: each function of
    :data:`COLLECTIVES` is wrapped in ``torch.distributed`` and ``distributed_c10d`` (one wrapper per
    function, so a call through either name counts once), and put back on the way out."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    originals: dict[tuple[Any, str], Any] = {}
    for module in (dist, distributed_c10d):
        for name in COLLECTIVES:
            original = getattr(module, name, None)
            if original is None:
                continue
            target = getattr(distributed_c10d, name, original)

            def counted(*args: Any, __name: str = name, __fn: Any = target, **kwargs: Any) -> Any:
                calls.append(__name)
                return __fn(*args, **kwargs)

            originals[(module, name)] = original
            setattr(module, name, counted)
    try:
        yield
    finally:
        for (module, name), original in originals.items():
            setattr(module, name, original)
