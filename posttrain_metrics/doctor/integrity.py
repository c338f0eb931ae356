"""Checks of the record itself: steps out of order, a torn last line, frames missing from the
journal (a gap record), how the run ended."""

from __future__ import annotations

import array
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ..core.frame import Frame
from .engine import Severity, _Hit, _Run, _Watch


class _StepOrder(_Watch):
    every_phase = True

    def __init__(self, run: _Run) -> None:
        self.latest: dict[str, int] = {}
        self.steps = array.array("q")
        self.examples: list[str] = []

    def see(self, frame: Frame) -> None:
        last = self.latest.get(frame.phase)
        if last is not None and frame.step <= last:
            self.steps.append(frame.step)
            if len(self.examples) < 3:
                self.examples.append(f"{frame.phase} step {frame.step} after {last}")
        self.latest[frame.phase] = max(frame.step, last if last is not None else frame.step)

    def hits(self) -> Iterator[_Hit]:
        if self.steps:
            yield _Hit(
                self.steps,
                f"steps go backwards or repeat ({'; '.join(self.examples)}): a resumed run that replayed "
                "steps, or two runs in one journal; trackers keep only one point per step",
                "resume from the checkpoint's step (not step 0), or give each run its own journal",
                (),
            )


class _JournalIntegrity(_Watch):
    def __init__(self, run: _Run) -> None:
        self.journal = run.journal

    def hits(self) -> Iterator[_Hit]:
        for note in self.journal.warnings:
            yield _Hit(
                (),
                f"{note}; the complete lines before it were read",
                "the writer was killed mid-line (a crash or a lost machine); nothing to fix unless the run "
                "should still be going",
                (),
            )


class _JournalGap(_Watch):
    def __init__(self, run: _Run) -> None:
        self.journal = run.journal

    def hits(self) -> Iterator[_Hit]:
        """One finding per gap record: the steps whose frames the writer could not keep."""
        gaps: Sequence[Mapping[str, Any]] = getattr(self.journal, "gaps", ())  # a journal's; a reader may lack it
        for gap in gaps:
            first, last, frames = int(gap["first_step"]), int(gap["last_step"]), int(gap["frames"])
            phases = ", ".join(f"{n} {phase}" for phase, n in dict(gap.get("phases", {})).items())
            error = f" ({gap['error']})" if gap.get("error") else ""
            yield _Hit(
                range(first, last + 1) if 0 <= last - first < 1_000_000 else (first, last),
                f"{frames} frames{f' ({phases})' if phases else ''} from step {first} to {last} are not in the "
                f"journal: it could not be written{error} and its backlog was full; no tracker has them either",
                "give the run's disk room (or a larger JournalSink backlog_bytes); these steps' metrics are lost",
                (),
            )


class _RunEnd(_Watch):
    def __init__(self, run: _Run) -> None:
        self.journal = run.journal

    def hits(self) -> Iterator[_Hit]:
        end = self.journal.end
        if end is None:
            yield _Hit(
                (),
                "the journal has no end record: the run is still going, or was killed before it closed",
                "if it is not running, look at the job's log around its last step",
                (),
                Severity.INFO,
            )
        elif end.get("status") == "failed":
            yield _Hit(
                (),
                f"the run ended with status 'failed' ({end.get('reason') or 'an exception unwound the training loop'})",
                "look at the job's log around the last step; the findings above may say why",
                (),
            )
        elif end.get("status") == "interrupted":
            yield _Hit(
                (),
                f"the run was interrupted ({end.get('reason') or 'Ctrl-C'}) before it finished",
                "resume it from its last checkpoint with the same run_id if it should go on",
                (),
                Severity.INFO,
            )
