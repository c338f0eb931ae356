"""The run's record on disk: one package, one validator.

- :mod:`.format`: the record shapes (header, frame, gap, end), the version, the files a run keeps
  beside its journal (:class:`RunFile`)
- :mod:`.declarations`: every adapter's declarations, carried by the header (a journal alone rebuilds its run)
- :mod:`.writer`: :class:`JournalSink` (the training side's writer) and :class:`RunLock`
- :mod:`.check`: :class:`LineCheck`, the one reading of a line, shared by the reader and the tail
- :mod:`.reader`: a whole journal (:func:`read_journal`, :func:`open_journal`)
- :mod:`.tail`: a journal as it grows (:class:`JournalTail`, the publisher's reader)
- :mod:`.lines`: :class:`LineFile`, the append-only file of whole lines both files are written with
- :mod:`.samples`: the samples file beside the journal
"""

from .check import LineCheck, header_adapter, header_adapters
from .declarations import adapter_declaration, adapter_declarations, adapter_from_declaration
from .format import (
    FORMAT,
    MAX_HEADER_DEPTH,
    SAFE_RUN_ID,
    VERSION,
    Gap,
    RunFile,
    describe_gap,
    gap_problem,
    missing_summary,
    nesting,
)
from .reader import FramesOnDisk, Journal, JournalOnDisk, PhaseSpan, open_journal, read_journal
from .tail import JournalTail, Record, journal_closed, last_header
from .writer import BACKLOG_BYTES, LOCK_FD_ENV, JournalSink, RunLock

__all__ = [
    "BACKLOG_BYTES", "FORMAT", "LOCK_FD_ENV", "MAX_HEADER_DEPTH", "SAFE_RUN_ID", "VERSION", "FramesOnDisk", "Gap",
    "Journal", "JournalOnDisk", "JournalSink", "JournalTail", "LineCheck", "PhaseSpan", "Record", "RunFile", "RunLock",
    "adapter_declaration", "adapter_declarations", "adapter_from_declaration", "describe_gap", "gap_problem",
    "header_adapter", "header_adapters", "journal_closed", "last_header", "missing_summary", "nesting",
    "open_journal", "read_journal",
]
