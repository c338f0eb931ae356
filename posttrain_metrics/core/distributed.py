"""The only place that talks to torch.distributed: who we are, and the step's collectives.

torch is never imported here unless the caller already imported it: a process that runs
torch.distributed has, and one that has not cannot be distributed.
"""

from __future__ import annotations

import sys
from typing import Any

from .errors import MetricsError
from .layout import PackedState

__all__ = ["all_reduce_state", "global_rank", "group_rank_and_size", "handshake"]


def _dist() -> Any | None:
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist


def group_rank_and_size(group: Any = None) -> tuple[int, int] | None:
    """``(rank, size)`` within ``group`` when torch.distributed is initialised, else ``None``."""
    dist = _dist()
    if dist is None:
        return None
    return dist.get_rank(group), dist.get_world_size(group)


def global_rank() -> int:
    """This process's global rank (0 when not distributed); read at call time, decided here only."""
    dist = _dist()
    return 0 if dist is None else int(dist.get_rank())


def _device(dist: Any, group: Any) -> str:
    # NCCL-only groups need CUDA tensors; gloo and mixed "cpu:gloo,cuda:nccl" groups take CPU ones.
    backend = str(dist.get_backend(group))
    if backend == "nccl":
        import torch

        return f"cuda:{torch.cuda.current_device()}"
    return "cpu"


def handshake(fingerprint: float, size: int, group: Any = None) -> None:
    """One small MAX collective verifying that every rank packs the same layout."""
    import torch

    dist = _dist()
    assert dist is not None
    probe = torch.tensor(
        [fingerprint, -fingerprint, float(size), -float(size)],
        dtype=torch.float64,
        device=_device(dist, group),
    )
    dist.all_reduce(probe, op=dist.ReduceOp.MAX, group=group)
    hi, neg_lo, size_hi, neg_size_lo = probe.cpu().tolist()
    if hi != -neg_lo or size_hi != -neg_size_lo:
        raise MetricsError(
            "ranks built MetricReducer with different adapters (their packed layouts differ), so "
            "their metrics cannot be reduced together; fix: construct the reducer with the same "
            "adapters, in the same order, on every rank"
        )


def all_reduce_state(state: PackedState, group: Any = None) -> PackedState:
    """The step's two collectives (SUM and MAX, issued together) and one device-to-host copy."""
    import torch

    dist = _dist()
    assert dist is not None
    device = _device(dist, group)
    sums = torch.tensor(state.sum, dtype=torch.float64, device=device)
    maxes = torch.tensor(state.max, dtype=torch.float64, device=device)
    pending = [
        dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=group, async_op=True),
        dist.all_reduce(maxes, op=dist.ReduceOp.MAX, group=group, async_op=True),
    ]
    for work in pending:
        work.wait()
    both = torch.cat([sums, maxes]).cpu().tolist()
    n = len(state.sum)
    return PackedState(both[:n], both[n:], state.errors)
