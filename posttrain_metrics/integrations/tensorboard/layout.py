"""The custom-scalars layout of a run, as plain data derived from its key declarations (the rules
are in the package docstring); :mod:`.sink` turns it into TensorBoard's ``Layout`` proto."""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from ...core.adapter import PHASES, Metric
from ...core.keys import KeyInfo

__all__ = ["Category", "Chart", "dashboard_layout", "written_layout"]

# Display names only: a user's adapter is shown under its own name.
_ADAPTER_TITLES = {
    "grpo": "GRPO", "ppo": "PPO", "dpo": "DPO", "nft": "NFT", "opd_direct": "OPD direct",
    "opd_advantage": "OPD advantage", "flow_bc": "flow-BC", "reward": "reward & groups",
}
_TOPIC_TITLES = {"kl": "KL", "sc": "score centering", "response": "response length"}
_NAMESPACE_TITLES = {"optim": "optimizer outcome", "timer": "timing"}
_MIN_GROUP = 3  # a leaf prefix shared by this many charts of an adapter makes a topic
_DOMINANT = 0.6  # ... unless it is the adapter's own prefix (shared by most of its keys)


# -- the custom-scalars layout, as plain data -----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Chart:
    """One chart: a multiline chart of the tags matching ``tags`` (anchored regexes), or, when
    ``bands`` is set, a margin chart of ``(value, lower, upper)`` tag triples."""

    title: str
    tags: tuple[str, ...] = ()
    bands: tuple[tuple[str, str, str], ...] = ()
    keys: tuple[str, ...] = ()
    """The tags a multiline chart matches (what ``tags`` says as regexes), for :func:`written_layout`."""


@dataclasses.dataclass(frozen=True)
class Category:
    """A titled group of charts; ``closed`` categories start collapsed."""

    title: str
    charts: tuple[Chart, ...]
    closed: bool = True


@dataclasses.dataclass
class _Unit:
    """What one chart shows: a leaf under every phase it is published in, or a mean/min/max band."""

    adapter: str
    leaf: str  # the band's stem for a band
    infos: list[KeyInfo]  # one per phase (the ``_mean`` keys for a band)
    bands: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)

    @property
    def metric(self) -> Metric:
        return self.infos[0].metric

    @property
    def fixed_namespace(self) -> str | None:
        ns = self.metric.namespace
        return ns if ns is not None and ns not in PHASES else None

    def charts(self) -> tuple[Chart, ...]:
        """One chart; a categorical key's labels one chart each: in one multiline chart the custom-
        scalars tab draws every label of a run in the run's colour, 0/1 lines on top of each other,
        and only the tooltip tells which label a line is."""
        keys = [i.key for i in self.infos]
        if self.bands:
            return (Chart(f"{self._title(keys)} (mean, min to max)", bands=tuple(self.bands)),)
        alternatives = "|".join(re.escape(k) for k in keys)
        if self.metric.labels:
            return tuple(Chart(f"{self._title(keys)} = {label} (1 at its steps)",
                               tags=(f"^(?:{alternatives})/{re.escape(label)}$",),
                               keys=tuple(f"{k}/{label}" for k in keys)) for label in self.metric.labels)
        return (Chart(self._title(keys), tags=(f"^(?:{alternatives})$",), keys=tuple(keys)),)

    def _title(self, keys: list[str]) -> str:
        if len(keys) == 1:
            return keys[0] if not self.bands else keys[0].rsplit("_", 1)[0]
        phases = ", ".join(k.split("/", 1)[0] for k in keys)
        return f"{self.leaf} ({phases})"


def _units(keys: Mapping[str, KeyInfo]) -> list[_Unit]:
    by_leaf: dict[tuple[str, str | None, str], _Unit] = {}
    for info in keys.values():
        ident = (info.adapter, info.metric.namespace, info.metric.leaf)
        if ident in by_leaf:
            by_leaf[ident].infos.append(info)
        else:
            by_leaf[ident] = _Unit(info.adapter, info.metric.leaf, [info])
    return list(by_leaf.values())


def _with_bands(units: list[_Unit]) -> list[_Unit]:
    """``<x>_mean`` + ``<x>_min`` + ``<x>_max`` of one adapter, same phases: one band unit."""
    index = {(u.adapter, u.metric.namespace, u.leaf): u for u in units}
    absorbed: set[int] = set()
    out: list[_Unit] = []
    for unit in units:
        if id(unit) in absorbed:
            continue
        stem = unit.leaf.removesuffix("_mean") if unit.leaf.endswith("_mean") else ""
        lo = index.get((unit.adapter, unit.metric.namespace, f"{stem}_min")) if stem else None
        hi = index.get((unit.adapter, unit.metric.namespace, f"{stem}_max")) if stem else None
        if lo is not None and hi is not None and len(lo.infos) == len(hi.infos) == len(unit.infos):
            band = _Unit(unit.adapter, stem, unit.infos,
                         [(m.key, low.key, high.key) for m, low, high in zip(unit.infos, lo.infos, hi.infos)])
            absorbed.update({id(lo), id(hi)})
            out.append(band)
        else:
            out.append(unit)
    return [u for u in out if id(u) not in absorbed]


