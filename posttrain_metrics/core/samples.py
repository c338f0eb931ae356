"""Sample completions: a bounded, deterministic sample of a step's per-sample rows, whole groups kept.

A row is a mapping of column to a plain value (``prompt``, ``completion``, ``reward``, ``advantage``
and any column the user adds). Rows that share the value of the ``group`` column (GRPO's prompt
group) are kept or dropped together; a row without one is a group of its own. Which groups are kept
depends only on the step and the group ids (a hash of both), never on the rank order or on chance,
so a rerun keeps the same rows. Long text is cut at ``max_chars`` and the row says so
(``truncated`` lists the columns cut, each ending with a marker giving how many characters went).
Redaction does not apply: the rows are model text, not config.

>>> rows = [{"group": g, "completion": "x" * n} for g, n in [(0, 3), (0, 5), (1, 9), (2, 2)]]
>>> s = select(7, rows, limit=3, max_chars=4)
>>> [(r["group"], r["completion"], r["truncated"]) for r in s.rows]  # group 0 (2 rows) no longer fits
[(1, 'xxxx… [5 more chars]', 'completion'), (2, 'xx', '')]
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from .errors import MetricsError

__all__ = ["BINS", "GROUP", "HISTOGRAMS", "MAX_CHARS", "Histogram", "Samples", "check_rows", "numeric_columns", "pick", "select"]

GROUP = "group"
"""The column whose value groups rows that are kept or dropped together."""

MAX_CHARS = 2000
"""Default longest text cell, in characters; longer ones are cut and marked."""

_PLAIN = (str, int, float, bool, type(None))


HISTOGRAMS = ("reward", "advantage", "response_len")
"""The numeric columns whose per-step distribution is published as a histogram, when rows carry them."""

BINS = 20


@dataclasses.dataclass(frozen=True)
class Histogram:
    """Counts of ``values`` in ``bins`` equal-width bins from their min to their max (the last bin
    includes the max; all values equal: one bin), with the moments TensorBoard's histograms keep."""

    edges: list[float]
    counts: list[int]
    sum: float
    sum_squares: float

    @property
    def num(self) -> int:
        return sum(self.counts)

    @classmethod
    def of(cls, values: Sequence[float], bins: int = BINS) -> Histogram:
        low, high = min(values), max(values)
        if low == high:
            edges, counts = [low, high], [len(values)]
        else:
            width = (high - low) / bins
            edges = [low + i * width for i in range(bins)] + [high]
            counts = [0] * bins
            for v in values:
                counts[min(int((v - low) / width), bins - 1)] += 1
        return cls(edges, counts, math.fsum(values), math.fsum(v * v for v in values))


def numeric_columns(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[float]]:
    """The finite numbers of each :data:`HISTOGRAMS` column over ``rows`` (bools and text left out)."""
    out: dict[str, list[float]] = {}
    for column in HISTOGRAMS:
        values = [float(r[column]) for r in rows
                  if type(r.get(column)) in (int, float) and math.isfinite(r[column])]
        if values:
            out[column] = values
    return out


@dataclasses.dataclass(frozen=True)
class Samples:
    """The rows of one step as published: ``columns`` in order, every row holding each of them."""

    step: int
    rows: list[dict[str, Any]]
    columns: list[str]
    offered: int  # rows offered on every rank before the sample was taken
    wall_time: float = 0.0
    histograms: dict[str, Histogram] = dataclasses.field(default_factory=dict)
    """Per numeric column of :data:`HISTOGRAMS`, the distribution over every row offered (not only
    the sample)."""
    run_id: str = ""
    """The run the rows belong to (a samples file left by another run at the same path is told apart)."""

    def table(self) -> list[list[Any]]:
        """The rows as lists in column order (a W&B Table's ``data``)."""
        return [[row.get(c) for c in self.columns] for row in self.rows]

    def markdown(self) -> str:
        """A Markdown table (TensorBoard's text plugin renders it)."""
        def cell(value: Any) -> str:
            text = "" if value is None else str(value)
            return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", "<br>")

        head = [f"step {self.step}: {len(self.rows)} of {self.offered} rows", "",
                "| " + " | ".join(cell(c) for c in self.columns) + " |",
                "|" + "---|" * len(self.columns)]
        return "\n".join(head + ["| " + " | ".join(cell(row.get(c)) for c in self.columns) + " |" for row in self.rows])

    def to_record(self) -> dict[str, Any]:
        record = {"kind": "samples", "step": self.step, "time": self.wall_time, "offered": self.offered,
                  "columns": self.columns, "rows": self.table()}
        if self.run_id:
            record["run_id"] = self.run_id
        if self.histograms:
            record["histograms"] = {k: dataclasses.asdict(h) for k, h in self.histograms.items()}
        return record

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Samples:
        columns = [str(c) for c in record["columns"]]
        rows = [dict(zip(columns, values)) for values in record["rows"]]
        step = record["step"]
        if isinstance(step, bool) or not isinstance(step, int):
            raise ValueError(f"step {step!r:.40} is not an integer")
        histograms = {str(k): Histogram(**h) for k, h in dict(record.get("histograms", {})).items()}
        return cls(step, rows, columns, int(record.get("offered", len(rows))), float(record.get("time", 0.0)),
                   histograms, str(record.get("run_id", "")))


