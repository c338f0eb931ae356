"""The user's own keys, declared in one line each, without writing an adapter.

In the callback config (or ``MetricsCallback(extra=...)``)::

    extra:
      my/tokens_per_s: mean
      my/oom_retries: sum
      my/tokens: sum
      my/loss: {reduction: weighted_mean, weight: my/tokens}

A key is ``<namespace>/<leaf>`` (one ``/``): the producer reports it under that very name in its
chunk dicts, and it is published under that name. The value is a :class:`Reduction` value
(``mean``, ``sum``, ``max``, ``min``, ``last``, ``agreed``) or a mapping with ``reduction`` and,
where the reduction takes them, ``weight`` (a ``sum`` key of the same namespace: the weight of a
``weighted_mean``, the count of a ``max``/``min``), ``mean`` (of a ``pooled_std``), ``labels`` (of a
``categorical``), plus ``unit`` and ``meaning``. Each namespace becomes one :class:`UserKeys`
adapter, reduced like every catalogue adapter: exactly, across chunks and ranks.

Namespaces: ``run/`` and ``health/`` belong to the publisher (run aggregates, non-finite counters)
and are refused. ``train/``, ``val/``, ``optim/`` and ``timer/`` are shared with the catalogue: a key
there is accepted unless the catalogue publishes it (``train/loss_avg`` is refused, ``train/my_bonus``
is not). Declarations are sorted by key, so every rank builds the same layout from the same set
whatever the order it was written in; ranks that declare different sets fail the first reduce with a
:class:`MetricsError` on every rank. The journal header carries the declarations (``"extra"``), so
the publisher process, ``export``, ``doctor`` and ``plot`` rebuild the same adapters.

>>> [a.name for a in user_adapters({"my/oom_retries": "sum", "my/tokens_per_s": "mean"})]
['extra:my']
>>> user_adapters({"my/oom_retries": "sum"})[0].public_key("my/oom_retries", "train")
'my/oom_retries'
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .adapter import PHASES, Metric, MetricAdapter
from .errors import MetricsError
from .reduction import Reduction

__all__ = [
    "OWNED_NAMESPACES", "UserKeys", "check_disjoint", "declarations", "normalise", "one_line_fix", "user_adapters",
]

OWNED_NAMESPACES = frozenset({"run", "health"})
"""Namespaces the publisher and the sinks derive series under (``run/<key>`` aggregates,
``health/nonfinite/<key>``): never the user's."""

_FIELDS = ("reduction", "weight", "mean", "labels", "unit", "meaning")
_CHOICES = [r.value for r in Reduction]
_ONE_LINE = "extra: {'my/x': mean} (or sum, max, min, last, agreed, or {reduction: weighted_mean, weight: 'my/n'})"


class UserKeys(MetricAdapter):
    """The user's keys of one namespace; ``declarations`` is their normalised form (what the journal
    header carries: the key to a dict of the fields given)."""

    def __init__(self, namespace: str, declared: Mapping[str, Mapping[str, Any]]) -> None:
        self.namespace = namespace
        self.declarations = {key: dict(spec) for key, spec in declared.items()}
        metrics = [_metric(namespace, key, spec) for key, spec in self.declarations.items()]
        try:
            super().__init__(f"extra:{namespace}", metrics=metrics, phases=sorted(PHASES))
        except MetricsError as exc:  # the adapter's words are leaves; the user wrote keys
            raise MetricsError(
                f"extra keys of namespace {namespace!r}: {exc}. In extra, a weighted key reads "
                f"{{reduction: weighted_mean, weight: '{namespace}/n'}} with '{namespace}/n': sum"
            ) from None


