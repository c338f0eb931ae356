"""Reliability and security, for real: trackers that die, crawl or get killed with us; secrets; hostile
journals.

- A real MLflow server is SIGKILLed mid-run and restarted later on the same port and store; the
  loop never waits for it, and every step ends up in ``get_metric_history`` exactly once.
- A slow proxy answers every MLflow request after 2 s: 20 training steps still take well under 5 s.
- A training process is SIGKILLed at a random step (a new seed each run, in every failure message;
  ``KILL_SEED=<seed>`` replays one): the publisher process drains the journal into TensorBoard, MLflow
  and W&B, each holds every step exactly once and marks the run killed. The publisher process is
  SIGKILLed at a random step: the callback restarts it and every tracker ends complete.
- A secret planted in the run config is in no byte any backend stored.
- A hostile journal given to ``export`` and ``doctor`` is refused clearly and writes nothing outside.

Figures (steps while down, publish times, recovery, overhead) are printed; run with ``-s`` to see them.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import itertools
import json
import math
import os
import random
import re
import signal
import statistics
import struct
import subprocess
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from _mlflow_server import SERVER_STORES, free_port, start_server, stop_server
from _runs import GRPO_ADAPTERS, expected_series, grpo_chunk, pid_alive, tensorboard_run, wait_for
from mlflow import MlflowClient

from posttrain_metrics import Frame, MetricReducer
from posttrain_metrics.cli import main
from posttrain_metrics.integrations.memory import MemorySink
from posttrain_metrics.integrations.mlflow import RUN_ID_TAG, MlflowSink
from posttrain_metrics.integrations.tensorboard import TensorBoardSink
from posttrain_metrics.integrations.wandb import WandbSink
from posttrain_metrics.journal import JournalSink, read_journal
from posttrain_metrics.publication import Publisher

TESTS = Path(__file__).resolve().parent
pytestmark = pytest.mark.usefixtures("clean_mlflow_env")  # each test starts and ends without MLflow's variables


def figure(text: str) -> None:
    print(f"[figure] {text}")


class Loop:
    """A training loop: GRPO chunks reduced by a real MetricReducer, published; times every publish."""

    def __init__(self, pub: Publisher, seed: int = 0) -> None:
        self.pub = pub
        self.reducer = MetricReducer(GRPO_ADAPTERS)
        self.rng = random.Random(seed)
        self.frames: list[Frame] = []
        self.publish_s: list[float] = []
        self.step_s: list[float] = []  # reduce + publish

    def step(self) -> float:
        n = len(self.frames) + 1
        t0 = time.perf_counter()
        for c in range(2):
            self.reducer.add(grpo_chunk(self.rng, n, last=c == 1))
        frame = self.reducer.reduce(n)
        t1 = time.perf_counter()
        self.pub.publish(frame)
        t2 = time.perf_counter()
        self.frames.append(frame)
        self.publish_s.append(t2 - t1)
        self.step_s.append(t2 - t0)
        return t2 - t1




def mlflow_series(client: MlflowClient, run_id: str) -> dict[str, list[tuple[int, float]]]:
    return {key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
            for key in client.get_run(run_id).data.metrics if not key.startswith("run/")}  # run/: aggregates


def assert_every_step_once(got: Mapping[str, list[tuple[int, float]]],
                           want: Mapping[str, list[tuple[int, float]]]) -> None:
    assert set(got) == set(want), f"extra {set(got) - set(want)}, missing {set(want) - set(got)}"
    for key, points in want.items():
        assert got[key] == sorted(points), f"{key}: {len(got[key])} points, want {len(points)}"


# -- 1. the MLflow server is killed mid-run and restarted later ------------------------------------------


def mlflow_run_of(pub: Publisher, timeout: float = 60.0) -> str:
    """The MLflow run id the publisher process reports (it starts the run a few seconds in)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run_id = pub.run_handles().get("mlflow", {}).get("run_id")
        if run_id:
            return str(run_id)
        time.sleep(0.05)
    raise AssertionError(f"the publisher reported no MLflow run within {timeout} s: {pub.run_handles()}")


