"""Every reduction against a plain single-process oracle, over uneven chunks and ranks.

The oracle below is deliberately naive: it walks the flat list of contributions of every chunk of
every rank and applies the architecture's pinned semantics directly (two-pass population std, last
value per rank, ...). Nothing in it shares code with the packed layout it checks.
"""

from __future__ import annotations

import copy
import math
import random
import zlib
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from posttrain_metrics import (
    Metric,
    MetricAdapter,
    MetricReducer,
    MetricsError,
    Reduction,
    get_adapter,
    reduce_metrics,
)

R = Reduction
REL, ABS = 1e-9, 1e-12

Chunks = Sequence[Sequence[Mapping[str, Any]]]


# -- the oracle -----------------------------------------------------------------------------------


class OracleDisagreement(Exception):
    """Ranks disagree on a categorical label: the library must raise MetricsError."""


def _is_int(v: Any) -> bool:
    return isinstance(v, int)  # bools included


def _widest(values: Sequence[Any], result: Any) -> Any:
    """``result`` typed as the widest input: bool < int < float."""
    if all(isinstance(v, bool) for v in values):
        return bool(result)
    if all(_is_int(v) for v in values):
        return int(result)
    return float(result)


def oracle(adapters: Sequence[MetricAdapter], per_rank_chunks: Chunks, phase: str = "train") -> dict[str, Any]:
    flat = [(rank, chunk) for rank, chunks in enumerate(per_rank_chunks) for chunk in chunks]
    out: dict[str, Any] = {}
    for adapter in adapters:
        for source, metric in adapter.metrics.items():
            seen = [(rank, chunk) for rank, chunk in flat if source in chunk]
            if not seen:
                continue  # absent everywhere: absent, not zero
            key = f"{metric.namespace or phase}/{metric.leaf}"
            values = [chunk[source] for _, chunk in seen]
            weight = adapter.source_of_leaf(metric.weight) if metric.weight else None
            r = metric.reduction
            if r is R.WEIGHTED_MEAN:
                assert weight is not None
                pairs = [(chunk[source], chunk[weight]) for _, chunk in seen if chunk[weight] > 0]
                total = sum(w for _, w in pairs)
                out[key] = sum(v * w for v, w in pairs) / total if total > 0 else 0.0
            elif r is R.SUM:
                out[key] = int(sum(values)) if all(_is_int(v) for v in values) else float(sum(values))
            elif r in (R.MAX, R.MIN):
                if weight:  # a contribution that counted nothing holds no extremum
                    values = [chunk[source] for _, chunk in seen if chunk.get(weight, 1) != 0]
                    if not values:
                        continue
                if any(isinstance(v, float) and math.isnan(v) for v in values):
                    out[key] = math.nan
                else:
                    out[key] = _widest(values, max(values) if r is R.MAX else min(values))
            elif r is R.MEAN:
                out[key] = sum(values) / len(values)
            elif r is R.LAST:
                last = {rank: chunk[source] for rank, chunk in seen}  # later chunks overwrite
                per_rank = list(last.values())
                if all(v == per_rank[0] for v in per_rank):
                    out[key] = _widest(per_rank, per_rank[0])
                else:
                    out[key] = sum(float(v) for v in per_rank) / len(per_rank)
            elif r is R.AGREED:
                last = {rank: chunk[source] for rank, chunk in seen}
                per_rank = list(last.values())
                if any(v != per_rank[0] for v in per_rank):
                    raise OracleDisagreement(key)
                out[key] = _widest(per_rank, per_rank[0])
            elif r is R.POOLED_STD:
                assert metric.mean is not None
                mean_source = adapter.source_of_leaf(metric.mean)
                if metric.second_moment:  # std^2 = E[x^2] - E[x]^2 over the same contributions
                    moment = adapter.source_of_leaf(metric.second_moment)
                    e_x = sum(chunk[mean_source] for _, chunk in seen) / len(seen)
                    e_x2 = sum(chunk[moment] for _, chunk in seen) / len(seen)
                    out[key] = math.sqrt(max(e_x2 - e_x * e_x, 0.0))
                    continue
                triples = [
                    (chunk[mean_source], chunk[source], chunk[weight] if weight else 1)
                    for _, chunk in seen
                ]
                triples = [t for t in triples if t[2] > 0]
                n_total = sum(n for _, _, n in triples)
                if n_total == 0:
                    out[key] = 0.0
                    continue
                mu = sum(n * m for m, _, n in triples) / n_total
                var = sum(n * (s * s + (m - mu) ** 2) for m, s, n in triples) / n_total
                out[key] = math.sqrt(var)
            elif r is R.CATEGORICAL:
                last = {rank: chunk[source] for rank, chunk in seen}
                labels = set(last.values())
                if len(labels) > 1:
                    raise OracleDisagreement(key)
                out[key] = labels.pop()
            else:  # pragma: no cover - a new Reduction member must get an oracle
                raise AssertionError(f"no oracle for {r}")
    return out


