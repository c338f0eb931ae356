"""One rank's window clock, stage timers and memory probe, and the ``perf/`` figures derived after the
reduction (the keys are declared in :mod:`posttrain_metrics.core.catalog.perf`).

The training thread's work per window is a clock read, a few dict entries (the window time, the
stage timers, the memory peak) added to the window as one more chunk, and after the reduction a few
divisions: the one collective of the step carries everything. Derived figures use reduced figures
only (sums over ranks, the slowest rank's window time), so every rank computes the same numbers.

Stage timers are declared as the user's own keys (``timer/<name>_s``: MAX over ranks, the step waits
for the slowest; ``timer/<name>_s_mean``: the mean over the ranks that timed the stage), one pair per
name given when the callback is built (plus :data:`DEFAULT_STAGES`); repeated timings of a name
within one window add up (a name nested in itself counts once). A rank that times a stage the others do not follows the absent-key
rule: the stage is published when any rank timed it, its max and mean over the ranks that did.

>>> clock = iter([0.0, 1.0, 1.5, 4.0]).__next__
>>> t = Throughput(clock=clock, memory=False)
>>> t.start()
>>> with t.timer("generation"):
...     pass
>>> sorted(t.window_chunk().items())
[('perf_window_s', 4.0), ('perf_window_s_mean', 4.0), ('timer/generation_s', 0.5), ('timer/generation_s_mean', 0.5)]
>>> t.derive({"perf/window_s": 4.0, "train/valid_token_count": 100})["perf/tokens_per_s"]
25.0
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .errors import MetricsError
from .values import Scalar

__all__ = [
    "DEFAULT_STAGES", "PEAK_FLOPS", "Throughput", "peak_flops_of", "timer_declarations", "timer_keys",
]

DEFAULT_STAGES = ("generation", "reward", "train")
"""Stage names declared whenever throughput is on; others are given with ``perf={"timers": [...]}``."""

PEAK_FLOPS: dict[str, float] = {
    # Dense BF16 tensor-core peak per device, FLOP/s, from the vendors' datasheets (no sparsity).
    "B200": 2.25e15,
    "H200": 989e12,
    "H100 SXM": 989e12,
    "H100 80GB HBM3": 989e12,
    "H100 NVL": 835e12,
    "H100 PCIe": 756e12,
    "H800": 989e12,
    "GH200": 989e12,
    "A100": 312e12,
    "A800": 312e12,
    "L40S": 362e12,
    "L40": 181e12,
    "L4": 121e12,
    "A10G": 70e12,
    "A10": 125e12,
    "RTX 4090": 165e12,
    "V100": 125e12,  # FP16: V100 has no BF16
    "T4": 65e12,  # FP16
}
"""A few common accelerators, matched against ``torch.cuda.get_device_name()`` (longest name first);
any other device needs ``peak_flops=`` given explicitly."""

_GIB = float(2**30)
_TOKENS = ("train/valid_token_count", "perf/tokens")
_SAMPLES = ("train/rollout_count", "perf/samples", "train/valid_sequence_count")


def peak_flops_of(device_name: str) -> float | None:
    """The table's peak for a CUDA device name (``"NVIDIA H100 80GB HBM3"``), or ``None``."""
    for name in sorted(PEAK_FLOPS, key=len, reverse=True):
        if name.lower() in device_name.lower():
            return PEAK_FLOPS[name]
    return None


def timer_keys(name: str) -> tuple[str, str]:
    """The two keys of stage ``name``: ``timer/<name>_s`` (max over ranks) and its ``_mean``."""
    return f"timer/{name}_s", f"timer/{name}_s_mean"


def timer_declarations(names: Iterable[str]) -> dict[str, dict[str, str]]:
    """The ``extra`` declarations of the stage timers ``names``."""
    out: dict[str, dict[str, str]] = {}
    for name in names:
        if not isinstance(name, str) or not name or "/" in name or not name.isidentifier():
            raise MetricsError(f"timer name {name!r:.60} must be a word such as 'generation' (letters, digits, _)")
        top, mean = timer_keys(name)
        out[top] = {"reduction": "max", "unit": "s", "meaning": f"Time in stage {name!r} this window, slowest rank"}
        out[mean] = {"reduction": "mean", "unit": "s", "meaning": f"Time in stage {name!r} this window, mean over "
                                                                   "the ranks that timed it"}
    return out


def _positive(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, str):  # PyYAML reads 7.0e9 (no sign in the exponent) as text
        raise MetricsError(f"perf: {name}={value!r:.40} is text, not a number; fix: a number (in YAML read "
                           "by PyYAML write 7.0e+9, not 7.0e9)")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise MetricsError(f"perf: {name}={value!r:.40}; fix: a positive number (or leave it out)")
    return float(value)