def test_a_killed_mlflow_server_restarted_later_holds_every_step_once(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    root, port = tmp_path / "server", free_port()
    proc, uri = start_server(root, port)
    servers = [proc]
    try:
        sink = MlflowSink(tracking_uri=uri, experiment_name="killed-server", http_max_retries=0,
                          http_backoff_factor=0, http_timeout=5, drain_timeout=60)
        pub = Publisher([JournalSink(tmp_path / "journal.jsonl"), sink], adapters=GRPO_ADAPTERS,
                        run_id="killedserver01")  # the default: a publisher process feeds MLflow
        pub.start({"rl": {"kl_beta": 0.04}})
        loop = Loop(pub)
        client = MlflowClient(uri)
        for _ in range(5):
            loop.step()
            time.sleep(0.05)
        run_id = mlflow_run_of(pub)
        deadline = time.monotonic() + 30  # the first steps are in before the kill
        while len(client.get_metric_history(run_id, "train/loss_avg")) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)

        os.killpg(proc.pid, signal.SIGKILL)  # the server and its uvicorn worker die mid-run
        proc.wait(10)
        down_from = len(loop.frames)
        killed_at = time.monotonic()
        for _ in range(10):  # down: nothing answers on the port
            loop.step()
            time.sleep(0.1)
        restarted: list[Any] = []
        thread = threading.Thread(target=lambda: restarted.append(start_server(root, port)), daemon=True)
        thread.start()
        while thread.is_alive():  # the server restarts (same port, same store); the loop goes on
            loop.step()
            time.sleep(0.1)
        thread.join()
        assert restarted, "the server did not come back"
        servers.append(restarted[0][0])
        up_at = time.monotonic()
        down_steps = len(loop.frames) - down_from
        max_down_publish = max(loop.publish_s[down_from:])
        for _ in range(10):
            loop.step()
            time.sleep(0.05)
        t0 = time.monotonic()
        pub.close()
        drained_s = time.monotonic() - t0
        client = MlflowClient(uri)
        err = capfd.readouterr().err  # the publisher process's log records, forwarded
        assert err.count("is degraded") == 1, err[-3000:]  # one message, not one per step
        assert "publisher: info: mlflow: " in err and "answers again; resending" in err, err[-3000:]
        assert pub.failures == {} and pub.process.restarts == 0
        assert_every_step_once(mlflow_series(client, run_id), expected_series(loop.frames))
        assert client.get_run(run_id).info.status == "FINISHED"
        figure(f"outage: {down_steps} steps while the server was down ({up_at - killed_at:.1f} s, restart "
               f"included); max publish while down {1000 * max_down_publish:.2f} ms; close drained in "
               f"{drained_s:.2f} s; {len(loop.frames)} steps in MLflow exactly once")
    finally:
        for server in servers:
            stop_server(server)


# -- 2. a tracker that answers after 2 s ------------------------------------------------------------------


