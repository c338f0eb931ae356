"""One sink's I/O on its own thread, behind a bounded queue, so a slow tracker never holds a step.

When the queue is full the *oldest* frame is dropped and counted: memory stays bounded, the
training step never waits, and the journal (written on the training thread, first) still holds the
dropped frame, which ``posttrain-metrics export`` puts back idempotently.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any

from ..core.frame import Frame
from .base import Sink

__all__ = ["SinkWorker"]


class SinkWorker:
    """Runs ``call(sink, "write", frame)`` for queued frames, in order, on a daemon thread."""

    def __init__(self, sink: Sink, call: Callable[..., object], *, maxsize: int = 1024) -> None:
        if maxsize < 1:
            raise ValueError(f"queue size must be >= 1, got {maxsize}")
        self.sink = sink
        self.maxsize = maxsize
        self.dropped = 0
        self.written = 0
        self._call = call
        self._queue: collections.deque[Frame] = collections.deque()
        self._ready = threading.Condition()
        self._closing: dict[str, Any] | None = None
        self._thread = threading.Thread(target=self._run, name=f"posttrain-metrics-{sink.name}", daemon=True)
        self._thread.start()

    def put(self, frame: Frame) -> bool:
        """Queue ``frame``; returns False when the oldest queued frame had to be dropped for it."""
        with self._ready:
            dropped = len(self._queue) >= self.maxsize
            if dropped:
                self._queue.popleft()
                self.dropped += 1
            self._queue.append(frame)
            self._ready.notify()
        return not dropped

    @property
    def backlog(self) -> int:
        return len(self._queue)

    def request_close(self, *, failed: bool) -> None:
        """Ask the thread to drain the queue, close the sink and stop (returns at once)."""
        with self._ready:
            self._closing = {"failed": failed}
            self._ready.notify()

    def wait(self, timeout: float) -> bool:
        """Wait for the thread to stop; False if it did not in ``timeout`` seconds."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def close(self, *, failed: bool, timeout: float) -> bool:
        """Drain the queue, close the sink, stop the thread. False if it did not finish in time."""
        self.request_close(failed=failed)
        return self.wait(timeout)

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._queue and self._closing is None:
                    self._ready.wait()
                if not self._queue:
                    closing = self._closing
                    break
                frame = self._queue.popleft()
            self._call(self.sink, "write", frame)
            self.written += 1
        self._call(self.sink, "close", **(closing or {}))
