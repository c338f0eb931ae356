"""Declarations: each metric key's semantics, stated once, as data.

A :class:`Metric` says what one public leaf means and how it aggregates; a :class:`MetricAdapter`
maps an algorithm's local source names (``grpo_clip_frac``) to those leaves and publishes them under
a namespace (``train/clip_frac``). Call sites pass values only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from .errors import MetricsError
from .reduction import Reduction, RunAggregate

__all__ = ["PHASES", "Metric", "MetricAdapter"]

_WEIGHTED = (Reduction.WEIGHTED_MEAN, Reduction.POOLED_STD, Reduction.MAX, Reduction.MIN)

PHASES = frozenset({"train", "val"})
"""The phases a frame can be published under; a metric without a fixed namespace takes the phase."""


@dataclasses.dataclass(frozen=True)
class Metric:
    """One public key: its leaf, how it aggregates, and what it means.

    ``weight`` names (by leaf) the summed key that weights a ``WEIGHTED_MEAN``, or the count of a
    ``POOLED_STD`` or of a ``MAX``/``MIN`` extremum (a contribution that counted nothing holds no
    extremum); ``mean`` names the mean a ``POOLED_STD`` is pooled around, and ``second_moment`` the
    second moment it is derived from instead of the reported std. ``count`` marks a count of things
    (tokens, groups, optimizer steps): every contribution must be finite and ``>= 0``; a key that
    weights or counts another is a count whether or not it says so. ``namespace`` fixes the prefix
    (``optim``, ``timer``) instead of taking the phase. ``family`` groups keys that a producer emits
    all together or not at all, in every chunk of a window that carries the adapter's keys.
    ``headline_if`` names a key that must be positive for this headline key to be shown (``kl_mean``
    only when ``kl_beta > 0``). ``run`` says what an ``AGREED`` counter or flag aggregates to over the
    run (:class:`RunAggregate`: the last value of a running counter such as ``optimizer_step``, the
    windows where a per-window flag held, the total of a window's own count); the catalogue declares
    it on each, a key that does not reads as ``LAST``. ``derived`` marks a key computed on every rank
    after the reduction from reduced figures (``perf/tokens_per_s`` = summed tokens / slowest rank's
    window time): it takes no slot in the packed state and no producer may report it; ``reduction``
    then says how its values fold over the run.

    >>> Metric("kl_max", Reduction.MAX, "Largest per-token K3 penalty of the step").leaf
    'kl_max'
    """

    leaf: str
    reduction: Reduction
    meaning: str
    unit: str = ""
    weight: str | None = None
    mean: str | None = None
    labels: tuple[str, ...] = ()
    namespace: str | None = None
    headline: bool = False
    headline_if: str | None = None
    family: str | None = None
    source: str | None = None
    second_moment: str | None = None
    count: bool = False
    run: RunAggregate | None = None
    derived: bool = False

    @property
    def run_aggregate(self) -> RunAggregate | None:
        """How an ``AGREED`` key aggregates over the run (``LAST`` unless declared); ``None`` for any
        other reduction (its :class:`Reduction` says)."""
        if self.reduction is not Reduction.AGREED:
            return None
        return self.run or RunAggregate.LAST


class MetricAdapter:
    """Maps an algorithm's source names to public keys with their declared semantics.

    The source name of a metric is ``internal_prefix + leaf``, unless the leaf already starts with the
    prefix (then it is the leaf itself) or the metric gives ``source`` explicitly (``loss_avg`` is
    ``<prefix>loss``). Names in ``ignored`` are accepted from producers and not published.

    >>> a = MetricAdapter("toy", internal_prefix="toy_", metrics=[
    ...     Metric("tokens", Reduction.SUM, "Tokens seen"),
    ...     Metric("frac", Reduction.WEIGHTED_MEAN, "A token fraction", weight="tokens")])
    >>> a.weighted_by
    {'toy_frac': 'toy_tokens'}
    >>> a.public_key("toy_frac", "train")
    'train/frac'
    """

    def __init__(
        self,
        name: str,
        *,
        metrics: Sequence[Metric],
        internal_prefix: str = "",
        phases: Iterable[str] = ("train",),
        ignored: Iterable[str] = (),
        family_scopes: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.internal_prefix = internal_prefix
        self.phases = frozenset(phases)
        self.ignored = frozenset(ignored)
        self.metrics: dict[str, Metric] = {}
        self._by_leaf: dict[str, str] = {}
        unknown = self.phases - PHASES
        if unknown or not self.phases:
            raise MetricsError(
                f"adapter {name!r}: phases {sorted(self.phases)} are not a non-empty subset of "
                f"{sorted(PHASES)}; fix: use 'train' and/or 'val'"
            )
        for metric in metrics:
            self._declare(metric)
        for source, metric in self.metrics.items():
            self._check_references(source, metric)
        self.family_scopes = dict(family_scopes or {})
        """Family name to the leaf whose presence makes a chunk part of the family's batch (the
        logprob gap: chunks with completion tokens). Without one, any chunk carrying this adapter's
        keys is."""
        for family, leaf in self.family_scopes.items():
            if family not in self.families or leaf not in self._by_leaf:
                raise MetricsError(
                    f"adapter {name!r}: family_scopes {family!r}: {leaf!r} must map a declared family to a "
                    f"declared leaf (families: {sorted(self.families)})"
                )
        clash = self.ignored & self.metrics.keys()
        if clash:
            raise MetricsError(
                f"adapter {name!r}: {sorted(clash)} are both declared and ignored; fix: remove them "
                "from one of the two"
            )

    # -- construction -------------------------------------------------------------------------

    def _declare(self, metric: Metric) -> None:
        where = f"adapter {self.name!r}, leaf {metric.leaf!r}"
        if not metric.leaf or "/" in metric.leaf:
            raise MetricsError(
                f"{where}: a leaf may not be empty or contain '/' (the namespace supplies it); "
                f"fix: declare {metric.leaf.rsplit('/', 1)[-1]!r} instead"
            )
        if metric.namespace is not None and (not metric.namespace or "/" in metric.namespace):
            raise MetricsError(f"{where}: namespace {metric.namespace!r} must be one word without '/'")
        if metric.leaf in self._by_leaf:
            raise MetricsError(f"{where}: declared twice; fix: keep one declaration per leaf")
        needs_weight = metric.reduction is Reduction.WEIGHTED_MEAN
        if needs_weight and metric.weight is None:
            raise MetricsError(f"{where}: a weighted mean needs weight=<leaf of a summed key>")
        if metric.weight is not None and metric.reduction not in _WEIGHTED:
            raise MetricsError(
                f"{where}: weight={metric.weight!r} given to a {metric.reduction.name} key; fix: "
                "only WEIGHTED_MEAN, POOLED_STD, MAX and MIN keys take a weight or count"
            )
        if (metric.reduction is Reduction.POOLED_STD) != (metric.mean is not None):
            raise MetricsError(f"{where}: mean=<leaf> is required by POOLED_STD and only by it")
        if metric.second_moment is not None and metric.reduction is not Reduction.POOLED_STD:
            raise MetricsError(f"{where}: second_moment=<leaf> is taken by POOLED_STD keys only")
        if metric.count and metric.reduction in (Reduction.CATEGORICAL, Reduction.POOLED_STD):
            raise MetricsError(f"{where}: count=True marks a number of things; a {metric.reduction.name} key is not one")
        if metric.run is not None and metric.reduction is not Reduction.AGREED:
            raise MetricsError(
                f"{where}: run={metric.run} says how an exact counter or flag aggregates over the run; a "
                f"{metric.reduction.name} key has its own; fix: declare it Reduction.AGREED, or drop run"
            )
        if metric.run is RunAggregate.TOTAL and not metric.count:
            raise MetricsError(f"{where}: run=RunAggregate.TOTAL sums a window's own count; fix: declare count=True")
        if (metric.reduction is Reduction.CATEGORICAL) != bool(metric.labels):
            raise MetricsError(f"{where}: labels=(...) are required by CATEGORICAL and only by it")
        if len(set(metric.labels)) != len(metric.labels):
            raise MetricsError(f"{where}: labels {metric.labels} repeat a label")
        source = metric.source or self._source_of(metric.leaf)
        if source in self.metrics:
            raise MetricsError(f"{where}: source name {source!r} is already taken by another leaf")
        self.metrics[source] = metric
        self._by_leaf[metric.leaf] = source

    def _source_of(self, leaf: str) -> str:
        prefix = self.internal_prefix
        return leaf if leaf.startswith(prefix) else prefix + leaf

    def _check_references(self, source: str, metric: Metric) -> None:
        where = f"adapter {self.name!r}, leaf {metric.leaf!r}"
        roles = (("weight", metric.weight), ("mean", metric.mean), ("second_moment", metric.second_moment),
                 ("headline_if", metric.headline_if))
        for role, leaf in roles:
            if leaf is None:
                continue
            if leaf not in self._by_leaf:
                raise MetricsError(
                    f"{where}: {role}={leaf!r} is not a declared leaf of this adapter; fix: declare "
                    f"{leaf!r} in the same adapter (declared: {sorted(self._by_leaf)})"
                )
        if metric.weight is not None:
            weight = self.metrics[self._by_leaf[metric.weight]]
            if weight.reduction is not Reduction.SUM:
                raise MetricsError(
                    f"{where}: weight {metric.weight!r} is a {weight.reduction.name} key; fix: "
                    "weights and counts must be SUM keys"
                )

    @classmethod
    def from_fields(
        cls,
        name: str,
        *,
        internal_prefix: str,
        names: Mapping[str, str],
        phases: Iterable[str] = ("train",),
        weighted_by: Mapping[str, str] | None = None,
        max_reduced: Iterable[str] = (),
        summed: Iterable[str] = (),
        ignored: Iterable[str] = (),
        meanings: Mapping[str, str] | None = None,
    ) -> MetricAdapter:
        """Build an adapter from the reference's field layout (source-keyed dicts and sets).

        This is the shape the reference documents (``names``, ``weighted_by``, ``max_reduced``,
        ``ignored``); a key neither weighted, max-reduced nor summed is a plain mean.
        """
        weighted = dict(weighted_by or {})
        maxima = frozenset(max_reduced)
        sums = frozenset(summed)
        meanings = dict(meanings or {})
        for source in (set(weighted) | maxima | sums) - names.keys():
            raise MetricsError(
                f"adapter {name!r}: {source!r} is reduced specially but missing from names; fix: add it"
            )
        both = (weighted.keys() & maxima) | (weighted.keys() & sums) | (maxima & sums)
        if both:
            raise MetricsError(
                f"adapter {name!r}: {sorted(both)} are in more than one of weighted_by, max_reduced "
                "and summed; fix: each key has one reduction"
            )
        metrics = []
        for source, leaf in names.items():
            if source in weighted:
                weight_source = weighted[source]
                if weight_source not in names:
                    raise MetricsError(
                        f"adapter {name!r}: {source!r} is weighted by {weight_source!r}, which is "
                        "not in names; fix: declare the weight key"
                    )
                reduction, weight = Reduction.WEIGHTED_MEAN, names[weight_source]
            else:
                reduction = (
                    Reduction.MAX if source in maxima else Reduction.SUM if source in sums else Reduction.MEAN
                )
                weight = None
            metrics.append(
                Metric(leaf, reduction, meanings.get(source, ""), weight=weight, source=source)
            )
        return cls(name, metrics=metrics, internal_prefix=internal_prefix, phases=phases, ignored=ignored)

    # -- reading -----------------------------------------------------------------------------

    def __repr__(self) -> str:
        return f"MetricAdapter({self.name!r}, {len(self.metrics)} metrics, phases={sorted(self.phases)})"

    def public_key(self, source: str, phase: str) -> str:
        """The published key of ``source`` under ``phase`` (fixed namespaces ignore the phase)."""
        metric = self.metrics[source]
        return f"{metric.namespace or phase}/{metric.leaf}"

    def source_of_leaf(self, leaf: str) -> str:
        """The source name that publishes ``leaf``."""
        return self._by_leaf[leaf]

    def _sources(self, reduction: Reduction) -> frozenset[str]:
        return frozenset(s for s, m in self.metrics.items() if m.reduction is reduction)

    @property
    def names(self) -> dict[str, str]:
        """Source name to public leaf (the reference's ``names``)."""
        return {source: metric.leaf for source, metric in self.metrics.items()}

    @property
    def weighted_by(self) -> dict[str, str]:
        """Source name to the source name of its weight (the reference's ``weighted_by``)."""
        return {
            source: self._by_leaf[metric.weight]
            for source, metric in self.metrics.items()
            if metric.reduction is Reduction.WEIGHTED_MEAN and metric.weight is not None
        }

    @property
    def max_reduced(self) -> frozenset[str]:
        """Source names reduced by MAX (the reference's ``max_reduced``)."""
        return self._sources(Reduction.MAX)

    @property
    def min_reduced(self) -> frozenset[str]:
        return self._sources(Reduction.MIN)

    @property
    def summed(self) -> frozenset[str]:
        return self._sources(Reduction.SUM)

    @property
    def last(self) -> frozenset[str]:
        return self._sources(Reduction.LAST)

    @property
    def categorical(self) -> dict[str, tuple[str, ...]]:
        return {s: m.labels for s, m in self.metrics.items() if m.reduction is Reduction.CATEGORICAL}

    @property
    def counts(self) -> frozenset[str]:
        """Source names of counts: declared ``count=True``, or the weight or count of another key."""
        referenced = {m.weight for m in self.metrics.values() if m.weight is not None}
        return frozenset(s for s, m in self.metrics.items() if m.count or m.leaf in referenced)

    @property
    def families(self) -> dict[str, frozenset[str]]:
        """All-or-nothing families: family name to its source names."""
        out: dict[str, set[str]] = {}
        for source, metric in self.metrics.items():
            if metric.family is not None:
                out.setdefault(metric.family, set()).add(source)
        return {family: frozenset(sources) for family, sources in out.items()}
