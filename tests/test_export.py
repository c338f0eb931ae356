"""export: a journal replayed into each backend equals live publication, and twice adds nothing.

The live run publishes to TensorBoard, an embedded MLflow store and an offline W&B run; its journal
is then exported into a fresh TensorBoard dir, a real MLflow server and a fresh W&B dir, and both
are read back with each vendor's own client.
"""

from __future__ import annotations

import atexit
import json
import math
from pathlib import Path
from typing import Any

import pytest
from _runs import GRPO_ADAPTERS, grpo_run, nonfinite_frame, only_run, tensorboard_run

from posttrain_metrics import Frame
from posttrain_metrics.cli import main
from posttrain_metrics.integrations.mlflow import RUN_ID_TAG, MlflowSink
from posttrain_metrics.integrations.tensorboard import TensorBoardSink
from posttrain_metrics.integrations.wandb import WandbSink
from posttrain_metrics.integrations.wandb_reader import read_offline_run
from posttrain_metrics.journal import JournalSink, read_journal
from posttrain_metrics.publication import Publisher

RUN_ID = "exportrun0001"


def frames() -> list[Frame]:
    """A multi-step GRPO run with an outcome label, a step missing a key, and NaN/inf values."""
    out = grpo_run(steps=6)
    absent = dict(out[4].metrics)
    del absent["train/kl_max"]
    out[4] = Frame(5, absent, "train", out[4].wall_time)
    return [*out, nonfinite_frame(7)]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("live")
    sinks = [JournalSink(root / "journal.jsonl"), TensorBoardSink(log_dir=root / "tensorboard" / "{name}-{run_id}"),
             MlflowSink(dir=root, experiment_name="export-test"),
             WandbSink(project="export-test", entity="export-team", dir=root, settings={"quiet": True})]
    pub = Publisher(sinks, adapters=GRPO_ADAPTERS, run_name="export-test", run_id=RUN_ID)
    pub.start({"rl": {"kl_beta": 0.04}})
    for frame in frames():
        pub.publish(frame)
    pub.close()
    import wandb

    wandb.teardown()  # the offline log is complete on disk before we read it
    return root


def same(a: float, b: float, rel: float = 1e-12) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b or math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)


def assert_series_equal(got: dict[str, list[tuple[int, float]]], want: dict[str, list[tuple[int, float]]],
                        rel: float = 1e-12) -> None:
    assert got.keys() == want.keys()
    for key in want:
        assert [s for s, _ in got[key]] == [s for s, _ in want[key]], key
        assert all(same(g, w, rel) for (_, g), (_, w) in zip(got[key], want[key])), key


