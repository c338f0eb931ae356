"""MetricReducer over real torch.distributed: gloo on CPU, 2 and 4 processes.

Each world size is started once (spawned processes, a file:// rendezvous in a temporary directory)
and every worker runs the same list of scenarios in order, reporting each outcome, its elapsed time
and what it observed back to the parent through a queue. The tests then assert per rank. Error
scenarios are followed by healthy ones, so a rank that fell out of step with the others would show
up as a hang (the gloo timeout) instead of passing silently.
"""

from __future__ import annotations

import datetime
import math
import os
import queue as queue_module
import random
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch.multiprocessing as mp
from _runs import counting_collectives

from posttrain_metrics import (
    Metric,
    MetricAdapter,
    MetricReducer,
    MetricsError,
    Reduction,
    get_adapter,
    reduce_metrics,
)
from posttrain_metrics.core.distributed import GATHER_MAX_RANKS

# Hang guards, not speed checks: generous, so that spawning 4 torch processes on a loaded 2-core machine
# cannot trip them (a wrong rank shows as a wrong outcome, never as a time).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # slow: spawns gloo ranks

R = Reduction
WORLD_SIZES = (2, 4)
GLOO_TIMEOUT_S = 30
PARENT_DEADLINE_S = 240
GRPO_STEP = ["grpo", "reward", "trainer"]
STAGES = MetricAdapter(
    "stages",
    internal_prefix="stage_",
    metrics=[
        Metric(f"stage_{name}_s", r, f"Wall time of the {name} stage", namespace="timer", unit="s")
        for name, r in [("rollout", R.MEAN), ("reward", R.MEAN), ("logprob", R.MAX), ("backward", R.MAX),
                        ("optimizer", R.MIN), ("sync", R.MEAN), ("checkpoint", R.LAST), ("data", R.SUM)]
    ],
)
"""A small user adapter, so that the counted step declares more than 60 keys."""


def chunks_per_rank(world: int) -> list[int]:
    return [3, 1, 0, 2][:world] if world > 2 else [3, 1]


def window(adapters: list[MetricAdapter], rank: int, step: int, n_chunks: int) -> list[dict[str, Any]]:
    """Deterministic chunks carrying every declared key (the parent rebuilds the same data)."""
    rng = random.Random(f"{rank}/{step}")
    out = []
    for c in range(n_chunks):
        last = c == n_chunks - 1
        chunk: dict[str, Any] = {}
        for adapter in adapters:
            for source, metric in adapter.metrics.items():
                r = metric.reduction
                if r is R.SUM:
                    chunk[source] = rng.choice([0, rng.randint(1, 3000)])
                elif r is R.CATEGORICAL:
                    if source == "update_outcome":
                        chunk[source] = "applied" if last else "accumulating"
                elif r is R.AGREED:
                    chunk[source] = step * 10 + (c if not last else 0)  # every rank ends on the same counter
                elif source in adapter.counts or (r in (R.MAX, R.MIN) and metric.unit == "tokens"):
                    chunk[source] = rng.randint(1, 4096)
                elif r is R.POOLED_STD:
                    chunk[source] = rng.uniform(0.0, 1.0)
                else:
                    chunk[source] = rng.uniform(-3.0, 3.0)
        out.append(chunk)
    return out


def full_data(adapters: list[MetricAdapter], world: int, step: int) -> list[list[dict[str, Any]]]:
    return [window(adapters, r, step, n) for r, n in enumerate(chunks_per_rank(world))]


def as_tensors(chunk: Mapping[str, Any]) -> dict[str, Any]:
    """Half of the values as 0-d float64/int64 tensors (exactly the same numbers)."""
    import torch

    out: dict[str, Any] = {}
    for i, (key, value) in enumerate(sorted(chunk.items())):
        if i % 2 == 0 and isinstance(value, (int, float)) and not isinstance(value, bool):
            dtype = torch.int64 if isinstance(value, int) else torch.float64
            out[key] = torch.tensor(value, dtype=dtype)
        else:
            out[key] = value
    return out


# -- worker scenarios (run in every spawned process) -------------------------------------------------


