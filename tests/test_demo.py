"""The demo, run for real: 2 gloo ranks, every sink, read back with each vendor's own client."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _runs import tensorboard_run

from posttrain_metrics import get_adapter
from posttrain_metrics.core.keys import describe, headline_keys
from posttrain_metrics.demo.grpo_toy import NullHooks, ToyConfig, completion_rows, run_distributed
from posttrain_metrics.demo.main import DEMO_ADAPTERS
from posttrain_metrics.integrations.wandb_reader import read_offline_run
from posttrain_metrics.journal import read_journal

pytestmark = pytest.mark.slow  # runs the demo (gloo ranks, publisher process, wandb-core)

STEPS = 10  # one validation frame at step 10


OUTPUT: dict[str, str] = {}  # the demo's stdout and stderr


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo") / "run"
    result = subprocess.run(
        [sys.executable, "-m", "posttrain_metrics.cli", "demo", "--out", str(out), "--steps", str(STEPS),
         "--ranks", "2", "--seed", "1"],
        capture_output=True, text=True, timeout=240,
    )
    assert result.returncode == 0, f"demo failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert "mlflow ui --backend-store-uri" in result.stdout and "tensorboard --logdir" in result.stdout
    assert "wandb sync" in result.stdout and "Doctor:" in result.stdout
    OUTPUT.update(stdout=result.stdout, stderr=result.stderr)
    return out


def numeric_headlines(frame_metrics: dict) -> list[str]:
    keys = describe([get_adapter(a) for a in DEMO_ADAPTERS])
    return [k for k in headline_keys(keys, frame_metrics) if not isinstance(frame_metrics[k], str)]


def test_demo_headline_keys_agree_across_journal_mlflow_tensorboard_and_wandb(demo_run: Path) -> None:
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    journal = read_journal(demo_run / "journal.jsonl")
    assert journal.end is not None and journal.end["status"] == "finished"
    train = [f for f in journal.frames if f.phase == "train"]
    val = [f for f in journal.frames if f.phase == "val"]
    assert [f.step for f in train] == list(range(1, STEPS + 1)) and [f.step for f in val] == [STEPS]

    client = MlflowClient(tracking_uri=f"sqlite:///{demo_run}/mlflow.db")
    experiment = client.get_experiment_by_name("posttrain-metrics-demo")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED"

    events = EventAccumulator(str(tensorboard_run(demo_run)), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    tb_tags = set(events.Tags()["scalars"])

    wandb_run = read_offline_run(demo_run / "wandb")
    assert wandb_run.exit_code == 0

    checked = 0
    for frame in journal.frames:
        keys = numeric_headlines(dict(frame.metrics))
        assert keys, f"step {frame.step}: no headline keys"
        for key in keys:
            want = float(frame.metrics[key])
            ml = {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
            assert ml[frame.step] == pytest.approx(want, rel=1e-12, abs=1e-12), (key, frame.step)
            assert key in tb_tags, key
            tb = {e.step: e.value for e in events.Scalars(key)}
            assert tb[frame.step] == pytest.approx(want, rel=1e-6, abs=1e-7), (key, frame.step)  # float32
            wb = wandb_run.column(key)
            assert wb[frame.step] == pytest.approx(want, rel=1e-12, abs=1e-12), (key, frame.step)
            checked += 1
    assert checked >= STEPS * 4
    # the outcome label: the journal holds the string, MLflow the last one as a tag, W&B every step's
    outcomes = {f.step: f.metrics["optim/update_outcome"] for f in train}
    assert run.data.tags["optim/update_outcome"] == outcomes[STEPS]
    assert wandb_run.column("optim/update_outcome") == outcomes
    assert set(outcomes.values()) <= {"applied", "skipped"}


def test_demo_console_shows_our_lines_and_the_trackers_chatter_goes_to_the_log(demo_run: Path) -> None:
    stdout, stderr = OUTPUT["stdout"], OUTPUT["stderr"]
    log = demo_run / "publisher.log"
    assert stdout.count(f"tracker logs (W&B, MLflow, TensorBoard output): {log}") == 2  # at start and end
    text = log.read_text()
    assert "INFO" in text and "mlflow" in text  # MLflow's schema creation on the fresh SQLite file
    for stream in (stdout, stderr):
        assert not re.search(r"^(wandb:|.* INFO )", stream, re.M), stream[-2000:]
        assert "alembic" not in stream
    train = {int(m[1]): m[0] for m in re.finditer(rf"^\d\d:\d\d:\d\d train step (\d+)/{STEPS} \|.*$", stdout, re.M)}
    assert sorted(train) == list(range(1, STEPS + 1))
    assert all(" | eta " in train[s] for s in range(2, STEPS + 1))

    # each window's updates by outcome, as the journal holds them, on its console line
    n_mini = ToyConfig().n_minibatches
    for frame in read_journal(demo_run / "journal.jsonl").frames:
        if frame.phase != "train":
            continue
        applied, skipped = frame.metrics["optim/updates_applied"], frame.metrics["optim/updates_skipped"]
        assert applied + skipped == n_mini, frame.step  # every update of the window, counted once
        line = train[frame.step]
        if skipped:
            shown = ", ".join(f"{o} {n}" for o, n in (("applied", applied), ("skipped", skipped)) if n)
            assert f"| updates {shown} |" in line + " |", line  # then the ETA, or the end of the line
        else:
            assert "updates" not in line, line
        assert "SKIPPED" not in line


def test_demo_summary_prints_the_links_that_open_each_tracker_on_the_headline_keys(demo_run: Path) -> None:
    """TensorBoard's custom-scalars tab (its headline group first) and MLflow's runs table with the
    headline columns (the experiment's shared view; its id is the one the run went to)."""
    from mlflow import MlflowClient

    stdout = OUTPUT["stdout"]
    assert "then open http://localhost:6006/#custom_scalars" in stdout
    experiment = MlflowClient(f"sqlite:///{demo_run / 'mlflow.db'}").get_experiment_by_name("posttrain-metrics-demo")
    assert experiment is not None
    link = (f"http://127.0.0.1:5000/#/experiments/{experiment.experiment_id}/runs"
            "?workflowType=machine_learning&viewStateShareKey=posttrain-metrics")
    assert f"runs table: {link}\n" in stdout and f"charts:     {link}&compareRunsMode=CHART\n" in stdout
    assert "mlflow.sharedViewState.posttrain-metrics" in experiment.tags


def test_demo_reward_rises_over_a_seeded_run() -> None:
    """80 steps on 2 ranks, seed 0: the mean reward of the last tenth of the steps far above the first."""
    summaries = run_distributed(ToyConfig(steps=80, seed=0), _null_hooks, ranks=2)
    rewards = [float(r) for r in summaries[0]["reward_mean"]]
    assert len(rewards) == 80 and rewards == [float(r) for r in summaries[1]["reward_mean"]]
    first, last = sum(rewards[:8]) / 8, sum(rewards[-8:]) / 8
    assert all(math.isfinite(r) for r in rewards)
    assert last > first + 0.4, f"reward did not rise: {first:.3f} -> {last:.3f}"


def _null_hooks(rank: int, world_size: int) -> NullHooks:
    return NullHooks()


def test_demo_rows_name_their_group_and_flag_a_completion_cut_by_the_token_budget() -> None:
    """Two prompts of two samples on rank 1: the group is a name (``0.2`` reads as a number in the
    trackers), and ``truncated`` says which completion ran out of tokens (no end token)."""
    import types

    import torch

    config = ToyConfig(group_size=2)
    eos = config.eos
    rollout = types.SimpleNamespace(
        targets=torch.tensor([3, 3, 7, 7]),
        tokens=torch.tensor([[3, eos, 0, 0], [1, 2, eos, 0], [1, 2, 3, 4], [7, eos, 0, 0]]),
        mask=torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool),
        truncated=torch.tensor([False, False, True, False]),
        rewards=torch.tensor([1.0, 1.0, 0.0, 1.0]),
    )
    batch: Any = types.SimpleNamespace(rollout=rollout, advantages=torch.tensor([0.0, 0.0, -0.70711, 0.70711]))
    rows = completion_rows(batch, config, rank=1)
    assert [(r["group"], r["completion"], r["response_len"], r["truncated"]) for r in rows] == [
        ("r1-g0", "3 [eos]", 2, ""), ("r1-g0", "1 2 [eos]", 3, ""),
        ("r1-g1", "1 2 3 4", 4, "token budget"), ("r1-g1", "7 [eos]", 2, ""),
    ]


