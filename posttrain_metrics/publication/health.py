"""Live health: the doctor's checks run in the publisher as it reads the journal, and may stop the run.

The publisher side (:class:`LiveHealth`) has its own tail of the journal, so a slow tracker never
delays it. It feeds each frame to a :class:`~posttrain_metrics.doctor.Doctor` and, the first time a
check fires, publishes the finding at once (within the frame that triggered it):

- one line on the trainer's console (a warning: the publisher process forwards our warnings);
- to every started sink that takes findings (``write_finding``): a W&B alert and summary entry, an
  MLflow ``health/<check>`` tag and 0/1 metric, a TensorBoard text entry and ``health/<check>`` scalar;
- one line in the findings file beside the journal (:func:`findings_path`), which ``export`` replays.

Each finding is published live once (a check's finding of one severity and keys), at the frame it
first fires with it (``step``). A watch that fired is asked again only when what it keeps grew (see
:func:`_signature`), so the cost per frame is the watches' own bookkeeping (the offline doctor's).
``stop`` acts on warning and error findings only (an info finding is context: a cold start, a check
that could not run). At the run's end the
offline doctor reads the journal (what the run's record shows) and the findings file gets its verdict
(a ``close`` line); a finding the live pass could not make (see :data:`CLOSE_ONLY`) is published then.

Where the live and the offline doctor can differ, precisely:

- :data:`CLOSE_ONLY` checks judge the whole run (DPO accuracy over the last quarter, the logprob gap's
  data over every step) or the record itself (a torn line, a gap, the end record): they are published
  at the close, with the offline doctor's finding, never live;
- every other check is the same watch over the same frames in the same order, and causal (what it
  says at a step depends on the frames up to it only; the trend checks of truncation and the logprob
  gap take their baseline from their series' first ``TREND_BASELINE`` points, not from a quarter of
  the run): the live finding is the offline one as it stood at the frame it fired, fired at the first
  step the offline doctor names or the next frame, and the ``close`` line holds it whole.

An action per check (:func:`parse_health`, the callback's ``health:`` config): ``warn`` (publish it),
``stop`` (publish it and stop the run: :func:`stop_path` is written, and the trainer's
:class:`StopWatch` hands the decision to rank 0's reducer, which carries it to every rank in the next
window's collective) or ``off`` (not published live; the record at close still has it).
"""

from __future__ import annotations

import array
import collections
import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core.errors import MetricsError
from ..core.frame import Frame
from ..core.log import get_logger
from ..core.warn import warn
from ..doctor import CHECKS, TUNABLE, Doctor, Finding, Severity, run_checks, step_ranges
from ..integrations.base import Sink
from ..journal.format import RunFile
from .replica import Replica

__all__ = ["ACTIONS", "CLOSE_ONLY", "LiveHealth", "StopWatch", "check_of",
           "config_path", "findings_path", "parse_health", "parse_thresholds", "read_findings", "read_thresholds",
           "replay_findings", "stop_code", "stop_path", "write_health_config"]

ACTIONS = ("warn", "stop", "off")
"""What a finding does live: publish it, publish it and stop the run, or nothing (the record has it)."""

CLOSE_ONLY = frozenset({"dpo_accuracy_flat", "logprob_gap_no_data", "journal_integrity", "journal_gap", "run_end"})
"""Checks that judge the whole run or the record itself: published at the close only."""

_IDS = tuple(check.id for check in CHECKS)

log = get_logger("publication")


# -- the files beside the journal ------------------------------------------------------------------------


def config_path(journal: Path) -> Path:
    """``<journal>.health.json``: the actions per check, written by the trainer at the run's start."""
    return RunFile.HEALTH.of(journal)


def findings_path(journal: Path) -> Path:
    """``<journal>.findings.jsonl``: one line per published finding, then the ``close`` line."""
    return RunFile.FINDINGS.of(journal)


def stop_path(journal: Path) -> Path:
    """``<journal>.stop.json``: the live decision to stop the run (the trainer's :class:`StopWatch` reads it)."""
    return RunFile.STOP.of(journal)


def stop_code(check: str) -> int:
    """The number a stop by ``check`` travels as in the reducer's buffer (1 + its row in CHECKS)."""
    return 1 + _IDS.index(check)


