"""The journal's series as the dashboard draws them, thinned as they are read so that a run of any
length takes bounded memory (see :data:`BUCKETS`)."""

from __future__ import annotations

import array
import bisect
import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..core.errors import MetricsError
from ..doctor import JournalLike
from .panels import PANELS

if TYPE_CHECKING:
    from ..core.frame import Frame

__all__ = ["BUCKETS", "FEW_STEPS", "Series"]


Series = list[tuple[int, float]]


BUCKETS = 1000
"""A series of more than ``4 * BUCKETS`` points is drawn from at most four points per bucket of the
run's steps (the first, the last, the lowest and the highest, as M4 charts do: every spike stays
visible, and the curve runs to the last step), so a run of 100k steps draws a page of a few thousand
points per curve (a panel is 700 pixels wide) and takes bounded memory. The buckets split the run's
steps ``lo``-``hi`` (its lowest and highest step) evenly: a step is in bucket
``(step - lo) * BUCKETS // (hi - lo + 1)``. A label key of more than ``4 * BUCKETS`` points keeps the
first point of each label in each bucket (a strip marker per bucket where the label occurs); so do
a key's non-finite points (their red marks)."""

FEW_STEPS = 60
"""A label strip of a run of at most this many distinct steps draws squares; of more, thin ticks."""

_BANDS = tuple(dict.fromkeys(p.band for p in PANELS if p.band is not None))


