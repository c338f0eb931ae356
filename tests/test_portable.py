"""The portable window state: exported by workers, merged on a driver, equal to reduce_metrics.

A single controller (a Ray driver) receives one exported state per worker. These tests pin that
merging them gives exactly the frame ``reduce_metrics`` gives on the same chunks, that a state is
small and independent of the number of chunks, that producer bugs are raised on the driver naming
the worker, and that a corrupted or hostile state is refused with a clear ``MetricsError``.
"""

from __future__ import annotations

import base64
import copy
import json
import math
import random
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest
import torch
from test_reduction_oracle import KINDS, UNEVEN, adapter_for, toy_chunks

from posttrain_metrics import Metric, MetricAdapter, MetricsError, Reduction, get_adapter, reduce_metrics
from posttrain_metrics.core import portable
from posttrain_metrics.core.layout import PackedState
from posttrain_metrics.core.portable import FORMAT, VERSION, DriverReducer, WorkerMetrics, merge_exported

R = Reduction
GRPO_STEP = ["grpo", "reward", "trainer"]
STAGES = MetricAdapter(
    "stages",
    internal_prefix="stage_",
    metrics=[
        Metric("stage_rollout_s", R.MEAN, "Wall time of the rollout stage", namespace="timer", unit="s"),
        Metric("stage_sync_s", R.MAX, "Wall time of the weight sync", namespace="timer", unit="s"),
    ],
)
"""A small user adapter: grpo + reward + trainer declare 61 keys, with this one 63 (about sixty)."""
SIXTY = [*(get_adapter(n) for n in GRPO_STEP), STAGES]
GAP = {
    "grpo_logprob_gap_mean": 0.05,
    "grpo_mean_rank_logprob_gap_p99": 0.4,
    "grpo_logprob_gap_gt0p5_frac": 0.001,
    "grpo_logprob_gap_token_count": 800,
}


def full_chunk(adapters: Sequence[MetricAdapter], rng: random.Random, *, last: bool) -> dict[str, Any]:
    """One chunk carrying every declared key with a nonzero value (weights and counts >= 1)."""
    chunk: dict[str, Any] = {}
    for adapter in adapters:
        for source, metric in adapter.metrics.items():
            r = metric.reduction
            if r is R.SUM:
                chunk[source] = rng.randint(1, 3000)
            elif r is R.CATEGORICAL:
                chunk[source] = metric.labels[1] if last else metric.labels[0]
            elif r is R.AGREED:
                chunk[source] = 40 + rng.randint(1, 9) * (not last)  # ranks end on the same counter
            elif r is R.POOLED_STD:
                chunk[source] = rng.uniform(0.1, 1.0)
            elif source in adapter.counts:
                chunk[source] = rng.randint(1, 30)
            else:
                chunk[source] = rng.uniform(0.1, 3.0) * rng.choice([-1, 1])
    return chunk


def windows(adapters: Sequence[MetricAdapter], layout: Sequence[int], seed: int) -> list[list[dict[str, Any]]]:
    rng = random.Random(seed)
    return [[full_chunk(adapters, rng, last=c == n - 1) for c in range(n)] for n in layout]


def export(
    adapters: Any, chunks: Sequence[Mapping[str, Any]], worker: str, step: int = 7, phase: str = "train"
) -> dict[str, Any]:
    w = WorkerMetrics(adapters, worker_id=worker)
    for chunk in chunks:
        w.add(chunk)
    return w.export(step, phase=phase)


def export_all(adapters: Any, data: Sequence[Sequence[Mapping[str, Any]]], step: int = 7) -> list[dict[str, Any]]:
    return [export(adapters, chunks, f"actor-{i}", step) for i, chunks in enumerate(data)]


def same(actual: Mapping[str, Any], expected: Mapping[str, Any]) -> None:
    """Exactly the same figures: keys, types and values, NaN equal to NaN and -0.0 apart from 0.0."""
    assert list(actual) == list(expected)
    for key, want in expected.items():
        got = actual[key]
        assert type(got) is type(want), f"{key}: {got!r} vs {want!r}"
        if isinstance(want, float) and math.isnan(want):
            assert math.isnan(got), f"{key}: {got!r} vs nan"
        else:
            assert got == want, f"{key}: {got!r} vs {want!r}"
            if isinstance(want, float):
                assert math.copysign(1.0, got) == math.copysign(1.0, want), f"{key}: {got!r} vs {want!r}"


# -- the driver's frame is reduce_metrics' frame -----------------------------------------------------------


