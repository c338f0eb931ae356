"""The reduction core: declarations, the catalogue, exact reduction. Imports neither torch nor vendors."""

from __future__ import annotations

from .adapter import PHASES, Metric, MetricAdapter
from .catalog import adapter_names, get_adapter, register_adapter
from .errors import MetricsError
from .frame import Frame
from .reducer import MetricReducer, reduce_metrics
from .reduction import Reduction

__all__ = [
    "PHASES",
    "Frame",
    "Metric",
    "MetricAdapter",
    "MetricReducer",
    "MetricsError",
    "Reduction",
    "adapter_names",
    "get_adapter",
    "reduce_metrics",
    "register_adapter",
]
