"""What the TensorBoard sink writes as text: a chart's description, the run's config table and a
step's samples as Markdown (TensorBoard's text tab renders Markdown)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ...core.keys import KeyInfo
from ...core.reduction import Reduction
from ..base import RunInfo

__all__ = ["WIDE_CELL", "samples_markdown"]


def _description(key: str, keys: Mapping[str, KeyInfo]) -> str:
    info = keys.get(key)
    if info is None:
        parent, _, label = key.rpartition("/")
        if parent in keys and label in keys[parent].metric.labels:
            return f"1 when `{parent}` is `{label}` at this step, else 0"
        return ""
    m = info.metric
    how = m.reduction.value.replace("_", " ")
    if info.weight_key and m.reduction is Reduction.WEIGHTED_MEAN:
        how += f" by `{info.weight_key}`"
    unit = f"{m.unit}; " if m.unit else ""
    return f"{m.meaning} ({unit}{how} over chunks and ranks)" if m.meaning else f"({unit}{how})"


def _config_table(run: RunInfo) -> str:
    def cell(value: object) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    lines = [f"run `{run.name}` ({run.run_id}), adapters: {', '.join(run.adapters)}", "",
             "| key | value |", "|---|---|"]
    lines += [f"| {cell(k)} | {cell(v)} |" for k, v in run.config.items()]
    return "\n".join(lines)


WIDE_CELL = 120
"""Characters beyond which a column's text leaves the samples table (see :func:`samples_markdown`)."""
_MARKDOWN_SPECIALS = re.compile(r"([\\`*_\[\]#|])")


def _paragraph(value: object) -> str:
    """Model text as one Markdown paragraph shown as written (``<think>`` included): Markdown's
    specials backslash-escaped, HTML's as entities (Markdown has no escape for ``<``), lines kept."""
    text = "" if value is None else str(value)
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MARKDOWN_SPECIALS.sub(r"\\\1", text).replace("\n", "<br>")


def samples_markdown(samples: Any) -> str:
    """A step's samples for TensorBoard's text tab. A table sizes each column to its longest cell,
    so one 2,000-character completion squeezed the other columns to a letter a line: a column with
    a cell longer than :data:`WIDE_CELL` leaves the table, which numbers its rows (``#``), and is
    written under the table row by row. Short text keeps the plain table (``Samples.markdown``)."""
    wide = [c for c in samples.columns
            if any(len("" if r.get(c) is None else str(r.get(c))) > WIDE_CELL for r in samples.rows)]
    if not wide:
        return str(samples.markdown())
    narrow = [c for c in samples.columns if c not in wide]

    def cell(value: object) -> str:
        return ("" if value is None else str(value)).replace("\\", "\\\\").replace("|", "\\|").replace("\n", "<br>")

    lines = [f"step {samples.step}: {len(samples.rows)} of {samples.offered} rows "
             f"({', '.join(wide)}: below the table)", "",
             "| # | " + " | ".join(cell(c) for c in narrow) + " |", "|" + "---|" * (len(narrow) + 1)]
    lines += [f"| {i} | " + " | ".join(cell(row.get(c)) for c in narrow) + " |"
              for i, row in enumerate(samples.rows, 1)]
    for i, row in enumerate(samples.rows, 1):
        for column in wide:
            lines += ["", f"**#{i} {_paragraph(column)}**", "", _paragraph(row.get(column))]
    return "\n".join(lines)
