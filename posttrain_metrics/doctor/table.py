"""The table of checks the doctor runs, and the offline doctor: every frame of a journal, then the findings."""

from __future__ import annotations

from collections.abc import Mapping

from .engine import Check, Doctor, Finding, JournalLike, Severity
from .integrity import _JournalGap, _JournalIntegrity, _RunEnd, _StepOrder
from .signals import _ClipAtSingleMinibatch, _InformativeGroups, _KlSpike, _PpoCounters, _ScRhoMax
from .thresholds import (
    BASELINE_FRACTION,
    CLIP_FRAC,
    CRITIC_STEP,
    DPO_ACCURACY,
    DPO_CHANCE,
    DPO_MIN_RISE,
    GAP_COUNT,
    GAP_MEAN,
    GAP_RISE_FACTOR,
    GAP_RISE_MIN,
    GRAD_BASELINE_WINDOW,
    GRAD_JUMP_FACTOR,
    GRAD_NORM,
    GROUPS,
    INFORMATIVE,
    INFORMATIVE_FRACTION_MIN,
    KL_MAX,
    KL_MAX_MIN,
    KL_MEAN,
    KL_RATIO_MIN,
    LEN_MAX,
    LOSS,
    NONFINITE_CONSECUTIVE,
    NONFINITE_CONSECUTIVE_MAX,
    NONFINITE_TOTAL,
    OUTCOME,
    POLICY_STEP,
    RATIO_ABSDEV,
    RATIO_ABSDEV_TOLERANCE,
    SC_RHO_MAX,
    SC_RHO_MAX_LARGE,
    SC_TOKENS,
    SKIP_REASON,
    THROUGHPUT_BASELINE,
    THROUGHPUT_DROP_FRACTION,
    TOKENS_PER_S,
    TREND_BASELINE,
    TRUNCATED,
    TRUNCATION_RISE,
    VALID_TOKENS,
    ZERO_GRAD,
)
from .trends import _DpoAccuracy, _LengthBudget, _LogprobGapNoData, _LogprobGapRising, _ThroughputDrop
from .updates import _NonfiniteApplied, _NonfiniteInARow, _NonfiniteValues, _UpdateSkipped, _ZeroGradSkips

__all__ = ["CHECKS", "TUNABLE", "run_checks"]


