"""The TensorBoard sink: event files written with TensorBoard's own writer; no torch, no TensorFlow.

``TensorBoardSink(log_dir=...)`` writes one run into ``log_dir`` (``{name}`` and ``{run_id}`` in the
path are filled in at start); point ``tensorboard --logdir`` at its parent to compare runs. The
callback's default, ``{"type": "tensorboard"}``, is ``<out_dir>/tensorboard/{name}-{run_id}``: one
directory (one TensorBoard run) per run, so a second run into the same ``out_dir`` never mixes its
points with the first, and a resumed run (same id, even under another name) goes on in its own
directory. ``posttrain-metrics export --to tensorboard`` writes the same directory by default. What
the dashboard then shows:

- **Scalars.** Every numeric key of a step under its own tag (``train/loss_avg``,
  ``train/grad_norm``, ``optim/optimizer_step`` ...), all of a step's keys in *one* event: one
  record, one checksum and one queue hand-off per step instead of one per key. The first point of
  each tag (only it) carries the catalogue's meaning, unit and reduction as the chart's
  description. Each categorical key also charts as one 0/1 series per label (``optim/update_outcome/skipped``).
  A key a step did not publish has no point at that step: PPO's critic-only warmup iterations
  leave the policy charts empty there, never zero.
- **Text.** The label of each categorical key at each step (``optim/update_outcome``:
  ``skipped``), and the run's config (flattened, secrets redacted) as a table under ``config``,
  written at start so that a killed run shows it too.
- **Custom scalars.** A layout derived from the catalogue, so the dashboard opens organised, listing
  only the tags the run has written: it is written with the first step and again, in the step's
  event, whenever a charted tag is first written (TensorBoard shows a run's latest layout), so no
  chart opens empty and the layout grows as keys appear:
  first ``<ALGO> headline`` (the keys the catalogue marks as headline: loss, reward, pre-clip
  gradient norm, informative groups, KL, the update outcome), expanded; then one collapsed
  category per topic: a key's declared family (``GRPO logprob gap``); a leaf prefix shared by at
  least three keys of an adapter (``GRPO KL``, ``GRPO score centering``, ``GRPO response length``,
  ``PPO policy``, ``PPO critic``), which also takes the keys weighted by its token count and admits
  no key weighted by another one; the adapter's other keys (``GRPO``, ``PPO``, ``reward & groups``,
  ``trainer``); last the fixed namespaces (``optimizer outcome`` for ``optim/*``, ``timing`` for
  ``timer/*``). One chart per key; ``train/`` and ``val/`` of one leaf share a chart;
  ``<x>_mean`` with ``<x>_min`` and ``<x>_max`` is one band chart; a categorical key is one chart
  of its label series. A user's own adapter is laid out by the same rules from its declarations.
  Keys a run never publishes (score centering when it is off) have no chart.
- **HParams.** At close, a session in ``<log_dir>/hparams``, its group named after the run (the
  run's directory name), with the config as hyperparameters
  (plus ``adapters``), the status (success, or failure when the run failed) and, as its metrics,
  the run aggregate of every key under ``run/<key>``: computed with each key's own semantics
  (token-weighted means over the whole run, totals for sums, the run's maximum and minimum, the
  last value of counters, the number of steps per outcome label), not TensorBoard's last value.
  They are the session's metrics in the hparams view; the run's own series hold none of them.
  No experiment summary is written, so TensorBoard takes the union of every run's hyperparameters
  and the runs of one logdir compare side by side.

Files are flushed after every step by default (``flush="step"``; ``flush=N`` flushes once the
frames since the last flush span N steps) and at close, so a short or killed run leaves readable
files (TensorBoard's writer otherwise holds events in a queue and flushes every two minutes).
Values are float32, TensorBoard's scalar type: about seven significant digits, integers exact up to
2**24. NaN, +inf and -inf are stored as such; a finite value beyond float32's range would become
+/-inf and is warned about once per key. The journal keeps every value exactly.

>>> sink = TensorBoardSink(log_dir="runs/{name}", flush=10)  # no I/O and no tensorboard import yet
>>> sink.name, sorted(sink.stores_nonfinite)
('tensorboard', ['inf', 'nan'])
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import itertools
import math
import operator
import os
import queue
import re
import socket
import struct
import threading
import time
import types
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core.adapter import PHASES, Metric
from ..core.errors import MetricsError
from ..core.frame import Frame
from ..core.keys import KeyInfo
from ..core.reduction import Reduction
from ..core.summary import RunSummary
from ..core.values import Scalar
from ..core.warn import warn
from .base import Points, RunInfo, Sink
from .factory import run_path, safe_name

__all__ = [
    "AGGREGATE_PREFIX",
    "CONFIG_TAG",
    "END_TAG",
    "HPARAMS_DIR",
    "INSTALL",
    "REASON_HPARAM",
    "STATUS_HPARAM",
    "Category",
    "Chart",
    "TensorBoardSink",
    "dashboard_layout",
    "samples_markdown",
    "written_layout",
]

INSTALL = "pip install 'posttrain-metrics[tensorboard]'"
HPARAMS_DIR = "hparams"
"""Sub-directory of ``log_dir`` holding the hparams session (a run of its own in TensorBoard)."""
AGGREGATE_PREFIX = "run/"
"""Tag prefix of the run aggregates in the hparams session (``run/train/loss_avg``)."""
CONFIG_TAG = "config"
"""Text tag of the run's config table (written at start)."""
STATUS_HPARAM = "posttrain_metrics/status"
"""The hparam that says how the run ended: ``finished``, ``failed``, ``interrupted`` or ``killed``
(never closed)."""
REASON_HPARAM = "posttrain_metrics/end_reason"
"""The hparam that says why a run failed or was interrupted (the exception's type and message)."""
END_TAG = "posttrain_metrics/end"
"""Text tag, at the last step, saying how the run ended and why (``interrupted: KeyboardInterrupt``)."""

