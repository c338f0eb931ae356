"""A one-page PNG dashboard of a run from its journal, with the doctor's findings marked.

Panels are chosen from what the journal holds. :data:`PANELS` groups the catalogue's families
(reward and groups, loss, KL, clipping, response length and truncation, logprob gap, score
centering, PPO counters, DPO accuracy and rewards, ...) by leaf name, so one table serves every
algorithm: a panel is drawn when at least one of its keys is present, and a key that is absent is
simply not drawn. Any headline key of the run's adapters (``Metric.headline``) that no panel shows
gets a panel of its own, so a user-registered adapter still gets its headline curves. Label-valued
keys (``optim/update_outcome``, ``optim/skip_reason``) become a strip of markers per label.

Findings are marked where they fire: a shaded span (red for errors, orange for warnings, blue for
info) on every panel that shows a key the finding is about, one row per finding in a findings strip,
and the list of findings as text under it. Non-finite points are marked with a red ``x`` along the
top edge of their panel.

matplotlib is imported inside :func:`dashboard` (the ``plot`` extra) and drives the Agg canvas
directly, so neither the import of this module nor a call changes pyplot's global backend.
"""

from __future__ import annotations

import array
import bisect
import dataclasses
import math
import os
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .core.catalog import get_adapter
from .core.errors import MetricsError
from .core.keys import describe
from .core.redact import redact_text
from .doctor import BUDGET_CONFIG_NAMES, Finding, JournalLike, Severity, config_int, step_ranges

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from .core.frame import Frame

__all__ = ["PANELS", "Panel", "dashboard"]


@dataclasses.dataclass(frozen=True)
class Panel:
    """One chart: the leaves it draws (under any namespace: ``train/``, ``val/``, ``optim/``).

    ``right`` leaves go on a second y axis (another unit). ``log`` asks for a log y axis, used when
    every value is positive and they span more than :data:`LOG_SPAN` (KL mean vs max). ``band`` is
    ``(mean_leaf, std_leaf)`` drawn as mean +- std, kept at each step within ``band_within``
    ``(min_leaf, max_leaf)`` where those are logged: a 0/1 reward's mean +- std runs past 0 and 1,
    values no sample had. A panel whose ``gate`` key is present but never positive is left out
    (score centering off). ``hline`` is a reference level (DPO chance).
    """

    title: str
    leaves: tuple[str, ...]
    right: tuple[str, ...] = ()
    log: bool = False
    band: tuple[str, str] | None = None
    band_within: tuple[str, str] | None = None
    gate: str | None = None
    hline: float | None = None
    budget_line: bool = False


PANELS: tuple[Panel, ...] = (
    Panel("Reward", ("reward_mean", "reward_avg", "reward_min", "reward_max"), band=("reward_mean", "reward_std"),
          band_within=("reward_min", "reward_max")),
    Panel("Groups (GRPO)", ("grpo_group_count", "grpo_informative_group_count", "grpo_all_zero_group_count",
                            "grpo_all_one_group_count")),
    Panel("Loss", ("loss_avg", "policy_total_loss", "policy_loss", "value_loss", "critic_loss")),
    Panel("Gradient norm (pre-clip)", ("grad_norm",), log=True),
    Panel("KL to reference", ("kl_mean", "kl_max", "reference_kl_mean"), log=True, gate="kl_beta"),
    Panel("Clipping and importance ratio", ("clip_frac", "ratio_absdev", "seq_clip_frac", "clip_fraction",
                                            "value_clip_fraction", "initial_clip_fraction")),
    Panel("Response length and truncation", ("response_len_mean", "response_len_max"),
          right=("rollout_truncated_frac",), budget_line=True),
    Panel("Train/rollout logprob gap", ("logprob_gap_mean", "mean_rank_logprob_gap_p99"),
          right=("logprob_gap_gt0p5_frac",), gate="logprob_gap_token_count"),
    Panel("Score centering", ("sc_rho_mean", "sc_rho_max"), right=("sc_out_of_head_frac",), log=True,
          gate="sc_token_count"),
    Panel("DPO accuracy", ("dpo_accuracy",), hline=0.5),
    Panel("DPO implicit rewards", ("dpo_reward_margin", "dpo_reward_winner", "dpo_reward_loser")),
    Panel("PPO optimizer counters", ("policy_optimizer_step", "critic_optimizer_step"), right=("actor_warmup",)),
    Panel("PPO value and advantage", ("value_mean", "return_mean", "advantage_mean")),
    Panel("Learning rate", ("learning_rate", "policy_lr", "critic_lr"), log=True),
    Panel("Throughput", ("tokens_per_s",), right=("window_s",)),
)
"""The families drawn when present, in page order (two per row)."""