class _Data:
    """The journal's numeric and label series by key, with the run's non-finite points.

    ``journal.frames`` is read twice (each pass may re-read the journal), in memory bounded by the
    number of keys times :data:`BUCKETS`, whatever the run's length: the first pass finds the run's
    steps ``lo``-``hi`` (which the buckets split), the second feeds each key's points, in step order,
    to a :class:`_Points` (or a :class:`_Strip`) that thins them as they come.

    A step written twice (a resumed run replaying steps; the doctor's step_order finding) is drawn
    once, with its last value, as the trackers keep it. Which value is the last is known only once
    the key is read, so a key whose steps ever fail to increase (the first pass sees it) is read whole,
    16 bytes a point, then sorted and fed: the one case whose memory grows with the run.

    A band (mean +- std, :attr:`Panel.band`) is drawn where both series have a point: each keeps the
    steps either kept, so a spike of the mean or of the std stays in the band. Each point of the two
    keys carries the other key's value at its step, taken from the same frame; a pair whose keys do
    not always come in the same frames is read whole, as a step written twice is.
    """

    def __init__(self, journal: JournalLike) -> None:
        self.first_step: int | None = None
        self.last_step: int | None = None
        self.many_steps = False  # more than FEW_STEPS distinct steps
        self.nonfinite: dict[str, list[int]] = {}
        self.numeric: dict[str, Series] = {}
        self.labels: dict[str, list[tuple[int, str]]] = {}
        whole, partner = self._scan(journal.frames)
        if self.first_step is not None and self.last_step is not None:
            self._read(journal.frames, self.first_step, self.last_step, whole, partner)
        self.keys = set(self.numeric) | set(self.nonfinite)

    def _scan(self, frames: Iterable[Frame]) -> tuple[set[str], dict[str, str]]:
        """The first pass: the run's first and last step, and whether it has more than FEW_STEPS.
        Returns the keys to read whole and the keys of the bands, each to the other key of its band."""
        last: dict[str, int] = {}  # the step each key was last seen at
        whole: set[str] = set()
        bands = _BandCheck()
        distinct: set[int] = set()  # up to FEW_STEPS + 1
        for frame in frames:
            step, metrics = frame.step, frame.metrics
            if self.first_step is None or step < self.first_step:
                self.first_step = step
            if self.last_step is None or step > self.last_step:
                self.last_step = step
            if len(distinct) <= FEW_STEPS:
                distinct.add(step)
            for key in metrics:
                seen = last.get(key)
                if seen is None:
                    bands.new_key(key)
                elif step <= seen:
                    whole.add(key)
                last[key] = step
            bands.count(metrics)
        self.many_steps = len(distinct) > FEW_STEPS
        partner: dict[str, str] = {}
        for mean, std, together in bands.pairs():
            if mean not in partner and std not in partner:  # a key named to be in two bands: the first
                partner[mean], partner[std] = std, mean
                if not together or mean in whole or std in whole:
                    whole.update((mean, std))
        return whole, partner

    def _read(self, frames: Iterable[Frame], lo: int, hi: int, whole: set[str], partner: Mapping[str, str]) -> None:
        """The second pass: each key's points to its _Points or _Strip, or kept whole (see the class)."""
        points: dict[str, _Points] = {}
        strips: dict[str, _Strip] = {}
        read: dict[str, tuple[array.array[int], array.array[float]]] = {}  # the keys read whole
        read_labels: dict[str, list[tuple[int, str]]] = {}
        nonfinite: dict[str, _Strip] = {}
        for frame in frames:
            step, metrics = frame.step, frame.metrics
            for key, value in metrics.items():
                t = type(value)
                if t is str:
                    if key in whole:
                        read_labels.setdefault(key, []).append((step, value))  # type: ignore[arg-type]
                    else:
                        if key not in strips:
                            strips[key] = _Strip(lo, hi)
                        strips[key].add(step, value)  # type: ignore[arg-type]
                elif t is float and value - value != 0.0:  # type: ignore[operator]
                    if key not in nonfinite:
                        nonfinite[key] = _Strip(lo, hi)
                    nonfinite[key].add(step, "")  # a marker per point, or per bucket in a long run
                elif key in whole:
                    if key not in read:
                        read[key] = array.array("q"), array.array("d")
                    read[key][0].append(step)
                    read[key][1].append(float(value))
                else:
                    series = points.get(key)
                    if series is None:
                        series = points[key] = _Points(lo, hi)
                    other = _finite(metrics.get(partner[key])) if key in partner else math.nan
                    series.add(step, float(value), other)
        self.nonfinite = {key: [step for step, _ in marks.finish()] for key, marks in nonfinite.items()}
        for key, labelled in read_labels.items():
            strips[key] = _Strip(lo, hi)
            for step, label in sorted(dict(labelled).items()):  # the last label of each step
                strips[key].add(step, label)
        points.update(_replayed(read, partner, lo, hi))
        self.labels = {key: strip.finish() for key, strip in strips.items()}
        self.numeric = _drawn(points, partner)

    def keys_of(self, leaf: str) -> list[str]:
        """Present keys whose leaf is ``leaf``, ``train/`` first, then ``val/``, then the rest."""
        found = [k for k in self.keys if k.split("/", 1)[-1] == leaf]
        order = {"train": 0, "val": 1}
        return sorted(found, key=lambda k: (order.get(k.split("/", 1)[0], 2), k))

    def positive_somewhere(self, leaf: str) -> bool | None:
        """``None`` when no key has this leaf; else whether any value is > 0."""
        keys = self.keys_of(leaf)
        if not keys:
            return None
        return any(v > 0 for k in keys for _, v in self.numeric.get(k, []))


class _BandCheck:
    """The first pass's watch on the bands' keys: which pairs of keys there are, and whether the two
    keys of each always come in the same frames (then each point can carry the other key's value)."""

    def __init__(self) -> None:
        self.std_of: dict[str, str] = {}  # a mean key seen -> its band's std key
        self.frames: dict[str, int] = {}  # a band key seen -> the frames holding it
        self.together: dict[str, int] = {}  # a mean key seen -> the frames holding it and its std key

    def new_key(self, key: str) -> None:
        """Called when the pass first sees ``key``; it is watched from there on if a band's."""
        prefix, leaf = key.rsplit("/", 1)[0], key.rsplit("/", 1)[-1]  # as _draw_panel pairs them
        for mean_leaf, std_leaf in _BANDS:
            if leaf == mean_leaf:
                self.std_of[key] = prefix + "/" + std_leaf
                self.together[key] = 0
            if leaf in (mean_leaf, std_leaf):
                self.frames[key] = 0

    def count(self, metrics: Mapping[str, object]) -> None:
        """Called with each frame's metrics."""
        for key in self.frames:
            if key in metrics:
                self.frames[key] += 1
        for mean, std in self.std_of.items():
            if mean in metrics and std in metrics:
                self.together[mean] += 1

    def pairs(self) -> Iterable[tuple[str, str, bool]]:
        """Each band whose two keys were seen: its mean key, its std key, and whether they always came together."""
        for mean, std in self.std_of.items():
            if std in self.frames:
                yield mean, std, self.frames[mean] == self.frames[std] == self.together[mean]