class SlowProxy:
    """An HTTP proxy on 127.0.0.1 that forwards every request to ``target`` after ``delay`` seconds.

    Threaded, bounded (at most ``max_requests`` in flight; more get 503), and it stops itself after
    ``lifetime`` seconds if the test does not stop it first."""

    def __init__(self, target: str, *, delay: float = 2.0, max_requests: int = 32, lifetime: float = 180.0) -> None:
        self.target = urlsplit(target)
        self.delay = delay
        self.slots = threading.BoundedSemaphore(max_requests)
        self.lifetime = lifetime
        self.requests = 0
        self.lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                proxy.forward(self)

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.uri = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._timer = threading.Timer(lifetime, self.stop)
        self._timer.daemon = True

    def start(self) -> SlowProxy:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self._timer.start()
        return self

    def stop(self) -> None:
        self._timer.cancel()
        self.server.shutdown()
        self.server.server_close()

    def forward(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        if not self.slots.acquire(blocking=False):
            handler.send_error(503, "slow proxy: too many requests in flight")
            return
        try:
            with self.lock:
                self.requests += 1
            length = int(handler.headers.get("Content-Length") or 0)
            body = handler.rfile.read(length) if length else None
            time.sleep(self.delay)
            headers = {k: v for k, v in handler.headers.items() if k.lower() not in ("host", "connection")}
            upstream = http.client.HTTPConnection(self.target.hostname, self.target.port, timeout=60)
            try:
                upstream.request(handler.command, handler.path, body=body, headers=headers)
                response = upstream.getresponse()
                data = response.read()
                handler.send_response(response.status)
                for key, value in response.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        handler.send_header(key, value)
                handler.send_header("Content-Length", str(len(data)))
                handler.send_header("Connection", "close")
                handler.end_headers()
                handler.wfile.write(data)
            finally:
                upstream.close()
        finally:
            self.slots.release()


def test_a_tracker_that_answers_after_2_s_costs_the_steps_nothing(tmp_path: Path, mlflow_server: str) -> None:
    proxy = SlowProxy(mlflow_server, delay=2.0).start()
    try:
        sink = MlflowSink(tracking_uri=proxy.uri, experiment_name=f"slow-{uuid.uuid4().hex[:8]}", http_timeout=30,
                          drain_timeout=120)
        pub = Publisher([JournalSink(tmp_path / "journal.jsonl"), sink], adapters=GRPO_ADAPTERS)
        t0 = time.perf_counter()
        pub.start({"rl": {"kl_beta": 0.04}})
        start_s = time.perf_counter() - t0
        loop = Loop(pub)
        t0 = time.perf_counter()
        for _ in range(20):
            loop.step()
            time.sleep(0.02)  # the step's own compute
        total_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        pub.close()
        close_s = time.perf_counter() - t0
    finally:
        proxy.stop()
    # A step that waited for the tracker takes at least the proxy's 2 s delay by construction: a bound
    # from the test's own setup, not a speed limit (a step takes ~1 ms when the journal is the queue).
    assert max(loop.step_s) < proxy.delay, loop.step_s
    assert pub.failures == {}
    assert proxy.requests >= 3  # the requests really went through the slow proxy
    client = MlflowClient(mlflow_server)
    run_id = mlflow_run_of(pub)
    assert_every_step_once(mlflow_series(client, run_id), expected_series(loop.frames))
    assert client.get_run(run_id).info.status == "FINISHED"
    figure(f"slow tracker (2 s per request): 20 steps in {total_s:.2f} s (0.40 s of it the simulated "
           f"compute); reduce+publish per step median {1000 * statistics.median(loop.step_s):.2f} ms, max "
           f"{1000 * max(loop.step_s):.2f} ms; publish alone median {1000 * statistics.median(loop.publish_s):.3f} "
           f"ms; start() {start_s:.1f} s; close() drained in "
           f"{close_s:.1f} s; {proxy.requests} requests")


# -- 3. the training process, or the publisher process, is SIGKILLed at a random step ----------------------

KILL_SEED = int(os.environ.get("KILL_SEED") or random.SystemRandom().randrange(1 << 32))
"""Where the trainer and the publisher are killed: new each run (so runs cover different steps)."""


@contextlib.contextmanager
def replayable(seed: int) -> Iterator[None]:
    """Any assertion failing inside names the seed and how to replay it."""
    try:
        yield
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n[kill seed {seed}; replay: KILL_SEED={seed} pytest tests/test_tracker_failures.py]") \
            from exc


TRAIN = """
import random, sys, time
sys.path.insert(0, {tests!r})
from _runs import grpo_chunk
from posttrain_metrics.callbacks import MetricsCallback

cb = MetricsCallback(
    adapters=["grpo", "reward", "trainer"], out_dir=sys.argv[1], run_id="killedrun01", run_name="killed",
    sinks=[{{"type": "journal"}}, {{"type": "tensorboard"}}, {{"type": "mlflow", "experiment_name": "killed"}},
           {{"type": "wandb", "project": "killed", "mode": "offline", "settings": {{"quiet": True}}}}],
)
cb.on_run_start({{"rl": {{"kl_beta": 0.04}}, "mlflow": {{"experiment": "killed"}}}})
rng = random.Random(0)
steps = int(sys.argv[2])
with cb:
    for step in range(1, steps + 1):
        for c in range(2):
            cb.on_chunk_end(grpo_chunk(rng, step, last=c == 1))
        cb.on_window_end(step)
        time.sleep(float(sys.argv[3]))
"""


def frames_in(path: Path) -> int:
    try:
        return path.read_bytes().count(b'"kind":"frame"')
    except FileNotFoundError:
        return 0


def f32(value: float) -> float:
    return struct.unpack("<f", struct.pack("<f", value))[0] if math.isfinite(value) else value


def tensorboard_series(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: sorted((e.step, e.value) for e in events.Scalars(tag)) for tag in events.Tags()["scalars"]}


def publisher_status(journal: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(journal.with_name(journal.name + ".publisher.json").read_text()))
    except (OSError, ValueError):
        return {}






def assert_trackers_hold(out: Path, journal: Any, status: str) -> None:
    """TensorBoard, the embedded MLflow store and the offline W&B run(s) hold every step of the journal
    exactly once, and the run is marked ``status`` in each."""
    from tensorboard.plugins.hparams import metadata as hparams_metadata

    from posttrain_metrics.integrations.tensorboard import STATUS_HPARAM
    from posttrain_metrics.integrations.wandb import STATUS_KEY
    from posttrain_metrics.integrations.wandb_reader import read_offline_run

    want = expected_series(journal.frames)
    tb = tensorboard_series(tensorboard_run(out))
    assert set(tb) == set(want)
    for key, points in want.items():
        assert tb[key] == [(s, f32(v)) for s, v in points], key  # every step once, float32 values
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tensorboard_run(out) / "hparams"))
    acc.Reload()
    content = acc.PluginTagToContent(hparams_metadata.PLUGIN_NAME)
    start = hparams_metadata.parse_session_start_info_plugin_data(content[hparams_metadata.SESSION_START_INFO_TAG])
    assert start.hparams[STATUS_HPARAM].string_value == status
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    runs = [r for e in client.search_experiments()
            for r in client.search_runs([e.experiment_id], filter_string=f"tags.`{RUN_ID_TAG}` = 'killedrun01'")]
    assert len(runs) == 1, [(r.info.run_id, r.info.experiment_id) for r in runs]
    assert_every_step_once(mlflow_series(client, runs[0].info.run_id), want)
    assert runs[0].info.status == status.upper()
    rows: dict[str, list[tuple[int, float]]] = {}
    statuses = []
    for file in sorted((out / "wandb").rglob("run-killedrun01.wandb")):
        offline = read_offline_run(file)
        statuses.append(offline.summary.get(STATUS_KEY))
        for row in offline.history:
            for key, value in row.items():
                if not key.startswith(("_", "trainer/")) and not isinstance(value, str):  # labels: tags
                    rows.setdefault(key, []).append((row["trainer/step"], float(value)))
    assert {k: sorted(v) for k, v in rows.items()} == {k: sorted(v) for k, v in want.items()}
    assert statuses[-1] == status


