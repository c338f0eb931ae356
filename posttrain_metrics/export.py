"""``posttrain-metrics export``: replay a journal into TensorBoard, MLflow or W&B.

Frames go through the same :class:`~posttrain_metrics.publication.Publisher` path as live
publication (label indicators, non-finite policy, step axis, summaries, layout), so an exported run
looks like a live one. Export is idempotent and resumable because it reads the target back first and
sends only the frames it does not hold yet: TensorBoard's event files in the run's own folder
(``<DIR>/<name>-<run id>``, so another run in ``DIR`` is neither merged with nor taken for it), the MLflow run
tagged with the journal's run id (the run a live sink created, or a previous export), the offline W&B
runs with the journal's run id. A point counts once per occurrence of its step, so a journal whose
steps repeat (a resumed run) is exported faithfully too.

Default targets (beside the journal) follow the run's path rule
(:func:`~posttrain_metrics.integrations.factory.run_path`): one reached through a symlink out of the
journal's folder is refused.

A journal opened with :func:`~posttrain_metrics.journal.open_journal` (what the command does) is read
once to check it and once to export it, a batch of frames at a time: the export's memory does not
grow with the run's length.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO, TypeVar, Union

from .core.errors import MetricsError
from .core.log import LOGGER, line
from .core.redact import redact_text
from .integrations.base import Sink
from .integrations.factory import run_path
from .integrations.mlflow import mlflow_run
from .journal import Journal, JournalOnDisk, Record
from .publication.follower import STATUSES
from .publication.replica import Replica

__all__ = ["export", "log_path"]

_T = TypeVar("_T")
AnyJournal = Union[Journal, JournalOnDisk]
"""A journal read whole (:func:`~posttrain_metrics.journal.read_journal`) or opened to be read pass by
pass (:func:`~posttrain_metrics.journal.open_journal`)."""


# -- the command ------------------------------------------------------------------------------------

_VENDORS = frozenset({"mlflow", "wandb", "tensorboard", "sqlalchemy", "alembic", "google", "pydantic"})
"""Packages whose warnings go to the export's log with their other output."""
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



def _recorded(journal: AnyJournal, tracker: str, setting: str) -> str | None:
    """A tracker setting the live run used: the journal header's ``trackers`` (recorded when the run
    started)."""
    settings = journal.trackers.get(tracker)
    value = settings.get(setting) if isinstance(settings, dict) else None
    return str(value) if value not in (None, "", "None") else None


def _target(journal: AnyJournal, to: str, target: str | None, *, project: str | None = None,
            entity: str | None = None) -> tuple[Sink, str]:
    home = journal.path.parent
    if to == "tensorboard":
        from .integrations.tensorboard import TensorBoardSink

        # the run's own folder: by default where a live TensorBoard sink of the callback writes it; in a
        # folder given, its <name>-<run id> sub-folder (unless the folder names {run_id} itself), so that
        # runs exported into one folder never merge and what is "already there" is this run's only
        folder = Path(target) if target else run_path(home, "tensorboard")
        log_dir = folder if "{run_id}" in str(folder) else folder / "{name}-{run_id}"
        tb_sink = TensorBoardSink(log_dir=log_dir, flush=1 << 30)  # flushed per batch and at close
        return tb_sink, str(tb_sink.resolve(redact_text(str(journal.header.get("name") or "")), journal.run_id))
    if to == "mlflow":
        from .integrations.mlflow import MlflowSink

        uri = target or f"sqlite:///{run_path(home, 'mlflow.db').resolve()}"
        _check_mlflow_uri(uri)
        experiment = _recorded(journal, "mlflow", "experiment_name")
        # The sink may hold every frame (a replay outruns MLflow) and close waits for all of them.
        mlflow_sink = MlflowSink(tracking_uri=uri, dir=home, experiment_name=experiment,
                                 run_id=_ask(uri, lambda: mlflow_run(uri, journal.run_id)),  # a live sink's run
                                 backlog=len(journal.frames) + 1, drain_timeout=24 * 3600.0)
        return mlflow_sink, uri
    if to == "wandb":
        from .integrations.wandb import WandbSink

        directory = Path(target) if target else run_path(home, "wandb").parent
        # The live run's project and entity (the journal header), unless the command names others;
        # W&B's environment variables fill what neither says, as for a live run.
        project = project or _recorded(journal, "wandb", "project")
        entity = entity or _recorded(journal, "wandb", "entity")
        sink = WandbSink(project=project, entity=entity, dir=directory, resume="allow", settings={"quiet": True})
        return sink, str(directory / "wandb")
    raise MetricsError(f"export --to {to!r}; fix: use tensorboard, mlflow or wandb")


