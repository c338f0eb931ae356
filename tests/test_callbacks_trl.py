"""TRL's GRPOTrainer made exact in one line (issue 29): ``exact_grpo(trainer, metrics)``, on 1 and 2 processes.

Each run is a subprocess executing this file (``--worker grpo``), over gloo through
``torch.distributed.run`` for 2 ranks, with a tiny random ``LlamaForCausalLM`` and a word-level
tokenizer built here (nothing is downloaded). The vocabulary is small, so the random policy ends
its completions at different lengths and the micro-batches hold different token counts.

The oracle: a hook in the worker saves, per micro-batch and per rank, the loss mask and the per-token
entropy, K3 and clip indicators (from the log-probabilities the policy's forward returned, the
batch's old and reference log-probabilities and advantages, by TRL's formulas), and the local
completion lengths of each generation. The expected window figures are computed from those by hand,
token-weighted over everything; the published figures must equal them, and TRL's own logged figure
must differ from them. The figures are read back from the journal, MLflow (SQLite), TensorBoard
(``EventAccumulator``) and, on the 2-process run, W&B (an offline run, read with our reader).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from _runs import need as _need

transformers = _need("transformers", "hf")

from posttrain_metrics import MetricsError  # noqa: E402
from posttrain_metrics.callbacks.transformers import PosttrainMetricsCallback  # noqa: E402
from posttrain_metrics.journal import read_journal  # noqa: E402

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
from test_callbacks_transformers import mlflow_history, run_worker_file, tiny_llama, tiny_tokenizer  # noqa: E402

EPS = 0.05  # TRL's clip epsilon in the runs: small, so the second iteration over a batch clips
BETA = 0.04


# -- worker side ----------------------------------------------------------------------------------


def worker_grpo(out: Path) -> None:
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from posttrain_metrics.callbacks.trl import exact_grpo

    rank = int(os.environ.get("RANK", "0"))
    tokenizer = tiny_tokenizer(words=5)  # 8 tokens, one of them EOS: completions end at varied lengths
    model_dir = out / f"tiny-llama-{rank}"  # each rank its own copy: the same seed, the same weights
    tiny_llama(len(tokenizer)).save_pretrained(model_dir)  # beta > 0: TRL loads the reference from a path
    tokenizer.save_pretrained(model_dir)
    prompts = Dataset.from_dict({"prompt": [" ".join(f"w{(i * 3 + j) % 5}" for j in range(3)) for i in range(64)]})

    def short_and_even(completions: list[str], **kwargs: Any) -> list[float]:
        return [1.0 if len(c.split()) % 2 == 0 else 0.25 * (len(c.split()) < 4) for c in completions]

    def length(completions: list[str], **kwargs: Any) -> list[float | None]:
        return [None if not c else len(c) / 10 for c in completions]

    args = GRPOConfig(
        output_dir=str(out / "grpo"), use_cpu=True, bf16=False, gradient_checkpointing=False,
        per_device_train_batch_size=4, gradient_accumulation_steps=2, num_generations=4, max_completion_length=8,
        max_steps=4, num_iterations=2, beta=BETA, epsilon=EPS, use_bias_correction_kl=False, learning_rate=5e-2,
        logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True, seed=0,
        **({"ddp_backend": "gloo"} if "RANK" in os.environ else {}),
    )
    sinks: list[dict[str, Any]] = [{"type": "journal"}, {"type": "console"}, {"type": "tensorboard"},
                                   {"type": "mlflow", "experiment_name": "trl-exact"}]
    if "RANK" in os.environ:  # the 2-process run also writes an offline W&B run
        sinks.append({"type": "wandb", "project": "trl-exact", "mode": "offline", "system_metrics": False,
                      "settings": {"quiet": True}})
    metrics = PosttrainMetricsCallback(out_dir=out, run_name="trl-exact", sinks=sinks)
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=[short_and_even, length], args=args,
                          train_dataset=prompts, processing_class=tokenizer)
    dump = open(out / f"oracle-rank{rank}.jsonl", "w")  # noqa: SIM115 - closed below
    seen: dict[str, Any] = {}

    forward = trainer._get_per_token_logps_and_entropies

    def keep_forward(*a: Any, **kw: Any) -> Any:
        logps, entropies, aux = forward(*a, **kw)
        if kw.get("compute_entropy"):
            seen["logps"], seen["entropies"] = logps.detach(), entropies.detach()
        return logps, entropies, aux

    trainer._get_per_token_logps_and_entropies = keep_forward
    compute_loss = trainer.compute_loss

    def oracle_loss(model: Any, inputs: Any, *a: Any, **kw: Any) -> Any:
        loss = compute_loss(model, inputs, *a, **kw)
        if model.training:
            mask = inputs["completion_mask"].double()
            logps, entropies = seen["logps"].double(), seen["entropies"].double()
            old = inputs.get("old_per_token_logps")
            old = logps if old is None else old.double()
            ref = inputs["ref_per_token_logps"].double()
            ratio = torch.exp(logps - old)
            adv = inputs["advantages"].double().unsqueeze(1)
            low = ((ratio < 1 - EPS) & (adv < 0)).double()
            high = ((ratio > 1 + EPS) & (adv > 0)).double()
            kl = torch.exp(ref - logps) - (ref - logps) - 1
            row = {"step": trainer.state.global_step + 1, "rank": rank, "mask": mask.tolist(),
                   "entropy": entropies.tolist(), "kl": kl.tolist(), "low": low.tolist(), "high": high.tolist()}
            dump.write(json.dumps(row) + "\n")
        return loss

    trainer.compute_loss = oracle_loss
    generate = trainer._generate

    def oracle_generate(*a: Any, **kw: Any) -> Any:
        result = generate(*a, **kw)
        if trainer.model.training:
            stop = {*trainer.eos_token_ids, trainer._tokenizer.pad_token_id}
            dump.write(json.dumps({"step": trainer.state.global_step + 1, "rank": rank,
                                   "lengths": [len(ids) for ids in result[1]],
                                   "terminated": [ids[-1] in stop for ids in result[1]]}) + "\n")
        return result

    trainer._generate = oracle_generate
    trainer = exact_grpo(trainer, metrics)  # the one line
    with metrics:
        trainer.train()
    dump.close()
    if trainer.is_world_process_zero():
        (out / "log_history.json").write_text(json.dumps(trainer.state.log_history))


# -- test side ------------------------------------------------------------------------------------


def frames_of(out: Path) -> dict[int, dict[str, Any]]:
    journal = read_journal(out / "journal.jsonl")
    assert journal.end is not None and journal.end["status"] == "finished"
    frames = [f for f in journal.frames if f.phase == "train"]
    assert len({f.step for f in frames}) == len(frames), "one frame per optimizer step"
    return {f.step: dict(f.metrics) for f in frames}


def token_truth(rows: list[dict[str, Any]], key: str) -> float:
    num = den = 0.0
    for r in rows:
        for values, mask in zip(r[key], r["mask"], strict=True):
            num += sum(v * m for v, m in zip(values, mask, strict=True))
            den += sum(mask)
    return num / den


def micro_batch_means(rows: list[dict[str, Any]], key: str, ranks: int) -> float:
    """TRL's figure: each micro-batch's token mean over the ranks, then the plain mean over them."""
    by_micro: dict[int, list[dict[str, Any]]] = {}
    for index, r in enumerate(sorted(rows, key=lambda r: r["rank"])):
        by_micro.setdefault(index % (len(rows) // ranks), []).append(r)
    means = [token_truth(group, key) for group in by_micro.values()]
    return sum(means) / len(means)


@pytest.mark.slow
def test_exact_grpo_equals_the_token_oracle_and_trl_does_not_on_one_and_two_processes(tmp_path: Path) -> None:
    keys = {ranks: check_run(tmp_path / f"ranks{ranks}", ranks) for ranks in (1, 2)}
    assert keys[1] == keys[2], keys[1] ^ keys[2]  # the same keys from 1 and 2 processes


def check_run(out: Path, ranks: int) -> set[str]:
    run_worker_file(HERE, "grpo", out, ranks=ranks)
    frames = frames_of(out)
    assert sorted(frames) == [1, 2, 3, 4]
    logged = {row["step"]: row for row in json.loads((out / "log_history.json").read_text()) if "loss" in row}
    rows = [json.loads(line) for r in range(ranks) for line in (out / f"oracle-rank{r}.jsonl").read_text().splitlines()]
    loss_rows = [r for r in rows if "mask" in r]
    generations = [r for r in rows if "lengths" in r]

    differs = {"entropy": 0, "clip": 0}
    for step, metrics in frames.items():
        window = [r for r in loss_rows if r["step"] == step]
        assert len(window) == 2 * ranks  # 2 micro-batches per rank
        tokens = [sum(map(sum, r["mask"])) for r in window]
        assert metrics["train/valid_token_count"] == sum(tokens)
        truth = {key: token_truth(window, key) for key in ("entropy", "kl", "low", "high")}
        region = token_truth([{**r, "region": [[a + b for a, b in zip(x, y, strict=True)]
                                               for x, y in zip(r["low"], r["high"], strict=True)]}
                              for r in window], "region")
        assert metrics["train/entropy_mean"] == pytest.approx(truth["entropy"], rel=1e-5, abs=1e-7)
        assert metrics["train/kl_mean"] == pytest.approx(truth["kl"], rel=1e-4, abs=1e-7)
        assert metrics["train/clip_low_frac"] == pytest.approx(truth["low"], abs=1e-7)
        assert metrics["train/clip_high_frac"] == pytest.approx(truth["high"], abs=1e-7)
        assert metrics["train/clip_frac"] == pytest.approx(region, abs=1e-7)
        row = logged[step]
        # TRL's own figure is the plain mean of the micro-batch means (checked against the oracle too)
        assert row["entropy"] == pytest.approx(micro_batch_means(window, "entropy", ranks), rel=1e-5)
        if len(set(tokens)) > 1 and abs(row["entropy"] - truth["entropy"]) > 1e-5 * truth["entropy"]:
            differs["entropy"] += 1
        if abs(row["clip_ratio/region_mean"] - region) > 1e-6:
            differs["clip"] += 1
        assert "train/trl_entropy" not in metrics and "train/trl_clip_ratio_low_mean" not in metrics
        # generations: lengths and truncation over every completion of every rank
        made = [r for r in generations if r["step"] == step]
        if made:
            lengths = [n for r in made for n in r["lengths"]]
            ended = [n for r in made for n, t in zip(r["lengths"], r["terminated"], strict=True) if t]
            assert metrics["train/response_count"] == len(lengths)
            assert metrics["train/response_len_mean"] == pytest.approx(sum(lengths) / len(lengths), rel=1e-6)
            assert metrics["train/response_len_max"] == max(lengths)
            assert metrics["train/response_len_min"] == min(lengths)
            assert metrics["train/rollout_truncated_frac"] == pytest.approx(1 - len(ended) / len(lengths), abs=1e-7)
            assert metrics["train/terminated_count"] == len(ended)
            if ended:
                assert metrics["train/terminated_len_mean"] == pytest.approx(sum(ended) / len(ended), rel=1e-6)
            assert metrics["train/reward_mean"] == pytest.approx(row["reward"], rel=1e-6)  # one generation
            assert "train/reward_short_and_even_mean" in metrics and "train/reward_length_std" in metrics
            assert "train/trl_reward_std" not in metrics
        else:
            assert "train/response_len_mean" not in metrics and "train/reward_mean" not in metrics
        assert metrics["train/epoch"] == row["epoch"] and "train/trl_epoch" not in metrics
    assert differs["entropy"] >= 1, "the run needs micro-batches whose token counts differ"
    if ranks == 2:
        assert differs["clip"] >= 1, "TRL's clip fraction equals the exact one on every step"

    run, history = mlflow_history(out, "trl-exact")
    assert run.info.status == "FINISHED"
    from _runs import tensorboard_run
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tensorboard_run(out)), size_guidance={"scalars": 0})
    events.Reload()
    wandb_run = None
    if ranks > 1:
        from posttrain_metrics.integrations.wandb_reader import read_offline_run

        wandb_run = read_offline_run(out / "wandb")
    for key in ("train/entropy_mean", "train/clip_frac", "train/kl_mean", "train/valid_token_count",
                "train/clip_low_frac", "train/epoch"):
        for step, metrics in frames.items():
            assert history[key][step] == pytest.approx(metrics[key], rel=1e-12), (key, step)
            assert {e.step: e.value for e in events.Scalars(key)}[step] == pytest.approx(metrics[key], rel=1e-6)
            if wandb_run is not None:
                assert wandb_run.column(key)[step] == pytest.approx(metrics[key], rel=1e-12), (key, step)
    for key in ("train/response_len_mean", "train/reward_mean", "train/reward_std", "train/terminated_len_max"):
        for step, metrics in frames.items():
            if key in metrics:
                assert history[key][step] == pytest.approx(metrics[key], rel=1e-12), (key, step)
                if wandb_run is not None:
                    assert wandb_run.column(key)[step] == pytest.approx(metrics[key], rel=1e-12), (key, step)
    return {k for m in frames.values() for k in m}


# -- fast, in process -----------------------------------------------------------------------------


def test_a_trl_outside_the_range_or_with_moved_internals_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import trl

    from posttrain_metrics.callbacks import trl as exact

    assert exact.check_trl() == trl.__version__
    monkeypatch.setattr(trl, "__version__", "0.19.1")
    with pytest.raises(MetricsError, match=r"supports TRL >=1.16,<2 \(tested 1.16.0\); this is TRL 0.19.1"):
        exact.check_trl()
    monkeypatch.setattr(trl, "__version__", "1.17.0")

    class Moved(trl.GRPOTrainer):  # type: ignore[misc]
        def _compute_loss(self, model: Any, inputs: Any) -> Any:  # a TRL that logs differently
            return None

    with pytest.raises(MetricsError, match=r"TRL 1.17.0's .*Moved._compute_loss no longer computes"):
        exact.check_trl(Moved)


def test_exact_grpo_wants_our_callback_and_its_adapters() -> None:
    from posttrain_metrics.callbacks.trl import exact_grpo

    with pytest.raises(MetricsError, match="metrics is a dict"):
        exact_grpo(object(), {})  # type: ignore[arg-type]
    trainer = type("T", (), {"_metrics": {"train": {}}, "reward_func_names": []})()
    with pytest.raises(MetricsError, match=r"lack \['trl_grpo_exact'\]"):
        exact_grpo(trainer, PosttrainMetricsCallback(adapters=["grpo", "reward", "trainer"], sinks=[{"type": "memory"}]))


def fake_trainer(level: str, rank: int, rewards: Any = None) -> Any:
    from types import SimpleNamespace as NS

    args = NS(importance_sampling_level=level, use_bias_correction_kl=False, num_iterations=1, logging_steps=1,
              gradient_accumulation_steps=2, steps_per_generation=2, logging_strategy="steps", use_vllm=False)
    return NS(args=args, _metrics={"train": {}}, model=NS(training=True), eos_token_ids=[1],
              _tokenizer=NS(pad_token_id=0), accelerator=NS(process_index=rank), reward_func_names=["f"])


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_each_ranks_share_of_trl_global_means_reduces_to_the_exact_figure(level: str) -> None:
    """The hint, in process: TRL's global mean of each micro-batch, weighted by each rank's count."""
    import torch

    from posttrain_metrics import reduce_metrics
    from posttrain_metrics.callbacks.trl import _Recorder

    # micro-batch -> rank -> (loss mask, whether each row was clipped); token counts differ everywhere
    data = [
        [([[1, 1, 1, 0], [1, 0, 0, 0]], [1, 0]), ([[1, 1, 1, 1], [1, 1, 0, 0]], [0, 1])],
        [([[1, 0, 0, 0], [1, 1, 0, 0]], [1, 1]), ([[1, 1, 1, 1], [1, 1, 1, 0]], [0, 0])],
    ]
    chunks: list[list[dict[str, Any]]] = [[], []]
    tokens_all = rows_all = hits_tok = hits_seq = 0
    for micro in data:
        tok = sum(sum(map(sum, mask)) for mask, _ in micro)
        rows = sum(len(mask) for mask, _ in micro)
        tok_hits = sum(f * sum(row) for mask, flags in micro for row, f in zip(mask, flags, strict=True))
        seq_hits = sum(sum(flags) for _, flags in micro)
        tokens_all, rows_all, hits_tok, hits_seq = tokens_all + tok, rows_all + rows, hits_tok + tok_hits, \
            hits_seq + seq_hits
        global_mean = seq_hits / rows if level == "sequence" else tok_hits / tok  # what TRL appends
        for r, (mask, _) in enumerate(micro):
            recorder = _Recorder(fake_trainer(level, r), "1.16.0")
            inputs = {"completion_mask": torch.tensor(mask), "advantages": torch.zeros(len(mask))}
            chunks[r].append(recorder.loss_chunk(inputs, {"clip_ratio/region_mean": [global_mean], "entropy": [0.5]}))
    frame = reduce_metrics(["grpo", "trl_grpo_exact"], chunks)
    if level == "sequence":
        assert frame["train/seq_clip_frac"] == hits_seq / rows_all and frame["train/valid_sequence_count"] == rows_all
        assert "train/clip_frac" not in frame
    else:
        assert frame["train/clip_frac"] == pytest.approx(hits_tok / tokens_all, rel=1e-15)
        assert frame["train/valid_token_count"] == tokens_all
    assert frame["train/entropy_mean"] == 0.5


def test_generation_figures_take_each_ranks_completions_and_the_population_std() -> None:
    import torch

    from posttrain_metrics import reduce_metrics
    from posttrain_metrics.callbacks.trl import _Recorder

    rewards = torch.tensor([[1.0], [0.0], [float("nan")], [1.0], [1.0], [0.0]])  # 3 completions per rank
    values = [1.0, 0.0, 1.0, 1.0, 0.0]  # the scored ones
    mean = sum(values) / 5
    sample_std = (sum((v - mean) ** 2 for v in values) / 4) ** 0.5
    new = {"reward": [mean], "reward_std": [sample_std], "rewards/f/mean": [mean], "rewards/f/std": [sample_std],
           "completions/mean_length": [4.0], "completions/max_length": [8.0]}
    chunks = []
    for r, completions in enumerate(([[5, 1], [5, 5, 5, 5, 5, 5, 5, 5], [1]], [[5, 5, 5, 1], [5, 1], [5, 5, 1]])):
        recorder = _Recorder(fake_trainer("token", r), "1.16.0")
        recorder.local_completions, recorder.rewards = completions, rewards
        chunks.append([recorder.generation_chunk(new)])
    ours = [[{k: v for k, v in c.items() if not k.startswith("train/reward_f_")} for c in rank] for rank in chunks]
    frame = reduce_metrics(["grpo", "reward", "trl_grpo_exact"], ours)
    assert frame["train/rollout_count"] == 5 and frame["train/response_count"] == 6
    assert frame["train/reward_mean"] == pytest.approx(mean) and frame["train/response_len_max"] == 8.0
    population = (sum((v - mean) ** 2 for v in values) / 5) ** 0.5
    assert frame["train/reward_std"] == pytest.approx(population, rel=1e-12)
    assert frame["train/terminated_count"] == 5  # every completion but the one cut at 8 tokens
    assert chunks[0][0]["train/reward_f_count"] == 2 and chunks[1][0]["train/reward_f_count"] == 3


def test_a_log_after_the_generation_window_does_not_republish_trls_interval_mean() -> None:
    """logging_steps=2 with a generation every 2 optimizer steps (num_iterations=2): the generation is
    recorded exactly in window 1; TRL's log at step 2 repeats it (its mean over the interval's
    generations), which must not come back as train/response_len_mean or train/reward_mean at step 2."""
    from types import SimpleNamespace

    from posttrain_metrics.callbacks.trl import _Recorder, _supersede
    from posttrain_metrics.integrations.memory import MemorySink

    sink = MemorySink()
    cb = PosttrainMetricsCallback(sinks=[sink])
    trainer = fake_trainer("token", 0)
    _supersede(cb, _Recorder(trainer, "1.16.0"), [])
    args = type("GRPOConfig", (SimpleNamespace,), {})(
        importance_sampling_level="token", use_bias_correction_kl=False, logging_steps=2, logging_strategy="steps",
        gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=2, beta=0.0, to_dict=dict)
    state, control = transformers.TrainerState(), transformers.TrainerControl()
    cb.on_train_begin(args, state, control)
    loss = {"grpo_valid_token_count": 10, "trl_exact_policy_token_count": 10, "trl_exact_entropy_mean": 0.5}
    for step in (1, 2):
        state.global_step = step
        cb.on_step_begin(args, state, control)
        if step == 1:  # the generation of both windows
            cb.on_chunk_end({"grpo_response_count": 4, "grpo_response_len_mean": 3.0, "rollout_count": 4,
                             "reward_mean": 0.25})
        cb.on_chunk_end(loss)
        control.should_log = step == 2
        cb.on_step_end(args, state, control)
    cb.on_log(args, state, control, logs={"loss": 1.0, "entropy": 0.5, "completions/mean_length": 7.0,
                                          "reward": 0.75, "epoch": 1.0})
    cb.on_train_end(args, state, control)
    first, second = sink.frames
    assert first.metrics["train/response_len_mean"] == 3.0 and first.metrics["train/reward_mean"] == 0.25
    assert "train/response_len_mean" not in second.metrics, second.metrics
    assert "train/reward_mean" not in second.metrics, second.metrics
    assert second.metrics["train/loss_avg"] == 1.0 and second.metrics["train/entropy_mean"] == 0.5


def wrappable(callbacks: list[Any]) -> Any:
    """A stand-in GRPOTrainer with what exact_grpo touches (the TRL check is patched out)."""
    trainer = fake_trainer("token", 0)
    for name in ("compute_loss", "_generate", "_calculate_rewards", "_generate_and_score_completions"):
        setattr(trainer, name, lambda *a, **kw: None)
    trainer.callback_handler = type("Handler", (), {"callbacks": callbacks})()
    trainer.add_callback = callbacks.append
    return trainer


def test_exact_grpo_adds_the_callback_once_and_refuses_a_second_wrap_or_a_second_callback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from posttrain_metrics.callbacks import trl as exact

    monkeypatch.setattr(exact, "check_trl", lambda trainer_class=None: "1.16.0")
    metrics = PosttrainMetricsCallback(sinks=[{"type": "memory"}])
    given = wrappable([metrics])  # already in callbacks=[...]
    assert exact.exact_grpo(given, metrics) is given and given.callback_handler.callbacks == [metrics]
    with pytest.raises(MetricsError, match="already wrapped"):
        exact.exact_grpo(given, metrics)
    bare = wrappable([])
    other = PosttrainMetricsCallback(sinks=[{"type": "memory"}])
    exact.exact_grpo(bare, other)
    assert bare.callback_handler.callbacks == [other]
    # another PosttrainMetricsCallback already on the trainer: two publishers of one run, the exact
    # figures in one and TRL's means in the other
    third = PosttrainMetricsCallback(sinks=[{"type": "memory"}])
    with pytest.raises(MetricsError, match="another PosttrainMetricsCallback"):
        exact.exact_grpo(wrappable([third]), PosttrainMetricsCallback(sinks=[{"type": "memory"}]))
    for cb in (metrics, other, third):
        cb.on_run_end()


if __name__ == "__main__":
    _, flag, kind, where = sys.argv
    assert flag == "--worker"
    {"grpo": worker_grpo}[kind](Path(where))