class _Points:
    """The points of one series to draw, fed in increasing step order: every point while there are at
    most ``4 * BUCKETS``, then, from the first point again, the first, last, lowest and highest point of
    each bucket (see :data:`BUCKETS`), chosen as the points come: a bucket's points are known once the
    next bucket's first point comes (the steps increase), so the series holds at most
    ``4 * BUCKETS`` points, 24 bytes each, plus the open bucket's four.

    ``other`` is carried along with each point: the other series' value at the step for a band (see
    :class:`_Data`), NaN for a series that is no band's.
    """

    def __init__(self, lo: int, hi: int) -> None:
        self.lo, self.span = lo, hi - lo + 1
        self.steps: array.array[int] = array.array("q")
        self.values: array.array[float] = array.array("d")
        self.others: array.array[float] = array.array("d")
        self.thinning = False
        self.bucket = -1  # the open bucket, while thinning
        self.first = self.last = self.low = self.high = (0, 0.0, 0.0)  # its points

    def add(self, step: int, value: float, other: float) -> None:
        point = (step, value, other)
        if not self.thinning:
            self._keep(point)
            if len(self.steps) > 4 * BUCKETS:
                self._start_thinning()
            return
        bucket = (step - self.lo) * BUCKETS // self.span
        if bucket != self.bucket:
            self._close()
            self.bucket = bucket
            self.first = self.last = self.low = self.high = point
        else:
            self.last = point
            if value < self.low[1]:  # strictly: the first of equal lows, as np.argmin
                self.low = point
            elif value > self.high[1]:
                self.high = point

    def _start_thinning(self) -> None:
        """Thin the points kept so far, from the first: the series has more than ``4 * BUCKETS``."""
        points = zip(self.steps.tolist(), self.values.tolist(), self.others.tolist())
        self.steps, self.values, self.others = array.array("q"), array.array("d"), array.array("d")
        self.thinning = True
        for point in points:
            self.add(*point)

    def _close(self) -> None:
        """Keep the open bucket's points, once each, in step order."""
        if self.bucket >= 0:
            for _, point in sorted({p[0]: p for p in (self.first, self.low, self.high, self.last)}.items()):
                self._keep(point)

    def _keep(self, point: tuple[int, float, float]) -> None:
        self.steps.append(point[0])
        self.values.append(point[1])
        self.others.append(point[2])

    def finish(self) -> None:
        """Keep the last bucket's points (when thinning): ``steps`` and ``values`` are then the drawing's."""
        if self.thinning:
            self._close()
            self.bucket = -1


