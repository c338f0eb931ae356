"""The one door our warnings leave by: redacted on the way out.

A warning's text is built from whatever was at hand (a tracker's exception, a tracking URI, a path),
and it is shown on the trainer's stderr and kept in ``publisher.log``. Every warning of the package
goes through :func:`warn`, so a new call site cannot forget the redaction (a test checks that no
module calls ``warnings.warn`` itself).
"""

from __future__ import annotations

import warnings

from .redact import redact_text

__all__ = ["warn"]


def warn(message: str, category: type[Warning] = UserWarning, stacklevel: int = 1) -> None:
    """``warnings.warn`` with every secret in ``message`` redacted; ``stacklevel`` counts from the
    caller, as it does for ``warnings.warn``."""
    warnings.warn(redact_text(str(message)), category, stacklevel=stacklevel + 1)
