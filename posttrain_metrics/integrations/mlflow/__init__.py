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
and -inf as ±1.7976931348623157e308, which reads back as a finite number (server and embedded
alike). So this sink declares ``stores_nonfinite = {"nan"}``: NaN is
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
limits (``MAX_METRICS_PER_BATCH``): a request's fixed cost is most of a small one's.

At most ``max_pending`` requests are in flight. When a request fails (server down, timeout) the sink
logs it once (on the ``posttrain_metrics.integrations.mlflow`` logger, as every message about the
tracker's state below; a name or value MLflow cannot hold is a warning) and is *degraded*: it holds frames, sends one request at a time as a probe, and when a
probe lands resends everything held. Nothing is dropped: once ``backlog`` frames are held,
``ready()`` is false and the publisher stops reading the journal for this sink until MLflow answers
again (the journal is the queue; a sink written directly holds every frame). Resending is exact: MLflow
identifies a point by (key, step, timestamp, value) and ignores a duplicate, and the timestamp is
the frame's wall time, so a request that reached the server before its reply was lost, or a replay
of the journal by ``posttrain-metrics export``, stores nothing twice. A request MLflow rejects as
invalid (HTTP 400/404: a run deleted or removed meanwhile) is not retried; it is logged and
counted in ``rejected``.

A ``sqlite:///`` store (the embedded default, or a SQLite file you name) is written more cheaply:
its metric points go straight into MLflow's tables, on a writer thread of the sink, one transaction
per request of up to :data:`DIRECT_POINTS` points (:class:`_SqlitePoints`: what ``log_batch``
stores, checked against it by the tests). ``log_batch`` builds an ORM object per point, which makes
it the publisher's largest cost on a machine whose cores the trainer needs; the direct write is a few
statements per request. Params and tags still go through ``log_batch``, on the same thread.
Where MLflow's tables are not the shape it writes (another MLflow version), or a logged model is
active (``log_batch`` files the points under it too), ``log_batch`` is used. Its failures are
MLflow's own errors, handled as above: a run deleted or removed meanwhile is rejected; a database
locked by another writer is waited for 20 s (MLflow's busy timeout), then retried.

``close`` drains: it waits up to ``drain_timeout`` seconds for every request to be confirmed (or
less, when the server is down and a probe sent during ``close`` fails too), logs the frames that
were not confirmed (the journal has them; ``posttrain-metrics export`` replays them), re-sets the
label tags to the last labels (requests may land out of order) and sets the status. When the server
is unreachable at the end, the run keeps status ``RUNNING`` and a log record says so.

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
The experiment is ``experiment_name``, else
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

Modules, one job each: :mod:`.names` (tags, settings, valid names), :mod:`.store` (opening a store,
reading back what it holds), :mod:`.direct` (a SQLite store's points written straight in),
:mod:`.sender` (requests off the caller's thread, held while the server is down), :mod:`.tables`
(completions as tables the UI shows), :mod:`.sink` (the sink).
"""

from __future__ import annotations

from .names import (
    ADAPTERS_TAG,
    DEFAULT_EXPERIMENT,
    HTTP_BACKOFF_FACTOR,
    HTTP_MAX_RETRIES,
    HTTP_TIMEOUT,
    INSTALL,
    REASON_TAG,
    RUN_ID_TAG,
    RUN_PREFIX,
    STATUS_TAG,
)
from .sink import MlflowSink
from .store import mlflow_points, mlflow_run

__all__ = [
    "ADAPTERS_TAG",
    "DEFAULT_EXPERIMENT",
    "HTTP_BACKOFF_FACTOR",
    "HTTP_MAX_RETRIES",
    "HTTP_TIMEOUT",
    "INSTALL",
    "REASON_TAG",
    "RUN_ID_TAG",
    "RUN_PREFIX",
    "STATUS_TAG",
    "MlflowSink",
    "mlflow_points",
    "mlflow_run",
]
