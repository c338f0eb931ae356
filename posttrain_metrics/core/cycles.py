"""Walking a user's nested config without running into its cycles.

A run config is walked recursively (flattened, redacted, turned into plain containers). A config
that holds itself (a dataclass with a link to its parent, a dict or a list that contains itself)
would recurse until Python raises a bare ``RecursionError`` that names neither the config nor
where the loop is. :class:`Cycles` remembers the containers on the path being walked, so that
meeting one of them again is a :class:`MetricsError` naming both places; a sub-object shared by
two branches (not an ancestor of itself) is walked twice, as it should be.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .errors import MetricsError

__all__ = ["Cycles"]


class Cycles:
    """The containers on the current path of a walk, by identity, with the path where each one is.

    >>> guard = Cycles("the run config")
    >>> loop: dict[str, object] = {"a": 1}
    >>> loop["self"] = loop
    >>> with guard.inside(loop, ""):
    ...     with guard.inside(loop["self"], "self"):
    ...         pass
    Traceback (most recent call last):
    ...
    posttrain_metrics.core.errors.MetricsError: the run config holds itself: 'self' is the same object as '' (the top); fix: pass a tree (no parent links or self-references), e.g. drop the back link or give its name instead
    """

    def __init__(self, what: str) -> None:
        self.what = what
        self._active: dict[int, str] = {}

    @contextmanager
    def inside(self, value: Any, path: str) -> Iterator[None]:
        """Enter ``value`` (held at ``path``) for the time of the ``with`` block."""
        key = id(value)
        if key in self._active:
            where = self._active[key]
            raise MetricsError(
                f"{self.what} holds itself: {path!r} is the same object as {where!r}"
                f"{' (the top)' if not where else ''}; fix: pass a tree (no parent links or "
                "self-references), e.g. drop the back link or give its name instead")
        self._active[key] = path
        try:
            yield
        finally:
            del self._active[key]
