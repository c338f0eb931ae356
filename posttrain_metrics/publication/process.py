"""The publisher process, seen from the trainer: start it, notice when it dies, restart it, wait for it.

The trainer writes the tracker sinks' configs next to the journal (``<journal>.sinks.json``, mode
0600: a sink's options may hold a tracking URI with a password) and starts ``posttrain-metrics publish
<journal> --follow --parent-pid <trainer pid>`` (through :data:`BOOTSTRAP`, not ``python -m``: it runs
only the package's code, never a file of the working directory) in its own session (a Ctrl-C to the
trainer's terminal does not reach it: it must outlive a trainer that dies to drain the journal and mark
the run killed). It inherits the run's lock (:class:`~posttrain_metrics.journal.RunLock`) and holds it
until it exits. Its stdout and stderr (the trackers' banners, INFO
logs and warnings) go to ``publisher.log`` beside the journal (:func:`log_path`, mode 0600 like the
sinks file; every line redacted on its way out, :mod:`.output`); our own warnings
are also forwarded to the trainer's stderr, one line each, through a duplicate of that stream whose
descriptor the child finds in ``POSTTRAIN_METRICS_WARNINGS_FD``. ``check`` (called after each journal line, a syscall at most once a second) warns
once and restarts a publisher that died; the new one resumes from what each tracker holds. Restarts
back off (:class:`~posttrain_metrics.publication.backoff.Backoff`: 1, 2, 4, 8, 16, 32, then 60 s after
each death), so that :data:`MAX_RESTARTS` restarts in a row span about five minutes: a publisher that
dies because a tracker crashes it is still running when that tracker recovers a minute later. A
publisher that ran :data:`STABLE` seconds before it died starts a new series (1 s, and ten more).

The publisher yields the cores to the trainer (:func:`yield_cpu`): the CLI lowers it to nice 10, and
on Linux the follower runs it at ``SCHED_IDLE`` while the trainer trains (it gets a core only when
nothing else wants one), back at normal policy (nice 10) when it has lagged for a while on a busy
machine, and for the drain at the run's end.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from ..core.log import get_logger
from ..journal import LOCK_FD_ENV, RunFile, RunLock
from .backoff import LIMIT, Backoff

__all__ = ["BOOTSTRAP", "MAX_RESTARTS", "STABLE", "WARNINGS_FD_ENV", "PublisherProcess", "log_path", "sinks_path",
           "yield_cpu"]

log = get_logger("publication")

MAX_RESTARTS = 10
"""A publisher that keeps dying (a bug, a tracker that crashes it) is restarted this many times in a
row, after 1, 2, 4, 8, 16, 32, 60, 60, 60 and 60 s: 303 s in all."""

STABLE = 5 * LIMIT
"""Seconds a publisher must have run before it dies for its restart to start a new series."""


WARNINGS_FD_ENV = "POSTTRAIN_METRICS_WARNINGS_FD"
"""The descriptor, in the publisher process, of the trainer's stderr: our warnings go there too."""


def log_path(journal: Path) -> Path:
    """The publisher process's output (the trackers' own chatter): ``publisher.log`` beside
    ``journal.jsonl``, ``<stem>.publisher.log`` beside any other journal (:class:`~posttrain_metrics.journal.RunFile`)."""
    return RunFile.LOG.of(journal)


