"""Sinks from configuration data: ``{"type": "mlflow", "tracking_uri": ...}`` to a sink object.

Paths in a config are relative to the run's output folder (W&B's files go to ``WANDB_DIR`` when the
environment sets it and the config gives no ``dir``) and may not leave it (``../`` or a
symlink out is refused), so a config cannot make a sink write elsewhere by accident or on purpose;
MLflow's ``tracking_uri`` too when it names a file (a relative ``sqlite:///ml.db`` is
``<out_dir>/ml.db``, a relative file-store folder is under ``out_dir``). An absolute path is an
explicit choice and is taken as given. Every option is checked against its constructor's
annotation first: a wrong type is a ``MetricsError`` naming the field, the value and the type.
"""

from __future__ import annotations

import collections.abc
import importlib
import inspect
import os
import re
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core.cycles import Cycles
from ..core.errors import MetricsError
from ..core.redact import key_text, redact_text, redact_tree
from .base import Sink, as_sink

__all__ = ["SINK_TYPES", "build_sink", "check_callback", "check_options", "check_path", "check_writable", "inside", "mlflow_uri", "plain", "run_path", "safe_name"]

SINK_TYPES: dict[str, tuple[str, str, str | None, str]] = {
    # type: (module, class, path option, default relative path)
    "journal": ("posttrain_metrics.journal", "JournalSink", "path", "journal.jsonl"),
    "console": ("posttrain_metrics.integrations.console", "ConsoleSink", None, ""),
    "memory": ("posttrain_metrics.integrations.memory", "MemorySink", None, ""),
    "wandb": ("posttrain_metrics.integrations.wandb", "WandbSink", "dir", "."),
    "mlflow": ("posttrain_metrics.integrations.mlflow", "MlflowSink", "dir", "."),
    # one directory per run (TensorBoard's run), so that runs into one out_dir never mix their points
    "tensorboard": ("posttrain_metrics.integrations.tensorboard", "TensorBoardSink", "log_dir",
                    "tensorboard/{name}-{run_id}"),
}


def check_callback(*, adapters: Any, sinks: Any, out_dir: Any, run_name: Any) -> None:
    """The callback's own options, by type, before anything is built (see :func:`check_options`)."""
    owner = "MetricsCallback"
    names = [adapters] if isinstance(adapters, str) or not isinstance(adapters, (list, tuple)) else adapters
    for item in names:
        if not isinstance(item, str) and not any(c.__name__ == "MetricAdapter" for c in type(item).__mro__):  # a subclass too
            raise MetricsError(f"{owner}: adapters={adapters!r:.80} holds {item!r:.40} of type {type(item).__name__}; "
                               "fix: give adapter names or MetricAdapter objects, e.g. adapters=['grpo', 'trainer']")
    if not isinstance(sinks, (list, tuple)):
        raise MetricsError(f"{owner}: sinks={redact_tree(sinks)!r:.80} is of type {type(sinks).__name__}; fix: give "
                           "a list of sink configs or objects, e.g. sinks=[{'type': 'journal'}]")
    if out_dir is not None:
        check_path(owner, "out_dir", out_dir, file=False)
    if run_name is not None and not isinstance(run_name, str):
        raise MetricsError(f"{owner}: run_name={run_name!r:.80} is of type {type(run_name).__name__}; fix: give "
                           "a string, or leave it out")


def plain(value: Any) -> Any:
    """OmegaConf containers (from Hydra configs) as plain dicts and lists; other values as given.
    A dict or list that holds itself is a :class:`MetricsError` naming where, not a ``RecursionError``."""
    return _plain(value, "", Cycles("the config"))