def log_path(journal: Path) -> Path:
    """Where ``export --to mlflow|wandb`` sends the trackers' own output: ``export.log`` beside the journal."""
    return journal.with_name("export.log")


def _ours(stream: TextIO, fd: int) -> TextIO | None:
    """A stream on a duplicate of ``fd`` when ``stream`` writes to it (a terminal, a pipe); ``None`` when
    ``stream`` is held in Python (a test's capture): there is then no descriptor to move."""
    try:
        real = stream.fileno() == fd
    except (AttributeError, OSError, ValueError):
        return None
    return os.fdopen(os.dup(fd), "w", buffering=1) if real else None


@contextlib.contextmanager
def _trackers_quiet(log: Path) -> Iterator[tuple[TextIO, TextIO]]:
    """The trackers' banners and INFO logs (W&B's ``wandb:`` lines and its service process, MLflow's
    schema creation) go to ``log``, as a live run's go to ``publisher.log``; the two streams yielded
    are the terminal's, for our own progress line and summary. Descriptors 1 and 2 are moved, not
    ``sys.stdout``: the vendors hold their own references to the streams and start child processes."""
    out, err = _ours(sys.stdout, 1), _ours(sys.stderr, 2)
    if out is None or err is None:
        for stream in (out, err):
            if stream is not None:
                stream.close()
        yield sys.stdout, sys.stderr
        return
    saved = (os.dup(1), os.dup(2))
    sys.stdout.flush()
    sys.stderr.flush()
    with open(log, "ab") as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
    shown = warnings.showwarning

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: TextIO | None = None, line: str | None = None) -> None:
        """Our warnings (a value a tracker cannot hold...) stay on the terminal; the vendors' go to the
        log. Ours are attributed to the caller's frame (``stacklevel``), so a warning is told by the
        vendor file it comes from, not by ours."""
        vendor = not _VENDORS.isdisjoint(Path(filename).parts)
        shown(message, category, filename, lineno, err if not vendor and file is None else file, line)

    warnings.showwarning = show
    ours = _Terminal(err)  # our log records (a value a tracker cannot hold...) on the terminal too
    logging.getLogger(LOGGER).addHandler(ours)
    try:
        print(f"tracker logs (W&B, MLflow output): {log}", file=out)
        yield out, err
    finally:
        logging.getLogger(LOGGER).removeHandler(ours)
        warnings.showwarning = shown
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
        out.close()
        err.close()


