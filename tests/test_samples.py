"""Sample completions: a bounded, deterministic sample per step (whole groups), kept beside the journal,
published as a W&B Table, an MLflow table and TensorBoard text, read back with each tracker's own client,
replayed by export, and gathered from two real gloo ranks."""

from __future__ import annotations

import datetime
import json
import os
import random
import traceback
from pathlib import Path
from typing import Any

import pytest
from _runs import only_run, run_ranks, tensorboard_run

from posttrain_metrics import MetricsError
from posttrain_metrics.callbacks import MetricsCallback
from posttrain_metrics.callbacks.samples import CUT, check_rows, select
from posttrain_metrics.cli import main
from posttrain_metrics.integrations import MemorySink
from posttrain_metrics.journal.samples import Histogram, read_samples

pytestmark = pytest.mark.timeout(300)


def grpo_rows(groups: int, size: int, *, offset: int = 0) -> list[dict[str, Any]]:
    return [{"group": offset + g, "prompt": f"prompt {offset + g}", "completion": f"answer {offset + g}.{i}",
             "reward": float(i % 2), "advantage": float(i % 2) - 0.5} for g in range(groups) for i in range(size)]


def test_the_sample_is_bounded_keeps_whole_groups_and_does_not_depend_on_row_order() -> None:
    rows = grpo_rows(10, 4)  # 10 groups of 4 rows
    for step in range(1, 30):
        s = select(step, rows, limit=10)
        groups = {r["group"] for r in s.rows}
        assert len(s.rows) == 8 and len(groups) == 2  # 2 whole groups of 4 fit in 10, a third does not
        for g in groups:
            assert [r for r in s.rows if r["group"] == g] == [{**r, CUT: ""} for r in rows if r["group"] == g]
        shuffled = rows[:]
        random.Random(step).shuffle(shuffled)
        assert {r["group"] for r in select(step, shuffled, limit=10).rows} == groups  # rank order does not matter
        assert select(step, rows, limit=10) == s  # deterministic
    chosen = {frozenset(r["group"] for r in select(step, rows, limit=10).rows) for step in range(1, 30)}
    assert len(chosen) > 5  # the step moves the sample around the groups
    assert select(1, rows, limit=3).rows == []  # no whole group fits: nothing, never a partial group
    assert len(select(1, [{"completion": "x"}] * 5, limit=3).rows) == 3  # rows without a group: one each


def test_a_histogram_counts_every_value_once_in_equal_bins() -> None:
    h = Histogram.of([0.0, 0.1, 0.25, 0.5, 1.0, 1.0], bins=4)  # bins [0, .25) [.25, .5) [.5, .75) [.75, 1]
    assert h.edges == [0.0, 0.25, 0.5, 0.75, 1.0] and h.counts == [2, 1, 1, 2] and h.num == 6
    assert h.sum == 2.85 and h.sum_squares == 0.01 + 0.0625 + 0.25 + 2.0
    same = Histogram.of([2.0, 2.0, 2.0])
    assert (same.edges, same.counts) == ([2.0, 2.0], [3])


def test_long_text_is_cut_and_the_row_says_so() -> None:
    s = select(1, [{"prompt": "p" * 12, "completion": "abcdefghij", "reward": 1.0},
                   {"prompt": "short", "completion": "abc", "reward": 0.0}], limit=2, max_chars=5)
    assert s.rows[0] == {"prompt": "ppppp… [7 more chars]", "completion": "abcde… [5 more chars]", "reward": 1.0,
                         CUT: "prompt,completion"}
    assert s.rows[1] == {"prompt": "short", "completion": "abc", "reward": 0.0, CUT: ""}
    assert s.columns == ["prompt", "completion", "reward", CUT]


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ({"prompt": "x"}, r"rows must be a list of dicts .* got dict"),
        (["x"], r"row 0 is a str, not a dict"),
        ([{1: "x"}], r"row 0 has the column 1 \(int\); fix: name columns with strings"),
        ([{"a": 1}, {"reward": [1, 2]}], r"row 1, column 'reward': got a list .*fix: pass text, a number"),
    ],
)
def test_bad_rows_name_the_row_and_the_fix(rows: Any, message: str) -> None:
    with pytest.raises(MetricsError, match=message):
        check_rows(rows)


def test_a_nan_reward_is_an_empty_cell_and_inline_sinks_get_the_sample() -> None:
    class Taker(MemorySink):
        def __init__(self) -> None:
            super().__init__()
            self.samples: list[Any] = []

        def write_samples(self, samples: Any) -> None:
            self.samples.append(samples)

    sink = Taker()
    with MetricsCallback(adapters=["trainer"], sinks=[sink], publisher="inline", samples_per_step=2) as cb:
        got = cb.on_samples(3, [{"group": 0, "completion": "a", "reward": float("nan")}])
    assert got is not None and got.rows == [{"group": 0, "completion": "a", "reward": None, CUT: ""}]
    assert sink.samples == [got]


# -- through the publisher process, into every tracker, and back out of export -----------------------------

