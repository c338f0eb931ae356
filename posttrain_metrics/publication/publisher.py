"""The one place that publishes: global rank 0 only, the journal first, then every other sink.

The publisher normalises a frame once for the sinks: categorical keys gain one 0/1 indicator series
per label (``optim/update_outcome/skipped``) so that outcomes chart in every tracker, bools become
0/1, and non-finite values a backend cannot store faithfully are removed for that backend and
counted under ``health/nonfinite/<key>``, logged once per key. The journal gets the frame
exactly as reduced. A sink that raises is logged once and never stops training or the others
(:mod:`.dispatch`; operational messages go to the ``posttrain_metrics`` logger, warnings are for misuse).

A frame with no metrics (``reduce`` with no ``add`` on any rank: an empty window) is written to the
journal only, so the record shows the step ran with no data; no other sink receives it (there is
nothing to chart, and a tracker row without values is noise), it is counted in ``empty_frames`` and
warned about once.

Where the trackers are written (``mode``):

- ``"process"`` (the default): the training thread writes the journal line and the console line,
  nothing else. A publisher process (``posttrain-metrics publish --follow <journal>``, started at
  ``start`` and restarted if it dies) tails the journal and feeds W&B, MLflow and TensorBoard with
  the code of ``posttrain-metrics export`` (:mod:`~posttrain_metrics.publication.follower`). The
  journal is the queue: a slow or dead tracker only delays its replica, nothing is dropped. Sinks
  given as objects that cannot describe themselves as a config (your own) are fed the same way by a
  thread of this process.
- ``"thread"``: the same follower on a thread of this process, for environments that forbid child
  processes. The trackers' Python work then shares the training process's GIL.
- ``"inline"``: every sink written on the calling thread.

Without a journal sink there is no queue: every sink is written inline.
``close`` writes the journal's end record and waits (``close_timeout``) for the followers to catch up
and close the trackers; what is left is reported with the command that finishes it.
"""

from __future__ import annotations

import atexit
import contextlib
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core.distributed import global_rank
from ..core.errors import MetricsError, user_stacklevel
from ..core.frame import Frame
from ..core.keys import describe
from ..core.log import get_logger
from ..core.redact import redact_text
from ..core.reducer import AdapterSpec, resolve_adapters
from ..core.warn import warn
from ..integrations.base import RunInfo, Sink, as_sink
from ..journal import JournalSink, adapter_declarations, journal_closed
from .dispatch import SinkSet, checked_run_id, run_info
from .dispatch import run_name as run_name_of
from .display import display_frame, nonfinite_kind
from .status import read_status

__all__ = ["MODES", "Publisher", "display_frame", "end_reason", "nonfinite_kind"]

log = get_logger("publication")

MODES = ("process", "thread", "inline")



def _close_before_threads_stop(pub: Publisher) -> None:
    """Close a run left open at the interpreter's exit before ``atexit`` would, at the first step of the
    exit (threading's own exit hooks), once the program's other threads are done. The trackers of the
    ``inline`` and ``thread`` modes run in this process, with threads and executors of their own: by the
    time ``atexit`` runs, these are shut down (``cannot schedule new futures after shutdown``, ``can't
    register atexit after shutdown``), so a run closed by ``atexit`` (an uncaught exception, Ctrl-C, no
    ``with``) left its MLflow run RUNNING and reached no tracker that had not started yet.
    ``concurrent.futures.thread`` is imported now (it cannot be imported then; its own exit hook, which
    stops the executors, must be registered before ours so that it runs after)."""
    import concurrent.futures.thread as futures_thread
    import weakref

    register = getattr(threading, "_register_atexit", None)
    if register is None:  # pragma: no cover - CPython has it from 3.9
        return
    ref = weakref.ref(pub)

    def close() -> None:
        live = ref()
        if live is None or live._closed:
            return
        # As atexit would: after the program's own threads (a training thread the main one started), not
        # the executors' workers, which wait for the exit hook that stops them.
        while True:  # executors' threads (thread and process pools) end in their own exit hooks, after ours
            workers = set(getattr(futures_thread, "_threads_queues", {}))
            pools = sys.modules.get("concurrent.futures.process")
            workers.update(getattr(pools, "_threads_wakeups", {}) if pools is not None else {})
            others = [t for t in threading.enumerate() if not t.daemon and t is not threading.current_thread()
                      and t is not threading.main_thread() and t not in workers]
            if not others:
                break
            others[0].join()
        live._at_exit()

    with contextlib.suppress(RuntimeError):  # already shutting down: atexit closes it
        register(close)


