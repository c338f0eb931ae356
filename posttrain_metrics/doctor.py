"""The doctor: a run's health read from its journal, the way the metrics reference says to read it.

Each check watches the run's frames go by (a small class, see ``_Watch``), registered in :data:`CHECKS`
with its id, its severity and the keys it reads. A check that fires yields a :class:`Finding`: the steps where it
fires, a one-line explanation and the next thing to do. ``posttrain-metrics doctor`` prints them and
exits non-zero when an error-level check fired, so a CI pipeline can gate on it.

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

Thresholds are the module constants below; each says why it has the value it has. The reference
establishes only two numbers (``clip_frac == ratio_absdev == 0.0`` at ``n_mini == 1``, and a bf16
clip rate 17x the fp32 one); every other threshold here is a judgement, chosen to stay silent on a
healthy run's noise and to fire on the signature the reference describes.

Two values come from the run config in the journal header, matched on the last ``/`` component of a
flat config key (``rl/n_mini``, ``rollout/max_tokens``): the minibatch count
(:data:`MINIBATCH_CONFIG_NAMES`) and the rollout token budget (:data:`BUDGET_CONFIG_NAMES`). When
several keys match with different values, a key under ``rl/`` (minibatches) or ``rollout/``
(budget) wins; if that does not settle it the value is unknown.
"""

from __future__ import annotations

import array
import collections
import dataclasses
import enum
import json
import math
import os
import statistics
import textwrap
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from .core.frame import Frame
from .core.printable import printable
from .core.redact import redact_text

__all__ = [
    "BUDGET_CONFIG_NAMES",
    "CHECKS",
    "MINIBATCH_CONFIG_NAMES",
    "Check",
    "Finding",
    "JournalLike",
    "Severity",
    "config_int",
    "exit_status",
    "format_findings",
    "run_checks",
    "step_ranges",
]


class Severity(str, enum.Enum):
    """How bad a finding is; the order of the members is the order of the report.

    ``ERROR`` makes :func:`exit_status` non-zero; ``WARNING`` and ``INFO`` never do.
    """

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


# -- thresholds ------------------------------------------------------------------------------------

RATIO_ABSDEV_TOLERANCE = 1e-6
"""``ratio_absdev`` at or below this counts as zero at ``n_mini == 1``. The reference says exactly
0.0 (the ratio is identically 1); the tolerance only forgives float noise of a recomputed, bitwise
non-deterministic pi_old forward. ``clip_frac`` has no tolerance: a clipped token needs the ratio
outside ``1 +- eps``, which noise never reaches, so any value above 0.0 fires."""

INFORMATIVE_FRACTION_MIN = 0.1
"""Informative groups at or below this fraction of the groups scored count as "near zero": at most
one group in ten produces a nonzero advantage, so nine tenths of the sampling bought no signal."""

KL_RATIO_MIN = 1000.0
"""``kl_max / kl_mean`` at or above this is "orders of magnitude above": three decades means one
token's K3 penalty outweighs the mean of about a thousand tokens, i.e. one token owns the KL term."""

KL_MAX_MIN = 1.0
"""...and ``kl_max`` must also be at least this many nats (K3 = 1 at a log-ratio of about 1.15 to the
reference). At the first steps the policy is the reference, ``kl_mean`` is ~1e-6 and any ratio is
huge but harmless; a penalty below 1 nat cannot own a step."""

GRAD_JUMP_FACTOR = 5.0
"""A ``grad_norm`` at least this many times the median of the preceding window is a jump. Pre-clip
norms wander by 2-3x on healthy runs; 5x is outside that."""

GRAD_BASELINE_WINDOW = 10
"""Steps of ``grad_norm`` history the jump is measured against (median, robust to earlier jumps)."""

GRAD_BASELINE_MIN = 3
"""Fewer preceding steps than this and no jump is declared: there is no baseline yet."""

TREND_MIN_FRAMES = 4
"""Trend checks (truncation, logprob gap, DPO accuracy) need at least this many frames carrying the
key: with fewer there is no "before" to compare "after" with."""

BASELINE_FRACTION = 0.25
"""Trend checks take their baseline from the first quarter of the run's frames (at least one)."""

