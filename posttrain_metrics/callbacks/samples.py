"""Choosing sample completions (the callback's side; the record is :mod:`posttrain_metrics.journal.samples`): a bounded, deterministic sample of a step's per-sample rows, whole groups kept.

A row is a mapping of column to a plain value (``prompt``, ``completion``, ``reward``, ``advantage``
and any column the user adds). Rows that share the value of the ``group`` column (GRPO's prompt
group) are kept or dropped together; a row without one is a group of its own. Which groups are kept
depends only on the step and the group ids (a hash of both), never on the rank order or on chance,
so a rerun keeps the same rows, and never on how the rows are split across ranks: the choice is
made over the sizes of the whole batch's groups (:class:`Offer`, :func:`settle`). Long text is cut at
``max_chars`` and the row says so (our column :data:`CUT` lists the columns cut, each ending with a
marker giving how many characters went; a user's own ``truncated`` column is kept as passed).
Redaction does not apply: the rows are model text, not config.

>>> rows = [{"group": g, "completion": "x" * n} for g, n in [(0, 3), (0, 5), (1, 9), (2, 2)]]
>>> s = select(7, rows, limit=3, max_chars=4)
>>> [(r["group"], r["completion"], r[CUT]) for r in s.rows]  # group 0 (2 rows) no longer fits
[(1, 'xxxx… [5 more chars]', 'completion'), (2, 'xx', '')]
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from ..core.errors import MetricsError
from ..core.reducer import _check_step
from ..core.values import MAX_EXACT_INT
from ..journal.samples import HISTOGRAMS, Samples, check_span

__all__ = ["CUT", "GROUP", "MAX_CHARS", "Offer", "check_rows", "cut", "kept_rows", "numeric_columns", "offer", "pick",
           "select", "settle"]

GROUP = "group"
"""The column whose value groups rows that are kept or dropped together."""

CUT = "[cut]"
"""Our column: the columns of the row whose text was cut (comma-separated, empty when none). A name
no user column may take (:func:`check_rows` refuses it), so a rollout's own ``truncated`` column is
never overwritten."""

MAX_CHARS = 2000
"""Default longest text cell, in characters; longer ones are cut and marked."""

_PLAIN = (str, int, float, bool, type(None))


def numeric_columns(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[float]]:
    """The finite numbers of each :data:`HISTOGRAMS` column over ``rows`` (bools and text left out)."""
    out: dict[str, list[float]] = {}
    for column in HISTOGRAMS:
        values = [float(r[column]) for r in rows
                  if type(r.get(column)) in (int, float) and math.isfinite(r[column])]
        if values:
            out[column] = values
    return out


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
            if key == CUT:
                raise MetricsError(f"{where}: row {i} has the column {CUT!r}, which the sampler writes (the "
                                   "columns it cut); fix: name your column otherwise")
            clean[key] = value if type(value) is str else _cell(value, f"{where}: row {i}, column {key!r}")
        out.append(clean)
    return out


def _cell(value: Any, where: str) -> Any:
    """One non-text cell as a plain value (a 0-d tensor or numpy scalar read), or a MetricsError."""
    if hasattr(value, "item") and callable(value.item):  # a 0-d tensor or a numpy scalar
        try:
            value = value.item()
        except Exception as exc:  # a tensor of several elements, a meta tensor ...
            raise MetricsError(f"{where}: a {type(value).__name__} that cannot be read as one value "
                               f"({type(exc).__name__}: {str(exc)[:120]}); fix: pass one number per cell") from None
    if not isinstance(value, _PLAIN):
        raise MetricsError(f"{where}: got a {type(value).__name__} ({value!r:.60}); "
                           "fix: pass text, a number, a bool or None")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_EXACT_INT:
        raise MetricsError(f"{where}: the integer {value!r:.40} exceeds 2**53, beyond which JSON readers and "
                           "float64 histograms lose it; fix: pass it as a float or as text")
    if isinstance(value, float) and not math.isfinite(value):
        return None  # strict JSON everywhere: a NaN reward shows as an empty cell
    return value


def _rank(step: int, group: str) -> str:
    """The order groups are offered in: sha256 of ``"<step>:<group as JSON>"``, e.g. ``'7:["group", 0]'``."""
    return hashlib.sha256(f"{step}:{group}".encode()).hexdigest()


def _key(row: Mapping[str, Any], index: int) -> str:
    """The group of a row as JSON: ``["group", <value>]``, or ``["row", <index in the batch>]`` for a
    row without one (a group of its own). JSON, not the value, so that equal ids on several ranks are
    one group whatever their order (``1`` and ``1.0`` are two ids)."""
    group = row.get(GROUP)
    return json.dumps(["group", group] if group is not None else ["row", index], default=str)


def _choose(step: int, sizes: Mapping[str, int], limit: int) -> frozenset[str]:
    """The groups kept: in hash order, each that still fits whole in ``limit``."""
    kept, used = [], 0
    for key in sorted(sizes, key=lambda k: (_rank(step, k), k)):
        if used + sizes[key] <= limit:
            kept.append(key)
            used += sizes[key]
    return frozenset(kept)


def pick(step: int, rows: Sequence[Mapping[str, Any]], *, limit: int) -> list[int]:
    """The indices of the rows :func:`select` keeps, in order (no truncation)."""
    keys = [_key(row, i) for i, row in enumerate(rows)]
    kept = _choose(step, Counter(keys), limit)
    return [i for i, key in enumerate(keys) if key in kept]


@dataclasses.dataclass(frozen=True)
class Offer:
    """What one rank tells every rank before a step's sample is chosen: one entry per group, not the
    rows, so this first gather stays small; then only the chosen groups' rows travel."""

    step: int | None
    problem: str  # why this rank's rows cannot be taken ("" when they can)
    rows: int
    sizes: dict[str, int]  # grouped rows: group key -> rows on this rank
    single: list[int]  # this rank's rows without a group, by index
    spans: dict[str, tuple[float, float]]  # per histogram column: this rank's (min, max)


