"""A set of sinks written together under one policy: what both sides of publication hand frames to.

The trainer's :class:`~posttrain_metrics.publication.Publisher` holds one for the sinks it writes
itself (the journal first, the console); each :class:`~posttrain_metrics.publication.replica.Replica`
of the publisher holds one for its tracker. The policy, in one place:

- a frame is normalised once for the trackers (:func:`~.display.display_frame`: label indicators,
  bools as 0/1); the journal gets it exactly as reduced, a ``raw_frames`` sink (the console) too;
- non-finite values a backend cannot store faithfully (outside its ``stores_nonfinite``) are removed
  for that backend and counted under ``health/nonfinite/<key>``, logged once per key;
- a frame with no metrics (an empty window) goes to the journal only;
- a sink that raises is counted in ``failures``, logged once, and never stops training or the
  other sinks; a sink whose ``start`` failed is ``unstarted`` and skipped (the journal has its frames).
  Two errors do stop: a requested backend that is not installed (``ImportError`` at ``start``), and
  the journal refusing the run (``MetricsError`` at its ``start``).

What is logged goes to the ``posttrain_metrics.publication`` logger (:mod:`~posttrain_metrics.core.log`):
an operational message, not a misuse to fix.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from ..core.errors import MetricsError
from ..core.extra import UserKeys
from ..core.extra import declarations as user_keys
from ..core.frame import Frame
from ..core.keys import KeyInfo
from ..core.log import get_logger
from ..core.redact import config_tree, flatten_config, redact_text
from ..core.values import Scalar
from ..integrations.base import RunInfo, Sink, as_sink, end_keywords, tracker_settings
from ..journal import MAX_HEADER_DEPTH, SAFE_RUN_ID, nesting
from .display import display_frame, nonfinite_kind

__all__ = ["SinkSet", "checked_run_id", "run_info", "run_name"]

log = get_logger("publication")


def checked_run_id(run_id: str | None) -> str:
    """``run_id`` when it is safe to name files and tracker runs with; a fresh one when ``None``."""
    if run_id is not None and not (isinstance(run_id, str) and SAFE_RUN_ID.fullmatch(run_id)):
        raise MetricsError(
            f"run_id {run_id!r:.80} is not a safe run id (it names files and tracker runs); fix: use "
            "1-128 letters, digits, '_', '-' or '.', not starting with '.' or '-'"
        )
    return run_id or uuid.uuid4().hex[:16]


def run_name(name: str | None) -> str:
    """The run's name, redacted once here (it becomes a folder, a console line and every tracker's run
    name); ``run-<date>-<time>`` when none is given."""
    return redact_text(name) if name else f"run-{time.strftime('%Y%m%d-%H%M%S')}"


def run_info(*, run_id: str, name: str, adapters: Sequence[Any], keys: Mapping[str, KeyInfo],
             config: Mapping[str, Any] | None, sinks: Sequence[Sink], started: float | None = None,
             declarations: Mapping[str, Mapping[str, Any]] | None = None) -> RunInfo:
    """What every sink learns at the run's start: the config flattened and redacted, the keys, the
    trackers' resolved settings, the user's own keys and every adapter's ``declarations`` (the
    journal header carries them: any reader rebuilds the run without importing the user's code)."""
    if config and nesting(config) >= MAX_HEADER_DEPTH:  # the header holds it one level down
        raise MetricsError(
            f"the run's config nests {nesting(config)} levels deep; a journal header holds at most "
            f"{MAX_HEADER_DEPTH - 1} (readers refuse a deeper one as damaged); fix: flatten the config"
        )
    return RunInfo(
        run_id=run_id,
        name=name,
        config=flatten_config(config or {}),
        config_tree=config_tree(config), trackers=tracker_settings(sinks),
        keys=keys,
        adapters=tuple(a.name for a in adapters if not isinstance(a, UserKeys)),
        started=started if started is not None else time.time(),
        extra=user_keys(adapters),  # the journal header carries them: readers rebuild them
        declarations=dict(declarations or {}),
    )


