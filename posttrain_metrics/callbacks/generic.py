"""The trainer callback for hand-written loops and config-driven trainers.

One object per rank. Each hook turns one trainer event into one core call: a chunk's metrics go to
the reducer, the end of an optimizer window reduces (collectively, on every rank) and publishes (on
global rank 0), the end of the run closes the sinks. It holds no arithmetic and no vendor code.

In a config (Hydra/OmegaConf ``instantiate``, or :func:`build_callback` without Hydra)::

    _target_: posttrain_metrics.callbacks.MetricsCallback
    adapters: [grpo, reward, trainer]
    out_dir: runs/my-run
    sinks:
      - {type: wandb, project: my-project}
      - {type: mlflow}
      - {type: tensorboard}
      - {type: console}
      - {type: journal}
    extra:                          # your own keys, one line each (see posttrain_metrics.core.extra)
      my/tokens_per_s: mean
      my/oom_retries: sum
    perf: {params: 7.0e+9, timers: [generation, reward]}   # perf/ and timer/ keys (docs/throughput.md)
    health: {kl_spike: stop, default: warn}   # live health (docs/health.md): an action per doctor check
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core import distributed
from ..core.errors import MetricsError, user_stacklevel
from ..core.extra import check_disjoint, normalise, user_adapters
from ..core.frame import Frame
from ..core.layout import RefusedChunk
from ..core.log import get_logger
from ..core.redact import redact_text
from ..core.reducer import AdapterSpec, MetricReducer, resolve_adapters
from ..core.throughput import Throughput
from ..core.warn import warn
from ..integrations.base import Sink
from ..integrations.console import check_total_steps
from ..integrations.factory import build_sink, check_callback, check_writable, plain, safe_name
from ..journal import JournalSink
from ..journal.samples import Histogram, Samples, SamplesFile, samples_path
from ..publication import Publisher
from ..publication.health import (
    StopWatch,
    check_of,
    config_path,
    parse_health,
    parse_thresholds,
    stop_path,
    write_health_config,
)
from .samples import MAX_CHARS, cut, kept_rows, offer, settle

__all__ = ["MetricsCallback", "build_callback"]

log = get_logger("callbacks")


class MetricsCallback:
    """Reduces chunk metrics exactly per optimizer window and publishes them to sinks.

    ``adapters`` names the catalogue adapters (``["grpo", "reward", "trainer"]``); ``sinks`` are
    sink objects or configs (``{"type": "tensorboard"}``); file-backed sinks write under
    ``out_dir``. Sinks are constructed on every rank (constructors do no I/O) but only global rank
    0 starts and writes them; there the callback creates ``out_dir`` and checks it can be written
    when it is built (a bad one is a ``MetricsError`` before training, not a run with no metrics).
    ``publisher`` says where the trackers are written: ``"process"`` (the default: a publisher process
    tails the journal; the training thread writes only the journal and console lines; ``on_run_start``
    does not wait for the trackers (it raises if another live run holds the journal), and their own output goes to
    ``<out_dir>/publisher.log``), ``"thread"`` (the same, on a thread of this process: no wait
    either, but the trackers' output stays on this process's streams) or ``"inline"`` (every sink on
    the calling thread: ``on_run_start`` waits for each tracker to start, seconds for MLflow's schema
    on a fresh SQLite file); ``close`` waits up to ``close_timeout`` seconds for the trackers (see
    :class:`~posttrain_metrics.publication.Publisher`).
    ``total_steps`` (the run's optimizer steps, when known) makes the console line read ``step/total``
    with an ETA; trainer callbacks set it from the trainer's ``max_steps`` (:meth:`set_total_steps`).
    ``extra`` declares your own keys in one line each (``{"my/tokens_per_s": "mean", "my/oom_retries":
    "sum"}``, see :mod:`posttrain_metrics.core.extra`), as does :meth:`declare`. Neither they nor
    your own ``MetricAdapter`` objects need an import elsewhere: the journal header declares every
    adapter, so the publisher process, ``export``, ``doctor`` and ``plot`` rebuild the run from it.
    Use as a context manager, or call ``on_run_end`` in a ``finally``: it is idempotent and also runs
    at interpreter exit. Under a launcher that started several ranks
    (``WORLD_SIZE`` > 1), reduce refuses until torch.distributed is initialised, unless ``local=True``
    says that a per-rank local reduction is deliberate.
    ``perf`` turns on throughput, step time, stage timers, MFU and memory (the ``perf/`` and
    ``timer/`` keys, docs/throughput.md): ``True``, or a mapping of
    :class:`~posttrain_metrics.core.throughput.Throughput` options (``timers``, ``params``,
    ``flops_per_token``, ``peak_flops``, ``memory``), or a ``Throughput`` (an injected clock);
    time stages with ``with callback.timer("generation"):``.
    """

    def __init__(
        self,
        *,
        adapters: AdapterSpec,
        sinks: Sequence[Mapping[str, Any] | Sink] = ({"type": "console"},),
        out_dir: str | os.PathLike[str] | None = None,
        run_name: str | None = None,
        run_id: str | None = None,
        group: Any = None,
        local: bool = False,
        publisher: str = "process",
        close_timeout: float = 300.0,
        total_steps: int | None = None,
        extra: Mapping[str, Any] | None = None,
        samples_per_step: int = 16,
        sample_max_chars: int = MAX_CHARS,
        perf: bool | Mapping[str, Any] | Throughput = False,
        health: Mapping[str, Any] | None = None,
    ) -> None:
        adapters, sinks = plain(adapters), plain(sinks)
        self._health = parse_health(plain(health)) if health is not None else None  # refused here, not at start
        self._thresholds = parse_thresholds(plain(health)) if health is not None else {}
        self._stop_watch: StopWatch | None = None
        self.stop_decision: dict[str, Any] | None = None  # rank 0: the publisher's decision (stop_path)
        check_callback(adapters=adapters, sinks=sinks, out_dir=out_dir, run_name=run_name)
        self.out_dir = Path(out_dir) if out_dir is not None else None
        name = safe_name(redact_text(run_name)) if run_name else None  # redacted before it is mangled
        built = [build_sink(spec, out_dir=self.out_dir) for spec in sinks]
        if distributed.global_rank() == 0:
            self._check_folders(built)
        self._adapters = resolve_adapters(adapters)
        self._perf = _throughput(perf)
        timers: dict[str, Any] = {}
        if self._perf is not None:
            if not any(a.name == "perf" for a in self._adapters):
                self._adapters = (*self._adapters, *resolve_adapters("perf"))
            timers = self._perf.declarations
        extra = plain(extra) if extra is not None else {}
        self._extra = normalise({**timers, **extra} if timers and isinstance(extra, Mapping) else extra)
        self._options: dict[str, Any] = dict(sinks=built, run_name=name, run_id=run_id, mode=publisher,
                                             close_timeout=close_timeout)
        self._group, self._local = group, local
        for option, value, low in (("samples_per_step", samples_per_step, 0), ("sample_max_chars", sample_max_chars, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise MetricsError(f"MetricsCallback: {option}={value!r:.40}; fix: a whole number >= {low}")
        self.samples_per_step, self.sample_max_chars = samples_per_step, sample_max_chars
        self._samples_file: SamplesFile | None = None
        self.samples_lost: list[int] = []  # steps whose samples the samples file could not take
        check_total_steps(total_steps)
        self._total_steps = total_steps
        self._build()
        self.last_frame: Frame | None = None
        self._started = False
        self._fixed = False  # the key set is fixed once a chunk is taken or the run starts

    def _check_folders(self, sinks: Sequence[Sink]) -> None:
        """``out_dir`` and the journal's folder can be written: checked at build, on the rank that will
        write them (global rank 0, as the launcher's ``RANK`` says before torch.distributed starts),
        so a bad folder is one clear error before training rather than a run that loses every metric.
        Not on other ranks: they write nothing there, and on another node that path may not exist."""
        journal = next((s.path for s in sinks if s.name == "journal" and isinstance(s, JournalSink)), None)
        if self.out_dir is not None:
            check_writable("MetricsCallback", "out_dir", self.out_dir)
        if journal is not None and (self.out_dir is None or Path(journal).parent.resolve() != self.out_dir.resolve()):
            check_writable("MetricsCallback", "the journal's folder", Path(journal).parent)

    def _build(self) -> None:
        users = user_adapters(self._extra)
        check_disjoint(users, self._adapters)
        options = dict(self._options)
        self.publisher = Publisher(options.pop("sinks"), adapters=[*self._adapters, *users], **options)
        # One reducer per phase, over the adapters that publish it: the reward report and the
        # validation adapter both take bare source names (reward_std) but never share a phase.
        self._reducers = {
            phase: MetricReducer([a for a in self.publisher.adapters if phase in a.phases], group=self._group,
                                 local=self._local)
            for phase in ("train", "val")
            if any(phase in a.phases for a in self.publisher.adapters)
        }
        self.set_total_steps(self._total_steps)
        log = self.publisher.vendor_log
        if log is not None:
            note = f"tracker logs (W&B, MLflow, TensorBoard output): {log}"
            for sink in self.publisher.sinks:
                sink.add_note(note)  # said once however often declare() rebuilds

    def set_total_steps(self, total_steps: int | None) -> None:
        """The run's number of optimizer steps (``None``: unknown), for the console's ``step/total``
        and ETA; may be called at any time (trainer callbacks call it when the trainer knows)."""
        check_total_steps(total_steps)
        self._total_steps = total_steps
        for sink in self.publisher.sinks:
            sink.set_total_steps(total_steps)

    def declare(self, key: str, reduction: str = "mean", **fields: Any) -> None:
        """Declare one of your own keys, as a line of ``extra`` would (``declare("my/x", "sum")``,
        ``declare("my/loss", "weighted_mean", weight="my/tokens")`` after ``my/tokens``). Before the
        run starts only (``on_run_start`` or the first chunk): the reduction layout, identical on
        every rank, and the journal header are fixed then. Declaring a key again the same way is a
        no-op."""
        spec = {"reduction": reduction, **fields}
        merged = normalise({**self._extra, key: spec})
        if key in self._extra:
            if merged[key] != self._extra[key]:
                raise MetricsError(f"declare({key!r}): already declared as {self._extra[key]}, now {merged[key]}; "
                                   "fix: declare each key once")
            return
        if self._fixed:
            raise MetricsError(
                f"declare({key!r}) after the run started: every rank fixes its keys before the first chunk; "
                f"fix: call declare before on_run_start and the first on_chunk_end, or put {key!r} in extra"
            )
        self._extra = merged
        self._build()

    @property
    def sinks(self) -> list[Sink]:
        return list(self.publisher.sinks)

    @property
    def run_handles(self) -> dict[str, dict[str, Any]]:
        """The trackers' own names for this run, once the publisher has started them (rank 0):
        ``{"wandb": {"run_id", "url", ...}, "mlflow": {"run_id", "experiment_id", "tracking_uri"},
        "tensorboard": {"log_dir"}}``. Attach your own logging to the same runs with them, e.g.
        ``MlflowClient(h["tracking_uri"]).log_artifact(h["run_id"], path)``. Empty until reported
        (the publisher process reports within a second of starting each tracker)."""
        return self.publisher.run_handles()

    def on_run_start(self, config: Mapping[str, Any] | None = None) -> None:
        """Start the sinks (rank 0) with the run's config, redacted at every depth: nested as given in
        the journal and W&B, one ``a/b`` param per value in MLflow (a list as one param)."""
        self._fixed = True
        self._start_health()
        self.publisher.start(plain(config) if config is not None else None)
        self._started = True
        if self._perf is not None:
            self._perf.start()

    def _start_health(self) -> None:
        """Live health, on global rank 0 (see :mod:`posttrain_metrics.publication.health`): the actions
        beside the journal for the publisher, and the watch for its stop decision when one is ``stop``."""
        journal = self.publisher.journal_path
        if distributed.global_rank() != 0 or journal is None:
            if self._health is not None and journal is None and distributed.global_rank() == 0:
                warn("MetricsCallback: health is set but the run has no journal sink, which live health reads; "
                     "fix: add {type: journal} to sinks", stacklevel=user_stacklevel())
            return
        if self._health is None:
            for stale in (config_path(journal), stop_path(journal)):  # an earlier run's, at this path
                if stale.exists():
                    stale.unlink()
            return
        write_health_config(journal, self._health, self._thresholds)
        if "stop" in self._health.values() and self._stop_watch is None and "train" in self._reducers:
            reducer = self._reducers["train"]

            def on_stop(decision: dict[str, Any]) -> None:
                self.stop_decision = decision
                reducer.stop_request = int(decision["code"])  # the flag the next reduce reads

            self._stop_watch = StopWatch(journal, on_stop).start()
        if not (self.publisher.in_child or self.publisher.in_process):
            warn("MetricsCallback: health is set but no publisher reads the journal (every sink is written "
                 "inline: journal and console only, or publisher='inline'), so nothing checks the run live; "
                 "the run's record at close still has the doctor's findings; fix: add a tracker sink "
                 "(tensorboard, mlflow, wandb) with publisher 'process' or 'thread'", stacklevel=user_stacklevel())

    @property
    def should_stop(self) -> bool:
        """Whether live health stopped the run: true on every rank from the step whose reduce carried
        the decision on (the same step everywhere); a loop stops after that step."""
        reducer = self._reducers.get("train")
        return reducer is not None and reducer.stop > 0

    @property
    def stopped_by(self) -> str:
        """The check that stopped the run (``""`` while it runs on), the same on every rank."""
        reducer = self._reducers.get("train")
        return check_of(reducer.stop) if reducer is not None else ""

    def on_chunk_end(self, metrics: Mapping[str, Any] | RefusedChunk) -> None:
        """One gradient-accumulation chunk's source-name metrics (every rank)."""
        self._fixed = True
        self._reducer("train").add(metrics)
        if self._perf is not None:
            self._perf.start(late=True)  # no on_run_start nor timer before: this window's time is unknown

    def on_window_end(self, step: int) -> Frame:
        """End of an optimizer window: reduce on every rank, publish on rank 0."""
        return self._publish(self._reduce_train(step))

    @property
    def throughput(self) -> Throughput | None:
        """The window clock and stage timers (``None`` unless ``perf`` is on)."""
        return self._perf

    def timer(self, name: str) -> contextlib.AbstractContextManager[None]:
        """``with callback.timer("generation"):`` times a stage of the window (every rank that runs
        it): published as ``timer/generation_s`` (max over ranks) and ``timer/generation_s_mean``;
        repeated and nested timings of a name in one window add up. Needs ``perf`` on; the names are
        fixed when the callback is built (``perf={"timers": [...]}`` beside the default stages)."""
        if self._perf is None:
            raise MetricsError(f"timer({name!r}) needs throughput on; fix: MetricsCallback(..., perf=True)")
        return self._perf.timer(name)

    def _reduce_train(self, step: int, unit_weights: Collection[str] = ()) -> Frame:
        """Reduce the training window (collective), with this rank's window time, stage timers and
        memory peak in the same collective, then the derived ``perf/`` figures (every rank).
        ``unit_weights``: keys that carry a unit weight, not a count, left out of the figures."""
        reducer = self._reducer("train")
        perf = self._perf
        if perf is None:
            return reducer.reduce(step, phase="train")
        reducer.add(perf.window_chunk())
        frame = reducer.reduce(step, phase="train")
        counted = {k: v for k, v in frame.metrics.items() if k not in unit_weights} if unit_weights else frame.metrics
        figures = perf.figures(counted)
        metrics = frame.metrics
        if isinstance(metrics, dict):  # the reducer's fresh dict, ours alone: no copy on the hot path
            metrics.update(figures)
            return frame
        return Frame(frame.step, {**metrics, **figures}, frame.phase, frame.wall_time)

    def on_validation_end(
        self, step: int, metrics: Mapping[str, Any] | Sequence[Mapping[str, Any] | RefusedChunk]
    ) -> Frame:
        """This rank's validation metrics (one chunk dict or a list of them), reduced under ``val/``.

        Atomic on every rank: a chunk that cannot be taken (not a dict, a bad value) fails the whole
        call with a ``MetricsError`` on every rank, after this rank has joined the collective, and
        leaves nothing pending for the next validation."""
        self._fixed = True
        reducer = self._reducer("val")
        many = isinstance(metrics, Sequence) and not isinstance(metrics, (str, bytes))
        reducer.add_window(list(metrics) if many else [metrics])
        return self._publish(reducer.reduce(step, phase="val"))

    def on_samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> Samples | None:
        """A step's per-sample rows (``prompt``, ``completion``, ``reward``, ``advantage``, ``group``
        and any column of yours), on every rank when torch.distributed is initialised (collective:
        each rank passes its own rows, an empty list if it has none). Rank 0 keeps at most
        ``samples_per_step`` of them, whole groups, chosen deterministically
        (:func:`~posttrain_metrics.callbacks.samples.select`; text cut at ``sample_max_chars``), appends them
        to the samples file beside the journal and publishes them (a W&B Table, an MLflow table, a
        TensorBoard text), with histograms of the ``reward``, ``advantage`` and ``response_len``
        columns over every row offered (TensorBoard and W&B). Returns them on rank 0, ``None``
        elsewhere. The groups are chosen over the whole batch (every rank's group sizes), so the sample
        is the same however the rows are split across ranks. A bad row or step on any rank is a
        MetricsError on every rank, after the same collectives, and the next step is normal."""
        gathered = self._gather_samples(step, rows)
        if gathered is None:
            return None
        step, chosen, numbers, offered = gathered
        if not self.publisher.publishes_here():
            return None
        if not self._started:
            self.on_run_start()
        samples = cut(step, chosen, max_chars=self.sample_max_chars, offered=offered)
        histograms = {column: Histogram.of(values, column=column) for column, values in numbers.items()}
        samples = dataclasses.replace(samples, wall_time=time.time(), histograms=histograms,
                                      run_id=self.publisher.run_id)
        path = self.publisher.journal_path
        if path is not None:
            self._keep_samples(samples, samples_path(path))
        for sink in self.publisher.inline:
            if sink.takes_samples and sink.name not in self.publisher.unstarted:
                self.publisher.call(sink, "write_samples", samples)
        return samples

    def _gather_samples(
        self, step: object, rows: object
    ) -> tuple[int, list[dict[str, Any]], dict[str, list[float]], int] | None:
        """The step, the chosen rows of every rank (rank order), the histogram columns' numbers of every
        row offered and how many were offered: on rank 0 (``None`` elsewhere). Two collectives under
        torch.distributed: every rank's :class:`~posttrain_metrics.callbacks.samples.Offer` (group sizes,
        a bad row's message) to every rank, which all choose the same groups over the whole batch or
        all raise the same MetricsError; then only the chosen rows and the numbers, to rank 0."""
        mine_offer, mine, numbers = offer(step, rows)
        where = None if self._local else distributed.group_rank_and_size(self._group)
        if where is None or where[1] == 1:
            value, kept = settle([mine_offer], self.samples_per_step)
            return value, kept_rows(mine, kept, 0), numbers, len(mine)
        offers = distributed.all_gather_objects(mine_offer, self._group)
        value, kept = settle(offers, self.samples_per_step)
        start = sum(o.rows for o in offers[: where[0]])
        parts = distributed.gather_to_first((kept_rows(mine, kept, start), numbers), self._group)
        if parts is None:
            return None
        numbers = {}
        for _, part_numbers in parts:
            for column, values in part_numbers.items():
                numbers.setdefault(column, []).extend(values)
        return value, [row for part, _ in parts for row in part], numbers, sum(o.rows for o in offers)

    def _keep_samples(self, samples: Samples, path: Path) -> None:
        """Append to the samples file. Its failure (a full disk) is the samples' own, never the
        trainer's: warned once, counted in ``publisher.failures["samples"]`` and ``samples_lost`` (the
        steps whose samples are not in the file, hence in no tracker fed from it); training goes on
        and the next step's samples are tried again."""
        if self._samples_file is None:
            self._samples_file = SamplesFile(path)
        try:
            self._samples_file.write(samples)
        except OSError as exc:
            self.samples_lost.append(samples.step)
            failures = self.publisher.failures
            failures["samples"] = failures.get("samples", 0) + 1
            if len(self.samples_lost) == 1:
                log.warning(f"the samples file {path} could not be written ({type(exc).__name__}: "
                            f"{exc}): step {samples.step}'s samples are not in it, so no tracker "
                            "fed from it shows them; training continues and later steps are tried again "
                            "(MetricsCallback.samples_lost lists the steps)")

    def on_run_end(self, failed: bool = False, *, error: BaseException | None = None) -> None:
        """Close every sink with the run's status (FAILED when ``failed``). ``error``, the exception
        that ended the run, says why: a ``KeyboardInterrupt`` (Ctrl-C) ends it ``interrupted``, any
        other ``failed``, and its type and message (redacted) are recorded and shown by every tracker.
        Idempotent."""
        if self._samples_file is not None:
            self._samples_file.close()
        if self._stop_watch is not None:
            self._stop_watch.close()
        reason = None
        if self.should_stop and not failed and error is None:
            decision = self.stop_decision or {}
            reason = (f"stopped by live health: {self.stopped_by}"
                      + (f" (fired at step {decision['step']}: {decision.get('explanation', '')})"[:400]
                         if "step" in decision else ""))
        self.publisher.close(failed=failed, error=error, reason=reason)

    def _reducer(self, phase: str) -> MetricReducer:
        try:
            return self._reducers[phase]
        except KeyError:
            names = [a.name for a in self.publisher.adapters]
            raise MetricsError(
                f"none of the adapters {names} publishes the {phase!r} phase; fix: add one that does "
                "(e.g. 'validation' for val/reward_avg)"
            ) from None

    def _publish(self, frame: Frame) -> Frame:
        if not self._started:
            self.on_run_start()
        self.publisher.publish(frame)
        self.last_frame = frame
        return frame

    def __enter__(self) -> MetricsCallback:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        self.on_run_end(failed=exc_type is not None, error=exc)


def _throughput(perf: object) -> Throughput | None:
    if isinstance(perf, Throughput):
        return perf
    if perf is False or perf is None:
        return None
    if perf is True:
        return Throughput()
    if isinstance(perf, Mapping):
        allowed = {"timers", "params", "flops_per_token", "peak_flops", "memory"}
        unknown = sorted(set(map(str, perf)) - allowed)
        if unknown:
            raise MetricsError(f"perf: unknown option(s) {unknown}; it takes {sorted(allowed)}")
        timers = perf.get("timers", ())
        if isinstance(timers, str):
            timers = [timers]
        return Throughput(**{**plain(dict(perf)), "timers": list(timers)})
    raise MetricsError(f"perf={perf!r:.60}; fix: True, False, or a mapping such as {{params: 7.0e+9, timers: [generation]}}")


def build_callback(config: Mapping[str, Any]) -> MetricsCallback:
    """The callback from a plain config dict (the same shape Hydra instantiates), without Hydra.

    >>> cb = build_callback({"_target_": "posttrain_metrics.callbacks.MetricsCallback",
    ...                      "adapters": ["grpo"], "sinks": [{"type": "memory"}]})
    >>> [s.name for s in cb.sinks]
    ['memory']
    """
    options = plain(dict(config))
    target = options.pop("_target_", None)
    if target not in (None, "posttrain_metrics.callbacks.MetricsCallback",
                      "posttrain_metrics.callbacks.generic.MetricsCallback"):
        raise MetricsError(f"_target_ {target!r} is not posttrain_metrics.callbacks.MetricsCallback")
    allowed = {"adapters", "sinks", "out_dir", "run_name", "run_id", "local", "publisher", "close_timeout",
               "total_steps", "extra", "samples_per_step", "sample_max_chars", "perf", "health"}
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise MetricsError(f"unknown callback option(s) {unknown}; it takes {sorted(allowed)}")
    if "adapters" not in options:
        raise MetricsError("the callback config needs adapters, e.g. adapters: [grpo, reward, trainer]")
    return MetricsCallback(**options)
