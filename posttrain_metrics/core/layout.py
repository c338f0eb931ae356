"""The packed state of a window and its one merge.

A :class:`Layout` is derived from the adapters alone, so every rank lays out the same two float64
buffers whatever it observed: a SUM buffer (sums, counts, weights, presence, one-hot labels, error
counts) and a MAX buffer (maxima, negated minima, type ranks, the worst error). :func:`merge` adds
the one and maxes the other. torch.distributed applies exactly that merge to the gathered states in
rank order (or lets one ``all_reduce(SUM)`` and one ``all_reduce(MAX)`` compute it on very large
worlds), so the in-process simulation of ranks and a real run share the arithmetic.
:meth:`Layout.read` turns a merged state into public figures and raises the producer bugs the
buffers carry, identically on every rank.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from .adapter import PHASES, Metric, MetricAdapter
from .errors import MetricsError
from .extra import one_line_fix
from .reduction import Reduction
from .values import MAX_EXACT_INT, BadValue, Scalar, to_scalar

__all__ = ["Layout", "PackedState", "RefusedChunk", "merge", "suggest"]

NEG_INF = float("-inf")

# Type ranks travel in the MAX buffer: the widest type seen wins.
_BOOL, _INT, _FLOAT = 0.0, 1.0, 2.0

# (SUM slots, MAX slots) after the common presence slot, by reduction.
_SLOTS: dict[Reduction, tuple[tuple[str, ...], tuple[str, ...]]] = {
    Reduction.WEIGHTED_MEAN: (("vw", "w"), ()),
    Reduction.SUM: (("sum",), ("type",)),
    Reduction.MAX: (("n", "nan"), ("max", "type")),
    Reduction.MIN: (("n", "nan"), ("negmin", "type")),
    Reduction.MEAN: (("sum", "n"), ()),
    Reduction.LAST: (("sum", "nan"), ("max", "negmin", "type")),
    Reduction.AGREED: (("sum", "nan"), ("max", "negmin", "type")),
    Reduction.POOLED_STD: (("n", "nm", "nss", "nmm"), ("mmax", "negmmin")),
    Reduction.CATEGORICAL: ((), ()),  # one-hot slots, one per label, follow presence
}

# The reductions :meth:`Layout.accumulate` adds inline for a plain float or int (the common case,
# about 150 values a step); anything else goes through ``Layout._add``, which defines the arithmetic.
_SLOW, _FAST_WMEAN, _FAST_SUM, _FAST_MAX, _FAST_MIN, _FAST_MEAN, _FAST_LAST = range(7)
_FAST: dict[Reduction, int] = {
    Reduction.WEIGHTED_MEAN: _FAST_WMEAN,
    Reduction.SUM: _FAST_SUM,
    Reduction.MAX: _FAST_MAX,
    Reduction.MIN: _FAST_MIN,
    Reduction.MEAN: _FAST_MEAN,
    Reduction.LAST: _FAST_LAST,
    Reduction.AGREED: _FAST_LAST,
}
_TYPE_RANK = {float: _FLOAT, int: _INT}

LAYOUT_VERSION = 4
"""Part of every layout's fingerprint: bumped whenever the slots or their meaning change, so ranks
(or workers) running different versions of this module refuse to merge instead of mixing slots."""


class Code:
    """Producer-bug codes; a higher code is reported first when several ranks fail."""

    UNKNOWN_KEY = 1
    BAD_VALUE = 2
    BAD_LABEL = 3
    BAD_WEIGHT = 4
    MISSING_PARTNER = 5
    PARTIAL_FAMILY = 6
    BAD_CHUNK = 7
    BAD_WINDOW = 8
    UNREADABLE = 9

    TEXT: ClassVar[dict[int, str]] = {
        UNKNOWN_KEY: "an undeclared source name",
        BAD_VALUE: "a value that is not a number, or could not be read",
        BAD_LABEL: "a label outside the declared set",
        BAD_WEIGHT: "a negative or non-finite count or weight",
        MISSING_PARTNER: "a weighted value without its weight in the same chunk",
        PARTIAL_FAMILY: "a partial all-or-nothing family",
        BAD_CHUNK: "a chunk that is not a mapping of source names to values",
        BAD_WINDOW: "a bad step or phase",
        UNREADABLE: "an error while reading the window",
    }


_KEY_BITS = 2**20
_CODE_BITS = 2**40


@dataclasses.dataclass(frozen=True, slots=True)
class _Key:
    index: int
    source: str
    adapter: MetricAdapter
    metric: Metric
    s: int  # offset of presence in the SUM buffer; the reduction's SUM slots follow
    m: int  # offset of the reduction's MAX slots
    weight: str | None  # source name of the weight or count
    mean: str | None  # source name of the pooled std's mean
    second_moment: str | None  # source name of the pooled std's second moment
    count: bool  # a count of things: finite and >= 0
    reduction: Reduction
    fast: int  # the accumulate loop's inline case (_FAST_*), or _SLOW for the general ``_add``
    names: Mapping[str, str] = dataclasses.field(hash=False, compare=False)  # public name by phase

    def public(self, phase: str) -> str:
        name = self.names.get(phase)
        return name if name is not None else f"{self.metric.namespace or phase}/{self.metric.leaf}"


@dataclasses.dataclass(frozen=True)
class _Family:
    adapter: str
    sources: tuple[str, ...]
    scope: frozenset[str]  # a chunk carrying any of these (or the family) is part of the batch
    carried: int  # SUM slot: chunks that carried the family
    batch: int  # SUM slot: chunks of the family's batch

    def describe_scope(self) -> str:
        if len(self.scope) == 1:
            return f"the chunks that carried {next(iter(self.scope))!r}"
        return f"the chunks that carried {self.adapter!r} keys"


@dataclasses.dataclass
class PackedState:
    """The two buffers of one rank's window (or of several ranks merged)."""

    sum: list[float]
    max: list[float]
    errors: dict[int, str] = dataclasses.field(default_factory=dict)
    """Full local messages by encoded error, for the rank that saw them (not merged)."""


