"""Publication: the training thread writes the journal; the publisher feeds the trackers from it.

:class:`Publisher` is what a callback holds. In its default mode a publisher process
(:mod:`.process`, running :func:`.follower.follow`) tails the journal and feeds each tracker with
the code that ``posttrain-metrics export`` uses (:class:`.replica.Replica`).

Imports go one way: :mod:`.publisher` (the trainer side: mode, process, waiting at close) ->
:mod:`.follower` (the publisher's loop) -> :mod:`.replica` (one tracker fed from the journal) ->
:mod:`.dispatch` (a set of sinks under one failure policy) -> :mod:`.display` (how trackers show a
frame); :mod:`.status` is the publisher's status file, :mod:`.process` the publisher process.
"""

from __future__ import annotations

from .display import display_frame, nonfinite_kind
from .publisher import MODES, Publisher

__all__ = ["MODES", "Publisher", "display_frame", "nonfinite_kind"]
