"""A real, tiny GRPO run in plain torch: the training half of ``posttrain-metrics demo``.

The task has a verifiable 0/1 reward. A prompt is a target number ``t``; the policy writes digits
``0 .. n_digits-1`` one at a time and then an end token. The reward is 1 when it stopped within its
budget of ``max_digits + 1`` tokens and the digits sum to ``t``; a completion that never stops is
cut at the budget ("truncated") and scores 0. The policy is a GRU of a few thousand parameters, so a
run of a hundred steps takes seconds on one CPU core and its reward visibly climbs (from about 0.02
to about 0.9 over the default 80 steps on 2 ranks).

The trainer is ordinary GRPO, every part of which shows up in the metrics:

* groups of ``group_size`` completions per prompt, advantages normalised within each group;
* a frozen ``pi_old`` pass right after sampling, then ``n_minibatches`` optimizer updates over the
  collected batch, each accumulated over ``grad_accum_chunks`` chunks, with the clipped surrogate
  (so ``clip_frac`` is not identically 0 from the second update on);
* a K3 penalty ``exp(z) - z - 1``, ``z = logp_ref - logp``, toward a frozen copy of the initial
  policy, scaled by ``kl_beta``;
* the loss is a token sum normalised by the DP-global count of valid tokens of the minibatch, and
  gradients are SUM-all-reduced, so every rank applies exactly the global token-mean gradient;
* groups whose rewards tie carry no signal and are left out of the loss entirely (policy term and
  KL term), so a minibatch in which every group of every rank ties has an exactly zero all-reduced
  gradient: the update is skipped and counted (``update_outcome="skipped"``, ``step_skipped``,
  ``zero_grad_skips_total``; no ``skip_reason``, whose labels are the non-finite rejections),
  identically on all ranks because the decision is taken on the all-reduced gradient; the window's
  updates are counted by outcome (``updates_applied``, ``updates_skipped``), so a step whose first
  update applied and whose second skipped reads ``applied 1, skipped 1``;
* pre-clip gradient norm from ``clip_grad_norm_``, warmup + cosine learning-rate schedule, AdamW.

Metrics leave through :class:`TrainerHooks` as source-name dicts (``grpo_clip_frac``,
``reward_mean``, ``update_outcome`` ...), exactly what ``MetricReducer(["grpo", "reward",
"trainer"]).add`` takes; the callback that reduces and publishes them lives elsewhere.

**One metrics window is one training step** (one collected batch): its ``n_minibatches *
grad_accum_chunks`` chunks are handed to ``on_chunk_end`` in order, then ``on_window_end(step)`` is
called once. The optimizer steps at the end of every minibatch, so the chunk that ends a minibatch
carries that update's outcome keys; the window's reduction (``LAST`` / ``CATEGORICAL``) reads the last
update's, and the running counters account for every attempt.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import queue as queue_module
import socket
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Protocol, Union

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..core.catalog.trainer import update_count_leaf

__all__ = [
    "DigitPolicy",
    "MetricValue",
    "NullHooks",
    "ToyConfig",
    "TrainerHooks",
    "run_distributed",
    "train",
]

MetricValue = Union[float, int, str, bool, Tensor]
"""A chunk metric: a Python number, an outcome label, or a 0-d tensor (read once per window)."""

Metrics = dict[str, MetricValue]


# -- the hooks the callback implements ----------------------------------------------------------


class TrainerHooks(Protocol):
    """What the trainer tells its callback, in order, on every rank.

    ``on_run_start`` -> per step: ``on_chunk_end`` x (n_minibatches * grad_accum_chunks), then
    ``on_window_end(step)``, then (every ``val_every`` steps) ``on_validation_end`` -> ``on_run_end``.
    ``on_window_end`` and ``on_validation_end`` are reached by every rank at the same point of the
    run, so they may issue collectives (a ``MetricReducer.reduce``); ``on_run_end`` may not, because
    it also runs while an exception unwinds one rank.
    """

    def on_run_start(self, config: dict[str, Any]) -> None:
        """Once, before the first rollout, with the run config (identical on every rank)."""

    def on_chunk_end(self, metrics: dict[str, MetricValue]) -> None:
        """One gradient-accumulation chunk's source-name metrics (this rank's share)."""

    def on_window_end(self, step: int) -> object:
        """End of one training step's metrics window (1-based step); collective on every rank.
        What it returns (a callback gives the reduced frame) is ignored."""

    def on_validation_end(self, step: int, metrics: dict[str, MetricValue]) -> object:
        """Held-out greedy reward (``reward_avg``, ``reward_std``: the ``validation`` adapter)."""

    def on_samples(self, step: int, rows: list[dict[str, Any]]) -> object:
        """This rank's completions of the step (target, digits, reward, advantage, group), after
        ``on_window_end``; collective on every rank (rank 0 publishes a sample of them)."""

    def on_run_end(self, failed: bool) -> None:
        """Once, last, also when an exception unwinds the loop (``failed=True``)."""


class NullHooks:
    """Hooks that do nothing: a base to override only what a caller needs, and the test double."""

    def on_run_start(self, config: dict[str, Any]) -> None:
        pass

    def on_chunk_end(self, metrics: dict[str, MetricValue]) -> None:
        pass

    def on_window_end(self, step: int) -> None:
        pass

    def on_validation_end(self, step: int, metrics: dict[str, MetricValue]) -> None:
        pass

    def on_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        pass

    def on_run_end(self, failed: bool) -> None:
        pass


# -- configuration --------------------------------------------------------------------------------


_POSITIVE_FIELDS = (
    "steps", "group_size", "prompts_per_rank", "n_minibatches", "grad_accum_chunks",
    "n_digits", "max_digits", "hidden_size", "embed_size",
)


@dataclasses.dataclass(frozen=True)
class ToyConfig:
    """Everything that decides a run; with the rank count it fixes the result bit for bit."""

    steps: int = 80
    """Training steps (collected batches); each is one metrics window."""
    seed: int = 0
    group_size: int = 8
    """Completions sampled per prompt (G)."""
    prompts_per_rank: int = 8
    """Prompts (groups) each rank samples per step, from its own seeded generator."""
    n_minibatches: int = 2
    """Optimizer updates per collected batch; > 1 is what makes ``clip_frac`` nonzero."""
    grad_accum_chunks: int = 2
    """Chunks accumulated into each update."""
    lr: float = 1e-2
    min_lr_ratio: float = 0.1
    """The cosine decays to ``lr * min_lr_ratio`` at the last update."""
    warmup_updates: int = 10
    weight_decay: float = 0.0
    kl_beta: float = 0.02
    max_grad_norm: float = 1.0
    """Clip threshold; 0 measures the norm without clipping."""
    clip_eps: float = 0.1
    """Tighter than the usual 0.2 so that the toy's small per-update ratio moves register in clip_frac."""
    n_digits: int = 10
    """Digits 0 .. n_digits-1 are the policy's words, plus an end token."""
    max_digits: int = 3
    """Digits a finished answer may have; the token budget is one more (for the end token)."""
    hidden_size: int = 32
    embed_size: int = 16
    val_every: int = 10
    """Greedy held-out evaluation every this many steps; 0 turns it off."""
    reward_outage_step: int | None = None
    """A step at which the verifier is down and scores every completion 0: every group ties, the
    gradient is exactly zero and each update of that step is skipped, which shows the zero-gradient
    skip on demand. ``None`` (default) never; natural all-tied minibatches are skipped regardless."""
    force_finite_grads: bool = True
    """Reject an update whose gradient norm is not finite (``optim/finite_gradient_check_enabled``)."""

    def __post_init__(self) -> None:
        for name in _POSITIVE_FIELDS:
            if getattr(self, name) < 1:
                raise ValueError(f"ToyConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.group_size < 2:
            raise ValueError("ToyConfig.group_size must be >= 2: a group of one has no advantage")
        if self.prompts_per_rank % self.chunks_per_window:
            raise ValueError(
                f"prompts_per_rank={self.prompts_per_rank} must be a multiple of n_minibatches * "
                f"grad_accum_chunks = {self.chunks_per_window}, so every chunk holds whole groups"
            )
        if not (self.lr > 0 and 0 <= self.min_lr_ratio <= 1 and self.warmup_updates >= 0):
            raise ValueError("need lr > 0, 0 <= min_lr_ratio <= 1 and warmup_updates >= 0")
        if self.kl_beta < 0 or self.clip_eps <= 0 or self.max_grad_norm < 0 or self.val_every < 0:
            raise ValueError("need kl_beta >= 0, clip_eps > 0, max_grad_norm >= 0, val_every >= 0")

    @property
    def chunks_per_window(self) -> int:
        return self.n_minibatches * self.grad_accum_chunks

    @property
    def prompts_per_chunk(self) -> int:
        return self.prompts_per_rank // self.chunks_per_window

    @property
    def max_new_tokens(self) -> int:
        return self.max_digits + 1

    @property
    def n_targets(self) -> int:
        """Targets 0 .. (n_digits-1) * max_digits: every reachable sum."""
        return (self.n_digits - 1) * self.max_digits + 1

    @property
    def eos(self) -> int:
        return self.n_digits

    @property
    def bos(self) -> int:
        """Input-only start token; never sampled."""
        return self.n_digits + 1

    @property
    def vocab_size(self) -> int:
        return self.n_digits + 1

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# -- the policy -----------------------------------------------------------------------------------


class DigitPolicy(nn.Module):
    """A GRU of a few thousand parameters over the policy's own tokens.

    Besides the previous token, each step sees what is left of the target after the digits written so
    far (clamped to "overshot" below 0): a deterministic feature of prompt and prefix, as a tokenizer
    would provide, which lets one small network share what it learns across targets instead of
    memorising an answer per target.
    """

    def __init__(self, config: ToyConfig) -> None:
        super().__init__()
        self.eos = config.eos
        self.target_embed = nn.Embedding(config.n_targets, config.hidden_size)
        self.token_embed = nn.Embedding(config.vocab_size + 1, config.embed_size)  # + BOS
        self.remaining_embed = nn.Embedding(config.n_targets + 1, config.embed_size)  # + overshot
        self.gru = nn.GRU(config.embed_size, config.hidden_size, batch_first=True)
        self.head = nn.Linear(config.hidden_size, config.vocab_size)

    def initial_state(self, targets: Tensor) -> Tensor:
        embedded: Tensor = self.target_embed(targets)
        return torch.tanh(embedded).unsqueeze(0)

    def _inputs(self, prev: Tensor, remaining: Tensor) -> Tensor:
        token: Tensor = self.token_embed(prev)
        left: Tensor = self.remaining_embed(remaining.clamp(min=-1) + 1)
        return token + left

    def forward(self, targets: Tensor, tokens: Tensor, bos: int) -> Tensor:
        """Teacher-forced logits ``[n, T, vocab]`` predicting each of ``tokens`` from its prefix."""
        prev = torch.cat([torch.full_like(tokens[:, :1], bos), tokens[:, :-1]], dim=1)
        written = torch.where(prev < self.eos, prev, torch.zeros_like(prev)).cumsum(dim=1)
        out, _ = self.gru(self._inputs(prev, targets.unsqueeze(1) - written), self.initial_state(targets))
        return self.head(out)  # type: ignore[no-any-return]

    def step(self, prev: Tensor, remaining: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """One sampling step: logits ``[n, vocab]`` for the next token, and the new state."""
        out, state = self.gru(self._inputs(prev, remaining).unsqueeze(1), state)
        return self.head(out.squeeze(1)), state


def token_logprobs(policy: DigitPolicy, targets: Tensor, tokens: Tensor, bos: int) -> Tensor:
    """``log pi(token_t | prompt, prefix)`` for every position, ``[n, T]``, in one teacher-forced pass."""
    logp = torch.log_softmax(policy(targets, tokens, bos), dim=-1)
    return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


# -- rollout and reward ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Rollout:
    """One rank's sampled completions, group-major: row ``p * G + g`` is prompt p's g-th sample."""

    targets: Tensor  # [N] long
    tokens: Tensor  # [N, T] long, end-token padded after the first end token
    mask: Tensor  # [N, T] bool: generated positions, the end token included
    truncated: Tensor  # [N] bool: no end token within the budget
    sampling_logp: Tensor  # [N, T] the logprob the sampler recorded for each token
    rewards: Tensor  # [N] float, 0 or 1

    @property
    def lengths(self) -> Tensor:
        return self.mask.sum(dim=1)


@torch.no_grad()
def sample(policy: DigitPolicy, targets: Tensor, config: ToyConfig, gen: torch.Generator) -> Rollout:
    """Sample one completion per row of ``targets`` at temperature 1, recording its logprobs."""
    n, eos = targets.shape[0], config.eos
    state = policy.initial_state(targets)
    prev, remaining = torch.full((n,), config.bos, dtype=torch.long), targets.clone()
    done = torch.zeros(n, dtype=torch.bool)
    tokens, logps, masks = [], [], []
    for _ in range(config.max_new_tokens):
        logits, state = policy.step(prev, remaining, state)
        logp = torch.log_softmax(logits, dim=-1)
        token = torch.multinomial(logp.exp(), 1, generator=gen).squeeze(1)
        masks.append(~done)
        token = torch.where(done, torch.full_like(token, eos), token)
        tokens.append(token)
        logps.append(logp.gather(1, token.unsqueeze(1)).squeeze(1))
        done = done | (token == eos)
        remaining = remaining - torch.where(token < eos, token, torch.zeros_like(token))
        prev = token
    rollout_tokens, mask = torch.stack(tokens, dim=1), torch.stack(masks, dim=1)
    return Rollout(
        targets=targets,
        tokens=rollout_tokens,
        mask=mask,
        truncated=~done,
        sampling_logp=torch.stack(logps, dim=1),
        rewards=score(targets, rollout_tokens, mask, done, eos),
    )


def score(targets: Tensor, tokens: Tensor, mask: Tensor, finished: Tensor, eos: int) -> Tensor:
    """The verifier: 1.0 when the answer finished and its digits sum to the target, else 0.0."""
    digits = torch.where(mask & (tokens != eos), tokens, torch.zeros_like(tokens))
    return (finished & (digits.sum(dim=1) == targets)).to(torch.float32)


@torch.no_grad()
def greedy_reward(policy: DigitPolicy, config: ToyConfig) -> Tensor:
    """Reward of the greedy answer to every target once: the held-out figure."""
    targets, eos = torch.arange(config.n_targets), config.eos
    state = policy.initial_state(targets)
    prev, remaining = torch.full_like(targets, config.bos), targets.clone()
    done = torch.zeros_like(targets, dtype=torch.bool)
    tokens, masks = [], []
    for _ in range(config.max_new_tokens):
        logits, state = policy.step(prev, remaining, state)
        token = torch.where(done, torch.full_like(targets, eos), logits.argmax(dim=-1))
        masks.append(~done)
        tokens.append(token)
        done = done | (token == eos)
        remaining = remaining - torch.where(token < eos, token, torch.zeros_like(token))
        prev = token
    return score(targets, torch.stack(tokens, 1), torch.stack(masks, 1), done, eos)


# -- grouping ---------------------------------------------------------------------------------------


def group_advantages(rewards: Tensor, group_size: int) -> tuple[Tensor, Tensor]:
    """Per-row advantages ``(r - mean_g) / (std_g + 1e-6)`` and the per-group informative flag.

    A tied group's advantage is exactly 0 (its mean equals each of its rewards), and the caller
    also drops its rows from the loss, so a batch of tied groups has exactly zero gradient.
    """
    r = rewards.view(-1, group_size)
    informative = r.amax(dim=1) != r.amin(dim=1)
    normalised = (r - r.mean(dim=1, keepdim=True)) / (r.std(dim=1, unbiased=False, keepdim=True) + 1e-6)
    advantages = torch.where(informative.unsqueeze(1), normalised, torch.zeros_like(r))
    return advantages.reshape(-1), informative


def reward_report(rewards: Tensor, informative: Tensor, group_size: int) -> Metrics:
    """This rank's reward and grouping keys; the reducer pools them into global figures."""
    r = rewards.view(-1, group_size)
    all_zero = (r == 0).all(dim=1)
    all_one = (r == 1).all(dim=1)
    return {
        "reward_mean": rewards.mean(),
        "reward_std": rewards.std(unbiased=False),
        "reward_min": rewards.min(),
        "reward_max": rewards.max(),
        "rollout_count": rewards.numel(),
        "grpo_group_count": r.shape[0],
        "grpo_informative_group_count": informative.sum(),
        "grpo_tied_group_count": (~informative).sum(),
        "grpo_all_zero_group_count": all_zero.sum(),
        "grpo_all_one_group_count": all_one.sum(),
    }


# -- one collected batch --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Batch:
    """A rollout with everything the updates need, fixed before the first update."""

    rollout: Rollout
    advantages: Tensor  # [N]
    valid_rows: Tensor  # [N] bool: rows of informative groups, the only ones in the loss
    old_logp: Tensor  # [N, T] frozen pi_old pass
    ref_logp: Tensor  # [N, T] frozen reference pass
    report: Metrics  # the reward/grouping keys

    @property
    def valid(self) -> Tensor:
        """``[N, T]`` tokens that carry learnable signal."""
        return self.rollout.mask & self.valid_rows.unsqueeze(1)


def collect(
    policy: DigitPolicy,
    reference: DigitPolicy,
    config: ToyConfig,
    step: int,
    gen: torch.Generator,
) -> Batch:
    """Sample this rank's prompts and groups, score them, and run the frozen pi_old/ref passes."""
    prompts = torch.randint(0, config.n_targets, (config.prompts_per_rank,), generator=gen)
    rollout = sample(policy, prompts.repeat_interleave(config.group_size), config, gen)
    if step == config.reward_outage_step:
        rollout = dataclasses.replace(rollout, rewards=torch.zeros_like(rollout.rewards))
    advantages, informative = group_advantages(rollout.rewards, config.group_size)
    with torch.no_grad():
        old_logp = token_logprobs(policy, rollout.targets, rollout.tokens, config.bos)
        ref_logp = token_logprobs(reference, rollout.targets, rollout.tokens, config.bos)
    return Batch(
        rollout=rollout,
        advantages=advantages,
        valid_rows=informative.repeat_interleave(config.group_size),
        old_logp=old_logp,
        ref_logp=ref_logp,
        report=reward_report(rollout.rewards, informative, config.group_size),
    )


def minibatch_rows(config: ToyConfig, minibatch: int, chunk: int) -> slice:
    """Rows of one chunk: whole groups, minibatches and chunks in order."""
    rows = config.prompts_per_chunk * config.group_size
    start = (minibatch * config.grad_accum_chunks + chunk) * rows
    return slice(start, start + rows)


def global_counts(batch: Batch, config: ToyConfig, world_size: int) -> tuple[Tensor, float]:
    """DP-global valid tokens of each minibatch (the loss divisor) and the global reward mean.

    One SUM all-reduce per step, before any update, so every rank normalises by the same divisor.
    """
    valid = batch.valid.view(config.n_minibatches, -1)  # minibatches are contiguous row blocks
    per_minibatch = valid.sum(dim=1).to(torch.float64)
    rewards = batch.rollout.rewards.to(torch.float64)
    count = torch.full((1,), float(rewards.numel()), dtype=torch.float64)
    buf = torch.cat([per_minibatch, rewards.sum().view(1), count])
    if world_size > 1:
        dist.all_reduce(buf, op=dist.ReduceOp.SUM)
    return buf[:-2], float(buf[-2]) / float(buf[-1])


# -- the objective on one chunk --------------------------------------------------------------------


def chunk_objective(
    policy: DigitPolicy, batch: Batch, rows: slice, divisor: Tensor, config: ToyConfig
) -> tuple[Tensor, Metrics]:
    """The chunk's share of the minibatch loss (to backpropagate) and its GRPO source metrics."""
    r = batch.rollout
    logp = token_logprobs(policy, r.targets[rows], r.tokens[rows], config.bos)
    valid = batch.valid[rows]
    adv = batch.advantages[rows].unsqueeze(1)
    log_ratio = logp - batch.old_logp[rows]
    ratio = log_ratio.exp()
    eps = config.clip_eps
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - eps, 1 + eps) * adv)
    z = batch.ref_logp[rows] - logp
    k3 = z.exp() - z - 1
    per_token = torch.where(valid, -surrogate + config.kl_beta * k3, torch.zeros_like(logp))
    loss = per_token.sum() / divisor.clamp(min=1).to(per_token.dtype)
    with torch.no_grad():
        metrics = _objective_metrics(
            valid, adv, log_ratio.detach(), k3.detach(), per_token.detach(), eps, config.kl_beta
        )
        metrics.update(_response_metrics(r, rows))
        metrics.update(_logprob_gap_metrics(batch, rows, valid))
    return loss, metrics