TRUNCATION_RISE = 0.1
"""``rollout_truncated_frac`` at least this far (absolute) above its baseline counts as risen: ten
more completions in a hundred now end at the budget. A healthy run's truncation wanders by a few
points. Only steps after the baseline window are judged, so a run whose truncation starts high and
*falls* (the policy learns to stop within the budget) never fires."""

GAP_RISE_FACTOR = 3.0
GAP_RISE_MIN = 0.02
"""``logprob_gap_mean`` has risen when it is at least ``GAP_RISE_FACTOR`` times its baseline *and* at
least ``GAP_RISE_MIN`` nats above it. On a dense model the gap is kernel and precision noise of a few
thousandths of a nat that jitters by a factor of two or three; the absolute floor keeps that noise
from firing, the factor keeps a run whose baseline is already large from firing on drift."""

NONFINITE_CONSECUTIVE_MAX = 3
"""``optim/nonfinite_skips_consecutive`` at or above this is an error: one rejection is a bad batch,
two can be a coincidence, three in a row means the state (weights or optimizer moments), not the
data, produces the non-finite values, and every further step is wasted."""

DPO_CHANCE = 0.5
DPO_MIN_RISE = 0.05
"""DPO accuracy starts near ``DPO_CHANCE``; a run whose last quarter averages below
``DPO_CHANCE + DPO_MIN_RISE`` has not risen. Five points is above the sampling noise of an accuracy
measured on a few hundred pairs per step, and far below what a learning run reaches."""

SC_RHO_MAX_LARGE = 100.0
"""``sc_rho_max`` (``q_tail / p_tail``, both floored at 1e-6; 1.0 when sampler and trainer agree) at
or above this is large: somewhere the sampler puts a hundred times the trainer's tail mass, a
confident trainer against an unsure sampler, which is where the floor starts to bite."""

MINIBATCH_CONFIG_NAMES = ("n_mini", "n_minibatches", "num_minibatches")
"""Config leaves that give the optimizer updates per collected batch (``rl/n_mini``)."""

BUDGET_CONFIG_NAMES = ("max_tokens", "max_new_tokens")
"""Config leaves that give the rollout token budget (``rollout/max_tokens``)."""

# -- keys --------------------------------------------------------------------------------------------

CLIP_FRAC = "train/clip_frac"
RATIO_ABSDEV = "train/ratio_absdev"
GROUPS = "train/grpo_group_count"
INFORMATIVE = "train/grpo_informative_group_count"
ALL_ZERO = "train/grpo_all_zero_group_count"
ALL_ONE = "train/grpo_all_one_group_count"
ZERO_GRAD = "optim/zero_grad_skips_total"
KL_MEAN = "train/kl_mean"
KL_MAX = "train/kl_max"
GRAD_NORM = "train/grad_norm"
LOSS = "train/loss_avg"
TRUNCATED = "train/rollout_truncated_frac"
LEN_MAX = "train/response_len_max"
VALID_SEQ = "train/valid_sequence_count"
VALID_TOKENS = "train/valid_token_count"
GAP_MEAN = "train/logprob_gap_mean"
GAP_P99 = "train/mean_rank_logprob_gap_p99"
GAP_COUNT = "train/logprob_gap_token_count"
OUTCOME = "optim/update_outcome"
SKIP_REASON = "optim/skip_reason"
NONFINITE_TOTAL = "optim/nonfinite_skips_total"
NONFINITE_CONSECUTIVE = "optim/nonfinite_skips_consecutive"
POLICY_STEP = "optim/policy_optimizer_step"
CRITIC_STEP = "optim/critic_optimizer_step"
DPO_ACCURACY = "train/dpo_accuracy"
SC_RHO_MAX = "train/sc_rho_max"
SC_TOKENS = "train/sc_token_count"


# -- what the checks read ------------------------------------------------------------------------------


class Frames(Protocol):
    """A journal's frames as the doctor reads them: in file order, possibly more than once (a list, or
    ``posttrain_metrics.journal.FramesOnDisk``, which parses the file again at each pass)."""

    def __iter__(self) -> Iterator[Frame]: ...

    def __len__(self) -> int: ...


class PhaseSpanLike(Protocol):
    """A phase's frame count and step range (``posttrain_metrics.journal.PhaseSpan``)."""

    @property
    def frames(self) -> int: ...

    @property
    def first_step(self) -> int: ...

    @property
    def last_step(self) -> int: ...


