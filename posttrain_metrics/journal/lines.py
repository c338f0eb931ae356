"""An append-only file of whole lines: what the journal and the samples file are written with.

A write to a full disk (or past a file-size limit) may take part of its bytes before it fails. A
buffered file then keeps the rest and writes it later, after lines written meanwhile: a torn line
in the middle of the file, which every reader refuses as damage. Here each append is one ``write``
loop on the raw descriptor, and one that fails cuts the file back to where it ended (``ftruncate``
needs no room on the disk), so the file always ends with a whole line and the caller decides what
to do with the line that did not go in.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["LineFile"]


class LineFile:
    """Appends whole lines to ``path`` (created with its folder when opened); each append reaches the
    operating system at once (a killed process loses nothing appended), ``sync`` forces it to disk."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._end = 0  # where the file ends after the last whole append

    @property
    def closed(self) -> bool:
        return self._fd is None

    def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._end = os.fstat(self._fd).st_size

    def append(self, data: bytes) -> None:
        """Append ``data`` (whole lines) or nothing: on a failure the file is cut back to where it
        ended and the ``OSError`` raised."""
        if self._fd is None:
            raise OSError(f"{self.path} is not open")
        view = memoryview(data)
        done = 0
        try:
            while done < len(data):
                done += os.write(self._fd, view[done:])
        except OSError:
            if done:
                os.ftruncate(self._fd, self._end)
            raise
        self._end += len(data)

    def sync(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
