"""A run's folder under faults (issue 23): one live run per journal, a re-run moves everything of the
previous run, nothing written through a symlink out of the folder, the publisher process runs only
the package's code, a bad out_dir refused when the callback is built. Second runs are second real
processes, kills are real SIGKILLs, trackers are read back with their own readers."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
from _runs import pid_alive, wait_for

from posttrain_metrics import MetricsError
from posttrain_metrics.callbacks import MetricsCallback
from posttrain_metrics.cli import main
from posttrain_metrics.integrations.base import Sink
from posttrain_metrics.integrations.mlflow import RUN_ID_TAG
from posttrain_metrics.journal import read_journal
from posttrain_metrics.journal.samples import read_samples

TRAIN = """
import sys, time
from posttrain_metrics.callbacks import MetricsCallback

out, run_id, steps, pause = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
sinks = [{"type": "journal"}, {"type": "tensorboard"}] + ([{"type": "mlflow"}] if "mlflow" in sys.argv[5:] else [])
with MetricsCallback(adapters=["trainer"], out_dir=out, run_id=run_id, run_name="r", sinks=sinks) as cb:
    cb.on_run_start({"which": run_id})
    for step in range(1, steps + 1):
        cb.on_chunk_end({"grad_norm": step / 4, "learning_rate": 0.001})
        cb.on_window_end(step)
        time.sleep(pause)