def _reduce(adapters: Any, chunks: list[dict[str, Any]], step: int) -> dict[str, Any]:
    reducer = MetricReducer(adapters)
    for chunk in chunks:
        reducer.add(chunk)
    frame = reducer.reduce(step)
    assert frame.step == step
    return dict(frame.metrics)


def scenario_equal(rank: int, world: int) -> Any:
    adapters = [get_adapter(n) for n in GRPO_STEP]
    reducer = MetricReducer(GRPO_STEP)
    frames = []
    for step in (5, 6):
        for chunk in full_data(adapters, world, step)[rank]:
            reducer.add(as_tensors(chunk))
        frames.append(dict(reducer.reduce(step).metrics))
    return frames


def scenario_count(rank: int, world: int) -> Any:
    adapters = [*(get_adapter(n) for n in GRPO_STEP), STAGES]
    calls: list[str] = []
    with counting_collectives(calls):
        reducer = MetricReducer(adapters)
        per_step: list[list[str]] = []
        frames = []
        for step in (1, 2, 3):
            for chunk in full_data(adapters, world, step)[rank]:
                reducer.add(chunk)
            before = len(calls)
            frames.append(dict(reducer.reduce(step).metrics))
            per_step.append(calls[before:])
    return {"per_step": per_step, "frames": frames, "keys": sum(len(a.metrics) for a in adapters)}


def scenario_adapters_differ(rank: int, world: int) -> Any:
    names = GRPO_STEP if rank == 0 else ["grpo", "trainer"]
    return _reduce(names, [{"grpo_kl_max": 1.0, "update_outcome": "applied"}], 7)


def scenario_adapter_order_differs(rank: int, world: int) -> Any:
    names = ["grpo", "trainer"] if rank % 2 == 0 else ["trainer", "grpo"]
    return _reduce(names, [{"grpo_kl_max": 1.0}], 7)


GAP = {
    "grpo_logprob_gap_mean": 0.05,
    "grpo_mean_rank_logprob_gap_p99": 0.4,
    "grpo_logprob_gap_gt0p5_frac": 0.001,
    "grpo_logprob_gap_token_count": 800,
}


def scenario_partial_gap_record(rank: int, world: int) -> Any:
    chunk: dict[str, Any] = {"grpo_clip_frac": 0.1, "grpo_valid_token_count": 900, **GAP}
    if rank == world - 1:
        chunk = {"grpo_clip_frac": 0.1, "grpo_valid_token_count": 900, "grpo_logprob_gap_mean": 0.05}
    return _reduce(GRPO_STEP, [chunk], 8)


def scenario_gap_on_some_ranks(rank: int, world: int) -> Any:
    chunk: dict[str, Any] = {"grpo_clip_frac": 0.1, "grpo_valid_token_count": 900}
    if rank == 0:
        chunk.update(GAP)
    return _reduce(GRPO_STEP, [chunk], 9)


def scenario_outcomes_disagree(rank: int, world: int) -> Any:
    last = "applied" if rank == 0 else "skipped"
    return _reduce(GRPO_STEP, [{"update_outcome": "accumulating"}, {"update_outcome": last}], 10)


def scenario_unknown_key_on_one_rank(rank: int, world: int) -> Any:
    chunk: dict[str, Any] = {"grpo_kl_max": 1.0}
    if rank == 1:
        chunk["grpo_kl_maximum"] = 2.0
    return _reduce(GRPO_STEP, [chunk], 11)


def scenario_bad_value_on_one_rank(rank: int, world: int) -> Any:
    value: Any = "nan?" if rank == world - 1 else 0.5
    return _reduce(GRPO_STEP, [{"grpo_kl_max": value}], 12)


def scenario_steps_differ(rank: int, world: int) -> Any:
    return _reduce(GRPO_STEP, [{"grpo_kl_max": 1.0}], 13 + rank)


def scenario_one_rank_only(rank: int, world: int) -> Any:
    chunk: dict[str, Any] = {"grpo_clip_frac": 0.5, "grpo_valid_token_count": 10 * (rank + 1)}
    if rank == world - 1:
        chunk["grpo_kl_max"] = 7.5
    if rank == 0:
        chunk["grpo_dynamic_sampling_idle_cells"] = 4
    return _reduce(GRPO_STEP, [chunk], 14)


