"""Sinks: the trackers and the console (the journal is :mod:`posttrain_metrics.journal`, the
publisher :mod:`posttrain_metrics.publication`). Vendor SDKs are imported inside each sink's ``start``, never here."""

from __future__ import annotations

from .base import RunInfo, Sink
from .console import ConsoleSink
from .memory import MemorySink

__all__ = [
    "ConsoleSink",
    "MemorySink",
    "RunInfo",
    "Sink",
]
