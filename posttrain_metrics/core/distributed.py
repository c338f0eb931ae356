"""The only place that talks to torch.distributed: who we are, and the step's collectives.

torch is never imported here unless the caller already imported it: a process that runs
torch.distributed has, and one that has not cannot be distributed.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from .errors import MetricsError
from .layout import PackedState

__all__ = [
    "all_gather_objects",
    "all_reduce_state",
    "global_rank",
    "group_rank_and_size",
    "handshake",
    "launcher_world_size",
    "refuse_launcher_without_group",
]


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
    """This process's global rank; read at call time, decided here only. Before the process group
    exists, the launcher's ``RANK`` (torchrun, accelerate, Lightning) says it, so that a callback
    started before ``init_process_group`` does not start sinks on every rank."""
    dist = _dist()
    if dist is not None:
        return int(dist.get_rank())
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def launcher_world_size() -> int:
    """The number of processes a launcher (torchrun, accelerate, Lightning, deepspeed) started, from
    its ``WORLD_SIZE``; 1 when there is none or it cannot be read."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def refuse_launcher_without_group() -> None:
    """Raise when a launcher started several ranks but torch.distributed is not initialised: each
    rank would reduce only its own chunks and rank 0 would publish them as the global figure."""
    world = launcher_world_size()
    if world > 1:
        raise MetricsError(
            f"WORLD_SIZE={world} says a launcher started {world} ranks, but torch.distributed is not "
            "initialised, so this rank would reduce only its own chunks and rank 0 would publish them "
            "as the global figure. Fix: call torch.distributed.init_process_group() before the first "
            "reduce, or pass local=True (MetricReducer, MetricsCallback) if a per-rank local "
            "reduction is what you want"
        )


def _device(dist: Any, group: Any) -> str:
    # NCCL-only groups need CUDA tensors; gloo and mixed "cpu:gloo,cuda:nccl" groups take CPU ones.
    backend = str(dist.get_backend(group))
    if backend == "nccl":
        import torch

        return f"cuda:{torch.cuda.current_device()}"
    return "cpu"


def _collective_failed(what: str, step: int | None, exc: BaseException) -> MetricsError:
    """A collective that raised, as a MetricsError that says which one, the step and the fix.

    The usual cause is a rank that did not call ``reduce`` for this step (it raised, returned early
    or skipped the window): the others wait in the collective until the process group's timeout,
    and torch.distributed then raises on them. The process group is not usable after that.
    """
    at = f" of step {step}" if step is not None else ""
    return MetricsError(
        f"MetricReducer.reduce: the {what} collective{at} failed on rank {global_rank()} "
        f"({type(exc).__name__}: {str(exc).strip()[:300]}). Usually a rank did not call reduce"
        f"({'' if step is None else step}) (it raised, returned early or skipped the window), so the "
        "others waited until the process group's timeout. Fix: call reduce(step) on every rank at "
        "every step, even with no chunks; init_process_group(timeout=...) bounds the wait"
    )


def handshake(fingerprint: float, size: int, group: Any = None, *, step: int | None = None) -> None:
    """One small MAX collective verifying that every rank packs the same layout."""
    import torch

    dist = _dist()
    assert dist is not None
    probe = torch.tensor(
        [fingerprint, -fingerprint, float(size), -float(size)],
        dtype=torch.float64,
        device=_device(dist, group),
    )
    try:
        dist.all_reduce(probe, op=dist.ReduceOp.MAX, group=group)
    except RuntimeError as exc:  # torch's DistBackendError (a timeout, a lost peer) is one
        raise _collective_failed("layout handshake all_reduce(MAX)", step, exc) from exc
    hi, neg_lo, size_hi, neg_size_lo = probe.cpu().tolist()
    if hi != -neg_lo or size_hi != -neg_size_lo:
        raise MetricsError(
            "ranks built MetricReducer with different adapters (their packed layouts differ), so "
            "their metrics cannot be reduced together; fix: construct the reducer with the same "
            "adapters, in the same order, and declare the same extra keys, on every rank"
        )


GATHER_MAX_RANKS = 64
"""Up to this many ranks the step is one ``all_gather`` of both buffers, merged on every rank in rank
order with the arithmetic of :func:`~posttrain_metrics.core.layout.merge`: one collective, and a
result bitwise identical to :func:`~posttrain_metrics.reduce_metrics`. Beyond it, gathered bytes
grow with the world, so the step is one SUM and one MAX ``all_reduce`` instead (fixed size)."""


def all_reduce_state(state: PackedState, group: Any = None, *, step: int | None = None) -> PackedState:
    """The step's collectives and one device-to-host copy: the merged state of every rank."""
    import torch

    dist = _dist()
    assert dist is not None
    device = _device(dist, group)
    world = int(dist.get_world_size(group))
    n = len(state.sum)
    if world <= GATHER_MAX_RANKS:
        mine = torch.tensor(state.sum + state.max, dtype=torch.float64, device=device)
        rows = torch.empty((world, mine.numel()), dtype=torch.float64, device=device)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        try:
            gather(rows.view(-1), mine, group=group)
        except RuntimeError as exc:  # torch's DistBackendError (a timeout, a lost peer) is one
            raise _collective_failed("all_gather", step, exc) from exc
        merged = rows[0].clone()
        for row in rows[1:]:  # rank order, as the in-process simulation merges
            merged[:n] += row[:n]
            torch.maximum(merged[n:], row[n:], out=merged[n:])
        both = merged.cpu().tolist()
    else:
        sums = torch.tensor(state.sum, dtype=torch.float64, device=device)
        maxes = torch.tensor(state.max, dtype=torch.float64, device=device)
        for what, buffer, op in (("all_reduce(SUM)", sums, dist.ReduceOp.SUM),
                                 ("all_reduce(MAX)", maxes, dist.ReduceOp.MAX)):
            try:
                dist.all_reduce(buffer, op=op, group=group)
            except RuntimeError as exc:
                raise _collective_failed(what, step, exc) from exc
        both = torch.cat([sums, maxes]).cpu().tolist()
    return PackedState(both[:n], both[n:], state.errors)


def gather_to_first(obj: Any, group: Any = None) -> list[Any] | None:
    """``obj`` of every rank of ``group``, in rank order, on the group's first rank (``None`` elsewhere).
    One ``gather_object``: collective, every rank of the group calls it."""
    dist = _dist()
    assert dist is not None
    size = dist.get_world_size(group)
    rank = dist.get_rank(group)
    dst = dist.get_global_rank(group, 0) if group is not None else 0
    out: list[Any] | None = [None] * size if rank == 0 else None
    try:
        dist.gather_object(obj, out, dst=dst, group=group)
    except RuntimeError as exc:
        raise _collective_failed("samples gather_object", None, exc) from exc
    return out


def all_gather_objects(obj: Any, group: Any = None) -> list[Any]:
    """``obj`` of every rank of ``group``, in rank order, on every rank. One ``all_gather_object``:
    collective; for small things every rank must decide alike (a step's sample offers)."""
    dist = _dist()
    assert dist is not None
    out: list[Any] = [None] * dist.get_world_size(group)
    try:
        dist.all_gather_object(out, obj, group=group)
    except RuntimeError as exc:
        raise _collective_failed("samples all_gather_object", None, exc) from exc
    return out
