"""Checks of the RL signal read frame by frame: clipping at one minibatch, informative groups, KL
spikes, PPO counters, score centering's ``sc_rho_max``."""

from __future__ import annotations

import array
import collections
import statistics
from collections.abc import Iterator

from ..core.frame import Frame
from .engine import Severity, _fmt, _Hit, _number, _Run, _Watch, config_int
from .thresholds import (
    ALL_ONE,
    ALL_ZERO,
    CLIP_FRAC,
    CRITIC_STEP,
    GRAD_BASELINE_MIN,
    GRAD_BASELINE_WINDOW,
    GRAD_JUMP_FACTOR,
    GRAD_NORM,
    GROUPS,
    INFORMATIVE,
    INFORMATIVE_COLD_STEPS,
    INFORMATIVE_FRACTION_MIN,
    INFORMATIVE_WARM_FRACTION,
    KL_MAX,
    KL_MAX_MIN,
    KL_MEAN,
    KL_RATIO_MIN,
    MINIBATCH_CONFIG_NAMES,
    POLICY_STEP,
    RATIO_ABSDEV,
    RATIO_ABSDEV_TOLERANCE,
    SC_RHO_MAX,
    SC_RHO_MAX_LARGE,
    SC_TOKENS,
    ZERO_GRAD,
)


class _ClipAtSingleMinibatch(_Watch):
    def __init__(self, run: _Run) -> None:
        self.ratio_absdev_tolerance = run.threshold("RATIO_ABSDEV_TOLERANCE", RATIO_ABSDEV_TOLERANCE)
        self.n_mini, self.where = config_int(run.config, MINIBATCH_CONFIG_NAMES, prefer="rl")
        self.recorded = False
        self.clip: dict[int, float] = {}  # step -> value where nonzero
        self.ratio: dict[int, float] = {}

    def see(self, frame: Frame) -> None:
        clip, ratio = _number(frame.metrics.get(CLIP_FRAC)), _number(frame.metrics.get(RATIO_ABSDEV))
        if clip is None and ratio is None:
            return
        self.recorded = True
        if self.n_mini != 1:
            return
        if clip is not None and clip > 0.0:
            self.clip[frame.step] = clip
        if ratio is not None and ratio > self.ratio_absdev_tolerance:
            self.ratio[frame.step] = ratio

    def hits(self) -> Iterator[_Hit]:
        if not self.recorded:
            return
        if self.n_mini is None:
            yield _Hit(
                (),
                f"clip_frac/ratio_absdev at one minibatch per batch not checked: the run config does not "
                f"say how many minibatches a batch has ({self.where})",
                "record it in the config handed to the run (e.g. rl/n_mini) so the doctor can check that "
                "clip_frac and ratio_absdev are exactly 0.0 when it is 1",
                (CLIP_FRAC, RATIO_ABSDEV),
                Severity.INFO,
            )
            return
        bad, bad_ratio = self.clip, self.ratio
        steps = sorted(bad.keys() | bad_ratio.keys())
        if not steps:
            return
        worst = ""
        if bad:
            s = max(bad, key=bad.__getitem__)
            worst = f"; clip_frac up to {_fmt(bad[s])} (step {s})"
        if bad_ratio:
            s = max(bad_ratio, key=bad_ratio.__getitem__)
            worst += f"; ratio_absdev up to {_fmt(bad_ratio[s])} (step {s})"
        yield _Hit(
            steps,
            f"clip_frac/ratio_absdev nonzero with one minibatch per batch ({self.where} = 1): with one update "
            f"per batch the policy has not moved since sampling, the ratio is identically 1 and both are "
            f"0.0 by construction, so this is a bug, not tighter training{worst}",
            "find where pi_old comes from: it must be the same policy and forward as the training pass "
            "(not rollout-engine logprobs, not another dtype or a stale copy); see howto/batching.md",
            (CLIP_FRAC, RATIO_ABSDEV),
        )