def test_demo_publishes_a_completions_table_in_every_tracker(demo_run: Path) -> None:
    """Both ranks' completions reach rank 0; the sample (16 rows a step, whole groups of the demo's
    group size) is in the samples file, a W&B Table, an MLflow table and TensorBoard text."""
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from posttrain_metrics.journal.samples import read_samples

    group_size = ToyConfig().group_size
    samples = read_samples(demo_run / "journal.samples.jsonl")
    assert [s.step for s in samples] == list(range(1, STEPS + 1))
    for s in samples:
        groups = [row["group"] for row in s.rows]
        assert 0 < len(s.rows) <= 16 and all(groups.count(g) == group_size for g in set(groups))  # whole groups
        assert {g.split("-")[0] for g in groups} <= {"r0", "r1"} and s.offered == 2 * ToyConfig().prompts_per_rank * group_size
        assert s.columns[:7] == ["group", "prompt", "completion", "reward", "advantage", "response_len", "truncated"]
        assert sorted(s.histograms) == ["advantage", "response_len", "reward"]
        assert all(h.num == s.offered for h in s.histograms.values())  # every row of both ranks, not the sample
    assert {g.split("-")[0] for s in samples for g in (row["group"] for row in s.rows)} == {"r0", "r1"}  # both ranks

    client = MlflowClient(tracking_uri=f"sqlite:///{demo_run}/mlflow.db")
    experiment = client.get_experiment_by_name("posttrain-metrics-demo")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    tables = client.list_artifacts(run.info.run_id, "posttrain_metrics/samples")
    assert len(tables) == STEPS
    last = json.loads(Path(client.download_artifacts(run.info.run_id, tables[-1].path, str(demo_run.parent / "dl")))
                      .read_text())
    assert last["data"] == samples[-1].table()

    events = EventAccumulator(str(tensorboard_run(demo_run)), size_guidance={"tensors": 0})
    events.Reload()
    assert sorted(e.step for e in events.Tensors("samples/completions")) == list(range(1, STEPS + 1))

    wandb_run = read_offline_run(demo_run / "wandb")
    paths = wandb_run.column("samples/completions/path")
    assert sorted(paths) == list(range(1, STEPS + 1))
    table = json.loads((wandb_run.path.parent / "files" / paths[STEPS]).read_text())
    assert table["data"] == samples[-1].table()


