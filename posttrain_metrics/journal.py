"""The journal: a local JSONL record of the run, written first, from which any sink can be replayed.

Format ``posttrain-metrics-journal`` version 1, one JSON object per line:

- header: ``{"format": "posttrain-metrics-journal", "version": 1, "kind": "header", "run_id",
  "name", "created", "adapters": [...], "config": {nested, redacted}, "trackers": {"wandb":
  {"project", "entity"}}}``; older journals hold the config flat (``a/b`` keys) and no trackers,
  and read the same (``Journal.config`` is flat either way); plus ``"extra": {key: {"reduction":
  ..., ...}}`` when the run declares its own keys (:mod:`~posttrain_metrics.core.extra`: readers rebuild
  those adapters from it, see :func:`header_adapters`)
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

import collections
import contextlib
import dataclasses
import enum
import json
import math
import os
import re
import socket
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from .core.adapter import MetricAdapter
from .core.errors import MetricsError
from .core.extra import user_adapters
from .core.frame import Frame
from .core.keys import KeyInfo, describe
from .core.redact import flatten_config
from .core.reducer import resolve_adapters
from .core.values import MAX_EXACT_INT, Scalar
from .core.warn import warn as emit_warning
from .integrations.base import RunInfo, Sink
from .integrations.factory import run_path
from .lines import LineFile

__all__ = [
    "BACKLOG_BYTES", "FORMAT", "LOCK_FD_ENV", "MAX_HEADER_DEPTH", "SAFE_RUN_ID", "VERSION", "FramesOnDisk", "Gap",
    "Journal", "JournalOnDisk", "JournalSink", "JournalTail", "LineCheck", "PhaseSpan", "Record", "RunFile", "RunLock",
    "describe_gap", "gap_problem", "header_adapters", "journal_closed", "last_header", "missing_summary", "nesting",
    "open_journal", "read_journal",
]

_orjson: Any = None
try:  # optional: a faster encoder for the frame lines (the training thread's cost), same JSON
    import orjson

    _orjson = orjson
except ImportError:  # pragma: no cover - exercised where orjson is absent
    pass

FORMAT = "posttrain-metrics-journal"
VERSION = 1
_FSYNC = ("close", "step", "never")
BACKLOG_BYTES = 16 << 20
"""How many bytes of frame lines a journal holds in memory while its disk is full (see JournalSink)."""

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

    SAMPLES = "{stem}.samples.jsonl"  # the completions the run published (posttrain_metrics.samples)
    RECORD = "{name}.record"  # the run's record folder, attached at close (publication.artifacts)
    STATUS = "{name}.publisher.json"  # the publisher's progress and run handles (publication.follower)
    SINKS = "{name}.sinks.json"  # the tracker sinks' configs for the publisher (publication.process)
    LOG = "{log}"  # the publisher process's output: publisher.log beside journal.jsonl (its documented name)
    LOCK = "{name}.lock"  # held for the run's life: one live run per journal (JournalSink.start)

    def of(self, journal: Path) -> Path:
        """This file of the journal at ``journal``."""
        log = "publisher.log" if journal.name == "journal.jsonl" else f"{journal.stem}.publisher.log"
        return run_path(journal.parent, self.value.format(stem=journal.stem, name=journal.name, log=log))


_MOVED = tuple(kind for kind in RunFile if kind is not RunFile.LOCK)
"""What a set-aside journal takes with it: everything of its run."""


RESUME_WAIT = 180.0
"""How long a resumed run waits for the publisher process of its previous attempt (see :meth:`RunLock.take`)."""

LOCK_FD_ENV = "POSTTRAIN_METRICS_LOCK_FD"
"""The descriptor, in the publisher process, of its run's lock (:class:`RunLock`), inherited from the trainer."""


