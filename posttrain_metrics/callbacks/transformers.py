"""The Hugging Face ``Trainer`` / TRL callback: one line, ``Trainer(..., callbacks=[PosttrainMetricsCallback(...)])``.

Two paths feed one frame per optimizer step:

- **Logged values** (``on_log``): the keys the Trainer and TRL's ``GRPOTrainer`` log are mapped onto
  our catalogue where they mean the same (:data:`TRL_GRPO_MAPPING`, conditions decided once from
  the ``TrainingArguments``); the others pass through under ``train/trl_<key>`` as plain means
  (declared by the ``trl_grpo`` adapter, or undeclared when their name is the user's, such as
  ``rewards/<reward_func>/mean``), warned once. TRL and the Trainer have already reduced these over
  the ranks and averaged them over the logging interval, so global rank 0 contributes each one
  exactly once and our reduction neither re-averages nor re-weights them. A weighted key's weight is
  then a unit of no meaning, and it is not published (``train/valid_token_count`` would read 1).
- **Per-micro-batch values** (``on_chunk_end``): the Trainer hands callbacks no per-micro-batch
  values (``on_substep_end``/``on_step_end`` receive only arguments, state and model), so code that
  has them (a ``compute_loss`` override, on every rank) passes each micro-batch's source-name dict to
  :meth:`PosttrainMetricsCallback.on_chunk_end`. The window closes at the optimizer step and is
  reduced exactly, over the micro-batches and every rank, by the same engine as any other loop. A
  key recorded this way wins over the mapping of the same key's logged value.

Every rank runs the callback (it joins the step's collectives); the publisher writes on global
rank 0 only, at ``state.global_step``. Turn the Trainer's own reporters off with
``report_to="none"`` (the default from transformers 5) to avoid logging twice.
"""

from __future__ import annotations

import dataclasses
import enum
import numbers
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..core.catalog.trl import passthrough_leaf
from ..core.distributed import global_rank
from ..core.errors import MetricsError
from ..core.frame import Frame
from ..core.layout import RefusedChunk
from ..core.reducer import AdapterSpec
from ..core.reduction import Reduction
from ..core.throughput import Throughput
from ..core.values import Scalar
from ..core.warn import warn
from ..integrations.base import Sink
from ..integrations.factory import plain
from .generic import MetricsCallback

try:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "posttrain_metrics.callbacks.transformers needs transformers; fix: pip install 'posttrain-metrics[hf]'"
    ) from exc

__all__ = [
    "DEFAULT_ADAPTERS",
    "TRL_GRPO_MAPPING",
    "KeyMapping",
    "PosttrainMetricsCallback",
    "When",
    "conditions",
]

DEFAULT_ADAPTERS: tuple[str, ...] = (
    "grpo", "reward", "trainer", "validation", "trl_grpo", "trl_grpo_exact", "hf_trainer",
)
"""The catalogue adapters a TRL GRPO run publishes through: the mapped keys' owners, the pass-through,
the exact TRL statistics :func:`posttrain_metrics.callbacks.trl.exact_grpo` records, and the plain
Trainer's own keys."""

PASSTHROUGH_ADAPTER = "trl_grpo"
SUMMARY_MARKER = "train_loss"  # only the Trainer's end-of-training summary log carries it


class When(enum.Enum):
    """When a logged key means the same as our key: decided once per run from the ``TrainingArguments``."""

    ALWAYS = "always"
    TOKEN_LEVEL = "importance_sampling_level='token' (TRL's clip ratios are token fractions)"
    SEQUENCE_LEVEL = "importance_sampling_level='sequence' (GSPO: TRL's clip ratios are sequence fractions)"
    RAW_KL = (
        "TRL's kl is the plain K3: use_bias_correction_kl off, or on-policy (num_iterations=1, "
        "steps_per_generation <= gradient_accumulation_steps, no vLLM), where the ratio it multiplies is exactly 1"
    )
    ONE_GENERATION_PER_LOG = (
        "at most one generation per logging interval: logging_steps * gradient_accumulation_steps <= "
        "steps_per_generation * num_iterations (a later interval would hold TRL's mean of maxima)"
    )


@dataclasses.dataclass(frozen=True)
class KeyMapping:
    """A logged key (``phase`` logs: ``eval_`` stripped for ``val``) that means our public ``key``."""

    logged: str
    key: str
    when: When
    exactness: str
    phase: str = "train"