class JournalLike(Protocol):
    """What the doctor needs of a journal (``posttrain_metrics.journal.Journal`` and ``JournalOnDisk``
    have it); the doctor does not import the journal, so it names the shape rather than the class."""

    @property
    def path(self) -> os.PathLike[str]: ...

    @property
    def header(self) -> Mapping[str, Any]: ...

    @property
    def frames(self) -> Frames: ...

    @property
    def phases(self) -> Mapping[str, PhaseSpanLike]: ...

    @property
    def end(self) -> Mapping[str, Any] | None: ...

    @property
    def warnings(self) -> Sequence[str]: ...

    @property
    def run_id(self) -> str: ...

    @property
    def adapters(self) -> Sequence[str]: ...

    @property
    def config(self) -> Mapping[str, Any]: ...


@dataclasses.dataclass(frozen=True)
class Finding:
    """One check that fired: where (``steps``, empty for a run-level finding), why and what next.

    ``keys`` are the journal keys the finding is about (the plot marks the panels that show them).
    """

    check: str
    severity: Severity
    steps: tuple[int, ...]
    explanation: str
    next_step: str
    keys: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "severity": self.severity.value,
            "steps": list(self.steps),
            "step_ranges": step_ranges(self.steps),
            "explanation": self.explanation,
            "next_step": self.next_step,
            "keys": list(self.keys),
        }


@dataclasses.dataclass(frozen=True)
class _Hit:
    """What a check yields; :func:`run_checks` adds the check's id and default severity."""

    steps: Iterable[int]
    explanation: str
    next_step: str
    keys: tuple[str, ...]
    severity: Severity | None = None


class _Run:
    """What every check knows before the frames go by: the journal, its config and adapters."""

    def __init__(self, journal: JournalLike) -> None:
        self.journal = journal
        self.config = dict(journal.config)
        self.adapters = tuple(journal.adapters)


class _Watch:
    """A check reading the run as its frames go by, in file order (:meth:`see`; the train frames only
    unless ``every_phase``), then saying what it found (:meth:`hits`). A check holds what it needs to
    remember, not the frames: the doctor reads a journal of any length in memory that grows only with
    the steps its findings name and a quarter of a trend check's series (see :class:`_Trend`)."""

    every_phase = False
    counts = False  # reads the train frames in a first pass too (count)

    def count(self, frame: Frame) -> None:
        """One train frame of the first pass, for a check whose ``counts`` is set."""

    def see(self, frame: Frame) -> None:
        """One frame, in file order."""

    def hits(self) -> Iterator[_Hit]:
        """What the check found, once every frame was seen."""
        return iter(())


class _Series:
    """Part of a trend check's series: ``(step, value)`` points in 16 bytes each (two arrays)."""

    def __init__(self) -> None:
        self.steps: array.array[int] = array.array("q")
        self.values: array.array[float] = array.array("d")

    def add(self, step: int, value: float) -> None:
        self.steps.append(step)
        self.values.append(value)

    def __len__(self) -> int:
        return len(self.values)

    def points(self) -> Iterator[tuple[int, float]]:
        return zip(self.steps, self.values)


