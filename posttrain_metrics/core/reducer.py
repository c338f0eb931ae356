"""The two entry points of the reduction: offline over simulated ranks, and per rank in a real run."""

from __future__ import annotations

import functools
import operator
import time
from collections.abc import Mapping, Sequence
from typing import Any, Union

from . import distributed
from .adapter import PHASES, MetricAdapter
from .catalog import get_adapter
from .errors import MetricsError
from .frame import Frame
from .layout import Code, Layout, PackedState, RefusedChunk, merge
from .values import MAX_EXACT_INT, Scalar, materialize

__all__ = ["AdapterSpec", "MetricReducer", "reduce_metrics", "resolve_adapters"]

AdapterSpec = Union[str, MetricAdapter, Sequence[Union[str, MetricAdapter]]]


def resolve_adapters(adapters: AdapterSpec) -> tuple[MetricAdapter, ...]:
    """A name, an adapter, or a list of them, as adapters."""
    items = [adapters] if isinstance(adapters, (str, MetricAdapter)) else list(adapters)
    if not items:
        raise MetricsError("no adapters given; fix: pass a name such as 'grpo', or a list of them")
    out = []
    for item in items:
        if isinstance(item, str):
            out.append(get_adapter(item))
        elif isinstance(item, MetricAdapter):
            out.append(item)
        else:
            raise MetricsError(
                f"adapters must be names or MetricAdapter objects, got {type(item).__name__} {item!r}"
            )
    return tuple(out)


@functools.lru_cache(maxsize=64)
def _layout(adapters: tuple[MetricAdapter, ...]) -> Layout:
    return Layout(adapters)


def _check_phase(phase: str) -> None:
    if not isinstance(phase, str) or phase not in PHASES:
        raise MetricsError(f"phase {phase!r} is not one of {sorted(PHASES)}")


def _check_step(step: object) -> int:
    """``step`` as a plain int: any integer (Python, numpy, a 0-d integer tensor), not a bool."""
    try:
        value = None if isinstance(step, bool) else operator.index(step)  # type: ignore[arg-type]
    except TypeError:
        value = None
    if value is None or abs(value) > MAX_EXACT_INT:
        try:
            shown = f"{step!r:.60}"
        except Exception:  # a step whose repr breaks is still named by its type
            shown = "(unprintable)"
        raise MetricsError(
            f"step must be an integer within +/-2**53, got {type(step).__name__} {shown}; fix: pass "
            "the optimizer step as an int"
        )
    return value


def _check_chunk(chunk: object, where: str) -> dict[str, Any]:
    """A copy of ``chunk`` as a plain dict keyed by strings, or a MetricsError saying why not."""
    if not isinstance(chunk, Mapping):
        raise MetricsError(
            f"{where} takes a mapping of source names to values, got {type(chunk).__name__} "
            f"{chunk!r:.60}; fix: pass one dict per chunk"
        )
    try:
        copy = dict(chunk)
    except Exception as exc:  # a mapping that breaks while being read
        raise MetricsError(f"{where}: the mapping could not be read ({type(exc).__name__}: {exc})") from None
    bad = [key for key in copy if not isinstance(key, str)]
    if bad:
        raise MetricsError(
            f"{where}: source names must be strings, got {bad[0]!r:.60} ({type(bad[0]).__name__}); "
            "fix: key the chunk by the declared source names"
        )
    return copy


def _window_state(
    layout: Layout, chunks: Sequence[Any], *, rank: int, step: object, phase: str
) -> tuple[PackedState, int | None]:
    """One rank's packed window; never raises. A bad step or phase, a tensor that cannot be read,
    or anything else that breaks while the window is read is recorded in the state, so this rank
    still joins the step's collectives and every rank raises it together."""
    problems: list[tuple[int, str]] = []
    step_value: int | None = None
    try:
        step_value = _check_step(step)
    except MetricsError as exc:
        problems.append((Code.BAD_WINDOW, str(exc)))
    except Exception as exc:  # a step object that breaks while being read (a meta tensor ...)
        problems.append((Code.BAD_WINDOW, f"the step could not be read as an int ({type(exc).__name__}: "
                                          f"{str(exc)[:200]}); fix: pass the optimizer step as an int"))
    if not isinstance(phase, str) or phase not in PHASES:
        shown = repr(phase)[:40] if isinstance(phase, str) else type(phase).__name__
        problems.append((Code.BAD_WINDOW, f"phase {shown} is not one of {sorted(PHASES)}"))
    try:
        state = layout.accumulate(materialize(chunks), rank=rank, step=step_value, phase=phase)
    except Exception as exc:
        state = layout.accumulate([], rank=rank, step=step_value, phase=phase)
        problems.append((
            Code.UNREADABLE,
            f"reading the window's {len(chunks)} chunk(s) failed ({type(exc).__name__}: {str(exc)[:300]})",
        ))
    for code, message in problems:
        layout.record(state, code, None, rank, message)
    return state, step_value


