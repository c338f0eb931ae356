"""Per-step cost of the Hugging Face callback and of ``exact_grpo`` on top of TRL's GRPOTrainer (issue 29).

One process, CPU, a tiny random Llama (2 layers, hidden 32) and a word-level tokenizer built here,
so TRL's own step is as short as it gets and our overhead is as large a share of it as it can be.
Configurations, run in interleaved rounds (each round runs every configuration once, so machine
load drifts over all of them alike):

- ``trl``: ``report_to="none"``, no callback (the baseline);
- ``trl+tensorboard``: ``report_to="tensorboard"``, TRL's own logger;
- ``callback``: our ``PosttrainMetricsCallback`` (journal + TensorBoard through the publisher
  process), TRL's reporters off;
- ``exact``: the same callback plus ``exact_grpo(trainer, metrics)``.

Printed: the optimizer step's wall time, from one step's start to the next (median and p90 over
the steps of every round, the first two of each run left out), its ratio to ``trl``, and for ``callback`` / ``exact`` the time the
training thread spends in our code per step (the callback's events, the recorder, ``on_chunk_end``),
median, measured inside the run. No extra collective is involved: a 1-process run has none, and the
2-process test shows the one all_gather per step carries every key.

    python benchmarks/bench_trl.py            # 5 rounds x 30 steps (a few minutes)
    python benchmarks/bench_trl.py --quick    # 1 round x 8 steps, a smoke test
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

CONFIGS = ("trl", "trl+tensorboard", "callback", "exact")


def tiny(words: int = 5) -> tuple[Any, Any]:
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = ["<pad>", "<eos>", "<unk>"] + [f"w{i}" for i in range(words)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                                     unk_token="<unk>")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, eos_token_id=1, bos_token_id=None,
        tie_word_embeddings=True)
    return transformers.LlamaForCausalLM(config), tokenizer


class Clock:
    """The optimizer step's wall time: from one ``on_step_begin`` to the next (the whole cycle: the
    step, the log, every callback's work, ours included), as a plain TrainerCallback."""

    def __init__(self) -> None:
        import transformers

        outer = self

        class _Cb(transformers.TrainerCallback):  # type: ignore[misc]
            def on_step_begin(self, *a: Any, **k: Any) -> None:
                now = time.perf_counter()
                if outer.begin:
                    outer.steps.append(now - outer.begin)
                outer.begin = now

        self.callback, self.steps, self.begin = _Cb(), [], 0.0


def timed(owner: Any, name: str, bucket: list[float]) -> None:
    """Replace ``owner.name`` by a wrapper adding its duration to ``bucket[-1]`` (the current step)."""
    original = getattr(owner, name)

    def wrapper(*a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        try:
            return original(*a, **k)
        finally:
            if bucket:
                bucket[-1] += time.perf_counter() - t

    setattr(owner, name, wrapper)


def run(config: str, steps: int, root: Path) -> tuple[list[float], list[float]]:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from posttrain_metrics.callbacks import trl as exact
    from posttrain_metrics.callbacks.transformers import PosttrainMetricsCallback

    out = Path(tempfile.mkdtemp(dir=root))
    model, tokenizer = tiny()
    model.save_pretrained(out / "model")  # beta > 0: TRL loads the reference from the path
    tokenizer.save_pretrained(out / "model")
    prompts = Dataset.from_dict({"prompt": [" ".join(f"w{(i * 3 + j) % 5}" for j in range(3)) for i in range(512)]})

    def reward(completions: list[str], **kwargs: Any) -> list[float]:
        return [1.0 if len(c.split()) % 2 == 0 else 0.0 for c in completions]

    args = GRPOConfig(
        output_dir=str(out / "grpo"), use_cpu=True, bf16=False, per_device_train_batch_size=4,
        gradient_accumulation_steps=2, num_generations=4, max_completion_length=8, max_steps=steps,
        num_iterations=1, beta=0.04, learning_rate=1e-3, logging_steps=1, save_strategy="no", disable_tqdm=True,
        seed=0, report_to="tensorboard" if config == "trl+tensorboard" else "none",
    )
    clock = Clock()
    ours: list[float] = []  # seconds in our code, per step
    callbacks = [clock.callback]
    metrics = None
    if config in ("callback", "exact"):
        metrics = PosttrainMetricsCallback(out_dir=out, sinks=[{"type": "journal"}, {"type": "tensorboard"}])
        for event in ("on_step_begin", "on_step_end", "on_log"):
            timed(metrics, event, ours)
        callbacks.append(metrics)
    trainer = GRPOTrainer(model=str(out / "model"), reward_funcs=[reward], args=args, train_dataset=prompts,
                          processing_class=tokenizer, callbacks=callbacks)
    begin = clock.callback.on_step_begin

    def step_begin(*a: Any, **k: Any) -> None:
        ours.append(0.0)
        begin(*a, **k)

    clock.callback.on_step_begin = step_begin
    if config == "exact" and metrics is not None:
        exact.exact_grpo(trainer, metrics)
        for name in ("loss_chunk", "generation_chunk"):
            timed(exact._Recorder, name, ours)
        timed(metrics, "on_chunk_end", ours)
    if metrics is not None:
        with metrics:
            trainer.train()
    else:
        trainer.train()
    return clock.steps[2:], ours[2:-1]  # ours[k] is step k's; the last step has no successor in steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    a = parser.parse_args()
    rounds, steps = (1, 8) if a.quick else (a.rounds, a.steps)
    import logging

    import torch
    import transformers
    import trl

    logging.disable(logging.WARNING)
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    step_s: dict[str, list[float]] = {c: [] for c in CONFIGS}
    ours_s: dict[str, list[float]] = {c: [] for c in CONFIGS}
    from posttrain_metrics.callbacks import trl as exact

    originals = {name: getattr(exact._Recorder, name) for name in ("loss_chunk", "generation_chunk")}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(rounds):
            for config in CONFIGS:
                s, o = run(config, steps, Path(tmp))
                for name, fn in originals.items():  # the class-level timers off again
                    setattr(exact._Recorder, name, fn)
                step_s[config] += s
                ours_s[config] += o
    base = statistics.median(step_s["trl"])
    print(f"# TRL GRPOTrainer per-step cost (trl {trl.__version__}, transformers {transformers.__version__}, "
          f"torch {torch.__version__}, {os.cpu_count()} CPUs, {rounds} rounds x {steps} steps)\n")
    print("| configuration | step median (ms) | p90 (ms) | ratio to trl | our code per step, median (us) |")
    print("|---|---|---|---|---|")
    for config in CONFIGS:
        values = sorted(step_s[config])
        p90 = values[int(0.9 * (len(values) - 1))]
        med = statistics.median(values)
        own = f"{statistics.median(ours_s[config]) * 1e6:.0f}" if ours_s[config] and config in ("callback", "exact") \
            else "-"
        print(f"| {config} | {med * 1e3:.2f} | {p90 * 1e3:.2f} | {med / base:.3f} | {own} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