# Doubles at or beyond this magnitude round to +/-inf in float32 (2**128 less half a float32 ulp).
_F32_OVERFLOW = 2.0**128 * (1.0 - 2.0**-25)

# Display names only: a user's adapter is shown under its own name.
_ADAPTER_TITLES = {
    "grpo": "GRPO", "ppo": "PPO", "dpo": "DPO", "nft": "NFT", "opd_direct": "OPD direct",
    "opd_advantage": "OPD advantage", "flow_bc": "flow-BC", "reward": "reward & groups",
}
_TOPIC_TITLES = {"kl": "KL", "sc": "score centering", "response": "response length"}
_NAMESPACE_TITLES = {"optim": "optimizer outcome", "timer": "timing"}
_MIN_GROUP = 3  # a leaf prefix shared by this many charts of an adapter makes a topic
_DOMINANT = 0.6  # ... unless it is the adapter's own prefix (shared by most of its keys)


# -- the custom-scalars layout, as plain data -----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Chart:
    """One chart: a multiline chart of the tags matching ``tags`` (anchored regexes), or, when
    ``bands`` is set, a margin chart of ``(value, lower, upper)`` tag triples."""

    title: str
    tags: tuple[str, ...] = ()
    bands: tuple[tuple[str, str, str], ...] = ()
    keys: tuple[str, ...] = ()
    """The tags a multiline chart matches (what ``tags`` says as regexes), for :func:`written_layout`."""


@dataclasses.dataclass(frozen=True)
class Category:
    """A titled group of charts; ``closed`` categories start collapsed."""

    title: str
    charts: tuple[Chart, ...]
    closed: bool = True


@dataclasses.dataclass
class _Unit:
    """What one chart shows: a leaf under every phase it is published in, or a mean/min/max band."""

    adapter: str
    leaf: str  # the band's stem for a band
    infos: list[KeyInfo]  # one per phase (the ``_mean`` keys for a band)
    bands: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)

    @property
    def metric(self) -> Metric:
        return self.infos[0].metric

    @property
    def fixed_namespace(self) -> str | None:
        ns = self.metric.namespace
        return ns if ns is not None and ns not in PHASES else None

    def charts(self) -> tuple[Chart, ...]:
        """One chart; a categorical key's labels one chart each: in one multiline chart the custom-
        scalars tab draws every label of a run in the run's colour, 0/1 lines on top of each other,
        and only the tooltip tells which label a line is."""
        keys = [i.key for i in self.infos]
        if self.bands:
            return (Chart(f"{self._title(keys)} (mean, min to max)", bands=tuple(self.bands)),)
        alternatives = "|".join(re.escape(k) for k in keys)
        if self.metric.labels:
            return tuple(Chart(f"{self._title(keys)} = {label} (1 at its steps)",
                               tags=(f"^(?:{alternatives})/{re.escape(label)}$",),
                               keys=tuple(f"{k}/{label}" for k in keys)) for label in self.metric.labels)
        return (Chart(self._title(keys), tags=(f"^(?:{alternatives})$",), keys=tuple(keys)),)

    def _title(self, keys: list[str]) -> str:
        if len(keys) == 1:
            return keys[0] if not self.bands else keys[0].rsplit("_", 1)[0]
        phases = ", ".join(k.split("/", 1)[0] for k in keys)
        return f"{self.leaf} ({phases})"


def _units(keys: Mapping[str, KeyInfo]) -> list[_Unit]:
    by_leaf: dict[tuple[str, str | None, str], _Unit] = {}
    for info in keys.values():
        ident = (info.adapter, info.metric.namespace, info.metric.leaf)
        if ident in by_leaf:
            by_leaf[ident].infos.append(info)
        else:
            by_leaf[ident] = _Unit(info.adapter, info.metric.leaf, [info])
    return list(by_leaf.values())


def _with_bands(units: list[_Unit]) -> list[_Unit]:
    """``<x>_mean`` + ``<x>_min`` + ``<x>_max`` of one adapter, same phases: one band unit."""
    index = {(u.adapter, u.metric.namespace, u.leaf): u for u in units}
    absorbed: set[int] = set()
    out: list[_Unit] = []
    for unit in units:
        if id(unit) in absorbed:
            continue
        stem = unit.leaf.removesuffix("_mean") if unit.leaf.endswith("_mean") else ""
        lo = index.get((unit.adapter, unit.metric.namespace, f"{stem}_min")) if stem else None
        hi = index.get((unit.adapter, unit.metric.namespace, f"{stem}_max")) if stem else None
        if lo is not None and hi is not None and len(lo.infos) == len(hi.infos) == len(unit.infos):
            band = _Unit(unit.adapter, stem, unit.infos,
                         [(m.key, low.key, high.key) for m, low, high in zip(unit.infos, lo.infos, hi.infos)])
            absorbed.update({id(lo), id(hi)})
            out.append(band)
        else:
            out.append(unit)
    return [u for u in out if id(u) not in absorbed]


def _adapter_title(name: str) -> str:
    return _ADAPTER_TITLES.get(name, name)


