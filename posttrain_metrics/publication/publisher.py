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
- ``"inline"``: every sink written on the calling thread (what ``export`` and the follower use).

Without a journal sink there is no queue: every sink is written inline.
``close`` writes the journal's end record and waits (``close_timeout``) for the followers to catch up
and close the trackers; what is left is reported with the command that finishes it.
"""

from __future__ import annotations

import atexit
import contextlib
import inspect
import json
import math
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core.distributed import global_rank
from ..core.errors import MetricsError, user_stacklevel
from ..core.extra import UserKeys, declarations
from ..core.frame import Frame
from ..core.keys import KeyInfo, describe, label_key
from ..core.redact import config_tree, flatten_config, redact_text
from ..core.reducer import AdapterSpec, resolve_adapters
from ..core.values import Scalar
from ..core.warn import warn
from ..integrations.base import RunInfo, Sink, tracker_settings
from ..journal import MAX_HEADER_DEPTH, SAFE_RUN_ID, journal_closed, nesting

__all__ = ["MODES", "Publisher", "display_frame", "end_reason", "nonfinite_kind"]

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


def nonfinite_kind(value: Scalar) -> str | None:
    """``"nan"``, ``"inf"`` or ``None`` for a finite value or a label."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else "inf"
    return None


def display_frame(frame: Frame, keys: Mapping[str, KeyInfo]) -> Frame:
    """The frame as trackers show it: label indicators added, bools as 0/1; nothing removed.

    Each label of a categorical key gets its 0/1 indicator right after the key (a value that is none
    of its labels: all 0), in the order the labels are declared. A frame's shape (its keys and the
    types of its values, the same step after step) is worked out once per ``keys`` mapping."""
    m = frame.metrics
    names = tuple(m)
    types = tuple(map(type, m.values()))
    shapes = _shapes(keys)
    shape = shapes.get(names)
    if shape is None or shape.types != types:
        shape = _Shape(names, types, keys)
        if len(shapes) < _MAX_SHAPES:  # frames of ever new key sets are worked out each time
            shapes[names] = shape
    return Frame(frame.step, shape.build(m), frame.phase, frame.wall_time)


class _Shape:
    """How frames with one set of keys and value types display: a template of the output keys in
    order (each label indicator right after its key), the keys of bools, the indicators per
    categorical key."""

    __slots__ = ("bools", "fallback", "labels", "template", "types")

    def __init__(self, names: tuple[str, ...], types: tuple[type, ...], keys: Mapping[str, KeyInfo]) -> None:
        self.types = types
        out: list[str] = []
        self.bools = [key for key, t in zip(names, types) if issubclass(t, bool)]
        self.labels: list[tuple[str, tuple[tuple[str, str], ...]]] = []
        for key, t in zip(names, types):
            out.append(key)
            info = keys.get(key)
            if issubclass(t, str) and info is not None and info.metric.labels:
                indicators = tuple((label_key(key, label), label) for label in info.metric.labels)
                self.labels.append((key, indicators))
                out.extend(name for name, _ in indicators)
        self.template: dict[str, Scalar | None] = dict.fromkeys(out)
        # A frame key named like an indicator (a user's "optim/update_outcome/skipped"): whichever of
        # the two comes later in the frame wins, value by value, as a dict built in order gives.
        self.fallback = keys if len(self.template) < len(out) else None

    def build(self, m: Mapping[str, Scalar]) -> dict[str, Scalar]:
        if self.fallback is not None:
            return _displayed(m, self.fallback)
        out = self.template.copy()  # the keys in order
        out.update(m)
        for key in self.bools:
            out[key] = int(m[key])
        for key, indicators in self.labels:
            value = m[key]
            for name, label in indicators:
                out[name] = int(value == label)
        return out  # type: ignore[return-value]  # every key of the template is set