def end_reason(error: BaseException) -> str:
    """Why a run ended, from the exception that ended it: its type and message, redacted (a message
    may quote a config value), at most 1,000 characters: ``KeyboardInterrupt``, ``RuntimeError: CUDA
    out of memory``."""
    message = str(error).strip()
    text = f"{type(error).__name__}: {message}" if message else type(error).__name__
    return redact_text(text)[:1000]


class Publisher:
    """Hands frames to sinks on global rank 0; on other ranks every call is a cheap no-op.

    Sink constructors do no I/O, so building the same publisher on every rank is harmless: only
    rank 0 starts runs. Use it as a context manager, or call ``start``/``close``; ``close`` is
    idempotent and also runs at interpreter exit. See the module docstring for ``mode``.
    """

    def __init__(
        self,
        sinks: Sequence[Sink],
        *,
        adapters: AdapterSpec,
        run_name: str | None = None,
        run_id: str | None = None,
        mode: str = "process",
        close_timeout: float = 300.0,
    ) -> None:
        self.sinks = sorted(map(as_sink, sinks), key=lambda s: s.name != "journal")  # the journal first
        names = [s.name for s in self.sinks]
        if len(set(names)) != len(names):
            twice = sorted({n for n in names if names.count(n) > 1})
            raise MetricsError(
                f"two sinks are named {twice}: sinks are told apart by name; fix: give one of them another "
                "name (set its `name` attribute) or publish to one backend per kind"
            )
        if mode not in MODES:
            raise MetricsError(f"Publisher mode={mode!r}; fix: use one of {list(MODES)}")
        if not (isinstance(close_timeout, (int, float)) and close_timeout >= 0):
            raise MetricsError(f"Publisher close_timeout={close_timeout!r}; fix: a number of seconds >= 0")
        self.close_timeout = float(close_timeout)
        self.adapters = resolve_adapters(adapters)
        self.keys = describe(self.adapters)
        # What the journal header declares; refused here, on every rank, if a reader could not rebuild it.
        self.declarations = adapter_declarations(self.adapters)
        self.run_id = checked_run_id(run_id)
        self.run_name = run_name_of(run_name)
        self.run: RunInfo | None = None
        self.empty_frames = 0  # frames with no metrics: journal only (see the module docstring)
        self._closed = False
        self._earlier_error: object = None  # sys.last_value when the run started (see _at_exit)
        self.after_close = 0  # frames published after close(): warned once, not recorded

        # Which sink is written where.
        journal = next((s for s in self.sinks if s.name == "journal"), None)
        self.journal_path: Path | None = journal.path if isinstance(journal, JournalSink) else None
        if mode != "inline" and self.journal_path is None:
            mode = "inline"  # no journal, no queue
        self.mode = mode
        self.inline: list[Sink] = []
        self.in_process: list[Sink] = []  # fed by the follower thread
        self.in_child: list[Sink] = []  # fed by the publisher process
        for sink in self.sinks:
            if mode == "inline" or sink.inline:
                self.inline.append(sink)
            elif mode == "process" and sink.to_config() is not None:
                self.in_child.append(sink)
            else:
                self.in_process.append(sink)
        self.dispatch = SinkSet(self.inline, self.keys)  # the sinks written here, and the failure policy
        self.process: Any = None  # a PublisherProcess once started
        self._thread: threading.Thread | None = None
        self._thread_result: dict[str, Any] = {}
        self._stop = threading.Event()

    @property
    def vendor_log(self) -> Path | None:
        """The file the publisher process's trackers write their own output to (banners, INFO logs),
        when there is one (``mode="process"`` with tracker sinks)."""
        if not self.in_child or self.journal_path is None:
            return None
        from .process import log_path

        return log_path(self.journal_path)

    # Side effects happen on global rank 0 only; the rank is read at call time.
    @staticmethod
    def publishes_here() -> bool:
        return global_rank() == 0

    def start(self, config: Mapping[str, Any] | None = None, *, started: float | None = None) -> RunInfo:
        """Start every sink (rank 0) with the flattened, redacted config. Idempotent: a second call
        returns the running run (a config that arrives after the first frame is not recorded)."""
        if self.run is not None:
            if config:
                warn(
                    "Publisher.start() called again after the run started (the first frame starts it): "
                    "this config is not recorded; fix: call on_run_start(config) before the first step",
                    stacklevel=user_stacklevel(),
                )
            return self.run
        run = run_info(run_id=self.run_id, name=self.run_name, adapters=self.adapters, keys=self.keys,
                       config=config, sinks=self.sinks, started=started, declarations=self.declarations)
        self.run = run
        if self.publishes_here():
            try:
                self.dispatch.start(run)
            except MetricsError:  # the journal refused the run (see SinkSet.call): nothing to close
                self.run = None
                raise
            if self.journal_path is not None and "journal" not in self.unstarted:
                self._start_followers()
            # An error already recorded as the last one (an interactive session's earlier error) did not end this run
            self._earlier_error = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
            atexit.register(self._at_exit)
            _close_before_threads_stop(self)
        return run

    def _start_followers(self) -> None:
        assert self.journal_path is not None
        if self.in_child:
            from .process import PublisherProcess

            configs = []
            for sink in self.in_child:
                config = sink.to_config() or {}
                if sink.name != type(sink).name:  # two sinks of one kind, told apart by name
                    config["name"] = sink.name
                configs.append(config)
            self.process = PublisherProcess(self.journal_path, configs, lock=self._run_lock())
            self.process.start()
        if self.in_process:
            from .follower import follow

            lock = self._run_lock()  # the follower thread holds the run (see RunLock) until it is done tailing
            held = lock.shared() if lock is not None else None

            path, sinks, adapters = self.journal_path, list(self.in_process), list(self.adapters)
            report = not self.in_child  # the process reports when there is one

            def run() -> None:
                try:
                    self._thread_result.update(follow(path, sinks, stop=self._stop, report=report,
                                                      adapters=adapters))
                except Exception as exc:  # a follower bug never stops training: the journal has all
                    log.warning(f"the in-process publisher stopped: {type(exc).__name__}: {exc}; the journal "
                                f"keeps every frame: `posttrain-metrics export {path} --to ...`")
                finally:
                    if held is not None:
                        held.release()

            self._thread = threading.Thread(target=run, name="posttrain-metrics-publisher", daemon=True)
            self._thread.start()

    def _run_lock(self) -> Any:
        """The journal's run lock (:class:`~posttrain_metrics.journal.RunLock`), when it holds one."""
        journal = next((s for s in self.inline if s.name == "journal"), None)
        return journal.lock if isinstance(journal, JournalSink) else None

    def _at_exit(self) -> None:
        # An uncaught exception leaves sys.last_value (sys.last_exc from 3.12) set by the time
        # interpreter exit runs this: the run failed, or was interrupted (Ctrl-C), and that says why.
        crashed = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
        if crashed is self._earlier_error:
            crashed = None
        self.close(error=crashed if isinstance(crashed, BaseException) else None)

    def publish(self, frame: Frame) -> None:
        if not self.publishes_here():
            return
        if self._closed:
            self.after_close += 1
            if self.after_close == 1:
                warn(
                    f"{frame.phase} step {frame.step} was published after close() and is not recorded "
                    "(counted in Publisher.after_close); fix: publish before closing the run",
                    stacklevel=user_stacklevel(),
                )
            return
        if self.run is None:
            self.start()
        if not frame.metrics:
            self.empty_frames += 1
            if self.empty_frames == 1:
                warn(
                    f"{frame.phase} step {frame.step} has no metrics (no rank added a chunk before "
                    "reduce: an empty window); it is written to the journal only, not to other sinks "
                    "(counted in Publisher.empty_frames)",
                    stacklevel=user_stacklevel(),
                )
        self.dispatch.write(frame)
        if self.process is not None:
            self.process.check()  # a syscall at most once a second: restarts a dead publisher

    def close(self, *, failed: bool = False, status: str | None = None, error: BaseException | None = None,
              reason: str | None = None) -> None:
        """Close the run: ``status`` ``"finished"``, ``"failed"`` (also ``failed=True``),
        ``"interrupted"`` or ``"killed"`` (a run that never closed, replayed). ``error`` is the
        exception that ended the run: a ``KeyboardInterrupt`` (Ctrl-C) makes the run interrupted, any
        other failed, and its type and message, redacted, are the run's ``reason`` (the journal's end
        record; every tracker shows it). Inline sinks are closed at once; the followers are waited for
        up to ``close_timeout`` seconds."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._at_exit)
        if isinstance(error, SystemExit) and error.code in (None, 0):
            error, failed = None, False  # sys.exit(0) in the run's block: a run that finished
        if error is not None:
            status = status or ("interrupted" if isinstance(error, KeyboardInterrupt) else "failed")
            reason = reason or end_reason(error)
        status = status or ("failed" if failed else "finished")
        if self.run is None or not self.publishes_here():
            return
        self.dispatch.close(status, reason or "")  # the journal's end record first: the followers close on it
        deadline = time.monotonic() + self.close_timeout
        if self.journal_path is not None and (self.process or self._thread) and not journal_closed(self.journal_path):
            # No end record (the disk is full: the journal warned, naming what is missing): a follower
            # would wait for one in vain. It closes the trackers as killed once this process is gone.
            self._stop.set()
            self.process = None
        if self._thread is not None:
            self._thread.join(self.close_timeout)
            if self._thread.is_alive():
                self._stop.set()
                log.warning(
                    f"the in-process publisher did not finish within close_timeout={self.close_timeout:g} s; "
                    f"{self._left()}")
        if self._thread is not None and not self._thread.is_alive():
            self._merge(self._thread_result)
        if self.process is not None:
            if not self.process.wait(max(0.0, deadline - time.monotonic())):
                log.warning(
                    f"the publisher process (pid {self.process.pid}) did not finish within close_timeout="
                    f"{self.close_timeout:g} s; {self._left()}. It goes on in the background and closes the "
                    f"trackers when done; if it is stopped, `{self.process.command()}` finishes it "
                    "(it sends only what the trackers lack)")
            elif self.process.returncode:
                log.warning(f"the publisher process exited with status {self.process.returncode}; "
                            f"{self._left()}; `{self.process.command()}` finishes it")
            else:
                self._merge(self._report())
        self._warn_unstarted()
        self._show_links()

    def _show_links(self) -> None:
        """The closing summary's links (a console sink's ``show_links``): each tracker opened on its
        headline view, from the trackers' names for the run, known once the followers are done."""
        shows = [s for s in self.inline if s.name not in self.unstarted]
        if shows:
            handles = self.run_handles()
            for sink in shows:
                self.dispatch.call(sink, "show_links", handles)

    def _warn_unstarted(self) -> None:
        """The close summary's word on trackers that never started (down from the run's start to its
        end): none of the run is in them, and the command that sends it all."""
        never = sorted(self.unstarted - {"journal"})
        if not never or self.journal_path is None:
            return
        fix = (f"`{self.process.command()}` sends them" if self.process is not None
               else f"`posttrain-metrics export {self.journal_path} --to KIND [TARGET]` replays them into a tracker")
        when = "at its start and at every retry" if self.process is not None or self._thread is not None else (
            "at its start; an inline sink's start is not retried")
        log.warning(f"tracker(s) {never} never started during the run (unreachable {when}); they hold none of its "
                    f"frames, which the journal keeps: {fix}")

    def _merge(self, report: Mapping[str, Any]) -> None:
        """The followers' failures and unstarted sinks, counted here as if written here."""
        for name, n in report.get("failures", {}).items():
            self.failures[name] = self.failures.get(name, 0) + int(n)
        self.unstarted.update(report.get("unstarted", []))

    def _report(self) -> dict[str, Any]:
        return read_status(self.journal_path) if self.journal_path is not None else {}

    def _left(self) -> str:
        """What each follower's tracker still lacks, from the publisher's status report."""

        if self.journal_path is None:
            return ""
        total = self.journal_path.read_bytes().count(b'"kind":"frame"') if self.journal_path.exists() else 0
        sinks = self._report().get("sinks", {})
        left = {s.name: total - int(sinks.get(s.name, {}).get("frames", 0))
                for s in (*self.in_child, *self.in_process)}
        return "frames of the journal not yet published: " + ", ".join(f"{k} {v}" for k, v in left.items())

    def run_handles(self) -> dict[str, dict[str, Any]]:
        """The trackers' own names for this run, per sink, once the publisher has reported them:
        ``{"wandb": {"run_id", "url", "dir"}, "mlflow": {"run_id", "experiment_id", "tracking_uri"},
        "tensorboard": {"log_dir"}}``; inline sinks report theirs directly. The publisher's are read from
        its status file and redacted there (a password in a tracking URI reads ``***REDACTED***``)."""

        out: dict[str, dict[str, Any]] = {}
        for sink in self.inline:
            handles = sink.run_handles() if self.run is not None else {}
            if handles:
                out[sink.name] = dict(handles)
        if self.in_child or self.in_process:
            for name, info in self._report().get("sinks", {}).items():
                if info.get("handles"):
                    out[name] = dict(info["handles"])
        return out

    def __enter__(self) -> Publisher:
        if self.run is None:
            self.start()
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        self.close(failed=exc_type is not None, error=exc)

    @property
    def failures(self) -> dict[str, int]:
        """Failures per sink: of the sinks written here, and the followers' once they reported."""
        return self.dispatch.failures

    @property
    def unstarted(self) -> set[str]:
        """The sinks whose start failed (here, or in a follower that reported)."""
        return self.dispatch.unstarted

    def call(self, sink: Sink, method: str, *args: Any, **kwargs: Any) -> bool:
        """``sink.<method>(...)`` with this publisher's failure policy (logged once, never raised)."""
        return self.dispatch.call(sink, method, *args, **kwargs)
