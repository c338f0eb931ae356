"""The MLflow sink: one MLflow run per training run, written off the training thread.

What MLflow shows
-----------------
- **Metrics**: every numeric key of every frame under its public name (``train/loss_avg``,
  ``val/loss_avg``, ``optim/optimizer_step``), at the frame's step, with the frame's wall time as
  the timestamp. Bools and ints are logged as numbers (``optim/step_skipped`` is 0/1). A key absent
  from a frame is absent from that step's history: nothing is zero-filled (PPO's critic-warmup
  steps have no policy points).
- **Categorical keys** (``optim/update_outcome``, ``optim/skip_reason``): a run tag with the last
  label (``optim/update_outcome = skipped``), plus one 0/1 metric per label
  (``optim/update_outcome/skipped``) so outcomes chart. A string is never passed as a metric value.
  A key absent from a later frame of its phase (``optim/skip_reason`` after an applied update) has
  its tag emptied, and removed at close: the tag never names a reason that no longer holds.
- **Run aggregates**: at close, ``run/<key>`` metrics at the last step from
  :class:`~posttrain_metrics.core.summary.RunSummary` (token-weighted run means, totals, maxima and
  minima, the last value of last-value keys, counts per label), so the runs table shows the run's
  maximum ``kl_max`` next to its last value. They cover the frames this sink was given (infinite
  values are removed upstream for MLflow, so a maximum is the largest finite value);
  ``run/nonfinite/<key>`` counts NaN values.
- **Params**: the run's config, nested keys joined with ``/`` (``rl/kl_beta``), a list as one param
  in JSON (``optim/betas = [0.9, 0.95]``, never ``optim/betas/0``), other values as
  ``mlflow.log_param`` writes them (``True``, ``None``); already redacted at every depth (passwords,
  tokens, API keys and the password of a ``user:password@`` URI read ``***REDACTED***``). Values longer than
  MLflow's ``MAX_PARAM_VAL_LENGTH`` (6000 characters) are truncated with a warning (the journal
  keeps the full value); params go in batches of ``MAX_PARAMS_TAGS_PER_BATCH``.
- **Tags**: ``posttrain_metrics.run_id`` (the publisher's run id, used to resume),
  ``posttrain_metrics.adapters``, ``mlflow.user`` (the user who created the run, as MLflow's
  ``start_run`` records it; kept when the run is resumed), and the ``tags`` you pass. The run name is ``run_name`` or the
  publisher's.
- **Status**: ``FINISHED``; ``FAILED`` when the run ends with ``close(failed=True)`` (the
  publisher passes that when training raised); ``KILLED`` for a run that never closed (its journal
  has no end record: the trainer was killed), as the doctor reports it.

Non-finite values
-----------------
MLflow's SQL stores (the embedded ``sqlite:///`` store and a tracking server on any SQL backend)
keep NaN faithfully (an ``is_nan`` column; ``get_metric_history`` returns ``nan``), but store +inf
and -inf as ±1.7976931348623157e308, which reads back as a finite number. Both were checked against
MLflow 3.17.2, server and embedded. So this sink declares ``stores_nonfinite = {"nan"}``: NaN is
logged as NaN; an infinite value is not logged, and ``health/nonfinite/<key>`` counts how many
were skipped (one warning per key). The journal keeps the exact values.

Names
-----
MLflow accepts names of alphanumerics, ``_ - . /``, spaces (and ``:`` except on Windows), at most
``MAX_ENTITY_KEY_LENGTH`` (250) characters, that do not change under path normalisation (no ``//``,
no leading or trailing ``/``, no ``.`` or ``..`` segment). A metric, param or tag name it would
reject is mapped to a valid one, never dropped: other characters become ``_``, empty and dot
segments are removed or replaced, an over-long name is cut and given a short hash
(``train/kl@0.5`` -> ``train/kl_0.5``). Each mapping is warned about once.

Reliability and retries
-----------------------
``write`` turns a frame into one batch and hands it to MLflow's own asynchronous batch logging
(``MlflowClient.log_batch(..., synchronous=False)``), or for a SQLite store to the sink's writer
thread (below); the caller never waits on the network or the disk. Fed
by the publisher (the default: a process of its own that tails the journal), ``write`` only queues
and the publisher's ``end_batch`` sends what accumulated, merged into requests up to MLflow's batch
limits (``MAX_METRICS_PER_BATCH``): one request of 1000 points costs about as much as four of 40.

At most ``max_pending`` requests are in flight. When a request fails (server down, timeout) the sink
warns once and is *degraded*: it holds frames, sends one request at a time as a probe, and when a
probe lands resends everything held. Nothing is dropped: once ``backlog`` frames are held,
``ready()`` is false and the publisher stops reading the journal for this sink until MLflow answers
again (the journal is the queue; a sink written directly holds every frame). Resending is exact: MLflow
identifies a point by (key, step, timestamp, value) and ignores a duplicate, and the timestamp is
the frame's wall time, so a request that reached the server before its reply was lost, or a replay
of the journal by ``posttrain-metrics export``, stores nothing twice. A request MLflow rejects as
invalid (HTTP 400/404: a run deleted or removed meanwhile) is not retried; it is warned about and
counted in ``rejected``.

A ``sqlite:///`` store (the embedded default, or a SQLite file you name) is written more cheaply:
its metric points go straight into MLflow's tables, on a writer thread of the sink, one transaction
per request of up to :data:`DIRECT_POINTS` points (:class:`_SqlitePoints`: what ``log_batch``
stores, checked against it by the tests). ``log_batch`` builds an ORM object per point, about 10 ms
of CPU per 61-key frame, which on a 2-core machine is most of the core the trainer does not use; the
direct write costs about 1 ms. Params and tags still go through ``log_batch``, on the same thread.
Where MLflow's tables are not the shape it writes (another MLflow version), or a logged model is
active (``log_batch`` files the points under it too), ``log_batch`` is used. Its failures are
MLflow's own errors, handled as above: a run deleted or removed meanwhile is rejected; a database
locked by another writer is waited for 20 s (MLflow's busy timeout), then retried.

``close`` drains: it waits up to ``drain_timeout`` seconds for every request to be confirmed (or
less, when the server is down and a probe sent during ``close`` fails too), warns about frames that
were not confirmed (the journal has them; ``posttrain-metrics export`` replays them), re-sets the
label tags to the last labels (requests may land out of order) and sets the status. When the server
is unreachable at the end, the run keeps status ``RUNNING`` and a warning says so.

MLflow's HTTP client retries a failed request for about 4 minutes by default. For an ``http(s)``
tracking URI this sink sets, for the process (MLflow reads them from the environment at every
request; there is no per-client setting):

=====================================  =======  ==============================
environment variable                   default  constructor argument
=====================================  =======  ==============================
``MLFLOW_HTTP_REQUEST_MAX_RETRIES``    2        ``http_max_retries``
``MLFLOW_HTTP_REQUEST_TIMEOUT``        20 s     ``http_timeout``
``MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR`` 1        ``http_backoff_factor``
=====================================  =======  ==============================

A variable you already set in the environment is left alone; an explicit constructor argument
overrides it. With the defaults a refused connection costs a batch about 3 s and an unresponsive
server about a minute, on MLflow's worker threads, never on the training step (MLflow's own
defaults: 7 retries, 120 s timeout, factor 2, about 4 minutes for a refused connection). ``start``
(which finds or creates the run) and ``close`` are synchronous and bounded by the same settings.

Where the run goes: ``tracking_uri`` if given, else ``MLFLOW_TRACKING_URI`` from the environment,
else an embedded SQLite store ``sqlite:///<dir>/mlflow.db`` (no server; artifacts, as for any SQLite store, under
``<dir>/mlartifacts``; browse it with ``mlflow ui --backend-store-uri sqlite:///<dir>/mlflow.db``).
The experiment is ``experiment_name`` (``experiment``, its older name, is accepted), else
``MLFLOW_EXPERIMENT_NAME``, else ``posttrain-metrics``; it is tagged
``mlflow.experimentKind = custom_model_development`` (set on an existing experiment without it),
which MLflow 3's UI reads to open the experiment on its runs table with metric charts rather than
its GenAI overview (MLflow 3.17's UI obeys its own per-browser "GenAI / Model training" switch first:
``#/experiments/<id>/runs?workflowType=machine_learning&viewStateShareKey=posttrain-metrics`` is
the link that opens the runs table, with the headline columns of the experiment's shared view:
:mod:`.views`).
``run_id``, else ``MLFLOW_RUN_ID``, targets an existing MLflow run; otherwise a run tagged with the
publisher's run id is resumed when one exists in the experiment (a restarted job continues its run), and a new run is
created when none does.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import getpass
import hashlib
import inspect
import json
import math
import os
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import MetricsError
from ..core.frame import Frame
from ..core.keys import KeyInfo
from ..core.redact import key_text, param_text, redact, redact_text
from ..core.summary import RunSummary
from ..core.warn import warn
from .base import Points, RunInfo, Sink
from .factory import run_path
from .views import MLFLOW_VIEW_TAG, mlflow_view_state

if TYPE_CHECKING:
    from .mlflow_tables import SampleTables

__all__ = ["MlflowSink"]

INSTALL = "pip install 'posttrain-metrics[mlflow]'"
DEFAULT_EXPERIMENT = "posttrain-metrics"
RUN_ID_TAG = "posttrain_metrics.run_id"
ADAPTERS_TAG = "posttrain_metrics.adapters"
STATUS_TAG = "posttrain_metrics.status"
"""``interrupted`` (Ctrl-C: MLflow's status says KILLED) or ``failed``, set when the run says why."""
REASON_TAG = "posttrain_metrics.end_reason"
"""Why the run failed or was interrupted: the exception's type and message, redacted."""
RUN_PREFIX = "run/"
"""The run aggregates are logged at close as ``run/<key>`` metrics."""
MLFLOW_USER_TAG = "mlflow.user"  # what MLflow's fluent API records as the run's user
# What MLflow 3's UI reads to choose an experiment's page: "custom_model_development" opens the runs
# table with metric charts; without it the UI may infer a GenAI experiment (traces, evaluations).
KIND_TAG = "mlflow.experimentKind"
KIND = "custom_model_development"

# MLflow's HTTP settings as (environment variable, our default): see the module docstring.
HTTP_MAX_RETRIES = ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", 2)
HTTP_TIMEOUT = ("MLFLOW_HTTP_REQUEST_TIMEOUT", 20)
HTTP_BACKOFF_FACTOR = ("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", 1)

# Characters kept when a name is mapped (a subset of what MLflow accepts on every OS).
_MAP_BAD = re.compile(r"[^/\w.\- ]")
_SAFE_ID = re.compile(r"^[A-Za-z0-9_.-]+$")


def _import_mlflow() -> Any:
    try:
        import mlflow
    except ImportError as exc:
        raise ModuleNotFoundError(
            f"the MLflow sink needs the mlflow package, which is not importable ({exc}); fix:\n"
            f"{INSTALL}"
        ) from exc
    return mlflow


@dataclasses.dataclass
class _Batch:
    """What goes to MLflow in one request: the points and changed label tags of one or more frames,
    or a slice of params.

    Plain tuples, not MLflow entities, so that held batches stay small; a point's timestamp is
    fixed when it is built, so that a resent point is recognised by MLflow as the same point.
    """

    steps: list[int]  # the frames' steps, for messages; empty for a params batch
    metrics: list[tuple[str, float, int, int]]  # key, value, timestamp (ms), step
    tags: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    params: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    def size(self) -> int:
        return len(self.metrics) + len(self.tags) + len(self.params)


class _Names:
    """Maps names MLflow would reject to valid ones: computed once per name, warned once."""

    def __init__(self, kind: str, valid: Any, limit: int, reserved: Mapping[str, object]) -> None:
        self.kind = kind
        self.valid = valid
        self.limit = limit
        self.reserved = reserved  # names that must not be produced by a mapping (declared keys)
        self.names: dict[str, str] = {}
        self.mapped: dict[str, str] = {}  # mapped name -> original

    def __call__(self, name: str, *, report: bool = True) -> str:
        out = self.names.get(name)
        if out is not None:
            return out
        if self.valid(name) and len(name) <= self.limit:
            out = name
        else:
            out = self._map(name)
            if report:
                warn(
                    f"mlflow: {self.kind} name {name!r} is not a valid MLflow name (MLflow takes "
                    f"alphanumerics, '_', '-', '.', '/', spaces, no empty or dot path segments, at most "
                    f"{self.limit} characters); logged as {out!r}",
                    stacklevel=4,
                )
            self.mapped[out] = name
        self.names[name] = out
        return out

    def _map(self, name: str) -> str:
        digest = hashlib.sha1(name.encode("utf-8")).hexdigest()[:8]
        # Empty segments (a leading, trailing or doubled "/") go; "." and ".." segments become "_".
        parts = [p if p.strip(" ") not in (".", "..") else "_"
                 for p in _MAP_BAD.sub("_", name).split("/") if p.strip(" ")]
        out = "/".join(parts) or "_"
        if len(out) > self.limit or out in self.reserved or out in self.mapped or out in self.names:
            out = f"{out[: self.limit - 9].rstrip('/')}-{digest}"  # too long, or taken: made unique
        if not self.valid(out):
            out = f"key-{digest}"
        return out


def _sqlite_file(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI; None for any other URI and for an in-memory store."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///"):].split("?", 1)[0]
    if not path or path == ":memory:":
        return None
    return Path(path).resolve()


