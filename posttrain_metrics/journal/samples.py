"""The samples file: the completions a run published, one JSON line per step, beside the journal.

``<journal stem>.samples.jsonl`` next to ``journal.jsonl`` (a separate file, so the metrics journal
stays small). Each line is ``{"kind": "samples", "step", "time", "offered", "columns": [...],
"rows": [[...], ...]}`` (see :class:`Samples`). Written on global
rank 0 by the callback, flushed per line; tailed by the publisher (live) and read by ``export``.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core.errors import MetricsError
from ..core.warn import warn
from .format import RunFile
from .lines import LineFile

__all__ = ["BINS", "HISTOGRAMS", "Histogram", "Samples", "SamplesFile", "SamplesTail", "check_span", "read_samples",
           "samples_path"]

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
    def of(cls, values: Sequence[float], bins: int = BINS, column: str = "values") -> Histogram:
        """The histogram of ``values``; a value equal to an interior edge goes in the bin that edge
        opens (found on the published edges themselves, so a reader's edges and our counts agree:
        ``(v - low) / width`` can round one bin low). A span beyond float64 is a MetricsError naming
        ``column``."""
        low, high = min(values), max(values)
        check_span(column, low, high)
        if low == high:
            edges, counts = [low, high], [len(values)]
        else:
            width = (high - low) / bins
            edges = [low + i * width for i in range(bins)] + [high]
            counts = [0] * bins
            for v in values:
                counts[min(max(bisect.bisect_right(edges, v) - 1, 0), bins - 1)] += 1
        return cls(edges, counts, math.fsum(values), math.fsum(v * v for v in values))


def check_span(column: str, low: float, high: float) -> None:
    """A MetricsError naming ``column`` when its values span more than float64 holds: the bin width
    would be inf and the edges NaN, which no tracker can draw."""
    if not math.isfinite(high - low):
        raise MetricsError(
            f"on_samples: the column {column!r} spans {low!r} to {high!r}, wider than a float64 can hold "
            "(its histogram's bin width would be inf); fix: pass values within +/-8.9e307, e.g. rescaled"
        )


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


def samples_path(journal: Path) -> Path:
    """The samples file of the journal at ``journal``: ``journal.jsonl`` -> ``journal.samples.jsonl``
    (:class:`~posttrain_metrics.journal.format.RunFile`: under the journal's folder rule, moved with it)."""
    return RunFile.SAMPLES.of(journal)


class SamplesFile:
    """Appends one line per step's samples, flushed (a killed run leaves whole lines). A line that
    cannot be written (a full disk) is not in the file at all (see :class:`~posttrain_metrics.journal.lines.LineFile`):
    ``write`` raises the ``OSError`` and the next step's line is written whole after the last one."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = LineFile(path)

    def write(self, samples: Samples) -> int:
        """Append ``samples``; the bytes written."""
        if self._file.closed:
            self._file.open()
        line = json.dumps(samples.to_record(), separators=(",", ":"), ensure_ascii=False, allow_nan=False) + "\n"
        data = line.encode("utf-8")
        self._file.append(data)
        return len(data)

    def close(self) -> None:
        self._file.close()


def read_samples(path: str | os.PathLike[str]) -> list[Samples]:
    """Every step's samples in ``path`` (none when it does not exist); a torn last line is skipped."""
    p = Path(path)
    if not p.is_file():
        return []
    return SamplesTail(p).read(final=True)


class SamplesTail:
    """The complete sample lines appended since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def read(self, *, final: bool = False) -> list[Samples]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        out = []
        for line in data[:end].splitlines():
            if not line.strip():
                continue
            try:
                out.append(Samples.from_record(json.loads(line)))
            except (ValueError, KeyError, TypeError) as exc:  # one bad line never stops the others
                # A warning, not a log record: it is about the file its reader was handed, as the
                # journal reader's torn line is (a caller can make it an error with a warnings filter).
                warn(f"{self.path}: skipped a samples line that is not one ({exc!r:.120})", stacklevel=2)
        self.offset += end
        if final and data[end:].strip():
            warn(f"{self.path}: skipped a torn last line (the writer stopped mid-line)", stacklevel=2)
        return out
