"""Public keys described: what sinks need to know about a key without knowing adapters."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from .adapter import PHASES, Metric, MetricAdapter
from .reduction import Reduction

__all__ = ["KeyInfo", "describe", "headline_keys", "label_key"]


@dataclasses.dataclass(frozen=True)
class KeyInfo:
    """A public key with its declaration; ``weight_key``/``mean_key`` are public keys too."""

    key: str
    metric: Metric
    adapter: str
    weight_key: str | None = None
    mean_key: str | None = None

    @property
    def reduction(self) -> Reduction:
        return self.metric.reduction

    @property
    def namespace(self) -> str:
        return self.key.split("/", 1)[0]


def label_key(key: str, label: str) -> str:
    """The indicator series of one label of a categorical key: ``optim/update_outcome/skipped``."""
    return f"{key}/{label}"


def describe(adapters: Iterable[MetricAdapter], phases: Iterable[str] = PHASES) -> dict[str, KeyInfo]:
    """Every public key the adapters can publish under ``phases``, in declaration order."""
    out: dict[str, KeyInfo] = {}
    for adapter in adapters:
        for phase in sorted(set(phases) & adapter.phases, key=("train", "val").index):
            for source, metric in adapter.metrics.items():
                key = adapter.public_key(source, phase)
                if key in out:
                    continue  # a fixed-namespace key is the same under every phase

                out[key] = KeyInfo(
                    key,
                    metric,
                    adapter.name,
                    _public(adapter, metric.weight, phase),
                    _public(adapter, metric.mean, phase),
                )
    return out


def _public(adapter: MetricAdapter, leaf: str | None, phase: str) -> str | None:
    return None if leaf is None else adapter.public_key(adapter.source_of_leaf(leaf), phase)


def headline_keys(keys: Mapping[str, KeyInfo], metrics: Mapping[str, object]) -> list[str]:
    """The headline keys of ``metrics`` to show now (``headline_if`` keys must be positive)."""
    shown = []
    for key, info in keys.items():
        if not info.metric.headline or key not in metrics:
            continue
        gate = info.metric.headline_if
        if gate is not None:
            gate_key = f"{info.namespace}/{gate}"
            value = metrics.get(gate_key)
            if not isinstance(value, (int, float)) or not value > 0:
                continue
        shown.append(key)
    return shown
