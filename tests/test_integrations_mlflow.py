"""The MLflow sink, for real: published through the Publisher (journal + mlflow) to a real
``mlflow server`` and to the embedded ``sqlite:///`` store, read back with ``MlflowClient``."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

try:
    import mlflow
    from mlflow import MlflowClient
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH
except ImportError as exc:  # fail, never skip: the MLflow sink is part of the product
    raise ImportError(
        f"tests/test_integrations_mlflow.py needs mlflow ({exc}); fix: pip install 'posttrain-metrics[mlflow]'"
    ) from exc

from _mlflow_server import SERVER_STORES, free_port
from _runs import (
    GRPO_ADAPTERS,
    LABELLED,
    dpo_run,
    expected_series,
    grpo_run,
    hand_frames,
    nonfinite_frame,
    ppo_run,
)

from posttrain_metrics import Frame
from posttrain_metrics.core.keys import describe
from posttrain_metrics.core.redact import REDACTED
from posttrain_metrics.core.reducer import resolve_adapters
from posttrain_metrics.integrations import RunInfo
from posttrain_metrics.integrations.mlflow import INSTALL, MlflowSink
from posttrain_metrics.journal import JournalSink, read_journal
from posttrain_metrics.publication import Publisher

MLFLOW_VERSION = tuple(int(part) for part in mlflow.__version__.split(".")[:2])
SECRET = "hunter2-secret"
URI_SECRET = "hunter2-uri-pw"
LIST_SECRET = "hf_abcdefghijklmnopqrstuvwxyz0123"
CONFIG: dict[str, Any] = {
    "rl": {"kl_beta": 0.04, "group_size": 8, "use_kl": True, "name": "grpo"},
    "optim": {"lr": 1e-3, "betas": [0.9, 0.95], "scheduler": None},
    "db": {"password": SECRET},
    "tracker": {"uri": f"postgresql://alice:{URI_SECRET}@db.internal:5432/runs"},
    "env": [{"name": "HF_TOKEN", "value": LIST_SECRET}],  # a secret inside a dict inside a list
}
ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
       "MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR")


@pytest.fixture(autouse=True)
def clean_env() -> Iterator[None]:
    """The sink sets MLflow's HTTP variables for the process; each test starts and ends without them."""
    saved = dict(os.environ)
    for var in (*ENV, "MLFLOW_RUN_ID"):
        os.environ.pop(var, None)
    yield
    os.environ.clear()
    os.environ.update(saved)


class Backend:
    def __init__(self, kind: str, store: Path, make: Callable[..., MlflowSink]) -> None:
        self.kind = kind
        self.store = store  # where the backend keeps its data (searched for planted secrets)
        self.make = make