def _plain(value: Any, path: str, cycles: Cycles) -> Any:
    if type(value).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(value, resolve=True)
    if isinstance(value, Mapping):
        with cycles.inside(value, path):
            return {str(k): _plain(v, f"{path}/{key_text(str(k))}" if path else key_text(str(k)), cycles)
                    for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        with cycles.inside(value, path):
            return [_plain(v, f"{path}/{i}" if path else str(i), cycles) for i, v in enumerate(value)]
    return value


def safe_name(name: str) -> str:
    """A run name usable as a folder name: no separators, no ``..``."""
    cleaned = re.sub(r"[^A-Za-z0-9._=-]+", "-", name).strip(".-")[:100].strip(".-")
    return cleaned or "run"


_GIVE_INSIDE = "give a path inside the output folder, or an absolute path on purpose"


def inside(base: Path, relative: str | os.PathLike[str], *, what: str, fix: str = _GIVE_INSIDE) -> Path:
    """``base / relative``, refusing any path that resolves outside ``base`` (``../``, or a symlink
    on the way that points elsewhere): the one rule for every path a run writes."""
    path = Path(relative)
    if path.is_absolute():
        return path
    resolved = (base / path).resolve()
    root = base.resolve()
    if resolved != root and root not in resolved.parents:
        raise MetricsError(f"{what} {str(relative)!r} resolves to {resolved}, outside the output folder {root}; "
                           f"fix: {fix}")
    return resolved


def run_path(folder: Path, relative: str | os.PathLike[str]) -> Path:
    """``folder / relative``, a path the run writes, under the journal's rule (:func:`inside`): one that
    resolves elsewhere (a symlink planted at it or on the way) is a :class:`MetricsError`, so a run
    never writes another folder's files through it. Every file of a run derived from the journal's
    path, the MLflow store and the TensorBoard run folder go through here. Returned as built, not
    resolved."""
    path = folder / relative
    inside(folder, relative, what=f"the run's file {path}:",
           fix="remove or rename what is at that path (the run writes it), or give the run another out_dir")
    return path


def _matches(value: Any, hint: Any) -> bool | None:
    """Whether ``value`` fits the annotation ``hint`` (``None``: a hint this check does not read,
    such as a stream or an arbitrary object, which the constructor then checks itself)."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return True
    if hint is None or hint is type(None):
        return value is None
    if origin in (typing.Union, types.UnionType):
        answers = [_matches(value, arg) for arg in typing.get_args(hint)]
        return True if any(answers) else (None if None in answers else False)
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if hint is os.PathLike or origin is os.PathLike:
        return isinstance(value, os.PathLike)
    if origin in (Mapping, collections.abc.Mapping, dict):
        return isinstance(value, Mapping)
    if origin in (Sequence, collections.abc.Sequence, list, tuple):
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            return False
        args = typing.get_args(hint)
        inner = [_matches(v, args[0]) for v in value] if args else []
        return False not in inner
    return None


def _type_name(hint: Any) -> str:
    text = str(hint).replace("typing.", "").replace("collections.abc.", "").replace("os.PathLike[str]", "path")
    return text.replace("<class '", "").replace("'>", "").replace("NoneType", "None")


def check_options(owner: str, options: Mapping[str, Any], hints: Mapping[str, Any]) -> None:
    """Every option of a config against its constructor's annotation: a wrong type is a
    :class:`MetricsError` naming the field, the value received and the type wanted (the fix), never
    a bare ``TypeError`` from deep inside a constructor."""
    for field, value in options.items():
        if field in hints and _matches(value, hints[field]) is False:
            shown = redact_tree({field: value})[field]
            raise MetricsError(
                f"{owner}: {field}={shown!r:.80} is of type {type(value).__name__}; fix: give {field} "
                f"as {_type_name(hints[field])}"
            )


def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls.__init__)  # type: ignore[misc]
    except Exception:  # an annotation this Python cannot evaluate: the constructor checks itself
        return {}


def check_path(owner: str, field: str, value: Any, *, file: bool) -> None:
    """A path option: a non-empty string or path; for a file (the journal), not a folder."""
    if not isinstance(value, (str, os.PathLike)):
        raise MetricsError(f"{owner}: {field}={value!r:.80} is of type {type(value).__name__}; fix: give a path string")
    text = os.fspath(value)
    if not isinstance(text, str) or not text.strip():
        raise MetricsError(f"{owner}: {field}={value!r:.80} is empty; fix: give a path such as 'journal.jsonl'")
    if file and (Path(text).name in ("", ".", "..") or text.endswith(("/", os.sep)) or Path(text).is_dir()):
        raise MetricsError(f"{owner}: {field}={text!r:.80} names a folder, not a file; fix: give a file path "
                           "such as 'journal.jsonl'")


def check_writable(owner: str, field: str, folder: Path) -> None:
    """``folder`` exists (created if need be) and this process can create a file in it, tested by
    creating and removing one: a :class:`MetricsError` naming the folder, what is wrong and the fix.
    Without it, a run whose folder cannot be written trains with every metric lost and exits 0."""
    import tempfile

    problem = ""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".posttrain-metrics-write-test-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except FileExistsError:
        problem = "is a file, not a folder"
    except NotADirectoryError:
        problem = "is under a file, not a folder"
    except OSError as exc:
        problem = f"cannot be written ({type(exc).__name__}: {exc.strerror or exc})"
    if problem:
        raise MetricsError(f"{owner}: {field}={str(folder)!r:.200} {problem}; fix: give a folder this process can "
                           "create files in (check the path, its permissions and that its file system is mounted "
                           "read-write)")


def mlflow_uri(uri: Any, base: Path) -> str:
    """A tracking URI from a config: a relative ``sqlite:///`` database or file-store path is
    resolved under ``base`` (the run's folder) like every other path of a config, and may not leave
    it; an absolute one is taken as given; a server URI as it is."""
    if not isinstance(uri, str) or not uri.strip():
        raise MetricsError(f"mlflow: tracking_uri={uri!r:.80} is not a URI; fix: give a string such as "
                           "'http://127.0.0.1:5000' or 'sqlite:///mlflow.db'")
    if uri.startswith("sqlite:///"):
        path = uri[len("sqlite:///"):]
        if path and not path.startswith("/") and not path.startswith(":memory:"):
            return "sqlite:///" + inside(base, path, what="mlflow.tracking_uri").as_posix()
        return uri
    if uri.startswith("file://"):
        return uri
    if uri.startswith("file:"):
        return inside(base, uri[len("file:"):], what="mlflow.tracking_uri").as_uri()
    if "://" not in uri and uri != "databricks":  # a file-store folder
        return str(inside(base, uri, what="mlflow.tracking_uri"))
    return uri


def _shown(options: Mapping[str, Any]) -> dict[str, Any]:
    """Options as an error message may show them: secrets redacted."""
    shown: dict[str, Any] = redact_tree(dict(options))
    return shown


def build_sink(spec: Mapping[str, Any] | Sink, *, out_dir: str | os.PathLike[str] | None = None) -> Sink:
    """A sink from ``{"type": ..., **options}``; a sink object passes through unchanged.

    Without an explicit path option, file-backed sinks write under ``out_dir`` (``journal.jsonl``,
    ``tensorboard/<name>-<run id>/``, ``mlflow.db``, ``wandb/``).
    """
    if not isinstance(spec, Mapping):
        return as_sink(spec)  # a Sink as it is; a plain object with the three methods wrapped; else an error
    options = plain(dict(spec))
    options.pop("_target_", None)
    kind = options.pop("type", None)
    if not isinstance(kind, str) or kind not in SINK_TYPES:
        raise MetricsError(
            f"unknown sink type {kind!r:.80} (field 'type', options {_shown(options)}); fix: type is one of "
            f"{sorted(SINK_TYPES)}"
        )
    module_name, class_name, path_option, default = SINK_TYPES[kind]
    cls = getattr(importlib.import_module(module_name), class_name)
    accepted = inspect.signature(cls).parameters
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise MetricsError(
            f"sink {kind!r} does not take option(s) {unknown}; it takes {sorted(accepted)}"
        )
    check_options(f"sink {kind!r}", options, _hints(cls))
    base = Path(out_dir) if out_dir is not None else Path.cwd()
    # W&B's own WANDB_DIR says where its files go when the config does not (WandbSink reads it).
    env_dir = kind == "wandb" and options.get(path_option) is None and bool(os.environ.get("WANDB_DIR"))
    if path_option is not None and not env_dir:
        given = options.get(path_option)
        if given is not None:
            check_path(f"sink {kind!r}", path_option, given, file=kind == "journal")
        options[path_option] = inside(base, given if given is not None else default, what=f"{kind}.{path_option}")
    if kind == "mlflow" and options.get("tracking_uri") is not None:
        options["tracking_uri"] = mlflow_uri(options["tracking_uri"], base)
    try:
        sink: Sink = cls(**options)
    except (TypeError, ValueError) as exc:
        raise MetricsError(f"sink {kind!r} rejected its options {_shown(options)}: {redact_text(str(exc))}") from None
    return sink
