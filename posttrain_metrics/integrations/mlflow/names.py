"""What things are called in MLflow: the tags and settings this sink owns, and the mapping of a name
MLflow would reject to a valid one (:class:`_Names`: never dropped, warned about once)."""

from __future__ import annotations

import getpass
import hashlib
import re
from collections.abc import Mapping
from typing import Any

from ...core.warn import warn

__all__ = ["ADAPTERS_TAG", "DEFAULT_EXPERIMENT", "HTTP_BACKOFF_FACTOR", "HTTP_MAX_RETRIES", "HTTP_TIMEOUT",
           "INSTALL", "KIND", "KIND_TAG", "MLFLOW_USER_TAG", "REASON_TAG", "RUN_ID_TAG", "RUN_PREFIX",
           "STATUS_TAG"]

INSTALL = "pip install 'posttrain-metrics[mlflow]'"
DEFAULT_EXPERIMENT = "posttrain-metrics"
RUN_ID_TAG = "posttrain_metrics.run_id"
ADAPTERS_TAG = "posttrain_metrics.adapters"
STATUS_TAG = "posttrain_metrics.status"
"""``interrupted`` (Ctrl-C: MLflow's status says KILLED) or ``failed``, set when the run says why."""
REASON_TAG = "posttrain_metrics.end_reason"
"""Why the run failed or was interrupted: the exception's type and message, redacted."""
RUN_PREFIX = "run/"
"""The run aggregates are logged at close as ``run/<key>`` metrics."""
MLFLOW_USER_TAG = "mlflow.user"  # what MLflow's fluent API records as the run's user
# What MLflow 3's UI reads to choose an experiment's page: "custom_model_development" opens the runs
# table with metric charts; without it the UI may infer a GenAI experiment (traces, evaluations).
KIND_TAG = "mlflow.experimentKind"
KIND = "custom_model_development"

# MLflow's HTTP settings as (environment variable, our default): see the package docstring.
HTTP_MAX_RETRIES = ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", 2)
HTTP_TIMEOUT = ("MLFLOW_HTTP_REQUEST_TIMEOUT", 20)
HTTP_BACKOFF_FACTOR = ("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", 1)

# Characters kept when a name is mapped (a subset of what MLflow accepts on every OS).
_MAP_BAD = re.compile(r"[^/\w.\- ]")
_SAFE_ID = re.compile(r"^[A-Za-z0-9_.-]+$")


class _Names:
    """Maps names MLflow would reject to valid ones: computed once per name, warned once."""

    def __init__(self, kind: str, valid: Any, limit: int, reserved: Mapping[str, object]) -> None:
        self.kind = kind
        self.valid = valid
        self.limit = limit
        self.reserved = reserved  # names that must not be produced by a mapping (declared keys)
        self.names: dict[str, str] = {}
        self.mapped: dict[str, str] = {}  # mapped name -> original

    def __call__(self, name: str, *, report: bool = True) -> str:
        out = self.names.get(name)
        if out is not None:
            return out
        if self.valid(name) and len(name) <= self.limit:
            out = name
        else:
            out = self._map(name)
            if report:
                warn(
                    f"mlflow: {self.kind} name {name!r} is not a valid MLflow name (MLflow takes "
                    f"alphanumerics, '_', '-', '.', '/', spaces, no empty or dot path segments, at most "
                    f"{self.limit} characters); logged as {out!r}",
                    stacklevel=4,
                )
            self.mapped[out] = name
        self.names[name] = out
        return out

    def _map(self, name: str) -> str:
        digest = hashlib.sha1(name.encode("utf-8")).hexdigest()[:8]
        # Empty segments (a leading, trailing or doubled "/") go; "." and ".." segments become "_".
        parts = [p if p.strip(" ") not in (".", "..") else "_"
                 for p in _MAP_BAD.sub("_", name).split("/") if p.strip(" ")]
        out = "/".join(parts) or "_"
        if len(out) > self.limit or out in self.reserved or out in self.mapped or out in self.names:
            out = f"{out[: self.limit - 9].rstrip('/')}-{digest}"  # too long, or taken: made unique
        if not self.valid(out):
            out = f"key-{digest}"
        return out


def _truncate(text: str, limit: int, kind: str, key: str) -> str:
    """A param's or tag's value cut to MLflow's limit, with a warning (the journal keeps it whole)."""
    if len(text) <= limit:
        return text
    warn(
        f"mlflow: {kind} {key!r} is {len(text)} characters, over MLflow's limit of {limit}; "
        "truncated (the journal header keeps the full value)",
        stacklevel=3,
    )
    return text[:limit]


def _user() -> str:
    """The user creating the run, as MLflow's own ``start_run`` records it (``mlflow.user``)."""
    try:
        return getpass.getuser()
    except Exception:  # no login name (a container without passwd entry): MLflow records "unknown"
        return "unknown"


def _params(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings flattened to ``a/b`` parameter names; a list stays one parameter
    (``optim/betas = [0.9, 0.95]``), an empty mapping one parameter ``{}``."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(_params(value, f"{name}/"))
        else:
            out[name] = dict(value) if isinstance(value, Mapping) else value
    return out
