"""The sink contract: one base class, :class:`Sink`. Sinks know nothing about ranks.

Every sink (W&B, MLflow, TensorBoard, the console, the journal, the memory sink, yours) subclasses
:class:`Sink`: three methods are required (``start``, ``write``, ``close``), and every optional hook
the publisher calls has a default here that does nothing, so the publisher calls them plainly and
mypy checks each override against this signature (as Lightning's ``Logger`` and accelerate's
``GeneralTracker`` do). A plain object with ``name``, ``stores_nonfinite`` and the three methods
still works (:func:`as_sink` wraps it); one that also defines an optional hook must subclass
:class:`Sink`, or the hook would never be called.
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from ..core.errors import MetricsError
from ..core.frame import Frame
from ..core.keys import KeyInfo
from ..core.redact import redact_tree
from ..core.values import Scalar

__all__ = ["Points", "RunInfo", "Sink", "as_sink", "tracker_settings"]

Points = collections.Counter[tuple[str, int]]
"""What a tracker holds of a run: how many points of each (key, step)."""


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """What a sink learns when the run starts. ``config`` is flat (``a/b``) and already redacted;
    ``config_tree`` is the same config nested, lists and ``None`` kept (for trackers that show
    structure; the flat ``config`` when not given, as an old journal has it); ``keys`` describes
    every public key the run's adapters can publish; ``trackers`` holds each tracker sink's resolved
    settings (:func:`tracker_settings`: W&B's project and entity), recorded in the journal header;
    ``extra`` holds the user's own key declarations (:mod:`posttrain_metrics.core.extra`), which
    ``adapters`` does not name; ``declarations`` every named adapter's declarations (the journal header
    carries them: :mod:`posttrain_metrics.journal.declarations`)."""

    run_id: str
    name: str
    config: Mapping[str, Scalar]
    keys: Mapping[str, KeyInfo]
    adapters: tuple[str, ...]
    started: float
    config_tree: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    trackers: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.config_tree and self.config:
            object.__setattr__(self, "config_tree", dict(self.config))
    extra: Mapping[str, Mapping[str, object]] = dataclasses.field(default_factory=dict)
    declarations: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)


_S = TypeVar("_S", bound="Sink")


class Sink:
    """A backend. Subclass it and override ``start``, ``write`` and ``close``; override an optional
    hook only where the backend has something to do.

    ``write`` receives plain numbers and strings under flat ``/`` keys, with the sink's non-finite
    policy already applied: values outside ``stores_nonfinite`` (a subset of ``{"nan", "inf"}``) are
    removed upstream and counted under ``health/nonfinite/<key>``. Constructors do no I/O; ``start``
    does; ``close`` is idempotent.

    A sink keeps the keyword arguments it was built with (:attr:`options`, recorded before
    ``__init__`` runs). A class that names a :attr:`config_type` (a ``type`` of
    :func:`~posttrain_metrics.integrations.factory.build_sink`) is rebuilt from them in the publisher
    process (:meth:`to_config`); any other sink is fed by a thread of the training process.

    >>> class Printer(Sink):
    ...     name = "printer"
    ...     def start(self, run): pass
    ...     def write(self, frame): print(frame.step, dict(frame.metrics))
    ...     def close(self, *, failed=False, killed=False, interrupted=False, reason=""): pass
    >>> Printer().write(Frame(3, {"train/loss_avg": 0.5}))
    3 {'train/loss_avg': 0.5}
    """

    name: str = "sink"
    """Tells the sinks of a run apart (and names it in warnings); two sinks of a run never share one."""
    stores_nonfinite: frozenset[str] = frozenset()
    """Which non-finite values the backend stores faithfully: a subset of ``{"nan", "inf"}``."""
    inline: bool = False
    """Written on the training thread, never by a follower (the journal, the console)."""
    raw_frames: bool = False
    """Takes frames as reduced: labels as text, flags as bools, no indicator series (the console)."""
    config_type: ClassVar[str | None] = None
    """The factory ``type`` that rebuilds this sink from :attr:`options` in the publisher process."""
    path_options: ClassVar[tuple[str, ...]] = ()
    """Options that are paths: made absolute in :meth:`to_config` (the publisher may run elsewhere)."""
    rejected: int = 0
    """Batches the backend refused as invalid (not retried); ``export`` is incomplete while any are."""
    unconfirmed: int = 0
    """Frames the backend had not confirmed when the sink closed."""
    options: dict[str, Any]
    """The keyword arguments the sink was built with."""
    _positional: bool  # built with positional arguments too: not rebuilt from ``options``

    def __new__(cls: type[_S], *args: Any, **kwargs: Any) -> _S:
        sink = super().__new__(cls)
        sink.options = dict(kwargs)
        sink._positional = bool(args)
        return sink

    # -- required ------------------------------------------------------------------------------------

    def start(self, run: RunInfo) -> None:
        """Open the run in the backend (the first I/O)."""
        raise NotImplementedError(f"{type(self).__name__}.start")

    def write(self, frame: Frame) -> None:
        """One frame of the run."""
        raise NotImplementedError(f"{type(self).__name__}.write")

    def close(self, *, failed: bool = False, killed: bool = False, interrupted: bool = False,
              reason: str = "") -> None:
        """End the run: ``failed`` for any end but a finished run; ``killed`` (a run that never closed,
        replayed) or ``interrupted`` (Ctrl-C) say which, and ``reason`` why (the exception's type and
        message, redacted). Idempotent. An override that takes ``failed`` only (the first contract) is
        called with ``failed`` only (:func:`end_keywords`)."""
        raise NotImplementedError(f"{type(self).__name__}.close")

    # -- optional hooks: each default does nothing --------------------------------------------------

    def ready(self) -> bool:
        """Whether the sink takes more frames now; a replica stops reading the journal while it does
        not (MLflow's full backlog)."""
        return True

    def end_batch(self) -> None:
        """A batch of frames ends (one follower round): flush or send what ``write`` queued."""

    def write_samples(self, samples: Any) -> None:
        """A step's sample completions (:class:`~posttrain_metrics.core.samples.Samples`)."""

    def attach(self, files: Sequence[Path]) -> None:
        """The run's record (journal, config, doctor's report, dashboard), just before ``close``."""

    def held_points(self, run_id: str, name: str, keys: Iterable[str]) -> Points:
        """What the backend already holds of run ``run_id`` (before ``start``): a replica sends only
        the rest. Empty: the sink cannot be read back, and is sent every frame."""
        return collections.Counter()

    def run_handles(self) -> dict[str, Any]:
        """The backend's own names for the run once started (run id, URL, log dir); empty: none."""
        return {}

    def run_settings(self) -> dict[str, Any]:
        """Where the run goes, as resolved (W&B's project and entity), for the journal header; empty:
        nothing to record."""
        return {}

    def set_total_steps(self, total_steps: int | None) -> None:
        """The run's number of optimizer steps, once the trainer knows it (``None``: unknown)."""

    def add_note(self, note: str) -> None:
        """A line the sink may show at start and close (where the trackers' own logs go)."""

    def show_links(self, handles: Mapping[str, Any]) -> None:
        """At close, once every tracker is done: ``handles`` are the trackers' names for the run
        (:meth:`run_handles` of each); a sink that shows text (the console) prints what opens each."""

    def write_finding(self, event: Mapping[str, Any]) -> None:
        """A live-health finding (:mod:`posttrain_metrics.publication.health`) to show beside the
        run's metrics: ``check``, ``severity``, ``step``, ``explanation``, ``next_step``, ``action``."""

    # -- derived --------------------------------------------------------------------------------------

    @property
    def takes_samples(self) -> bool:
        """Whether ``write_samples`` is overridden: the samples file is read only for such a sink."""
        return type(self).write_samples is not Sink.write_samples

    @property
    def takes_files(self) -> bool:
        """Whether ``attach`` is overridden: the run's record is written only for such a sink."""
        return type(self).attach is not Sink.attach

    def to_config(self) -> dict[str, Any] | None:
        """This sink as a config the publisher process rebuilds it from: ``{"type": config_type,
        **options}`` with path options absolute (one left at its constructor's default included);
        ``None`` (it is fed in the training process) for a sink whose own class names no ``config_type``
        (a subclass of a tracker sink is not the class the factory builds) or that was given positional
        arguments."""
        if type(self).__dict__.get("config_type") is None or self._positional:
            return None
        config: dict[str, Any] = {"type": self.config_type, **self.options}
        for key in self.path_options:
            # A path left at the constructor's default (MLflow's ``runs``) is sent too: the factory's own
            # default for it (the working directory) would put the publisher's files elsewhere.
            value = config[key] if key in config else _default(type(self), key)
            if value is not None:
                config[key] = os.path.abspath(os.fspath(value))
        return config


def _default(cls: type, option: str) -> Any:
    """The default of ``cls``'s constructor option ``option``; ``None`` when it has none."""
    try:
        parameter = inspect.signature(cls).parameters.get(option)
    except (TypeError, ValueError):
        return None
    return None if parameter is None or parameter.default is parameter.empty else parameter.default


_END = ("killed", "interrupted", "reason")


def end_keywords(close: Any, *, failed: bool, killed: bool = False, interrupted: bool = False,
                 reason: str = "") -> dict[str, Any]:
    """The keywords to call ``close`` with for a run's end: ``failed`` always; ``killed``,
    ``interrupted`` and ``reason`` when set and ``close`` takes them. A close written to the first
    contract, ``close(*, failed=False)``, is still called (it gets the nearest end, failed)."""
    try:
        parameters = list(inspect.signature(close).parameters.values())
    except (TypeError, ValueError):
        parameters = []
    takes = set(_END) if any(p.kind is p.VAR_KEYWORD for p in parameters) else {p.name for p in parameters}
    given = {"killed": killed, "interrupted": interrupted, "reason": reason}
    return {"failed": failed, **{k: v for k, v in given.items() if v and k in takes}}


_HOOKS = ("ready", "end_batch", "write_samples", "attach", "held_points", "run_handles", "run_settings",
          "set_total_steps", "add_note", "show_links", "write_finding", "to_config", "inline", "raw_frames")


class _Plain(Sink):
    """A plain object that has the three methods, as a :class:`Sink` (see :func:`as_sink`)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = str(inner.name)
        self.stores_nonfinite = frozenset(inner.stores_nonfinite)

    def start(self, run: RunInfo) -> None:
        self.inner.start(run)

    def write(self, frame: Frame) -> None:
        self.inner.write(frame)

    def close(self, *, failed: bool = False, killed: bool = False, interrupted: bool = False,
              reason: str = "") -> None:
        self.inner.close(**end_keywords(self.inner.close, failed=failed, killed=killed, interrupted=interrupted,
                                        reason=reason))


def as_sink(obj: object) -> Sink:
    """``obj`` when it is a :class:`Sink`; a plain object with ``name``, ``stores_nonfinite``,
    ``start``, ``write`` and ``close`` wrapped as one; anything else, or a plain object that defines
    an optional hook (which only a subclass gets called), a :class:`MetricsError` with the fix."""
    if isinstance(obj, Sink):
        return obj
    kind = type(obj).__name__
    lacks = [a for a in ("name", "stores_nonfinite") if not hasattr(obj, a)] + [
        m for m in ("start", "write", "close") if not callable(getattr(obj, m, None))]
    if lacks:
        raise MetricsError(f"a sink must be a mapping such as {{'type': 'console'}} or a sink object, got "
                           f"{kind} {obj!r:.60} (it lacks {lacks}); fix: subclass "
                           "posttrain_metrics.integrations.Sink")
    hooks = [h for h in _HOOKS if hasattr(obj, h)]
    if hooks:
        raise MetricsError(f"sink {kind} defines {hooks} but does not subclass posttrain_metrics.integrations.Sink, "
                           f"so the publisher would never call them; fix: class {kind}(Sink)")
    return _Plain(obj)


def tracker_settings(sinks: Iterable[Sink]) -> dict[str, dict[str, Any]]:
    """``{sink name: settings}`` of the sinks that say where their run goes (``run_settings()``, such
    as W&B's project and entity), for the journal header: an export later finds the same place."""
    out: dict[str, dict[str, Any]] = {}
    for sink in sinks:
        settings = sink.run_settings()
        if settings:
            out[sink.name] = dict(redact_tree(dict(settings)))
    return out
