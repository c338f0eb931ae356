"""The doctor's engine: how a check is declared, fed a run's frames one at a time, and turned into findings.

A check is a :class:`Check` row (id, default severity, the keys it reads, its threshold in words) whose
``watch`` makes a fresh ``_Watch`` for each run. A :class:`Doctor` holds one watch per check: it is
fed frames one at a time (:meth:`Doctor.see`) and says at any point what the checks found
(:meth:`Doctor.findings`). The offline doctor (``run_checks``) feeds it every frame of a journal and
then asks; a reader of a journal still being written can feed it each frame as it comes.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from ..core.frame import Frame

__all__ = [
    "Check",
    "Doctor",
    "Finding",
    "JournalLike",
    "Severity",
    "config_int",
    "exit_status",
    "step_ranges",
]


class Severity(str, enum.Enum):
    """How bad a finding is; the order of the members is the order of the report.

    ``ERROR`` makes :func:`exit_status` non-zero; ``WARNING`` and ``INFO`` never do.
    """

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


# -- what the checks read ------------------------------------------------------------------------------


class Frames(Protocol):
    """A journal's frames as the doctor reads them: in file order, possibly more than once (a list, or
    ``posttrain_metrics.journal.FramesOnDisk``, which parses the file again at each pass)."""

    def __iter__(self) -> Iterator[Frame]: ...

    def __len__(self) -> int: ...


class PhaseSpanLike(Protocol):
    """A phase's frame count and step range (``posttrain_metrics.journal.PhaseSpan``)."""

    @property
    def frames(self) -> int: ...

    @property
    def first_step(self) -> int: ...

    @property
    def last_step(self) -> int: ...


class JournalLike(Protocol):
    """What the doctor needs of a journal (``posttrain_metrics.journal.Journal`` and ``JournalOnDisk``
    have it); the doctor does not import the journal, so it names the shape rather than the class."""

    @property
    def path(self) -> os.PathLike[str]: ...

    @property
    def header(self) -> Mapping[str, Any]: ...

    @property
    def frames(self) -> Frames: ...

    @property
    def phases(self) -> Mapping[str, PhaseSpanLike]: ...

    @property
    def end(self) -> Mapping[str, Any] | None: ...

    @property
    def warnings(self) -> Sequence[str]: ...

    @property
    def run_id(self) -> str: ...

    @property
    def adapters(self) -> Sequence[str]: ...

    @property
    def config(self) -> Mapping[str, Any]: ...


@dataclasses.dataclass(frozen=True)
class Finding:
    """One check that fired: where (``steps``, empty for a run-level finding), why and what next.

    ``keys`` are the journal keys the finding is about (the plot marks the panels that show them).
    """

    check: str
    severity: Severity
    steps: tuple[int, ...]
    explanation: str
    next_step: str
    keys: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "severity": self.severity.value,
            "steps": list(self.steps),
            "step_ranges": step_ranges(self.steps),
            "explanation": self.explanation,
            "next_step": self.next_step,
            "keys": list(self.keys),
        }


@dataclasses.dataclass(frozen=True)
class _Hit:
    """What a check yields; :class:`Doctor` adds the check's id and default severity."""

    steps: Iterable[int]
    explanation: str
    next_step: str
    keys: tuple[str, ...]
    severity: Severity | None = None


class _Run:
    """What every check knows before the frames go by: the journal, its config and adapters, and the
    thresholds the run overrides (by their names in ``thresholds``, e.g. ``KL_RATIO_MIN``)."""

    def __init__(self, journal: JournalLike, thresholds: Mapping[str, float] | None = None) -> None:
        self.journal = journal
        self.config = dict(journal.config)
        self.adapters = tuple(journal.adapters)
        self.thresholds = dict(thresholds or {})

    def threshold(self, name: str, default: float) -> float:
        """The threshold ``name``: the run's override, else ``default`` (the value in ``thresholds``)."""
        return float(self.thresholds.get(name, default))


class _Watch:
    """A check reading the run as its frames go by, one at a time in file order (:meth:`see`; the train
    frames only unless ``every_phase``), then saying what it found (:meth:`hits`). A check holds what it
    needs to remember, not the frames: the doctor reads a journal of any length in memory that grows
    only with the steps its findings name and a quarter of a trend check's series (see ``_Trend``).

    :meth:`hits` changes nothing in the watch, so a reader of a run still being written may ask it after
    any frame. A check whose ``counts`` is set also wants a first pass over the train frames
    (:meth:`count`) before the frames go by: its threshold depends on how long the series is (a
    baseline of its first quarter), which only a finished run knows."""

    every_phase = False
    counts = False  # reads the train frames in a first pass too (count)

    def count(self, frame: Frame) -> None:
        """One train frame of the first pass, for a check whose ``counts`` is set."""

    def see(self, frame: Frame) -> None:
        """One frame, in file order."""

    def hits(self) -> Iterator[_Hit]:
        """What the check found in the frames seen so far (all of them, for the offline doctor)."""
        return iter(())


