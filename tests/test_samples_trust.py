"""Sample completions, trust round 3 (issue 24, items 1-5): the sample is chosen over the whole batch
whatever its split across ranks, histogram counts agree with their published edges, a bad row on one
rank is a MetricsError on every rank with the ranks still in step, hostile values name their column,
and a user's own ``truncated`` column is kept.

Expected values come from an oracle written here from the documented rule (whole groups in the order
of sha256("<step>:<group as JSON>"), greedily while they fit), never from the code under test."""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
import random
from pathlib import Path
from typing import Any

import pytest
from _runs import gloo_rank, run_ranks
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain_metrics import MetricReducer, MetricsError
from posttrain_metrics.callbacks import MetricsCallback
from posttrain_metrics.callbacks.samples import select
from posttrain_metrics.integrations import MemorySink
from posttrain_metrics.journal.samples import Histogram

pytestmark = pytest.mark.timeout(300)


# -- the oracle -------------------------------------------------------------------------------------------


def _hash(step: int, key: list[Any]) -> str:
    return hashlib.sha256(f"{step}:{json.dumps(key)}".encode()).hexdigest()


def oracle_ids(step: int, rows: list[dict[str, Any]], limit: int) -> list[Any]:
    """The ``id`` of the rows the documented rule keeps from the whole batch ``rows``, in batch order."""
    groups: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        key = ["group", row["group"]] if row.get("group") is not None else ["row", i]
        groups.setdefault(json.dumps(key), []).append(i)
    kept: list[int] = []
    for key in sorted(groups, key=lambda k: _hash(step, json.loads(k))):
        if len(kept) + len(groups[key]) <= limit:
            kept += groups[key]
    return [rows[i]["id"] for i in sorted(kept)]


def step_where(order: list[str], start: int = 1) -> int:
    """The first step at which the groups named in ``order`` hash in that order."""
    step = start
    while [g for g in sorted(order, key=lambda g: _hash(step, ["group", g]))] != order:
        step += 1
    return step


def rows_of(spec: list[tuple[str, int]], rank: int) -> list[dict[str, Any]]:
    return [{"group": g, "id": f"{g}{rank}.{i}", "completion": f"{g} {i}", "reward": 1.0}
            for g, n in spec for i in range(n)]


def random_batch(seed: int, world: int) -> tuple[list[list[dict[str, Any]]], int, int]:
    """Rows of random groups (some without one) dealt to ``world`` ranks at random, a step, a limit."""
    rnd = random.Random(seed)
    rows: list[dict[str, Any]] = []
    for g in range(rnd.randint(0, 9)):
        group = rnd.choice([g, f"g{g}", None])
        rows += [{"group": group, "reward": rnd.random()} for _ in range(rnd.randint(1, 5))]
    rnd.shuffle(rows)
    split: list[list[dict[str, Any]]] = [[] for _ in range(world)]
    for row in rows:
        split[rnd.randrange(world)].append(row)
    for r, part in enumerate(split):
        for i, row in enumerate(part):
            row["id"] = f"{r}.{i}"
    return split, rnd.randint(0, 10**6), rnd.randint(0, 12)


# -- in process -------------------------------------------------------------------------------------------


def test_one_process_selection_follows_the_documented_rule() -> None:
    for seed in range(300):
        split, step, limit = random_batch(seed, 1)
        assert [r["id"] for r in select(step, split[0], limit=limit).rows] == oracle_ids(step, split[0], limit)


def test_a_value_on_an_interior_edge_goes_in_the_bin_that_edge_opens() -> None:
    h = Histogram.of([-1.0, -0.8, -0.8, 1.0], bins=20)
    assert h.edges[2] == -0.8  # the published edge
    assert h.counts == [1, 0, 2] + [0] * 16 + [1]


@settings(max_examples=400)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False) | st.sampled_from([-1.0, -0.8, -0.6, 0.0, 0.2, 0.7]),
                min_size=2, max_size=40))
def test_histogram_counts_agree_with_their_published_edges(values: list[float]) -> None:
    h = Histogram.of(values, bins=20)
    if len(h.edges) == 2:
        return
    want = [0] * 20
    for v in values:  # the bin whose edge is the last at or below v; the max closes the last bin
        want[min(bisect.bisect_right(h.edges, v) - 1, 19)] += 1
    assert h.counts == want


def test_interior_edges_over_random_inputs() -> None:
    rnd = random.Random(3)
    for _ in range(3000):
        low, width = rnd.uniform(-5, 5), rnd.uniform(0.01, 1.0)
        values = [low, low + 20 * width] + [low + rnd.randint(0, 20) * width for _ in range(6)]
        h = Histogram.of(values, bins=20)
        for v in values:  # each value is counted in the bin [edge_i, edge_i+1) that holds it
            i = max(i for i, e in enumerate(h.edges[:-1]) if e <= v)
            assert h.edges[i] <= v and (v < h.edges[i + 1] or i == 19)
        assert sum(h.counts) == len(values)
        assert h.counts == [sum(1 for v in values if max(i for i, e in enumerate(h.edges[:-1]) if e <= v) == b)
                            for b in range(20)]