def _number(value: object) -> float | None:
    """A finite int or float as a float; ``None`` for absent, labels, bools and non-finite values."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def config_int(config: Mapping[str, Any], names: Sequence[str], prefer: str = "") -> tuple[int | None, str]:
    """An integer from the flat run config: ``(value, where)`` or ``(None, why not)``.

    A key matches when its last ``/`` component is one of ``names``. Different values under several
    matching keys are settled by the ones starting with ``prefer/``, or give ``None``.

    >>> config_int({"rl/n_mini": 4, "model/hidden": 8}, ("n_mini",))
    (4, 'rl/n_mini')
    >>> config_int({}, ("n_mini",))[0] is None
    True
    """
    found: dict[str, int] = {}
    for key, raw in config.items():
        if str(key).rsplit("/", 1)[-1] not in names:
            continue
        value = _as_int(raw)
        if value is not None:
            found[str(key)] = value
    wanted = " or ".join(f"'.../{n}'" for n in names)
    if not found:
        return None, f"no config key named {wanted}"
    for candidates in (found, {k: v for k, v in found.items() if prefer and k.startswith(prefer + "/")}):
        if len(set(candidates.values())) == 1:
            key = sorted(candidates)[0]
            return candidates[key], key
    return None, f"config keys disagree: {', '.join(f'{k}={v}' for k, v in sorted(found.items()))}"


def _as_int(raw: object) -> int | None:
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw
    if isinstance(raw, float) and raw.is_integer():
        return int(raw)
    if isinstance(raw, str) and raw.strip().lstrip("-").isdigit():
        return int(raw.strip())
    return None


def _count(items: Sequence[object], noun: str) -> str:
    return f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"


def _fmt(value: float) -> str:
    return f"{value:.4g}"


# -- the checks ------------------------------------------------------------------------------------------


class _ClipAtSingleMinibatch(_Watch):
    def __init__(self, run: _Run) -> None:
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
        if ratio is not None and ratio > RATIO_ABSDEV_TOLERANCE:
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
    def __init__(self, run: _Run) -> None:
        self.scored = 0  # frames carrying the informative count
        self.low = array.array("q")
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
        if (total is not None and total > 0 and value <= INFORMATIVE_FRACTION_MIN * total) or (
            total is None and value == 0
        ):
            self.low.append(frame.step)
            self.tied_zero += _number(metrics.get(ALL_ZERO)) or 0.0
            self.tied_one += _number(metrics.get(ALL_ONE)) or 0.0

    def hits(self) -> Iterator[_Hit]:
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
            f"informative groups at or below {INFORMATIVE_FRACTION_MIN:.0%} of the groups scored at "
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
                if base > 0 and grad >= GRAD_JUMP_FACTOR * base:
                    jump = grad / base
            self.recent.append(grad)
        kl_max, kl_mean = _number(metrics.get(KL_MAX)), _number(metrics.get(KL_MEAN))
        if kl_max is None or kl_mean is None or kl_mean <= 0.0:
            return
        if kl_max >= KL_MAX_MIN and kl_max >= KL_RATIO_MIN * kl_mean:
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
                f"kl_max is {KL_RATIO_MIN:.0f}x kl_mean or more, but train/grad_norm is not recorded, so "
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


class _Trend(_Watch):
    """A trend check: one series (:meth:`value` of a train frame) whose first or last quarter is compared
    with the rest. The first pass counts the series' points, so the main pass knows where the quarter
    ends as it goes and keeps that quarter only (8-16 bytes a point), not the series."""

    counts = True

    def __init__(self) -> None:
        self.n = 0  # the series' points, counted in the first pass
        self.i = 0  # the points seen so far in the main pass

    def value(self, frame: Frame) -> float | None:
        raise NotImplementedError

    def count(self, frame: Frame) -> None:
        if self.value(frame) is not None:
            self.n += 1

    @property
    def quarter(self) -> int:
        """The points of the series' baseline (its first ``BASELINE_FRACTION``, at least one)."""
        return max(1, math.ceil(self.n * BASELINE_FRACTION))


class _LengthBudget(_Trend):
    def __init__(self, run: _Run) -> None:
        super().__init__()
        self.config = run.config
        self.longest: float | None = None  # the run's longest response (the first pass)
        self.budget: tuple[int, str] | None = None  # and where it comes from, settled at the main pass
        self.first: array.array[float] = array.array("d")  # the baseline's values
        self.base = 0.0
        self.risen = array.array("q")
        self.peak = -math.inf

    def value(self, frame: Frame) -> float | None:
        return _number(frame.metrics.get(TRUNCATED))

    def count(self, frame: Frame) -> None:
        super().count(frame)
        length = _number(frame.metrics.get(LEN_MAX))
        if length is not None:
            self.longest = length if self.longest is None else max(self.longest, length)

    def _budget(self, longest: float) -> tuple[int, str]:
        budget, where = config_int(self.config, BUDGET_CONFIG_NAMES, prefer="rollout")
        if budget is None:
            return int(longest), f"the run's longest response ({where}; set rollout/max_tokens in the config to be exact)"
        return budget, where

    def see(self, frame: Frame) -> None:
        value = self.value(frame)
        if value is None or self.n < TREND_MIN_FRAMES or self.longest is None:
            return
        if self.budget is None:
            self.budget = self._budget(self.longest)
        self.i += 1
        if self.i <= self.quarter:
            self.first.append(value)
            if self.i == self.quarter:
                self.base = statistics.fmean(self.first)
                self.first = array.array("d")
            return
        length = _number(frame.metrics.get(LEN_MAX))
        if value >= self.base + TRUNCATION_RISE and length is not None and length >= self.budget[0]:
            self.risen.append(frame.step)
            self.peak = max(self.peak, value)

    def hits(self) -> Iterator[_Hit]:
        if not self.risen or self.budget is None:
            return
        budget, where = self.budget
        yield _Hit(
            self.risen,
            f"rollout_truncated_frac rose from {_fmt(self.base)} (first {BASELINE_FRACTION:.0%} of steps) to up "
            f"to {_fmt(self.peak)} with response_len_max pinned at the budget {budget} (from {where}): responses "
            "are running into the token budget, and each cut completion is scored on an unfinished answer",
            "raise rollout.max_tokens, add a length penalty, or mask cut completions out of the loss "
            "(rl.mask_truncated_completions; train/valid_sequence_count then drops)",
            (TRUNCATED, LEN_MAX, VALID_SEQ),
        )


