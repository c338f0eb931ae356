"""Redaction right both ways (issue 25): no secret out, every value a run is reproduced from kept in.

Two generated corpora measure the shape rule on values held under innocuous keys: random secrets of the
common alphabets and lengths (at least 99% redacted, per corpus) and readable run values (paths, URIs
without user info, experiment names with hyperparameters, prompts, ids, dates, model and dataset names:
at least 99% kept, per corpus). The rest pins each shape the issue names, and cyclic configs (issue 24
item 9). The artefact-wide grep is ``test_bad_input.py::test_a_planted_secret_of_any_shape_is_in_no_byte_of_any_artefact``.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import random
import string
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from posttrain_metrics import MetricsError
from posttrain_metrics.core.redact import REDACTED, config_tree, flatten_config, redact_text

# -- the corpora ----------------------------------------------------------------------------------------

B64 = string.ascii_letters + string.digits + "+/"
B64URL = string.ascii_letters + string.digits + "-_"
ALNUM = string.ascii_letters + string.digits
LENGTHS = (20, 24, 32, 40, 48, 64, 86)
PER_CORPUS = 200


def random_secrets() -> dict[str, list[str]]:
    """Seeded random secrets by alphabet and length, plus the two forms the issue measured."""
    rng = random.Random(25)
    corpora = {f"{name} {n}": ["".join(rng.choice(alphabet) for _ in range(n)) for _ in range(PER_CORPUS)]
               for name, alphabet in (("base64", B64), ("base64url", B64URL), ("alphanumeric", ALNUM))
               for n in LENGTHS}
    corpora["token_urlsafe(32)"] = [base64.urlsafe_b64encode(rng.randbytes(32)).rstrip(b"=").decode()
                                    for _ in range(PER_CORPUS)]
    corpora["aws secret key (40 base64)"] = ["".join(rng.choice(B64) for _ in range(40)) for _ in range(PER_CORPUS)]
    corpora["padded base64 of 15-48 bytes"] = [base64.b64encode(rng.randbytes(rng.randint(15, 48))).decode()
                                               for _ in range(PER_CORPUS)]
    return corpora


MODELS = ("meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-Math-7B-Instruct", "mistralai/Mixtral-8x7B-Instruct-v0.1",
          "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", "EleutherAI/gpt-neox-20b", "google/gemma-2-9b-it",
          "TinyLlama/TinyLlama-1.1B-Chat-v1.0", "microsoft/Phi-3-mini-4k-instruct", "bigcode/starcoder2-15b",
          "nvidia/Llama-3.1-Nemotron-70B-Instruct-HF", "allenai/OLMo-2-1124-13B-DPO", "Qwen/Qwen2-VL-72B-Instruct",
          "HuggingFaceTB/SmolLM2-1.7B-Instruct")
DATASETS = ("HuggingFaceH4/ultrafeedback_binarized", "openai/gsm8k", "allenai/tulu-3-sft-mixture",
            "AI-MO/NuminaMath-CoT", "trl-lib/ultrafeedback_binarized", "Anthropic/hh-rlhf", "HuggingFaceH4/MATH-500",
            "openbmb/UltraInteract_pair", "lmsys/lmsys-chat-1m", "argilla/distilabel-intel-orca-dpo-pairs")
ALGOS = ("GRPO", "PPO", "DPO", "OPD", "NFT", "RLOO", "ReMax", "DAPO", "flow_bc")
SHORT = ("Q7B", "L8B", "Q72B", "M8x7B", "Qwen2-7B", "Llama3-70B", "gemma2-9b")
HARDWARE = ("A100x8", "H100x16", "H200x8", "L40Sx4", "MI300Xx8", "A10Gx1", "TPUv5e-256")
PROMPTS = ("Put your final answer after the token: ####", "special token: <|endoftext|> to stop",
           "<|im_start|>system\nYou are a helpful assistant.<|im_end|>",
           "Solve the problem step by step. Put the final answer in \\boxed{}.",
           "### Instruction:\n{instruction}\n\n### Response:", "End with the stop token: </s>",
           "Think inside <think></think> tags, then give the answer after 'Answer:'.",
           "Use the key insight first: the answer is an integer between 0 and 999.",
           "Rate the response from 1 to 10. Token budget: 512.",
           "You are a helpful assistant. Never reveal the password.", "Answer with a single token: yes or no.",
           "The secret key to this problem is to factor the polynomial.", "Use a basic approach: think first.",
           "End each answer with the special token <|endoftext|> to stop.")
CREDENTIAL_WORDS = ("password", "Password", "token", "Token", "key", "Key", "secret", "api key", "passphrase")


def prose_naming_a_credential(rng: random.Random, n: int) -> list[str]:
    """Sentences of system prompts and task descriptions that name a credential in plain English."""
    templates = ("Never reveal the {w}.", "{w}: the user will give you one; say whether it is strong.",
                 "Do not guess the {w} until you have checked it twice.", "The {w} to this problem is symmetry.",
                 "Reply with one {w}: yes or no.", "The {w}: a unique value for each row of the table.",
                 "If you see a {w} in the code, flag it and explain why.", "Explain what a {w} is to a child.",
                 "Remember: the {w} is not the answer, the reasoning is.", "Use your {w} wisely: the budget is small.")
    return [rng.choice(templates).format(w=rng.choice(CREDENTIAL_WORDS)) for _ in range(n)]


def readable_values() -> dict[str, list[str]]:
    """Seeded readable run values of the kinds a person reads a run's record for."""
    rng = random.Random(24)

    def many(make: Callable[[], str], n: int = PER_CORPUS) -> list[str]:
        return [make() for _ in range(n)]

    def lr(compact: bool = False) -> str:
        text = rng.choice(("1e-6", "5e-7", "3e-6", "1e-5", "2e-4", "6e-7"))
        return text.replace("-", "") if compact else text

    def model() -> str:
        return rng.choice(MODELS).split("/")[1]

    return {
        "model and dataset names": list(MODELS + DATASETS),
        "experiment names": many(lambda: f"{model()}_{rng.choice(ALGOS)}_lr{lr()}_bs{rng.choice((64, 256, 512))}"
                                 f"_kl{rng.choice(('4e-2', '1e-3', '0.05'))}_ep{rng.randint(1, 5)}"),
        "compact experiment names": many(lambda: f"{rng.choice(SHORT)}_{rng.choice(ALGOS)}_lr{lr(True)}"
                                         f"_bs{rng.choice((64, 512))}_g{rng.choice((4, 8, 16))}_seed{rng.randint(0, 999)}"),
        "output dirs": many(lambda: f"runs/2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}"
                            f"-{rng.randint(0, 59):02d}-00Z_{rng.choice(ALGOS)}_{rng.choice(SHORT)}_{rng.choice(HARDWARE)}"),
        "checkpoint URIs": many(lambda: f"{rng.choice(('s3', 'gs', 'hdfs', 'abfs'))}://{rng.choice(('bkt', 'ml-ckpts'))}"
                                f"/RL/{rng.choice(SHORT)}/{rng.choice(ALGOS)}/lr{lr(True)}/bs{rng.choice((256, 512))}"
                                f"/kl{rng.choice(('4e2', '1e3'))}/seed{rng.randint(0, 99)}/ckpt/global_step_{rng.randint(1, 90) * 100}"),
        "paths": many(lambda: f"/mnt/{rng.choice(('shared', 'lustre', 'fsx'))}/{rng.choice(('ckpts', 'users/alice'))}/"
                      f"{model()}/{rng.choice(ALGOS).lower()}_run{rng.randint(1, 99):03d}/checkpoint-{rng.randint(1, 50) * 500}"
                      "/model-00001-of-00004.safetensors"),
        "tensorboard dirs": many(lambda: f"runs/{rng.choice(('Nov05', 'Jan17'))}_{rng.randint(0, 23):02d}-"
                                 f"{rng.randint(0, 59):02d}-{rng.randint(0, 59):02d}_node-a100-{rng.randint(1, 64):03d}"),
        "URIs without user info": many(lambda: rng.choice((
            f"https://huggingface.co/datasets/{rng.choice(DATASETS)}/resolve/main/data/train-0000{rng.randint(0, 9)}.parquet",
            f"https://wandb.ai/alice/grpo-sweep/runs/{''.join(rng.choice('0123456789abcdefghijklmnopqrstuvwxyz') for _ in range(8))}",
            f"http://mlflow.internal:5000/#/experiments/{rng.randint(1, 99)}/runs/{rng.randbytes(16).hex()}",
            f"https://github.com/org/repo/tree/feature/kl-annealing-{rng.randint(1, 9)}",
            f"hf://datasets/{rng.choice(DATASETS)}@main"))),
        "ids": many(lambda: rng.choice((
            str(uuid.UUID(int=rng.getrandbits(128))), rng.randbytes(20).hex(), rng.randbytes(32).hex(),
            f"GPU-{uuid.UUID(int=rng.getrandbits(128))}", f"sha256:{rng.randbytes(32).hex()}", rng.randbytes(16).hex(),
            f"slurm-{rng.randint(10**6, 10**7)}", f"grpo-trainer-{rng.randbytes(5).hex()[:9]}-x{rng.randint(1000, 9999)}"))),
        "dates": many(lambda: rng.choice((
            f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00Z",
            f"{rng.randint(2020, 2026)}{rng.randint(1, 12):02d}{rng.randint(1, 28):02d}-{rng.randint(0, 235959):06d}"))),
        "prompts": list(PROMPTS),
        "prose naming a credential": prose_naming_a_credential(rng, PER_CORPUS),
        "class and setting names": ["bf16", "deepspeed_zero3_offload", "FlashAttention2", "Qwen2ForCausalLM",
                                    "GPTNeoXForCausalLM", "LlamaForCausalLMWithValueHead", "cosine_with_min_lr",
                                    "AdamW8bit", "feature/grpo-kl-annealing", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
                                    "nvcr.io/nvidia/pytorch:24.05-py3", "vllm/vllm-openai:v0.6.3.post1",
                                    "x" * 50, "ab" * 15, "ZZZZZZZZZZZZZZZZZZZZZZZZ", "mlflowtrackingserver"],
    }