class _InformativeGroups(_Watch):
    # A frame's counts are read together: the informative groups of a step against the groups that
    # step scored, and the tied groups of the steps found low.
    # Low steps of a cold start (before the run warmed up, within its first steps) and of solved
    # prompts (most ties all 1) are info; the others are the warning (see INFORMATIVE_WARM_FRACTION).
    def __init__(self, run: _Run) -> None:
        self.informative_fraction_min = run.threshold("INFORMATIVE_FRACTION_MIN", INFORMATIVE_FRACTION_MIN)
        self.informative_warm_fraction = run.threshold("INFORMATIVE_WARM_FRACTION", INFORMATIVE_WARM_FRACTION)
        self.informative_cold_steps = run.threshold("INFORMATIVE_COLD_STEPS", INFORMATIVE_COLD_STEPS)
        self.scored = 0  # frames carrying the informative count
        self.low = array.array("q")
        self.cold = array.array("q")
        self.solved = array.array("q")
        self.warm = False  # some step had INFORMATIVE_WARM_FRACTION of its groups informative
        self.tied_zero = self.tied_one = 0.0
        self.zero_grad: float | None = None  # the last zero_grad_skips_total

    def see(self, frame: Frame) -> None:
        metrics = frame.metrics
        skips = _number(metrics.get(ZERO_GRAD))
        if skips is not None:
            self.zero_grad = skips
        value = _number(metrics.get(INFORMATIVE))
        if value is None:
            return
        self.scored += 1
        total = _number(metrics.get(GROUPS))
        if (total is not None and total > 0 and value <= self.informative_fraction_min * total) or (
            total is None and value == 0
        ):
            zero, one = _number(metrics.get(ALL_ZERO)) or 0.0, _number(metrics.get(ALL_ONE)) or 0.0
            if one > zero:
                self.solved.append(frame.step)
            elif not self.warm and self.scored <= self.informative_cold_steps:
                self.cold.append(frame.step)
            else:
                self.low.append(frame.step)
                self.tied_zero += zero
                self.tied_one += one
        elif total is not None and total > 0 and value >= self.informative_warm_fraction * total:
            self.warm = True

    def hits(self) -> Iterator[_Hit]:
        if self.cold:
            yield _Hit(
                self.cold,
                f"informative groups at or below {self.informative_fraction_min:.0%} of the groups scored at "
                f"{len(self.cold)} step(s) of the run's start, before any step had {self.informative_warm_fraction:.0%} "
                "of its groups informative: a cold start (the policy solves almost none of the prompts yet)",
                "nothing while it passes; if it lasts, the prompts are too hard or the verifier fails",
                (INFORMATIVE, GROUPS, ALL_ZERO),
                Severity.INFO,
            )
        if self.solved:
            yield _Hit(
                self.solved,
                f"informative groups at or below {self.informative_fraction_min:.0%} of the groups scored at "
                f"{len(self.solved)} step(s) where most tied groups scored all 1: the policy solves these "
                "prompts, so they carry no more signal",
                "add harder prompts (a curriculum) or filter solved ones (dynamic sampling)",
                (INFORMATIVE, GROUPS, ALL_ONE),
                Severity.INFO,
            )
        if not self.low:
            return
        why = ""
        if self.tied_zero > self.tied_one:
            why = " Most tied groups scored all 0: the task is too hard for the policy or the verifier is failing."
        elif self.tied_one > self.tied_zero:
            why = " Most tied groups scored all 1: the prompts are too easy (or already solved)."
        zero_grad = ""
        if self.zero_grad is not None:
            # A cumulative counter: its last value is what the run skipped (a resumed run's counter
            # includes the earlier part, which is still this run's history).
            zero_grad = (
                f" optim/zero_grad_skips_total reached {_fmt(max(self.zero_grad, 0.0))}: those are the "
                "trainer refusing zero gradients, expected in GRPO, not an optimizer fault."
            )
        yield _Hit(
            self.low,
            f"informative groups at or below {self.informative_fraction_min:.0%} of the groups scored at "
            f"{len(self.low)} of {self.scored} steps: groups whose rewards tie have zero advantage, so "
            f"these batches carry (almost) no gradient signal.{why}{zero_grad}",
            "a data or reward problem, not an optimizer one: check that the reward discriminates between "
            "samples of a group (verifier up, prompt difficulty); consider dynamic sampling "
            "(rl.min_informative_groups)",
            (INFORMATIVE, GROUPS, ZERO_GRAD),
        )