def _sqlite_artifacts(uri: str) -> str | None:
    """Where a new experiment of a ``sqlite:///`` store keeps its artifacts: ``mlartifacts`` next to
    the database file (the embedded default's and any explicit SQLite file's), never MLflow's own
    default of ``./mlruns`` in whatever directory the trainer happens to run from. None (the
    server's or store's own default) for every other URI."""
    path = _sqlite_file(uri)
    return (path.parent / "mlartifacts").as_uri() if path is not None else None


@contextlib.contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    """Hold ``<database>.lock`` (an exclusive ``flock``) while a ``sqlite:///`` store is opened.

    Opening a store creates MLflow's tables and runs its schema migrations when they are missing, with
    no lock of MLflow's own: runs of a sweep that open one fresh file at once race (``duplicate column
    name: step``, ``table experiments already exists``) and the losers never reach the store. Under
    the lock one process creates the schema and the others find it complete. A no-op for other URIs,
    and where ``fcntl`` is missing (Windows)."""
    path = _sqlite_file(uri)
    try:
        import fcntl
    except ImportError:
        path = None
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file is closed
        yield


def _client(uri: str) -> Any:
    """An ``MlflowClient`` for ``uri``; it opens the store (creating its schema if need be) under
    :func:`_store_lock`."""
    from mlflow.tracking import MlflowClient

    with _store_lock(uri):
        return MlflowClient(tracking_uri=uri)


