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
import json
import logging
import subprocess
import sys
import threading
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

import pytest
from _mlflow_server import free_port, start_server, stop_server
from _runs import GRPO_ADAPTERS, grpo_run
from mlflow import MlflowClient

from posttrain_metrics import Frame
from posttrain_metrics.core.keys import describe
from posttrain_metrics.core.reducer import resolve_adapters
from posttrain_metrics.integrations import RunInfo
from posttrain_metrics.integrations.memory import MemorySink
from posttrain_metrics.integrations.mlflow import RUN_ID_TAG, MlflowSink
from posttrain_metrics.journal import JournalSink
from posttrain_metrics.publication import Publisher
from posttrain_metrics.publication.follower import follow
from posttrain_metrics.publication.process import MAX_RESTARTS, PublisherProcess

TESTS = Path(__file__).resolve().parent
# each test starts and ends without MLflow's variables; real mlflow servers, publisher processes and
# sweeps of trainers: the slow tier
pytestmark = [pytest.mark.usefixtures("clean_mlflow_env"), pytest.mark.slow]


def figure(text: str) -> None:
    print(f"[figure] {text}")


# -- a publisher that keeps dying ----------------------------------------------------------------------


def test_a_crash_looping_publisher_is_restarted_with_a_doubling_delay_up_to_a_minute(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
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
    said = [str(w.message) for w in caught] + caplog.messages  # a restart is a log record
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


def test_a_run_deleted_mid_training_warns_once_not_once_per_batch(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    sink = MlflowSink(dir=tmp_path, experiment_name="deleted-once", drain_timeout=10)
    sink.start(run_info())
    client = MlflowClient(sink.tracking_uri)
    land(sink, client, 1)
    client.delete_run(sink.run_id)
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
    said = [m for m in caplog.messages if "rejected" in m]  # the tracker's state: a log record
    assert sink.rejected == 7  # six frames, and the run aggregates close() sends
    assert len(said) == 1 and "rejected the batch of steps 2" in said[0], said


# -- a tracker down when the run starts ----------------------------------------------------------------

LATE_TRAIN = """
import random, sys, time
sys.path.insert(0, {tests!r})
from _runs import grpo_chunk
from posttrain_metrics.callbacks import MetricsCallback

cb = MetricsCallback(
    adapters=["grpo", "reward", "trainer"], out_dir=sys.argv[1], run_id="laterun01", run_name="late",
    sinks=[{{"type": "journal"}}, {{"type": "mlflow", "tracking_uri": sys.argv[2], "experiment_name": "late"}}],
)
cb.on_run_start({{"rl": {{"kl_beta": 0.04}}}})
open(sys.argv[1] + "/started", "w").close()
rng = random.Random(0)
with cb:
    for step in range(1, int(sys.argv[3]) + 1):
        for c in range(2):
            cb.on_chunk_end(grpo_chunk(rng, step, last=c == 1))
        cb.on_window_end(step)
        time.sleep(float(sys.argv[4]))
"""


def journal_series(journal: Path) -> dict[str, list[int]]:
    """Each numeric key's steps in the journal, computed from the journal's own lines."""
    steps: dict[str, list[int]] = {}
    for line in journal.read_text().splitlines():
        record = json.loads(line)
        if record.get("kind") == "frame":
            for key, value in record["metrics"].items():
                if not isinstance(value, str):
                    steps.setdefault(key, []).append(record["step"])
    return steps


def test_a_tracker_down_at_the_runs_start_gets_every_frame_once_when_it_comes_up(tmp_path: Path) -> None:
    """A real `mlflow server` on a port chosen first and started only after the trainer's run start
    (and its first steps): the publisher retries the tracker's start on its backoff schedule and, once
    the server answers, sends every frame of the journal exactly once."""
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    out = tmp_path / "run"
    out.mkdir()
    script = tmp_path / "train.py"
    script.write_text(LATE_TRAIN.format(tests=str(TESTS)))
    log = tmp_path / "train.stderr"
    steps = 40
    with open(log, "wb") as err:
        trainer = subprocess.Popen([sys.executable, str(script), str(out), uri, str(steps), "0.25"],
                                   stdout=subprocess.DEVNULL, stderr=err)
    server = None
    try:
        for _ in range(1200):
            if (out / "started").exists() or trainer.poll() is not None:
                break
            time.sleep(0.05)
        time.sleep(5.0)  # the trainer runs on, its tracker down
        late = (out / "journal.jsonl").read_bytes().count(b'"kind":"frame"')  # the header is written at start
        server, served = start_server(tmp_path / "server", port)
        assert served == uri
        assert trainer.wait(600) == 0, log.read_text()[-3000:]
        client = MlflowClient(uri)
        runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                  filter_string=f"tags.`{RUN_ID_TAG}` = 'laterun01'")
        assert len(runs) == 1, [r.info.run_id for r in runs]
        run = runs[0]
        expected = journal_series(out / "journal.jsonl")
        assert expected["train/loss_avg"] == list(range(1, steps + 1))
        for key, want in expected.items():
            got = sorted(m.step for m in client.get_metric_history(run.info.run_id, key))
            assert got == want, key  # every frame, once
        assert run.info.status == "FINISHED" and run.data.params["rl/kl_beta"] == "0.04"
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()
        if server is not None:
            stop_server(server)
    said = log.read_text()
    assert "its start is retried" in said and "started on attempt" in said, said[-3000:]
    figure(f"MLflow down at the run's start, up after {late} frames: all {steps} frames landed once")


def test_a_run_deleted_mid_training_warns_once_through_the_publisher(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """The same through a publisher (the follower on a thread) with completions every step: the batches,
    the samples, the run's record and the close after the deletion cost one warning in all."""
    from posttrain_metrics.callbacks import MetricsCallback

    cb = MetricsCallback(adapters=["trainer"], out_dir=tmp_path, run_id="deletedrun01", publisher="thread",
                         sinks=[{"type": "journal"}, {"type": "mlflow", "experiment_name": "deleted-publisher"}])
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with cb:
            cb.on_run_start({})
            for step in range(1, 31):
                cb.on_chunk_end({"grad_norm": float(step)})
                cb.on_window_end(step)
                cb.on_samples(step, [{"group": 0, "completion": f"answer {step}"}])
                if step == 5:
                    for _ in range(600):  # the first frames landed: then the run is deleted by hand
                        runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
                        if runs and "train/grad_norm" in runs[0].data.metrics:
                            break
                        time.sleep(0.05)
                    else:
                        raise AssertionError("the first frames never reached MLflow")
                    client.delete_run(runs[0].info.run_id)
                time.sleep(0.05)
    ours = [str(w.message) for w in caught if "mlflow" in str(w.message) and "noload" not in str(w.message)]
    ours += [m for m in caplog.messages if "mlflow" in m]  # the rejection is a log record
    # Whichever reaches MLflow first after the deletion (a batch of frames or a step's completions) is
    # the one message; everything after it is counted, not said again.
    assert len(ours) == 1 and "rejected the" in ours[0] and "'active' state" in ours[0], ours


def closed_journal(path: Path, steps: int) -> None:
    """A finished run's journal of ``steps`` GRPO frames."""
    pub = Publisher([JournalSink(path)], adapters=GRPO_ADAPTERS, run_id="neverrun01", mode="inline")
    pub.start({})
    for frame in grpo_run(steps=steps):
        pub.publish(frame)
    pub.close()


@pytest.mark.parametrize("publisher", ["process", "thread"])
def test_a_tracker_that_never_comes_up_is_named_with_the_command_that_finishes_it(
        tmp_path: Path, publisher: str, caplog: pytest.LogCaptureFixture) -> None:
    """Nothing listens on the tracker's port for the whole run: the publisher retries its start until
    ``grace`` after the run's end, then names it as never started, with the command that finishes it
    (``publish`` beside the sinks file a publisher process has; a follower thread has none: ``export``);
    it is not counted as failed twice."""
    from posttrain_metrics.publication.process import sinks_path

    journal = tmp_path / "journal.jsonl"
    closed_journal(journal, 5)
    if publisher == "process":
        sinks_path(journal).write_text(json.dumps({"sinks": [{"type": "mlflow"}]}))
    command = (f"posttrain-metrics publish {journal}" if publisher == "process"
               else f"posttrain-metrics export {journal} --to mlflow")
    sink = MlflowSink(tracking_uri=f"http://127.0.0.1:{free_port()}", http_max_retries=0, http_timeout=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = follow(journal, [sink], follow=False, grace=4.0, report=False, record=False)
    said = [str(w.message) for w in caught] + caplog.messages  # retries and give-ups are log records
    never = [m for m in said if "never started" in m]
    assert len(never) == 1 and command in never[0], said
    if publisher == "thread":
        from posttrain_metrics.cli import main

        assert main(["publish", str(journal)]) != 0  # the command it would have named cannot work there
    assert sum("its start is retried" in m for m in said) == 1, said
    assert result["unstarted"] == ["mlflow"] and result["failures"] == {"mlflow": 1}
    assert result["sinks"]["mlflow"]["written"] == 0


def test_a_tracker_that_comes_up_between_two_retries_after_the_run_is_started_at_a_last_try(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The run has ended; the tracker's next retry is 10 minutes away (an injected schedule) when a real
    `mlflow server` comes up on its port: before giving it up at the end of ``grace``, the publisher
    tries once more, and it gets every frame once."""
    from posttrain_metrics.publication.backoff import Backoff

    journal = tmp_path / "journal.jsonl"
    closed_journal(journal, 5)
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    sink = MlflowSink(tracking_uri=uri, experiment_name="last-try", http_max_retries=0, http_timeout=2)
    done: dict[str, Any] = {}
    caplog.set_level(logging.INFO, logger="posttrain_metrics")  # a tracker that came back: info
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        thread = threading.Thread(target=lambda: done.update(follow(
            journal, [sink], follow=False, grace=30.0, report=False, record=False,
            retry=lambda: Backoff(first=600.0, limit=600.0))))
        thread.start()
        server = None
        try:
            for _ in range(600):  # its first start failed: the next is 600 s away
                if any("its start is retried in 600 s" in m for m in caplog.messages):
                    break
                time.sleep(0.05)
            server, _ = start_server(tmp_path / "server", port)
            thread.join(120)
            assert not thread.is_alive()
            client = MlflowClient(uri)
            [run] = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                       filter_string=f"tags.`{RUN_ID_TAG}` = 'neverrun01'")
            steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "train/loss_avg"))
        finally:
            if server is not None:
                stop_server(server)
    said = [str(w.message) for w in caught] + caplog.messages
    assert steps == [1, 2, 3, 4, 5], steps
    assert done["unstarted"] == [] and done["sinks"]["mlflow"]["written"] == 5
    assert not any("never started" in m for m in said) and any("started on attempt 2" in m for m in said), said


def test_the_close_summary_names_a_tracker_that_never_started(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    class Unreachable(MemorySink):
        name = "unreachable"

        def start(self, run: RunInfo) -> None:
            raise ConnectionError("tracker unreachable at start")

    journal = tmp_path / "journal.jsonl"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pub = Publisher([Unreachable(), JournalSink(journal)], adapters=GRPO_ADAPTERS, mode="inline")
        pub.start({})
        for frame in grpo_run(steps=3):
            pub.publish(frame)
        pub.close()
    said = [m for m in [str(w.message) for w in caught] + caplog.messages if "never started" in m]
    assert len(said) == 1 and "['unreachable']" in said[0] and f"posttrain-metrics export {journal}" in said[0], said


# -- a sweep on one SQLite store -----------------------------------------------------------------------

SWEEP_TRAIN = """
import random, sys, time
sys.path.insert(0, {tests!r})
from _runs import grpo_chunk
from posttrain_metrics.callbacks import MetricsCallback

import mlflow  # imported before the start, as a trainer that uses MLflow itself has it

cb = MetricsCallback(
    adapters=["grpo", "reward", "trainer"], out_dir=sys.argv[1], run_id=sys.argv[3], run_name=sys.argv[3],
    sinks=[{{"type": "journal"}}, {{"type": "mlflow", "tracking_uri": sys.argv[2], "experiment_name": "sweep"}}],
    publisher=sys.argv[5],
)
go = float(sys.argv[4])
while time.time() < go:  # every run starts at the same instant
    time.sleep(0.001)
cb.on_run_start({{"seed": sys.argv[3]}})
rng = random.Random(0)
with cb:
    for step in range(1, 11):
        for c in range(2):
            cb.on_chunk_end(grpo_chunk(rng, step, last=c == 1))
        cb.on_window_end(step)
"""


@pytest.mark.parametrize("mode", ["inline", "process"])
def test_runs_started_at_once_on_one_fresh_sqlite_store_each_hold_every_step(tmp_path: Path, mode: str) -> None:
    """Four real trainer processes start their runs at the same instant on one fresh `sqlite:///` file
    (a sweep): MLflow's schema is created once, and every run holds all 10 steps of its journal. Inline,
    the four sinks open the store within milliseconds of each other (without a lock, MLflow's schema
    creation races: `duplicate column name: step`); with publisher processes, as their start-up allows."""
    store = tmp_path / "shared" / "mlflow.db"
    uri = f"sqlite:///{store}"
    script = tmp_path / "train.py"
    script.write_text(SWEEP_TRAIN.format(tests=str(TESTS)))
    names = [f"sweep{i}" for i in range(4)]
    go = time.time() + 8.0  # after every interpreter has started and imported mlflow
    procs = []
    for name in names:
        err = open(tmp_path / f"{name}.stderr", "wb")  # noqa: SIM115 - closed below
        cmd = [sys.executable, str(script), str(tmp_path / name), uri, name, str(go), mode]
        procs.append((subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err), err))
    for proc, err in procs:
        code = proc.wait(600)
        err.close()
        assert code == 0, (tmp_path / f"{proc.args[5]}.stderr").read_text()[-3000:]
    client = MlflowClient(uri)
    for name in names:
        runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                  filter_string=f"tags.`{RUN_ID_TAG}` = '{name}'")
        assert len(runs) == 1, (name, (tmp_path / f"{name}.stderr").read_text()[-3000:])
        expected = journal_series(tmp_path / name / "journal.jsonl")
        assert expected["train/loss_avg"] == list(range(1, 11))
        for key, want in expected.items():
            assert sorted(m.step for m in client.get_metric_history(runs[0].info.run_id, key)) == want, (name, key)
        assert runs[0].info.status == "FINISHED"


# -- completions tables of a long run ------------------------------------------------------------------

SAMPLE_COLUMNS = ["group", "prompt", "completion", "reward", "truncated"]


def step_rows(step: int) -> list[list[Any]]:
    """Four rows of a step, made here (the expected values of the tables)."""
    return [[g, f"prompt {step}.{g}", f'answer {step}.{g}, with "quotes" and a\nnewline', float((step + g) % 2), ""]
            for g in range(4)]


def read_table(client: MlflowClient, run_id: str, path: str, into: Path) -> dict[str, Any]:
    return dict(json.loads(Path(client.download_artifacts(run_id, path, str(into))).read_text()))


@pytest.mark.parametrize("block", [None, 4])
def test_a_long_runs_completions_stay_tables_with_a_valid_tag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              block: int | None) -> None:
    """1,200 steps of completions into the embedded store (MLflow cut its loggedArtifacts tag past about
    107 steps). The tag stays valid JSON within MLflow's limit and lists only tables; the tables it
    lists hold every step's rows exactly once, and each step's own file holds its rows. With blocks of
    4 steps the tag fills up and blocks are merged (read back from the store) until it fits."""
    from mlflow.utils.validation import MAX_TAG_VAL_LENGTH

    from posttrain_metrics.integrations.mlflow import tables as mlflow_tables
    from posttrain_metrics.journal.samples import Samples

    if block is not None:
        monkeypatch.setattr(mlflow_tables, "BLOCK", block)
    steps = 1200
    sink = MlflowSink(dir=tmp_path, experiment_name="tables")
    sink.start(run_info())
    started = time.perf_counter()
    for step in range(1, steps + 1):
        rows = [dict(zip(SAMPLE_COLUMNS, row)) for row in step_rows(step)]
        sink.write_samples(Samples(step, rows, SAMPLE_COLUMNS, offered=8))
    per_step = (time.perf_counter() - started) / steps
    sink.close()
    client = MlflowClient(sink.tracking_uri)
    tag = client.get_run(sink.run_id).data.tags["mlflow.loggedArtifacts"]
    assert len(tag) <= MAX_TAG_VAL_LENGTH
    entries = json.loads(tag)  # valid JSON
    assert entries and all(e["type"] == "table" for e in entries)
    got: dict[int, list[list[Any]]] = {}
    for entry in entries:
        table = read_table(client, sink.run_id, entry["path"], tmp_path / "dl")
        assert table["columns"] == ["step", *SAMPLE_COLUMNS]
        for row in table["data"]:
            got.setdefault(row[0], []).append(row[1:])
    assert sorted(got) == list(range(1, steps + 1))
    for step in (1, 2, 107, 108, 600, steps):
        assert got[step] == step_rows(step), step  # once each, in order
        own = read_table(client, sink.run_id, f"posttrain_metrics/samples/step_{step:08d}.json", tmp_path / "own")
        assert own == {"columns": SAMPLE_COLUMNS, "data": step_rows(step)}
    assert all(got[step] == step_rows(step) for step in got)
    figure(f"{steps} completions steps, blocks of {block or mlflow_tables.BLOCK} at first: {len(entries)} tables "
           f"in a {len(tag)}-character tag, {per_step * 1000:.1f} ms per step (embedded store)")