def _topics(units: list[_Unit], keys: Mapping[str, KeyInfo]) -> list[str]:
    """The category title of every unit (see the module docstring for the rules)."""
    titles: list[str | None] = [None] * len(units)
    unit_of_key = {info.key: i for i, u in enumerate(units) for info in u.infos}
    weights = {info.weight_key for info in keys.values() if info.weight_key}

    def weight_unit(i: int) -> int | None:
        w = units[i].infos[0].weight_key
        return unit_of_key.get(w) if w else None

    by_adapter: dict[str, list[int]] = {}
    for i, unit in enumerate(units):
        if unit.fixed_namespace is not None:
            titles[i] = _NAMESPACE_TITLES.get(unit.fixed_namespace, unit.fixed_namespace)
        elif unit.metric.family:
            titles[i] = f"{_adapter_title(unit.adapter)} {unit.metric.family.replace('_', ' ')}"
        else:
            by_adapter.setdefault(unit.adapter, []).append(i)

    for adapter, members in by_adapter.items():
        token = {i: units[i].leaf.split("_", 1)[0] for i in members}
        counts = Counter(token.values())
        own = adapter.split("_", 1)[0]  # the adapter's own prefix (``dpo_``) names no topic
        topic = {t for t, n in counts.items()
                 if n >= _MIN_GROUP and n <= _DOMINANT * len(members) and t != own}
        group: dict[int, str | None] = {i: token[i] if token[i] in topic else None for i in members}
        # A group built around a token count (a population) admits only keys measured over it.
        population = {t: {i for i in members if group[i] == t and units[i].infos[0].key in weights}
                      for t in topic}
        for i in members:
            t, w = group[i], weight_unit(i)
            if t is not None and w is not None and population[t] and w not in population[t]:
                group[i] = None
        # A key weighted by a group's token count joins that group.
        for i in members:
            w = weight_unit(i)
            if w is not None and w in group and group[w] is not None:
                group[i] = group[w]
        sizes = Counter(t for t in group.values() if t is not None)
        for i in members:
            t = group[i]
            if t is not None and sizes[t] >= _MIN_GROUP:
                titles[i] = f"{_adapter_title(adapter)} {_TOPIC_TITLES.get(t, t)}"
            else:
                titles[i] = _adapter_title(adapter)
    return [t or "" for t in titles]


def dashboard_layout(keys: Mapping[str, KeyInfo], adapters: Sequence[str]) -> list[Category]:
    """The custom-scalars layout of a run, derived from its key declarations.

    >>> from posttrain_metrics.core.keys import describe
    >>> from posttrain_metrics import get_adapter
    >>> layout = dashboard_layout(describe([get_adapter("grpo")]), ["grpo"])
    >>> [c.title for c in layout]  # doctest: +NORMALIZE_WHITESPACE
    ['GRPO headline', 'GRPO', 'GRPO logprob gap', 'GRPO KL', 'GRPO response length',
     'GRPO score centering']
    """
    units = _units(keys)
    out: list[Category] = []
    headline = [c for u in units if any(i.metric.headline for i in u.infos) for c in u.charts()]
    if headline:
        lead = _adapter_title(adapters[0]) if adapters else "run"
        out.append(Category(f"{lead} headline", tuple(headline), closed=False))
    topical = _with_bands(units)
    charts: dict[str, list[Chart]] = {}
    shared: dict[str, list[Chart]] = {}  # fixed namespaces (optim, timer) span adapters: last
    for unit, title in zip(topical, _topics(topical, keys)):
        (shared if unit.fixed_namespace else charts).setdefault(title, []).extend(unit.charts())
    out.extend(Category(title, tuple(group)) for title, group in {**charts, **shared}.items())
    return out


def written_layout(categories: Sequence[Category], written: Iterable[str]) -> list[Category]:
    """``categories`` restricted to the ``written`` tags: a multiline chart lists only its tags that
    were written (its regex rebuilt over them), a band chart keeps the bands whose three tags were,
    a chart or category left with nothing is dropped. So no chart opens empty.

    >>> layout = [Category("c", (Chart("x", tags=("^(?:a|b)$",), keys=("a", "b")), Chart("y", keys=("c",))))]
    >>> written_layout(layout, {"b"})  # doctest: +NORMALIZE_WHITESPACE
    [Category(title='c', charts=(Chart(title='x', tags=('^(?:b)$',), bands=(), keys=('b',)),), closed=True)]
    """
    done = set(written)
    out: list[Category] = []
    for category in categories:
        charts: list[Chart] = []
        for chart in category.charts:
            if chart.bands:
                bands = tuple(b for b in chart.bands if all(t in done for t in b))
                if bands:
                    charts.append(dataclasses.replace(chart, bands=bands))
                continue
            keys = tuple(k for k in chart.keys if k in done)
            if keys:
                charts.append(dataclasses.replace(chart, keys=keys,
                                                  tags=(f"^(?:{'|'.join(re.escape(k) for k in keys)})$",)))
        if charts:
            out.append(dataclasses.replace(category, charts=tuple(charts)))
    return out


# -- the sink ------------------------------------------------------------------------------------


def _description(key: str, keys: Mapping[str, KeyInfo]) -> str:
    info = keys.get(key)
    if info is None:
        parent, _, label = key.rpartition("/")
        if parent in keys and label in keys[parent].metric.labels:
            return f"1 when `{parent}` is `{label}` at this step, else 0"
        return ""
    m = info.metric
    how = m.reduction.value.replace("_", " ")
    if info.weight_key and m.reduction is Reduction.WEIGHTED_MEAN:
        how += f" by `{info.weight_key}`"
    unit = f"{m.unit}; " if m.unit else ""
    return f"{m.meaning} ({unit}{how} over chunks and ranks)" if m.meaning else f"({unit}{how})"


def _config_table(run: RunInfo) -> str:
    def cell(value: object) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    lines = [f"run `{run.name}` ({run.run_id}), adapters: {', '.join(run.adapters)}", "",
             "| key | value |", "|---|---|"]
    lines += [f"| {cell(k)} | {cell(v)} |" for k, v in run.config.items()]
    return "\n".join(lines)


