"""One headline line per step on the console: the keys the catalogue marks as headline."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from ..core.catalog.trainer import COUNTED_OUTCOMES, update_count_leaf
from ..core.errors import MetricsError
from ..core.frame import Frame
from ..core.keys import KeyInfo, headline_keys
from ..core.printable import printable
from ..core.values import Scalar
from .base import RunInfo, Sink
from .views import closing_links

__all__ = ["ConsoleSink", "check_total_steps", "format_eta", "update_counts"]

OUTCOME_KEY = "optim/update_outcome"


def _fmt(value: Scalar) -> str:
    if isinstance(value, (bool, int, str)):
        return str(value)
    return f"{value:.4g}" if math.isfinite(value) else str(value)


def _label_text(metrics: Mapping[str, Scalar], key: str, value: str) -> str | None:
    """What a line says of a label, or None when there is nothing to say: the optimizer outcome as the
    window's updates by outcome when one was not applied (or its label alone when the producer reports
    no counts); any other label when it is not ``applied``."""
    counts = update_counts(metrics) if key == OUTCOME_KEY else None
    if counts is not None:
        if any(n for o, n in counts.items() if o != "applied"):
            return "updates " + ", ".join(f"{o} {n}" for o, n in counts.items() if n)
        return None
    return None if value == "applied" else f"{key.rsplit('/', 1)[-1]} {value.upper()}"


def _positive(value: object) -> bool:
    """A ``headline_if`` gate is open: a number above zero."""
    return isinstance(value, (int, float)) and value > 0


def format_eta(seconds: float) -> str:
    """``45s``, ``12m05s``, ``3h07m``: short enough for a console line.

    >>> format_eta(72), format_eta(3 * 3600 + 7 * 60 + 59)
    ('1m12s', '3h07m')
    """
    s = max(0, round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def update_counts(metrics: Mapping[str, Scalar]) -> dict[str, int] | None:
    """The window's updates by outcome (``{"applied": 1, "skipped": 1}``), from the trainer's
    ``optim/updates_<outcome>`` counts; ``None`` when the producer reports none."""
    counts = {o: metrics.get(f"optim/{update_count_leaf(o)}") for o in COUNTED_OUTCOMES}
    if all(n is None for n in counts.values()):
        return None
    return {o: int(n) for o, n in counts.items() if isinstance(n, (int, float)) and math.isfinite(n)}


def check_total_steps(total_steps: object) -> int | None:
    """``total_steps`` as given, or a ``MetricsError`` naming what was received and the fix."""
    if total_steps is None:
        return None
    if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
        raise MetricsError(
            f"total_steps={total_steps!r} ({type(total_steps).__name__}); fix: pass the number of optimizer "
            "steps of the run as a whole number >= 1, or None when it is not known"
        )
    return total_steps


class ConsoleSink(Sink):
    """Prints ``12:04:31 train step 8/80 | loss_avg 0.1234 | ... | eta 1m12s`` for the headline keys.

    Headline keys are declared in the catalogue (``Metric(headline=True)``, with ``headline_if``
    for keys shown only when another is positive, such as ``kl_mean`` when ``kl_beta > 0``), so
    a user's own adapter gets its own line. ``keys`` overrides the choice. The line starts with the
    local time the window closed. When the run's length is known (``total_steps``, set by the
    callback from its own option or the trainer's ``max_steps``) the step reads ``step/total`` and
    the line ends with an ETA (from the time per step since the first train step shown).

    The optimizer outcome is shown only when an update was not applied: as the window's counts by
    outcome (``updates applied 1, skipped 1``) when the trainer reports them (several updates per
    window, ``n_mini > 1``), else as the last update's label (``update_outcome SKIPPED``).
    ``notes`` are printed after the run line at start and again at close (where the trackers'
    own logs go). Once the trackers are closed, the publisher hands over their names for the run and
    :meth:`show_links` prints the closing summary's links: each tracker opened on the headline keys
    (:func:`~posttrain_metrics.integrations.views.closing_links`).

    Train lines come at most every ``min_interval`` seconds (default 0.2 s; 0 prints every
    ``every``-th step): a run of 10 ms steps prints five lines a second, not a hundred, and the
    training thread formats one line in twenty (a line costs it ~0.1 ms with cold caches). A step
    whose update was not applied, whose headline holds a NaN or an infinity, or that is the run's
    last is always shown, and the last step not shown is printed at close. Validation lines are
    always shown. Every step is in the journal and the trackers whatever the console shows.
    """

    name = "console"
    stores_nonfinite = frozenset({"nan", "inf"})
    inline = True  # written on the training thread, never by the publisher process
    raw_frames = True  # takes frames as reduced: labels as text, flags as bools (no indicator series)

    def __init__(
        self,
        *,
        keys: Sequence[str] | None = None,
        every: int = 1,
        min_interval: float = 0.2,
        stream: TextIO | None = None,
        total_steps: int | None = None,
    ) -> None:
        self.keys = tuple(keys) if keys is not None else None
        self.every = max(1, int(every))
        if isinstance(min_interval, bool) or not isinstance(min_interval, (int, float)) or not (
            0 <= min_interval < math.inf
        ):
            raise MetricsError(
                f"console min_interval={min_interval!r} ({type(min_interval).__name__}); fix: pass the least "
                "number of seconds between two train lines, >= 0 (0 prints every step)"
            )
        self.min_interval = float(min_interval)
        self._shown_at = -math.inf  # wall time of the last train line printed
        self._held: Frame | None = None  # the last train frame not printed yet (shown at close)
        self.stream = stream
        self.total_steps = check_total_steps(total_steps)
        self.notes: list[str] = []
        self._catalog: dict[str, KeyInfo] = {}
        # The headline keys in catalogue order, each with the key that gates it (or None) and its
        # shown name: what ``headline_keys`` finds, worked out once per run instead of once per line.
        self._headline: list[tuple[str, str | None, str]] = []
        self._clock: tuple[int, str] = (-1, "")  # the last second shown, as text
        self._first: tuple[int, float] | None = None  # (step, time) of the first train line: the ETA's origin
        self._closed = False

    def add_note(self, note: str) -> None:
        """A line printed after the run line at start and again at close (once, however often given)."""
        if note not in self.notes:
            self.notes.append(note)

    def set_total_steps(self, total_steps: int | None) -> None:
        """The run's number of optimizer steps, once the trainer knows it (``None``: unknown)."""
        self.total_steps = check_total_steps(total_steps)

    def start(self, run: RunInfo) -> None:
        self._catalog = dict(run.keys)
        self._headline = [
            (key, f"{info.namespace}/{info.metric.headline_if}" if info.metric.headline_if else None,
             key.split("/", 1)[-1])
            for key, info in self._catalog.items() if info.metric.headline
        ]
        self._closed = False
        total = f", {self.total_steps} steps" if self.total_steps else ""
        self._print(f"run {run.name} ({run.run_id}): adapters {', '.join(run.adapters)}{total}")
        for note in self.notes:
            self._print(note)

    def line(self, frame: Frame) -> str:
        m = frame.metrics
        if self.keys is not None:
            keys = [k for k in self.keys if k in m]
        elif self._headline or not self._catalog:
            keys = [key for key, gate, _ in self._headline if key in m and (gate is None or _positive(m.get(gate)))]
        else:  # a catalogue handed in after start
            keys = headline_keys(self._catalog, m)
        when = frame.wall_time or time.time()
        total = self.total_steps
        step = f"{frame.step}/{total}" if total and frame.phase == "train" else str(frame.step)
        parts = [f"{self._time(when)} {frame.phase} step {step}"]
        for key in keys:
            value = m[key]
            if isinstance(value, str):
                said = _label_text(m, key, value)
                if said is not None:
                    parts.append(said)
                continue
            parts.append(f"{key.split('/', 1)[-1]} {_fmt(value)}")
        if frame.phase == "train":
            eta = self._eta(frame.step, when)
            if eta is not None:
                parts.append(f"eta {format_eta(eta)}")
        return " | ".join(parts)

    def _time(self, when: float) -> str:
        """``HH:MM:SS`` local time, formatted once per second."""
        second = int(when)
        if second != self._clock[0]:
            self._clock = (second, time.strftime("%H:%M:%S", time.localtime(when)))
        return self._clock[1]

    def _eta(self, step: int, when: float) -> float | None:
        if self._first is None:
            self._first = (step, when)
            return None
        first_step, first_time = self._first
        if not self.total_steps or step <= first_step:
            return None
        per_step = (when - first_time) / (step - first_step)
        return max(0, self.total_steps - step) * per_step

    def write(self, frame: Frame) -> None:
        if frame.phase != "train":
            self._print(self.line(frame))
            return
        when = frame.wall_time or time.time()
        if frame.step % self.every == 0:
            if when - self._shown_at >= self.min_interval or self._notable(frame):
                self._shown_at, self._held = when, None
                self._print(self.line(frame))
                return
            self._held = frame
        if self._first is None:
            self._first = (frame.step, when)

    def _notable(self, frame: Frame) -> bool:
        """A line shown whatever ``min_interval`` says: the run's last step, an update that was not
        applied, a headline value that is NaN or infinite."""
        m = frame.metrics
        if self.total_steps and frame.step >= self.total_steps:
            return True
        outcome = m.get(OUTCOME_KEY)
        if isinstance(outcome, str) and _label_text(m, OUTCOME_KEY, outcome) is not None:
            return True
        keys = self.keys if self.keys is not None else [key for key, _, _ in self._headline]
        return any(type(v) is float and v - v != 0.0 for v in map(m.get, keys))

    def close(self, *, failed: bool = False, killed: bool = False, interrupted: bool = False,
              reason: str = "") -> None:
        if self._closed:
            return
        self._closed = True
        held, self._held = self._held, None
        if held is not None:  # the run's last figures, whatever the interval
            self._print(self.line(held))
        for note in self.notes:
            self._print(note)

    def show_links(self, handles: Mapping[str, Mapping[str, Any]]) -> None:
        """The closing summary's last lines: the command and link that open each tracker of the run on
        its headline view (MLflow's experiment with its id and the shared view, TensorBoard's custom
        scalars, W&B's page or ``wandb sync``), from ``Publisher.run_handles()``; nothing when no
        tracker reported its names."""
        for line in closing_links(handles):
            self._print(line)

    def _print(self, text: str) -> None:
        # Run names, keys and labels may hold control characters (a replayed journal is anyone's
        # data): escaped, so that one printed line stays one line.
        stream = self.stream or sys.stdout
        stream.write(printable(text) + "\n")
        stream.flush()