def assert_matches(actual: Mapping[str, Any], expected: Mapping[str, Any]) -> None:
    assert sorted(actual) == sorted(expected), (
        f"missing {sorted(set(expected) - set(actual))}, unexpected {sorted(set(actual) - set(expected))}"
    )
    for key, want in expected.items():
        got = actual[key]
        assert type(got) is type(want), f"{key}: got {got!r} ({type(got).__name__}), want {want!r}"
        if isinstance(want, float):
            assert math.isclose(got, want, rel_tol=REL, abs_tol=ABS), f"{key}: got {got!r}, want {want!r}"
        else:
            assert got == want, f"{key}: got {got!r}, want {want!r}"


def check(adapters: Sequence[MetricAdapter | str], per_rank_chunks: Chunks, phase: str = "train") -> dict[str, Any]:
    resolved = [get_adapter(a) if isinstance(a, str) else a for a in adapters]
    snapshot = copy.deepcopy(per_rank_chunks)
    expected = oracle(resolved, per_rank_chunks, phase)
    actual = reduce_metrics(list(adapters), per_rank_chunks, phase=phase)
    assert per_rank_chunks == snapshot, "reduce_metrics mutated its input"
    assert_matches(actual, expected)
    return actual


# -- one adapter per reduction ----------------------------------------------------------------------

UNEVEN = [(3, 1, 0), (1, 4), (0, 2, 1, 5), (2,)]
"""Chunks per rank: rank 0 with 3 chunks, rank 1 with 1, rank 2 with none, and so on."""


def adapter_for(reduction: Reduction, *, counted: bool = True) -> MetricAdapter:
    """A toy adapter whose key ``t_x`` has ``reduction`` (with the partners it needs)."""
    metrics = [Metric("n", R.SUM, "A count, the weight of weighted keys")]
    if reduction is R.WEIGHTED_MEAN:
        metrics.append(Metric("x", reduction, "weighted", weight="n"))
    elif reduction is R.POOLED_STD:
        metrics.append(Metric("mu", R.WEIGHTED_MEAN if counted else R.MEAN, "mean", weight="n" if counted else None))
        metrics.append(Metric("x", reduction, "pooled", weight="n" if counted else None, mean="mu"))
    elif reduction is R.CATEGORICAL:
        metrics.append(Metric("x", reduction, "label", labels=("red", "green", "blue")))
    elif reduction in (R.MAX, R.MIN) and counted:
        metrics.append(Metric("x", reduction, reduction.name, weight="n"))
    else:
        metrics.append(Metric("x", reduction, reduction.name))
    metrics.append(Metric("never", reduction if reduction is R.SUM else R.MEAN, "reported by nobody"))
    return MetricAdapter(f"toy_{reduction.value}", internal_prefix="t_", metrics=metrics)