class _KlSpike(_Watch):
    # A spike (kl_max against the same frame's kl_mean) confirmed by a jump of the same frame's
    # grad_norm against the median of the norms recorded before it. Spikes are kept unconfirmed only
    # while no grad_norm has come (a run that records none gets them as an info finding).
    def __init__(self, run: _Run) -> None:
        self.kl_ratio_min = run.threshold("KL_RATIO_MIN", KL_RATIO_MIN)
        self.kl_max_min = run.threshold("KL_MAX_MIN", KL_MAX_MIN)
        self.grad_jump_factor = run.threshold("GRAD_JUMP_FACTOR", GRAD_JUMP_FACTOR)
        self.unconfirmed: dict[int, float] = {}  # step -> kl_max / kl_mean, before any grad_norm
        self.confirmed: dict[int, tuple[float, float]] = {}  # step -> (that ratio, grad_norm / baseline)
        self.recent: collections.deque[float] = collections.deque(maxlen=GRAD_BASELINE_WINDOW)
        self.grad = False

    def see(self, frame: Frame) -> None:
        metrics = frame.metrics
        grad = _number(metrics.get(GRAD_NORM))
        jump = None
        if grad is not None:
            if not self.grad:
                self.grad = True
                self.unconfirmed.clear()  # a run that records grad_norm reports confirmed spikes only
            # zero norms are zero-gradient skips, not a scale: they stay out of the baseline
            history = [v for v in self.recent if v > 0]
            if len(history) >= GRAD_BASELINE_MIN:
                base = statistics.median(history)
                if base > 0 and grad >= self.grad_jump_factor * base:
                    jump = grad / base
            self.recent.append(grad)
        kl_max, kl_mean = _number(metrics.get(KL_MAX)), _number(metrics.get(KL_MEAN))
        if kl_max is None or kl_mean is None or kl_mean <= 0.0:
            return
        if kl_max >= self.kl_max_min and kl_max >= self.kl_ratio_min * kl_mean:
            if not self.grad:
                self.unconfirmed[frame.step] = kl_max / kl_mean
            elif jump is not None:
                self.confirmed[frame.step] = (kl_max / kl_mean, jump)
            else:
                self.confirmed.pop(frame.step, None)  # the step's last frame decides

    def hits(self) -> Iterator[_Hit]:
        keys = (KL_MAX, KL_MEAN, GRAD_NORM)
        if self.unconfirmed:
            yield _Hit(
                sorted(self.unconfirmed),
                f"kl_max is {self.kl_ratio_min:.0f}x kl_mean or more, but train/grad_norm is not recorded, so "
                "the one-token-owns-the-step signature cannot be confirmed",
                "record grad_norm (max_grad_norm > 0) to tell a harmless outlier token from one that owns "
                "the update",
                keys,
                Severity.INFO,
            )
        if self.confirmed:
            worst = max(self.confirmed, key=lambda step: self.confirmed[step][0])
            spike, jump = self.confirmed[worst]
            yield _Hit(
                sorted(self.confirmed),
                f"kl_max orders of magnitude above kl_mean (up to {spike:.3g}x at step {worst}) together "
                f"with a grad_norm jump ({jump:.3g}x its recent median): one token owns the step",
                "bound the per-token KL gradient with rl.kl_coeff_clamp (the reported kl_* stay the exact k3), "
                "and look at which token carries the max penalty",
                keys,
            )


class _PpoCounters(_Watch):
    def __init__(self, run: _Run) -> None:
        self.steps = array.array("q")
        self.details: list[str] = []  # the first three, and how many
        self.mismatches = 0
        self.previous: tuple[int, float, float] | None = None

    def see(self, frame: Frame) -> None:
        policy = _number(frame.metrics.get(POLICY_STEP))
        critic = _number(frame.metrics.get(CRITIC_STEP))
        current = None if policy is None or critic is None else (frame.step, policy, critic)
        previous = self.previous
        if previous is not None and current is not None:
            dp, dc = current[1] - previous[1], current[2] - previous[2]
            if dp != dc:
                self.steps.append(frame.step)
                self.mismatches += 1
                if len(self.details) < 3:
                    self.details.append(f"steps {previous[0]}->{frame.step}: policy +{dp:g}, critic +{dc:g}")
        self.previous = current  # only adjacent frames: a warmup iteration in between breaks the pair

    def hits(self) -> Iterator[_Hit]:
        if self.steps:
            more = f" (and {self.mismatches - 3} more)" if self.mismatches > 3 else ""
            yield _Hit(
                self.steps,
                "PPO policy and critic optimizer counters advanced by different amounts ("
                + "; ".join(self.details) + more + "): both roles must run the same configured number of "
                "minibatches per iteration",
                "a role lost or repeated minibatch updates: check the role receipts, the minibatch settings "
                "of both roles, and optimizer state restored on resume",
                (POLICY_STEP, CRITIC_STEP),
            )


class _ScRhoMax(_Watch):
    def __init__(self, run: _Run) -> None:
        self.sc_rho_max_large = run.threshold("SC_RHO_MAX_LARGE", SC_RHO_MAX_LARGE)
        self.steps = array.array("q")
        self.peak: tuple[int, float] | None = None

    def see(self, frame: Frame) -> None:
        value = _number(frame.metrics.get(SC_RHO_MAX))
        tokens = _number(frame.metrics.get(SC_TOKENS))
        if value is None or value < self.sc_rho_max_large or (tokens is not None and tokens <= 0):
            return
        self.steps.append(frame.step)
        if self.peak is None or value > self.peak[1]:
            self.peak = (frame.step, value)

    def hits(self) -> Iterator[_Hit]:
        if self.peak is not None:
            step, peak = self.peak
            yield _Hit(
                self.steps,
                f"sc_rho_max reached {_fmt(peak)} (step {step}; 1.0 when sampler and trainer agree): a "
                "confident trainer against an unsure sampler, where the 1e-6 tail floor bites",
                "compare sc_head_mass_q/p and sc_kl_head; check that sampler and trainer run the same "
                "weights and temperature, or widen the sampler's top-k head",
                (SC_RHO_MAX, SC_TOKENS),
            )
