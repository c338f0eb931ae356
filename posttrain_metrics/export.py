"""``posttrain-metrics export``: replay a journal into TensorBoard, MLflow or W&B.

Frames go through the same :class:`~posttrain_metrics.integrations.Publisher` path as live
publication (label indicators, non-finite policy, step axis, summaries, layout), so an exported run
looks like a live one. Export is idempotent and resumable because it reads the target back first and
sends only the frames it does not hold yet: TensorBoard's event files in the log dir, the MLflow run
tagged with the journal's run id (the run a live sink created, or a previous export), the offline W&B
runs with the journal's run id. A point counts once per occurrence of its step, so a journal whose
steps repeat (a resumed run) is exported faithfully too.
"""

from __future__ import annotations

import collections
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TypeVar

from .core.errors import MetricsError
from .core.frame import Frame
from .core.keys import KeyInfo
from .core.redact import redact_text
from .integrations.base import Sink
from .integrations.journal import Journal
from .integrations.publisher import Publisher, display_frame, nonfinite_kind

__all__ = ["export", "pending_frames"]

Points = collections.Counter[tuple[str, int]]
_T = TypeVar("_T")


def _probe(frame: Frame, stores: frozenset[str]) -> str | None:
    """The key whose presence at the frame's step says the frame was written (every sink writes a
    frame whole): its first number the target stores, label indicators included."""
    for key in sorted(frame.metrics):
        value = frame.metrics[key]
        if isinstance(value, str):
            continue
        kind = nonfinite_kind(float(value))
        if kind is None or kind in stores:
            return key
    return None


def pending_frames(
    frames: Iterable[Frame], existing: Points, *, keys: Mapping[str, KeyInfo] | None = None,
    stores: frozenset[str] = frozenset(),
) -> list[Frame]:
    """The frames whose probe point is not in ``existing`` yet (counting repeated steps), probed as
    the target shows them (``keys`` adds the label indicators). A frame with no metrics (an empty
    window) is never pending: the publisher sends it to no tracker."""
    seen: Points = collections.Counter()
    out = []
    for frame in frames:
        if not frame.metrics:
            continue
        key = _probe(display_frame(frame, keys or {}), stores)
        if key is None:
            out.append(frame)
            continue
        seen[(key, frame.step)] += 1
        if seen[(key, frame.step)] > existing[(key, frame.step)]:
            out.append(frame)
    return out


# -- what each target already holds --------------------------------------------------------------------


def _tensorboard_points(log_dir: Path) -> Points:
    points: Points = collections.Counter()
    if not any(log_dir.glob("events.out.tfevents.*")):
        return points
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    for tag in events.Tags()["scalars"]:
        points.update((tag, e.step) for e in events.Scalars(tag))
    return points


def _mlflow_run(uri: str, run_id: str) -> str | None:
    """The MLflow run tagged with the journal's run id, in any experiment (a live sink's run)."""
    from mlflow.tracking import MlflowClient

    from .integrations.mlflow import RUN_ID_TAG

    client = MlflowClient(tracking_uri=uri)
    for experiment in client.search_experiments():
        runs = client.search_runs([experiment.experiment_id], filter_string=f"tags.`{RUN_ID_TAG}` = '{run_id}'",
                                  max_results=1)
        if runs:
            return str(runs[0].info.run_id)
    return None


def _mlflow_points(uri: str, run_id: str, keys: Iterable[str]) -> Points:
    from mlflow.tracking import MlflowClient

    from .integrations.mlflow import RUN_ID_TAG

    client = MlflowClient(tracking_uri=uri)
    points: Points = collections.Counter()
    for experiment in client.search_experiments():
        runs = client.search_runs([experiment.experiment_id], filter_string=f"tags.`{RUN_ID_TAG}` = '{run_id}'")
        for run in runs:
            for key in keys:
                points.update((key, m.step) for m in client.get_metric_history(run.info.run_id, key))
    return points


def _wandb_points(directory: Path, run_id: str) -> Points:
    from .integrations.wandb_reader import read_offline_run

    points: Points = collections.Counter()
    for file in sorted(directory.rglob(f"run-{run_id}.wandb")):
        for row in read_offline_run(file).history:
            step = row.get("trainer/step")
            if isinstance(step, int):
                points.update((key, step) for key in row if not key.startswith(("_", "trainer/")))
    return points


# -- the command ------------------------------------------------------------------------------------

_MLFLOW_SCHEMES = ("http", "https", "sqlite", "postgresql", "mysql", "mssql", "databricks")


def _check_mlflow_uri(uri: str) -> None:
    """An MLflow target export can replay into: a tracking server or a database store. A file
    store (a plain path or ``file:``) cannot be read back to resume an export, and anything else
    is a typo; both are one clear error, before any network or disk access. An ``http(s)`` server
    gets the same bounded retries as the live sink (MLflow's own default retries for minutes)."""
    shown = redact_text(uri)
    scheme = uri.split("://", 1)[0].split("+", 1)[0].lower() if "://" in uri else ""
    if uri == "databricks" or uri.startswith("databricks://"):
        return
    if not scheme or scheme == "file":
        raise MetricsError(
            f"--to mlflow {shown!r} is an MLflow file store (a folder), which export cannot read back; fix: "
            "a database, --to mlflow sqlite:///path/to/mlflow.db, or a server, --to mlflow http://host:5000"
        )
    if scheme not in _MLFLOW_SCHEMES:
        raise MetricsError(
            f"--to mlflow {shown!r}: unknown tracking URI scheme {scheme!r}; fix: use one of "
            f"{', '.join(s + '://' for s in _MLFLOW_SCHEMES)} (e.g. http://127.0.0.1:5000 or sqlite:///mlflow.db)"
        )
    if scheme in ("http", "https"):
        import os

        from .integrations.mlflow import HTTP_BACKOFF_FACTOR, HTTP_MAX_RETRIES, HTTP_TIMEOUT

        for var, default in (HTTP_MAX_RETRIES, HTTP_TIMEOUT, HTTP_BACKOFF_FACTOR):
            os.environ.setdefault(var, str(default))  # the live sink's bound; the user's own setting wins