def _redacted(value: str) -> bool:
    """Whether any of ``value`` is redacted when it is held under an innocuous key."""
    return REDACTED in str(flatten_config({"note": value})["note"])


def test_random_secrets_under_an_innocuous_key_are_redacted_at_least_99_percent() -> None:
    rates = {name: sum(map(_redacted, corpus)) / len(corpus) for name, corpus in random_secrets().items()}
    print("[figure] random secrets redacted: " + ", ".join(f"{k} {v:.1%}" for k, v in rates.items()))
    assert all(rate >= 0.99 for rate in rates.values()), rates


def test_readable_run_values_are_kept_at_least_99_percent() -> None:
    kept = {name: [v for v in corpus if not _redacted(v)] for name, corpus in readable_values().items()}
    rates = {name: len(kept[name]) / len(corpus) for name, corpus in readable_values().items()}
    print("[figure] readable values kept: " + ", ".join(f"{k} {v:.1%}" for k, v in rates.items()))
    lost = {name: [v for v in corpus if v not in kept[name]][:3] for name, corpus in readable_values().items()}
    assert all(rate >= 0.99 for rate in rates.values()), (rates, lost)
    for corpus in readable_values().values():  # kept means kept verbatim, not only "no marker"
        for value in corpus:
            assert flatten_config({"note": value}) == {"note": value}