class RunLock:
    """One live run per journal: an exclusive ``flock`` on ``<journal>.lock`` (:class:`RunFile`).

    The trainer takes it at the run's start and holds it for the run's life; its publisher process
    inherits the descriptor (:data:`LOCK_FD_ENV`) and so holds it until it has sent the journal to the
    trackers and exits, even after the trainer: a second run in the same place would otherwise rename
    the journal under it and be tailed into the first run's trackers. The kernel releases the lock when
    its last holder exits, a SIGKILLed one included, so a killed run never leaves it stuck; the file
    stays (removing it would race a start). It holds one JSON line per holder (the trainer's pid and
    run id, then each publisher process's pid), for the refusal to name them. Where ``fcntl`` does not
    exist (Windows) there is no lock.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd

    @classmethod
    def take(cls, path: Path, run_id: str, *, resume_wait: float = RESUME_WAIT) -> RunLock | None:
        """The lock of ``path`` for run ``run_id``, or a :class:`MetricsError` naming the run that holds it.

        A resumed run (the same run id) whose previous attempt's trainer has exited while its publisher
        process still sends that journal to the trackers (a job restarted at once after a crash) waits
        for that publisher, up to ``resume_wait`` seconds, instead of being refused: it finishes by
        itself, and the resumed run then appends to the same journal."""
        try:
            import fcntl
        except ImportError:  # pragma: no cover - no flock on this platform
            return None
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = None
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holders = _holders(fd)
                draining = _draining_publisher(run_id, holders)
                if draining is not None and deadline is None and resume_wait > 0:
                    deadline = time.monotonic() + resume_wait
                    emit_warning(f"journal {path.with_name(path.name[: -len('.lock')])}: the previous attempt of run "
                                 f"{run_id!r} has exited and its publisher process (pid {draining}) still sends "
                                 f"that journal to the trackers; this resumed run waits for it (up to "
                                 f"{resume_wait:g} s)", stacklevel=4)
                if draining is None or deadline is None or time.monotonic() >= deadline:
                    os.close(fd)
                    raise MetricsError(_refusal(path, run_id, holders)) from None
                time.sleep(0.2)
        os.ftruncate(fd, 0)
        lock = cls(fd)
        lock.note("trainer", run_id)
        return lock

    def note(self, role: str, run_id: str = "") -> None:
        """Add this process as a holder (``trainer`` or ``publisher``), for a refused start to name it."""
        line = json.dumps({"role": role, "pid": os.getpid(), "host": socket.gethostname(), "run_id": run_id,
                           "since": time.time()}) + "\n"
        os.pwrite(self.fd, line.encode(), os.fstat(self.fd).st_size)

    def shared(self) -> RunLock | None:
        """Another hold on this same lock (a duplicate descriptor), for a follower of the run that may
        outlive this holder: the lock is free only once both are released. None once released."""
        return RunLock(os.dup(self.fd)) if self.fd >= 0 else None

    def release(self) -> None:
        """This holder's part (the lock is free once every holder released it or exited)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _holders(fd: int) -> list[dict[str, Any]]:
    """The holders a lock file lists (see :class:`RunLock`); a line that is not one is skipped."""
    found = []
    for line in os.pread(fd, 1 << 16, 0).decode("utf-8", "replace").splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict):
                found.append(record)
    return found


def _draining_publisher(run_id: str, holders: list[dict[str, Any]]) -> int | None:
    """The pid of the publisher process still holding the lock of run ``run_id`` on this host once its
    trainer has exited (None: another run holds it, or its trainer runs, or it is not known)."""
    trainer = next((h for h in holders if h.get("role") == "trainer"), {})
    publisher = next((h for h in reversed(holders) if h.get("role") == "publisher"), None)
    if (publisher is None or trainer.get("run_id") != run_id or not run_id
            or _alive(trainer.get("pid"), trainer.get("host")) is not False
            or _alive(publisher.get("pid"), publisher.get("host")) is not True):
        return None
    return int(publisher["pid"])


def _alive(pid: Any, host: Any) -> bool | None:
    """Whether process ``pid`` runs (None: another host's, or not known)."""
    if not isinstance(pid, int) or host != socket.gethostname():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # someone else's process: it exists
        return True
    return True


def _refusal(path: Path, run_id: str, holders: list[dict[str, Any]]) -> str:
    """Why a run cannot start at ``path``: which run holds it, through which process, and the fix."""
    trainer = next((h for h in holders if h.get("role") == "trainer"), {})
    publisher = next((h for h in reversed(holders) if h.get("role") == "publisher"), None)
    journal = path.with_name(path.name[: -len(".lock")])
    held = f"run {trainer.get('run_id', '?')!r} (trainer pid {trainer.get('pid', '?')} on {trainer.get('host', '?')})"
    if _alive(trainer.get("pid"), trainer.get("host")) is False and publisher is not None:
        how = (f"its trainer has exited and its publisher process (pid {publisher.get('pid')}) is still sending that "
               "journal to the trackers; fix: wait until it exits (it does once every tracker has the run), or "
               "give this run another out_dir")
    else:
        how = ("it is still running; fix: give this run another out_dir (or journal path), or stop that run first "
               f"(kill {trainer.get('pid', '?')})")
    return (f"journal {journal} is in use by {held}, so run {run_id!r} cannot start there: a second live run "
            f"would take its journal and the two would mix (lock {path}); {how}")


