"""Issue 23: a full disk never turns into a silent gap. Faults are real: the trainer child process
sets its own file-size limit (RLIMIT_FSIZE, SIGXFSZ ignored) mid-run and lifts it later; the publisher
process, started before, feeds W&B (offline), MLflow (the embedded store) and TensorBoard."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _faults import run_child
from _runs import only_run
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from posttrain_metrics.doctor import run_checks
from posttrain_metrics.export import export
from posttrain_metrics.journal import JournalTail, open_journal, read_journal
from posttrain_metrics.publication.follower import MISSING_STEP_RANGES, MISSING_STEPS

pytestmark = pytest.mark.slow  # runs each case in a child process

TRAINER = """
    import json
    import logging
    import warnings
    from pathlib import Path
    from posttrain_metrics.callbacks import MetricsCallback

    said = []  # a full disk and its recovery are the run's state: log records (the recovery at INFO)

    class Keep(logging.Handler):
        def emit(self, record):
            said.append(record.getMessage())

    logging.getLogger("posttrain_metrics").addHandler(Keep())
    logging.getLogger("posttrain_metrics").setLevel(logging.INFO)
    out = Path({out!r})
    cb = MetricsCallback(adapters=["trainer"], out_dir=out, run_name="disk", run_id="diskrun01",
                         sinks={sinks!r}, close_timeout=120)
    journal = out / "journal.jsonl"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with cb:
            cb.on_run_start({{"seed": 1}})
            for step in range(1, 241):
                if step == 41:
                    disk_full(journal.stat().st_size)  # not one more byte: steps 41-229 cannot be written
                if step == 230:
                    disk_room()
                cb.on_chunk_end({{"grad_norm": step / 8, "learning_rate": 1e-3}})
                cb.on_window_end(step)
    print(json.dumps([m for m in [str(w.message) for w in caught] + said if "journal" in m]))