class _Strip:
    """The points of one label key (or a key's non-finite points, under one label), fed in increasing
    step order: every point while there are at most ``4 * BUCKETS``, then the first point of each label
    in each bucket (see :data:`BUCKETS`)."""

    def __init__(self, lo: int, hi: int) -> None:
        self.lo, self.span = lo, hi - lo + 1
        self.points: list[tuple[int, str]] = []
        self.firsts: dict[tuple[int, str], int] | None = None  # (bucket, label) -> step, while thinning

    def add(self, step: int, label: str) -> None:
        if self.firsts is not None:
            self.firsts.setdefault(((step - self.lo) * BUCKETS // self.span, label), step)
            return
        self.points.append((step, label))
        if len(self.points) > 4 * BUCKETS:
            points, self.points, self.firsts = self.points, [], {}
            for point in points:
                self.add(*point)

    def finish(self) -> list[tuple[int, str]]:
        if self.firsts is None:
            return self.points
        return sorted((step, label) for (_, label), step in self.firsts.items())


def _finite(value: object) -> float:
    """A metric's value as a point's number, NaN for none (absent, a label, NaN or inf)."""
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return math.nan


def _replayed(read: Mapping[str, tuple[array.array[int], array.array[float]]], partner: Mapping[str, str],
              lo: int, hi: int) -> dict[str, _Points]:
    """The keys read whole, fed to their _Points in step order with the last value of each step (a band's
    key with the other key's value at its steps)."""
    import numpy as np  # matplotlib's own dependency

    lasts: dict[str, tuple[Any, Any]] = {}
    for key, (steps, values) in read.items():
        s, v = np.frombuffer(steps, dtype=np.int64), np.frombuffer(values, dtype=np.float64)
        order = np.argsort(s, kind="stable")
        s, v = s[order], v[order]
        last = np.append(s[1:] != s[:-1], True)  # the last of each step, in file order
        lasts[key] = s[last], v[last]
    points: dict[str, _Points] = {}
    for key, (s, v) in lasts.items():
        others = np.full(len(s), np.nan)
        if partner.get(key) in lasts:
            other_steps, other_values = lasts[partner[key]]
            at = np.minimum(np.searchsorted(other_steps, s), len(other_steps) - 1)
            others = np.where(other_steps[at] == s, other_values[at], np.nan)
        points[key] = _Points(lo, hi)
        for point in zip(s.tolist(), v.tolist(), others.tolist()):
            points[key].add(*point)
    return points


def _drawn(points: Mapping[str, _Points], partner: Mapping[str, str]) -> dict[str, Series]:
    """The series to draw, by key: each key's points, a band's two keys at the steps either kept."""
    drawn: dict[str, Series] = {}
    for key, series in points.items():
        if key not in partner:
            series.finish()
            drawn[key] = list(zip(series.steps.tolist(), series.values.tolist()))
    for key, paired in partner.items():
        if key < paired:  # each band once
            for k, band_series in zip((key, paired), _band(points.get(key), points.get(paired))):
                if band_series:  # a key of a band may have no finite point
                    drawn[k] = band_series
    return drawn


def _band(a: _Points | None, b: _Points | None) -> tuple[Series, Series]:
    """A band's two series, each at every step either kept: a point kept by one series brings the
    other's value at its step, which it carries."""
    rows: dict[int, tuple[float, float]] = {}  # step -> (a's value, b's value), NaN for none
    for series, flip in ((a, False), (b, True)):
        if series is not None:
            series.finish()
            for step, value, other in zip(series.steps.tolist(), series.values.tolist(), series.others.tolist()):
                rows[step] = (other, value) if flip else (value, other)
    ordered = sorted(rows.items())
    return [(s, x) for s, (x, _) in ordered if x == x], [(s, y) for s, (_, y) in ordered if y == y]


# -- alternate x-axes: the run's cumulative tokens, samples or time instead of the step ------

X_AXES = {"step": "", "tokens": "perf/tokens_total", "samples": "perf/samples_total", "time": "perf/time_s"}


def _on_x_axis(data: _Data, key: str) -> None:
    """Put every series of ``data`` on the x-axis ``key`` (a running total, non-decreasing in the
    step): each step maps to the total at that step, linearly between the points kept of a thinned
    long run. A run without the key (``perf`` off) is a MetricsError with the fix."""
    axis = sorted(data.numeric.get(key, []))
    if not axis:
        raise MetricsError(f"plot --x: the journal has no {key} (throughput was off, or no window counted "
                           "it); fix: run with MetricsCallback(perf=True), or plot against the step")
    steps, totals = [s for s, _ in axis], [v for _, v in axis]

    def at(step: int) -> float:
        i = bisect.bisect_left(steps, step)
        if i < len(steps) and steps[i] == step:
            return totals[i]
        if i == 0:
            return totals[0]
        if i == len(steps):
            return totals[-1]
        s0, s1, v0, v1 = steps[i - 1], steps[i], totals[i - 1], totals[i]
        return v0 + (v1 - v0) * (step - s0) / (s1 - s0)

    data.numeric = {k: [(at(s), v) for s, v in series] for k, series in data.numeric.items()}  # type: ignore[misc]
    data.labels = {k: [(at(s), v) for s, v in strip] for k, strip in data.labels.items()}  # type: ignore[misc]
    data.nonfinite = {k: [at(s) for s in steps_] for k, steps_ in data.nonfinite.items()}  # type: ignore[misc]