@pytest.fixture(scope="module")
def embedded_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One embedded store for the module: creating an MLflow SQLite database takes seconds."""
    return tmp_path_factory.mktemp("mlflow-embedded")


@pytest.fixture(params=["server", "sqlite"])
def backend(request: pytest.FixtureRequest, embedded_dir: Path) -> Backend:
    experiment = f"test-{uuid.uuid4().hex[:8]}"  # one experiment per test
    if request.param == "server":
        uri = request.getfixturevalue("mlflow_server")
        return Backend("server", SERVER_STORES[uri],
                       lambda **kw: MlflowSink(tracking_uri=uri, experiment_name=experiment, **kw))
    # the embedded default, sqlite:///<dir>/mlflow.db
    return Backend("sqlite", embedded_dir, lambda **kw: MlflowSink(dir=embedded_dir, experiment_name=experiment, **kw))


def publish(
    sink: MlflowSink,
    frames: Sequence[Frame],
    adapters: Any,
    journal: Path,
    *,
    config: Mapping[str, Any] | None = None,
    failed: bool = False,
    run_id: str | None = None,
    mode: str = "process",
) -> Publisher:
    pub = Publisher([JournalSink(journal), sink], adapters=adapters, run_id=run_id, mode=mode)
    pub.start(config or {})
    for frame in frames:
        pub.publish(frame)
    pub.close(failed=failed)
    assert pub.failures == {}, f"a sink failed: {pub.failures}"
    reported(sink, pub)
    assert sink.run_id is not None
    return pub


def reported(sink: MlflowSink, pub: Publisher) -> None:
    """The run the publisher reported, on the (unstarted) sink object the test holds: in the
    publisher process mode the sink that wrote is a copy in another process."""
    handles = pub.run_handles()["mlflow"]
    assert handles["run_id"] and handles["tracking_uri"], handles
    sink.run_id = sink.run_id or handles["run_id"]
    sink.tracking_uri = sink.tracking_uri or handles["tracking_uri"]
    assert (sink.run_id, sink.tracking_uri) == (handles["run_id"], handles["tracking_uri"])


def history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))




def assert_history(client: MlflowClient, run_id: str, expected: Mapping[str, list[tuple[int, float]]]) -> None:
    stored = {k for k in client.get_run(run_id).data.metrics if not k.startswith("run/")}  # run/: aggregates
    assert stored == set(expected), f"extra {stored - set(expected)}, missing {set(expected) - stored}"
    for key, points in expected.items():
        got = history(client, run_id, key)
        assert [s for s, _ in got] == [s for s, _ in points], key
        for (_, g), (_, e) in zip(got, points):
            assert g == pytest.approx(e, rel=1e-12, abs=0.0) or (math.isnan(g) and math.isnan(e)), key


# --------------------------------------------------------------------------------------- runs


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_grpo_every_key_every_step(backend: Backend, tmp_path: Path, mode: str) -> None:
    frames = grpo_run(steps=6)
    sink = backend.make(run_name="grpo-readback")
    pub = publish(sink, frames, GRPO_ADAPTERS, tmp_path / "journal.jsonl", config=CONFIG, mode=mode)
    client = MlflowClient(sink.tracking_uri)
    run = client.get_run(sink.run_id)

    expected = expected_series(frames)
    assert len(expected) > 30
    assert_history(client, run.info.run_id, expected)
    # the outcome: a tag with the last label, and 0/1 series per label that chart
    assert "optim/update_outcome" not in run.data.metrics  # never a string metric
    assert run.data.tags["optim/update_outcome"] == "applied"
    assert history(client, run.info.run_id, "optim/update_outcome/skipped") == [
        (s, 1.0 if s == 3 else 0.0) for s in range(1, 7)
    ]
    assert history(client, run.info.run_id, "optim/step_skipped")[2] == (3, 1.0)  # a bool as a number
    assert history(client, run.info.run_id, "train/response_len_max")[0][1] == frames[0].metrics[
        "train/response_len_max"]  # an int as a number
    # run identity, params, status
    assert run.info.run_name == "grpo-readback"
    assert run.data.tags["posttrain_metrics.run_id"] == pub.run_id
    assert run.data.tags["posttrain_metrics.adapters"] == "grpo,reward,trainer"
    params = run.data.params
    assert params["rl/kl_beta"] == "0.04" and params["rl/use_kl"] == "True" and params["rl/name"] == "grpo"
    # a list is one readable param, not optim/betas/0 and optim/betas/1; None as mlflow.log_param writes it
    assert params["optim/betas"] == "[0.9, 0.95]" and not any(k.startswith("optim/betas/") for k in params)
    assert params["optim/scheduler"] == "None"
    assert params["env"] == '[{"name": "HF_TOKEN", "value": "' + REDACTED + '"}]'
    assert run.info.status == "FINISHED"


def test_secrets_are_nowhere(backend: Backend, tmp_path: Path) -> None:
    sink = backend.make()
    publish(sink, grpo_run(steps=2), GRPO_ADAPTERS, tmp_path / "journal.jsonl", config=CONFIG)
    run = MlflowClient(sink.tracking_uri).get_run(sink.run_id)
    assert run.data.params["db/password"] == REDACTED
    assert run.data.params["tracker/uri"] == f"postgresql://alice:{REDACTED}@db.internal:5432/runs"
    for secret in (SECRET, URI_SECRET, LIST_SECRET):
        for kind, entries in (("param", run.data.params), ("tag", run.data.tags)):
            for key, value in entries.items():
                assert secret not in key and secret not in value, f"{kind} {key} leaks a secret"
        assert not any(secret in key for key in run.data.metrics)
    # the stored bytes: the SQLite database (and its journal/WAL files) of the backend
    files = [p for p in backend.store.rglob("*") if p.is_file()]
    assert any(p.name == "mlflow.db" for p in files), files
    for path in files:
        data = path.read_bytes()
        assert not any(s.encode() in data for s in (SECRET, URI_SECRET, LIST_SECRET)), f"{path} holds a secret"
    assert SECRET not in (tmp_path / "journal.jsonl").read_text()


@pytest.mark.parametrize("mode", ["inline", "process"])
def test_failed_run_is_failed(backend: Backend, tmp_path: Path, mode: str) -> None:
    sink = backend.make()
    with pytest.raises(RuntimeError, match="boom"), \
            Publisher([JournalSink(tmp_path / "j.jsonl"), sink], adapters=GRPO_ADAPTERS, mode=mode) as pub:
        pub.publish(grpo_run(steps=1)[0])
        raise RuntimeError("boom")
    reported(sink, pub)
    client = MlflowClient(sink.tracking_uri)
    run = client.get_run(sink.run_id)
    assert run.info.status == "FAILED"
    assert history(client, run.info.run_id, "train/loss_avg")[0][0] == 1  # what was logged stays
    sink.close()  # idempotent: a second close changes nothing
    assert client.get_run(sink.run_id).info.status == "FAILED"


def test_ppo_critic_warmup_has_no_policy_points(backend: Backend, tmp_path: Path) -> None:
    frames = ppo_run(steps=4, warmup=2)
    sink = backend.make()
    publish(sink, frames, "ppo", tmp_path / "journal.jsonl")
    client = MlflowClient(sink.tracking_uri)
    expected = expected_series(frames)
    assert_history(client, sink.run_id, expected)
    for key in ("train/policy_loss", "train/clip_fraction", "optim/policy_optimizer_step"):
        assert [s for s, _ in history(client, sink.run_id, key)] == [3, 4], key  # absent, not 0
    assert [s for s, _ in history(client, sink.run_id, "train/critic_loss")] == [1, 2, 3, 4]


def test_dpo_train_and_val(backend: Backend, tmp_path: Path) -> None:
    frames = dpo_run(steps=3)
    sink = backend.make()
    publish(sink, frames, "dpo", tmp_path / "journal.jsonl")
    client = MlflowClient(sink.tracking_uri)
    assert_history(client, sink.run_id, expected_series(frames))
    for key in ("train/loss_avg", "val/loss_avg", "train/dpo_accuracy", "val/dpo_accuracy"):
        assert [s for s, _ in history(client, sink.run_id, key)] == [1, 2, 3], key


def test_nonfinite_nan_kept_inf_skipped_and_counted(backend: Backend, tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    frames = [grpo_run(steps=1)[0], nonfinite_frame(step=2), nonfinite_frame(step=3)]
    sink = backend.make()
    assert sink.stores_nonfinite == frozenset({"nan"})
    publish(sink, frames, GRPO_ADAPTERS, tmp_path / "journal.jsonl", mode="thread")  # thread: logged here
    warned = [m for m in caplog.messages if "cannot be stored faithfully" in m]
    assert len(warned) == 2  # once per key, not once per step
    client = MlflowClient(sink.tracking_uri)
    loss = history(client, sink.run_id, "train/loss_avg")
    assert [s for s, _ in loss] == [1, 2, 3] and math.isnan(loss[1][1]) and math.isnan(loss[2][1])
    for key in ("train/kl_max", "train/kl_mean"):  # ±inf would read back as ±1.797e308: skipped
        assert [s for s, _ in history(client, sink.run_id, key)] == [1], key
        assert history(client, sink.run_id, f"health/nonfinite/{key}") == [(2, 1.0), (3, 2.0)]
    assert "health/nonfinite/train/loss_avg" not in client.get_run(sink.run_id).data.metrics
    journal = read_journal(tmp_path / "journal.jsonl")  # the journal keeps the exact values
    last = journal.frames[-1].metrics
    assert math.isnan(last["train/loss_avg"]) and last["train/kl_max"] == math.inf
    assert last["train/kl_mean"] == -math.inf


# ------------------------------------------------------------------------------ names, params


def run_info(config: Mapping[str, Any] | None = None, run_id: str | None = None) -> RunInfo:
    from posttrain_metrics.core.redact import flatten_config

    adapters = resolve_adapters(GRPO_ADAPTERS)
    return RunInfo(run_id or uuid.uuid4().hex[:16], "names", flatten_config(config or {}), describe(adapters),
                   tuple(a.name for a in adapters), time.time())


def test_rejected_names_are_mapped_and_warned_once(backend: Backend) -> None:
    long_key = "train/" + "x" * 300
    weird = {"train/kl@0.5": 1.0, "train//double": 2.0, "/lead/": 3.0, long_key: 4.0, "ok/a b-c.d_e:f": 5.0}
    config: dict[str, Any] = {f"p{i:03d}": i for i in range(2 * MAX_PARAMS_TAGS_PER_BATCH + 17)}
    config.update({"opt/β1?": 0.9, "long": "y" * (MAX_PARAM_VAL_LENGTH + 50)})
    sink = backend.make()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sink.start(run_info(config))
        for step in (1, 2):
            sink.write(Frame(step, {**weird, "optim/odd?label": "alpha"}, "train", 1_700_000_000.0 + step))
        sink.close()
    messages = [str(w.message) for w in caught if str(w.message).startswith("mlflow:")]
    mapped = [m for m in messages if "is not a valid MLflow name" in m]
    assert len(mapped) == 6, mapped  # 4 metric names, 1 tag name, 1 param name: each warned once
    assert sum("truncated" in m for m in messages) == 1
    assert sink.rejected == 0

    client = MlflowClient(sink.tracking_uri)
    run = client.get_run(sink.run_id)
    names = set(run.data.metrics)
    assert {"train/kl_0.5", "train/double", "lead", "ok/a b-c.d_e:f"} <= names
    assert len(names) == 5 and all(len(n) <= 250 for n in names)
    (long_name,) = [n for n in names if n.startswith("train/xxx")]
    assert [s for s, _ in history(client, sink.run_id, long_name)] == [1, 2]
    assert history(client, sink.run_id, "train/kl_0.5") == [(1, 1.0), (2, 1.0)]
    assert run.data.tags["optim/odd_label"] == "alpha"
    params = run.data.params
    assert len([k for k in params if k.startswith("p")]) == 2 * MAX_PARAMS_TAGS_PER_BATCH + 17
    assert params["opt/β1_"] == "0.9"  # unicode letters are valid in MLflow names; '?' is not
    assert params["long"] == "y" * MAX_PARAM_VAL_LENGTH


def test_resumed_run_continues_the_same_mlflow_run(backend: Backend, tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    frames = grpo_run(steps=4)
    first = backend.make()
    publish(first, frames[:2], GRPO_ADAPTERS, tmp_path / "journal.jsonl", config=CONFIG, run_id="resume-me")
    second = backend.make()
    publish(second, frames[2:], GRPO_ADAPTERS, tmp_path / "journal.jsonl",
            config={**CONFIG, "rl": {**CONFIG["rl"], "kl_beta": 0.1}}, run_id="resume-me", mode="thread")
    # thread: logged in this process; the run's state, not a misuse: a log record
    assert sum("params cannot change" in m for m in caplog.messages) == 1, caplog.messages
    assert second.run_id == first.run_id
    client = MlflowClient(second.tracking_uri)
    assert [s for s, _ in history(client, second.run_id, "train/loss_avg")] == [1, 2, 3, 4]
    run = client.get_run(second.run_id)
    assert run.info.status == "FINISHED" and run.data.params["rl/kl_beta"] == "0.04"
    # an explicit MLflow run id targets that run
    third = backend.make(run_id=first.run_id)
    publish(third, [Frame(5, {"train/loss_avg": 0.5}, "train", 1_700_000_005.0)], GRPO_ADAPTERS,
            tmp_path / "journal.jsonl")
    assert [s for s, _ in history(client, first.run_id, "train/loss_avg")] == [1, 2, 3, 4, 5]


# ------------------------------------------------------------------------ configuration


def test_missing_mlflow_fails_with_the_install_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    sink = MlflowSink(dir=tmp_path / "never")  # constructing needs no mlflow and does no I/O
    assert not (tmp_path / "never").exists()
    monkeypatch.setitem(sys.modules, "mlflow", None)  # `import mlflow` now raises ImportError
    with pytest.raises(ModuleNotFoundError) as info:
        sink.start(run_info())
    assert INSTALL in str(info.value).splitlines()
    assert INSTALL == "pip install 'posttrain-metrics[mlflow]'"


def test_tracking_uri_explicit_then_environment_then_embedded(
    tmp_path: Path, embedded_dir: Path, mlflow_server: str
) -> None:
    embedded = "sqlite:///" + (embedded_dir / "mlflow.db").resolve().as_posix()
    os.environ["MLFLOW_TRACKING_URI"] = embedded
    explicit = MlflowSink(tracking_uri=mlflow_server, dir=tmp_path / "a", experiment_name="uri")
    from_env = MlflowSink(dir=tmp_path / "b", experiment_name="uri")
    for sink in (explicit, from_env):
        sink.start(run_info())
        sink.close()
    assert explicit.tracking_uri == mlflow_server and from_env.tracking_uri == embedded
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()  # no embedded store made
    del os.environ["MLFLOW_TRACKING_URI"]
    default = MlflowSink(dir=embedded_dir, experiment_name="uri-embedded")
    default.start(run_info())
    default.close()
    assert default.tracking_uri == embedded
    run = MlflowClient(default.tracking_uri).get_run(default.run_id)
    assert run.info.status == "FINISHED"
    # the embedded store keeps artifacts next to its database, not in ./mlruns of the cwd
    assert run.info.artifact_uri.startswith((embedded_dir / "mlartifacts").resolve().as_uri())


def test_http_retry_settings(mlflow_server: str) -> None:
    def started(**kw: Any) -> None:
        sink = MlflowSink(tracking_uri=mlflow_server, experiment_name="http-settings", **kw)
        sink.start(run_info())
        sink.close()

    started()  # nothing set: our defaults
    assert [os.environ[v] for v in ENV[2:]] == ["2", "20", "1"]
    os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = "45"  # the user's own setting is kept
    del os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"]
    started()
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "45"
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "2"
    started(http_timeout=7, http_max_retries=0)  # an explicit argument wins
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "7"
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "0"


def test_bad_arguments_say_what_and_how() -> None:
    from posttrain_metrics import MetricsError

    with pytest.raises(MetricsError, match=r"http_timeout='10'.*int"):
        MlflowSink(http_timeout="10")  # type: ignore[arg-type]
    with pytest.raises(MetricsError, match="max_pending=0"):
        MlflowSink(max_pending=0)


# ----------------------------------------------------------------------------- outage


class Outage:
    """A TCP relay in front of the real server that can go down (connections reset, then refused)
    and come back on the same port: an outage without the seconds a server restart costs."""

    def __init__(self, target: str) -> None:
        self.target = int(target.rsplit(":", 1)[1])
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self._listener: socket.socket | None = None
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()

    def up(self) -> None:
        listener = socket.create_server(("127.0.0.1", self.port))
        listener.settimeout(0.1)
        with self._lock:
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        with self._lock:  # no connection accepted meanwhile survives the outage
            listener, self._listener = self._listener, None
            if listener is not None:
                listener.close()
            for conn in self._open:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
                conn.close()
            self._open.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    return
                client.settimeout(None)
                upstream = socket.create_connection(("127.0.0.1", self.target))
                self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for conn in (a, b):
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)


def test_dead_server_costs_the_sink_not_the_step(tmp_path: Path, mlflow_server: str,
                                                caplog: pytest.LogCaptureFixture) -> None:
    """The server goes away mid-run and comes back: no step waits on it, and every step lands once."""
    caplog.set_level(logging.INFO, logger="posttrain_metrics")  # the recovery is an INFO record
    outage = Outage(mlflow_server)
    outage.up()
    frames = grpo_run(steps=10)
    sink = MlflowSink(tracking_uri=outage.uri, experiment_name="outage", http_max_retries=1,
                      http_backoff_factor=0, http_timeout=5)
    # No stopwatch: the sink's writes are watched. Each records its thread; during the outage the first
    # one is held until the test has published every outage step, so a step that waited on the sink
    # could not return.
    training_thread, writers = threading.get_ident(), set()
    hold, held = threading.Event(), []
    hold.set()
    write = sink.write

    def watched_write(frame: Frame) -> None:
        writers.add(threading.get_ident())
        if not hold.is_set():
            held.append(frame.step)
            hold.wait(60)
        write(frame)

    sink.write = watched_write  # type: ignore[method-assign]
    # thread mode: the trackers are fed from the journal by a follower thread of this process, so the
    # wrapped write can be watched (the process mode's outage test is in test_tracker_failures)
    pub = Publisher([JournalSink(tmp_path / "journal.jsonl"), sink], adapters=GRPO_ADAPTERS, mode="thread")
    try:
        pub.start(CONFIG)
        for frame in frames[:3]:
            pub.publish(frame)
        client = MlflowClient(mlflow_server)
        deadline = time.monotonic() + 20
        # the follower thread starts the sink (and so learns its run id) on its own time
        while time.monotonic() < deadline and (
                sink.run_id is None or len(history(client, sink.run_id, "train/loss_avg")) < 3):
            time.sleep(0.05)
        assert sink.run_id is not None and len(history(client, sink.run_id, "train/loss_avg")) == 3
        outage.down()
        hold.clear()
        pub.publish(frames[3])
        deadline = time.monotonic() + 20
        while not held and time.monotonic() < deadline:
            time.sleep(0.01)
        assert held == [4]  # the sink is inside its write of step 4, held there
        for frame in frames[4:6]:
            pub.publish(frame)
        # ordering: steps 5 and 6 returned while the sink had still not finished step 4's write
        assert held == [4] and not hold.is_set()
        hold.set()  # now it meets the dead server
        for frame in frames[6:8]:
            time.sleep(0.3)  # a training step; failures surface meanwhile
            pub.publish(frame)
        time.sleep(0.3)
        assert training_thread not in writers and writers  # no sink write ever ran on the step's thread
        assert sink.degraded
        assert any("degraded" in m for m in caplog.messages), caplog.messages  # a log record
        outage.up()
        for frame in frames[8:]:
            pub.publish(frame)
        pub.close()
        assert sum("answers again; resending" in m for m in caplog.messages) == 1, caplog.messages
        assert pub.failures == {}
        assert sink.unconfirmed == 0 and not sink.degraded
        assert [s for s, _ in history(client, sink.run_id, "train/loss_avg")] == list(range(1, 11))
        assert_history(client, sink.run_id, expected_series(frames))
        assert client.get_run(sink.run_id).info.status == "FINISHED"
    finally:
        outage.down()


def test_server_down_at_close_gives_up_quickly(tmp_path: Path, mlflow_server: str,
                                               caplog: pytest.LogCaptureFixture) -> None:
    """A server that never comes back costs close() a few seconds, not drain_timeout; what was
    held is counted and warned about, and the journal has every frame."""
    outage = Outage(mlflow_server)
    outage.up()
    drain_timeout = 120
    sink = MlflowSink(tracking_uri=outage.uri, experiment_name="down-at-close", http_max_retries=0,
                      http_backoff_factor=0, http_timeout=5, backlog=3, drain_timeout=drain_timeout)
    pub = Publisher([JournalSink(tmp_path / "journal.jsonl"), sink], adapters=GRPO_ADAPTERS, mode="inline")
    try:
        pub.start({})
        outage.down()
        for frame in grpo_run(steps=6):
            pub.publish(frame)
            time.sleep(0.1)
        t0 = time.monotonic()
        pub.close()
        took = time.monotonic() - t0
    finally:
        outage.down()
    messages = caplog.messages  # the tracker's state at close: log records
    # close gave up on a failed probe instead of waiting out drain_timeout: a close that waited takes at
    # least drain_timeout by construction (a logical bound, not a speed bound; it took ~3 s when written)
    assert took < drain_timeout, took
    assert sink.degraded and sink.unconfirmed == 6  # held beyond its backlog: nothing is ever dropped
    assert not sink.ready()  # a publisher feeding it from the journal would have stopped reading
    assert any("were not confirmed" in m and "posttrain-metrics export" in m for m in messages)
    assert any("keeps status RUNNING" in m for m in messages)
    assert MlflowClient(mlflow_server).get_run(sink.run_id).info.status == "RUNNING"
    assert [f.step for f in read_journal(tmp_path / "journal.jsonl").frames] == [1, 2, 3, 4, 5, 6]


# ------------------------------------------------- run aggregates, labels, user, experiment


def finite_hand_frames() -> list[Frame]:
    """_runs.hand_frames with a finite step 3 (MLflow cannot hold +inf), whose kl_max (0.5) is not the
    run's maximum (0.75 at step 2): the runs table must show the maximum, not the last value."""
    frames = hand_frames()
    third = dict(frames[2].metrics, **{"train/loss_avg": 0.25, "train/kl_mean": 0.125, "train/kl_max": 0.5})
    return [frames[0], frames[1], Frame(3, third, "train", frames[2].wall_time)]