def _value(kind: str, rng: random.Random) -> Any:
    if kind == "float":
        return rng.uniform(-50.0, 50.0)
    if kind == "int":
        return rng.randint(-1000, 1000)
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "mixed":
        return rng.choice([rng.randint(-9, 9), rng.uniform(-9, 9), rng.random() < 0.5])
    raise AssertionError(kind)


def toy_chunks(reduction: Reduction, layout: Sequence[int], kind: str, seed: int, *, counted: bool = True) -> list[list[dict[str, Any]]]:
    """Uneven chunks for :func:`adapter_for`; some chunks omit ``t_x`` (and carry only the count)."""
    rng = random.Random(seed)
    out: list[list[dict[str, Any]]] = []
    label = rng.choice(["red", "green", "blue"])  # the window's final label, the same on every rank
    agreed = _value(kind, rng) if kind != "label" else 0  # the window's exact counter, the same on every rank
    for n_chunks in layout:
        chunks = []
        for c in range(n_chunks):
            chunk: dict[str, Any] = {"t_n": rng.choice([0, 1, 7, rng.randint(0, 500)])}
            last = c == n_chunks - 1
            if rng.random() < 0.2 and not last:
                chunks.append(chunk)  # a chunk without the key
                continue
            if reduction is R.CATEGORICAL:
                chunk["t_x"] = label if last else rng.choice(["red", "green", "blue"])
            elif reduction is R.AGREED:  # identical on every rank at the window's last chunk
                chunk["t_x"] = agreed if last else _value(kind, rng)
            elif reduction is R.POOLED_STD:
                chunk["t_mu"] = rng.uniform(-3.0, 3.0)
                chunk["t_x"] = rng.choice([0.0, rng.uniform(0.0, 2.0)])
            elif reduction is R.WEIGHTED_MEAN:
                chunk["t_x"] = rng.uniform(-5.0, 5.0)
            else:
                chunk["t_x"] = _value(kind, rng)
            chunks.append(chunk)
        out.append(chunks)
    return out


KINDS = {
    R.WEIGHTED_MEAN: ["float"],
    R.SUM: ["float", "int", "bool", "mixed"],
    R.MAX: ["float", "int", "bool", "mixed"],
    R.MIN: ["float", "int", "bool", "mixed"],
    R.MEAN: ["float", "int", "mixed"],
    R.LAST: ["float", "int", "bool", "mixed"],
    R.AGREED: ["float", "int", "bool", "mixed"],
    R.POOLED_STD: ["float"],
    R.CATEGORICAL: ["label"],
}

CASES = [
    pytest.param(reduction, kind, layout, seed, id=f"{reduction.name}-{kind}-{'.'.join(map(str, layout))}-{seed}")
    for reduction, kinds in KINDS.items()
    for kind in kinds
    for layout in UNEVEN
    for seed in range(3)
]


def test_every_reduction_has_oracle_cases() -> None:
    assert set(KINDS) == set(Reduction)


@pytest.mark.parametrize(("reduction", "kind", "layout", "seed"), CASES)
def test_reduction_matches_oracle(reduction: Reduction, kind: str, layout: tuple[int, ...], seed: int) -> None:
    adapter = adapter_for(reduction)
    data = toy_chunks(reduction, layout, kind, seed)
    result = check([adapter], data)
    assert "train/never" not in result
    if any(layout):
        assert "train/n" in result
        assert type(result["train/n"]) is int


@pytest.mark.parametrize("layout", UNEVEN)
def test_pooled_std_without_count_matches_oracle(layout: tuple[int, ...]) -> None:
    adapter = adapter_for(R.POOLED_STD, counted=False)
    for seed in range(3):
        check([adapter], toy_chunks(R.POOLED_STD, layout, "float", seed, counted=False))


