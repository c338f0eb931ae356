"""posttrain-metrics: exact, well-labelled post-training metrics for W&B, MLflow and TensorBoard.

Importing the package is light: no torch, no tracker SDK. Backends are imported where used.
"""

from __future__ import annotations

from .core import (
    Frame,
    Metric,
    MetricAdapter,
    MetricReducer,
    MetricsError,
    Reduction,
    adapter_names,
    get_adapter,
    reduce_metrics,
    register_adapter,
)

__version__ = "0.1.0"

__all__ = [
    "Frame",
    "Metric",
    "MetricAdapter",
    "MetricReducer",
    "MetricsError",
    "Reduction",
    "__version__",
    "adapter_names",
    "get_adapter",
    "reduce_metrics",
    "register_adapter",
]
