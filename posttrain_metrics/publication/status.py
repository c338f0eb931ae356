"""The publisher's status file: its progress and the trackers' run ids, beside the journal.

The follower (:func:`~posttrain_metrics.publication.follower.follow`) writes it as it goes; the
trainer's :class:`~posttrain_metrics.publication.Publisher` reads it at close (failures, what each
tracker still lacks) and for ``run_handles``; the demo reads it to show where each tracker's run is.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..journal import RunFile

__all__ = ["read_status", "status_path", "write_status"]


def status_path(journal: Path) -> Path:
    """Where the publisher reports its progress and the trackers' run ids: ``<journal>.publisher.json``
    (:class:`~posttrain_metrics.journal.RunFile`)."""
    return RunFile.STATUS.of(journal)


def write_status(path: Path, status: Mapping[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(status, default=str))
    os.replace(tmp, path)


def read_status(journal: Path) -> dict[str, Any]:
    """The last status the publisher of ``journal`` wrote; empty when there is none (yet) or it cannot
    be read."""
    try:
        report: dict[str, Any] = json.loads(status_path(journal).read_text())
    except (OSError, ValueError):
        return {}
    return report
