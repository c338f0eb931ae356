"""Writing a run's journal: :class:`JournalSink` (one flushed line per frame, a bounded backlog and gap
records on a full disk) and :class:`RunLock` (one live run per journal)."""

from __future__ import annotations

import collections
import contextlib
import json
import math
import os
import re
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..core.errors import MetricsError
from ..core.frame import Frame
from ..core.log import get_logger
from ..integrations.base import RunInfo, Sink
from . import format as _format
from .format import FORMAT, VERSION, Gap, RunFile, _encode, _json_line, missing_summary
from .lines import LineFile

__all__ = ["BACKLOG_BYTES", "LOCK_FD_ENV", "RESUME_WAIT", "JournalSink", "RunLock"]

log = get_logger("journal")  # a full disk, its recovery, a run set aside: what happened, nothing to fix

_FSYNC = ("close", "step", "never")
BACKLOG_BYTES = 16 << 20
"""How many bytes of frame lines a journal holds in memory while its disk is full (see JournalSink)."""


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
                    log.warning(f"journal {path.with_name(path.name[: -len('.lock')])}: the previous attempt of run "
                                f"{run_id!r} has exited and its publisher process (pid {draining}) still sends "
                                f"that journal to the trackers; this resumed run waits for it (up to "
                                f"{resume_wait:g} s)")
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
    (``health/missing_steps``) report them. Each failure and the recovery are logged once
    (``posttrain_metrics.journal``).
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
                "declarations": {name: dict(d) for name, d in run.declarations.items()},
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
        log.warning(f"journal {self.path} held run {previous!r}; moved it to {target.name} (with its samples, "
                    f"record, status and publisher log) so that run {run_id!r} starts its own journal")

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
        orjson = _format._orjson  # looked up at each call: tests run both encoders
        if orjson is not None and math.isfinite(frame.wall_time):
            # orjson (when installed) encodes a 61-key frame about 10x faster than json: it is the
            # training thread's main cost here. Same strict JSON; floats in their shortest repr.
            try:
                return orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)  # type: ignore[no-any-return]
            except TypeError:  # a value orjson does not take (it is strict about types): json's turn
                pass
        return _json_line(record)

    def _failed(self, exc: OSError) -> None:
        if self._fault:
            return
        self._fault = f"{type(exc).__name__}: {exc}"
        log.warning(f"journal {self.path}: a line could not be written ({self._fault}); training goes on, the "
                    f"frames are held in memory (up to backlog_bytes={self.backlog_bytes}) and written when the "
                    "disk has room; frames beyond that are recorded as a gap (their steps) in the journal")

    def _hold(self, step: int, phase: str, line: bytes) -> None:
        """Keep a frame that could not be written, within the bound; past it, count it in the gap."""
        if self._gap is None and self._held_bytes + len(line) <= self.backlog_bytes:
            self._held.append((step, phase, line))
            self._held_bytes += len(line)
            return
        if self._gap is None:
            self._gap = Gap(step, step, error=self._fault)
            self.gaps.append(self._gap)
            log.warning(f"journal {self.path}: {len(self._held)} frames held in memory fill backlog_bytes="
                        f"{self.backlog_bytes}; frames from {phase} step {step} on are not kept until the disk "
                        "has room: their steps are recorded as a gap")
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
            said = log.warning if gap is not None else log.info  # a recovery that lost nothing is info
            said(f"journal {self.path} is written again: {written} held frames are in it{lost}")
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
            log.warning(f"journal {self.path}: the end record could not be written ({type(exc).__name__}: {exc})"
                        f"{missing}; readers take the run as killed")
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
