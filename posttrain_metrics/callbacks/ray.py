"""Exact metrics on a Ray driver: gather the workers' window states, merge them, publish.

The single-controller way (verl, OpenRLHF): actors train, the driver logs. Each actor keeps a
:class:`~posttrain_metrics.core.portable.WorkerMetrics`, ``add``s its chunks and returns
``export(step, phase=...)`` from a method (``metrics_state`` by default); the driver merges the
states with the core's own merge and publishes the frame through a
:class:`~posttrain_metrics.publication.Publisher`. No torch.distributed anywhere.

Ray is imported where used (``pip install 'posttrain-metrics[ray]'``); the merge itself needs no Ray,
so states that arrive another way go straight to :meth:`RayDriver.publish`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..core.errors import MetricsError
from ..core.frame import Frame
from ..core.portable import DriverReducer, State
from ..core.reducer import AdapterSpec
from ..publication import Publisher

__all__ = ["RayDriver", "gather", "resolve"]

INSTALL = "pip install 'posttrain-metrics[ray]'"


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError(f"the Ray integration needs ray: {INSTALL}") from exc
    return ray


def gather(
    actors: Sequence[Any],
    step: int,
    *,
    phase: str = "train",
    method: str = "metrics_state",
    timeout: float | None = None,
) -> list[Any]:
    """Call ``actor.<method>.remote(step, phase=phase)`` on every actor; one ``ray.get`` for all.

    The actor method returns ``self.metrics.export(step, phase=phase)``. Results come back in the
    order of ``actors``; a failed or dead actor raises Ray's own error.
    """
    ray = _ray()
    refs = []
    for i, actor in enumerate(actors):
        try:
            remote = getattr(actor, method).remote
        except AttributeError:
            raise MetricsError(
                f"actor {i} ({actor!r:.80}) has no remote method {method!r}; fix: define "
                f"`def {method}(self, step, phase='train'): return self.metrics.export(step, phase=phase)` "
                "on the actor class, or pass method= the name of yours"
            ) from None
        refs.append(remote(step, phase=phase))
    return list(ray.get(refs, timeout=timeout))


def resolve(objects: Iterable[Any], *, key: str | None = None, timeout: float | None = None) -> list[Any]:
    """Worker states from what the trainer's remote calls already return.

    ``objects`` may hold Ray ``ObjectRef``s (fetched with one ``ray.get``) and plain results. With
    ``key``, each result carries its state under ``key``: an item of a dict, or of a verl-style
    ``DataProto.meta_info``. Without ``key``, each result is the state itself.
    """
    items = list(objects)
    refs = [i for i, obj in enumerate(items) if type(obj).__name__ == "ObjectRef"]
    if refs:
        fetched = _ray().get([items[i] for i in refs], timeout=timeout)
        for i, value in zip(refs, fetched):
            items[i] = value
    if key is None:
        return items
    out = []
    for i, result in enumerate(items):
        holder = result if isinstance(result, Mapping) else getattr(result, "meta_info", None)
        if not isinstance(holder, Mapping) or key not in holder:
            raise MetricsError(
                f"result {i} ({type(result).__name__}) carries no {key!r} (looked in the dict itself and "
                f"in .meta_info); fix: have the worker put `{key}: metrics.export(step)` into what it returns"
            )
        out.append(holder[key])
    return out


class RayDriver:
    """The driver's side: merges worker states exactly and publishes the frame through our sinks.

    Thin by design: :func:`gather` (or :func:`resolve`) to collect, a
    :class:`~posttrain_metrics.core.portable.DriverReducer` to merge, the publisher to write.
    The publisher's lifecycle stays the caller's (``with Publisher(...) as publisher:``); without
    one, frames are only returned.
    """

    def __init__(
        self,
        adapters: AdapterSpec,
        *,
        publisher: Publisher | None = None,
        method: str = "metrics_state",
        timeout: float | None = None,
    ) -> None:
        self.reducer = DriverReducer(adapters)
        self.publisher = publisher
        self.method = method
        self.timeout = timeout

    def reduce(self, actors: Sequence[Any], step: int, *, phase: str = "train") -> Frame:
        """Ask every actor for its window state of ``step``, merge, publish, and return the frame."""
        states = gather(actors, step, phase=phase, method=self.method, timeout=self.timeout)
        return self.publish(states, step=step, phase=phase)

    def publish(self, states: Iterable[State], *, step: int | None = None, phase: str | None = None) -> Frame:
        """Merge states the trainer already collected (dicts, JSON text or ``ObjectRef``s), publish."""
        items = list(states)
        if any(type(s).__name__ == "ObjectRef" for s in items):
            items = resolve(items, timeout=self.timeout)
        frame = self.reducer.merge(items, step=step, phase=phase)
        if self.publisher is not None:
            self.publisher.publish(frame)
        return frame

