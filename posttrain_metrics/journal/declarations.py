"""Every adapter's declarations, as the journal header carries them: a journal alone rebuilds its run.

The header's ``"declarations"`` maps each adapter the run names (``"adapters"``) to its
declaration: ``{"internal_prefix", "phases", "ignored", "family_scopes", "metrics": [{"leaf",
"reduction", "meaning", ...}]}``, a :class:`~posttrain_metrics.core.adapter.Metric`'s fields that
differ from their defaults, enums by value. The publisher process, ``export``, ``doctor`` and
``plot`` rebuild the run's adapters from it, so a user's own adapter (a ``MetricAdapter`` built or
subclassed in the training script) needs no import there. The user's one-line keys travel apart,
as ``"extra"`` (:mod:`~posttrain_metrics.core.extra`). A header without declarations (written
before they were recorded) names built-in adapters only: they are found in the catalogue by name.

>>> from posttrain_metrics import get_adapter
>>> grpo = get_adapter("grpo")
>>> rebuilt = adapter_from_declaration("grpo", adapter_declaration(grpo))
>>> rebuilt.metrics == grpo.metrics and rebuilt.phases == grpo.phases
True
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping
from typing import Any

from ..core.adapter import Metric, MetricAdapter
from ..core.errors import MetricsError
from ..core.extra import UserKeys
from ..core.keys import describe
from ..core.reduction import Reduction, RunAggregate

__all__ = ["adapter_declaration", "adapter_declarations", "adapter_from_declaration"]

_FIELDS = {f.name: f for f in dataclasses.fields(Metric)}
_ENUMS: dict[str, type[enum.Enum]] = {"reduction": Reduction, "run": RunAggregate}
_TEXT = ("leaf", "meaning", "unit", "weight", "mean", "namespace", "headline_if", "family", "source", "second_moment")


def adapter_declaration(adapter: MetricAdapter) -> dict[str, Any]:
    """``adapter``'s declarations as plain JSON data (see the module)."""
    metrics = []
    for metric in adapter.metrics.values():
        out: dict[str, Any] = {}
        for name, field in _FIELDS.items():
            value = getattr(metric, name)
            if field.default is not dataclasses.MISSING and value == field.default:
                continue
            out[name] = value.value if isinstance(value, enum.Enum) else list(value) if isinstance(value, tuple) else value
        metrics.append(out)
    return {"internal_prefix": adapter.internal_prefix, "phases": sorted(adapter.phases),
            "ignored": sorted(adapter.ignored), "family_scopes": dict(adapter.family_scopes), "metrics": metrics}


def adapter_declarations(adapters: Iterable[MetricAdapter]) -> dict[str, dict[str, Any]]:
    """``{name: declaration}`` of every adapter but the user's one-line keys (those travel as ``extra``).

    What a reader cannot rebuild is refused here, before the run starts, rather than published
    otherwise by the publisher process, ``export``, ``doctor`` and ``plot``: two different adapters
    of one name (the header keys declarations by name), and a subclass whose methods describe its
    keys otherwise than its declarations do (a reader rebuilds a plain :class:`MetricAdapter`)."""
    out: dict[str, dict[str, Any]] = {}
    for adapter in adapters:
        if isinstance(adapter, UserKeys):
            continue
        declaration = adapter_declaration(adapter)
        if out.get(adapter.name, declaration) != declaration:
            raise MetricsError(
                f"two adapters are named {adapter.name!r} with different declarations; the journal header "
                "declares adapters by name, so every reader would rebuild one of them only; fix: give each "
                "adapter its own name"
            )
        out[adapter.name] = declaration
        if type(adapter) is not MetricAdapter:
            _check_rebuilt(adapter, declaration)
    return out


