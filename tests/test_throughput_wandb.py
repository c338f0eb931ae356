"""The alternate x-axes in W&B (issue 28 item 5): the cumulative tokens, samples and time are step
metrics, and ``x_axis="tokens"`` binds every namespace to ``perf/tokens_total``; read back from
the offline run's own records."""

from __future__ import annotations

from pathlib import Path

import pytest

from posttrain_metrics import MetricsError
from posttrain_metrics.callbacks import MetricsCallback
from posttrain_metrics.core.throughput import Throughput
from posttrain_metrics.integrations.wandb import STEP_KEY, WandbSink
from posttrain_metrics.integrations.wandb_reader import read_offline_run

pytestmark = pytest.mark.slow  # W&B starts its wandb-core service process


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def run(tmp_path: Path, x_axis: str) -> object:
    clock = Clock()
    sink = WandbSink(dir=tmp_path, mode="offline", project="perf", x_axis=x_axis, system_metrics=False)
    cb = MetricsCallback(adapters=["grpo"], sinks=[sink], publisher="inline", out_dir=tmp_path,
                         perf=Throughput(clock=clock, memory=False))
    with cb:
        cb.on_run_start()
        assert cb.publisher.failures == {}, cb.publisher.failures
        for step, tokens in enumerate((100, 300, 50), 1):
            with cb.timer("generation"):
                clock.t += 0.5
            cb.on_chunk_end({"grpo_valid_token_count": tokens, "grpo_clip_frac": 0.1})
            clock.t = 2.0 * step
            cb.on_window_end(step)
    import wandb

    wandb.teardown()  # wandb-core closes the .wandb file asynchronously after finish()
    assert cb.publisher.failures == {}, cb.publisher.failures
    return read_offline_run(tmp_path / "wandb")


def test_namespaces_bound_to_tokens_seen(tmp_path: Path) -> None:
    wb = run(tmp_path, "tokens")
    for namespace in ("train", "timer", "perf"):
        assert wb.metric(f"{namespace}/*").step_metric == "perf/tokens_total", namespace  # type: ignore[attr-defined]
    assert wb.metric("train/clip_frac").step_metric == "perf/tokens_total"  # type: ignore[attr-defined]
    for axis in ("perf/tokens_total", "perf/samples_total", "perf/time_s"):
        assert not wb.metric(axis).step_metric, axis  # type: ignore[attr-defined]  # an axis itself
    assert wb.column("perf/tokens_total") == {1: 100, 2: 400, 3: 450}  # type: ignore[attr-defined]
    assert wb.column("perf/tokens_per_s") == {1: 50.0, 2: 150.0, 3: 25.0}  # type: ignore[attr-defined]
    assert wb.column("timer/generation_s") == {1: 0.5, 2: 0.5, 3: 0.5}  # type: ignore[attr-defined]


def test_default_axis_stays_the_step(tmp_path: Path) -> None:
    wb = run(tmp_path, "step")
    assert wb.metric("train/*").step_metric == STEP_KEY  # type: ignore[attr-defined]
    assert wb.metric("perf/tokens_per_s").step_metric == STEP_KEY  # type: ignore[attr-defined]
    assert not wb.metric("perf/time_s").step_metric  # type: ignore[attr-defined]  # still selectable


def test_unknown_axis_is_refused() -> None:
    with pytest.raises(MetricsError, match="x_axis"):
        WandbSink(x_axis="epochs")
