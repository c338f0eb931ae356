"""The run's own record (journal, redacted config, doctor's report, dashboard) attached to the trackers at
close, read back with MLflow's client (a real server, and the embedded store) and from W&B's offline run."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from _runs import grpo_chunk

from posttrain_metrics.callbacks import MetricsCallback
from posttrain_metrics.integrations.wandb_reader import read_offline_run, run_file
from posttrain_metrics.journal import read_journal

pytestmark = pytest.mark.timeout(300)

SECRET = "hf_PLANTEDrecordSECRET0123456789abcdef"
RECORD = ["config.json", "dashboard.png", "doctor.json", "doctor.txt", "journal.jsonl"]  # matplotlib is in [dev]


def run(out: Path, mlflow: dict[str, Any], publisher: str) -> dict[str, dict[str, Any]]:
    cb = MetricsCallback(
        adapters=["grpo", "reward", "trainer"], out_dir=out, run_id=f"record{publisher}", run_name="record",
        publisher=publisher, extra={"my/oom_retries": "sum"},
        sinks=[{"type": "journal"}, {"type": "mlflow", "experiment": "record", **mlflow},
               {"type": "wandb", "project": "record", "mode": "offline", "settings": {"quiet": True}}],
    )
    rng = random.Random(3)
    with cb:
        cb.on_run_start({"rl": {"kl_beta": 0.04}, "hf_token": SECRET})
        for step in range(1, 6):
            for c in range(2):
                cb.on_chunk_end({**grpo_chunk(rng, step, last=c == 1), "my/oom_retries": 1})
            cb.on_window_end(step)
    return cb.run_handles  # the final report of the publisher names the trackers' runs


@pytest.mark.parametrize("publisher", ["process", "thread"])
def test_the_record_is_attached_to_mlflow_and_wandb_at_close(tmp_path: Path, mlflow_server: str,
                                                              publisher: str) -> None:
    from mlflow.tracking import MlflowClient

    out = tmp_path / "run"
    # the process run writes to a real server; the thread run to the embedded store beside the journal
    mlflow = {"tracking_uri": mlflow_server} if publisher == "process" else {}
    handles = run(out, mlflow, publisher)
    journal = out / "journal.jsonl"
    assert read_journal(journal).end is not None

    uri = handles["mlflow"]["tracking_uri"]
    client = MlflowClient(tracking_uri=uri)
    run_id = handles["mlflow"]["run_id"]
    listed = client.list_artifacts(run_id, "posttrain_metrics")
    assert sorted(Path(a.path).name for a in listed) == RECORD
    assert client.get_run(run_id).info.status == "FINISHED"  # attached before the run was closed
    got = Path(client.download_artifacts(run_id, "posttrain_metrics", str(tmp_path / "dl")))
    assert (got / "journal.jsonl").read_bytes() == journal.read_bytes()
    config = json.loads((got / "config.json").read_text())
    assert config["rl/kl_beta"] == 0.04 and config["hf_token"] == "***REDACTED***"
    doctor = json.loads((got / "doctor.json").read_text())
    assert doctor["format"] == "posttrain-metrics-doctor" and doctor["run"]["id"] == f"record{publisher}"
    assert doctor["run"]["extra"] == {"my/oom_retries": "sum"}
    assert (got / "doctor.txt").read_text().startswith(f"run record (id record{publisher}): 5 train frames")
    assert (got / "dashboard.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for path in got.rglob("*"):
        assert SECRET not in path.read_bytes().decode("latin-1"), path

    files = Path(handles["wandb"]["dir"]) / "posttrain_metrics"
    assert sorted(p.name for p in files.iterdir()) == RECORD
    assert (files / "journal.jsonl").read_bytes() == journal.read_bytes()
    assert json.loads((files / "config.json").read_text()) == config
    offline = read_offline_run(run_file(files.parent.parent / f"run-record{publisher}.wandb"))
    saved = sorted(f.path for r in offline.records if r.WhichOneof("record_type") == "files" for f in r.files.files)
    assert [p for p in saved if p.startswith("posttrain_metrics/")] == [f"posttrain_metrics/{n}" for n in RECORD]
