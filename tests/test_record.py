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
        sinks=[{"type": "journal"}, {"type": "mlflow", "experiment_name": "record", **mlflow},
               {"type": "wandb", "project": "record", "mode": "offline", "settings": {"quiet": True}}],
    )
    rng = random.Random(3)
    with cb:
        cb.on_run_start({"rl": {"kl_beta": 0.04, "betas": [0.9, 0.95], "ref_model": None}, "hf_token": SECRET})
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
    # the nested config W&B gets (a list stays a list, None stays null), not a flat one with "None"
    assert config == {"rl": {"kl_beta": 0.04, "betas": [0.9, 0.95], "ref_model": None}, "hf_token": "***REDACTED***"}
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


# -- the journal read pass by pass (what the record does at close) --------------------------------------


def small_journal(path: Path, steps: int = 5) -> list[str]:
    """A journal of ``steps`` train frames and an end record, written by the real writer; its lines."""
    from posttrain_metrics import Frame
    from posttrain_metrics.integrations.base import RunInfo
    from posttrain_metrics.journal import JournalSink

    sink = JournalSink(path)
    sink.start(RunInfo(run_id="passes", name="passes", config={}, keys={}, adapters=(), started=1.0))
    for step in range(1, steps + 1):
        sink.write(Frame(step, {"my/x": step * 0.5, "my/y": float("nan") if step == 3 else step}, "train", 2.0 + step))
    sink.close()
    return path.read_text().splitlines()


def test_open_journal_reads_the_file_as_it_was_when_opened_and_the_same_at_every_pass(tmp_path: Path) -> None:
    import math
    import warnings

    from posttrain_metrics.core.errors import MetricsError
    from posttrain_metrics.journal import open_journal

    path = tmp_path / "journal.jsonl"
    lines = small_journal(path)
    frame_line = lines[1]
    with path.open("a") as f:  # a torn last line: warned about once, at open
        f.write(frame_line[:20])
    with pytest.warns(UserWarning, match="skipped a torn last line") as caught:
        journal = open_journal(path)
    assert caught[0].filename == __file__  # the warning names the caller, not the reader
    assert len(journal.frames) == 5 and journal.end is not None and journal.end["status"] == "finished"
    assert journal.phases["train"].frames == 5
    assert (journal.phases["train"].first_step, journal.phases["train"].last_step) == (1, 5)
    assert len(journal.warnings) == 1

    with path.open("a") as f:  # the run goes on after the opening: not read by later passes
        f.write(frame_line[20:] + "\n" + frame_line.replace('"step":1', '"step":99') + "\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the torn line is not warned about again at each pass
        passes = [[(f.step, f.metrics["my/x"], f.metrics["my/y"]) for f in journal.frames] for _ in range(2)]
    assert passes[0][:2] == passes[1][:2] == [(1, 0.5, 1), (2, 1.0, 2)]
    assert [p[0] for p in passes[0]] == [p[0] for p in passes[1]] == [1, 2, 3, 4, 5]
    assert all(math.isnan(p[2][2]) for p in passes)  # NaN read back as NaN

    full = path.read_bytes()
    for cut in (len("\n".join(lines[:3])) + 1, len("\n".join(lines[:3])) - 7):  # at a line's end, inside one
        with path.open("r+b") as f:
            f.truncate(cut)  # shortened in place: not silently fewer frames
        with pytest.raises(MetricsError, match="shorter than when it was opened"):
            list(journal.frames)
        path.write_bytes(full)
    assert len(list(journal.frames)) == 5

    other = tmp_path / "other.jsonl"
    other.write_bytes(full)
    other.replace(path)  # another file at the path (a new run's journal), even with the same bytes
    with pytest.raises(MetricsError, match="replaced since it was opened"):
        list(journal.frames)


def test_the_record_of_a_journal_read_pass_by_pass_equals_the_record_of_it_read_whole(tmp_path: Path) -> None:
    from posttrain_metrics.doctor import format_findings, run_checks
    from posttrain_metrics.journal import open_journal
    from posttrain_metrics.publication.artifacts import record_dir, write_record

    path = tmp_path / "journal.jsonl"
    small_journal(path, steps=40)
    write_record(path)
    whole = read_journal(path)
    folder = record_dir(path)
    for name, as_json in (("doctor.txt", False), ("doctor.json", True)):
        assert (folder / name).read_text() == format_findings(run_checks(whole), as_json=as_json, journal=whole) + "\n"
    report = json.loads((folder / "doctor.json").read_text())
    assert report["run"]["phases"] == {"train": {"frames": 40, "first_step": 1, "last_step": 40}}
    assert [f["check"] for f in report["findings"]] == ["nonfinite_values"]  # my/y is NaN at step 3
    assert report["findings"][0]["steps"] == [3]
    assert (folder / "dashboard.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(open_journal(path).frames) == 40
