"""The console line (timestamp, step/total, ETA, outcome counts), the window's update counts, where
the publisher process's output goes, where our warnings point, and the command line's --version."""

from __future__ import annotations

import io
import math
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from posttrain_metrics import Frame, MetricsError, reduce_metrics
from posttrain_metrics.callbacks import MetricsCallback
from posttrain_metrics.integrations import ConsoleSink
from posttrain_metrics.publication import Publisher

T0 = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def console_lines(frames: list[Frame], **options) -> list[str]:
    out = io.StringIO()
    pub = Publisher([ConsoleSink(stream=out, **options)], adapters=["grpo", "reward", "trainer"], run_name="c",
                    run_id="c1")
    pub.start()
    for frame in frames:
        pub.publish(frame)
    pub.close()
    return out.getvalue().splitlines()


def test_console_line_has_time_step_of_total_and_eta(utc) -> None:
    # steps 1..4 closing 2 s apart: from step 2 on, 2 s per step since step 1
    frames = [Frame(s, {"train/grad_norm": 0.5}, wall_time=T0 + 2 * (s - 1)) for s in range(1, 5)]
    frames.append(Frame(4, {"val/reward_avg": 0.25}, phase="val", wall_time=T0 + 7))
    lines = console_lines(frames, total_steps=10)
    assert lines[0] == "run c (c1): adapters grpo, reward, trainer, 10 steps"
    assert lines[1] == "22:13:20 train step 1/10 | grad_norm 0.5"  # no ETA from one point
    assert lines[2] == "22:13:22 train step 2/10 | grad_norm 0.5 | eta 16s"  # 8 steps left x 2 s
    assert lines[4] == "22:13:26 train step 4/10 | grad_norm 0.5 | eta 12s"  # 6 x (6 s / 3 steps)
    assert lines[5] == "22:13:27 val step 4"  # validation: no total, no ETA


def test_console_without_a_total_shows_the_bare_step(utc) -> None:
    lines = console_lines([Frame(s, {"train/grad_norm": 1}, wall_time=T0 + s) for s in (1, 2)])
    assert lines[0] == "run c (c1): adapters grpo, reward, trainer"
    assert lines[2] == "22:13:22 train step 2 | grad_norm 1"


def test_console_eta_in_minutes_and_hours(utc) -> None:
    frames = [Frame(1, {"train/grad_norm": 1}, wall_time=T0), Frame(2, {"train/grad_norm": 1}, wall_time=T0 + 75)]
    assert console_lines(frames, total_steps=3)[-1].endswith("| eta 1m15s")  # 1 step x 75 s
    assert console_lines(frames, total_steps=200)[-1].endswith("| eta 4h07m")  # 198 x 75 s = 14850 s = 4 h 7.5 min, minutes cut


def test_console_counts_updates_by_outcome(utc) -> None:
    """Two updates in one window, the second skipped: the counts, not the last label alone."""
    both = {"optim/update_outcome": "skipped", "optim/updates_applied": 1, "optim/updates_skipped": 1}
    applied = {"optim/update_outcome": "applied", "optim/updates_applied": 2, "optim/updates_skipped": 0}
    label_only = {"optim/update_outcome": "skipped"}  # a producer that reports no counts
    lines = console_lines([Frame(8, both, wall_time=T0), Frame(9, applied, wall_time=T0),
                           Frame(10, label_only, wall_time=T0)], min_interval=0)
    assert lines[1] == "22:13:20 train step 8 | updates applied 1, skipped 1"
    assert "SKIPPED" not in lines[1]
    assert lines[2] == "22:13:20 train step 9"  # all applied: nothing to say
    assert lines[3] == "22:13:20 train step 10 | update_outcome SKIPPED"


def shown_steps(lines: list[str]) -> list[int]:
    return [int(line.split(" step ")[1].split()[0].split("/")[0]) for line in lines if " train step " in line]