LOG_SPAN = 50.0
"""A ``log`` panel switches to a log axis when its positive values span more than this factor
(zeros are then left out of the curve: on these keys they mean "nothing measured")."""

FAINT = frozenset({"reward_min", "reward_max"})
"""Leaves drawn thin and translucent: context for the panel's main curve, not a curve to read."""

SEVERITY_COLOURS = {Severity.ERROR: "#d62728", Severity.WARNING: "#ff7f0e", Severity.INFO: "#1f77b4"}
LABEL_COLOURS = {"applied": "#2ca02c", "accumulating": "#7f7f7f", "skipped": "#d62728", "discarded": "#ff7f0e"}
NONFINITE_COLOUR = "#d62728"


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


def _headline_keys(adapters: Iterable[str]) -> tuple[dict[str, str], set[str]]:
    """Headline keys of the run's adapters (key -> unit) and the adapters this process lacks."""
    heads: dict[str, str] = {}
    unknown = set()
    for name in adapters:
        try:
            adapter = get_adapter(name)
        except MetricsError:
            unknown.add(name)  # a user adapter not registered here: its keys still plot by leaf
            continue
        for key, info in describe([adapter]).items():
            if info.metric.headline:
                heads[key] = info.metric.unit
    return heads, unknown


def _import_matplotlib() -> tuple[Any, Any]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise MetricsError(
            "the plot needs matplotlib, which is not installed; fix: pip install 'posttrain-metrics[plot]'"
        ) from None
    return Figure, FigureCanvasAgg


