"""Run-level aggregates with each key's own semantics.

Trackers summarise a run by the last value (W&B's default) or a plain min/max that one NaN
poisons; neither can weight a mean by tokens. :class:`RunSummary` folds frames the way the key is
declared: weighted means over the whole run by their weight, sums to totals, maxima to the run
maximum (NaN ignored and counted; an infinite value counts, and is counted), categorical labels to
counts. Types follow the widest input seen: a maximum over ints and floats is a float.
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
        self.frames = 0

    def add(self, frame: Frame) -> None:
        self.frames += 1
        m = frame.metrics
        for key, value in m.items():
            info = self.keys.get(key)
            if info is None:
                continue
            if isinstance(value, str):
                counts = self._labels.setdefault(key, {})
                counts[value] = counts.get(value, 0) + 1
                continue
            self._last[key] = value
            self._kind[key] = max(self._kind.get(key, 0), 0 if isinstance(value, bool) else 1 if isinstance(value, int) else 2)
            v = float(value)
            r = info.reduction
            if not math.isfinite(v):
                self.nonfinite[key] = self.nonfinite.get(key, 0) + 1
                # NaN compares with nothing; an infinite maximum (minimum) is still the run's
                if math.isnan(v) or r not in (Reduction.MAX, Reduction.MIN):
                    continue
            acc = self._acc.setdefault(key, [0.0, 0.0])
            if r is Reduction.WEIGHTED_MEAN:
                w = _number(m.get(info.weight_key or ""))
                acc[0] += v * w
                acc[1] += w
            elif r is Reduction.SUM:
                acc[0] += v
            elif r is Reduction.MAX:
                acc[0] = v if acc[1] == 0 else max(acc[0], v)
                acc[1] = 1.0
            elif r is Reduction.MIN:
                acc[0] = v if acc[1] == 0 else min(acc[0], v)
                acc[1] = 1.0
            elif r is Reduction.POOLED_STD:
                n = _number(m.get(info.weight_key or ""), default=1.0)
                mean = _number(m.get(info.mean_key or ""))
                acc.extend([0.0] * (3 - len(acc)))
                acc[0] += n
                acc[1] += n * mean
                acc[2] += n * (v * v + mean * mean)
            else:  # MEAN over frames (a compensated sum: a constant averages to itself); LAST keeps the last
                acc.extend([0.0] * (3 - len(acc)))
                _add(acc, v)
                acc[1] += 1.0

    def values(self) -> dict[str, Scalar]:
        """The run aggregate of every key seen; categorical keys give one count per label."""
        out: dict[str, Scalar] = {}
        for key, acc in self._acc.items():
            r = self.keys[key].reduction
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


def _add(acc: list[float], value: float) -> None:
    """Neumaier's compensated ``acc[0] += value``, the running error kept in ``acc[2]``."""
    total = acc[0] + value
    if abs(acc[0]) >= abs(value):
        acc[2] += (acc[0] - total) + value
    else:
        acc[2] += (value - total) + acc[0]
    acc[0] = total


def _number(value: object, default: float = 0.0) -> float:
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return default
