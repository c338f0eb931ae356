"""Every row of docs/bad-input.md, tried: what a producer or a user can hand us, and what happens.

Each error row checks three things: a ``MetricsError`` that names the key, what was received and the
fix; the bad window is discarded while the frames published before it stay in the journal and the
sinks; and the next good window reduces exactly as if nothing had happened. Substitution rows check
the substituted value and where it is counted. The sink rows (steps that go backwards or repeat,
names a backend rejects, an empty window) publish one run to the journal, TensorBoard, an embedded
MLflow store and an offline W&B run, and read each back with the vendor's own reader. The last row
runs two gloo processes where rank 1 skips ``reduce``.
"""

from __future__ import annotations

import datetime
import io
import json
import math
import os
import queue as queue_module
import random
import sys
import time
import traceback
import types
import uuid
import warnings
from collections.abc import Callable, Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from _runs import GRPO_ADAPTERS, grpo_chunk, only_run

from posttrain_metrics import (
    Frame,
    Metric,
    MetricAdapter,
    MetricReducer,
    MetricsError,
    Reduction,
    reduce_metrics,
)
from posttrain_metrics.core.values import materialize
from posttrain_metrics.doctor import run_checks
from posttrain_metrics.integrations import MemorySink
from posttrain_metrics.journal import JournalSink, read_journal
from posttrain_metrics.publication import Publisher

R = Reduction


# -- helpers ------------------------------------------------------------------------------------------


def good_window(step: int) -> list[dict[str, Any]]:
    rng = random.Random(step)
    return [grpo_chunk(rng, step, last=c == 1) for c in range(2)]


class Run:
    """A reducer and a publisher (journal + memory sink) driven like a training loop."""

    def __init__(self, folder: Path, adapters: Any = GRPO_ADAPTERS) -> None:
        self.adapters = adapters
        self.reducer = MetricReducer(adapters)
        self.memory = MemorySink()
        self.journal = folder / "journal.jsonl"
        self.pub = Publisher([JournalSink(self.journal), self.memory], adapters=adapters, mode="inline")
        self.pub.start({})

    def step(self, step: int, chunks: list[dict[str, Any]]) -> Frame:
        for chunk in chunks:
            self.reducer.add(chunk)
        frame = self.reducer.reduce(step)
        self.pub.publish(frame)
        return frame

    def close(self) -> None:
        self.pub.close()


def rejected(folder: Path, chunk: Mapping[str, Any], *needles: str, adapters: Any = GRPO_ADAPTERS,
             good: Callable[[int], list[dict[str, Any]]] = good_window) -> str:
    """Step 1 good, step 2 carries ``chunk`` (a MetricsError naming ``needles`` and a fix), step 3
    good: steps 1 and 3 are in the journal and the sink, and step 3 is exact."""
    run = Run(folder, adapters)
    run.step(1, good(1))
    run.reducer.add(good(2)[0])
    run.reducer.add(chunk)
    with pytest.raises(MetricsError) as info:
        run.reducer.reduce(2)
    text = str(info.value)
    for needle in (*needles, "fix"):
        assert needle in text, f"{needle!r} not in {text!r}"
    assert run.reducer.pending_chunks == 0  # the bad window is discarded
    third = run.step(3, good(3))
    run.close()
    assert dict(third.metrics) == reduce_metrics(adapters, [good(3)])  # nothing of step 2 leaked in
    assert [f.step for f in read_journal(run.journal).frames] == [1, 3]
    assert [f.step for f in run.memory.frames] == [1, 3]
    return text


def reduce_one(adapters: Any, chunk: Mapping[str, Any]) -> dict[str, Any]:
    reducer = MetricReducer(adapters)
    reducer.add(chunk)
    return dict(reducer.reduce(1).metrics)


# -- NaN and inf ---------------------------------------------------------------------------------------


