"""The built-in catalogue: every key of the metrics reference, one module per algorithm family.

Users register their own adapters with :func:`register_adapter`; :func:`get_adapter` finds either.
"""

from __future__ import annotations

from ..adapter import MetricAdapter
from ..errors import MetricsError
from .dpo import DPO
from .flow_bc import FLOW_BC
from .grpo import GRPO
from .nft import NFT
from .opd import OPD_ADVANTAGE, OPD_DIRECT
from .perf import PERF
from .ppo import PPO
from .reward import REWARD
from .trainer import TRAINER
from .trl import HF_TRAINER, TRL_GRPO, TRL_GRPO_EXACT
from .validation import VALIDATION

__all__ = ["BUILTIN", "adapter_names", "get_adapter", "register_adapter"]

BUILTIN: tuple[MetricAdapter, ...] = (
    GRPO, PPO, DPO, OPD_DIRECT, OPD_ADVANTAGE, NFT, FLOW_BC, REWARD, VALIDATION, TRAINER, TRL_GRPO, PERF,
    TRL_GRPO_EXACT, HF_TRAINER,
)

_REGISTRY: dict[str, MetricAdapter] = {adapter.name: adapter for adapter in BUILTIN}


def get_adapter(name: str) -> MetricAdapter:
    """The adapter registered under ``name`` (built-in: grpo, ppo, dpo, opd_direct, opd_advantage,
    nft, flow_bc, reward, validation, trainer, trl_grpo, perf, trl_grpo_exact, hf_trainer)."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise MetricsError(
            f"unknown adapter {name!r}; known: {', '.join(sorted(_REGISTRY))}. Fix: use one of "
            "those or register yours with posttrain_metrics.register_adapter(adapter)"
        ) from None


def register_adapter(adapter: MetricAdapter, *, replace: bool = False) -> MetricAdapter:
    """Make ``adapter`` available by name (to configs and ``get_adapter``, in this process). Reading a
    run needs no registration: its journal header declares every adapter it used."""
    if adapter.name in _REGISTRY and not replace and _REGISTRY[adapter.name] is not adapter:
        raise MetricsError(
            f"an adapter named {adapter.name!r} is already registered; fix: choose another name "
            "or pass replace=True"
        )
    _REGISTRY[adapter.name] = adapter
    return adapter


def adapter_names() -> list[str]:
    return sorted(_REGISTRY)