def _cb() -> MetricsCallback:
    return MetricsCallback(adapters=["trainer"], sinks=[MemorySink()], publisher="inline", samples_per_step=8)


@pytest.mark.parametrize(("rows", "step", "names"), [
    ([{"reward": 10**400}], 1, ["'reward'", "2**53"]),
    ([{"reward": -(2**60)}], 1, ["'reward'", "2**53"]),
    ([{"reward": -1e308}, {"reward": 1e308}], 1, ["'reward'", "spans"]),
    ([{"reward": 1.0}], 20.7, ["step", "20.7"]),
    ([{"reward": 1.0}], "21", ["step", "'21'"]),
    ([{"reward": 1.0}], True, ["step", "bool"]),
    ([{"completion": b"bytes"}], 1, ["'completion'", "bytes"]),
])
def test_hostile_sample_values_are_a_metrics_error_naming_what(rows: list[dict[str, Any]], step: Any,
                                                                names: list[str]) -> None:
    with _cb() as cb, pytest.raises(MetricsError) as info:
        cb.on_samples(step, rows)
    assert all(n in str(info.value) for n in names), str(info.value)
    assert "fix" in str(info.value)


def test_a_tensor_of_two_elements_names_its_column() -> None:
    import torch

    with _cb() as cb, pytest.raises(MetricsError, match=r"column 'advantage'.*Tensor.*fix"):
        cb.on_samples(1, [{"advantage": torch.tensor([1.0, 2.0])}])


def test_rewards_spanning_beyond_float64_across_rows_are_refused_before_the_histogram() -> None:
    with pytest.raises(MetricsError, match="'reward'"):
        Histogram.of([-1.5e308, 1.5e308], column="reward")


def test_a_users_truncated_column_is_kept_as_passed() -> None:
    rows = [{"group": 0, "completion": "x" * 50, "truncated": True},
            {"group": 0, "completion": "short", "truncated": False}]
    with _cb() as cb:
        cb.sample_max_chars = 10
        got = cb.on_samples(1, rows)
    assert got is not None
    assert [r["truncated"] for r in got.rows] == [True, False]  # the rollout's own flag (hit max_new_tokens)
    assert got.columns[:2] == ["group", "completion"] and "truncated" in got.columns
    ours = [c for c in got.columns if c not in ("group", "completion", "truncated")]
    assert len(ours) == 1 and [r[ours[0]] for r in got.rows] == ["completion", ""]  # the sampler's own column
    assert got.table()[0][got.columns.index("truncated")] is True


def test_the_samplers_column_name_cannot_be_taken_by_a_user() -> None:
    with _cb() as cb:
        got = cb.on_samples(1, [{"completion": "x"}])
        assert got is not None
        ours = got.columns[-1]
        with pytest.raises(MetricsError, match="name your column otherwise"):
            cb.on_samples(2, [{"completion": "x", ours: "mine"}])


# -- real gloo ranks --------------------------------------------------------------------------------------


def _ids(got: Any) -> list[Any] | None:
    return None if got is None else [r["id"] for r in got.rows]


def _scenarios(rank: int, world: int, cb: MetricsCallback) -> dict[str, Any]:
    out: dict[str, Any] = {}
    cb.samples_per_step = 4
    if world == 2:
        step = step_where(["G", "X"])
        out["G_then_X"] = _ids(cb.on_samples(step, rows_of([("G", 3), ("X", 2)] if rank == 0 else [("G", 3), ("X", 1)], rank)))
        step = step_where(["A", "Y", "X"])
        out["A_Y_X"] = _ids(cb.on_samples(step, rows_of([("Y", 3), ("X", 2)] if rank == 0 else [("A", 2)], rank)))
    else:  # rank 0 alone would keep G (3 fits in 4) and drop X; over the batch G has 6 rows
        spec = [[("G", 3), ("X", 2)], [("G", 3)], [("X", 1)], []][rank]
        out["G_then_X"] = _ids(cb.on_samples(step_where(["G", "X"]), rows_of(spec, rank)))
    out["random"] = []
    for seed in range(12 if world == 2 else 6):
        split, step, limit = random_batch(seed, world)
        cb.samples_per_step = limit
        got = cb.on_samples(step, split[rank])
        out["random"].append((_ids(got), None if got is None else got.offered))
    return out


