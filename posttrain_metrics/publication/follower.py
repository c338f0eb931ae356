"""The publisher's loop: tail the journal, feed each tracker what it lacks, close them at the run's end.

Each tracker is fed by a :class:`~.replica.Replica` (one sink, its own offset into the journal, the
code ``posttrain-metrics export`` uses too), so a slow or dead tracker only delays its own replica and
the publisher holds no frames in memory: the journal is the queue, and nothing is ever dropped.

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

import os
import shlex
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..core.log import get_logger
from ..integrations.base import Points, Sink
from ..journal import JournalTail, Record, journal_closed
from .backoff import Backoff
from .replica import MISSING_STEP_RANGES, MISSING_STEPS, MissingSteps, Pending, Replica, held_points
from .status import status_path, write_status

__all__ = ["MISSING_STEPS", "MISSING_STEP_RANGES", "STATUSES", "TRIM_EVERY", "JournalTail", "MissingSteps", "Pending", "Points", "Record", "Replica", "follow", "heap_trimmer",
           "held_points", "status_path", "write_status"]

log = get_logger("publication")

STATUSES = ("finished", "failed", "interrupted", "killed")
"""A run's end status: closed normally, closed because training raised, closed because it was
interrupted (Ctrl-C), never closed (killed)."""


# -- the loop -----------------------------------------------------------------------------------------


def _step(replica: Replica) -> int:
    """One replica's step; a bug or a backend error in it stops that replica only (warned once; the
    others go on, and the journal keeps every frame for `posttrain-metrics export`)."""
    try:
        return replica.step()
    except Exception as exc:
        replica.closed = True
        replica.end = replica.end or "failed"
        replica.failed()
        log.warning(f"{replica.sink.name}: publishing stopped ({type(exc).__name__}: {str(exc)[:300]}); the other "
                    f"trackers go on and the journal keeps every frame for `posttrain-metrics export`")
        return 0


def _attach_record(journal: Path, replicas: Sequence[Replica]) -> None:
    """The run's record, written once, handed to each started sink that takes files (``attach``)."""
    takers = [r for r in replicas if r.dispatch is not None and r.dispatch.run is not None and not r.closed
              and r.sink.takes_files and r.sink.name not in r.dispatch.unstarted]
    if not takers:
        return
    from .artifacts import write_record

    try:
        files = write_record(journal)
    except Exception as exc:  # never in the way of closing the trackers
        log.warning(f"{journal}: the run's record could not be written ({type(exc).__name__}: {exc}); the "
                    "trackers close without it")
        return
    for r in takers:
        assert r.dispatch is not None
        r.dispatch.call(r.sink, "attach", files)


def _given_up(replica: Replica, grace: float) -> None:
    """A replica whose tracker took nothing for ``grace`` seconds at the run's end: counted as a failure
    of its sink (a tracker that never started was counted when its start failed) and warned about,
    with the command that sends the rest."""
    name = replica.sink.name
    if replica.waiting and replica.retry is not None:
        log.warning(f"{name}: never started ({replica.retry.failures} attempts over {replica.retry.waited():.0f} s; "
                    f"its tracker could not be reached), so it was sent no frame of this run. `{finish_command(replica)}` "
                    "sends them all")
        return
    replica.failed()
    log.warning(f"{name}: its tracker took no frame for {grace:g} s after the run ended; the frames of the journal "
                f"from line {replica.tail.line_number + 1} on were not sent to it. `{finish_command(replica)}` "
                "sends what it lacks")


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
        log.warning(f"live health is off: {type(exc).__name__}: {str(exc)[:300]}")
        return None


def _health_step(health: Any, replicas: Sequence[Replica]) -> Any:
    """One round of live health; None once it broke (warned once)."""
    if health is None:
        return None
    try:
        health.pump(replicas)
        return health
    except Exception as exc:
        log.warning(f"live health stopped: {type(exc).__name__}: {str(exc)[:300]}; the run's record at close "
                    "still has the doctor's findings")
        return None


def _health_close(health: Any, replicas: Sequence[Replica]) -> None:
    if health is None:
        return
    try:
        health.close(replicas)
    except Exception as exc:
        log.warning(f"live health could not close: {type(exc).__name__}: {str(exc)[:300]}")


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
            "failures": {r.sink.name: r.failures for r in replicas if r.failures},
            "unstarted": sorted(r.sink.name for r in replicas if r.dispatch and r.dispatch.unstarted),
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
        runs = sum(1 for r in replicas if r.started)
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
        log.warning(f"{journal}: the trainer stopped without closing the run; the trackers hold every frame "
                    f"of the journal and mark the run killed")
    return final