class JournalSink(Sink):
    """Appends one line per frame to ``path`` (JSONL) and flushes it.

    The header carries the redacted config; ``close`` writes an end line with the run's status.
    Opening an existing journal of the same run id appends to it (a resumed run).

    A line that cannot be written (a full disk) never becomes a silent gap: the frame is held in
    memory, up to ``backlog_bytes`` of lines, and the held frames are written, in order, as soon as a
    write succeeds again (at the next frame, or at close). Frames beyond that bound are not kept: their
    count and step range are written as a ``gap`` record, in their place, as soon as anything can be
    written, and the end record lists every gap (``missing``). Readers, the doctor and the trackers
    (``health/missing_steps``) report them. Each failure and the recovery are warned about once.
    """

    name = "journal"
    stores_nonfinite = frozenset({"nan", "inf"})
    inline = True  # written on the training thread, never by the publisher process

    def __init__(self, path: str | os.PathLike[str], *, fsync: str = "close",
                 backlog_bytes: int = BACKLOG_BYTES) -> None:
        if fsync not in _FSYNC:
            raise MetricsError(f"journal fsync={fsync!r}; fix: use one of {list(_FSYNC)}")
        if isinstance(backlog_bytes, bool) or not isinstance(backlog_bytes, int) or backlog_bytes < 0:
            raise MetricsError(f"journal backlog_bytes={backlog_bytes!r:.40}; fix: a whole number of bytes >= 0 "
                               f"(the default {BACKLOG_BYTES} holds about 6,000 frames of 61 keys)")
        self.path = Path(path)
        self.fsync = fsync
        self.backlog_bytes = backlog_bytes
        self._file = LineFile(self.path)
        self._run_id = ""
        self._held: collections.deque[tuple[int, str, bytes]] = collections.deque()  # (step, phase, line)
        self._held_bytes = 0
        self._gap: Gap | None = None  # the frames not kept since the backlog was full
        self.gaps: list[Gap] = []  # every gap of the run, written or not: the end record lists them
        self._fault = ""  # the error of the write that failed, while writes fail
        self._head = b""  # the header (a full disk at the start), written before anything else
        self.lock: RunLock | None = None

    def start(self, run: RunInfo) -> None:
        """Open the journal for ``run``: refused (:class:`MetricsError`) while another run holds it
        (:class:`RunLock`) or when one of the run's files would be written through a symlink out of
        its folder (:class:`RunFile`); another run's journal is set aside first."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for kind in RunFile:  # every file's rule checked before anything is written
            kind.of(self.path)
        if self.lock is None:
            self.lock = RunLock.take(RunFile.LOCK.of(self.path), run.run_id)
        try:
            self._open(run)
        except BaseException:
            self._unlock()
            raise

    def _open(self, run: RunInfo) -> None:
        self._run_id = run.run_id
        self._set_aside_other_run(run.run_id)
        torn = self.path.exists() and self.path.stat().st_size > 0 and not self._ends_with_newline()
        self._file.open()
        header = _json_line(
            {
                "format": FORMAT,
                "version": VERSION,
                "kind": "header",
                "run_id": run.run_id,
                "name": run.name,
                "created": run.started,
                "adapters": list(run.adapters),
                "config": dict(run.config_tree),
                "trackers": {name: dict(settings) for name, settings in run.trackers.items()},
                **({"extra": {k: dict(v) for k, v in run.extra.items()}} if run.extra else {}),
            }
        )
        # a crash mid-line: end that line so that the resumed run's lines stay whole
        head = (b"\n" if torn else b"") + header
        try:
            self._file.append(head)
        except OSError as exc:  # a disk full from the start: the header is held like a frame, written first
            self._head = head
            self._failed(exc)

    def _ends_with_newline(self) -> bool:
        with open(self.path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            return f.read(1) == b"\n"

    def _set_aside_other_run(self, run_id: str) -> None:
        """A journal holds one run: the same run id appends (a resumed run); another run's journal
        at this path is renamed ``<stem>.<its run id>.jsonl`` first, never mixed into, and every file
        of that run (:class:`RunFile`: samples, record, status, sinks, publisher log) goes with it, so
        the set-aside journal is whole (``export`` of it finds its completions)."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        with open(self.path, encoding="utf-8", errors="replace") as f:
            first = f.readline()
        try:
            previous = str(json.loads(first).get("run_id", ""))
        except (ValueError, AttributeError):
            previous = ""
        if previous == run_id:
            return
        target = self._free_name(f"{self.path.stem}.{re.sub(r'[^A-Za-z0-9_.-]', '_', previous) or 'unknown'}")
        for kind in _MOVED:  # its files first, the journal last: an interrupted move is finished by the next start
            if os.path.lexists(kind.of(self.path)):
                os.rename(kind.of(self.path), kind.of(target))
        self.path.rename(target)
        emit_warning(f"journal {self.path} held run {previous!r}; moved it to {target.name} (with its samples, "
                     f"record, status and publisher log) so that run {run_id!r} starts its own journal", stacklevel=3)

    def _free_name(self, stem: str) -> Path:
        """``<stem>.jsonl``, or ``<stem>.<n>.jsonl``: the first name that neither a journal nor any
        file of one holds."""
        target, n = self.path.with_name(f"{stem}{self.path.suffix}"), 1
        while any(os.path.lexists(p) for p in (target, *(kind.of(target) for kind in _MOVED))):
            target = self.path.with_name(f"{stem}.{n}{self.path.suffix}")
            n += 1
        return target

    def write(self, frame: Frame) -> None:
        if self._file.closed:
            raise MetricsError(f"journal {self.path} is not open; fix: call start() before write()")
        line = self._frame_line(frame)
        if self._head or self._held or self._gap is not None:
            self._catch_up()
        if not self._head and not self._held and self._gap is None:
            try:
                self._file.append(line)
            except OSError as exc:
                self._failed(exc)
            else:
                if self.fsync == "step":
                    self._file.sync()
                return
        self._hold(frame.step, frame.phase, line)

    def _frame_line(self, frame: Frame) -> bytes:
        metrics = frame.metrics
        for value in metrics.values():  # NaN and infinities as {"$float": ...}: strict JSON
            if type(value) is float and value - value != 0.0:
                metrics = {k: _encode(v) for k, v in metrics.items()}
                break
        record = {"kind": "frame", "run_id": self._run_id, "step": frame.step, "phase": frame.phase,
                  "time": frame.wall_time, "metrics": metrics}
        if _orjson is not None and math.isfinite(frame.wall_time):
            # orjson (when installed) encodes a 61-key frame about 10x faster than json: it is the
            # training thread's main cost here. Same strict JSON; floats in their shortest repr.
            try:
                return _orjson.dumps(record, option=_orjson.OPT_APPEND_NEWLINE)  # type: ignore[no-any-return]
            except TypeError:  # a value orjson does not take (it is strict about types): json's turn
                pass
        return _json_line(record)

    def _failed(self, exc: OSError) -> None:
        if self._fault:
            return
        self._fault = f"{type(exc).__name__}: {exc}"
        emit_warning(f"journal {self.path}: a line could not be written ({self._fault}); training goes on, the "
                     f"frames are held in memory (up to backlog_bytes={self.backlog_bytes}) and written when the "
                     "disk has room; frames beyond that are recorded as a gap (their steps) in the journal",
                     stacklevel=4)

    def _hold(self, step: int, phase: str, line: bytes) -> None:
        """Keep a frame that could not be written, within the bound; past it, count it in the gap."""
        if self._gap is None and self._held_bytes + len(line) <= self.backlog_bytes:
            self._held.append((step, phase, line))
            self._held_bytes += len(line)
            return
        if self._gap is None:
            self._gap = Gap(step, step, error=self._fault)
            self.gaps.append(self._gap)
            emit_warning(f"journal {self.path}: {len(self._held)} frames held in memory fill backlog_bytes="
                         f"{self.backlog_bytes}; frames from {phase} step {step} on are not kept until the disk "
                         "has room: their steps are recorded as a gap", stacklevel=4)
        self._gap.add(step, phase)

    def _catch_up(self) -> bool:
        """Write the held frames, then the gap record, in order; whether all of it is written."""
        written, head = 0, bool(self._head)
        if self._head:
            try:
                self._file.append(self._head)
            except OSError:
                return False
            self._head = b""
        while self._held:
            _, _, line = self._held[0]
            try:
                self._file.append(line)
            except OSError:
                return False
            self._held.popleft()
            self._held_bytes -= len(line)
            written += 1
        gap = self._gap
        if gap is not None:
            try:
                self._file.append(_json_line(gap.record(self._run_id)))
            except OSError:
                return False
            self._gap = None
        if written or head or gap is not None:
            lost = f"; {gap.describe()} could not be kept: recorded as a gap" if gap is not None else ""
            emit_warning(f"journal {self.path} is written again: {written} held frames are in it{lost}", stacklevel=5)
        self._fault = ""
        return True

    def _give_up_held(self) -> None:
        """At close, with the disk still full: the held frames join the gap (they come before it)."""
        if not self._held:
            return
        first = self._held[0][0]
        gap = Gap(first, first, error=self._fault)
        for step, phase, _ in self._held:
            gap.add(step, phase)
        if self._gap is not None:
            gap.extend(self._gap)
            self.gaps.remove(self._gap)
        self.gaps.append(gap)
        self._gap = gap
        self._held.clear()
        self._held_bytes = 0

    def close(self, *, failed: bool = False, killed: bool = False, interrupted: bool = False,
              reason: str = "") -> None:
        """Write the end record: status ``interrupted`` (Ctrl-C), ``failed`` or ``finished``, the
        ``reason`` when one is given (the exception's type and message, redacted by the publisher) and
        the gaps (``missing``)."""
        if self._file.closed:
            return
        if (self._head or self._held or self._gap is not None) and not self._catch_up():
            self._give_up_held()
        status = "interrupted" if interrupted else "failed" if failed else "finished"
        end: dict[str, Any] = {"kind": "end", "run_id": self._run_id, "status": status, "time": time.time()}
        if reason:
            end["reason"] = reason
        if self.gaps:
            end["missing"] = missing_summary(g.record(self._run_id) for g in self.gaps)
        lines = [self._head] if self._head else []
        if self._gap is not None:
            lines.append(_json_line(self._gap.record(self._run_id)))
        try:
            self._file.append(b"".join((*lines, _json_line(end))))
            if self.fsync != "never":
                self._file.sync()
        except OSError as exc:
            missing = f"; it misses {', '.join(g.describe() for g in self.gaps)}" if self.gaps else ""
            emit_warning(f"journal {self.path}: the end record could not be written ({type(exc).__name__}: {exc})"
                         f"{missing}; readers take the run as killed", stacklevel=3)
        finally:
            self._file.close()
            self._unlock()

    def _unlock(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def _line(self, record: Mapping[str, Any], *, sync: bool = False) -> None:
        if self._file.closed:
            raise MetricsError(f"journal {self.path} is not open; fix: call start() before write()")
        self._file.append(_json_line(record))
        if sync:
            self._file.sync()


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


class _Header:
    """What a journal's header says, for both ways of reading a journal (:class:`Journal`,
    :class:`JournalOnDisk`)."""

    header: dict[str, Any]

    @property
    def run_id(self) -> str:
        return str(self.header.get("run_id", ""))

    @property
    def adapters(self) -> list[str]:
        return list(self.header.get("adapters", []))

    @property
    def config(self) -> dict[str, Any]:
        """The run config flat (``rl/n_mini``), whether the header holds it nested (version 1 since
        the nested config) or flat (older journals)."""
        return dict(flatten_config(self.header.get("config", {})))

    @property
    def config_tree(self) -> dict[str, Any]:
        """The run config as the header holds it: nested, lists and ``None`` kept (an older journal:
        flat)."""
        return dict(self.header.get("config", {}))

    @property
    def trackers(self) -> dict[str, Any]:
        """Each tracker sink's settings when the run started (``{"wandb": {"project", "entity"}}``);
        empty for an older journal."""
        trackers = self.header.get("trackers", {})
        return dict(trackers) if isinstance(trackers, dict) else {}

    @property
    def extra(self) -> dict[str, Any]:
        """The user's own key declarations (empty when the run declared none)."""
        return dict(self.header.get("extra", {}))


@dataclasses.dataclass(frozen=True)
class PhaseSpan:
    """A phase's frames in a journal: how many, and the lowest and highest step."""

    frames: int
    first_step: int
    last_step: int


def _phase_spans(frames: Iterable[Frame]) -> dict[str, PhaseSpan]:
    spans: dict[str, list[int]] = {}  # phase -> [frames, first, last]
    for frame in frames:
        span = spans.get(frame.phase)
        if span is None:
            spans[frame.phase] = [1, frame.step, frame.step]
        else:
            span[0] += 1
            span[1] = min(span[1], frame.step)
            span[2] = max(span[2], frame.step)
    return {phase: PhaseSpan(*span) for phase, span in spans.items()}


@dataclasses.dataclass
class Journal(_Header):
    """A journal read back: its header, frames in file order, end record (if any) and warnings."""

    path: Path
    header: dict[str, Any]
    frames: list[Frame]
    end: dict[str, Any] | None
    warnings: list[str]
    gaps: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """The gap records: frames the writer could not keep (a full disk), with their steps."""

    @property
    def phases(self) -> dict[str, PhaseSpan]:
        """Per phase (``train``, ``val``): its frames and its lowest and highest step."""
        return _phase_spans(self.frames)


class FramesOnDisk:
    """A journal's frames, parsed again from the file at each iteration: a pass holds one frame at a
    time. The file is read as it was when the journal was opened, so every pass gives the same frames
    (a live run's later lines are not read); a file changed under it since (replaced, cut shorter, or
    another journal copied over it: its header differs) is a :class:`MetricsError`."""

    def __init__(self, path: Path, size: int, count: int, identity: tuple[int, int], header: dict[str, Any]) -> None:
        self.path, self.size, self.count, self.identity, self.header = path, size, count, identity, header

    def __iter__(self) -> Iterator[Frame]:
        found = _Pass()
        checked = False
        for frame in _frames(self.path, found, size=self.size, identity=self.identity, warn=False):
            if not checked:  # the header comes before any frame
                if found.first != self.header:
                    raise MetricsError(f"{self.path}: the journal was rewritten since it was opened (its header "
                                       "is not the one read then); fix: open it again")
                checked = True
            yield frame

    def __len__(self) -> int:
        return self.count


@dataclasses.dataclass
class JournalOnDisk(_Header):
    """A journal checked whole but not held (see :func:`open_journal`): ``frames`` reads them again
    from the file at each iteration, so a long run's journal is read in constant memory."""

    path: Path
    header: dict[str, Any]
    frames: FramesOnDisk
    end: dict[str, Any] | None
    warnings: list[str]
    phases: dict[str, PhaseSpan]
    gaps: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """The gap records (see :class:`Journal`)."""


_SURROGATE = re.compile("[\ud800-\udfff]")


def _lines(path: Path, size: int | None = None,
           identity: tuple[int, int] | None = None) -> Iterator[tuple[int, str | UnicodeDecodeError, bool]]:
    """``(number, text, last)`` per non-blank line of the file's first ``size`` bytes (by default,
    what is written when it is opened: a live run's later lines wait); ``last``: no newline after it
    (possibly torn). A line that is not UTF-8 comes as its decoding error, for the reader to name the
    line. With ``identity`` (the file's device and inode when it was first read), a file replaced at
    the path since, or shorter than ``size``, is a :class:`MetricsError`: a later pass must read what
    the first one read."""
    with open(path, "rb") as f:  # line by line: a long run's journal is never held twice over
        if identity is not None and _identity(os.fstat(f.fileno())) != identity:
            raise MetricsError(f"{path}: the journal was replaced since it was opened (another run started "
                               "there?); open it again")
        if size is None:
            size = os.fstat(f.fileno()).st_size
        read = 0
        for i, raw in enumerate(f, 1):
            if read + len(raw) > size:
                raw = raw[: size - read]  # the part of a line being written that was there at the start
            read += len(raw)
            last = not raw.endswith(b"\n")
            if last and read < size:
                break  # the file ends short of what it held: not a torn line of its own
            if raw.strip():
                try:
                    line: str | UnicodeDecodeError = (raw if last else raw[:-1]).decode("utf-8")
                except UnicodeDecodeError as exc:
                    line = exc
                yield i, line, last
            if last or read >= size:
                return
    if read < size:
        raise MetricsError(f"{path}: the file is shorter than when it was opened ({read} of {size} bytes): it "
                           "was truncated or replaced while being read")


def _identity(stat: os.stat_result) -> tuple[int, int]:
    return stat.st_dev, stat.st_ino


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


def header_adapters(header: Mapping[str, Any]) -> tuple[MetricAdapter, ...]:
    """The adapters a journal header names, then the user's own keys it declares (``extra``), rebuilt
    here: a registered adapter is found by name, a user key from its declaration alone."""
    names = list(header.get("adapters", []))
    extra = user_adapters(header.get("extra", {}))
    return (*(resolve_adapters(names) if names else ()), *extra)


def _catalogue(header: Mapping[str, Any]) -> dict[str, KeyInfo]:
    """The declared keys of the journal's adapters; empty when one is not registered here (the
    command line refuses such a journal, naming the adapter and the fix)."""
    try:
        return describe(header_adapters(header))
    except MetricsError:
        return {}


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
    elif not isinstance(header.get("extra", {}), dict):
        problem = f"extra {header.get('extra')!r:.80} is not a JSON object of key declarations"
    elif "created" in header and not _finite_number(header["created"]):
        problem = f"created {header['created']!r:.40} is not a finite time in seconds"
    elif nesting(header) > MAX_HEADER_DEPTH:
        problem = (f"values nest more than {MAX_HEADER_DEPTH} levels deep (a config nests a few; every "
                   "reader of a config walks it level by level)")
    if problem:
        raise MetricsError(f"{path}: the journal header's {problem}; the file is damaged or not ours")


def _existing(path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    if not p.is_file():
        raise MetricsError(f"journal {p} does not exist or is not a file; fix: pass the path of a journal.jsonl")
    return p


def read_journal(path: str | os.PathLike[str]) -> Journal:
    """Read a journal. A torn last line (a crash mid-write) is skipped with a warning; anything
    else malformed, an unknown format or version, or a missing file is a :class:`MetricsError`."""
    p = _existing(path)
    found = _Pass()
    frames = list(_frames(p, found))
    return Journal(p, found.header(p), frames, found.end, found.notes, found.gaps)


def open_journal(path: str | os.PathLike[str]) -> JournalOnDisk:
    """Check a journal as :func:`read_journal` does, without holding its frames: they are read again
    from the file at each iteration of ``frames`` (the run's record at close reads a long run this
    way, in memory that does not grow with the run)."""
    p = _existing(path)
    stat = p.stat()
    identity = _identity(stat)
    found = _Pass()
    spans = _phase_spans(_frames(p, found, size=stat.st_size, identity=identity, stacklevel=5))
    count = sum(span.frames for span in spans.values())
    header = found.header(p)
    return JournalOnDisk(p, header, FramesOnDisk(p, stat.st_size, count, identity, header), found.end, found.notes,
                         spans, found.gaps)


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


@dataclasses.dataclass
class _Pass:
    """What a pass over a journal (:func:`_frames`) found besides its frames."""

    first: dict[str, Any] | None = None  # the first header
    end: dict[str, Any] | None = None
    notes: list[str] = dataclasses.field(default_factory=list)
    gaps: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # frames the writer could not keep

    def header(self, path: Path) -> dict[str, Any]:
        if self.first is None:
            raise MetricsError(f"{path}: empty journal (no header line)")
        return self.first


def _frames(p: Path, found: _Pass, *, size: int | None = None, identity: tuple[int, int] | None = None,
            warn: bool = True, stacklevel: int = 4) -> Iterator[Frame]:
    """The frames of the journal at ``p`` (see :func:`_lines`) in file order, checked; its header, end
    record and notes (a skipped torn line) go to ``found`` (warned about too, with ``warn``, at the
    caller ``stacklevel`` frames up from the warning)."""
    damaged: tuple[int, str] | None = None
    check = LineCheck(p)

    def note(text: str) -> None:
        found.notes.append(text)
        if warn:
            emit_warning(text, stacklevel=stacklevel)  # the caller of read_journal / open_journal

    for number, line, unterminated in _lines(p, size, identity):
        try:
            record, strict = check.record(line)
        except (ValueError, RecursionError) as exc:  # RecursionError: nesting too deep to decode
            if unterminated:
                note(f"{p}:{number}: skipped a torn last line (the writer stopped mid-line)")
                continue
            if damaged is not None or found.first is None:
                raise MetricsError(f"{p}:{number}: not a journal line ({exc}); the file is damaged") from None
            damaged = (number, str(exc))  # a crash's torn line, if a resumed run's header follows it
            continue
        assert isinstance(line, str)  # a line that is not UTF-8 was refused above
        kind = record.get("kind")
        if damaged is not None:
            if kind != "header" or found.first is None:
                raise MetricsError(f"{p}:{damaged[0]}: not a journal line ({damaged[1]}); the file is damaged")
            note(f"{p}:{damaged[0]}: skipped a line torn by a crash; the run resumed after it")
            damaged = None
        if found.first is None and kind != "header":
            raise MetricsError(f"{p}: the first line is not a {FORMAT} header; is this a journal?")
        if kind == "header":
            check.header(record, number)
            found.first = check.first
        elif kind == "frame":
            try:
                frame = check.frame(line, record, strict)
            except LineCheck.FRAME_ERRORS as exc:
                if unterminated:
                    found.notes.append(f"{p}:{number}: skipped a torn last line")
                    continue
                raise MetricsError(f"{p}:{number}: malformed frame ({exc!r})") from None
        elif kind == "end":
            try:
                check.end(record)
            except ValueError as exc:
                if unterminated:
                    continue
                raise MetricsError(f"{p}:{number}: {exc}") from None
            found.end = record
            continue
        elif kind == "gap":
            try:
                check.gap(record)
            except ValueError as exc:
                if unterminated:
                    continue
                raise MetricsError(f"{p}:{number}: malformed gap record ({exc})") from None
            found.gaps.append(record)
            continue
        else:
            raise MetricsError(f"{p}:{number}: unknown record kind {kind!r}")
        if kind in ("frame", "header"):
            found.end = None  # the run went on after an end record: its status is the next end's
        if kind == "frame":
            yield frame
    if damaged is not None:
        raise MetricsError(f"{p}:{damaged[0]}: not a journal line ({damaged[1]}); the file is damaged")


# -- following a journal as it grows (the publisher's reader) ----------------------------------------


@dataclasses.dataclass
class Record:
    """One journal line as the follower needs it."""

    kind: str  # "header", "frame", "gap", "end"
    frame: Frame | None = None
    header: dict[str, Any] | None = None
    status: str | None = None
    gap: dict[str, Any] | None = None  # a gap record (see Gap)
    reason: str = ""  # an end record's reason (why the run failed or was interrupted)


class JournalTail:
    """Reads the complete lines appended to a journal since the last call (a torn last line waits).

    Every line is read by the reader's own :class:`LineCheck`, with the reader's one recovery: a line
    that is not JSON followed by a header is a line torn by a crash, the run having resumed after
    it; followed by anything else it is damage (a :class:`MetricsError`). Live, what follows such a
    line is not known yet: it waits, and ``read(final=True)`` (the file is complete) refuses it."""

    def __init__(self, path: Path, offset: int = 0) -> None:
        self.path = path
        self.offset = offset
        self.line_number = 0
        self.check = LineCheck(path)
        self.damaged: tuple[int, str] | None = None  # a line that is not JSON, waiting for what follows

    def read(self, limit: int = 1 << 30, max_bytes: int = 1 << 20, *, final: bool = False) -> list[Record]:
        """The next ``limit`` complete lines (fewer at the end of what is written), read about
        ``max_bytes`` at a time: a follower's batch of 512 frames is one or two reads, never the whole
        backlog at once. A torn last line waits for its end. ``final``: the file is complete, so a
        damaged line that nothing followed is refused."""
        out = self._read(limit, max_bytes)
        if final and self.damaged is not None and len(out) < limit:
            self._refuse_damaged()
        return out

    def _read(self, limit: int, max_bytes: int) -> list[Record]:
        out: list[Record] = []
        try:
            f = open(self.path, "rb")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            return out
        with f:
            f.seek(self.offset)
            data = b""
            consumed = 0  # the offset moves once every line read is parsed
            while len(out) < limit:
                chunk = f.read(max_bytes)
                if not chunk:
                    break
                data += chunk
                pos = 0
                while len(out) < limit:
                    end = data.find(b"\n", pos)
                    if end < 0:
                        break
                    line = data[pos:end]
                    pos = end + 1
                    self.line_number += 1
                    record = self._parse(line) if line.strip() else None
                    if record is not None:
                        out.append(record)
                consumed += pos
                data = data[pos:]  # a line not complete in this read: read on
        self.offset += consumed
        return out

    def _parse(self, line: bytes) -> Record | None:
        """One line as a record (``None``: a line that is not JSON, held until the next line says
        whether a crash tore it), read as :func:`read_journal` reads it."""
        try:
            text: str | UnicodeDecodeError = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            text = exc
        try:
            record, strict = self.check.record(text)
        except (ValueError, RecursionError) as exc:
            if self.damaged is not None or self.check.first is None:
                raise self._not_a_line(self.line_number, repr(exc)) from None
            self.damaged = (self.line_number, repr(exc))
            return None
        assert isinstance(text, str)
        kind = record.get("kind")
        if self.damaged is not None:
            if kind != "header":
                self._refuse_damaged()
            self.damaged = None  # torn by a crash: the resumed run's header follows it
        if self.check.first is None and kind != "header":
            raise MetricsError(f"{self.path}: the first line is not a {FORMAT} header; is this a journal?")
        try:
            if kind == "frame":
                return Record("frame", frame=self.check.frame(text, record, strict))
            if kind == "header":
                self.check.header(record, self.line_number)
                return Record("header", header=record)
            if kind == "end":
                self.check.end(record)
                return Record("end", status=str(record.get("status", "finished")), reason=str(record.get("reason", "")))
            if kind == "gap":
                self.check.gap(record)
                return Record("gap", gap=record)
        except LineCheck.FRAME_ERRORS as exc:
            raise self._not_a_line(self.line_number, repr(exc)) from None
        raise self._not_a_line(self.line_number, f"unknown record kind {kind!r:.40}")

    def _not_a_line(self, number: int, why: str) -> MetricsError:
        return MetricsError(f"{self.path}: line {number}: not a journal line ({why:.200}); the file is damaged")

    def _refuse_damaged(self) -> None:
        assert self.damaged is not None
        raise self._not_a_line(*self.damaged)


def last_header(path: Path, block: int = 1 << 20) -> dict[str, Any] | None:
    """The last header line of the journal (a resumed run appends one), found from the end a block at
    a time: a long run's journal is neither read whole nor mapped (a mapping's pages count in the
    process's resident set while it scans)."""
    marker = b'{"format":"' + FORMAT.encode() + b'"'
    try:
        with open(path, "rb") as f:
            end = f.seek(0, os.SEEK_END)
            tail = b""  # the first bytes after this block, for a marker across the boundary
            while end > 0:
                start = max(0, end - block)
                f.seek(start)
                data = f.read(end - start) + tail[: len(marker) - 1]
                at = data.rfind(marker)
                if at >= 0:
                    f.seek(start + at)
                    line = f.readline()
                    break
                tail, end = data[: len(marker) - 1], start
            else:
                return None
    except OSError:
        return None
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


def journal_closed(path: Path) -> str | None:
    """The status of the journal's end record when its last line is one (the trainer closed the
    run), else None."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 512))
            tail = f.read()
    except OSError:
        return None
    last = tail.rstrip(b"\n").rsplit(b"\n", 1)[-1]
    if b'"kind":"end"' not in last:
        return None
    try:
        return str(json.loads(last).get("status", "finished"))
    except (ValueError, AttributeError):
        return None
