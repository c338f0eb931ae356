"""Opening an MLflow store: the import, a ``sqlite:///`` store's file, its artifacts folder and the lock
under which its schema is created; and reading back what a store holds of a run (:func:`mlflow_run`,
:func:`mlflow_points`: the publisher and ``export`` send only what it lacks)."""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ..base import Points
from .names import INSTALL, RUN_ID_TAG

__all__ = ["mlflow_points", "mlflow_run"]


def _import_mlflow() -> Any:
    try:
        import mlflow
    except ImportError as exc:
        raise ModuleNotFoundError(
            f"the MLflow sink needs the mlflow package, which is not importable ({exc}); fix:\n"
            f"{INSTALL}"
        ) from exc
    return mlflow


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
