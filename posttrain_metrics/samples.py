"""The samples file: the completions a run published, one JSON line per step, beside the journal.

``<journal stem>.samples.jsonl`` next to ``journal.jsonl`` (a separate file, so the metrics journal
stays small). Each line is ``{"kind": "samples", "step", "time", "offered", "columns": [...],
"rows": [[...], ...]}`` (see :class:`~posttrain_metrics.core.samples.Samples`). Written on global
rank 0 by the callback, flushed per line; tailed by the publisher (live) and read by ``export``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .core.samples import Samples
from .core.warn import warn
from .journal import RunFile
from .lines import LineFile

__all__ = ["SamplesFile", "SamplesTail", "read_samples", "samples_path"]


def samples_path(journal: Path) -> Path:
    """The samples file of the journal at ``journal``: ``journal.jsonl`` -> ``journal.samples.jsonl``
    (:class:`~posttrain_metrics.journal.RunFile`: under the journal's folder rule, moved with it)."""
    return RunFile.SAMPLES.of(journal)


class SamplesFile:
    """Appends one line per step's samples, flushed (a killed run leaves whole lines). A line that
    cannot be written (a full disk) is not in the file at all (see :class:`~posttrain_metrics.lines.LineFile`):
    ``write`` raises the ``OSError`` and the next step's line is written whole after the last one."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = LineFile(path)

    def write(self, samples: Samples) -> int:
        """Append ``samples``; the bytes written."""
        if self._file.closed:
            self._file.open()
        line = json.dumps(samples.to_record(), separators=(",", ":"), ensure_ascii=False, allow_nan=False) + "\n"
        data = line.encode("utf-8")
        self._file.append(data)
        return len(data)

    def close(self) -> None:
        self._file.close()


def read_samples(path: str | os.PathLike[str]) -> list[Samples]:
    """Every step's samples in ``path`` (none when it does not exist); a torn last line is skipped."""
    p = Path(path)
    if not p.is_file():
        return []
    return SamplesTail(p).read(final=True)


class SamplesTail:
    """The complete sample lines appended since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def read(self, *, final: bool = False) -> list[Samples]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        out = []
        for line in data[:end].splitlines():
            if not line.strip():
                continue
            try:
                out.append(Samples.from_record(json.loads(line)))
            except (ValueError, KeyError, TypeError) as exc:  # one bad line never stops the others
                warn(f"{self.path}: skipped a samples line that is not one ({exc!r:.120})", stacklevel=2)
        self.offset += end
        if final and data[end:].strip():
            warn(f"{self.path}: skipped a torn last line (the writer stopped mid-line)", stacklevel=2)
        return out