def test_run_aggregates_are_logged_at_close(backend: Backend, tmp_path: Path) -> None:
    sink = backend.make()
    publish(sink, finite_hand_frames(), GRPO_ADAPTERS, tmp_path / "journal.jsonl")
    client = MlflowClient(sink.tracking_uri)
    metrics = client.get_run(sink.run_id).data.metrics  # what the runs table shows: the latest values
    assert metrics["train/kl_max"] == 0.5  # the last window's
    assert metrics["run/train/kl_max"] == 0.75  # max(0.25, 0.75, 0.5)
    assert metrics["run/train/loss_avg"] == pytest.approx(10 / 60, rel=1e-12)  # (0.5*10 + 0*30 + 0.25*20) / 60
    assert metrics["run/train/kl_mean"] == pytest.approx(0.25, rel=1e-12)  # (0.5*10 + 0.25*30 + 0.125*20) / 60
    assert metrics["run/train/valid_token_count"] == 60  # 10 + 30 + 20
    assert metrics["run/train/grad_norm"] == 1.5  # LAST: step 3's
    assert metrics["run/timer/e2e_step_s"] == pytest.approx(2.0, rel=1e-12)  # (1 + 3 + 2) / 3
    assert (metrics["run/optim/update_outcome/applied"], metrics["run/optim/update_outcome/skipped"]) == (2, 1)
    assert history(client, sink.run_id, "run/train/kl_max") == [(3, 0.75)]  # one point, at the last step