class Throughput:
    """One rank's window clock, stage timers and memory probe; the derivation of the ``perf/`` keys.

    ``clock`` is the training clock (seconds, monotonic; injectable for tests). ``flops_per_token``
    (model FLOPs per trained token) or ``params`` (the model's parameter count: 6N FLOPs per
    trained token, 2N per generated one) turns on ``perf/mfu``, with ``peak_flops`` (this rank's
    accelerator peak, FLOP/s) or, when it is not given, the :data:`PEAK_FLOPS` entry of the CUDA
    device; neither is a :class:`MetricsError` when built. ``memory`` publishes the window's peak
    CUDA memory when CUDA is in use, the process's peak resident memory otherwise.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.perf_counter,
        timers: Iterable[str] = (),
        flops_per_token: float | None = None,
        params: float | None = None,
        peak_flops: float | None = None,
        memory: bool = True,
    ) -> None:
        self.clock = clock
        self.stages = tuple(dict.fromkeys([*DEFAULT_STAGES, *timers]))
        self.declarations = timer_declarations(self.stages)
        self._keys = {name: timer_keys(name) for name in self.stages}
        self.flops_per_token = _positive("flops_per_token", flops_per_token)
        self.params = _positive("params", params)
        self.peak_flops = _positive("peak_flops", peak_flops)
        if (self.flops_per_token or self.params) and self.peak_flops is None:
            self.peak_flops = _device_peak()
            if self.peak_flops is None:
                raise MetricsError(
                    "perf: MFU needs the accelerator's peak FLOP/s and this device is not in the table "
                    f"({', '.join(PEAK_FLOPS)}); fix: pass peak_flops= (e.g. 989e12 for an H100 SXM, BF16 dense)"
                )
        self.memory = memory
        self._probe: Callable[[dict[str, Scalar]], None] | None = None
        self._mark: float | None = None
        self._unknown_start = False  # the clock started at a chunk's end: this window's time is unknown
        self._spent: dict[str, float] = {}
        self._open: set[str] = set()
        # the running totals: None until a window counted one (absent is not zero)
        self.tokens_total: int | float | None = None
        self.samples_total: int | float | None = None
        self.time_s: float | None = None
        self._rollouts_seen = False  # a window reported train/rollout_count or perf/samples

    def start(self, *, late: bool = False) -> None:
        """Start the clock (the first window is timed from here), unless it already runs. ``late``:
        started after some of the window's work (at its first chunk's end), so that window has no
        time (nor rate); its counts still add up."""
        if self._mark is None:
            self._mark = self.clock()
            self._unknown_start = late

    def timer(self, name: str) -> contextlib.AbstractContextManager[None]:
        """Time a stage of the window. Repeated timings of ``name`` add up, and so do different
        stages nested in one another (each counts its own time); ``name`` nested in itself counts once."""
        if name not in self._keys:
            raise MetricsError(
                f"timer {name!r} is not declared (declared: {', '.join(self.stages)}); every rank fixes its keys "
                f"before the run starts; fix: pass perf={{'timers': [{name!r}]}} to the callback"
            )
        return _Timer(self, name)

    def window_chunk(self) -> dict[str, Scalar]:
        """End this rank's window: its wall time, stage times and memory peak, as one chunk."""
        now, mark = self.clock(), self._mark
        self._mark = now
        chunk: dict[str, Scalar] = {}
        if mark is not None and not self._unknown_start:  # else the window's start is unknown: no time
            chunk["perf_window_s"] = chunk["perf_window_s_mean"] = now - mark
        self._unknown_start = False
        if self._spent:
            keys = self._keys
            for name, spent in self._spent.items():
                top, mean = keys[name]
                chunk[top] = chunk[mean] = spent
            self._spent = {}
        if self.peak_flops is not None:
            chunk["perf_peak_flops"] = self.peak_flops
        if self.memory:
            probe = self._probe
            if probe is None:
                probe = self._probe = _memory_probe()
            probe(chunk)
        return chunk

    def derive(self, metrics: Mapping[str, Scalar]) -> dict[str, Scalar]:
        """``metrics`` (a reduced frame's figures) with the derived ``perf/`` keys added (a copy)."""
        return {**metrics, **self.figures(metrics)}

    def figures(self, metrics: Mapping[str, Scalar]) -> dict[str, Scalar]:
        """The derived ``perf/`` keys of a window from its reduced figures, and the running totals
        moved on. Identical on every rank: it reads reduced figures only. A window with no time
        keeps its counts, no rates; a total is absent until a window counted it."""
        out: dict[str, Scalar] = {}
        window = metrics.get("perf/window_s")
        tokens = _value(_first(metrics, _TOKENS))
        samples = self._samples(metrics)
        if tokens is not None:
            self.tokens_total = (self.tokens_total or 0) + tokens
        if samples is not None:
            self.samples_total = (self.samples_total or 0) + samples
        if isinstance(window, (int, float)) and math.isfinite(window):
            self.time_s = (self.time_s or 0.0) + window
            if window > 0:
                if tokens is not None:
                    out["perf/tokens_per_s"] = tokens / window
                if samples is not None:
                    out["perf/samples_per_s"] = samples / window
                mfu = self._mfu(metrics, tokens, window)
                if mfu is not None:
                    out["perf/mfu"] = mfu
        for key, total in (("perf/tokens_total", self.tokens_total), ("perf/samples_total", self.samples_total),
                           ("perf/time_s", self.time_s)):
            if total is not None:
                out[key] = total
        return out

    def _samples(self, metrics: Mapping[str, Scalar]) -> int | float | None:
        """The window's samples: its rollouts (or the producer's own count); the sequences trained on
        stand in only in a run that never reported either. Between two generations (GSPO with
        exact_grpo, several optimizer steps per generation) the rows trained on are not new samples."""
        found = _first(metrics, _SAMPLES[:-1] if self._rollouts_seen else _SAMPLES)
        if found is None:
            return None
        self._rollouts_seen = self._rollouts_seen or found[0] < len(_SAMPLES) - 1
        return found[1]

    def _mfu(self, metrics: Mapping[str, Scalar], tokens: float | None, window: float) -> float | None:
        peak = metrics.get("perf/peak_flops")
        if not isinstance(peak, (int, float)) or not peak > 0:
            return None
        per_token = self.flops_per_token or (6.0 * self.params if self.params else None)
        if per_token is None:
            return None
        flops = per_token * (tokens or 0)
        generated = metrics.get("perf/generated_tokens")
        if self.params and isinstance(generated, (int, float)):
            flops += 2.0 * self.params * generated
        return flops / (window * peak)