class _LogprobGapRising(_Trend):
    def __init__(self, run: _Run) -> None:
        super().__init__()
        self.first = _Series()  # the baseline's points, until the baseline is known
        self.floor = math.inf
        self.base = 0.0
        self.risen = array.array("q")
        self.peak = -math.inf

    def value(self, frame: Frame) -> float | None:
        # a gap over no tokens (a count of 0) is no measurement; a gap without a count is one
        value, count = _number(frame.metrics.get(GAP_MEAN)), _number(frame.metrics.get(GAP_COUNT))
        return value if count is None or count > 0 else None

    def see(self, frame: Frame) -> None:
        value = self.value(frame)
        if value is None or self.n < TREND_MIN_FRAMES:
            return
        self.i += 1
        if self.i < self.quarter:
            self.first.add(frame.step, value)
            return
        if self.i == self.quarter:  # the baseline is known: judge its own points, then the rest as they come
            self.first.add(frame.step, value)
            self.base = statistics.median(self.first.values)
            self.floor = max(GAP_RISE_FACTOR * self.base, self.base + GAP_RISE_MIN)
            for step, v in self.first.points():
                self._judge(step, v)
            self.first = _Series()
            return
        self._judge(frame.step, value)

    def _judge(self, step: int, value: float) -> None:
        if value >= self.floor:
            self.risen.append(step)
            self.peak = max(self.peak, value)

    def hits(self) -> Iterator[_Hit]:
        if not self.risen:
            return
        yield _Hit(
            self.risen,
            f"the train/infer logprob gap rose from {_fmt(self.base)} to {_fmt(self.peak)} nats: on an MoE "
            "policy a rising gap is the routing-flip collapse signature (GSPO, Rollout Routing Replay); on a "
            "dense model it should stay at kernel and precision noise",
            "MoE: replay the rollout's routing (rl.routing_replay=rollout) or use sequence-level ratios "
            "(GSPO); do not use rollout logprobs as pi_old while the gap is large; dense: compare the "
            "engine's and the trainer's precision and kernels",
            (GAP_MEAN, GAP_P99, GAP_COUNT),
        )


