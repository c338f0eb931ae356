"""The run's own record, attached to the trackers at close: a run viewed in MLflow or W&B carries it.

When the publisher closes a run (:func:`~posttrain_metrics.publication.follower.follow`, live, in the
publisher process or thread), it writes beside the journal, in ``<journal>.record/``:

- ``config.json``: the run's config as the journal header holds it (nested as W&B gets it, lists and
  ``null`` kept, already redacted);
- ``doctor.txt`` and ``doctor.json``: ``posttrain-metrics doctor``'s report;
- ``dashboard.png``: ``posttrain-metrics plot``'s one-page dashboard, when matplotlib is installed.

and hands them, after the journal itself (the metrics exactly as reduced) and its samples file (when
the run published completions), to every sink that takes files (``attach(files)``: MLflow as run artifacts under
``posttrain_metrics/``, W&B as run files under ``posttrain_metrics/``) before closing it. Building
the record never stops the close: a part that fails is left out with a warning.

The journal is not held in memory: it is checked whole once, then each reader (the doctor, the
dashboard) parses it again as it goes (:func:`~posttrain_metrics.journal.open_journal`), so the record
of a long run takes no more memory than a short one's, at the price of a few passes over the file.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

from ..core.log import get_logger

__all__ = ["ARTIFACT_DIR", "record_dir", "write_record"]

log = get_logger("publication")

ARTIFACT_DIR = "posttrain_metrics"
"""The folder of the run's record in a tracker (MLflow artifact path, W&B files sub-folder)."""


def record_dir(journal: Path) -> Path:
    """Where the record of the journal at ``journal`` is written: ``<journal>.record/``
    (:class:`~posttrain_metrics.journal.RunFile`: a symlink planted there is refused, never written through)."""
    from ..journal import RunFile

    return RunFile.RECORD.of(journal)


def _atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_record(journal: Path) -> list[Path]:
    """Write the record of ``journal`` (see the module docstring); the journal and the files written."""
    from ..doctor import format_findings, run_checks
    from ..journal import open_journal

    folder = record_dir(journal)
    folder.mkdir(parents=True, exist_ok=True)
    files: list[Path] = [journal]
    from ..journal.samples import samples_path

    if samples_path(journal).is_file():
        files.append(samples_path(journal))  # the sample completions, when the run published some
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a torn last line was warned about where it was read first
        run = open_journal(journal)  # checked whole, frames read again by each pass: memory flat in steps
    config = folder / "config.json"
    _atomic(config, json.dumps(run.config_tree, indent=2, sort_keys=True, allow_nan=False).encode())
    files.append(config)
    try:
        from .health import read_thresholds

        findings = run_checks(run, read_thresholds(journal))  # the thresholds live health judged with
        for name, as_json in (("doctor.txt", False), ("doctor.json", True)):
            path = folder / name
            _atomic(path, (format_findings(findings, as_json=as_json, journal=run) + "\n").encode())
            files.append(path)
    except Exception as exc:  # the record is a courtesy: the trackers close regardless
        log.warning(f"the doctor's report of {journal} could not be written ({type(exc).__name__}: {exc}); "
                    "it is left out of the run's record")
        return files
    try:
        import matplotlib  # noqa: F401  (optional: the dashboard needs it)
    except ImportError:
        return files
    try:
        from ..plot import dashboard

        files.append(dashboard(run, findings, folder / "dashboard.png"))
    except Exception as exc:
        log.warning(f"the dashboard of {journal} could not be drawn ({type(exc).__name__}: {exc}); it is "
                    "left out of the run's record")
    return files