def test_the_run_spans_the_training_not_the_publishers_drain(backend: Backend, tmp_path: Path) -> None:
    """MLflow's duration is end_time - start_time: the run starts when training started and ends at
    its last frame (1_700_000_003.0), not when the publisher had drained and attached the record."""
    sink = backend.make()
    pub = Publisher([JournalSink(tmp_path / "journal.jsonl"), sink], adapters=GRPO_ADAPTERS)
    pub.start({}, started=1_699_999_999.5)
    for frame in finite_hand_frames():  # wall times 1_700_000_001.0, .002.0, .003.0
        pub.publish(frame)
    pub.close()
    reported(sink, pub)
    info = MlflowClient(sink.tracking_uri).get_run(sink.run_id).info
    assert (info.start_time, info.end_time) == (1_699_999_999_500, 1_700_000_003_000)  # 3.5 s of training


@pytest.mark.parametrize("mode", ["inline", "process"])
def test_a_label_absent_from_a_later_frame_leaves_no_stale_tag(backend: Backend, tmp_path: Path, mode: str) -> None:
    adapters = [*GRPO_ADAPTERS, "validation"]
    kept = backend.make()
    publish(kept, LABELLED[:3], adapters, tmp_path / "a.jsonl", mode=mode)
    client = MlflowClient(kept.tracking_uri)
    assert client.get_run(kept.run_id).data.tags["optim/skip_reason"] == "nonfinite_loss"  # val frame: kept
    cleared = backend.make()
    publish(cleared, LABELLED, adapters, tmp_path / "b.jsonl", mode=mode)
    tags = client.get_run(cleared.run_id).data.tags
    assert "optim/skip_reason" not in tags and tags["optim/update_outcome"] == "applied"
    assert history(client, cleared.run_id, "optim/skip_reason/nonfinite_loss") == [(2, 1.0)]  # history kept


