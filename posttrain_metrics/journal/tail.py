"""Following a journal as it grows (the publisher's reader): :class:`JournalTail` reads each new line
with the reader's own :class:`~.check.LineCheck`."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from ..core.errors import MetricsError
from ..core.frame import Frame
from .check import LineCheck
from .format import FORMAT

__all__ = ["JournalTail", "Record", "journal_closed", "last_header"]


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
    try:  # the one reading of a line (a torn or damaged one: no header found)
        record, _ = LineCheck.record(line.rstrip(b"\n").decode("utf-8"))
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    return record


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