STEP_ROWS = {1: grpo_rows(3, 2), 2: grpo_rows(3, 2, offset=10)}
LIMIT = 4  # two whole groups of 2 per step


def expected(step: int) -> list[list[Any]]:
    """The rows the trackers must hold: worked out from the callback's own return value would be circular,
    so the kept groups are read from the samples file and the rows rebuilt here from STEP_ROWS."""
    return [[r["group"], r["prompt"], r["completion"], r["reward"], r["advantage"], ""] for r in STEP_ROWS[step]]


def drive(out: Path, sinks: list[dict[str, Any]], run_id: str) -> None:
    cb = MetricsCallback(adapters=["trainer"], out_dir=out, run_id=run_id, run_name="samples", samples_per_step=LIMIT,
                         sinks=[{"type": "journal"}, *sinks])
    with cb:
        cb.on_run_start({})
        for step in (1, 2):
            cb.on_chunk_end({"grad_norm": 1.0})
            cb.on_window_end(step)
            cb.on_samples(step, STEP_ROWS[step])


COLUMNS = ["group", "prompt", "completion", "reward", "advantage", CUT]


def kept_rows(out: Path) -> dict[int, list[list[Any]]]:
    """Per step, the rows of STEP_ROWS whose group the samples file says was kept (2 whole groups)."""
    kept = {}
    for s in read_samples(out / "journal.samples.jsonl"):
        groups = {row["group"] for row in s.rows}
        assert len(groups) == 2 and s.offered == 6
        kept[s.step] = [row for row in expected(s.step) if row[0] in groups]
    assert sorted(kept) == [1, 2]
    return kept


def test_samples_reach_every_tracker_through_the_publisher_process(tmp_path: Path, mlflow_server: str) -> None:
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from posttrain_metrics.integrations.wandb_reader import read_offline_run

    out = tmp_path / "run"
    drive(out, [{"type": "tensorboard"}, {"type": "mlflow", "tracking_uri": mlflow_server, "experiment_name": "samples"},
                {"type": "wandb", "project": "samples", "mode": "offline", "settings": {"quiet": True}}], "samplesrun01")
    want = kept_rows(out)
    status = json.loads((out / "journal.jsonl.publisher.json").read_text())
    assert status["status"] == "finished" and not status["failures"], status

    client = MlflowClient(tracking_uri=mlflow_server)
    run_id = status["sinks"]["mlflow"]["handles"]["run_id"]
    files = sorted(a.path for a in client.list_artifacts(run_id, "posttrain_metrics/samples"))
    assert files == ["posttrain_metrics/samples/step_00000001.json", "posttrain_metrics/samples/step_00000002.json"]
    for step, path in ((1, files[0]), (2, files[1])):
        table = json.loads(Path(client.download_artifacts(run_id, path, str(tmp_path / f"dl{step}"))).read_text())
        assert table["columns"] == COLUMNS and table["data"] == want[step]

    events = EventAccumulator(str(tensorboard_run(out)), size_guidance={"tensors": 0, "histograms": 0})
    events.Reload()
    texts = {e.step: e.tensor_proto.string_val[0].decode() for e in events.Tensors("samples/completions")}
    assert sorted(texts) == [1, 2]
    for step, rows in want.items():
        assert texts[step].startswith(f"step {step}: 4 of 6 rows")
        for row in rows:
            assert f"| {row[0]} | {row[1]} | {row[2]} | {row[3]} | {row[4]} |  |" in texts[step]

    # histograms over every row offered: rewards 0,1,0,1,0,1 and advantages -0.5,0.5,... per step
    for tag, total, squares in (("samples/reward", 3.0, 3.0), ("samples/advantage", 0.0, 1.5)):
        histos = {e.step: e.histogram_value for e in events.Histograms(tag)}
        assert sorted(histos) == [1, 2]
        h = histos[1]
        assert (h.num, h.sum, h.sum_squares) == (6, total, squares)
        assert (h.min, h.max) == ((0.0, 1.0) if tag.endswith("reward") else (-0.5, 0.5))
        assert list(h.bucket) == [3] + [0] * 18 + [3]  # 20 equal bins: the low ones in the first, the high in the last
        assert h.bucket_limit[-1] == h.max

    run_dir = Path(status["sinks"]["wandb"]["handles"]["dir"]).parent
    offline = read_offline_run(run_dir / "run-samplesrun01.wandb")
    prefix = "samples/completions/"  # the offline reader flattens the table reference W&B logs
    tables = {row["trainer/step"]: {k[len(prefix):]: v for k, v in row.items() if k.startswith(prefix)}
              for row in offline.history if f"{prefix}path" in row}
    assert sorted(tables) == [1, 2]
    for step, ref in tables.items():
        assert ref["_type"] == "table-file" and ref["nrows"] == 4 and ref["ncols"] == 6
        table = json.loads((run_dir / "files" / ref["path"]).read_text())
        assert table["columns"] == COLUMNS and table["data"] == want[step]
    histos = {row["trainer/step"]: row for row in offline.history if "samples/reward/_type" in row}
    assert sorted(histos) == [1, 2]
    assert histos[1]["samples/reward/_type"] == "histogram"
    assert histos[1]["samples/reward/values"] == [3] + [0] * 18 + [3]