def dashboard(journal: JournalLike, findings: Sequence[Finding], output_path: str | os.PathLike[str],
              *, x: str = "step") -> Path:
    """Write the run's one-page dashboard as a PNG at ``output_path``; returns the path written.
    ``x`` is the x-axis: ``step``, or (runs with ``perf`` on) ``tokens``, ``samples`` or ``time``."""
    path = Path(output_path)
    if path.suffix.lower() != ".png":
        raise MetricsError(f"plot output {str(path)!r} is not a .png file; fix: name it FILE.png")
    if x not in X_AXES:
        raise MetricsError(f"plot --x {x!r}; fix: one of {list(X_AXES)}")
    figure_cls, canvas_cls = _import_matplotlib()
    data = _Data(journal)
    if x != "step":
        _on_x_axis(data, X_AXES[x])
        findings = [dataclasses.replace(f, steps=()) if f.steps else f for f in findings]  # marks are by step
    heads, unknown = _headline_keys(journal.adapters)
    panels = _choose_panels(data, heads)
    strips = sorted(data.labels)
    marked = [f for f in findings if f.steps]

    columns = 2
    rows = max(1, math.ceil(len(panels) / columns))
    strip_rows = sum(len({v for _, v in data.labels[k]}) for k in strips)
    text_lines = _finding_lines(findings)
    heights = [0.55] + [2.7] * rows
    if strips:
        heights.append(0.55 + 0.22 * strip_rows)
    if marked:
        heights.append(0.55 + 0.28 * len(marked))
    heights.append(0.3 + 0.19 * len(text_lines))
    fig: Figure = figure_cls(figsize=(PAGE_WIDTH, sum(heights) + 0.6), layout="constrained")
    canvas_cls(fig)
    grid = fig.add_gridspec(len(heights), columns, height_ratios=heights)

    header = fig.add_subplot(grid[0, :])
    header.set_axis_off()
    header.text(0.5, 0.78, f"{_title(journal.header.get('name'))}  ·  run {journal.run_id}", ha="center",
                va="center", fontsize=15,
                fontweight="bold", transform=header.transAxes)
    header.text(0.5, 0.12, _subtitle(journal, data, findings, unknown), ha="center", va="center",
                fontsize=9.5, color="#444444", transform=header.transAxes)

    first: Axes | None = None
    time_axes: list[Axes] = []
    budget, _ = config_int(journal.config, BUDGET_CONFIG_NAMES, prefer="rollout")
    for i, (panel, keys, right_keys) in enumerate(panels):
        row, column = 1 + i // columns, i % columns
        ax = fig.add_subplot(grid[row, column], sharex=first)
        first = first or ax
        _draw_panel(ax, panel, keys, right_keys, data, heads, budget)
        _mark_findings(ax, findings, {*keys, *right_keys})
        time_axes.append(ax)
    if not panels:
        ax = fig.add_subplot(grid[1, :])
        ax.set_axis_off()
        ax.text(0.5, 0.5, "the journal holds no numeric series to plot", ha="center", va="center")
    row = 1 + rows
    if strips:
        ax = fig.add_subplot(grid[row, :], sharex=first)
        _draw_strips(ax, strips, data)
        time_axes.append(ax)
        row += 1
    if marked:
        ax = fig.add_subplot(grid[row, :], sharex=first)
        _draw_findings_strip(ax, marked)
        time_axes.append(ax)
        row += 1
    bottom = time_axes[-1:] if strips or marked else time_axes[-len(panels) % columns or -columns :]
    for ax in bottom:
        ax.set_xlabel("step" if x == "step" else X_AXES[x], fontsize=9)
    if first is not None and x == "step":
        from matplotlib.ticker import MaxNLocator

        first.xaxis.set_major_locator(MaxNLocator(integer=True))  # shared: steps are integers
    ax = fig.add_subplot(grid[row, :])
    _draw_findings_text(ax, text_lines)

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=100)
    return path


# -- alternate x-axes (issue 28): the run's cumulative tokens, samples or time instead of the step ------

X_AXES = {"step": "", "tokens": "perf/tokens_total", "samples": "perf/samples_total", "time": "perf/time_s"}


def _on_x_axis(data: _Data, key: str) -> None:
    """Put every series of ``data`` on the x-axis ``key`` (a running total, non-decreasing in the
    step): each step maps to the total at that step, linearly between the points kept of a thinned
    long run. A run without the key (``perf`` off) is a MetricsError with the fix."""
    axis = sorted(data.numeric.get(key, []))
    if not axis:
        raise MetricsError(f"plot --x: the journal has no {key} (throughput was off); fix: run with "
                           "MetricsCallback(perf=True), or plot against the step")
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


def _choose_panels(data: _Data, heads: Mapping[str, str]) -> list[tuple[Panel, list[str], list[str]]]:
    chosen = []
    shown: set[str] = set()
    for panel in PANELS:
        if panel.gate is not None and data.positive_somewhere(panel.gate) is False:
            continue
        keys = [k for leaf in panel.leaves for k in data.keys_of(leaf)]
        right = [k for leaf in panel.right for k in data.keys_of(leaf)]
        if keys or right:
            chosen.append((panel, keys, right))
            shown.update(keys, right)
    for key in heads:
        if key in data.keys and key not in shown:  # a headline key no family shows: its own panel
            chosen.append((Panel(key, (key.split("/", 1)[-1],)), [key], []))
            shown.add(key)
    return chosen


