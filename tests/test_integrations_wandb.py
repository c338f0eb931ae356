"""The W&B sink, run for real (offline) and read back from the run's ``.wandb`` transaction log.

Each module-scoped run goes through the real Publisher (journal + W&B) and is decoded with wandb's
own record classes (``wandb_internal_pb2.Record``, see ``posttrain_metrics.integrations.wandb_reader``). wandb is required: if
it is missing, importing ``posttrain_metrics.integrations.wandb_reader`` fails with the install line (never a skip).
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import sys
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from _runs import (
    GRPO_ADAPTERS,
    HAND_INDICATORS,
    HAND_NONFINITE,
    HAND_RUN,
    LABELLED,
    dpo_run,
    grpo_chunk,
    grpo_run,
    hand_frames,
    nonfinite_frame,
    ppo_run,
    tracked,
)

from posttrain_metrics import Frame, MetricsError
from posttrain_metrics.core.keys import KeyInfo
from posttrain_metrics.core.redact import REDACTED
from posttrain_metrics.core.reduction import Reduction
from posttrain_metrics.integrations import Sink
from posttrain_metrics.integrations.wandb import NAMESPACES, RUN_PREFIX, STEP_KEY, WandbSink, resolve_mode
from posttrain_metrics.integrations.wandb_reader import OfflineRun, read_offline_run
from posttrain_metrics.journal import JournalSink, read_journal
from posttrain_metrics.publication import Publisher

pytestmark = pytest.mark.slow  # W&B starts its wandb-core service process

SECRET = "sk-live-0123456789abcdefghijklmnop"
DB_PASSWORD = "hunter2-very-secret-pw"
HF_SECRET = "hf_abcdefghijklmnopqrstuvwxyz0123"
ARGV_SECRET = "argv-secret-value-42"
CONFIG = {
    "wandb": {"api_key": SECRET},
    "db": {"uri": f"postgresql://trainer:{DB_PASSWORD}@db.example/runs"},
    "rl": {"kl_beta": 0.04, "max_tokens": 16},
    "optim": {"lr": 1e-3, "betas": (0.9, 0.95), "scheduler": None},
    # secrets planted inside lists and dicts inside lists
    "env": [{"name": "HF_TOKEN", "value": HF_SECRET}, {"name": "SEED", "value": "7"}],
    "argv": ["--lr", "0.1", "--password", ARGV_SECRET],
}
W_RESERVED = {"_step", "_runtime", "_timestamp", STEP_KEY}


@dataclasses.dataclass
class Published:
    dir: Path
    frames: list[Frame]  # as handed to the publisher (what the journal keeps)
    shown: list[Frame]  # as W&B must show them (label indicators added, bools as 0/1; _runs.tracked)
    keys: Mapping[str, KeyInfo]
    sink: WandbSink
    wb: OfflineRun


def publish(
    folder: Path, frames: list[Frame], adapters: Any, *, failed: bool = False, **sink_kw: Any
) -> Published:
    """A real offline run through the Publisher, read back after ``finish()``.

    The environment holds no credentials (no ``WANDB_API_KEY``, a netrc path that does not exist, no
    ``WANDB_MODE``), so the default ``mode=None`` must resolve to offline on any machine."""
    sink = WandbSink(project="posttrain-metrics-tests", dir=folder, **sink_kw)
    with pytest.MonkeyPatch.context() as mp:
        for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE", "WANDB_BASE_URL"):
            mp.delenv(var, raising=False)
        mp.setenv("NETRC", str(folder / "no-netrc"))
        pub = Publisher([JournalSink(folder / "journal.jsonl"), sink], adapters=adapters, run_name=folder.name)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pub.start(CONFIG)
            for frame in frames:
                pub.publish(frame)
            pub.close(failed=failed)
    # finish() returns once W&B acknowledged the exit record; wandb-core closes the .wandb file a few
    # ms later, asynchronously. teardown() waits for that (it also runs at interpreter exit).
    import wandb  # present: importing posttrain_metrics.integrations.wandb_reader checked it, with the install line

    wandb.teardown()
    assert pub.failures == {}, pub.failures
    # the publisher removed nothing for this sink (it would warn "wandb: <key> = nan cannot be stored")
    assert not [w for w in caught if str(w.message).startswith(("wandb:", "sink 'wandb'"))], caught
    shown = [Frame(f.step, tracked(f), f.phase, f.wall_time) for f in frames]  # an independent oracle
    return Published(folder, frames, shown, pub.keys, sink, read_offline_run(folder / "wandb"))


def grpo_frames() -> list[Frame]:
    """Steps 1-6, a NaN/inf frame at step 7, then step 2 again (a replay: the step goes back)."""
    frames = grpo_run(steps=6)
    replay = Frame(2, frames[1].metrics, "train", frames[-1].wall_time + 10)
    return [*frames, nonfinite_frame(7), replay]


@pytest.fixture(scope="module")
def grpo(tmp_path_factory: pytest.TempPathFactory) -> Published:
    return publish(
        tmp_path_factory.mktemp("grpo"), grpo_frames(), GRPO_ADAPTERS, summary_every=4,
        tags=["unit", "grpo"], group="sinks", job_type="train", notes="read back from the .wandb log",
    )


@pytest.fixture(scope="module")
def hand(tmp_path_factory: pytest.TempPathFactory) -> Published:
    """_runs.hand_frames: three frames whose every run aggregate is worked out by hand (_runs.HAND_RUN)."""
    return publish(tmp_path_factory.mktemp("hand"), hand_frames(), GRPO_ADAPTERS, summary_every=2)


@pytest.fixture(scope="module")
def ppo(tmp_path_factory: pytest.TempPathFactory) -> Published:
    return publish(tmp_path_factory.mktemp("ppo"), ppo_run(steps=4, warmup=2), "ppo", failed=True)


@pytest.fixture(scope="module")
def dpo(tmp_path_factory: pytest.TempPathFactory) -> Published:
    return publish(tmp_path_factory.mktemp("dpo"), dpo_run(steps=3), "dpo")


def same(got: Any, want: Any) -> bool:
    """Equal, within float tolerance for floats, NaN equal to NaN, exact for ints and labels."""
    if isinstance(want, float):
        if math.isnan(want):
            return isinstance(got, float) and math.isnan(got)
        return isinstance(got, (int, float)) and got == pytest.approx(want, rel=1e-12, abs=1e-15)
    if isinstance(want, str):
        return got == want
    return type(got) is int and got == want


def metric_keys(row: Mapping[str, Any]) -> set[str]:
    return set(row) - W_RESERVED


def files_under(folder: Path) -> Iterator[Path]:
    return (p for p in folder.rglob("*") if p.is_file())


# -- the run itself ---------------------------------------------------------------------------


def test_the_sink_satisfies_the_protocol_and_stores_nonfinite_values():
    sink = WandbSink(project="p")
    assert isinstance(sink, Sink)
    assert sink.name == "wandb"
    assert sink.stores_nonfinite == frozenset({"nan", "inf"})


def test_without_credentials_the_run_is_offline_and_lands_in_dir(grpo):
    assert grpo.wb.path.is_relative_to(grpo.dir / "wandb")
    assert grpo.wb.path.parent.name.startswith("offline-run-"), grpo.wb.path
    assert grpo.wb.run.telemetry.feature.offline
    run = grpo.wb.run
    assert run.run_id == grpo.wb.path.stem.removeprefix("run-")
    assert run.display_name == "grpo0"  # the publisher's run name
    assert list(run.tags) == ["unit", "grpo"]
    assert (run.run_group, run.job_type, run.notes) == ("sinks", "train", "read back from the .wandb log")
    assert grpo.sink.run is None  # closed


def test_every_frame_is_one_history_row_with_every_key_and_value(grpo):
    history = grpo.wb.history
    assert len(history) == len(grpo.shown)
    for row, frame in zip(history, grpo.shown):
        assert row[STEP_KEY] == frame.step
        assert row["_timestamp"] == pytest.approx(frame.wall_time)
        assert metric_keys(row) == set(frame.metrics), frame.step
        for key, want in frame.metrics.items():
            assert same(row[key], want), (frame.step, key, row[key], want)
    # the multi-step GRPO run really covers the catalogue: objective, reward report and trainer keys
    assert {"train/loss_avg", "train/kl_max", "train/reward_mean", "train/grad_norm", "timer/e2e_step_s",
            "optim/update_outcome", "optim/update_outcome/skipped"} <= metric_keys(history[0])


def test_a_step_lower_than_a_previous_one_is_still_recorded(grpo):
    steps = [row[STEP_KEY] for row in grpo.wb.history]
    assert steps == [1, 2, 3, 4, 5, 6, 7, 2]
    replay = grpo.wb.history[-1]
    assert same(replay["train/loss_avg"], grpo.frames[1].metrics["train/loss_avg"])
    # W&B's own _step only counts rows: we never pass step=, so nothing is dropped
    assert [row["_step"] for row in grpo.wb.history] == list(range(len(steps)))


def test_every_namespace_and_declared_key_is_bound_to_the_step_axis(grpo):
    wb = grpo.wb
    assert wb.metric(STEP_KEY).options.defined
    for namespace in NAMESPACES:
        assert wb.metric(f"{namespace}/*").step_metric == STEP_KEY, namespace
    for key in grpo.keys:
        assert wb.metric(key).step_metric == STEP_KEY, key


def flags(record: Any) -> set[str]:
    s = record.summary
    return {name for name in ("min", "max", "mean", "best", "last", "none", "first") if getattr(s, name)}


def test_define_metric_summaries_follow_each_keys_semantics(grpo):
    wb = grpo.wb
    assert flags(wb.metric("train/kl_max")) == {"max"}
    assert flags(wb.metric("train/response_len_max")) == {"max"}
    assert flags(wb.metric("train/reward_min")) == {"min"}
    assert flags(wb.metric("train/loss_avg")) == {"last", "min", "max"}  # a weighted mean
    assert flags(wb.metric("train/kl_beta")) == {"last", "min", "max"}  # a plain mean
    assert flags(wb.metric("train/valid_token_count")) == set()  # a SUM: W&B's default, the last value
    assert flags(wb.metric("optim/optimizer_step")) == set()  # LAST
    assert flags(wb.metric("optim/update_outcome")) == set()  # the label: its last value
    assert flags(wb.metric("optim/update_outcome/skipped")) == {"mean"}  # share of windows
    for key, info in grpo.keys.items():
        want = {Reduction.MAX: {"max"}, Reduction.MIN: {"min"}}.get(info.reduction)
        if want is not None:
            assert flags(wb.metric(key)) == want, key
    # our aggregates never share a summary key with a define_metric summary
    assert not [m for m in wb.metrics if (m.name or m.glob_name).startswith(RUN_PREFIX)]


def test_wandb_summaries_hold_what_define_metric_asked_for(grpo):
    summary, finite = grpo.wb.summary, grpo.shown[:6]
    # kl_max: the max over the run, which the +inf of step 7 takes (documented)
    assert summary["train/kl_max"] == {"max": math.inf}
    assert summary["train/response_len_max"] == {"max": max(f.metrics["train/response_len_max"] for f in finite)}
    clip = [f.metrics["train/clip_frac"] for f in grpo.shown]
    assert summary["train/clip_frac"]["max"] == pytest.approx(max(clip))
    assert summary["train/clip_frac"]["last"] == pytest.approx(clip[-1])
    # a SUM key keeps a plain last value; the label key its last label
    assert summary["train/valid_token_count"] == grpo.shown[-1].metrics["train/valid_token_count"]
    assert summary["optim/update_outcome"] == grpo.shown[-1].metrics["optim/update_outcome"]
    outcomes = [f.metrics["optim/update_outcome"] for f in grpo.shown]
    assert summary["optim/update_outcome/skipped"]["mean"] == pytest.approx(outcomes.count("skipped") / len(outcomes))


def test_wandb_summaries_of_a_hand_computed_run(hand):
    summary = hand.wb.summary
    assert summary["train/kl_max"] == {"max": math.inf}  # max(0.25, 0.75, +inf)
    assert summary["train/response_len_max"] == {"max": 16}  # max(12, 16, 14)
    assert summary["train/reward_min"] == {"min": 0.0}  # min(0.0, 1.0)
    assert summary["train/clip_frac"]["max"] == 0.5 and summary["train/clip_frac"]["last"] == 0.125
    assert summary["train/valid_token_count"] == 20  # a SUM key keeps W&B's plain last value
    assert summary["optim/update_outcome"] == "applied"  # the last label
    # share of windows per outcome: applied, skipped, applied
    assert summary["optim/update_outcome/skipped"]["mean"] == pytest.approx(1 / 3, rel=1e-12)
    assert summary["optim/update_outcome/applied"]["mean"] == pytest.approx(2 / 3, rel=1e-12)


def test_run_aggregates_are_in_the_summary_under_run_prefix(hand):
    """Every ``run/`` aggregate equals the hand-computed figure of _runs.HAND_RUN (arithmetic there)."""
    summary = hand.wb.summary
    for key, want in HAND_RUN.items():
        got = summary[f"{RUN_PREFIX}{key}"]
        assert same(got, want), (key, got, want)
    assert {k: summary[f"{RUN_PREFIX}nonfinite/{k}"] for k in HAND_NONFINITE} == HAND_NONFINITE
    ours = {k for k in summary if k.startswith(RUN_PREFIX)}
    assert ours == {f"{RUN_PREFIX}{k}" for k in HAND_RUN} | {f"{RUN_PREFIX}nonfinite/{k}" for k in HAND_NONFINITE}
    # the literals above, spelled out for the keys where a wrong reduction would be easy to miss
    assert summary["run/train/loss_avg"] == 0.125  # (0.5*10 + 0.0*30) / 40: NaN and its weight left out
    assert summary["run/train/kl_mean"] == 0.3125  # (0.5*10 + 0.25*30) / 40: -inf and its weight left out
    assert summary["run/train/valid_token_count"] == 60 and type(summary["run/train/valid_token_count"]) is int
    assert summary["run/train/reward_std"] == pytest.approx(0.4330127018922193, rel=1e-12)  # sqrt(3/16)
    assert summary["run/train/grad_norm"] == 1.5  # LAST, not a mean (2.0 + 0.0 + 1.5)/3


def test_run_aggregates_match_a_direct_computation(grpo):
    summary, everything = grpo.wb.summary, [f.metrics for f in grpo.shown]
    finite = [m for m in everything if math.isfinite(m["train/kl_max"])]
    tokens = [m["train/valid_token_count"] for m in everything]
    clip = sum(m["train/clip_frac"] * t for m, t in zip(everything, tokens)) / sum(tokens)
    assert summary["run/train/clip_frac"] == pytest.approx(clip, rel=1e-12)
    loss = [(m["train/loss_avg"], m["train/weight_sum"]) for m in everything if math.isfinite(m["train/loss_avg"])]
    assert len(loss) == len(everything) - 1
    assert summary["run/train/loss_avg"] == pytest.approx(sum(v * w for v, w in loss) / sum(w for _, w in loss))
    assert summary["run/train/valid_token_count"] == sum(m["train/valid_token_count"] for m in everything)
    not_nan = [m["train/kl_max"] for m in everything if not math.isnan(m["train/kl_max"])]
    assert summary["run/train/kl_max"] == max(not_nan)  # NaN left out; an infinite maximum is the maximum
    assert max(not_nan) == math.inf and len(finite) < len(everything)
    assert summary["run/optim/update_outcome/skipped"] == 1
    assert summary["run/optim/update_outcome/applied"] == len(everything) - 1
    assert summary["run/optim/update_outcome/discarded"] == 0


def test_run_aggregates_are_written_during_the_run_not_only_at_close(grpo):
    kinds = [r.WhichOneof("record_type") for r in grpo.wb.records]
    ours = [i for i, r in enumerate(grpo.wb.records)
            if kinds[i] == "summary" and any(u.key.startswith(RUN_PREFIX) or
                                              (u.nested_key and u.nested_key[0].startswith(RUN_PREFIX))
                                              for u in r.summary.update)]
    last_row = max(i for i, k in enumerate(kinds) if k == "history")
    assert ours and ours[0] < last_row, "summary_every=4 should push aggregates before the last row"


def test_labels_are_logged_as_strings_and_as_indicators(grpo, hand):
    assert [row["optim/update_outcome"] for row in hand.wb.history] == ["applied", "skipped", "applied"]
    for key, want in HAND_INDICATORS.items():
        got = [row[key] for row in hand.wb.history]
        assert got == want and all(type(v) is int for v in got), (key, got)
    # the longer GRPO run: step 3 is its skip, every other window applied
    assert [row["optim/update_outcome"] for row in grpo.wb.history] == [
        "applied", "applied", "skipped", "applied", "applied", "applied", "applied", "applied"]
    assert [row["optim/update_outcome/skipped"] for row in grpo.wb.history] == [0, 0, 1, 0, 0, 0, 0, 0]
    assert [row["optim/update_outcome/applied"] for row in grpo.wb.history] == [1, 1, 0, 1, 1, 1, 1, 1]
    assert grpo.wb.column("optim/update_outcome")[3] == "skipped"


def test_a_hand_computed_run_is_stored_row_by_row(hand):
    rows = hand.wb.history
    assert [r[STEP_KEY] for r in rows] == [1, 2, 3]
    assert [r["train/loss_avg"] for r in rows][:2] == [0.5, 0.0] and math.isnan(rows[2]["train/loss_avg"])
    assert [r["train/kl_max"] for r in rows] == [0.25, 0.75, math.inf]
    assert [r["train/response_len_max"] for r in rows] == [12, 16, 14]
    assert "train/reward_mean" not in rows[2]  # absent, not 0
    assert metric_keys(rows[0]) == set(hand_frames()[0].metrics) | set(HAND_INDICATORS)


def test_config_is_nested_with_lists_and_nulls_and_redacted_at_every_depth(grpo):
    config = {k: v for k, v in grpo.wb.config.items() if not k.startswith("_")}  # _wandb: W&B's own
    assert config == {
        "wandb": {"api_key": REDACTED},
        "db": {"uri": f"postgresql://trainer:{REDACTED}@db.example/runs"},
        "rl": {"kl_beta": 0.04, "max_tokens": 16},
        "optim": {"lr": 1e-3, "betas": [0.9, 0.95], "scheduler": None},
        "env": [{"name": "HF_TOKEN", "value": REDACTED}, {"name": "SEED", "value": "7"}],
        "argv": ["--lr", "0.1", "--password", REDACTED],
    }
    # the journal header keeps the same tree, and reads flat for the doctor
    journal = read_journal(grpo.dir / "journal.jsonl")
    assert journal.config_tree["optim"] == {"lr": 1e-3, "betas": [0.9, 0.95], "scheduler": None}
    assert journal.config["optim/lr"] == 1e-3 and journal.config["env/0/value"] == REDACTED
    files = list(files_under(grpo.dir))
    assert any(p.suffix == ".wandb" for p in files) and any(p.name == "journal.jsonl" for p in files)
    for path in files:
        data = path.read_bytes()
        for secret in (SECRET, DB_PASSWORD, HF_SECRET, ARGV_SECRET):
            assert secret.encode() not in data, f"{secret!r} leaked into {path}"


def test_nonfinite_values_are_stored_faithfully_in_history(grpo):
    row = next(r for r in grpo.wb.history if r[STEP_KEY] == 7)
    assert math.isnan(row["train/loss_avg"])
    assert row["train/kl_max"] == math.inf
    assert row["train/kl_mean"] == -math.inf
    assert not [k for r in grpo.wb.history for k in r if k.startswith("health/nonfinite/")]
    # the journal keeps the exact values too
    journal = read_journal(grpo.dir / "journal.jsonl")
    held = next(f for f in journal.frames if f.step == 7).metrics
    assert math.isnan(held["train/loss_avg"]) and held["train/kl_max"] == math.inf
    assert held["train/kl_mean"] == -math.inf


def test_nan_poisons_wandbs_own_min_and_max_but_not_last_nor_ours(grpo):
    loss = grpo.wb.summary["train/loss_avg"]
    assert math.isnan(loss["min"]) and math.isnan(loss["max"])  # for the rest of the run
    assert loss["last"] == pytest.approx(grpo.frames[-1].metrics["train/loss_avg"])  # recovered
    assert grpo.wb.summary["train/kl_mean"]["min"] == -math.inf
    assert math.isfinite(grpo.wb.summary["run/train/loss_avg"])


def test_a_finished_run_exits_0_and_close_is_idempotent(grpo):
    assert grpo.wb.exit_code == 0
    grpo.sink.close()
    grpo.sink.close(failed=True)
    exits = [r for r in read_offline_run(grpo.dir / "wandb").records if r.WhichOneof("record_type") == "exit"]
    assert [r.exit.exit_code for r in exits] == [0]


def test_a_failed_run_exits_1(ppo):
    assert ppo.wb.exit_code == 1


def test_the_training_span_is_in_the_summary_and_agrees_with_mlflows_duration(tmp_path):
    """Issue 30, item 9: MLflow's run lasts from the training's start (the journal header's time) to its
    last frame; W&B's own runtime is its service's clock and cannot be set (see the sink's docstring),
    so the summary holds the same span, and every row's ``_timestamp`` is its frame's wall time."""
    from mlflow import MlflowClient

    from posttrain_metrics.integrations.mlflow import MlflowSink

    mlflow = MlflowSink(dir=tmp_path / "mlflow")
    wandb_sink = WandbSink(project="posttrain-metrics-tests", dir=tmp_path)
    with pytest.MonkeyPatch.context() as mp:
        for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE", "WANDB_BASE_URL"):
            mp.delenv(var, raising=False)
        mp.setenv("NETRC", str(tmp_path / "no-netrc"))
        pub = Publisher([JournalSink(tmp_path / "journal.jsonl"), mlflow, wandb_sink], adapters=GRPO_ADAPTERS,
                        mode="inline")
        pub.start({}, started=1_699_999_999.5)  # training started half a second before step 1's frame
        for frame in hand_frames():  # wall times 1_700_000_001.0, .002.0, .003.0
            pub.publish(frame)
        pub.close()
    import wandb

    wandb.teardown()
    assert pub.failures == {}, pub.failures
    info = MlflowClient(mlflow.tracking_uri).get_run(mlflow.run_id).info
    assert (info.end_time - info.start_time) / 1000 == 3.5  # 1_700_000_003.0 - 1_699_999_999.5
    wb = read_offline_run(tmp_path / "wandb")
    assert wb.summary["posttrain_metrics/started_at"] == "2023-11-14T22:13:19.500Z"  # 1_699_999_999.5 UTC
    assert wb.summary["posttrain_metrics/ended_at"] == "2023-11-14T22:13:23.000Z"  # step 3's frame
    assert wb.summary["posttrain_metrics/duration_s"] == 3.5
    assert [row["_timestamp"] for row in wb.history] == [1_700_000_001.0, 1_700_000_002.0, 1_700_000_003.0]


def test_frames_from_before_the_recorded_start_start_the_span(hand):
    """A replay of frames stamped before the publisher's start (hand frames of 2023): the span starts at
    the first frame, never after the last one."""
    assert hand.wb.summary["posttrain_metrics/started_at"] == "2023-11-14T22:13:21.000Z"  # step 1's frame
    assert hand.wb.summary["posttrain_metrics/ended_at"] == "2023-11-14T22:13:23.000Z"
    assert hand.wb.summary["posttrain_metrics/duration_s"] == 2.0


# -- PPO warmup and DPO phases ------------------------------------------------------------------


def test_ppo_critic_warmup_steps_have_no_policy_keys(ppo):
    policy = {k for k in ppo.keys if k.split("/", 1)[1] in {
        "policy_token_count", "policy_total_loss", "policy_loss", "clip_fraction", "ratio_mean",
        "policy_lr", "policy_optimizer_step"}}
    assert len(policy) == 7, policy
    history = ppo.wb.history
    assert [r[STEP_KEY] for r in history] == [1, 2, 3, 4]
    for row in history[:2]:
        assert not policy & set(row), row  # absent, not 0
        assert "train/value_loss" in row
    for row, frame in zip(history[2:], ppo.shown[2:]):
        assert policy <= set(row)
        for key in policy:
            assert same(row[key], frame.metrics[key]), key
    assert ppo.wb.column("train/policy_loss").keys() == {3, 4}


def test_dpo_publishes_train_and_val_at_the_same_steps(dpo):
    history = dpo.wb.history
    assert [r[STEP_KEY] for r in history] == [1, 1, 2, 2, 3, 3]
    for row, frame in zip(history, dpo.shown):
        assert metric_keys(row) == set(frame.metrics)
        assert {k.split("/", 1)[0] for k in metric_keys(row)} == {frame.phase}
        for key, want in frame.metrics.items():
            assert same(row[key], want), key
    assert "train/dpo_accuracy" in dpo.wb.summary and "val/dpo_accuracy" in dpo.wb.summary
    assert dpo.wb.metric("val/*").step_metric == STEP_KEY
    assert dpo.wb.summary["run/val/loss_avg"] == pytest.approx(
        sum(f.metrics["val/loss_avg"] for f in dpo.shown if f.phase == "val") / 3)
    assert dpo.wb.exit_code == 0


# -- configuration, mode and a missing wandb -----------------------------------------------------


def test_mode_explicit_argument_wins_then_wandb_mode_then_offline_without_a_key(tmp_path):
    no_netrc = {"NETRC": str(tmp_path / "absent")}
    assert resolve_mode(None, no_netrc) == "offline"
    assert resolve_mode(None, {**no_netrc, "WANDB_MODE": "online"}) == "online"
    assert resolve_mode("offline", {**no_netrc, "WANDB_MODE": "online", "WANDB_API_KEY": "k" * 40}) == "offline"
    assert resolve_mode("online", {**no_netrc, "WANDB_MODE": "offline"}) == "online"
    assert resolve_mode(None, {**no_netrc, "WANDB_API_KEY": "k" * 40}) is None  # wandb's default
    assert resolve_mode(None, {**no_netrc, "WANDB_IDENTITY_TOKEN_FILE": "/tok"}) is None
    netrc = tmp_path / "netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    assert resolve_mode(None, {"NETRC": str(netrc)}) is None
    assert resolve_mode(None, {"NETRC": str(netrc), "WANDB_BASE_URL": "https://wandb.corp.example"}) == "offline"
    assert resolve_mode(None, no_netrc, {"api_key": "k" * 40}) is None  # WandbSink(settings=...)
    assert resolve_mode(None, {"NETRC": str(netrc)}, {"base_url": "https://wandb.corp.example"}) == "offline"
    with pytest.raises(MetricsError, match="mode='cloud'"):
        resolve_mode("cloud", no_netrc)


def test_bad_arguments_are_refused_at_construction():
    with pytest.raises(MetricsError, match="mode='cloud'"):
        WandbSink(project="p", mode="cloud")
    with pytest.raises(MetricsError, match="pass a list"):
        WandbSink(project="p", tags="grpo")
    with pytest.raises(MetricsError, match="mode="):
        WandbSink(project="p", settings={"mode": "offline"})


def test_write_before_start_is_an_error():
    with pytest.raises(MetricsError, match="before start"):
        WandbSink(project="p").write(Frame(1, {"train/loss_avg": 0.1}))
    WandbSink(project="p").close()  # closing a sink never started is a no-op


def test_a_missing_wandb_fails_loudly_with_the_install_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` now raises ImportError
    sink = WandbSink(project="p", dir=tmp_path / "run")  # cheap: no import, no I/O
    assert not (tmp_path / "run").exists()
    pub = Publisher([sink], adapters=GRPO_ADAPTERS)
    with pytest.raises(ImportError) as err:  # a requested backend that is missing is an error
        pub.start({})
    assert "pip install 'posttrain-metrics[wandb]'" in str(err.value).splitlines()
    pub.close()


# -- W&B's own conventions: environment variables, labels that no longer hold ---------------------


def offline_env(mp: pytest.MonkeyPatch, folder: Path) -> None:
    for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE", "WANDB_BASE_URL"):
        mp.delenv(var, raising=False)
    mp.setenv("NETRC", str(folder / "no-netrc"))


WANDB_ENV = {
    "WANDB_PROJECT": "env-project", "WANDB_ENTITY": "env-team", "WANDB_RUN_GROUP": "sweep-7",
    "WANDB_TAGS": "grpo, nightly", "WANDB_NOTES": "set in the environment", "WANDB_JOB_TYPE": "rl-train",
}


def test_wandb_environment_variables_fill_what_the_sink_config_leaves_out(tmp_path, monkeypatch):
    import wandb

    offline_env(monkeypatch, tmp_path)
    for var, value in WANDB_ENV.items():
        monkeypatch.setenv(var, value)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    out = tmp_path / "out"
    from posttrain_metrics.integrations.factory import build_sink

    sink = build_sink({"type": "wandb"}, out_dir=out)  # no project in the config: WANDB_PROJECT
    pub = Publisher([JournalSink(out / "journal.jsonl"), sink], adapters=GRPO_ADAPTERS, run_name="env")
    pub.start({})
    for frame in grpo_run(steps=2):
        pub.publish(frame)
    pub.close()
    wandb.teardown()
    assert pub.failures == {}, pub.failures
    run = read_offline_run(tmp_path / "wandb-dir" / "wandb").run  # WANDB_DIR, not out_dir
    assert (run.project, run.entity, run.run_group, list(run.tags), run.notes, run.job_type) == (
        "env-project", "env-team", "sweep-7", ["grpo", "nightly"], "set in the environment", "rl-train")
    assert not (out / "wandb").exists()
    # recorded in the journal header, for export --to wandb
    assert read_journal(out / "journal.jsonl").trackers["wandb"] == {"project": "env-project", "entity": "env-team"}


def test_an_explicit_argument_wins_over_the_wandb_environment(monkeypatch, tmp_path):
    for var, value in WANDB_ENV.items():
        monkeypatch.setenv(var, value)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "env-dir"))
    sink = WandbSink(project="cfg", entity="me", group="g", tags=[], notes="n", job_type="eval", dir=tmp_path)
    assert (sink.project, sink.entity, sink.group, sink.tags, sink.notes, sink.job_type, sink.dir) == (
        "cfg", "me", "g", (), "n", "eval", tmp_path)
    for var in (*WANDB_ENV, "WANDB_DIR"):
        monkeypatch.delenv(var)
    bare = WandbSink()  # neither: W&B's own defaults (its project "uncategorized" once started)
    assert (bare.project, bare.entity, bare.group, bare.tags, bare.dir) == (None, None, None, (), None)



def test_a_label_absent_from_a_later_frame_is_not_left_in_the_summary(tmp_path):
    wb = publish(tmp_path, LABELLED[:3], [*GRPO_ADAPTERS, "validation"]).wb
    assert wb.summary["optim/skip_reason"] == "nonfinite_loss"  # the val frame left it alone
    wb = publish(tmp_path / "later", LABELLED, [*GRPO_ADAPTERS, "validation"]).wb
    assert wb.summary.get("optim/skip_reason") is None  # step 3 was applied: no reason any more
    assert wb.summary["optim/update_outcome"] == "applied"
    assert wb.column("optim/skip_reason") == {2: "nonfinite_loss"}  # the history keeps what happened


def test_the_publisher_process_starts_its_own_wandb_service_not_the_trainers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trainer that uses W&B itself leaves its wandb-core's address in WANDB_SERVICE for its children.
    The publisher process must not attach to it: here the address is of a service that is gone (as a
    killed trainer's is), and the publisher's W&B run still holds every step."""
    from posttrain_metrics.callbacks import MetricsCallback

    offline_env(monkeypatch, tmp_path)
    monkeypatch.setenv("WANDB_SERVICE", f"2-{2**22 + 7}-unix-{tmp_path / 'gone.sock'}")
    out = tmp_path / "run"
    with MetricsCallback(adapters=GRPO_ADAPTERS, out_dir=out, run_id="ownservice1", close_timeout=240,
                         sinks=[{"type": "journal"}, {"type": "wandb", "project": "own-service"}]) as cb:
        cb.on_run_start({})
        for frame_step in (1, 2, 3):
            cb.on_chunk_end(grpo_chunk(random.Random(frame_step), frame_step, last=True))
            cb.on_window_end(frame_step)
    status = json.loads((out / "journal.jsonl.publisher.json").read_text())
    assert status["status"] == "finished" and not status["failures"], status
    [file] = sorted((out / "wandb").rglob("run-ownservice1.wandb"))
    assert [row["trainer/step"] for row in read_offline_run(file).history] == [1, 2, 3]


@pytest.mark.parametrize("mode", ["inline", "thread"])
def test_an_address_of_a_wandb_service_that_is_gone_is_not_followed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """The training process itself inherited WANDB_SERVICE from a parent whose wandb-core has exited:
    the sink starts W&B's own service instead of failing to connect."""
    import wandb

    offline_env(monkeypatch, tmp_path)
    monkeypatch.setenv("WANDB_SERVICE", f"3-{2**22 + 11}-unix-{tmp_path / 'gone.sock'}")
    sink = WandbSink(project="gone-service", dir=tmp_path, settings={"quiet": True})
    pub = Publisher([JournalSink(tmp_path / "journal.jsonl"), sink], adapters=GRPO_ADAPTERS, mode=mode,
                    run_id=f"gone{mode}1")
    pub.start({})
    for frame in grpo_run(steps=3):
        pub.publish(frame)
    pub.close()
    wandb.teardown()
    assert pub.failures == {}, pub.failures
    [file] = sorted(tmp_path.rglob(f"run-gone{mode}1.wandb"))
    assert [row["trainer/step"] for row in read_offline_run(file).history] == [1, 2, 3]