def scenario_still_in_step(rank: int, world: int) -> Any:
    return _reduce(GRPO_STEP, [{"grpo_kl_max": float(rank), "rollout_count": 2}], 15)


# Failures on one rank before the collective (issue 12, item 9), and desynchronised counters and
# partial families (items 4, 5): each is a window that must fail on every rank, followed by a window
# on the same reducer that must reduce normally on every rank (ranks still in step).

NEXT_WINDOW = 99


def _then_next_window(rank: int, first: list[Any], step: Any = 40, *, during: Any = None) -> dict[str, Any]:
    reducer = MetricReducer(GRPO_STEP)
    outcome = "no error"
    try:
        for chunk in first:
            reducer.add(chunk)
        if during is not None:
            with during():
                reducer.reduce(step)
        else:
            reducer.reduce(step)
    except MetricsError as exc:
        outcome = str(exc)
    reducer.add({"grpo_kl_max": float(rank), "rollout_count": 2})
    after = reducer.reduce(NEXT_WINDOW)
    return {"first": outcome, "after": dict(after.metrics), "after_step": after.step}


def _on_last_rank(rank: int, world: int, bad: Any, good: Any = 0.5) -> list[dict[str, Any]]:
    return [{"grpo_kl_max": bad if rank == world - 1 else good}]


def scenario_meta_tensor(rank: int, world: int) -> Any:
    import torch

    return _then_next_window(rank, _on_last_rank(rank, world, torch.tensor(1.0, device="meta")))


def scenario_sparse_tensor(rank: int, world: int) -> Any:
    import torch

    return _then_next_window(rank, _on_last_rank(rank, world, torch.tensor([1.0]).to_sparse()))


def scenario_quantized_tensor(rank: int, world: int) -> Any:
    import torch

    q = torch.quantize_per_tensor(torch.tensor([1.0]), 0.1, 0, torch.quint8)
    return _then_next_window(rank, _on_last_rank(rank, world, q))