def _check_rebuilt(adapter: MetricAdapter, declaration: dict[str, Any]) -> None:
    """Refuse a subclass whose keys a reader, rebuilding it from ``declaration``, would describe otherwise."""
    try:
        again = adapter_from_declaration(adapter.name, declaration)
    except MetricsError as exc:  # changed after MetricAdapter checked it: no reader could rebuild it
        raise MetricsError(
            f"adapter {adapter.name!r} ({type(adapter).__name__}) cannot be rebuilt from its declarations, as every "
            f"reader of its journal rebuilds it: {exc}; fix: declare it through MetricAdapter(...)'s arguments "
            "instead of changing the adapter after"
        ) from None
    mine, rebuilt = describe([adapter]), describe([again])
    if mine == rebuilt:
        return
    overrides = sorted(name for name in vars(MetricAdapter) if not name.startswith("__") and next(
        c for c in type(adapter).__mro__ if name in vars(c)) is not MetricAdapter)
    ours = [k for k in mine if k not in rebuilt or mine[k] != rebuilt[k]][:3]
    theirs = [k for k in rebuilt if k not in mine or mine[k] != rebuilt[k]][:3]
    raise MetricsError(
        f"adapter {adapter.name!r} ({type(adapter).__name__}) overrides {', '.join(overrides) or 'a method'}, "
        f"so it describes its keys as {ours} where its declarations say {theirs}; the journal header carries "
        "the declarations only (the internal prefix, phases, ignored names, family scopes and each Metric), "
        "and the publisher process, export, doctor and plot rebuild the adapter from them; fix: declare it "
        "in the Metric fields (namespace=, source=, ...) instead of overriding MetricAdapter's methods"
    )


def adapter_from_declaration(name: str, record: Any) -> MetricAdapter:
    """The adapter ``record`` declares, checked as any adapter is; a malformed record is a
    :class:`MetricsError` naming the adapter (a journal is data: a hostile header raises nothing else)."""
    try:
        if not isinstance(record, Mapping):
            raise TypeError(f"a {type(record).__name__}, not a JSON object")
        unknown = sorted(set(record) - {"internal_prefix", "phases", "ignored", "family_scopes", "metrics"})
        if unknown:
            raise ValueError(f"unknown field(s) {unknown}")
        metrics = [_metric(m) for m in _list(record.get("metrics"), "metrics", Mapping)]
        prefix = record.get("internal_prefix", "")
        if not isinstance(prefix, str):
            raise TypeError(f"internal_prefix {prefix!r:.40} is not a string")
        scopes = record.get("family_scopes", {})
        if not isinstance(scopes, Mapping) or not all(isinstance(v, str) for v in [*scopes, *scopes.values()]):
            raise TypeError(f"family_scopes {scopes!r:.60} is not an object of strings")
        return MetricAdapter(name, metrics=metrics, internal_prefix=prefix,
                             phases=_list(record.get("phases", ["train"]), "phases", str),
                             ignored=_list(record.get("ignored", []), "ignored", str), family_scopes=scopes)
    except MetricsError as exc:
        raise MetricsError(f"the journal header's declaration of adapter {name!r}: {exc}") from None
    except (TypeError, ValueError, KeyError) as exc:
        raise MetricsError(f"the journal header's declaration of adapter {name!r} is malformed ({exc}); the "
                           "file is damaged or not ours") from None


def _list(value: Any, what: str, kind: type) -> list[Any]:
    if not isinstance(value, list) or not all(isinstance(v, kind) for v in value):
        raise TypeError(f"{what} {value!r:.60} is not a list of {'strings' if kind is str else 'objects'}")
    return value


def _metric(record: Mapping[str, Any]) -> Metric:
    unknown = sorted(set(record) - set(_FIELDS))
    if unknown:
        raise ValueError(f"a metric has unknown field(s) {unknown}")
    kw: dict[str, Any] = {}
    for name, value in record.items():
        if name in _ENUMS:
            value = _ENUMS[name](value)
        elif name == "labels":
            value = tuple(_list(value, "labels", str))
        elif name in _TEXT:
            if not isinstance(value, str):
                raise TypeError(f"{name} {value!r:.40} is not a string")
        elif type(value) is not bool:  # headline, count
            raise TypeError(f"{name} {value!r:.40} is not true or false")
        kw[name] = value
    return Metric(**kw)
