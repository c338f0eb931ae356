"""Throughput and stage timers over real torch.distributed (issue 28): gloo on CPU, 2 and 4 ranks.

Every rank runs the callback with ``perf`` on and a clock injected per rank, with different token
counts, window times and stage times per rank; one rank times a stage the others do not. The
expected figures are computed here by hand from the per-rank inputs (sums over ranks, the slowest
rank's window time), never by the code under test. The collectives of a window are counted with
perf on and off: the same.
"""

from __future__ import annotations

import datetime
import os
import traceback
from pathlib import Path
from typing import Any

import pytest
from _runs import counting_collectives, run_ranks

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # slow: spawns gloo ranks

GLOO_TIMEOUT_S = 30
PARENT_DEADLINE_S = 240
class Clock:
    """A training clock the test moves by hand."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def tokens(rank: int, step: int) -> int:
    return 100 * (rank + 1) + 7 * step


def rollouts(rank: int, step: int) -> int:
    return 4 * (rank + 1) + step


def window_s(rank: int, step: int) -> float:
    return 1.0 + rank + 0.25 * step


PARAMS = 1.0e6


def peak(rank: int) -> float:
    return 1.0e9 * (rank + 1)  # mixed accelerators: the world's peak is the sum


def generation_s(rank: int, step: int) -> float:
    return 0.5 * (rank + 1) + 0.125 * step  # timed in two pieces: repeated timings add up


def _scenario(rank: int, world: int, out_dir: str) -> dict[str, Any]:

    from posttrain_metrics.callbacks import MetricsCallback
    from posttrain_metrics.core.throughput import Throughput

    clock = Clock()
    cb = MetricsCallback(adapters=["grpo", "reward"], sinks=[{"type": "memory"}], publisher="inline",
                         out_dir=os.path.join(out_dir, f"rank{rank}"),
                         perf=Throughput(clock=clock, timers=["scoring_only_on_rank0"], memory=True,
                                         params=PARAMS, peak_flops=peak(rank)))
    calls: list[str] = []

    frames = []
    with cb:
        cb.on_run_start()  # clock at 0: the first window starts here
        for step in (1, 2):
            begin = clock.t
            for _ in range(2):
                with cb.timer("generation"):
                    clock.t += generation_s(rank, step) / 2
            if rank == 0:
                with cb.timer("scoring_only_on_rank0"):
                    clock.t += 0.25
            cb.on_chunk_end({"grpo_valid_token_count": tokens(rank, step), "rollout_count": rollouts(rank, step)})
            clock.t = begin + window_s(rank, step)
            before = len(calls)
            with counting_collectives(calls):
                frames.append(dict(cb.on_window_end(step).metrics))
            counts = calls[before:]
        # the same window without perf: the collectives it makes
        plain = MetricsCallback(adapters=["grpo", "reward"], sinks=[{"type": "memory"}], publisher="inline",
                                out_dir=os.path.join(out_dir, f"plain{rank}"))
        plain.on_chunk_end({"grpo_valid_token_count": 1, "rollout_count": 1})
        plain.on_window_end(1)  # the first reduce of a reducer adds its one handshake
        plain.on_chunk_end({"grpo_valid_token_count": 1, "rollout_count": 1})
        before = len(calls)
        with counting_collectives(calls):
            plain.on_window_end(2)
        plain_counts = calls[before:]
        plain.on_run_end()
    return {"frames": frames, "collectives": counts, "plain_collectives": plain_counts}


def _worker(rank: int, store: str, results: Any, world: int, out_dir: str) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=GLOO_TIMEOUT_S))
        report: tuple[str, Any] = ("ok", _scenario(rank, world, out_dir))
    except Exception:
        report = ("crash", traceback.format_exc())
    results.put((rank, report))
    try:
        dist.barrier()
        dist.destroy_process_group()
    except Exception:
        pass


def run_world(world: int, directory: Path) -> dict[int, Any]:
    reports = run_ranks(_worker, directory / "store", world, PARENT_DEADLINE_S, args=(world, str(directory)))
    for rank, (status, detail) in reports.items():
        assert status == "ok", f"rank {rank}:\n{detail}"
    return {rank: detail for rank, (_, detail) in reports.items()}


@pytest.fixture(scope="module", params=[2, 4], ids=lambda w: f"world{w}")
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[int, Any]]:
    return request.param, run_world(request.param, tmp_path_factory.mktemp(f"perf{request.param}"))


def test_throughput_and_timers_are_the_hand_computed_global_figures(world: tuple[int, dict[int, Any]]) -> None:
    size, reports = world
    ranks = range(size)
    tokens_total = samples_total = 0
    time_total = 0.0
    for i, step in enumerate((1, 2)):
        slowest = max(window_s(r, step) for r in ranks)
        tok = sum(tokens(r, step) for r in ranks)
        smp = sum(rollouts(r, step) for r in ranks)
        tokens_total, samples_total, time_total = tokens_total + tok, samples_total + smp, time_total + slowest
        gen = [generation_s(r, step) for r in ranks]
        for rank in ranks:
            m = reports[rank]["frames"][i]  # every rank holds the same figures
            assert m["train/valid_token_count"] == tok
            assert m["perf/window_s"] == pytest.approx(slowest, rel=1e-12)
            assert m["perf/window_s_mean"] == pytest.approx(sum(window_s(r, step) for r in ranks) / size, rel=1e-12)
            assert m["perf/tokens_per_s"] == pytest.approx(tok / slowest, rel=1e-12)
            assert m["perf/samples_per_s"] == pytest.approx(smp / slowest, rel=1e-12)
            assert m["perf/tokens_total"] == tokens_total and type(m["perf/tokens_total"]) is int
            assert m["perf/samples_total"] == samples_total
            assert m["perf/time_s"] == pytest.approx(time_total, rel=1e-12)
            assert m["timer/generation_s"] == pytest.approx(max(gen), rel=1e-12)
            assert m["timer/generation_s_mean"] == pytest.approx(sum(gen) / size, rel=1e-12)
            # the absent-key rule: published because one rank timed it, max and mean over that rank
            assert m["timer/scoring_only_on_rank0_s"] == pytest.approx(0.25)
            assert m["timer/scoring_only_on_rank0_s_mean"] == pytest.approx(0.25)
            # a declared stage no rank timed is absent, not zero
            assert "timer/reward_s" not in m and "timer/reward_s_mean" not in m
            assert m["perf/rss_peak_gib"] > 0  # no CUDA here: the process's peak resident memory
            assert "perf/mem_allocated_peak_gib" not in m
            world_peak = sum(peak(r) for r in ranks)
            assert m["perf/peak_flops"] == pytest.approx(world_peak, rel=1e-12)
            assert m["perf/mfu"] == pytest.approx(6 * PARAMS * tok / (slowest * world_peak), rel=1e-12)
            assert m == reports[0]["frames"][i]


def test_perf_adds_no_collective(world: tuple[int, dict[int, Any]]) -> None:
    size, reports = world
    for rank in range(size):
        assert reports[rank]["collectives"] == reports[rank]["plain_collectives"], rank
        assert len(reports[rank]["collectives"]) == 1, reports[rank]["collectives"]  # the step's one all_gather
