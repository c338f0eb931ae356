"""The one validator of journal lines (:class:`LineCheck`), shared by the file reader and the live
tail: what a line must be for ``export`` to replay it faithfully."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ..core.adapter import MetricAdapter
from ..core.catalog import adapter_names, get_adapter
from ..core.errors import MetricsError
from ..core.extra import user_adapters
from ..core.frame import Frame
from ..core.keys import KeyInfo, describe
from ..core.values import MAX_EXACT_INT, Scalar
from .declarations import adapter_from_declaration
from .format import (
    _INT64,
    FORMAT,
    MAX_HEADER_DEPTH,
    SAFE_RUN_ID,
    VERSION,
    _loads,
    _metrics,
    gap_problem,
    nesting,
)

__all__ = ["LineCheck", "header_adapter", "header_adapters"]

_SURROGATE = re.compile("[\ud800-\udfff]")

def _encoding_problem(exc: UnicodeDecodeError) -> str:
    byte = exc.object[exc.start:exc.start + 1]
    hint = " (a UTF-16 file?)" if exc.object[:2] in (b"\xff\xfe", b"\xfe\xff") or b"\x00" in exc.object[:64] else ""
    return (f"not UTF-8: byte 0x{byte.hex()} at column {exc.start + 1}{hint}; journals are UTF-8 JSON lines, "
            "so the file is damaged or not a journal")


def _strings(value: Any) -> Iterator[str]:
    """Every string in a decoded JSON value, keys included (iteratively: no recursion limit)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _finite_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and abs(value) <= MAX_EXACT_INT)


def _check_frame(record: Mapping[str, Any], metrics: Mapping[str, Scalar], keys: Mapping[str, KeyInfo]) -> None:
    """What a replay needs to be faithful: an integer step within +/-2**53, a finite time, numbers
    where the catalogue declares numbers and declared labels where it declares labels (a journal
    that breaks these would export wrongly, or fail on every try)."""
    step = record.get("step")
    if isinstance(step, bool) or not isinstance(step, int):
        raise ValueError(f"step {step!r:.40} is not an integer")
    if abs(step) > MAX_EXACT_INT:
        raise ValueError(f"step {step} is beyond +/-2**53, where trackers (float64) lose integers")
    wall = record.get("time", 0.0)
    if not _finite_number(wall):
        raise ValueError(f"time {wall!r:.40} is not a finite number of seconds")
    for key, value in metrics.items():
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_EXACT_INT:
            raise ValueError(f"{key} = {value} is an integer beyond +/-2**53 (not exact in float64)")
        info = keys.get(key)
        if info is None:
            continue
        labels = info.metric.labels
        if labels and value not in labels:
            raise ValueError(f"{key} = {value!r:.60} is not one of its declared labels {list(labels)}")
        if labels and not isinstance(value, str):
            raise ValueError(f"{key} = {value!r:.60} is not a label string")
        if not labels and isinstance(value, str):
            raise ValueError(f"{key} = {value!r:.60} is a string where the catalogue declares a number")


def _plain_frame(record: Mapping[str, Any], metrics: Mapping[str, Scalar], keys: Mapping[str, KeyInfo],
                 labelled: Mapping[str, tuple[str, ...]]) -> bool:
    """Whether the frame plainly passes :func:`_check_frame` (its usual case, checked quickly): an int
    step and time within range, a string phase, numbers within range where no label is declared,
    declared labels, and no float of 2**63 or more in size (what orjson makes of an integer beyond 64
    bits)."""
    step, wall = record.get("step"), record.get("time", 0.0)
    if type(step) is not int or not -MAX_EXACT_INT <= step <= MAX_EXACT_INT:
        return False
    if type(record.get("phase", "train")) is not str:  # a number there: json's reading decides its text
        return False
    if type(wall) is not float or not -MAX_EXACT_INT <= wall <= MAX_EXACT_INT:  # NaN fails both
        return False
    for key, value in metrics.items():
        t = type(value)
        if t is float:
            if key in labelled or value >= _INT64 or value <= -_INT64:  # type: ignore[operator]
                return False
        elif t is bool:
            if key in labelled:
                return False
        elif t is str:
            labels = labelled.get(key)
            if (labels is None and key in keys) or (labels is not None and value not in labels):
                return False
        elif t is int:
            if key in labelled or not -MAX_EXACT_INT <= value <= MAX_EXACT_INT:  # type: ignore[operator]
                return False
        else:
            return False
    return True