"""


def trainer(tmp_path: Path, out: Path, run_id: str, steps: int, pause: float = 0.0, *extra: str,
            cwd: Path | None = None) -> subprocess.Popen[bytes]:
    """A real trainer process (the script lives apart from ``cwd``, as a user's would)."""
    script = tmp_path / "scripts" / "train.py"
    script.parent.mkdir(exist_ok=True)
    script.write_text(TRAIN)
    return subprocess.Popen([sys.executable, str(script), str(out), run_id, str(steps), str(pause), *extra],
                            cwd=cwd or tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finished(proc: subprocess.Popen[bytes], timeout: float = 180) -> tuple[int, str]:
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err.decode(errors="replace")


def frames_in(path: Path) -> int:
    try:
        return path.read_bytes().count(b'"kind":"frame"')
    except FileNotFoundError:
        return 0






def publisher_pid(journal: Path) -> int:
    try:
        return int(json.loads(journal.with_name(journal.name + ".publisher.json").read_text()).get("pid", 0))
    except (OSError, ValueError):
        return 0


def tensorboard_steps(log_dir: Path, tag: str = "train/grad_norm") -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    return sorted((e.step, round(e.value, 6)) for e in events.Scalars(tag))


def grad_norms(steps: range) -> list[tuple[int, float]]:
    """What TRAIN publishes as train/grad_norm at each step: step / 4 (exact in float32)."""
    return [(s, s / 4) for s in steps]


# -- 7. one live run per journal ---------------------------------------------------------------------


def test_a_second_trainer_is_refused_while_a_run_is_live_and_a_killed_run_frees_the_folder(tmp_path: Path) -> None:
    out = tmp_path / "run"
    journal = out / "journal.jsonl"
    first = trainer(tmp_path, out, "first", 100_000, 0.02)
    try:
        wait_for("the first run's frames", lambda: frames_in(journal) >= 3)
        code, err = finished(trainer(tmp_path, out, "second", 3))
        assert code != 0, err
        assert "MetricsError" in err and f"run 'first' (trainer pid {first.pid}" in err, err[-2000:]
        assert "fix: give this run another out_dir" in err
        assert read_journal(journal).run_id == "first" and not (out / "journal.first.jsonl").exists()
        wait_for("the first run's publisher", lambda: publisher_pid(journal))
        os.kill(first.pid, signal.SIGKILL)  # a killed run never leaves the folder locked
        assert first.wait(10) == -signal.SIGKILL
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    publisher = publisher_pid(journal)
    wait_for("the first run's publisher to drain and exit", lambda: not pid_alive(publisher))
    killed = [f.step for f in read_journal(journal).frames]
    code, err = finished(trainer(tmp_path, out, "third", 3))
    assert code == 0, err[-2000:]
    # never mixed: the first run's journal and TensorBoard run hold its own steps, the third run its own
    assert [f.step for f in read_journal(out / "journal.first.jsonl").frames] == killed
    assert tensorboard_steps(out / "tensorboard" / "r-first") == grad_norms(range(1, len(killed) + 1))
    assert tensorboard_steps(out / "tensorboard" / "r-third") == grad_norms(range(1, 4))
    code, err = finished(trainer(tmp_path, out, "third", 2))  # resumed after it finished: allowed
    assert code == 0, err[-2000:]
    assert [f.step for f in read_journal(journal).frames] == [1, 2, 3, 1, 2]


def test_a_killed_runs_publisher_still_draining_holds_the_folder_until_it_exits(tmp_path: Path) -> None:
    """The trainer is SIGKILLed while its publisher process is held (SIGSTOP: a slow drain, made for
    real): a new run is refused, naming the publisher, so the journal it tails is never renamed under
    it; once it has drained and exited the folder is free and nothing is mixed."""
    out = tmp_path / "run"
    journal = out / "journal.jsonl"
    first = trainer(tmp_path, out, "first", 100_000, 0.02)
    publisher = 0
    try:
        wait_for("the first run's publisher", lambda: publisher_pid(journal) and frames_in(journal) >= 3)
        publisher = publisher_pid(journal)
        os.kill(publisher, signal.SIGSTOP)
        os.kill(first.pid, signal.SIGKILL)
        assert first.wait(10) == -signal.SIGKILL
        code, err = finished(trainer(tmp_path, out, "second", 3))
        assert code != 0 and f"its publisher process (pid {publisher}) is still sending" in err, err[-2000:]
        assert read_journal(journal).run_id == "first"
    finally:
        if publisher > 0:  # never pid 0: that would signal this test's process group
            with contextlib.suppress(ProcessLookupError):
                os.kill(publisher, signal.SIGCONT)  # the one stopped (the status file may be another run's)
        if first.poll() is None:
            first.kill()
            first.wait()
    wait_for("the publisher to drain and exit", lambda: not pid_alive(publisher))
    killed = [f.step for f in read_journal(journal).frames]
    code, err = finished(trainer(tmp_path, out, "third", 2))
    assert code == 0, err[-2000:]
    assert tensorboard_steps(out / "tensorboard" / "r-first") == grad_norms(range(1, len(killed) + 1))
    assert json.loads((out / "journal.first.jsonl.publisher.json").read_text())["status"] == "killed"


class Held:
    """A tracker that takes its time (its write waits for ``go``): the follower thread outlives close()."""

    name = "held"
    stores_nonfinite = frozenset({"nan", "inf"})

    def __init__(self) -> None:
        self.go = threading.Event()

    def start(self, run: Any) -> None:
        pass

    def write(self, frame: Any) -> None:
        self.go.wait(120)

    def close(self, *, failed: bool = False) -> None:
        pass


def test_in_thread_mode_the_run_holds_its_folder_until_the_follower_thread_is_done(tmp_path: Path) -> None:
    out = tmp_path / "run"
    held = Held()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # close_timeout passes: warned
        with MetricsCallback(adapters=["trainer"], out_dir=out, run_id="threaded", publisher="thread",
                             close_timeout=0.2, sinks=[{"type": "journal"}, held]) as cb:
            cb.on_chunk_end({"grad_norm": 1.0, "learning_rate": 0.001})
            cb.on_window_end(1)
    assert cb.publisher._thread is not None and cb.publisher._thread.is_alive()  # still tailing the journal
    code, err = finished(trainer(tmp_path, out, "second", 2))
    assert code != 0 and "journal.jsonl is in use by run 'threaded'" in err, err[-2000:]
    held.go.set()
    cb.publisher._thread.join(60)
    code, err = finished(trainer(tmp_path, out, "second", 2))  # the thread is done: the folder is free
    assert code == 0, err[-2000:]
    assert read_journal(out / "journal.threaded.jsonl").run_id == "threaded"


# -- 9. a re-run moves everything of the previous run with its journal --------------------------------


class Attaching(Sink):
    """A tracker that takes files, so that the publisher writes the run's record (an optional hook:
    a subclass of Sink)."""

    name = "attaching"
    stores_nonfinite = frozenset({"nan", "inf"})

    def __init__(self) -> None:
        self.files: list[Path] = []

    def start(self, run: Any) -> None:
        pass

    def write(self, frame: Any) -> None:
        pass

    def attach(self, files: Any) -> None:
        self.files = list(files)

    def close(self, *, failed: bool = False) -> None:
        pass


def one_run(out: Path, run_id: str) -> None:
    with MetricsCallback(adapters=["trainer"], out_dir=out, run_id=run_id, run_name="r", publisher="thread",
                         sinks=[{"type": "journal"}, Attaching()]) as cb:
        cb.on_run_start({"which": run_id})
        for step in (1, 2):
            cb.on_chunk_end({"grad_norm": 1.0, "learning_rate": 0.001})
            cb.on_window_end(step)
            cb.on_samples(step, [{"prompt": f"{run_id}-prompt-{step}", "completion": "c", "reward": 1.0}])


def test_a_rerun_moves_the_previous_runs_samples_record_and_status_with_its_journal(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    one_run(out, "one")
    (out / "publisher.log").write_text("the first run's publisher log\n")  # what a process-mode run leaves
    (out / "journal.jsonl.sinks.json").write_text('{"sinks": []}')
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        one_run(out, "two")
    old = out / "journal.one.jsonl"
    assert read_journal(old).run_id == "one"
    assert [s.rows[0]["prompt"] for s in read_samples(out / "journal.one.samples.jsonl")] == ["one-prompt-1", "one-prompt-2"]
    assert [s.rows[0]["prompt"] for s in read_samples(out / "journal.samples.jsonl")] == ["two-prompt-1", "two-prompt-2"]
    assert json.loads((out / "journal.one.jsonl.record" / "config.json").read_text()) == {"which": "one"}
    assert json.loads((out / "journal.jsonl.record" / "config.json").read_text()) == {"which": "two"}
    assert json.loads((out / "journal.one.jsonl.publisher.json").read_text())["sinks"]["attaching"]["frames"] == 2
    assert (out / "journal.one.publisher.log").read_text() == "the first run's publisher log\n"
    assert (out / "journal.one.jsonl.sinks.json").is_file() and not (out / "publisher.log").exists()
    capsys.readouterr()
    assert main(["export", str(old), "--to", "tensorboard", str(tmp_path / "tb"), "--quiet"]) == 0
    assert "2 steps of sample completions" in capsys.readouterr().out


# -- 10. nothing the run writes leaves out_dir through a symlink ------------------------------------


@pytest.mark.parametrize("planted", ["journal.jsonl.record", "journal.samples.jsonl", "publisher.log",
                                     "journal.jsonl.publisher.json", "journal.jsonl.sinks.json", "journal.jsonl.lock"])
def test_a_symlink_planted_at_a_runs_file_is_refused_at_start(tmp_path: Path, planted: str) -> None:
    out, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (elsewhere / "config.json").write_text("theirs")
    (out / planted).symlink_to(elsewhere if planted.endswith(".record") else elsewhere / "config.json")
    cb = MetricsCallback(adapters=["trainer"], out_dir=out, sinks=[{"type": "journal"}], publisher="inline")
    with pytest.raises(MetricsError, match=rf"the run's file .*{re.escape(planted)}.* resolves to {elsewhere}.*outside .*fix: "):
        cb.on_run_start({})
    assert (elsewhere / "config.json").read_text() == "theirs" and os.listdir(elsewhere) == ["config.json"]
    assert not (out / "journal.jsonl").exists()  # refused before anything was written


@pytest.mark.parametrize("tracker", ["mlflow", "tensorboard"])
def test_a_trackers_store_planted_as_a_symlink_is_not_written_through(tmp_path: Path, tracker: str,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    out, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    (out / "tensorboard").mkdir(parents=True)
    elsewhere.mkdir()
    victim = elsewhere / "theirs"
    victim.write_text("")  # an empty file is an empty SQLite database: MLflow would create its tables in it
    if tracker == "mlflow":
        (out / "mlflow.db").symlink_to(victim)
    else:
        (out / "tensorboard" / "r-planted").symlink_to(elsewhere)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with MetricsCallback(adapters=["trainer"], out_dir=out, run_id="planted", run_name="r", publisher="inline",
                             sinks=[{"type": "journal"}, {"type": tracker}]) as cb:
            cb.on_chunk_end({"grad_norm": 1.0, "learning_rate": 0.001})
            cb.on_window_end(1)
    assert victim.stat().st_size == 0 and os.listdir(elsewhere) == ["theirs"]
    said = [str(w.message) for w in caught] + caplog.messages  # the sink's failed start: a log record
    assert any("resolves to" in m and "outside" in m for m in said), said
    assert [f.step for f in read_journal(out / "journal.jsonl").frames] == [1]  # training went on


def test_export_refuses_a_default_target_reached_through_a_symlink(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    elsewhere.mkdir()
    with MetricsCallback(adapters=["trainer"], out_dir=out, sinks=[{"type": "journal"}], publisher="inline") as cb:
        cb.on_chunk_end({"grad_norm": 1.0, "learning_rate": 0.001})
        cb.on_window_end(1)
    (out / "tensorboard").symlink_to(elsewhere)
    (out / "mlflow.db").symlink_to(elsewhere / "theirs.db")
    for kind in ("tensorboard", "mlflow"):
        assert main(["export", str(out / "journal.jsonl"), "--to", kind, "--quiet"]) == 2
        assert f"resolves to {elsewhere}" in capsys.readouterr().err
    assert os.listdir(elsewhere) == []


# -- 11. the publisher process runs only the package's code ------------------------------------------


def test_a_users_tensorboard_py_and_mlflow_py_in_the_working_directory_do_not_stop_the_trackers(
        tmp_path: Path) -> None:
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    (work / "tensorboard.py").write_text("raise RuntimeError('the user own tensorboard.py was imported')\n")
    (work / "mlflow.py").write_text("# the user's own file: it does nothing\n")
    code, err = finished(trainer(tmp_path, out, "mine", 4, 0.0, "mlflow", cwd=work))
    assert code == 0, err[-2000:]
    assert tensorboard_steps(out / "tensorboard" / "r-mine") == grad_norms(range(1, 5))
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    [run] = [r for e in client.search_experiments()
             for r in client.search_runs([e.experiment_id], filter_string=f"tags.`{RUN_ID_TAG}` = 'mine'")]
    history = client.get_metric_history(run.info.run_id, "train/grad_norm")
    assert sorted((m.step, m.value) for m in history) == grad_norms(range(1, 5))
    assert "user own tensorboard.py" not in (out / "publisher.log").read_text()


# -- 12. a bad out_dir is a MetricsError when the callback is built ----------------------------------


@pytest.mark.parametrize("case", ["cannot be created", "a file", "under a file", "not writable"])
def test_a_bad_out_dir_is_refused_when_the_callback_is_built(tmp_path: Path, case: str) -> None:
    (tmp_path / "file").write_text("x")
    out_dir, said = {"cannot be created": ("/proc/1/nope", "cannot be written (FileNotFoundError"),
                     "a file": (str(tmp_path / "file"), "is a file, not a folder"),
                     "under a file": (str(tmp_path / "file" / "run"), "is under a file"),
                     "not writable": ("/sys", "cannot be written (PermissionError")}[case]
    with pytest.raises(MetricsError, match=re.escape(f"out_dir={out_dir!r} {said}")) as raised:
        MetricsCallback(adapters=["trainer"], out_dir=out_dir, sinks=[{"type": "journal"}])
    assert "; fix: give a folder this process can create files in" in str(raised.value)


def test_a_bad_out_dir_is_checked_only_on_the_rank_that_writes_it(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")  # the launcher's rank, before torch.distributed starts
    cb = MetricsCallback(adapters=["trainer"], out_dir="/proc/1/nope", sinks=[{"type": "journal"}])
    assert cb.out_dir == Path("/proc/1/nope") and not Path("/proc/1/nope").exists()


def _lock_held_by_a_draining_publisher(lock: Path, run_id: str, seconds: float) -> subprocess.Popen[str]:
    """A lock as a killed trainer leaves it: its trainer (a process that has exited) listed first, then its
    publisher, a real process that holds the flock for ``seconds`` more and exits."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    host = socket.gethostname()
    holder = subprocess.Popen([sys.executable, "-c", f"""
import fcntl, json, os, sys, time
fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
os.ftruncate(fd, 0)
for role, pid in (("trainer", {int(dead.stdout)}), ("publisher", os.getpid())):
    os.write(fd, (json.dumps({{"role": role, "pid": pid, "host": {host!r}, "run_id": {run_id!r}}}) + "\\n").encode())
print("held", flush=True)
time.sleep({seconds})
"""], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def test_a_resumed_run_waits_for_its_previous_attempts_publisher_instead_of_failing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A job restarted at once after a crash (same run id) finds the previous attempt's publisher still
    draining the journal: it waits for it and starts; another run is still refused at once."""
    from posttrain_metrics.journal import RunLock

    lock = tmp_path / "journal.jsonl.lock"
    holder = _lock_held_by_a_draining_publisher(lock, "resumed01", 2.0)
    try:
        with pytest.raises(MetricsError, match="still sending"):
            RunLock.take(lock, "another01")
        started = time.monotonic()
        taken = RunLock.take(lock, "resumed01")
        assert taken is not None and time.monotonic() - started < 60
        said = f"publisher process (pid {holder.pid}) still sends"  # why it waited: a log record
        assert sum(said in m for m in caplog.messages) == 1, caplog.messages
        taken.release()
    finally:
        holder.kill()
        holder.wait()