def test_a_trainer_killed_at_a_random_step_leaves_every_tracker_complete_and_the_run_killed(tmp_path: Path) -> None:
    """SIGKILL of the trainer: the publisher process notices, drains the journal into every tracker and
    marks the run killed; no manual export is needed (a later export finds nothing to send)."""
    out = tmp_path / "run"
    script = tmp_path / "train.py"
    script.write_text(TRAIN.format(tests=str(TESTS)))
    kill_step = random.Random(KILL_SEED).randint(1, 60)
    journal_path = out / "journal.jsonl"
    log = tmp_path / "train.stderr"
    with replayable(KILL_SEED):
        proc = subprocess.Popen([sys.executable, str(script), str(out), "100000", "0.01"],
                                stdout=subprocess.DEVNULL, stderr=open(log, "wb"))  # noqa: SIM115
        try:
            wait_for(f"{kill_step} frames", lambda: frames_in(journal_path) >= kill_step, 90, proc, log)
            os.kill(proc.pid, signal.SIGKILL)
            assert proc.wait(10) == -signal.SIGKILL
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        wait_for("the publisher's report", lambda: publisher_status(journal_path).get("pid"), 60)
        publisher = int(publisher_status(journal_path)["pid"])
        wait_for("the publisher to drain and exit", lambda: not pid_alive(publisher), 120)
        status = publisher_status(journal_path)
        assert status["state"] == "closed" and status["status"] == "killed", status

        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            journal = read_journal(journal_path)
        steps = [f.step for f in journal.frames]
        assert steps == list(range(1, len(steps) + 1)) and len(steps) >= kill_step  # every step before the kill
        assert journal.end is None  # killed: no end record
        assert_trackers_hold(out, journal, "killed")
        for kind in ("tensorboard", "mlflow"):  # nothing left for export to do
            assert main(["export", str(journal_path), "--to", kind, "--quiet"]) == 0
    figure(f"trainer SIGKILL at step {kill_step} (seed {KILL_SEED}); journal holds steps 1-{len(steps)}; the "
           f"publisher drained them into TensorBoard, MLflow and W&B and marked the run killed")


