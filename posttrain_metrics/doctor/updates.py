"""Checks of the optimizer's updates and the values' health: rejected and zero-gradient skips,
non-finite rejections in a row, a non-finite loss on an applied update, non-finite values."""

from __future__ import annotations

import array
import math
from collections.abc import Iterator

from ..core.frame import Frame
from .engine import Severity, _count, _fmt, _Hit, _number, _Run, _Watch
from .thresholds import (
    GRAD_NORM,
    INFORMATIVE,
    LOSS,
    NONFINITE_CONSECUTIVE,
    NONFINITE_CONSECUTIVE_MAX,
    NONFINITE_TOTAL,
    OUTCOME,
    SKIP_REASON,
    ZERO_GRAD,
)


class _Skips(_Watch):
    """Rejected updates ``(step, reason)`` and zero-gradient skips (steps) of the train frames.

    A skip counts as a zero-gradient skip, expected in GRPO, when it names no ``skip_reason``, the
    frame's ``zero_grad_skips_total`` rose and ``nonfinite_skips_total`` did not.
    """

    def __init__(self, run: _Run) -> None:
        self.adapters = run.adapters
        self.rejected: list[tuple[int, str]] = []
        self.zero_grad = array.array("q")
        self.previous = {ZERO_GRAD: 0.0, NONFINITE_TOTAL: 0.0}

    def see(self, frame: Frame) -> None:
        previous = self.previous
        now = {k: _number(frame.metrics.get(k)) for k in previous}
        rose = {k: v is not None and v > previous[k] for k, v in now.items()}
        if rose[ZERO_GRAD]:
            self.zero_grad.append(frame.step)
        if frame.metrics.get(OUTCOME) == "skipped":
            reason = frame.metrics.get(SKIP_REASON)
            if reason is not None or rose[NONFINITE_TOTAL] or not rose[ZERO_GRAD]:
                self.rejected.append((frame.step, str(reason) if reason is not None else "no skip_reason"))
        previous.update({k: v for k, v in now.items() if v is not None})


class _UpdateSkipped(_Skips):
    def hits(self) -> Iterator[_Hit]:
        rejected = self.rejected
        if not rejected:
            return
        reasons: dict[str, int] = {}
        for _, reason in rejected:
            reasons[reason] = reasons.get(reason, 0) + 1
        why = ", ".join(f"{r} x{n}" for r, n in sorted(reasons.items()))
        grpo = "grpo" in self.adapters
        fate = (
            "at the GRPO entry this is fatal: the loop raises rather than continuing on a rejected update"
            if grpo
            else "the update was rejected and its batch lost"
        )
        yield _Hit(
            [s for s, _ in rejected],
            f"optim/update_outcome is 'skipped' at {_count(rejected, 'step')} ({why}): {fate}",
            "go to the first such step: a non-finite loss (rewards, logprob dtype) or gradient (learning "
            "rate, max_grad_norm); resume from a checkpoint before it",
            (OUTCOME, SKIP_REASON, LOSS, GRAD_NORM),
            None if grpo else Severity.WARNING,
        )


class _ZeroGradSkips(_Skips):
    def hits(self) -> Iterator[_Hit]:
        steps = self.zero_grad
        if steps:
            yield _Hit(
                steps,
                f"optim/zero_grad_skips_total rose at {_count(steps, 'step')}: the trainer skipped updates "
                "whose gradient was exactly zero (all groups tied), which is expected in GRPO, not a fault",
                "read it with train/grpo_informative_group_count; only a reward that stops discriminating "
                "(informative groups near zero) makes it a problem",
                (ZERO_GRAD, OUTCOME, INFORMATIVE),
            )


class _NonfiniteInARow(_Watch):
    def __init__(self, run: _Run) -> None:
        self.nonfinite_consecutive_max = run.threshold("NONFINITE_CONSECUTIVE_MAX", NONFINITE_CONSECUTIVE_MAX)
        self.steps = array.array("q")
        self.peak = -math.inf

    def see(self, frame: Frame) -> None:
        value = _number(frame.metrics.get(NONFINITE_CONSECUTIVE))
        if value is not None:
            self.peak = max(self.peak, value)
            if value >= self.nonfinite_consecutive_max:
                self.steps.append(frame.step)

    def hits(self) -> Iterator[_Hit]:
        if self.steps:
            yield _Hit(
                self.steps,
                f"{_fmt(self.peak)} non-finite rejections in a row (threshold {self.nonfinite_consecutive_max}): the "
                "weights or optimizer state, not one bad batch, produce the non-finite values",
                "stop the run and resume from a checkpoint before the first rejection with a lower learning "
                "rate or gradient clipping; check the loss and logprob precision",
                (NONFINITE_CONSECUTIVE, NONFINITE_TOTAL, OUTCOME),
            )


class _NonfiniteApplied(_Watch):
    def __init__(self, run: _Run) -> None:
        self.steps = array.array("q")
        self.keys: set[str] = set()

    def see(self, frame: Frame) -> None:
        if frame.metrics.get(OUTCOME) != "applied":
            return
        bad = [k for k in (LOSS, GRAD_NORM) if _is_nonfinite(frame.metrics.get(k))]
        if bad:
            self.steps.append(frame.step)
            self.keys.update(bad)

    def hits(self) -> Iterator[_Hit]:
        if self.steps:
            keys = sorted(self.keys)
            yield _Hit(
                self.steps,
                f"a non-finite {' / '.join(keys)} on an update whose outcome is 'applied': the "
                "optimizer stepped on it, so the weights may now be non-finite",
                "turn on force_finite_grads (optim/finite_gradient_check_enabled) and resume from a "
                "checkpoint before the first such step",
                (*keys, OUTCOME),
            )


def _is_nonfinite(value: object) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


class _NonfiniteValues(_Watch):
    every_phase = True

    def __init__(self, run: _Run) -> None:
        self.where: dict[str, array.array[int]] = {}

    def see(self, frame: Frame) -> None:
        for key, value in frame.metrics.items():
            if isinstance(value, float) and value - value != 0.0:  # NaN or +-inf, in one operation
                self.where.setdefault(key, array.array("q")).append(frame.step)

    def hits(self) -> Iterator[_Hit]:
        # one finding per set of steps, so a finding's keys are non-finite at every one of its steps
        by_steps: dict[tuple[int, ...], list[str]] = {}
        for key, steps in sorted(self.where.items()):
            by_steps.setdefault(tuple(sorted(set(steps))), []).append(key)
        for at, keys in sorted(by_steps.items()):
            listed = ", ".join(keys[:6]) + (f" and {len(keys) - 6} more" if len(keys) > 6 else "")
            yield _Hit(
                at,
                f"non-finite values (NaN/inf) in {_count(keys, 'key')}: {listed}",
                "trace the first step back to its producer (loss, rewards, logprobs); the journal keeps the "
                "values exactly, trackers that cannot store them count them under health/nonfinite/<key>",
                tuple(keys),
            )