def _draw_panel(
    ax: Axes,
    panel: Panel,
    keys: list[str],
    right_keys: list[str],
    data: _Data,
    heads: Mapping[str, str],
    budget: int | None,
) -> None:
    ax.set_title(panel.title, fontsize=11, loc="left")
    ax.grid(True, alpha=0.3)
    if panel.band is not None:
        means, stds = data.keys_of(panel.band[0]), data.keys_of(panel.band[1])
        for mean_key in means:
            std_key = mean_key.rsplit("/", 1)[0] + "/" + panel.band[1]
            if std_key in stds:
                std = dict(data.numeric.get(std_key, []))
                pts = [(s, m, std[s]) for s, m in data.numeric.get(mean_key, []) if s in std]
                low, high = _band_limits(panel, mean_key, data)
                if pts:
                    ax.fill_between([p[0] for p in pts],
                                    [max(p[1] - p[2], low.get(p[0], -math.inf)) for p in pts],
                                    [min(p[1] + p[2], high.get(p[0], math.inf)) for p in pts],
                                    alpha=0.15, color="#1f77b4", linewidth=0, label=f"{_short(mean_key)} ± std")
    for key in keys:
        _line(ax, key, data, heads)
    _scale(ax, panel, keys, data)
    if panel.hline is not None:
        ax.axhline(panel.hline, color="#555555", linestyle=":", linewidth=1, label=f"chance {panel.hline:g}")
    if panel.budget_line and budget is not None:
        ax.axhline(budget, color="#d62728", linestyle=":", linewidth=1, label=f"token budget {budget}")
    _mark_nonfinite(ax, keys, data)
    lines, labels = ax.get_legend_handles_labels()
    if right_keys:
        twin = ax.twinx()
        for j, key in enumerate(right_keys):
            _line(twin, key, data, heads, colour=f"C{len(keys) + j}", dashed=True)
        twin.tick_params(labelsize=8)
        right_values = [v for k in right_keys for _, v in data.numeric.get(k, [])]
        if right_values and min(right_values) >= 0:
            twin.set_ylim(bottom=0)  # fractions and flags: no negative half for a constant 0
        twin.yaxis.set_major_formatter(_formatter())
        _mark_nonfinite(twin, right_keys, data)
        more, more_labels = twin.get_legend_handles_labels()
        lines, labels = lines + more, [*labels, *(f"{label} (right axis)" for label in more_labels)]
    if lines:  # between the title and the plot area: never over a curve
        ncol = min(3, len(lines))
        ax.legend(lines, labels, fontsize=7.5, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=ncol,
                  frameon=False, borderaxespad=0.15, handlelength=1.6, columnspacing=1.2)
        ax.set_title(panel.title, fontsize=11, loc="left", pad=4 + 11.5 * math.ceil(len(lines) / ncol))
    if ax.get_yscale() == "linear":  # plain tick labels: an offset text would sit on the legend
        ax.yaxis.set_major_formatter(_formatter())
    ax.tick_params(labelsize=8)


def _band_limits(panel: Panel, mean_key: str, data: _Data) -> tuple[dict[int, float], dict[int, float]]:
    """The band's floor and ceiling by step: the same family's logged minimum and maximum (a step
    without them is not limited)."""
    if panel.band_within is None:
        return {}, {}
    prefix = mean_key.rsplit("/", 1)[0]
    low, high = (dict(data.numeric.get(f"{prefix}/{leaf}", [])) for leaf in panel.band_within)
    return low, high