DIRECT_POINTS = 5000
"""The most metric points in one request written straight into a SQLite store (:class:`_SqlitePoints`):
a transaction's fixed cost (its commit) is spread over more points than MLflow's 1000 per request."""


class _SqlitePoints:
    """Metric points written straight into the tables of an MLflow ``sqlite:///`` store, in one
    transaction per request: MLflow's own ``log_batch`` builds an ORM object per point and costs the
    process about 10 ms of CPU per 61-key frame (76-104 frames/s), which on 2 cores is a core the
    trainer loses; this costs about 1 ms (``benchmarks/bench_export.py``).

    It writes what ``SqlAlchemyStore.log_batch`` writes, with MLflow's own pieces: the store's
    session (its SQLite settings and its error mapping), the installed MLflow's table definitions
    (``SqlMetric``, ``SqlLatestMetric``, ``SqlRun``: MLflow's schema check at start makes the database
    match them) and its ``sanitize_metric_value``. A point already held (same key, step, timestamp,
    value) is skipped, as MLflow skips it; the run's latest value of a key is replaced by a point with
    a greater (step, timestamp, value), as MLflow replaces it; a run that is gone or deleted is refused
    with MLflow's own errors (404 and 400: the sink counts it as rejected, and does not retry); a locked
    database is MLflow's 503 (retried). Used only for a ``SqlAlchemyStore`` on SQLite whose table
    definitions have exactly the columns written here, and no active logged model (``log_batch``
    files points under it too: :meth:`find`); anything else goes through ``log_batch``. The tests
    check it against ``log_batch`` itself, point by point and latest value by latest value.
    """

    COLUMNS = frozenset({"key", "value", "timestamp", "step", "is_nan", "run_uuid"})

    def __init__(self, store: Any, metrics: Any, latest: Any, runs: Any, error: Any, codes: Any,
                 session: Mapping[str, Any] | None = None) -> None:
        self.store, self.metrics, self.latest, self.runs = store, metrics, latest, runs
        self.error, self.codes = error, codes  # MlflowException, MLflow's error codes
        self.session = dict(session or {})  # ManagedSessionMaker's arguments for a write
    @classmethod
    def find(cls, client: Any) -> _SqlitePoints | None:
        """The direct writer for ``client``'s store, or None when it is not a SQLite store of the
        shape this writes (then ``log_batch`` is used)."""
        store = getattr(getattr(client, "_tracking_client", None), "store", None)
        try:
            import mlflow
            from mlflow.exceptions import MlflowException
            from mlflow.protos import databricks_pb2 as codes
            from mlflow.store.tracking.dbmodels.models import SqlLatestMetric, SqlMetric, SqlRun
            from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
        except ImportError:
            return None
        if not isinstance(store, SqlAlchemyStore) or getattr(store, "engine", None) is None:
            return None
        if not callable(getattr(store, "ManagedSessionMaker", None)):
            return None
        # Later MLflows mark a session that writes (read_only=False; their default is True, and under
        # pytest they refuse a read-only session's flush); 3.5 has no such argument, and writes with any.
        try:
            arguments = inspect.signature(store.ManagedSessionMaker).parameters
        except (TypeError, ValueError):
            return None
        session = {"read_only": False} if "read_only" in arguments else {}
        # log_batch also files the points under an active logged model (set in this thread, or for
        # every thread by the environment): it does that, not this
        active = getattr(mlflow, "get_active_model_id", lambda: None)()
        if active or os.environ.get("MLFLOW_ACTIVE_MODEL_ID") or os.environ.get("_MLFLOW_ACTIVE_MODEL_ID"):
            return None
        if store.engine.dialect.name != "sqlite" or not callable(getattr(store, "sanitize_metric_value", None)):
            return None
        metrics: Any = SqlMetric.__table__
        latest: Any = SqlLatestMetric.__table__
        runs: Any = SqlRun.__table__
        if any({c.name for c in t.columns} != cls.COLUMNS for t in (metrics, latest)):
            return None
        if not {"run_uuid", "lifecycle_stage"} <= {c.name for c in runs.columns}:
            return None
        return cls(store, metrics, latest, runs, MlflowException, codes, session)

    def write(self, run_id: str, points: list[tuple[str, float, int, int]]) -> None:
        """Log ``points`` (key, value, timestamp ms, step) to the run, in one transaction."""
        import sqlalchemy as sa

        def rank(row: dict[str, Any]) -> tuple[int, int, float]:  # MLflow's order for a key's latest value
            return row["step"], row["timestamp"], row["value"]

        rows: list[dict[str, Any]] = []
        newest: dict[str, dict[str, Any]] = {}
        sanitize = self.store.sanitize_metric_value
        for key, value, stamp, step in points:
            is_nan, stored = sanitize(value)
            row = {"key": key, "value": stored, "timestamp": stamp, "step": step, "is_nan": is_nan,
                   "run_uuid": run_id}
            rows.append(row)
            old = newest.get(key)
            if old is None or rank(row) > rank(old):
                newest[key] = row
        if not rows:
            return
        latest, runs = self.latest, self.runs
        # MLflow's own session: its SQLite settings (foreign keys on, a 20 s busy timeout) on whichever
        # pooled connection it gets, and its error mapping (a locked or unreachable database is a 503,
        # retried; any other database error a 400, rejected), as for log_batch.
        with self.store.ManagedSessionMaker(**self.session) as session:
            # Read outside the write transaction (SQLite begins it at the first insert): a run that is
            # gone or deleted is refused as log_batch refuses it.
            stage = session.execute(sa.select(runs.c.lifecycle_stage).where(runs.c.run_uuid == run_id)).scalar()
            if stage is None:
                raise self.error(f"Run with id={run_id} not found", self.codes.RESOURCE_DOES_NOT_EXIST)
            if stage != "active":
                raise self.error(f"The run {run_id} must be in the 'active' state. Current state is {stage}.",
                                 self.codes.INVALID_PARAMETER_VALUE)
            # The insert first: it takes SQLite's write lock, so nothing changes the latest values
            # between the read below and their update.
            session.execute(self.metrics.insert().prefix_with("OR IGNORE"), rows)
            keys = list(newest)
            held: dict[str, tuple[int, int, float]] = {}
            for i in range(0, len(keys), 500):  # SQLite builds before 3.32 bind at most 999 values
                held.update((r.key, rank(r._asdict())) for r in session.execute(
                    sa.select(latest.c.key, latest.c.step, latest.c.timestamp, latest.c.value)
                    .where(latest.c.run_uuid == run_id, latest.c.key.in_(keys[i : i + 500]))))
            added = [row for key, row in newest.items() if key not in held]
            # (bound names differ from the columns': SQLAlchemy reserves those for the SET clause)
            changed = [{"k": key, "run": run_id, "v": row["value"], "t": row["timestamp"], "s": row["step"],
                        "n": row["is_nan"]} for key, row in newest.items()
                       if key in held and rank(row) > held[key]]
            if added:
                session.execute(latest.insert(), added)
            if changed:
                session.execute(
                    latest.update()
                    .where(latest.c.run_uuid == sa.bindparam("run"), latest.c.key == sa.bindparam("k"))
                    .values(value=sa.bindparam("v"), timestamp=sa.bindparam("t"), step=sa.bindparam("s"),
                            is_nan=sa.bindparam("n")),
                    changed,
                )