@pytest.mark.parametrize("layout", [(3, 1), (3, 1, 0, 2), (1,), (5, 0, 2, 1, 4, 1, 3, 2), (0, 4)])
def test_merged_states_equal_reduce_metrics_on_uneven_grpo_windows(layout: tuple[int, ...]) -> None:
    data = windows(SIXTY, layout, seed=len(layout))
    snapshot = copy.deepcopy(data)
    expected = reduce_metrics(SIXTY, data)
    assert len(expected) == 63  # every declared key is published
    frame = merge_exported(SIXTY, export_all(SIXTY, data))
    assert frame.metrics == expected
    same(frame.metrics, expected)
    assert (frame.step, frame.phase) == (7, "train")
    assert data == snapshot, "export or merge mutated the chunks"


def test_tensors_on_workers_and_json_on_the_wire_change_nothing() -> None:
    data = windows(SIXTY, (3, 1, 0, 2), seed=11)
    expected = reduce_metrics(SIXTY, data)
    states = []
    for i, chunks in enumerate(data):
        as_tensors = [
            {k: torch.tensor(v, dtype=torch.float64 if isinstance(v, float) else torch.int64)
             if isinstance(v, (int, float)) and not isinstance(v, bool) and j % 2 else v
             for j, (k, v) in enumerate(chunk.items())}
            for chunk in chunks
        ]
        states.append(json.dumps(export(SIXTY, as_tensors, f"actor-{i}")))  # JSON text, as sent over HTTP
    same(merge_exported(SIXTY, states).metrics, expected)
    same(merge_exported(SIXTY, [json.loads(s) for s in states]).metrics, expected)


@pytest.mark.parametrize(
    ("reduction", "kind"), [(r, k) for r, kinds in KINDS.items() for k in kinds], ids=lambda x: getattr(x, "name", x)
)
def test_every_reduction_survives_the_trip(reduction: Reduction, kind: str) -> None:
    adapter = adapter_for(reduction)
    for layout in UNEVEN:
        for seed in range(3):
            data = toy_chunks(reduction, layout, kind, seed)
            same(merge_exported([adapter], export_all([adapter], data)).metrics, reduce_metrics([adapter], data))


def test_non_finite_values_and_negative_zero_travel_bit_exact() -> None:
    data = [
        [{"grpo_kl_max": math.inf, "grad_norm": -0.0, "grpo_loss": math.nan, "grpo_weight_sum": 3}],
        [{"grpo_kl_max": 1.0, "grad_norm": -0.0, "grpo_loss": 1.0, "grpo_weight_sum": 0}],
        [{"grpo_kl_max": 2.0, "grpo_response_len_max": math.nan, "e2e_step_s": -math.inf}],
    ]
    expected = reduce_metrics(GRPO_STEP, data)
    assert math.isnan(expected["train/loss_avg"]) and expected["train/kl_max"] == math.inf
    states = export_all(GRPO_STEP, data)
    same(merge_exported(GRPO_STEP, [json.loads(json.dumps(s, allow_nan=False)) for s in states]).metrics, expected)


def test_val_phase_and_driver_reducer_reuse() -> None:
    driver = DriverReducer(["dpo"])
    for step in (1, 2):
        data = [[{"dpo_loss": step * 0.5, "dpo_accuracy": 0.75, "dpo_weight_sum": 8}], [{"dpo_loss": 1.0}]]
        states = [export("dpo", chunks, f"w{i}", step, "val") for i, chunks in enumerate(data)]
        frame = driver.merge(states, step=step, phase="val")
        assert (frame.step, frame.phase) == (step, "val")
        same(frame.metrics, reduce_metrics("dpo", data, phase="val"))


def test_export_ends_the_window() -> None:
    w = WorkerMetrics(GRPO_STEP, worker_id="actor-0")
    w.add({"grpo_kl_max": 5.0})
    w.add({"grpo_kl_max": 1.0})
    assert w.pending_chunks == 2
    first = w.export(1)
    assert w.pending_chunks == 0
    w.add({"grpo_kl_max": 2.0})
    assert merge_exported(GRPO_STEP, [first]).metrics == {"train/kl_max": 5.0}
    assert merge_exported(GRPO_STEP, [w.export(2)]).metrics == {"train/kl_max": 2.0}
    assert merge_exported(GRPO_STEP, [w.export(3)]).metrics == {}  # an empty window: absent, not zero


# -- compact ---------------------------------------------------------------------------------------------


def json_size(state: Mapping[str, Any]) -> int:
    return len(json.dumps(state).encode())


