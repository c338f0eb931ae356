"""The journal: a local JSONL record of the run, written first, from which any sink can be replayed.

Format ``posttrain-metrics-journal`` version 1, one JSON object per line:

- header: ``{"format": "posttrain-metrics-journal", "version": 1, "kind": "header", "run_id",
  "name", "created", "adapters": [...], "declarations": {adapter: {...}}, "config": {nested,
  redacted}, "trackers": {"wandb": {"project", "entity"}}}``: every adapter's declarations
  (:mod:`~posttrain_metrics.journal.declarations`), from which readers rebuild the run's adapters
  (a header without them names catalogue adapters); plus ``"extra": {key: {"reduction": ...,
  ...}}`` when the run declares its own keys (:mod:`~posttrain_metrics.core.extra`)
- frame: ``{"kind": "frame", "run_id", "step", "phase", "time", "metrics": {key: value}}`` where a
  value is a number, a bool, a label string, or ``{"$float": "NaN" | "Infinity" | "-Infinity"}`` for
  a non-finite float (strict JSON, exact round trip)
- gap: ``{"kind": "gap", "run_id", "time", "first_step", "last_step", "frames", "phases": {phase: n},
  "error"}``: frames the writer could not keep (a full disk past its backlog, see :class:`JournalSink`),
  written where they would have been
- end: ``{"kind": "end", "run_id", "status": "finished" | "failed" | "interrupted", "time"}``, plus
  ``"reason"`` (the exception that ended the run: type and message, redacted) when there is one and
  ``"missing": {"frames": n, "steps": [[first, last], ...]}`` when the run has gaps

Every line is flushed when written, so a killed process leaves complete lines only, bar possibly a
torn last one, which readers skip with a warning. ``fsync`` says when lines are also forced to disk
(``"close"``, ``"step"`` or ``"never"``): flushing survives a killed process, fsync a lost machine.
The journal is plain data, never pickle: reading one executes nothing.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import re
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..core.values import MAX_EXACT_INT, Scalar
from ..integrations.factory import run_path

__all__ = [
    "FORMAT", "MAX_HEADER_DEPTH", "SAFE_RUN_ID", "VERSION", "Gap", "RunFile", "describe_gap", "gap_problem",
    "missing_summary", "nesting",
]

_orjson: Any = None
try:  # optional: a faster encoder for the frame lines (the training thread's cost), same JSON
    import orjson

    _orjson = orjson
except ImportError:  # pragma: no cover - exercised where orjson is absent
    pass

FORMAT = "posttrain-metrics-journal"
VERSION = 1

# Run ids end up in file names (W&B's run-<id>.wandb, a TensorBoard log_dir with {run_id}) and in
# tracker queries: letters, digits, '_', '-', '.', not starting with '.' or '-'.
SAFE_RUN_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")  # matched with fullmatch


def _encode(value: Scalar) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return {"$float": "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")}
    return value


def _decode(value: Any) -> Scalar:
    if isinstance(value, dict):
        return float(value["$float"])
    if isinstance(value, (bool, int, float, str)):
        return value
    raise ValueError(f"unexpected metric value {value!r}")


_PLAIN = frozenset({float, int, str, bool})  # JSON values that are metric values as they are


def _metrics(record: Mapping[str, Any]) -> dict[str, Scalar]:
    """A frame record's metrics, decoded (``{"$float": ...}`` to NaN and infinities)."""
    return {k: v if type(v) in _PLAIN else _decode(v) for k, v in record["metrics"].items()}


_INT64 = float(2**63)  # orjson reads an integer token beyond int64/uint64 as a float of this size or more


def _loads(line: str | bytes) -> tuple[Any, bool]:
    """A line's JSON value, and whether orjson (when installed) parsed it: a frame line only (strict
    JSON, about 5x faster than json here; it refuses a lone surrogate, so a line it parsed holds
    none). Every other line, and a line it refuses, is parsed by json, which decides."""
    if _orjson is not None:
        try:
            record = _orjson.loads(line)
        except _orjson.JSONDecodeError:
            pass
        else:
            if type(record) is dict and record.get("kind") == "frame":
                return record, True
    return json.loads(line), False