def test_pooled_std_is_the_union_std() -> None:
    """Two groups [1, 3] (mean 2, std 1) and [10] (std 0): the union [1, 3, 10] has std sqrt(14)."""
    adapter = adapter_for(R.POOLED_STD)
    data = [[{"t_n": 2, "t_mu": 2.0, "t_x": 1.0}], [], [{"t_n": 1, "t_mu": 10.0, "t_x": 0.0}]]
    union = [1.0, 3.0, 10.0]
    mu = sum(union) / 3
    want = math.sqrt(sum((v - mu) ** 2 for v in union) / 3)
    got = check([adapter], data)["train/x"]
    assert math.isclose(got, want, rel_tol=REL)
    # not the mean of the stds, nor their count-weighted mean
    assert not math.isclose(got, 0.5, rel_tol=1e-3)
    assert not math.isclose(got, 2 / 3, rel_tol=1e-3)


@pytest.mark.parametrize("mean", [0.84, 0.1, -3.7, 1e3, 1.0 / 3.0])
def test_pooled_std_of_tied_values_is_zero(mean: float) -> None:
    """Every reward the same (a GRPO batch whose groups all tie): the union's std is 0, not rounding noise."""
    data = [
        [{"reward_mean": mean, "reward_std": 0.0, "rollout_count": n} for n in (3, 7, 5)],
        [{"reward_mean": mean, "reward_std": 0.0, "rollout_count": 11}],
        [],
    ]
    result = check(["reward"], data)
    assert result["train/reward_std"] == pytest.approx(0.0, abs=ABS)


@settings(max_examples=200)
@given(
    mean=st.floats(-1e3, 1e3),
    parts=st.lists(
        st.tuples(st.integers(1, 64), st.one_of(st.just(0.0), st.floats(1e-6, 10.0))), min_size=1, max_size=8
    ),
    rng=st.randoms(use_true_random=False),
)
def test_pooled_std_around_one_shared_mean(mean: float, parts: list[tuple[int, float]], rng: random.Random) -> None:
    """Contributions sharing one mean pool to sqrt(sum(n*s^2)/N) exactly: the spread of the means
    adds nothing, and a std far below the mean (or zero) is not drowned by cancellation."""
    units = [{"reward_mean": mean, "reward_std": s, "rollout_count": n} for n, s in parts]
    result = check(["reward"], partition(units, rng, rng.randint(1, 4)))
    want = math.sqrt(sum(n * s * s for n, s in parts) / sum(n for n, _ in parts))
    assert math.isclose(result["train/reward_std"], want, rel_tol=REL, abs_tol=ABS)


def test_weighted_mean_with_zero_total_weight_is_zero() -> None:
    adapter = adapter_for(R.WEIGHTED_MEAN)
    data = [[{"t_n": 0, "t_x": 3.5}, {"t_n": 0, "t_x": -1.0}], [{"t_n": 0, "t_x": 9.0}], []]
    result = check([adapter], data)
    assert result["train/x"] == 0.0
    assert type(result["train/x"]) is float
    assert result["train/n"] == 0  # how a reader tells "no data" from "zero"


def test_weighted_mean_is_not_a_mean_of_means() -> None:
    adapter = adapter_for(R.WEIGHTED_MEAN)
    data = [[{"t_n": 10, "t_x": 0.5}, {"t_n": 30, "t_x": 0.0}], [{"t_n": 60, "t_x": 1.0}]]
    result = check([adapter], data)
    assert math.isclose(result["train/x"], (5.0 + 60.0) / 100.0, rel_tol=REL)


