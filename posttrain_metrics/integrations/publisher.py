"""The one place that publishes: global rank 0 only, the journal first, then every other sink.

The publisher normalises a frame once for the sinks: categorical keys gain one 0/1 indicator series
per label (``optim/update_outcome/skipped``) so that outcomes chart in every tracker, bools become
0/1, and non-finite values a backend cannot store faithfully are removed for that backend and
counted under ``health/nonfinite/<key>`` with one warning per key. The journal gets the frame
exactly as reduced. A sink that raises is warned about once and never stops training or the others.

A frame with no metrics (``reduce`` with no ``add`` on any rank: an empty window) is written to the
journal only, so the record shows the step ran with no data; no other sink receives it (there is
nothing to chart, and a tracker row without values is noise), it is counted in ``empty_frames`` and
warned about once.

Only the reduction and the journal line happen on the training thread: every other sink writes on
its own thread behind a bounded queue (:class:`~posttrain_metrics.integrations.worker.SinkWorker`;
drop-oldest when full, counted, the journal keeps every frame for ``posttrain-metrics export``).
``close`` drains the queues (bounded by ``close_timeout``) and closes every sink.
"""

from __future__ import annotations

import atexit
import math
import re
import sys
import time
import uuid
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from ..core.distributed import global_rank
from ..core.errors import MetricsError
from ..core.frame import Frame
from ..core.keys import KeyInfo, describe, label_key
from ..core.redact import flatten_config, redact_text
from ..core.reducer import AdapterSpec, resolve_adapters
from ..core.values import Scalar
from .base import RunInfo, Sink
from .worker import SinkWorker

__all__ = ["Publisher", "display_frame", "nonfinite_kind"]

# Run ids end up in file names (W&B's run-<id>.wandb, a TensorBoard log_dir with {run_id}) and in
# tracker queries: letters, digits, '_', '-', '.', not starting with '.' or '-'.
SAFE_RUN_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")  # matched with fullmatch


