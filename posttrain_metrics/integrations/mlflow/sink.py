"""The MLflow sink: one MLflow run per training run (what it shows and how it fails: the package
docstring). It finds or creates the run, turns frames into batches and closes the run; sending them
is :mod:`.sender`'s job."""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...core.errors import MetricsError
from ...core.frame import Frame
from ...core.keys import KeyInfo
from ...core.log import get_logger
from ...core.redact import key_text, param_text, redact, redact_text
from ...core.summary import RunSummary
from ..base import RunInfo, Sink
from ..factory import run_path
from ..views import MLFLOW_VIEW_TAG, mlflow_view_state
from .direct import DIRECT_POINTS, _SqlitePoints
from .names import (
    _SAFE_ID,
    ADAPTERS_TAG,
    DEFAULT_EXPERIMENT,
    HTTP_BACKOFF_FACTOR,
    HTTP_MAX_RETRIES,
    HTTP_TIMEOUT,
    KIND,
    KIND_TAG,
    MLFLOW_USER_TAG,
    REASON_TAG,
    RUN_ID_TAG,
    RUN_PREFIX,
    STATUS_TAG,
    _Names,
    _params,
    _truncate,
    _user,
)
from .sender import _Batch, _Sender, _span
from .store import _client, _import_mlflow, _sqlite_artifacts, mlflow_points

if TYPE_CHECKING:
    from .tables import SampleTables

__all__ = ["MlflowSink"]

# What happens to the tracker (a server down at close, a run deleted meanwhile, a tag it refuses) is
# logged; a warning (:mod:`.names`) is for what the user passed: a name or value MLflow cannot hold.
log = get_logger("integrations.mlflow")