def _adapter_title(name: str) -> str:
    return _ADAPTER_TITLES.get(name, name)


def _topics(units: list[_Unit], keys: Mapping[str, KeyInfo]) -> list[str]:
    """The category title of every unit (the rules: the package docstring)."""
    titles: list[str | None] = [None] * len(units)
    unit_of_key = {info.key: i for i, u in enumerate(units) for info in u.infos}
    weights = {info.weight_key for info in keys.values() if info.weight_key}

    def weight_unit(i: int) -> int | None:
        w = units[i].infos[0].weight_key
        return unit_of_key.get(w) if w else None

    by_adapter: dict[str, list[int]] = {}
    for i, unit in enumerate(units):
        if unit.fixed_namespace is not None:
            titles[i] = _NAMESPACE_TITLES.get(unit.fixed_namespace, unit.fixed_namespace)
        elif unit.metric.family:
            titles[i] = f"{_adapter_title(unit.adapter)} {unit.metric.family.replace('_', ' ')}"
        else:
            by_adapter.setdefault(unit.adapter, []).append(i)

    for adapter, members in by_adapter.items():
        token = {i: units[i].leaf.split("_", 1)[0] for i in members}
        counts = Counter(token.values())
        own = adapter.split("_", 1)[0]  # the adapter's own prefix (``dpo_``) names no topic
        topic = {t for t, n in counts.items()
                 if n >= _MIN_GROUP and n <= _DOMINANT * len(members) and t != own}
        group: dict[int, str | None] = {i: token[i] if token[i] in topic else None for i in members}
        # A group built around a token count (a population) admits only keys measured over it.
        population = {t: {i for i in members if group[i] == t and units[i].infos[0].key in weights}
                      for t in topic}
        for i in members:
            t, w = group[i], weight_unit(i)
            if t is not None and w is not None and population[t] and w not in population[t]:
                group[i] = None
        # A key weighted by a group's token count joins that group.
        for i in members:
            w = weight_unit(i)
            if w is not None and w in group and group[w] is not None:
                group[i] = group[w]
        sizes = Counter(t for t in group.values() if t is not None)
        for i in members:
            t = group[i]
            if t is not None and sizes[t] >= _MIN_GROUP:
                titles[i] = f"{_adapter_title(adapter)} {_TOPIC_TITLES.get(t, t)}"
            else:
                titles[i] = _adapter_title(adapter)
    return [t or "" for t in titles]


def dashboard_layout(keys: Mapping[str, KeyInfo], adapters: Sequence[str]) -> list[Category]:
    """The custom-scalars layout of a run, derived from its key declarations.

    >>> from posttrain_metrics.core.keys import describe
    >>> from posttrain_metrics import get_adapter
    >>> layout = dashboard_layout(describe([get_adapter("grpo")]), ["grpo"])
    >>> [c.title for c in layout]  # doctest: +NORMALIZE_WHITESPACE
    ['GRPO headline', 'GRPO', 'GRPO logprob gap', 'GRPO KL', 'GRPO response length',
     'GRPO score centering']
    """
    units = _units(keys)
    out: list[Category] = []
    headline = [c for u in units if any(i.metric.headline for i in u.infos) for c in u.charts()]
    if headline:
        lead = _adapter_title(adapters[0]) if adapters else "run"
        out.append(Category(f"{lead} headline", tuple(headline), closed=False))
    topical = _with_bands(units)
    charts: dict[str, list[Chart]] = {}
    shared: dict[str, list[Chart]] = {}  # fixed namespaces (optim, timer) span adapters: last
    for unit, title in zip(topical, _topics(topical, keys)):
        (shared if unit.fixed_namespace else charts).setdefault(title, []).extend(unit.charts())
    out.extend(Category(title, tuple(group)) for title, group in {**charts, **shared}.items())
    return out


def written_layout(categories: Sequence[Category], written: Iterable[str]) -> list[Category]:
    """``categories`` restricted to the ``written`` tags: a multiline chart lists only its tags that
    were written (its regex rebuilt over them), a band chart keeps the bands whose three tags were,
    a chart or category left with nothing is dropped. So no chart opens empty.

    >>> layout = [Category("c", (Chart("x", tags=("^(?:a|b)$",), keys=("a", "b")), Chart("y", keys=("c",))))]
    >>> written_layout(layout, {"b"})  # doctest: +NORMALIZE_WHITESPACE
    [Category(title='c', charts=(Chart(title='x', tags=('^(?:b)$',), bands=(), keys=('b',)),), closed=True)]
    """
    done = set(written)
    out: list[Category] = []
    for category in categories:
        charts: list[Chart] = []
        for chart in category.charts:
            if chart.bands:
                bands = tuple(b for b in chart.bands if all(t in done for t in b))
                if bands:
                    charts.append(dataclasses.replace(chart, bands=bands))
                continue
            keys = tuple(k for k in chart.keys if k in done)
            if keys:
                charts.append(dataclasses.replace(chart, keys=keys,
                                                  tags=(f"^(?:{'|'.join(re.escape(k) for k in keys)})$",)))
        if charts:
            out.append(dataclasses.replace(category, charts=tuple(charts)))
    return out
