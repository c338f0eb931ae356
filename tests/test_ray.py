"""The single-controller path on a real local Ray cluster: actors export, the driver merges and publishes.

One cluster (2 CPUs) and four actor workers serve the whole module. Each actor holds uneven GRPO
chunks (3, 1, 0 and 2 per window) in a WorkerMetrics and returns its exported state from
``metrics_state``; the driver's frame must equal ``reduce_metrics`` on the same data exactly, and
the torch.distributed gloo result on the same data (a small gloo job in spawned processes, as in
tests/test_distributed.py). Producer bugs on one actor surface on the driver naming that worker.
"""

from __future__ import annotations

import datetime
import os
import queue as queue_module
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch.multiprocessing as mp
from test_distributed import GAP, GRPO_STEP, assert_same_metrics, chunks_per_rank, full_data

from posttrain_metrics import MetricReducer, MetricsError, get_adapter, reduce_metrics
from posttrain_metrics.callbacks.ray import RayDriver, gather, resolve
from posttrain_metrics.integrations import MemorySink
from posttrain_metrics.publication import Publisher

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]  # slow: starts ray and gloo ranks

WORLDS = (2, 4)
STEPS = (5, 6)
ADAPTERS = [get_adapter(n) for n in GRPO_STEP]
INSTALL = "pip install 'posttrain-metrics[ray]'  (or: pip install 'ray>=2.40')"


# -- the reference: MetricReducer over gloo on the same chunks ----------------------------------------------


def _gloo_worker(rank: int, world: int, store: str, results: Any) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=30))
        frames = []
        reducer = MetricReducer(GRPO_STEP)
        for step in STEPS:
            for chunk in full_data(ADAPTERS, world, step)[rank]:
                reducer.add(chunk)
            frames.append(dict(reducer.reduce(step).metrics))
        results.put((rank, "ok", frames))
        dist.barrier()
        dist.destroy_process_group()
    except Exception:
        results.put((rank, "crash", traceback.format_exc()))


def gloo_frames(world: int, directory: Path) -> list[dict[str, Any]]:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_gloo_worker, args=(r, world, str(directory / f"store{world}"), results), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    reports: dict[int, Any] = {}
    deadline = time.monotonic() + 60
    try:
        while len(reports) < world:
            try:
                rank, status, payload = results.get(timeout=0.5)
            except queue_module.Empty:
                if time.monotonic() > deadline or any(p.exitcode not in (None, 0) for p in procs):
                    pytest.fail(f"gloo world {world}: ranks {sorted(reports)} reported; exit codes "
                                f"{[p.exitcode for p in procs]}")
                continue
            assert status == "ok", f"gloo rank {rank}:\n{payload}"
            reports[rank] = payload
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    return list(reports[0])


@pytest.fixture(scope="module")
def gloo(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[dict[str, Any]]]:
    return {world: gloo_frames(world, tmp_path_factory.mktemp(f"gloo{world}")) for world in WORLDS}


# -- one local Ray cluster and four actor workers ----------------------------------------------------------


@pytest.fixture(scope="module")
def ray_module() -> Iterator[Any]:
    try:
        import ray
    except ImportError:
        pytest.fail(f"the Ray tests need ray, which is not installed: {INSTALL}")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def actors(ray_module: Any) -> list[Any]:
    ray = ray_module

    # Defined here so that Ray ships the class by value (the test module is not importable on workers).
    @ray.remote(num_cpus=0)
    class TrainerWorker:
        """What a trainer's actor adds: a WorkerMetrics, chunks added while training, one method."""

        def __init__(self) -> None:
            self.metrics: Any = None

        def configure(self, adapters: list[str], worker_id: str) -> None:
            from posttrain_metrics.core.portable import WorkerMetrics

            self.metrics = WorkerMetrics(adapters, worker_id=worker_id)

        def train(self, chunks: list[dict[str, Any]]) -> int:
            for chunk in chunks:  # in a real trainer: one add per micro-batch
                self.metrics.add(chunk)
            return len(chunks)

        def train_and_report(self, chunks: list[dict[str, Any]], step: int) -> dict[str, Any]:
            """A trainer method that already returns something: the state rides along."""
            self.train(chunks)
            return {"loss": 0.0, "metrics_state": self.metrics.export(step)}

        def metrics_state(self, step: int, phase: str = "train") -> dict[str, Any]:
            return dict(self.metrics.export(step, phase=phase))

    handles = [TrainerWorker.remote() for _ in range(max(WORLDS))]
    ray.get([h.__ray_ready__.remote() for h in handles])
    return handles


