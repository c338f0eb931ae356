"""Callbacks: thin adapters from a trainer's events to reduce/publish/close. One file per framework.

The framework callbacks import their framework, so they are not imported here: use
``posttrain_metrics.callbacks.transformers.PosttrainMetricsCallback`` (Hugging Face Trainer, TRL) and
``posttrain_metrics.callbacks.lightning.LightningMetricsCallback``.
"""

from __future__ import annotations

from .generic import MetricsCallback, build_callback

__all__ = ["MetricsCallback", "build_callback"]
