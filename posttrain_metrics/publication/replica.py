"""One sink fed from the journal: a :class:`Replica` reads its target back, then sends what it lacks.

A replica reads what its tracker already holds of the run first (:meth:`Sink.held_points
<posttrain_metrics.integrations.base.Sink.held_points>`), skips those frames (:class:`Pending`), then
writes every further frame in journal order, in batches (one ``end_batch()`` of the sink per batch: one
TensorBoard flush, MLflow requests merged up to its batch limits). It keeps its own byte offset into
the journal, so a slow or dead tracker only delays its own replica and nothing is held in memory: the
journal is the queue. Its sink is written through a :class:`~.dispatch.SinkSet` of one, under the
same policy as the trainer's sinks. Live publication (:func:`~.follower.follow`) and ``posttrain-metrics
export`` both use it.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core.errors import MetricsError
from ..core.frame import Frame
from ..core.keys import KeyInfo, describe
from ..core.log import get_logger
from ..core.redact import redact_tree
from ..core.reducer import resolve_adapters
from ..integrations.base import Points, Sink, as_sink
from ..journal import JournalTail, Record, header_adapters, last_header
from ..journal.samples import SamplesTail, samples_path
from .backoff import Backoff
from .dispatch import SinkSet, checked_run_id, run_info, run_name
from .display import display_frame, nonfinite_kind

__all__ = ["GAP_PHASE", "MISSING_STEPS", "MISSING_STEP_RANGES", "MissingSteps", "Pending", "Replica", "held_points"]

log = get_logger("publication")


# -- what a target already holds --------------------------------------------------------------------


def _probe(frame: Frame, stores: frozenset[str]) -> str | None:
    """The key whose presence at the frame's step says the frame was written (every sink writes a
    frame whole): its first number the target stores, label indicators included."""
    for key in sorted(frame.metrics):
        value = frame.metrics[key]
        if isinstance(value, str):
            continue
        kind = nonfinite_kind(float(value))
        if kind is None or kind in stores:
            return key
    return None


class Pending:
    """Decides, frame by frame in journal order, whether a target lacks a frame: its probe point
    (see :func:`_probe`) is held fewer times than the journal has had it so far (repeated steps of
    a resumed run count once per occurrence). A frame with no metrics (an empty window) never is:
    the publisher sends it to no tracker."""

    def __init__(self, existing: Points, keys: Mapping[str, KeyInfo], stores: frozenset[str]) -> None:
        self.existing = existing
        self.keys = keys
        self.stores = stores
        self.seen: Points = collections.Counter()

    def __call__(self, frame: Frame) -> bool:
        if not frame.metrics:
            return False
        if not self.existing:
            return True
        key = _probe(display_frame(frame, self.keys), self.stores)
        if key is None:
            return True
        self.seen[(key, frame.step)] += 1
        return self.seen[(key, frame.step)] > self.existing[(key, frame.step)]


def held_points(sink: Sink, run_id: str, name: str, keys: Iterable[str]) -> Points:
    """What ``sink``'s target already holds of run ``run_id`` (before ``start``); empty for a sink
    that cannot be read back (every frame is then sent)."""
    try:
        return sink.held_points(run_id, name, keys)
    except ImportError:
        raise  # a requested backend that is not installed is an error
    except Exception as exc:  # a tracker down at the start: it is sent everything (see below)
        log.warning(
            f"{sink.name}: could not read back what it already holds of run {run_id} ({type(exc).__name__}: "
            f"{str(exc)[:200]}); every frame of the journal is sent to it (MLflow ignores a point it holds "
            "already; a TensorBoard dir that cannot be read would get duplicates)",
        )
        return collections.Counter()


# -- a gap in the journal, as the trackers show it ---------------------------------------------------

MISSING_STEPS = "health/missing_steps"
"""How many frames the journal misses so far (its gap records), at each gap's last step."""
MISSING_STEP_RANGES = "health/missing_step_ranges"
"""Which steps they are (``41-229, 300-310``): a text/tag beside :data:`MISSING_STEPS`."""
GAP_PHASE = "health"
"""The phase of a gap's frame: not a training phase, so that a tracker that empties a label absent from
a later frame of the same phase (MLflow, W&B) keeps this one."""


class MissingSteps:
    """The gap records of a journal read so far, turned into the frame every tracker gets for each:
    the count of frames missing and their step ranges, at the gap's last step."""

    def __init__(self) -> None:
        self.frames = 0
        self.ranges: list[str] = []

    def frame(self, gap: Mapping[str, Any]) -> Frame:
        first, last = int(gap["first_step"]), int(gap["last_step"])
        self.frames += int(gap["frames"])
        self.ranges.append(str(first) if first == last else f"{first}-{last}")
        shown = ", ".join(self.ranges)
        if len(shown) > 500:  # a tag's worth: the latest ranges
            shown = "... " + shown[-496:].split(", ", 1)[-1]
        wall = gap.get("time")
        return Frame(last, {MISSING_STEPS: self.frames, MISSING_STEP_RANGES: shown}, GAP_PHASE,
                     float(wall) if isinstance(wall, (int, float)) else 0.0)