def test_the_values_a_run_is_reproduced_from_stay_readable() -> None:
    config = {
        "output_dir": "runs/2024-11-05T12-30-00Z_GRPO_Q7B_A100x8",
        "resume_from": "s3://bkt/RL/Q7B/GRPO/lr1e6/bs512/kl4e2/seed42/ckpt",
        "exp_name": "Qwen2-7B_GRPO_lr1e-6_bs512_kl4e-2_ep3",
        "gpu": "GPU-5b7a3c2e-1f4d-4e8a-9b6c-0d2e3f4a5b6c",
        "system_prompt": "Put your final answer after the token: ####",
        "stop": "special token: <|endoftext|> to stop",
        "git_sha": "9fceb02d0ae598e95dc970b74767f19372d61af8",
        "run_uuid": "123e4567-e89b-12d3-a456-426614174000",
        "prompt_key": "prompt",
        "max_new_tokens": 1024,
    }
    assert flatten_config(config) == config
    assert config_tree({"data": config}) == {"data": config}


# -- secret shapes that got through -------------------------------------------------------------------


@pytest.mark.parametrize(("uri", "secret"), [
    ("redis://:Pw25-redis-empty-user@cache.internal:6379/0", "Pw25-redis-empty-user"),
    ("rediss://:Pw25-tls@cache.internal:6380", "Pw25-tls"),
    ("memcached://:Pw25-mc@10.0.0.7:11211", "Pw25-mc"),
])
def test_userinfo_with_an_empty_user_is_userinfo(uri: str, secret: str) -> None:
    flat = flatten_config({"cache": {"url": uri}})
    assert flat["cache/url"] == uri.replace(secret, REDACTED)


def test_a_url_with_a_port_and_no_user_info_is_kept() -> None:
    for uri in ("redis://cache.internal:6379/0", "http://[::1]:5000/api", "postgresql://db.internal:5432/runs"):
        assert flatten_config({"u": uri}) == {"u": uri}


def test_a_databricks_token_under_an_innocuous_key_is_redacted() -> None:
    token = "dapi" + "3f9a0c1e7b2d4f6a8c0e1b3d5f7a9c2e"  # dapi + 32 hex: hex alone would be kept as an id
    flat = flatten_config({"workspace": {"note": token, "host": "https://adb-123.azuredatabricks.net"}})
    assert flat == {"workspace/note": REDACTED, "workspace/host": "https://adb-123.azuredatabricks.net"}
    assert redact_text(f"DATABRICKS_HOST=x {token}-2 end") == f"DATABRICKS_HOST=x {REDACTED} end"


