"""Reading a whole journal (``export``, ``doctor``, ``plot``): :func:`read_journal` holds its frames,
:func:`open_journal` reads them again at each pass; every line is checked by :class:`~.check.LineCheck`."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ..core.errors import MetricsError
from ..core.frame import Frame
from ..core.redact import flatten_config
from ..core.warn import warn as emit_warning
from .check import LineCheck
from .format import FORMAT

__all__ = ["FramesOnDisk", "Journal", "JournalOnDisk", "PhaseSpan", "open_journal", "read_journal"]


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
        """The run config flat (``rl/n_mini``); the header holds it nested."""
        return dict(flatten_config(self.header.get("config", {})))

    @property
    def config_tree(self) -> dict[str, Any]:
        """The run config as the header holds it: nested, lists and ``None`` kept."""
        return dict(self.header.get("config", {}))

    @property
    def trackers(self) -> dict[str, Any]:
        """Each tracker sink's settings when the run started (``{"wandb": {"project", "entity"}}``)."""
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