# -- one sink fed from the journal --------------------------------------------------------------------


class Replica:
    """One sink fed from the journal at ``path``, from its own offset, in batches.

    With ``retry`` (what :func:`follow` passes), a sink whose ``start`` fails (its tracker is down when
    the run starts) is started again on that schedule (1, 2, 4 ... up to 60 s apart) and takes nothing
    meanwhile: the records read after its header wait in ``parked`` (at most one batch) and
    ``ready()`` is false, so the journal holds the rest. Once it starts, it reads back what its target
    holds and gets every frame it lacks. Without ``retry`` (``export``), such a sink is skipped."""

    def __init__(self, path: Path, sink: Sink, *, batch: int = 512, lazy: bool = False,
                 adapters: Sequence[Any] | None = None, retry: Backoff | None = None) -> None:
        self.path = path
        self.adapters = adapters  # the run's adapter objects (in process); else by name from the header
        self.lazy = lazy  # start the sink at the first frame it lacks, not at the header
        self.sink = as_sink(sink)
        self.batch = batch
        self.tail = JournalTail(path)
        self.samples = SamplesTail(samples_path(path))  # the completions beside the journal, if any
        self.samples_written = 0
        self.dispatch: SinkSet | None = None  # the sink under the publication policy, from the header on
        self.run_id = ""
        self.run_name = ""
        self.run_adapters: Sequence[Any] = ()
        self.pending: Pending | None = None
        self.header: dict[str, Any] | None = None
        self.written = 0  # frames this replica sent
        self.skipped = 0  # frames the target already held
        self.gaps_written = 0  # gap points (health/missing_steps) sent: not frames of the journal
        self.frames = 0  # journal frames processed (sent, held already, or empty)
        self.end: str | None = None  # the status of the last end record read, None while the run goes on
        self.closed = False
        self.gaps = MissingSteps()  # the journal's gaps so far, as the trackers show them
        self.end_reason = ""  # the end record's reason (why the run failed or was interrupted)
        self.retry = retry
        self.waiting = False  # its start failed: retried on ``retry``'s schedule, nothing fed meanwhile
        self.parked: collections.deque[Record] = collections.deque()  # read while waiting, fed once started

    def ready(self) -> bool:
        """Whether the sink takes more frames now: not while its start waits for a retry (one is made
        here when due), nor while an MLflow sink holds a full backlog."""
        if self.waiting and not self._restart():
            return False
        return self.sink.ready()

    def step(self) -> int:
        """Read and publish what has accumulated (at most ``batch`` lines); the records handled."""
        if self.closed or not self.ready():
            self._flush()
            return 0
        records = list(self.parked) or self.tail.read(self.batch)
        self.parked.clear()
        self.feed(records)
        self.feed_samples()
        self._flush()
        return len(records)

    def feed_samples(self) -> None:
        """Publish the sample completions appended beside the journal since the last call, to a sink
        that takes them (``write_samples``) once it has started. A restarted publisher sends them again
        (MLflow overwrites its per-step file; W&B and TensorBoard then show a step's table twice)."""
        sinks = self.dispatch
        if sinks is None or sinks.run is None or self.sink.name in sinks.unstarted:
            return
        if not self.sink.takes_samples:
            return
        for samples in self.samples.read():
            if samples.run_id and samples.run_id != self.run_id:
                continue  # left by another run at this path (its journal was set aside, see JournalSink)
            if sinks.call(self.sink, "write_samples", samples):
                self.samples_written += 1

    def feed(self, records: Iterable[Record]) -> None:
        """Publish ``records`` in order (what :meth:`step` read, or a journal already in memory); once
        the sink's start fails and waits for a retry, the rest are parked for after it."""
        it = iter(records)
        for record in it:
            if self.waiting:
                self.parked.append(record)
                self.parked.extend(it)
                return
            if record.kind == "frame" and record.frame is not None:
                self.frames += 1
                self.end = None
                self._send(record.frame)
            elif record.kind == "gap" and record.gap is not None:
                self._send(self.gaps.frame(record.gap), gap=True)
            elif record.kind == "header" and record.header is not None:
                self.end = None
                if self.dispatch is None:
                    self._prepare(record.header)
                    if not self.lazy:
                        self._start_sink()
            elif record.kind == "end":
                self.end = record.status
                self.end_reason = record.reason

    def _send(self, frame: Frame, *, gap: bool = False) -> None:
        """One frame to the sink, unless the target holds it already; ``gap``: a gap's point, counted
        apart from the journal's frames (``written`` and ``skipped`` count frames only)."""
        if self.dispatch is None:
            raise MetricsError(f"{self.path}: a frame before the journal header")
        if not frame.metrics:
            return  # an empty window: the journal's alone (the trainer warned about it)
        if self.pending is None or self.pending(frame):
            if self.dispatch.run is None:
                self._start_sink()
            self.dispatch.write(frame)
            if gap:
                self.gaps_written += 1
            else:
                self.written += 1
        elif not gap:
            self.skipped += 1

    def _prepare(self, header: dict[str, Any]) -> None:
        """The run's sink set and what the target already holds (read back before anything is sent)."""
        self.header = header
        self.run_id = checked_run_id(str(header.get("run_id", "")))
        self.run_name = run_name(str(header.get("name") or "") or None)
        self.run_adapters = resolve_adapters(list(self.adapters) if self.adapters is not None
                                             else list(header_adapters(header)))
        self.dispatch = SinkSet([self.sink], describe(self.run_adapters))
        existing = held_points(self.sink, self.run_id, self.run_name, self._read_keys())
        self.pending = Pending(existing, self.dispatch.keys, self.sink.stores_nonfinite) if existing else None

    def _read_keys(self) -> list[str]:
        """The series whose points say what the target holds: every numeric key, label indicator and
        non-finite counter the run can publish."""
        assert self.dispatch is not None
        keys = self.dispatch.keys
        numeric = sorted(k for k, info in keys.items() if not info.metric.labels) + sorted(
            f"{k}/{label}" for k, info in keys.items() for label in info.metric.labels)
        return [*numeric, *(f"health/nonfinite/{k}" for k in keys), MISSING_STEPS]

    def _start_sink(self) -> None:
        if self.dispatch is not None and self.header is not None:
            created = self.header.get("created")
            started = float(created) if isinstance(created, (int, float)) and created > 0 else None
            # A resumed run appends its own header: the trackers get the config it runs with now.
            latest = last_header(self.path)
            header = latest if latest is not None and latest.get("run_id") == self.header.get("run_id") else self.header
            self.dispatch.start(run_info(run_id=self.run_id, name=self.run_name, adapters=self.run_adapters,
                                         keys=self.dispatch.keys, config=dict(header.get("config", {})),
                                         sinks=[self.sink], started=started,
                                         declarations=dict(header.get("declarations") or {})))
            if self.retry is not None and not self.lazy and self.sink.name in self.dispatch.unstarted:
                self.waiting = True
                wait = self.retry.failed()
                log.warning(f"{self.sink.name}: its start is retried in {wait:g} s, then with a doubling delay up "
                            f"to {self.retry.limit:g} s until it starts; it then gets every frame of the journal "
                            "it lacks (the trackers that started go on meanwhile)")

    def _restart(self) -> bool:
        """Start the sink again if its retry is due; whether it started. Before starting, what its
        target holds is read back again (a tracker that comes back may hold part of the run)."""
        assert self.retry is not None and self.dispatch is not None and self.dispatch.run is not None
        if not self.retry.due():
            return False
        run, name = self.dispatch.run, self.sink.name
        try:
            existing = self.sink.held_points(run.run_id, run.name, self._read_keys())
            self.sink.start(run)
        except ImportError:
            raise  # a requested backend that is not installed is an error
        except Exception:  # still down: warned at the first failure, counted there once
            self.retry.failed()
            return False
        self.pending = Pending(existing, self.dispatch.keys, self.sink.stores_nonfinite) if existing else None
        self.waiting = False
        self.dispatch.unstarted.discard(name)
        log.info(f"{name}: started on attempt {self.retry.failures + 1}, {self.retry.waited():.0f} s after its "
                 "first failure; it now gets every frame of the journal it lacks")
        self.retry.reset()
        return True

    def flush(self) -> None:
        """End a batch: the sink's ``end_batch`` (one TensorBoard flush, MLflow requests merged)."""
        self._flush()

    def _flush(self) -> None:
        if self.dispatch is not None and self.sink.name not in self.dispatch.unstarted:
            self.dispatch.call(self.sink, "end_batch")

    def close(self, status: str) -> None:
        if self.closed:
            return
        self.closed = True
        if self.dispatch is not None:
            self.feed_samples()
            if self.dispatch.run is not None:
                self.dispatch.close(status, self.end_reason if status == self.end else "")

    def handles(self) -> dict[str, Any]:
        """The tracker's own names for this run (W&B run id and URL, MLflow run id, log dir), redacted:
        they go to the status file, which other users may read (a tracking URI may hold a password)."""
        return dict(redact_tree(self.sink.run_handles())) if self.dispatch is not None else {}

    @property
    def started(self) -> bool:
        """Whether the sink was started for the run (a target that lacked nothing never is)."""
        return self.dispatch is not None and self.dispatch.run is not None

    @property
    def failures(self) -> int:
        """How often the sink failed (a start, a write, a close...)."""
        return self.dispatch.failures.get(self.sink.name, 0) if self.dispatch is not None else 0

    def failed(self) -> None:
        """Count one more failure of the sink (its replica broke, or it took nothing at the run's end)."""
        if self.dispatch is not None:
            self.dispatch.failures[self.sink.name] = self.failures + 1