def test_console_shows_a_line_per_min_interval_and_always_what_matters(utc) -> None:
    """Steps 0.25 s apart, ``min_interval`` 1 s: a line per second, counted from the last line shown.
    Step 7 skipped its update and step 12 has a NaN grad_norm: both shown at once (and the interval
    counts from them); step 20 is the run's last. Worked out by hand: 1 (t 0), 5 (t 1.0), 7 (skipped,
    t 1.5), 11 (t 2.5), 12 (NaN), 16 (t 3.75), 20 (last)."""
    def frame(step: int) -> Frame:
        metrics: dict[str, object] = {"train/grad_norm": math.nan if step == 12 else 0.5,
                                      "optim/update_outcome": "skipped" if step == 7 else "applied"}
        return Frame(step, metrics, wall_time=T0 + 0.25 * (step - 1))  # type: ignore[arg-type]

    lines = console_lines([frame(s) for s in range(1, 21)], total_steps=20, min_interval=1.0)
    assert shown_steps(lines) == [1, 5, 7, 11, 12, 16, 20]
    assert "update_outcome SKIPPED" in lines[3] and "grad_norm nan" in lines[5]
    # no total: the last step not shown (10) is printed at close, after the validation line
    frames = [frame(s) for s in range(1, 11)] + [Frame(10, {"val/reward_avg": 0.5}, phase="val", wall_time=T0 + 2.3)]
    frames[6] = Frame(7, {"train/grad_norm": 0.5}, wall_time=frames[6].wall_time)  # no outcome: nothing notable
    lines = console_lines(frames, min_interval=1.0)
    assert shown_steps(lines) == [1, 5, 9, 10] and lines[-2] == "22:13:22 val step 10"
    assert shown_steps(console_lines(frames, min_interval=0)) == list(range(1, 11))  # 0: every step
    for bad in (-1, math.inf, math.nan, "1", True):
        with pytest.raises(MetricsError, match=r"min_interval=.*fix: pass the least number of seconds"):
            ConsoleSink(min_interval=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -3, 2.5, "80", True])
def test_total_steps_must_be_a_whole_number(bad: object) -> None:
    with pytest.raises(MetricsError, match=r"total_steps=.*fix"):
        ConsoleSink(total_steps=bad)  # type: ignore[arg-type]
    with pytest.raises(MetricsError, match=r"total_steps="):
        MetricsCallback(adapters=["trainer"], sinks=[{"type": "console"}], total_steps=bad)  # type: ignore[arg-type]


def test_callback_passes_total_steps_to_the_console(capsys: pytest.CaptureFixture[str]) -> None:
    with MetricsCallback(adapters=["trainer"], sinks=[{"type": "console"}], run_name="t", total_steps=5) as cb:
        cb.on_chunk_end({"grad_norm": 1.0})
        cb.on_window_end(1)
        cb.set_total_steps(7)  # a trainer that learns its length later (HF state.max_steps)
        cb.on_chunk_end({"grad_norm": 1.0})
        cb.on_window_end(2)
    out = capsys.readouterr().out
    assert " train step 1/5 | " in out and " train step 2/7 | " in out


# -- the window's updates by outcome: AGREED counts, exact across chunks and ranks ----------------------


def update_chunk(outcome: str, applied: int, skipped: int) -> dict[str, object]:
    return {"update_outcome": outcome, "updates_applied": applied, "updates_skipped": skipped}


def test_update_counts_are_the_windows_count_on_every_rank() -> None:
    # n_mini = 3 with 2 accumulation chunks: applied, skipped, applied. Each update's last chunk
    # carries the window's count so far; the window's count is the last: applied 2, skipped 1.
    window = [{"update_outcome": "accumulating"}, update_chunk("applied", 1, 0),
              {"update_outcome": "accumulating"}, update_chunk("skipped", 1, 1),
              {"update_outcome": "accumulating"}, update_chunk("applied", 2, 1)]
    for ranks in (1, 2, 4):  # every rank saw the same updates: counted once, not once per rank
        got = reduce_metrics("trainer", [window] * ranks)
        assert got["optim/update_outcome"] == "applied"  # the last label, as before
        assert got["optim/updates_applied"] == 2 and type(got["optim/updates_applied"]) is int
        assert got["optim/updates_skipped"] == 1
        assert "optim/updates_discarded" not in got  # not reported: absent, not zero


def test_ranks_that_counted_different_updates_are_desynchronised() -> None:
    with pytest.raises(MetricsError, match=r"ranks disagree on 'optim/updates_skipped'"):
        reduce_metrics("trainer", [[update_chunk("skipped", 1, 1)], [update_chunk("skipped", 1, 2)]])


def test_negative_update_count_is_refused() -> None:
    with pytest.raises(MetricsError, match="updates_applied"):
        reduce_metrics("trainer", [[update_chunk("applied", -1, 0)]])


