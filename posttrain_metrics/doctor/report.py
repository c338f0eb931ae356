"""The doctor's report: a text page for a person, or one JSON object for a machine."""

from __future__ import annotations

import json
import os
import textwrap
from collections.abc import Sequence
from typing import Any

from ..core.printable import printable
from ..core.redact import redact_text
from .engine import Finding, JournalLike, Severity, exit_status, step_ranges
from .table import CHECKS

__all__ = ["format_findings"]


def _run_summary(journal: JournalLike) -> dict[str, Any]:
    end = journal.end
    return {
        "id": journal.run_id,
        "name": redact_text(str(journal.header.get("name", ""))),  # a name the writer did not redact
        "path": os.fspath(journal.path),
        "adapters": list(journal.adapters),
        "extra": {str(k): str(v.get("reduction", "?")) if isinstance(v, dict) else "?"
                  for k, v in dict(journal.header.get("extra") or {}).items()},
        "status": str(end.get("status", "?")) if end is not None else "no end record",
        "phases": {
            phase: {"frames": span.frames, "first_step": span.first_step, "last_step": span.last_step}
            for phase, span in journal.phases.items()
        },
    }


def format_findings(findings: Sequence[Finding], *, as_json: bool, journal: JournalLike) -> str:
    """The report: a header about the run, then findings by severity; or one JSON object."""
    run = _run_summary(journal)
    counts = {s.value: sum(f.severity is s for f in findings) for s in Severity}
    if as_json:
        return json.dumps(
            {
                "format": "posttrain-metrics-doctor",
                "version": 1,
                "run": run,
                "exit_status": exit_status(findings),
                "counts": counts,
                "findings": [f.to_dict() for f in findings],
                "checks": [c.to_dict() for c in CHECKS],
            },
            indent=2,
            allow_nan=False,
        )
    phases = ", ".join(
        f"{p['frames']} {name} frames (steps {p['first_step']}-{p['last_step']})"
        for name, p in run["phases"].items()
    ) or "no frames"
    lines = [
        f"run {run['name'] or '(unnamed)'} (id {run['id']}): {phases}",
        f"adapters {', '.join(run['adapters']) or '(none)'}; status {run['status']}; {run['path']}",
    ]
    if run["extra"]:
        lines.append("user keys " + ", ".join(f"{k} ({r})" for k, r in run["extra"].items()))
    if not findings:
        lines.append(f"healthy: none of the {len(CHECKS)} checks fired")
        return "\n".join(printable(line) for line in lines)
    lines.append(", ".join(f"{n} {s}{'s' if n != 1 and s != 'info' else ''}" for s, n in counts.items()))
    wrap = textwrap.TextWrapper(width=100, initial_indent="    ", subsequent_indent="    ")
    for severity in Severity:
        group = [f for f in findings if f.severity is severity]
        if not group:
            continue
        lines.append("")
        lines.append(f"{severity.value.upper()} ({len(group)})")
        for finding in group:
            where = f" at steps {step_ranges(finding.steps, limit=12)}" if finding.steps else ""
            lines.append(f"  [{finding.check}]{where}")
            lines.extend(wrap.wrap(finding.explanation))
            lines.extend(wrap.wrap("next: " + finding.next_step))
    # A journal's names, keys and labels may hold control characters: escaped line by line, so
    # that no journal can forge a line of this report or drive the terminal.
    return "\n".join(printable(line) for line in lines)
