"""The one exception type producers and users see, and where our warnings point."""

from __future__ import annotations

import os
import sys
import threading
import types

__all__ = ["MetricsError", "user_stacklevel"]

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def user_stacklevel() -> int:
    """The ``stacklevel`` for the caller's ``warnings.warn`` that names the first frame outside this
    package: the user's line (``cb.on_window_end(8)``), not ``publisher.py``, however many of our
    frames sit between (a callback, the publisher). 1 (the caller) when no user code called us: every
    frame is ours, or what lies beyond is the interpreter's (``python -m``'s runpy, a thread's start)."""
    frame: types.FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    if frame is None or frame.f_code.co_filename.startswith("<frozen ") or frame.f_code.co_filename == threading.__file__:
        return 1
    return level


class MetricsError(ValueError):
    """A producer bug or bad input: a bad declaration, an unknown key, a bad value, ranks that disagree.

    Messages say which key, what was received and how to fix it. In a distributed run the error is
    raised on every rank after the step's collectives, never on one rank alone (which would hang the
    others).
    """
