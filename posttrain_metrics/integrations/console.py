"""One headline line per step on the console: the keys the catalogue marks as headline."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import TextIO

from ..core.frame import Frame
from ..core.keys import KeyInfo, headline_keys
from ..core.printable import printable
from ..core.values import Scalar
from .base import RunInfo

__all__ = ["ConsoleSink"]


def _fmt(value: Scalar) -> str:
    if isinstance(value, (bool, int, str)):
        return str(value)
    return f"{value:.4g}" if math.isfinite(value) else str(value)


class ConsoleSink:
    """Prints ``step N | train/loss_avg 0.1234 | ...`` for the catalogue's headline keys.

    Headline keys are declared in the catalogue (``Metric(headline=True)``, with ``headline_if``
    for keys shown only when another is positive, such as ``kl_mean`` when ``kl_beta > 0``), so
    a user's own adapter gets its own line. ``keys`` overrides the choice. The outcome label is
    shown only when it is not ``applied``.
    """

    name = "console"
    stores_nonfinite = frozenset({"nan", "inf"})
    inline = True  # written on the training thread, never by the publisher process

    def __init__(self, *, keys: Sequence[str] | None = None, every: int = 1, stream: TextIO | None = None) -> None:
        self.keys = tuple(keys) if keys is not None else None
        self.every = max(1, int(every))
        self.stream = stream
        self._catalog: dict[str, KeyInfo] = {}

    def start(self, run: RunInfo) -> None:
        self._catalog = dict(run.keys)
        self._print(f"run {run.name} ({run.run_id}): adapters {', '.join(run.adapters)}")

    def line(self, frame: Frame) -> str:
        m = frame.metrics
        keys = [k for k in self.keys if k in m] if self.keys is not None else headline_keys(self._catalog, m)
        parts = [f"{frame.phase} step {frame.step}"]
        for key in keys:
            value = m[key]
            if isinstance(value, str):
                if value != "applied":
                    parts.append(f"{key.rsplit('/', 1)[-1]} {value.upper()}")
                continue
            parts.append(f"{key.split('/', 1)[-1]} {_fmt(value)}")
        return " | ".join(parts)

    def write(self, frame: Frame) -> None:
        if frame.step % self.every == 0 or frame.phase != "train":
            self._print(self.line(frame))

    def close(self, *, failed: bool = False) -> None:
        pass  # nothing held open

    def _print(self, text: str) -> None:
        # Run names, keys and labels may hold control characters (a replayed journal is anyone's
        # data): escaped, so that one printed line stays one line.
        print(printable(text), file=self.stream or sys.stdout, flush=True)