def test_sixty_key_state_is_under_4kb_and_independent_of_chunks() -> None:
    assert sum(len(a.metrics) for a in SIXTY) == 63
    sizes = {}
    for n_chunks in (1, 64):
        state = export(SIXTY, windows(SIXTY, (n_chunks,), seed=n_chunks)[0], "actor-0")
        sizes[n_chunks] = json_size(state)
        assert all(type(v) in (str, int, list) for v in state.values())  # plain data, no pickle
    assert sizes[1] == sizes[64] < 4096, sizes
    # Whatever the data, the size is bounded by the layout alone: every slot set.
    layout = WorkerMetrics(SIXTY).layout
    every_slot = base64.b64encode(b"\0" * 8 * (layout.sum_size + layout.max_size))
    header = json_size({**state, "values": ""})
    assert header + len(every_slot) < 4096


def test_state_size_does_not_grow_with_workers_or_tokens() -> None:
    small = export(SIXTY, windows(SIXTY, (4,), seed=1)[0], "actor-0")
    big = [{k: (v * 10**6 if isinstance(v, int) and not isinstance(v, bool) else v) for k, v in c.items()}
           for c in windows(SIXTY, (4,), seed=1)[0]]
    assert json_size(export(SIXTY, big, "actor-0")) == json_size(small)  # token counts are values, not items


def test_an_idle_worker_sends_almost_nothing() -> None:
    assert json_size(export(SIXTY, [], "actor-7")) < 400


def test_exported_state_example_fields() -> None:
    state = export("grpo", [{"grpo_kl_max": 1.5}], "actor-3", step=12)
    assert state["format"] == FORMAT and state["version"] == VERSION == 2
    assert (state["worker"], state["step"], state["phase"], state["adapters"]) == ("actor-3", 12, "train", ["grpo"])
    assert len(state["layout"]) == 13 and int(state["layout"], 16) >= 0
    assert state["errors"] == []
    n_set = sum(bin(b).count("1") for b in base64.b64decode(state["mask"]))
    values = struct.unpack(f"<{n_set}d", base64.b64decode(state["values"]))
    # SUM: ranks active, kl_max present, kl_max contributions (the chunk carries no completion
    # tokens, so it is not part of the gap family's batch); MAX: step, -step, phase, -phase, kl_max, its type
    assert values == (1.0, 1.0, 1.0, 12.0, -12.0, 0.0, -0.0, 1.5, 2.0)


# -- producer bugs on the driver, naming the worker ---------------------------------------------------------


def raises(states: Sequence[Any], *needles: str, adapters: Any = GRPO_STEP, **kwargs: Any) -> str:
    with pytest.raises(MetricsError) as info:
        merge_exported(adapters, states, **kwargs)
    message = str(info.value)
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"
    return message


OK_CHUNK = {"grpo_clip_frac": 0.1, "grpo_valid_token_count": 900, **GAP}


def test_worker_with_mismatched_adapters_is_named() -> None:
    states = [export(GRPO_STEP, [OK_CHUNK], "actor-0"), export(["grpo", "trainer"], [OK_CHUNK], "actor-1")]
    raises(states, "worker 'actor-1'", "['grpo', 'trainer']", "['grpo', 'reward', 'trainer']", "same adapters")
    reordered = export(["grpo", "trainer", "reward"], [OK_CHUNK], "actor-2")
    raises([states[0], reordered], "worker 'actor-2'", "in the same order")


def test_same_adapter_name_with_other_declarations_is_named() -> None:
    changed = MetricAdapter("stages", internal_prefix="stage_", metrics=[
        Metric("stage_rollout_s", R.MAX, "changed reduction", namespace="timer", unit="s"),
        Metric("stage_sync_s", R.MAX, "Wall time of the weight sync", namespace="timer", unit="s"),
    ])
    states = [export(SIXTY, [], "actor-0"), export([*SIXTY[:3], changed], [], "actor-1")]
    raises(states, "worker 'actor-1'", "different declarations", adapters=SIXTY)


def test_partial_logprob_gap_record_names_the_worker() -> None:
    partial = {"grpo_clip_frac": 0.1, "grpo_valid_token_count": 900, "grpo_logprob_gap_mean": 0.05}
    states = [export(GRPO_STEP, [OK_CHUNK], "actor-0"), export(GRPO_STEP, [OK_CHUNK, partial], "actor-1"),
              export(GRPO_STEP, [OK_CHUNK], "actor-2")]
    raises(states, "worker 'actor-1' (state 2 of 3)", "grpo_logprob_gap_mean", "chunk 1", "all together")