def test_the_creating_user_and_the_experiment_kind_are_recorded(mlflow_server: str, tmp_path: Path) -> None:
    import pwd

    client = MlflowClient(mlflow_server)
    old = client.create_experiment(f"made-by-hand-{uuid.uuid4().hex[:6]}")  # no kind tag yet
    name = client.get_experiment(old).name
    for experiment in (name, f"new-{uuid.uuid4().hex[:6]}"):
        sink = MlflowSink(tracking_uri=mlflow_server, experiment_name=experiment)
        publish(sink, grpo_run(steps=1), GRPO_ADAPTERS, tmp_path / f"{experiment}.jsonl")
        run = client.get_run(sink.run_id)
        assert run.data.tags["mlflow.user"] == pwd.getpwuid(os.getuid()).pw_name
        found = client.get_experiment_by_name(experiment)
        assert found is not None and run.info.experiment_id == found.experiment_id
        # MLflow 3's UI opens an experiment of this kind on its runs table with metric charts
        assert found.tags["mlflow.experimentKind"] == "custom_model_development"


def test_the_printed_link_opens_the_runs_table_on_the_headline_columns(mlflow_server: str, tmp_path: Path) -> None:
    """MLflow 3.17's runs table shows every metric column hidden; the experiment's shared view state
    (tag ``mlflow.sharedViewState.<key>``, loaded by ``viewStateShareKey=<key>``) makes the headline
    keys and their run aggregates visible, in that order (checked in headless Chromium too)."""
    import json

    from posttrain_metrics.integrations.views import mlflow_link

    name = f"view-{uuid.uuid4().hex[:6]}"
    publish(MlflowSink(tracking_uri=mlflow_server, experiment_name=name), grpo_run(steps=1), GRPO_ADAPTERS,
            tmp_path / "journal.jsonl")
    experiment = MlflowClient(mlflow_server).get_experiment_by_name(name)
    assert experiment is not None
    state = json.loads(experiment.tags["mlflow.sharedViewState.posttrain-metrics"])
    # the GRPO run's numeric headline keys in declaration order, each with its run aggregate
    headline = ["train/loss_avg", "train/kl_mean", "train/kl_max", "train/reward_mean",
                "train/grpo_informative_group_count", "train/grad_norm"]
    expected = ["attributes.`Source`"] + [f"metrics.`{p}{k}`" for k in headline for p in ("", "run/")]
    assert state["selectedColumns"] == state["columnOrder"] == expected
    # the chart view: one first section, one line chart over steps per headline key, in that order
    assert [s["name"] for s in state["compareRunSections"]] == ["headline"] and state["isAccordionReordered"]
    charts = state["compareRunCharts"]
    assert [(c["metricKey"], c["type"], c["xAxisKey"]) for c in charts] == [(k, "LINE", "step") for k in headline]
    assert {c["metricSectionId"] for c in charts} == {state["compareRunSections"][0]["uuid"]}
    assert mlflow_link(mlflow_server, experiment.experiment_id) == (
        f"{mlflow_server}/#/experiments/{experiment.experiment_id}/runs"
        "?workflowType=machine_learning&viewStateShareKey=posttrain-metrics")
    assert mlflow_link(mlflow_server, "7", charts=True).endswith("viewStateShareKey=posttrain-metrics&compareRunsMode=CHART")
    assert mlflow_link("sqlite:////x/mlflow.db", "7") == (
        "http://127.0.0.1:5000/#/experiments/7/runs?workflowType=machine_learning&viewStateShareKey=posttrain-metrics")


