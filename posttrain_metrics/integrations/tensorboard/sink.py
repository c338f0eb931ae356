"""The TensorBoard sink: one run's event files, its custom-scalars layout and its hparams session
(what each shows: the package docstring)."""

from __future__ import annotations

import glob
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...core.errors import MetricsError
from ...core.frame import Frame
from ...core.keys import KeyInfo
from ...core.log import get_logger
from ...core.summary import RunSummary
from ...core.values import Scalar
from ..base import RunInfo, Sink
from ..factory import run_path, safe_name
from .events import _F, _MAX_ENCODINGS, _STEPS, _WALL, _Encoding, _EventFile, _import_tensorboard, _varint
from .layout import Category, dashboard_layout, written_layout
from .read import tensorboard_points
from .text import _config_table, _description, samples_markdown

__all__ = ["AGGREGATE_PREFIX", "CONFIG_TAG", "END_TAG", "HPARAMS_DIR", "REASON_HPARAM", "STATUS_HPARAM",
           "TensorBoardSink"]

log = get_logger("integrations.tensorboard")  # a value the format cannot hold is the run's, not a misuse

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


class TensorBoardSink(Sink):
    """Writes a run to TensorBoard event files under ``log_dir`` (see the package docstring).

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

    def write_finding(self, event: Mapping[str, Any]) -> None:
        """A live-health finding (:mod:`posttrain_metrics.publication.health`): the scalar ``health/<check>``
        (1 at the step it fired; 0 at the run's first step for a check that never fired, at the close) and,
        for a finding, a text entry ``health/<check>`` at that step."""
        if self._writer is None:
            return
        check, step = str(event["check"]), int(event["step"])
        summary = self._tb.summary_pb2
        found = event.get("kind") == "finding"
        values = [summary.Summary.Value(tag=f"health/{check}", simple_value=1.0 if found else 0.0)]
        if found:
            text = (f"**{check}** ({event['severity']}, action {event.get('action', 'warn')}) at step {step}"
                    f"{' (steps ' + str(event.get('step_ranges')) + ')' if event.get('step_ranges') else ''}\n\n"
                    f"{event['explanation']}\n\nNext: {event['next_step']}")
            values.append(self._text_value(f"health/{check}/finding", text, "A live-health finding"))
        self._writer.add_event(self._event(step, time.time(), values))
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
        log.warning(
            f"tensorboard: {key} = {number!r} is beyond float32's range and is stored as "
            f"{'-' if number < 0 else ''}inf (TensorBoard scalars are float32); the journal "
            "keeps the value"
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