WIDE_CELL = 120
"""Characters beyond which a column's text leaves the samples table (see :func:`samples_markdown`)."""
_MARKDOWN_SPECIALS = re.compile(r"([\\`*_\[\]#|])")


def _paragraph(value: object) -> str:
    """Model text as one Markdown paragraph shown as written (``<think>`` included): Markdown's
    specials backslash-escaped, HTML's as entities (Markdown has no escape for ``<``), lines kept."""
    text = "" if value is None else str(value)
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MARKDOWN_SPECIALS.sub(r"\\\1", text).replace("\n", "<br>")


def samples_markdown(samples: Any) -> str:
    """A step's samples for TensorBoard's text tab. A table sizes each column to its longest cell,
    so one 2,000-character completion squeezed the other columns to a letter a line: a column with
    a cell longer than :data:`WIDE_CELL` leaves the table, which numbers its rows (``#``), and is
    written under the table row by row. Short text keeps the plain table (``Samples.markdown``)."""
    wide = [c for c in samples.columns
            if any(len("" if r.get(c) is None else str(r.get(c))) > WIDE_CELL for r in samples.rows)]
    if not wide:
        return str(samples.markdown())
    narrow = [c for c in samples.columns if c not in wide]

    def cell(value: object) -> str:
        return ("" if value is None else str(value)).replace("\\", "\\\\").replace("|", "\\|").replace("\n", "<br>")

    lines = [f"step {samples.step}: {len(samples.rows)} of {samples.offered} rows "
             f"({', '.join(wide)}: below the table)", "",
             "| # | " + " | ".join(cell(c) for c in narrow) + " |", "|" + "---|" * (len(narrow) + 1)]
    lines += [f"| {i} | " + " | ".join(cell(row.get(c)) for c in narrow) + " |"
              for i, row in enumerate(samples.rows, 1)]
    for i, row in enumerate(samples.rows, 1):
        for column in wide:
            lines += ["", f"**#{i} {_paragraph(column)}**", "", _paragraph(row.get(column))]
    return "\n".join(lines)


def _import_tensorboard() -> Any:
    try:
        from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2
        from tensorboard.plugins.custom_scalar import layout_pb2
        from tensorboard.plugins.custom_scalar import metadata as layout_metadata
        from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2
        from tensorboard.plugins.hparams import metadata as hparams_metadata
        from tensorboard.plugins.hparams import summary_v2 as hparams_summary
        from tensorboard.plugins.scalar import metadata as scalar_metadata
        from tensorboard.plugins.text import metadata as text_metadata
    except ImportError as exc:
        raise ImportError(
            f"the TensorBoard sink needs the tensorboard package, which could not be imported "
            f"({exc}); fix:\n{INSTALL}"
        ) from exc

    return types.SimpleNamespace(
        event_pb2=event_pb2, summary_pb2=summary_pb2, tensor_pb2=tensor_pb2, types_pb2=types_pb2,
        layout_pb2=layout_pb2, layout_metadata=layout_metadata, api_pb2=api_pb2,
        plugin_data_pb2=plugin_data_pb2, hparams_metadata=hparams_metadata,
        hparams_summary=hparams_summary, scalar_metadata=scalar_metadata, text_metadata=text_metadata,
        crc32c=_crc32c(),
    )


def _crc32c() -> Callable[[bytes], int]:
    """CRC-32C in C (``google-crc32c``, a dependency of the tensorboard extra), else TensorBoard's own
    pure-Python one (about 170 us per 2 KB frame: a tenth of the C speed)."""
    try:
        import google_crc32c

        if google_crc32c.implementation == "c":
            value: Callable[[bytes], int] = google_crc32c.value
            return value
    except ImportError:
        pass
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import crc32c  # pure Python

    slow: Callable[[bytes], int] = crc32c
    return slow


_UID = itertools.count()
_Q = struct.Struct("<Q")
_D = struct.Struct("<d")
_WALL = struct.Struct("<Bd")
_F = struct.Struct("<f")
_I = struct.Struct("<I")


_SMALL = [bytes((n,)) for n in range(0x80)]
_STEPS = [b"\x10" + bytes((n,)) for n in range(0x80)]


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _SMALL[n]
    out = bytearray()
    while True:
        bits = n & 0x7F
        n >>= 7
        if n:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


