"""A sink that keeps frames in memory: for tests, notebooks and the contract test."""

from __future__ import annotations

from ..core.frame import Frame
from .base import RunInfo, Sink

__all__ = ["MemorySink"]


class MemorySink(Sink):
    """Keeps every frame it is given, as given.

    >>> sink = MemorySink()
    >>> sink.write(Frame(1, {"train/loss_avg": 0.5}))
    >>> sink.frames[0].metrics
    {'train/loss_avg': 0.5}
    """

    name = "memory"
    stores_nonfinite = frozenset({"nan", "inf"})

    def __init__(self) -> None:
        self.run: RunInfo | None = None
        self.frames: list[Frame] = []
        self.closed: bool | None = None  # None while open; then whether the run failed

    def start(self, run: RunInfo) -> None:
        self.run = run

    def write(self, frame: Frame) -> None:
        self.frames.append(frame)

    def close(self, *, failed: bool = False, killed: bool = False, interrupted: bool = False,
              reason: str = "") -> None:
        if self.closed is None:
            self.closed = failed