def offer(step: object, rows: object,
          where: str = "on_samples") -> tuple[Offer, list[dict[str, Any]], dict[str, list[float]]]:
    """This rank's :class:`Offer`, its checked rows and their :func:`numeric_columns`. Never raises: a
    bad step or row is the offer's ``problem``, so the rank still joins the collectives and every
    rank raises it."""
    try:
        value, mine = _check_step(step), check_rows(rows, where)
    except MetricsError as exc:
        return Offer(None, str(exc), 0, {}, [], {}), [], {}
    except Exception as exc:  # rows that break while being read
        return Offer(None, f"{where}: the rows could not be read ({type(exc).__name__}: {str(exc)[:200]})",
                     0, {}, [], {}), [], {}
    numbers = numeric_columns(mine)
    sizes = Counter(_key(r, 0) for r in mine if r.get(GROUP) is not None)
    spans = {c: (min(v), max(v)) for c, v in numbers.items()}
    single = [i for i, r in enumerate(mine) if r.get(GROUP) is None]
    return Offer(value, "", len(mine), dict(sizes), single, spans), mine, numbers


def settle(offers: Sequence[Offer], limit: int) -> tuple[int, frozenset[str]]:
    """The step and the groups kept over every rank's offer (the same on every rank, whatever the
    split), or the MetricsError of any rank: a bad row anywhere fails the step everywhere."""
    problems = [f"rank {r}: {o.problem}" if len(offers) > 1 else o.problem for r, o in enumerate(offers) if o.problem]
    if problems:
        raise MetricsError("; ".join(problems))
    steps = sorted({o.step for o in offers if o.step is not None})
    if len(steps) != 1:
        raise MetricsError(f"on_samples: the ranks passed different steps {steps[:8]}; fix: call on_samples "
                           "with the same step on every rank")
    for column in HISTOGRAMS:
        ends = [o.spans[column] for o in offers if column in o.spans]
        if ends:
            check_span(column, min(lo for lo, _ in ends), max(hi for _, hi in ends))
    sizes: Counter[str] = Counter()
    start = 0
    for o in offers:
        sizes.update(o.sizes)
        sizes.update(json.dumps(["row", start + i]) for i in o.single)
        start += o.rows
    return steps[0], _choose(steps[0], sizes, limit)


def kept_rows(rows: Sequence[dict[str, Any]], kept: frozenset[str], start: int) -> list[dict[str, Any]]:
    """This rank's rows of the ``kept`` groups, ``start`` being its first row's index in the batch."""
    return [row for i, row in enumerate(rows) if _key(row, start + i) in kept]


def select(step: int, rows: Sequence[Mapping[str, Any]], *, limit: int, max_chars: int = MAX_CHARS,
           offered: int | None = None) -> Samples:
    """At most ``limit`` rows of ``rows``, whole groups, chosen by a hash of (step, group), in their
    original order, text cut at ``max_chars``. A group larger than what is left of the limit is
    skipped (a smaller one may still fit)."""
    return cut(step, [rows[i] for i in pick(step, rows, limit=limit)], max_chars=max_chars,
               offered=len(rows) if offered is None else offered)


def cut(step: int, rows: Sequence[Mapping[str, Any]], *, max_chars: int, offered: int) -> Samples:
    """``rows`` (already chosen) as the step's :class:`Samples`: text cut at ``max_chars``, our
    :data:`CUT` column naming the columns cut."""
    columns: list[str] = []
    chosen = []
    for original in rows:
        row = dict(original)
        marked = []
        for column, value in row.items():
            if isinstance(value, str) and len(value) > max_chars:
                row[column] = f"{value[:max_chars]}… [{len(value) - max_chars} more chars]"
                marked.append(column)
        row[CUT] = ",".join(marked)
        chosen.append(row)
        columns.extend(c for c in row if c not in columns)
    columns = [c for c in columns if c != CUT] + [CUT] if chosen else []
    return Samples(step, chosen, columns, offered)
