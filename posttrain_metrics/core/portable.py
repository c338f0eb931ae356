"""A worker's window state as plain data, and its exact merge on a single controller.

Single-controller trainers (a Ray driver over actor workers, as verl and OpenRLHF run) do not
reduce with collectives: the driver collects what each worker returns. :class:`WorkerMetrics` packs
a worker's window with the same :class:`~.layout.Layout` the collectives use and exports it as a
small, versioned dict of ``str``, ``int`` and lists (JSON-ready; no pickle of our classes).
:class:`DriverReducer` validates any number of such states and merges them with the core's one
:func:`~.layout.merge` into exactly the frame :func:`~.reducer.reduce_metrics` gives for the same
chunks, and :class:`~.reducer.MetricReducer` over torch.distributed.

The state holds the two packed buffers of the window, so its size is set by the declared keys,
never by the number of chunks or tokens. Only the slots that differ from their empty value travel:
``mask`` is a bitmap over the SUM then the MAX buffer, ``values`` the set slots as little-endian
float64, both base64. Binary float64 keeps every value bit-exact, NaN and infinities included, in
strict JSON. A worker's producer bugs travel as ``[code, key index, message]`` and are raised on
the driver, naming the worker.

>>> worker = WorkerMetrics("grpo", worker_id="actor-0")
>>> worker.add({"grpo_clip_frac": 0.5, "grpo_valid_token_count": 10})
>>> state = worker.export(3)
>>> sorted(state)  # doctest: +NORMALIZE_WHITESPACE
['adapters', 'errors', 'format', 'layout', 'mask', 'phase', 'slots', 'step', 'values',
 'version', 'worker']
>>> other = WorkerMetrics("grpo", worker_id="actor-1")
>>> other.add({"grpo_clip_frac": 0.0, "grpo_valid_token_count": 30})
>>> merge_exported("grpo", [state, other.export(3)]).metrics
{'train/valid_token_count': 40, 'train/clip_frac': 0.125}
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import math
import os
import socket
import struct
import time
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple, Union

from .adapter import PHASES
from .errors import MetricsError
from .frame import Frame
from .layout import _CODE_BITS, _KEY_BITS, NEG_INF, Code, Layout, PackedState, merge
from .reducer import AdapterSpec, _check_phase, _check_step, _layout, resolve_adapters
from .reduction import Reduction
from .values import MAX_EXACT_INT, materialize

__all__ = ["FORMAT", "VERSION", "DriverReducer", "State", "WorkerMetrics", "merge_exported"]

FORMAT = "posttrain-metrics/window-state"
VERSION = 2
"""Bumped whenever the encoding or the meaning of a field changes; a driver accepts only its own."""

State = Union[Mapping[str, Any], str, bytes]
"""What a driver accepts per worker: the exported dict, or its JSON text."""

_FIELDS = frozenset(
    {"format", "version", "worker", "step", "phase", "adapters", "layout", "slots", "mask", "values", "errors"}
)
_MAX_JSON_BYTES = 4 * 2**20
_MAX_ID_CHARS = 200
_MAX_MESSAGE_CHARS = 2000
_FINGERPRINT_DIGITS = 13  # Layout.fingerprint is 52 bits
_BITS = [tuple(bit for bit in range(8) if byte >> bit & 1) for byte in range(256)]


def _default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class WorkerMetrics:
    """One worker's window, exported as plain data for a driver to merge.

    The worker-side half of :class:`DriverReducer`: ``add`` each chunk's source-name dict, then
    ``export(step)`` at the end of the window returns the state to hand to the driver (return it
    from a Ray actor method, or put it in what the worker already returns). ``export`` never talks
    to torch.distributed, even where it is initialised, and never raises for a producer bug: the
    bug travels in the state and the driver raises it naming ``worker_id`` (default
    ``host:pid``), so a bad worker cannot hide from the report.
    """

    def __init__(self, adapters: AdapterSpec, *, worker_id: str | None = None) -> None:
        self.adapters = resolve_adapters(adapters)
        self.layout = _layout(self.adapters)
        self.worker_id = _default_worker_id() if worker_id is None else worker_id
        if not isinstance(self.worker_id, str) or not _valid_id(self.worker_id):
            raise MetricsError(
                f"worker_id must be a non-empty printable str of at most {_MAX_ID_CHARS} characters, "
                f"got {self.worker_id!r:.80}"
            )
        self._chunks: list[Mapping[str, Any]] = []

    def add(self, chunk: Mapping[str, Any]) -> None:
        """Record one chunk's source-name metrics (copied, never modified; tensors read at export)."""
        if not isinstance(chunk, Mapping):
            raise MetricsError(f"add() takes a mapping of source names to values, got {type(chunk).__name__}")
        bad = [key for key in chunk if not isinstance(key, str)]
        if bad:
            raise MetricsError(
                f"add(): source names must be strings, got {bad[0]!r:.60} ({type(bad[0]).__name__}); "
                "fix: key the chunk by the declared source names"
            )
        self._chunks.append(dict(chunk))

    @property
    def pending_chunks(self) -> int:
        return len(self._chunks)

    def export(self, step: int, *, phase: str = "train") -> dict[str, Any]:
        """End the window: its state as a JSON-ready dict; the next ``add`` starts a new window,
        also when this call raises (a bad step or phase: nothing of this window leaks into the next)."""
        chunks, self._chunks = self._chunks, []
        _check_phase(phase)
        step = _check_step(step)
        packed = self.layout.accumulate(materialize(chunks), rank=0, step=step, phase=phase)
        return _encode(self.layout, packed, worker=self.worker_id, step=step, phase=phase)


