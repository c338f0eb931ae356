"""Exact TRL ``GRPOTrainer`` metrics in one line: ``trainer = exact_grpo(GRPOTrainer(...), metrics)``.

TRL 1.16 computes each micro-batch's clip ratios, KL and entropy as a *global* token mean (an
all-reduce of the sum and the count over the ranks), appends it to ``trainer._metrics``, and
``log()`` then averages those per-micro-batch figures equally: a mean of means whenever the
micro-batches hold different token counts, which in GRPO is always. The same goes for the
generation statistics over a window with several generations.

The hint that makes the figures exact without re-deriving TRL's losses: the global mean ``m_k`` of
micro-batch ``k``, weighted by this rank's token count ``n_kr`` of that micro-batch, sums over the
ranks to ``m_k * N_k`` (``N_k`` the global count), so ``sum_k m_k N_k / sum_k N_k`` over the window
is the exact token mean. Each rank therefore records, per micro-batch, TRL's own figure beside its
local count into the callback's window (:meth:`PosttrainMetricsCallback.on_chunk_end`), and the
reducer's one collective per optimizer step does the rest: no extra collective per key. Generation
figures (lengths, truncation, rewards) are weighted the same way by this rank's completions.

Why a wrapper and not a mixin: it works on the trainer the user already has, whatever subclass
built it (their own ``GRPOTrainer`` subclass, a TRL script, a config), with no change to the class
hierarchy or the constructor's arguments, and it can check the TRL version and the internals it
relies on before the first step. It wraps four instance methods (the class is untouched): the
public ``compute_loss``, and ``_generate``, ``_calculate_rewards`` and
``_generate_and_score_completions``, reading what TRL appended to ``_metrics`` around each call.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

from ..core.errors import MetricsError
from .transformers import PosttrainMetricsCallback, When, conditions

__all__ = ["SUPPORTED_TRL", "TESTED_TRL", "check_trl", "exact_grpo"]

SUPPORTED_TRL = ((1, 16), (2, 0))
"""TRL versions ``>= 1.16, < 2``: the range whose ``GRPOTrainer`` internals :func:`check_trl` verifies."""
TESTED_TRL = "1.16.0"

# The lines of TRL's source whose arithmetic the weighting relies on; a TRL that changed them is
# refused at start instead of publishing a silently wrong figure.
_FINGERPRINT: dict[str, tuple[str, ...]] = {
    "_compute_loss": (
        'mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]',
        "local_sum, local_count = x.sum(), torch.tensor(float(x.shape[0]), device=x.device)",
        "local_sum, local_count = (x * mask).sum(), mask.sum().float()",
        'self._metrics[mode]["entropy"].append(global_masked_mean(entropies))',
        'self._metrics[mode]["clip_ratio/region_mean"].append(global_masked_mean(is_region_clipped.float()))',
        'self._metrics[mode]["kl"].append(global_masked_mean(per_token_kl))',
    ),
    "_generate": (
        "agg_completion_lengths = self.accelerator.gather(completion_lengths)",
        "completion_lengths = torch.tensor([len(ids) for ids in completion_ids], device=device)",
        "is_truncated = torch.tensor([ids[-1] not in eos_and_pad for ids in completion_ids], device=device)",
        "if len(term_completion_lengths) == 0:",
    ),
    "_generate_and_score_completions": (
        "self.accelerator.process_index * len(prompts),",
        'self._metrics[mode]["reward"].append(torch.nanmean(rewards).item())',
        'self._metrics[mode]["reward_std"].append(nanstd(rewards).item())',
        "rewards[unscorable_mask] = torch.nan  # exclude unscorable rows from the logged reward stats",
        'self._metrics[mode][f"rewards/{reward_func_name}/mean"].append(mean_rewards)',
    ),
}


def _version(text: str) -> tuple[int, int]:
    parts = text.split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)
    except (IndexError, ValueError):
        return (0, 0)


def check_trl(trainer_class: type | None = None) -> str:
    """The installed TRL's version, once its ``GRPOTrainer`` is one whose internals we rely on.

    Raises :class:`MetricsError` naming the version when it is outside :data:`SUPPORTED_TRL` or when
    a line the exact weighting relies on moved (checked in the class's own source, so a patch release
    that leaves them alone passes).
    """
    try:
        import trl
        from trl import GRPOTrainer  # type: ignore[attr-defined]  # trl re-exports it lazily
    except ImportError as exc:
        raise MetricsError(f"exact_grpo needs TRL ({exc}); fix: pip install 'posttrain-metrics[trl]'") from None
    version = str(getattr(trl, "__version__", "?"))
    low, high = SUPPORTED_TRL
    wanted = f">={low[0]}.{low[1]},<{high[0]}"
    if not low <= _version(version) < high:
        raise MetricsError(
            f"exact_grpo supports TRL {wanted} (tested {TESTED_TRL}); this is TRL {version}; fix: "
            f"pip install 'trl{wanted}', or record your figures with metrics.on_chunk_end from compute_loss"
        )
    base = trainer_class or GRPOTrainer
    for method, lines in _FINGERPRINT.items():
        owner = next((c for c in base.__mro__ if method in vars(c)), None)
        try:
            source = inspect.getsource(getattr(owner, method)) if owner is not None else ""
        except (OSError, TypeError):
            source = ""
        flat = " ".join(source.split())
        missing = [line for line in lines if " ".join(line.split()) not in flat]
        if missing:
            where = f"{owner.__module__}.{owner.__qualname__}.{method}" if owner is not None else method
            raise MetricsError(
                f"exact_grpo: TRL {version}'s {where} no longer computes what the exact weighting relies on "
                f"(missing: {missing[0]!r}); its figures would be wrong, so it refuses to start. Supported: "
                f"TRL {wanted} as of {TESTED_TRL}; fix: pin trl=={TESTED_TRL}, or drop exact_grpo (the callback "
                "alone publishes TRL's interval means)"
            )
    return version


# TRL's per-micro-batch key -> (our source name by importance level, or one for both)
_LOSS_KEYS_TOKEN = {
    "entropy": "trl_exact_entropy_mean",
    "clip_ratio/low_mean": "trl_exact_clip_low_frac",
    "clip_ratio/high_mean": "trl_exact_clip_high_frac",
    "clip_ratio/region_mean": "grpo_clip_frac",
}
_LOSS_KEYS_SEQUENCE = {
    "entropy": "trl_exact_entropy_mean",
    "clip_ratio/low_mean": "trl_exact_seq_clip_low_frac",
    "clip_ratio/high_mean": "trl_exact_seq_clip_high_frac",
    "clip_ratio/region_mean": "grpo_seq_clip_frac",
}
_EXTREMA = {"clip_ratio/low_min": "trl_exact_clip_low_seq_min", "clip_ratio/high_max": "trl_exact_clip_high_seq_max"}
_GENERATION = {  # TRL key -> our source; a mean is weighted by this rank's completions (or terminated ones)
    "completions/mean_length": "grpo_response_len_mean",
    "completions/clipped_ratio": "grpo_rollout_truncated_frac",
    "completions/max_length": "grpo_response_len_max",
    "completions/min_length": "trl_exact_response_len_min",
    "completions/mean_terminated_length": "trl_exact_terminated_len_mean",
    "completions/min_terminated_length": "trl_exact_terminated_len_min",
    "completions/max_terminated_length": "trl_exact_terminated_len_max",
}


def _reward_key(name: str, stat: str) -> str:
    return f"train/reward_{name.replace('/', '_')}_{stat}"


class _Recorder:
    """Turns what TRL appended to ``_metrics`` around one call into one weighted chunk."""

    def __init__(self, trainer: Any, version: str) -> None:
        self.trainer, self.version = trainer, version
        holds = conditions(trainer.args)  # the callback's own reading of the run's arguments
        self.sequence_level = When.SEQUENCE_LEVEL in holds
        self.raw_kl = When.RAW_KL in holds  # TRL's kl is the plain K3 (else K3 times the ratio)
        self.local_completions: list[list[int]] | None = None
        self.rewards: Any = None  # the gathered rewards per function, as TRL computed them

    # -- helpers ---------------------------------------------------------------------------------

    def _training(self) -> bool:
        return bool(self.trainer.model.training)

    def _new(self, before: Mapping[str, int]) -> dict[str, list[float]]:
        now = self.trainer._metrics["train"]
        return {k: list(v[before.get(k, 0):]) for k, v in now.items() if len(v) > before.get(k, 0)}

    def _snapshot(self) -> dict[str, int]:
        return {k: len(v) for k, v in self.trainer._metrics["train"].items()}

    def _one(self, new: Mapping[str, list[float]], key: str) -> float | None:
        values = new.get(key)
        if not values:
            return None
        if len(values) != 1:
            raise MetricsError(
                f"exact_grpo: TRL {self.version} appended {len(values)} values of {key!r} in one call, expected "
                f"one; its internals moved (tested {TESTED_TRL}); fix: pin trl=={TESTED_TRL}"
            )
        value = float(values[0])
        return None if math.isnan(value) else value

    # -- one micro-batch -------------------------------------------------------------------------

    def loss_chunk(self, inputs: Mapping[str, Any], new: Mapping[str, list[float]]) -> dict[str, Any]:
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        rows, width = int(mask.shape[0]), int(mask.shape[1])
        tokens = int(mask.sum().item())
        # TRL's global_masked_mean: a tensor one column wide is a per-sequence value counted by rows
        token_weight = rows if width == 1 else tokens
        per_sequence = self.sequence_level and inputs["advantages"].dim() == 1  # the ratio is one per row
        chunk: dict[str, Any] = {"grpo_valid_token_count": token_weight, "trl_exact_policy_token_count": token_weight}
        if per_sequence:
            chunk["grpo_valid_sequence_count"] = rows
            chunk["trl_exact_policy_sequence_count"] = rows
        keys = _LOSS_KEYS_SEQUENCE if per_sequence else _LOSS_KEYS_TOKEN
        for key, source in keys.items():
            value = self._one(new, key)
            if value is not None:
                chunk[source] = value
        kl = self._one(new, "kl")
        if kl is not None:
            chunk["grpo_kl_mean" if self.raw_kl else "trl_exact_kl_ratio_mean"] = kl
        for key, source in _EXTREMA.items():
            value = self._one(new, key)
            if value is not None:
                chunk[source] = value
        return chunk

    # -- one generation --------------------------------------------------------------------------

    def generation_chunk(self, new: Mapping[str, list[float]]) -> dict[str, Any]:
        trainer = self.trainer
        completions = self.local_completions or []
        stop = {*trainer.eos_token_ids, trainer._tokenizer.pad_token_id}
        chunk: dict[str, Any] = {
            "grpo_response_count": len(completions),
            "trl_exact_completion_count": len(completions),
            "trl_exact_terminated_count": sum(1 for ids in completions if ids and ids[-1] in stop),
        }
        for key, source in _GENERATION.items():
            value = self._one(new, key)
            if value is not None:
                chunk[source] = value
        if self.rewards is not None:
            chunk.update(self._reward_chunk(new, len(completions)))
        return chunk

    def _reward_chunk(self, new: Mapping[str, list[float]], local: int) -> dict[str, Any]:
        import torch

        per_func = self.rewards  # (global completions, functions), gathered by TRL on every rank
        start = int(self.trainer.accelerator.process_index) * local
        unscorable = torch.isnan(per_func).all(dim=1)
        scored_here = int((~unscorable[start:start + local]).sum().item())
        scored = int((~unscorable).sum().item())
        chunk: dict[str, Any] = {"rollout_count": scored_here}
        mean, std = self._one(new, "reward"), self._one(new, "reward_std")
        if mean is not None:
            chunk["reward_mean"] = mean
            if std is not None or scored == 1:  # TRL's std is Bessel-corrected: ours is the population's
                chunk["reward_std"] = 0.0 if scored <= 1 else float(std or 0.0) * math.sqrt((scored - 1) / scored)
        for i, name in enumerate(self.trainer.reward_func_names):
            column = ~torch.isnan(per_func[:, i])
            here, total = int(column[start:start + local].sum().item()), int(column.sum().item())
            chunk[_reward_key(name, "count")] = here
            f_mean = self._one(new, f"rewards/{name}/mean")
            f_std = self._one(new, f"rewards/{name}/std")
            if f_mean is not None:
                chunk[_reward_key(name, "mean")] = f_mean
                chunk[_reward_key(name, "std")] = (
                    0.0 if total <= 1 else float(f_std or 0.0) * math.sqrt((total - 1) / total))
        return chunk


def _wrap(trainer: Any, name: str, around: Callable[..., Any]) -> None:
    original = getattr(trainer, name)

    @functools.wraps(original)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        return around(original, *args, **kwargs)

    setattr(trainer, name, wrapped)


def exact_grpo(trainer: Any, metrics: PosttrainMetricsCallback) -> Any:
    """Make ``trainer``'s GRPO figures exact over each optimizer window and every process; returns it.

    Call it on every rank, after building the trainer and before ``train()``; ``metrics`` is added to
    the trainer's callbacks if it is not there yet. TRL's own logged values for the keys recorded
    here are then not published (the exact ones replace them); the others still pass through.

    Raises :class:`MetricsError` when TRL is outside :data:`SUPPORTED_TRL` or its internals moved,
    when the trainer was already wrapped or already has another ``PosttrainMetricsCallback``, or when
    ``metrics`` lacks an adapter the keys need.
    """
    if not isinstance(metrics, PosttrainMetricsCallback):
        raise MetricsError(
            f"exact_grpo(trainer, metrics): metrics is a {type(metrics).__name__}; fix: pass the "
            "PosttrainMetricsCallback you give the trainer"
        )
    if getattr(trainer, "_posttrain_exact", False):
        raise MetricsError("exact_grpo: this trainer is already wrapped; fix: call exact_grpo once per trainer")
    needed = {"grpo_clip_frac": "grpo", "reward_mean": "reward", "trl_exact_entropy_mean": "trl_grpo_exact"}
    sources = {s for a in metrics.publisher.adapters for s in a.metrics}
    absent = sorted({adapter for source, adapter in needed.items() if source not in sources})
    if absent:
        raise MetricsError(
            f"exact_grpo: the callback's adapters lack {absent}; fix: keep the default adapters or add those"
        )
    version = check_trl(type(trainer))
    if not isinstance(getattr(trainer, "_metrics", None), dict) or "train" not in trainer._metrics:
        raise MetricsError(f"exact_grpo: TRL {version}'s GRPOTrainer has no _metrics['train']; fix: pin "
                           f"trl=={TESTED_TRL}")
    callbacks = list(getattr(getattr(trainer, "callback_handler", None), "callbacks", []))
    if any(isinstance(c, PosttrainMetricsCallback) and c is not metrics for c in callbacks):
        raise MetricsError(
            "exact_grpo: the trainer already has another PosttrainMetricsCallback, which would publish TRL's "
            "interval means as a second run beside this one's exact figures; fix: pass that same callback "
            "to exact_grpo"
        )
    for name in trainer.reward_func_names:  # the user's reward functions: one exact key each, declared
        metrics.declare(_reward_key(name, "count"), "sum", unit="completions",
                        meaning=f"Completions the reward function {name} scored (not None)")
        metrics.declare(_reward_key(name, "mean"), "weighted_mean", weight=_reward_key(name, "count"),
                        meaning=f"Mean reward of {name} over the completions it scored, exact")
        metrics.declare(_reward_key(name, "std"), "pooled_std", mean=_reward_key(name, "mean"),
                        weight=_reward_key(name, "count"),
                        meaning=f"Population std of {name}'s rewards, pooled exactly")
    recorder = _Recorder(trainer, version)
    _supersede(metrics, recorder, trainer.reward_func_names)

    def compute_loss(original: Callable[..., Any], model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        if not recorder._training():
            return original(model, inputs, *args, **kwargs)
        before = recorder._snapshot()
        loss = original(model, inputs, *args, **kwargs)
        metrics.on_chunk_end(recorder.loss_chunk(inputs, recorder._new(before)))
        return loss

    def generate(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        recorder.local_completions = [list(ids) for ids in out[1]]
        return out

    def calculate_rewards(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        recorder.rewards = out = original(*args, **kwargs)
        return out

    def generate_and_score(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if not recorder._training():
            return original(*args, **kwargs)
        before = recorder._snapshot()
        recorder.local_completions, recorder.rewards = None, None
        out = original(*args, **kwargs)
        metrics.on_chunk_end(recorder.generation_chunk(recorder._new(before)))
        return out

    _wrap(trainer, "compute_loss", compute_loss)
    _wrap(trainer, "_generate", generate)
    _wrap(trainer, "_calculate_rewards", calculate_rewards)
    _wrap(trainer, "_generate_and_score_completions", generate_and_score)
    trainer._posttrain_exact = True
    if metrics not in trainer.callback_handler.callbacks:
        trainer.add_callback(metrics)
    return trainer


def _supersede(metrics: PosttrainMetricsCallback, recorder: _Recorder, reward_funcs: list[str]) -> None:
    """Logged TRL keys whose exact figure is recorded: not published again as TRL's interval mean."""
    keys = _LOSS_KEYS_SEQUENCE if recorder.sequence_level else _LOSS_KEYS_TOKEN
    table = {**keys, **_EXTREMA, **_GENERATION,
             "kl": "grpo_kl_mean" if recorder.raw_kl else "trl_exact_kl_ratio_mean",
             "reward": "reward_mean", "reward_std": "reward_std"}
    for name in reward_funcs:
        table[f"rewards/{name}/mean"] = _reward_key(name, "mean")
        table[f"rewards/{name}/std"] = _reward_key(name, "std")
    metrics.superseded.update(table)
