"""The one path from a journal to the trackers: tail the journal, feed each sink what it lacks.

Live publication and ``posttrain-metrics export`` both go through here. A :class:`Replica` is one
sink fed from the journal: it reads the target back first (what it already holds, see
:mod:`posttrain_metrics.export`), skips those frames, then writes every further frame in journal
order, in batches (one ``flush()`` of the sink per batch: one TensorBoard flush, MLflow requests
merged up to its batch limits). Each replica keeps its own byte offset into the journal, so a slow or
dead tracker only delays its own replica and the publisher holds no frames in memory: the journal is
the queue, and nothing is ever dropped.

:func:`follow` runs the replicas of a run until the journal's end record (the trainer closed the
run), or until the trainer is gone (``parent_pid``): then it drains every complete line and closes
the trackers with status ``killed``. It is what the publisher process runs
(``posttrain-metrics publish``); the in-process mode runs it on a thread.

It wakes rarely, so that the trainer keeps the cores: after a round that caught up it sleeps
``poll`` seconds (0.5) and publishes what accumulated meanwhile as one batch per sink (at 100 steps/s,
one TensorBoard flush and one MLflow transaction per 50 frames: a transaction's commit is most of
its cost); only a backlog (a full batch read) is read again at once. The trackers are at most about
half a second behind the journal. While it sleeps it reads the journal's last line ten times a second,
so that a trainer that closes the run does not wait out the sleep.
Started by a trainer (``parent_pid``), the process runs at ``SCHED_IDLE`` on Linux (it gets a core
only when nothing else wants it; elsewhere it stays at the nice 10 the CLI set). On a machine busy
with other work that starves it, it goes back to normal policy (nice 10) once it has not caught up
with the journal for ``catch_up`` seconds, and idle again once it has; the drain after the trainer
closed the run or is gone, which the trainer may be waiting for, runs at normal policy (see
:func:`~posttrain_metrics.publication.process.yield_cpu`).

A publisher process of its own (``trim_heap``, what ``posttrain-metrics publish`` passes) gives the
C heap's free pages back to the system every :data:`TRIM_EVERY` seconds (glibc's ``malloc_trim``):
working through a backlog in large batches leaves the heap fragmented, and without it the process's
resident set ratchets up by a few MB during a drain, freed but never returned. The in-process mode
does not: trimming locks each arena in turn, which the training thread's allocations would wait for.
"""

from __future__ import annotations

import collections
import json
import os
import shlex
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core.errors import MetricsError
from ..core.frame import Frame
from ..core.keys import KeyInfo
from ..core.redact import redact_tree
from ..core.warn import warn
from ..integrations.base import Points, Sink
from ..journal import JournalTail, Record, RunFile, header_adapters, journal_closed, last_header
from ..journal.samples import SamplesTail, samples_path
from .backoff import Backoff
from .publisher import Publisher, display_frame, nonfinite_kind

__all__ = ["MISSING_STEPS", "MISSING_STEP_RANGES", "STATUSES", "TRIM_EVERY", "JournalTail", "MissingSteps", "Pending", "Points", "Record", "Replica", "follow", "heap_trimmer",
           "status_path", "write_status"]