class RunFile(enum.Enum):
    """The files a run keeps beside its journal, each named from the journal's file name so that they go
    with it: a re-run that sets another run's journal aside moves every one of them with it (all but
    the lock, which belongs to the path, not to a run). :meth:`of` applies the journal's folder rule
    (:func:`~posttrain_metrics.integrations.factory.run_path`): one that resolves elsewhere through a
    symlink is a :class:`MetricsError`, never written through."""

    SAMPLES = "{stem}.samples.jsonl"  # the completions the run published (journal.samples)
    RECORD = "{name}.record"  # the run's record folder, attached at close (publication.artifacts)
    STATUS = "{name}.publisher.json"  # the publisher's progress and run handles (publication.follower)
    SINKS = "{name}.sinks.json"  # the tracker sinks' configs for the publisher (publication.process)
    HEALTH = "{name}.health.json"  # live health's actions and thresholds, from the trainer (publication.health)
    FINDINGS = "{name}.findings.jsonl"  # the findings live health published (publication.health)
    STOP = "{name}.stop.json"  # live health's decision to stop the run, read by rank 0 (publication.health)
    LOG = "{log}"  # the publisher process's output: publisher.log beside journal.jsonl (its documented name)
    LOCK = "{name}.lock"  # held for the run's life: one live run per journal (JournalSink.start)

    def of(self, journal: Path) -> Path:
        """This file of the journal at ``journal``."""
        log = "publisher.log" if journal.name == "journal.jsonl" else f"{journal.stem}.publisher.log"
        return run_path(journal.parent, self.value.format(stem=journal.stem, name=journal.name, log=log))


def _json_line(record: Mapping[str, Any]) -> bytes:
    return (json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n").encode("utf-8")


@dataclasses.dataclass
class Gap:
    """Frames the journal could not keep (a full disk past its backlog): how many per phase, the step
    of the first and of the last, and the error that stopped the writes. Its journal record:
    ``{"kind": "gap", "run_id", "time", "first_step", "last_step", "frames", "phases": {phase: n},
    "error"}``."""

    first_step: int
    last_step: int
    frames: int = 0
    phases: dict[str, int] = dataclasses.field(default_factory=dict)
    error: str = ""

    def add(self, step: int, phase: str) -> None:
        self.last_step = step
        self.frames += 1
        self.phases[phase] = self.phases.get(phase, 0) + 1

    def extend(self, later: Gap) -> None:
        self.last_step = later.last_step
        self.frames += later.frames
        for phase, n in later.phases.items():
            self.phases[phase] = self.phases.get(phase, 0) + n

    def describe(self) -> str:
        return describe_gap(self.record(""))

    def record(self, run_id: str) -> dict[str, Any]:
        return {"kind": "gap", "run_id": run_id, "time": time.time(), "first_step": self.first_step,
                "last_step": self.last_step, "frames": self.frames, "phases": dict(self.phases), "error": self.error}


def describe_gap(gap: Mapping[str, Any]) -> str:
    """``steps 41-229 (189 frames)``: what a gap record says is missing."""
    first, last, frames = gap["first_step"], gap["last_step"], gap["frames"]
    steps = f"step {first}" if first == last else f"steps {first}-{last}"
    return f"{steps} ({frames} frame{'s' if frames != 1 else ''})"


def gap_problem(record: Mapping[str, Any]) -> str | None:
    """What is wrong with a gap record as read (None: nothing): integer steps within +/-2**53, a positive
    frame count, a phases object."""
    for field in ("first_step", "last_step", "frames"):
        value = record.get(field)
        if isinstance(value, bool) or not isinstance(value, int) or abs(value) > MAX_EXACT_INT:
            return f"{field} {value!r:.40} is not an integer"
    if record["frames"] < 1:
        return f"frames {record['frames']} is not a positive count"
    if not isinstance(record.get("phases", {}), dict):
        return f"phases {record.get('phases')!r:.40} is not a JSON object"
    return None


def missing_summary(gaps: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """What the end record says is missing: ``{"frames": n, "steps": [[first, last], ...]}``."""
    listed = list(gaps)
    return {"frames": sum(int(g["frames"]) for g in listed),
            "steps": [[int(g["first_step"]), int(g["last_step"])] for g in listed]}


MAX_HEADER_DEPTH = 100
"""The deepest nesting of a journal header's values (its config) that readers take: far beyond any
trainer's config, and well within what the recursive readers downstream (redaction, the trackers'
config flattening) can walk; a deeper header is refused as damaged, never a RecursionError."""


def nesting(value: Any) -> int:
    """How deep ``value`` nests (a scalar: 0), iteratively: no recursion limit."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, level + 1)
            stack.extend((child, level + 1) for child in item if isinstance(child, (dict, list)))
    return deepest