def header_adapter(header: Mapping[str, Any], name: str) -> MetricAdapter:
    """The adapter ``name`` of a journal header, rebuilt from its declaration (see
    :mod:`~.declarations`); a header written before declarations were recorded names catalogue
    adapters, found by name (a :class:`MetricsError` names one that is not)."""
    declared = header.get("declarations") or {}
    if name in declared:
        return adapter_from_declaration(name, declared[name])
    try:
        return get_adapter(name)
    except MetricsError:  # get_adapter's fix (register it) needs a Python process: say how
        raise MetricsError(
            f"the journal header names adapter {name!r} without declaring it (a header written before headers "
            f"declared their adapters, or edited), and no adapter of that name is registered here (unknown adapter "
            f"{name!r}; known: {', '.join(adapter_names())}); the command line imports nothing of yours, so fix: "
            "in Python, register_adapter(adapter), then posttrain_metrics.cli.main(['export', ...]) (or doctor, "
            "plot, publish) in the same process"
        ) from None


def header_adapters(header: Mapping[str, Any]) -> tuple[MetricAdapter, ...]:
    """The adapters a journal header names, then the user's own keys it declares (``extra``), rebuilt
    from the header alone (:func:`header_adapter`)."""
    names = list(header.get("adapters", []))
    extra = user_adapters(header.get("extra", {}))
    return (*(header_adapter(header, name) for name in names), *extra)


def _catalogue(header: Mapping[str, Any]) -> dict[str, KeyInfo]:
    """The declared keys of the journal's adapters; empty when one cannot be rebuilt (an old header
    naming an adapter the catalogue lacks: the command line refuses such a journal, naming it)."""
    try:
        return describe(header_adapters(header))
    except MetricsError:
        return {}


def _check_header(path: Path, header: Mapping[str, Any]) -> None:
    """A header's fields have the types the writer gives them; the run id is a safe name (it
    becomes file names and tracker queries on export), so a hostile header is refused here."""
    run_id, name, adapters = header.get("run_id"), header.get("name"), header.get("adapters")
    problem = None
    if not isinstance(run_id, str) or not SAFE_RUN_ID.fullmatch(run_id):
        problem = f"run_id {run_id!r:.80} is not a safe run id (letters, digits, '_', '-', '.')"
    elif name is not None and not isinstance(name, str):
        problem = f"name {name!r:.80} is not a string"
    elif not isinstance(adapters, list) or not all(isinstance(a, str) for a in adapters):
        problem = f"adapters {adapters!r:.80} is not a list of adapter names"
    elif not isinstance(header.get("config", {}), dict):
        problem = f"config {header.get('config')!r:.80} is not a JSON object"
    elif not isinstance(header.get("declarations", {}), dict):
        problem = f"declarations {header.get('declarations')!r:.80} is not a JSON object of adapter declarations"
    elif not isinstance(header.get("extra", {}), dict):
        problem = f"extra {header.get('extra')!r:.80} is not a JSON object of key declarations"
    elif "created" in header and not _finite_number(header["created"]):
        problem = f"created {header['created']!r:.40} is not a finite time in seconds"
    elif nesting(header) > MAX_HEADER_DEPTH:
        problem = (f"values nest more than {MAX_HEADER_DEPTH} levels deep (a config nests a few; every "
                   "reader of a config walks it level by level)")
    if problem:
        raise MetricsError(f"{path}: the journal header's {problem}; the file is damaged or not ours")