def normalise(extra: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``extra`` as ``{key: {"reduction": ..., ...}}``, sorted by key, every field checked."""
    if not isinstance(extra, Mapping):
        raise MetricsError(
            f"extra={extra!r:.80} is of type {type(extra).__name__}; fix: a mapping of key to reduction, "
            f"e.g. {_ONE_LINE}"
        )
    out: dict[str, dict[str, Any]] = {}
    for key in sorted(extra, key=str):
        spec = extra[key]
        if not isinstance(key, str) or key.count("/") != 1 or not all(key.split("/")):
            raise MetricsError(
                f"extra key {key!r:.80} is not '<namespace>/<leaf>' (one '/', both parts non-empty); fix: name "
                "it like 'my/tokens_per_s' and report it under that name"
            )
        namespace = key.split("/", 1)[0]
        if namespace in OWNED_NAMESPACES:
            raise MetricsError(
                f"extra key {key!r}: the namespace {namespace!r} holds series the publisher derives "
                f"({sorted(OWNED_NAMESPACES)} are not yours); fix: choose another namespace, e.g. 'my/"
                f"{key.split('/', 1)[1]}'"
            )
        if isinstance(spec, str):
            spec = {"reduction": spec}
        if not isinstance(spec, Mapping):
            raise MetricsError(
                f"extra key {key!r}: got {spec!r:.80} ({type(spec).__name__}); fix: a reduction name "
                f"({', '.join(_CHOICES)}) or a mapping such as {{reduction: weighted_mean, weight: 'my/n'}}"
            )
        unknown = sorted(set(map(str, spec)) - set(_FIELDS))
        if unknown:
            raise MetricsError(f"extra key {key!r}: unknown field(s) {unknown}; it takes {list(_FIELDS)}")
        reduction = spec.get("reduction")
        if reduction not in _CHOICES:
            raise MetricsError(
                f"extra key {key!r}: reduction {reduction!r:.60} is not one of {_CHOICES}; fix: e.g. "
                f"{{{key!r}: mean}}"
            )
        clean: dict[str, Any] = {"reduction": reduction}
        for field in ("weight", "mean"):
            ref = spec.get(field)
            if ref is None:
                continue
            if not isinstance(ref, str) or ref.split("/", 1)[0] != namespace or ref not in extra:
                raise MetricsError(
                    f"extra key {key!r}: {field}={ref!r:.80} must be another extra key of the same "
                    f"namespace {namespace!r}; fix: declare it too, e.g. {{'{namespace}/n': sum}}"
                )
            clean[field] = ref
        labels = spec.get("labels")
        if labels is not None:
            if isinstance(labels, str) or not isinstance(labels, Sequence) or not all(
                isinstance(label, str) for label in labels
            ):
                raise MetricsError(f"extra key {key!r}: labels={labels!r:.80}; fix: a list of label strings")
            clean["labels"] = list(labels)
        for field in ("unit", "meaning"):
            if field in spec:
                if not isinstance(spec[field], str):
                    raise MetricsError(f"extra key {key!r}: {field}={spec[field]!r:.60}; fix: a string")
                clean[field] = spec[field]
        out[key] = clean
    return out


def user_adapters(extra: Mapping[str, Any]) -> tuple[UserKeys, ...]:
    """One :class:`UserKeys` adapter per namespace of ``extra``, in namespace order."""
    declared = normalise(extra)
    by_namespace: dict[str, dict[str, dict[str, Any]]] = {}
    for key, spec in declared.items():
        by_namespace.setdefault(key.split("/", 1)[0], {})[key] = spec
    return tuple(UserKeys(namespace, specs) for namespace, specs in sorted(by_namespace.items()))


def declarations(adapters: Iterable[MetricAdapter]) -> dict[str, dict[str, Any]]:
    """The declarations of the :class:`UserKeys` among ``adapters`` (empty when there are none)."""
    out: dict[str, dict[str, Any]] = {}
    for adapter in adapters:
        if isinstance(adapter, UserKeys):
            out.update(adapter.declarations)
    return dict(sorted(out.items()))


def check_disjoint(extra: Sequence[UserKeys], others: Sequence[MetricAdapter]) -> None:
    """Refuse a user key that the catalogue or one of the run's adapters publishes already."""
    from .catalog import BUILTIN
    from .keys import describe

    taken = {key: info.adapter for key, info in describe([*BUILTIN, *others]).items()}
    for adapter in extra:
        for key in adapter.declarations:
            if key in taken:
                raise MetricsError(
                    f"extra key {key!r} is published by adapter {taken[key]!r} already (a catalogue key "
                    "keeps its declared meaning); fix: choose another name, e.g. "
                    f"'my/{key.split('/', 1)[1]}', or report the source name of {taken[key]!r}"
                )


def one_line_fix(name: str, adapters: Sequence[MetricAdapter] = ()) -> str:
    """A fix for an undeclared source ``name`` that works when followed: when ``name`` is a key the
    catalogue or ``adapters`` publish (a declaration of it would be refused), its source name (and
    the adapter to add); otherwise the one-line declaration of a user key, moved out of a namespace
    the publisher owns (``run/x`` -> ``my/x``)."""
    owner = _publisher_of(name, adapters)
    if owner is not None:
        adapter, source = owner
        add = "" if any(a.name == adapter for a in adapters) else f" and add the adapter {adapter!r}"
        return (f"{name!r} is the key adapter {adapter!r} publishes for the source name {source!r} (a key "
                f"the catalogue publishes cannot be declared again); fix: report {source!r}{add}")
    shaped = name.count("/") == 1 and all(name.split("/"))
    if shaped and name.split("/", 1)[0] in OWNED_NAMESPACES:
        key = f"my/{name.split('/', 1)[1]}"
    else:
        key = name if shaped else f"my/{name.replace('/', '_')}"
    rename = "" if key == name else f" (report it as {key!r})"
    return ("fix: use a declared source name, add the adapter that declares it, or declare it in one line "
            f"in the callback config: extra: {{{key!r}: mean}}{rename} (or sum, max, ...)")


def _publisher_of(key: str, adapters: Sequence[MetricAdapter]) -> tuple[str, str] | None:
    """``(adapter name, source name)`` of the adapter that publishes ``key``: one of ``adapters``
    first, else the built-in catalogue's; ``None`` when none does."""
    from .catalog import BUILTIN

    for adapter in [*adapters, *BUILTIN]:
        for phase in sorted(adapter.phases):
            for source in adapter.metrics:
                if adapter.public_key(source, phase) == key:
                    return adapter.name, source
    return None


def _metric(namespace: str, key: str, spec: Mapping[str, Any]) -> Metric:
    def leaf(ref: str | None) -> str | None:
        return None if ref is None else ref.split("/", 1)[1]

    return Metric(
        key.split("/", 1)[1],
        Reduction(spec["reduction"]),
        spec.get("meaning", f"user key {key}"),
        unit=spec.get("unit", ""),
        weight=leaf(spec.get("weight")),
        mean=leaf(spec.get("mean")),
        labels=tuple(spec.get("labels", ())),
        namespace=namespace,
        source=key,
    )
