"""How trackers show a frame: each label of a categorical key as a 0/1 indicator series, bools as 0/1.

The journal keeps a frame exactly as reduced; every tracker sink but the console (``raw_frames``) gets
it through :func:`display_frame`, and a replica that asks what its tracker already holds probes the
same displayed keys.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from ..core.frame import Frame
from ..core.keys import KeyInfo, label_key
from ..core.values import Scalar

__all__ = ["display_frame", "nonfinite_kind"]


def nonfinite_kind(value: Scalar) -> str | None:
    """``"nan"``, ``"inf"`` or ``None`` for a finite value or a label."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else "inf"
    return None


def display_frame(frame: Frame, keys: Mapping[str, KeyInfo]) -> Frame:
    """The frame as trackers show it: label indicators added, bools as 0/1; nothing removed.

    Each label of a categorical key gets its 0/1 indicator right after the key (a value that is none
    of its labels: all 0), in the order the labels are declared. A frame's shape (its keys and the
    types of its values, the same step after step) is worked out once per ``keys`` mapping."""
    m = frame.metrics
    names = tuple(m)
    types = tuple(map(type, m.values()))
    shapes = _shapes(keys)
    shape = shapes.get(names)
    if shape is None or shape.types != types:
        shape = _Shape(names, types, keys)
        if len(shapes) < _MAX_SHAPES:  # frames of ever new key sets are worked out each time
            shapes[names] = shape
    return Frame(frame.step, shape.build(m), frame.phase, frame.wall_time)


class _Shape:
    """How frames with one set of keys and value types display: a template of the output keys in
    order (each label indicator right after its key), the keys of bools, the indicators per
    categorical key."""

    __slots__ = ("bools", "fallback", "labels", "template", "types")

    def __init__(self, names: tuple[str, ...], types: tuple[type, ...], keys: Mapping[str, KeyInfo]) -> None:
        self.types = types
        out: list[str] = []
        self.bools = [key for key, t in zip(names, types) if issubclass(t, bool)]
        self.labels: list[tuple[str, tuple[tuple[str, str], ...]]] = []
        for key, t in zip(names, types):
            out.append(key)
            info = keys.get(key)
            if issubclass(t, str) and info is not None and info.metric.labels:
                indicators = tuple((label_key(key, label), label) for label in info.metric.labels)
                self.labels.append((key, indicators))
                out.extend(name for name, _ in indicators)
        self.template: dict[str, Scalar | None] = dict.fromkeys(out)
        # A frame key named like an indicator (a user's "optim/update_outcome/skipped"): whichever of
        # the two comes later in the frame wins, value by value, as a dict built in order gives.
        self.fallback = keys if len(self.template) < len(out) else None

    def build(self, m: Mapping[str, Scalar]) -> dict[str, Scalar]:
        if self.fallback is not None:
            return _displayed(m, self.fallback)
        out = self.template.copy()  # the keys in order
        out.update(m)
        for key in self.bools:
            out[key] = int(m[key])
        for key, indicators in self.labels:
            value = m[key]
            for name, label in indicators:
                out[name] = int(value == label)
        return out  # type: ignore[return-value]  # every key of the template is set


def _displayed(m: Mapping[str, Scalar], keys: Mapping[str, KeyInfo]) -> dict[str, Scalar]:
    """The rule itself, value by value (what the shapes build, for the frames they cannot)."""
    out: dict[str, Scalar] = {}
    for key, value in m.items():
        if isinstance(value, bool):
            out[key] = int(value)
            continue
        out[key] = value
        info = keys.get(key)
        if isinstance(value, str) and info is not None:
            for label in info.metric.labels:
                out[label_key(key, label)] = int(value == label)
    return out


_MAX_SHAPES = 256
_SHAPES: dict[int, tuple[Mapping[str, KeyInfo], dict[tuple[str, ...], _Shape]]] = {}


def _shapes(keys: Mapping[str, KeyInfo]) -> dict[tuple[str, ...], _Shape]:
    """The shapes worked out for this ``keys`` mapping (the mapping itself is held, so its id is not
    reused by another while cached; a few per process: one per publisher's catalogue)."""
    entry = _SHAPES.get(id(keys))
    if entry is None or entry[0] is not keys:
        if len(_SHAPES) >= 64:
            _SHAPES.clear()
        entry = _SHAPES[id(keys)] = (keys, {})
    return entry[1]