PERF_KEYS = ("perf/window_s", "perf/window_s_mean", "perf/tokens_per_s", "perf/samples_per_s", "perf/tokens_total",
             "perf/samples_total", "perf/time_s", "perf/rss_peak_gib", "timer/generation_s",
             "timer/generation_s_mean", "timer/train_s", "timer/train_s_mean")


def test_demo_publishes_throughput_and_stage_timers_in_every_tracker(demo_run: Path) -> None:
    """Issue 28: the perf/ and timer/ keys of every training frame, read back from MLflow (sqlite),
    TensorBoard's event files and the offline W&B run, equal the journal's."""
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    journal = read_journal(demo_run / "journal.jsonl")
    train = [f for f in journal.frames if f.phase == "train"]
    client = MlflowClient(tracking_uri=f"sqlite:///{demo_run}/mlflow.db")
    experiment = client.get_experiment_by_name("posttrain-metrics-demo")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    events = EventAccumulator(str(tensorboard_run(demo_run)), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    wandb_run = read_offline_run(demo_run / "wandb")
    for key in PERF_KEYS:
        want = {f.step: float(f.metrics[key]) for f in train}
        assert len(want) == STEPS, key
        ml = {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
        tb = {e.step: e.value for e in events.Scalars(key)}
        wb = wandb_run.column(key)
        for step, value in want.items():
            assert ml[step] == pytest.approx(value, rel=1e-12, abs=1e-12), (key, step)
            assert tb[step] == pytest.approx(value, rel=1e-6, abs=1e-7), (key, step)
            assert wb[step] == pytest.approx(value, rel=1e-12, abs=1e-12), (key, step)
    # the running totals are the sums of the window figures (the alternate x-axes)
    tokens = [f.metrics["train/valid_token_count"] for f in train]
    assert [f.metrics["perf/tokens_total"] for f in train] == [sum(tokens[: i + 1]) for i in range(STEPS)]
    assert all(f.metrics["perf/window_s"] >= f.metrics["perf/window_s_mean"] > 0 for f in train)