@pytest.mark.parametrize(("text", "shown"), [
    ("mailgun key-0f1e2d3c4b5a69788796a5b4c3d2e1f0 here", f"mailgun {REDACTED} here"),
    ("client GOCSPX-Pw25googleOauthClientSecret", f"client {REDACTED}"),
    ("run-hf_Pw25TokenAfterAHyphenInARunName", f"run-{REDACTED}"),
    ("cache in grpo_hf_dataset_cache_dir", "cache in grpo_hf_dataset_cache_dir"),  # a name, not a token
    ("sklearn-sk-learn-pipeline-v2", "sklearn-sk-learn-pipeline-v2"),
    ("AZURE_CLIENT_SECRET is mYH8Q~Be~4oKtr7lgdUD~j.cRPQSrkekRAiz3C_O now", f"AZURE_CLIENT_SECRET is {REDACTED} now"),
    ("mailchimp 8cab5a87e3af2cdc80836c148d26d050-us19", f"mailchimp {REDACTED}"),
    ("slack xapp-1-A07QX2B9K1M-7799123456789-3f9a0c1e7b2d4f6a8c0e1b3d5f7a9c2e3f9a0c1e7b2d4f6a8c0e1b3d5f7a9c2e",
     f"slack {REDACTED}"),
    ("postman PMAK-65f1c2d3e4f5a6b7c8d9e0f1-3f9a0c1e7b2d4f6a8c0e1b3d5f7a9c2e3f", f"postman {REDACTED}"),
    ("supabase sbp_3f9a0c1e7b2d4f6a8c0e1b3d5f7a9c2e3f9a0c1e", f"supabase {REDACTED}"),
    ("twilio SK3f9a0c1e7b2d4f6a8c0e1b3d5f7a9c2e", f"twilio {REDACTED}"),
    ("commit 8cab5a87e3af2cdc80836c148d26d050 in us-east-1", "commit 8cab5a87e3af2cdc80836c148d26d050 in us-east-1"),
])
def test_provider_prefixes_after_a_separator_and_new_providers(text: str, shown: str) -> None:
    assert redact_text(text) == shown


def test_random_one_case_strings_are_mostly_redacted() -> None:
    """Base32 (TOTP seeds) and lower-case letters have no case change to break them: the long
    unpronounceable runs count instead. Measured, not promised at 99% (the issue's alphabets are
    mixed case); the floor is what this rule gives at 32 characters."""
    rng = random.Random(32)
    corpora = {"base32": string.ascii_uppercase + "234567", "lower-case letters": string.ascii_lowercase,
               "lower-case alphanumeric": string.ascii_lowercase + string.digits}
    rates = {name: sum(_redacted("".join(rng.choice(alphabet) for _ in range(32))) for _ in range(PER_CORPUS))
             / PER_CORPUS for name, alphabet in corpora.items()}
    print("[figure] one-case random strings of 32 redacted: " + ", ".join(f"{k} {v:.1%}" for k, v in rates.items()))
    assert all(rate >= 0.9 for rate in rates.values()), rates


def test_a_secret_used_as_a_mapping_key_is_redacted_and_its_value_kept() -> None:
    hf = "hf_Pw25asAMappingName0123456789abcd"
    config = {"hub_accounts": {hf: "alice", "hf_Pw25secondAccountQz987654321zyxw": "bob"},
              "mirrors": {"https://mirror:Pw25-mirror-pass@pypi.internal/simple": "eu"}}
    flat = flatten_config(config)
    assert flat == {f"hub_accounts/{REDACTED}": "alice", f"hub_accounts/{REDACTED}#2": "bob",
                    f"mirrors/https://mirror:{REDACTED}@pypi.internal/simple": "eu"}
    assert "Pw25" not in repr(config_tree(config))


@pytest.mark.parametrize(("text", "kept"), [
    ("ConnectionError: HTTPConnectionPool(host='db', port=6379): redis://:Pw25-exc@db:6379/0 refused",
     "HTTPConnectionPool(host='db', port=6379)"),
    ("RuntimeError: login failed for https://bob:Pw25-exc-uri@mlflow.internal/api (401)", "https://bob:"),
    ("Traceback (most recent call last):\n  File \"train.py\", line 7\nValueError: HF_TOKEN=Pw25-exc-env rejected",
     'File "train.py", line 7'),
    ("KeyError: 'hf_Pw25excKey0123456789abcdefghij'", "KeyError: "),
    ("OSError: 403 for s3://bkt/ckpt?X-Amz-Signature=Pw25excSig&X-Amz-Date=20241105", "s3://bkt/ckpt?"),
])
def test_exception_text_such_as_an_end_records_reason_is_redacted(text: str, kept: str) -> None:
    shown = redact_text(text)
    assert "Pw25" not in shown and REDACTED in shown and kept in shown, shown


