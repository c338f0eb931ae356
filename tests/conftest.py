"""Shared fixtures. tests/ is on sys.path (pytest rootdir import mode), so helpers import directly."""

from __future__ import annotations

import os

# Never let a developer's real tracker credentials or servers leak into the tests.
for var in ("WANDB_API_KEY", "MLFLOW_TRACKING_URI", "WANDB_MODE", "WANDB_BASE_URL"):
    os.environ.pop(var, None)
os.environ.setdefault("WANDB_SILENT", "true")

import _profiles  # noqa: E402
from _mlflow_server import clean_mlflow_env, mlflow_server  # noqa: E402,F401  (MLflow variables cleared; a real server)

HYPOTHESIS_PROFILE = _profiles.load()  # before any test module builds its settings from the default
