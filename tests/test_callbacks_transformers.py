"""The Hugging Face callback, for real: a Trainer over 2 gloo ranks and a TRL GRPOTrainer, on the CPU.

Each run is a subprocess executing this file (``--worker trainer|grpo``), so the test process keeps
no distributed or accelerate state. Models are tiny random ``LlamaForCausalLM``s built from a config
here, tokenizers are built locally over a word list: nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from _runs import need as _need

transformers = _need("transformers", "hf")

from posttrain_metrics import Metric, MetricAdapter, MetricsError, Reduction  # noqa: E402
from posttrain_metrics.callbacks.transformers import (  # noqa: E402
    TRL_GRPO_MAPPING,
    PosttrainMetricsCallback,
    When,
    conditions,
)
from posttrain_metrics.integrations import MemorySink  # noqa: E402
from posttrain_metrics.journal import read_journal  # noqa: E402

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1"}

# A user adapter for what the worker records per micro-batch: exact token-weighted figures.
LM = MetricAdapter(
    "lm_test",
    internal_prefix="lm_",
    metrics=[
        Metric("token_count", Reduction.SUM, "Label tokens of the window", unit="tokens"),
        Metric("token_nll", Reduction.WEIGHTED_MEAN, "Token mean of the next-token NLL", weight="token_count"),
        Metric("token_accuracy", Reduction.WEIGHTED_MEAN, "Fraction of label tokens predicted", weight="token_count"),
    ],
)


# -- worker side (runs in the subprocesses) ------------------------------------------------------------


def tiny_tokenizer(words: int = 61) -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = ["<pad>", "<eos>", "<unk>"] + [f"w{i}" for i in range(words)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                                unk_token="<unk>")


def tiny_llama(vocab: int) -> Any:
    import torch

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, eos_token_id=1, bos_token_id=None,
        tie_word_embeddings=True,
    )
    return transformers.LlamaForCausalLM(config)


def sinks(wandb: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"type": "journal"}, {"type": "console"}, {"type": "tensorboard"},
                                 {"type": "mlflow", "experiment_name": "hf-callback"}]
    if wandb:
        out.append({"type": "wandb", "project": "hf-callback", "mode": "offline",
                    "system_metrics": False, "settings": {"quiet": True}})
    return out


def worker_trainer(out: Path) -> None:
    """Causal-LM training, 2 micro-batches per optimizer step, on every rank torchrun started."""
    import torch
    import torch.nn.functional as F

    rank = int(os.environ.get("RANK", "0"))
    model = tiny_llama(64)
    rows = []
    for i in range(24):  # uneven lengths: token counts differ per micro-batch and per rank
        n = 3 + (i * 5) % 11
        ids = [3 + (i * 7 + j * 3) % 61 for j in range(n)]
        rows.append({"input_ids": ids, "labels": ids})

    def collate(batch: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        width = max(len(r["input_ids"]) for r in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for k, r in enumerate(batch):
            n = len(r["input_ids"])
            ids[k, :n] = torch.tensor(r["input_ids"])
            labels[k, :n] = torch.tensor(r["labels"])
            mask[k, :n] = 1
        return {"input_ids": ids, "labels": labels, "attention_mask": mask}

    callback = PosttrainMetricsCallback(
        adapters=["grpo", "reward", "trainer", "validation", "trl_grpo", "hf_trainer", LM],
        sinks=sinks(wandb=True), out_dir=out, run_name="hf-trainer",
    )
    dump = open(out / f"chunks-rank{rank}.jsonl", "w")  # noqa: SIM115 - closed below

    class Recording(transformers.Trainer):
        def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False,
                         num_items_in_batch: Any = None) -> Any:
            loss, outputs = super().compute_loss(model, inputs, return_outputs=True,
                                                 num_items_in_batch=num_items_in_batch)
            if model.training:
                logits = outputs.logits[:, :-1].detach().double()
                labels = inputs["labels"][:, 1:]
                valid = labels != -100
                tokens = int(valid.sum())
                nll = float(F.cross_entropy(logits[valid], labels[valid], reduction="sum"))
                correct = int((logits.argmax(-1)[valid] == labels[valid]).sum())
                callback.on_chunk_end({"lm_token_count": tokens, "lm_token_nll": nll / tokens,
                                       "lm_token_accuracy": correct / tokens})
                dump.write(json.dumps({"step": self.state.global_step + 1, "tokens": tokens, "nll": nll,
                                       "correct": correct}) + "\n")
            return (loss, outputs) if return_outputs else loss

    args = transformers.TrainingArguments(
        output_dir=str(out / "hf"), per_device_train_batch_size=2, per_device_eval_batch_size=4,
        gradient_accumulation_steps=2, max_steps=3, logging_steps=1, eval_strategy="steps", eval_steps=3,
        learning_rate=1e-3, use_cpu=True, ddp_backend="gloo", report_to="none", save_strategy="no",
        disable_tqdm=True, dataloader_num_workers=0, seed=0,
    )
    trainer = Recording(model=model, args=args, train_dataset=rows, eval_dataset=rows[:8], data_collator=collate,
                        callbacks=[callback])
    with callback:
        trainer.train()
    dump.close()
    if trainer.is_world_process_zero():
        (out / "log_history.json").write_text(json.dumps(trainer.state.log_history))


def worker_grpo(out: Path) -> None:
    """TRL GRPO on one process: a few optimizer steps, a reward function defined here."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = tiny_tokenizer()
    model_dir = out / "tiny-llama"
    tiny_llama(len(tokenizer)).save_pretrained(model_dir)  # beta > 0: TRL loads the reference from a path
    tokenizer.save_pretrained(model_dir)
    prompts = Dataset.from_dict({"prompt": [" ".join(f"w{(i * 7 + j) % 61}" for j in range(3)) for i in range(32)]})

    def short_and_even(completions: list[str], **kwargs: Any) -> list[float]:
        return [1.0 if len(c.split()) % 2 == 0 else 0.25 * (len(c.split()) < 6) for c in completions]

    args = GRPOConfig(
        output_dir=str(out / "grpo"), use_cpu=True, bf16=False, gradient_checkpointing=False,
        per_device_train_batch_size=4, gradient_accumulation_steps=2, num_generations=4, max_completion_length=8,
        max_steps=4, num_iterations=2, beta=0.04, use_bias_correction_kl=False, learning_rate=5e-3, logging_steps=1, report_to="none",
        save_strategy="no", disable_tqdm=True, seed=0,
    )
    callback = PosttrainMetricsCallback(sinks=sinks(wandb=False), out_dir=out, run_name="trl-grpo")
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=[short_and_even], args=args, train_dataset=prompts,
                          processing_class=tokenizer, callbacks=[callback])
    with callback:
        trainer.train()
    (out / "log_history.json").write_text(json.dumps(trainer.state.log_history))