class MlflowSink(Sink):
    """Publishes frames to an MLflow run through :class:`mlflow.MlflowClient` (no global state, so
    several sinks can coexist), with MLflow's asynchronous batch logging. See the module docstring
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
        experiment: str | None = None,  # the same, under its older name
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
        if experiment_name is not None and experiment is not None and experiment_name != experiment:
            raise MetricsError(
                f"MlflowSink(experiment_name={experiment_name!r}, experiment={experiment!r}): two different "
                "experiments; fix: give experiment_name only (experiment is its older name)"
            )
        self._uri_arg = tracking_uri
        self.tracking_uri = tracking_uri  # the URI in use once started
        self.dir = Path(dir)
        self.experiment = experiment_name if experiment_name is not None else experiment
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
        self._pending: collections.deque[tuple[Any, _Batch, int]] = collections.deque()  # ops, batch, seq
        self._sent = 0  # sequence number of the next request
        self._probe_from = 0  # when degraded, only a request sent from this one on proves recovery
        self._held: collections.deque[_Batch] = collections.deque()
        self._degraded = False
        self._failed_probes = 0
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
        self._direct: _SqlitePoints | None = None  # a SQLite store's points, written straight in
        self._writer: concurrent.futures.ThreadPoolExecutor | None = None  # ... on this thread
        self._tables: SampleTables | None = None  # the completions tables, from the first write_samples
        self._gone = False  # the run was deleted meanwhile (asked when a batch is rejected)
        self._gone_asked = 0  # the rejected count when that was last asked

    @property
    def degraded(self) -> bool:
        """Whether the last batch failed: frames are held and a probe is sent per step."""
        return self._degraded

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
            tags[self._tag_names(name)] = self._truncate(shown, self._tag_limit, "tag", name)
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
        self._direct = _SqlitePoints.find(client)
        if self._direct is not None:  # one writer thread: SQLite takes one writer at a time anyway
            self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="posttrain-metrics-mlflow")
            self._max_metrics = DIRECT_POINTS
            self._max_entities = DIRECT_POINTS + 2 * self._max_tags

        self._summary = RunSummary(run.keys)
        params: list[tuple[str, str]] = []
        for key, setting in _params(run.config_tree).items():
            pname = param_names(key)
            text = self._truncate(param_text(setting), self._param_limit, "param", key)
            if pname in logged:  # params cannot change in MLflow: a resumed run keeps the first value
                if logged[pname] != text:
                    warn(
                        f"mlflow: run {self.run_id} already has param {pname}={logged[pname]!r}; MLflow "
                        f"params cannot change, so the resumed value {text!r} is not logged",
                        stacklevel=2,
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
                    warn(f"mlflow: could not tag experiment {name!r} with {KIND_TAG}={KIND} "
                         f"({redact_text(str(exc))[:200]}); its page may open on MLflow's GenAI overview",
                         stacklevel=3)
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
            warn(f"mlflow: could not store the experiment's view ({redact_text(str(exc))[:200]}); "
                 "its runs table shows the metric columns once chosen under Columns", stacklevel=3)

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
        self._reap()
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
        deadline = time.monotonic() + self.drain_timeout
        probes = self._failed_probes
        while self._pending or self._held:
            self._reap()
            if self._degraded and self._failed_probes > probes:
                break  # a probe sent now failed too: do not hold the process up for nothing
            self._pump()
            left = deadline - time.monotonic()
            if left <= 0 or not self._pending:
                break
            futures = _futures(self._pending[0][0])
            concurrent.futures.wait(futures, timeout=min(left, 1.0))
        if self._writer is not None:  # what did not land by now is reported below, not written later
            self._writer.shutdown(wait=False, cancel_futures=True)
        waiting = [b for _, b, _ in self._pending] + list(self._held)
        steps = sorted(step for b in waiting for step in b.steps)
        self.unconfirmed = len(steps)
        if waiting:
            params = sum(len(b.params) for b in waiting)
            warn(
                f"mlflow: {len(steps)} frame(s) (steps {_span(steps)}) and {params} param(s) were not "
                f"confirmed by {redact_text(str(self.tracking_uri))} when close() stopped waiting (drain_timeout="
                f"{self.drain_timeout:g}s, or the server is down); the journal holds them: "
                "`posttrain-metrics export` replays them",
                stacklevel=2,
            )
        status = "KILLED" if killed or interrupted else "FAILED" if failed else "FINISHED"
        if self._degraded:
            warn(
                f"mlflow: {redact_text(str(self.tracking_uri))} is unreachable; run {self.run_id} keeps status RUNNING "
                f"(could not set it to {status})",
                stacklevel=2,
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
        (each step's own file holds them already); a failure is warned about, never raised."""
        if self._tables is None or self._degraded or self._run_gone():
            return
        try:
            self._tables.flush()
        except Exception as exc:
            warn(f"mlflow: the last completions table could not be written ({type(exc).__name__}: "
                 f"{redact_text(str(exc))[:200]}); each step's own file holds its rows", stacklevel=3)

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
        if self._client is None or self._closed or self._degraded or self._run_gone():
            return
        for path in files:
            self._client.log_artifact(self.run_id, str(path), artifact_path="posttrain_metrics")

    def write_samples(self, samples: Any) -> None:
        """A step's sample completions as MLflow tables (:mod:`.mlflow_tables`): the step's own file
        ``posttrain_metrics/samples/step_<step>.json`` (a replayed step overwrites it) and its rows in
        a block table listed in ``mlflow.loggedArtifacts``, which the UI shows as a table."""
        if self._client is None or self._closed or self._degraded or not samples.rows or self._run_gone():
            return
        if self._tables is None:
            from .mlflow_tables import SampleTables

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

    # ------------------------------------------------------------------ the queue
    def _queue(self, batch: _Batch) -> None:
        self._held.append(batch)  # never dropped: see ready() for how a publisher holds back
        if not self._batched:
            self._pump()

    def ready(self) -> bool:
        """Whether fewer than ``backlog`` frames wait to be sent. A publisher that feeds this sink
        from the journal stops reading while it is not (the journal holds the rest), so a tracker
        that is down costs neither memory nor frames."""
        return sum(len(b.steps) for b in self._held) < self.backlog

    def end_batch(self) -> None:
        """The publisher's batch ends: send what it wrote, merged into requests up to MLflow's
        limits. Once a publisher calls this, ``write`` only queues and frames go at batch ends."""
        self._batched = True
        if self._client is not None and not self._closed:
            self._reap()
            self._pump()

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

    def _pump(self) -> None:
        """Send held batches: up to ``max_pending`` in flight when healthy, one (a probe) when
        degraded. Held frames are merged into one request up to MLflow's batch limits: one request
        of 1000 points costs about as much as four of 40, so a backlog drains fast."""
        limit = 1 if self._degraded else self.max_pending
        while self._held and len(self._pending) < limit:
            batch = self._held.popleft()
            while self._held and not self._degraded and self._fits(batch, self._held[0]):
                nxt = self._held.popleft()
                tags = dict(batch.tags)
                tags.update(nxt.tags)  # a tag holds the last label: the later frame's wins
                batch = _Batch(batch.steps + nxt.steps, batch.metrics + nxt.metrics,
                               list(tags.items()), batch.params + nxt.params)
            self._pending.append((self._send(batch), batch, self._sent))
            self._sent += 1

    def _fits(self, a: _Batch, b: _Batch) -> bool:
        return (
            len(a.metrics) + len(b.metrics) <= self._max_metrics
            and len(a.tags) + len(b.tags) <= self._max_tags
            and len(a.params) + len(b.params) <= self._max_tags
            and a.size() + b.size() <= self._max_entities
        )

    def _send(self, batch: _Batch) -> Any:
        """Hand ``batch`` over; what comes back is polled with :func:`_futures`."""
        if self._writer is not None:
            return self._writer.submit(self._write_direct, batch)
        return self._log_batch(batch, metrics=True, synchronous=False)

    def _log_batch(self, batch: _Batch, *, metrics: bool, synchronous: bool) -> Any:
        metric, param, run_tag = self._entities
        return self._client.log_batch(
            self.run_id,
            metrics=[metric(k, v, t, step) for k, v, t, step in batch.metrics] if metrics else [],
            params=[param(k, v) for k, v in batch.params],
            tags=[run_tag(k, v) for k, v in batch.tags],
            synchronous=synchronous,
        )

    def _write_direct(self, batch: _Batch) -> None:
        """On the writer thread: the points straight into the SQLite store, then params and tags
        (few, and rare) through ``log_batch``."""
        assert self._direct is not None and self.run_id is not None
        self._direct.write(self.run_id, batch.metrics)
        if batch.params or batch.tags:
            self._log_batch(batch, metrics=False, synchronous=True)

    def _reap(self) -> None:
        """Collect finished batches (non-blocking); requeue what failed for a transient reason."""
        recovered = False
        while self._pending and all(f.done() for f in _futures(self._pending[0][0])):
            operations, batch, seq = self._pending.popleft()
            errors = [e for e in (f.exception() for f in _futures(operations)) if e is not None]
            if not errors:
                # A request sent before the failure that landed proves nothing about the server now.
                if self._degraded and seq >= self._probe_from:
                    self._degraded = False
                    recovered = True
                continue
            exc = errors[0]
            status = getattr(exc, "get_http_status_code", lambda: 500)()
            if 400 <= status < 500 and status not in (401, 403, 408, 429):  # invalid: resending won't help
                self._rejected(f"the batch of steps {_span(batch.steps)}" if batch.steps else "the batch of params", exc)
                continue
            if self._degraded and seq >= self._probe_from:
                self._failed_probes += 1
            if not self._degraded:
                self._probe_from = self._sent
                warn(
                    f"mlflow: sending to {redact_text(str(self.tracking_uri))} failed ({type(exc).__name__}: {redact_text(str(exc))}); the "
                    f"sink is degraded: frames are held (up to backlog={self.backlog}) and resent when "
                    "the server answers again; training continues",
                    stacklevel=3,
                )
            self._degraded = True
            self._held.appendleft(batch)
        if recovered:
            warn(
                f"mlflow: {redact_text(str(self.tracking_uri))} answers again; resending "
                f"{sum(len(b.steps) for b in self._held)} held frame(s)",
                stacklevel=3,
            )

    def _rejected(self, what: str, exc: BaseException) -> None:
        """A batch (or a step's completions) MLflow refused as invalid: counted, not retried, warned about
        the first time only (a run deleted by hand mid-training refuses every later batch the same way:
        one warning, not one per batch)."""
        self.rejected += 1
        if self.rejected > 1:
            return
        warn(
            f"mlflow: {redact_text(str(self.tracking_uri))} rejected {what} ({redact_text(str(exc))}); it is "
            "not retried, and later rejected batches are not warned about (all are counted in MlflowSink.rejected; "
            "the journal keeps the frames)",
            stacklevel=4,
        )

    @staticmethod
    def _truncate(text: str, limit: int, kind: str, key: str) -> str:
        if len(text) <= limit:
            return text
        warn(
            f"mlflow: {kind} {key!r} is {len(text)} characters, over MLflow's limit of {limit}; "
            "truncated (the journal header keeps the full value)",
            stacklevel=3,
        )
        return text[:limit]


