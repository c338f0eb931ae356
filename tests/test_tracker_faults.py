"""Trackers under faults, for real (issue 23): a tracker down when the run starts, a sweep of runs on one
SQLite store, a run with thousands of completions tables, a publisher that keeps dying, a run deleted by
hand.

Each fault is made with real processes: a real ``mlflow server`` started late on a port chosen first,
several trainer processes started at once, a publisher process that exits at once; MLflow is read back
with ``MlflowClient``. Clocks are injected where a backoff schedule is walked.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow import MlflowClient

from posttrain_metrics import Frame
from posttrain_metrics.core.keys import describe
from posttrain_metrics.core.reducer import resolve_adapters
from posttrain_metrics.integrations import RunInfo
from posttrain_metrics.integrations.mlflow import MlflowSink
from posttrain_metrics.publication.process import MAX_RESTARTS, PublisherProcess

TESTS = Path(__file__).resolve().parent
HTTP_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
            "MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR")


@pytest.fixture(autouse=True)
def clean_env() -> Iterator[None]:
    """The MLflow sink sets MLflow's HTTP variables for the process: each test starts and ends clean."""
    saved = dict(os.environ)
    for var in HTTP_ENV:
        os.environ.pop(var, None)
    yield
    os.environ.clear()
    os.environ.update(saved)


def figure(text: str) -> None:
    print(f"[figure] {text}")


# -- a publisher that keeps dying ----------------------------------------------------------------------


def test_a_crash_looping_publisher_is_restarted_with_a_doubling_delay_up_to_a_minute(tmp_path: Path) -> None:
    """A real publisher process that exits at once every time (its sinks file names a tracker that does
    not exist): it is restarted 1, 2, 4, 8, 16, 32, 60, 60, 60, 60 s after each death is noticed (a
    death is noticed at the first check a second after the start), then given up, warned once each."""
    journal = tmp_path / "journal.jsonl"
    journal.touch()
    now = [0.0]
    proc = PublisherProcess(journal, [{"type": "no-such-tracker"}], clock=lambda: now[0], sleep=lambda s: None)
    spawned: list[float] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        proc.start()
        spawned.append(now[0])
        pids = [proc.pid]
        while now[0] < 1000:
            assert proc.proc is not None
            assert proc.proc.wait(60) == 2  # it really died (the CLI's exit status for a bad sinks file)
            now[0] += 0.5
            proc.check()
            if proc.pid != pids[-1]:
                pids.append(proc.pid)
                spawned.append(now[0])
    gaps = [b - a for a, b in itertools.pairwise(spawned)]
    # noticed 1 s after each start (check_every), then the delay: 1, 2, 4, 8, 16, 32, 60 ... s
    assert gaps == [2.0, 3.0, 5.0, 9.0, 17.0, 33.0, 61.0, 61.0, 61.0, 61.0], gaps
    assert len(spawned) == 1 + MAX_RESTARTS and proc.restarts == MAX_RESTARTS + 1
    said = [str(w.message) for w in caught]
    assert sum("exited with status 2 before the run's end" in m for m in said) == 1, said
    assert sum("not restarted again" in m and "publish" in m for m in said) == 1, said
    figure(f"crash loop: {MAX_RESTARTS} restarts spread over {spawned[-1] - spawned[0]:g} s (injected clock)")


def test_a_publisher_that_ran_a_good_while_before_dying_starts_a_new_series(tmp_path: Path) -> None:
    """Deaths far apart (each after 10 minutes of work) are restarted 1 s after being noticed each
    time, and never given up: only deaths in a row count towards the limit."""
    journal = tmp_path / "journal.jsonl"
    journal.touch()
    now = [0.0]
    proc = PublisherProcess(journal, [{"type": "no-such-tracker"}], clock=lambda: now[0], sleep=lambda s: None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        proc.start()
        for _ in range(MAX_RESTARTS + 2):
            assert proc.proc is not None
            proc.proc.wait(60)
            now[0] += 600.0  # it "ran" ten minutes (the injected clock) before its death is noticed
            first = proc.pid
            proc.check()
            assert proc.pid == first  # noticed, restart scheduled for 1 s later
            now[0] += 1.0
            proc.check()
            assert proc.pid != first
    assert proc.restarts == MAX_RESTARTS + 2


# -- a run deleted by hand -----------------------------------------------------------------------------


def run_info(run_id: str | None = None) -> RunInfo:
    adapters = resolve_adapters(["grpo", "reward", "trainer"])
    return RunInfo(run_id or uuid.uuid4().hex[:16], "faults", {}, describe(adapters),
                   tuple(a.name for a in adapters), time.time())


def land(sink: MlflowSink, client: MlflowClient, step: int) -> None:
    """Write one frame and wait until MLflow holds it."""
    sink.write(Frame(step, {"train/loss_avg": step / 10}, "train", 1_700_000_000.0 + step))
    for _ in range(600):
        sink.end_batch()
        if step in [m.step for m in client.get_metric_history(sink.run_id, "train/loss_avg")]:
            return
        time.sleep(0.05)
    raise AssertionError(f"step {step} never landed")


def test_a_run_deleted_mid_training_warns_once_not_once_per_batch(tmp_path: Path) -> None:
    sink = MlflowSink(dir=tmp_path, experiment_name="deleted-once", drain_timeout=10)
    sink.start(run_info())
    client = MlflowClient(sink.tracking_uri)
    land(sink, client, 1)
    client.delete_run(sink.run_id)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(2, 8):  # six batches, each refused by MLflow
            sink.write(Frame(step, {"train/loss_avg": step / 10}, "train", 1_700_000_000.0 + step))
            sink.end_batch()
            for _ in range(600):
                sink.end_batch()
                if sink.rejected == step - 1:
                    break
                time.sleep(0.02)
        with contextlib.suppress(Exception):  # setting the status of a deleted run may fail too
            sink.close()
    said = [str(w.message) for w in caught if "rejected" in str(w.message)]
    assert sink.rejected == 7  # six frames, and the run aggregates close() sends
    assert len(said) == 1 and "rejected the batch of steps 2" in said[0], said