def test_a_killed_publisher_is_restarted_and_every_tracker_ends_complete(tmp_path: Path) -> None:
    """SIGKILL of the publisher process at a random step: training goes on, the callback warns once and
    restarts it, the new one resumes from what each tracker holds; the run ends finished with every
    step once."""
    out = tmp_path / "run"
    script = tmp_path / "train.py"
    script.write_text(TRAIN.format(tests=str(TESTS)))
    journal_path = out / "journal.jsonl"
    log = tmp_path / "train.stderr"
    at = random.Random(KILL_SEED + 1).randint(1, 60)  # frames every tracker has taken when it is killed
    with replayable(KILL_SEED):
        proc = subprocess.Popen([sys.executable, str(script), str(out), "300", "0.05"], stdout=subprocess.DEVNULL,
                                stderr=open(log, "wb"))  # noqa: SIM115
        try:
            def publishing() -> bool:
                sinks = publisher_status(journal_path).get("sinks", {})
                return all(sinks.get(name, {}).get("written", 0) >= at for name in ("tensorboard", "mlflow", "wandb"))

            wait_for(f"the publisher writing {at} frames to every tracker", publishing, 120, proc, log)
            first = int(publisher_status(journal_path)["pid"])
            killed_at = frames_in(journal_path)
            os.kill(first, signal.SIGKILL)
            wait_for("a new publisher", lambda: publisher_status(journal_path).get("pid") not in (None, first), 60,
                     proc, log)
            assert proc.wait(180) == 0, log.read_text()[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        err = log.read_text()
        assert err.count("the publisher process (pid") == 1 and "Restarted" in err, err[-3000:]  # warned once
        status = publisher_status(journal_path)
        assert status["state"] == "closed" and status["status"] == "finished", status
        journal = read_journal(journal_path)
        assert [f.step for f in journal.frames] == list(range(1, 301)) and journal.end is not None
        assert_trackers_hold(out, journal, "finished")
    figure(f"publisher SIGKILL after {at} frames in every tracker, step {killed_at} (seed {KILL_SEED}): restarted, "
           f"resumed from what each tracker held; 300 steps in TensorBoard, MLflow and W&B exactly once")


# -- 4. secrets -----------------------------------------------------------------------------------------

SECRETS = ("hf_PLANTEDSECRETabcdefghij0123456789", "PLANTED-PW-9f2c", "PLANTED-URI-PW-77e1",
           "sk-PLANTEDopenaikey0123456789abcd", "PLANTED-BEARER-TOKEN-5a5a")
SECRET_CONFIG = {
    "hf_token": SECRETS[0],
    "db": {"password": SECRETS[1]},
    "uri": f"postgres://u:{SECRETS[2]}@h/db",
    "note": SECRETS[3],  # a secret-looking value under an innocent key
    "headers": {"Authorization": f"Bearer {SECRETS[4]}"},
    "rl": {"kl_beta": 0.04, "max_tokens": 64},
}


def files_under(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()]


def test_a_planted_secret_is_in_no_byte_any_backend_stored(tmp_path: Path, mlflow_server: str) -> None:
    root = tmp_path / "run"
    embedded = MlflowSink(dir=root, experiment_name="secrets")
    served = MlflowSink(tracking_uri=mlflow_server, experiment_name=f"secrets-{uuid.uuid4().hex[:8]}")
    served.name = "mlflow-server"  # two sinks of one kind: the publisher tells them apart by name
    sinks = [JournalSink(root / "journal.jsonl"), TensorBoardSink(log_dir=root / "tensorboard"), embedded, served,
             WandbSink(project="secrets", dir=root, mode="offline", settings={"quiet": True})]
    pub = Publisher(sinks, adapters=GRPO_ADAPTERS, run_name="secrets", run_id="secretsrun01")
    pub.start(SECRET_CONFIG)
    loop = Loop(pub)
    for _ in range(3):
        loop.step()
    pub.close()
    import wandb

    wandb.teardown()  # the offline run is complete on disk
    assert pub.failures == {}
    files = files_under(root) + files_under(SERVER_STORES[mlflow_server])
    names = {p.name for p in files}
    assert {"journal.jsonl", "mlflow.db"} <= names
    assert any(n.startswith("events.out.tfevents") for n in names) and any(n.endswith(".wandb") for n in names)
    assert any("hparams" in p.parts for p in files)  # the TensorBoard hparams session holds the config too
    for path in files:
        data = path.read_bytes()
        for secret in SECRETS:
            assert secret.encode() not in data, f"{secret!r} is in {path}"
    for sink in (embedded, served):
        handles = pub.run_handles()[sink.name]
        run = MlflowClient(handles["tracking_uri"]).get_run(handles["run_id"])
        stored = json.dumps([run.data.params, run.data.tags, run.info.run_name])
        assert "rl/kl_beta" in run.data.params and "***REDACTED***" in run.data.params["hf_token"]
        assert run.data.params["uri"] == "postgres://u:***REDACTED***@h/db"
        for secret in SECRETS:
            assert secret not in stored, f"{secret!r} is in MLflow run {handles}"


class SlowTracker(MemorySink):
    """A tracker that takes frames slowly but surely: after each batch it is not ready for ``pause``
    seconds (a healthy MLflow working through a full backlog); ``dead_after`` frames, never again."""

    def __init__(self, pause: float, dead_after: int | None = None) -> None:
        super().__init__()
        self.pause, self.dead_after, self.busy_until, self.taken = pause, dead_after, 0.0, 0

    def ready(self) -> bool:
        if self.dead_after is not None and len(self.frames) >= self.dead_after:
            return False
        return time.monotonic() >= self.busy_until

    def end_batch(self) -> None:
        if len(self.frames) > self.taken:  # a new batch: busy with it for a while
            self.taken = len(self.frames)
            self.busy_until = time.monotonic() + self.pause


def closed_journal(path: Path, steps: int) -> None:
    pub = Publisher([JournalSink(path)], adapters=GRPO_ADAPTERS, run_id="slowrun01", mode="inline")
    pub.start({})
    loop = Loop(pub)
    for _ in range(steps):
        loop.step()
    pub.close()


def test_a_slow_tracker_is_waited_for_after_the_run_ends_however_long_it_takes(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The run has ended; the tracker takes a batch of 5 frames every 0.1 s, 0.8 s for the 40: longer
    than the 0.25 s ``grace`` a tracker gets without progress. Every frame reaches it, none is given up."""
    from posttrain_metrics.publication.follower import follow

    closed_journal(tmp_path / "journal.jsonl", 40)
    sink = SlowTracker(pause=0.1)
    final = follow(tmp_path / "journal.jsonl", [sink], batch=5, grace=0.25, poll=0.01, report=False,
                   adapters=GRPO_ADAPTERS)
    assert [f.step for f in sink.frames] == list(range(1, 41))
    assert final["status"] == "finished" and final["failures"] == {}, final
    assert not [m for m in caplog.messages if "took no frame" in m]


def test_a_tracker_that_takes_nothing_after_the_run_ends_is_given_up_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The tracker stops taking frames once it holds 10: after ``grace`` seconds without progress the publisher
    gives it up, counts a failure and names the command that sends the rest; the run still closes."""
    from posttrain_metrics.publication.follower import follow

    closed_journal(tmp_path / "journal.jsonl", 40)
    sink = SlowTracker(pause=0.0, dead_after=10)
    final = follow(tmp_path / "journal.jsonl", [sink], batch=5, grace=0.2, poll=0.01, report=False,
                   adapters=GRPO_ADAPTERS)
    assert any(re.search(r"took no frame for 0.2 s .* `posttrain-metrics publish ", m) for m in caplog.messages)
    held = [f.step for f in sink.frames]
    assert held == list(range(1, len(held) + 1)) and 10 <= len(held) < 40, held  # whole batches, then nothing
    assert final["failures"] == {"memory": 1}, final
    assert sink.closed is not None  # closed, with what it has


def test_the_publishers_report_says_recording_while_it_writes_the_runs_record(tmp_path: Path) -> None:
    """Between reading the journal to its end and closing the trackers, the publisher writes the run's
    record; its report says so (``recording``), so that a watcher can tell the record from the drain."""
    from posttrain_metrics.publication.follower import follow, status_path

    journal = tmp_path / "journal.jsonl"
    closed_journal(journal, 6)

    class Attaching(MemorySink):
        """A tracker that takes files: it reads the publisher's report when handed the record."""

        def attach(self, files: Sequence[Path]) -> None:
            self.report = json.loads(status_path(journal).read_text())
            self.files = sorted(Path(f).name for f in files)

    sink = Attaching()
    final = follow(journal, [sink], poll=0.01, report=True, adapters=GRPO_ADAPTERS)
    assert sink.report["state"] == "recording", sink.report
    assert sink.report["sinks"]["memory"]["frames"] == 6  # every frame read before the record
    assert {"doctor.txt", "doctor.json", "config.json", "journal.jsonl"} <= set(sink.files)
    assert final["state"] == "closed" and json.loads(status_path(journal).read_text())["state"] == "closed"



def test_a_sleeping_publisher_wakes_when_the_trainer_closes_the_run(tmp_path: Path) -> None:
    """The trainer waits in close() for the publisher: a publisher asleep between rounds (here for
    10 minutes, poll=600) notices the end record within a CLOSE_CHECK, and the run closes; without
    that it would sleep on (join would give up after 60 s)."""
    from posttrain_metrics.publication.follower import follow

    journal = tmp_path / "journal.jsonl"
    closed_journal(journal, 5)
    lines = journal.read_text().splitlines(keepends=True)
    journal.write_text("".join(lines[:-1]))  # the run goes on: no end record yet
    sink = MemorySink()
    done: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: done.update(follow(
        journal, [sink], parent_pid=os.getppid(), poll=600, max_poll=600, report=False, record=False,
        adapters=GRPO_ADAPTERS)), daemon=True)
    thread.start()
    wait_for("the publisher to take the 5 frames, then sleep", lambda: len(sink.frames) == 5, 60)
    with journal.open("a") as f:
        f.write(lines[-1])  # the trainer closes the run
    thread.join(60)
    assert not thread.is_alive(), "the publisher slept through the end of the run"
    assert done["status"] == "finished" and [f.step for f in sink.frames] == [1, 2, 3, 4, 5]


def test_the_heap_trimmer_here_is_glibcs_malloc_trim() -> None:
    from posttrain_metrics.publication.follower import heap_trimmer

    trim = heap_trimmer()
    assert trim is not None, "this Linux runs on glibc: malloc_trim must be found"
    assert trim(0) in (0, 1)  # 1: pages were given back, 0: there were none to give


@pytest.mark.parametrize("trim_heap", [None, 0.2])
def test_a_publisher_process_trims_its_heap_at_most_every_interval_the_in_process_mode_never(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trim_heap: float | None) -> None:
    """The tracker takes 5 frames every 0.1 s: the drain lasts 0.8 s or more, time for several trims at
    0.2 s apart, and never two closer than that; without ``trim_heap`` (the in-process mode) none."""
    from posttrain_metrics.publication import follower

    calls: list[float] = []
    monkeypatch.setattr(follower, "heap_trimmer", lambda: lambda pad: calls.append(time.monotonic()) or 1)
    closed_journal(tmp_path / "journal.jsonl", 40)
    sink = SlowTracker(pause=0.1)
    final = follower.follow(tmp_path / "journal.jsonl", [sink], batch=5, grace=5.0, poll=0.01, report=False,
                            adapters=GRPO_ADAPTERS, trim_heap=trim_heap)
    assert [f.step for f in sink.frames] == list(range(1, 41)) and final["status"] == "finished"
    if trim_heap is None:
        assert calls == []
        return
    assert len(calls) >= 2, calls
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    assert min(gaps) >= trim_heap - 1e-3, gaps

class SlowWriter(MemorySink):
    """A tracker that is always ready but takes 10 ms a frame: a publisher reading full batches of it
    lags behind the journal (as one starved of CPU by other work does)."""

    def write(self, frame: Frame) -> None:
        time.sleep(0.01)
        super().write(frame)


def test_a_publisher_lagging_at_sched_idle_catches_up_at_normal_priority_then_yields_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Started by a trainer, the publisher runs at SCHED_IDLE. After ``catch_up`` seconds of reading
    nothing but full batches (it lags: a backlog of 60 frames, 4 per batch, 10 ms each, ``catch_up``
    0.2 s) it goes back to the normal policy while the backlog lasts, yields again once it has read to
    the journal's end, and takes the normal policy for the final drain when the run stops."""
    from posttrain_metrics.publication import process
    from posttrain_metrics.publication.follower import follow

    journal = tmp_path / "journal.jsonl"
    closed_journal(journal, 60)
    lines = journal.read_text().splitlines(keepends=True)
    assert json.loads(lines[-1])["kind"] == "end"
    journal.write_text("".join(lines[:-1]))  # the run goes on: no end record yet
    sink = SlowWriter()
    calls: list[tuple[bool, int, float]] = []
    t0 = time.monotonic()
    monkeypatch.setattr(process, "yield_cpu",
                        lambda idle: calls.append((idle, len(sink.frames), time.monotonic() - t0)) or True)
    stop = threading.Event()
    done: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: done.update(follow(
        journal, [sink], parent_pid=os.getppid(), stop=stop, batch=4, poll=0.01, catch_up=0.2, report=False,
        record=False, adapters=GRPO_ADAPTERS)))
    thread.start()
    try:
        wait_for("the publisher to yield again once caught up", lambda: len(calls) >= 3, 60)
    finally:
        stop.set()
        thread.join(60)
    assert not thread.is_alive()
    assert [idle for idle, _, _ in calls] == [True, False, True, False], calls
    (_, at_start, _), (_, lagging, left_idle), (_, caught_up, _), _ = calls
    assert at_start == 0 and caught_up == 60, calls
    assert 0 < lagging < 60 and left_idle >= 0.2, calls  # back to normal while the backlog lasted
    assert [f.step for f in sink.frames] == list(range(1, 61))
    assert done["status"] == "killed"  # stopped without an end record: the in-process mode's stop


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
def test_the_publisher_process_yields_the_cores_to_the_trainer(tmp_path: Path) -> None:
    """While the trainer trains, the publisher process (and its threads) runs at SCHED_IDLE where it may
    leave it again (root or RLIMIT_NICE >= 11), else at nice 10 under the normal policy; every frame
    still reaches the tracker."""
    import resource

    root = tmp_path / "run"
    tb = TensorBoardSink(log_dir=root / "tensorboard")
    pub = Publisher([JournalSink(root / "journal.jsonl"), tb], adapters=GRPO_ADAPTERS, run_id="yieldrun01")
    pub.start({})
    loop = Loop(pub)
    loop.step()
    journal = root / "journal.jsonl"
    wait_for("the publisher's report", lambda: publisher_status(journal).get("sinks", {}).get("tensorboard", {})
             .get("frames", 0) >= 1, 120)
    pid = pub.process.pid
    policies = {os.sched_getscheduler(int(tid)) for tid in os.listdir(f"/proc/{pid}/task")}
    nice = os.getpriority(os.PRIO_PROCESS, pid)
    for _ in range(9):
        loop.step()
    pub.close()
    may_leave = os.geteuid() == 0 or resource.getrlimit(resource.RLIMIT_NICE)[0] >= 11
    if may_leave:
        assert policies == {os.SCHED_IDLE}, policies
    else:
        assert policies == {os.SCHED_OTHER} and nice == 10, (policies, nice)
    assert [s for s, _ in tensorboard_series(root / "tensorboard")["train/loss_avg"]] == list(range(1, 11))