def _private_log(path: Path) -> BinaryIO:
    """``publisher.log`` opened to append (a restarted publisher adds to it), readable by its owner
    only, like ``sinks.json``: a tracker's own output may hold what we could not redact."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.fchmod(fd, 0o600)  # a log left by an older version, or created under another umask
    return os.fdopen(fd, "ab")


def _threads() -> list[int]:
    """Every thread of this process and of its descendants (wandb-core, started by the W&B sink,
    inherits the policy of the thread that started it), from /proc; ``[0]`` (this thread) without it."""
    tids: list[int] = []
    pids, seen = [os.getpid()], set()
    while pids:
        pid = pids.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue  # gone meanwhile, or no /proc
        for tid in tasks:
            tids.append(int(tid))
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    pids.extend(int(child) for child in f.read().split())
            except (OSError, ValueError):
                pass
    return tids or [0]


def _may_leave_idle() -> bool:
    """Whether this process may leave ``SCHED_IDLE`` again once in it (root, ``CAP_SYS_NICE``, or an
    ``RLIMIT_NICE`` that allows its nice value): probed by lowering its nice value by one, which needs
    at least that permission, and restoring it."""
    try:
        nice = os.getpriority(os.PRIO_PROCESS, 0)
        os.setpriority(os.PRIO_PROCESS, 0, nice - 1)
    except (OSError, AttributeError):
        return False
    os.setpriority(os.PRIO_PROCESS, 0, nice)
    return True


def yield_cpu(idle: bool) -> bool:
    """Run this process (every thread, and its child processes) at ``SCHED_IDLE`` (``idle``) or back
    at ``SCHED_OTHER``; whether any thread changed. ``SCHED_IDLE`` is what lets a publisher that is busy
    catching up (MLflow's embedded SQLite store takes milliseconds per frame) cost the trainer no core
    time: a nice-10 process still gets about a tenth of a core the trainer wants. Linux only, and only
    where the process may come back (:func:`_may_leave_idle`: an unprivileged process in
    ``SCHED_IDLE`` with the default ``RLIMIT_NICE`` of 0 could never leave it, and its trackers would
    starve on a busy machine); elsewhere it keeps what it has, nice 10."""
    setter = getattr(os, "sched_setscheduler", None)
    policy = getattr(os, "SCHED_IDLE" if idle else "SCHED_OTHER", None)
    if setter is None or policy is None or (idle and not _may_leave_idle()):
        return False
    changed = False
    for tid in _threads():
        try:
            setter(tid, policy, os.sched_param(0))
            changed = True
        except OSError:  # not permitted, or gone meanwhile
            pass
    return changed


BOOTSTRAP = """\
import sys
if not getattr(sys.flags, "safe_path", False):  # -P, PYTHONSAFEPATH (3.11+): no implicit entry to remove
    del sys.path[0]  # -c's implicit '': the trainer's working directory, where a tensorboard.py is not ours
from importlib.machinery import PathFinder
args = sys.argv[1:]
pins = {}
while args[0] != "--":
    name, _, where = args.pop(0).partition("=")
    pins[name] = where
class Pinned:
    @staticmethod
    def find_spec(name, path=None, target=None):
        return PathFinder.find_spec(name, [pins[name]]) if name in pins else None
sys.meta_path.insert(0, Pinned)
from posttrain_metrics.cli import main
sys.exit(main(args[1:]))
"""
"""How the publisher process starts: ``python -c BOOTSTRAP name=folder ... -- <cli arguments>``. Not
``python -m``, which puts the working directory first on ``sys.path``: a ``tensorboard.py`` or
``mlflow.py`` of the user's there would be imported instead of the tracker, which would silently stop.
The bootstrap drops that implicit entry (``-P`` alone needs Python 3.11) and keeps the rest
(``PYTHONPATH``, site-packages); the package itself is found in the folder the trainer imported it
from (a "pin", whatever the working directory), so the publisher runs the trainer's own copy of the
package. It imports nothing of the user's: the journal header declares every adapter of the run."""


def _locations(modules: Sequence[str]) -> dict[str, str]:
    """The folder holding each module's top-level package or module, as this process finds it; a
    module not found or without a single folder (a namespace package) is not pinned."""
    found: dict[str, str] = {}
    for module in modules:
        top = module.split(".")[0]
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            continue
        if spec is None or not spec.has_location or spec.origin is None:
            continue
        origin = Path(spec.origin).parent
        found[top] = str(origin.parent if spec.submodule_search_locations is not None else origin)
    return found


def sinks_path(journal: Path) -> Path:
    """The tracker sinks of a run, as configs: ``<journal>.sinks.json`` (:class:`~posttrain_metrics.journal.RunFile`)."""
    return RunFile.SINKS.of(journal)


class PublisherProcess:
    """One publisher process for the journal at ``journal`` and the sinks ``configs``. ``clock`` and
    ``sleep`` (monotonic seconds) are injected so that a test walks the restart schedule quickly."""

    def __init__(self, journal: Path, configs: Sequence[Mapping[str, Any]], *, check_every: float = 1.0,
                 lock: RunLock | None = None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.journal = journal
        # The run's lock, shared with each publisher process started (see RunLock): this copy is held until
        # wait() is done, so that a publisher restarted after the journal's close still inherits it.
        self.lock = lock.shared() if lock is not None else None
        self.configs = [dict(c) for c in configs]
        self.check_every = check_every
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0  # deaths before the run's end, in all
        self.clock = clock
        self.sleep = sleep
        self.backoff = Backoff(clock=clock)  # its failures: deaths in a row, this series
        self._spawned = 0.0
        self._down = False  # dead, its restart scheduled
        self._given_up = False  # died MAX_RESTARTS times in a row: left dead
        self._checked = 0.0
        self._closing = False

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode if self.proc is not None else None

    def command(self) -> str:
        """The command that finishes publishing this journal by hand."""
        return f"posttrain-metrics publish {shlex.quote(str(self.journal))}"

    def start(self) -> None:
        path = sinks_path(self.journal)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"sinks": self.configs}, f)
        os.replace(tmp, path)
        self._spawn()

    def _spawn(self) -> None:
        pins = [f"{name}={where}" for name, where in _locations(("posttrain_metrics",)).items()]
        cmd = [sys.executable, "-c", BOOTSTRAP, *pins, "--", "publish", str(self.journal), "--follow",
               "--parent-pid", str(os.getpid())]
        env, fds = dict(os.environ), []
        env.pop(LOCK_FD_ENV, None)
        held = [self.lock.fd] if self.lock is not None and self.lock.fd >= 0 else []
        if held:
            env[LOCK_FD_ENV] = str(held[0])
        # A trainer that uses W&B itself has its own wandb-core, whose address wandb leaves in
        # WANDB_SERVICE for its children: the publisher must start its own, or a killed trainer would
        # take the publisher's W&B connection down with it (and the drain could not finish W&B).
        env.pop("WANDB_SERVICE", None)
        try:
            fds.append(os.dup(2))  # the trainer's stderr, for our warnings (one line each)
            env[WARNINGS_FD_ENV] = str(fds[0])
        except OSError:  # no stderr descriptor: our warnings are in the log only
            env.pop(WARNINGS_FD_ENV, None)
        try:
            with _private_log(log_path(self.journal)) as log:
                self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                             start_new_session=True, pass_fds=[*fds, *held], env=env)
        finally:
            for fd in fds:
                os.close(fd)
        self._spawned = self._checked = self.clock()
        self._down = False

    def check(self) -> None:
        """Restart the publisher if it died (warned once), once its backoff delay has passed; at most
        one syscall per ``check_every``."""
        now = self.clock()
        if self._closing or self._given_up or self.proc is None or now - self._checked < self.check_every:
            return
        self._checked = now
        if not self._down:
            code = self.proc.poll()
            if code is None:
                return
            self._died(code)
        if self._down and self.backoff.due():
            self._spawn()

    def _died(self, code: int) -> None:
        """Count a death and schedule the restart (``_down``), or give up after MAX_RESTARTS in a row."""
        if self.clock() - self._spawned >= STABLE:
            self.backoff.reset()  # it ran a good while: a new fault, a new series
        self.restarts += 1
        if self.restarts == 1:
            log.warning(
                f"the publisher process (pid {self.pid}) exited with status {code} before the run's end; "
                "training is not affected and the journal keeps every frame. Restarted after "
                f"{self.backoff.delay(1):g} s, then with a doubling delay up to {self.backoff.limit:g} s while it "
                "keeps dying; it resumes from what each tracker holds (warned once, counted in restarts)",
            )
        if self.backoff.failures < MAX_RESTARTS:
            self.backoff.failed()
            self._down = True
        elif not self._given_up:
            self._given_up = True
            log.warning(f"the publisher process died {MAX_RESTARTS} times in a row; not restarted again. The "
                        f"journal keeps every frame: `{self.command()}` publishes them")

    def wait(self, timeout: float) -> bool:
        """Wait for the publisher to close the trackers (it does on the journal's end record). One
        that died before (or while) the end record was written is restarted once its backoff delay
        has passed, within ``timeout``, to drain the journal and close the trackers. Then this
        process's part of the run's lock is released (a publisher still running keeps holding it)."""
        try:
            return self._wait(timeout)
        finally:
            if self.lock is not None:
                self.lock.release()

    def _wait(self, timeout: float) -> bool:
        self._closing = True
        if self.proc is None:
            return True
        deadline = self.clock() + timeout
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        if self.proc.returncode and not self._down and not self._given_up:
            self._died(self.proc.returncode)
        if not self._down:
            return True
        self.sleep(max(0.0, min(self.backoff.next_at, deadline) - self.clock()))
        if not self.backoff.due():
            return False
        self._spawn()
        try:
            self.proc.wait(max(0.0, deadline - self.clock()))
        except subprocess.TimeoutExpired:
            return False
        return True