CHECKS: tuple[Check, ...] = (
    Check("clip_at_single_minibatch", Severity.ERROR, (CLIP_FRAC, RATIO_ABSDEV, "config .../n_mini"),
          f"clip_frac > 0 or ratio_absdev > {RATIO_ABSDEV_TOLERANCE:g} at n_mini == 1 "
          "(info when n_mini is unknown)", _ClipAtSingleMinibatch),
    Check("update_skipped", Severity.ERROR, (OUTCOME, SKIP_REASON, ZERO_GRAD, NONFINITE_TOTAL),
          "update_outcome == 'skipped', zero-gradient skips excepted (warning outside GRPO)", _UpdateSkipped),
    Check("nonfinite_in_a_row", Severity.ERROR, (NONFINITE_CONSECUTIVE,),
          f"nonfinite_skips_consecutive >= {NONFINITE_CONSECUTIVE_MAX}", _NonfiniteInARow),
    Check("nonfinite_applied", Severity.ERROR, (LOSS, GRAD_NORM, OUTCOME),
          "loss_avg or grad_norm NaN/inf where update_outcome == 'applied'", _NonfiniteApplied),
    Check("ppo_counter_mismatch", Severity.ERROR, (POLICY_STEP, CRITIC_STEP),
          "policy and critic counters advance differently between adjacent frames", _PpoCounters),
    Check("informative_groups_low", Severity.WARNING, (INFORMATIVE, GROUPS, ZERO_GRAD),
          f"informative <= {INFORMATIVE_FRACTION_MIN:.0%} of group_count (or 0); info at a cold start or on "
          "solved prompts", _InformativeGroups),
    Check("kl_spike", Severity.WARNING, (KL_MAX, KL_MEAN, GRAD_NORM),
          f"kl_max >= {KL_RATIO_MIN:g} x kl_mean and >= {KL_MAX_MIN:g} nat, with grad_norm >= "
          f"{GRAD_JUMP_FACTOR:g} x median of the previous {GRAD_BASELINE_WINDOW}", _KlSpike),
    Check("length_budget", Severity.WARNING, (TRUNCATED, LEN_MAX, "config .../max_tokens"),
          f"truncated_frac >= mean of its first {TREND_BASELINE} + {TRUNCATION_RISE:g} with "
          "response_len_max at the budget", _LengthBudget),
    Check("logprob_gap_rising", Severity.WARNING, (GAP_MEAN, GAP_COUNT),
          f"gap >= max({GAP_RISE_FACTOR:g} x baseline, baseline + {GAP_RISE_MIN:g} nats), baseline the median "
          f"of its first {TREND_BASELINE}",
          _LogprobGapRising),
    Check("logprob_gap_no_data", Severity.INFO, (GAP_COUNT, VALID_TOKENS),
          "logprob_gap_token_count == 0 where valid_token_count > 0 (warning when only at some steps)",
          _LogprobGapNoData),
    Check("dpo_accuracy_flat", Severity.WARNING, (DPO_ACCURACY,),
          f"last-{BASELINE_FRACTION:.0%} mean of dpo_accuracy < {DPO_CHANCE + DPO_MIN_RISE:g}", _DpoAccuracy),
    Check("sc_rho_max_large", Severity.WARNING, (SC_RHO_MAX, SC_TOKENS),
          f"sc_rho_max >= {SC_RHO_MAX_LARGE:g}", _ScRhoMax),
    Check("nonfinite_values", Severity.WARNING, ("*",), "any NaN/inf value in the journal", _NonfiniteValues),
    Check("step_order", Severity.WARNING, ("step",), "a step <= an earlier step of the same phase", _StepOrder),
    Check("journal_integrity", Severity.WARNING, ("journal",), "a torn last line was skipped", _JournalIntegrity),
    Check("journal_gap", Severity.ERROR, ("journal",), "a gap record: frames the journal could not keep",
          _JournalGap),
    Check("run_end", Severity.WARNING, ("journal end",), "status 'failed' (info: interrupted, no end record)", _RunEnd),
    Check("zero_grad_skips", Severity.INFO, (ZERO_GRAD,), "zero_grad_skips_total rose", _ZeroGradSkips),
    Check("throughput_drop", Severity.INFO, (TOKENS_PER_S,),
          f"tokens_per_s < {THROUGHPUT_DROP_FRACTION:g} x median of the previous {THROUGHPUT_BASELINE} windows",
          _ThroughputDrop),
)
"""Every check the doctor runs, in report order within a severity."""


TUNABLE: dict[str, tuple[str, ...]] = {
    "clip_at_single_minibatch": ("RATIO_ABSDEV_TOLERANCE",),
    "informative_groups_low": ("INFORMATIVE_FRACTION_MIN", "INFORMATIVE_WARM_FRACTION", "INFORMATIVE_COLD_STEPS"),
    "kl_spike": ("KL_RATIO_MIN", "KL_MAX_MIN", "GRAD_JUMP_FACTOR"),
    "length_budget": ("TRUNCATION_RISE",),
    "logprob_gap_rising": ("GAP_RISE_FACTOR", "GAP_RISE_MIN"),
    "dpo_accuracy_flat": ("DPO_MIN_RISE",),
    "sc_rho_max_large": ("SC_RHO_MAX_LARGE",),
    "nonfinite_in_a_row": ("NONFINITE_CONSECUTIVE_MAX",),
}
"""The thresholds (names in ``thresholds``) a run may override, per check (see :class:`Doctor`)."""


def run_checks(journal: JournalLike, thresholds: Mapping[str, float] | None = None) -> list[Finding]:
    """Every finding of every check in :data:`CHECKS`, errors first, then warnings, then info.

    The frames are read in file order, each handed to every check that reads its phase; the train
    frames are read once before, for the checks that count a series first (the trend checks).
    ``thresholds`` overrides thresholds by name (:data:`TUNABLE`; live health's config)."""
    doctor = Doctor(journal, CHECKS, thresholds)
    if doctor.counting:
        for frame in journal.frames:
            doctor.count(frame)
    for frame in journal.frames:
        doctor.see(frame)
    return doctor.findings()
