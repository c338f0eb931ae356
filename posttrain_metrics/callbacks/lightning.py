"""The PyTorch Lightning callback: chunk = training batch, window = optimizer step.

A ``Callback`` and not a ``Logger``, because a Lightning logger is the wrong end of the pipe: it
runs on global rank 0 only and receives ``log_metrics(metrics, step)`` *after* Lightning has reduced
each ``self.log`` value (``on_epoch``: a batch-size-weighted mean of the per-batch values over the
batches of every rank; ``on_step``: one batch's value, synced over ranks). By then a token-weighted
fraction has become a mean of means, and no logger can undo it.
A callback runs on every rank, sees each batch's ``training_step`` output, and can join the step's
collectives, which is what an exact reduction needs.

The LightningModule hands its source-name metrics over in the ``training_step`` output dict, under
``"posttrain_metrics"`` (the callback's ``output_key``)::

    def training_step(self, batch, batch_idx):
        ...
        return {"loss": loss, "posttrain_metrics": {
            "grpo_clip_frac": clipped / tokens, "grpo_valid_token_count": tokens, ...}}

    trainer = L.Trainer(accumulate_grad_batches=4, logger=False,
                        callbacks=[LightningMetricsCallback(adapters=["grpo", "trainer"], ...)])

Tensors are fine (one stacked device-to-host copy per window). Every batch is one chunk; when
``trainer.global_step`` has advanced after a batch (the optimizer stepped, under
``accumulate_grad_batches`` every N batches and at the end of an epoch), the window is reduced on
every rank (our reducer over torch.distributed, which Lightning's DDP strategy initialises) and
published on global rank 0 at step ``trainer.global_step``. ``validation_step`` may return the same
key; the validation epoch is then one ``val/`` window (sanity checks are not published).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from ..core.layout import RefusedChunk
from ..core.reducer import AdapterSpec
from ..core.throughput import Throughput
from ..integrations.base import Sink
from ..integrations.factory import plain
from .generic import MetricsCallback

try:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import Callback
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "posttrain_metrics.callbacks.lightning needs lightning; fix: pip install 'posttrain-metrics[lightning]'"
    ) from exc

__all__ = ["OUTPUT_KEY", "LightningMetricsCallback"]

OUTPUT_KEY = "posttrain_metrics"
"""Where ``training_step`` / ``validation_step`` put their source-name metrics in the output dict."""


def _total_steps(trainer: pl.Trainer) -> int | None:
    """The run's optimizer steps, for the console's step/total and ETA: ``max_steps`` when set, else
    Lightning's own estimate from the epochs and batches; ``None`` when unbounded or unknown."""
    total: Any = trainer.max_steps
    if not (isinstance(total, int) and total > 0):
        try:
            total = trainer.estimated_stepping_batches
        except Exception:  # no dataloader length yet (an iterable dataset): unknown, not an error
            return None
    return int(total) if isinstance(total, (int, float)) and math.isfinite(total) and total >= 1 else None


class LightningMetricsCallback(Callback):  # type: ignore[misc]
    """Reduces each optimizer window's batch metrics exactly over every rank; publishes on rank 0.

    Constructed like :class:`~posttrain_metrics.callbacks.MetricsCallback`, which it drives
    (``.metrics``; it holds one rather than being one, because Lightning's own ``on_validation_end``
    hook would collide with ``MetricsCallback.on_validation_end``). The sinks start at
    ``on_train_start`` (with the module's ``hparams`` as the run's config), close at
    ``on_train_end``, and close as failed on an exception.

    >>> cb = LightningMetricsCallback(adapters=["grpo"], sinks=[{"type": "memory"}])
    >>> cb.output_key
    'posttrain_metrics'
    """

    def __init__(
        self,
        *,
        adapters: AdapterSpec,
        sinks: Sequence[Mapping[str, Any] | Sink] = ({"type": "console"}, {"type": "journal"}),
        out_dir: str | os.PathLike[str] | None = None,
        run_name: str | None = None,
        run_id: str | None = None,
        output_key: str = OUTPUT_KEY,
        extra: Mapping[str, Any] | None = None,
        perf: bool | Mapping[str, Any] | Throughput = False,
        health: Mapping[str, Any] | None = None,
    ) -> None:
        self.metrics = MetricsCallback(
            adapters=adapters, sinks=sinks, out_dir=out_dir, run_name=run_name, run_id=run_id, extra=extra,
            perf=perf, health=health,
        )
        self.output_key = output_key
        self._seen_step: int | None = None
        self._val_chunks: list[Mapping[str, Any] | RefusedChunk] = []

    def _chunk(self, outputs: Any, hook: str) -> Mapping[str, Any] | RefusedChunk | None:
        if not isinstance(outputs, Mapping) or self.output_key not in outputs:
            return None  # a bare loss, or a step that returned nothing: this batch adds no chunk
        chunk = outputs[self.output_key]
        if not isinstance(chunk, Mapping) or not all(isinstance(name, str) for name in chunk):
            # Recorded, not raised here: this rank still joins the window's collective, and every
            # rank raises it there (raising on one rank alone would leave the others waiting).
            return RefusedChunk(
                f"{hook} returned {self.output_key!r}: {type(chunk).__name__} {chunk!r:.60}; fix: return a "
                f"dict of source names to values, e.g. {{'loss': loss, {self.output_key!r}: "
                "{'grpo_clip_frac': frac, 'grpo_valid_token_count': tokens}}"
            )
        return chunk

    # -- training ---------------------------------------------------------------------------------

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._seen_step = trainer.global_step
        self.metrics.set_total_steps(_total_steps(trainer))
        if self.metrics.publisher.run is None:
            self.metrics.on_run_start(plain(dict(pl_module.hparams)))

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        chunk = self._chunk(outputs, "training_step")
        if chunk is not None:
            self.metrics.on_chunk_end(chunk)
        # The optimizer stepped inside this batch iff global_step moved (public, equal on every rank).
        if trainer.global_step != self._seen_step:
            self._seen_step = trainer.global_step
            self.metrics.on_window_end(trainer.global_step)
            if self.metrics.should_stop:  # live health's stop: the same step on every rank
                trainer.should_stop = True

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.metrics.on_run_end()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self.metrics.on_run_end(failed=True, error=exception)  # Ctrl-C: interrupted, with the reason

    # -- validation -------------------------------------------------------------------------------

    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        chunk = self._chunk(outputs, "validation_step")
        if chunk is not None and not trainer.sanity_checking:
            self._val_chunks.append(chunk)

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        chunks, self._val_chunks = self._val_chunks, []
        if trainer.sanity_checking:
            return
        # Collective on every rank when an adapter publishes val/ (the same answer everywhere); with
        # none, returned val metrics are a configuration error, raised on every rank alike.
        if chunks or any("val" in a.phases for a in self.metrics.publisher.adapters):
            self.metrics.on_validation_end(trainer.global_step, chunks)