def test_the_publisher_status_file_holds_no_tracking_uri_password(tmp_path: Path, mlflow_server: str) -> None:
    """``<journal>.publisher.json`` (the publisher's progress and the trackers' run handles, readable by
    others) shows a tracking URI with its password redacted; the publisher itself used the real URI
    (the run is on the server, every step read back)."""
    password = "PLANTED-STATUS-PW-3c9d"
    host = urlsplit(mlflow_server).netloc
    root = tmp_path / "run"
    sink = MlflowSink(tracking_uri=f"http://bob:{password}@{host}", experiment_name=f"status-{uuid.uuid4().hex[:8]}")
    pub = Publisher([JournalSink(root / "journal.jsonl"), sink], adapters=GRPO_ADAPTERS, run_id="statusrun01")
    assert pub.in_child == [sink]  # fed by the publisher process, which writes the status file
    pub.start({})
    loop = Loop(pub)
    for _ in range(5):
        loop.step()
    pub.close()
    assert pub.failures == {}
    status = root / "journal.jsonl.publisher.json"
    text = status.read_text()
    assert password not in text, text
    handles = json.loads(text)["sinks"]["mlflow"]["handles"]
    assert handles["tracking_uri"] == f"http://bob:***REDACTED***@{host}", handles
    assert pub.run_handles()["mlflow"] == handles  # what the trainer sees is the same, redacted
    history = MlflowClient(mlflow_server).get_metric_history(handles["run_id"], "train/loss_avg")
    assert sorted(m.step for m in history) == [1, 2, 3, 4, 5]