class _LogprobGapNoData(_Watch):
    # A step with no loss tokens (every group tied and masked out) has nothing to compare: its
    # count is 0 without saying anything about the producer, so it is not counted either way. The
    # first pass counts; the steps are kept only when some, not all, are empty (the finding names them).
    counts = True

    def __init__(self, run: _Run) -> None:
        self.counted = self.empties = 0
        self.empty = array.array("q")

    def _empty(self, frame: Frame) -> bool | None:
        """Whether the frame's gap count is 0; None when the frame does not count."""
        count = _number(frame.metrics.get(GAP_COUNT))
        tokens = _number(frame.metrics.get(VALID_TOKENS))
        if count is None or (tokens is not None and tokens <= 0):
            return None
        return count == 0

    def count(self, frame: Frame) -> None:
        empty = self._empty(frame)
        if empty is not None:
            self.counted += 1
            self.empties += empty

    def see(self, frame: Frame) -> None:
        if 0 < self.empties < self.counted and self._empty(frame):
            self.empty.append(frame.step)

    def hits(self) -> Iterator[_Hit]:
        if not self.empties:
            return
        keys = (GAP_COUNT, GAP_MEAN)
        if self.empties == self.counted:
            yield _Hit(
                (),
                "logprob_gap_token_count is 0 at every step: the rollout records no logprobs, so the "
                "logprob_gap_* keys read 0.0 for lack of data, not for lack of a gap",
                "to measure train/infer consistency use a rollout that records logprobs (vLLM always does; "
                "HFRollout(capture_logprobs=True))",
                keys,
            )
            return
        yield _Hit(
            self.empty,
            f"logprob_gap_token_count is 0 at {self.empties} of {self.counted} steps: the gap there is 0.0 "
            "for lack of data, not for lack of a gap, and the producer records logprobs only sometimes",
            "find which rollout produced those batches; read the gap only where the count is positive",
            keys,
            Severity.WARNING,
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
        self.steps = array.array("q")
        self.peak = -math.inf

    def see(self, frame: Frame) -> None:
        value = _number(frame.metrics.get(NONFINITE_CONSECUTIVE))
        if value is not None:
            self.peak = max(self.peak, value)
            if value >= NONFINITE_CONSECUTIVE_MAX:
                self.steps.append(frame.step)

    def hits(self) -> Iterator[_Hit]:
        if self.steps:
            yield _Hit(
                self.steps,
                f"{_fmt(self.peak)} non-finite rejections in a row (threshold {NONFINITE_CONSECUTIVE_MAX}): the "
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


class _DpoAccuracy(_Trend):
    def __init__(self, run: _Run) -> None:
        super().__init__()
        self.tail = _Series()  # the last quarter's points

    def value(self, frame: Frame) -> float | None:
        return _number(frame.metrics.get(DPO_ACCURACY))

    def see(self, frame: Frame) -> None:
        value = self.value(frame)
        if value is None or self.n < TREND_MIN_FRAMES:
            return
        self.i += 1
        if self.i > self.n - self.quarter:
            self.tail.add(frame.step, value)

    def hits(self) -> Iterator[_Hit]:
        tail = self.tail
        if not len(tail):
            return
        level = statistics.fmean(tail.values)
        if level >= DPO_CHANCE + DPO_MIN_RISE:
            return
        below = level <= DPO_CHANCE - DPO_MIN_RISE
        yield _Hit(
            tail.steps,
            f"train/dpo_accuracy averages {_fmt(level)} over the last {len(tail)} steps: it has not risen "
            f"from chance ({DPO_CHANCE})"
            + ("; below chance, the policy prefers the rejected samples" if below else ""),
            ("check that winner and loser are not swapped in the data; " if below else "")
            + "check the learning rate, beta and the reference model (dpo_reward_margin, dpo_err_*)",
            (DPO_ACCURACY,),
        )


class _ScRhoMax(_Watch):
    def __init__(self, run: _Run) -> None:
        self.steps = array.array("q")
        self.peak: tuple[int, float] | None = None

    def see(self, frame: Frame) -> None:
        value = _number(frame.metrics.get(SC_RHO_MAX))
        tokens = _number(frame.metrics.get(SC_TOKENS))
        if value is None or value < SC_RHO_MAX_LARGE or (tokens is not None and tokens <= 0):
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


# -- throughput (issue 28) ----------------------------------------------------------------------------

TOKENS_PER_S = "perf/tokens_per_s"
THROUGHPUT_DROP_FRACTION = 0.5
"""tokens/s below this fraction of the recent median is a sudden drop: halving is far outside the
window-to-window noise of a steady run, and what a straggler, a swap storm or a throttled device does."""
THROUGHPUT_BASELINE = 8
"""The recent median is over this many previous windows that counted tokens (a window with no
counted token says nothing about speed and is left out)."""


class _ThroughputDrop(_Watch):
    def __init__(self, run: _Run) -> None:
        self.recent: list[float] = []
        self.steps = array.array("q")
        self.worst = math.inf  # the lowest value / baseline seen at a drop

    def see(self, frame: Frame) -> None:
        value = _number(frame.metrics.get(TOKENS_PER_S))
        if value is None or not math.isfinite(value) or value <= 0:
            return
        if len(self.recent) >= THROUGHPUT_BASELINE:
            baseline = statistics.median(self.recent)
            if value < THROUGHPUT_DROP_FRACTION * baseline:
                self.steps.append(frame.step)
                self.worst = min(self.worst, value / baseline)
        self.recent.append(value)
        del self.recent[:-THROUGHPUT_BASELINE]

    def hits(self) -> Iterator[_Hit]:
        if self.steps:
            yield _Hit(
                self.steps,
                f"tokens/s fell below {THROUGHPUT_DROP_FRACTION:.0%} of the median of the previous "
                f"{THROUGHPUT_BASELINE} windows at {_count(self.steps, 'step')} (down to {self.worst:.0%})",
                "compare perf/window_s with perf/window_s_mean (one slow rank, or all?) and the timer/ stages "
                "of those steps; memory (perf/*_peak_gib) near the device's limit is a usual suspect",
                (TOKENS_PER_S, "perf/window_s", "perf/window_s_mean"),
            )


# -- the table -----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Check:
    """A registered check: its id, default severity, the keys it reads, its threshold in words, and
    what watches the frames for it (made afresh for each run)."""

    id: str
    severity: Severity
    reads: tuple[str, ...]
    threshold: str
    watch: Callable[[_Run], _Watch]

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "severity": self.severity.value, "reads": list(self.reads),
                "threshold": self.threshold}


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
          f"informative <= {INFORMATIVE_FRACTION_MIN:.0%} of group_count (or 0)", _InformativeGroups),
    Check("kl_spike", Severity.WARNING, (KL_MAX, KL_MEAN, GRAD_NORM),
          f"kl_max >= {KL_RATIO_MIN:g} x kl_mean and >= {KL_MAX_MIN:g} nat, with grad_norm >= "
          f"{GRAD_JUMP_FACTOR:g} x median of the previous {GRAD_BASELINE_WINDOW}", _KlSpike),
    Check("length_budget", Severity.WARNING, (TRUNCATED, LEN_MAX, "config .../max_tokens"),
          f"truncated_frac >= first-{BASELINE_FRACTION:.0%} mean + {TRUNCATION_RISE:g} with "
          "response_len_max at the budget", _LengthBudget),
    Check("logprob_gap_rising", Severity.WARNING, (GAP_MEAN, GAP_COUNT),
          f"gap >= max({GAP_RISE_FACTOR:g} x baseline, baseline + {GAP_RISE_MIN:g} nats)",
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


def run_checks(journal: JournalLike) -> list[Finding]:
    """Every finding of every check in :data:`CHECKS`, errors first, then warnings, then info.

    The frames are read in file order, each handed to every check that reads its phase; the train
    frames are read once before, for the checks that count a series first (:class:`_Trend`)."""
    run = _Run(journal)
    watches = [check.watch(run) for check in CHECKS]
    counting = [w for w in watches if w.counts]
    if counting:
        for frame in journal.frames:
            if frame.phase == "train":
                for watch in counting:
                    watch.count(frame)
    every_phase = [w for w in watches if w.every_phase]
    for frame in journal.frames:
        for watch in watches if frame.phase == "train" else every_phase:
            watch.see(frame)
    findings = []
    for check, watch in zip(CHECKS, watches):
        for hit in watch.hits():
            findings.append(
                Finding(check.id, hit.severity or check.severity, tuple(sorted(set(hit.steps))),
                        hit.explanation, hit.next_step, hit.keys)
            )
    order = list(Severity)
    return sorted(findings, key=lambda f: order.index(f.severity))  # stable: table order within


def exit_status(findings: Iterable[Finding]) -> int:
    """1 when an error-level check fired, else 0 (a CI pipeline gates on it)."""
    return 1 if any(f.severity is Severity.ERROR for f in findings) else 0


def step_ranges(steps: Iterable[int], *, limit: int | None = None) -> str:
    """Steps compressed into ranges; ``limit`` caps the ranges shown.

    >>> step_ranges([12, 13, 14, 18, 40, 41])
    '12-14, 18, 40-41'
    >>> step_ranges(range(0, 20, 2), limit=3)
    '0, 2, 4, ... (+7 more)'
    """
    ordered = sorted(set(steps))
    ranges: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        ranges.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    if limit is not None and len(ranges) > limit:
        return ", ".join(ranges[:limit]) + f", ... (+{len(ranges) - limit} more)"
    return ", ".join(ranges)


def _run_summary(journal: JournalLike) -> dict[str, Any]:
    end = journal.end
    return {
        "id": journal.run_id,
        "name": redact_text(str(journal.header.get("name", ""))),  # a journal older than the rule
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