def _ask(where: str, question: Callable[[], _T]) -> _T:
    """A query to the target, its failure (a dead server, a refused login) one clear error."""
    try:
        return question()
    except MetricsError:
        raise
    except Exception as exc:
        detail = redact_text(str(exc)).strip().splitlines()
        raise MetricsError(
            f"export: {redact_text(where)} did not answer ({type(exc).__name__}: {detail[0][:300] if detail else ''}); "
            "fix: start the tracker or correct the target, then run export again (nothing was written)"
        ) from None



def _target(journal: Journal, to: str, target: str | None) -> tuple[Sink, str, Callable[[], Points]]:
    home = journal.path.parent
    keys = sorted({k for f in journal.frames for k, v in f.metrics.items() if not isinstance(v, str)})
    if to == "tensorboard":
        from .integrations.tensorboard import TensorBoardSink

        log_dir = Path(target) if target else home / "tensorboard"
        tb_sink = TensorBoardSink(log_dir=log_dir, flush=1000)  # flushed at close: no per-frame wait
        return tb_sink, str(log_dir), lambda: _tensorboard_points(log_dir)
    if to == "mlflow":
        from .integrations.mlflow import MlflowSink

        uri = target or f"sqlite:///{(home / 'mlflow.db').resolve()}"
        _check_mlflow_uri(uri)
        experiment = journal.config.get("mlflow/experiment")
        # A replay outruns MLflow: the sink may hold every frame (its live-run backlog would drop the
        # oldest) and close waits for all of them to be confirmed.
        mlflow_sink = MlflowSink(tracking_uri=uri, dir=home, experiment=str(experiment) if experiment else None,
                                 run_id=_ask(uri, lambda: _mlflow_run(uri, journal.run_id)),  # a live sink's run
                                 backlog=len(journal.frames) + 1, drain_timeout=24 * 3600.0)
        return mlflow_sink, uri, lambda: _mlflow_points(uri, journal.run_id, keys)
    if to == "wandb":
        from .integrations.wandb import WandbSink

        directory = Path(target) if target else home
        project = str(journal.config.get("wandb/project", "posttrain-metrics"))
        sink = WandbSink(project=project, dir=directory, resume="allow", settings={"quiet": True})
        return sink, str(directory / "wandb"), lambda: _wandb_points(directory, journal.run_id)
    raise MetricsError(f"export --to {to!r}; fix: use tensorboard, mlflow or wandb")


def export(journal: Journal, to: str, target: str | None = None, *, quiet: bool = False) -> int:
    """Replay ``journal`` into ``to`` (``tensorboard``, ``mlflow`` or ``wandb``); 0 on success."""
    sink, where, existing = _target(journal, to, target)
    where = redact_text(where)
    # synchronous: a replay outruns any tracker, and a background queue would drop frames
    pub = Publisher([sink], adapters=journal.adapters, run_name=str(journal.header.get("name") or "") or None,
                    run_id=journal.run_id, background=False)
    todo = pending_frames(journal.frames, _ask(where, existing), keys=pub.keys, stores=sink.stores_nonfinite)
    total = len(journal.frames)
    if not todo:
        print(f"nothing to export: all {total} frames of run {journal.run_id} are already in {where}")
        return 0
    pub.start(journal.config)
    progress = _Progress(len(todo), f"export -> {to}", quiet=quiet)
    failed = journal.end is not None and journal.end.get("status") == "failed"
    try:
        for frame in todo:
            pub.publish(frame)
            progress.tick()
    finally:
        pub.close(failed=failed)
        progress.done()
    lost = {name: n for name in ("dropped", "unconfirmed", "rejected") if (n := getattr(sink, name, 0))}
    if pub.failures or pub.dropped or lost:
        raise MetricsError(
            f"export to {where} is incomplete (failures {pub.failures}, {lost or pub.dropped}); run it "
            "again: it sends only what is missing"
        )
    print(f"exported {len(todo)} of {total} frames of run {journal.run_id} to {where} "
          f"({total - len(todo)} were already there)")
    return 0


class _Progress:
    """A progress line on stderr, redrawn at most twice a second (no dependency)."""

    def __init__(self, total: int, label: str, *, quiet: bool) -> None:
        self.total, self.label, self.quiet = total, label, quiet or not sys.stderr.isatty()
        self.count, self.started, self.shown = 0, time.monotonic(), 0.0

    def tick(self) -> None:
        self.count += 1
        now = time.monotonic()
        if not self.quiet and now - self.shown > 0.5:
            self.shown = now
            rate = self.count / max(now - self.started, 1e-9)
            sys.stderr.write(f"\r{self.label}: {self.count}/{self.total} frames "
                             f"({100 * self.count / self.total:.0f}%, {rate:.0f}/s)")
            sys.stderr.flush()

    def done(self) -> None:
        if not self.quiet and self.shown:
            sys.stderr.write("\n")
