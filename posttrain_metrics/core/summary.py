"""Run-level aggregates with each key's own semantics.

Trackers summarise a run by the last value (W&B's default) or a plain min/max that one NaN
poisons; neither can weight a mean by tokens. :class:`RunSummary` folds frames the way the key is
declared: weighted means over the whole run by their weight, sums to totals, maxima to the run
maximum (NaN ignored and counted; an infinite value counts, and is counted), categorical labels to
counts, a window's own counts (``per_window``: updates by outcome) to run totals. Types follow the widest input seen: a maximum over ints and floats is a float.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from .frame import Frame
from .keys import KeyInfo, label_key
from .reduction import Reduction
from .values import Scalar

__all__ = ["RunSummary"]


class RunSummary:
    """Folds frames; :meth:`values` gives the run aggregate per public key."""

    def __init__(self, keys: Mapping[str, KeyInfo]) -> None:
        self.keys = keys
        self._acc: dict[str, list[float]] = {}
        self._last: dict[str, Scalar] = {}
        self._labels: dict[str, dict[str, int]] = {}
        self.nonfinite: dict[str, int] = {}
        self._kind: dict[str, int] = {}  # widest type seen: 0 bool, 1 int, 2 float
        self._plans: dict[str, tuple[int, str, str]] = {}  # key -> (what to do, weight key, mean key)
        self.frames = 0

    def _plan(self, key: str) -> tuple[int, str, str]:
        info = self.keys.get(key)
        if info is None:
            return (_SKIP, "", "")
        code = _SUM if info.metric.per_window else _CODES[info.reduction]  # a window's count: the run's total
        return (code, info.weight_key or "", info.mean_key or "")

    def add(self, frame: Frame) -> None:
        """Fold one frame: O(keys) with one small plan per key, computed the first time it is seen."""
        self.frames += 1
        m = frame.metrics
        plans, acc_of, last, kinds = self._plans, self._acc, self._last, self._kind
        for key, value in m.items():
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
                self.nonfinite[key] = self.nonfinite.get(key, 0) + 1
                # NaN compares with nothing; an infinite maximum (minimum) is still the run's
                if v != v or code not in (_MAX, _MIN):
                    continue
            acc = acc_of.get(key)
            if acc is None:
                acc = acc_of[key] = [0.0, 0.0, 0.0]
            if code == _WEIGHTED:
                w = _number(m.get(plan[1]))
                acc[0] += v * w
                acc[1] += w
            elif code == _SUM:
                acc[0] += v
            elif code == _MAX:
                acc[0] = v if acc[1] == 0 else max(acc[0], v)
                acc[1] = 1.0
            elif code == _MIN:
                acc[0] = v if acc[1] == 0 else min(acc[0], v)
                acc[1] = 1.0
            elif code == _POOLED:
                n = _number(m.get(plan[1]), default=1.0)
                mean = _number(m.get(plan[2]))
                acc[0] += n
                acc[1] += n * mean
                acc[2] += n * (v * v + mean * mean)
            else:  # MEAN over frames (a compensated sum: a constant averages to itself); LAST keeps the last
                total = acc[0] + v  # Neumaier's compensated acc[0] += v, the running error in acc[2]
                if abs(acc[0]) >= abs(v):
                    acc[2] += (acc[0] - total) + v
                else:
                    acc[2] += (v - total) + acc[0]
                acc[0] = total
                acc[1] += 1.0

    def values(self) -> dict[str, Scalar]:
        """The run aggregate of every key seen; categorical keys give one count per label."""
        out: dict[str, Scalar] = {}
        for key, acc in self._acc.items():
            info = self.keys[key]
            r = Reduction.SUM if info.metric.per_window else info.reduction
            last = self._last[key]
            if r is Reduction.WEIGHTED_MEAN:
                out[key] = acc[0] / acc[1] if acc[1] > 0 else 0.0
            elif r is Reduction.SUM:
                out[key] = int(acc[0]) if self._kind[key] < 2 and acc[0].is_integer() else acc[0]
            elif r in (Reduction.MAX, Reduction.MIN):
                kind = self._kind[key]
                out[key] = bool(acc[0]) if kind == 0 else int(acc[0]) if kind == 1 and math.isfinite(acc[0]) else acc[0]
            elif r is Reduction.POOLED_STD:
                mean = acc[1] / acc[0] if acc[0] > 0 else 0.0
                out[key] = math.sqrt(max(acc[2] / acc[0] - mean * mean, 0.0)) if acc[0] > 0 else 0.0
            elif r in (Reduction.LAST, Reduction.AGREED):
                out[key] = last
            else:
                out[key] = (acc[0] + acc[2]) / acc[1]
        for key, value in self._last.items():
            out.setdefault(key, value)  # keys only ever non-finite: their last value
        for key, counts in self._labels.items():
            info = self.keys[key]
            for label in info.metric.labels or tuple(counts):
                out[label_key(key, label)] = counts.get(label, 0)
        return out


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


_SKIP, _WEIGHTED, _SUM, _MAX, _MIN, _POOLED, _OTHER = range(7)
_CODES = {Reduction.WEIGHTED_MEAN: _WEIGHTED, Reduction.SUM: _SUM, Reduction.MAX: _MAX, Reduction.MIN: _MIN,
          Reduction.POOLED_STD: _POOLED}
_CODES.update({r: _OTHER for r in Reduction if r not in _CODES})
