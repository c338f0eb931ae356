"""The doctor: a run's health read from its journal, the way the metrics reference says to read it.

Each check watches the run's frames go by (a small class, see ``engine._Watch``), registered in
:data:`CHECKS` with its id, its severity and the keys it reads. A check that fires yields a
:class:`Finding`: the steps where it fires, a one-line explanation and the next thing to do.
``posttrain-metrics doctor`` prints them and exits non-zero when an error-level check fired, so a CI
pipeline can gate on it.

Severities:

- ``error``: the numbers say something is broken, not merely unusual: ``clip_frac`` nonzero at one
  minibatch per batch (a bug, not tighter training), a rejected update (fatal at the GRPO entry),
  non-finite rejections in a row, a non-finite loss or gradient norm on an *applied* update, PPO
  role counters that disagree, frames missing from the journal (a gap record: a full disk).
- ``warning``: a known pathology signature that needs a human to look (informative groups near
  zero, a KL spike with a gradient jump, responses running into the token budget, a rising logprob
  gap, DPO accuracy stuck at chance, a large ``sc_rho_max``, non-finite values, steps out of order,
  a torn journal).
- ``info``: context that changes how to read the curves (no logprob data, zero-gradient skips, a
  check that could not run because the config does not say what it needs).

The package, in the order a frame meets it:

- ``engine``: a check's row (:class:`Check`), its watch, :class:`Doctor` (fed frames one at a
  time, it says what the checks found), :class:`Finding` and :class:`Severity`;
- ``thresholds``: every threshold, with why it has its value, and the keys the checks read;
- the checks by family: ``signals`` (the RL signal, frame by frame), ``trends`` (a series' quarter
  against the rest), ``updates`` (skipped updates and non-finite values), ``integrity`` (the record
  itself: step order, torn lines, gaps, how the run ended);
- ``table``: :data:`CHECKS` and :func:`run_checks`, the offline doctor;
- ``report``: :func:`format_findings`, text or JSON.

A new check is a ``_Watch`` in its family's file, its threshold (with why) in ``thresholds``, and
a row in :data:`CHECKS`; its test goes in ``tests/test_health.py``, one journal showing the pathology.
"""

from __future__ import annotations

from .engine import Check, Doctor, Finding, JournalLike, Severity, config_int, exit_status, step_ranges
from .report import format_findings
from .table import CHECKS, TUNABLE, run_checks
from .thresholds import BUDGET_CONFIG_NAMES, MINIBATCH_CONFIG_NAMES

__all__ = [
    "BUDGET_CONFIG_NAMES",
    "CHECKS",
    "MINIBATCH_CONFIG_NAMES",
    "TUNABLE",
    "Check",
    "Doctor",
    "Finding",
    "JournalLike",
    "Severity",
    "config_int",
    "exit_status",
    "format_findings",
    "run_checks",
    "step_ranges",
]
