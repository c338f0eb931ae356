"""Issue 23: an interrupted run says so. A real trainer process is sent SIGINT (Ctrl-C) mid-run; the
journal's end record, MLflow (the embedded store, read with MlflowClient), W&B (the offline run read
back from its transaction log) and TensorBoard (EventAccumulator) say it was interrupted and why."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import metadata as hparams_metadata

from posttrain_metrics.callbacks import MetricsCallback
from posttrain_metrics.doctor import run_checks
from posttrain_metrics.journal import read_journal

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # slow: signals a child trainer process

ROOT = Path(__file__).parents[1]

TRAINER = """
import sys, time
from pathlib import Path
from posttrain_metrics.callbacks import MetricsCallback

out = Path(sys.argv[1])
cb = MetricsCallback(adapters=["trainer"], out_dir=out, run_name="ctrlc", run_id="ctrlc01", close_timeout=120,
                     publisher=sys.argv[3],
                     sinks=[{"type": "journal"}, {"type": "tensorboard"}, {"type": "mlflow"},
                            {"type": "wandb", "project": "ctrlc", "mode": "offline"}])
USE_WITH = sys.argv[2] == "with"


def train():
    cb.on_run_start({"seed": 1})
    step = 0
    while True:  # until Ctrl-C
        step += 1
        cb.on_chunk_end({"grad_norm": 1.0, "learning_rate": 1e-3})
        cb.on_window_end(step)
        time.sleep(0.02)


if USE_WITH:
    with cb:
        train()
else:
    train()  # no with: the interpreter's exit closes the run (atexit)
"""


def interrupt_a_trainer(tmp_path: Path, how: str, mode: str = "process") -> Path:
    out = tmp_path / "run"
    script = tmp_path / "train.py"
    script.write_text(TRAINER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    proc = subprocess.Popen([sys.executable, str(script), str(out), how, mode], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    journal = out / "journal.jsonl"
    deadline = time.monotonic() + 120
    while not (journal.exists() and journal.read_bytes().count(b'"kind":"frame"') >= 5):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=240)
    assert "KeyboardInterrupt" in err  # the trainer did die of Ctrl-C
    return out


@pytest.mark.parametrize(("how", "mode"), [("with", "process"), ("atexit", "process"), ("atexit", "thread"),
                                             ("atexit", "inline")])
def test_a_trainer_sent_sigint_is_interrupted_with_its_reason_in_the_journal_and_every_tracker(tmp_path, how, mode):
    # thread, inline: the trackers run in the trainer's process. atexit is too late for them (the
    # interpreter's threads and executors are shut down: a tracker not started yet by the follower
    # thread at the 5th step never starts, MLflow's writer cannot close its run), so the run closes earlier
    out = interrupt_a_trainer(tmp_path, how, mode)
    journal = read_journal(out / "journal.jsonl")
    assert journal.end is not None
    assert (journal.end["status"], journal.end["reason"]) == ("interrupted", "KeyboardInterrupt")
    [finding] = [f for f in run_checks(journal) if f.check == "run_end"]
    assert "interrupted (KeyboardInterrupt)" in finding.explanation
    # MLflow: its own status for an interruption, KILLED, and the tags that say which and why
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    [run] = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert run.info.status == "KILLED"
    assert run.data.tags["posttrain_metrics.status"] == "interrupted"
    assert run.data.tags["posttrain_metrics.end_reason"] == "KeyboardInterrupt"
    # W&B offline: exit code 130 (128 + SIGINT), status and reason in the summary
    from posttrain_metrics.integrations.wandb_reader import read_offline_run

    offline = read_offline_run(next((out / "wandb").rglob("run-ctrlc01.wandb")))
    assert offline.exit_code == 130
    assert offline.summary["posttrain_metrics/status"] == "interrupted"
    assert offline.summary["posttrain_metrics/end_reason"] == "KeyboardInterrupt"
    # TensorBoard: the text at the last step and the hparams session's status
    [tb_dir] = (out / "tensorboard").iterdir()
    acc = EventAccumulator(str(tb_dir), size_guidance={"tensors": 0})
    acc.Reload()
    [text] = acc.Tensors("posttrain_metrics/end")
    assert text.tensor_proto.string_val == [b"interrupted: KeyboardInterrupt"]
    assert text.step == journal.frames[-1].step
    session = EventAccumulator(str(tb_dir / "hparams"))
    session.Reload()
    content = session.PluginTagToContent(hparams_metadata.PLUGIN_NAME)
    start = hparams_metadata.parse_session_start_info_plugin_data(content[hparams_metadata.SESSION_START_INFO_TAG])
    assert start.hparams["posttrain_metrics/status"].string_value == "interrupted"


def test_a_failure_records_its_exception_redacted_as_the_reason(tmp_path):
    cb = MetricsCallback(adapters=["trainer"], out_dir=tmp_path, sinks=[{"type": "journal"}], publisher="inline")
    with pytest.raises(RuntimeError), cb:
        cb.on_chunk_end({"grad_norm": 1.0})
        cb.on_window_end(1)
        raise RuntimeError("login failed with password=hunter2")
    end = read_journal(tmp_path / "journal.jsonl").end
    assert end is not None and end["status"] == "failed"
    assert end["reason"] == "RuntimeError: login failed with password=***REDACTED***"


@pytest.mark.parametrize(("code", "status", "reason"), [(0, "finished", None), (None, "finished", None),
                                                        (3, "failed", "SystemExit: 3")])
def test_sys_exit_in_the_runs_block_is_finished_when_its_code_says_success(tmp_path, code, status, reason):
    cb = MetricsCallback(adapters=["trainer"], out_dir=tmp_path, sinks=[{"type": "journal"}], publisher="inline")
    with pytest.raises(SystemExit), cb:
        cb.on_chunk_end({"grad_norm": 1.0})
        cb.on_window_end(1)
        sys.exit(code)
    end = read_journal(tmp_path / "journal.jsonl").end
    assert end is not None and (end["status"], end.get("reason")) == (status, reason)


def test_a_run_left_open_by_a_training_thread_closes_once_that_thread_is_done(tmp_path):
    """The main thread starts a (non-daemon) training thread and returns: the run is closed at the
    interpreter's exit, after that thread's last step, as atexit would."""
    script = tmp_path / "train.py"
    script.write_text(f"""
