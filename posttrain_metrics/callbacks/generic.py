"""The trainer callback for hand-written loops and config-driven trainers.

One object per rank. Each hook turns one trainer event into one core call: a chunk's metrics go to
the reducer, the end of an optimizer window reduces (collectively, on every rank) and publishes (on
global rank 0), the end of the run closes the sinks. It holds no arithmetic and no vendor code.

In a config (Hydra/OmegaConf ``instantiate``, or :func:`build_callback` without Hydra)::

    _target_: posttrain_metrics.callbacks.MetricsCallback
    adapters: [grpo, reward, trainer]
    out_dir: runs/my-run
    sinks:
      - {type: wandb, project: my-project}
      - {type: mlflow}
      - {type: tensorboard}
      - {type: console}
      - {type: journal}
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core.errors import MetricsError
from ..core.frame import Frame
from ..core.layout import RefusedChunk
from ..core.reducer import AdapterSpec, MetricReducer
from ..integrations.base import Sink
from ..integrations.console import check_total_steps
from ..integrations.factory import build_sink, check_callback, plain, safe_name
from ..publication import Publisher

__all__ = ["MetricsCallback", "build_callback"]


class MetricsCallback:
    """Reduces chunk metrics exactly per optimizer window and publishes them to sinks.

    ``adapters`` names the catalogue adapters (``["grpo", "reward", "trainer"]``); ``sinks`` are
    sink objects or configs (``{"type": "tensorboard"}``); file-backed sinks write under
    ``out_dir``. Sinks are constructed on every rank (constructors do no I/O) but only global rank
    0 starts and writes them. ``publisher`` says where the trackers are written: ``"process"`` (the
    default: a publisher process tails the journal; the training thread writes only the journal and
    console lines; ``on_run_start`` does not wait for the trackers, and their own output goes to
    ``<out_dir>/publisher.log``), ``"thread"`` (the same, on a thread of this process: no wait
    either, but the trackers' output stays on this process's streams) or ``"inline"`` (every sink on
    the calling thread: ``on_run_start`` waits for each tracker to start, seconds for MLflow's schema
    on a fresh SQLite file); ``close`` waits up to ``close_timeout`` seconds for the trackers (see
    :class:`~posttrain_metrics.publication.Publisher`).
    ``imports`` names modules that register your own adapters, for the publisher process to import.
    ``total_steps`` (the run's optimizer steps, when known) makes the console line read ``step/total``
    with an ETA; trainer callbacks set it from the trainer's ``max_steps`` (:meth:`set_total_steps`).
    Use as a context manager, or call ``on_run_end`` in a ``finally``: it is idempotent and also runs
    at interpreter exit. Under a launcher that started several ranks
    (``WORLD_SIZE`` > 1), reduce refuses until torch.distributed is initialised, unless ``local=True``
    says that a per-rank local reduction is deliberate.
    """

    def __init__(
        self,
        *,
        adapters: AdapterSpec,
        sinks: Sequence[Mapping[str, Any] | Sink] = ({"type": "console"},),
        out_dir: str | os.PathLike[str] | None = None,
        run_name: str | None = None,
        run_id: str | None = None,
        group: Any = None,
        local: bool = False,
        publisher: str = "process",
        close_timeout: float = 300.0,
        imports: Sequence[str] = (),
        total_steps: int | None = None,
    ) -> None:
        adapters, sinks = plain(adapters), plain(sinks)
        check_callback(adapters=adapters, sinks=sinks, out_dir=out_dir, run_name=run_name)
        self.out_dir = Path(out_dir) if out_dir is not None else None
        name = safe_name(run_name) if run_name else None
        built = [build_sink(spec, out_dir=self.out_dir) for spec in sinks]
        self.publisher = Publisher(built, adapters=adapters, run_name=name, run_id=run_id, mode=publisher,
                                   close_timeout=close_timeout, imports=plain(imports))
        # One reducer per phase, over the adapters that publish it: the reward report and the
        # validation adapter both take bare source names (reward_std) but never share a phase.
        self._reducers = {
            phase: MetricReducer([a for a in self.publisher.adapters if phase in a.phases], group=group, local=local)
            for phase in ("train", "val")
            if any(phase in a.phases for a in self.publisher.adapters)
        }
        self.last_frame: Frame | None = None
        self._started = False
        self.set_total_steps(total_steps)
        log = self.publisher.vendor_log
        if log is not None:
            for sink in built:
                if isinstance(getattr(sink, "notes", None), list):
                    sink.notes.append(f"tracker logs (W&B, MLflow, TensorBoard output): {log}")  # type: ignore[attr-defined]

    def set_total_steps(self, total_steps: int | None) -> None:
        """The run's number of optimizer steps (``None``: unknown), for the console's ``step/total``
        and ETA; may be called at any time (trainer callbacks call it when the trainer knows)."""
        check_total_steps(total_steps)
        for sink in self.publisher.sinks:
            setter = getattr(sink, "set_total_steps", None)
            if callable(setter):
                setter(total_steps)

    @property
    def sinks(self) -> list[Sink]:
        return list(self.publisher.sinks)

    @property
    def run_handles(self) -> dict[str, dict[str, Any]]:
        """The trackers' own names for this run, once the publisher has started them (rank 0):
        ``{"wandb": {"run_id", "url", ...}, "mlflow": {"run_id", "experiment_id", "tracking_uri"},
        "tensorboard": {"log_dir"}}``. Attach your own logging to the same runs with them, e.g.
        ``MlflowClient(h["tracking_uri"]).log_artifact(h["run_id"], path)``. Empty until reported
        (the publisher process reports within a second of starting each tracker)."""
        return self.publisher.run_handles()

    def on_run_start(self, config: Mapping[str, Any] | None = None) -> None:
        """Start the sinks (rank 0) with the run's config, redacted at every depth: nested as given in
        the journal and W&B, one ``a/b`` param per value in MLflow (a list as one param)."""
        self.publisher.start(plain(config) if config is not None else None)
        self._started = True

    def on_chunk_end(self, metrics: Mapping[str, Any] | RefusedChunk) -> None:
        """One gradient-accumulation chunk's source-name metrics (every rank)."""
        self._reducer("train").add(metrics)

    def on_window_end(self, step: int) -> Frame:
        """End of an optimizer window: reduce on every rank, publish on rank 0."""
        return self._publish(self._reducer("train").reduce(step, phase="train"))

    def on_validation_end(
        self, step: int, metrics: Mapping[str, Any] | Sequence[Mapping[str, Any] | RefusedChunk]
    ) -> Frame:
        """This rank's validation metrics (one chunk dict or a list of them), reduced under ``val/``.

        Atomic on every rank: a chunk that cannot be taken (not a dict, a bad value) fails the whole
        call with a ``MetricsError`` on every rank, after this rank has joined the collective, and
        leaves nothing pending for the next validation."""
        reducer = self._reducer("val")
        many = isinstance(metrics, Sequence) and not isinstance(metrics, (str, bytes))
        reducer.add_window(list(metrics) if many else [metrics])
        return self._publish(reducer.reduce(step, phase="val"))

    def on_run_end(self, failed: bool = False) -> None:
        """Close every sink with the run's status (FAILED when ``failed``). Idempotent."""
        self.publisher.close(failed=failed)

    def _reducer(self, phase: str) -> MetricReducer:
        try:
            return self._reducers[phase]
        except KeyError:
            names = [a.name for a in self.publisher.adapters]
            raise MetricsError(
                f"none of the adapters {names} publishes the {phase!r} phase; fix: add one that does "
                "(e.g. 'validation' for val/reward_avg)"
            ) from None

    def _publish(self, frame: Frame) -> Frame:
        if not self._started:
            self.on_run_start()
        self.publisher.publish(frame)
        self.last_frame = frame
        return frame

    def __enter__(self) -> MetricsCallback:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.on_run_end(failed=exc_type is not None)


def build_callback(config: Mapping[str, Any]) -> MetricsCallback:
    """The callback from a plain config dict (the same shape Hydra instantiates), without Hydra.

    >>> cb = build_callback({"_target_": "posttrain_metrics.callbacks.MetricsCallback",
    ...                      "adapters": ["grpo"], "sinks": [{"type": "memory"}]})
    >>> [s.name for s in cb.sinks]
    ['memory']
    """
    options = plain(dict(config))
    target = options.pop("_target_", None)
    if target not in (None, "posttrain_metrics.callbacks.MetricsCallback",
                      "posttrain_metrics.callbacks.generic.MetricsCallback"):
        raise MetricsError(f"_target_ {target!r} is not posttrain_metrics.callbacks.MetricsCallback")
    allowed = {"adapters", "sinks", "out_dir", "run_name", "run_id", "local", "publisher", "close_timeout",
               "imports", "total_steps"}
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise MetricsError(f"unknown callback option(s) {unknown}; it takes {sorted(allowed)}")
    if "adapters" not in options:
        raise MetricsError("the callback config needs adapters, e.g. adapters: [grpo, reward, trainer]")
    return MetricsCallback(**options)