def _line(ax: Axes, key: str, data: _Data, heads: Mapping[str, str], *, colour: str | None = None,
          dashed: bool = False) -> Any:
    points = data.numeric.get(key, [])
    val = key.startswith("val/")
    label = _short(key) + (f" [{heads[key]}]" if heads.get(key) else "")
    style: dict[str, Any] = {
        "label": label,
        "linewidth": 2.0 if key in heads else 1.2,
        "linestyle": "--" if dashed or val else "-",
        "marker": "o" if val or len(points) <= 12 else None,
        "markersize": 4,
    }
    if key.split("/", 1)[-1] in FAINT:
        style.update(linewidth=0.8, alpha=0.55)
    if colour is not None:
        style["color"] = colour
    return ax.plot([s for s, _ in points], [v for _, v in points], **style)[0]


def _formatter() -> Any:
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda value, _pos: f"{value:.3g}")


def _short(key: str) -> str:
    """``train/kl_mean`` -> ``kl_mean``; other namespaces (``val/``, ``optim/``) stay visible."""
    return key.split("/", 1)[1] if key.startswith("train/") else key


def _scale(ax: Axes, panel: Panel, keys: list[str], data: _Data) -> None:
    if not panel.log:
        return
    values = [v for k in keys for _, v in data.numeric.get(k, [])]
    positive = [v for v in values if v > 0]
    # Exact zeros are steps with nothing to measure (no loss tokens, a zero-gradient skip); a
    # negative value means the quantity is not a magnitude, and then the axis stays linear.
    if positive and min(values) >= 0 and max(positive) / min(positive) > LOG_SPAN:
        ax.set_yscale("log", nonpositive="mask")


def _mark_nonfinite(ax: Axes, keys: list[str], data: _Data) -> None:
    steps = sorted({s for k in keys for s in data.nonfinite.get(k, [])})
    if steps:
        ax.plot(steps, [0.96] * len(steps), linestyle="none", marker="x", markersize=7, markeredgewidth=2,
                color=NONFINITE_COLOUR, transform=ax.get_xaxis_transform(), label="NaN/inf", clip_on=False)