import threading, time
from posttrain_metrics.callbacks import MetricsCallback

cb = MetricsCallback(adapters=["trainer"], out_dir={str(tmp_path / "run")!r}, sinks=[{{"type": "journal"}},
                     {{"type": "mlflow"}}], publisher="inline")


def train():
    for step in range(1, 21):
        time.sleep(0.05)
        cb.on_chunk_end({{"grad_norm": 1.0}})
        cb.on_window_end(step)


cb.on_run_start()
threading.Thread(target=train).start()
""")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    subprocess.run([sys.executable, str(script)], env=env, check=True, capture_output=True, timeout=240)
    journal = read_journal(tmp_path / "run" / "journal.jsonl")
    assert [f.step for f in journal.frames] == list(range(1, 21))
    assert journal.end is not None and journal.end["status"] == "finished"
    client = MlflowClient(f"sqlite:///{tmp_path / 'run' / 'mlflow.db'}")
    [run] = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert run.info.status == "FINISHED"


def test_a_run_left_open_beside_a_live_process_pool_still_exits(tmp_path):
    """A process pool's manager thread ends in its own exit hook, after the one that closes the run: the
    close does not wait for it (the interpreter would never exit)."""
    script = tmp_path / "train.py"
    script.write_text(f"""
import concurrent.futures
from posttrain_metrics.callbacks import MetricsCallback

cb = MetricsCallback(adapters=["trainer"], out_dir={str(tmp_path / "run")!r}, sinks=[{{"type": "journal"}}],
                     publisher="inline")
pool = concurrent.futures.ProcessPoolExecutor(1)
assert pool.submit(abs, -3).result() == 3
cb.on_chunk_end({{"grad_norm": 1.0}})
cb.on_window_end(1)
""")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    subprocess.run([sys.executable, str(script)], env=env, check=True, capture_output=True, timeout=60)
    end = read_journal(tmp_path / "run" / "journal.jsonl").end
    assert end is not None and end["status"] == "finished"


def test_an_error_recorded_before_the_run_started_is_not_its_end_reason(tmp_path):
    """An interactive session (IPython, the REPL) keeps its last error in sys.last_value: one from before
    the run started does not make a run closed at exit failed."""
    script = tmp_path / "train.py"
    script.write_text(f"""
import sys
from posttrain_metrics.callbacks import MetricsCallback

sys.last_value = NameError("name 'x' is not defined")  # an earlier cell's typo
cb = MetricsCallback(adapters=["trainer"], out_dir={str(tmp_path / "run")!r}, sinks=[{{"type": "journal"}}],
                     publisher="inline")
cb.on_chunk_end({{"grad_norm": 1.0}})
cb.on_window_end(1)
""")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    subprocess.run([sys.executable, str(script)], env=env, check=True, capture_output=True, timeout=60)
    end = read_journal(tmp_path / "run" / "journal.jsonl").end
    assert end is not None and (end["status"], end.get("reason")) == ("finished", None)