# -- issue 24 item 9: cyclic configs ----------------------------------------------------------------------


@dataclasses.dataclass
class Node:
    name: str
    parent: Node | None = None
    children: list[Node] = dataclasses.field(default_factory=list)


def _dataclass_with_a_parent_link() -> tuple[dict[str, Any], str]:
    root = Node("policy")
    root.children.append(Node("value_head", parent=root))
    return {"model": root}, "'model/children/0/parent' is the same object as 'model'"


def _dict_that_holds_itself() -> tuple[dict[str, Any], str]:
    loop: dict[str, Any] = {"lr": 1e-6}
    loop["optim"] = {"again": loop}
    return {"train": loop}, "'train/optim/again' is the same object as 'train'"


def _list_that_holds_itself() -> tuple[dict[str, Any], str]:
    items: list[Any] = [1, 2]
    items.append(items)
    return {"stages": items}, "'stages/2' is the same object as 'stages'"


@pytest.mark.parametrize("make", [_dataclass_with_a_parent_link, _dict_that_holds_itself, _list_that_holds_itself])
def test_a_cyclic_config_is_a_metrics_error_at_run_start_naming_where(make: Callable[[], tuple[Any, str]],
                                                                      tmp_path: Any) -> None:
    from posttrain_metrics.callbacks import MetricsCallback

    config, where = make()
    callback = MetricsCallback(adapters=["grpo"], sinks=[{"type": "memory"}], out_dir=tmp_path)
    with pytest.raises(MetricsError) as info:
        callback.on_run_start(config)
    assert where in str(info.value) and "fix:" in str(info.value), str(info.value)
    with pytest.raises(MetricsError, match="holds itself"):
        flatten_config(config)
    callback.on_run_end()


def test_a_shared_sub_object_used_twice_is_not_a_cycle(tmp_path: Any) -> None:
    from posttrain_metrics.callbacks import MetricsCallback

    shared = {"lr": 1e-6, "betas": [0.9, 0.95]}
    node = Node("shared")
    config = {"actor": {"optim": shared, "n": node}, "critic": {"optim": shared, "n": node}}
    assert flatten_config(config)["critic/optim/betas/1"] == 0.95
    callback = MetricsCallback(adapters=["grpo"], sinks=[{"type": "memory"}], out_dir=tmp_path)
    callback.on_run_start(config)
    callback.on_run_end()


# -- every line the package prints or logs passes one choke point ------------------------------------------


def test_no_module_warns_but_through_the_redacting_door() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "posttrain_metrics"
    direct = [str(p.relative_to(root)) for p in root.rglob("*.py")
              if "warnings.warn(" in p.read_text() and p.name != "warn.py"]
    assert direct == [], f"these call warnings.warn themselves, unredacted: {direct}"


def test_the_read_back_warning_redacts_a_tracking_uri_password(caplog: pytest.LogCaptureFixture) -> None:
    from posttrain_metrics.integrations import MemorySink
    from posttrain_metrics.publication.follower import held_points

    secret = "Pw25-read-back-password"

    class Unreadable(MemorySink):
        name = "mlflow"

        def held_points(self, run_id: str, name: str, keys: Any) -> Any:
            raise ConnectionError(f"API request to http://alice:{secret}@127.0.0.1:9/api/2.0/mlflow/runs/search failed")

    assert not held_points(Unreadable(), "run01", "r", ["train/kl_max"])
    (text,) = caplog.messages  # an operational message: a log record, redacted on its way in
    assert "could not read back" in text and f"http://alice:{REDACTED}@127.0.0.1:9" in text, text
    assert secret not in text


def test_lines_leaving_the_publisher_process_are_redacted_whole() -> None:
    import io

    from posttrain_metrics.publication.output import RedactedLines

    out = io.StringIO()
    stream = RedactedLines(out)  # type: ignore[arg-type]
    stream.write("WARNING mlflow: could not reach https://bob:")  # a line written in pieces
    stream.write("Pw25-pieces@mlflow.internal/api\nnext line, no newline yet: token=Pw25-tail")
    assert out.getvalue() == f"WARNING mlflow: could not reach https://bob:{REDACTED}@mlflow.internal/api\n"
    stream.flush()
    assert out.getvalue().endswith(f"next line, no newline yet: token={REDACTED}") and "Pw25" not in out.getvalue()