def scenario_copy_fails(rank: int, world: int) -> Any:
    """Any error while a tensor is copied to the host (a lost device, a driver error) on one rank."""
    import contextlib

    import torch

    @contextlib.contextmanager
    def broken_copies() -> Any:
        # torch.stack gathers a window's tensors for their one host copy; the collectives don't use it
        original = torch.stack

        def stack(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("simulated device error while copying to the host")

        torch.stack = stack
        try:
            yield
        finally:
            torch.stack = original

    chunk = [{"grpo_kl_max": torch.tensor(0.5), "rollout_count": torch.tensor(3)}]
    return _then_next_window(rank, chunk, during=broken_copies if rank == world - 1 else None)


def scenario_value_raises(rank: int, world: int) -> Any:
    import fractions

    class Exploding(fractions.Fraction):
        def __float__(self) -> float:
            raise RuntimeError("this value cannot be read")

    return _then_next_window(rank, _on_last_rank(rank, world, Exploding(1, 2)))


def scenario_bad_step_on_one_rank(rank: int, world: int) -> Any:
    step: Any = "40" if rank == world - 1 else 40
    return _then_next_window(rank, [{"grpo_kl_max": 0.5}], step)


def scenario_counters_disagree(rank: int, world: int) -> Any:
    step = 5 if rank == 0 else 6
    return _then_next_window(rank, [{"optimizer_step": step, "grad_norm": 1.0 + rank}])


def _update_window(skipped_on_last_rank: int, rank: int, world: int) -> list[dict[str, Any]]:
    """n_mini = 2 updates of 2 accumulation chunks: applied, then skipped. Each update's last chunk
    carries the window's count so far (tensors, as a trainer holds them)."""
    import torch

    skipped = skipped_on_last_rank if rank == world - 1 else 1
    return [{"update_outcome": "accumulating", "grad_norm": torch.tensor(0.0)},
            {"update_outcome": "applied", "updates_applied": torch.tensor(1), "updates_skipped": torch.tensor(0),
             "grad_norm": torch.tensor(0.5)},
            {"update_outcome": "accumulating"},
            {"update_outcome": "skipped", "updates_applied": torch.tensor(1), "updates_skipped": torch.tensor(skipped),
             "grad_norm": torch.tensor(0.0)}]


def scenario_update_counts(rank: int, world: int) -> Any:
    return _reduce(GRPO_STEP, _update_window(1, rank, world), 8)


def scenario_update_counts_disagree(rank: int, world: int) -> Any:
    return _then_next_window(rank, _update_window(2, rank, world))


def scenario_gap_in_some_chunks(rank: int, world: int) -> Any:
    with_gap = {"grpo_clip_frac": 0.1, "grpo_valid_token_count": 900, **GAP}
    without = {"grpo_clip_frac": 0.2, "grpo_valid_token_count": 100}
    return _then_next_window(rank, [with_gap, without])


def scenario_gap_with_trainer_chunks(rank: int, world: int) -> Any:
    """A chunk that carries none of grpo's keys (the trainer's own) does not count for the family."""
    with_gap = {"grpo_clip_frac": 0.1, "grpo_valid_token_count": 900, **GAP}
    return _reduce(GRPO_STEP, [with_gap, {"grad_norm": 2.0, "update_outcome": "applied"}], 41)


SCENARIOS: dict[str, Callable[[int, int], Any]] = {
    "equal": scenario_equal,
    "count": scenario_count,
    "adapters_differ": scenario_adapters_differ,
    "adapter_order_differs": scenario_adapter_order_differs,
    "partial_gap_record": scenario_partial_gap_record,
    "gap_on_some_ranks": scenario_gap_on_some_ranks,
    "outcomes_disagree": scenario_outcomes_disagree,
    "unknown_key_on_one_rank": scenario_unknown_key_on_one_rank,
    "bad_value_on_one_rank": scenario_bad_value_on_one_rank,
    "steps_differ": scenario_steps_differ,
    "one_rank_only": scenario_one_rank_only,
    "meta_tensor": scenario_meta_tensor,
    "sparse_tensor": scenario_sparse_tensor,
    "quantized_tensor": scenario_quantized_tensor,
    "copy_fails": scenario_copy_fails,
    "value_raises": scenario_value_raises,
    "bad_step_on_one_rank": scenario_bad_step_on_one_rank,
    "counters_disagree": scenario_counters_disagree,
    "update_counts": scenario_update_counts,
    "update_counts_disagree": scenario_update_counts_disagree,
    "gap_in_some_chunks": scenario_gap_in_some_chunks,
    "gap_with_trainer_chunks": scenario_gap_with_trainer_chunks,
    "still_in_step": scenario_still_in_step,
}


def _worker(rank: int, world: int, store: str, results: Any, gather_max: int) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    report: dict[str, tuple[str, Any, float]] = {}
    try:
        import torch
        import torch.distributed as dist

        from posttrain_metrics.core import distributed

        distributed.GATHER_MAX_RANKS = gather_max  # 1: the two-all_reduce path of worlds beyond 64 ranks

        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo",
            init_method=f"file://{store}",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=GLOO_TIMEOUT_S),
        )
        for name, scenario in SCENARIOS.items():
            start = time.monotonic()
            try:
                outcome: tuple[str, Any] = ("ok", scenario(rank, world))
            except MetricsError as exc:
                outcome = ("MetricsError", str(exc))
            except Exception:
                outcome = ("crash", traceback.format_exc())
            report[name] = (*outcome, time.monotonic() - start)
    except Exception:
        report["<setup>"] = ("crash", traceback.format_exc(), 0.0)
    results.put((rank, report))
    try:  # leave together: a rank that closed its connections early would break a slower peer
        dist.barrier()
        dist.destroy_process_group()
    except Exception:
        pass