def _spans(steps: Sequence[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for step in sorted(set(steps)):
        if out and step == out[-1][1] + 1:
            out[-1] = (out[-1][0], step)
        else:
            out.append((step, step))
    return out


def _mark_findings(ax: Axes, findings: Sequence[Finding], keys: set[str]) -> None:
    for finding in findings:
        if not finding.steps or not keys & set(finding.keys):
            continue
        colour = SEVERITY_COLOURS[finding.severity]
        alpha = 0.08 if finding.severity is Severity.INFO else 0.16
        for start, stop in _spans(finding.steps):
            ax.axvspan(start - 0.5, stop + 0.5, color=colour, alpha=alpha, linewidth=0)


def _draw_strips(ax: Axes, strips: list[str], data: _Data) -> None:
    rows: list[str] = []
    for key in strips:
        seen = list(dict.fromkeys(v for _, v in data.labels[key]))
        for label in seen:
            y = len(rows)
            rows.append(f"{key.split('/', 1)[-1]}: {label}")
            steps = [s for s, v in data.labels[key] if v == label]
            ax.scatter(steps, [y] * len(steps), s=14, marker="|" if data.many_steps else "s",
                       color=LABEL_COLOURS.get(label, f"C{len(rows) % 10}"), linewidths=1.5)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.invert_yaxis()
    ax.set_title("Label keys (one row per label)", fontsize=11, loc="left")
    ax.grid(True, axis="x", alpha=0.3)
    ax.tick_params(axis="x", labelsize=8)


def _draw_findings_strip(ax: Axes, findings: Sequence[Finding]) -> None:
    for y, finding in enumerate(findings):
        colour = SEVERITY_COLOURS[finding.severity]
        for start, stop in _spans(finding.steps):
            ax.barh(y, stop - start + 1, left=start - 0.5, height=0.6, color=colour, alpha=0.85)
    ax.set_yticks(range(len(findings)), [f"{f.severity.value}: {f.check}" for f in findings], fontsize=8)
    ax.set_ylim(-0.7, len(findings) - 0.3)
    ax.invert_yaxis()
    ax.set_title("Doctor findings (where they fire)", fontsize=11, loc="left")
    ax.grid(True, axis="x", alpha=0.3)
    ax.tick_params(axis="x", labelsize=8)


PAGE_WIDTH = 15.0
"""The dashboard's width in inches."""
FINDING_FONT = 8.5
# a monospace character is 0.6 em wide (DejaVu Sans Mono: 1233/2048): the line, indent included,
# fits 96% of the page from its 1% margin
FINDING_CHARS = int(0.96 * PAGE_WIDTH * 72 / (0.6021 * FINDING_FONT)) - 6
"""Characters of a finding's line in the dashboard (its continuation lines are indented by 6)."""
FINDING_LINES = 4
"""Lines of one finding at most (the doctor's report has the rest)."""


def _finding_lines(findings: Sequence[Finding]) -> list[tuple[str, Severity | None]]:
    if not findings:
        return [("doctor: no findings, every check passed", None)]
    lines: list[tuple[str, Severity | None]] = []
    for finding in findings:
        where = f" (steps {step_ranges(finding.steps, limit=6)})" if finding.steps else ""
        text = f"{finding.severity.value.upper()} {finding.check}{where}: {finding.explanation}"
        wrapped = textwrap.wrap(text, width=FINDING_CHARS, max_lines=FINDING_LINES, placeholder=" ...")
        lines.extend((line if i == 0 else "      " + line, finding.severity) for i, line in enumerate(wrapped))
    return lines


def _draw_findings_text(ax: Axes, lines: list[tuple[str, Severity | None]]) -> None:
    """From the page's left edge, not the axes' (which starts where the panels' tick labels end):
    :data:`FINDING_CHARS` monospace characters then fit the page's width."""
    from matplotlib.transforms import blended_transform_factory

    ax.set_axis_off()
    n = len(lines)
    where = blended_transform_factory(ax.figure.transFigure, ax.transAxes)
    for i, (line, severity) in enumerate(lines):
        colour = SEVERITY_COLOURS[severity] if severity is not None else "#2ca02c"
        ax.text(0.01, 1.0 - (i + 0.5) / n, line, transform=where, fontsize=FINDING_FONT, va="center",
                family="monospace", color="#222222" if line.startswith(" ") else colour)


TITLE_CHARS = 48
"""The longest run name the plot's title shows; a longer one is cut, ending with "…" (a 5 MB name
overflows the font rasteriser, and a long one is wider than the figure)."""


def _title(name: object) -> str:
    """The run name as the title shows it: redacted (a journal written before names were), cut at
    :data:`TITLE_CHARS`, ``$`` escaped (matplotlib would read ``$...$`` as mathtext, and a malformed one
    fails the drawing). Only its start is redacted and shown: a name of megabytes costs nothing."""
    text = redact_text(str(name or "")[: 16 * TITLE_CHARS]) or "(unnamed run)"
    if len(text) > TITLE_CHARS:
        text = f"{text[:TITLE_CHARS]}…"
    return text.replace("$", r"\$")


def _subtitle(journal: JournalLike, data: _Data, findings: Sequence[Finding], unknown: set[str]) -> str:
    counts = {s: sum(f.severity is s for f in findings) for s in Severity}
    end = journal.end
    status = str(end.get("status", "?")) if end is not None else "no end record"
    steps = f"steps {data.first_step}-{data.last_step}" if data.first_step is not None else "no frames"
    parts = [
        f"adapters: {', '.join(journal.adapters) or '(none)'}",
        f"{len(journal.frames)} frames, {steps}",
        f"status: {status}",
        "doctor: " + ", ".join(f"{n} {s.value}{'' if n == 1 or s is Severity.INFO else 's'}"
                               for s, n in counts.items()),
    ]
    if unknown:
        parts.append(f"adapters not registered here: {', '.join(sorted(unknown))}")
    return "   |   ".join(parts)