def reduce_metrics(
    adapters: AdapterSpec,
    per_rank_chunks: Sequence[Sequence[Mapping[str, Any]]],
    *,
    phase: str = "train",
) -> dict[str, Scalar]:
    """Reduce ``per_rank_chunks[rank][chunk]`` (source-name dicts) to public figures, in process.

    The same arithmetic as a real distributed run: each rank's window is packed, the packed states
    are merged in rank order with the one merge a distributed run applies, and the result is read out.

    >>> reduce_metrics("grpo", [[{"grpo_clip_frac": 0.5, "grpo_valid_token_count": 10}],
    ...                         [{"grpo_clip_frac": 0.0, "grpo_valid_token_count": 30}]])
    {'train/valid_token_count': 40, 'train/clip_frac': 0.125}
    """
    _check_phase(phase)
    if not per_rank_chunks:
        raise MetricsError("per_rank_chunks is empty; fix: pass one list of chunk dicts per rank")
    for rank, chunks in enumerate(per_rank_chunks):
        if isinstance(chunks, (str, bytes, Mapping)) or not isinstance(chunks, Sequence):
            raise MetricsError(
                f"per_rank_chunks[{rank}] must be a list of chunk dicts, got {type(chunks).__name__}"
            )
        for chunk in chunks:
            _check_chunk(chunk, f"per_rank_chunks[{rank}]")
    layout = _layout(resolve_adapters(adapters))
    states = [
        layout.accumulate(materialize(chunks), rank=rank, phase=phase)
        for rank, chunks in enumerate(per_rank_chunks)
    ]
    return layout.read(functools.reduce(merge, states), phase=phase, world_size=len(states))


class MetricReducer:
    """One rank's reducer in a real run: ``add`` each chunk, ``reduce`` at the end of the window.

    ``reduce`` is collective when torch.distributed is initialised (every rank of ``group`` calls it,
    default the world): one collective per step (an all-gather of the packed state, merged in rank
    order; one SUM and one MAX all-reduce beyond 64 ranks), plus one small handshake the first
    time, whatever the number of keys. Without torch.distributed it is local; under a launcher
    that started several processes (``WORLD_SIZE`` > 1) without a process group it refuses, since
    each rank would publish its own figures as if global, unless ``local=True`` says the local
    reduction is deliberate (``local=True`` never runs a collective, process group or not). A producer bug on any rank (a bad value, a bad step, a tensor that
    cannot be read) raises :class:`MetricsError` on every rank after the collectives; the window
    is discarded everywhere and the next one reduces normally.

    >>> r = MetricReducer(["grpo", "trainer"])
    >>> r.add({"grpo_kl_max": 0.2, "update_outcome": "accumulating"})
    >>> r.add({"grpo_kl_max": 0.9, "update_outcome": "applied"})
    >>> r.reduce(1).metrics
    {'train/kl_max': 0.9, 'optim/update_outcome': 'applied'}
    """

    def __init__(self, adapters: AdapterSpec, *, group: Any = None, local: bool = False) -> None:
        self.adapters = resolve_adapters(adapters)
        self.layout = _layout(self.adapters)
        self.group = group
        if not isinstance(local, bool):
            raise MetricsError(
                f"local must be True or False, got {type(local).__name__} {local!r:.40}; fix: pass a bool "
                "(a YAML `local: false`, not the string 'false')"
            )
        self.local = local
        self._chunks: list[Any] = []
        self._verified = False
        self.stop_request = 0
        """A live-health stop to carry to every rank (a code > 0, set on global rank 0 by a watcher
        thread): read once per ``reduce``, packed in the window's MAX buffer, so the decision rides in
        the step's existing collective."""
        self.stop = 0
        """The stop code the first window that carried one brought, the same on every rank (0: none)."""

    def add(self, chunk: Mapping[str, Any] | RefusedChunk) -> None:
        """Record one chunk's source-name metrics. Cheap: values are read at ``reduce``, tensors
        in one stacked copy. The mapping is copied, never modified. A chunk that is not a mapping
        of strings raises here and is not recorded (the window is as it was before the call)."""
        if isinstance(chunk, RefusedChunk):  # a framework callback's record of a bad chunk
            self._chunks.append(chunk)
            return
        self._chunks.append(_check_chunk(chunk, "add()"))

    def add_window(self, chunks: Sequence[Any]) -> None:
        """Record several chunks for a ``reduce`` that follows at once (a callback's validation
        hook). Never raises: a chunk that cannot be taken is recorded as a producer bug, so that this
        rank still joins the step's collectives and every rank raises it from ``reduce``."""
        for i, chunk in enumerate(chunks):
            if isinstance(chunk, RefusedChunk):
                self._chunks.append(chunk)
                continue
            try:
                self._chunks.append(_check_chunk(chunk, f"chunk {i}"))
            except MetricsError as exc:
                self._chunks.append(RefusedChunk(str(exc)))

    @property
    def pending_chunks(self) -> int:
        return len(self._chunks)

    def reduce(self, step: int, *, phase: str = "train") -> Frame:
        """End the window: the global figures of every chunk added since the last ``reduce``.

        Whatever happens, the window's chunks are gone afterwards: a window that raises is
        discarded on every rank, and the next one starts clean."""
        chunks, self._chunks = self._chunks, []
        where = None if self.local else distributed.group_rank_and_size(self.group)
        if where is None and not self.local:
            distributed.refuse_launcher_without_group()
        rank, size = where or (0, 1)
        state, step_value = _window_state(self.layout, chunks, rank=rank, step=step, phase=phase)
        request = self.stop_request  # the one flag the training thread reads per step
        if request:
            state.max[Layout.STOP] = float(request)
        if where is not None:
            if not self._verified:
                distributed.handshake(self.layout.fingerprint, self.layout.sum_size, self.group, step=step_value)
                self._verified = True
            state = distributed.all_reduce_state(state, self.group, step=step_value)
        if not self.stop and state.max[Layout.STOP] > 0:  # every rank, before a bad window raises
            self.stop = int(state.max[Layout.STOP])
        metrics = self.layout.read(state, phase=phase, world_size=size)
        assert step_value is not None  # a bad step was recorded, and read() raised it
        return Frame(step=step_value, metrics=metrics, phase=phase, wall_time=time.time())
