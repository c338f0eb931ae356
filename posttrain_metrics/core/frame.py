"""The reduced result of one optimizer window: what every sink receives."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from .values import Scalar

__all__ = ["Frame"]


@dataclasses.dataclass(frozen=True)
class Frame:
    """Global figures of one step, keyed by public key (``train/clip_frac``).

    ``metrics`` holds plain ``float``, ``int``, ``bool`` and ``str`` values; a key no rank reported
    is absent, never zero-filled. ``wall_time`` is seconds since the epoch when the window closed.
    """

    step: int
    metrics: Mapping[str, Scalar]
    phase: str = "train"
    wall_time: float = 0.0