def check_of(code: int) -> str:
    """The check a stop code names (``""`` for a code no check has)."""
    return _IDS[code - 1] if 0 < code <= len(_IDS) else ""


def parse_health(config: Mapping[str, Any] | None) -> dict[str, str]:
    """The action of every check from the callback's ``health:`` config (check ids, and ``default``).

    >>> parse_health({"kl_spike": "stop", "default": "warn"})["kl_spike"]
    'stop'
    >>> parse_health({})["reward_collapse"]
    Traceback (most recent call last):
    ...
    KeyError: 'reward_collapse'
    """
    config = {name: value.get("action", "warn") if isinstance(value, Mapping) else value
              for name, value in dict(config or {}).items()}
    parse_thresholds(config)  # the names, checked
    default = config.pop("default", "warn")
    actions: dict[str, str] = {}
    for name, action in [("default", default), *config.items()]:
        if action not in ACTIONS:
            raise MetricsError(f"health: {name}: {action!r:.40} is not an action; fix: one of {list(ACTIONS)}")
    unknown = sorted(set(config) - set(_IDS))
    if unknown:
        raise MetricsError(f"health: unknown check(s) {unknown}; fix: use the doctor's check ids {list(_IDS)} "
                           "or 'default'")
    for check in _IDS:
        actions[check] = str(config.get(check, default))
    return actions


def parse_thresholds(config: Mapping[str, Any] | None) -> dict[str, float]:
    """The thresholds a ``health:`` config overrides: a check given as a mapping takes its ``action`` and
    any of its thresholds (``TUNABLE``), by their lower-case names.

    >>> parse_thresholds({"kl_spike": {"action": "stop", "kl_ratio_min": 500}, "default": "warn"})
    {'KL_RATIO_MIN': 500.0}
    """
    out: dict[str, float] = {}
    for check, value in dict(config or {}).items():
        if not isinstance(value, Mapping):
            continue
        allowed = TUNABLE.get(check, ())
        for name, number in value.items():
            if name == "action":
                continue
            if name.upper() not in allowed:
                raise MetricsError(f"health: {check}: {name!r:.40} is not one of its thresholds; fix: use one of "
                                   f"{[a.lower() for a in allowed]} (docs/health.md)")
            if isinstance(number, bool) or not isinstance(number, (int, float)) or number != number:
                raise MetricsError(f"health: {check}: {name} = {number!r:.40}; fix: a number")
            out[name.upper()] = float(number)
    return out


def read_thresholds(journal: Path) -> dict[str, float]:
    """The thresholds the run's health config overrides (empty without one): the run's record and the
    live doctor judge with the same."""
    try:
        raw = json.loads(config_path(journal).read_text())
        return {str(k): float(v) for k, v in dict(raw.get("thresholds", {})).items()}
    except (OSError, ValueError, AttributeError, TypeError):
        return {}


def write_health_config(journal: Path, actions: Mapping[str, str],
                        thresholds: Mapping[str, float] | None = None) -> None:
    """Write the actions (and the thresholds overridden) beside the journal for the publisher, and clear
    a stop left by an earlier run."""
    path = config_path(journal)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"actions": dict(actions), "thresholds": dict(thresholds or {})}))
    os.replace(tmp, path)
    with contextlib.suppress(FileNotFoundError):
        stop_path(journal).unlink()


# -- the publisher's side --------------------------------------------------------------------------------


def _signature(watch: object) -> tuple[int, ...]:
    """The sizes of what a watch keeps (its steps, its examples): a watch that fired is asked for its
    findings again only when one of them grew, so a check that fires at every step of a long run costs
    its own bookkeeping per frame, not a rebuilt finding (``hits`` is linear in the steps it names)."""
    return tuple(len(v) for v in vars(watch).values() if isinstance(v, (array.array, list, dict, set, collections.deque)))


def _identity(finding: Finding) -> tuple[str, str, tuple[str, ...]]:
    """What tells a check's findings apart, whatever their steps: its id, severity and keys (the
    informative-groups check says a cold start and solved prompts in two info findings)."""
    return finding.check, finding.severity.value, tuple(finding.keys)