def test_the_publisher_process_log_is_private_and_holds_no_uri_password(
    tmp_path: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    """The real publisher process, with an MLflow server that does not answer behind a tracking URI
    that holds a password: its warnings on the trainer's stderr and in publisher.log are redacted,
    and publisher.log is readable by its owner only (0600), like sinks.json."""
    import os
    import stat

    from _mlflow_server import free_port

    from posttrain_metrics.callbacks import MetricsCallback

    secret = "Pw25-process-uri-password"
    out = tmp_path / "run"
    uri = f"http://alice:{secret}@127.0.0.1:{free_port()}"
    cb = MetricsCallback(adapters=["trainer"], out_dir=out, run_name="private", close_timeout=240,
                         sinks=[{"type": "journal"}, {"type": "mlflow", "tracking_uri": uri, "http_max_retries": 0,
                                                      "http_timeout": 2, "drain_timeout": 1}])
    with cb:
        cb.on_run_start({"lr": 0.1})
        cb.on_chunk_end({"grad_norm": 1.0, "update_outcome": "applied", "updates_applied": 1})
        cb.on_window_end(1)
    captured = capfd.readouterr()
    log = out / "publisher.log"
    text = log.read_text()
    assert "could not read back" in captured.err + text and REDACTED in text, (captured.err, text)
    assert secret not in captured.err + captured.out and secret not in text
    assert stat.S_IMODE(os.stat(log).st_mode) == 0o600


def test_a_run_name_holding_a_secret_is_redacted_wherever_it_is_shown(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import io

    from posttrain_metrics import Frame
    from posttrain_metrics.cli import main
    from posttrain_metrics.integrations.console import ConsoleSink
    from posttrain_metrics.journal import JournalSink
    from posttrain_metrics.publication import Publisher

    secret = "hf_Pw25RunNameTokenAbCdEfGh0123456789"
    console = io.StringIO()
    journal = tmp_path / "journal.jsonl"
    pub = Publisher([JournalSink(journal), ConsoleSink(stream=console, min_interval=0)], adapters="grpo",
                    run_name=f"grpo-{secret}", mode="inline")
    pub.start({})
    pub.publish(Frame(1, {"train/kl_max": 0.5}, "train", 1.0))
    pub.close()
    assert f"run grpo-{REDACTED} (" in console.getvalue() and secret not in console.getvalue()
    assert secret not in journal.read_text() and f"grpo-{REDACTED}" in journal.read_text()
    # a journal written before the rule holds the name as given: the doctor's report redacts it
    older = tmp_path / "older.jsonl"
    older.write_text(journal.read_text().replace(REDACTED, secret))
    main(["doctor", str(older)])
    report = capsys.readouterr().out
    assert f"run grpo-{REDACTED} (id " in report and secret not in report, report


def test_what_trackers_store_besides_the_config_is_redacted_and_read_back(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run name, MLflow tags and run_name, W&B tags, group and notes, read back with each vendor's
    own reader: the secrets are gone, what a person reads them for is still there."""
    from mlflow import MlflowClient

    from posttrain_metrics import Frame
    from posttrain_metrics.integrations.mlflow import MlflowSink
    from posttrain_metrics.integrations.wandb import WandbSink
    from posttrain_metrics.integrations.wandb_reader import read_offline_run
    from posttrain_metrics.publication import Publisher

    for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    token = "hf_Pw25TrackerFieldsTokenAbCdEf0123456"
    mlflow = MlflowSink(dir=tmp_path, experiment_name="fields", run_name=f"sweep-{token}",
                        tags={"team": "rl", "ci_token": "Pw25-ci-token", "repo": "https://ci:Pw25-repo@git.internal/rl.git"})
    wandb_sink = WandbSink(project="fields", dir=tmp_path, mode="offline", settings={"quiet": True},
                           tags=["grpo", token], group="redis://:Pw25-group@cache:6379", notes="HF_TOKEN=Pw25-notes lr 1e-6")
    pub = Publisher([mlflow, wandb_sink], adapters="grpo", run_name=f"grpo-{token}", mode="inline")
    pub.start({"lr": 1e-6})
    pub.publish(Frame(1, {"train/kl_max": 0.5}, "train", 1.0))
    handles = pub.run_handles()["mlflow"]
    pub.close()
    import wandb

    wandb.teardown()
    run = MlflowClient(handles["tracking_uri"]).get_run(handles["run_id"])
    assert run.info.run_name == f"sweep-{REDACTED}"
    assert (run.data.tags["team"], run.data.tags["ci_token"]) == ("rl", REDACTED)
    assert run.data.tags["repo"] == f"https://ci:{REDACTED}@git.internal/rl.git"
    wb = read_offline_run(tmp_path / "wandb").run
    assert wb.display_name == f"grpo-{REDACTED}"
    assert list(wb.tags) == ["grpo", REDACTED]
    assert (wb.run_group, wb.notes) == (f"redis://:{REDACTED}@cache:6379", f"HF_TOKEN={REDACTED} lr 1e-6")


def test_mlflows_param_name_warning_shows_no_secret_used_as_a_key(tmp_path: Any) -> None:
    """A key MLflow cannot take as a param name is logged under another name, with a warning that
    quotes it: a mirror URL with a password, used as a key, is redacted before that warning."""
    import warnings

    from mlflow import MlflowClient

    from posttrain_metrics import Frame
    from posttrain_metrics.integrations.mlflow import MlflowSink
    from posttrain_metrics.publication import Publisher

    secret = "Pw25-mirror-key-pass"
    sink = MlflowSink(dir=tmp_path, experiment_name="keys")
    pub = Publisher([sink], adapters="grpo", mode="inline")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pub.start({"mirrors": {f"https://mirror:{secret}@pypi.internal/simple": "eu"}})
        pub.publish(Frame(1, {"train/kl_max": 0.5}, "train", 1.0))
        handles = pub.run_handles()["mlflow"]
        pub.close()
    texts = [str(w.message) for w in caught]
    assert any("is not a valid MLflow name" in t and REDACTED in t for t in texts), texts
    assert not any(secret in t for t in texts), texts
    params = MlflowClient(handles["tracking_uri"]).get_run(handles["run_id"]).data.params
    assert "eu" in params.values() and not any(secret in k for k in params), params


# -- review of issue 25: forms a second probe corpus found --------------------------------------------------


@pytest.mark.parametrize("prompt", [
    "Password: the user gives you a password; say whether it is strong.",
    "Answer with a single token: yes or no.",
    "The secret key to this problem is to factor the polynomial.",
    "The key: a unique id for each row. The token: a subword unit.",
    "Do not guess the password until you have checked it twice.",
])
def test_prose_that_names_a_credential_keeps_the_next_word(prompt: str) -> None:
    """A credential's name in a sentence is followed by the sentence, not by a value: a plain word
    that the sentence goes on after is kept (``token: yes or no``, ``Password: the user ...``)."""
    assert flatten_config({"system_prompt": prompt}) == {"system_prompt": prompt}
    for text, secret in (("password: hunter2 rejected", "hunter2"),  # not a plain word
                         ("user: bob password: swordfish host: db", "swordfish"),  # a pair follows, not a sentence
                         ("password: swordfish", "swordfish"),  # nothing follows
                         ("machine api.wandb.ai login bob password swordfish", "swordfish"),
                         ("machine h login bob password swordfish account ops", "swordfish"),  # netrc goes on
                         ("password: $uperSecret rejected", "uperSecret")):  # a '$' password, not a $VAR
        assert secret not in redact_text(text) and REDACTED in redact_text(text), text


@pytest.mark.parametrize("config", [
    {"use_auth_token": True}, {"auth": "none"}, {"auth": "required", "token_auth": "disabled"},
    {"api_key": "${oc.env:OPENAI_API_KEY}"}, {"hf_token": "$HF_TOKEN"}, {"token": "{{ secrets.HF_TOKEN }}"},
    {"password": "${{ secrets.DB_PASSWORD }}"},
    {"argv": "train.py --use_auth_token False --push_to_hub_token None --hub_token ${HF_TOKEN}"},
])
def test_flags_and_references_under_a_credential_name_stay_readable(config: dict[str, Any]) -> None:
    """A boolean, a null, or a reference to where the secret is kept (``${oc.env:X}``, ``$X``,
    ``{{ secrets.X }}``) is not the secret: it says how the run found its credential."""
    assert flatten_config(config) == config


@pytest.mark.parametrize("config", [
    {"hf_token_path": "/root/.cache/huggingface/token"}, {"password_file": "/run/secrets/db"},
    {"ssh_key_path": "~/.ssh/id_ed25519"}, {"api_key_env": "OPENAI_API_KEY"}, {"auth_type": "bearer"},
    {"secret_name": "wandb-secret"}, {"env": "HF_TOKEN_PATH=/data/hf/token HF_HOME=/data/hf"},
])
def test_a_name_that_says_where_or_what_kind_of_credential_is_not_a_credential(config: dict[str, Any]) -> None:
    assert flatten_config(config) == config


@pytest.mark.parametrize(("text", "secret"), [
    (json.dumps(json.dumps({"model": "Qwen/Qwen2.5-7B", "api_key": "plainword"})), "plainword"),
    ('payload="{\\"hf_token\\": \\"lowercasesecret\\"}"', "lowercasesecret"),
    ("argv: ['train.py', '--hf_token', 'lowercasesecret', '--lr', '1e-6']", "lowercasesecret"),
    ('["--api-key", "lowercasesecret"]', "lowercasesecret"),
    # INI, TOML, .aws/credentials: name = value, spaces around the '='
    ("[default]\naws_access_key_id = AKIAIOSFODNN7EXAMPLE\naws_secret_access_key = u8jzPde0IgxLd6\n", "u8jzPde0IgxLd6"),
    ('[wandb]\napi_key = "Pw25-toml-value"', "Pw25-toml-value"),
    ("api.key = Pw25-spaced", "Pw25-spaced"),
    ("password=Pw25\\back\\slash user=u", "slash"),  # a backslash inside an unquoted value
])
def test_escaped_json_printed_argv_and_ini_pair_the_name_with_its_value(text: str, secret: str) -> None:
    shown = redact_text(text)
    assert secret not in shown and REDACTED in shown, shown


@pytest.mark.parametrize("prompt", [
    "Use a basic approach: think first, then answer.", "Basic arithmetic problems only.",
    "End each answer with the special token <|endoftext|> to stop.", "the token ids:[151643] end a turn",
    "Set the token HF_HOME=/data/hf before the run",
])
def test_an_auth_scheme_word_in_prose_is_not_an_authorization_header(prompt: str) -> None:
    """``Basic``/``Token`` ... redact what follows only when it is a credential (token68 characters,
    not a plain word): headers still are (``Authorization: Basic YWxp...==``)."""
    assert flatten_config({"prompt": prompt}) == {"prompt": prompt}
    for header, secret in (("Authorization: Basic YWxpY2U6aHVudGVyMg==", "YWxpY2U6aHVudGVyMg=="),
                           ("-H 'Authorization: Token 9944b09199c62bcf9418ad846dd0e4bbdfc6ee4b'", "9944b0"),
                           ("Authorization: Bearer abcdefghijklmnop", "abcdefghijklmnop"),
                           ("Authorization: token plainlowercaseword", "plainlowercaseword"),
                           ('{"Authorization": "Basic plainlowercaseword"}', "plainlowercaseword")):
        assert secret not in redact_text(header), header


@pytest.mark.parametrize("value", [
    "Use your secret weapon: the quadratic formula.", "mailto:alice@example.com", "sip:bob@voip.example.com",
    "python:3.11-slim@sha256:" + "5f0e3a9c" * 8,  # an image pinned by digest: tag, not password
])
def test_a_sentence_and_an_address_are_not_credentials(value: str) -> None:
    assert flatten_config({"note": value}) == {"note": value}


def credential_pairs_in_text(rng: random.Random, n: int) -> list[tuple[str, str]]:
    """(text, secret): a credential's name and its value as env dumps, YAML, INI/TOML, JSON (plain or
    escaped inside a JSON string), DSNs, command lines and netrc write them, the value a random
    password or a plain word, the pair alone on its line or followed by another pair."""
    names = ("password", "PGPASSWORD", "api_key", "apiKey", "HF_TOKEN", "client_secret", "x-api-key", "db.pass",
             "WANDB_API_KEY", "token", "auth_token", "aws_secret_access_key")
    words = ("swordfish", "dragon", "letmein", "hunter2", "Summer2024!", "correcthorse", "p4ss-w0rd", "qwerty123")

    def value() -> str:
        return rng.choice(words) + str(rng.randint(0, 99)) if rng.random() < 0.5 else \
            "".join(rng.choice(ALNUM) for _ in range(rng.randint(6, 16)))

    forms = ("{n}={v}", "{n}: {v}", "{n} = {v}", '"{n}": "{v}"', "{n}='{v}'", '{n} = "{v}"', "--{n} {v}",
             "--{n}={v}", '\\"{n}\\": \\"{v}\\"', "'--{n}', '{v}'", "{n}: {v}\nhost: db", "{n}={v} user=u",
             "machine h login u password {v}")
    out = []
    for _ in range(n):
        v = value()
        out.append((rng.choice(forms).format(n=rng.choice(names), v=v), v))
    return out


def test_credential_pairs_in_text_are_redacted_at_least_99_percent() -> None:
    corpus = credential_pairs_in_text(random.Random(2025), 4 * PER_CORPUS)
    leaked = [text for text, secret in corpus if secret in redact_text(f"config: {text} end")]
    rate = 1 - len(leaked) / len(corpus)
    print(f"[figure] credential pairs in text redacted: {rate:.1%}")
    assert rate >= 0.99, leaked[:5]
