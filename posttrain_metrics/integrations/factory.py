"""Sinks from configuration data: ``{"type": "mlflow", "tracking_uri": ...}`` to a sink object.

Paths in a config are relative to the run's output folder and may not leave it (``../`` or a
symlink out is refused), so a config cannot make a sink write elsewhere by accident or on purpose.
An absolute path is an explicit choice and is taken as given.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..core.errors import MetricsError
from ..core.redact import redact_text, redact_tree
from .base import Sink

__all__ = ["SINK_TYPES", "build_sink", "inside", "plain", "safe_name"]

SINK_TYPES: dict[str, tuple[str, str, str | None, str]] = {
    # type: (module, class, path option, default relative path)
    "journal": ("posttrain_metrics.integrations.journal", "JournalSink", "path", "journal.jsonl"),
    "console": ("posttrain_metrics.integrations.console", "ConsoleSink", None, ""),
    "memory": ("posttrain_metrics.integrations.memory", "MemorySink", None, ""),
    "wandb": ("posttrain_metrics.integrations.wandb", "WandbSink", "dir", "."),
    "mlflow": ("posttrain_metrics.integrations.mlflow", "MlflowSink", "dir", "."),
    "tensorboard": ("posttrain_metrics.integrations.tensorboard", "TensorBoardSink", "log_dir", "tensorboard"),
}


def plain(value: Any) -> Any:
    """OmegaConf containers (from Hydra configs) as plain dicts and lists; other values as given."""
    if type(value).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(value, resolve=True)
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def safe_name(name: str) -> str:
    """A run name usable as a folder name: no separators, no ``..``."""
    cleaned = re.sub(r"[^A-Za-z0-9._=-]+", "-", name).strip(".-")[:100].strip(".-")
    return cleaned or "run"


def inside(base: Path, relative: str | os.PathLike[str], *, what: str) -> Path:
    """``base / relative``, refusing any path that resolves outside ``base``."""
    path = Path(relative)
    if path.is_absolute():
        return path
    resolved = (base / path).resolve()
    root = base.resolve()
    if resolved != root and root not in resolved.parents:
        raise MetricsError(
            f"{what} {str(relative)!r} resolves to {resolved}, outside the output folder {root}; "
            "fix: give a path inside the output folder, or an absolute path on purpose"
        )
    return resolved


def _shown(options: Mapping[str, Any]) -> dict[str, Any]:
    """Options as an error message may show them: secrets redacted."""
    shown: dict[str, Any] = redact_tree(dict(options))
    return shown


def build_sink(spec: Mapping[str, Any] | Sink, *, out_dir: str | os.PathLike[str] | None = None) -> Sink:
    """A sink from ``{"type": ..., **options}``; a sink object passes through unchanged.

    Without an explicit path option, file-backed sinks write under ``out_dir`` (``journal.jsonl``,
    ``tensorboard/``, ``mlflow.db``, ``wandb/``).
    """
    if not isinstance(spec, Mapping):
        if isinstance(spec, Sink):
            return spec
        raise MetricsError(
            f"a sink must be a mapping such as {{'type': 'console'}} or a sink object, got "
            f"{type(spec).__name__} {spec!r:.60}"
        )
    options = plain(dict(spec))
    options.pop("_target_", None)
    kind = options.pop("type", None)
    if kind not in SINK_TYPES:
        raise MetricsError(
            f"unknown sink type {kind!r} in {_shown(options)}; fix: use one of {sorted(SINK_TYPES)}"
        )
    module_name, class_name, path_option, default = SINK_TYPES[kind]
    cls = getattr(importlib.import_module(module_name), class_name)
    accepted = inspect.signature(cls).parameters
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise MetricsError(
            f"sink {kind!r} does not take option(s) {unknown}; it takes {sorted(accepted)}"
        )
    if path_option is not None:
        base = Path(out_dir) if out_dir is not None else Path.cwd()
        given = options.get(path_option)
        options[path_option] = inside(base, given if given is not None else default, what=f"{kind}.{path_option}")
    try:
        sink: Sink = cls(**options)
    except (TypeError, ValueError) as exc:
        raise MetricsError(f"sink {kind!r} rejected its options {_shown(options)}: {redact_text(str(exc))}") from None
    return sink
