"""The one door our warnings leave by: redacted on the way out, shown as one line of ours.

A warning's text is built from whatever was at hand (a tracker's exception, a tracking URI, a path),
and it is shown on the trainer's stderr and kept in ``publisher.log``. Every warning of the package
goes through :func:`warn`, so a new call site cannot forget the redaction (a test checks that no
module calls ``warnings.warn`` itself).

**One line.** Python shows a warning as ``<file>:<line>: UserWarning: <message>`` followed by the
source line at that place: for a warning raised where no user code is on the stack (the publisher's
thread or process) that is one of our own lines (``publisher.py:507: UserWarning:`` then
``warn(``), which tells a user nothing. Ours are shown as ``posttrain-metrics: <message>``: their
category, :class:`PosttrainMetricsWarning`, is a ``UserWarning`` (``category=`` another warning
class gives a subclass of both), and ``warnings.formatwarning`` formats that category, and only
that one, as one line. Everything else about them is a plain warning: ``warnings.filterwarnings``
on ``UserWarning`` (or the given category), on the message or on the module still selects them,
``-W error`` raises them, and ``pytest.warns(UserWarning)`` catches them.
"""

from __future__ import annotations

import warnings
from typing import Any

from .redact import redact_text

__all__ = ["PREFIX", "PosttrainMetricsWarning", "one_line", "warn"]

PREFIX = "posttrain-metrics: "
"""What our warnings start with on the screen, in place of ``<file>:<line>: UserWarning:``."""


class PosttrainMetricsWarning(UserWarning):
    """The category of every warning of this package: a ``UserWarning``, so the filters that select
    those select ours; ``warnings.filterwarnings("ignore", category=PosttrainMetricsWarning)`` silences
    ours alone."""


_CATEGORIES: dict[type[Warning], type[PosttrainMetricsWarning]] = {UserWarning: PosttrainMetricsWarning}


def _ours(category: type[Warning]) -> type[PosttrainMetricsWarning]:
    """``category`` as one of ours: ``PosttrainMetricsWarning`` for ``UserWarning`` (and itself), else a
    subclass of both (``RuntimeWarning`` -> ``PosttrainMetricsRuntimeWarning``), made once: a filter
    or ``pytest.warns`` on the given category still matches."""
    if issubclass(category, PosttrainMetricsWarning):
        return category
    found = _CATEGORIES.get(category)
    if found is None:
        name = f"PosttrainMetrics{category.__name__}"
        found = _CATEGORIES[category] = type(name, (PosttrainMetricsWarning, category), {"__module__": __name__})
        globals().setdefault(name, found)  # found by its name, as a pickled class is
    return found


def one_line(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             line: str | None = None) -> str:
    """How a warning is shown (the signature of ``warnings.formatwarning``): ours as
    ``posttrain-metrics: <message>`` and a newline, any other as Python formats it.

    >>> one_line("mlflow: the server is down", PosttrainMetricsWarning, "publisher.py", 507)
    'posttrain-metrics: mlflow: the server is down\\n'
    """
    if isinstance(category, type) and issubclass(category, PosttrainMetricsWarning):
        return f"{PREFIX}{message}\n"
    return str(_formatwarning(message, category, filename, lineno, line))


def _install() -> None:
    """Put :func:`one_line` in front of the ``warnings.formatwarning`` in place (Python's, or one a
    program set before importing us, which still formats every other warning). Once per process: a
    reload of this module does not wrap it twice."""
    global _formatwarning
    current: Any = warnings.formatwarning
    previous = getattr(current, "_posttrain_metrics_wraps", None)
    _formatwarning = previous if previous is not None else current
    formatter: Any = one_line
    formatter._posttrain_metrics_wraps = _formatwarning
    warnings.formatwarning = formatter


_formatwarning: Any = warnings.formatwarning
_install()


def warn(message: str, category: type[Warning] = UserWarning, stacklevel: int = 1) -> None:
    """``warnings.warn`` with every secret in ``message`` redacted, as a :class:`PosttrainMetricsWarning`
    (of ``category`` too); ``stacklevel`` counts from the caller, as it does for ``warnings.warn``."""
    warnings.warn(redact_text(str(message)), _ours(category), stacklevel=stacklevel + 1)