def _number(value: object) -> float | None:
    """A finite int or float as a float; ``None`` for absent, labels, bools and non-finite values."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def config_int(config: Mapping[str, Any], names: Sequence[str], prefer: str = "") -> tuple[int | None, str]:
    """An integer from the flat run config: ``(value, where)`` or ``(None, why not)``.

    A key matches when its last ``/`` component is one of ``names``. Different values under several
    matching keys are settled by the ones starting with ``prefer/``, or give ``None``.

    >>> config_int({"rl/n_mini": 4, "model/hidden": 8}, ("n_mini",))
    (4, 'rl/n_mini')
    >>> config_int({}, ("n_mini",))[0] is None
    True
    """
    found: dict[str, int] = {}
    for key, raw in config.items():
        if str(key).rsplit("/", 1)[-1] not in names:
            continue
        value = _as_int(raw)
        if value is not None:
            found[str(key)] = value
    wanted = " or ".join(f"'.../{n}'" for n in names)
    if not found:
        return None, f"no config key named {wanted}"
    for candidates in (found, {k: v for k, v in found.items() if prefer and k.startswith(prefer + "/")}):
        if len(set(candidates.values())) == 1:
            key = sorted(candidates)[0]
            return candidates[key], key
    return None, f"config keys disagree: {', '.join(f'{k}={v}' for k, v in sorted(found.items()))}"


def _as_int(raw: object) -> int | None:
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw
    if isinstance(raw, float) and raw.is_integer():
        return int(raw)
    if isinstance(raw, str) and raw.strip().lstrip("-").isdigit():
        return int(raw.strip())
    return None


def _count(items: Sequence[object], noun: str) -> str:
    return f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"


def _fmt(value: float) -> str:
    return f"{value:.4g}"


# -- the engine ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Check:
    """A registered check: its id, default severity, the keys it reads, its threshold in words, and
    what watches the frames for it (made afresh for each run)."""

    id: str
    severity: Severity
    reads: tuple[str, ...]
    threshold: str
    watch: Callable[[_Run], _Watch]

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "severity": self.severity.value, "reads": list(self.reads),
                "threshold": self.threshold}


class Doctor:
    """The checks of a table watching one run: fed its frames one at a time, in file order.

    ``thresholds`` overrides thresholds by name (see ``table.TUNABLE``).
    The offline doctor feeds every frame (:meth:`see`), then asks for the :meth:`findings`. The
    checks whose ``counts`` is set (:attr:`counting`) first read the run's train frames once more
    (:meth:`count`): their thresholds depend on the series' length. Asking for the findings changes
    nothing, so a runner reading a journal as it is written can ask after any frame.
    """

    def __init__(self, journal: JournalLike, checks: Sequence[Check],
                 thresholds: Mapping[str, float] | None = None) -> None:
        run = _Run(journal, thresholds)
        self.checks = tuple(checks)
        self.watches = [check.watch(run) for check in self.checks]
        self.counting = tuple(check.id for check, watch in zip(self.checks, self.watches) if watch.counts)
        self._counting = [w for w in self.watches if w.counts]
        self._every_phase = [w for w in self.watches if w.every_phase]

    def count(self, frame: Frame) -> None:
        """One frame of the first pass (only train frames are counted)."""
        if frame.phase == "train":
            for watch in self._counting:
                watch.count(frame)

    def see(self, frame: Frame) -> None:
        """One frame, in file order, handed to every check that reads its phase."""
        for watch in self.watches if frame.phase == "train" else self._every_phase:
            watch.see(frame)

    def findings(self) -> list[Finding]:
        """What the checks found in the frames seen so far: errors first, then warnings, then info,
        in table order within a severity."""
        findings = []
        for check, watch in zip(self.checks, self.watches):
            for hit in watch.hits():
                findings.append(
                    Finding(check.id, hit.severity or check.severity, tuple(sorted(set(hit.steps))),
                            hit.explanation, hit.next_step, hit.keys)
                )
        order = list(Severity)
        return sorted(findings, key=lambda f: order.index(f.severity))  # stable: table order within


def exit_status(findings: Iterable[Finding]) -> int:
    """1 when an error-level check fired, else 0 (a CI pipeline gates on it)."""
    return 1 if any(f.severity is Severity.ERROR for f in findings) else 0


def step_ranges(steps: Iterable[int], *, limit: int | None = None) -> str:
    """Steps compressed into ranges; ``limit`` caps the ranges shown.

    >>> step_ranges([12, 13, 14, 18, 40, 41])
    '12-14, 18, 40-41'
    >>> step_ranges(range(0, 20, 2), limit=3)
    '0, 2, 4, ... (+7 more)'
    """
    ordered = sorted(set(steps))
    ranges: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        ranges.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    if limit is not None and len(ranges) > limit:
        return ", ".join(ranges[:limit]) + f", ... (+{len(ranges) - limit} more)"
    return ", ".join(ranges)