_INTERVAL = "a logging interval of several optimizer steps holds the plain mean over them"
_GENERATIONS = (
    "each generation batch is gathered over every rank, so a value is exact for its batch; batches are "
    "of equal size, so TRL's plain mean over an interval's generations is the exact mean over their completions"
)
_MICRO = (
    "TRL's token mean of each micro-batch over every rank (exact across ranks), then the plain mean over "
    "the interval's micro-batches: exact when the micro-batches hold equal completion-token counts"
)

TRL_GRPO_MAPPING: tuple[KeyMapping, ...] = (
    KeyMapping("loss", "train/loss_avg", When.ALWAYS,
               "the Trainer's mean over ranks of each rank's accumulated loss; with TRL's default dapo loss "
               "(normalised by the global token count) that is the exact token mean of the window; " + _INTERVAL),
    KeyMapping("grad_norm", "train/grad_norm", When.ALWAYS,
               "the pre-clip total norm of the globally reduced gradient at the last optimizer step of the "
               "interval: exact, and our LAST semantics"),
    KeyMapping("learning_rate", "train/learning_rate", When.ALWAYS,
               "the rate the last update of the interval used (read before the scheduler steps): exact for "
               "logging_steps=1"),
    KeyMapping("reward", "train/reward_mean", When.ALWAYS, "sum of weighted reward functions; " + _GENERATIONS),
    KeyMapping("kl", "train/kl_mean", When.RAW_KL, "the unscaled K3 toward the reference; " + _MICRO),
    KeyMapping("clip_ratio/region_mean", "train/clip_frac", When.TOKEN_LEVEL,
               "tokens where the clipped branch of the surrogate was active (ratio < 1-eps with A < 0, or > 1+eps "
               "with A > 0); " + _MICRO),
    KeyMapping("clip_ratio/region_mean", "train/seq_clip_frac", When.SEQUENCE_LEVEL,
               "sequences whose sequence-level ratio was clipped; " + _MICRO.replace("completion-token", "sequence")),
    KeyMapping("completions/mean_length", "train/response_len_mean", When.ALWAYS,
               "generated tokens per completion; " + _GENERATIONS),
    KeyMapping("completions/max_length", "train/response_len_max", When.ONE_GENERATION_PER_LOG,
               "the longest completion of the generation batch, over every rank: exact"),
    KeyMapping("completions/clipped_ratio", "train/rollout_truncated_frac", When.ALWAYS,
               "completions that did not end with EOS (cut at max_completion_length); " + _GENERATIONS),
    KeyMapping("reward", "val/reward_avg", When.ALWAYS, "eval_reward: the held-out mean reward", phase="val"),
    KeyMapping("epoch", "train/epoch", When.ALWAYS, "the Trainer's fractional epoch when it logged: exact"),
    KeyMapping("loss", "val/loss", When.ALWAYS, "eval_loss: the Trainer's evaluation loss", phase="val"),
    KeyMapping("runtime", "val/runtime_s", When.ALWAYS, "eval_runtime: wall time of the evaluation loop",
               phase="val"),
    KeyMapping("samples_per_second", "val/samples_per_s", When.ALWAYS,
               "eval_samples_per_second: evaluation throughput", phase="val"),
    KeyMapping("steps_per_second", "val/steps_per_s", When.ALWAYS, "eval_steps_per_second: evaluation batches per "
               "second", phase="val"),
)
"""Logged TRL/Trainer keys that mean the same as a catalogue key, with when and how exactly."""

ARGS_ECHO: tuple[tuple[str, str], ...] = (("beta", "train/kl_beta"),)
"""GRPOConfig fields echoed each logged step (``beta`` is the KL coefficient: the console then shows kl)."""


def _is_grpo_config(args: Any) -> bool:
    return any(cls.__name__ == "GRPOConfig" for cls in type(args).__mro__)


def _run_config(args: Any) -> dict[str, Any]:
    """The run's config: the ``TrainingArguments`` as the Trainer serialises them (tokens masked)."""
    return dict(args.to_dict())


def _value(x: Any) -> Any:
    return getattr(x, "value", x)  # a str enum (IntervalStrategy) or a plain string


def _at_most_one_generation(args: Any, state: Any) -> bool:
    if _value(getattr(args, "logging_strategy", "steps")) != "steps":
        return False
    logging_steps = int(getattr(state, "logging_steps", 0) or 0) or int(getattr(args, "logging_steps", 1) or 1)
    accumulation = int(getattr(args, "gradient_accumulation_steps", 1) or 1)
    per_generation = int(getattr(args, "steps_per_generation", None) or accumulation)
    iterations = int(getattr(args, "num_iterations", 1) or 1)
    return logging_steps * accumulation <= per_generation * iterations