def _encode(layout: Layout, packed: PackedState, *, worker: str, step: int, phase: str) -> dict[str, Any]:
    """The portable form of one worker's packed window (accumulated with ``rank=0``)."""
    slots = [*packed.sum, *packed.max]
    n_sum = len(packed.sum)
    mask = bytearray((len(slots) + 7) // 8)
    values: list[float] = []
    for i, value in enumerate(slots):
        if i < n_sum:
            empty = value == 0.0 and math.copysign(1.0, value) > 0.0  # -0.0 travels, bit-exact
        else:
            empty = value == NEG_INF
        if not empty:
            mask[i // 8] |= 1 << (i % 8)
            values.append(value)
    errors = []
    for encoded, message in sorted(packed.errors.items()):
        code, rest = divmod(encoded, _CODE_BITS)
        index = rest // _KEY_BITS
        errors.append([code, index, message.removeprefix("rank 0: ")])
    return {
        "format": FORMAT,
        "version": VERSION,
        "worker": worker,
        "step": step,
        "phase": phase,
        "adapters": [a.name for a in layout.adapters],
        "layout": _fingerprint_text(layout),
        "slots": [layout.sum_size, layout.max_size],
        "mask": base64.b64encode(bytes(mask)).decode("ascii"),
        "values": base64.b64encode(struct.pack(f"<{len(values)}d", *values)).decode("ascii"),
        "errors": errors,
    }


class _Decoded(NamedTuple):
    worker: str
    step: int
    phase: str
    state: PackedState
    errors: list[tuple[int, int, str]]


class DriverReducer:
    """The driver-side half: merges exported worker states into one exact :class:`Frame`.

    Every state is validated as untrusted input (format, version, sizes, encoding, internal
    consistency) and must come from the same adapters, in the same order, as the driver's. Producer
    bugs hold as they do across torch.distributed ranks (unknown keys, bad values, partial
    all-or-nothing families, label disagreement, different steps) and each :class:`MetricsError`
    names the worker(s) by their ``worker_id``. The arithmetic is the core's own :func:`merge` and
    :meth:`Layout.read`, so the frame equals :func:`~.reducer.reduce_metrics` on the same chunks.
    """

    def __init__(self, adapters: AdapterSpec) -> None:
        self.adapters = resolve_adapters(adapters)
        self.layout = _layout(self.adapters)
        L = self.layout
        # The SUM slots that one worker's accumulate sets to exactly 0 or 1, the chunk counters
        # (whole numbers), and the label ranges.
        self._flags = [L.ACTIVE, L.ERROR_RANKS]
        self._counters = [slot for fam in L.families for slot in (fam.carried, fam.batch)]
        self._labels: list[tuple[str, int, range]] = []
        for key in L.keys.values():
            self._flags.append(key.s)
            if key.reduction is Reduction.CATEGORICAL:
                labels = range(key.s + 1, key.s + 1 + len(key.metric.labels))
                self._flags.extend(labels)
                self._labels.append((key.source, key.s, labels))

    def merge(self, states: Iterable[State], *, step: int | None = None, phase: str | None = None) -> Frame:
        """The global frame of one window from every worker's exported state.

        ``step`` and ``phase``, when given, must be what the workers exported; otherwise they are
        taken from the states (which must agree).
        """
        if isinstance(states, (str, bytes, Mapping)) or not isinstance(states, Iterable):
            raise MetricsError(
                f"states must be a list with one exported state per worker, got {type(states).__name__}"
            )
        states = list(states)
        if not states:
            raise MetricsError("no worker states to merge; fix: pass one exported state per worker")
        if phase is not None:
            _check_phase(phase)
        if step is not None:
            step = _check_step(step)
        n = len(states)
        decoded = [self._decode(raw, i, n) for i, raw in enumerate(states)]
        self._check_distinct(decoded)
        self._raise_worst(decoded)  # producer bugs first, as the collectives report them
        self._check_window(decoded, step, phase)
        self._check_families(decoded)
        self._check_agreed(decoded)
        self._check_labels(decoded)
        merged = functools.reduce(merge, [d.state for d in decoded])
        first = decoded[0]
        metrics = self.layout.read(merged, phase=first.phase, world_size=n)
        return Frame(step=first.step, metrics=metrics, phase=first.phase, wall_time=time.time())

    # -- one state ------------------------------------------------------------------------------

    def _decode(self, raw: object, index: int, n: int) -> _Decoded:
        where = f"state {index + 1} of {n}"
        if isinstance(raw, (str, bytes, bytearray)):
            if len(raw) > _MAX_JSON_BYTES:
                raise MetricsError(f"{where} is {len(raw)} bytes of text, more than {_MAX_JSON_BYTES}; not a window state")
            try:
                raw = json.loads(raw)
            except (ValueError, RecursionError) as exc:
                raise MetricsError(f"{where} is not valid JSON ({exc}); fix: pass what export() returned") from None
        if not isinstance(raw, Mapping):
            raise MetricsError(
                f"{where} is a {type(raw).__name__}, not a window state; fix: pass what "
                "WorkerMetrics.export() returned (a dict, or its JSON text)"
            )
        worker = raw.get("worker")
        valid_id = isinstance(worker, str) and _valid_id(worker)
        who = f"worker {worker!r} ({where})" if valid_id else where
        if raw.get("format") != FORMAT:
            raise MetricsError(
                f"{who} is not a posttrain-metrics window state (format {raw.get('format')!r:.60}, "
                f"expected {FORMAT!r}); fix: pass what WorkerMetrics.export() returned"
            )
        version = raw.get("version")
        if version != VERSION or isinstance(version, bool):
            raise MetricsError(
                f"{who} has format version {version!r:.20}; this installation reads version {VERSION}. "
                "Fix: run the same posttrain-metrics version on the workers and the driver"
            )
        if not valid_id:
            raise MetricsError(
                f"{where} has no valid worker id (got {worker!r:.80}); it must be a non-empty printable "
                f"str of at most {_MAX_ID_CHARS} characters"
            )
        assert isinstance(worker, str)
        unknown = sorted(str(k)[:40] for k in raw.keys() - _FIELDS)
        missing = sorted(_FIELDS - raw.keys())
        if unknown or missing:
            raise MetricsError(
                f"{who}: malformed state (unknown fields {unknown}, missing fields {missing}); "
                f"fix: pass what WorkerMetrics.export() returned, unmodified"
            )
        layout = self.layout
        names = raw["adapters"]
        if (
            not isinstance(names, list)
            or len(names) > 256
            or not all(isinstance(a, str) and len(a) <= _MAX_ID_CHARS for a in names)
        ):
            raise MetricsError(f"{who}: 'adapters' must be a list of adapter names, got {names!r:.80}")
        if raw["layout"] != _fingerprint_text(layout):
            mine = [a.name for a in layout.adapters]
            detail = (
                "the same adapter names with different declarations (another version of an adapter?)"
                if names == mine
                else f"adapters {names}"
            )
            raise MetricsError(
                f"{who} packed its window with {detail} (layout {str(raw['layout'])[:20]!r}), but this "
                f"driver reduces adapters {mine} (layout {_fingerprint_text(layout)!r}); their states "
                "cannot be merged. Fix: construct WorkerMetrics with the same adapters, in the same "
                "order, as the driver"
            )
        if raw["slots"] != [layout.sum_size, layout.max_size]:
            raise MetricsError(
                f"{who}: 'slots' is {raw['slots']!r:.40}, expected {[layout.sum_size, layout.max_size]} "
                "for this layout; the state is corrupted"
            )
        step = raw["step"]
        if isinstance(step, bool) or not isinstance(step, int) or abs(step) > MAX_EXACT_INT:
            raise MetricsError(f"{who}: 'step' must be an int within +-2**53, got {step!r:.40}")
        phase = raw["phase"]
        if phase not in PHASES:
            raise MetricsError(f"{who}: 'phase' {phase!r:.40} is not one of {sorted(PHASES)}")
        packed = PackedState(*self._buffers(raw["mask"], raw["values"], who))
        errors = self._errors(raw["errors"], who)
        self._check_consistent(packed, step, phase, errors, who)
        return _Decoded(worker, step, phase, packed, errors)

    def _buffers(self, mask_text: object, values_text: object, who: str) -> tuple[list[float], list[float]]:
        n_sum, n_max = self.layout.sum_size, self.layout.max_size
        total = n_sum + n_max
        n_bytes = (total + 7) // 8
        mask = _b64(mask_text, 4 * ((n_bytes + 2) // 3), "mask", who)
        if len(mask) != n_bytes or (total % 8 and mask[-1] >> (total % 8)):
            raise MetricsError(f"{who}: 'mask' does not cover exactly {total} slots; the state is corrupted")
        set_slots = [8 * j + bit for j, byte in enumerate(mask) if byte for bit in _BITS[byte]]
        raw = _b64(values_text, 4 * ((8 * len(set_slots) + 2) // 3), "values", who)
        if len(raw) != 8 * len(set_slots):
            raise MetricsError(
                f"{who}: 'values' holds {len(raw)} bytes for {len(set_slots)} set slots "
                f"({8 * len(set_slots)} expected); the state is corrupted"
            )
        slots = [0.0] * n_sum + [NEG_INF] * n_max
        for i, value in zip(set_slots, struct.unpack(f"<{len(set_slots)}d", raw)):
            slots[i] = value
        return slots[:n_sum], slots[n_sum:]

    def _errors(self, items: object, who: str) -> list[tuple[int, int, str]]:
        n_keys = len(self.layout.keys)
        codes = Code.TEXT.keys()
        if not isinstance(items, list) or len(items) > len(codes) * (n_keys + 1):
            raise MetricsError(f"{who}: 'errors' must be a list of at most {len(codes) * (n_keys + 1)} items")
        out: dict[tuple[int, int], str] = {}
        for item in items:
            ok = (
                isinstance(item, list)
                and len(item) == 3
                and isinstance(item[0], int)
                and not isinstance(item[0], bool)
                and item[0] in codes
                and isinstance(item[1], int)
                and not isinstance(item[1], bool)
                and 0 <= item[1] <= n_keys
                and isinstance(item[2], str)
                and (item[0], item[1]) not in out
            )
            if not ok:
                raise MetricsError(
                    f"{who}: error record {item!r:.80} is not [code in {sorted(codes)}, key index "
                    f"0..{n_keys}, message] (or repeats one); the state is corrupted"
                )
            message = item[2][:_MAX_MESSAGE_CHARS]
            out[(item[0], item[1])] = "".join(c if c.isprintable() else "?" for c in message)
        return [(code, index, message) for (code, index), message in sorted(out.items())]

    def _check_consistent(
        self, state: PackedState, step: int, phase: str, errors: list[tuple[int, int, str]], who: str
    ) -> None:
        """One worker's buffers must be what one ``accumulate`` can produce: 0/1 flags, one label,
        the header's step and phase, and the error slots agreeing with the error list."""
        S, M, L = state.sum, state.max, self.layout
        problems = []
        if any(v != v for v in M):  # NaN
            problems.append("a NaN in the MAX buffer")
        if any(S[i] != 0.0 and S[i] != 1.0 for i in self._flags):
            problems.append("a presence or label flag that is not 0 or 1")
        if any(not (S[i] >= 0.0 and S[i].is_integer() and S[i] <= MAX_EXACT_INT) for i in self._counters):
            problems.append("a chunk counter that is not a whole number")
        if any(S[fam.carried] > S[fam.batch] for fam in L.families):
            problems.append("a family carried by more chunks than its batch holds")
        for source, presence, labels in self._labels:
            if sum(S[i] for i in labels) > S[presence]:
                problems.append(f"more than one label for {source!r}")
        phase_id = float(phase == "val")
        if (M[L.STEP], M[L.NEG_STEP], M[L.PHASE], M[L.NEG_PHASE]) != (step, -step, phase_id, -phase_id):
            problems.append("buffers whose step or phase differ from the header's")
        worst = max((code * _CODE_BITS + index * _KEY_BITS for code, index, _ in errors), default=None)
        if (S[L.ERROR_RANKS] == 1.0) != bool(errors) or M[L.WORST] != (NEG_INF if worst is None else worst):
            problems.append("error slots that disagree with its error list")
        if problems:
            raise MetricsError(
                f"{who}: inconsistent state ({'; '.join(problems)}); it was modified or corrupted on the "
                "way. Fix: pass what WorkerMetrics.export() returned, unmodified"
            )

    # -- across workers ---------------------------------------------------------------------------

    def _check_distinct(self, decoded: list[_Decoded]) -> None:
        seen: dict[str, int] = {}
        for i, d in enumerate(decoded):
            if d.worker in seen:
                raise MetricsError(
                    f"worker {d.worker!r} sent states {seen[d.worker] + 1} and {i + 1}; each worker's "
                    "window must be merged once. Fix: give every worker a distinct worker_id, and pass "
                    "each state once"
                )
            seen[d.worker] = i

    def _check_window(self, decoded: list[_Decoded], step: int | None, phase: str | None) -> None:
        for field, wanted in (("step", step), ("phase", phase)):
            groups: dict[object, list[str]] = {}
            for d in decoded:
                groups.setdefault(getattr(d, field), []).append(d.worker)
            by = "; ".join(f"{field} {value!r} from workers {workers}" for value, workers in groups.items())
            if len(groups) > 1:
                raise MetricsError(
                    f"workers exported different {field}s: {by}; fix: every worker must export the "
                    f"same window (the same {field})"
                )
            if wanted is not None and wanted not in groups:
                raise MetricsError(
                    f"the driver merges {field} {wanted!r}, but the workers exported {by}; fix: pass "
                    f"the same {field} to export() and to merge()"
                )

    def _raise_worst(self, decoded: list[_Decoded]) -> None:
        # The order the collectives use: highest code, then highest key index, then the later worker.
        failed = [(code, index, i, msg) for i, d in enumerate(decoded) for code, index, msg in d.errors]
        if not failed:
            return
        _, _, i, message = max(failed)
        workers = sorted({decoded[j].worker for _, _, j, _ in failed})
        others = f" ({len(workers)} workers reported errors: {workers})" if len(workers) > 1 else ""
        raise MetricsError(f"worker {decoded[i].worker!r} (state {i + 1} of {len(decoded)}): {message}{others}")

    def _check_families(self, decoded: list[_Decoded]) -> None:
        # Presence is all-or-nothing per batch: every chunk of every worker in the family's batch
        # carries the family, or none does. Name the workers on each side.
        for fam in self.layout.families:
            full = [d.worker for d in decoded if d.state.sum[fam.carried] > 0.0]
            short = [d.worker for d in decoded if d.state.sum[fam.carried] < d.state.sum[fam.batch]]
            if full and short:
                raise MetricsError(
                    f"the all-or-nothing family {list(fam.sources)} of adapter {fam.adapter!r} was carried "
                    f"by chunks of workers {full}, but workers {short} sent chunks of its batch "
                    f"({fam.describe_scope()}) without it; presence is all-or-nothing per batch, so a "
                    "partial record is a producer bug. Fix: emit the family in every such chunk (zero "
                    "weight when there is no data), or in none"
                )

    def _check_agreed(self, decoded: list[_Decoded]) -> None:
        # Exact counters and flags: every worker that reported one must hold the same last value.
        for key in self.layout.keys.values():
            if key.reduction is not Reduction.AGREED:
                continue
            by_value: dict[str, list[str]] = {}
            for d in decoded:
                if d.state.sum[key.s] == 0.0:
                    continue  # not reported by this worker
                value = "nan" if d.state.sum[key.s + 2] else repr(d.state.max[key.m] + 0.0)
                by_value.setdefault(value, []).append(d.worker)
            if len(by_value) > 1:
                detail = ", ".join(f"{value} from workers {workers}" for value, workers in by_value.items())
                raise MetricsError(
                    f"workers disagree on {key.source!r} (-> {key.metric.leaf!r}), a counter or flag every "
                    f"worker holds identically by construction: {detail}; the workers are desynchronised"
                )

    def _check_labels(self, decoded: list[_Decoded]) -> None:
        for key in self.layout.keys.values():
            if key.reduction is not Reduction.CATEGORICAL:
                continue
            by_label: dict[str, list[str]] = {}
            for d in decoded:
                for j, label in enumerate(key.metric.labels):
                    if d.state.sum[key.s + 1 + j] > 0.0:
                        by_label.setdefault(label, []).append(d.worker)
            if len(by_label) > 1:
                detail = ", ".join(f"{label!r} from workers {workers}" for label, workers in by_label.items())
                raise MetricsError(
                    f"workers disagree on categorical key {key.source!r} (-> {key.metric.leaf!r}): "
                    f"{detail}; fix: every worker must report the same label for a window"
                )


def merge_exported(
    adapters: AdapterSpec, states: Iterable[State], *, step: int | None = None, phase: str | None = None
) -> Frame:
    """One-shot :meth:`DriverReducer.merge`: the exact frame of every worker's exported state."""
    return DriverReducer(adapters).merge(states, step=step, phase=phase)


def _fingerprint_text(layout: Layout) -> str:
    return f"{int(layout.fingerprint):0{_FINGERPRINT_DIGITS}x}"


def _valid_id(text: str) -> bool:
    return 0 < len(text) <= _MAX_ID_CHARS and text.isprintable()


def _b64(text: object, length: int, field: str, who: str) -> bytes:
    if not isinstance(text, str) or len(text) != length:
        got = f"{len(text)} characters" if isinstance(text, str) else type(text).__name__
        raise MetricsError(f"{who}: {field!r} must be {length} characters of base64, got {got}; the state is corrupted")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise MetricsError(f"{who}: {field!r} is not valid base64; the state is corrupted") from None