class _Terminal(logging.Handler):
    """The package's log records, one line each, on the terminal's stream while fds 1 and 2 go to the log."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self.stream = stream

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.stream.write(f"posttrain-metrics: {line(record)}\n")


def export(journal: AnyJournal, to: str, target: str | None = None, *, quiet: bool = False, batch: int = 512,
           project: str | None = None, entity: str | None = None) -> int:
    """Replay ``journal`` into ``to`` (``tensorboard``, ``mlflow`` or ``wandb``); 0 on success.

    ``--to wandb`` goes to the live run's W&B project and entity, as the journal header recorded
    them (so ``wandb sync`` of the live run's offline folder and an export land in one run), or to
    ``project``/``entity`` when given.

    The run's status in the tracker is the journal's: ``finished``, ``failed``, or ``killed`` when
    the journal has no end record (the run never closed), as ``posttrain-metrics doctor`` reports it.
    MLflow's and W&B's own output goes to :func:`log_path`, as quiet as a live run.
    """
    if to in ("mlflow", "wandb"):
        with _trackers_quiet(log_path(Path(journal.path))) as (out, err):
            return _replay(journal, to, target, quiet=quiet, batch=batch, project=project, entity=entity,
                           out=out, err=err)
    return _replay(journal, to, target, quiet=quiet, batch=batch, project=project, entity=entity,
                   out=sys.stdout, err=sys.stderr)


def _replay(journal: AnyJournal, to: str, target: str | None, *, quiet: bool, batch: int, project: str | None,
            entity: str | None, out: TextIO, err: TextIO) -> int:
    if (project is not None or entity is not None) and to != "wandb":
        raise MetricsError(f"export --to {to}: --project and --entity are W&B's; fix: drop them, or use --to wandb")
    sink, where = _target(journal, to, target, project=project, entity=entity)
    where = redact_text(where)
    replica = Replica(journal.path, sink, lazy=True)  # the sink starts at the first frame it lacks
    _ask(where, lambda: replica.feed([Record("header", header=journal.header)]))  # reads the target back
    total = len(journal.frames)
    progress = _Progress(total, f"export -> {to}", quiet=quiet, stream=err)
    status = str(journal.end.get("status", "finished")) if journal.end is not None else "killed"
    frames = iter(journal.frames)  # one pass, a batch at a time (read from the file when opened)
    try:
        while chunk := list(itertools.islice(frames, batch)):
            replica.feed(Record("frame", frame=f) for f in chunk)
            replica.flush()
            progress.tick(len(chunk))
        replica.feed(Record("gap", gap=gap) for gap in journal.gaps)  # the steps the journal misses, as live
        if replica.written and replica.started:
            from .publication.health import replay_findings  # the live-health findings file, as live

            replay_findings(Path(journal.path), replica.sink)
        replica.flush()
    finally:
        if replica.started:  # a target that lacked nothing is left as it is
            replica.end, replica.end_reason = status, str(journal.end.get("reason", "")) if journal.end else ""
            replica.close(status if status in STATUSES else "finished")
        progress.done()
    if replica.written == 0 and replica.gaps_written == 0:
        print(f"nothing to export: all {total} frames of run {journal.run_id} are already in {where}", file=out)
        return 0
    failures = {sink.name: replica.failures} if replica.failures else {}
    lost = {name: n for name, n in (("unconfirmed", sink.unconfirmed), ("rejected", sink.rejected)) if n}
    if failures or lost:
        raise MetricsError(
            f"export to {where} is incomplete (failures {failures}, {lost}); run it "
            "again: it sends only what is missing"
        )
    tables = f", {replica.samples_written} steps of sample completions" if replica.samples_written else ""
    if replica.gaps_written:
        tables += f", {replica.gaps_written} gap{'s' if replica.gaps_written != 1 else ''} (the steps it misses)"
    print(f"exported {replica.written} of {total} frames of run {journal.run_id} to {where} "
          f"({replica.skipped} were already there; run {status}{tables})", file=out)
    return 0


class _Progress:
    """A progress line on stderr, redrawn at most twice a second (no dependency)."""

    def __init__(self, total: int, label: str, *, quiet: bool, stream: TextIO) -> None:
        self.total, self.label, self.quiet, self.stream = total, label, quiet or not stream.isatty(), stream
        self.count, self.started, self.shown = 0, time.monotonic(), 0.0

    def tick(self, n: int = 1) -> None:
        self.count += n
        now = time.monotonic()
        if not self.quiet and now - self.shown > 0.5:
            self.shown = now
            rate = self.count / max(now - self.started, 1e-9)
            self.stream.write(f"\r{self.label}: {self.count}/{self.total} frames "
                              f"({100 * self.count / self.total:.0f}%, {rate:.0f}/s)")
            self.stream.flush()

    def done(self) -> None:
        if not self.quiet and self.shown:
            self.stream.write("\n")