def configure(ray: Any, actors: list[Any], adapters: dict[int, list[str]] | None = None) -> None:
    ray.get([a.configure.remote((adapters or {}).get(i, GRPO_STEP), f"actor-{i}") for i, a in enumerate(actors)])


def train(ray: Any, actors: list[Any], per_actor: list[list[dict[str, Any]]]) -> None:
    ray.get([a.train.remote(chunks) for a, chunks in zip(actors, per_actor)])


# -- the tests -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world", WORLDS)
def test_driver_frame_equals_reduce_metrics_and_gloo(
    world: int, ray_module: Any, actors: list[Any], gloo: dict[int, list[dict[str, Any]]]
) -> None:
    workers = actors[:world]
    configure(ray_module, workers)
    sink = MemorySink()
    with Publisher([sink], adapters=GRPO_STEP, mode="inline") as publisher:
        driver = RayDriver(GRPO_STEP, publisher=publisher, timeout=60)
        for i, step in enumerate(STEPS):
            data = full_data(ADAPTERS, world, step)
            assert [len(c) for c in data] == chunks_per_rank(world)  # uneven: 3, 1 (, 0, 2)
            train(ray_module, workers, data)
            frame = driver.reduce(workers, step)
            expected = reduce_metrics(GRPO_STEP, data)
            assert len(expected) >= 50 and expected["optim/update_outcome"] == "applied"
            assert frame.metrics == expected  # exactly: the same merge, in the same order
            assert [type(v) for v in frame.metrics.values()] == [type(v) for v in expected.values()]
            assert (frame.step, frame.phase) == (step, "train")
            assert_same_metrics(frame.metrics, gloo[world][i])  # gloo sums in its own order
    assert [f.step for f in sink.frames] == list(STEPS)
    assert sink.frames[-1].metrics["optim/update_outcome/applied"] == 1  # published through our sinks
    assert sink.closed is False


def test_states_riding_on_what_the_trainer_returns(ray_module: Any, actors: list[Any]) -> None:
    configure(ray_module, actors)
    data = full_data(ADAPTERS, 4, 9)
    refs = [a.train_and_report.remote(chunks, 9) for a, chunks in zip(actors, data)]
    frame = RayDriver(GRPO_STEP).publish(resolve(refs, key="metrics_state"), step=9)
    assert frame.metrics == reduce_metrics(GRPO_STEP, data)
    # ObjectRefs of the states themselves are fetched too
    train(ray_module, actors, data)
    refs = [a.metrics_state.remote(9) for a in actors]
    assert RayDriver(GRPO_STEP).publish(refs).metrics == frame.metrics


def test_worker_with_mismatched_adapter_is_named_on_the_driver(ray_module: Any, actors: list[Any]) -> None:
    configure(ray_module, actors, {2: ["grpo", "trainer"]})
    train(ray_module, actors, full_data(ADAPTERS, 4, 10))
    with pytest.raises(MetricsError) as info:
        RayDriver(GRPO_STEP).reduce(actors, 10)
    message = str(info.value)
    assert "worker 'actor-2'" in message and "['grpo', 'trainer']" in message, message


def test_partial_logprob_gap_record_is_named_on_the_driver(ray_module: Any, actors: list[Any]) -> None:
    configure(ray_module, actors)
    good = {"grpo_clip_frac": 0.1, "grpo_valid_token_count": 900, **GAP}
    partial = {"grpo_clip_frac": 0.1, "grpo_valid_token_count": 900, "grpo_logprob_gap_mean": 0.05}
    train(ray_module, actors, [[good], [good, good], [good], [good, partial]])
    with pytest.raises(MetricsError) as info:
        RayDriver(GRPO_STEP).reduce(actors, 11)
    message = str(info.value)
    assert "worker 'actor-3'" in message and "grpo_logprob_gap_mean" in message, message
    # the actors stay usable: the next window reduces
    train(ray_module, actors, [[good]] * 4)
    assert RayDriver(GRPO_STEP).reduce(actors, 12).metrics["train/valid_token_count"] == 3600


def test_missing_ray_is_an_install_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # what an environment without ray sees
    with pytest.raises(ImportError, match=r"pip install 'posttrain-metrics\[ray\]'"):
        gather([], 1)


def test_actor_without_the_method_is_a_clear_error(ray_module: Any, actors: list[Any]) -> None:
    with pytest.raises(MetricsError, match="no remote method 'metrics_report'"):
        gather(actors, 1, method="metrics_report")
    with pytest.raises(MetricsError, match="carries no 'state'"):
        resolve([{"loss": 1.0}], key="state")
