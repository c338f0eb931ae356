"""Live health on real runs: a publisher process that finds a KL spike tells every tracker (TensorBoard,
MLflow, W&B offline, read back) and stops the run; on 2 and 4 gloo ranks every rank stops after the
same step, the journal holds the steps up to it and the end record says why; a publisher that dies
never stops training."""

from __future__ import annotations

import functools
import json
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from _runs import GRPO_ADAPTERS, gloo_rank, grpo_chunk, run_ranks, wait_for

from posttrain_metrics.journal import read_journal
from posttrain_metrics.publication.follower import status_path
from posttrain_metrics.publication.health import findings_path, read_findings, stop_path

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]  # publisher processes, gloo ranks, wandb-core

SPIKE = 9
CONFIG = {"rl": {"n_mini": 2}, "rollout": {"max_tokens": 16}}
OUT_ENV = "POSTTRAIN_METRICS_TEST_LIVE_HEALTH_OUT"


def chunks(rank: int, step: int) -> list[dict[str, object]]:
    """Two chunks of a GRPO window; at SPIKE one token owns the KL term and the gradient jumps."""
    rng = random.Random(1000 * step + rank)
    out = [grpo_chunk(rng, step, c == 1) for c in range(2)]
    if step == SPIKE:
        for chunk in out:
            chunk.update(grpo_kl_mean=1e-3, grpo_kl_max=5.0)
        out[1]["grad_norm"] = 40.0
    return out


def train(cb: Any, rank: int = 0, steps: int = 400) -> int:
    """A generic loop: one window per step, stop when the callback says so; the last step run."""
    cb.on_run_start(CONFIG)
    step = 0
    for step in range(1, steps + 1):
        for chunk in chunks(rank, step):
            cb.on_chunk_end(chunk)
        cb.on_window_end(step)
        if cb.should_stop:
            break
        time.sleep(0.05)  # a training step's time: the publisher reads the journal meanwhile
    cb.on_run_end()
    return step


def test_a_kl_spike_is_on_every_tracker_and_stops_the_run(tmp_path):
    from test_export import mlflow_series_of, tensorboard_series

    from posttrain_metrics.callbacks import MetricsCallback
    from posttrain_metrics.integrations.wandb_reader import read_offline_run

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cb = MetricsCallback(adapters=GRPO_ADAPTERS, out_dir=tmp_path, run_id="livehealth1", health={"kl_spike": "stop"},
                         sinks=[{"type": "journal"}, {"type": "tensorboard", "log_dir": str(tmp_path / "tb")},
                                {"type": "mlflow", "tracking_uri": uri},
                                {"type": "wandb", "mode": "offline", "dir": str(tmp_path / "wandb"),
                                 "project": "live-health"}])
    last = train(cb)
    journal = cb.publisher.journal_path
    assert journal is not None
    assert SPIKE < last < 400 and cb.stopped_by == "kl_spike"
    run = read_journal(journal)
    assert [f.step for f in run.frames] == list(range(1, last + 1))
    assert run.end is not None and run.end["status"] == "finished" and "kl_spike" in run.end["reason"]
    lines = read_findings(journal)
    spike = [e for e in lines if e.get("check") == "kl_spike"]
    assert [(e["step"], e["action"], e["when"], e["steps"]) for e in spike] == [(SPIKE, "stop", "live", [SPIKE])]
    assert lines[-1]["kind"] == "close" and {f["check"] for f in lines[-1]["findings"]} == {"kl_spike"}
    assert json.loads(stop_path(journal).read_text())["step"] == SPIKE

    tb = tensorboard_series(tmp_path / "tb")
    assert tb["health/kl_spike"] == [(SPIKE, 1.0)]
    assert tb["health/update_skipped"] == [(1, 0.0)]  # a check that never fired: 0 at the first step
    series, tags, _ = mlflow_series_of(uri, "livehealth1")
    assert series["health/kl_spike"] == [(SPIKE, 1.0)] and series["health/run_end"] == [(1, 0.0)]
    assert tags["health/kl_spike"].startswith(f"step {SPIKE} (warning, action stop)")
    wb = read_offline_run(tmp_path / "wandb")
    alerts = [r.alert for r in wb.records if r.WhichOneof("record_type") == "alert"]
    assert [a.title for a in alerts] == [f"kl_spike (warning) at step {SPIKE}"]
    assert wb.summary["health/kl_spike"]["step"] == SPIKE and wb.summary["health/kl_spike"]["action"] == "stop"
    assert "kl_spike" in wb.summary["posttrain_metrics/end_reason"]