def test_nan_and_inf_values_propagate_and_every_sink_keeps_or_counts_them(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    chunks = [{"grpo_clip_frac": math.nan, "grpo_valid_token_count": 0},  # NaN under zero weight adds nothing
              {"grpo_kl_max": math.nan, "grpo_kl_mean": math.inf, "grpo_loss": -math.inf, "grpo_weight_sum": 10,
               "grpo_clip_frac": 0.25, "grpo_valid_token_count": 4}]
    metrics = reduce_metrics("grpo", [chunks])
    assert math.isnan(metrics["train/kl_max"])
    assert metrics["train/kl_mean"] == math.inf and metrics["train/loss_avg"] == -math.inf
    assert metrics["train/clip_frac"] == 0.25 and metrics["train/valid_token_count"] == 4
    # a NaN on one rank makes the global figure NaN: never dropped, never averaged away
    assert math.isnan(reduce_metrics("grpo", [[{"grpo_kl_max": 0.1}], [{"grpo_kl_max": math.nan}]])["train/kl_max"])

    strict = MemorySink()
    strict.name, strict.stores_nonfinite = "strict", frozenset({"nan"})  # like MLflow: NaN yes, inf no
    journal = tmp_path / "journal.jsonl"
    pub = Publisher([JournalSink(journal), strict], adapters="grpo", mode="inline")
    pub.start({})
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        for step in (1, 2):
            pub.publish(Frame(step, metrics, "train", 1.0 + step))
    pub.close()
    back = read_journal(journal).frames[-1].metrics  # the journal keeps the exact values
    assert math.isnan(back["train/kl_max"]) and back["train/kl_mean"] == math.inf
    last = strict.frames[-1].metrics
    assert math.isnan(last["train/kl_max"]) and "train/kl_mean" not in last
    assert last["health/nonfinite/train/kl_mean"] == 2 and last["health/nonfinite/train/loss_avg"] == 2
    assert sum("cannot be stored faithfully" in m for m in caplog.messages) == 2  # once per key (a log record)
    findings = {f.check: f for f in run_checks(read_journal(journal))}
    assert findings["nonfinite_values"].steps == (1, 2)


# -- strings, bools, containers ----------------------------------------------------------------------


@pytest.mark.parametrize(("value", "shown"), [("high", "'high'"), ("0.5", "'0.5'"), (b"1", "b'1'")])
def test_a_string_for_a_numeric_key_is_refused(tmp_path: Path, value: Any, shown: str) -> None:
    rejected(tmp_path, {"grpo_kl_max": value}, "'grpo_kl_max'", shown)


@pytest.mark.parametrize(("value", "shown"), [
    (None, "None"), ([0.5], "[0.5]"), ({"v": 1}, "{'v': 1}"), (1 + 2j, "(1+2j)"),
    (torch.tensor([0.1, 0.2]), "(2,)"), (torch.tensor([]), "(0,)"), (np.array([1.0, 2.0]), "(2,)"),
    (torch.tensor(1 + 2j), "complex"), (np.clongdouble(1), "clongdouble"),
])
def test_none_containers_complex_and_multi_element_tensors_are_refused(tmp_path: Path, value: Any, shown: str) -> None:
    rejected(tmp_path, {"grpo_kl_max": value}, "'grpo_kl_max'", shown)


def test_bools_are_counts_and_flags_and_trackers_see_0_or_1(tmp_path: Path) -> None:
    summed = reduce_metrics("grpo", [[{"grpo_response_count": True}, {"grpo_response_count": True}],
                                     [{"grpo_response_count": False}]])
    assert summed == {"train/response_count": 2} and type(summed["train/response_count"]) is int
    flags = reduce_metrics("trainer", [[{"step_skipped": True}], [{"step_skipped": True}]])
    assert flags["optim/step_skipped"] is True  # LAST of the same flag on every rank stays a bool
    with pytest.raises(MetricsError, match="ranks disagree on 'optim/step_skipped'"):  # desynchronised ranks
        reduce_metrics("trainer", [[{"step_skipped": True}], [{"step_skipped": False}]])
    assert reduce_one("grpo", {"grpo_clip_frac": True, "grpo_valid_token_count": True}) == {
        "train/clip_frac": 1.0, "train/valid_token_count": 1}  # True counts as 1, as a value and a weight
    rejected(tmp_path, {"update_outcome": True}, "'update_outcome'", "True", "'applied'")

    sink = MemorySink()
    pub = Publisher([JournalSink(tmp_path / "j.jsonl"), sink], adapters="trainer", mode="inline")
    pub.start({})
    pub.publish(Frame(1, flags, "train", 1.0))
    pub.close()
    assert sink.frames[0].metrics["optim/step_skipped"] == 1 and type(sink.frames[0].metrics["optim/step_skipped"]) is int
    assert read_journal(tmp_path / "j.jsonl").frames[0].metrics["optim/step_skipped"] is True


# -- numpy scalars and 0-d tensors ---------------------------------------------------------------------


def test_numpy_scalars_and_0d_tensors_on_the_available_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a machine with CUDA the tensors live on the GPU and come back in one copy per device;
    without it the same test runs the CPU path (no skip)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    stacked: list[str] = []
    real_stack = torch.stack

    def spy(tensors: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        out = real_stack(tensors, *args, **kwargs)
        stacked.append(out.device.type)
        return out

    monkeypatch.setattr(torch, "stack", spy)
    chunk = {
        "grpo_clip_frac": torch.tensor(0.25, device=device),
        "grpo_valid_token_count": torch.tensor(8, device=device),
        "grpo_kl_max": torch.tensor([1.5], device=device, dtype=torch.bfloat16),  # one element, any shape
        "grpo_response_count": np.int64(3),
        "grpo_response_len_max": np.array(12),  # a 0-d numpy array
        "grpo_kl_mean": np.longdouble(0.125),  # no Python twin: used to recurse forever
        "grpo_loss": np.float32(0.5), "grpo_weight_sum": np.uint8(8),
    }
    plain = materialize([chunk])[0]
    assert stacked == [device]  # the window's three tensors: one stacked copy from their device
    assert plain["grpo_clip_frac"] == 0.25 and type(plain["grpo_valid_token_count"]) is int
    got = reduce_one("grpo", chunk)
    assert got == {"train/clip_frac": 0.25, "train/valid_token_count": 8, "train/kl_max": 1.5,
                   "train/response_count": 3, "train/response_len_max": 12, "train/kl_mean": 0.125,
                   "train/loss_avg": 0.5, "train/weight_sum": 8}
    assert type(got["train/response_count"]) is int and type(got["train/kl_mean"]) is float
    assert all(type(v) in (int, float) for v in got.values())  # plain Python out, never numpy or torch


# -- huge ints ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [2**53 + 1, -(2**60), np.int64(2**60), torch.tensor(2**60), Fraction(10**400)])
def test_ints_beyond_2_53_are_refused(tmp_path: Path, value: Any) -> None:
    rejected(tmp_path, {"grpo_response_count": value}, "'grpo_response_count'")


def test_2_53_itself_and_huge_floats_are_exact_in_the_journal(tmp_path: Path) -> None:
    metrics = reduce_one("grpo", {"grpo_response_count": 2**53, "grpo_kl_max": 1e300})
    assert metrics == {"train/response_count": 2**53, "train/kl_max": 1e300}
    pub = Publisher([JournalSink(tmp_path / "j.jsonl")], adapters="grpo")
    pub.start({})
    pub.publish(Frame(1, metrics, "train", 1.0))
    pub.close()
    assert read_journal(tmp_path / "j.jsonl").frames[0].metrics == metrics


# -- weights, unknown keys, labels -----------------------------------------------------------------------


@pytest.mark.parametrize("weight", [-4, math.nan, math.inf, -0.5])
def test_negative_or_nonfinite_weights_are_refused(tmp_path: Path, weight: float) -> None:
    rejected(tmp_path, {"grpo_clip_frac": 0.1, "grpo_valid_token_count": weight}, "'grpo_clip_frac'",
             "'grpo_valid_token_count'", "finite and >= 0")


def test_a_zero_weight_contributes_nothing() -> None:
    got = reduce_metrics("grpo", [[{"grpo_clip_frac": 0.9, "grpo_valid_token_count": 0}],
                                  [{"grpo_clip_frac": 0.1, "grpo_valid_token_count": 5}]])
    assert got == {"train/clip_frac": 0.1, "train/valid_token_count": 5}
    assert reduce_one("grpo", {"grpo_clip_frac": 0.9, "grpo_valid_token_count": 0}) == {
        "train/clip_frac": 0.0, "train/valid_token_count": 0}  # no data reads 0.0 with weight 0


def test_unknown_keys_are_refused_with_a_suggestion_and_ignored_keys_are_accepted(tmp_path: Path) -> None:
    rejected(tmp_path, {"grpo_kl_maximum": 1.0}, "'grpo_kl_maximum'", "not declared", "did you mean 'grpo_kl_max'")
    rejected(tmp_path, {"grpo_clipfrac": 1.0}, "did you mean 'grpo_clip_frac'")
    assert reduce_one("dpo", {"dpo_loss": 0.5, "dpo_weight_sum": 8}) == {"train/loss_avg": 0.5}  # declared as ignored


def test_keys_that_are_not_strings_and_chunks_that_are_not_mappings_are_refused() -> None:
    reducer = MetricReducer("grpo")
    with pytest.raises(MetricsError, match=r"source names must be strings, got 1 \(int\)"):
        reducer.add({1: 0.5})
    with pytest.raises(MetricsError, match="mapping"):
        reducer.add([("grpo_kl_max", 0.5)])  # type: ignore[arg-type]
    with pytest.raises(MetricsError, match=r"per_rank_chunks\[1\].*strings"):
        reduce_metrics("grpo", [[{"grpo_kl_max": 1.0}], [{None: 1.0}]])
    with pytest.raises(MetricsError, match=r"per_rank_chunks\[0\] must be a list"):
        reduce_metrics("grpo", [{"grpo_kl_max": 1.0}])  # type: ignore[list-item]
    reducer.add({"grpo_kl_max": 0.5})
    assert reducer.reduce(1).metrics == {"train/kl_max": 0.5}  # the refused chunks left no trace


@pytest.mark.parametrize(("value", "shown"), [("stepped", "'stepped'"), (1, "1"), ("Applied", "'Applied'")])
def test_a_label_outside_the_declared_set_is_refused(tmp_path: Path, value: Any, shown: str) -> None:
    rejected(tmp_path, {"update_outcome": value}, "'update_outcome'", shown, "'applied'", "'skipped'")


# -- steps -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("step", ["3", 1.5, None, True, 2**60, torch.tensor(1.0)])
def test_a_step_that_is_not_an_integer_is_refused(step: Any) -> None:
    reducer = MetricReducer("grpo")
    reducer.add({"grpo_kl_max": 1.0})
    with pytest.raises(MetricsError, match="step must be an integer"):
        reducer.reduce(step)
    assert reducer.pending_chunks == 0


@pytest.mark.parametrize("step", [np.int64(7), torch.tensor(7), 7])
def test_integer_steps_of_any_kind_become_a_plain_int(step: Any) -> None:
    reducer = MetricReducer("grpo")
    frame = reducer.reduce(step)
    assert frame.step == 7 and type(frame.step) is int


# -- sinks: steps backwards and repeated, names backends reject, an empty window ---------------------------

LONG = "x" * 300
ODD = MetricAdapter("odd", internal_prefix="odd_", metrics=[
    Metric("loss", R.MEAN, "A plain key"),
    Metric(LONG, R.MEAN, "A 300-character leaf (MLflow takes 250)"),
    Metric("kl@0.5", R.MAX, "A leaf with a character MLflow rejects"),
    Metric("with space", R.MEAN, "A leaf with a space"),
])
ODD_KEYS = ("train/loss", f"train/{LONG}", "train/kl@0.5", "train/with space")
STEPS = [1, 2, 3, 2, 3, 3, 4]  # a resume from step 1 after reaching 3, then step 3 logged twice
EMPTY_STEP = 5


class Vendors:
    def __init__(self, root: Path, pub: Publisher, frames: list[Frame], caught: list[str]) -> None:
        self.root, self.pub, self.frames, self.caught = root, pub, frames, caught

    def series(self, key: str) -> list[tuple[int, float]]:
        return [(f.step, float(f.metrics[key])) for f in self.frames if key in f.metrics]


@pytest.fixture(scope="module")
def vendors(tmp_path_factory: pytest.TempPathFactory) -> Vendors:
    from posttrain_metrics.integrations.mlflow import MlflowSink
    from posttrain_metrics.integrations.tensorboard import TensorBoardSink
    from posttrain_metrics.integrations.wandb import WandbSink

    root = tmp_path_factory.mktemp("vendors")
    sinks = [JournalSink(root / "journal.jsonl"), TensorBoardSink(log_dir=root / "tensorboard"),
             MlflowSink(dir=root, experiment_name="bad-input"),
             WandbSink(project="bad-input", dir=root, mode="offline", settings={"quiet": True})]
    # mode="thread": the sinks' warnings are raised in this process, where catch_warnings sees them
    pub = Publisher(sinks, adapters=[ODD], run_id="badinput01", run_name="bad-input", mode="thread")
    reducer = MetricReducer([ODD])
    frames: list[Frame] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pub.start({})
        for i, step in enumerate([*STEPS, EMPTY_STEP, 6]):
            if step != EMPTY_STEP:
                reducer.add({f"odd_{m.leaf}": float(i) + 0.5 for m in ODD.metrics.values()})
            frame = reducer.reduce(step)
            frame = Frame(frame.step, frame.metrics, frame.phase, 1_700_000_000.0 + i)
            frames.append(frame)
            pub.publish(frame)
        pub.close()
    import wandb

    wandb.teardown()
    assert pub.failures == {}, pub.failures
    return Vendors(root, pub, frames, [str(w.message) for w in caught])


def tensorboard_series(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def mlflow_series(root: Path) -> tuple[dict[str, list[tuple[int, float]]], Any]:
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("bad-input").experiment_id])
    return {key: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
            for key in run.data.metrics}, run


def wandb_rows(root: Path) -> list[dict[str, Any]]:
    from posttrain_metrics.integrations.wandb_reader import read_offline_run

    return [{k: v for k, v in row.items() if not k.startswith("_")} for row in read_offline_run(root).history]


def test_steps_that_go_backwards_or_repeat_are_kept_by_every_sink(vendors: Vendors) -> None:
    published = [*STEPS, 6]
    journal = read_journal(vendors.root / "journal.jsonl")
    assert [f.step for f in journal.frames] == [*STEPS, EMPTY_STEP, 6]  # every frame, in order
    want = vendors.series("train/loss")
    assert [s for s, _ in want] == published
    # TensorBoard: every point in write order (the line goes back in x; nothing is purged)
    tb = tensorboard_series(vendors.root / "tensorboard")
    assert [(s, v) for s, v in tb["train/loss"]] == want
    # MLflow: every point (a point is (step, timestamp, value): a re-logged step is a second point)
    ml, _ = mlflow_series(vendors.root)
    assert ml["train/loss"] == sorted(want)
    # W&B: one row per frame on the trainer/step axis, never dropped by W&B's monotonic _step
    rows = wandb_rows(vendors.root)
    assert [(r["trainer/step"], r["train/loss"]) for r in rows] == want
    # the doctor warns
    (order,) = [f for f in run_checks(journal) if f.check == "step_order"]
    assert order.steps == (2, 3) and "backwards or repeat" in order.explanation


def test_names_a_backend_rejects_are_mapped_by_mlflow_only_and_kept_elsewhere(vendors: Vendors) -> None:
    journal = read_journal(vendors.root / "journal.jsonl")
    assert set(journal.frames[0].metrics) == set(ODD_KEYS)
    assert set(tensorboard_series(vendors.root / "tensorboard")) == set(ODD_KEYS)  # TensorBoard: as is
    rows = wandb_rows(vendors.root)
    assert set(rows[0]) == {*ODD_KEYS, "trainer/step"}  # W&B: as is
    assert [r[f"train/{LONG}"] for r in rows] == [v for _, v in vendors.series(f"train/{LONG}")]
    ml, _ = mlflow_series(vendors.root)
    (long_name,) = [k for k in ml if k.startswith("train/xxx")]
    assert len(long_name) == 250 and long_name != f"train/{LONG}"  # cut to MLflow's limit + a short hash
    series = {k for k in ml if not k.startswith("run/")}  # run/<key>: the run aggregates, logged at close
    assert series == {"train/loss", long_name, "train/kl_0.5", "train/with space"}
    assert {k for k in ml if k.startswith("run/")} >= {"run/train/loss", "run/train/kl_0.5", "run/train/with space"}
    assert ml["train/kl_0.5"] == sorted(vendors.series("train/kl@0.5"))  # every point under the mapped name
    mapped = [m for m in vendors.caught if "is not a valid MLflow name" in m]
    assert len(mapped) == 2 and any("'train/kl@0.5'" in m and "'train/kl_0.5'" in m for m in mapped)


def test_an_empty_window_is_in_the_journal_only(
    vendors: Vendors, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from posttrain_metrics.cli import main
    from posttrain_metrics.core import catalog

    monkeypatch.setitem(catalog._REGISTRY, ODD.name, ODD)  # export looks the journal's adapters up by name

    journal = read_journal(vendors.root / "journal.jsonl")
    (empty,) = [f for f in journal.frames if f.step == EMPTY_STEP]
    assert dict(empty.metrics) == {}
    assert vendors.pub.empty_frames == 1
    assert sum("has no metrics" in m for m in vendors.caught) == 1
    assert EMPTY_STEP not in [s for s, _ in tensorboard_series(vendors.root / "tensorboard")["train/loss"]]
    ml, _ = mlflow_series(vendors.root)
    assert all(EMPTY_STEP not in [s for s, _ in points] for points in ml.values())
    assert EMPTY_STEP not in [r["trainer/step"] for r in wandb_rows(vendors.root)]  # no row without values
    findings = run_checks(journal)  # the doctor reads it
    assert "step_order" in {f.check for f in findings}
    # export skips it, so exporting twice is still idempotent
    target = tmp_path / "tb"
    argv = ["export", str(vendors.root / "journal.jsonl"), "--to", "tensorboard", str(target), "--quiet"]
    assert main(argv) == 0
    assert f"exported {len(STEPS) + 1} of {len(STEPS) + 2} frames" in capsys.readouterr().out
    assert main(argv) == 0
    assert "nothing to export" in capsys.readouterr().out
    assert tensorboard_series(only_run(target))["train/loss"] == tensorboard_series(vendors.root / "tensorboard")["train/loss"]


def test_reduce_with_no_add_gives_a_frame_with_no_metrics_on_every_path() -> None:
    assert MetricReducer(GRPO_ADAPTERS).reduce(4).metrics == {}
    assert reduce_metrics(GRPO_ADAPTERS, [[], []]) == {}
    sink = MemorySink()
    with pytest.warns(UserWarning, match="step 4 has no metrics"):
        pub = Publisher([sink], adapters=GRPO_ADAPTERS, mode="inline")
        pub.start({})
        pub.publish(Frame(4, {}))
    pub.publish(Frame(5, {}))  # warned once, counted every time
    pub.close()
    assert sink.frames == [] and pub.empty_frames == 2


# -- reduce called by only some ranks -------------------------------------------------------------------

GLOO_TIMEOUT_S = 5


class FakeDist(types.SimpleNamespace):
    """torch.distributed as seen by posttrain_metrics.core.distributed, whose collectives time out."""


def fake_dist(world: int) -> FakeDist:
    def timeout(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("[gloo] Timed out waiting 5000ms for recv operation to complete")

    return FakeDist(
        is_available=lambda: True, is_initialized=lambda: True, get_rank=lambda group=None: 0,
        get_world_size=lambda group=None: world, get_backend=lambda group=None: "gloo",
        ReduceOp=types.SimpleNamespace(SUM="sum", MAX="max"), all_reduce=timeout,
        all_gather_into_tensor=timeout,
    )


@pytest.mark.parametrize(("world", "first", "collective"), [
    (2, True, "layout handshake all_reduce(MAX)"), (2, False, "all_gather"), (65, False, "all_reduce(SUM)")])
def test_a_collective_that_fails_says_which_the_step_and_the_fix(
    monkeypatch: pytest.MonkeyPatch, world: int, first: bool, collective: str
) -> None:
    monkeypatch.setitem(sys.modules, "torch.distributed", fake_dist(world))
    reducer = MetricReducer("grpo")
    reducer._verified = not first  # past the first step's handshake, or not
    reducer.add({"grpo_kl_max": 1.0})
    with pytest.raises(MetricsError) as info:
        reducer.reduce(12)
    text = str(info.value)
    for part in (f"the {collective} collective of step 12", "on rank 0", "Timed out", "reduce(12)",
                 "every rank", "init_process_group(timeout=...)", "Fix"):
        assert part in text, f"{part!r} not in {text!r}"
    assert isinstance(info.value.__cause__, RuntimeError)


def _skipping_worker(rank: int, store: str, results: Any, release: Any) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    outcome: tuple[str, Any, float] = ("crash", "never ran", 0.0)
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2,
                                timeout=datetime.timedelta(seconds=GLOO_TIMEOUT_S))
        reducer = MetricReducer("grpo")
        reducer.add({"grpo_kl_max": float(rank)})
        first = dict(reducer.reduce(1).metrics)  # both ranks: the handshake and step 1
        if rank == 1:
            results.put((rank, ("skipped", first, 0.0)))
            release.wait(60)  # alive but never calls reduce(2): rank 0 waits in the collective
            return
        reducer.add({"grpo_kl_max": 2.0})
        start = time.monotonic()
        try:
            reducer.reduce(2)
            outcome = ("ok", first, time.monotonic() - start)
        except MetricsError as exc:
            outcome = ("MetricsError", str(exc), time.monotonic() - start)
    except Exception:
        outcome = ("crash", traceback.format_exc(), 0.0)
    results.put((rank, outcome))


@pytest.mark.timeout(90)
def test_reduce_called_by_only_some_ranks_times_out_with_a_clear_error(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    results, release = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_skipping_worker, args=(r, str(tmp_path / "store"), results, release), daemon=True)
             for r in range(2)]
    for p in procs:
        p.start()
    got: dict[int, tuple[str, Any, float]] = {}
    deadline = time.monotonic() + 75
    try:
        while len(got) < 2 and time.monotonic() < deadline:
            try:
                rank, outcome = results.get(timeout=0.5)
            except queue_module.Empty:
                continue
            got[rank] = outcome
    finally:
        release.set()
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    assert sorted(got) == [0, 1], f"only ranks {sorted(got)} reported: {got}"
    assert got[1][0] == "skipped" and got[1][1] == {"train/kl_max": 1.0}
    status, text, waited = got[0]
    assert status == "MetricsError", f"rank 0: {status} {text}"
    for part in ("all_gather collective of step 2", "on rank 0", "reduce(2)", "every rank", "timeout"):
        assert part in text, f"{part!r} not in {text!r}"
    # it is the process group's timeout that ended the wait: not before it (a loaded machine only
    # waits longer, so this lower bound cannot flake); no upper bound, which load could break
    assert waited >= GLOO_TIMEOUT_S - 0.5, waited
    print(f"[figure] rank 1 skipped reduce(2): rank 0 raised after {waited:.1f} s: {text}")


# -- the table ---------------------------------------------------------------------------------------------


def test_every_row_of_the_bad_input_table_names_a_test_that_exists() -> None:
    import re

    root = Path(__file__).resolve().parent
    table = (root.parent / "docs" / "bad-input.md").read_text()
    rows = [line for line in table.splitlines()
            if line.startswith("| ") and not line.startswith(("| input", "| ---"))]
    inputs = " ".join(row.split(" | ")[0] for row in rows)
    for case in ("NaN", "±inf", "string for a numeric key", "Bools", "numpy scalars", "0-d", "CUDA", "2**53",
                 "negative, NaN or infinite weight", "unknown key", "label outside", "backwards", "repeat",
                 "long key names", "names a backend rejects", "empty window", "only some ranks"):
        assert case in inputs, f"no row for {case!r}"  # every case issue 6 lists
    for case in ("credential", "command line", "error or a warning", "hostile config string", "control characters",
                 "relative MLflow", "wrong type", "not UTF-8", "could not reproduce faithfully", "dead server",
                 "file-store", "unknown URI scheme", "command-line arguments"):
        assert case in inputs, f"no row for {case!r}"  # every case issues 14 and 12 (item 12) list
    # The README links the table rather than copying it, so there is one table to keep true.
    readme = (root.parent / "README.md").read_text()
    section = readme.split("## Bad input", 1)[1].split("\n## ", 1)[0]
    assert "(docs/bad-input.md)" in section
    assert not [line for line in section.splitlines() if line.startswith("|")], "the README copies the table"
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert len(cells) == 3, row
        names = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", cells[2])
        assert names, f"row without a test: {row}"
        for path, name in names:
            source = (root.parent / path).read_text()
            assert re.search(rf"^(?:async )?def {name}\(", source, re.M), f"{path}::{name} does not exist"



@pytest.mark.parametrize("run_id", ["../../x", "a/b", "x' OR '1'='1", ".hidden", "-rf", "", "x" * 129, 7,
                                    "run\n"])
def test_an_unsafe_run_id_is_refused_at_construction(run_id: Any) -> None:
    from posttrain_metrics.callbacks import MetricsCallback

    with pytest.raises(MetricsError, match="not a safe run id"):
        Publisher([MemorySink()], adapters="grpo", run_id=run_id)
    with pytest.raises(MetricsError, match="not a safe run id"):
        MetricsCallback(adapters=["grpo"], sinks=[{"type": "memory"}], run_id=run_id)
    assert Publisher([MemorySink()], adapters="grpo", run_id="grpo-7b_v1.2").run_id == "grpo-7b_v1.2"


# -- issue 14: secrets ------------------------------------------------------------------------------------

# Each planted secret is unique, so that a grep of the raw bytes says which form leaked.
PLANTED: dict[str, tuple[Any, str]] = {
    # form: (a config fragment holding it, the secret)
    "parent key pass": ({"db": {"host": "db1", "pass": "Pq1-parent-pass"}}, "Pq1-parent-pass"),
    "plural parent": ({"passwords": {"admin": "Pq2-plural-parent"}}, "Pq2-plural-parent"),
    "secrets parent": ({"secrets": {"slack": {"channel": "Pq3-secrets-parent"}}}, "Pq3-secrets-parent"),
    "passwd": ({"svc": {"passwd": "Pq4-passwd"}}, "Pq4-passwd"),
    "pwd": ({"pwd": "Pq5-pwd"}, "Pq5-pwd"),
    "*_PWD": ({"env": {"MYSQL_PWD": "Pq6-mysql-pwd"}}, "Pq6-mysql-pwd"),
    "PGPASSWORD": ({"env": {"PGPASSWORD": "Pq7-pgpassword"}}, "Pq7-pgpassword"),
    "api_keys list": ({"openai": {"api_keys": ["Pq8-first-key", "Pq8-second-key"]}}, "Pq8-second-key"),
    "argv list": ({"argv": ["train.py", "--password", "Pq9-argv-list", "--lr", "3e-4"]}, "Pq9-argv-list"),
    "argv pair tuple": ({"auth_pairs": [("token", "Pq10-pair-tuple")]}, "Pq10-pair-tuple"),
    "command --api-key": ({"cmd": "python train.py --api-key Pq11-cmd-api-key --lr 3"}, "Pq11-cmd-api-key"),
    "command --hf-token": ({"cmd2": "accelerate launch t.py --hf-token Pq12-cmd-hf-token"}, "Pq12-cmd-hf-token"),
    "k8s env entry": ({"pod": {"env": [{"name": "WANDB_API_KEY", "value": "Pq13-k8s-env"},
                                       {"name": "LR", "value": "0.1"}]}}, "Pq13-k8s-env"),
    "PEM block": ({"deploy": {"cert": "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAPq14pem\n"
                                      "-----END OPENSSH PRIVATE KEY-----\n"}}, "b3BlbnNzaC1rZXktdjEAAAAPq14pem"),
    "github ghp_": ({"note1": "clone with ghp_Pq15aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}, "ghp_Pq15aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"),
    "github_pat_": ({"note2": "github_pat_11Pq16bbbbbbbbbbbbbbbbbbbbbbbbb"}, "github_pat_11Pq16bbbbbbbbbbbbbbbbbbbbbbbbb"),
    "gitlab glpat-": ({"note3": "glpat-Pq17ccccccccccccccccc"}, "glpat-Pq17ccccccccccccccccc"),
    "google AIza": ({"maps": "AIzaSyPq18ddddddddddddddddddddddddddddd"}, "AIzaSyPq18ddddddddddddddddddddddddddddd"),
    "aws AKIA": ({"note4": "id AKIAPQ19EEEEEEEEEEEE here"}, "AKIAPQ19EEEEEEEEEEEE"),
    "aws ASIA": ({"note5": "ASIAPQ20FFFFFFFFFFFF"}, "ASIAPQ20FFFFFFFFFFFF"),
    "stripe sk_live_": ({"billing": "sk_live_Pq21gggggggggggggggggggggg"}, "sk_live_Pq21gggggggggggggggggggggg"),
    "slack webhook": ({"alerts": "https://hooks.slack.com/services/T0000/B0000/Pq22hhhhhhhhhhhhhhhh"},
                      "Pq22hhhhhhhhhhhhhhhh"),
    "hugging face hf_": ({"note6": "hf_Pq23iiiiiiiiiiiiiiiiiiiiiiii"}, "hf_Pq23iiiiiiiiiiiiiiiiiiiiiiii"),
    "DSN password=": ({"dsn": "host=db port=5432 user=u password=Pq24-dsn dbname=runs"}, "Pq24-dsn"),
    "netrc line": ({"note7": "machine api.wandb.ai login alice password Pq25-netrc"}, "Pq25-netrc"),
    "scp user:pass@host:path": ({"sync": "alice:Pq26-scp@storage.internal:/data/ckpt"}, "Pq26-scp"),
    "bytes value": ({"blob": b"HF_TOKEN=Pq27-bytes-value"}, "Pq27-bytes-value"),
    "tuple value": ({"creds": ("password", "Pq28-tuple-value")}, "Pq28-tuple-value"),
    "JSON text": ({"extra": '{"db": {"password": "Pq29-json-text"}}'}, "Pq29-json-text"),
    "random-looking key": ({"note8": "key material 7fQ2xR9LmK4pZ8wT3vY6nB1cH5jD0sPq30 end"},
                           "7fQ2xR9LmK4pZ8wT3vY6nB1cH5jD0sPq30"),
    "creds parent": ({"creds": ("svc", "Pq3-creds-in-a-tuple")}, "Pq3-creds-in-a-tuple"),
    "cred word": ({"db_cred": "Pq3-db-cred"}, "Pq3-db-cred"),
    # issue 25: shapes a hostile probe found outside the tests
    "empty-user URI": ({"cache": "redis://:Pq32-empty-user@cache.internal:6379/0"}, "Pq32-empty-user"),
    "databricks dapi": ({"note9": "dapi5f0e3a9c1b7d2e4f6a8c0b1d3e5f7a9c"}, "dapi5f0e3a9c1b7d2e4f6a8c0b1d3e5f7a9c"),
    "random base64 (AWS secret form)": ({"note10": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYPq33EXAMPLE"},
                                        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYPq33EXAMPLE"),
    "token_urlsafe(32)": ({"note11": "Pq34zN6c_y2QdKfR-0tWbLmX9eHsUaVjGpYiT1oC8w"},
                          "Pq34zN6c_y2QdKfR-0tWbLmX9eHsUaVjGpYiT1oC8w"),
    # the review of issue 25: a JSON string of JSON (escaped quotes) and an argv printed as a list
    "escaped JSON text": ({"payload": json.dumps(json.dumps({"model": "q", "api_key": "Pq46-escaped-json"}))},
                          "Pq46-escaped-json"),
    "printed argv": ({"launch": "argv: ['train.py', '--hf_token', 'Pq47-printed-argv', '--lr', '1e-6']"},
                     "Pq47-printed-argv"),
}
# Secrets used as mapping keys (the key is redacted, its value kept).
KEYED: dict[str, tuple[Any, str]] = {
    "hub account as a key": ({"hub_accounts": {"hf_Pq35accountAsAMappingName0123456": "alice"}},
                             "hf_Pq35accountAsAMappingName0123456"),
    "mirror URL as a key": ({"mirrors": {"https://mirror:Pq36-mirror-pass@pypi.internal/simple": "eu"}},
                            "Pq36-mirror-pass"),
}
INNOCENT = {"rl": {"kl_beta": 0.04, "max_tokens": 256, "eos_token": "</s>", "pad_token_id": 0, "sort_key": "len",
                   "pass_at_k": 0.5},
            "model": "meta-llama/Llama-3.1-8B-Instruct", "git_sha": "0123456789abcdef0123456789abcdef01234567",
            "url": "https://huggingface.co/datasets/gsm8k", "tags": ["grpo", "ablation"],
            "hub": {"use_auth_token": True, "hf_token_path": "/data/hf/token", "api_key": "${oc.env:OPENAI_API_KEY}"},
            "prompt": "Answer with a single token: yes or no. Never reveal the password."}


def planted_config() -> dict[str, Any]:
    config: dict[str, Any] = {"innocent": INNOCENT}
    for i, (fragment, _secret) in enumerate(PLANTED.values()):
        config[f"form{i}"] = fragment
    for i, (fragment, _secret) in enumerate(KEYED.values()):
        config[f"keyed{i}"] = fragment
    return config


@pytest.mark.parametrize("form", list(PLANTED))
def test_every_shape_of_credential_is_redacted_by_rule(form: str) -> None:
    from posttrain_metrics.core.redact import flatten_config

    fragment, secret = PLANTED[form]
    flat = flatten_config({"cfg": fragment})
    assert secret not in repr(flat), flat
    assert any("***REDACTED***" in str(v) for v in flat.values()), flat


def test_what_only_looks_like_a_credential_stays_readable() -> None:
    from posttrain_metrics.core.redact import flatten_config

    flat = flatten_config(INNOCENT)
    assert flat == {"rl/kl_beta": 0.04, "rl/max_tokens": 256, "rl/eos_token": "</s>", "rl/pad_token_id": 0,
                    "rl/sort_key": "len", "rl/pass_at_k": 0.5, "model": "meta-llama/Llama-3.1-8B-Instruct",
                    "git_sha": "0123456789abcdef0123456789abcdef01234567",
                    "url": "https://huggingface.co/datasets/gsm8k", "tags/0": "grpo", "tags/1": "ablation",
                    "hub/use_auth_token": True, "hub/hf_token_path": "/data/hf/token",
                    "hub/api_key": "${oc.env:OPENAI_API_KEY}", "prompt": INNOCENT["prompt"]}
    # the non-secret half of a pairing is kept: the user, the host, the other env entries
    flat = flatten_config(planted_config())
    assert flat["form12/pod/env/1/value"] == "0.1" and flat["form12/pod/env/0/name"] == "WANDB_API_KEY"
    assert flat["form0/db/host"] == "db1"
    assert flat["form25/sync"] == "alice:***REDACTED***@storage.internal:/data/ckpt"
    assert flat["form8/argv/3"] == "--lr" and flat["form8/argv/4"] == "3e-4"


def test_a_planted_secret_of_any_shape_is_in_no_byte_of_any_artefact(
    tmp_path: Path, mlflow_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from _mlflow_server import SERVER_STORES

    from posttrain_metrics.integrations.console import ConsoleSink
    from posttrain_metrics.integrations.mlflow import MlflowSink
    from posttrain_metrics.integrations.tensorboard import TensorBoardSink
    from posttrain_metrics.integrations.wandb import WandbSink

    argv_secret = "Pq31-command-line-secret"  # W&B's metadata records the command line
    monkeypatch.setattr(sys, "argv", ["train.py", "--hf-token", argv_secret, f"--password={argv_secret}"])
    # what the trackers store besides the config: the run name, MLflow tags, W&B tags, group, notes
    tracker_secrets = {"run name": "hf_Pq37runNameHoldsAToken0123456789", "mlflow tag": "Pq38-mlflow-tag",
                       "mlflow tag URI": "Pq39-tag-uri-pass", "wandb tag": "hf_Pq42wandbTagToken012345678",
                       "wandb notes": "Pq43-wandb-notes", "wandb group": "Pq44-group-pass",
                       "mlflow tag key": "sk-Pq45tagKeyIsAToken0123456789ab"}
    root = tmp_path / "run"
    served = MlflowSink(tracking_uri=mlflow_server, experiment_name=f"planted-{uuid.uuid4().hex[:8]}")
    served.name = "mlflow-server"
    console = io.StringIO()
    tagged = MlflowSink(dir=root, experiment_name="planted",
                        tags={"team": "rl", "ci_token": tracker_secrets["mlflow tag"],
                              "source": f"https://ci:{tracker_secrets['mlflow tag URI']}@git.internal/rl.git",
                              tracker_secrets["mlflow tag key"]: "x"})
    sinks = [JournalSink(root / "journal.jsonl"), TensorBoardSink(log_dir=root / "tensorboard"), tagged, served,
             WandbSink(project="planted", dir=root, mode="offline", settings={"quiet": True},
                       tags=["grpo", tracker_secrets["wandb tag"]], notes=f"HF_TOKEN={tracker_secrets['wandb notes']}",
                       group=f"redis://:{tracker_secrets['wandb group']}@cache:6379"),
             ConsoleSink(stream=console, min_interval=0)]
    pub = Publisher(sinks, adapters=GRPO_ADAPTERS, run_name=f"planted-{tracker_secrets['run name']}",
                    run_id="planted01", mode="inline")
    pub.start(planted_config())
    reducer = MetricReducer(GRPO_ADAPTERS)
    for step in (1, 2):
        for chunk in good_window(step):
            reducer.add(chunk)
        pub.publish(reducer.reduce(step))
    pub.close()
    import wandb

    wandb.teardown()
    assert pub.failures == {}
    files = [p for p in [*root.rglob("*"), *SERVER_STORES[mlflow_server].rglob("*")] if p.is_file()]
    names = {p.name for p in files}
    assert "journal.jsonl" in names and "mlflow.db" in names
    assert any(n.startswith("events.out.tfevents") for n in names) and any(n.endswith(".wandb") for n in names)
    secrets = [secret for _fragment, secret in [*PLANTED.values(), *KEYED.values()]] + [argv_secret]
    secrets += tracker_secrets.values()
    for path in files:
        data = path.read_bytes()
        for secret in secrets:
            assert secret.encode() not in data, f"{secret!r} is in {path}"
    assert "planted-" in console.getvalue()  # the console names the run, redacted
    for secret in secrets:
        assert secret not in console.getvalue(), f"{secret!r} is on the console"
    header = read_journal(root / "journal.jsonl").config
    assert header["innocent/rl/kl_beta"] == 0.04 and header["innocent/model"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert header["innocent/prompt"] == INNOCENT["prompt"] and header["innocent/hub/hf_token_path"] == "/data/hf/token"


def test_no_secret_in_an_error_or_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from posttrain_metrics.integrations.factory import build_sink

    secret = "Pq40-warned-secret"

    class Failing(MemorySink):
        name = "failing"

        def write(self, frame: Frame) -> None:
            raise ConnectionError(f"API request to http://alice:{secret}@127.0.0.1:9/api/2.0/mlflow failed")

    pub = Publisher([Failing()], adapters=GRPO_ADAPTERS, mode="inline")
    pub.start({})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pub.publish(Frame(1, {"train/kl_max": 0.5}, "train", 1.0))
    pub.close()
    texts = [str(w.message) for w in caught] + caplog.messages  # a degraded sink is a log record
    assert any("failed in write()" in t and "alice:***REDACTED***@127.0.0.1" in t for t in texts), texts
    assert not any(secret in t for t in texts), texts
    # our own errors that print a user's options, nested ones included
    for spec in ({"type": "nope", "auth": {"headers": {"Authorization": f"Bearer {secret}"}}},
                 {"type": "console", "every": 1, "extra": {"db": {"pass": secret}}},
                 {"type": "tensorboard", "flush": [f"--password={secret}"]}):
        with pytest.raises(MetricsError) as info:
            build_sink(spec, out_dir=tmp_path)
        assert secret not in str(info.value), str(info.value)


def test_the_live_mlflow_sink_redacts_a_password_in_its_uri_from_its_warnings(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from _mlflow_server import free_port

    from posttrain_metrics.integrations.mlflow import MlflowSink

    secret = "Pq41-uri-password"
    sink = MlflowSink(tracking_uri=f"http://alice:{secret}@127.0.0.1:{free_port()}", http_max_retries=0,
                      http_timeout=2)
    pub = Publisher([sink, JournalSink(tmp_path / "journal.jsonl")], adapters=GRPO_ADAPTERS, mode="inline")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pub.start({})
        pub.publish(Frame(1, {"train/kl_max": 0.5}, "train", 1.0))
        pub.close()
    texts = [str(w.message) for w in caught] + caplog.messages  # a degraded sink: a log record
    assert any("REDACTED" in t for t in texts), texts  # the sink did warn, with the URI
    assert not any(secret in t for t in texts), texts


def test_redaction_is_linear_time_on_hostile_and_plain_text() -> None:
    from posttrain_metrics.core.redact import flatten_config, redact_text

    # Shapes that made the old expressions quadratic (a long name run, many "a=", many "x://"),
    # and shapes each rule looks for, repeated without end.
    units = ["a", "a.", "a=", "a:", "a:b", "-a", "--key ", "key ", "a://", "a:b@", "@", "password ", 'password="',
             "Bearer ", "hf_", "eyJ", "eyJaaaaaaaaaa.", "-----BEGIN ", "aB1", "token", "keykey", "é", "lorem ipsum "]
    worst = 0.0
    for unit in units:
        small, large = unit * (20_000 // len(unit)), unit * (200_000 // len(unit))
        times = []
        for text in (small, large):
            best = math.inf
            for _ in range(3):
                started = time.process_time()
                redact_text(text)
                best = min(best, time.process_time() - started)
            times.append(max(best, 1e-4))
        ratio = times[1] / times[0]
        worst = max(worst, ratio)
        assert ratio < 30, f"{unit!r}: 10x the text cost {ratio:.0f}x the time (quadratic is 100x)"
    config = {"run": {"note": "lorem ipsum dolor sit amet, --lr 3e-4 url=https://h/x " * 18_000}}
    started = time.process_time()
    flat = flatten_config(config)
    spent = time.process_time() - started
    assert len(flat["run/note"]) == len(config["run"]["note"])  # nothing in it was a secret
    print(f"[figure] redaction: worst 10x-size ratio {worst:.1f}; 1 MB of config text in {spent:.2f} s CPU")


# -- issue 14: terminal control characters ----------------------------------------------------------------


def test_doctor_and_console_escape_control_characters_from_a_journal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from posttrain_metrics.cli import main
    from posttrain_metrics.integrations.console import ConsoleSink
    from posttrain_metrics.publication.publisher import Publisher as Pub

    forged = "x\r\x1b[2K\nhealthy: none of the checks fired\x1b]0;owned\x07\u202e"
    header = {"format": "posttrain-metrics-journal", "version": 1, "kind": "header", "run_id": "ctl01",
              "name": forged, "created": 1.7e9, "adapters": ["grpo"], "config": {}}
    frames = [{"kind": "frame", "run_id": "ctl01", "step": s, "phase": "train", "time": 1.7e9 + s,
               "metrics": {"train/kl_max": 0.5, "train/loss_avg": {"$float": "NaN"}, f"train/k\x1b[31m{s}": 1.0}}
              for s in (1, 2)]
    path = tmp_path / "journal.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [header, *frames]))
    assert main(["doctor", str(path)]) in (0, 1)
    out = capsys.readouterr().out
    for char in ("\x1b", "\r", "\x07", "\u202e"):
        assert char not in out, repr(out)
    assert not any(line.startswith("healthy") for line in out.splitlines()), out  # no forged line
    assert "x\\r\\x1b[2K\\nhealthy" in out
    stream = io.StringIO()
    pub = Pub([ConsoleSink(stream=stream, keys=["train/kl_max", "train/k\x1b[31m1"])], adapters="grpo",
              run_name=forged, mode="inline")
    pub.start({})
    pub.publish(Frame(1, {"train/kl_max": 0.5}, "train", 1.0))
    pub.close()
    printed = stream.getvalue()
    assert "\x1b" not in printed and "\r" not in printed and "\u202e" not in printed, repr(printed)
    assert len(printed.splitlines()) == 2  # the run line and the step line, nothing forged


# -- issue 14: paths and configs --------------------------------------------------------------------------


def test_a_relative_mlflow_uri_resolves_under_out_dir_and_an_absolute_one_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from posttrain_metrics.callbacks import MetricsCallback

    work, out = tmp_path / "cwd", tmp_path / "run"
    work.mkdir()
    monkeypatch.chdir(work)
    chosen = tmp_path / "elsewhere" / "abs.db"
    chosen.parent.mkdir()
    for uri, where in (("sqlite:///outside/ml.db", out / "outside" / "ml.db"),
                       (f"sqlite:///{chosen}", chosen)):
        callback = MetricsCallback(adapters=GRPO_ADAPTERS, sinks=[{"type": "mlflow", "tracking_uri": uri}],
                                   out_dir=out)
        callback.on_run_start({})
        for chunk in good_window(1):
            callback.on_chunk_end(chunk)
        callback.on_window_end(1)
        callback.on_run_end()
        assert where.is_file(), (uri, list(tmp_path.rglob("*.db")))
    assert list(work.iterdir()) == []  # nothing against the working directory
    assert MetricsCallback(adapters=["grpo"], sinks=[{"type": "mlflow", "tracking_uri": "mlruns"}],
                           out_dir=out).sinks[0].tracking_uri == str((out / "mlruns").resolve())  # type: ignore[attr-defined]
    with pytest.raises(MetricsError, match="outside the output folder"):
        MetricsCallback(adapters=["grpo"], sinks=[{"type": "mlflow", "tracking_uri": "sqlite:///../x.db"}],
                        out_dir=out)


@pytest.mark.parametrize(("kwargs", "needles"), [
    ({"sinks": [{"type": ["journal"]}]}, ["type ['journal']", "field 'type'", "fix"]),
    ({"sinks": [{"type": "journal", "path": 5}]}, ["path=5", "int", "fix"]),
    ({"sinks": [{"type": "journal", "path": ""}]}, ["path=''", "empty", "fix"]),
    ({"sinks": [{"type": "journal", "path": "."}]}, ["path='.'", "folder", "fix"]),
    ({"sinks": [{"type": "tensorboard", "log_dir": ["a"]}]}, ["log_dir=['a']", "list", "fix"]),
    ({"sinks": [{"type": "console", "every": "3"}]}, ["every='3'", "str", "fix"]),
    ({"sinks": [{"type": "wandb", "project": 7}]}, ["project=7", "int", "fix"]),
    ({"sinks": [{"type": "mlflow", "tracking_uri": 5}]}, ["tracking_uri=5", "fix"]),
    ({"sinks": [{"type": "mlflow", "backlog": "many"}]}, ["backlog='many'", "fix"]),
    ({"sinks": {"type": "journal"}}, ["sinks=", "dict", "fix"]),
    ({"adapters": 3}, ["adapters=3", "int", "fix"]),
    ({"adapters": ["grpo", 3.5]}, ["3.5", "float", "fix"]),
    ({"out_dir": 5}, ["out_dir=5", "int", "fix"]),
    ({"out_dir": ""}, ["out_dir=''", "fix"]),
    ({"run_name": 5}, ["run_name=5", "int", "fix"]),
])
def test_wrong_types_anywhere_in_a_callback_or_sink_config_are_a_metrics_error(
    tmp_path: Path, kwargs: dict[str, Any], needles: list[str]
) -> None:
    from posttrain_metrics.callbacks import MetricsCallback

    options: dict[str, Any] = {"adapters": ["grpo"], "sinks": [{"type": "memory"}], "out_dir": tmp_path, **kwargs}
    with pytest.raises(MetricsError) as info:
        MetricsCallback(**options)
    for needle in needles:
        assert needle in str(info.value), str(info.value)


# -- issue 14: journals and the command line ---------------------------------------------------------------


def _journal_lines(run_id: str = "enc01", name: str = "enc") -> list[bytes]:
    import json

    header = {"format": "posttrain-metrics-journal", "version": 1, "kind": "header", "run_id": run_id,
              "name": name, "created": 1.7e9, "adapters": ["grpo"], "config": {}}
    frames = [{"kind": "frame", "run_id": run_id, "step": s, "phase": "train", "time": 1.7e9 + s,
               "metrics": {"train/kl_max": 0.5 + s}} for s in (1, 2, 3)]
    return [json.dumps(r).encode() for r in [header, *frames]]


def _replaced(index: int, old: bytes, new: bytes) -> bytes:
    lines = _journal_lines()
    lines[index] = lines[index].replace(old, new)
    return b"\n".join(lines) + b"\n"


ENCODINGS: dict[str, tuple[bytes, str]] = {
    # case: (file bytes, what stderr says; "" = a documented skip with a warning, exit 0)
    "bad byte in a frame": (_replaced(2, b"kl_max", b"kl_max\xff"), ":3: not a journal line (not UTF-8: byte 0xff"),
    "bad byte in the header": (b"\n".join([_journal_lines(name="caf\xe9")[0].replace(b"caf\\u00e9", b"caf\xe9"),
                                           *_journal_lines()[1:]]) + b"\n", ":1: not a journal line (not UTF-8"),
    "torn last line mid-character": (b"\n".join(_journal_lines()) + b"\n" + _journal_lines()[3][:40] + b"\xe2\x82",
                                     ""),
    "UTF-16 file": ("\n".join(line.decode() for line in _journal_lines()).encode("utf-16") + b"\n",
                    "a UTF-16 file?"),
    "lone surrogate in the name": (b"\n".join([_journal_lines(name="x\ud800y")[0], *_journal_lines()[1:]]) + b"\n",
                                   ":1: not a journal line (a string holds a lone surrogate"),
    "lone surrogate in a key": (_replaced(2, b"kl_max", b"kl_\\udfff"), "lone surrogate"),
}


@pytest.mark.parametrize("command", ["doctor", "plot", "export"])
@pytest.mark.parametrize("case", list(ENCODINGS))
def test_a_journal_that_is_not_utf8_is_a_clear_error_in_every_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, command: str, journal_parser: str
) -> None:
    from posttrain_metrics.cli import main

    data, said = ENCODINGS[case]
    path = tmp_path / "journal.jsonl"
    path.write_bytes(data)
    argv = {"doctor": ["doctor", str(path)], "plot": ["plot", str(path), "-o", str(tmp_path / "p.png")],
            "export": ["export", str(path), "--to", "tensorboard", str(tmp_path / "tb"), "--quiet"]}[command]
    status = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    if said:
        assert status == 2 and said in err and str(path) in err, (status, err)
    else:  # a torn last line: skipped with a warning, the complete lines are used
        assert status in (0, 1) and "skipped a torn last line" in err, (status, err)
        assert len(read_journal(path).frames) == 3


def _strict_journal(tmp_path: Path, header_fields: Mapping[str, Any], frame_fields: Mapping[str, Any],
                    raw_frame: str | None = None) -> Path:
    import json

    header = {"format": "posttrain-metrics-journal", "version": 1, "kind": "header", "run_id": "strict01",
              "name": "strict", "created": 1.7e9, "adapters": ["grpo", "trainer"], "config": {}, **header_fields}
    good = {"kind": "frame", "run_id": "strict01", "step": 1, "phase": "train", "time": 1.7e9,
            "metrics": {"train/kl_max": 0.5}}
    bad = raw_frame if raw_frame is not None else json.dumps({**good, "step": 2, **frame_fields})
    path = tmp_path / "journal.jsonl"
    path.write_text(json.dumps(header) + "\n" + json.dumps(good) + "\n" + bad + "\n")
    return path


STRICT: dict[str, tuple[dict[str, Any], dict[str, Any], str | None, str]] = {
    # case: (header fields, frame fields, raw third line, what the error says)
    "step beyond 2**53": ({}, {"step": 2**53 + 1}, None, "beyond +/-2**53"),
    "step below -2**53": ({}, {"step": -(2**53) - 1}, None, "beyond +/-2**53"),
    "time infinite": ({}, {}, '{"kind":"frame","run_id":"strict01","step":2,"time":Infinity,"metrics":{}}',
                      "not a finite number"),
    "time NaN": ({}, {}, '{"kind":"frame","run_id":"strict01","step":2,"time":NaN,"metrics":{}}', "not a finite"),
    "time a string": ({}, {"time": "yesterday"}, None, "not a finite number"),
    "version true": ({"version": True}, {}, None, "journal format version True"),
    "version 1.0": ({"version": 1.0}, {}, None, "journal format version 1.0"),
    "string for a number": ({}, {"metrics": {"train/kl_max": "0.5"}}, None, "string where the catalogue declares"),
    "label outside the set": ({}, {"metrics": {"optim/update_outcome": "stepped"}}, None, "declared labels"),
    "number for a label": ({}, {"metrics": {"optim/update_outcome": 1}}, None, "declared labels"),
    "int metric beyond 2**53": ({}, {"metrics": {"train/kl_max": 2**60}}, None, "beyond +/-2**53"),
    # beyond 64 bits orjson reads an integer as a float: the reader must still see the integer
    "int metric beyond 2**64": ({}, {"metrics": {"train/kl_max": 2**64}}, None, "beyond +/-2**53"),
    "int metric below -2**63": ({}, {"metrics": {"train/kl_max": -(2**63) - 1}}, None, "beyond +/-2**53"),
    "step beyond 2**64": ({}, {"step": 2**64 + 1}, None, "beyond +/-2**53"),
    "created infinite": ({"created": 1e400}, {}, None, "created"),
}


@pytest.fixture(params=["orjson", "json"])
def journal_parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Journal readers parse frame lines with orjson when it is installed, else json: both are tested."""
    import posttrain_metrics.journal.format as journal_module

    if request.param == "json":
        monkeypatch.setattr(journal_module, "_orjson", None)
    else:
        assert journal_module._orjson is not None, "orjson is not installed; fix: pip install orjson"
    return str(request.param)


@pytest.mark.parametrize("case", list(STRICT))
def test_the_journal_reader_refuses_what_it_cannot_replay_faithfully(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, journal_parser: str
) -> None:
    from posttrain_metrics.cli import main

    header_fields, frame_fields, raw, said = STRICT[case]
    path = _strict_journal(tmp_path, header_fields, frame_fields, raw)
    with pytest.raises(MetricsError) as info:
        read_journal(path)
    assert said in str(info.value), str(info.value)
    if not header_fields:
        assert f"{path}:3" in str(info.value)  # names the line
    for argv in (["doctor", str(path)], ["export", str(path), "--to", "tensorboard", "--quiet"]):
        assert main(argv) == 2
        assert said in capsys.readouterr().err
    assert not (tmp_path / "tensorboard").exists()  # nothing exported from a journal refused


def test_an_mlflow_export_target_that_is_a_file_store_or_an_unknown_scheme_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from posttrain_metrics.cli import main

    path = tmp_path / "journal.jsonl"
    path.write_bytes(b"\n".join(_journal_lines()) + b"\n")
    for target, said in ((str(tmp_path / "mlruns"), "file store"), ("file:///tmp/mlruns", "file store"),
                         ("mlflw://host:5000", "unknown tracking URI scheme 'mlflw'"),
                         ("htp://alice:Pq42-in-uri@host", "unknown tracking URI scheme 'htp'")):
        assert main(["export", str(path), "--to", "mlflow", target, "--quiet"]) == 2
        err = capsys.readouterr().err
        assert said in err and "fix" in err and len(err.strip().splitlines()) == 1, err
        assert "Pq42-in-uri" not in err
    assert not (tmp_path / "mlruns").exists()


def test_export_to_a_dead_mlflow_server_fails_within_the_live_sinks_retries(tmp_path: Path) -> None:
    import subprocess

    from _mlflow_server import free_port

    path = tmp_path / "journal.jsonl"
    path.write_bytes(b"\n".join(_journal_lines()) + b"\n")
    target = f"http://alice:Pq43-dead@127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_HTTP_REQUEST")}
    # Today's default MLflow retries take about 4 minutes; the live sink's bound about 3 s. The
    # subprocess timeout only stops a hang: the assertions are on what the command says.
    done = subprocess.run([sys.executable, "-m", "posttrain_metrics.cli", "export", str(path), "--to", "mlflow",
                           target, "--quiet"], capture_output=True, text=True, timeout=150, env=env)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "did not answer" in lines[0] and "fix" in lines[0], done.stderr
    assert "Traceback" not in done.stderr and "Pq43-dead" not in done.stderr + done.stdout


@pytest.mark.parametrize(("argv", "said"), [
    (["demo", "--ranks", "0"], "less than 1"),
    (["demo", "--steps", "-3"], "less than 1"),
    (["demo", "--steps", "0"], "less than 1"),
    (["demo", "--ranks", "two"], "not a whole number"),
])
def test_bad_command_line_arguments_are_a_clear_error_with_exit_2(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from posttrain_metrics.cli import main

    try:
        status = main(argv)
    except SystemExit as exit_:  # argparse's own exit for a bad argument
        status = int(exit_.code or 0)
    err = capsys.readouterr().err
    assert status == 2 and said in err and "Traceback" not in err, (status, err)


def test_a_hostile_journal_header_costs_export_linear_time(tmp_path: Path) -> None:
    import json

    from posttrain_metrics.export import export

    def exported(size: int, name: str) -> float:
        folder = tmp_path / name
        folder.mkdir()
        header = {"format": "posttrain-metrics-journal", "version": 1, "kind": "header", "run_id": f"hdr{size}",
                  "name": "hostile", "created": 1.7e9, "adapters": ["grpo"],
                  "config": {"note": "a." * (size // 2), "cmd": "x://" * (size // 4)}}  # quadratic before
        frame = {"kind": "frame", "run_id": f"hdr{size}", "step": 1, "phase": "train", "time": 1.7e9,
                 "metrics": {"train/kl_max": 0.5}}
        (folder / "journal.jsonl").write_text(json.dumps(header) + "\n" + json.dumps(frame) + "\n")
        journal = read_journal(folder / "journal.jsonl")
        started = time.process_time()
        assert export(journal, "tensorboard", str(folder / "tb"), quiet=True) == 0
        return time.process_time() - started

    exported(100, "warm")  # imports and first-use costs out of the comparison
    small, large = exported(20_000, "small"), exported(200_000, "large")
    assert large / max(small, 1e-3) < 30, (small, large)  # 10x the header: about 10x at most, not 100x
    print(f"[figure] export of a journal with a 200 KB hostile header: {large:.2f} s CPU ({small:.2f} s for 20 KB)")


def test_a_phase_written_as_a_huge_number_reads_as_json_writes_it(tmp_path: Path, journal_parser: str) -> None:
    # orjson reads an integer beyond 64 bits as a float ("1e+20" once made a string); the reader must
    # give what json gives, whichever parser it uses, and so must the publisher's JournalTail
    from posttrain_metrics.journal import JournalTail

    path = _strict_journal(tmp_path, {}, {"phase": 10**20})
    assert [f.phase for f in read_journal(path).frames] == ["train", "100000000000000000000"]
    tail = [r.frame.phase for r in JournalTail(path).read() if r.frame is not None]
    assert tail == ["train", "100000000000000000000"]
