"""Metric points written straight into the tables of an MLflow ``sqlite:///`` store (:class:`_SqlitePoints`):
what ``log_batch`` stores, at a fraction of its cost per point."""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from typing import Any

__all__ = ["DIRECT_POINTS"]


DIRECT_POINTS = 5000
"""The most metric points in one request written straight into a SQLite store (:class:`_SqlitePoints`):
a transaction's fixed cost (its commit) is spread over more points than MLflow's 1000 per request."""


class _SqlitePoints:
    """Metric points written straight into the tables of an MLflow ``sqlite:///`` store, in one
    transaction per request: MLflow's own ``log_batch`` builds an ORM object per point, which makes it
    the publisher's largest cost, CPU taken from a trainer that may need every core; this writes the
    same rows with a few statements per request (``benchmarks/bench_export.py`` compares the two).

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
