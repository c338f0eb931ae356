"""Run aggregates of exact counters and flags (issue 24, item 6): each declares in the catalogue what
it aggregates to over the run, and every tracker shows that at close. The demo's journal has
``optim/step_skipped`` true at steps 1, 2, 3, 7, 8, 9 and 70 of 80: ``run/optim/step_skipped`` is 7
(the windows where it held), never the last window's 0."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_export import mlflow_series, tensorboard_series, wandb_series

from posttrain_metrics import Frame, get_adapter
from posttrain_metrics.core.adapter import Metric, MetricAdapter
from posttrain_metrics.core.catalog import BUILTIN
from posttrain_metrics.core.errors import MetricsError
from posttrain_metrics.core.keys import describe
from posttrain_metrics.core.reduction import Reduction, RunAggregate
from posttrain_metrics.core.summary import RunSummary
from posttrain_metrics.integrations.mlflow import MlflowSink
from posttrain_metrics.integrations.tensorboard import TensorBoardSink
from posttrain_metrics.integrations.wandb import WandbSink
from posttrain_metrics.publication import Publisher

pytestmark = pytest.mark.timeout(300)

RUN_ID = "exportrun0001"  # the id test_export's readers look for
SKIPPED = {1, 2, 3, 7, 8, 9, 70}
STEPS = 80


def demo_frames() -> list[Frame]:
    """80 windows: skipped at SKIPPED (a streak of 3, then 3, then 1), one update per window."""
    out, committed, streak = [], 0, 0
    for step in range(1, STEPS + 1):
        skipped = step in SKIPPED
        committed += not skipped
        streak = streak + 1 if skipped else 0
        out.append(Frame(step, {
            "optim/step_skipped": skipped,
            "optim/optimizer_step": committed,
            "optim/attempt_id": step,
            "optim/nonfinite_skips_total": sum(s <= step for s in SKIPPED),
            "optim/nonfinite_skips_consecutive": streak,
            "optim/updates_skipped": int(skipped),
            "optim/updates_applied": int(not skipped),
            "optim/finite_gradient_check_enabled": True,
        }, "train", 1_700_000_000.0 + step))
    return out


# Worked out by hand from demo_frames' rule, not from the code under test.
WANT: dict[str, Any] = {
    "run/optim/step_skipped": 7,  # windows where it held
    "run/optim/optimizer_step": 73,  # last value: 80 windows - 7 skipped
    "run/optim/attempt_id": 80,  # last value
    "run/optim/nonfinite_skips_total": 7,  # last value of a cumulative counter
    "run/optim/nonfinite_skips_consecutive": 3,  # the longest streak (1-3 and 7-9); the last value is 0
    "run/optim/updates_skipped": 7,  # total of the windows' own counts
    "run/optim/updates_applied": 73,
    "run/optim/finite_gradient_check_enabled": 1,  # a setting: its last value (True)
}


def test_every_exact_counter_and_flag_of_the_catalogue_declares_its_run_aggregate() -> None:
    declared = {(a.name, m.leaf): m.run for a in BUILTIN for m in a.metrics.values() if m.reduction is Reduction.AGREED}
    assert declared == {
        ("trainer", "step_skipped"): RunAggregate.WINDOWS,
        ("trainer", "attempt_id"): RunAggregate.LAST,
        ("trainer", "optimizer_step"): RunAggregate.LAST,
        ("trainer", "nonfinite_skips_total"): RunAggregate.LAST,
        ("trainer", "nonfinite_skips_consecutive"): RunAggregate.MAX,
        ("trainer", "zero_grad_skips_total"): RunAggregate.LAST,
        ("trainer", "finite_gradient_check_enabled"): RunAggregate.LAST,
        ("trainer", "updates_applied"): RunAggregate.TOTAL,
        ("trainer", "updates_skipped"): RunAggregate.TOTAL,
        ("trainer", "updates_discarded"): RunAggregate.TOTAL,
        ("ppo", "policy_optimizer_step"): RunAggregate.LAST,
        ("ppo", "critic_optimizer_step"): RunAggregate.LAST,
        ("ppo", "actor_warmup"): RunAggregate.WINDOWS,
    }


def test_the_run_summary_reads_each_counter_as_declared() -> None:
    summary = RunSummary(describe([get_adapter("trainer")]))
    for frame in demo_frames():
        summary.add(frame)
    got = summary.values()
    assert {f"run/{k}": v for k, v in got.items()} == {**WANT, "run/optim/finite_gradient_check_enabled": True}
    assert type(got["optim/step_skipped"]) is int


def test_ppo_warmup_windows_are_counted() -> None:
    summary = RunSummary(describe([get_adapter("ppo")]))
    for step, warm in enumerate([1.0, 1.0, 0.0, 0.0, 0.0], 1):
        summary.add(Frame(step, {"train/actor_warmup": warm}))
    assert summary.values()["train/actor_warmup"] == 2


def test_a_run_aggregate_is_declared_on_exact_counters_only() -> None:
    with pytest.raises(MetricsError, match=r"run=.* fix: declare it Reduction\.AGREED"):
        MetricAdapter("mine", metrics=[Metric("events", Reduction.SUM, "Events", count=True, run=RunAggregate.TOTAL)])
    with pytest.raises(MetricsError, match=r"TOTAL sums a window's own count; fix: declare count=True"):
        MetricAdapter("mine", metrics=[Metric("events", Reduction.AGREED, "Events", run=RunAggregate.TOTAL)])


def test_every_tracker_shows_the_declared_run_aggregates(tmp_path: Path) -> None:
    tb = tmp_path / "tb"
    sinks = [TensorBoardSink(log_dir=tb), MlflowSink(dir=tmp_path, experiment_name="aggregates"),
             WandbSink(project="aggregates", dir=tmp_path, settings={"quiet": True})]
    pub = Publisher(sinks, adapters=["trainer"], run_name="aggregates", run_id=RUN_ID)
    pub.start({})
    for frame in demo_frames():
        pub.publish(frame)
    pub.close()
    import wandb

    wandb.teardown()
    _, summary = wandb_series(tmp_path)
    assert {k: summary[k] for k in WANT} == WANT
    series, _, _ = mlflow_series(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert {k: series[k][-1][1] for k in WANT} == WANT
    hparams = tensorboard_series(tb / "hparams")
    assert {k: hparams[k][-1][1] for k in WANT} == WANT