def _on_policy(args: Any) -> bool:
    """TRL reuses the policy's own log-probs as the old ones (the ratio is exactly 1)."""
    accumulation = int(getattr(args, "gradient_accumulation_steps", 1) or 1)
    per_generation = int(getattr(args, "steps_per_generation", None) or accumulation)
    return (int(getattr(args, "num_iterations", 1) or 1) == 1 and per_generation <= accumulation
            and not getattr(args, "use_vllm", False))


def conditions(args: Any, state: Any = None) -> frozenset[When]:
    """The :class:`When` conditions that hold for a run with these ``TrainingArguments``.

    >>> from types import SimpleNamespace as NS
    >>> sorted(w.name for w in conditions(NS(importance_sampling_level="sequence", logging_steps=1,
    ...                                      gradient_accumulation_steps=4, steps_per_generation=4)))
    ['ALWAYS', 'ONE_GENERATION_PER_LOG', 'RAW_KL', 'SEQUENCE_LEVEL']
    """
    holds = {When.ALWAYS}
    level = getattr(args, "importance_sampling_level", "token")
    holds.add(When.SEQUENCE_LEVEL if level == "sequence" else When.TOKEN_LEVEL)
    if not getattr(args, "use_bias_correction_kl", False) or _on_policy(args):
        holds.add(When.RAW_KL)
    if _at_most_one_generation(args, state):
        holds.add(When.ONE_GENERATION_PER_LOG)
    return frozenset(holds)


@dataclasses.dataclass(frozen=True)
class _Route:
    source: str  # the source name our adapter takes
    key: str  # the public key it publishes
    weight: str | None = None  # source name of the weight a weighted key needs (a unit, never published)
    weight_key: str | None = None
    passthrough: bool = False  # no counterpart: the trainer's own value under train/trl_<key>


@dataclasses.dataclass(frozen=True)
class _Routes:
    """Where each logged value goes in this run: decided once, from the mapping and the adapters."""

    mapped: dict[tuple[str, str], _Route]  # (phase, logged key) -> a catalogue key with its meaning
    declared: dict[tuple[str, str], _Route]  # (phase, source) -> a trl_grpo pass-through key
    echoed: dict[str, _Route]  # GRPOConfig field -> its key

    def find(self, phase: str, logged: str) -> _Route | None:
        return self.mapped.get((phase, logged)) or self.declared.get((phase, passthrough_leaf(logged)))


@dataclasses.dataclass
class _Translation:
    chunk: dict[str, Any] = dataclasses.field(default_factory=dict)
    unit_weights: set[str] = dataclasses.field(default_factory=set)  # public keys, not published
    extras: dict[str, Scalar] = dataclasses.field(default_factory=dict)  # undeclared pass-through