def test_run_aggregate_of_a_windows_count_is_the_runs_total() -> None:
    from posttrain_metrics import get_adapter
    from posttrain_metrics.core.keys import describe
    from posttrain_metrics.core.summary import RunSummary

    summary = RunSummary(describe([get_adapter("trainer")]))
    windows = [(1, 1, 5), (2, 0, 7), (0, 2, 7)]  # (applied, skipped, optimizer_step after the window)
    for step, (applied, skipped, committed) in enumerate(windows, 1):
        summary.add(Frame(step, {"optim/updates_applied": applied, "optim/updates_skipped": skipped,
                                 "optim/optimizer_step": committed}))
    got = summary.values()
    assert got["optim/updates_applied"] == 3 and type(got["optim/updates_applied"]) is int  # 1 + 2 + 0
    assert got["optim/updates_skipped"] == 3  # 1 + 0 + 2
    assert got["optim/optimizer_step"] == 7  # a running counter: its last value, as before


def test_a_run_total_is_declared_on_agreed_counts_only() -> None:
    from posttrain_metrics import Metric, MetricAdapter
    from posttrain_metrics.core.reduction import Reduction, RunAggregate

    with pytest.raises(MetricsError, match=r"run=.* fix: declare it Reduction\.AGREED"):
        MetricAdapter("mine", metrics=[Metric("events", Reduction.SUM, "Events", count=True, run=RunAggregate.TOTAL)])


# -- where output and warnings go -------------------------------------------------------------------


def test_a_callback_warning_points_at_the_calling_line(tmp_path: Path) -> None:
    cb = MetricsCallback(adapters=["trainer"], sinks=[{"type": "memory"}], run_name="w")
    cb.on_run_start()
    cb.on_run_end()
    cb.on_chunk_end({"grad_norm": 1.0})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cb.on_window_end(3)  # after close: warned, not recorded
    (warning,) = [w for w in caught if "after close" in str(w.message)]
    assert warning.filename == __file__, warning.filename