def _user() -> str:
    """The user creating the run, as MLflow's own ``start_run`` records it (``mlflow.user``)."""
    try:
        return getpass.getuser()
    except Exception:  # no login name (a container without passwd entry): MLflow records "unknown"
        return "unknown"


def _params(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings flattened to ``a/b`` parameter names; a list stays one parameter
    (``optim/betas = [0.9, 0.95]``), an empty mapping one parameter ``{}``."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(_params(value, f"{name}/"))
        else:
            out[name] = dict(value) if isinstance(value, Mapping) else value
    return out


def _futures(operations: Any) -> list[concurrent.futures.Future[Any]]:
    # RunOperations exposes only wait(), which blocks; its futures let the training thread poll.
    if isinstance(operations, concurrent.futures.Future):  # a direct write (_SqlitePoints)
        return [operations]
    return list(getattr(operations, "_operation_futures", None) or [])


def _span(steps: list[int]) -> str:
    if not steps:
        return "none"
    return str(steps[0]) if len(steps) == 1 else f"{steps[0]}..{steps[-1]}"


def mlflow_run(uri: str, run_id: str) -> str | None:
    """The MLflow run tagged with the journal's run id, in any experiment (a live sink's run)."""
    client = _client(uri)
    for experiment in client.search_experiments():
        runs = client.search_runs([experiment.experiment_id], filter_string=f"tags.`{RUN_ID_TAG}` = '{run_id}'",
                                  max_results=1)
        if runs:
            return str(runs[0].info.run_id)
    return None


def mlflow_points(uri: str, run_id: str, keys: Iterable[str]) -> Points:
    client = _client(uri)
    points: Points = collections.Counter()
    for experiment in client.search_experiments():
        runs = client.search_runs([experiment.experiment_id], filter_string=f"tags.`{RUN_ID_TAG}` = '{run_id}'")
        for run in runs:
            held = set(run.data.metrics)
            for key in keys:
                if key in held:
                    points.update((key, m.step) for m in client.get_metric_history(run.info.run_id, key))
    return points