def test_zero_weight_nan_placeholder_does_not_poison() -> None:
    """No recorded logprobs: the gap keys are placeholders with zero weight."""
    no_data = {
        "grpo_logprob_gap_mean": math.nan,
        "grpo_mean_rank_logprob_gap_p99": 0.0,
        "grpo_logprob_gap_gt0p5_frac": 0.0,
        "grpo_logprob_gap_token_count": 0,
    }
    data = [
        [no_data, {**no_data, "grpo_logprob_gap_mean": 0.2, "grpo_logprob_gap_token_count": 40}],
        [{**no_data, "grpo_logprob_gap_mean": 0.4, "grpo_logprob_gap_token_count": 10}],
    ]
    result = reduce_metrics("grpo", data)
    assert math.isclose(result["train/logprob_gap_mean"], (0.2 * 40 + 0.4 * 10) / 50, rel_tol=REL)
    assert result["train/logprob_gap_token_count"] == 50
    empty = reduce_metrics("grpo", [[no_data], [no_data]])
    assert empty["train/logprob_gap_mean"] == 0.0
    assert empty["train/logprob_gap_token_count"] == 0


@pytest.mark.parametrize(("reduction", "values", "want"), [
    (R.SUM, [[3, 4], [5], []], 12),
    (R.SUM, [[True, True], [False], [True]], 3),
    (R.MAX, [[3, 40], [5], []], 40),
    (R.MIN, [[3, 40], [-5], []], -5),
    (R.MAX, [[False], [True, False]], True),
    (R.MAX, [[3, 4.5], [5]], 5.0),
])
def test_integer_reductions_keep_their_type(reduction: Reduction, values: list[list[Any]], want: Any) -> None:
    adapter = adapter_for(reduction)
    data = [[{"t_x": v} for v in rank] for rank in values]
    result = check([adapter], data)
    assert result["train/x"] == want
    assert type(result["train/x"]) is type(want)


def test_last_is_last_chunk_per_rank_then_mean_across_ranks() -> None:
    adapter = adapter_for(R.LAST)
    data = [[{"t_x": 100.0}, {"t_x": 1.0}], [{"t_x": 3.0}], [], [{"t_x": -50.0}, {"t_x": 2.0}]]
    result = check([adapter], data)
    assert math.isclose(result["train/x"], (1.0 + 3.0 + 2.0) / 3, rel_tol=REL)


@pytest.mark.parametrize("value", [7, True, False, 0.125, 12345678901])
def test_last_is_exact_and_typed_when_ranks_agree(value: Any) -> None:
    adapter = adapter_for(R.LAST)
    data = [[{"t_x": 0}, {"t_x": value}], [{"t_x": value}], [], [{"t_x": value}]]
    result = check([adapter], data)
    assert result["train/x"] == value
    assert type(result["train/x"]) is type(value)


def test_categorical_is_the_last_label() -> None:
    data = [
        [{"update_outcome": "accumulating"}, {"update_outcome": "accumulating"}, {"update_outcome": "skipped"}],
        [{"update_outcome": "skipped"}],
        [],
    ]
    result = check(["trainer"], data)
    assert result["optim/update_outcome"] == "skipped"
    assert "optim/skip_reason" not in result


def test_categorical_disagreement_raises() -> None:
    adapter = adapter_for(R.CATEGORICAL)
    data = [[{"t_x": "red"}, {"t_x": "green"}], [{"t_x": "red"}], []]
    with pytest.raises(OracleDisagreement):
        oracle([adapter], data)
    with pytest.raises(MetricsError, match="t_x"):
        reduce_metrics(adapter, data)


def test_absent_keys_stay_absent() -> None:
    result = check(["grpo"], [[{"grpo_kl_max": 0.5}], [], [{"grpo_kl_max": 0.25}]])
    assert result == {"train/kl_max": 0.5}
    assert reduce_metrics("grpo", [[{}], [], [{}]]) == {}
    assert reduce_metrics("grpo", [[], []]) == {}


