"""Run-level aggregates with each key's own semantics.

Trackers summarise a run by the last value (W&B's default) or a plain min/max that one NaN
poisons; neither can weight a mean by tokens. :class:`RunSummary` folds frames the way the key is
declared: weighted means over the whole run by their weight, sums to totals, maxima to the run
maximum (NaN ignored and counted; an infinite value counts, and is counted), categorical labels to
counts; an exact counter or flag (``AGREED``) as its catalogue entry declares (:class:`RunAggregate`):
a running counter to its last value, a per-window flag to the number of windows where it held
(``run/optim/step_skipped`` = 7 after seven skipped windows, never the last window's 0), a window's
own count (updates by outcome) to the run's total, a streak to its longest. Types follow the widest
input seen: a maximum over ints and floats is a float.

The state is plain floats per key (a weighted mean is two sums). A run repeats the same keys step
after step, so frames with the keys of an earlier frame are held (up to ``BATCH``, by reference:
frames are values, never changed once made) and folded a key at a time: one C-level ``reduce`` of
the key's values onto its sums, in frame order, with the very operations of the value-by-value
fold (``s + v``, ``s + float(v) * w``, ``max(s, float(v))``), so the figures do not depend on the
batching. A key whose values in the batch are not all finite numbers of its type so far (a NaN, an
int key turned float) is folded value by value, like any frame with new keys.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from functools import reduce
from operator import add, mul

from .frame import Frame
from .keys import KeyInfo, label_key
from .reduction import Reduction, RunAggregate
from .values import Scalar

__all__ = ["BATCH", "RunSummary"]

BATCH = 256
"""Frames held before they are folded a key at a time (see the module docstring)."""


class RunSummary:
    """Folds frames; :meth:`values` gives the run aggregate per public key."""

    def __init__(self, keys: Mapping[str, KeyInfo]) -> None:
        self.keys = keys
        # Per key, in the order keys were first folded: two or three running sums (see _fold).
        self._a0: dict[str, float] = {}
        self._a1: dict[str, float] = {}
        self._a2: dict[str, float] = {}
        self._last: dict[str, Scalar] = {}
        self._labels: dict[str, dict[str, int]] = {}
        self._nonfinite: dict[str, int] = {}
        self._kind: dict[str, int] = {}  # widest type seen: 0 bool, 1 int, 2 float
        self._plans: dict[str, tuple[int, str, str]] = {}  # key -> (what to do, weight key, mean key)
        self._layouts: dict[tuple[str, ...], _Layout] = {}  # a frame's keys -> its fold plan
        self._active: _Layout | None = None  # the plan of the held frames
        self._held: list[Mapping[str, Scalar]] = []  # frames with the active plan's keys, not folded yet
        self.frames = 0

    def _plan(self, key: str) -> tuple[int, str, str]:
        info = self.keys.get(key)
        if info is None:
            return (_SKIP, "", "")
        run = info.metric.run_aggregate
        code = _CODES[info.reduction] if run is None else _RUN_CODES[run]
        return (code, info.weight_key or "", info.mean_key or "")

    @property
    def nonfinite(self) -> dict[str, int]:
        """How many non-finite values each key had (NaN and infinities)."""
        self._drain()
        return self._nonfinite

    def add(self, frame: Frame, names: tuple[str, ...] | None = None) -> None:
        """Fold one frame: held when its keys have a plan, else value by value at once. ``names``,
        ``tuple(frame.metrics)``, when the caller has it already."""
        self.frames += 1
        m = frame.metrics
        if names is None:
            names = tuple(m)
        active = self._active
        if active is not None and active.names == names:
            held = self._held
            held.append(m)
            if len(held) >= BATCH:
                self._drain()
            return
        self._drain()  # another set of keys (a validation frame): the held frames first
        self._active = None
        layout = self._layouts.get(names)
        if layout is None:
            self._fold(m, m.items())
            if len(self._layouts) < _MAX_LAYOUTS:  # frames of ever new key sets fold value by value
                self._layouts[names] = _Layout(self, m)
        elif layout.ready(self._a0):
            self._active = layout
            self._held.append(m)
        else:
            self._fold(m, m.items())

    def _drain(self) -> None:
        if self._held and self._active is not None:
            self._active.fold(self, self._held)
        self._held.clear()

    def _fold(self, m: Mapping[str, Scalar], items: Iterable[tuple[str, Scalar]]) -> None:
        """Value by value: any frame, any value."""
        plans, last, kinds, a0, a1, a2 = self._plans, self._last, self._kind, self._a0, self._a1, self._a2
        for key, value in items:
            plan = plans.get(key)
            if plan is None:
                plan = plans[key] = self._plan(key)
            code = plan[0]
            if code == _SKIP:
                continue
            t = type(value)
            if t is str:
                label: str = value  # type: ignore[assignment]
                counts = self._labels.setdefault(key, {})
                counts[label] = counts.get(label, 0) + 1
                continue
            last[key] = value
            kind = 2 if t is float else 1 if t is int else 0 if t is bool else _kind_of(value)
            if kind > kinds.get(key, -1):
                kinds[key] = kind
            v = float(value)
            if v - v != 0.0:  # NaN or an infinity
                self._nonfinite[key] = self._nonfinite.get(key, 0) + 1
                # NaN compares with nothing; an infinite maximum (minimum) is still the run's
                if v != v or code not in (_MAX, _MIN):
                    continue
            if key not in a0:
                a0[key] = a1[key] = a2[key] = 0.0
            if code == _WEIGHTED:
                w = _number(m.get(plan[1]))
                a0[key] += v * w
                a1[key] += w
            elif code == _SUM:
                a0[key] += v
            elif code == _HELD:
                a0[key] += v != 0.0
            elif code == _MAX:
                a0[key] = v if a1[key] == 0 else max(a0[key], v)
                a1[key] = 1.0
            elif code == _MIN:
                a0[key] = v if a1[key] == 0 else min(a0[key], v)
                a1[key] = 1.0
            elif code == _POOLED:
                n = _number(m.get(plan[1]), default=1.0)
                mean = _number(m.get(plan[2]))
                a0[key] += n
                a1[key] += n * mean
                a2[key] += n * (v * v + mean * mean)
            elif code == _MEAN:  # over frames, a compensated sum: a constant averages to itself
                a0[key], a2[key] = _neumaier(a0[key], a2[key], v)
                a1[key] += 1.0
            # LAST and AGREED read the last value

    def _fold_key(self, key: str, frames: list[Mapping[str, Scalar]]) -> None:
        """One key of held frames, value by value (in frame order: keys fold independently)."""
        for m in frames:
            self._fold(m, ((key, m[key]),))

    def values(self) -> dict[str, Scalar]:
        """The run aggregate of every key seen; categorical keys give one count per label."""
        self._drain()
        out: dict[str, Scalar] = {}
        a1, a2 = self._a1, self._a2
        for key, s0 in self._a0.items():
            info = self.keys[key]
            run = info.metric.run_aggregate
            r = info.reduction if run is None else _READ.get(run, info.reduction)
            s1, s2 = a1[key], a2[key]
            if run is RunAggregate.WINDOWS:
                out[key] = int(s0)
            elif r is Reduction.WEIGHTED_MEAN:
                out[key] = s0 / s1 if s1 > 0 else 0.0
            elif r is Reduction.SUM:
                out[key] = int(s0) if self._kind[key] < 2 and s0.is_integer() else s0
            elif r in (Reduction.MAX, Reduction.MIN):
                kind = self._kind[key]
                out[key] = bool(s0) if kind == 0 else int(s0) if kind == 1 and math.isfinite(s0) else s0
            elif r is Reduction.POOLED_STD:
                mean = s1 / s0 if s0 > 0 else 0.0
                out[key] = math.sqrt(max(s2 / s0 - mean * mean, 0.0)) if s0 > 0 else 0.0
            elif r in (Reduction.LAST, Reduction.AGREED):
                out[key] = self._last[key]
            else:
                out[key] = (s0 + s2) / s1
        for key, value in self._last.items():
            out.setdefault(key, value)  # keys only ever non-finite: their last value
        for key, counts in self._labels.items():
            info = self.keys[key]
            for label in info.metric.labels or tuple(counts):
                out[label_key(key, label)] = counts.get(label, 0)
        return out


def _neumaier(total: float, error: float, v: float) -> tuple[float, float]:
    """``total + v`` and the running rounding error (Neumaier's compensated sum)."""
    t = total + v
    if abs(total) >= abs(v):
        error += (total - t) + v
    else:
        error += (v - t) + total
    return t, error


class _Layout:
    """How frames with one set of keys, in one order, fold a key at a time (the module docstring).

    Built from the first such frame: each known key's fold (its reduction code, the position of its
    weight among the values), and whether it was a label (a string). Used once every number of
    that frame has its sums (was folded finite once), so a batch creates no key: the order in which
    keys first appear, which ``values()`` keeps, is the value-by-value one.
    """

    def __init__(self, summary: RunSummary, m: Mapping[str, Scalar]) -> None:
        self.names = tuple(m)
        index = {key: i for i, key in enumerate(self.names)}
        # key, code, position, weight (count) position, mean position (-1: not in the frame)
        self.columns: list[tuple[str, int, int, int, int]] = []
        numbers: list[str] = []
        for i, (key, value) in enumerate(m.items()):
            code, weight, mean = summary._plans[key]
            if code == _SKIP:
                continue
            if isinstance(value, str):
                code = _LABEL
            else:
                numbers.append(key)
            self.columns.append((key, code, i, index.get(weight, -1), index.get(mean, -1)))
        self.numbers = tuple(numbers)

    def ready(self, a0: Mapping[str, float]) -> bool:
        return all(map(a0.__contains__, self.numbers))

    def fold(self, summary: RunSummary, frames: list[Mapping[str, Scalar]]) -> None:
        columns = list(zip(*[m.values() for m in frames]))
        finite = [_finite(column) for column in columns]  # per position: None, or the column's sum type
        a0, a1, a2, last, kinds = summary._a0, summary._a1, summary._a2, summary._last, summary._kind
        for key, code, i, w, mu in self.columns:
            column = columns[i]
            if code == _LABEL:
                if set(map(type, column)) == _STR:
                    counts = summary._labels.setdefault(key, {})
                    for label in column:
                        counts[label] = counts.get(label, 0) + 1  # type: ignore[index,call-overload]
                    continue
            elif _keeps_kind(column, finite[i], kinds[key]):
                if code in (_WEIGHTED, _POOLED) and (w < 0 or finite[w] is None):  # no weight (count) to map
                    summary._fold_key(key, frames)
                    continue
                if code == _WEIGHTED:
                    weights = columns[w]
                    a0[key] = reduce(add, map(mul, map(float, column), weights), a0[key])  # type: ignore[arg-type]
                    a1[key] = reduce(add, weights, a1[key])  # type: ignore[arg-type]
                elif code == _POOLED:
                    if mu < 0 or finite[mu] is None:
                        summary._fold_key(key, frames)
                        continue
                    n = list(map(float, columns[w]))  # type: ignore[arg-type]
                    means = list(map(float, columns[mu]))  # type: ignore[arg-type]
                    xs = list(map(float, column))  # type: ignore[arg-type]
                    a0[key] = reduce(add, n, a0[key])
                    a1[key] = reduce(add, map(mul, n, means), a1[key])
                    a2[key] = reduce(add, map(mul, n, map(add, map(mul, xs, xs), map(mul, means, means))), a2[key])
                elif code == _SUM:
                    a0[key] = reduce(add, column, a0[key])  # type: ignore[arg-type]
                elif code == _HELD:
                    a0[key] += sum(1 for v in column if v)
                elif code == _MAX:
                    a0[key] = reduce(max, map(float, column), a0[key])  # type: ignore[arg-type]
                elif code == _MIN:
                    a0[key] = reduce(min, map(float, column), a0[key])  # type: ignore[arg-type]
                elif code == _MEAN:
                    total, error = a0[key], a2[key]
                    for v in map(float, column):  # type: ignore[arg-type]
                        t = total + v  # _neumaier, inlined
                        error += ((total - t) + v) if abs(total) >= abs(v) else ((v - t) + total)
                        total = t
                    a0[key], a2[key] = total, error
                    a1[key] += len(column)  # as many += 1.0: exact
                last[key] = column[-1]
                continue
            summary._fold_key(key, frames)


def _finite(column: tuple[Scalar, ...]) -> type | None:
    """The type of the column's sum when every value is a finite ``float``/``int``/``bool``, else None."""
    try:
        total = sum(column)  # type: ignore[arg-type]
    except (TypeError, OverflowError):
        return None
    t = type(total)
    # a NaN or an infinity makes the sum non-finite (so does a sum beyond the float range: the slow path)
    return t if (t is float or t is int) and total - total == 0 else None


def _keeps_kind(column: tuple[Scalar, ...], total: type | None, kind: int) -> bool:
    """Every value is a finite number that does not widen the key's type (its ``kind``)."""
    if total is None:
        return False
    if kind == 2:
        return True
    if kind == 1:
        return total is int  # ints and bools only
    return set(map(type, column)) == _BOOL


def _number(value: object, default: float = 0.0) -> float:
    t = type(value)
    if t is float or t is int:
        v = float(value)  # type: ignore[arg-type]
        return v if v - v == 0.0 else default
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return default


def _kind_of(value: object) -> int:
    return 0 if isinstance(value, bool) else 1 if isinstance(value, int) else 2


_MAX_LAYOUTS = 256
_SKIP, _WEIGHTED, _SUM, _MAX, _MIN, _POOLED, _MEAN, _LAST, _LABEL, _HELD = range(10)
_STR = {str}
_BOOL = {bool}
_CODES = {Reduction.WEIGHTED_MEAN: _WEIGHTED, Reduction.SUM: _SUM, Reduction.MAX: _MAX, Reduction.MIN: _MIN,
          Reduction.POOLED_STD: _POOLED, Reduction.LAST: _LAST, Reduction.AGREED: _LAST}
_CODES.update({r: _MEAN for r in Reduction if r not in _CODES})
_RUN_CODES = {RunAggregate.LAST: _LAST, RunAggregate.WINDOWS: _HELD, RunAggregate.TOTAL: _SUM,
              RunAggregate.MAX: _MAX}
_READ = {RunAggregate.LAST: Reduction.AGREED, RunAggregate.TOTAL: Reduction.SUM, RunAggregate.MAX: Reduction.MAX}
"""How an exact counter's run aggregate is read out (WINDOWS: the count of windows, an int)."""