def nonfinite_kind(value: Scalar) -> str | None:
    """``"nan"``, ``"inf"`` or ``None`` for a finite value or a label."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else "inf"
    return None


def display_frame(frame: Frame, keys: Mapping[str, KeyInfo]) -> Frame:
    """The frame as trackers show it: label indicators added, bools as 0/1; nothing removed."""
    out: dict[str, Scalar] = {}
    for key, value in frame.metrics.items():
        out[key] = int(value) if isinstance(value, bool) else value
        info = keys.get(key)
        if isinstance(value, str) and info is not None:
            for label in info.metric.labels:
                out[label_key(key, label)] = int(value == label)
    return Frame(frame.step, out, frame.phase, frame.wall_time)


class Publisher:
    """Hands frames to sinks on global rank 0; on other ranks every call is a cheap no-op.

    Sink constructors do no I/O, so building the same publisher on every rank is harmless: only
    rank 0 starts runs. Use it as a context manager, or call ``start``/``close``; ``close`` is
    idempotent and also runs at interpreter exit.
    """

    def __init__(
        self,
        sinks: Sequence[Sink],
        *,
        adapters: AdapterSpec,
        run_name: str | None = None,
        run_id: str | None = None,
        background: bool = True,
        queue_size: int = 1024,
        close_timeout: float = 300.0,
    ) -> None:
        self.sinks = sorted(sinks, key=lambda s: s.name != "journal")  # the journal first
        names = [s.name for s in self.sinks]
        if len(set(names)) != len(names):
            twice = sorted({n for n in names if names.count(n) > 1})
            raise MetricsError(
                f"two sinks are named {twice}: sinks are told apart by name; fix: give one of them another "
                "name (set its `name` attribute) or publish to one backend per kind"
            )
        self.background = background
        self.queue_size = queue_size
        self.close_timeout = close_timeout
        self.workers: dict[str, SinkWorker] = {}
        self.unstarted: set[str] = set()  # sinks whose start() failed: skipped, the journal has all
        self.adapters = resolve_adapters(adapters)
        self.keys = describe(self.adapters)
        if run_id is not None and not (isinstance(run_id, str) and SAFE_RUN_ID.fullmatch(run_id)):
            raise MetricsError(
                f"run_id {run_id!r:.80} is not a safe run id (it names files and tracker runs); fix: use "
                "1-128 letters, digits, '_', '-' or '.', not starting with '.' or '-'"
            )
        self.run_id = run_id or uuid.uuid4().hex[:16]
        self.run_name = run_name or f"run-{time.strftime('%Y%m%d-%H%M%S')}"
        self.run: RunInfo | None = None
        self.failures: dict[str, int] = {}
        self.empty_frames = 0  # frames with no metrics: journal only (see the module docstring)
        self._nonfinite: dict[tuple[str, str], int] = {}
        self._closed = False
        self.after_close = 0  # frames published after close(): warned once, not recorded

    # Side effects happen on global rank 0 only; the rank is read at call time.
    @staticmethod
    def publishes_here() -> bool:
        return global_rank() == 0

    def start(self, config: Mapping[str, Any] | None = None) -> RunInfo:
        """Start every sink (rank 0) with the flattened, redacted config. Idempotent: a second call
        returns the running run (a config that arrives after the first frame is not recorded)."""
        if self.run is not None:
            if config:
                warnings.warn(
                    "Publisher.start() called again after the run started (the first frame starts it): "
                    "this config is not recorded; fix: call on_run_start(config) before the first step",
                    stacklevel=2,
                )
            return self.run
        run = RunInfo(
            run_id=self.run_id,
            name=self.run_name,
            config=flatten_config(config or {}),
            keys=self.keys,
            adapters=tuple(a.name for a in self.adapters),
            started=time.time(),
        )
        self.run = run
        if self.publishes_here():
            for sink in self.sinks:
                if not self._call(sink, "start", run):
                    self.unstarted.add(sink.name)  # warned once; its frames stay in the journal
                    continue
                if self.background and sink.name != "journal":
                    self.workers[sink.name] = SinkWorker(sink, self._call, maxsize=self.queue_size)
            atexit.register(self._at_exit)
        return run

    def _at_exit(self) -> None:
        # An uncaught exception leaves sys.last_value (sys.last_exc from 3.12) set by the time
        # interpreter exit runs this: the run failed.
        crashed = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
        self.close(failed=crashed is not None)

    def publish(self, frame: Frame) -> None:
        if not self.publishes_here():
            return
        if self._closed:
            self.after_close += 1
            if self.after_close == 1:
                warnings.warn(
                    f"{frame.phase} step {frame.step} was published after close() and is not recorded "
                    "(counted in Publisher.after_close); fix: publish before closing the run",
                    stacklevel=2,
                )
            return
        if self.run is None:
            self.start()
        if not frame.metrics:
            self.empty_frames += 1
            if self.empty_frames == 1:
                warnings.warn(
                    f"{frame.phase} step {frame.step} has no metrics (no rank added a chunk before "
                    "reduce: an empty window); it is written to the journal only, not to other sinks "
                    "(counted in Publisher.empty_frames)",
                    stacklevel=2,
                )
        shown = display_frame(frame, self.keys)
        for sink in self.sinks:
            if sink.name in self.unstarted:
                continue
            if sink.name == "journal":
                self._call(sink, "write", frame)
                continue
            if not frame.metrics:
                continue
            prepared = self._for(sink, shown)
            worker = self.workers.get(sink.name)
            if worker is None:
                self._call(sink, "write", prepared)
            elif not worker.put(prepared) and worker.dropped == 1:
                warnings.warn(
                    f"sink {sink.name!r} is {worker.maxsize} frames behind; dropping its oldest frames "
                    "(counted in Publisher.dropped). The journal keeps them: `posttrain-metrics export` "
                    "puts them back.",
                    stacklevel=2,
                )

    def close(self, *, failed: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._at_exit)
        if self.run is None or not self.publishes_here():
            return
        started = [s for s in self.sinks if s.name not in self.unstarted]
        for sink in started:  # every background sink drains at once, not one after another
            if sink.name in self.workers:
                self.workers[sink.name].request_close(failed=failed)
        for sink in started:
            worker = self.workers.get(sink.name)
            if worker is None:
                self._call(sink, "close", failed=failed)
            elif not worker.wait(self.close_timeout):
                warnings.warn(
                    f"sink {sink.name!r} did not finish within {self.close_timeout:.0f} s "
                    f"({worker.backlog} frames still queued); the journal has them for "
                    "`posttrain-metrics export`",
                    stacklevel=2,
                )

    @property
    def dropped(self) -> dict[str, int]:
        """Frames each background sink dropped because its queue was full."""
        return {name: w.dropped for name, w in self.workers.items() if w.dropped}

    def __enter__(self) -> Publisher:
        if self.run is None:
            self.start()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.close(failed=exc_type is not None)

    def _for(self, sink: Sink, frame: Frame) -> Frame:
        stores = sink.stores_nonfinite
        metrics: dict[str, Scalar] = {}
        for key, value in frame.metrics.items():
            kind = nonfinite_kind(value)
            if kind is None or kind in stores:
                metrics[key] = value
                continue
            counter = (sink.name, key)
            if counter not in self._nonfinite:
                warnings.warn(
                    f"{sink.name}: {key} = {value} cannot be stored faithfully by this backend; "
                    f"skipped and counted under health/nonfinite/{key} (the journal keeps the value)",
                    stacklevel=3,
                )
            self._nonfinite[counter] = self._nonfinite.get(counter, 0) + 1
            metrics[f"health/nonfinite/{key}"] = self._nonfinite[counter]
        return Frame(frame.step, metrics, frame.phase, frame.wall_time)

    def _call(self, sink: Sink, method: str, *args: Any, **kwargs: Any) -> bool:
        try:
            getattr(sink, method)(*args, **kwargs)
            return True
        except ImportError:
            if method == "start":
                raise  # a requested backend that is not installed is an error, never a silent degrade
            return self._failed(sink, method, sys.exc_info()[1])
        except Exception as exc:  # a tracker's failure never stops training
            return self._failed(sink, method, exc)

    def _failed(self, sink: Sink, method: str, exc: BaseException | None) -> bool:
        n = self.failures.get(sink.name, 0)
        self.failures[sink.name] = n + 1
        if n == 0:
            where = (
                "the journal itself failed: fix its path or disk, or every frame is lost"
                if sink.name == "journal"
                else "the journal keeps every frame for `posttrain-metrics export`"
            )
            warnings.warn(
                f"sink {sink.name!r} failed in {method}() and is degraded: {type(exc).__name__}: "
                f"{redact_text(str(exc))}. "
                f"Training continues; {where}.",
                stacklevel=4,
            )
        return False