class _Timer:
    """One ``with throughput.timer(name):`` block (a plain class: a generator-based context manager
    costs the training thread a few microseconds more per block)."""

    __slots__ = ("begin", "name", "nested", "owner")

    def __init__(self, owner: Throughput, name: str) -> None:
        self.owner, self.name, self.begin, self.nested = owner, name, 0.0, False

    def __enter__(self) -> None:
        owner = self.owner
        if owner._mark is None:
            owner._mark = owner.clock()
        self.nested = self.name in owner._open  # the same stage inside itself: the outer one counts
        if not self.nested:
            owner._open.add(self.name)
            self.begin = owner.clock()

    def __exit__(self, *exc: object) -> None:
        if self.nested:
            return
        owner, name = self.owner, self.name
        owner._open.discard(name)
        owner._spent[name] = owner._spent.get(name, 0.0) + (owner.clock() - self.begin)


def _value(found: tuple[int, int | float] | None) -> int | float | None:
    return None if found is None else found[1]


def _first(metrics: Mapping[str, Scalar], keys: tuple[str, ...]) -> tuple[int, int | float] | None:
    for i, key in enumerate(keys):
        value = metrics.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return i, value
    return None


def _device_peak() -> float | None:
    """The table's peak for this process's CUDA device, when torch is there and CUDA is available."""
    torch: Any = sys.modules.get("torch")
    if torch is None:
        try:
            import torch as imported  # MFU asked for: the trainer has torch
        except ImportError:
            return None
        torch = imported
    try:
        if not torch.cuda.is_available():
            return None
        return peak_flops_of(str(torch.cuda.get_device_name()))
    except Exception:
        return None


def _memory_probe() -> Callable[[dict[str, Scalar]], None]:
    """The window's memory reading, chosen once: peak CUDA memory (then reset) when CUDA is in use
    in this process, else the process's peak resident memory, else nothing (never an error)."""
    torch = sys.modules.get("torch")
    try:
        cuda = torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized()
    except Exception:
        cuda = False
    if cuda:
        assert torch is not None
        mem = torch.cuda

        def read_cuda(chunk: dict[str, Scalar]) -> None:
            chunk["perf_mem_allocated_peak_gib"] = mem.max_memory_allocated() / _GIB
            chunk["perf_mem_reserved_peak_gib"] = mem.max_memory_reserved() / _GIB
            mem.reset_peak_memory_stats()

        return read_cuda
    try:
        import resource
    except ImportError:  # not on Windows
        return lambda chunk: None
    # ru_maxrss is KiB on Linux, bytes on macOS
    scale = 1.0 if sys.platform == "darwin" else 1024.0
    getrusage, who = resource.getrusage, resource.RUSAGE_SELF

    def read_rss(chunk: dict[str, Scalar]) -> None:
        chunk["perf_rss_peak_gib"] = getrusage(who).ru_maxrss * scale / _GIB

    return read_rss
