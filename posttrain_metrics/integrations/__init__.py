"""Sinks and the publisher. Vendor SDKs are imported inside each sink's ``start``, never here."""

from __future__ import annotations

from .base import RunInfo, Sink
from .console import ConsoleSink
from .journal import Journal, JournalSink, read_journal
from .memory import MemorySink
from .publisher import Publisher

__all__ = [
    "ConsoleSink",
    "Journal",
    "JournalSink",
    "MemorySink",
    "Publisher",
    "RunInfo",
    "Sink",
    "read_journal",
]
