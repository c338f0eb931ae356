"""The publisher process's output, redacted where it leaves the process.

The publisher's stdout and stderr are ``publisher.log`` (and, for our own warnings, the trainer's
stderr). What reaches them is not only ours: MLflow logs a warning with the tracking URI it could
not reach, W&B prints its banner and a library may print the exception a tracker raised. Rather than
trust every call site, the process's text streams are wrapped once (:func:`redacted_output`), and
every line is redacted by :func:`~posttrain_metrics.core.redact.redact_text` on its way out.
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Iterator
from typing import TextIO

from ..core.redact import redact_text

__all__ = ["RedactedLines", "redacted_output"]


class RedactedLines(io.TextIOBase):
    """A text stream that passes whole lines, redacted, to ``out``. A line is held until its end
    (or a flush) so that a secret written in two pieces is still seen whole."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._pending = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._pending += text
        if "\n" in self._pending:
            lines, self._pending = self._pending.rsplit("\n", 1)
            self._out.write(redact_text(lines) + "\n")
        return len(text)

    def flush(self) -> None:
        if self._pending:
            self._out.write(redact_text(self._pending))
            self._pending = ""
        self._out.flush()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return str(getattr(self._out, "encoding", None) or "utf-8")

    def fileno(self) -> int:
        return self._out.fileno()

    def isatty(self) -> bool:
        return self._out.isatty()


@contextlib.contextmanager
def redacted_output() -> Iterator[None]:
    """Within the block, ``sys.stdout`` and ``sys.stderr`` pass only redacted lines (Python's
    ``print``, ``logging`` handlers that write to ``sys.stderr`` when they emit, warnings)."""
    saved = sys.stdout, sys.stderr
    out, err = RedactedLines(sys.stdout), RedactedLines(sys.stderr)
    sys.stdout, sys.stderr = out, err  # type: ignore[assignment]
    try:
        yield
    finally:
        out.flush()
        err.flush()
        sys.stdout, sys.stderr = saved
