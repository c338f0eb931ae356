"""Operational messages: the ``posttrain_metrics`` logger and its children.

What happens to a run while it goes (a tracker degraded, a start retried, a publisher process that died
and was restarted, followers that lag behind the journal at close) is logged on a child of the
``posttrain_metrics`` logger (``posttrain_metrics.publication`` ...), so that an application filters and
routes it like its own logs. :func:`~posttrain_metrics.core.warn.warn` is kept for misuse a user must
fix. Messages are redacted on their way in (:func:`get_logger`), like warnings.

Until the application configures logging (no handler on the root logger), the package's records are
shown on stderr, one line each (``posttrain-metrics: warning: ...``), by :class:`ConsoleFallback`, so a
script that never heard of logging still sees a tracker go down. Once the root logger has a handler,
the fallback is silent and the records go where the application sends them.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

from .redact import redact_text

__all__ = ["LOGGER", "ConsoleFallback", "get_logger", "line"]

LOGGER = "posttrain_metrics"
"""The package's logger; each layer logs on a child (``posttrain_metrics.publication``)."""


def line(record: logging.LogRecord) -> str:
    """A record as one line: its level and message (``warning: sink 'mlflow' failed ...``)."""
    return f"{record.levelname.lower()}: {record.getMessage()}"


class ConsoleFallback(logging.Handler):
    """Writes the package's records to ``sys.stderr`` (looked up at each record: a redirected stream
    is followed) while the root logger has no handler: logging's own ``lastResort``, with the package's
    name and for every level the logger lets through."""

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers:
            return  # the application routes the records (they propagate to its handlers)
        try:
            sys.stderr.write(f"posttrain-metrics: {line(record)}\n")
            sys.stderr.flush()
        except Exception:
            self.handleError(record)


class _Redacted(logging.LoggerAdapter):  # type: ignore[type-arg]  # generic from Python 3.11 only
    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        return redact_text(str(msg)), kwargs


def get_logger(name: str) -> logging.LoggerAdapter:  # type: ignore[type-arg]
    """The logger ``posttrain_metrics.<name>``, every message redacted; installs the
    :class:`ConsoleFallback` on the package logger once."""
    package = logging.getLogger(LOGGER)
    if not any(isinstance(h, ConsoleFallback) for h in package.handlers):
        package.addHandler(ConsoleFallback())
    return _Redacted(logging.getLogger(f"{LOGGER}.{name}"), {})