def test_a_publisher_that_dies_never_stops_training(tmp_path):
    from posttrain_metrics.callbacks import MetricsCallback

    cb = MetricsCallback(adapters=GRPO_ADAPTERS, out_dir=tmp_path, health={"kl_spike": "stop"},
                         sinks=[{"type": "journal"}, {"type": "tensorboard", "log_dir": str(tmp_path / "tb")}])
    cb.on_run_start(CONFIG)
    journal = cb.publisher.journal_path
    assert journal is not None
    pid = cb.publisher.process.pid
    wait_for("the publisher's status", lambda: status_path(journal).exists())
    os.kill(pid, signal.SIGKILL)
    for step in range(1, 4):  # no spike: nothing to stop for, whatever the publisher does
        for chunk in chunks(0, step + 20):
            cb.on_chunk_end(chunk)
        cb.on_window_end(step)
        assert not cb.should_stop
    cb.on_run_end()
    assert not cb.should_stop and not stop_path(journal).exists()
    assert read_journal(journal).end["status"] == "finished"
    assert findings_path(journal).exists()  # the restarted publisher wrote it afresh


# -- gloo ranks ------------------------------------------------------------------------------------------


def _stop_scenario(rank: int, world: int) -> dict[str, Any]:
    from posttrain_metrics.callbacks import MetricsCallback

    out = Path(os.environ[OUT_ENV])
    cb = MetricsCallback(adapters=GRPO_ADAPTERS, out_dir=out, run_id=f"gloo{world}", health={"kl_spike": "stop"},
                         sinks=[{"type": "journal"}, {"type": "tensorboard", "log_dir": str(out / "tb")}])
    last = train(cb, rank, steps=300)
    return {"last": last, "should_stop": cb.should_stop, "by": cb.stopped_by}


@pytest.mark.parametrize("world", [2, 4])
def test_every_gloo_rank_stops_after_the_same_step(world, tmp_path, monkeypatch):
    from test_export import tensorboard_series

    out = tmp_path / "run"
    monkeypatch.setenv(OUT_ENV, str(out))
    got = run_ranks(functools.partial(gloo_rank, _stop_scenario, world=world), tmp_path / "store", world=world,
                    timeout=360)
    assert all("crash" not in r for r in got.values()), got
    lasts = {r["last"] for r in got.values()}
    assert len(lasts) == 1 and all(r["should_stop"] and r["by"] == "kl_spike" for r in got.values()), got
    last = lasts.pop()
    assert SPIKE < last < 300
    print(f"world {world}: kl_spike at step {SPIKE}, every rank stopped after step {last}")
    run = read_journal(out / "journal.jsonl")
    assert [f.step for f in run.frames] == list(range(1, last + 1))
    assert run.end is not None and "stopped by live health: kl_spike" in run.end["reason"]
    tb = tensorboard_series(out / "tb")
    assert [s for s, _ in tb["train/kl_max"]] == list(range(1, last + 1)) and tb["health/kl_spike"] == [(SPIKE, 1.0)]
    status = json.loads(status_path(out / "journal.jsonl").read_text())
    assert status["state"] == "closed" and status["status"] == "finished"
    assert status["health"]["stopped"]["check"] == "kl_spike" and status["health"]["stopped"]["step"] == SPIKE