class LineCheck:
    """The one reading of a journal line, shared by the file reader (:func:`read_journal`,
    :func:`open_journal`: ``export``, ``doctor``, ``plot``) and the live :class:`JournalTail` (the
    publisher), so that the publisher never sends a frame that ``export`` would refuse: UTF-8, one JSON
    object, no lone surrogate, every header checked (format, version, field types, a safe run id,
    nesting), frames checked against the first header's catalogue (an integer step within +/-2**53,
    a finite time, declared labels, numbers where numbers are declared), an end record's time finite.
    Each method raises what its caller names: ``ValueError``/``RecursionError`` for a line that is not
    a journal line, a :class:`MetricsError` for a header, ``KeyError``/``TypeError``/``ValueError``/
    ``AttributeError``/``OverflowError`` for a malformed frame."""

    FRAME_ERRORS = (KeyError, TypeError, ValueError, AttributeError, OverflowError)

    def __init__(self, path: Path) -> None:
        self.path = path
        self.first: dict[str, Any] | None = None  # the first header: it names the run and its keys
        self.keys: dict[str, KeyInfo] = {}
        self.labelled: dict[str, tuple[str, ...]] = {}

    @staticmethod
    def record(line: str | UnicodeDecodeError) -> tuple[dict[str, Any], bool]:
        """The line's JSON object, and whether orjson parsed it (see :func:`_loads`)."""
        if isinstance(line, UnicodeDecodeError):
            raise ValueError(_encoding_problem(line))
        record, strict = _loads(line)
        if not isinstance(record, dict):
            raise ValueError("not a JSON object")
        if not strict and any(_SURROGATE.search(text) for text in _strings(record)):
            raise ValueError("a string holds a lone surrogate (\\ud800-\\udfff), which is not text "
                             "any tracker can store")
        return record, strict

    def header(self, record: dict[str, Any], number: int) -> None:
        """Check a header line (the first names the run; a resumed run appends its own)."""
        if record.get("format") != FORMAT:
            if self.first is None:
                raise MetricsError(f"{self.path}: the first line is not a {FORMAT} header; is this a journal?")
            raise MetricsError(f"{self.path}:{number}: a header that is not a {FORMAT} header; the file is damaged")
        version = record.get("version")
        if type(version) is not int or version != VERSION:  # not true, not 1.0
            raise MetricsError(
                f"{self.path}: journal format version {record.get('version')!r}; this posttrain-metrics "
                f"reads version {VERSION}; fix: upgrade posttrain-metrics"
            )
        _check_header(self.path, record)
        if self.first is None:
            self.first = record
            self.keys = _catalogue(record)
            self.labelled = {key: info.metric.labels for key, info in self.keys.items() if info.metric.labels}

    def frame(self, line: str, record: dict[str, Any], strict: bool) -> Frame:
        """A frame line as its :class:`Frame`, checked against the catalogue (see the class)."""
        # orjson's dict as it is, unless a value needs decoding ({"$float": ...}); a frame that is not
        # plainly valid (see _plain_frame: a float beyond 64-bit integers among others) is read again
        # by json, which decides, and checked value by value
        metrics = record["metrics"] if strict and "$float" not in line else _metrics(record)
        if not (type(metrics) is dict and _plain_frame(record, metrics, self.keys, self.labelled)):
            if strict:
                record = json.loads(line)
                metrics = _metrics(record)
            _check_frame(record, metrics, self.keys)  # names what is wrong, if anything is
        return Frame(record["step"], metrics, str(record.get("phase", "train")), float(record.get("time", 0.0)))

    @staticmethod
    def end(record: Mapping[str, Any]) -> None:
        if "time" in record and not _finite_number(record["time"]):
            raise ValueError(f"end record's time {record['time']!r:.40} is not a finite number")

    @staticmethod
    def gap(record: Mapping[str, Any]) -> None:
        """A gap record (frames the writer could not keep: see :class:`JournalSink`) well formed."""
        problem = gap_problem(record)
        if problem:
            raise ValueError(problem)