def run_world(world: int, directory: Path, gather_max: int) -> dict[int, dict[str, tuple[str, Any, float]]]:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    store = directory / f"store-{world}"
    procs = [ctx.Process(target=_worker, args=(r, world, str(store), results, gather_max), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    reports: dict[int, dict[str, tuple[str, Any, float]]] = {}
    deadline = time.monotonic() + PARENT_DEADLINE_S
    try:
        while len(reports) < world:
            try:
                rank, report = results.get(timeout=0.5)
            except queue_module.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode is not None and r not in reports]
                if dead:
                    pytest.fail(f"world {world}: ranks {dead} exited ({[procs[r].exitcode for r in dead]}) unreported")
                if time.monotonic() > deadline:
                    pytest.fail(f"world {world}: only ranks {sorted(reports)} reported within {PARENT_DEADLINE_S}s")
                continue
            reports[rank] = report
    finally:
        for p in procs:
            p.join(timeout=10)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    for rank, report in reports.items():
        assert "<setup>" not in report, f"rank {rank}: {report['<setup>'][1]}"
    return reports


PATHS = {"gather": GATHER_MAX_RANKS, "allreduce": 1}
"""The collective path: one all_gather (up to 64 ranks), or, with the threshold lowered to 1 in the
workers, the SUM and MAX all_reduces that worlds beyond 64 ranks take."""


@pytest.fixture(
    scope="module",
    params=[(size, path) for path in PATHS for size in WORLD_SIZES],
    ids=lambda p: f"world{p[0]}-{p[1]}",
)
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[int, dict[str, tuple[str, Any, float]]]]:
    size, path = request.param
    return size, run_world(size, tmp_path_factory.mktemp(f"dist{size}{path}"), PATHS[path])


def path_of(request: pytest.FixtureRequest) -> str:
    return str(request.node.callspec.params["world"][1])


def outcomes(world: tuple[int, dict[int, dict[str, Any]]], scenario: str) -> list[tuple[str, Any, float]]:
    size, reports = world
    assert sorted(reports) == list(range(size))
    got = [reports[r][scenario] for r in range(size)]
    for rank, (status, detail, _) in enumerate(got):
        assert status != "crash", f"rank {rank} crashed in {scenario}:\n{detail}"
    return got


def assert_same_metrics(actual: Mapping[str, Any], expected: Mapping[str, Any]) -> None:
    assert sorted(actual) == sorted(expected)
    for key, want in expected.items():
        got = actual[key]
        assert type(got) is type(want), f"{key}: {got!r} vs {want!r}"
        if isinstance(want, float):
            assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12), f"{key}: {got!r} vs {want!r}"
        else:
            assert got == want, f"{key}: {got!r} vs {want!r}"


def assert_error_everywhere(world: tuple[int, dict[int, dict[str, Any]]], scenario: str, *needles: str) -> None:
    for rank, (status, detail, elapsed) in enumerate(outcomes(world, scenario)):
        assert status == "MetricsError", f"rank {rank} in {scenario}: {status} {detail!r}"
        # the error reached this rank through the step's collectives, not by waiting out the gloo
        # timeout: no collective failed (that error names the timeout), and the rank did not sit in one
        # for the whole timeout (no speed bound: a slow machine only stays under it by more). The
        # scenarios after this one running in step on the same group (still_in_step) is the proof by
        # ordering: a timed-out gloo group would not run them.
        assert "process group's timeout" not in detail, f"rank {rank} in {scenario}: {detail!r}"
        assert elapsed < GLOO_TIMEOUT_S, f"rank {rank} waited {elapsed:.1f}s in {scenario}: the gloo timeout"
        for needle in needles:
            assert needle in detail, f"rank {rank}: {needle!r} not in {detail!r}"


# -- the tests -------------------------------------------------------------------------------------------


def test_distributed_equals_reduce_metrics(world: tuple[int, Any]) -> None:
    size = world[0]
    adapters = [get_adapter(n) for n in GRPO_STEP]
    results = outcomes(world, "equal")
    for step_index, step in enumerate((5, 6)):
        expected = reduce_metrics(GRPO_STEP, full_data(adapters, size, step))
        assert len(expected) >= 50
        assert expected["optim/update_outcome"] == "applied"
        assert type(expected["optim/optimizer_step"]) is int
        for rank, (status, frames, _) in enumerate(results):
            assert status == "ok", f"rank {rank}: {frames}"
            assert_same_metrics(frames[step_index], expected)