class SinkSet:
    """``sinks`` written together under the policy of the module docstring; ``keys`` describes every
    key the run can publish (for the label indicators)."""

    def __init__(self, sinks: Sequence[Sink], keys: Mapping[str, KeyInfo]) -> None:
        self.sinks = [as_sink(s) for s in sinks]
        self.keys = keys
        self.run: RunInfo | None = None
        self.failures: dict[str, int] = {}
        self.unstarted: set[str] = set()  # sinks whose start() failed: skipped, the journal has all
        self._nonfinite: dict[tuple[str, str], int] = {}

    def start(self, run: RunInfo) -> None:
        """Start every sink with ``run``; one that fails is ``unstarted`` (logged once). A requested
        backend that is not installed, or the journal refusing the run, raises (nothing to close)."""
        self.run = run
        for sink in self.sinks:
            try:
                if not self.call(sink, "start", run):
                    self.unstarted.add(sink.name)  # logged once; its frames stay in the journal
            except MetricsError:  # the journal refused the run (see call): nothing started, nothing to close
                self.run = None
                raise

    def write(self, frame: Frame) -> None:
        """``frame`` to every started sink: the journal as reduced, the others as trackers show it."""
        shown: Frame | None = None
        for sink in self.sinks:
            if sink.name in self.unstarted:
                continue
            if sink.name == "journal":
                self.call(sink, "write", frame)
                continue
            if not frame.metrics:
                continue
            if sink.raw_frames:  # the console: labels as text, no indicator series
                self.call(sink, "write", self._for(sink, frame))
                continue
            if shown is None:
                shown = display_frame(frame, self.keys)
            self.call(sink, "write", self._for(sink, shown))

    def close(self, status: str, reason: str = "") -> None:
        """Close every started sink with the run's end (see :meth:`close_sink`)."""
        for sink in self.sinks:
            if sink.name not in self.unstarted:
                self.close_sink(sink, status, reason)

    def _for(self, sink: Sink, frame: Frame) -> Frame:
        stores = sink.stores_nonfinite
        if "nan" in stores and "inf" in stores:
            return frame  # stores every value as it is (the frame is never mutated)
        metrics: dict[str, Scalar] = {}
        for key, value in frame.metrics.items():
            if type(value) is not float or value - value == 0.0:  # only a float can be NaN or infinite
                metrics[key] = value
                continue
            kind = nonfinite_kind(value)
            if kind is None or kind in stores:
                metrics[key] = value
                continue
            counter = (sink.name, key)
            if counter not in self._nonfinite:
                log.warning(
                    f"{sink.name}: {key} = {value} cannot be stored faithfully by this backend; "
                    f"skipped and counted under health/nonfinite/{key} (the journal keeps the value)",
                )
            self._nonfinite[counter] = self._nonfinite.get(counter, 0) + 1
            metrics[f"health/nonfinite/{key}"] = self._nonfinite[counter]
        return Frame(frame.step, metrics, frame.phase, frame.wall_time)

    def close_sink(self, sink: Sink, status: str, reason: str) -> None:
        """``sink.close`` with the run's end ``status`` (one of ``finished``, ``failed``, ``interrupted``,
        ``killed``): ``failed`` for any end but ``finished``, and ``killed`` or ``interrupted`` saying which
        (:meth:`Sink.close <posttrain_metrics.integrations.base.Sink.close>`), each as far as its ``close``
        takes it (:func:`~posttrain_metrics.integrations.base.end_keywords`)."""
        self.call(sink, "close", **end_keywords(sink.close, failed=status != "finished", killed=status == "killed",
                                                interrupted=status == "interrupted", reason=reason))

    def call(self, sink: Sink, method: str, *args: Any, **kwargs: Any) -> bool:
        """``sink.<method>(...)`` with this set's failure policy (logged once, never raised); whether
        it succeeded."""
        try:
            getattr(sink, method)(*args, **kwargs)
            return True
        except ImportError:
            if method == "start":
                raise  # a requested backend that is not installed is an error, never a silent degrade
            return self._failed(sink, method, sys.exc_info()[1])
        except MetricsError:
            if method == "start" and sink.name == "journal":
                raise  # the run is refused: another live run holds its journal, or a path of it leaves out_dir
            return self._failed(sink, method, sys.exc_info()[1])
        except Exception as exc:  # a tracker's failure never stops training
            return self._failed(sink, method, exc)

    def _failed(self, sink: Sink, method: str, exc: BaseException | None) -> bool:
        n = self.failures.get(sink.name, 0)
        self.failures[sink.name] = n + 1
        if n == 0:
            where = (
                "the journal itself failed: fix its path or disk, or every frame is lost"
                if sink.name == "journal"
                else "the journal keeps every frame for `posttrain-metrics export`"
            )
            log.warning(
                f"sink {sink.name!r} failed in {method}() and is degraded: {type(exc).__name__}: "
                f"{redact_text(str(exc))}. "
                f"Training continues; {where}.",
            )
        return False