# -- 5. a hostile journal -----------------------------------------------------------------------------------

FRAME = {"kind": "frame", "run_id": "hostile01", "step": 1, "phase": "train", "time": 1.7e9,
         "metrics": {"train/kl_max": 0.5, "train/loss_avg": {"$float": "NaN"}}}


def header(**fields: Any) -> dict[str, Any]:
    return {"format": "posttrain-metrics-journal", "version": 1, "kind": "header", "run_id": "hostile01",
            "name": "hostile", "created": 0, "adapters": ["grpo"], "config": {}, **fields}


HOSTILE: dict[str, tuple[list[Any], str]] = {
    # name: (lines, what the error says; "" = safe handling, exit 0)
    "run_id traversal": ([header(run_id="../../x"), FRAME], "not a safe run id"),
    "run_id quote": ([header(run_id="x' OR '1'='1"), FRAME], "not a safe run id"),
    "run_id absolute": ([header(run_id="/tmp/x"), FRAME], "not a safe run id"),
    "adapter traversal": ([header(adapters=["../../x"]), FRAME], "unknown adapter '../../x'"),
    "adapters not a list": ([header(adapters=5), FRAME], "not a list of adapter names"),
    "adapters of objects": ([header(adapters=[{"__class__": "os.system"}]), FRAME], "not a list of adapter names"),
    "config not an object": ([header(config=["rm", "-rf"]), FRAME], "config"),
    "$float not a float": ([header(), {**FRAME, "metrics": {"train/kl_max": {"$float": "__import__('os')"}}}],
                           "malformed frame"),
    "$float an object": ([header(), {**FRAME, "metrics": {"train/kl_max": {"$float": {"py/object": "os.system"}}}}],
                         "malformed frame"),
    "step infinite": ([header(), '{"kind":"frame","step":Infinity,"metrics":{}}'], "malformed frame"),
    "step a string": ([header(), {**FRAME, "step": "1; rm -rf /"}], "malformed frame"),
    "deep nesting": ([header(), "[" * 100_000 + "]" * 100_000], "not a journal line"),
    "name traversal": ([header(name="../../x"), FRAME], ""),  # a display name: never a path
}


