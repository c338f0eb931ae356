"""The sink contract: three methods, no base class. Sinks know nothing about ranks."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from ..core.frame import Frame
from ..core.keys import KeyInfo
from ..core.values import Scalar

__all__ = ["Points", "RunInfo", "Sink"]

Points = collections.Counter[tuple[str, int]]
"""What a tracker holds of a run: how many points of each (key, step)."""


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """What a sink learns when the run starts. ``config`` is flat (``a/b``) and already redacted;
    ``keys`` describes every public key the run's adapters can publish; ``extra`` holds the user's
    own key declarations (:mod:`posttrain_metrics.core.extra`), which ``adapters`` does not name."""

    run_id: str
    name: str
    config: Mapping[str, Scalar]
    keys: Mapping[str, KeyInfo]
    adapters: tuple[str, ...]
    started: float
    extra: Mapping[str, Mapping[str, object]] = dataclasses.field(default_factory=dict)


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
