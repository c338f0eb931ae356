"""The Lightning callback, for real: DDP over 2 gloo processes with accumulate_grad_batches=4.

The run is a subprocess executing this file (``--worker``); Lightning's ``ddp`` strategy re-launches
it for rank 1. Each batch carries a token-weighted fraction whose token count differs per batch
and per rank. The test computes the exact global fraction of every optimizer window from what the
ranks saw, and checks that our key equals it while Lightning's ``self.log(..., sync_dist=True)`` of
the same per-batch fraction (a mean over ranks, then over batches) does not.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _runs import need as _need

L = _need("lightning.pytorch", "lightning")

from posttrain_metrics import MetricsError  # noqa: E402
from posttrain_metrics.callbacks.lightning import OUTPUT_KEY, LightningMetricsCallback  # noqa: E402
from posttrain_metrics.journal import read_journal  # noqa: E402

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
ACCUMULATE = 4
EPOCHS = 2  # 16 items, 2 ranks, batches of 2: 4 batches per rank per epoch = one optimizer window


# -- worker side (every DDP rank) -----------------------------------------------------------------------


def worker(out: Path) -> None:
    import torch
    from lightning.pytorch.loggers import CSVLogger
    from lightning.pytorch.strategies import DDPStrategy
    from torch.utils.data import DataLoader, TensorDataset

    class Fractions(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.save_hyperparameters({"accumulate_grad_batches": ACCUMULATE})
            self.layer = torch.nn.Linear(4, 1)
            self.dump = open(out / f"batches-rank{os.environ.get('LOCAL_RANK', '0')}.jsonl", "a")  # noqa: SIM115

        def training_step(self, batch: Any, batch_idx: int) -> dict[str, Any]:
            x, tokens, hits = batch
            loss = self.layer(x).pow(2).mean()
            t, h = tokens.sum(), hits.sum()
            fraction = h.double() / t.double()  # e.g. clipped tokens over tokens of this batch
            self.log("fraction_sync_dist", fraction, sync_dist=True, on_step=False, on_epoch=True, batch_size=len(x))
            self.dump.write(json.dumps({"step": self.trainer.global_step + 1, "tokens": int(t), "hits": int(h)}) + "\n")
            self.dump.flush()
            return {"loss": loss, OUTPUT_KEY: {"grpo_clip_frac": fraction, "grpo_valid_token_count": t,
                                               "grpo_kl_max": fraction.float()}}

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    n = 16
    tokens = torch.tensor([1 + (i * 7) % 13 for i in range(n)])
    hits = torch.tensor([(i * 5) % 4 for i in range(n)]).clamp(max=tokens)
    data = DataLoader(TensorDataset(torch.randn(n, 4), tokens, hits), batch_size=2, shuffle=False)
    callback = LightningMetricsCallback(adapters=["grpo"], sinks=[{"type": "journal"}, {"type": "tensorboard"}],
                                        out_dir=out, run_name="lightning")
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend="gloo"), max_epochs=EPOCHS,
        accumulate_grad_batches=ACCUMULATE, callbacks=[callback], logger=CSVLogger(out, name="csv", version=0),
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False, log_every_n_steps=1,
    )
    trainer.fit(Fractions(), data)


# -- test side ----------------------------------------------------------------------------------------


def lightning_epoch_values(out: Path) -> list[float]:
    with open(out / "csv" / "version_0" / "metrics.csv") as f:
        return [float(row["fraction_sync_dist"]) for row in csv.DictReader(f) if row.get("fraction_sync_dist")]


def test_ddp_two_gloo_ranks_token_weighted_key_is_exact_where_sync_dist_is_not(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, str(HERE), "--worker", str(out)], capture_output=True, text=True,
                            timeout=240, env=env, cwd=out)
    assert result.returncode == 0, f"lightning run failed:\n{result.stdout[-4000:]}\n{result.stderr[-6000:]}"

    journal = read_journal(out / "journal.jsonl")
    assert journal.end is not None and journal.end["status"] == "finished"
    frames = {f.step: dict(f.metrics) for f in journal.frames if f.phase == "train"}
    assert sorted(frames) == list(range(1, EPOCHS + 1)), "one frame per optimizer window, published once"

    batches = [json.loads(line) for r in (0, 1) for line in (out / f"batches-rank{r}.jsonl").read_text().splitlines()]
    sync_dist = lightning_epoch_values(out)
    assert len(sync_dist) == EPOCHS
    for step, metrics in frames.items():
        window = [b for b in batches if b["step"] == step]
        assert len(window) == 2 * ACCUMULATE
        assert len({b["tokens"] for b in window}) > 2, "token counts must differ per batch and rank"
        exact = sum(b["hits"] for b in window) / sum(b["tokens"] for b in window)
        ours, lightning = metrics["train/clip_frac"], sync_dist[step - 1]
        shown = f"step {step}: exact {exact!r}, ours {ours!r}, Lightning sync_dist {lightning!r}"
        assert ours == pytest.approx(exact, rel=1e-12, abs=0), shown
        assert abs(lightning - exact) > 1e-3, shown
        assert metrics["train/valid_token_count"] == sum(b["tokens"] for b in window), shown
        assert metrics["train/kl_max"] == pytest.approx(max(b["hits"] / b["tokens"] for b in window), rel=1e-6)
        print(shown)

    from _runs import tensorboard_run
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tensorboard_run(out)), size_guidance={"scalars": 0})
    events.Reload()
    assert {e.step for e in events.Scalars("train/clip_frac")} == set(frames)


def test_training_step_metrics_must_be_a_mapping() -> None:
    callback = LightningMetricsCallback(adapters=["grpo"], sinks=[{"type": "memory"}])
    # Recorded rather than raised in the batch hook, so that the rank still joins the window's
    # collective; the window's reduce then raises it (on every rank) and is discarded.
    refused = callback._chunk({"loss": 0.0, OUTPUT_KEY: 0.5}, "training_step")
    assert refused is not None
    callback.metrics.on_chunk_end(refused)
    with pytest.raises(MetricsError, match="dict of source names"):
        callback.metrics.on_window_end(1)
    callback.metrics.on_chunk_end({"grpo_kl_max": 0.5})
    assert callback.metrics.on_window_end(2).metrics == {"train/kl_max": 0.5}  # the next window is clean
    assert callback._chunk({"loss": 0.0}, "training_step") is None
    callback.metrics.on_run_end()


@pytest.mark.parametrize(("max_steps", "estimated", "want"), [
    (20, 8, 20),  # max_steps set: it bounds the run
    (-1, 8, 8),  # unset (Lightning's -1): Lightning's estimate from epochs and batches
    (-1, float("inf"), None),  # unbounded: no total, no ETA
    (-1, RuntimeError("no length"), None),  # the estimate cannot be made: unknown, not an error
])
def test_total_steps_from_the_trainer(max_steps: int, estimated: Any, want: int | None) -> None:
    from posttrain_metrics.callbacks.lightning import _total_steps

    class Trainer:  # the two public attributes the callback reads
        def __init__(self) -> None:
            self.max_steps = max_steps

        @property
        def estimated_stepping_batches(self) -> Any:
            if isinstance(estimated, Exception):
                raise estimated
            return estimated

    assert _total_steps(Trainer()) == want  # type: ignore[arg-type]


if __name__ == "__main__":
    _, flag, where = sys.argv
    assert flag == "--worker"
    worker(Path(where))