def test_export_replays_the_samples_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    drive(out, [], "samplesrun02")  # the journal and its samples file only
    want = kept_rows(out)
    path = out / "journal.samples.jsonl"
    foreign = json.loads(path.read_text().splitlines()[0])
    assert foreign["run_id"] == "samplesrun02"
    foreign.update(run_id="anotherrun", step=3, rows=[[0, "p", "FOREIGN", 1.0, 0.0, ""]])
    with open(path, "a") as f:  # a line another run left at this path: not this run's
        f.write(json.dumps(foreign) + "\n")
    assert main(["export", str(out / "journal.jsonl"), "--to", "tensorboard", str(tmp_path / "tb"), "--quiet"]) == 0
    assert "2 steps of sample completions" in capsys.readouterr().out
    events = EventAccumulator(str(only_run(tmp_path / "tb")), size_guidance={"tensors": 0})
    events.Reload()
    texts = {e.step: e.tensor_proto.string_val[0].decode() for e in events.Tensors("samples/completions")}
    assert sorted(texts) == [1, 2] and all(f"| {row[2]} |" in texts[2] for row in want[2])
    assert not any("FOREIGN" in text for text in texts.values())


# -- two real ranks ---------------------------------------------------------------------------------------


def _rank(rank: int, store: str, results: Any) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out: dict[str, Any] = {}
    try:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2,
                                timeout=datetime.timedelta(seconds=30))
        cb = MetricsCallback(adapters=["trainer"], sinks=[MemorySink()], publisher="inline", samples_per_step=8)
        mine = grpo_rows(2, 2, offset=10 * rank)  # rank 0: groups 0, 1; rank 1: groups 10, 11
        got = cb.on_samples(5, mine)
        out["all"] = None if got is None else (got.offered, [r["group"] for r in got.rows])
        cb.samples_per_step = 4
        got = cb.on_samples(6, [] if rank == 0 else mine)  # a rank with nothing still joins
        out["bounded"] = None if got is None else (got.offered, [r["group"] for r in got.rows])
        cb.on_run_end()
        dist.barrier()
        dist.destroy_process_group()
    except Exception:
        out["crash"] = traceback.format_exc()
    results.put((rank, out))


def test_two_gloo_ranks_send_their_rows_to_rank_0(tmp_path: Path) -> None:
    got = run_ranks(_rank, tmp_path / "store")
    assert "crash" not in got[0] and "crash" not in got[1], got
    assert got[0]["all"] == (8, [0, 0, 1, 1, 10, 10, 11, 11])  # every row of both ranks fits in 8, rank order
    assert got[1]["all"] is None and got[1]["bounded"] is None  # only rank 0 publishes
    offered, groups = got[0]["bounded"]
    assert offered == 4 and len(groups) == 4 and set(groups) == {10, 11}  # rank 1's two groups of 2, whole


def test_a_samples_file_that_cannot_be_written_is_logged_once_and_training_goes_on(tmp_path: Path) -> None:
    # A real fault: the child's file-size limit stops the samples file (large lines) at step 5 and is
    # lifted at step 8; the journal (small lines) stays below it. on_samples never raises.
    from _faults import run_child

    out = tmp_path / "run"
    proc = run_child(f"""
        import json, logging
        from pathlib import Path
        from posttrain_metrics.callbacks import MetricsCallback

        class Records(logging.Handler):
            def __init__(self):
                super().__init__()
                self.messages = []
            def emit(self, record):
                self.messages.append(record.getMessage())
        records = Records()
        logging.getLogger("posttrain_metrics").addHandler(records)  # a disk fault is logged, not warned

        out = Path({str(out)!r})
        cb = MetricsCallback(adapters=["trainer"], out_dir=out, sinks=[{{"type": "journal"}}], publisher="inline")
        rows = [{{"group": g, "prompt": "p" * 900, "completion": "c" * 1900, "reward": 1.0}} for g in range(16)]
        with cb:
            for step in range(1, 11):
                if step == 5:
                    disk_full((out / "journal.samples.jsonl").stat().st_size + 100)  # part of a line fits
                if step == 8:
                    disk_room()
                cb.on_chunk_end({{"grad_norm": 1.0}})
                cb.on_window_end(step)
                cb.on_samples(step, rows)
        said = [m for m in records.messages if "samples file" in m]
        print(json.dumps([said, cb.samples_lost, cb.publisher.failures]))
    """, tmp_path)
    said, lost, failures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(said) == 1 and "File too large" in said[0] and "training continues" in said[0], said
    assert lost == [5, 6, 7] and failures == {"samples": 3}
    kept = read_samples(out / "journal.samples.jsonl")  # every line whole: no torn line mid-file
    assert [s.step for s in kept] == [1, 2, 3, 4, 8, 9, 10]
    assert all(len(s.rows) == 16 for s in kept)
    assert [json.loads(line)["step"] for line in (out / "journal.jsonl").read_text().splitlines()
            if '"kind":"frame"' in line] == list(range(1, 11))
