"""Reading back what a TensorBoard log dir holds (with TensorBoard's own ``EventAccumulator``): the
publisher and ``export`` send a resumed run only the points it lacks."""

from __future__ import annotations

import collections
from pathlib import Path

from ..base import Points

__all__ = ["tensorboard_points"]


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
