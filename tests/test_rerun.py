"""Re-running into an existing out_dir: a new run beside the old one (a new run id, the default), or
the same run resumed (the same run id), consistently in the journal, W&B (offline, read back from its
transaction logs) and MLflow (the embedded SQLite store, read back with MlflowClient); never a mix."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from _runs import GRPO_ADAPTERS, grpo_chunk

from posttrain_metrics.callbacks import MetricsCallback
from posttrain_metrics.integrations.mlflow import RUN_ID_TAG
from posttrain_metrics.integrations.wandb_reader import read_offline_run
from posttrain_metrics.journal import read_journal

pytestmark = pytest.mark.slow  # starts publisher processes and wandb-core


def train(out_dir: Path, steps: range, run_id: str | None = None) -> MetricsCallback:
    sinks = [{"type": "journal"}, {"type": "wandb", "project": "rerun", "settings": {"quiet": True}},
             {"type": "mlflow", "experiment_name": "rerun"}]
    rng = random.Random(steps.start)
    with MetricsCallback(adapters=GRPO_ADAPTERS, sinks=sinks, out_dir=out_dir, run_id=run_id,
                         publisher="thread") as cb:
        cb.on_run_start({"rl": {"kl_beta": 0.04}})
        for step in steps:
            cb.on_chunk_end(grpo_chunk(rng, step, last=True))
            cb.on_window_end(step)
    import wandb

    wandb.teardown()
    return cb


def wandb_steps(out_dir: Path, run_id: str) -> list[list[int]]:
    """The trainer/step of every history row, per offline run file of ``run_id`` (oldest first)."""
    files = sorted((out_dir / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    return [[row["trainer/step"] for row in read_offline_run(f).history] for f in files]


def mlflow_steps(out_dir: Path, run_id: str) -> list[list[int]]:
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{out_dir / 'mlflow.db'}")
    experiment: Any = client.get_experiment_by_name("rerun")
    runs = client.search_runs([experiment.experiment_id], filter_string=f"tags.`{RUN_ID_TAG}` = '{run_id}'")
    return [sorted(m.step for m in client.get_metric_history(r.info.run_id, "train/loss_avg")) for r in runs]


@pytest.fixture(autouse=True)
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR", "WANDB_PROJECT", "MLFLOW_TRACKING_URI",
                "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))


def test_a_second_run_into_the_same_out_dir_is_a_new_run_beside_the_first(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    first = train(tmp_path, range(1, 4)).publisher.run_id
    second = train(tmp_path, range(1, 3)).publisher.run_id
    assert first != second
    assert any("moved it to" in m for m in caplog.messages)  # the journal says what it did (a log record)
    assert read_journal(tmp_path / "journal.jsonl").run_id == second
    assert [f.step for f in read_journal(tmp_path / f"journal.{first}.jsonl").frames] == [1, 2, 3]
    # each tracker: two runs, each with its own steps once
    assert wandb_steps(tmp_path, first) == [[1, 2, 3]] and wandb_steps(tmp_path, second) == [[1, 2]]
    assert mlflow_steps(tmp_path, first) == [[1, 2, 3]] and mlflow_steps(tmp_path, second) == [[1, 2]]


def test_the_same_run_id_resumes_the_run_in_every_tracker(tmp_path: Path) -> None:
    train(tmp_path, range(1, 4), run_id="resumed-run")
    train(tmp_path, range(4, 6), run_id="resumed-run")
    assert [f.step for f in read_journal(tmp_path / "journal.jsonl").frames] == [1, 2, 3, 4, 5]
    assert mlflow_steps(tmp_path, "resumed-run") == [[1, 2, 3, 4, 5]]  # one MLflow run, continued
    # W&B offline: one file per session of the one run id (`wandb sync` resumes it: resume="allow"),
    # the second holding only the new steps
    assert wandb_steps(tmp_path, "resumed-run") == [[1, 2, 3], [4, 5]]
    files = sorted((tmp_path / "wandb").glob("offline-run-*-resumed-run/run-resumed-run.wandb"))
    assert [(read_offline_run(f).run.run_id, read_offline_run(f).run.resume) for f in files] == [
        ("resumed-run", True), ("resumed-run", True)]  # W&B's resume flag: the sync continues the run