class _EventFile:
    """TensorBoard's event file format (TFRecord framing of ``Event`` protos) with a C CRC-32C: the same
    bytes as ``EventFileWriter``. Records are framed on the calling thread and written at ``flush``.

    A flush of a large batch (``_BACKGROUND_BYTES``, the follower's: hundreds of frames) is written by a
    writer thread, so that framing the next batch overlaps a disk that throttles writes (this machine's
    takes ~150 MB/s sustained; a 100k-step export is 200 MB). At most ``_QUEUED`` batches wait for it
    (then ``flush`` blocks: memory stays bounded); a small flush (a step's event) is written on the
    calling thread unless batches are still queued (order is kept), so a training process never hands
    a step to another thread. A write that fails (a full disk) is raised by the next ``flush`` or
    ``close``, on either thread. The file is written unbuffered and a failed write keeps exactly the
    bytes that did not reach it (part of a record, possibly), which the next write sends first: when
    the disk has room again every record is in the file once, whole and in order, never twice (a
    buffered file kept its own copy of a failed write besides ours: a step came back 11 times).
    """

    def __init__(self, log_dir: Path, tb: Any) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{next(_UID)}"
        self.path = log_dir / name
        self._crc = tb.crc32c
        self._file = open(self.path, "wb", buffering=0)  # noqa: SIM115 - held for the run
        self._pending: list[bytes] = []
        self._unwritten = b""  # what a failed write did not get into the file: written first, next time
        self._queue: queue.Queue[bytes | None] | None = None  # the writer thread's, once started
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        version = tb.event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2")
        self.add(version.SerializeToString())
        self.flush()

    def add(self, data: bytes) -> None:
        """Frame one record (length, its masked CRC, data, its masked CRC); it is written at the next
        ``flush`` (one write per batch)."""
        crc = self._crc
        header = _Q.pack(len(data))
        h, d = crc(header), crc(data)
        self._pending.append(b"".join((header, _I.pack((((h >> 15) | (h << 17)) + 0xA282EAD8) & 0xFFFFFFFF), data,
                                       _I.pack((((d >> 15) | (d << 17)) + 0xA282EAD8) & 0xFFFFFFFF))))

    def add_event(self, event: Any) -> None:
        self.add(event.SerializeToString())

    def flush(self) -> None:
        if self._pending or self._unwritten:
            data = b"".join(self._pending)
            self._pending.clear()  # from here on, what does not reach the file is in _unwritten
            self._write(data)
        self._raise()

    def _write(self, data: bytes) -> None:
        q = self._queue
        if q is not None and q.unfinished_tasks:  # batches still queued: after them, in order
            q.put(data)
        elif len(data) >= _BACKGROUND_BYTES:
            if q is None:
                q = self._queue = queue.Queue(maxsize=_QUEUED)
                self._thread = threading.Thread(target=self._drain, args=(q,), daemon=True,
                                                name="posttrain-metrics-tensorboard-writer")
                self._thread.start()
            q.put(data)
        else:
            self._write_all(data)

    def _write_all(self, data: bytes) -> None:
        """Write what an earlier failed write left, then ``data``; on a failure keep exactly the bytes
        that did not reach the file (see the class docstring). One writer at a time: the calling
        thread writes only when the writer thread has no batch left."""
        data = self._unwritten + data if self._unwritten else data
        view = memoryview(data)
        done = 0
        try:
            while done < len(data):
                done += self._file.write(view[done:]) or 0  # a raw file may take part of it
        finally:
            self._unwritten = data[done:]

    def _drain(self, q: queue.Queue[bytes | None]) -> None:
        while True:
            data = q.get()
            try:
                if data is None:
                    return
                self._write_all(data)
            except BaseException as exc:  # kept for the next write (see _write_all): raised once
                with self._lock:
                    self._error = self._error or exc
            finally:
                q.task_done()

    def _raise(self) -> None:
        """The writer thread's first failure since the last one raised, raised once (a new exception
        each time: the same one raised again would grow its traceback)."""
        with self._lock:
            error, self._error = self._error, None
        if error is not None:
            raise OSError(f"writing {self.path.name} failed: {type(error).__name__}: {error}") from error

    def close(self) -> None:
        if self._file.closed:
            return
        try:
            self.flush()
        finally:
            if self._thread is not None:  # started with its queue
                assert self._queue is not None
                self._queue.put(None)
                self._thread.join()
            self._file.close()
        self._raise()


_BACKGROUND_BYTES = 256 << 10  # a flush this large is written by the writer thread (see _EventFile)
_QUEUED = 4  # batches waiting for the writer thread at most

_MAX_ENCODINGS = 256  # frames of ever new key sets are encoded value by value


class _Encoding:
    """The ``Summary`` bytes of frames with one set of keys, in one order, as one ``struct`` format.

    A scalar value is a tiny fixed protobuf (``0a <len> 0a <len> <tag> 15 <float32>``): everything
    up to the float is the tag's constant prefix. A label's text value is constant bytes per (key,
    label) once its tag is described. So a frame is its numbers packed between constant byte strings:
    one ``Struct.pack`` per frame, with one format per combination of labels (``formats``). The
    bytes are those of the value-by-value encoding, which any frame falls back to: when a tag is new,
    a label's text is not built yet, a number is beyond float32 (warned and stored as inf there) or
    a value changes type.
    """

    def __init__(self, names: tuple[str, ...], prefixes: tuple[bytes, ...],
                 numbers: Callable[[Any], tuple[Any, ...]], texts: tuple[tuple[str, int, int], ...]) -> None:
        self.names = names
        self.prefixes = prefixes  # per number, its tag's prefix
        self.numbers = numbers  # the numbers of a frame's values
        self.texts = texts  # (key, position among the values, index of the number it precedes)
        self.count = len(prefixes)
        at = [i for _, i, _ in texts]
        self.labels: Callable[[Any], tuple[Any, ...]] = (
            operator.itemgetter(*at) if len(at) > 1 else (lambda values: (values[at[0]],)) if at else (lambda values: ()))
        self.formats: dict[tuple[Any, ...], tuple[struct.Struct, list[Any]]] = {}

    @classmethod
    def of(cls, names: tuple[str, ...], metrics: Mapping[str, Scalar], prefixes: Mapping[str, bytes]
           ) -> _Encoding | None:
        """The encoding of frames with ``metrics``' keys, or None when a key has no prefix yet."""
        numbers: list[int] = []
        tags: list[bytes] = []
        labels: list[tuple[str, int, int]] = []
        for i, (key, value) in enumerate(metrics.items()):
            if isinstance(value, str):
                labels.append((key, i, len(numbers)))
                continue
            prefix = prefixes.get(key)
            if prefix is None:
                return None
            numbers.append(i)
            tags.append(prefix)
        getter: Callable[[Any], tuple[Any, ...]]
        if len(numbers) == 1:
            only = numbers[0]
            getter = lambda values: (values[only],)  # noqa: E731
        else:
            getter = operator.itemgetter(*numbers) if numbers else (lambda values: ())
        return cls(names, tuple(tags), getter, tuple(labels))

    def encode(self, values: tuple[Scalar, ...], texts: Mapping[tuple[str, str], bytes]) -> bytes | None:
        """The frame's bytes, or None when it does not fit this encoding (see the class docstring)."""
        labels = self.labels(values) if self.texts else ()
        compiled = self.formats.get(labels)
        if compiled is None:
            compiled = self._compile(labels, texts)
            if compiled is None:
                return None
        layout, args = compiled
        args[1 : 2 * self.count : 2] = self.numbers(values)
        try:
            data: bytes = layout.pack(*args)
        except (struct.error, OverflowError):
            return None
        return data

    def _compile(self, labels: tuple[Any, ...], texts: Mapping[tuple[str, str], bytes]
                 ) -> tuple[struct.Struct, list[Any]] | None:
        before: dict[int, list[bytes]] = {}
        for (key, _, at), label in zip(self.texts, labels):
            text = texts.get((key, label)) if isinstance(label, str) else None
            if text is None:
                return None
            before.setdefault(at, []).append(text)
        pieces = [b"".join(before.get(j, ())) + prefix for j, prefix in enumerate(self.prefixes)]
        tail = b"".join(before.get(self.count, ()))
        fmt = "<" + "".join(f"{len(p)}sf" for p in pieces) + (f"{len(tail)}s" if tail else "")
        args: list[Any] = [x for p in pieces for x in (p, 0.0)] + ([tail] if tail else [])
        if len(self.formats) < _MAX_ENCODINGS:
            self.formats[labels] = (struct.Struct(fmt), args)
        return struct.Struct(fmt), args


