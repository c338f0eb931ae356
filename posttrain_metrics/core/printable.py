"""Text from a journal made safe to print on a terminal.

A journal is data anyone can write: a run name, a key or a label may hold a newline, a carriage
return, an ANSI escape sequence or a Unicode direction override, which printed as they are would
forge report lines or rewrite the terminal. :func:`printable` escapes every control, format,
separator and surrogate character (Unicode categories Cc, Cf, Zl, Zp, Cs) the way Python's
``repr`` does (``\\x1b``, ``\\n``, ``\\u202e``), and leaves every other character as it is.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["printable"]

_SUSPECT = re.compile(r"[\x00-\x1f\x7f-\x9f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u180e\u200b-\u200f"
                      r"\u2028-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb\ud800-\udfff]|[^\x00-\u2fff]")
_ESCAPE = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


def _escape(match: re.Match[str]) -> str:
    char = match[0]
    if unicodedata.category(char) not in _ESCAPE:
        return char
    code = ord(char)
    if char in "\n\r\t":
        return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}[char]
    return f"\\x{code:02x}" if code < 0x100 else (f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")


def printable(text: str) -> str:
    """``text`` with control characters escaped: one line, as it will show.

    >>> printable("run\\x1b[2J\\nhealthy")
    'run\\\\x1b[2J\\\\nhealthy'
    """
    if text.isprintable():  # no control, format, separator or surrogate character: nothing to escape
        return text
    return _SUSPECT.sub(_escape, text)
