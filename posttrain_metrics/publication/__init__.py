"""Publication: the training thread writes the journal; the publisher feeds the trackers from it.

:class:`Publisher` is what a callback holds. In its default mode a publisher process
(:mod:`.process`, running :func:`.follower.follow`) tails the journal and feeds each tracker with
the code that ``posttrain-metrics export`` uses (:class:`.follower.Replica`).
"""

from __future__ import annotations

from .display import display_frame, nonfinite_kind
from .publisher import MODES, Publisher

__all__ = ["MODES", "Publisher", "display_frame", "nonfinite_kind"]