def test_logprob_gap_family_on_some_workers_only_names_them() -> None:
    bare = {"grpo_clip_frac": 0.1, "grpo_valid_token_count": 900}
    states = [export(GRPO_STEP, [OK_CHUNK], "actor-0"), export(GRPO_STEP, [bare], "actor-1"),
              export(GRPO_STEP, [{"reward_max": 1.0}], "actor-2")]  # no grpo keys: not expected to carry it
    message = raises(states, "logprob_gap", "['actor-0']", "['actor-1']")
    assert "actor-2" not in message


def test_unknown_key_and_bad_value_name_the_workers() -> None:
    states = [export(GRPO_STEP, [{"grpo_kl_maximum": 2.0}], "actor-0"),
              export(GRPO_STEP, [{"grpo_kl_max": "nan?"}], "actor-1")]
    raises(states, "worker 'actor-1'", "grpo_kl_max", "2 workers reported errors: ['actor-0', 'actor-1']")
    raises(states[:1], "worker 'actor-0'", "'grpo_kl_maximum' is not declared")


def test_label_disagreement_names_the_workers() -> None:
    states = [export(GRPO_STEP, [{"update_outcome": "accumulating"}, {"update_outcome": "applied"}], f"actor-{i}")
              for i in range(2)]
    states.append(export(GRPO_STEP, [{"update_outcome": "skipped"}], "actor-2"))
    raises(states, "update_outcome", "'applied' from workers ['actor-0', 'actor-1']", "'skipped' from workers ['actor-2']")


def test_steps_phases_and_duplicates_name_the_workers() -> None:
    a, b = export(GRPO_STEP, [OK_CHUNK], "actor-0", step=3), export(GRPO_STEP, [OK_CHUNK], "actor-1", step=4)
    raises([a, b], "different steps", "step 3 from workers ['actor-0']", "step 4 from workers ['actor-1']")
    raises([a], "merges step 5", "step 3 from workers ['actor-0']", step=5)
    raises([a], "merges phase 'val'", phase="val")
    raises([a, copy.deepcopy(a)], "worker 'actor-0' sent states 1 and 2")


# -- untrusted input ----------------------------------------------------------------------------------------


def good() -> dict[str, Any]:
    return export(GRPO_STEP, [OK_CHUNK, {"grpo_kl_max": 2.0, "update_outcome": "applied", **GAP}], "actor-0", step=7)


def buffers(state: Mapping[str, Any]) -> PackedState:
    """The packed state of an exported dict (decoded by the driver's own code)."""
    driver = DriverReducer(GRPO_STEP)
    return PackedState(*driver._buffers(state["mask"], state["values"], "test"))


def reencode(state: Mapping[str, Any], edit: Callable[[PackedState], None]) -> dict[str, Any]:
    packed = buffers(state)
    edit(packed)
    layout = DriverReducer(GRPO_STEP).layout
    out = portable._encode(layout, packed, worker=state["worker"], step=state["step"], phase=state["phase"])
    return {**out, "errors": state["errors"]}


def _set(field: str, value: Any) -> Callable[[dict[str, Any]], Any]:
    def edit(state: dict[str, Any]) -> Any:
        state[field] = value
        return state
    return edit