def test_two_collectives_per_step_after_one_handshake(world: tuple[int, Any], request: pytest.FixtureRequest) -> None:
    size, gather = world[0], path_of(request) == "gather"
    adapters = [*(get_adapter(n) for n in GRPO_STEP), STAGES]
    for rank, (status, seen, _) in enumerate(outcomes(world, "count")):
        assert status == "ok", f"rank {rank}: {seen}"
        assert seen["keys"] >= 60
        first, *rest = seen["per_step"]
        assert rest, "several steps were counted"
        for calls in rest:
            if gather:  # one all_gather of both buffers
                assert len(calls) == 1 and "all_gather" in calls[0], f"rank {rank}: {calls}"
            else:  # one SUM and one MAX all_reduce
                assert calls == ["all_reduce", "all_reduce"], f"rank {rank}: {calls}"
        assert len(first) == len(rest[0]) + 1, f"rank {rank}: first step {first}, then {rest[0]}"
        for step, frame in zip((1, 2, 3), seen["frames"]):
            expected = reduce_metrics(adapters, full_data(adapters, size, step))
            assert_same_metrics(frame, expected)
            if gather:
                assert frame == expected, "the gathered rows merge in rank order: bitwise the same figures"


@pytest.mark.parametrize("scenario", ["adapters_differ", "adapter_order_differs"])
def test_different_adapters_fail_on_every_rank(world: tuple[int, Any], scenario: str) -> None:
    assert_error_everywhere(world, scenario, "adapters")


def test_partial_logprob_gap_record_fails_on_every_rank(world: tuple[int, Any]) -> None:
    assert_error_everywhere(world, "partial_gap_record", "grpo_logprob_gap_mean")


def test_logprob_gap_family_on_some_ranks_only_fails_on_every_rank(world: tuple[int, Any]) -> None:
    assert_error_everywhere(world, "gap_on_some_ranks", "logprob_gap")


def test_disagreeing_update_outcome_fails_on_every_rank(world: tuple[int, Any]) -> None:
    assert_error_everywhere(world, "outcomes_disagree", "update_outcome", "applied", "skipped")


def test_unknown_key_on_one_rank_fails_on_every_rank(world: tuple[int, Any]) -> None:
    assert_error_everywhere(world, "unknown_key_on_one_rank", "rank 1")
    _, detail, _ = outcomes(world, "unknown_key_on_one_rank")[1]
    assert "'grpo_kl_maximum'" in detail  # the rank that saw it has the details


def test_bad_value_on_one_rank_fails_on_every_rank(world: tuple[int, Any]) -> None:
    size = world[0]
    assert_error_everywhere(world, "bad_value_on_one_rank", f"rank {size - 1}", "grpo_kl_max")


def test_ranks_reducing_different_steps_fail_on_every_rank(world: tuple[int, Any]) -> None:
    assert_error_everywhere(world, "steps_differ", "step")


def test_key_present_on_one_rank_is_published(world: tuple[int, Any]) -> None:
    size = world[0]
    weights = [10 * (r + 1) for r in range(size)]
    for rank, (status, metrics, _) in enumerate(outcomes(world, "one_rank_only")):
        assert status == "ok", f"rank {rank}: {metrics}"
        assert metrics["train/kl_max"] == 7.5
        assert metrics["train/grpo_dynamic_sampling_idle_cells"] == 4
        assert type(metrics["train/grpo_dynamic_sampling_idle_cells"]) is int
        assert metrics["train/valid_token_count"] == sum(weights)
        assert math.isclose(metrics["train/clip_frac"], 0.5, rel_tol=1e-12)
        assert "train/kl_mean" not in metrics
        assert "optim/update_outcome" not in metrics


def test_ranks_stay_in_step_after_errors(world: tuple[int, Any]) -> None:
    size = world[0]
    for rank, (status, metrics, elapsed) in enumerate(outcomes(world, "still_in_step")):
        assert status == "ok", f"rank {rank}: {metrics}"
        assert metrics == {"train/kl_max": float(size - 1), "train/rollout_count": 2 * size}
        assert elapsed < GLOO_TIMEOUT_S  # did not wait out the gloo timeout (not a speed bound)
    # it ran after every error scenario, on the same process group, in the same order on every rank
    assert list(SCENARIOS)[-1] == "still_in_step"


# -- a failure on one rank before the collective, and desynchronised ranks ---------------------------