# -- test side ---------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_worker(kind: str, out: Path, *, ranks: int) -> subprocess.CompletedProcess[str]:
    return run_worker_file(HERE, kind, out, ranks=ranks)


def run_worker_file(script: Path, kind: str, out: Path, *, ranks: int) -> subprocess.CompletedProcess[str]:
    """Run ``script --worker kind out`` (under torch.distributed.run for several ranks), offline."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(script), "--worker", kind, str(out)]
    if ranks > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks),
               "--master_addr", "127.0.0.1", "--master_port", str(free_port()), *cmd[1:]]
    env = {**os.environ, **OFFLINE, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    for var in ("WANDB_API_KEY", "MLFLOW_TRACKING_URI", "WANDB_MODE"):
        env.pop(var, None)
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=out)
    assert result.returncode == 0, f"{kind} run failed:\n{result.stdout[-4000:]}\n{result.stderr[-6000:]}"
    return result


def mlflow_history(out: Path, experiment: str) -> tuple[Any, dict[str, dict[int, float]]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{out}/mlflow.db")
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no MLflow experiment {experiment!r} in {out}/mlflow.db"
    (run,) = client.search_runs([found.experiment_id])
    history = {key: {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
               for key in run.data.metrics}
    return run, history


def train_frames(out: Path) -> dict[int, dict[str, Any]]:
    journal = read_journal(out / "journal.jsonl")
    assert journal.end is not None and journal.end["status"] == "finished"
    frames = [f for f in journal.frames if f.phase == "train"]
    assert len({f.step for f in frames}) == len(frames), "one frame per optimizer step"
    return {f.step: dict(f.metrics) for f in frames}


UNIT_WEIGHTS = ("train/weight_sum", "train/valid_token_count", "train/valid_sequence_count",
                "train/response_count", "train/rollout_count")


def test_trainer_two_gloo_ranks_maps_logged_keys_and_reduces_micro_batches_exactly(tmp_path: Path) -> None:
    out = tmp_path / "trainer"
    run_worker("trainer", out, ranks=2)
    frames = train_frames(out)
    assert sorted(frames) == [1, 2, 3]
    logged = {row["step"]: row for row in json.loads((out / "log_history.json").read_text()) if "loss" in row}

    # 1. the Trainer's logged keys under our names, equal to what the Trainer logged
    for step, metrics in frames.items():
        row = logged[step]
        assert metrics["train/loss_avg"] == row["loss"]
        assert metrics["train/grad_norm"] == row["grad_norm"]
        assert metrics["train/learning_rate"] == row["learning_rate"]
        assert metrics["train/epoch"] == row["epoch"] and "train/trl_epoch" not in metrics
        assert not set(UNIT_WEIGHTS) & set(metrics), "a unit weight was published"

    # 2. the per-micro-batch path: exact over both ranks and both micro-batches of each window
    chunks = [json.loads(line) for r in (0, 1) for line in (out / f"chunks-rank{r}.jsonl").read_text().splitlines()]
    for step, metrics in frames.items():
        window = [c for c in chunks if c["step"] == step]
        assert len(window) == 4  # 2 ranks x 2 micro-batches
        tokens = sum(c["tokens"] for c in window)
        assert len({c["tokens"] for c in window}) > 1, "the test needs uneven micro-batches"
        assert metrics["train/token_count"] == tokens
        assert metrics["train/token_nll"] == pytest.approx(sum(c["nll"] for c in window) / tokens, rel=1e-12)
        assert metrics["train/token_accuracy"] == pytest.approx(sum(c["correct"] for c in window) / tokens,
                                                                 rel=1e-12)
        # transformers 5 normalises by the global label-token count: its logged loss is the exact token
        # mean of the window (float32), so our train/loss_avg agrees with the exact figure we reduced
        assert metrics["train/loss_avg"] == pytest.approx(metrics["train/token_nll"], rel=1e-5)

    # 3. evaluation: eval_loss and the Trainer's timings pass through under val/
    journal = read_journal(out / "journal.jsonl")
    (val,) = [f for f in journal.frames if f.phase == "val"]
    assert val.step == 3 and "val/loss" in val.metrics and "val/runtime_s" in val.metrics
    assert "val/samples_per_s" in val.metrics and "val/steps_per_s" in val.metrics
    assert not any(k.startswith("val/trl_") for k in val.metrics), sorted(val.metrics)

    # 4. the same figures in MLflow (embedded SQLite), TensorBoard and W&B (offline), read back
    run, history = mlflow_history(out, "hf-callback")
    assert run.info.status == "FINISHED"
    from _runs import tensorboard_run
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from posttrain_metrics.integrations.wandb_reader import read_offline_run

    events = EventAccumulator(str(tensorboard_run(out)), size_guidance={"scalars": 0})
    events.Reload()
    wandb_run = read_offline_run(out / "wandb")
    for key in ("train/loss_avg", "train/grad_norm", "train/learning_rate", "train/token_nll",
                "train/token_accuracy", "train/epoch"):
        for step, metrics in frames.items():
            assert history[key][step] == pytest.approx(metrics[key], rel=1e-12), (key, step)
            assert {e.step: e.value for e in events.Scalars(key)}[step] == pytest.approx(metrics[key], rel=1e-6)
            assert wandb_run.column(key)[step] == pytest.approx(metrics[key], rel=1e-12), (key, step)
    assert not set(UNIT_WEIGHTS) & set(history)


GRPO_HEADLINES = ("train/loss_avg", "train/reward_mean", "train/grad_norm", "train/kl_mean")


def test_trl_grpo_trainer_publishes_headline_keys_under_our_names(tmp_path: Path) -> None:
    out = tmp_path / "grpo"
    result = run_worker("grpo", out, ranks=1)
    frames = train_frames(out)
    assert sorted(frames) == [1, 2, 3, 4]
    logged = {row["step"]: row for row in json.loads((out / "log_history.json").read_text()) if "loss" in row}
    mapped = {m.logged: m.key for m in TRL_GRPO_MAPPING if m.phase == "train" and m.when is not When.SEQUENCE_LEVEL}
    for step, metrics in frames.items():
        row = logged[step]
        for key in GRPO_HEADLINES:  # rewards exist only on steps that generated (see below)
            assert key in metrics or (key == "train/reward_mean" and step % 2 == 0), (step, key, sorted(metrics))
        assert metrics["train/kl_beta"] == 0.04
        for trl_key, ours in mapped.items():
            if trl_key in row:
                assert metrics[ours] == pytest.approx(row[trl_key], rel=1e-12), (step, trl_key, ours)
        assert metrics["train/trl_entropy"] == pytest.approx(row["entropy"], rel=1e-12)
        assert not set(UNIT_WEIGHTS) & set(metrics), "a unit weight was published"
        assert not any(k.startswith("train/trl_") and k[len("train/trl_"):] in {m.replace("/", "_") for m in mapped}
                       for k in metrics), "a mapped key was also passed through"
    # num_iterations=2: completions are generated every other step, so those keys are absent, not zero
    generated = [s for s, m in frames.items() if "train/response_len_mean" in m]
    assert generated == [1, 3] and all("train/reward_mean" in frames[s] for s in generated)
    assert "train/trl_rewards_short_and_even_mean" in frames[1]  # the reward function's own key, undeclared
    assert "pass through" in result.stderr and "rewards/short_and_even/mean -> train/trl_rewards_short_and_even_mean" \
        in result.stderr

    run, history = mlflow_history(out, "hf-callback")
    assert run.info.status == "FINISHED"
    for key in (*GRPO_HEADLINES, "train/response_len_mean", "train/clip_frac"):
        for step, metrics in frames.items():
            if key in metrics:
                assert history[key][step] == pytest.approx(metrics[key], rel=1e-12), (key, step)
    assert set(history["train/loss_avg"]) == {1, 2, 3, 4}


# -- the mapping, driven by hand (fast, in process) ----------------------------------------------------


def drive(args: Any, logs: list[dict[str, Any]], **kw: Any) -> tuple[list[Any], list[str]]:
    sink = MemorySink()
    cb = PosttrainMetricsCallback(sinks=[sink], **kw)
    state = transformers.TrainerState()
    state.logging_steps = args.logging_steps  # the Trainer resolves it before on_train_begin
    control = transformers.TrainerControl()
    with pytest.warns(UserWarning) as caught:
        cb.on_train_begin(args, state, control)
        for step, row in enumerate(logs, 1):
            state.global_step = step
            control.should_log = True
            cb.on_step_end(args, state, control)
            cb.on_log(args, state, control, logs=row)
        cb.on_log(args, state, control, logs={"train_runtime": 1.0, "train_loss": 0.5})  # the summary
        cb.on_train_end(args, state, control)
    return sink.frames, [str(w.message) for w in caught]


def grpo_args(**kw: Any) -> Any:
    fields = {"importance_sampling_level": "token", "use_bias_correction_kl": False, "logging_steps": 1,
              "logging_strategy": "steps", "gradient_accumulation_steps": 2, "steps_per_generation": 2,
              "num_iterations": 1, "beta": 0.02, "to_dict": dict}
    fields.update(kw)
    return type("GRPOConfig", (SimpleNamespace,), {})(**fields)


ROW = {"loss": 0.5, "kl": 0.01, "clip_ratio/region_mean": 0.1, "completions/max_length": 8.0,
       "entropy": 2.0, "rewards/f/mean": 0.3, "reward_std": 0.2}


@pytest.mark.parametrize(("kw", "clip", "kl", "max_len"), [
    ({}, "train/clip_frac", "train/kl_mean", "train/response_len_max"),
    ({"importance_sampling_level": "sequence"}, "train/seq_clip_frac", "train/kl_mean", "train/response_len_max"),
    ({"use_bias_correction_kl": True}, "train/clip_frac", "train/kl_mean", "train/response_len_max"),  # ratio 1
    ({"use_bias_correction_kl": True, "num_iterations": 2}, "train/clip_frac", "train/trl_kl",
     "train/response_len_max"),
    ({"logging_steps": 2}, "train/clip_frac", "train/kl_mean", "train/trl_completions_max_length"),
])
def test_mapping_follows_the_arguments(kw: dict[str, Any], clip: str, kl: str, max_len: str) -> None:
    frames, warned = drive(grpo_args(**kw), [ROW])
    (frame,) = frames
    assert frame.metrics[clip] == 0.1 and frame.metrics[kl] == 0.01 and frame.metrics[max_len] == 8.0
    assert frame.metrics["train/loss_avg"] == 0.5 and frame.metrics["train/kl_beta"] == 0.02
    assert frame.metrics["train/trl_reward_std"] == 0.2 and frame.metrics["train/trl_rewards_f_mean"] == 0.3
    assert not set(UNIT_WEIGHTS) & set(frame.metrics)
    assert len(warned) == 1 and "entropy -> train/trl_entropy" in warned[0] and "(undeclared)" in warned[0]


def test_recorded_micro_batches_win_over_logged_values_and_warnings_come_once() -> None:
    sink = MemorySink()
    cb = PosttrainMetricsCallback(sinks=[sink])
    args, state, control = grpo_args(), transformers.TrainerState(), transformers.TrainerControl()
    state.logging_steps = 1
    with pytest.warns(UserWarning) as caught:
        cb.on_train_begin(args, state, control)
        for step in (1, 2):
            state.global_step = step
            for tokens, clipped in ((10, 1), (30, 0)):
                cb.on_chunk_end({"grpo_clip_frac": clipped / tokens, "grpo_valid_token_count": tokens})
            control.should_log = True
            cb.on_step_end(args, state, control)
            cb.on_log(args, state, control, logs=ROW)
        cb.on_train_end(args, state, control)
    for frame in sink.frames:
        assert frame.metrics["train/clip_frac"] == 1 / 40  # exact, not TRL's 0.1
        assert frame.metrics["train/valid_token_count"] == 40  # a real weight is published
        assert frame.metrics["train/loss_avg"] == 0.5  # its weight (weight_sum) is not recorded: mapped
        assert "train/kl_mean" not in frame.metrics  # TRL's kl cannot join a recorded valid_token_count
    (warned,) = [str(w.message) for w in caught]
    assert "kl -> dropped: its weight train/valid_token_count is recorded per micro-batch" in warned


def test_plain_trainer_keys_have_names_of_their_own() -> None:
    """Issue 29 item 4: epoch, eval_loss and the evaluation timings, not train/trl_epoch, val/trl_loss."""
    sink = MemorySink()
    cb = PosttrainMetricsCallback(sinks=[sink])
    args = transformers.TrainingArguments(output_dir="unused", report_to="none", use_cpu=True)
    state, control = transformers.TrainerState(), transformers.TrainerControl()
    state.logging_steps = 1
    cb.on_train_begin(args, state, control)
    state.global_step = 1
    control.should_log = True
    cb.on_step_end(args, state, control)
    cb.on_log(args, state, control, logs={"loss": 2.0, "grad_norm": 1.0, "learning_rate": 0.1, "epoch": 0.5})
    cb.on_log(args, state, control, logs={"eval_loss": 1.5, "eval_runtime": 2.0, "eval_samples_per_second": 4.0,
                                          "eval_steps_per_second": 1.0, "epoch": 0.5})
    cb.on_train_end(args, state, control)
    train, val = sink.frames
    assert train.metrics == {"train/loss_avg": 2.0, "train/grad_norm": 1.0, "train/learning_rate": 0.1,
                             "train/epoch": 0.5}
    assert val.metrics == {"val/loss": 1.5, "val/runtime_s": 2.0, "val/samples_per_s": 4.0, "val/steps_per_s": 1.0}


def test_steps_without_a_log_still_publish_recorded_windows() -> None:
    sink = MemorySink()
    cb = PosttrainMetricsCallback(sinks=[sink])
    args, state, control = grpo_args(), transformers.TrainerState(), transformers.TrainerControl()
    cb.on_train_begin(args, state, control)
    for step in (1, 2, 3):
        state.global_step = step
        cb.on_step_begin(args, state, control)
        cb.on_chunk_end({"grpo_kl_max": float(step)})
        control.should_log = step == 2  # a log was due but never came: the next step closes the window
        cb.on_step_end(args, state, control)
    cb.on_train_end(args, state, control)
    assert [(f.step, dict(f.metrics)) for f in sink.frames] == [(s, {"train/kl_max": float(s)}) for s in (1, 2, 3)]


def test_the_console_reads_step_of_the_trainers_max_steps(capsys: pytest.CaptureFixture[str]) -> None:
    cb = PosttrainMetricsCallback(sinks=[{"type": "console"}])
    args, state, control = grpo_args(), transformers.TrainerState(), transformers.TrainerControl()
    state.max_steps = 12
    cb.on_train_begin(args, state, control)
    state.global_step = 1
    cb.on_step_begin(args, state, control)
    cb.on_chunk_end({"grad_norm": 0.5})
    cb.on_step_end(args, state, control)
    cb.on_train_end(args, state, control)
    assert " train step 1/12 | grad_norm 0.5" in capsys.readouterr().out


def test_from_config_and_errors() -> None:
    cb = PosttrainMetricsCallback.from_config({
        "_target_": "posttrain_metrics.callbacks.transformers.PosttrainMetricsCallback",
        "adapters": ["grpo", "trainer"], "sinks": [{"type": "memory"}]})
    assert [a.name for a in cb.publisher.adapters] == ["grpo", "trainer"]
    with pytest.raises(MetricsError, match="unknown callback option"):
        PosttrainMetricsCallback.from_config({"sinks": [], "report_to": "none"})
    assert When.ONE_GENERATION_PER_LOG not in conditions(grpo_args(logging_strategy="epoch"))


def test_missing_transformers_names_the_install_line() -> None:
    probe = "import sys; sys.modules['transformers'] = None; import posttrain_metrics.callbacks.transformers"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "pip install 'posttrain-metrics[hf]'" in result.stderr


def test_docs_table_lists_every_mapping() -> None:
    doc = (ROOT / "docs" / "frameworks.md").read_text()
    for m in TRL_GRPO_MAPPING:
        logged = f"`eval_{m.logged}`" if m.phase == "val" else f"`{m.logged}`"
        assert any(logged in line and f"`{m.key}`" in line for line in doc.splitlines()), (m.logged, m.key)


if __name__ == "__main__":
    _, flag, kind, where = sys.argv
    assert flag == "--worker"
    {"trainer": worker_trainer, "grpo": worker_grpo}[kind](Path(where))
