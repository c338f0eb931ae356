"""The user's own keys (``extra``): declared in one line, reduced exactly, published everywhere, replayed.

Every expected figure below is worked out by hand in a comment from the chunk values; the trackers are
read back with their own clients (a real ``mlflow server``, TensorBoard's EventAccumulator, W&B's
offline transaction log).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import traceback
from pathlib import Path
from typing import Any

import pytest
from _runs import only_run, run_ranks, tensorboard_run

from posttrain_metrics import MetricReducer, MetricsError, reduce_metrics
from posttrain_metrics.callbacks import MetricsCallback, build_callback
from posttrain_metrics.cli import main
from posttrain_metrics.core.extra import user_adapters
from posttrain_metrics.integrations import MemorySink
from posttrain_metrics.journal import header_adapters, read_journal

pytestmark = pytest.mark.timeout(300)

EXTRA: dict[str, Any] = {
    "my/tokens_per_s": "mean",
    "my/oom_retries": "sum",
    "my/tokens": "sum",
    "my/loss": {"reduction": "weighted_mean", "weight": "my/tokens"},
    "my/peak_mem_gb": "max",
    "my/lr_scale": "last",
    "sys/gpu_util": "min",
}

# Step 1 on two ranks (rank 0: two chunks, rank 1: one); step 2 carries two keys only.
RANK0 = [
    {"my/tokens_per_s": 100.0, "my/oom_retries": 1, "my/tokens": 10, "my/loss": 0.5, "my/peak_mem_gb": 3.0,
     "my/lr_scale": 0.5, "sys/gpu_util": 0.75},
    {"my/tokens_per_s": 200.0, "my/oom_retries": 0, "my/tokens": 30, "my/loss": 1.5, "my/peak_mem_gb": 5.0,
     "my/lr_scale": 1.0},
]
RANK1 = [
    {"my/tokens_per_s": 300.0, "my/oom_retries": 2, "my/tokens": 20, "my/loss": 2.0, "my/peak_mem_gb": 4.0,
     "my/lr_scale": 1.0, "sys/gpu_util": 0.5},
]
STEP1 = {
    "my/tokens_per_s": 200.0,  # (100 + 200 + 300) / 3 contributions
    "my/oom_retries": 3,  # 1 + 0 + 2, an int
    "my/tokens": 60,  # 10 + 30 + 20
    "my/loss": 1.5,  # (0.5*10 + 1.5*30 + 2.0*20) / 60 = (5 + 45 + 40) / 60
    "my/peak_mem_gb": 5.0,  # max(3, 5, 4)
    "my/lr_scale": 1.0,  # the last chunk of each rank: 1.0 and 1.0
    "sys/gpu_util": 0.5,  # min(0.75, 0.5)
}
STEP2_CHUNKS = [{"my/tokens_per_s": 10.0}, {"my/oom_retries": 4}]
STEP2 = {"my/tokens_per_s": 10.0, "my/oom_retries": 4}  # the other keys are absent, not zero


def test_user_keys_reduce_exactly_over_chunks_and_ranks() -> None:
    adapters = user_adapters(EXTRA)
    assert [a.name for a in adapters] == ["extra:my", "extra:sys"]
    got = reduce_metrics(adapters, [RANK0, RANK1])
    assert got == STEP1
    assert type(got["my/oom_retries"]) is int and type(got["my/tokens"]) is int
    # one rank holding every chunk gives the same figures (partition invariance)
    assert reduce_metrics(adapters, [[*RANK0, *RANK1]]) == STEP1


def test_the_callback_publishes_user_keys_declared_in_its_config() -> None:
    sink = MemorySink()
    cb = build_callback({"adapters": ["trainer"], "sinks": [sink], "extra": EXTRA})
    with cb:
        for chunk in [*RANK0, *RANK1]:
            cb.on_chunk_end(chunk)
        cb.on_chunk_end({"grad_norm": 2.0})  # a catalogue key beside them
        cb.on_window_end(1)
        for chunk in STEP2_CHUNKS:
            cb.on_chunk_end(chunk)
        cb.on_window_end(2)
    assert sink.frames[0].metrics == {**STEP1, "train/grad_norm": 2.0}
    assert sink.frames[1].metrics == STEP2
    assert sink.run is not None and sink.run.adapters == ("trainer",)
    assert sink.run.extra["my/loss"] == {"reduction": "weighted_mean", "weight": "my/tokens"}
    assert sink.run.keys["my/loss"].weight_key == "my/tokens"


def test_declare_adds_a_key_before_the_run_starts_only() -> None:
    sink = MemorySink()
    cb = MetricsCallback(adapters=["trainer"], sinks=[sink])
    cb.declare("my/n", "sum")
    cb.declare("my/frac", "weighted_mean", weight="my/n")
    cb.declare("my/n", "sum")  # the same declaration again: a no-op
    with pytest.raises(MetricsError, match=r"already declared as \{'reduction': 'sum'\}"):
        cb.declare("my/n", "max")
    with cb:
        cb.on_chunk_end({"my/n": 1, "my/frac": 1.0})
        cb.on_chunk_end({"my/n": 3, "my/frac": 0.0})
        with pytest.raises(MetricsError, match=r"after the run started.*put 'my/late' in extra"):
            cb.declare("my/late", "mean")
        frame = cb.on_window_end(1)
    assert frame.metrics == {"my/n": 4, "my/frac": 0.25}  # (1*1 + 0*3) / 4


def test_declaration_order_does_not_change_the_layout() -> None:
    reordered = dict(reversed(list(EXTRA.items())))
    a = MetricReducer(list(user_adapters(EXTRA)))
    b = MetricReducer(list(user_adapters(reordered)))
    assert a.layout.fingerprint == b.layout.fingerprint  # ranks that list the same set in another order agree


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"tokens_per_s": "mean"}, r"'tokens_per_s' is not '<namespace>/<leaf>'.*fix: name it like 'my/tokens_per_s'"),
        ({"my/a/b": "mean"}, r"'my/a/b' is not '<namespace>/<leaf>'"),
        ({"my/x": "average"}, r"extra key 'my/x': reduction 'average' is not one of \[.*'mean'.*\]"),
        ({"my/x": 3}, r"extra key 'my/x': got 3 \(int\); fix: a reduction name"),
        ({"my/x": {"reduction": "weighted_mean"}}, r"extra keys of namespace 'my'.*weighted mean needs weight"),
        ({"my/x": {"reduction": "weighted_mean", "weight": "my/n"}}, r"weight='my/n' must be another extra key"),
        ({"my/x": {"reduction": "weighted_mean", "weight": "other/n"}, "other/n": "sum"},
         r"weight='other/n' must be another extra key of the same namespace 'my'"),
        ({"my/x": {"reduction": "weighted_mean", "weight": "my/n"}, "my/n": "mean"},
         r"weight 'n' is a MEAN key; fix: weights and counts must be SUM keys"),
        ({"my/x": {"reduction": "sum", "wieght": "my/n"}}, r"unknown field\(s\) \['wieght'\]"),
        ({"health/x": "sum"}, r"namespace 'health' holds series the publisher derives.*'my/x'"),
        ({"run/x": "sum"}, r"namespace 'run' holds series"),
        ({"train/loss_avg": "mean"}, r"'train/loss_avg' is published by adapter 'grpo' already"),
        ({"optim/update_outcome": "last"}, r"'optim/update_outcome' is published by adapter 'trainer'"),
        (["my/x"], r"extra=\['my/x'\] is of type list"),
    ],
)
def test_bad_declarations_name_the_key_and_the_fix(extra: Any, message: str) -> None:
    with pytest.raises(MetricsError, match=message):
        MetricsCallback(adapters=["trainer"], sinks=[MemorySink()], extra=extra)


def test_a_new_key_in_a_catalogue_namespace_is_accepted() -> None:
    sink = MemorySink()
    with MetricsCallback(adapters=["grpo"], sinks=[sink], extra={"train/my_bonus": "sum"}) as cb:
        cb.on_chunk_end({"train/my_bonus": 2, "grpo_kl_max": 0.5})
        cb.on_chunk_end({"train/my_bonus": 3})
        cb.on_window_end(1)
    assert sink.frames[0].metrics == {"train/my_bonus": 5, "train/kl_max": 0.5}


def test_an_undeclared_key_names_the_one_line_fix() -> None:
    cb = MetricsCallback(adapters=["trainer"], sinks=[MemorySink()], extra={"my/x": "sum"})
    with cb:
        cb.on_chunk_end({"my/y": 1.0})
        with pytest.raises(MetricsError, match=r"'my/y' is not declared.*extra: \{'my/y': mean\} \(or sum, max"):
            cb.on_window_end(1)
        cb.on_chunk_end({"tokens_per_s": 1.0})
        with pytest.raises(MetricsError, match=r"extra: \{'my/tokens_per_s': mean\} \(report it as 'my/tokens_per_s'\)"):
            cb.on_window_end(2)


# -- two real ranks ---------------------------------------------------------------------------------------


def _rank(rank: int, store: str, results: Any) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out: dict[str, Any] = {}
    try:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2,
                                timeout=datetime.timedelta(seconds=30))
        reducer = MetricReducer(list(user_adapters(EXTRA)))
        for chunk in (RANK0, RANK1)[rank]:
            reducer.add(chunk)
        out["step1"] = reducer.reduce(1).metrics
        for chunk in STEP2_CHUNKS[rank:rank + 1]:  # rank 0 one key, rank 1 the other
            reducer.add(chunk)
        out["step2"] = reducer.reduce(2).metrics
        # rank 1 declares one key more: its layout differs, and the first reduce fails on both ranks
        extra = {**EXTRA, "my/extra_on_rank1": "sum"} if rank == 1 else EXTRA
        mismatched = MetricReducer(list(user_adapters(extra)))
        mismatched.add({"my/tokens": 1})
        try:
            mismatched.reduce(3)
            out["mismatch"] = "no error"
        except MetricsError as exc:
            out["mismatch"] = str(exc)
        dist.barrier()
        dist.destroy_process_group()
    except Exception:
        out["crash"] = traceback.format_exc()
    results.put((rank, out))


def test_two_gloo_ranks_reduce_user_keys_exactly_and_refuse_different_declarations(tmp_path: Path) -> None:
    got = run_ranks(_rank, tmp_path / "store")
    for rank in (0, 1):
        assert "crash" not in got[rank], got[rank]["crash"]
        assert got[rank]["step1"] == STEP1
        assert got[rank]["step2"] == STEP2
        assert "declare the same extra keys, on every rank" in got[rank]["mismatch"]


# -- the journal carries the declarations: the publisher process and export rebuild them ------------------


def _tensorboard(log_dir: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


def _mlflow(uri: str, run_id: str) -> dict[str, dict[int, float]]:
    from mlflow.tracking import MlflowClient

    from posttrain_metrics.integrations.mlflow import RUN_ID_TAG

    client = MlflowClient(tracking_uri=uri)
    runs = [r for e in client.search_experiments()
            for r in client.search_runs([e.experiment_id], filter_string=f"tags.`{RUN_ID_TAG}` = '{run_id}'")]
    assert len(runs) == 1, runs
    return {key: {m.step: m.value for m in client.get_metric_history(runs[0].info.run_id, key)}
            for key in runs[0].data.metrics}


WANT = {key: {1: float(value)} for key, value in STEP1.items()}
for _key, _value in STEP2.items():
    WANT[_key][2] = float(_value)


def _user_series(series: dict[str, dict[int, Any]]) -> dict[str, dict[int, float]]:
    return {k: {s: float(v) for s, v in points.items()} for k, points in series.items() if k.startswith(("my/", "sys/"))}


def _run_with_extra(out: Path, sinks: list[dict[str, Any]], run_id: str) -> None:
    cb = MetricsCallback(adapters=["trainer"], out_dir=out, run_id=run_id, run_name="extra", extra=EXTRA,
                         sinks=[{"type": "journal"}, *sinks], publisher="process")
    assert cb.publisher.mode == "process"  # user keys need no import: the publisher process rebuilds them
    with cb:
        cb.on_run_start({"rl": {"kl_beta": 0.04}})
        for chunk in [*RANK0, *RANK1]:
            cb.on_chunk_end(chunk)
        cb.on_window_end(1)
        for chunk in STEP2_CHUNKS:
            cb.on_chunk_end(chunk)
        cb.on_window_end(2)


def test_the_publisher_process_feeds_user_keys_to_every_tracker(tmp_path: Path, mlflow_server: str) -> None:
    out = tmp_path / "run"
    _run_with_extra(out, [
        {"type": "tensorboard"},
        {"type": "mlflow", "tracking_uri": mlflow_server, "experiment_name": "extra"},
        {"type": "wandb", "project": "extra", "mode": "offline", "settings": {"quiet": True}},
    ], "extrarun01")
    journal = read_journal(out / "journal.jsonl")
    assert journal.adapters == ["trainer"]
    assert journal.extra["my/loss"] == {"reduction": "weighted_mean", "weight": "my/tokens"}
    assert set(journal.extra) == set(EXTRA)
    assert [a.name for a in header_adapters(journal.header)] == ["trainer", "extra:my", "extra:sys"]
    assert [dict(f.metrics) for f in journal.frames] == [STEP1, STEP2]
    status = json.loads((out / "journal.jsonl.publisher.json").read_text())
    assert status["status"] == "finished" and not status["failures"], status

    assert _user_series(_tensorboard(tensorboard_run(out))) == WANT  # every value exact in float32 too
    assert _user_series(_mlflow(mlflow_server, "extrarun01")) == WANT
    from posttrain_metrics.integrations.wandb_reader import read_offline_run

    files = sorted((out / "wandb").rglob("run-extrarun01.wandb"))
    assert files, list((out / "wandb").rglob("*"))
    wandb_rows: dict[str, dict[int, Any]] = {}
    for row in read_offline_run(files[-1]).history:
        for key, value in row.items():
            wandb_rows.setdefault(key, {})[row["trainer/step"]] = value
    assert _user_series(wandb_rows) == WANT


def test_export_and_doctor_rebuild_user_keys_from_the_journal(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    _run_with_extra(out, [], "extrarun02")  # the journal only
    journal = out / "journal.jsonl"
    assert main(["export", str(journal), "--to", "tensorboard", str(tmp_path / "tb"), "--quiet"]) == 0
    assert _user_series(_tensorboard(only_run(tmp_path / "tb"))) == WANT
    mlflow_uri = f"sqlite:///{tmp_path / 'export.db'}"
    assert main(["export", str(journal), "--to", "mlflow", mlflow_uri, "--quiet"]) == 0
    assert _user_series(_mlflow(mlflow_uri, "extrarun02")) == WANT
    capsys.readouterr()
    main(["doctor", str(journal)])
    report = capsys.readouterr().out
    assert "user keys my/loss (weighted_mean), my/lr_scale (last)" in report, report


def test_a_journal_with_a_bad_declaration_is_refused_naming_it(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    _run_with_extra(out, [], "extrarun03")
    journal = out / "journal.jsonl"
    text = journal.read_text().replace('"my/peak_mem_gb":{"reduction":"max"}', '"my/peak_mem_gb":{"reduction":"maximum"}')
    journal.write_text(text)
    assert main(["doctor", str(journal)]) != 0
    assert "extra key 'my/peak_mem_gb': reduction 'maximum' is not one of" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["train/clip_frac", "optim/optimizer_step", "train/loss_avg", "run/x", "health/x",
                                  "clip_frac", "a/b/c", "my/y"])
def test_an_undeclared_name_suggests_only_fixes_that_work(name: str) -> None:
    """Every ``extra: {...}`` the message proposes is a declaration the callback accepts; a published
    key (whose declaration check_disjoint refuses) gets its source name instead (issue 24, item 11)."""
    with pytest.raises(MetricsError) as info:
        reduce_metrics("grpo", [[{name: 1.0}]])
    message = str(info.value)
    for proposed in re.findall(r"extra: \{'([^']+)': mean\}", message):
        MetricsCallback(adapters=["grpo"], sinks=[MemorySink()], extra={proposed: "mean"})  # accepted
    published = {"train/clip_frac": ("grpo_clip_frac", ""), "optim/optimizer_step": ("optimizer_step", "trainer"),
                 "train/loss_avg": ("grpo_loss", "")}
    if name in published:
        source, adapter = published[name]
        assert "extra:" not in message and f"fix: report {source!r}" in message
        assert (f"add the adapter {adapter!r}" in message) == bool(adapter)
        with pytest.raises(MetricsError, match="published by adapter"):  # what the old message proposed
            MetricsCallback(adapters=["grpo"], sinks=[MemorySink()], extra={name: "mean"})
    else:
        assert re.findall(r"extra: \{'([^']+)': mean\}", message)