def assert_failed_then_in_step(world: tuple[int, Any], scenario: str, *needles: str) -> None:
    """Every rank raised the first window's error (naming what and where), then reduced the next
    window normally: max(rank) of kl_max and 2 rollouts per rank, at the next window's step."""
    size = world[0]
    for rank, (status, result, elapsed) in enumerate(outcomes(world, scenario)):
        assert status == "ok", f"rank {rank} in {scenario}: {status} {result!r}"
        assert "process group's timeout" not in result["first"], f"rank {rank} in {scenario}: {result!r}"
        assert elapsed < GLOO_TIMEOUT_S, f"rank {rank} waited {elapsed:.1f}s in {scenario}: the gloo timeout"
        for needle in needles:
            assert needle in result["first"], f"rank {rank}: {needle!r} not in {result['first']!r}"
        assert result["after_step"] == NEXT_WINDOW
        assert result["after"] == {"train/kl_max": float(size - 1), "train/rollout_count": 2 * size}


@pytest.mark.parametrize(("scenario", "what"), [
    ("meta_tensor", "meta tensor"),
    ("sparse_tensor", "sparse"),
    ("quantized_tensor", "quantized"),
    ("value_raises", "cannot be read"),
])
def test_unreadable_value_on_one_rank_fails_everywhere_and_the_next_window_is_normal(
    world: tuple[int, Any], scenario: str, what: str
) -> None:
    size = world[0]
    assert_failed_then_in_step(world, scenario, f"rank {size - 1}", "grpo_kl_max")
    _, detail, _ = outcomes(world, scenario)[size - 1]
    assert what in detail["first"], detail["first"]  # the rank that saw it says what it was


def test_copy_error_on_one_rank_fails_everywhere_and_the_next_window_is_normal(world: tuple[int, Any]) -> None:
    size = world[0]
    assert_failed_then_in_step(world, "copy_fails", f"rank {size - 1}")
    _, detail, _ = outcomes(world, "copy_fails")[size - 1]
    assert "simulated device error" in detail["first"]


def test_bad_step_on_one_rank_fails_everywhere_and_the_next_window_is_normal(world: tuple[int, Any]) -> None:
    size = world[0]
    assert_failed_then_in_step(world, "bad_step_on_one_rank", f"rank {size - 1}", "step")


def test_disagreeing_exact_counter_fails_on_every_rank(world: tuple[int, Any]) -> None:
    # rank 0 reports optimizer step 5 and the others 6: never the average
    assert_failed_then_in_step(world, "counters_disagree", "optim/optimizer_step", "from 5 to 6", "desynchronised")


def test_update_counts_are_the_windows_count_once_whatever_the_world_size(world: tuple[int, Any]) -> None:
    # every rank applied one update and skipped the next (same all-reduced gradient, same decisions):
    # the window counts 1 applied and 1 skipped, not world-size times that
    for rank, (status, metrics, _) in enumerate(outcomes(world, "update_counts")):
        assert status == "ok", f"rank {rank}: {metrics}"
        assert metrics == {"optim/update_outcome": "skipped", "optim/updates_applied": 1, "optim/updates_skipped": 1,
                           "train/grad_norm": 0.0}
        assert type(metrics["optim/updates_applied"]) is int


def test_ranks_counting_different_updates_fail_on_every_rank(world: tuple[int, Any]) -> None:
    # the last rank counted 2 skipped updates, the others 1: desynchronised, never an average
    assert_failed_then_in_step(world, "update_counts_disagree", "optim/updates_skipped", "from 1 to 2",
                               "desynchronised")


def test_family_in_some_chunks_of_every_rank_fails_on_every_rank(world: tuple[int, Any]) -> None:
    size = world[0]
    # each rank: one chunk with the gap family and one grpo chunk without: size of 2*size chunks
    assert_failed_then_in_step(world, "gap_in_some_chunks", "logprob_gap", f"{size} of the {2 * size} chunks")


def test_trainer_only_chunks_do_not_count_for_the_family(world: tuple[int, Any]) -> None:
    size = world[0]
    for rank, (status, metrics, _) in enumerate(outcomes(world, "gap_with_trainer_chunks")):
        assert status == "ok", f"rank {rank}: {metrics}"
        assert metrics["train/logprob_gap_token_count"] == 800 * size
        assert metrics["train/valid_token_count"] == 900 * size
        assert metrics["optim/update_outcome"] == "applied"
