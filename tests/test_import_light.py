"""``import posttrain_metrics`` is light, and its public API is pinned."""

from __future__ import annotations

import json
import subprocess
import sys

import posttrain_metrics

HEAVY = ["torch", "wandb", "mlflow", "tensorboard", "tensorboardX", "transformers", "matplotlib", "numpy"]

PUBLIC_API = [
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

_PROBE = """
import json, sys
import posttrain_metrics
from posttrain_metrics import reduce_metrics, MetricReducer
reduce_metrics(["grpo", "reward", "trainer"], [[{"grpo_kl_max": 1.0, "update_outcome": "applied"}], []])
r = MetricReducer("grpo")
r.add({"grpo_kl_max": 2.0})
r.reduce(1)
heavy = %r
loaded = sorted(m for m in sys.modules if m.split(".")[0] in heavy)
print(json.dumps(loaded))
"""


def test_import_loads_no_heavy_module() -> None:
    # a fresh interpreter: this test process has torch and numpy loaded already
    out = subprocess.run(
        [sys.executable, "-c", _PROBE % HEAVY], capture_output=True, text=True, timeout=60, check=True
    )
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded == [], f"importing and using posttrain_metrics loaded {loaded}"


def test_public_api_is_pinned() -> None:
    assert sorted(posttrain_metrics.__all__) == posttrain_metrics.__all__ == PUBLIC_API
    for name in PUBLIC_API:
        assert hasattr(posttrain_metrics, name), name


def test_errors_are_value_errors() -> None:
    assert issubclass(posttrain_metrics.MetricsError, ValueError)