class TensorBoardSink(Sink):
    """Writes a run to TensorBoard event files under ``log_dir`` (see the module docstring).

    ``log_dir`` is the run's own directory (point TensorBoard at its parent to compare runs);
    ``{name}`` and ``{run_id}`` in it are replaced by the run's name and id at start. ``flush`` is
    ``"step"`` (after every frame) or N (once the frames since the last flush span N steps); files
    are always flushed at close. ``layout`` writes the custom-scalars layout of the tags written (with
    the first step, again as it grows), ``hparams`` the hparams session with the run aggregates at
    close.
    """

    name = "tensorboard"
    config_type = "tensorboard"  # rebuilt from its options in the publisher process
    path_options = ("log_dir",)
    stores_nonfinite = frozenset({"nan", "inf"})

    def __init__(
        self,
        *,
        log_dir: str | os.PathLike[str],
        flush: str | int = "step",
        layout: bool = True,
        hparams: bool = True,
    ) -> None:
        if flush == "step":
            every = 1
        elif isinstance(flush, int) and not isinstance(flush, bool) and flush >= 1:
            every = flush
        else:
            raise MetricsError(
                f"tensorboard flush={flush!r}; fix: use 'step' (after every step) or a whole number "
                "of steps >= 1"
            )
        self.log_dir = log_dir
        self.flush = flush
        self.layout = bool(layout)
        self.hparams = bool(hparams)
        self.path: Path | None = None  # the resolved run directory, known from start()
        self._every = every
        self._tb: Any = None
        self._writer: Any = None
        self._run: RunInfo | None = None
        self._summary: RunSummary | None = None
        self._described: set[str] = set()
        self._overflow_warned: set[str] = set()
        self._prefix: dict[str, bytes] = {}  # a scalar tag's bytes up to its float
        self._texts: dict[tuple[str, str], bytes] = {}  # a label's bytes, after the first with its metadata
        self._encodings: dict[tuple[str, ...], _Encoding | None] = {}  # a frame's keys -> its encoding
        self._current: _Encoding | None = None  # the last frame's
        self._layout: list[Category] = []  # the catalogue's layout, every chart
        self._chartable: set[str] = set()  # the tags it charts
        self._charted: set[str] = set()  # those written so far
        self._layout_stale = False  # a charted tag was first written since the layout was
        self._unflushed = 0
        self._last_step = 0

    # -- protocol ---------------------------------------------------------------------------------

    def start(self, run: RunInfo) -> None:
        tb = _import_tensorboard()
        if self._writer is not None:
            raise MetricsError(f"tensorboard sink for {self.path} already started; fix: close() it first")
        path = self.resolve(run.name, run.run_id)
        self._tb, self._run, self.path = tb, run, path
        self._summary = RunSummary(run.keys)
        self._described.clear()
        self._prefix.clear()
        self._texts.clear()
        self._encodings.clear()
        self._current = None
        self._unflushed = 0
        self._last_step = 0
        self._writer = _EventFile(path, tb)
        # The layout is written with the first frame and again whenever a charted tag is first
        # written (TensorBoard shows a run's latest layout): it lists only tags the run has.
        self._layout = dashboard_layout(run.keys, run.adapters) if self.layout else []
        self._chartable = {t for c in self._layout for chart in c.charts
                           for t in (*chart.keys, *(t for band in chart.bands for t in band))}
        self._charted.clear()
        self._layout_stale = False
        values = [self._text_value(CONFIG_TAG, _config_table(run), "The run's config (flattened, redacted)")]
        self._writer.add_event(self._event(0, run.started, values))
        self._writer.flush()

    def write_samples(self, samples: Any) -> None:
        """A step's sample completions as a Markdown table, TensorBoard text ``samples/completions``, and
        its histograms (``samples/reward`` ...) as TensorBoard histograms."""
        if self._writer is None:
            return
        values = []
        if samples.rows:
            values.append(self._text_value("samples/completions", samples_markdown(samples),
                                           "Sample completions of the step"))
        summary = self._tb.summary_pb2
        for column, h in samples.histograms.items():
            histo = summary.HistogramProto(min=h.edges[0], max=h.edges[-1], num=h.num, sum=h.sum,
                                           sum_squares=h.sum_squares, bucket_limit=h.edges[1:], bucket=h.counts)
            values.append(summary.Summary.Value(tag=f"samples/{column}", histo=histo))
        if values:
            self._writer.add_event(self._event(samples.step, samples.wall_time or time.time(), values))
            self._writer.flush()

    def resolve(self, name: str, run_id: str) -> Path:
        """``log_dir`` with its placeholders filled in. Placeholders take folder-safe values: a run
        name or id cannot lead the path elsewhere. A run resumed (same id) under another name finds
        the directory of its id when ``log_dir`` has both placeholders and exactly one matches."""
        template = str(self.log_dir)
        path = Path(template.replace("{name}", safe_name(name)).replace("{run_id}", safe_name(run_id)))
        if "{name}" in template and "{run_id}" in template and not path.exists():
            pattern = "*".join(glob.escape(part.replace("{run_id}", safe_name(run_id)))
                               for part in template.split("{name}"))
            found = [Path(p) for p in glob.glob(pattern) if Path(p).is_dir()]
            if len(found) == 1:
                return self._kept_in(template, found[0])
        return self._kept_in(template, path)

    @staticmethod
    def _kept_in(template: str, path: Path) -> Path:
        """``path`` checked by the journal's rule (:func:`~posttrain_metrics.integrations.factory.run_path`):
        the run's folder, filled in from the template, may not lead out of the template's own folder
        through a symlink planted at it."""
        if "{" not in template:
            return path  # an explicit folder, taken as given
        fixed = template.split("{", 1)[0]
        root = Path(fixed) if fixed.endswith(("/", os.sep)) else Path(fixed).parent
        return run_path(root, path.relative_to(root))

    def write(self, frame: Frame) -> None:
        """One event per frame, encoded directly (see :class:`_Encoding`): a frame with the keys of an
        earlier one is one ``struct.pack``; the first point of a tag, a label's first text and a
        value beyond float32 go through the proto classes."""
        writer, summary, run = self._writer, self._summary, self._run
        if writer is None or summary is None or run is None:
            raise MetricsError("tensorboard sink is not open; fix: call start() before write()")
        m = frame.metrics
        names = tuple(m)
        encoding = self._current
        if encoding is None or encoding.names != names:  # the keys of the last frame, most often
            encoding = self._current = self._encodings.get(names)
        body = encoding.encode(tuple(m.values()), self._texts) if encoding is not None else None
        if body is None:
            body = self._encode(m, run.keys)
            if encoding is None and len(self._encodings) < _MAX_ENCODINGS:
                self._encodings[names] = _Encoding.of(names, m, self._prefix)
        if self._layout_stale:  # the layout grew: written again, in this step's event
            self._layout_stale = False
            layout = self._layout_value(written_layout(self._layout, self._charted)).SerializeToString()
            body += b"\x0a" + _varint(len(layout)) + layout
        step = frame.step
        writer.add(b"".join((_WALL.pack(9, frame.wall_time or time.time()),
                             _STEPS[step] if 0 <= step < 0x80 else b"\x10" + _varint(step & 0xFFFFFFFFFFFFFFFF),
                             b"\x2a", _varint(len(body)), body)))
        summary.add(frame, names)
        if frame.step > self._last_step:
            self._last_step = frame.step
        self._unflushed += 1
        if self._unflushed >= self._every:
            writer.flush()
            self._unflushed = 0

    def _encode(self, metrics: Mapping[str, Scalar], keys: Mapping[str, KeyInfo]) -> bytes:
        """A frame's ``Summary`` bytes, value by value (each tag's bytes are built once per run)."""
        parts: list[bytes] = []
        prefixes = self._prefix
        pack = _F.pack
        for key, value in metrics.items():
            prefix = prefixes.get(key)
            if prefix is not None and not isinstance(value, str):
                try:
                    parts.append(prefix + pack(value))
                    continue
                except OverflowError:  # beyond float32: stored as inf, like TensorBoard's own writer
                    self._overflow(key, float(value))
                    parts.append(prefix + pack(math.copysign(math.inf, value)))
                    continue
            if isinstance(value, str):  # a label: its bytes are built once per (key, label)
                text = self._texts.get((key, value))
                if text is None:
                    text = self._first_value(key, value, keys)
                    if key in self._described:
                        self._texts[(key, value)] = self._first_value(key, value, keys)
                parts.append(text)
                continue
            parts.append(self._first_value(key, value, keys))
        return b"".join(parts)

    def _first_value(self, key: str, value: Scalar, keys: Mapping[str, KeyInfo]) -> bytes:
        """A value through the proto classes (a label's text, a tag's first point with its
        description), as the bytes of one ``Summary.value`` entry; remembers the tag's prefix."""
        tb = self._tb
        if isinstance(value, str):
            v = self._text_value(key, value, _description(key, keys))
        else:
            number = float(value)
            if math.isfinite(number) and abs(number) >= _F32_OVERFLOW:
                self._overflow(key, number)
                number = math.copysign(math.inf, number)
            v = tb.summary_pb2.Summary.Value(tag=key, simple_value=number)
            if key in self._chartable and key not in self._charted:
                self._charted.add(key)
                self._layout_stale = True
            if key not in self._described:
                self._described.add(key)
                v.metadata.CopyFrom(tb.scalar_metadata.create_summary_metadata("", _description(key, keys)))
            tag = key.encode("utf-8")
            field = b"\x0a" + _varint(len(tag)) + tag
            self._prefix[key] = b"\x0a" + _varint(len(field) + 5) + field + b"\x15"
        data: bytes = v.SerializeToString()
        return b"\x0a" + _varint(len(data)) + data

    def _overflow(self, key: str, number: float) -> None:
        if key in self._overflow_warned:
            return
        self._overflow_warned.add(key)
        warn(
            f"tensorboard: {key} = {number!r} is beyond float32's range and is stored as "
            f"{'-' if number < 0 else ''}inf (TensorBoard scalars are float32); the journal "
            "keeps the value",
            stacklevel=4,
        )

    def end_batch(self) -> None:
        """The publisher's batch ends: flush once (a follower's batch is many frames)."""
        if self._writer is not None and self._unflushed:
            self._writer.flush()
            self._unflushed = 0

    def close(self, *, failed: bool = False, killed: bool = False, interrupted: bool = False,
              reason: str = "") -> None:
        """Close the files and write the hparams session: status success, or failure when the run
        failed, was interrupted or was killed (a run that never closed; the hparam
        ``posttrain_metrics/status`` tells which: ``finished``, ``failed``, ``interrupted`` or
        ``killed``). A ``reason`` (why it failed or was interrupted) is the text ``posttrain_metrics/end``
        at the last step and the hparam ``posttrain_metrics/end_reason``."""
        writer, self._writer = self._writer, None
        if writer is None:
            return
        status = "killed" if killed else "interrupted" if interrupted else "failed" if failed else "finished"
        if reason:
            text = self._text_value(END_TAG, f"{status}: {reason}", "How the run ended, and why")
            writer.add_event(self._event(self._last_step, time.time(), [text]))
        writer.close()  # the steps first, whatever happens next
        if self.hparams and self._run is not None and self._summary is not None and self.path is not None:
            self._write_hparams(self._run, self._summary, self.path, status, reason)

    # -- the publisher process ---------------------------------------------------------------------

    def held_points(self, run_id: str, name: str, keys: Iterable[str]) -> Any:
        """The (tag, step) points the log dir already holds (read back with ``EventAccumulator``)."""
        return tensorboard_points(self.resolve(name, run_id))

    def run_handles(self) -> dict[str, Any]:
        return {"log_dir": str(self.path.resolve()) if self.path is not None else None}

    # -- helpers ----------------------------------------------------------------------------------

    def _event(self, step: int, wall_time: float, values: Sequence[Any]) -> Any:
        tb = self._tb
        return tb.event_pb2.Event(wall_time=wall_time, step=step, summary=tb.summary_pb2.Summary(value=values))

    def _string_tensor(self, data: bytes) -> Any:
        tb = self._tb
        return tb.tensor_pb2.TensorProto(dtype=tb.types_pb2.DT_STRING, string_val=[data])

    def _text_value(self, tag: str, text: str, description: str) -> Any:
        tb = self._tb
        value = tb.summary_pb2.Summary.Value(tag=tag, tensor=self._string_tensor(text.encode("utf-8")))
        if tag not in self._described:  # readers keep the first metadata of a tag
            self._described.add(tag)
            value.metadata.CopyFrom(tb.text_metadata.create_summary_metadata(None, description))
        return value

    def _layout_value(self, categories: Sequence[Category]) -> Any:
        tb = self._tb
        pb = tb.layout_pb2
        layout = pb.Layout()
        for category in categories:
            cat = layout.category.add(title=category.title, closed=category.closed)
            for chart in category.charts:
                if chart.bands:
                    series = [pb.MarginChartContent.Series(value=v, lower=lo, upper=hi) for v, lo, hi in chart.bands]
                    cat.chart.add(title=chart.title, margin=pb.MarginChartContent(series=series))
                else:
                    cat.chart.add(title=chart.title, multiline=pb.MultilineChartContent(tag=list(chart.tags)))
        return tb.summary_pb2.Summary.Value(
            tag=tb.layout_metadata.CONFIG_SUMMARY_TAG,
            metadata=tb.layout_metadata.create_summary_metadata(),
            tensor=self._string_tensor(layout.SerializeToString()),
        )

    def _write_hparams(self, run: RunInfo, summary: RunSummary, path: Path, status: str, reason: str) -> None:
        tb = self._tb
        hparams: dict[str, Scalar] = dict(run.config)
        hparams.setdefault("adapters", ",".join(run.adapters))
        hparams[STATUS_HPARAM] = status
        if reason:
            hparams[REASON_HPARAM] = reason
        # the session's group is named after the run (its directory: name and id)
        session_start = tb.hparams_summary.hparams_pb(hparams, trial_id=path.name, start_time_secs=run.started)
        aggregates = [
            tb.summary_pb2.Summary.Value(tag=f"{AGGREGATE_PREFIX}{key}", simple_value=float(value))
            for key, value in summary.values().items()
            if not isinstance(value, str)
        ]
        api = tb.api_pb2
        end_info = tb.plugin_data_pb2.SessionEndInfo(
            status=api.STATUS_SUCCESS if status == "finished" else api.STATUS_FAILURE, end_time_secs=time.time()
        )
        session_end = tb.summary_pb2.Summary.Value(
            tag=tb.hparams_metadata.SESSION_END_INFO_TAG,
            metadata=tb.hparams_metadata.create_summary_metadata(
                tb.plugin_data_pb2.HParamsPluginData(session_end_info=end_info)
            ),
            tensor=tb.hparams_metadata.NULL_TENSOR,
        )
        writer = _EventFile(path / HPARAMS_DIR, tb)
        try:
            now = time.time()
            writer.add_event(self._event(0, run.started, list(session_start.value)))
            writer.add_event(self._event(self._last_step, now, aggregates))
            writer.add_event(self._event(self._last_step, now, [session_end]))
        finally:
            writer.close()


def tensorboard_points(log_dir: Path) -> Points:
    points: Points = collections.Counter()
    if not log_dir.is_dir() or not any(log_dir.glob("events.out.tfevents.*")):
        return points
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    for tag in events.Tags()["scalars"]:
        points.update((tag, e.step) for e in events.Scalars(tag))
    return points