def _masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean over ``mask``; 0.0 when it is empty (the count key, with weight 0, says "no data")."""
    return torch.where(mask, values, torch.zeros_like(values)).sum() / mask.sum().clamp(min=1)


def _objective_metrics(
    valid: Tensor, adv: Tensor, log_ratio: Tensor, k3: Tensor, per_token: Tensor, eps: float, beta: float
) -> Metrics:
    ratio = log_ratio.exp()
    clipped = valid & (((adv > 0) & (ratio > 1 + eps)) | ((adv < 0) & (ratio < 1 - eps)))
    seqs = valid.any(dim=1)
    token_log_ratio = torch.where(valid, log_ratio, torch.zeros_like(log_ratio))
    seq_log_ratio = token_log_ratio.sum(dim=1) / valid.sum(dim=1).clamp(min=1)  # GSPO's length-normalised
    tokens = valid.sum()
    return {
        "grpo_loss": per_token.sum() / tokens.clamp(min=1),
        "grpo_weight_sum": tokens,
        "grpo_valid_token_count": tokens,
        "grpo_valid_sequence_count": seqs.sum(),
        "grpo_clip_frac": clipped.sum() / tokens.clamp(min=1),
        "grpo_ratio_absdev": _masked_mean((ratio - 1).abs(), valid),
        "grpo_seq_clip_frac": _masked_mean(clipped.any(dim=1).float(), seqs),
        "grpo_seq_log_ratio_abs": _masked_mean(seq_log_ratio.abs(), seqs),
        "grpo_kl_mean": _masked_mean(k3, valid),
        "grpo_kl_max": torch.where(valid, k3, torch.zeros_like(k3)).max(),  # K3 >= 0: 0 is neutral
        "grpo_kl_beta": beta,
    }


def _response_metrics(r: Rollout, rows: slice) -> Metrics:
    """Every completion the objective was handed, tied groups included."""
    lengths = r.lengths[rows]
    return {
        "grpo_response_count": lengths.numel(),
        "grpo_response_len_mean": lengths.double().mean(),
        "grpo_response_len_max": lengths.max(),
        "grpo_rollout_truncated_frac": r.truncated[rows].double().mean(),
    }


def _logprob_gap_metrics(batch: Batch, rows: slice, valid: Tensor) -> Metrics:
    """|pi_old pass - sampler's record| over loss-masked tokens: the train/infer consistency check.

    The sampler steps the GRU one token at a time and the trainer runs it over the whole sequence:
    two forwards of one model, whose gap is kernel noise (on CPU it comes out exactly 0). It is
    measured, never assumed, and ``grpo_logprob_gap_token_count > 0`` says it had data.
    """
    gap = (batch.old_logp[rows] - batch.rollout.sampling_logp[rows]).abs()[valid]
    count = gap.numel()
    p99 = torch.quantile(gap.double(), 0.99) if count else torch.zeros((), dtype=torch.float64)
    return {
        "grpo_logprob_gap_mean": gap.mean() if count else 0.0,
        "grpo_mean_rank_logprob_gap_p99": p99,
        "grpo_logprob_gap_gt0p5_frac": (gap > 0.5).double().mean() if count else 0.0,
        "grpo_logprob_gap_token_count": count,
    }


# -- the optimizer update ----------------------------------------------------------------------------


@dataclasses.dataclass
class OptimCounters:
    """The durable counters behind the ``optim/*`` keys."""

    attempt_id: int = 0
    optimizer_step: int = 0
    zero_grad_skips_total: int = 0
    nonfinite_skips_total: int = 0
    nonfinite_skips_consecutive: int = 0


def lr_at(config: ToyConfig, attempt: int) -> float:
    """Linear warmup then cosine to ``lr * min_lr_ratio``, indexed by update attempt (0-based).

    Indexed by attempt rather than by applied step so that a skipped update does not shift the
    schedule of the rest of the run against the step axis.
    """
    if attempt < config.warmup_updates:
        return config.lr * (attempt + 1) / config.warmup_updates
    total = config.steps * config.n_minibatches
    progress = (attempt - config.warmup_updates) / max(1, total - config.warmup_updates - 1)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return config.lr * (config.min_lr_ratio + (1 - config.min_lr_ratio) * cosine)


def all_reduce_gradients(params: list[nn.Parameter], world_size: int) -> None:
    """SUM the accumulated gradients over ranks in one flat collective (each rank's loss already
    carries the DP-global divisor, so the sum is the global gradient)."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if world_size == 1:
        return
    grads = [p.grad for p in params if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def finish_update(
    optimizer: torch.optim.Optimizer,
    params: list[nn.Parameter],
    counters: OptimCounters,
    config: ToyConfig,
    world_size: int,
) -> Metrics:
    """All-reduce, measure, clip, then apply or skip; the trainer and outcome keys of the attempt.

    Every rank holds the same all-reduced gradient, hence the same norm, hence the same decision.
    """
    lr = lr_at(config, counters.attempt_id)
    counters.attempt_id += 1
    all_reduce_gradients(params, world_size)
    max_norm = config.max_grad_norm if config.max_grad_norm > 0 else math.inf
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    norm = float(grad_norm)  # the one host read of the update: the decision needs it
    skip_reason = None
    if config.force_finite_grads and not math.isfinite(norm):
        skip_reason = "nonfinite_gradient"
        counters.nonfinite_skips_total += 1
        counters.nonfinite_skips_consecutive += 1
    else:
        counters.nonfinite_skips_consecutive = 0
        if norm == 0.0:
            counters.zero_grad_skips_total += 1
    skipped = skip_reason is not None or norm == 0.0
    if not skipped:
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.step()
        counters.optimizer_step += 1
    optimizer.zero_grad(set_to_none=False)
    metrics: Metrics = {
        "update_outcome": "skipped" if skipped else "applied",
        "step_skipped": skipped,
        "attempt_id": counters.attempt_id,
        "optimizer_step": counters.optimizer_step,
        "zero_grad_skips_total": counters.zero_grad_skips_total,
        "nonfinite_skips_total": counters.nonfinite_skips_total,
        "nonfinite_skips_consecutive": counters.nonfinite_skips_consecutive,
        "finite_gradient_check_enabled": config.force_finite_grads,
        "grad_norm": grad_norm.detach(),
        "learning_rate": lr,
    }
    if skip_reason is not None:
        metrics["skip_reason"] = skip_reason
    return metrics


# -- the run ------------------------------------------------------------------------------------------


def _generator(seed: int, rank: int) -> torch.Generator:
    """This rank's own sampling stream: different prompts and samples per rank, fixed per seed."""
    return torch.Generator().manual_seed(1_000_003 * seed + 7_919 * rank + 1)


def build_policy(config: ToyConfig) -> DigitPolicy:
    """The initial policy, identical on every rank (seeded from ``seed`` alone)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        return DigitPolicy(config)


def completion_rows(batch: Batch, config: ToyConfig, rank: int) -> list[dict[str, Any]]:
    """One row per completion of this rank's batch, for ``on_samples``: the prompt (its target sum),
    the digits written (``[eos]`` when it stopped), the reward, the advantage, the response length in
    tokens, the group (a name, ``r<rank>-g<index>``: ``0.2`` read as a number in the trackers) and
    ``truncated``: ``token budget`` for a completion cut by ``max_new_tokens`` (no end token, scored
    0), empty otherwise."""
    rollout = batch.rollout
    rows = []
    for i in range(rollout.targets.shape[0]):
        digits = [int(t) for t, m in zip(rollout.tokens[i], rollout.mask[i]) if m and int(t) != config.eos]
        stopped = not bool(rollout.truncated[i])
        rows.append({
            "group": f"r{rank}-g{i // config.group_size}",
            "prompt": f"digits summing to {int(rollout.targets[i])}",
            "completion": " ".join([*map(str, digits), *(["[eos]"] if stopped else [])]),
            "reward": float(rollout.rewards[i]),
            "advantage": round(float(batch.advantages[i]), 4),
            "response_len": int(rollout.mask[i].sum()),
            "truncated": "" if stopped else "token budget",
        })
    return rows


def _stage(hooks: TrainerHooks, name: str) -> contextlib.AbstractContextManager[None]:
    """``hooks.timer(name)`` when the hooks time stages (the callback with ``perf`` on), else nothing."""
    timer = getattr(hooks, "timer", None)
    return timer(name) if callable(timer) and getattr(hooks, "throughput", None) is not None else contextlib.nullcontext()


def train_step(
    step: int,
    policy: DigitPolicy,
    reference: DigitPolicy,
    optimizer: torch.optim.Optimizer,
    counters: OptimCounters,
    gen: torch.Generator,
    hooks: TrainerHooks,
    config: ToyConfig,
    world_size: int,
) -> tuple[float, Batch]:
    """One collected batch and its updates; hands every chunk to the hooks. Returns the global
    reward mean of the batch, and the batch (its completions go to ``on_samples``)."""
    started = time.perf_counter()
    with _stage(hooks, "generation"):
        batch = collect(policy, reference, config, step, gen)
    divisors, reward_mean = global_counts(batch, config, world_size)
    params = list(policy.parameters())
    # This window's updates by outcome, reported so far on each update's last chunk: the window's
    # last report is its count (AGREED: every rank takes the same decisions, see catalog/trainer.py).
    window = {"applied": 0, "skipped": 0}
    for m in range(config.n_minibatches):
        for c in range(config.grad_accum_chunks):
            with _stage(hooks, "train"):
                loss, metrics = chunk_objective(policy, batch, minibatch_rows(config, m, c), divisors[m], config)
                loss.backward()  # type: ignore[no-untyped-call]
            if m == 0 and c == 0:
                metrics.update(batch.report)
            if c < config.grad_accum_chunks - 1:
                metrics["update_outcome"] = "accumulating"
            else:
                metrics.update(finish_update(optimizer, params, counters, config, world_size))
                window[str(metrics["update_outcome"])] += 1
                metrics.update({update_count_leaf(outcome): n for outcome, n in window.items()})
                if m == config.n_minibatches - 1:
                    metrics["e2e_step_s"] = time.perf_counter() - started
            hooks.on_chunk_end(metrics)
    return reward_mean, batch


def train(config: ToyConfig, hooks: TrainerHooks, *, rank: int = 0, world_size: int = 1) -> dict[str, Any]:
    """Run GRPO on this rank; the hooks see every chunk. Returns this rank's summary.

    With ``world_size > 1`` torch.distributed must already be initialised (``run_distributed`` does
    it). ``on_run_end`` is called exactly once, with ``failed=True`` if anything raised.
    """
    if world_size > 1 and not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("world_size > 1 needs torch.distributed initialised; use run_distributed()")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    started = time.perf_counter()
    failed = True
    try:
        policy = build_policy(config)
        reference = copy.deepcopy(policy).requires_grad_(False)
        optimizer = torch.optim.AdamW(policy.parameters(), lr=config.lr, weight_decay=config.weight_decay)
        counters, gen = OptimCounters(), _generator(config.seed, rank)
        n_params = sum(p.numel() for p in policy.parameters())
        hooks.on_run_start({**config.as_dict(), "world_size": world_size, "policy_parameters": n_params})
        rewards, val_rewards = [], []
        for step in range(1, config.steps + 1):
            reward_mean, batch = train_step(step, policy, reference, optimizer, counters, gen, hooks, config,
                                            world_size)
            rewards.append(reward_mean)
            hooks.on_window_end(step)
            hooks.on_samples(step, completion_rows(batch, config, rank))
            if config.val_every and step % config.val_every == 0:
                val = greedy_reward(policy, config)
                val_rewards.append((step, float(val.mean())))
                val_metrics: Metrics = {"reward_avg": val.mean(), "reward_std": val.std(unbiased=False)}
                hooks.on_validation_end(step, val_metrics)
        failed = False
        return {
            "rank": rank,
            "world_size": world_size,
            "steps": config.steps,
            "policy_parameters": n_params,
            "reward_mean": rewards,
            "val_reward_avg": val_rewards,
            "optimizer_step": counters.optimizer_step,
            "update_attempts": counters.attempt_id,
            "zero_grad_skips_total": counters.zero_grad_skips_total,
            "wall_time_s": time.perf_counter() - started,
        }
    finally:
        torch.set_num_threads(threads)
        hooks.on_run_end(failed)


# -- launching ranks --------------------------------------------------------------------------------


_COLLECTIVE_TIMEOUT = timedelta(minutes=10)
"""Generous: rank 0's hooks may start tracker SDKs before the first collective; a rank that dies is
caught by ``run_distributed`` long before this."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(
    rank: int,
    world_size: int,
    port: int,
    config: ToyConfig,
    make_hooks: Callable[[int, int], TrainerHooks],
    results: Any,
) -> None:
    """One spawned rank: join the gloo group, build the hooks, train, report back."""
    torch.set_num_threads(1)
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=_COLLECTIVE_TIMEOUT,
        )
        try:
            summary = train(config, make_hooks(rank, world_size), rank=rank, world_size=world_size)
        finally:
            dist.destroy_process_group()
        results.put(("ok", rank, summary))
    except BaseException:
        results.put(("error", rank, traceback.format_exc()))
        raise SystemExit(1) from None


def run_distributed(
    config: ToyConfig,
    make_hooks: Callable[[int, int], TrainerHooks],
    ranks: int = 2,
    *,
    grace_s: float = 20.0,
) -> list[dict[str, Any]]:
    """Train on ``ranks`` data-parallel CPU processes (gloo on 127.0.0.1); per-rank summaries.

    ``make_hooks(rank, world_size)`` runs inside each rank after the process group is up, so it
    must be picklable (a module-level function or a ``functools.partial`` of one). ``ranks == 1``
    runs in this process without torch.distributed. If a rank fails, the others get ``grace_s``
    seconds to notice, the rest are terminated, and a ``RuntimeError`` carries the first traceback.
    """
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    if ranks == 1:
        return [train(config, make_hooks(0, 1), rank=0, world_size=1)]
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(
            target=_worker,
            args=(rank, ranks, port, config, make_hooks, results),
            name=f"grpo-toy-rank{rank}",
        )
        for rank in range(ranks)
    ]
    for p in procs:
        p.start()
    try:
        summaries, errors = _collect(procs, results, grace_s)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
            p.join()
    if errors:
        lines = "\n".join(f"  rank {rank}: {text.strip().splitlines()[-1]}" for rank, text in errors)
        rank, text = errors[0]
        raise RuntimeError(f"the demo failed on {len(errors)} of {ranks} ranks:\n{lines}\nrank {rank}:\n{text}")
    return [summaries[r] for r in range(ranks)]


def _collect(
    procs: list[Any], results: Any, grace_s: float
) -> tuple[dict[int, dict[str, Any]], list[tuple[int, str]]]:
    """Read every rank's report; stop waiting ``grace_s`` after the first sign of failure.

    A rank that died without a word (killed, or crashed before it could report) is named last, so
    the first error is a real traceback whenever one exists.
    """
    summaries: dict[int, dict[str, Any]] = {}
    errors: list[tuple[int, str]] = []
    deadline = math.inf
    while len(summaries) + len(errors) < len(procs) and time.monotonic() < deadline:
        try:
            kind, rank, payload = results.get(timeout=0.2)
        except queue_module.Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                deadline = min(deadline, time.monotonic() + grace_s)
            continue
        if kind == "ok":
            summaries[rank] = payload
        else:
            errors.append((rank, payload))
            deadline = min(deadline, time.monotonic() + grace_s)
    reported = summaries.keys() | {rank for rank, _ in errors}
    for rank, p in enumerate(procs):
        if rank not in reported and p.exitcode not in (None, 0):
            errors.append((rank, f"the process exited with code {p.exitcode} before reporting"))
        elif rank not in reported:
            errors.append((rank, f"no report within {grace_s:.0f} s of another rank's failure"))
    return summaries, errors
