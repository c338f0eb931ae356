"""Flattening a run config and taking the secrets out of it before any sink sees it.

Two nets. By key: a value whose key names a credential (``api_key``, ``hfToken``, ``db/password``,
``Authorization``) is replaced whole. By value: wherever a string holds a secret in a recognisable
form (a provider token such as ``hf_...`` or ``sk-...``, a JWT, the password of a
``user:password@`` URI, a ``token=`` query parameter, ``HF_TOKEN=...`` or ``--api-key ...`` in a
command line), that part is replaced. Words that only look like secrets stay readable:
``max_tokens``, ``eos_token``, ``pad_token_id``, ``tokenizer``, ``sort_key``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any

from .values import Scalar

__all__ = ["REDACTED", "flatten_config", "is_secret_key", "redact", "redact_text"]

REDACTED = "***REDACTED***"

_ALWAYS = frozenset({"password", "passwd", "pwd", "secret", "secrets", "authorization", "credential",
                     "credentials", "bearer", "cookie", "apikey", "passphrase"})
# "token" is a credential unless it is a vocabulary token or a token count.
_NOT_A_CREDENTIAL_TOKEN = frozenset({"eos", "bos", "pad", "unk", "sep", "cls", "mask", "id", "ids", "level",
                                     "type", "types", "count", "counts", "len", "length", "max", "min",
                                     "num", "per", "special", "budget", "limit", "weight", "start", "end"})
# "key" is a credential only next to one of these (not a sort key or a dataset column).
_KEY_QUALIFIERS = frozenset({"api", "secret", "access", "private", "auth", "encryption", "ssh", "signing",
                             "master", "client", "wandb", "hf", "openai", "anthropic", "aws", "gcp", "azure",
                             "github", "gh", "mlflow", "license", "service", "account"})

_TOKEN_SHAPES = (
    r"hf_[A-Za-z0-9]{20,}", r"sk-[A-Za-z0-9_-]{20,}", r"gh[pousr]_[A-Za-z0-9]{20,}", r"AKIA[0-9A-Z]{16}",
    r"xox[abprs]-[A-Za-z0-9-]{10,}", r"eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}",
)
_SECRET_VALUE = re.compile(r"(?<![A-Za-z0-9])(?:" + "|".join(_TOKEN_SHAPES) + r")")
_AUTH_SCHEME = re.compile(r"\b(Bearer|Basic|Token)\s+\S{8,}")
# scheme://user:password@host -- the password may hold '/' or '@': it runs to the last '@'.
_URI_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/@:\s]*):(?P<pw>\S+)@(?=[^@\s/]+)")
_QUERY = re.compile(r"(?P<head>[?&;](?:[A-Za-z0-9_-]*?(?:token|key|secret|password|signature|sig|auth)"
                    r"[A-Za-z0-9_-]*)=)[^&;#\s]+", re.IGNORECASE)
_ASSIGN = re.compile(r"(?P<head>\b(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)[=:]\s*)(?P<value>[^\s,;&]+)")
_FLAG = re.compile(r"(?P<head>--(?P<name>[A-Za-z][A-Za-z0-9_-]*)(?:=|\s+))(?P<value>[^\s-][^\s]*)")


def _words(key: str) -> list[str]:
    parts = re.split(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])", key)
    return [w.lower() for w in parts if w]


def is_secret_key(key: str) -> bool:
    """Whether a config key (any part of its path) names a credential: ``api_key``, ``hfToken``,
    ``db/password``, ``Authorization``; not ``max_tokens``, ``eos_token`` or ``sort_key``."""
    words = _words(key)
    last = key.rsplit("/", 1)[-1]
    leaf = set(_words(last))
    if set(words) & _ALWAYS:
        return True
    if ("token" in leaf or ("tokens" in leaf and "access" in leaf)) and not leaf & _NOT_A_CREDENTIAL_TOKEN:
        return True
    if "key" in leaf and (leaf & _KEY_QUALIFIERS or last.lower() == "key"):
        return True
    return "auth" in leaf


def redact_text(text: str) -> str:
    """``text`` with every secret in a recognisable form replaced by :data:`REDACTED`."""
    text = _SECRET_VALUE.sub(REDACTED, text)
    text = _AUTH_SCHEME.sub(lambda m: f"{m[1]} {REDACTED}", text)
    text = _URI_PASSWORD.sub(lambda m: f"{m['head']}:{REDACTED}@", text)
    text = _QUERY.sub(lambda m: m["head"] + REDACTED, text)
    text = _ASSIGN.sub(lambda m: m["head"] + REDACTED if is_secret_key(m["name"]) else m[0], text)
    return _FLAG.sub(lambda m: m["head"] + REDACTED if is_secret_key(m["name"]) else m[0], text)


def redact(key: str, value: Scalar) -> Scalar:
    """``value`` with any secret it holds replaced by :data:`REDACTED`."""
    empty = value is None or value == "" or value is False
    if is_secret_key(key) and not empty:
        return REDACTED
    return redact_text(value) if isinstance(value, str) else value


def _as_mapping(value: Any) -> Mapping[str, Any] | None:
    """Structured configs (dataclasses, argparse namespaces, pydantic models, namedtuples) as
    mappings, so that their fields are redacted by name like a dict's."""
    if isinstance(value, Mapping):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    for method in ("model_dump", "_asdict"):
        if callable(getattr(value, method, None)):
            out = getattr(value, method)()
            return out if isinstance(out, Mapping) else None
    if type(value).__name__ == "Namespace" and hasattr(value, "__dict__"):
        return dict(vars(value))
    return None


def flatten_config(config: Any, *, sep: str = "/") -> dict[str, Scalar]:
    """Nested mappings (and dataclasses, namespaces, pydantic models) and lists flattened to
    ``a/b/0`` keys, values made plain JSON-safe scalars (non-finite floats as ``"inf"``/``"nan"``),
    and redacted.

    >>> flatten_config({"rl": {"kl_beta": 0.1, "max_tokens": 64}, "wandb": {"api_key": "abc"}})
    {'rl/kl_beta': 0.1, 'rl/max_tokens': 64, 'wandb/api_key': '***REDACTED***'}
    """
    out: dict[str, Scalar] = {}

    def walk(prefix: str, value: Any) -> None:
        mapping = _as_mapping(value)
        if mapping is not None:
            if not mapping and prefix:
                out[prefix] = "{}"
            for k, v in mapping.items():
                walk(f"{prefix}{sep}{k}" if prefix else str(k), v)
        elif isinstance(value, (list, tuple)):
            if is_secret_key(prefix):
                out[prefix] = REDACTED
                return
            if not value:
                out[prefix] = "[]"
            for i, v in enumerate(value):
                walk(f"{prefix}{sep}{i}", v)
        elif isinstance(value, float) and not math.isfinite(value):
            out[prefix] = redact(prefix, str(value))  # strict JSON has no inf/nan; the text is exact
        elif value is None or isinstance(value, (bool, int, float, str)):
            out[prefix] = redact(prefix, "None" if value is None else value)
        else:
            out[prefix] = redact(prefix, str(value))

    walk("", config)
    return out
