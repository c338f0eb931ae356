"""The README's example runs as written: examples/grpo_loop.py with examples/grpo_callback.yaml."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from posttrain_metrics.journal import read_journal

pytestmark = pytest.mark.slow  # runs the examples as scripts

ROOT = Path(__file__).resolve().parent.parent


def test_the_readme_loop_runs_with_the_example_config_and_every_sink(tmp_path: Path) -> None:
    out = tmp_path / "my-run"
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "grpo_loop.py"), "--out", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    journal = read_journal(out / "journal.jsonl")
    assert journal.end is not None and journal.end["status"] == "finished"
    train = [f for f in journal.frames if f.phase == "train"]
    val = [f for f in journal.frames if f.phase == "val"]
    assert [f.step for f in train] == list(range(1, 21)) and [f.step for f in val] == [10, 20]
    # two chunks of 120 and 80 tokens per step, and 8 rollouts each
    assert all(f.metrics["train/valid_token_count"] == 200 and f.metrics["train/rollout_count"] == 16 for f in train)
    assert all(f.metrics["optim/update_outcome"] == "applied" for f in train)
    assert val[0].metrics == {"val/reward_avg": 0.5, "val/reward_std": 0.5}
    # every sink of the example config wrote where the config says
    for name in ("tensorboard", "mlflow.db", "wandb"):
        assert (out / name).exists(), name
