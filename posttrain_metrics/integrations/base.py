"""The sink contract: three methods, no base class. Sinks know nothing about ranks."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

from ..core.frame import Frame
from ..core.keys import KeyInfo
from ..core.redact import redact_tree
from ..core.values import Scalar

__all__ = ["Points", "RunInfo", "Sink", "tracker_settings"]

Points = collections.Counter[tuple[str, int]]
"""What a tracker holds of a run: how many points of each (key, step)."""


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """What a sink learns when the run starts. ``config`` is flat (``a/b``) and already redacted;
    ``config_tree`` is the same config nested, lists and ``None`` kept (for trackers that show
    structure; the flat ``config`` when not given, as an old journal has it); ``keys`` describes
    every public key the run's adapters can publish; ``trackers`` holds each tracker sink's resolved
    settings (:func:`tracker_settings`: W&B's project and entity), recorded in the journal header;
    ``extra`` holds the user's own key declarations (:mod:`posttrain_metrics.core.extra`), which
    ``adapters`` does not name; ``declarations`` every named adapter's declarations (the journal header
    carries them: :mod:`posttrain_metrics.journal.declarations`)."""

    run_id: str
    name: str
    config: Mapping[str, Scalar]
    keys: Mapping[str, KeyInfo]
    adapters: tuple[str, ...]
    started: float
    config_tree: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    trackers: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.config_tree and self.config:
            object.__setattr__(self, "config_tree", dict(self.config))
    extra: Mapping[str, Mapping[str, object]] = dataclasses.field(default_factory=dict)
    declarations: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)


@runtime_checkable
class Sink(Protocol):
    """A backend. ``write`` receives plain numbers and strings under flat ``/`` keys, with the
    sink's non-finite policy already applied: values outside ``stores_nonfinite`` (a subset of
    ``{"nan", "inf"}``) are removed upstream and counted under ``health/nonfinite/<key>``.
    Constructors do no I/O; ``start`` does; ``close`` is idempotent."""

    name: str
    stores_nonfinite: frozenset[str]

    def start(self, run: RunInfo) -> None: ...

    def write(self, frame: Frame) -> None: ...

    def close(self, *, failed: bool = False) -> None: ...


def tracker_settings(sinks: Iterable[object]) -> dict[str, dict[str, Any]]:
    """``{sink name: settings}`` of the sinks that say where their run goes (a ``run_settings()``
    method, such as W&B's project and entity), for the journal header: an export later finds the
    same place."""
    out: dict[str, dict[str, Any]] = {}
    for sink in sinks:
        settings = getattr(sink, "run_settings", None)
        if callable(settings):
            out[str(getattr(sink, "name", type(sink).__name__))] = dict(redact_tree(dict(settings())))
    return out