def test_experiment_name_then_the_environment(tmp_path: Path) -> None:
    assert MlflowSink(experiment_name="a").experiment_name() == "a"
    os.environ["MLFLOW_EXPERIMENT_NAME"] = "from-env"
    assert MlflowSink().experiment_name() == "from-env" and MlflowSink(experiment_name="a").experiment_name() == "a"


def test_mlflow_run_id_from_the_environment_targets_that_run(mlflow_server: str, tmp_path: Path) -> None:
    client = MlflowClient(mlflow_server)
    experiment = client.create_experiment(f"env-run-{uuid.uuid4().hex[:6]}")
    target = client.create_run(experiment).info.run_id
    os.environ["MLFLOW_RUN_ID"] = target  # as `mlflow run` sets it
    sink = MlflowSink(tracking_uri=mlflow_server)
    publish(sink, grpo_run(steps=2), GRPO_ADAPTERS, tmp_path / "journal.jsonl")
    assert sink.run_id == target
    assert [s for s, _ in history(client, target, "train/loss_avg")] == [1, 2]


def test_an_explicit_sqlite_store_keeps_its_artifacts_next_to_its_database(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow's own default for a new experiment of a SQLite store is ./mlruns of the working
    directory: a trainer started elsewhere would scatter the run's record there."""
    store, elsewhere = tmp_path / "store", tmp_path / "cwd"
    store.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    db = store / "ml.db"
    sink = MlflowSink(tracking_uri=f"sqlite:///{db}", experiment_name="explicit-sqlite")
    publish(sink, grpo_run(steps=2), GRPO_ADAPTERS, tmp_path / "journal.jsonl", mode="inline")
    client = MlflowClient(f"sqlite:///{db}")
    client.log_text(sink.run_id, "hello", "note.txt")
    artifact_uri = client.get_run(sink.run_id).info.artifact_uri
    assert artifact_uri.startswith((store / "mlartifacts").as_uri()), artifact_uri
    assert list(store.joinpath("mlartifacts").rglob("note.txt"))
    # MLflow 3.5 itself makes an empty ./mlruns whenever a client opens any SQLite store (its default
    # artifact root); the dev pin does not. Either way nothing of the run may be written there.
    left = [] if MLFLOW_VERSION >= (3, 17) else [elsewhere / "mlruns"]
    assert sorted(elsewhere.rglob("*")) == left


# ------------------------------------------------- the embedded store's direct writes (_SqlitePoints)

# Batches of (key, value, timestamp ms, step) as a sink sends them, chosen for MLflow's rules: a NaN,
# an infinity, a key twice in one batch, a resent point (stored once), a step older than the latest,
# a later step with an older timestamp, a point equal in step and timestamp but greater in value
# (replaces the latest), a key first seen in a later batch.
ORACLE_BATCHES: list[list[tuple[str, float, int, int]]] = [
    [("a", 1.0, 1000, 1), ("b", 10.0, 1000, 1), ("a", 2.0, 2000, 2), ("nan", float("nan"), 1000, 1)],
    [("a", 2.0, 2000, 2), ("a", -1.0, 500, 0), ("b", 11.0, 900, 3), ("inf", float("inf"), 1000, 1)],
    [("b", 12.0, 900, 3), ("c", 5.0, 3000, 4), ("nan", 3.0, 1000, 2), ("a", 0.5, 2000, 2), ("c", 6.0, 3000, 4)],
]


def test_direct_sqlite_writes_store_what_log_batch_stores(tmp_path: Path) -> None:
    """The oracle is MLflow itself: the same batches through MlflowClient.log_batch into a second run
    must read back the same, point for point (history) and key for key (the runs table's latest)."""
    from mlflow.entities import Metric

    from posttrain_metrics.integrations.mlflow.direct import _SqlitePoints

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("oracle")
    direct, oracle = (client.create_run(experiment).info.run_id for _ in range(2))
    writer = _SqlitePoints.find(client)
    assert writer is not None, "the installed MLflow's SQLite store is not written directly: the fast path is off"
    for batch in ORACLE_BATCHES:
        writer.write(direct, batch)
        client.log_batch(oracle, metrics=[Metric(k, v, t, s) for k, v, t, s in batch])

    def points(run_id: str, key: str) -> list[tuple[int, int, float | str]]:
        return sorted((m.step, m.timestamp, "nan" if math.isnan(m.value) else m.value)
                      for m in client.get_metric_history(run_id, key))

    for key in ("a", "b", "c", "nan", "inf"):
        assert points(direct, key) == points(oracle, key), key
    latest_direct, latest_oracle = client.get_run(direct).data.metrics, client.get_run(oracle).data.metrics
    assert set(latest_direct) == set(latest_oracle) == {"a", "b", "c", "nan", "inf"}
    for key, value in latest_oracle.items():
        assert latest_direct[key] == value or (math.isnan(value) and math.isnan(latest_direct[key])), key
    # and by hand: the resent (a, 2.0, 2000, 2) is stored once; the latest of a is (2, 2000, 2.0),
    # greater than (2, 2000, 0.5) in value; b's latest is step 3's greatest value; nan's is step 2's 3.0
    assert points(direct, "a") == [(0, 500, -1.0), (1, 1000, 1.0), (2, 2000, 0.5), (2, 2000, 2.0)]
    assert (latest_direct["a"], latest_direct["b"], latest_direct["nan"]) == (2.0, 12.0, 3.0)
    assert latest_direct["c"] == 6.0  # one batch, same step and timestamp: the greater value
    assert points(direct, "inf") == [(1, 1000, 1.7976931348623157e308)]  # as MLflow stores +inf


def test_the_embedded_store_is_written_directly_and_a_server_is_not(backend: Backend) -> None:
    sink = backend.make()
    sink.start(run_info())
    try:
        assert (sink._direct is not None) == (backend.kind == "sqlite")
    finally:
        sink.close()


def test_a_store_of_another_shape_goes_through_log_batch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Tables whose columns differ from what the direct writer writes (another MLflow version): the
    sink falls back to MLflow's own log_batch, and every point still lands."""
    from posttrain_metrics.integrations.mlflow.direct import _SqlitePoints

    monkeypatch.setattr(_SqlitePoints, "COLUMNS", _SqlitePoints.COLUMNS | {"model_id"})
    sink = MlflowSink(dir=tmp_path, experiment_name="shape")
    sink.start(run_info())
    assert sink._direct is None
    for step in (1, 2, 3):
        sink.write(Frame(step, {"train/loss_avg": step / 10}, "train", 1_700_000_000.0 + step))
    sink.close()
    assert history(MlflowClient(sink.tracking_uri), sink.run_id, "train/loss_avg") == [(1, 0.1), (2, 0.2), (3, 0.3)]


@pytest.mark.parametrize("gone", ["deleted", "removed"])
def test_a_deleted_or_removed_run_is_rejected_not_retried(tmp_path: Path, gone: str, package_log: Any) -> None:
    """A run deleted by hand mid-training (400, "must be in the 'active' state"), or removed for good as
    `mlflow gc` removes it (404, "not found"): the direct write is refused with MLflow's own error, as
    log_batch refuses it, counted in rejected and warned about; nothing is retried, and the sink is
    not left degraded."""
    sink = MlflowSink(dir=tmp_path, experiment_name="deleted", drain_timeout=10)
    sink.start(run_info())
    assert sink._direct is not None
    sink.write(Frame(1, {"train/loss_avg": 0.1}, "train", 1_700_000_001.0))
    sink.end_batch()
    client = MlflowClient(sink.tracking_uri)
    deadline = time.monotonic() + 30
    while not client.get_metric_history(sink.run_id, "train/loss_avg") and time.monotonic() < deadline:
        time.sleep(0.05)
        sink.end_batch()
    client.delete_run(sink.run_id)
    if gone == "removed":
        client._tracking_client.store._hard_delete_run(sink.run_id)  # what `mlflow gc` does
    sink.write(Frame(2, {"train/loss_avg": 0.2}, "train", 1_700_000_002.0))
    with contextlib.suppress(Exception):  # setting the status of a deleted run may fail too
        sink.close()
    assert sink.rejected == 1 and sink.unconfirmed == 0 and not sink.degraded
    said = "active" if gone == "deleted" else "not found"
    assert any("rejected the batch of steps 2" in m and said in m for m in package_log.messages), package_log.messages
    if gone == "deleted":
        assert [m.step for m in client.get_metric_history(sink.run_id, "train/loss_avg")] == [1]


def test_a_degraded_sink_is_a_log_record_not_a_warning(tmp_path: Path, package_log: Any) -> None:
    """A store that fails and comes back is the run's state, not a misuse to fix: the sink says so on the
    ``posttrain_metrics.integrations.mlflow`` logger (WARNING when degraded, INFO when it answers again),
    once each, and raises no warning; every frame still lands once."""
    import sqlite3

    from posttrain_metrics.core.warn import PosttrainMetricsWarning

    sink = MlflowSink(dir=tmp_path, experiment_name="degraded", drain_timeout=30)
    sink.start(run_info())
    assert sink._direct is not None
    write, down = sink._direct.write, threading.Event()

    def flaky(run_id: str, points: Any) -> None:  # on the sink's writer thread
        if down.is_set():
            raise sqlite3.OperationalError("disk I/O error")  # transient: held and resent
        write(run_id, points)

    sink._direct.write = flaky  # type: ignore[method-assign]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        down.set()
        sink.write(Frame(1, {"train/loss_avg": 0.1}, "train", 1_700_000_001.0))
        deadline = time.monotonic() + 30
        while not sink.degraded and time.monotonic() < deadline:
            time.sleep(0.02)
            sink.end_batch()  # collects the failed request, as the publisher's batch end does
        assert sink.degraded
        down.clear()
        sink.write(Frame(2, {"train/loss_avg": 0.2}, "train", 1_700_000_002.0))
        while sink.degraded and time.monotonic() < deadline:
            time.sleep(0.02)
            sink.end_batch()
        assert not sink.degraded
        sink.close()
    assert not [str(w.message) for w in caught if issubclass(w.category, PosttrainMetricsWarning)]
    ours = [(r.name, r.levelname, r.getMessage()) for r in package_log.records]
    assert [(name, level) for name, level, _ in ours] == [("posttrain_metrics.integrations.mlflow", "WARNING"),
                                                          ("posttrain_metrics.integrations.mlflow", "INFO")], ours
    assert "disk I/O error" in ours[0][2] and "the sink is degraded" in ours[0][2], ours
    assert "answers again; resending 1 held frame(s)" in ours[1][2], ours  # step 2 waited behind step 1
    assert history(MlflowClient(sink.tracking_uri), sink.run_id, "train/loss_avg") == [(1, 0.1), (2, 0.2)]


def test_a_store_locked_by_another_writer_is_waited_for(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Another process holding SQLite's write lock for 7 s (an `mlflow ui` writing, the trainer's own
    client): the direct write waits, as log_batch waits (MLflow's session sets a 20 s busy timeout on
    every connection it uses; SQLite's own default is 5 s), and lands. NullPool: a fresh connection per
    write, never one that an earlier MLflow session already configured."""
    import sqlite3

    from posttrain_metrics.integrations.mlflow.direct import _SqlitePoints

    monkeypatch.setenv("MLFLOW_SQLALCHEMYSTORE_POOLCLASS", "NullPool")
    path = tmp_path / "mlflow.db"
    client = MlflowClient(f"sqlite:///{path}")
    run_id = client.create_run(client.create_experiment("locked")).info.run_id
    writer = _SqlitePoints.find(client)
    assert writer is not None
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)  # released by a timer
    holder.execute("BEGIN IMMEDIATE")  # the write lock, held
    release = threading.Timer(7.0, lambda: holder.execute("COMMIT"))
    release.start()
    try:
        writer.write(run_id, [("train/loss_avg", 0.5, 1000, 1)])  # raises "database is locked" unless it waits
    finally:
        release.join()
        holder.close()
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "train/loss_avg")] == [(1, 0.5)]


def test_an_active_logged_model_gets_its_metrics(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """With an active logged model (MLFLOW_ACTIVE_MODEL_ID, which a publisher process inherits, or
    mlflow.set_active_model in the thread), log_batch also files every point under that model, which
    MLflow's model page shows: the sink then goes through log_batch."""
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("model")
    model = client.create_logged_model(experiment_id=experiment)
    monkeypatch.setenv("MLFLOW_ACTIVE_MODEL_ID", model.model_id)
    sink = MlflowSink(dir=tmp_path, experiment_name="model")
    failed: list[BaseException] = []

    def publish_in_a_new_thread() -> None:  # MLflow reads the variable once per thread, at first use
        try:
            sink.start(run_info())
            assert sink._direct is None
            for step in (1, 2):
                sink.write(Frame(step, {"train/loss_avg": step / 10}, "train", 1_700_000_000.0 + step))
            sink.close()
        except BaseException as exc:  # re-raised in the test's thread
            failed.append(exc)

    thread = threading.Thread(target=publish_in_a_new_thread)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    points = sorted((m.step, m.value) for m in client.get_logged_model(model.model_id).metrics or []
                    if m.key == "train/loss_avg")
    assert points == [(1, 0.1), (2, 0.2)]