def test_publisher_process_output_goes_to_its_log_and_our_warnings_to_stderr(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The real publisher process with the real MLflow (a fresh SQLite file: its schema creation logs
    INFO lines) and a TensorBoard sink that cannot start (its log_dir is a file): MLflow's chatter is
    in publisher.log only; our warning about TensorBoard is one line on the trainer's stderr."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = tmp_path / "run"
    cb = MetricsCallback(adapters=["trainer"], out_dir=out, run_name="quiet", close_timeout=240,
                         sinks=[{"type": "journal"}, {"type": "console"}, {"type": "mlflow"},
                                {"type": "tensorboard", "log_dir": str(blocker)}])
    with cb:
        cb.on_run_start({"lr": 0.1})
        for step in (1, 2):
            cb.on_chunk_end({"grad_norm": 1.0, "update_outcome": "applied", "updates_applied": 1})
            cb.on_window_end(step)
    captured = capfd.readouterr()
    log = (out / "publisher.log").read_text()
    assert "mlflow" in log and "INFO" in log  # the vendor's own lines are kept, in the log
    assert "INFO" not in captured.out + captured.err and "alembic" not in captured.err
    ours = [line for line in captured.err.splitlines() if "sink 'tensorboard' failed in start()" in line]
    assert len(ours) == 1 and ours[0].startswith("posttrain-metrics publisher: warning: "), captured.err
    assert captured.out.count(f"tracker logs (W&B, MLflow, TensorBoard output): {out / 'publisher.log'}") == 2


# -- the closing summary's links (issue 30, item 3) -----------------------------------------------------

RUNS_TABLE = "/#/experiments/{}/runs?workflowType=machine_learning&viewStateShareKey=posttrain-metrics"


def test_the_closing_links_open_each_tracker_on_its_headline_view(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """From the trackers' own names for a run (what ``run_handles`` gives): TensorBoard's custom-scalars
    tab on the runs' parent folder, MLflow's experiment runs table and chart view with the shared view,
    and the command that starts ``mlflow ui`` on a SQLite file; W&B's page, or ``wandb sync`` offline.
    Folders under the current one are shown relative to it."""
    from posttrain_metrics.integrations.views import closing_links

    monkeypatch.chdir(tmp_path)
    local = {
        "journal": {},
        "tensorboard": {"log_dir": str(tmp_path / "out" / "tensorboard" / "r-1")},
        "mlflow": {"run_id": "ab", "experiment_id": "12", "tracking_uri": f"sqlite:///{tmp_path}/out/mlflow.db"},
        "wandb": {"run_id": "r1", "url": None, "dir": str(tmp_path / "out" / "wandb" / "offline-run-x" / "files")},
    }
    table = "http://127.0.0.1:5000" + RUNS_TABLE.format(12)
    assert closing_links(local) == [
        "trackers, opened on loss and reward:",
        "  TensorBoard   tensorboard --logdir out/tensorboard",
        "                then open http://localhost:6006/#custom_scalars (loss, reward, KL first)",
        "  MLflow        mlflow ui --backend-store-uri sqlite:///out/mlflow.db",
        f"                runs table: {table}",
        f"                charts:     {table}&compareRunsMode=CHART",
        "  W&B           wandb sync out/wandb/offline-run-x",
    ]
    # a server: its own address, without the user:password a browser asks for; W&B online: its page
    served = {"mlflow": {"experiment_id": 3, "tracking_uri": "https://bob:Pw-4-links@mlflow.example:8443/"},
              "wandb": {"url": "https://wandb.ai/team/p/runs/r1", "dir": "/elsewhere/files"}}
    table = "https://mlflow.example:8443" + RUNS_TABLE.format(3)
    assert closing_links(served) == [
        "trackers, opened on loss and reward:",
        f"  MLflow        runs table: {table}",
        f"                charts:     {table}&compareRunsMode=CHART",
        "  W&B           https://wandb.ai/team/p/runs/r1",
    ]
    assert closing_links({"mlflow": {"experiment_id": "1", "tracking_uri": "databricks"}}) == []
    assert closing_links({"console": {}, "journal": {}}) == []


def test_a_run_without_trackers_closes_with_no_links(utc) -> None:
    lines = console_lines([Frame(1, {"train/grad_norm": 0.5}, wall_time=T0)])
    assert lines == ["run c (c1): adapters grpo, reward, trainer", "22:13:20 train step 1 | grad_norm 0.5"]


def test_a_live_runs_closing_summary_links_its_trackers(tmp_path: Path, mlflow_server: str) -> None:
    """A run of the callback (not the demo), its trackers fed by the publisher process: the console's
    last lines open TensorBoard on this run's folder and the real MLflow server on the experiment the
    run went to (its id read back with MlflowClient), with the shared view stored on it."""
    import random

    from _runs import grpo_chunk
    from mlflow import MlflowClient

    out = io.StringIO()
    cb = MetricsCallback(adapters=["grpo", "reward", "trainer"], out_dir=tmp_path, run_name="links", close_timeout=240,
                         sinks=[{"type": "journal"}, ConsoleSink(stream=out), {"type": "tensorboard"},
                                {"type": "mlflow", "tracking_uri": mlflow_server, "experiment_name": "closing-links"}])
    rng = random.Random(0)
    with cb:
        cb.on_run_start({"lr": 1e-6})
        for step in (1, 2):
            cb.on_chunk_end(grpo_chunk(rng, step, True))
            cb.on_window_end(step)
    experiment = MlflowClient(mlflow_server).get_experiment_by_name("closing-links")
    assert experiment is not None and "mlflow.sharedViewState.posttrain-metrics" in experiment.tags
    (run,) = MlflowClient(mlflow_server).search_runs([experiment.experiment_id])
    assert run.data.tags["posttrain_metrics.run_id"] == cb.publisher.run_id
    table = mlflow_server.rstrip("/") + RUNS_TABLE.format(experiment.experiment_id)
    lines = out.getvalue().splitlines()
    assert lines[-5:] == [
        "trackers, opened on loss and reward:",
        f"  TensorBoard   tensorboard --logdir {tmp_path / 'tensorboard'}",  # not under the current folder
        "                then open http://localhost:6006/#custom_scalars (loss, reward, KL first)",
        f"  MLflow        runs table: {table}",
        f"                charts:     {table}&compareRunsMode=CHART",
    ], lines
    assert [p.name for p in (tmp_path / "tensorboard").iterdir() if p.is_dir()] == [f"links-{cb.publisher.run_id}"]


# -- the command line ---------------------------------------------------------------------------------


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "posttrain_metrics.cli", *args], capture_output=True, text=True,
                          timeout=120)


def test_version() -> None:
    import tomllib

    version = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())["project"]["version"]
    result = cli("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"posttrain-metrics {version}"


def test_demo_help_states_the_demos_defaults() -> None:
    from posttrain_metrics.demo.grpo_toy import ToyConfig

    toy = ToyConfig()
    text = " ".join(cli("demo", "--help").stdout.split())
    assert f"Defaults: {toy.steps} steps, 2 ranks over gloo, seed {toy.seed}" in text
    assert f"{toy.prompts_per_rank} prompts x {toy.group_size} samples" in text
    assert f"{toy.n_minibatches} optimizer updates (n_mini {toy.n_minibatches}) of {toy.grad_accum_chunks} " \
           "accumulation chunks" in text
    assert f"validation every {toy.val_every} steps" in text and f"(default {toy.steps})" in text