class PosttrainMetricsCallback(TrainerCallback, MetricsCallback):  # type: ignore[misc]
    """Publishes a Trainer's or TRL ``GRPOTrainer``'s metrics through our catalogue and sinks.

    Constructed like :class:`~posttrain_metrics.callbacks.MetricsCallback` (``adapters``, ``sinks``,
    ``out_dir``, ``run_name``, ``extra`` for your own keys, ``perf`` for throughput and stage timers:
    ``with callback.timer("generation"):``), or from a config with :meth:`from_config`
    or Hydra's ``instantiate``.
    The sinks start at ``on_train_begin`` with the ``TrainingArguments`` as the run's config and
    close at ``on_train_end``; wrap ``trainer.train()`` in ``with callback:`` to mark a crashed run
    failed. The Trainer's end-of-training summary log (``train_runtime``, ``train_loss``) is not a
    step and is not published.

    >>> cb = PosttrainMetricsCallback(sinks=[{"type": "memory"}])
    >>> sorted(a.name for a in cb.publisher.adapters)
    ['grpo', 'hf_trainer', 'reward', 'trainer', 'trl_grpo', 'trl_grpo_exact', 'validation']
    """

    def __init__(
        self,
        *,
        adapters: AdapterSpec = DEFAULT_ADAPTERS,
        sinks: Sequence[Mapping[str, Any] | Sink] = ({"type": "console"}, {"type": "journal"}),
        out_dir: str | os.PathLike[str] | None = None,
        run_name: str | None = None,
        run_id: str | None = None,
        extra: Mapping[str, Any] | None = None,
        perf: bool | Mapping[str, Any] | Throughput = False,
        health: Mapping[str, Any] | None = None,
    ) -> None:
        MetricsCallback.__init__(
            self, adapters=adapters, sinks=sinks, out_dir=out_dir, run_name=run_name, run_id=run_id, extra=extra,
            perf=perf, health=health,
        )
        self._routes: _Routes | None = None
        self._recorded: set[str] = set()  # source names recorded via on_chunk_end in the open window
        self._open_step: int | None = None  # a window whose step ended; the log that follows closes it
        self._announced: set[str] = set()  # pass-through keys already warned about
        self.superseded: dict[str, str] = {}
        """Logged key -> the source name recorded per micro-batch that replaces it (filled by
        :func:`posttrain_metrics.callbacks.trl.exact_grpo`): a log whose interval recorded the source
        does not also publish the logged value, TRL's mean of means over that interval."""
        self._recorded_since_log: set[str] = set()  # source names recorded since the last train log

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> PosttrainMetricsCallback:
        """The callback from a plain config dict (``_target_`` optional), without Hydra.

        >>> PosttrainMetricsCallback.from_config({"sinks": [{"type": "memory"}]}).sinks[0].name
        'memory'
        """
        options = plain(dict(config))
        target = options.pop("_target_", None)
        if target not in (None, f"{cls.__module__}.{cls.__name__}"):
            raise MetricsError(f"_target_ {target!r} is not {cls.__module__}.{cls.__name__}")
        allowed = {"adapters", "sinks", "out_dir", "run_name", "run_id", "extra", "perf", "health"}
        unknown = sorted(set(options) - allowed)
        if unknown:
            raise MetricsError(f"unknown callback option(s) {unknown}; it takes {sorted(allowed)}")
        return cls(**options)

    # -- the per-micro-batch path -----------------------------------------------------------------

    def on_chunk_end(self, metrics: Mapping[str, Any] | RefusedChunk) -> None:
        """One micro-batch's source-name metrics, on every rank (call it from ``compute_loss``)."""
        super().on_chunk_end(metrics)
        if isinstance(metrics, Mapping):
            self._recorded.update(metrics)
            self._recorded_since_log.update(metrics)

    # -- Trainer events ---------------------------------------------------------------------------

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._routes = self._resolve(args, state)
        if state.max_steps and state.max_steps > 0:  # the console's step/total and ETA
            self.set_total_steps(int(state.max_steps))
        if not self._started:
            self.on_run_start(_run_config(args))

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._close_open_window(args)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        # DefaultFlowCallback (always first) has decided whether the Trainer logs this step; if it
        # does, the logged values join this window's frame in on_log, which closes it.
        if control.should_log:
            self._open_step = state.global_step
        else:
            self._close_window(state.global_step, args, None)
        if self.should_stop:  # live health's stop, the same step on every rank (see MetricsCallback.should_stop)
            control.should_training_stop = True

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float] | None = None,
        **kwargs: Any,
    ) -> None:
        if not logs:
            return
        if SUMMARY_MARKER in logs:
            self._close_open_window(args)
            return
        if any(name.startswith("eval_") for name in logs):
            self._close_eval(state.global_step, args, logs)
        else:
            self._close_window(state.global_step, args, logs)
        if self.should_stop:
            control.should_training_stop = True

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._close_open_window(args)
        self.on_run_end()

    # -- windows ----------------------------------------------------------------------------------

    def _close_open_window(self, args: Any) -> None:
        if self._open_step is not None:
            self._close_window(self._open_step, args, None)

    def _close_window(self, step: int, args: Any, logs: Mapping[str, Any] | None) -> None:
        """Reduce the window (collective, every rank) with the logged values, publish on rank 0."""
        self._open_step = None
        out = self._translate(logs, "train", args) if logs else _Translation()
        self._recorded.clear()
        if logs:  # the next log's interval starts after this one
            self._recorded_since_log.clear()
        reducer = self._reducer("train")
        if out.chunk and global_rank() == 0:  # already-global values: contributed exactly once
            reducer.add(out.chunk)
        self._emit(self._reduce_train(step, out.unit_weights), out)

    def _close_eval(self, step: int, args: Any, logs: Mapping[str, Any]) -> None:
        self._close_open_window(args)
        # the evaluation log repeats the Trainer's epoch, which the train frame of this step carries
        out = self._translate({k.removeprefix("eval_"): v for k, v in logs.items() if k != "epoch"}, "val", args)
        if any("val" in a.phases for a in self.publisher.adapters):  # the same answer on every rank
            reducer = self._reducer("val")
            if out.chunk and global_rank() == 0:
                reducer.add(out.chunk)
            frame = reducer.reduce(step, phase="val")
        else:
            frame = Frame(step, {}, "val", time.time())
        self._emit(frame, out)

    def _emit(self, frame: Frame, out: _Translation) -> None:
        metrics: dict[str, Scalar] = {k: v for k, v in frame.metrics.items() if k not in out.unit_weights}
        for key, value in out.extras.items():
            metrics.setdefault(key, value)
        if metrics:
            self._publish(Frame(frame.step, metrics, frame.phase, frame.wall_time))

    # -- the mapping ------------------------------------------------------------------------------

    def _resolve(self, args: Any, state: Any) -> _Routes:
        """Routes of logged keys to our source names, from the mapping and the run's adapters."""
        keys = self.publisher.keys
        adapters = {a.name: a for a in self.publisher.adapters}

        def route(key: str) -> _Route | None:
            info = keys.get(key)
            if info is None:  # no adapter of this run publishes it
                return None
            adapter = adapters[info.adapter]
            # a weighted mean needs its weight beside it; a counted extremum reported without its count
            # is taken as it is, so it needs no unit count (which would corrupt a recorded one)
            needs = info.metric.weight is not None and info.reduction not in (Reduction.MAX, Reduction.MIN)
            weight = adapter.source_of_leaf(info.metric.weight) if needs and info.metric.weight else None
            return _Route(adapter.source_of_leaf(info.metric.leaf), key, weight, info.weight_key if needs else None)

        holds = conditions(args, state)
        mapped = {(m.phase, m.logged): r for m in TRL_GRPO_MAPPING if m.when in holds and (r := route(m.key))}
        declared = {
            (phase, source): _Route(source, a.public_key(source, phase), passthrough=True)
            for a in self.publisher.adapters
            if a.name == PASSTHROUGH_ADAPTER
            for source in a.metrics
            for phase in a.phases
        }
        echoed = {f: r for f, key in ARGS_ECHO if _is_grpo_config(args) and (r := route(key))}
        return _Routes(mapped, declared, echoed)

    def _translate(self, logs: Mapping[str, Any], phase: str, args: Any) -> _Translation:
        if self._routes is None:  # evaluate() without train(): resolve from the arguments now
            self._routes = self._resolve(args, None)
        out = _Translation()
        if phase == "train":
            for field, route in self._routes.echoed.items():
                if isinstance(getattr(args, field, None), numbers.Real):
                    self._put(out, route, float(getattr(args, field)))
        fresh: list[str] = []
        for name, value in logs.items():
            if value is None:  # TRL logs None when every contribution was NaN: absent, not zero
                continue
            if phase == "train" and self.superseded.get(name) in self._recorded_since_log:
                continue  # recorded exactly in this log's interval: TRL's interval mean would say it twice
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                fresh += self._note(name, f"not published: {type(value).__name__} {value!r:.40}")
                continue
            found = self._routes.find(phase, name)
            if found is None:
                key = f"{phase}/{passthrough_leaf(name)}"
                out.extras[key] = float(value)
                fresh += self._note(name, f"{key} (undeclared)")
                continue
            if found.passthrough:
                fresh += self._note(name, found.key)
            if not self._put(out, found, value):
                fresh += self._note(name, f"dropped: its weight {found.weight_key} is recorded per micro-batch, "
                                    f"record {found.source} too")
        if fresh and global_rank() == 0:
            warn(
                "PosttrainMetricsCallback: logged keys with no counterpart in the catalogue pass through "
                "as the trainer's own values (plain means; `posttrain-metrics keys trl_grpo` lists the "
                f"declared ones), or cannot be published: {', '.join(fresh)}",
                stacklevel=3,
            )
        return out

    def _put(self, out: _Translation, route: _Route, value: Any) -> bool:
        """Add a logged value to the chunk; False when a recorded weight makes it unmergeable."""
        if route.source in self._recorded:
            return True  # recorded per micro-batch this window: the exact value wins
        if route.weight is not None and route.weight in self._recorded:
            return False  # a unit weight would corrupt the recorded count
        out.chunk[route.source] = value
        if route.weight is not None and route.weight_key is not None:
            out.chunk[route.weight] = 1
            out.unit_weights.add(route.weight_key)
        return True

    def _note(self, name: str, where: str) -> list[str]:
        if name in self._announced:
            return []
        self._announced.add(name)
        return [f"{name} -> {where}"]