def _failures(rank: int, cb: MetricsCallback, reducer: MetricReducer) -> dict[str, Any]:
    out: dict[str, Any] = {}
    cb.samples_per_step = 8
    bad: list[Any] = [
        ("bytes", [{"completion": b"\x00bytes"}]),
        ("unreadable", [{"reward": _Unreadable()}]),
        ("huge", [{"reward": 10**400}]),
    ]
    for name, rows in bad:
        try:
            cb.on_samples(30, rows if rank == 1 else [{"completion": "fine", "reward": 0.5}])
            out[name] = "no error"
        except MetricsError as exc:
            out[name] = str(exc)
        reducer.add({"grad_norm": 1.0 + rank})
        out[f"{name} then reduce"] = reducer.reduce(31).metrics  # the collectives are still in step
        got = cb.on_samples(32, [{"id": rank, "completion": "ok"}])
        out[f"{name} then samples"] = _ids(got)
    try:
        cb.on_samples(20.7 if rank == 1 else 20, [])
        out["float step"] = "no error"
    except MetricsError as exc:
        out["float step"] = str(exc)
    got = cb.on_samples(33, [{"id": rank, "completion": "ok"}])
    out["float step then samples"] = _ids(got)
    return out


class _Unreadable:
    def item(self) -> float:
        raise RuntimeError("cannot read this value")


def _scenario(rank: int, world: int) -> dict[str, Any]:
    cb = MetricsCallback(adapters=["trainer"], sinks=[MemorySink()], publisher="inline")
    out = _scenarios(rank, world, cb)
    if world == 2:
        out.update(_failures(rank, cb, MetricReducer(["trainer"])))
    cb.on_run_end()
    return out


def _check_random(got: dict[int, dict[str, Any]], world: int) -> None:
    for seed, (ids, offered) in enumerate(got[0]["random"]):
        split, step, limit = random_batch(seed, world)
        union = [row for part in split for row in part]
        assert ids == oracle_ids(step, union, limit), seed  # the single-process selection of the union
        assert offered == len(union)
    for r in range(1, world):
        assert all(x == (None, None) for x in got[r]["random"])


def test_two_gloo_ranks_choose_over_the_whole_batch_and_fail_together(tmp_path: Path) -> None:
    got = run_ranks(functools.partial(gloo_rank, _scenario, world=2), tmp_path / "store")
    assert "crash" not in got[0] and "crash" not in got[1], got
    # G (3 + 3 rows) does not fit in 4 and is skipped; X (2 + 1 rows) fits: all three X rows.
    assert got[0]["G_then_X"] == ["X0.0", "X0.1", "X1.0"]
    # A (2) fits, Y (3) no longer does, X (2) does: {A, X} in batch order (rank 0's rows first).
    assert got[0]["A_Y_X"] == ["X0.0", "X0.1", "A1.0", "A1.1"]
    _check_random(got, 2)
    for rank in (0, 1):
        out = got[rank]
        assert "rank 1" in out["bytes"] and "'completion'" in out["bytes"] and "bytes" in out["bytes"]
        assert "rank 1" in out["unreadable"] and "'reward'" in out["unreadable"]
        assert "rank 1" in out["huge"] and "'reward'" in out["huge"]
        assert "rank 1" in out["float step"] and "20.7" in out["float step"]
        for name in ("bytes", "unreadable", "huge"):
            assert out[f"{name} then reduce"] == {"train/grad_norm": 1.5}  # (1.0 + 2.0) / 2: both ranks
    for name in ("bytes then samples", "unreadable then samples", "huge then samples", "float step then samples"):
        assert got[0][name] == [0, 1] and got[1][name] is None


def test_four_gloo_ranks_choose_as_one_process_would(tmp_path: Path) -> None:
    got = run_ranks(functools.partial(gloo_rank, _scenario, world=4), tmp_path / "store", world=4)
    assert all("crash" not in got[r] for r in range(4)), got
    assert got[0]["G_then_X"] == ["X0.0", "X0.1", "X2.0"]
    _check_random(got, 4)


@settings(max_examples=300)
@given(st.lists(st.tuples(st.one_of(st.none(), st.integers(0, 6), st.sampled_from(["a", "b"])), st.integers(0, 4)),
                max_size=30),
       st.integers(1, 5), st.integers(0, 10**6), st.integers(0, 14))
def test_the_split_never_changes_the_sample(dealt: list[tuple[Any, int]], world: int, step: int, limit: int) -> None:
    """Rows (group, rank) dealt at random to ``world`` simulated ranks: each rank's offer, then the
    shared decision (the very functions on_samples runs on real ranks), equal the oracle over the
    union in rank order."""
    from posttrain_metrics.callbacks.samples import kept_rows, offer, settle

    split: list[list[dict[str, Any]]] = [[] for _ in range(world)]
    for i, (group, rank) in enumerate(dealt):
        split[rank % world].append({"group": group, "id": i})
    offers = [offer(step, part) for part in split]
    _, kept = settle([o for o, _, _ in offers], limit)
    starts = [sum(o.rows for o, _, _ in offers[:r]) for r in range(world)]
    chosen = [row["id"] for r, (_, mine, _) in enumerate(offers) for row in kept_rows(mine, kept, starts[r])]
    assert chosen == oracle_ids(step, [row for part in split for row in part], limit)