def merge(a: PackedState, b: PackedState) -> PackedState:
    """The one associative, commutative merge: SUM buffers add, MAX buffers take the maximum."""
    return PackedState(
        [x + y for x, y in zip(a.sum, b.sum)],
        [x if x >= y else y for x, y in zip(a.max, b.max)],
        {**a.errors, **b.errors},
    )


class Layout:
    """Fixed slots for every declared key of a set of adapters."""

    # Global slots. SUM: ranks that added a chunk, ranks with an error, then per adapter the chunks
    # that carried any of its keys and per all-or-nothing family the chunks that carried it. MAX:
    # worst error, step and phase (with negations, so a disagreement shows as max != min), and the
    # stop code (a live-health stop that rank 0 carries to every rank: see MetricReducer.stop_request).
    ACTIVE, ERROR_RANKS = 0, 1
    WORST, STEP, NEG_STEP, PHASE, NEG_PHASE, STOP = 0, 1, 2, 3, 4, 5

    def __init__(self, adapters: Sequence[MetricAdapter]) -> None:
        self.adapters = tuple(adapters)
        self.keys: dict[str, _Key] = {}
        self.ignored: frozenset[str] = frozenset().union(*(a.ignored for a in self.adapters))
        self.families = [
            _Family(
                adapter=adapter.name,
                sources=tuple(sorted(sources)),
                scope=(frozenset({adapter.source_of_leaf(adapter.family_scopes[name])})
                       if name in adapter.family_scopes else frozenset(adapter.metrics)),
                carried=2 + 2 * i,
                batch=3 + 2 * i,
            )
            for i, (adapter, name, sources) in enumerate(
                (adapter, name, sources)
                for adapter in self.adapters
                for name, sources in adapter.families.items()
            )
        ]
        """All-or-nothing families, each with two SUM slots: the chunks that carried it, and the
        chunks of its batch (those carrying its scope key, or any of its adapter's keys, or it)."""
        owner: dict[str, str] = {}
        published: dict[tuple[str | None, str], str] = {}
        s, m = 2 + 2 * len(self.families), 6
        for adapter in self.adapters:
            counts = adapter.counts
            for source, metric in adapter.metrics.items():
                if metric.derived:  # computed after the reduction, from reduced figures: no slot
                    continue
                if source in owner or (source in self.ignored and source not in adapter.ignored):
                    raise MetricsError(
                        f"source name {source!r} of adapter {adapter.name!r} is also declared or "
                        "ignored by another adapter of the same reduction; fix: combine adapters "
                        "whose source names are disjoint"
                    )
                name = (metric.namespace, metric.leaf)
                if name in published:
                    raise MetricsError(
                        f"adapters {published[name]!r} and {adapter.name!r} both publish "
                        f"{metric.namespace or '<phase>'}/{metric.leaf}; fix: reduce them separately"
                    )
                owner[source], published[name] = adapter.name, adapter.name
                sum_slots, max_slots = _SLOTS[metric.reduction]
                key = _Key(
                    index=len(self.keys) + 1,
                    source=source,
                    adapter=adapter,
                    metric=metric,
                    s=s,
                    m=m,
                    weight=adapter.source_of_leaf(metric.weight) if metric.weight else None,
                    mean=adapter.source_of_leaf(metric.mean) if metric.mean else None,
                    second_moment=(
                        adapter.source_of_leaf(metric.second_moment) if metric.second_moment else None
                    ),
                    count=source in counts,
                    reduction=metric.reduction,
                    fast=_FAST.get(metric.reduction, _SLOW),
                    names={phase: f"{metric.namespace or phase}/{metric.leaf}" for phase in PHASES},
                )
                self.keys[source] = key
                s += 1 + len(sum_slots) + len(metric.labels)
                m += len(max_slots)
        self.sum_size, self.max_size = s, m
        spec = [
            (k.source, k.metric.leaf, k.reduction.value, k.weight, k.mean, k.second_moment, k.count,
             k.metric.labels, k.metric.namespace, k.metric.family)
            for k in self.keys.values()
        ]
        scopes = [(f.sources, sorted(f.scope)) for f in self.families]
        self._derived = [k for k in self.keys.values() if k.second_moment is not None]
        self._fast = True
        """Whether :meth:`accumulate` adds plain numbers inline; ``False`` sends every value through
        ``_add`` (the tests compare the two, bit for bit)."""
        digest = hashlib.sha256(repr((LAYOUT_VERSION, spec, scopes)).encode()).hexdigest()
        self.fingerprint = float(int(digest[:13], 16))  # 52 bits: exact in float64

    # -- one rank ------------------------------------------------------------------------------

    def empty(self) -> PackedState:
        return PackedState([0.0] * self.sum_size, [NEG_INF] * self.max_size)

    def record(self, state: PackedState, code: int, key: _Key | None, rank: int, message: str) -> None:
        """Record a producer bug in ``state``: it travels in the buffers, and every rank raises it
        in :meth:`read` after the collectives."""
        encoded = code * _CODE_BITS + (key.index if key else 0) * _KEY_BITS + rank
        state.errors.setdefault(encoded, f"rank {rank}: {message}")
        state.sum[self.ERROR_RANKS] = 1.0
        state.max[self.WORST] = max(state.max[self.WORST], float(encoded))

    def accumulate(
        self,
        chunks: Sequence[Mapping[str, Any]],
        *,
        rank: int = 0,
        step: int | None = 0,
        phase: str = "train",
    ) -> PackedState:
        """The packed state of one rank's window. Producer bugs are recorded, not raised, so that
        the rank still joins the collectives and every rank raises together in :meth:`read`. A
        ``step`` of ``None`` (one that could not be read, recorded by the caller) leaves the step
        slots empty."""
        state = self.empty()
        S, M = state.sum, state.max
        if step is not None:
            M[self.STEP], M[self.NEG_STEP] = float(step), -float(step)
        if isinstance(phase, str) and phase in PHASES:
            phase_id = float(phase == "val")
            M[self.PHASE], M[self.NEG_PHASE] = phase_id, -phase_id
        last: dict[str, Scalar] = {}

        def fail(code: int, key: _Key | None, message: str) -> None:
            self.record(state, code, key, rank, message)

        keys_get, fast = self.keys.get, self._fast
        for c, chunk in enumerate(chunks):
            if isinstance(chunk, RefusedChunk):
                fail(Code.BAD_CHUNK, None, f"chunk {c}: {chunk.reason}")
                continue
            values: dict[str, Scalar] = {}
            taken: list[tuple[_Key, Scalar]] = []
            for source, raw in chunk.items():
                key = keys_get(source)
                if key is None:
                    if source not in self.ignored:
                        fail(Code.UNKNOWN_KEY, None, self._unknown(source))
                    continue
                S[key.s] = 1.0  # presence: ranks that reported the key (whatever its value)
                t = type(raw)
                if (t is float and (not key.count or 0.0 <= raw < math.inf)) or (
                    t is int and (0 if key.count else -MAX_EXACT_INT) <= raw <= MAX_EXACT_INT
                ):
                    value: Scalar = raw  # a plain number, as to_scalar would return it
                else:
                    read = self._read(key, raw, c, chunk, fail)
                    if read is None:
                        continue
                    value = read
                values[source] = value
                taken.append((key, value))
            for fam in self.families:
                present = [s for s in fam.sources if s in chunk]
                if present or not fam.scope.isdisjoint(chunk.keys()):
                    S[fam.batch] += 1.0
                if not present:
                    continue
                S[fam.carried] += 1.0
                if len(present) != len(fam.sources):
                    missing = sorted(set(fam.sources) - set(present))
                    fail(
                        Code.PARTIAL_FAMILY, self.keys[present[0]],
                        f"chunk {c} carries {sorted(present)} without {missing}; these keys are "
                        "emitted all together or not at all (a partial record is a producer bug); "
                        "fix: emit the whole family, with zero weight when there is no data",
                    )
            for key, value in taken:
                # Inline: exactly the arithmetic of ``_add`` for a plain float or int whose partner
                # is a plain, valid number; every other case (labels, bools, missing or bad
                # partners, NaN extrema, pooled stds) is left to ``_add`` itself.
                kind, t = (fast and key.fast), type(value)
                if kind and (t is float or t is int):
                    s, m = key.s + 1, key.m
                    if kind == _FAST_WMEAN:
                        w = values.get(key.weight)  # type: ignore[arg-type]
                        tw = type(w)
                        if (tw is float or tw is int) and 0.0 <= w < math.inf:  # type: ignore[operator]
                            if w > 0.0:  # type: ignore[operator]
                                v = float(value)
                                S[s] += v * w  # type: ignore[operator]
                                S[s + 1] += w  # type: ignore[operator]
                            continue
                    elif kind == _FAST_SUM:
                        S[s] += float(value)
                        type_rank = _TYPE_RANK[t]
                        if type_rank > M[m]:
                            M[m] = type_rank
                        continue
                    elif kind in (_FAST_MAX, _FAST_MIN):
                        v = float(value)
                        w = values.get(key.weight) if key.weight is not None else None
                        if v == v and (
                            key.weight is None or key.weight not in chunk
                            or ((type(w) is float or type(w) is int) and 0.0 < w < math.inf)  # type: ignore[operator]
                        ):
                            S[s] += 1.0
                            if kind == _FAST_MIN:
                                v = -v
                            if v > M[m]:
                                M[m] = v
                            type_rank = _TYPE_RANK[t]
                            if type_rank > M[m + 1]:
                                M[m + 1] = type_rank
                            continue
                    elif kind == _FAST_MEAN:
                        S[s] += float(value)
                        S[s + 1] += 1.0
                        continue
                    else:  # _FAST_LAST
                        last[key.source] = value
                        continue
                try:
                    self._add(key, value, values, chunk, S, M, last)
                except _Reject as exc:
                    fail(exc.code, key, f"{self._where(key, c)} {exc.message}")
            for key in self._derived:  # a chunk with both moments and no std: its std is theirs
                if key.source not in chunk and key.mean in values and key.second_moment in values:
                    try:
                        self._add(key, 0.0, values, chunk, S, M, last)
                        S[key.s] = 1.0
                    except _Reject as exc:
                        fail(exc.code, key, f"{self._where(key, c)} {exc.message}")
        for source, value in last.items():
            key = self.keys[source]
            if key.reduction is Reduction.CATEGORICAL:
                S[key.s + 1 + key.metric.labels.index(str(value))] = 1.0
            elif isinstance(value, float) and math.isnan(value):
                S[key.s + 1], S[key.s + 2] = value, 1.0
            else:
                S[key.s + 1] = float(value)
                M[key.m], M[key.m + 1] = float(value), -float(value)
                M[key.m + 2] = _type_rank(value)
        if chunks:
            S[self.ACTIVE] = 1.0
        return state

    def _read(self, key: _Key, raw: Any, c: int, chunk: Mapping[str, Any], fail: Any) -> Scalar | None:
        """``raw`` as a plain scalar, or ``None`` with the producer bug recorded through ``fail``."""
        try:
            if isinstance(raw, BadValue):
                raise raw
            value = to_scalar(raw)
            if key.count and not isinstance(value, str) and not 0.0 <= float(value) < math.inf:
                users = sorted(k.source for k in self.keys.values() if k.weight == key.source and k.source in chunk)
                weights = f" (it weights {', '.join(map(repr, users))} in this chunk)" if users else ""
                fail(
                    Code.BAD_WEIGHT, key,
                    f"{self._where(key, c)} got {value!r}; it is a count (of tokens, sequences, "
                    f"groups, steps...), so it must be finite and >= 0{weights}; fix the producer "
                    "of that count",
                )
                return None
            return value
        except BadValue as exc:
            fail(Code.BAD_VALUE, key, f"{self._where(key, c)} got {exc}")
        except Exception as exc:  # a value that breaks while being read is a bad value too
            fail(
                Code.BAD_VALUE, key,
                f"{self._where(key, c)} got a {type(raw).__name__} that cannot be read "
                f"({type(exc).__name__}: {str(exc)[:200]}); fix: pass a plain number",
            )
        return None

    def _add(
        self,
        key: _Key,
        value: Scalar,
        values: Mapping[str, Scalar],
        chunk: Mapping[str, Any],
        S: list[float],
        M: list[float],
        last: dict[str, Scalar],
    ) -> None:
        r, s, m = key.reduction, key.s + 1, key.m
        if r is Reduction.CATEGORICAL:
            if not isinstance(value, str) or value not in key.metric.labels:
                raise _Reject(
                    Code.BAD_LABEL,
                    f"got {value!r:.80}, not one of {list(key.metric.labels)}; fix: report one of those labels",
                )
            last[key.source] = value
            return
        if isinstance(value, str):
            raise _Reject(
                Code.BAD_VALUE,
                f"got the string {value!r:.80} for a numeric key; fix: pass a number "
                "(only CATEGORICAL keys take labels)",
            )
        v = float(value)
        if r is Reduction.WEIGHTED_MEAN:
            w = self._partner(key, key.weight, values, chunk, "weight")
            if w > 0.0:
                S[s] += v * w
                S[s + 1] += w
        elif r is Reduction.SUM:
            S[s] += v
            M[m] = max(M[m], _type_rank(value))
        elif r is Reduction.MAX or r is Reduction.MIN:
            # A contribution whose count says it holds no sample holds no extremum either; one that
            # reports no count at all is taken as it is.
            if key.weight in chunk and self._partner(key, key.weight, values, chunk, "count") == 0.0:
                return
            S[s] += 1.0
            if math.isnan(v):
                S[s + 1] += 1.0
            else:
                M[m] = max(M[m], v if r is Reduction.MAX else -v)
            M[m + 1] = max(M[m + 1], _type_rank(value))
        elif r is Reduction.MEAN:
            S[s] += v
            S[s + 1] += 1.0
        elif r is Reduction.LAST or r is Reduction.AGREED:
            last[key.source] = value
        elif r is Reduction.POOLED_STD:
            if v < 0.0:  # a NaN std is a value (one sample's torch.std()); it drops out with a zero count
                raise _Reject(Code.BAD_VALUE, f"got the standard deviation {value!r} < 0; fix the producer")
            n = self._partner(key, key.weight, values, chunk, "count") if key.weight else 1.0
            mean = self._partner(key, key.mean, values, chunk, "mean", weight=False)
            if key.second_moment is not None and key.second_moment in chunk:
                # The std is derived from the moments published beside it: s^2 = E[x^2] - E[x]^2.
                second = self._partner(key, key.second_moment, values, chunk, "second moment", weight=False)
                within = second - mean * mean
            else:  # no second moment reported in this chunk: its std says the same thing
                within = v * v
            if n > 0.0:
                # Within- and between-contribution moments apart, and the spread of the means in
                # the MAX buffer: tied means give exactly zero between-variance, not rounding noise.
                S[s] += n
                S[s + 1] += n * mean
                S[s + 2] += n * within
                S[s + 3] += n * mean * mean
                M[m], M[m + 1] = max(M[m], mean), max(M[m + 1], -mean)

    def _partner(
        self,
        key: _Key,
        source: str | None,
        values: Mapping[str, Scalar],
        chunk: Mapping[str, Any],
        role: str,
        *,
        weight: bool = True,
    ) -> float:
        assert source is not None
        if source not in chunk:
            raise _Reject(
                Code.MISSING_PARTNER,
                f"needs its {role} {source!r} in the same chunk; fix: report {source!r} "
                f"alongside {key.source!r}",
            )
        if source not in values:  # the partner itself was a bad value, reported on its own key
            return 0.0
        raw = values[source]
        if isinstance(raw, str):
            return 0.0  # reported as a bad value on the partner's own key
        w = float(raw)
        if weight and not (math.isfinite(w) and w >= 0.0):
            raise _Reject(
                Code.BAD_WEIGHT,
                f"is weighted by {source!r}={raw!r}; weights must be finite and >= 0; fix the producer "
                "of that count",
            )
        return w

    def _where(self, key: _Key, chunk: int) -> str:
        return f"key {key.source!r} (-> {key.metric.leaf!r}, adapter {key.adapter.name!r}) in chunk {chunk}"

    def _unknown(self, source: str) -> str:
        names = ", ".join(a.name for a in self.adapters)
        near = suggest(source, [*self.keys, *self.ignored])
        hint = f" (did you mean {', '.join(repr(n) for n in near)}?)" if near else ""
        return (
            f"source name {source!r:.80} is not declared by adapters [{names}]{hint}; "
            f"{one_line_fix(source[:80], self.adapters)}"
        )

    # -- many ranks -----------------------------------------------------------------------------

    def read(self, state: PackedState, *, phase: str, world_size: int) -> dict[str, Scalar]:
        """Public figures of a merged state; raises every producer bug it carries."""
        S, M = state.sum, state.max
        if M[self.WORST] > 0:
            self._raise_worst(state)
        if M[self.STEP] != -M[self.NEG_STEP]:
            raise MetricsError(
                f"ranks reduced different steps (from {-M[self.NEG_STEP]:.0f} to {M[self.STEP]:.0f}); "
                "fix: every rank must call reduce(step) with the same step"
            )
        if M[self.PHASE] != -M[self.NEG_PHASE]:
            raise MetricsError("ranks reduced different phases; fix: pass the same phase on every rank")
        for fam in self.families:
            carried, chunks = S[fam.carried], S[fam.batch]
            if carried and carried != chunks:
                raise MetricsError(
                    f"the all-or-nothing family {list(fam.sources)} of adapter {fam.adapter!r} was "
                    f"carried by {int(carried)} of the {int(chunks)} chunks (over every rank) of this "
                    f"window's batch ({fam.describe_scope()}); presence is all-or-nothing per batch, so "
                    "a partial record is a producer bug; fix: emit the family in every such chunk "
                    "(zero weight when there is no data), or in none"
                )
        out: dict[str, Scalar] = {}
        for key in self.keys.values():
            if S[key.s] == 0.0:
                continue  # absent on every rank: absent, not zero
            if key.metric.namespace is None and phase not in key.adapter.phases:
                raise MetricsError(
                    f"adapter {key.adapter.name!r} publishes phases {sorted(key.adapter.phases)}, "
                    f"not {phase!r} (key {key.source!r}); fix: reduce it under one of those phases"
                )
            if key.reduction is Reduction.AGREED and S[key.s] < S[self.ACTIVE]:
                self._raise_partial(key, int(S[key.s]), int(S[self.ACTIVE]), phase)
            if key.fast == _FAST_WMEAN:  # most keys: what _value gives, without the call
                w = S[key.s + 2]
                out[key.public(phase)] = S[key.s + 1] / w if w > 0.0 else 0.0
                continue
            value = self._value(key, S, M, phase)
            if value is not None:
                out[key.public(phase)] = value
        return out

    def _value(self, key: _Key, S: list[float], M: list[float], phase: str) -> Scalar | None:
        r, s, m = key.reduction, key.s + 1, key.m
        if r is Reduction.WEIGHTED_MEAN:
            return S[s] / S[s + 1] if S[s + 1] > 0.0 else 0.0
        if r is Reduction.SUM:
            return _typed(S[s], max(M[m], _INT))  # a sum of flags is a count
        if r is Reduction.MAX or r is Reduction.MIN:
            if S[s] == 0.0:
                return None  # every contribution counted nothing: no extremum, not a placeholder
            if S[s + 1] > 0.0:
                return math.nan
            v = (M[m] if r is Reduction.MAX else -M[m]) + 0.0  # -0.0 and 0.0 tie: report 0.0 on every path
            return _typed(v, M[m + 1])
        if r is Reduction.MEAN:
            return S[s] / S[s + 1]
        if r is Reduction.LAST or r is Reduction.AGREED:
            ranks, nan_ranks = S[key.s], S[s + 1]
            agree = nan_ranks == ranks or (nan_ranks == 0.0 and M[m] == -M[m + 1])
            if r is Reduction.AGREED and not agree:
                low = "nan" if nan_ranks else _text(-M[m + 1])
                raise MetricsError(
                    f"ranks disagree on {key.public(phase)!r} (source {key.source!r}), a counter or "
                    f"flag that every data-parallel rank holds identically by construction: values "
                    f"from {low} to {_text(M[m])} over {int(ranks)} ranks. The ranks are "
                    "desynchronised (one skipped or repeated an update, or restored another "
                    "checkpoint); fix the training loop so every rank reports the same value"
                )
            if nan_ranks > 0.0:
                return math.nan
            if M[m] == -M[m + 1]:
                return _typed(M[m] + 0.0, M[m + 2])  # -0.0 and 0.0 tie: report 0.0, as extrema do
            return S[s] / ranks
        if r is Reduction.POOLED_STD:
            n = S[s]
            if n <= 0.0:
                return 0.0
            mean = S[s + 1] / n
            tied = M[m] == -M[m + 1] and math.isfinite(mean)
            between = 0.0 if tied else S[s + 3] / n - mean * mean
            variance = S[s + 2] / n + between
            return math.sqrt(variance) if variance > 0.0 else (variance if math.isnan(variance) else 0.0)
        labels = [label for i, label in enumerate(key.metric.labels) if S[s + i] > 0.0]
        if len(labels) > 1:
            counts = {label: int(S[s + key.metric.labels.index(label)]) for label in labels}
            raise MetricsError(
                f"ranks disagree on categorical key {key.source!r} (-> {key.metric.leaf!r}): "
                f"ranks per label {counts}; fix: every rank must report the same label for a window"
            )
        return labels[0]

    @staticmethod
    def _raise_partial(key: _Key, reported: int, active: int, phase: str) -> None:
        """An exact counter or flag that some ranks reported and others did not in a window where
        they all added chunks: every rank holds it by construction, so a rank without it is
        desynchronised, as a rank with another value is. (A rank that added no chunk at all reports
        nothing, as ever.)"""
        raise MetricsError(
            f"{key.public(phase)!r} (source {key.source!r}), a counter or flag that every data-parallel "
            f"rank holds identically by construction, was reported by {reported} of the {active} "
            "ranks that added chunks to this window. The ranks are desynchronised (one skipped or repeated an update, or its loop reports "
            f"the key on some ranks only); fix the training loop so every rank reports {key.source!r} in "
            "the same windows"
        )

    def _raise_worst(self, state: PackedState) -> None:
        worst = int(state.max[self.WORST])
        n_ranks = int(state.sum[self.ERROR_RANKS])
        others = f" ({n_ranks} ranks reported errors)" if n_ranks > 1 else ""
        if worst in state.errors:
            raise MetricsError(state.errors[worst] + others)
        code, rest = divmod(worst, _CODE_BITS)
        index, rank = divmod(rest, _KEY_BITS)
        key = next((k for k in self.keys.values() if k.index == index), None)
        what = f" for key {key.source!r}" if key else ""
        raise MetricsError(
            f"rank {rank} reported {Code.TEXT.get(code, 'an error')}{what}{others}; rank {rank}'s "
            "own error has the details. Every rank stops here so that none hangs in a collective."
        )


