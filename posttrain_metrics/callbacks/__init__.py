"""Callbacks: thin adapters from a trainer's events to reduce/publish/close. One file per framework."""

from __future__ import annotations

from .generic import MetricsCallback, build_callback

__all__ = ["MetricsCallback", "build_callback"]