def check_rows(rows: object, where: str = "on_samples") -> list[dict[str, Any]]:
    """``rows`` as a list of plain dicts (copies), or a MetricsError naming the bad row and the fix."""
    if isinstance(rows, (str, bytes, Mapping)) or not isinstance(rows, Sequence):
        raise MetricsError(f"{where}: rows must be a list of dicts (one per sample), got {type(rows).__name__}; "
                           "fix: pass [{'prompt': ..., 'completion': ..., 'reward': ...}, ...]")
    out = []
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise MetricsError(f"{where}: row {i} is a {type(row).__name__}, not a dict; fix: one dict per sample")
        clean: dict[str, Any] = {}
        for key, value in row.items():
            if not isinstance(key, str):
                raise MetricsError(f"{where}: row {i} has the column {key!r:.40} ({type(key).__name__}); fix: "
                                   "name columns with strings")
            if type(value) is str:  # the common case first: this runs on the training thread
                clean[key] = value
                continue
            if hasattr(value, "item") and callable(value.item):  # a 0-d tensor or a numpy scalar
                value = value.item()
            if not isinstance(value, _PLAIN):
                raise MetricsError(f"{where}: row {i}, column {key!r}: got a {type(value).__name__} ({value!r:.60}); "
                                   "fix: pass text, a number, a bool or None")
            if isinstance(value, float) and not math.isfinite(value):
                value = None  # strict JSON everywhere: a NaN reward shows as an empty cell
            clean[key] = value
        out.append(clean)
    return out


def _rank(step: int, group: str) -> str:
    """The order groups are offered in: sha256 of ``"<step>:<group as JSON>"``, e.g. ``'7:["group", 0]'``."""
    return hashlib.sha256(f"{step}:{group}".encode()).hexdigest()


def pick(step: int, rows: Sequence[Mapping[str, Any]], *, limit: int) -> list[int]:
    """The indices of the rows :func:`select` keeps, in order (no truncation)."""
    by_id: dict[tuple[str, Any], list[int]] = {}
    for i, row in enumerate(rows):
        group = row.get(GROUP)
        by_id.setdefault(("group", group) if group is not None else ("row", i), []).append(i)
    groups = {json.dumps(list(ident), default=str): members for ident, members in by_id.items()}
    kept: list[int] = []
    for key in sorted(groups, key=lambda k: _rank(step, k)):
        members = groups[key]
        if len(kept) + len(members) <= limit:
            kept.extend(members)
    return sorted(kept)


def select(step: int, rows: Sequence[Mapping[str, Any]], *, limit: int, max_chars: int = MAX_CHARS,
           offered: int | None = None) -> Samples:
    """At most ``limit`` rows of ``rows``, whole groups, chosen by a hash of (step, group), in their
    original order, text cut at ``max_chars``. A group larger than what is left of the limit is
    skipped (a smaller one may still fit)."""
    columns: list[str] = []
    chosen = []
    for i in pick(step, rows, limit=limit):
        row = dict(rows[i])
        cut = []
        for column, value in row.items():
            if isinstance(value, str) and len(value) > max_chars:
                row[column] = f"{value[:max_chars]}… [{len(value) - max_chars} more chars]"
                cut.append(column)
        row["truncated"] = ",".join(cut)
        chosen.append(row)
        columns.extend(c for c in row if c not in columns)
    columns = [c for c in columns if c != "truncated"] + ["truncated"] if chosen else []
    return Samples(step, chosen, columns, len(rows) if offered is None else offered)
