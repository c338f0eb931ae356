"""The callback built three ways (Python, plain dict, Hydra instantiate of the example YAML)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import yaml
from _runs import CloseCountingSink, grpo_chunk, tensorboard_run

from posttrain_metrics import MetricsError
from posttrain_metrics.callbacks import MetricsCallback, build_callback
from posttrain_metrics.integrations import MemorySink
from posttrain_metrics.journal import read_journal

EXAMPLE = Path(__file__).parent.parent / "examples" / "grpo_callback.yaml"


def drive(callback: MetricsCallback, steps: int = 4) -> None:
    rng = random.Random(7)
    with callback:
        callback.on_run_start({"rl": {"kl_beta": 0.04}, "wandb": {"api_key": "PLANTED-SECRET"}})
        for step in range(1, steps + 1):
            for c in range(3):
                callback.on_chunk_end(grpo_chunk(rng, step, last=c == 2))
            callback.on_window_end(step)
        callback.on_validation_end(steps, {"reward_avg": 0.5, "reward_std": 0.1})


def local_sinks(out: Path) -> list[dict]:
    return [{"type": "journal"}, {"type": "console"}]


def test_three_constructions_publish_identical_frames(tmp_path):
    adapters = ["grpo", "reward", "trainer", "validation"]
    python = MetricsCallback(adapters=adapters, sinks=[{"type": "journal"}], out_dir=tmp_path / "py")
    plain = build_callback({"_target_": "posttrain_metrics.callbacks.MetricsCallback", "adapters": adapters,
                            "sinks": [{"type": "journal"}], "out_dir": str(tmp_path / "dict")})
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(EXAMPLE).metrics
    cfg.adapters = adapters
    cfg.out_dir = str(tmp_path / "hydra")
    cfg.sinks = [{"type": "journal"}]
    hydra = instantiate(cfg)
    assert isinstance(hydra, MetricsCallback)
    runs = []
    for cb, sub in ((python, "py"), (plain, "dict"), (hydra, "hydra")):
        drive(cb)
        runs.append(read_journal(tmp_path / sub / "journal.jsonl"))
    first = [(f.step, f.phase, dict(f.metrics)) for f in runs[0].frames]
    assert len(first) == 5 and first[-1][1] == "val" and "val/reward_avg" in first[-1][2]
    for other in runs[1:]:
        assert [(f.step, f.phase, dict(f.metrics)) for f in other.frames] == first
    for run in runs:
        assert "PLANTED-SECRET" not in run.path.read_text()


def test_example_yaml_builds_every_sink_without_hydra(tmp_path):
    spec = yaml.safe_load(EXAMPLE.read_text())["metrics"]
    spec["out_dir"] = str(tmp_path)
    cb = build_callback(spec)
    assert sorted(s.name for s in cb.sinks) == ["console", "journal", "mlflow", "tensorboard", "wandb"]


def test_memory_sink_and_exception_unwinding_marks_failure(tmp_path):
    sink = MemorySink()
    cb = MetricsCallback(adapters=["grpo", "reward", "trainer"], sinks=[sink])
    with pytest.raises(RuntimeError), cb:
        cb.on_chunk_end({"grpo_kl_max": 1.0})
        cb.on_window_end(1)
        raise RuntimeError("training crashed")
    assert sink.closed is True and len(sink.frames) == 1
    counting = CloseCountingSink()  # counts closes: MemorySink's own guard would hide a second one
    cb = MetricsCallback(adapters=["grpo", "reward", "trainer"], sinks=[counting])
    with pytest.raises(RuntimeError), cb:
        cb.on_chunk_end({"grpo_kl_max": 1.0})
        cb.on_window_end(1)
        raise RuntimeError("training crashed")
    assert counting.closes == [True]
    cb.on_run_end()  # idempotent: no second close reaches the sink
    assert counting.closes == [True]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"adapters": ["grpo"], "sinks": [{"type": "nope"}]}, "unknown sink type 'nope'"),
        ({"adapters": ["grpo"], "sinks": [{"type": "console", "colour": 1}]}, "does not take option"),
        ({"adapters": ["grpo"], "sinks": [{"type": "journal", "path": "../../escape.jsonl"}]}, "outside the output folder"),
        ({"adapters": ["nope"]}, "unknown adapter 'nope'"),
        ({"sinks": []}, "needs adapters"),
        ({"adapters": ["grpo"], "sink": []}, "unknown callback option"),
    ],
)
def test_bad_configs_fail_at_construction(tmp_path, config, message):
    with pytest.raises(MetricsError, match=message):
        build_callback({**config, "out_dir": str(tmp_path)})


@pytest.mark.parametrize("publisher", ["process", "thread"])
def test_the_callback_reports_the_trackers_run_handles(tmp_path, publisher):
    """Once the publisher has started the trackers, the callback names their runs: the TensorBoard
    log dir and the MLflow run (which holds the run's steps: the handle is the real one)."""
    import time

    from mlflow.tracking import MlflowClient

    cb = MetricsCallback(adapters=["grpo", "reward", "trainer"], out_dir=tmp_path, publisher=publisher,
                         sinks=[{"type": "journal"}, {"type": "tensorboard"}, {"type": "mlflow"}])
    assert cb.run_handles == {}  # nothing started yet
    cb.on_run_start({})
    deadline = time.monotonic() + 120
    while not {"tensorboard", "mlflow"} <= set(cb.run_handles) and time.monotonic() < deadline:
        time.sleep(0.05)
    handles = cb.run_handles
    assert handles["tensorboard"]["log_dir"] == str(tensorboard_run(tmp_path).resolve())  # the run's own dir
    rng = random.Random(1)
    with cb:
        for step in range(1, 4):
            cb.on_chunk_end(grpo_chunk(rng, step, last=True))
            cb.on_window_end(step)
    run = MlflowClient(handles["mlflow"]["tracking_uri"]).get_run(handles["mlflow"]["run_id"])
    assert run.info.status == "FINISHED" and run.data.metrics["train/loss_avg"] is not None
    assert handles["mlflow"]["tracking_uri"] == f"sqlite:///{(tmp_path / 'mlflow.db').resolve()}"