"""


def train(tmp_path: Path, sinks: list[dict[str, object]]) -> tuple[Path, list[str]]:
    out = tmp_path / "run"
    proc = run_child(TRAINER.format(out=str(out), sinks=sinks), tmp_path)
    return out, json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_full_disk_past_the_backlog_is_a_gap_that_the_journal_doctor_end_and_every_tracker_name(tmp_path):
    out, said = train(tmp_path, [{"type": "journal", "backlog_bytes": 0}, {"type": "tensorboard"},
                                 {"type": "mlflow"}, {"type": "wandb", "project": "disk", "mode": "offline"}])
    assert any("could not be written" in s for s in said) and any("written again" in s for s in said), said
    missing = list(range(41, 230))  # 189 frames of 240, by hand
    journal = read_journal(out / "journal.jsonl")
    assert [f.step for f in journal.frames] == [s for s in range(1, 241) if s not in missing]
    [gap] = journal.gaps
    assert (gap["first_step"], gap["last_step"], gap["frames"], gap["phases"]) == (41, 229, 189, {"train": 189})
    assert "File too large" in gap["error"]
    assert journal.end is not None and journal.end["status"] == "finished"
    assert journal.end["missing"] == {"frames": 189, "steps": [[41, 229]]}
    assert open_journal(out / "journal.jsonl").gaps == [gap]
    assert [r.kind for r in JournalTail(out / "journal.jsonl").read()].count("gap") == 1
    [finding] = [f for f in run_checks(journal) if f.check == "journal_gap"]
    assert finding.severity.value == "error" and list(finding.steps) == missing
    assert "189 frames" in finding.explanation

    # TensorBoard: the count at the gap's last step, and the range as text
    [tb_dir] = (out / "tensorboard").iterdir()
    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars(MISSING_STEPS)] == [(229, 189.0)]
    assert [e.step for e in acc.Scalars("train/grad_norm")] == [s for s in range(1, 241) if s not in missing]
    [text] = acc.Tensors(MISSING_STEP_RANGES)
    assert text.step == 229 and text.tensor_proto.string_val == [b"41-229"]
    # MLflow: a metric point and a tag
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    [run] = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, MISSING_STEPS)] == [(229, 189.0)]
    assert run.data.tags[MISSING_STEP_RANGES] == "41-229"
    assert run.info.status == "FINISHED"
    # W&B offline, read back from its transaction log
    from posttrain_metrics.integrations.wandb_reader import read_offline_run

    offline = read_offline_run(next((out / "wandb").rglob("run-diskrun01.wandb")))
    assert offline.column(MISSING_STEPS) == {229: 189}
    assert offline.summary[MISSING_STEP_RANGES] == "41-229"


def test_a_full_disk_within_the_backlog_loses_nothing_and_keeps_the_order(tmp_path):
    out, said = train(tmp_path, [{"type": "journal"}, {"type": "tensorboard"}])
    assert any("written again: 189 held frames" in s for s in said), said
    journal = read_journal(out / "journal.jsonl")
    assert [f.step for f in journal.frames] == list(range(1, 241))
    assert [f.metrics["train/grad_norm"] for f in journal.frames] == [s / 8 for s in range(1, 241)]
    assert journal.gaps == [] and journal.end is not None and "missing" not in journal.end
    assert not [f for f in run_checks(journal) if f.check == "journal_gap"]
    [tb_dir] = (out / "tensorboard").iterdir()
    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/grad_norm")] == list(range(1, 241))
    assert MISSING_STEPS not in acc.Tags()["scalars"]


def test_a_backlog_of_five_lines_holds_five_frames_then_the_rest_is_a_gap_that_export_replays(tmp_path):
    # Frames of one width (3-digit steps, one key, a fixed time): the backlog holds exactly 5 lines.
    path = tmp_path / "journal.jsonl"
    run_child(f"""
        import warnings
        from pathlib import Path
        from posttrain_metrics import Frame
        from posttrain_metrics.publication import Publisher
        from posttrain_metrics.journal import JournalSink

        path = Path({str(path)!r})
        frame = lambda step: Frame(step, {{"train/grad_norm": 0.5}}, "train", 1_700_000_000.5)
        sink = JournalSink(path)
        pub = Publisher([sink], adapters=["trainer"], run_id="gaprun", mode="inline")
        pub.start()
        sink.backlog_bytes = 5 * len(sink._frame_line(frame(100)))
        warnings.simplefilter("ignore")
        for step in range(100, 200):
            if step == 140:
                disk_full(path.stat().st_size)
            if step == 180:
                disk_room()
            pub.publish(frame(step))
        pub.close()
    """, tmp_path)
    journal = read_journal(path)
    assert [f.step for f in journal.frames] == [*range(100, 145), *range(180, 200)]
    assert [(g["first_step"], g["last_step"], g["frames"]) for g in journal.gaps] == [(145, 179, 35)]
    assert journal.end is not None and journal.end["missing"] == {"frames": 35, "steps": [[145, 179]]}
    lines = [json.loads(line)["kind"] for line in path.read_text().splitlines()]
    assert lines.index("gap") == 1 + 45  # after the header and the frames kept, before step 180
    assert export(open_journal(path), "tensorboard", str(tmp_path / "tb"), quiet=True) == 0
    assert export(open_journal(path), "tensorboard", str(tmp_path / "tb"), quiet=True) == 0  # again: nothing new
    acc = EventAccumulator(str(only_run(tmp_path / "tb")), size_guidance={"scalars": 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars(MISSING_STEPS)] == [(179, 35.0)]
    assert [e.step for e in acc.Scalars("train/grad_norm")] == [*range(100, 145), *range(180, 200)]


def test_a_disk_still_full_at_close_names_the_missing_steps_and_the_trackers_mark_the_run_killed(tmp_path):
    import time

    from tensorboard.plugins.hparams import metadata as hparams_metadata

    out = tmp_path / "run"
    proc = run_child(f"""
        import json, logging, warnings
        from pathlib import Path
        from posttrain_metrics.callbacks import MetricsCallback

        said = []  # the end record that could not be written: a log record

        class Keep(logging.Handler):
            def emit(self, record):
                said.append(record.getMessage())

        logging.getLogger("posttrain_metrics").addHandler(Keep())
        out = Path({str(out)!r})
        cb = MetricsCallback(adapters=["trainer"], out_dir=out, run_name="full", run_id="fullrun01",
                             sinks=[{{"type": "journal"}}, {{"type": "tensorboard"}}], close_timeout=600)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with cb:
                for step in range(1, 21):
                    if step == 11:
                        disk_full((out / "journal.jsonl").stat().st_size)  # never lifted
                    cb.on_chunk_end({{"grad_norm": 1.0}})
                    cb.on_window_end(step)
        print(json.dumps([m for m in [str(w.message) for w in caught] + said if "end record" in m]))
    """, tmp_path)
    [said] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "it misses steps 11-20 (10 frames)" in said and "killed" in said, said
    journal = read_journal(out / "journal.jsonl")
    assert [f.step for f in journal.frames] == list(range(1, 11)) and journal.end is None
    status = out / "journal.jsonl.publisher.json"  # the publisher, once the trainer is gone, closes as killed
    deadline = time.monotonic() + 120
    while not (status.exists() and json.loads(status.read_text()).get("state") == "closed"):
        assert time.monotonic() < deadline, "the publisher process never closed the run"
        time.sleep(0.2)
    [tb_dir] = (out / "tensorboard").iterdir()
    session = EventAccumulator(str(tb_dir / "hparams"))
    session.Reload()
    content = session.PluginTagToContent(hparams_metadata.PLUGIN_NAME)
    start = hparams_metadata.parse_session_start_info_plugin_data(content[hparams_metadata.SESSION_START_INFO_TAG])
    assert start.hparams["posttrain_metrics/status"].string_value == "killed"


def _run_on_a_filling_disk(out: Path, full: set[int], monkeypatch, *, start: bool = True,
                           full_at_start: bool = False, mode: str = "inline", sinks=None) -> None:
    """A run of steps 1-10 whose journal cannot be written at the steps of ``full`` (ENOSPC, made in
    process: LineFile.append of the journal fails), nor at its start when ``full_at_start``."""
    import errno
    import warnings

    from posttrain_metrics.callbacks import MetricsCallback
    from posttrain_metrics.journal import lines

    append, state = lines.LineFile.append, {"full": full_at_start}

    def failing(self, data):
        if state["full"] and self.path.name == "journal.jsonl":
            raise OSError(errno.ENOSPC, "No space left on device")
        return append(self, data)

    monkeypatch.setattr(lines.LineFile, "append", failing)
    cb = MetricsCallback(adapters=["trainer"], out_dir=out, run_name="fill", run_id="fill01", publisher=mode,
                         sinks=sinks or [{"type": "journal", "backlog_bytes": 0}], close_timeout=120)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with cb:
            if start:
                cb.on_run_start({"seed": 1})
            for step in range(1, 11):
                state["full"] = step in full or (full_at_start and step == 1)
                cb.on_chunk_end({"grad_norm": step / 8, "learning_rate": 1e-3})
                cb.on_window_end(step)
            state["full"] = False


def test_export_of_a_journal_with_a_gap_counts_frames_not_the_gap_point(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    _run_on_a_filling_disk(out, {4, 5, 6}, monkeypatch)
    assert [(g["first_step"], g["last_step"]) for g in read_journal(out / "journal.jsonl").gaps] == [(4, 6)]
    capsys.readouterr()
    for target in ("tensorboard", "mlflow"):
        where = str(tmp_path / "tb") if target == "tensorboard" else f"sqlite:///{tmp_path / 'x.db'}"
        assert export(open_journal(out / "journal.jsonl"), target, where, quiet=True) == 0
        said = capsys.readouterr().out
        assert "exported 7 of 7 frames" in said and "1 gap" in said, said
        assert export(open_journal(out / "journal.jsonl"), target, where, quiet=True) == 0
        said = capsys.readouterr().out
        assert "nothing to export: all 7 frames" in said, said


@pytest.mark.parametrize("mode", ["inline", "thread", "process"])
def test_a_disk_full_when_the_run_starts_holds_the_header_and_loses_no_frame(tmp_path, monkeypatch, mode):
    out = tmp_path / "run"
    sinks = [{"type": "journal"}, {"type": "tensorboard"}]
    _run_on_a_filling_disk(out, {1, 2, 3}, monkeypatch, full_at_start=True, mode=mode, sinks=sinks)
    journal = read_journal(out / "journal.jsonl")
    assert journal.run_id == "fill01" and [f.step for f in journal.frames] == list(range(1, 11))
    assert journal.gaps == [] and journal.end is not None and journal.end["status"] == "finished"
    acc = EventAccumulator(str(only_run(out / "tensorboard")), size_guidance={"scalars": 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/grad_norm")] == list(range(1, 11))


def test_a_disk_full_from_the_start_past_the_backlog_is_a_gap_from_step_one(tmp_path, monkeypatch):
    out = tmp_path / "run"
    _run_on_a_filling_disk(out, {1, 2, 3}, monkeypatch, full_at_start=True)
    journal = read_journal(out / "journal.jsonl")
    assert [f.step for f in journal.frames] == list(range(4, 11))
    assert [(g["first_step"], g["last_step"], g["frames"]) for g in journal.gaps] == [(1, 3, 3)]
    assert journal.end is not None and journal.end["missing"] == {"frames": 3, "steps": [[1, 3]]}
