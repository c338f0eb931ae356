"""Trend checks: a series' first points or last quarter against the rest (truncation against the token
budget, the logprob gap, DPO accuracy), and the logprob gap's data.

Truncation and the logprob gap are causal: their baseline is the series' first ``TREND_BASELINE``
points, so what they say at a step depends on the frames up to it only, and the live doctor (live
health) and the offline one name the same steps. DPO accuracy (its last quarter) and the gap's data
(every step or only some) judge the whole run: they count their series in a first pass, so that they
keep a quarter of it, not the series."""

from __future__ import annotations

import array
import math
import statistics
from collections.abc import Iterator

from ..core.frame import Frame
from .engine import Severity, _count, _fmt, _Hit, _number, _Run, _Watch, config_int
from .thresholds import (
    BASELINE_FRACTION,
    BUDGET_CONFIG_NAMES,
    DPO_ACCURACY,
    DPO_CHANCE,
    DPO_MIN_RISE,
    GAP_COUNT,
    GAP_MEAN,
    GAP_P99,
    GAP_RISE_FACTOR,
    GAP_RISE_MIN,
    LEN_MAX,
    THROUGHPUT_BASELINE,
    THROUGHPUT_DROP_FRACTION,
    TOKENS_PER_S,
    TREND_BASELINE,
    TREND_MIN_FRAMES,
    TRUNCATED,
    TRUNCATION_RISE,
    VALID_SEQ,
    VALID_TOKENS,
)


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


class _Trend(_Watch):
    """A trend check over the whole run: one series (:meth:`value` of a train frame) whose last quarter
    is judged. The first pass counts the series' points, so the main pass knows where the quarter
    begins as it goes and keeps that quarter only (16 bytes a point), not the series."""

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
        """The points of the series' last quarter (``BASELINE_FRACTION`` of them, at least one)."""
        return max(1, math.ceil(self.n * BASELINE_FRACTION))


class _Baselined(_Watch):
    """A causal trend check: one series (:meth:`value` of a train frame) whose first ``TREND_BASELINE``
    points are its baseline; each later point is judged against it as it comes. The points of the
    baseline are not judged (the baseline is not complete before its last one), so a finding at a step
    depends on the frames up to that step only: the live and the offline doctor name the same steps."""

    def __init__(self) -> None:
        self.first: array.array[float] = array.array("d")  # the baseline's values, while it fills
        self.known = False  # the baseline is complete
        self.base = 0.0
        self.risen = array.array("q")
        self.peak = -math.inf

    def value(self, frame: Frame) -> float | None:
        raise NotImplementedError

    def baseline(self, values: array.array[float]) -> None:
        """Settle the baseline from its ``TREND_BASELINE`` values."""
        raise NotImplementedError

    def judge(self, frame: Frame, value: float) -> bool:
        """Whether a point after the baseline has risen."""
        raise NotImplementedError

    def see(self, frame: Frame) -> None:
        value = self.value(frame)
        if value is None:
            return
        if not self.known:
            self.first.append(value)
            if len(self.first) == TREND_BASELINE:
                self.baseline(self.first)
                self.known, self.first = True, array.array("d")
            return
        if self.judge(frame, value):
            self.risen.append(frame.step)
            self.peak = max(self.peak, value)


class _LengthBudget(_Baselined):
    def __init__(self, run: _Run) -> None:
        self.truncation_rise = run.threshold("TRUNCATION_RISE", TRUNCATION_RISE)
        super().__init__()
        budget, where = config_int(run.config, BUDGET_CONFIG_NAMES, prefer="rollout")
        self.configured = budget is not None
        self.where = where
        # the budget: the config's, else the longest response so far (settled as the frames come)
        self.budget: float | None = float(budget) if budget is not None else None

    def value(self, frame: Frame) -> float | None:
        return _number(frame.metrics.get(TRUNCATED))

    def see(self, frame: Frame) -> None:
        length = _number(frame.metrics.get(LEN_MAX))
        if length is not None and not self.configured:
            self.budget = length if self.budget is None else max(self.budget, length)
        super().see(frame)

    def baseline(self, values: array.array[float]) -> None:
        self.base = statistics.fmean(values)

    def judge(self, frame: Frame, value: float) -> bool:
        length = _number(frame.metrics.get(LEN_MAX))
        return (value >= self.base + self.truncation_rise and length is not None and self.budget is not None
                and length >= self.budget)

    def hits(self) -> Iterator[_Hit]:
        if not self.risen or self.budget is None:
            return
        budget = int(self.budget)
        where = (self.where if self.configured else
                 f"the run's longest response so far ({self.where}; set rollout/max_tokens in the config to be exact)")
        yield _Hit(
            self.risen,
            f"rollout_truncated_frac rose from {_fmt(self.base)} (its first {TREND_BASELINE} steps) to up "
            f"to {_fmt(self.peak)} with response_len_max pinned at the budget {budget} (from {where}): responses "
            "are running into the token budget, and each cut completion is scored on an unfinished answer",
            "raise rollout.max_tokens, add a length penalty, or mask cut completions out of the loss "
            "(rl.mask_truncated_completions; train/valid_sequence_count then drops)",
            (TRUNCATED, LEN_MAX, VALID_SEQ),
        )


class _LogprobGapRising(_Baselined):
    def __init__(self, run: _Run) -> None:
        self.gap_rise_factor = run.threshold("GAP_RISE_FACTOR", GAP_RISE_FACTOR)
        self.gap_rise_min = run.threshold("GAP_RISE_MIN", GAP_RISE_MIN)
        super().__init__()
        self.floor = math.inf

    def value(self, frame: Frame) -> float | None:
        # a gap over no tokens (a count of 0) is no measurement; a gap without a count is one
        value, count = _number(frame.metrics.get(GAP_MEAN)), _number(frame.metrics.get(GAP_COUNT))
        return value if count is None or count > 0 else None

    def baseline(self, values: array.array[float]) -> None:
        self.base = statistics.median(values)
        self.floor = max(self.gap_rise_factor * self.base, self.base + self.gap_rise_min)

    def judge(self, frame: Frame, value: float) -> bool:
        return value >= self.floor

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


class _DpoAccuracy(_Trend):
    def __init__(self, run: _Run) -> None:
        self.dpo_min_rise = run.threshold("DPO_MIN_RISE", DPO_MIN_RISE)
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
        if level >= DPO_CHANCE + self.dpo_min_rise:
            return
        below = level <= DPO_CHANCE - self.dpo_min_rise
        yield _Hit(
            tail.steps,
            f"train/dpo_accuracy averages {_fmt(level)} over the last {len(tail)} steps: it has not risen "
            f"from chance ({DPO_CHANCE})"
            + ("; below chance, the policy prefers the rejected samples" if below else ""),
            ("check that winner and loser are not swapped in the data; " if below else "")
            + "check the learning rate, beta and the reference model (dpo_reward_margin, dpo_err_*)",
            (DPO_ACCURACY,),
        )


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