class MlflowSink(Sink):
    """Publishes frames to an MLflow run through :class:`mlflow.MlflowClient` (no global state, so
    several sinks can coexist), with MLflow's asynchronous batch logging. See the package docstring
    for what MLflow shows and the failure policy.

    >>> sink = MlflowSink(dir="runs/demo", experiment_name="grpo-sweep")  # no I/O, no mlflow import yet
    >>> sink.name, sorted(sink.stores_nonfinite)
    ('mlflow', ['nan'])
    """

    name = "mlflow"
    config_type = "mlflow"  # rebuilt from its options in the publisher process
    path_options = ("dir",)
    stores_nonfinite = frozenset({"nan"})

    def __init__(
        self,
        *,
        tracking_uri: str | None = None,
        dir: str | os.PathLike[str] = "runs",  # the directory of the embedded store
        experiment_name: str | None = None,
        run_name: str | None = None,
        tags: Mapping[str, str] | None = None,
        run_id: str | None = None,
        http_max_retries: int | None = None,
        http_timeout: int | None = None,
        http_backoff_factor: int | None = None,
        max_pending: int = 4,
        backlog: int = 1000,
        drain_timeout: float = 60.0,
    ) -> None:
        for arg, value, low in (("http_max_retries", http_max_retries, 0), ("http_timeout", http_timeout, 1),
                                ("http_backoff_factor", http_backoff_factor, 0), ("max_pending", max_pending, 1),
                                ("backlog", backlog, 1)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise MetricsError(
                    f"MlflowSink({arg}={value!r}): must be an int >= {low} (got {type(value).__name__}); "
                    f"fix: pass a whole number{' of seconds' if arg == 'http_timeout' else ''}"
                )
        if not (isinstance(drain_timeout, (int, float)) and drain_timeout >= 0):
            raise MetricsError(f"MlflowSink(drain_timeout={drain_timeout!r}): must be a number of seconds >= 0")
        self._uri_arg = tracking_uri
        self.tracking_uri = tracking_uri  # the URI in use once started
        self.dir = Path(dir)
        self.experiment = experiment_name
        self.run_name = run_name
        self.tags = dict(tags or {})
        self.run_id = run_id
        self._run_id_arg = run_id
        self.http_max_retries = http_max_retries
        self.http_timeout = http_timeout
        self.http_backoff_factor = http_backoff_factor
        self.max_pending = max_pending
        self.backlog = backlog
        self.drain_timeout = float(drain_timeout)
        self.experiment_id: str | None = None
        # Counters a caller (or the doctor) can read: batches rejected by MLflow as invalid,
        # frames that were not confirmed at close.
        self.rejected = 0
        self.unconfirmed = 0
        self._client: Any = None
        self._entities: Any = None
        self._sender: _Sender | None = None  # the requests in flight and held, from start()
        self._direct: _SqlitePoints | None = None  # a SQLite store's points, written straight in
        self._labels: dict[str, str] = {}  # tag -> the last label ("" once a frame of its phase lacks it)
        self._label_phase: dict[str, tuple[str, str]] = {}  # key -> (tag, phase of the frame that held it)
        self._summary: RunSummary | None = None
        self._last_step = 0
        self._last_wall = 0.0  # wall time of the latest frame: the run's end time in MLflow
        self._closed = False
        self._batched = False
        self._param_limit = self._tag_limit = 0
        self._max_metrics = self._max_tags = self._max_entities = 0
        self._metric_names: _Names | None = None
        self._tag_names: _Names | None = None
        self._tables: SampleTables | None = None  # the completions tables, from the first write_samples
        self._gone = False  # the run was deleted meanwhile (asked when a batch is rejected)
        self._gone_asked = 0  # the rejected count when that was last asked

    @property
    def degraded(self) -> bool:
        """Whether the last batch failed: frames are held and a probe is sent per step."""
        return self._sender is not None and self._sender.degraded

    # ------------------------------------------------------------------ start
    def start(self, run: RunInfo) -> None:
        if self._client is not None:
            raise MetricsError("MlflowSink.start() was called twice; fix: use one sink per run")
        mlflow = _import_mlflow()
        from mlflow.entities import Metric, Param, RunTag
        from mlflow.exceptions import MlflowException
        from mlflow.utils import validation as checks
        from mlflow.utils.async_logging import run_operations

        probe: Any = run_operations.RunOperations  # untyped
        if not hasattr(probe(None), "_operation_futures"):  # polled without blocking: see _futures
            raise MetricsError(
                f"mlflow {mlflow.__version__}: RunOperations has no futures to poll; fix: "
                "pip install 'mlflow>=3.5,<3.18' (the versions this sink is tested with)"
            )

        validation: Any = checks  # MLflow's own name rules and limits, untyped

        def valid(name: str) -> bool:
            return bool(name) and bool(validation.validate_param_and_metric_name(name)) and not (
                validation.path_not_unique(name)
            )

        limit = validation.MAX_ENTITY_KEY_LENGTH
        self._entities = (Metric, Param, RunTag)
        self._max_metrics = validation.MAX_METRICS_PER_BATCH
        self._max_tags = validation.MAX_PARAMS_TAGS_PER_BATCH
        self._max_entities = validation.MAX_ENTITIES_PER_BATCH
        self._param_limit = validation.MAX_PARAM_VAL_LENGTH
        self._tag_limit = validation.MAX_TAG_VAL_LENGTH
        self._metric_names = _Names("metric", valid, limit, run.keys)
        self._tag_names = _Names("tag", valid, limit, run.keys)
        param_names = _Names("param", valid, limit, {})

        self.tracking_uri, embedded = self._resolve_uri()
        if self.tracking_uri.startswith(("http://", "https://")):
            self._configure_http()
        client = _client(self.tracking_uri)

        # Which run: the one named by run_id, else the one tagged with the publisher's run id (a
        # restarted job resumes its run), else a new one.
        existing = None
        if self.run_id is None and self._run_id_arg is None and os.environ.get("MLFLOW_RUN_ID"):
            self.run_id = os.environ["MLFLOW_RUN_ID"]  # MLflow's own convention for "log to this run"
        if self.run_id is not None:
            existing = client.get_run(self.run_id)
            self.experiment_id = str(existing.info.experiment_id)
        else:
            self.experiment_id = self._experiment(client, MlflowException, embedded)
            if _SAFE_ID.match(run.run_id):
                found = client.search_runs(
                    [self.experiment_id], filter_string=f"tags.`{RUN_ID_TAG}` = '{run.run_id}'", max_results=1
                )
                existing = found[0] if found else None

        self._share_view(client, MlflowException, run.keys)
        tags = {RUN_ID_TAG: run.run_id, ADAPTERS_TAG: ",".join(run.adapters), MLFLOW_USER_TAG: _user()}
        for key, value in self.tags.items():  # the user's tags are stored like the config: redacted
            name, shown = key_text(str(key)), str(redact(str(key), str(value)))
            tags[self._tag_names(name)] = _truncate(shown, self._tag_limit, "tag", name)
        logged: Mapping[str, str] = {}
        if existing is None:
            created = client.create_run(
                self.experiment_id, tags=tags, run_name=redact_text(self.run_name) if self.run_name else run.name,
                start_time=int(run.started * 1000) if run.started > 0 else None,
            )
            self.run_id = created.info.run_id
            tags = {}
        else:
            self.run_id = existing.info.run_id
            client.update_run(self.run_id, status="RUNNING")
            if MLFLOW_USER_TAG in existing.data.tags:  # the user who created the run stays recorded
                tags.pop(MLFLOW_USER_TAG, None)
            logged = existing.data.params
        self._client = client
        self._direct = direct = _SqlitePoints.find(client)
        if direct is not None:  # a SQLite store's points, written straight in: larger requests
            self._max_metrics = DIRECT_POINTS
            self._max_entities = DIRECT_POINTS + 2 * self._max_tags
        self._sender = _Sender(client, str(self.run_id), self._entities, direct=direct, max_pending=self.max_pending,
                               backlog=self.backlog, limits=(self._max_metrics, self._max_tags, self._max_entities),
                               where=redact_text(str(self.tracking_uri)), rejected=self._rejected,
                               batched=self._batched)

        self._summary = RunSummary(run.keys)
        params: list[tuple[str, str]] = []
        for key, setting in _params(run.config_tree).items():
            pname = param_names(key)
            text = _truncate(param_text(setting), self._param_limit, "param", key)
            if pname in logged:  # params cannot change in MLflow: a resumed run keeps the first value
                if logged[pname] != text:
                    log.warning(
                        f"mlflow: run {self.run_id} already has param {pname}={logged[pname]!r}; MLflow "
                        f"params cannot change, so the resumed value {text!r} is not logged"
                    )
                continue
            params.append((pname, text))
        size = validation.MAX_PARAMS_TAGS_PER_BATCH
        tag_items = list(tags.items())
        for i in range(0, max(len(params), len(tag_items)), size):
            self._queue(_Batch([], [], tag_items[i : i + size], params[i : i + size]))

    def _resolve_uri(self) -> tuple[str, bool]:
        """The tracking URI, and whether it is the embedded default."""
        if self._uri_arg:
            return self._uri_arg, False
        env = os.environ.get("MLFLOW_TRACKING_URI")
        if env:
            return env, False
        self.dir.mkdir(parents=True, exist_ok=True)
        store = run_path(self.dir, "mlflow.db")  # the journal's rule: a symlink out of dir is refused
        return "sqlite:///" + store.resolve().as_posix(), True

    def _configure_http(self) -> None:
        settings = ((HTTP_MAX_RETRIES, self.http_max_retries), (HTTP_TIMEOUT, self.http_timeout),
                    (HTTP_BACKOFF_FACTOR, self.http_backoff_factor))
        for (var, default), explicit in settings:
            if explicit is not None:
                os.environ[var] = str(explicit)  # an explicit argument wins over the environment
            else:
                os.environ.setdefault(var, str(default))  # never clobber the user's own setting

    def experiment_name(self) -> str:
        """The experiment the run goes to: ``experiment_name``, else ``MLFLOW_EXPERIMENT_NAME``, else
        ``posttrain-metrics``."""
        return self.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT

    def run_settings(self) -> dict[str, Any]:
        """The experiment, recorded in the journal header (``export --to mlflow`` replays into it)."""
        return {"experiment_name": self.experiment_name()}

    def _experiment(self, client: Any, error: type[Exception], embedded: bool) -> str:
        name = self.experiment_name()
        found = client.get_experiment_by_name(name)
        if found is not None:
            if KIND_TAG not in (found.tags or {}):  # an experiment of ours from before, or made by hand
                try:
                    client.set_experiment_tag(found.experiment_id, KIND_TAG, KIND)
                except error as exc:  # not allowed to tag it: the UI's default view is all we lose
                    log.warning(f"mlflow: could not tag experiment {name!r} with {KIND_TAG}={KIND} "
                                f"({redact_text(str(exc))[:200]}); its page may open on MLflow's GenAI overview")
            return str(found.experiment_id)
        location = _sqlite_artifacts(self.tracking_uri or "")
        try:
            # Tagged as model development: MLflow 3's UI otherwise opens a new experiment as a GenAI
            # one (traces and evaluations) and hides the metric charts this run is made of.
            return str(client.create_experiment(name, artifact_location=location,
                                                tags={KIND_TAG: KIND}))
        except error:  # created meanwhile by another process
            found = client.get_experiment_by_name(name)
            if found is None:
                raise
            return str(found.experiment_id)

    def _share_view(self, client: Any, error: type[Exception], keys: Mapping[str, KeyInfo]) -> None:
        """The experiment's shared view (:mod:`.views`): the runs table opened by :func:`mlflow_link`
        shows the headline keys and their ``run/`` aggregates, where MLflow shows every metric hidden."""
        state = json.dumps(mlflow_view_state(keys), separators=(",", ":"))
        try:
            client.set_experiment_tag(self.experiment_id, MLFLOW_VIEW_TAG, state)
        except error as exc:  # not allowed to tag it: the link then opens the table as MLflow shows it
            log.warning(f"mlflow: could not store the experiment's view ({redact_text(str(exc))[:200]}); "
                        "its runs table shows the metric columns once chosen under Columns")

    # ------------------------------------------------------------------ write
    def write(self, frame: Frame) -> None:
        if self._client is None or self._metric_names is None or self._tag_names is None:
            raise MetricsError("MlflowSink.write() before start(); fix: call start() (the publisher does)")
        if self._closed:
            raise MetricsError("MlflowSink.write() after close(); fix: start a new sink for a new run")
        stamp = int(frame.wall_time * 1000) if frame.wall_time > 0 else int(time.time() * 1000)
        names = self._metric_names
        metrics: list[tuple[str, float, int, int]] = []
        tags: list[tuple[str, str]] = []
        for key, value in frame.metrics.items():
            if isinstance(value, str):  # a label: a tag, never a metric value
                tag = self._tag_names(key)
                self._label_phase[key] = (tag, frame.phase)
                if self._labels.get(tag) != value:
                    self._labels[tag] = value
                    tags.append((tag, value))
                continue
            metrics.append((names(key), float(value), stamp, frame.step))
        # A categorical key absent from a frame of its phase has no label for that window (an applied
        # update has no skip_reason): its tag is emptied, never left naming a reason that no longer holds.
        for key, (tag, phase) in list(self._label_phase.items()):
            if phase == frame.phase and key not in frame.metrics:
                del self._label_phase[key]
                self._labels[tag] = ""
                tags.append((tag, ""))
        if self._summary is not None:
            self._summary.add(frame)
        self._last_step = max(self._last_step, frame.step)
        if frame.wall_time > 0 and math.isfinite(frame.wall_time):
            self._last_wall = max(self._last_wall, frame.wall_time)
        if self._sender is not None:
            self._sender.reap()
        if metrics or tags:
            self._queue(_Batch([frame.step], metrics, tags))

    # ------------------------------------------------------------------ close
    def close(self, *, failed: bool = False, killed: bool = False, interrupted: bool = False,
              reason: str = "") -> None:
        """Drain, then set the status: ``FINISHED``, ``FAILED``, or ``KILLED`` for a run that was
        interrupted (Ctrl-C) or never closed (its trainer was killed; the publisher replayed its
        journal). An interrupted run, or one with a ``reason`` (why it failed), is also tagged
        ``posttrain_metrics.status`` and ``posttrain_metrics.end_reason``."""
        if self._closed:
            return
        self._closed = True
        if self._client is None:
            return
        self._flush_tables()
        self._queue_aggregates()
        assert self._sender is not None
        waiting = self._sender.drain(time.monotonic() + self.drain_timeout)
        steps = sorted(step for b in waiting for step in b.steps)
        self.unconfirmed = len(steps)
        if waiting:
            params = sum(len(b.params) for b in waiting)
            log.warning(
                f"mlflow: {len(steps)} frame(s) (steps {_span(steps)}) and {params} param(s) were not "
                f"confirmed by {redact_text(str(self.tracking_uri))} when close() stopped waiting (drain_timeout="
                f"{self.drain_timeout:g}s, or the server is down); the journal holds them: "
                "`posttrain-metrics export` replays them"
            )
        status = "KILLED" if killed or interrupted else "FAILED" if failed else "FINISHED"
        if self.degraded:
            log.warning(
                f"mlflow: {redact_text(str(self.tracking_uri))} is unreachable; run {self.run_id} keeps status RUNNING "
                f"(could not set it to {status})"
            )
            return
        if self._run_gone():
            return  # deleted or removed meanwhile: warned at the first rejected batch, nothing to close
        _, _, run_tag = self._entities
        if interrupted or reason:  # how and why it ended, where the status alone cannot say
            word = "killed" if killed else "interrupted" if interrupted else "failed" if failed else "finished"
            self._client.log_batch(self.run_id, tags=[run_tag(STATUS_TAG, word),
                                                      *([run_tag(REASON_TAG, reason[:5000])] if reason else [])])
        if self._labels:  # batches may land out of order: make the tags hold the last labels
            self._client.log_batch(self.run_id, tags=[run_tag(k, v) for k, v in self._labels.items() if v])
            for tag in [k for k, v in self._labels.items() if not v]:  # no label at the end: no tag
                with contextlib.suppress(Exception):  # already gone: nothing stale is left either way
                    self._client.delete_tag(self.run_id, tag)
        # the run ends when training did (its last frame), not when the publisher finished draining
        # and attaching the record, seconds later: MLflow's duration is then the training span
        end = int(self._last_wall * 1000) if self._last_wall > 0 else None
        self._client.set_terminated(self.run_id, status=status, end_time=end)

    def _run_gone(self) -> bool:
        """Whether the run was deleted or removed (by hand, or by ``mlflow gc``) while it was written:
        asked once MLflow has rejected a batch, and then remembered, so that the files and the status
        still to come are not each refused and warned about again."""
        if self._gone or self._gone_asked == self.rejected:
            return self._gone
        self._gone_asked = self.rejected  # asked again only after another rejection
        try:
            self._gone = str(self._client.get_run(self.run_id).info.lifecycle_stage) != "active"
        except Exception:  # not found: removed for good
            self._gone = True
        return self._gone

    def _flush_tables(self) -> None:
        """The open block of completions written, so that the table view holds the run's last steps
        (each step's own file holds them already); a failure is logged, never raised."""
        if self._tables is None or self.degraded or self._run_gone():
            return
        try:
            self._tables.flush()
        except Exception as exc:
            log.warning(f"mlflow: the last completions table could not be written ({type(exc).__name__}: "
                        f"{redact_text(str(exc))[:200]}); each step's own file holds its rows")

    def _queue_aggregates(self) -> None:
        """The run aggregates (:class:`~posttrain_metrics.core.summary.RunSummary`) as ``run/<key>``
        metrics at the last step, so that the runs table shows the run's maximum ``kl_max``, its
        token-weighted mean loss, its totals and outcome counts, not only each key's last value.
        An infinite aggregate (a maximum that was +inf) is not logged (MLflow would store it as a
        finite 1.8e308); ``run/nonfinite/<key>`` counts the non-finite values seen."""
        summary, names = self._summary, self._metric_names
        if summary is None or names is None or not summary.frames:
            return
        stamp = int(time.time() * 1000)
        values: dict[str, float] = {}
        for key, value in summary.values().items():
            if not isinstance(value, str) and not (isinstance(value, float) and math.isinf(value)):
                values[f"{RUN_PREFIX}{key}"] = float(value)
        for key, count in summary.nonfinite.items():
            values[f"{RUN_PREFIX}nonfinite/{key}"] = float(count)
        # a run aggregate of a renamed key is renamed the same way, and not warned about again: its
        # series was (run/train/kl@0.5 -> run/train/kl_0.5)
        items = [(names(k, report=False), v, stamp, self._last_step) for k, v in values.items()]
        for i in range(0, len(items), self._max_metrics):
            self._queue(_Batch([], items[i : i + self._max_metrics]))
    def attach(self, files: Iterable[Path]) -> None:
        """Attach the run's own record (journal, config, doctor's report, dashboard) as artifacts under
        ``posttrain_metrics/``; the publisher calls it just before ``close``."""
        if self._client is None or self._closed or self.degraded or self._run_gone():
            return
        for path in files:
            self._client.log_artifact(self.run_id, str(path), artifact_path="posttrain_metrics")

    def write_finding(self, event: Mapping[str, Any]) -> None:
        """A live-health finding (:mod:`posttrain_metrics.publication.health`): the metric ``health/<check>``
        (1 at the step it fired; 0 at the run's first step for a check that never fired, at the close) and,
        for a finding, the tag ``health/<check>`` with its step and message. Queued like a frame."""
        if self._client is None or self._closed or self._metric_names is None or self._tag_names is None:
            return
        check, step = str(event["check"]), int(event["step"])
        found = event.get("kind") == "finding"
        metrics = [(self._metric_names(f"health/{check}"), 1.0 if found else 0.0, int(time.time() * 1000), step)]
        tags = []
        if found:
            text = (f"step {step} ({event['severity']}, action {event.get('action', 'warn')}): "
                    f"{event['explanation']} Next: {event['next_step']}")
            tags.append((self._tag_names(f"health/{check}"), text[: self._tag_limit or 5000]))
        self._queue(_Batch([step], metrics, tags))

    def write_samples(self, samples: Any) -> None:
        """A step's sample completions as MLflow tables (:mod:`.tables`): the step's own file
        ``posttrain_metrics/samples/step_<step>.json`` (a replayed step overwrites it) and its rows in
        a block table listed in ``mlflow.loggedArtifacts``, which the UI shows as a table."""
        if self._client is None or self._closed or self.degraded or not samples.rows or self._run_gone():
            return
        if self._tables is None:
            from .tables import SampleTables

            self._tables = SampleTables(self._client, str(self.run_id), limit=self._tag_limit)
        try:
            self._tables.add(samples.step, list(samples.columns), samples.table())
        except Exception as exc:
            # The run deleted by hand before any batch was refused: the completions are the first to
            # find out. Counted and warned as a refused batch (once), not as a failing sink.
            self._gone_asked = -1
            if not self._run_gone():
                raise
            self._rejected(f"the completions of step {samples.step}", exc)

    # ------------------------------------------------------------------ the queue (:mod:`.sender`)
    def _queue(self, batch: _Batch) -> None:
        assert self._sender is not None
        self._sender.queue(batch)

    def ready(self) -> bool:
        """Whether fewer than ``backlog`` frames wait to be sent. A publisher that feeds this sink
        from the journal stops reading while it is not (the journal holds the rest), so a tracker
        that is down costs neither memory nor frames."""
        return self._sender is None or self._sender.ready()

    def end_batch(self) -> None:
        """The publisher's batch ends: send what it wrote, merged into requests up to MLflow's
        limits. Once a publisher calls this, ``write`` only queues and frames go at batch ends."""
        self._batched = True
        if self._sender is not None and not self._closed:
            self._sender.end_batch()

    # ------------------------------------------------------------------ the publisher process
    def held_points(self, run_id: str, name: str, keys: Any) -> Any:
        """The (key, step) points MLflow already holds for the run tagged ``run_id``."""
        _import_mlflow()
        uri, _ = self._resolve_uri()
        if uri.startswith(("http://", "https://")):
            self._configure_http()
        return mlflow_points(uri, run_id, keys)

    def run_handles(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "experiment_id": self.experiment_id, "tracking_uri": self.tracking_uri}

    def _rejected(self, what: str, exc: BaseException) -> None:
        """A batch (or a step's completions) MLflow refused as invalid: counted, not retried, warned about
        the first time only (a run deleted by hand mid-training refuses every later batch the same way:
        one message, not one per batch)."""
        self.rejected += 1
        if self.rejected > 1:
            return
        log.warning(
            f"mlflow: {redact_text(str(self.tracking_uri))} rejected {what} ({redact_text(str(exc))}); it is "
            "not retried, and later rejected batches are not warned about (all are counted in MlflowSink.rejected; "
            "the journal keeps the frames)"
        )