STATUSES = ("finished", "failed", "interrupted", "killed")
"""A run's end status: closed normally, closed because training raised, closed because it was
interrupted (Ctrl-C), never closed (killed)."""


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
    held: Callable[[str, str, Iterable[str]], Points] | None = getattr(sink, "held_points", None)
    if held is None:
        return collections.Counter()
    try:
        return held(run_id, name, keys)
    except ImportError:
        raise  # a requested backend that is not installed is an error
    except Exception as exc:  # a tracker down at the start: it is sent everything (see below)
        warn(
            f"{sink.name}: could not read back what it already holds of run {run_id} ({type(exc).__name__}: "
            f"{str(exc)[:200]}); every frame of the journal is sent to it (MLflow ignores a point it holds "
            "already; a TensorBoard dir that cannot be read would get duplicates)",
            stacklevel=2,
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
        self.sink = sink
        self.batch = batch
        self.tail = JournalTail(path)
        self.samples = SamplesTail(samples_path(path))  # the completions beside the journal, if any
        self.samples_written = 0
        self.publisher: Publisher | None = None
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
        probe: Callable[[], bool] | None = getattr(self.sink, "ready", None)
        return probe() if probe is not None else True

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
        pub = self.publisher
        if pub is None or pub.run is None or self.sink.name in pub.unstarted:
            return
        if not callable(getattr(self.sink, "write_samples", None)):
            return
        for samples in self.samples.read():
            if samples.run_id and samples.run_id != pub.run_id:
                continue  # left by another run at this path (its journal was set aside, see JournalSink)
            if pub.call(self.sink, "write_samples", samples):
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
                if self.publisher is None:
                    self._prepare(record.header)
                    if not self.lazy:
                        self._start_sink()
            elif record.kind == "end":
                self.end = record.status
                self.end_reason = record.reason

    def _send(self, frame: Frame, *, gap: bool = False) -> None:
        """One frame to the sink, unless the target holds it already; ``gap``: a gap's point, counted
        apart from the journal's frames (``written`` and ``skipped`` count frames only)."""
        if self.publisher is None:
            raise MetricsError(f"{self.path}: a frame before the journal header")
        if not frame.metrics:
            return  # an empty window: the journal's alone (the trainer warned about it)
        if self.pending is None or self.pending(frame):
            if self.publisher.run is None:
                self._start_sink()
            self.publisher.publish(frame)
            if gap:
                self.gaps_written += 1
            else:
                self.written += 1
        elif not gap:
            self.skipped += 1

    def _prepare(self, header: dict[str, Any]) -> None:
        """The run's publisher and what the target already holds (read back before anything is sent)."""
        self.header = header
        run_id = str(header.get("run_id", ""))
        adapters = list(self.adapters) if self.adapters is not None else list(header_adapters(header))
        pub = Publisher([self.sink], adapters=adapters, run_id=run_id,
                        run_name=str(header.get("name") or "") or None, mode="inline")
        self.publisher = pub
        existing = held_points(self.sink, run_id, pub.run_name, self._read_keys())
        self.pending = Pending(existing, pub.keys, self.sink.stores_nonfinite) if existing else None

    def _read_keys(self) -> list[str]:
        """The series whose points say what the target holds: every numeric key, label indicator and
        non-finite counter the run can publish."""
        assert self.publisher is not None
        keys = self.publisher.keys
        numeric = sorted(k for k, info in keys.items() if not info.metric.labels) + sorted(
            f"{k}/{label}" for k, info in keys.items() for label in info.metric.labels)
        return [*numeric, *(f"health/nonfinite/{k}" for k in keys), MISSING_STEPS]

    def _start_sink(self) -> None:
        if self.publisher is not None and self.header is not None:
            created = self.header.get("created")
            started = float(created) if isinstance(created, (int, float)) and created > 0 else None
            # A resumed run appends its own header: the trackers get the config it runs with now.
            latest = last_header(self.path)
            header = latest if latest is not None and latest.get("run_id") == self.header.get("run_id") else self.header
            self.publisher.start(dict(header.get("config", {})), started=started)
            if self.retry is not None and not self.lazy and self.sink.name in self.publisher.unstarted:
                self.waiting = True
                wait = self.retry.failed()
                warn(f"{self.sink.name}: its start is retried in {wait:g} s, then with a doubling delay up "
                     f"to {self.retry.limit:g} s until it starts; it then gets every frame of the journal "
                     "it lacks (the trackers that started go on meanwhile)", stacklevel=2)

    def _restart(self) -> bool:
        """Start the sink again if its retry is due; whether it started. Before starting, what its
        target holds is read back again (a tracker that comes back may hold part of the run)."""
        assert self.retry is not None and self.publisher is not None and self.publisher.run is not None
        if not self.retry.due():
            return False
        run, name = self.publisher.run, self.sink.name
        held: Callable[[str, str, Iterable[str]], Points] | None = getattr(self.sink, "held_points", None)
        try:
            existing = held(run.run_id, run.name, self._read_keys()) if held is not None else None
            self.sink.start(run)
        except ImportError:
            raise  # a requested backend that is not installed is an error
        except Exception:  # still down: warned at the first failure, counted there once
            self.retry.failed()
            return False
        if existing is not None:
            self.pending = Pending(existing, self.publisher.keys, self.sink.stores_nonfinite) if existing else None
        self.waiting = False
        self.publisher.unstarted.discard(name)
        warn(f"{name}: started on attempt {self.retry.failures + 1}, {self.retry.waited():.0f} s after its "
             "first failure; it now gets every frame of the journal it lacks", stacklevel=2)
        self.retry.reset()
        return True

    def flush(self) -> None:
        """End a batch: the sink's ``end_batch`` (one TensorBoard flush, MLflow requests merged)."""
        self._flush()

    def _flush(self) -> None:
        end: Callable[[], None] | None = getattr(self.sink, "end_batch", None)
        if end is not None and self.publisher is not None and self.sink.name not in self.publisher.unstarted:
            self.publisher.call(self.sink, "end_batch")

    def close(self, status: str) -> None:
        if self.closed:
            return
        self.closed = True
        if self.publisher is not None:
            self.feed_samples()
            self.publisher.close(status=status, reason=self.end_reason if status == self.end else None)

    def handles(self) -> dict[str, Any]:
        """The tracker's own names for this run (W&B run id and URL, MLflow run id, log dir), redacted:
        they go to the status file, which other users may read (a tracking URI may hold a password)."""
        get: Callable[[], dict[str, Any]] | None = getattr(self.sink, "run_handles", None)
        return dict(redact_tree(get())) if get is not None and self.publisher is not None else {}


# -- the loop -----------------------------------------------------------------------------------------


def status_path(journal: Path) -> Path:
    """Where the publisher reports its progress and the trackers' run ids: ``<journal>.publisher.json``
    (:class:`~posttrain_metrics.journal.RunFile`)."""
    return RunFile.STATUS.of(journal)


def write_status(path: Path, status: Mapping[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(status, default=str))
    os.replace(tmp, path)


def _step(replica: Replica) -> int:
    """One replica's step; a bug or a backend error in it stops that replica only (warned once; the
    others go on, and the journal keeps every frame for `posttrain-metrics export`)."""
    try:
        return replica.step()
    except Exception as exc:
        replica.closed = True
        replica.end = replica.end or "failed"
        if replica.publisher is not None:
            replica.publisher.failures[replica.sink.name] = replica.publisher.failures.get(replica.sink.name, 0) + 1
        warn(f"{replica.sink.name}: publishing stopped ({type(exc).__name__}: {str(exc)[:300]}); the other "
             f"trackers go on and the journal keeps every frame for `posttrain-metrics export`",
             stacklevel=2)
        return 0


def _attach_record(journal: Path, replicas: Sequence[Replica]) -> None:
    """The run's record, written once, handed to each started sink that takes files (``attach``)."""
    takers = [r for r in replicas if r.publisher is not None and r.publisher.run is not None and not r.closed
              and callable(getattr(r.sink, "attach", None)) and r.sink.name not in r.publisher.unstarted]
    if not takers:
        return
    from .artifacts import write_record

    try:
        files = write_record(journal)
    except Exception as exc:  # never in the way of closing the trackers
        warn(f"{journal}: the run's record could not be written ({type(exc).__name__}: {exc}); the "
             "trackers close without it", stacklevel=2)
        return
    for r in takers:
        assert r.publisher is not None
        r.publisher.call(r.sink, "attach", files)


def _given_up(replica: Replica, grace: float) -> None:
    """A replica whose tracker took nothing for ``grace`` seconds at the run's end: counted as a failure
    of its sink (a tracker that never started was counted when its start failed) and warned about,
    with the command that sends the rest."""
    name = replica.sink.name
    if replica.waiting and replica.retry is not None:
        warn(f"{name}: never started ({replica.retry.failures} attempts over {replica.retry.waited():.0f} s; "
             f"its tracker could not be reached), so it was sent no frame of this run. `{finish_command(replica)}` "
             "sends them all", stacklevel=3)
        return
    if replica.publisher is not None:
        replica.publisher.failures[name] = replica.publisher.failures.get(name, 0) + 1
    warn(f"{name}: its tracker took no frame for {grace:g} s after the run ended; the frames of the journal "
         f"from line {replica.tail.line_number + 1} on were not sent to it. `{finish_command(replica)}` "
         "sends what it lacks", stacklevel=3)


def finish_command(replica: Replica) -> str:
    """The command that sends a replica's tracker what it lacks: ``publish`` where the run wrote its
    sinks file (a publisher process), else (a follower thread: no sinks file) ``export --to`` its kind,
    for the trackers ``export`` knows."""
    from .process import sinks_path

    journal = shlex.quote(str(replica.path))
    kind = type(replica.sink).name
    if sinks_path(replica.path).exists() or kind not in ("tensorboard", "mlflow", "wandb"):
        return f"posttrain-metrics publish {journal}"  # (a sink of yours: neither command knows it)
    return f"posttrain-metrics export {journal} --to {kind} [TARGET]"


def _last_try(stuck: Sequence[Replica]) -> bool:
    """Before the trackers that never started are given up, one more start each, whatever their
    backoff says; whether any started."""
    started = False
    for r in stuck:
        if r.waiting and r.retry is not None:
            r.retry.hurry()
            started = r.ready() or not r.waiting or started
    return started


def _open_health(journal: Path, *, live: bool) -> Any:
    """The run's live health (:mod:`.health`) when its trainer asked for it; a bug there never stops
    publication (warned, then publication goes on without it)."""
    from .health import LiveHealth

    try:
        return LiveHealth.open(journal, live=live)
    except Exception as exc:
        warn(f"live health is off: {type(exc).__name__}: {str(exc)[:300]}", stacklevel=2)
        return None


def _health_step(health: Any, replicas: Sequence[Replica]) -> Any:
    """One round of live health; None once it broke (warned once)."""
    if health is None:
        return None
    try:
        health.pump(replicas)
        return health
    except Exception as exc:
        warn(f"live health stopped: {type(exc).__name__}: {str(exc)[:300]}; the run's record at close still "
             "has the doctor's findings", stacklevel=2)
        return None


def _health_close(health: Any, replicas: Sequence[Replica]) -> None:
    if health is None:
        return
    try:
        health.close(replicas)
    except Exception as exc:
        warn(f"live health could not close: {type(exc).__name__}: {str(exc)[:300]}", stacklevel=2)


def _parent_gone(parent_pid: int | None) -> bool:
    return parent_pid is not None and os.getppid() != parent_pid


CLOSE_CHECK = 0.1
"""How often a sleeping follower looks for the run's end record (the trainer waits for it in ``close()``)."""

TRIM_EVERY = 5.0
"""Seconds between two trims of the publisher process's C heap (see the module docstring)."""


def heap_trimmer() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` (give the heap's free pages back to the system; 1 when some were), or
    None where the C library has none (musl, macOS, Windows)."""
    import ctypes

    try:
        trim = ctypes.CDLL(None).malloc_trim  # the C library the interpreter runs on
    except (OSError, AttributeError, TypeError):  # TypeError: Windows has no CDLL(None)
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim  # type: ignore[no-any-return]


def follow(
    path: str | os.PathLike[str],
    sinks: Sequence[Sink],
    *,
    follow: bool = True,
    parent_pid: int | None = None,
    stop: threading.Event | None = None,
    poll: float = 0.5,
    max_poll: float = 0.5,
    catch_up: float = 30.0,
    batch: int = 512,
    report: bool = True,
    grace: float = 30.0,
    adapters: Sequence[Any] | None = None,
    record: bool = True,
    trim_heap: float | None = None,
    retry: Callable[[], Backoff] = Backoff,
) -> dict[str, Any]:
    """Feed ``sinks`` from the journal at ``path`` until the run ends; returns the final status.

    Before closing them, ``record`` attaches the run's record (the journal, its config, the doctor's
    report, the dashboard) to every sink that takes files (see :mod:`.artifacts`).

    With ``follow`` the journal is tailed until its end record (then every sink is closed with the
    run's status); if the trainer (``parent_pid``) is gone first, every complete line is drained and
    the sinks are closed with status ``killed``. Without ``follow`` what is there is published and the
    sinks are closed with the end record's status, or ``killed`` when there is none (a run that never
    closed). ``stop`` (the in-process mode) ends the loop after a last drain, like a trainer gone.
    Between rounds it sleeps ``poll`` seconds, up to ``max_poll`` while nothing comes; ``catch_up`` is
    how long it may lag at ``SCHED_IDLE`` (see the module docstring); ``grace`` is how long a tracker
    that takes nothing is waited for once the run has ended; ``trim_heap`` (seconds, in a publisher
    process of its own) how often the C heap is trimmed. Progress and the trackers' run ids go to
    :func:`status_path` when ``report``, with the ``state``: ``running``, ``recording`` (every replica
    read the journal to its end; the run's record is being written, then the trackers closed) and
    ``closed``. ``retry`` makes each replica's schedule for starting a tracker that was down
    (:class:`~posttrain_metrics.publication.backoff.Backoff`; a test passes a slower one).
    """
    from .process import yield_cpu

    journal = Path(path)
    replicas = [Replica(journal, sink, batch=batch, adapters=adapters, retry=retry()) for sink in sinks]
    health = _open_health(journal, live=follow) if report else None  # the reporting follower's (one per run)
    if health is not None and follow:
        health.run()  # on a thread of its own: a tracker slow to start never delays a finding
    where = status_path(journal)
    started = time.time()
    last_report = 0.0
    state = "running"

    def snapshot(final: str | None = None) -> dict[str, Any]:
        return {
            "pid": os.getpid(), "state": final or state, "started": started, "time": time.time(),
            "sinks": {r.sink.name: {"frames": r.frames, "written": r.written, "already_held": r.skipped,
                                    "handles": r.handles()} for r in replicas},
            "failures": {r.sink.name: n for r in replicas if r.publisher
                         for n in [r.publisher.failures.get(r.sink.name, 0)] if n},
            "unstarted": sorted(r.sink.name for r in replicas if r.publisher and r.publisher.unstarted),
        }

    # Started by a trainer: the trackers may lag (the journal holds every frame), the step may not.
    lower = idle = parent_pid is not None and yield_cpu(True)
    caught_up = time.monotonic()

    def nap(seconds: float) -> None:
        if stop is not None and not stop.is_set():
            stop.wait(seconds)  # the in-process mode's stop wakes it at once
        else:
            time.sleep(seconds)

    def nap_until_closed(seconds: float) -> None:
        """``nap``, cut short when the trainer closes the run (it waits for us in ``close()``): the
        journal's last line is read every :data:`CLOSE_CHECK` seconds, a 512-byte read."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0 and not (stop is not None and stop.is_set()):
            nap(min(left, CLOSE_CHECK))
            if journal_closed(journal):
                return

    gone_since: float | None = None
    reported_runs = 0
    sleep = poll
    trim = heap_trimmer() if trim_heap is not None else None
    trimmed = time.monotonic()
    while True:
        handled = [_step(r) for r in replicas]
        health = _health_step(health, replicas)
        moved = sum(handled)
        now = time.monotonic()
        if trim is not None and trim_heap is not None and now - trimmed >= trim_heap:
            trim(0)  # the pages a backlog's batches freed, back to the system
            trimmed = now
        if moved:
            gone_since = None  # a tracker that takes frames, however slowly, is waited for
        runs = sum(1 for r in replicas if r.publisher is not None and r.publisher.run is not None)
        if report and (now - last_report > 0.5 or runs != reported_runs):
            last_report, reported_runs = now, runs  # a tracker's run ids are reported as soon as it starts
            write_status(where, snapshot())
        stopping = stop is not None and stop.is_set()
        done = not follow or stopping or _parent_gone(parent_pid)
        closed = journal_closed(journal)
        full = any(n >= batch for n in handled)
        if not full:
            caught_up = now  # every replica read to the journal's end (or waits for its tracker)
        if lower and (done or closed):
            lower = False  # the trainer waits in close() or is gone: the drain takes its share
            if idle:
                yield_cpu(False)
                idle = False
        elif lower and idle == (now - caught_up > catch_up):  # starved by other work: catch up at nice 10
            idle = not idle
            yield_cpu(idle)
        if full:
            continue  # a backlog: the next batch at once
        if moved:
            sleep = poll  # caught up: let the next frames accumulate into one batch
            if not (done or closed):
                nap_until_closed(poll)
                continue
        live = [r for r in replicas if not r.closed]  # a replica that broke is closed already
        ends = {r.end for r in live}
        if not live or (len(ends) == 1 and None not in ends):
            status = (ends.pop() if live else None) or journal_closed(journal) or "finished"
            break
        if moved:
            continue  # closing: read on until every replica has the end record
        if done or closed:
            # Nothing more comes. A sink that is not ready (its tracker down, or a full backlog that
            # does not move) gets ``grace`` seconds without progress, then is closed: what it lacks is
            # warned about and left in the journal for `posttrain-metrics publish`.
            gone_since = gone_since or now
            stuck = [r for r in live if r.end is None and not r.ready()]
            if stuck and now - gone_since > grace and _last_try(stuck):
                gone_since = None  # a tracker that was down started at its last try: it is waited for
                continue
            if (done and not stuck) or (stuck and now - gone_since > grace):
                status = closed or next((e for e in ends if e), None) or "killed"
                for r in stuck:
                    _given_up(r, grace)
                break
            nap(min(poll, 0.05))  # the trainer may be waiting in close()
            continue
        nap_until_closed(sleep)
        sleep = min(max_poll, sleep * 2)  # nothing new: wake less often (with a poll below max_poll)
    _health_close(health, replicas)
    if record:
        state = "recording"  # every replica read the journal to its end: the run's record, then the close
        if report:
            write_status(where, snapshot())
        _attach_record(journal, replicas)
    for r in replicas:
        r.close(r.end or status)
    state = "closed"
    final = snapshot("closed")
    final["status"] = status
    if health is not None:
        final["health"] = health.summary()  # the findings published and the stop decision, if any
    if report:
        write_status(where, final)
    if status == "killed":
        warn(f"{journal}: the trainer stopped without closing the run; the trackers hold every frame "
             f"of the journal and mark the run killed", stacklevel=2)
    return final