class RefusedChunk:
    """Stands in a window for a chunk that could not be taken (not a mapping, a key that is not a
    string), so that the rank still joins the step's collectives and every rank raises."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def items(self) -> list[tuple[str, Any]]:
        return []

    def keys(self) -> frozenset[str]:
        return frozenset()


def suggest(name: str, candidates: Sequence[str], limit: int = 3) -> list[str]:
    """The declared names closest to a mistyped ``name``: by edit distance (at most a third of its
    length, and at least 2), and any with the same leaf under another prefix or none.

    >>> suggest("grpo_kl_maximum", ["grpo_kl_max", "grpo_kl_mean", "reward_max"])
    ['grpo_kl_max']
    >>> suggest("grpo_clipfrac", ["grpo_clip_frac", "grpo_seq_clip_frac"])
    ['grpo_clip_frac']
    >>> suggest("clip_frac", ["grpo_clip_frac", "ppo_clip_fraction"])
    ['grpo_clip_frac']
    """
    if not name or len(name) > 200:
        return []
    leaf = name.split("_", 1)[-1]
    scored = []
    for candidate in set(candidates):
        same_leaf = candidate.endswith("_" + name) or candidate.split("_", 1)[-1] == leaf
        distance = _edit_distance(name, candidate, cap=max(2, len(name) // 3))
        if same_leaf or distance is not None:
            scored.append((distance if distance is not None else len(candidate), candidate))
    return [candidate for _, candidate in sorted(scored)[:limit]]


def _edit_distance(a: str, b: str, *, cap: int) -> int | None:
    """Levenshtein distance of ``a`` and ``b`` if it is at most ``cap``, else ``None``."""
    if abs(len(a) - len(b)) > cap:
        return None
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        if min(current) > cap:
            return None
        previous = current
    return previous[-1] if previous[-1] <= cap else None


def _text(value: float) -> str:
    return str(int(value)) if value.is_integer() and abs(value) <= MAX_EXACT_INT else repr(value)


class _Reject(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def _type_rank(value: Scalar) -> float:
    if isinstance(value, bool):
        return _BOOL
    return _INT if isinstance(value, int) else _FLOAT


def _typed(value: float, type_rank: float) -> Scalar:
    if type_rank == _BOOL:
        return bool(value)
    if type_rank == _INT and math.isfinite(value) and abs(value) <= MAX_EXACT_INT:
        return int(value)
    return value  # a sum beyond 2**53 is no longer exact: a float says so, a wrong int would not