def _event(finding: Finding, *, step: int, action: str, when: str) -> dict[str, Any]:
    return {"kind": "finding", "when": when, "step": step, "action": action, **finding.to_dict()}


class _LiveJournal:
    """What the doctor knows of a run still being written: its header; frames come one at a time."""

    def __init__(self, path: Path, header: Mapping[str, Any]) -> None:
        from ..journal import Journal

        self.journal = Journal(path, dict(header), [], None, [])


class LiveHealth:
    """The doctor's checks over a journal as it is written, published live (see the module docstring).

    ``live`` (a trainer's publisher): the findings file is written afresh and a ``stop`` action writes
    :func:`stop_path`. Not live (``export``'s replay, a test): nothing is written but the events."""

    def __init__(self, journal: Path, actions: Mapping[str, str], *, live: bool = True, batch: int = 512,
                 thresholds: Mapping[str, float] | None = None, clock: Callable[[], float] = time.thread_time) -> None:
        from ..journal import JournalTail

        self.journal = journal
        self.actions = dict(actions)
        self.thresholds = dict(thresholds or {})
        self.live = live
        self.batch = batch
        self.tail = JournalTail(journal)
        self.doctor: Doctor | None = None
        self.pending: list[tuple[Any, Any]] = []  # (check, watch) of the live checks
        self.events: list[dict[str, Any]] = []  # what was published (at most one per check and severity)
        self.fired: dict[tuple[str, str, tuple[str, ...]], int] = {}  # identity (see _identity) -> step
        self.fired_watches: dict[int, tuple[int, ...]] = {}  # a watch that fired -> its _signature then
        self.stopped: dict[str, Any] | None = None
        self.first_step: int | None = None
        self.last_step: int | None = None
        self.frames = 0
        self.seconds = 0.0  # CPU seconds of the reading thread spent in the checks (``clock``)
        self.clock = clock
        self.closed = False
        self.outbox: collections.deque[dict[str, Any]] = collections.deque()  # for the trackers (see run)
        self._thread: threading.Thread | None = None
        self._halt = threading.Event()
        self._file = None
        if live:
            self._file = open(findings_path(journal), "w", encoding="utf-8")  # noqa: SIM115 - held for the run

    @classmethod
    def open(cls, journal: Path, *, live: bool = True) -> LiveHealth | None:
        """The live health of the run at ``journal`` when its trainer asked for it (a health config beside
        the journal), else None. A config that cannot be read is warned about and ignored."""
        try:
            raw = json.loads(config_path(journal).read_text())
            actions = parse_health(raw.get("actions", {}))
            thresholds = read_thresholds(journal)
        except FileNotFoundError:
            return None
        except (ValueError, AttributeError, MetricsError) as exc:
            warn(f"{config_path(journal)}: not a health config ({exc!s:.200}); live health is off", stacklevel=2)
            return None
        return cls(journal, actions, live=live, thresholds=thresholds)

    # -- frames ----------------------------------------------------------------------------------------

    def run(self, poll: float = 0.2) -> LiveHealth:
        """Read the journal on a thread of its own, every ``poll`` seconds, so that a tracker that is slow
        to start or to take a batch never delays a finding: the console line, the findings file and a stop
        decision are made on this thread; the trackers' part waits in :attr:`outbox` for the follower's
        loop (:meth:`deliver`), which owns the sinks."""

        def loop() -> None:
            try:
                while not self._halt.is_set():
                    if not self.step() and self._halt.wait(poll):
                        return
            except Exception as exc:  # a bug here never stops publication; the close reads again
                log.warning(f"live health stopped reading the journal: {type(exc).__name__}: {str(exc)[:300]}")

        self._thread = threading.Thread(target=loop, name="posttrain-metrics-health", daemon=True)
        self._thread.start()
        return self

    def pump(self, replicas: Sequence[Any]) -> None:
        """The follower's round: deliver what the thread found (see :meth:`run`), or, with no thread,
        read and check the journal here."""
        if self._thread is not None:
            self.deliver(replicas)
        else:
            self.step(replicas)

    def deliver(self, replicas: Sequence[Any]) -> None:
        """The findings the thread published since the last call, to the trackers (the follower's loop)."""
        while self.outbox:
            deliver(self.outbox.popleft(), replicas)

    def step(self, replicas: Sequence[Any] | None = None) -> int:
        """Read what the journal gained (at most ``batch`` lines), check each frame, publish what fired
        (to ``replicas`` now, or, without them, into :attr:`outbox`)."""
        if self.closed:
            return 0
        records = self.tail.read(self.batch)
        for record in records:
            if record.kind == "header" and record.header is not None and self.doctor is None:
                self._start(record.header)
            elif record.kind == "frame" and record.frame is not None and self.doctor is not None:
                self.see(record.frame, replicas)
        return len(records)

    def _start(self, header: Mapping[str, Any]) -> None:
        run = _LiveJournal(self.journal, header).journal
        checks = [c for c in CHECKS if c.id not in CLOSE_ONLY and self.actions.get(c.id) != "off"]
        self.doctor = Doctor(run, checks, self.thresholds)
        self.pending = list(zip(self.doctor.checks, self.doctor.watches))

    def see(self, frame: Frame, replicas: Sequence[Any] | None = None) -> None:
        """One frame to every live check; a check that fires is published now, once."""
        assert self.doctor is not None
        start = self.clock()
        train = frame.phase == "train"
        for _, watch in self.pending:  # Doctor.see over the checks that have not fired
            if train or watch.every_phase:
                watch.see(frame)
        self.frames += 1
        if frame.phase == "train":
            if self.first_step is None:
                self.first_step = frame.step
            self.last_step = frame.step
        fired = []
        for check, watch in self.pending:
            if self.fired_watches.get(id(watch)) == (sig := _signature(watch)):
                continue  # fired before and nothing it keeps grew since: its findings are as published
            if id(watch) in self.fired_watches:
                self.fired_watches[id(watch)] = sig
            for hit in watch.hits():
                severity = hit.severity or check.severity
                if (check.id, severity.value, tuple(hit.keys)) in self.fired:
                    continue  # published already: its steps are not materialised again
                steps = tuple(sorted(set(hit.steps)))
                fired.append(Finding(check.id, severity, steps, hit.explanation, hit.next_step, hit.keys))
        self.seconds += self.clock() - start
        for finding in fired:
            self._publish(finding, frame.step, "live", replicas)
            watch = next(w for c, w in self.pending if c.id == finding.check)
            self.fired_watches[id(watch)] = _signature(watch)

    def _publish(self, finding: Finding, step: int, when: str, replicas: Sequence[Any] | None) -> None:
        action = self.actions.get(finding.check, "warn")
        if action == "off":
            return
        event = _event(finding, step=step, action=action, when=when)
        self.events.append(event)
        self.fired[_identity(finding)] = step
        self._write(event)
        stopping = (action == "stop" and self.live and self.stopped is None and when == "live"
                    and finding.severity is not Severity.INFO)  # context never stops a run
        warn(f"health: {finding.check} ({finding.severity.value}) at step {step}"
             + (f" (steps {step_ranges(finding.steps, limit=4)})" if finding.steps else "")
             + f": {finding.explanation}; next: {finding.next_step}"
             + ("; action stop: the run stops at the next step every rank reduces" if stopping else ""),
             stacklevel=2)
        if stopping:
            self._stop(event)
        if replicas is None:
            self.outbox.append(event)
        else:
            deliver(event, replicas)

    def _stop(self, event: Mapping[str, Any]) -> None:
        path = stop_path(self.journal)
        self.stopped = {"check": event["check"], "code": stop_code(event["check"]), "step": event["step"],
                        "severity": event["severity"], "explanation": event["explanation"]}
        if path.exists():
            return  # a restarted publisher decided this already
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.stopped))
        os.replace(tmp, path)

    def _write(self, line: Mapping[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps(line, default=str) + "\n")
            self._file.flush()

    # -- the close -------------------------------------------------------------------------------------

    def close(self, replicas: Sequence[Any] = ()) -> list[Finding]:
        """At the run's end: the rest of the journal, then the offline doctor's verdict. Its findings that
        were not published live are published now (at the run's last step), each live check that never
        fired gets its 0 (``value``), and the findings file its ``close`` line. Returns the verdict."""
        if self.closed:
            return []
        if self._thread is not None:
            self._halt.set()
            self._thread.join()
        self.deliver(replicas)
        while self.step(replicas):
            pass
        self.closed = True
        findings: list[Finding] = []
        try:
            from ..journal import open_journal

            findings = run_checks(open_journal(self.journal), self.thresholds)
        except Exception as exc:  # never in the way of closing the trackers
            log.warning(f"{self.journal}: the doctor could not read the run at its close ({type(exc).__name__}: "
                        f"{exc!s:.200}); the findings file has the live findings only")
        last = self.last_step if self.last_step is not None else 0
        for finding in findings:
            if finding.check in CLOSE_ONLY or _identity(finding) not in self.fired:
                self._publish(finding, last, "close", replicas)
        if self.first_step is not None:
            fired = {check for check, _, _ in self.fired}
            for check in _IDS:
                if check not in fired and self.actions.get(check) != "off":
                    deliver({"kind": "clear", "check": check, "step": self.first_step}, replicas)
        self._write({"kind": "close", "findings": [f.to_dict() for f in findings], "first_step": self.first_step,
                     "frames": self.frames, "check_cpu_s": self.seconds})
        if self._file is not None:
            self._file.close()
            self._file = None
        return findings


    def summary(self) -> dict[str, Any]:
        """For the publisher's status file: the findings published (check, severity, step, when) and the
        stop decision (None when the run was not stopped), and the checks' CPU per frame."""
        return {"findings": [{k: e[k] for k in ("check", "severity", "step", "when", "action")}
                             for e in self.events],
                "stopped": self.stopped, "frames": self.frames,
                "check_cpu_us_per_frame": round(1e6 * self.seconds / self.frames, 1) if self.frames else None}


def deliver(event: Mapping[str, Any], replicas: Sequence[Replica]) -> None:
    """An event to every started sink (:meth:`~posttrain_metrics.integrations.base.Sink.write_finding`),
    through its replica's sink set (a failing tracker is counted and logged there, never raised)."""
    for r in replicas:
        if r.dispatch is None or not r.started or r.closed or r.sink.name in r.dispatch.unstarted:
            continue
        r.dispatch.call(r.sink, "write_finding", dict(event))


def read_findings(journal: Path) -> list[dict[str, Any]]:
    """The lines of the findings file beside ``journal`` (empty when there is none)."""
    try:
        text = findings_path(journal).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            break  # a torn last line: what came before is kept
    return out


def replay_findings(journal: Path, sink: Sink) -> int:
    """``export``: the findings file's events to ``sink`` (started), in order; how many were sent."""
    sent = 0
    lines = read_findings(journal)
    fired = {e["check"] for e in lines if e.get("kind") == "finding"}
    for event in lines:
        if event.get("kind") == "finding":
            sink.write_finding(event)
            sent += 1
    first = next((e.get("first_step") for e in lines if e.get("kind") == "close"), None)
    if first is not None:  # the run closed: each check that never fired gets its 0, as live
        for check in _IDS:
            if check not in fired:
                sink.write_finding({"kind": "clear", "check": check, "step": first})
    return sent


# -- the trainer's side ----------------------------------------------------------------------------------


class StopWatch:
    """On global rank 0: a daemon thread that looks for :func:`stop_path` every ``every`` seconds (one
    ``stat``) and, once it appears, calls ``on_stop(decision)`` once. The training thread reads only the
    flag ``on_stop`` sets (the reducer's ``stop_request``), once per step."""

    def __init__(self, journal: Path, on_stop: Callable[[dict[str, Any]], None], *, every: float = 0.1) -> None:
        self.path = stop_path(journal)
        self.on_stop = on_stop
        self.every = every
        self.decision: dict[str, Any] | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="posttrain-metrics-health-stop", daemon=True)

    def start(self) -> StopWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._done.wait(self.every):
            try:
                decision = json.loads(self.path.read_text())
                code = int(decision["code"])
            except (FileNotFoundError, ValueError, KeyError, TypeError):
                continue  # not there yet (or being replaced: read again next time)
            if code > 0:
                self.decision = decision
                self.on_stop(decision)
                return

    def close(self) -> None:
        self._done.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(1.0)
