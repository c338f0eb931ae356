"""The dashboard's page: panels, label strips and the doctor's findings drawn with matplotlib's Agg canvas."""

from __future__ import annotations

import dataclasses
import math
import os
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import MetricsError
from ..core.keys import describe
from ..core.redact import redact_text
from ..doctor import BUDGET_CONFIG_NAMES, Finding, JournalLike, Severity, config_int, step_ranges
from ..journal import header_adapter
from .panels import PANELS, Panel
from .series import X_AXES, _Data, _on_x_axis

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["dashboard"]


LOG_SPAN = 50.0
"""A ``log`` panel switches to a log axis when its positive values span more than this factor
(zeros are then left out of the curve: on these keys they mean "nothing measured")."""

FAINT = frozenset({"reward_min", "reward_max"})
"""Leaves drawn thin and translucent: context for the panel's main curve, not a curve to read."""

SEVERITY_COLOURS = {Severity.ERROR: "#d62728", Severity.WARNING: "#ff7f0e", Severity.INFO: "#1f77b4"}
LABEL_COLOURS = {"applied": "#2ca02c", "accumulating": "#7f7f7f", "skipped": "#d62728", "discarded": "#ff7f0e"}
NONFINITE_COLOUR = "#d62728"


def _headline_keys(header: Mapping[str, Any]) -> tuple[dict[str, str], set[str]]:
    """Headline keys of the run's adapters (key -> unit) and the adapters this process lacks."""
    heads: dict[str, str] = {}
    unknown = set()
    for name in header.get("adapters", []):
        try:
            adapter = header_adapter(header, name)  # rebuilt from the header's declarations
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
    heads, unknown = _headline_keys(journal.header)
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
    """The run name as the title shows it: redacted (a journal from another writer may hold a secret in
    it), cut at :data:`TITLE_CHARS`, ``$`` escaped (matplotlib would read ``$...$`` as mathtext, and a
    malformed one fails the drawing). Only its start is redacted and shown: a name of megabytes costs nothing."""
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