def test_local_reducer_equals_reduce_metrics() -> None:
    data = realistic_grpo(random.Random(5), (4,))
    reducer = MetricReducer(["grpo", "reward", "trainer"])
    for chunk in data[0]:
        reducer.add(chunk)
    assert reducer.pending_chunks == 4
    frame = reducer.reduce(17)
    assert frame.step == 17
    assert frame.phase == "train"
    assert_matches(frame.metrics, reduce_metrics(["grpo", "reward", "trainer"], data))
    assert_matches(frame.metrics, oracle([get_adapter(n) for n in ("grpo", "reward", "trainer")], data))
    assert reducer.pending_chunks == 0
    assert reducer.reduce(18).metrics == {}  # a new window starts empty


# -- realistic windows over the built-in adapters -----------------------------------------------------


def generic_chunk(adapter: MetricAdapter, rng: random.Random, *, last: bool, skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """One chunk carrying every declared source of ``adapter`` (except ``skip``) with plausible values."""
    chunk: dict[str, Any] = {}
    for source, metric in adapter.metrics.items():
        if source in skip:
            continue
        r = metric.reduction
        if r is R.SUM:
            chunk[source] = rng.choice([0, rng.randint(1, 4000)])
        elif r in (R.MAX, R.MIN):
            chunk[source] = rng.randint(0, 512) if metric.unit in ("tokens", "rounds", "calls") else rng.uniform(0, 20)
        elif r is R.LAST:
            chunk[source] = rng.uniform(0.0, 3.0)
        elif r is R.AGREED:  # the same on every rank at the last chunk, as a real run's counters are
            fixed = zlib.crc32(source.encode())
            value_rng = random.Random(fixed) if last else rng
            flag = source.endswith(("skipped", "enabled", "warmup"))
            chunk[source] = (value_rng.random() < 0.5) if flag else value_rng.randint(0, 99)
        elif r is R.CATEGORICAL:
            if source == "update_outcome":
                chunk[source] = "applied" if last else "accumulating"
        elif r is R.POOLED_STD:
            chunk[source] = rng.uniform(0.0, 1.5)
        else:
            chunk[source] = rng.uniform(-2.0, 2.0)
    return chunk


def windows(adapters: Sequence[str], rng: random.Random, layout: Sequence[int], skip: frozenset[str] = frozenset()) -> list[list[dict[str, Any]]]:
    out = []
    for n in layout:
        rank = []
        for c in range(n):
            chunk: dict[str, Any] = {}
            for name in adapters:
                chunk.update(generic_chunk(get_adapter(name), rng, last=c == n - 1, skip=skip))
            rank.append(chunk)
        out.append(rank)
    return out


DYNAMIC = frozenset(s for s in get_adapter("reward").metrics if s.startswith("grpo_dynamic_sampling_"))
ROUTING = frozenset({"grpo_routing_replay_pinned_tokens", "grpo_routing_replay_pinned_blocks"})


def realistic_grpo(rng: random.Random, layout: Sequence[int]) -> list[list[dict[str, Any]]]:
    """GRPO + reward report + trainer; routing replay off (absent), dynamic sampling only on rank 0."""
    data = windows(["grpo", "reward", "trainer"], rng, layout, skip=ROUTING)
    for r, rank in enumerate(data):
        if r > 0:
            for chunk in rank:
                for source in DYNAMIC:
                    chunk.pop(source)
    return data


@pytest.mark.parametrize("layout", [(3, 1, 0), (1, 1), (0, 2, 1, 5)])
@pytest.mark.parametrize("seed", range(3))
def test_grpo_reward_trainer_window(layout: tuple[int, ...], seed: int) -> None:
    data = realistic_grpo(random.Random(seed), layout)
    result = check(["grpo", "reward", "trainer"], data)
    assert "train/routing_replay_pinned_tokens" not in result
    assert "optim/skip_reason" not in result
    assert result["optim/update_outcome"] == "applied"
    if layout[0]:
        assert "train/grpo_dynamic_sampling_idle_cells" in result  # reported by rank 0 only


@pytest.mark.parametrize(("adapters", "phase"), [
    (["ppo", "trainer"], "train"),
    (["dpo"], "train"),
    (["dpo"], "val"),
    (["dpo", "validation"], "val"),
    (["opd_direct", "trainer"], "train"),
    (["opd_advantage"], "train"),
    (["nft", "trainer"], "train"),
    (["flow_bc"], "train"),
    (["flow_bc"], "val"),
    (["validation"], "val"),
])
@pytest.mark.parametrize("layout", [(3, 1, 0), (2, 5)])
def test_builtin_adapters_match_oracle(adapters: list[str], phase: str, layout: tuple[int, ...]) -> None:
    data = windows(adapters, random.Random(zlib.crc32(repr((adapters, phase, layout)).encode())), layout)
    result = check(adapters, data, phase=phase)
    assert result
    assert all(k.startswith((f"{phase}/", "optim/", "timer/")) for k in result)


def test_ppo_critic_warmup_publishes_no_policy_keys() -> None:
    ppo = get_adapter("ppo")
    # the policy update window's keys; the policy-vs-reference diagnostic is a consistency key
    policy = frozenset(
        ppo.source_of_leaf(leaf)
        for leaf in ("policy_token_count", "policy_total_loss", "policy_loss", "clip_fraction", "ratio_mean",
                     "entropy", "jsd_loss", "policy_lr", "policy_optimizer_step")
    )
    data = windows(["ppo"], random.Random(3), (3, 1, 0), skip=policy)
    for rank in data:
        for chunk in rank:
            chunk["ppo_actor_warmup"] = 1.0
    result = check(["ppo"], data)
    for key in ("train/policy_loss", "train/policy_total_loss", "train/clip_fraction", "train/ratio_mean",
                "train/entropy", "train/jsd_loss", "train/policy_lr", "optim/policy_optimizer_step"):
        assert key not in result
    assert "train/value_loss" in result
    assert "train/policy_reference_logprob_delta_mean" in result
    assert "optim/critic_optimizer_step" in result
    assert result["train/actor_warmup"] == 1.0


# -- property tests: partitions -------------------------------------------------------------------------

INVARIANT = [r for r in Reduction if r.partition_invariant]


def test_partition_invariance_flags() -> None:
    assert set(INVARIANT) == set(Reduction) - {R.LAST, R.AGREED, R.CATEGORICAL}


def test_last_depends_on_the_partition() -> None:
    """Why LAST is not partition invariant: the same contributions, split differently, read differently."""
    adapter = adapter_for(R.LAST)
    one_rank = [[{"t_x": 1.0}, {"t_x": 3.0}]]
    two_ranks = [[{"t_x": 1.0}], [{"t_x": 3.0}]]
    assert check([adapter], one_rank)["train/x"] == 3.0
    assert check([adapter], two_ranks)["train/x"] == 2.0


def _property_adapter() -> tuple[MetricAdapter, list[tuple[str, ...]]]:
    """One key per partition-invariant reduction, and the groups of sources reported together."""
    metrics = [Metric("tok", R.SUM, "weights"), Metric("cnt", R.SUM, "pooled-std counts")]
    groups: list[tuple[str, ...]] = []
    for r in INVARIANT:
        leaf = f"k_{r.value}"
        if r is R.WEIGHTED_MEAN:
            metrics.append(Metric(leaf, r, "", weight="tok"))
            groups.append((f"p_{leaf}", "p_tok"))
        elif r is R.POOLED_STD:
            metrics.append(Metric("mu", R.WEIGHTED_MEAN, "", weight="cnt"))
            metrics.append(Metric(leaf, r, "", weight="cnt", mean="mu"))
            groups.append((f"p_{leaf}", "p_mu", "p_cnt"))
        elif r is R.SUM:
            metrics.append(Metric(leaf, r, ""))
            metrics.append(Metric("isum", r, ""))
            groups += [(f"p_{leaf}",), ("p_isum",)]
        elif r in (R.MAX, R.MIN):
            metrics.append(Metric(leaf, r, ""))
            metrics.append(Metric(f"i{leaf}", r, ""))
            groups += [(f"p_{leaf}",), (f"p_i{leaf}",)]
        else:
            metrics.append(Metric(leaf, r, ""))
            groups.append((f"p_{leaf}",))
    return MetricAdapter("prop", internal_prefix="p_", metrics=metrics), groups


PROP, GROUPS = _property_adapter()
_float = st.floats(-10.0, 10.0, allow_nan=False)
_weight = st.one_of(st.just(0), st.integers(1, 1000))


def _unit(group: tuple[str, ...]) -> st.SearchStrategy[dict[str, Any]]:
    """One contribution of a group: a value together with its weight, mean and count."""
    head = group[0]
    if head.endswith(R.WEIGHTED_MEAN.value):
        return st.fixed_dictionaries({head: _float, "p_tok": _weight})
    if head.endswith(R.POOLED_STD.value):
        return st.fixed_dictionaries({head: st.floats(0.5, 5.0), "p_mu": st.floats(-5.0, 5.0), "p_cnt": _weight})
    if head.startswith(("p_isum", "p_ik_")):
        return st.fixed_dictionaries({head: st.integers(-2**40, 2**40)})
    return st.fixed_dictionaries({head: _float})


_contributions = st.tuples(*(st.lists(_unit(g), max_size=5) for g in GROUPS)).map(
    lambda lists: [unit for units in lists for unit in units]
)


def partition(units: Sequence[dict[str, Any]], rng: random.Random, n_ranks: int) -> list[list[dict[str, Any]]]:
    """Place every unit on a random rank, in a random chunk holding no other unit of its group;
    chunks combine units of different groups and some chunks (and ranks) stay empty."""
    per_rank: list[list[dict[str, Any]]] = [[] for _ in range(n_ranks)]
    for unit in units:
        per_rank[rng.randrange(n_ranks)].append(unit)
    out = []
    for rank_units in per_rank:
        by_group: dict[str, list[dict[str, Any]]] = {}
        for unit in rank_units:
            by_group.setdefault(tuple(sorted(unit)), []).append(unit)
        n_chunks = max((len(v) for v in by_group.values()), default=0) + rng.randrange(2)
        chunks: list[dict[str, Any]] = [{} for _ in range(n_chunks)]
        for group_units in by_group.values():
            for unit, c in zip(group_units, rng.sample(range(n_chunks), len(group_units))):
                chunks[c].update(unit)
        out.append(chunks)
    return out


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(units=_contributions, data=st.data())
def test_repartition_does_not_change_invariant_reductions(units: list[dict[str, Any]], data: st.DataObject) -> None:
    rng = data.draw(st.randoms(use_true_random=False))
    flat = [list(units)]  # one rank, one contribution per chunk
    reference = reduce_metrics(PROP, flat)
    assert_matches(reference, oracle([PROP], flat))
    for n_ranks in (1, 2, 3, 5):
        split = partition(units, rng, n_ranks)
        assert len(split) == n_ranks
        assert Counter(i for rank in split for c in rank for i in c.items()) == Counter(
            i for unit in units for i in unit.items()
        )
        assert_matches(reduce_metrics(PROP, split), reference)


@settings(max_examples=100)
@given(
    layout=st.lists(st.integers(0, 4), min_size=1, max_size=5),
    seed=st.integers(0, 2**32 - 1),
    reduction=st.sampled_from(list(Reduction)),
    kind=st.sampled_from(["float", "int", "bool", "mixed"]),
)
def test_every_reduction_matches_oracle_on_random_layouts(
    layout: list[int], seed: int, reduction: Reduction, kind: str
) -> None:
    if reduction not in (R.SUM, R.MAX, R.MIN, R.LAST, R.AGREED):
        kind = "float"
    check([adapter_for(reduction)], toy_chunks(reduction, layout, kind, seed))
