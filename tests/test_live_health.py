"""Live health (posttrain_metrics.publication.health): the doctor's checks over a journal as it is
written agree with the offline doctor on every journal of the doctor's tests and on random runs; the
stop bit rides in the reducer's buffer; the actions config; the trackers' findings read back."""

from __future__ import annotations

import inspect
import json
import random
import warnings
from pathlib import Path
from typing import Any

import pytest
import test_health as th
from _runs import grpo_run

from posttrain_metrics import Frame, MetricReducer
from posttrain_metrics.core.errors import MetricsError
from posttrain_metrics.doctor import CHECKS, Finding, run_checks
from posttrain_metrics.journal import open_journal, read_journal
from posttrain_metrics.publication.health import (
    CLOSE_ONLY,
    LiveHealth,
    check_of,
    findings_path,
    parse_health,
    read_findings,
    stop_code,
    stop_path,
)

# -- the live doctor against the offline one ---------------------------------------------------------


def live(path: Path, actions: dict[str, str] | None = None, *, file: bool = False) -> LiveHealth:
    """The live doctor over a finished journal, fed a few lines at a time (as a publisher that wakes
    while the run writes), then closed."""
    health = LiveHealth(path, parse_health(actions or {}), live=file, batch=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        while health.step():
            pass
        health.close()
    return health


def check_agreement(path: Path, offline: list[Finding]) -> None:
    """The contract of the module docstring, on one journal (independent of the code under test: the
    offline doctor's findings and the journal's own frame steps)."""
    health = live(path)
    steps = [f.step for f in read_journal(path).frames if f.phase == "train"]
    by_check = {(f.check, f.severity.value, *f.keys): f for f in offline}
    events = [e for e in health.events if e["kind"] == "finding"]
    published = [(e["check"], e["severity"], *e["keys"]) for e in events]
    assert len(set(published)) == len(published)  # each finding published once
    # every offline finding is published: live, or at the close
    assert set(by_check) <= set(published)
    for e in events:
        key = (e["check"], e["severity"], *e["keys"])
        if e["when"] == "close":
            assert key in by_check and e == {**e, **by_check[key].to_dict()}
            continue
        assert e["check"] not in CLOSE_ONLY
        # every live check is causal, the trend checks too (a baseline of their first 8 points, the same
        # live and offline): it is an offline finding, fired within a frame of its first step
        whole = by_check[key]
        assert set(e["steps"]) <= set(whole.steps)
        if whole.steps:  # fired within one frame of the first step the offline doctor names
            first = min(whole.steps)
            later = [s for s in steps if s > first]
            assert e["step"] in {first, *later[:1]}, (e["check"], e["step"], first)


def _journal_tests() -> list[str]:
    return [name for name, fn in vars(th).items()
            if name.startswith("test_") and callable(fn) and list(inspect.signature(fn).parameters) == ["tmp_path"]
            and "doctor(" in inspect.getsource(fn)]


@pytest.mark.parametrize("name", _journal_tests())
def test_the_live_doctor_agrees_with_the_offline_one_on_the_doctors_journals(name, tmp_path, monkeypatch):
    offline_doctor = th.doctor
    seen = []

    def doctor(tmp: Path, frames: list[Frame], **kw: object) -> list[Finding]:
        findings = offline_doctor(tmp, frames, **kw)
        check_agreement(tmp / "journal.jsonl", findings)
        seen.append(1)
        return findings

    monkeypatch.setattr(th, "doctor", doctor)
    getattr(th, name)(tmp_path)
    assert seen


def _random_run(rng: random.Random) -> tuple[list[Frame], dict[str, Any]]:
    frames = grpo_run(steps=rng.randint(4, 40), seed=rng.randint(0, 10**6))
    changes: dict[int, dict[str, object]] = {}
    for _ in range(rng.randint(0, 4)):
        step = rng.choice(frames).step
        kind = rng.randrange(5)
        if kind == 0:
            changes[step] = {"train/kl_mean": 1e-3, "train/kl_max": 5.0, "train/grad_norm": 60.0}
        elif kind == 1:
            changes[step] = {"train/clip_frac": 0.2}
        elif kind == 2:
            changes[step] = {"train/grpo_informative_group_count": 0}
        elif kind == 3:
            changes[step] = {"train/loss_avg": float("nan"), "optim/update_outcome": "applied"}
        else:
            changes[step] = {"train/sc_rho_max": 500.0}
    config = {"rl": {"n_mini": rng.choice([1, 2])}, "rollout": {"max_tokens": 16}}
    return th.edit(frames, changes), config


@pytest.mark.parametrize("seed", range(12))
def test_the_live_doctor_agrees_with_the_offline_one_on_random_runs(seed, tmp_path):
    frames, config = _random_run(random.Random(seed))
    path = th.write_journal(tmp_path / "journal.jsonl", frames, config=config)
    check_agreement(path, run_checks(open_journal(path)))


@pytest.mark.parametrize("seed", range(8))
def test_the_live_trend_checks_fire_where_the_offline_ones_name_on_random_rises(seed, tmp_path):
    # Truncation pinned at the budget and the logprob gap rising from a random step after the baseline
    # (steps 1-8) of a run of random length, with the budget in the config or not (then the longest
    # response so far, 16 at every step). By hand: the truncation baseline is 0.0, so it fires from the
    # rise on (0.5 >= 0.0 + 0.1); the gap's baseline is 0.004, its floor max(3 x 0.004, 0.004 + 0.02) =
    # 0.024, and it reads 0.008, 0.016, 0.032, ... from the rise: it fires from two steps after it.
    # Live fires each at that same step (the offline doctor used to name the first quarter's steps).
    rng = random.Random(1000 + seed)
    frames = grpo_run(steps=rng.randint(11, 40), seed=rng.randint(0, 10**6))
    last = frames[-1].step
    assert [f.step for f in frames] == list(range(1, last + 1))
    rise = rng.randint(9, last - 2)
    changes = {s: {"train/rollout_truncated_frac": 0.0 if s < rise else 0.5, "train/response_len_max": 16,
                   "train/logprob_gap_mean": 0.004 if s < rise else 0.004 * 2.0 ** (s - rise + 1)}
               for s in range(1, last + 1)}
    config = {"rl": {"n_mini": 2}, **({"rollout": {"max_tokens": 16}} if seed % 2 else {})}
    path = th.write_journal(tmp_path / "journal.jsonl", th.edit(frames, changes), config=config)
    offline = run_checks(open_journal(path))
    assert th.only(offline, "length_budget").steps == tuple(range(rise, last + 1))
    assert th.only(offline, "logprob_gap_rising").steps == tuple(range(rise + 2, last + 1))
    check_agreement(path, offline)
    events = {e["check"]: (e["when"], e["step"]) for e in live(path).events if e["kind"] == "finding"}
    assert events["length_budget"] == ("live", rise) and events["logprob_gap_rising"] == ("live", rise + 2)


def test_the_findings_file_holds_each_finding_then_the_runs_verdict(tmp_path):
    frames = th.edit(th.healthy(), {9: {"train/kl_mean": 1e-3, "train/kl_max": 5.0, "train/grad_norm": 40.0}})
    path = th.write_journal(tmp_path / "journal.jsonl", frames)
    health = live(path, {"kl_spike": "stop"}, file=True)
    lines = read_findings(path)
    assert [(e["check"], e["step"], e["action"]) for e in lines[:-1]] == [
        ("zero_grad_skips", 3, "warn"), ("kl_spike", 9, "stop")]
    assert lines[-1]["kind"] == "close" and lines[-1]["findings"] == [f.to_dict() for f in run_checks(read_journal(path))]
    decision = json.loads(stop_path(path).read_text())
    assert decision["check"] == "kl_spike" and decision["step"] == 9 and check_of(decision["code"]) == "kl_spike"
    assert health.stopped == decision
    assert findings_path(path).name == "journal.jsonl.findings.jsonl"


def test_a_check_set_off_is_not_published_and_not_live(tmp_path):
    frames = th.edit(th.healthy(), {9: {"train/kl_mean": 1e-3, "train/kl_max": 5.0, "train/grad_norm": 40.0}})
    path = th.write_journal(tmp_path / "journal.jsonl", frames)
    health = live(path, {"kl_spike": "off"})
    assert [e["check"] for e in health.events] == ["zero_grad_skips"]
    assert not stop_path(path).exists()


def test_the_healthy_run_fires_nothing_at_warning_or_above(tmp_path):
    path = th.write_journal(tmp_path / "journal.jsonl", grpo_run(steps=40, seed=3))
    assert {e["severity"] for e in live(path).events} <= {"info"}


def test_the_actions_config_is_checked():
    actions = parse_health({"kl_spike": "stop", "default": "off"})
    assert actions["kl_spike"] == "stop" and actions["update_skipped"] == "off" and len(actions) == len(CHECKS)
    with pytest.raises(MetricsError, match="unknown check"):
        parse_health({"kl_spikes": "stop"})
    with pytest.raises(MetricsError, match="not an action"):
        parse_health({"kl_spike": "halt"})
    assert [check_of(stop_code(c.id)) for c in CHECKS] == [c.id for c in CHECKS] and check_of(0) == ""


# -- the stop bit ----------------------------------------------------------------------------------------


def test_the_stop_request_rides_in_the_window_and_sticks():
    reducer = MetricReducer(["grpo"])
    reducer.add({"grpo_kl_max": 0.5})
    assert reducer.reduce(1).metrics == {"train/kl_max": 0.5} and reducer.stop == 0
    reducer.stop_request = stop_code("kl_spike")
    reducer.add({"grpo_kl_max": 0.7})
    frame = reducer.reduce(2)
    assert frame.metrics == {"train/kl_max": 0.7}  # the bit is not a metric
    assert check_of(reducer.stop) == "kl_spike"


@pytest.mark.filterwarnings("ignore:MetricsCallback. health is set")
def test_the_callback_says_should_stop_once_the_publisher_decided(tmp_path):
    from posttrain_metrics.callbacks import MetricsCallback

    cb = MetricsCallback(adapters=["grpo"], sinks=[{"type": "journal"}], out_dir=tmp_path, publisher="inline",
                         health={"kl_spike": "stop"})
    journal = cb.publisher.journal_path
    assert journal is not None
    cb.on_run_start({})
    stopped_at = None
    for step in range(1, 400):
        cb.on_chunk_end({"grpo_kl_max": 0.5})
        cb.on_window_end(step)
        if step == 3:  # what the publisher writes when kl_spike fires
            stop_path(journal).write_text(json.dumps({"check": "kl_spike", "code": stop_code("kl_spike"),
                                                      "step": 3, "explanation": "a spike"}))
        if cb.should_stop:
            stopped_at = step
            break
        import time

        time.sleep(0.01)
    assert stopped_at is not None and stopped_at > 3 and cb.stopped_by == "kl_spike"
    cb.on_run_end()
    end = read_journal(journal).end
    assert end is not None and end["status"] == "finished" and "kl_spike" in end["reason"]
    assert [f.step for f in read_journal(journal).frames] == list(range(1, stopped_at + 1))


def test_thresholds_overridden_per_check_judge_live_and_at_the_close(tmp_path):
    from posttrain_metrics.publication.health import parse_thresholds, write_health_config

    # kl_max 0.6 at 600x kl_mean with a grad jump: below the defaults (1 nat, 1000x), above these
    frames = th.edit(th.healthy(), {9: {"train/kl_mean": 1e-3, "train/kl_max": 0.6, "train/grad_norm": 40.0}})
    path = th.write_journal(tmp_path / "journal.jsonl", frames)
    assert not th.fired(run_checks(read_journal(path)), "kl_spike")
    config = {"kl_spike": {"action": "stop", "kl_ratio_min": 500, "kl_max_min": 0.5}, "default": "warn"}
    thresholds = parse_thresholds(config)
    assert thresholds == {"KL_RATIO_MIN": 500.0, "KL_MAX_MIN": 0.5} and parse_health(config)["kl_spike"] == "stop"
    write_health_config(path, parse_health(config), thresholds)
    health = LiveHealth.open(path, live=False)
    assert health is not None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        while health.step():
            pass
        verdict = health.close()
    assert [(e["check"], e["step"], e["when"]) for e in health.events if e["check"] == "kl_spike"] == [
        ("kl_spike", 9, "live")]
    assert th.only(verdict, "kl_spike").steps == (9,)
    with pytest.raises(MetricsError, match="not one of its thresholds"):
        parse_thresholds({"kl_spike": {"truncation_rise": 0.2}})


@pytest.mark.filterwarnings("ignore:MetricsCallback. health is set")
def test_the_hugging_face_callback_stops_the_trainer_at_the_step_the_stop_rode_in():
    transformers = pytest.importorskip("transformers")
    from test_callbacks_transformers import grpo_args

    from posttrain_metrics.callbacks.transformers import PosttrainMetricsCallback
    from posttrain_metrics.integrations.memory import MemorySink

    sink = MemorySink()
    cb = PosttrainMetricsCallback(sinks=[sink], health={"kl_spike": "stop"})
    args, state, control = grpo_args(), transformers.TrainerState(), transformers.TrainerControl()
    cb.on_train_begin(args, state, control)
    for step in (1, 2):
        state.global_step = step
        cb.on_step_begin(args, state, control)
        cb.on_chunk_end({"grpo_kl_max": float(step)})
        if step == 2:
            cb._reducers["train"].stop_request = stop_code("kl_spike")  # what the watcher sets on rank 0
        control.should_log = False
        cb.on_step_end(args, state, control)
        assert control.should_training_stop is (step == 2)
    cb.on_train_end(args, state, control)
    assert [f.step for f in sink.frames] == [1, 2] and cb.stopped_by == "kl_spike"


@pytest.mark.filterwarnings("ignore:MetricsCallback. health is set")
def test_the_lightning_callback_sets_should_stop_at_the_step_the_stop_rode_in():
    pytest.importorskip("lightning")
    from types import SimpleNamespace

    from posttrain_metrics.callbacks.lightning import OUTPUT_KEY, LightningMetricsCallback

    cb = LightningMetricsCallback(adapters=["grpo"], sinks=[{"type": "memory"}], health={"kl_spike": "stop"})
    trainer = SimpleNamespace(global_step=0, should_stop=False)
    cb._seen_step = 0
    for step in (1, 2):
        trainer.global_step = step  # the optimizer stepped in this batch
        if step == 2:
            cb.metrics._reducers["train"].stop_request = stop_code("kl_spike")
        cb.on_train_batch_end(trainer, None, {OUTPUT_KEY: {"grpo_kl_max": 0.5}}, None, 0)  # type: ignore[arg-type]
        assert trainer.should_stop is (step == 2)
    cb.metrics.on_run_end()


def test_export_replays_the_findings_file_into_the_tracker(tmp_path, capsys):
    from _runs import only_run
    from test_export import export, tensorboard_series

    frames = th.edit(th.healthy(), {9: {"train/kl_mean": 1e-3, "train/kl_max": 5.0, "train/grad_norm": 40.0}})
    path = th.write_journal(tmp_path / "journal.jsonl", frames)
    live(path, {"kl_spike": "stop"}, file=True)  # what the run's publisher left beside the journal
    target = tmp_path / "tb"
    assert "exported 12 of 12 frames" in export(path, "tensorboard", str(target), capsys=capsys)
    series = tensorboard_series(only_run(target))
    assert series["health/kl_spike"] == [(9, 1.0)] and series["health/zero_grad_skips"] == [(3, 1.0)]
    assert series["health/update_skipped"] == [(1, 0.0)]  # a check that never fired: 0 at the first step
