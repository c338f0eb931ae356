"""Flattening a run config and taking the secrets out of it before any sink sees it."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .values import Scalar

__all__ = ["REDACTED", "flatten_config", "redact"]

REDACTED = "***REDACTED***"

_SECRET_WORDS = frozenset(
    {"token", "key", "apikey", "secret", "password", "passwd", "pwd", "authorization",
     "auth", "credential", "credentials", "bearer", "cookie", "private"}
)
# Values that are secrets whatever their key is called.
_SECRET_VALUE = re.compile(
    r"^(?:hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|AKIA[0-9A-Z]{16}"
    r"|xox[abprs]-[A-Za-z0-9-]{10,}|eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}"
    r"|(?:Bearer|Basic)\s+\S{8,}|[0-9a-f]{40})$"
)
_URI_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/@:\s]*):(?P<pw>[^/@\s]+)@")


def _words(key: str) -> set[str]:
    return {w for w in re.split(r"[^A-Za-z0-9]+|(?<=[a-z])(?=[A-Z])", key.lower()) if w}


def is_secret_key(key: str) -> bool:
    """Whether a config key (any part of its path) names a credential: ``api_key``, ``hf_token``,
    ``db/password``, ``Authorization``; not ``max_tokens`` or ``tokenizer``."""
    words = _words(key)
    return bool(words & _SECRET_WORDS) or ("api" in words and "key" in words)


def redact(key: str, value: Scalar) -> Scalar:
    """``value`` with any secret it holds replaced by :data:`REDACTED`."""
    if is_secret_key(key) and value not in (None, "", False):
        return REDACTED
    if isinstance(value, str):
        if _SECRET_VALUE.match(value.strip()):
            return REDACTED
        return _URI_PASSWORD.sub(lambda m: f"{m['head']}:{REDACTED}@", value)
    return value


def flatten_config(config: Mapping[str, Any], *, sep: str = "/") -> dict[str, Scalar]:
    """Nested mappings and lists flattened to ``a/b/0`` keys, values made plain and redacted.

    >>> flatten_config({"rl": {"kl_beta": 0.1, "max_tokens": 64}, "wandb": {"api_key": "abc"}})
    {'rl/kl_beta': 0.1, 'rl/max_tokens': 64, 'wandb/api_key': '***REDACTED***'}
    """
    out: dict[str, Scalar] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping):
            if not value and prefix:
                out[prefix] = "{}"
            for k, v in value.items():
                walk(f"{prefix}{sep}{k}" if prefix else str(k), v)
        elif isinstance(value, (list, tuple)):
            if is_secret_key(prefix):
                out[prefix] = REDACTED
                return
            if not value:
                out[prefix] = "[]"
            for i, v in enumerate(value):
                walk(f"{prefix}{sep}{i}", v)
        elif value is None or isinstance(value, (bool, int, float, str)):
            out[prefix] = redact(prefix, "None" if value is None else value)
        else:
            out[prefix] = redact(prefix, str(value))

    walk("", config)
    return out