def entries(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_journal_is_refused_or_harmless_and_writes_nothing_outside(
    tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    lines, error = HOSTILE[case]
    folder = tmp_path / "a" / "b" / "run"
    folder.mkdir(parents=True)
    journal = folder / "journal.jsonl"
    journal.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    work = tmp_path / "a" / "b" / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    beside = entries(tmp_path.parent)  # the other tests' folders of this session
    around = {str(p): p.stat().st_size for p in tmp_path.rglob("*") if p.is_file()}
    commands = [["doctor", str(journal)],
                ["export", str(journal), "--to", "tensorboard", "--quiet"],
                ["export", str(journal), "--to", "mlflow", "--quiet"]]
    for argv in commands:
        code = main(argv)
        err = capsys.readouterr().err
        if error:
            assert code == 2, (argv, err)
            assert error in err and "Traceback" not in err, err
        else:
            assert code in (0, 1), (argv, err)
    assert entries(tmp_path.parent) <= beside | {tmp_path.name}  # nothing new next to the test's folder
    now = {str(p): p.stat().st_size for p in tmp_path.rglob("*") if p.is_file()}
    changed = {p for p, size in now.items() if around.get(p) != size}
    assert all(Path(p).is_relative_to(folder) for p in changed), sorted(changed)  # only the journal's folder
    assert not list(tmp_path.rglob("x")) and not list(work.iterdir())  # no ../../x, nothing in the cwd
    if error:
        assert changed == set() and sorted(folder.iterdir()) == [journal]  # refused before any write