LAYOUT = DriverReducer(GRPO_STEP).layout
PRESENCE = LAYOUT.keys["grpo_kl_max"].s
HOSTILE: dict[str, tuple[Callable[[dict[str, Any]], Any], str]] = {
    "not a dict": (lambda s: [s], "is a list, not a window state"),
    "None": (lambda s: None, "NoneType"),
    "not JSON": (lambda s: "{not json", "not valid JSON"),
    "huge text": (lambda s: " " * (5 * 2**20), "bytes of text"),
    "deep JSON": (lambda s: "[" * 100_000 + "]" * 100_000, "not valid JSON"),
    "other format": (_set("format", "other/thing"), "not a posttrain-metrics window state"),
    "no format": (lambda s: {k: v for k, v in s.items() if k != "format"}, "not a posttrain-metrics window state"),
    "newer version": (_set("version", 3), "format version 3"),
    "bool version": (_set("version", True), "format version True"),
    "no worker": (_set("worker", None), "no valid worker id"),
    "empty worker": (_set("worker", ""), "no valid worker id"),
    "long worker": (_set("worker", "w" * 500), "no valid worker id"),
    "control chars in worker": (_set("worker", "a\x1b[2Jb"), "no valid worker id"),
    "extra field": (_set("pickle", "gASVAAAA"), "unknown fields ['pickle']"),
    "missing field": (lambda s: {k: v for k, v in s.items() if k != "mask"}, "missing fields ['mask']"),
    "adapters not a list": (_set("adapters", "grpo"), "'adapters' must be a list"),
    "other layout": (_set("layout", "0000000000000"), "cannot be merged"),
    "layout not text": (_set("layout", 12), "cannot be merged"),
    "wrong slots": (_set("slots", [10**12, 5]), "'slots' is"),
    "float step": (_set("step", 7.0), "'step' must be an int"),
    "bool step": (_set("step", True), "'step' must be an int"),
    "huge step": (_set("step", 2**60), "'step' must be an int"),
    "bad phase": (_set("phase", "test"), "'phase' 'test' is not one of"),
    "short mask": (lambda s: {**s, "mask": s["mask"][:-4]}, "'mask' must be"),
    "mask not text": (_set("mask", [1, 2]), "'mask' must be"),
    "mask not base64": (lambda s: {**s, "mask": "!" * len(s["mask"])}, "not valid base64"),
    "mask padding bits": (
        lambda s: {**s, "mask": base64.b64encode(base64.b64decode(s["mask"])[:-1] + b"\xff").decode()},
        "does not cover exactly",
    ),
    "short values": (lambda s: {**s, "values": s["values"][:-8]}, "'values' must be"),
    "values not base64": (lambda s: {**s, "values": "*" * len(s["values"])}, "not valid base64"),
    "header step differs from buffers": (_set("step", 8), "step or phase differ"),
    "header phase differs from buffers": (_set("phase", "val"), "step or phase differ"),
    "NaN in MAX buffer": (lambda s: reencode(s, lambda p: p.max.__setitem__(-1, math.nan)), "NaN in the MAX"),
    "presence flag 7": (lambda s: reencode(s, lambda p: p.sum.__setitem__(PRESENCE, 7.0)), "not 0 or 1"),
    "two labels": (
        lambda s: reencode(s, lambda p: p.sum.__setitem__(LAYOUT.keys["update_outcome"].s + 1, 1.0)),
        "more than one label",
    ),
    "error slots without errors": (
        lambda s: reencode(s, lambda p: p.sum.__setitem__(LAYOUT.ERROR_RANKS, 1.0)),
        "error slots that disagree",
    ),
    "errors not a list": (_set("errors", {"1": "x"}), "'errors' must be a list"),
    "error bad code": (_set("errors", [[99, 0, "x"]]), "is not [code"),
    "error bool code": (_set("errors", [[True, 0, "x"]]), "is not [code"),
    "error list code": (_set("errors", [[[1], 0, "x"]]), "is not [code"),
    "error key out of range": (_set("errors", [[1, 10**6, "x"]]), "is not [code"),
    "error not a triple": (_set("errors", [[1, 0]]), "is not [code"),
    "errors not in the buffers": (_set("errors", [[1, 0, "made up"]]), "error slots that disagree"),
    "too many errors": (_set("errors", [[1, 0, "x"]] * 10_000), "at most"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_corrupted_or_hostile_state_is_refused_clearly(case: str) -> None:
    edit, needle = HOSTILE[case]
    healthy = export(GRPO_STEP, [OK_CHUNK], "actor-1", step=7)
    message = raises([healthy, edit(good())], needle)
    assert "state 2 of 2" in message, message
    if "worker id" not in message and "window state" not in message and "JSON" not in message and "text" not in message:
        assert "worker 'actor-0'" in message, message


def test_driver_errors_from_a_worker_are_printable_and_bounded() -> None:
    state = export(GRPO_STEP, [{"grpo_kl_maximum": 1.0}], "actor-0")
    code, index, _ = state["errors"][0]
    state["errors"] = [[code, index, "evil\x1b[2J" + "x" * 10_000]]
    message = raises([state], "worker 'actor-0'", "evil?[2J")
    assert len(message) < 3000


def test_states_argument_is_checked() -> None:
    raises([], "no worker states")
    raises(good(), "must be a list")  # type: ignore[arg-type]
    raises(json.dumps(good()), "must be a list")  # type: ignore[arg-type]


def test_worker_side_misuse_fails_at_once() -> None:
    with pytest.raises(MetricsError, match="worker_id"):
        WorkerMetrics("grpo", worker_id="")
    w = WorkerMetrics("grpo")
    assert ":" in w.worker_id  # host:pid by default
    with pytest.raises(MetricsError, match="mapping"):
        w.add([("grpo_kl_max", 1.0)])  # type: ignore[arg-type]
    with pytest.raises(MetricsError, match="source names must be strings"):
        w.add({1: 1.0})  # type: ignore[dict-item]
    with pytest.raises(MetricsError, match="phase"):
        w.export(1, phase="eval")
    with pytest.raises(MetricsError, match="step"):
        w.export(1.5)  # type: ignore[arg-type]
    assert w.export(torch.tensor(3))["step"] == 3  # type: ignore[arg-type]