def _displayed(m: Mapping[str, Scalar], keys: Mapping[str, KeyInfo]) -> dict[str, Scalar]:
    """The rule itself, value by value (what the shapes build, for the frames they cannot)."""
    out: dict[str, Scalar] = {}
    for key, value in m.items():
        if isinstance(value, bool):
            out[key] = int(value)
            continue
        out[key] = value
        info = keys.get(key)
        if isinstance(value, str) and info is not None:
            for label in info.metric.labels:
                out[label_key(key, label)] = int(value == label)
    return out


_MAX_SHAPES = 256
_SHAPES: dict[int, tuple[Mapping[str, KeyInfo], dict[tuple[str, ...], _Shape]]] = {}


def _shapes(keys: Mapping[str, KeyInfo]) -> dict[tuple[str, ...], _Shape]:
    """The shapes worked out for this ``keys`` mapping (the mapping itself is held, so its id is not
    reused by another while cached; a few per process: one per publisher's catalogue)."""
    entry = _SHAPES.get(id(keys))
    if entry is None or entry[0] is not keys:
        if len(_SHAPES) >= 64:
            _SHAPES.clear()
        entry = _SHAPES[id(keys)] = (keys, {})
    return entry[1]


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
        imports: Sequence[str] = (),
    ) -> None:
        self.sinks = sorted(sinks, key=lambda s: s.name != "journal")  # the journal first
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
        self.unstarted: set[str] = set()  # sinks whose start() failed: skipped, the journal has all
        self.adapters = resolve_adapters(adapters)
        self.keys = describe(self.adapters)
        if run_id is not None and not (isinstance(run_id, str) and SAFE_RUN_ID.fullmatch(run_id)):
            raise MetricsError(
                f"run_id {run_id!r:.80} is not a safe run id (it names files and tracker runs); fix: use "
                "1-128 letters, digits, '_', '-' or '.', not starting with '.' or '-'"
            )
        self.run_id = run_id or uuid.uuid4().hex[:16]
        # the name becomes a folder, a console line and every tracker's run name: redacted once, here
        self.run_name = redact_text(run_name) if run_name else f"run-{time.strftime('%Y%m%d-%H%M%S')}"
        self.run: RunInfo | None = None
        self.failures: dict[str, int] = {}
        self.empty_frames = 0  # frames with no metrics: journal only (see the module docstring)
        self._nonfinite: dict[tuple[str, str], int] = {}
        self._closed = False
        self._earlier_error: object = None  # sys.last_value when the run started (see _at_exit)
        self.after_close = 0  # frames published after close(): warned once, not recorded
        self._close_kw: dict[str, frozenset[str]] = {}  # per sink, the keywords its close() takes

        # Which sink is written where.
        journal = next((s for s in self.sinks if s.name == "journal"), None)
        where: Any = getattr(journal, "path", None)
        self.journal_path: Path | None = Path(where) if where is not None else None
        if mode != "inline" and self.journal_path is None:
            mode = "inline"  # no journal, no queue
        self.mode = mode
        self.inline: list[Sink] = []
        self.in_process: list[Sink] = []  # fed by the follower thread
        self.in_child: list[Sink] = []  # fed by the publisher process
        from ..core.catalog import BUILTIN

        builtin = {id(a) for a in BUILTIN}
        # The user's own keys (UserKeys) travel as declarations in the journal header: any reader rebuilds them.
        own = [a.name for a in self.adapters if id(a) not in builtin and not isinstance(a, UserKeys)]
        self.imports = tuple(imports)
        if mode == "process" and own and not self.imports:
            # A fresh publisher process knows the catalogue, not adapters registered in this one.
            warn(
                f"adapter(s) {own} are registered in this process only, so the trackers are fed by a thread of "
                "this process instead of the publisher process; fix: register them in a module and pass "
                "imports=['that.module'] (the publisher imports it first)",
                stacklevel=user_stacklevel(),
            )
            mode = "thread"
            self.mode = mode
        for sink in self.sinks:
            if mode == "inline" or getattr(sink, "inline", False):
                self.inline.append(sink)
            elif mode == "process" and callable(getattr(sink, "to_config", None)):
                self.in_child.append(sink)
            else:
                self.in_process.append(sink)
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
        if config and nesting(config) >= MAX_HEADER_DEPTH:  # the header holds it one level down
            raise MetricsError(
                f"the run's config nests {nesting(config)} levels deep; a journal header holds at most "
                f"{MAX_HEADER_DEPTH - 1} (readers refuse a deeper one as damaged); fix: flatten the config"
            )
        run = RunInfo(
            run_id=self.run_id,
            name=self.run_name,
            config=flatten_config(config or {}),
            config_tree=config_tree(config), trackers=tracker_settings(self.sinks),
            keys=self.keys,
            adapters=tuple(a.name for a in self.adapters if not isinstance(a, UserKeys)),
            started=started if started is not None else time.time(),
            extra=declarations(self.adapters),  # the journal header carries them: readers rebuild them
        )
        self.run = run
        if self.publishes_here():
            for sink in self.inline:
                try:
                    if not self._call(sink, "start", run):
                        self.unstarted.add(sink.name)  # warned once; its frames stay in the journal
                except MetricsError:  # the journal refused the run (see _call): nothing started, nothing to close
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
                config = dict(sink.to_config())  # type: ignore[attr-defined]
                if sink.name != type(sink).name:  # two sinks of one kind, told apart by name
                    config["name"] = sink.name
                configs.append(config)
            self.process = PublisherProcess(self.journal_path, configs, imports=self.imports, lock=self._run_lock())
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
                    warn(f"the in-process publisher stopped: {type(exc).__name__}: {exc}; the journal "
                         f"keeps every frame: `posttrain-metrics export {path} --to ...`", stacklevel=1)
                finally:
                    if held is not None:
                        held.release()

            self._thread = threading.Thread(target=run, name="posttrain-metrics-publisher", daemon=True)
            self._thread.start()

    def _run_lock(self) -> Any:
        """The journal's run lock (:class:`~posttrain_metrics.journal.RunLock`), when it holds one."""
        journal = next((s for s in self.inline if s.name == "journal"), None)
        return getattr(journal, "lock", None)

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
        shown: Frame | None = None
        for sink in self.inline:
            if sink.name in self.unstarted:
                continue
            if sink.name == "journal":
                self._call(sink, "write", frame)
                continue
            if not frame.metrics:
                continue
            if getattr(sink, "raw_frames", False):  # the console: labels as text, no indicator series
                self._call(sink, "write", self._for(sink, frame))
                continue
            if shown is None:
                shown = display_frame(frame, self.keys)
            self._call(sink, "write", self._for(sink, shown))
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
        for sink in self.inline:  # the journal's end record first: the followers close on it
            if sink.name not in self.unstarted:
                self._close_sink(sink, status, reason or "")
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
                warn(
                    f"the in-process publisher did not finish within close_timeout={self.close_timeout:g} s; "
                    f"{self._left()}", stacklevel=user_stacklevel())
        if self._thread is not None and not self._thread.is_alive():
            self._merge(self._thread_result)
        if self.process is not None:
            if not self.process.wait(max(0.0, deadline - time.monotonic())):
                warn(
                    f"the publisher process (pid {self.process.pid}) did not finish within close_timeout="
                    f"{self.close_timeout:g} s; {self._left()}. It goes on in the background and closes the "
                    f"trackers when done; if it is stopped, `{self.process.command()}` finishes it "
                    "(it sends only what the trackers lack)", stacklevel=user_stacklevel())
            elif self.process.returncode:
                warn(f"the publisher process exited with status {self.process.returncode}; "
                     f"{self._left()}; `{self.process.command()}` finishes it", stacklevel=user_stacklevel())
            else:
                self._merge(self._report())
        self._warn_unstarted()

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
        warn(f"tracker(s) {never} never started during the run (unreachable {when}); they hold none of its "
             f"frames, which the journal keeps: {fix}",
             stacklevel=user_stacklevel())

    def _merge(self, report: Mapping[str, Any]) -> None:
        """The followers' failures and unstarted sinks, counted here as if written here."""
        for name, n in report.get("failures", {}).items():
            self.failures[name] = self.failures.get(name, 0) + int(n)
        self.unstarted.update(report.get("unstarted", []))

    def _report(self) -> dict[str, Any]:
        from .follower import status_path

        if self.journal_path is None:
            return {}
        try:
            report: dict[str, Any] = json.loads(status_path(self.journal_path).read_text())
        except (OSError, ValueError):
            return {}
        return report

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
            get = getattr(sink, "run_handles", None)
            if get is not None and self.run is not None:
                out[sink.name] = dict(get())
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

    def _for(self, sink: Sink, frame: Frame) -> Frame:
        stores = sink.stores_nonfinite
        if "nan" in stores and "inf" in stores:
            return frame  # stores every value as it is (the frame is never mutated)
        metrics: dict[str, Scalar] = {}
        for key, value in frame.metrics.items():
            if type(value) is not float or value - value == 0.0:  # only a float can be NaN or infinite
                metrics[key] = value
                continue
            kind = nonfinite_kind(value)
            if kind is None or kind in stores:
                metrics[key] = value
                continue
            counter = (sink.name, key)
            if counter not in self._nonfinite:
                warn(
                    f"{sink.name}: {key} = {value} cannot be stored faithfully by this backend; "
                    f"skipped and counted under health/nonfinite/{key} (the journal keeps the value)",
                    stacklevel=user_stacklevel(),
                )
            self._nonfinite[counter] = self._nonfinite.get(counter, 0) + 1
            metrics[f"health/nonfinite/{key}"] = self._nonfinite[counter]
        return Frame(frame.step, metrics, frame.phase, frame.wall_time)

    def _close_sink(self, sink: Sink, status: str, reason: str) -> None:
        """``sink.close`` with the run's end: ``failed`` for any end but ``finished``; ``killed`` or
        ``interrupted`` and ``reason`` to a sink whose ``close`` takes them (it shows them its own way;
        any other gets the nearest, failed)."""
        takes = self._close_kw.get(sink.name)
        if takes is None:
            try:
                takes = frozenset(inspect.signature(sink.close).parameters)
            except (TypeError, ValueError):
                takes = frozenset()
            self._close_kw[sink.name] = takes
        kwargs: dict[str, Any] = {"failed": status != "finished"}
        if status in ("killed", "interrupted") and status in takes:
            kwargs[status] = True
        if reason and "reason" in takes:
            kwargs["reason"] = reason
        self._call(sink, "close", **kwargs)

    def call(self, sink: Sink, method: str, *args: Any, **kwargs: Any) -> bool:
        """``sink.<method>(...)`` with this publisher's failure policy (warned once, never raised)."""
        return self._call(sink, method, *args, **kwargs)

    def _call(self, sink: Sink, method: str, *args: Any, **kwargs: Any) -> bool:
        try:
            getattr(sink, method)(*args, **kwargs)
            return True
        except ImportError:
            if method == "start":
                raise  # a requested backend that is not installed is an error, never a silent degrade
            return self._failed(sink, method, sys.exc_info()[1])
        except MetricsError:
            if method == "start" and sink.name == "journal":
                raise  # the run is refused: another live run holds its journal, or a path of it leaves out_dir
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
            warn(
                f"sink {sink.name!r} failed in {method}() and is degraded: {type(exc).__name__}: "
                f"{redact_text(str(exc))}. "
                f"Training continues; {where}.",
                stacklevel=user_stacklevel(),
            )
        return False