def tensorboard_series(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    # sorted by step: TensorBoard reads event files in name order, and a writer's counter can sort
    # "...10" before "...9" within one second
    return {tag: sorted((e.step, e.value) for e in events.Scalars(tag)) for tag in events.Tags()["scalars"]}


def mlflow_series(uri: str) -> tuple[dict[str, list[tuple[int, float]]], dict[str, str], str]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    runs = [r for e in client.search_experiments()
            for r in client.search_runs([e.experiment_id], filter_string=f"tags.`{RUN_ID_TAG}` = '{RUN_ID}'")]
    assert len(runs) == 1, f"expected one run tagged {RUN_ID} in {uri}, found {len(runs)}"
    run = runs[0]
    series = {key: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
              for key in run.data.metrics}
    return series, dict(run.data.tags), run.info.status


def wandb_series(directory: Path) -> tuple[dict[str, list[tuple[int, Any]]], dict[str, Any]]:
    run = read_offline_run(directory)
    series: dict[str, list[tuple[int, Any]]] = {}
    for row in run.history:
        for key, value in row.items():
            if not key.startswith(("_", "trainer/")):
                series.setdefault(key, []).append((row["trainer/step"], value))
    summary = {k: v for k, v in run.summary.items() if k.startswith("run/")}
    return series, summary


def export(journal: Path, *to: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["export", str(journal), "--to", *to, "--quiet"]) == 0
    return capsys.readouterr().out


def test_export_to_tensorboard_equals_live_and_is_idempotent(live: Path, tmp_path: Path, capsys) -> None:
    target = tmp_path / "tb"
    assert "exported 7 of 7 frames" in export(live / "journal.jsonl", "tensorboard", str(target), capsys=capsys)
    want = tensorboard_series(tensorboard_run(live))
    assert_series_equal(tensorboard_series(only_run(target)), want)
    assert "train/kl_max" in want and 5 not in [s for s, _ in want["train/kl_max"]]  # absent stays absent
    assert math.isnan(dict(want["train/loss_avg"])[7])
    assert "nothing to export" in export(live / "journal.jsonl", "tensorboard", str(target), capsys=capsys)
    assert_series_equal(tensorboard_series(only_run(target)), want)


def test_export_is_resumable_after_a_partial_export(live: Path, tmp_path: Path, capsys) -> None:
    lines = (live / "journal.jsonl").read_text().splitlines()
    partial = tmp_path / "partial" / "journal.jsonl"
    partial.parent.mkdir()
    partial.write_text("\n".join(lines[:4]) + "\n")  # header + 3 frames: an export cut short
    target = tmp_path / "tb"
    assert "exported 3 of 3" in export(partial, "tensorboard", str(target), capsys=capsys)
    assert "exported 4 of 7 frames" in export(live / "journal.jsonl", "tensorboard", str(target), capsys=capsys)
    assert_series_equal(tensorboard_series(only_run(target)), tensorboard_series(tensorboard_run(live)))


def test_export_to_a_real_mlflow_server_equals_live_and_is_idempotent(live: Path, mlflow_server: str, capsys) -> None:
    assert "exported 7 of 7 frames" in export(live / "journal.jsonl", "mlflow", mlflow_server, capsys=capsys)
    got, got_tags, status = mlflow_series(mlflow_server)
    want, want_tags, _ = mlflow_series(f"sqlite:///{live}/mlflow.db")
    assert_series_equal(got, want)
    assert status == "FINISHED"
    assert got_tags["optim/update_outcome"] == want_tags["optim/update_outcome"] == "applied"
    assert [s for s, _ in got["optim/update_outcome/skipped"] if _] == [3]  # the skipped step charts
    assert "nothing to export" in export(live / "journal.jsonl", "mlflow", mlflow_server, capsys=capsys)
    assert_series_equal(mlflow_series(mlflow_server)[0], want)  # no duplicate points


def test_export_to_wandb_equals_live_and_is_idempotent(live: Path, tmp_path: Path, capsys) -> None:
    import wandb

    target = tmp_path / "wb"
    assert "exported 7 of 7 frames" in export(live / "journal.jsonl", "wandb", str(target), capsys=capsys)
    wandb.teardown()
    got, got_summary = wandb_series(target)
    want, want_summary = wandb_series(live)
    assert got.keys() == want.keys()
    for key in want:
        assert len(got[key]) == len(want[key]), key
        for (gs, gv), (ws, wv) in zip(got[key], want[key]):
            assert gs == ws and (gv == wv or same(float(gv), float(wv))), key
    assert got_summary == want_summary
    # the live run's project and entity, recorded in the journal header: `wandb sync` of the live
    # offline run and this export go to the same place
    run = read_offline_run(target).run
    assert (run.project, run.entity) == ("export-test", "export-team")
    assert "nothing to export" in export(live / "journal.jsonl", "wandb", str(target), capsys=capsys)


def test_export_to_mlflow_and_wandb_is_as_quiet_as_a_live_run(live: Path, tmp_path: Path) -> None:
    """A user's terminal (real descriptors, hence a subprocess; the journal: 6 GRPO frames and a
    non-finite one): MLflow's schema INFO lines and
    W&B's ``wandb:`` banners go to ``export.log`` beside the journal; the terminal keeps our lines."""
    import os
    import shutil
    import subprocess
    import sys

    journal = tmp_path / "journal.jsonl"
    shutil.copy(live / "journal.jsonl", journal)
    log = tmp_path / "export.log"
    for to, target, where in (("mlflow", f"sqlite:///{tmp_path / 'x.db'}", f"sqlite:///{tmp_path / 'x.db'}"),
                              ("wandb", str(tmp_path / "wb"), str(tmp_path / "wb" / "wandb"))):
        env = {k: v for k, v in os.environ.items() if k != "WANDB_SILENT"}  # W&B's banners, as a user has them
        result = subprocess.run([sys.executable, "-m", "posttrain_metrics.cli", "export", str(journal), "--to", to,
                                 target], capture_output=True, text=True, timeout=240, env=env)
        assert result.returncode == 0, result.stderr[-3000:]
        # our own warning stays on the terminal: the +inf of step 7 that this tracker cannot hold
        assert "wandb:" not in result.stderr and "INFO" not in result.stderr
        if to == "mlflow":
            assert "train/kl_max" in result.stderr and "cannot be stored faithfully" in result.stderr
        assert result.stdout == (f"tracker logs (W&B, MLflow output): {log}\n"
                                 f"exported 7 of 7 frames of run {RUN_ID} to {where} (0 were already there; "
                                 "run finished)\n")
    text = log.read_text()
    assert "INFO mlflow.store.db.utils" in text and "wandb: " in text


def test_export_to_wandb_takes_project_and_entity(live: Path, tmp_path: Path, capsys) -> None:
    import wandb

    target = tmp_path / "elsewhere"
    main(["export", str(live / "journal.jsonl"), "--to", "wandb", str(target), "--quiet",
          "--project", "other-project", "--entity", "other-team"])
    wandb.teardown()
    run = read_offline_run(target).run
    assert (run.project, run.entity) == ("other-project", "other-team")
    capsys.readouterr()
    # W&B's options with another target: one clear error, nothing written
    assert main(["export", str(live / "journal.jsonl"), "--to", "tensorboard", str(tmp_path / "tb"),
                 "--project", "p"]) != 0
    assert "--project and --entity are W&B's" in capsys.readouterr().err and not (tmp_path / "tb").exists()


def test_export_finds_what_the_live_sinks_already_wrote(live: Path, capsys) -> None:
    for kind in ("tensorboard", "mlflow", "wandb"):
        assert "nothing to export: all 7 frames" in export(live / "journal.jsonl", kind, capsys=capsys), kind


@pytest.mark.parametrize("kind", ["tensorboard", "mlflow", "wandb", "doctor", "plot"])
def test_every_subcommand_fails_clearly_on_bad_journals(tmp_path: Path, capsys, kind: str) -> None:
    def run(path: Path) -> int:
        if kind == "doctor":
            return main(["doctor", str(path)])
        if kind == "plot":
            return main(["plot", str(path), "-o", str(tmp_path / "x.png")])
        return main(["export", str(path), "--to", kind, str(tmp_path / "target"), "--quiet"])

    assert run(tmp_path / "missing.jsonl") == 2
    assert "does not exist" in capsys.readouterr().err
    journal = tmp_path / "j.jsonl"
    pub = Publisher([JournalSink(journal)], adapters=GRPO_ADAPTERS, run_id="x")
    pub.start({})
    pub.close()
    text = journal.read_text()
    journal.write_text(text.replace('"version":1', '"version":7'))
    assert run(journal) == 2
    assert "version 7" in capsys.readouterr().err
    journal.write_text(text.replace('"adapters":["grpo"', '"adapters":["grpo_v9"'))
    assert run(journal) == 2
    assert "unknown adapter 'grpo_v9'" in capsys.readouterr().err


def test_a_torn_journal_exports_its_complete_lines(live: Path, tmp_path: Path, capsys) -> None:
    text = (live / "journal.jsonl").read_text().splitlines()
    torn = tmp_path / "torn.jsonl"
    torn.write_text("\n".join(text[:5]) + "\n" + text[5][:40])  # killed mid-write
    out = export(torn, "tensorboard", str(tmp_path / "tb"), capsys=capsys)
    assert "exported 4 of 4 frames" in out
    assert read_journal(torn).warnings


def test_a_long_journal_exports_every_frame_and_label_only_frames_once(tmp_path: Path, capsys) -> None:
    journal = tmp_path / "run" / "journal.jsonl"
    pub = Publisher([JournalSink(journal)], adapters=GRPO_ADAPTERS, run_id="long", mode="inline")
    pub.start({})
    base = dict(grpo_run(steps=1)[0].metrics)
    for step in range(1, 3001):  # far more frames than a background queue holds
        pub.publish(Frame(step, {**base, "train/loss_avg": step / 1000}))
    pub.publish(Frame(3001, {"optim/update_outcome": "skipped"}))  # a frame holding only a label
    pub.close()
    target = tmp_path / "tb"
    assert "exported 3001 of 3001 frames" in export(journal, "tensorboard", str(target), capsys=capsys)
    series = tensorboard_series(only_run(target))
    assert [s for s, _ in series["train/loss_avg"]] == list(range(1, 3001))
    assert "nothing to export" in export(journal, "tensorboard", str(target), capsys=capsys)
    skipped = tensorboard_series(only_run(target))["optim/update_outcome/skipped"]
    assert [s for s, _ in skipped] == list(range(1, 3002))  # one point per step: none sent twice
    assert skipped[-1] == (3001, 1.0)


def test_an_export_into_mlflow_larger_than_the_sinks_live_backlog_loses_nothing(tmp_path: Path, capsys) -> None:
    """The benchmark found it: a replay outran MLflow and the live-run backlog (1000) dropped frames."""
    from mlflow.tracking import MlflowClient

    journal = tmp_path / "run" / "journal.jsonl"
    pub = Publisher([JournalSink(journal)], adapters=GRPO_ADAPTERS, run_id="bulk", mode="inline")
    pub.start({})
    for step in range(1, 1301):
        pub.publish(Frame(step, {"train/loss_avg": step / 1000, "train/kl_max": 0.5}))
    pub.close()
    uri = f"sqlite:///{tmp_path / 'bulk.db'}"
    assert "exported 1300 of 1300 frames" in export(journal, "mlflow", uri, capsys=capsys)
    client = MlflowClient(tracking_uri=uri)
    (run,) = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert len(client.get_metric_history(run.info.run_id, "train/loss_avg")) == 1300


def test_a_run_that_never_closed_exports_as_killed_everywhere(tmp_path: Path, capsys) -> None:
    """A journal with no end record (the trainer was killed) is exported with status KILLED, as the
    doctor reports it, and a closed one keeps its status: MLflow's run status, TensorBoard's hparams
    session (failure, and the status hparam) and W&B's exit code and summary."""
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing import event_accumulator as ea
    from tensorboard.plugins.hparams import api_pb2
    from tensorboard.plugins.hparams import metadata as hparams_metadata

    from posttrain_metrics.integrations.tensorboard import STATUS_HPARAM
    from posttrain_metrics.integrations.wandb import STATUS_KEY

    def journal_of(folder: Path, run_id: str, close: str | None) -> Path:
        sink = JournalSink(folder / "journal.jsonl")
        pub = Publisher([sink], adapters=GRPO_ADAPTERS, run_id=run_id, mode="inline")
        pub.start({"rl": {"kl_beta": 0.04}})
        for frame in grpo_run(steps=3):
            pub.publish(frame)
        if close is not None:
            pub.close(failed=close == "failed")
        else:  # the process died: no end record
            atexit.unregister(pub._at_exit)
            sink._file.close()  # type: ignore[union-attr]
        return folder / "journal.jsonl"

    for close, mlflow_status, tb_status, exit_code in ((None, "KILLED", "killed", 137),
                                                       ("finished", "FINISHED", "finished", 0),
                                                       ("failed", "FAILED", "failed", 1)):
        folder = tmp_path / str(close)
        folder.mkdir()
        run_id = f"never-closed-{close}"
        journal = journal_of(folder, run_id, close)
        assert (read_journal(journal).end is None) == (close is None)
        main(["doctor", str(journal), "--json"])
        said = json.loads(capsys.readouterr().out)["run"]["status"]
        assert said == (close or "no end record")  # what the doctor says the trackers must say too
        for kind in ("mlflow", "tensorboard", "wandb"):
            export(journal, kind, capsys=capsys)
        client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
        runs = [r for e in client.search_experiments()
                for r in client.search_runs([e.experiment_id], filter_string=f"tags.`{RUN_ID_TAG}` = '{run_id}'")]
        assert [r.info.status for r in runs] == [mlflow_status]
        acc = ea.EventAccumulator(str(tensorboard_run(folder) / "hparams"))
        acc.Reload()
        content = acc.PluginTagToContent(hparams_metadata.PLUGIN_NAME)
        start = hparams_metadata.parse_session_start_info_plugin_data(content[hparams_metadata.SESSION_START_INFO_TAG])
        end = hparams_metadata.parse_session_end_info_plugin_data(content[hparams_metadata.SESSION_END_INFO_TAG])
        assert start.hparams[STATUS_HPARAM].string_value == tb_status
        assert end.status == (api_pb2.STATUS_SUCCESS if close == "finished" else api_pb2.STATUS_FAILURE)
        import wandb

        wandb.teardown()
        run = read_offline_run(folder / "wandb")
        assert run.exit_code == exit_code and run.summary[STATUS_KEY] == tb_status


def test_publish_by_hand_finishes_what_a_stopped_publisher_left(tmp_path: Path, monkeypatch, capsys) -> None:
    """The publisher process never ran (or was stopped): the journal and the sinks file are there,
    and `posttrain-metrics publish <journal>`, the command close() names, publishes every frame and
    closes the run with the journal's status; a second run sends nothing."""
    from posttrain_metrics.publication import process

    monkeypatch.setattr(process.PublisherProcess, "_spawn", lambda self: None)  # a publisher that never ran
    journal = tmp_path / "journal.jsonl"
    pub = Publisher([JournalSink(journal), TensorBoardSink(log_dir=tmp_path / "tensorboard"),
                     MlflowSink(dir=tmp_path, experiment_name="by-hand")],
                    adapters=GRPO_ADAPTERS, run_id="byhand01", run_name="by-hand")
    assert [s.name for s in pub.in_child] == ["tensorboard", "mlflow"]
    pub.start({"rl": {"kl_beta": 0.04}})
    run = frames()
    for frame in run:
        pub.publish(frame)
    pub.close()
    assert pub.process.command() == f"posttrain-metrics publish {journal}"
    assert not (tmp_path / "tensorboard").exists()  # nothing published yet
    assert main(["publish", str(journal)]) == 0
    said = capsys.readouterr().out
    assert "run finished" in said and "tensorboard 7 sent" in said and "mlflow 7 sent" in said, said
    assert tensorboard_series(tmp_path / "tensorboard")["train/loss_avg"][-1][0] == 7
    series, _tags, status = mlflow_series_of(f"sqlite:///{tmp_path / 'mlflow.db'}", "byhand01")
    assert status == "FINISHED" and [s for s, _ in series["train/loss_avg"]] == list(range(1, 8))
    assert main(["publish", str(journal)]) == 0
    again = capsys.readouterr().out
    assert "tensorboard 0 sent, 7 already there" in again and "mlflow 0 sent, 7 already there" in again, again
    assert len(tensorboard_series(tmp_path / "tensorboard")["train/loss_avg"]) == 7


def mlflow_series_of(uri: str, run_id: str) -> tuple[dict[str, list[tuple[int, float]]], dict[str, str], str]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    runs = [r for e in client.search_experiments()
            for r in client.search_runs([e.experiment_id], filter_string=f"tags.`{RUN_ID_TAG}` = '{run_id}'")]
    assert len(runs) == 1, runs
    run = runs[0]
    series = {key: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
              for key in run.data.metrics}
    return series, dict(run.data.tags), run.info.status


def long_journal(path: Path, steps: int) -> Path:
    pub = Publisher([JournalSink(path)], adapters=GRPO_ADAPTERS, run_id=f"long{steps}", mode="inline")
    pub.start({})
    base = dict(grpo_run(steps=1)[0].metrics)
    for step in range(1, steps + 1):
        pub.publish(Frame(step, {**base, "train/loss_avg": step / 1000}))
    pub.close()
    return path


def test_export_reads_the_journal_a_batch_at_a_time_whatever_its_length(tmp_path: Path, capsys) -> None:
    """`export` reads the journal pass by pass (open_journal): 9,000 more steps must not cost the ~4.5 KB
    a step that holding the frames costs (40 MB here); a few batches of 512 frames in flight are all."""
    import tracemalloc

    export(long_journal(tmp_path / "warm" / "journal.jsonl", 50), "tensorboard", str(tmp_path / "warm-tb"),
           capsys=capsys)  # imports and first-use caches, outside the measure
    peaks = {}
    for steps in (3_000, 12_000):
        journal = long_journal(tmp_path / f"run{steps}" / "journal.jsonl", steps)
        tracemalloc.start()
        try:
            out = export(journal, "tensorboard", str(tmp_path / f"tb{steps}"), capsys=capsys)
            peaks[steps] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert f"exported {steps} of {steps} frames" in out
        assert [s for s, _ in tensorboard_series(only_run(tmp_path / f"tb{steps}"))["train/loss_avg"]] == list(range(1, steps + 1))
    assert peaks[12_000] - peaks[3_000] <= 2_000_000, peaks


@pytest.mark.parametrize("block", [7, 16, 64, 1 << 20])
def test_the_last_header_is_found_from_the_end_across_block_boundaries(tmp_path: Path, block: int) -> None:
    """A resumed run appends its own header: the publisher starts the trackers with the last one. It is
    searched from the end a block at a time (small blocks here, so the marker straddles boundaries)."""
    from posttrain_metrics.journal import FORMAT, last_header

    first = {"format": FORMAT, "version": 1, "kind": "header", "run_id": "r", "config": {"lr": 1}}
    second = {"format": FORMAT, "version": 1, "kind": "header", "run_id": "r", "config": {"lr": 2}}
    frame = '{"kind":"frame","step":%d,"metrics":{"train/loss_avg":0.5}}\n'
    path = tmp_path / "journal.jsonl"
    path.write_text(json.dumps(first, separators=(",", ":")) + "\n" + "".join(frame % i for i in range(1, 6)))
    assert last_header(path, block) == first
    with path.open("a") as f:
        f.write(json.dumps(second, separators=(",", ":")) + "\n" + frame % 6)
    assert last_header(path, block) == second
    path.write_text("".join(frame % i for i in range(1, 4)))
    assert last_header(path, block) is None
    path.write_text("")
    assert last_header(path, block) is None
    assert last_header(tmp_path / "missing.jsonl", block) is None


def test_another_journal_copied_over_the_path_mid_export_is_refused(tmp_path: Path) -> None:
    """`cp other.jsonl journal.jsonl` rewrites the file in place (same inode, not shorter): the replay
    must not export the other run's frames under this run's id; its header is not the one checked."""
    import shutil

    from posttrain_metrics.core.errors import MetricsError
    from posttrain_metrics.export import export as export_journal
    from posttrain_metrics.journal import open_journal

    journal = long_journal(tmp_path / "run" / "journal.jsonl", 5)
    other = long_journal(tmp_path / "other" / "journal.jsonl", 10)
    opened = open_journal(journal)
    shutil.copyfile(other, journal)
    with pytest.raises(MetricsError, match="rewritten since it was opened"):
        export_journal(opened, "tensorboard", str(tmp_path / "tb"), quiet=True)
    assert not (tmp_path / "tb").exists() or not any(tensorboard_series(p) for p in (tmp_path / "tb").iterdir())


def test_export_into_a_folder_holding_another_run_keeps_each_run_apart(tmp_path: Path, capsys) -> None:
    """Two runs (same name, different ids) exported into one folder: each into its own <name>-<run id>
    folder with its own values, and 'already there' is decided per run (the second is exported whole)."""
    target = tmp_path / "tb"
    for run_id, reward in (("run-a", 0.25), ("run-b", 0.75)):
        journal = tmp_path / run_id / "journal.jsonl"
        pub = Publisher([JournalSink(journal)], adapters=["validation"], run_id=run_id, run_name="same",
                        mode="inline")
        pub.start({})
        for step in (1, 2):
            pub.publish(Frame(step, {"val/reward_avg": reward * step}, "val"))
        pub.close()
        assert f"exported 2 of 2 frames of run {run_id}" in export(journal, "tensorboard", str(target), capsys=capsys)
    assert sorted(p.name for p in target.iterdir()) == ["same-run-a", "same-run-b"]
    assert tensorboard_series(target / "same-run-a")["val/reward_avg"] == [(1, 0.25), (2, 0.5)]
    assert tensorboard_series(target / "same-run-b")["val/reward_avg"] == [(1, 0.75), (2, 1.5)]
    assert "nothing to export" in export(tmp_path / "run-b" / "journal.jsonl", "tensorboard", str(target),
                                         capsys=capsys)
