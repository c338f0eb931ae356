"""The one exception type producers and users see."""

from __future__ import annotations

__all__ = ["MetricsError"]


class MetricsError(ValueError):
    """A producer bug or bad input: a bad declaration, an unknown key, a bad value, ranks that disagree.

    Messages say which key, what was received and how to fix it. In a distributed run the error is
    raised on every rank after the step's collectives, never on one rank alone (which would hang the
    others).
    """
