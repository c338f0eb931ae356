"""Publisher, journal, console, memory sink, run summaries and redaction (no vendor needed)."""

from __future__ import annotations

import io
import json
import math
import warnings

import pytest
from _runs import (
    GRPO_ADAPTERS,
    HAND_NONFINITE,
    HAND_RUN,
    CloseCountingSink,
    grpo_run,
    hand_frames,
    nonfinite_frame,
    ppo_run,
)

from posttrain_metrics import Frame, MetricsError, get_adapter
from posttrain_metrics.core.keys import describe
from posttrain_metrics.core.redact import REDACTED, flatten_config, is_secret_key
from posttrain_metrics.core.summary import RunSummary
from posttrain_metrics.integrations import ConsoleSink, MemorySink
from posttrain_metrics.journal import JournalSink, read_journal
from posttrain_metrics.publication import Publisher


def publish(frames: list[Frame], sinks: list, adapters=GRPO_ADAPTERS, config=None, failed=False) -> Publisher:
    pub = Publisher(sinks, adapters=adapters, run_name="t")
    pub.start(config or {})
    for frame in frames:
        pub.publish(frame)
    pub.close(failed=failed)
    return pub


def test_journal_round_trips_every_frame_exactly(tmp_path):
    frames = [*grpo_run(), nonfinite_frame(7)]
    publish(frames, [JournalSink(tmp_path / "j.jsonl")])
    journal = read_journal(tmp_path / "j.jsonl")
    assert [f.step for f in journal.frames] == [f.step for f in frames]
    for got, want in zip(journal.frames, frames):
        assert got.metrics.keys() == want.metrics.keys()
        for key, value in want.metrics.items():
            back = got.metrics[key]
            assert type(back) is type(value), key
            assert back == value or (math.isnan(back) and math.isnan(value)), key
    assert journal.end is not None and journal.end["status"] == "finished"
    # strict JSON: no bare NaN/Infinity tokens
    for line in (tmp_path / "j.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))


def test_journal_reader_skips_a_torn_last_line_and_rejects_bad_files(tmp_path):
    path = tmp_path / "j.jsonl"
    publish(grpo_run(steps=3), [JournalSink(path)])
    text = path.read_text()
    lines = text.splitlines()
    path.write_text("\n".join(lines[:-1]) + "\n" + lines[-2][: len(lines[-2]) // 2])  # torn copy of a frame
    with pytest.warns(UserWarning, match="torn last line"):
        journal = read_journal(path)
    assert [f.step for f in journal.frames] == [1, 2, 3]
    assert journal.end is None
    header = json.loads(lines[0])
    header["version"] = 99
    path.write_text(json.dumps(header) + "\n")
    with pytest.raises(MetricsError, match="version 99"):
        read_journal(path)
    with pytest.raises(MetricsError, match="does not exist"):
        read_journal(tmp_path / "missing.jsonl")
    path.write_text('{"hello": 1}\n')
    with pytest.raises(MetricsError, match="header"):
        read_journal(path)


def test_publisher_writes_the_journal_first_and_normalises_for_sinks(tmp_path, caplog):
    seen_in_journal: list[bool] = []

    class Spy(MemorySink):
        def __init__(self, name: str, stores=frozenset({"nan", "inf"})):
            super().__init__()
            self.name = name
            self.stores_nonfinite = stores

        def write(self, frame):
            lines = (tmp_path / "j.jsonl").read_text().splitlines()
            seen_in_journal.append(any(f'"step":{frame.step},' in line for line in lines))
            super().write(frame)

    strict = Spy("strict", frozenset())
    journal = JournalSink(tmp_path / "j.jsonl")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        publish([*grpo_run(steps=3), nonfinite_frame(4), nonfinite_frame(5)], [strict, journal])
    assert seen_in_journal == [True] * 5  # every frame was in the journal before any other sink saw it
    skipped = strict.frames[2].metrics
    assert skipped["optim/update_outcome"] == "skipped"
    assert skipped["optim/update_outcome/skipped"] == 1 and skipped["optim/update_outcome/applied"] == 0
    assert skipped["optim/step_skipped"] == 1 and type(skipped["optim/step_skipped"]) is int
    last = strict.frames[-1].metrics
    assert "train/loss_avg" not in last and "train/kl_max" not in last
    assert last["health/nonfinite/train/loss_avg"] == 2 and last["health/nonfinite/train/kl_max"] == 2
    assert not caught  # a value a backend cannot store is an operational message: a log record
    assert sum("cannot be stored faithfully" in m for m in caplog.messages) == 3  # once per key


def test_publisher_isolates_a_failing_sink(tmp_path, caplog):
    class Broken(MemorySink):
        name = "broken"

        def write(self, frame):
            raise ConnectionError("tracker down")

    good = MemorySink()
    pub = publish(grpo_run(steps=3), [Broken(), good])
    [said] = [r for r in caplog.records if "degraded" in r.getMessage()]  # once, not once per step
    assert said.name == "posttrain_metrics.publication" and said.levelname == "WARNING"
    assert len(good.frames) == 3 and pub.failures == {"broken": 3}


def test_absent_stays_absent_in_the_publisher():
    sink = MemorySink()
    publish(ppo_run(steps=3, warmup=2), [sink], adapters="ppo")
    assert "train/policy_loss" not in sink.frames[0].metrics
    assert "optim/policy_optimizer_step" not in sink.frames[1].metrics
    assert "train/policy_loss" in sink.frames[2].metrics


@pytest.mark.parametrize("mode", ["thread", "inline"])
def test_close_is_idempotent_and_reports_failure(tmp_path, mode):
    sink = CloseCountingSink()  # records every close it gets: a second one would show
    pub = Publisher([sink, JournalSink(tmp_path / "j.jsonl")], adapters=GRPO_ADAPTERS, mode=mode)
    pub.start({})
    pub.publish(grpo_run(steps=1)[0])
    pub.close(failed=True)
    assert sink.closes == [True] and len(sink.frames) == 1
    pub.close()  # a second close of the publisher reaches no sink
    pub.close(failed=False)
    assert sink.closes == [True]
    ends = [json.loads(line) for line in (tmp_path / "j.jsonl").read_text().splitlines()
            if json.loads(line)["kind"] == "end"]
    assert [e["status"] for e in ends] == ["failed"]  # one end record: the first close's status


def test_the_journal_sinks_own_close_is_idempotent(tmp_path):
    sink = JournalSink(tmp_path / "j.jsonl")
    publish(grpo_run(steps=1), [sink])
    sink.close(failed=True)  # again, directly: no second end record, the status stays
    kinds = [json.loads(line)["kind"] for line in (tmp_path / "j.jsonl").read_text().splitlines()]
    assert kinds.count("end") == 1 and kinds[-1] == "end"
    assert read_journal(tmp_path / "j.jsonl").end["status"] == "finished"


def test_console_headline_follows_the_catalogue():
    out = io.StringIO()
    frames = grpo_run(steps=3)
    publish(frames, [ConsoleSink(stream=out)])
    lines = out.getvalue().splitlines()
    assert lines[1].split(" ", 1)[1].startswith("train step 1 | loss_avg ")  # after the time of day
    for key in ("reward_mean", "grad_norm", "grpo_informative_group_count", "kl_mean", "kl_max"):
        assert key in lines[1]
    assert "update_outcome" not in lines[1] and "update_outcome SKIPPED" in lines[3]
    # kl keys are headline only when kl_beta > 0
    metrics = dict(frames[0].metrics, **{"train/kl_beta": 0.0})
    sink = ConsoleSink(stream=io.StringIO())
    publish([Frame(1, metrics)], [sink])
    assert "kl_max" not in sink.stream.getvalue()


def test_run_summary_uses_each_keys_semantics():
    """RunSummary against the hand-computed aggregates of _runs.HAND_RUN (arithmetic written there)."""
    summary = RunSummary(describe([get_adapter(a) for a in GRPO_ADAPTERS]))
    for frame in hand_frames():
        summary.add(frame)
    got = summary.values()
    assert set(got) == set(HAND_RUN)
    for key, want in HAND_RUN.items():
        if isinstance(want, float) and math.isfinite(want):
            assert got[key] == pytest.approx(want, rel=1e-12, abs=0.0), key
        else:
            assert got[key] == want and type(got[key]) is type(want), key
    assert got["train/loss_avg"] == 0.125  # (0.5*10 + 0.0*30) / 40, NaN and its weight left out
    assert got["train/clip_frac"] == 0.25  # (0.5*10 + 0.25*30 + 0.125*20) / 60
    assert got["train/valid_token_count"] == 60 and isinstance(got["train/valid_token_count"], int)
    assert got["train/response_len_max"] == 16 and isinstance(got["train/response_len_max"], int)
    assert got["train/reward_std"] == pytest.approx(0.4330127018922193, rel=1e-12)  # sqrt(0.75 - 0.75^2)
    assert summary.nonfinite == HAND_NONFINITE
    summary.add(Frame(4, {"train/kl_max": math.nan, "train/reward_min": -0.5}))
    got = summary.values()
    assert got["train/kl_max"] == math.inf  # a NaN does not poison it
    assert got["train/reward_min"] == -0.5  # min(0.0, 1.0, -0.5)
    assert summary.nonfinite == {**HAND_NONFINITE, "train/kl_max": 2}


@pytest.mark.parametrize(
    ("key", "secret"),
    [("api_key", True), ("wandb/WANDB_API_KEY", True), ("hf_token", True), ("db/password", True),
     ("headers/Authorization", True), ("aws/secret_access_key", True), ("rollout/max_tokens", False),
     ("model/tokenizer", False), ("rl/kl_beta", False), ("hfToken", True), ("clientSecret", True),
     ("privateKey", True), ("tokenizer/eos_token", False), ("bos_token_id", False), ("token_level_loss", False),
     ("data/key_column", False), ("sort_key", False), ("wandb_key", True)],
)
def test_secret_keys(key, secret):
    assert is_secret_key(key) is secret


def test_flatten_config_redacts_secrets_everywhere():
    config = {
        "rl": {"kl_beta": 0.04, "max_tokens": 256, "groups": [4, 8]},
        "wandb": {"api_key": "0123456789abcdef0123456789abcdef01234567"},
        "mlflow": {"uri": "https://alice:hunter2@mlflow.example.com/api"},
        "note": "hf_abcdefghijklmnopqrstuvwxyz123456",
        "nested": {"credentials": ["a", "b"]},
    }
    flat = flatten_config(config)
    assert flat["rl/kl_beta"] == 0.04 and flat["rl/max_tokens"] == 256 and flat["rl/groups/1"] == 8
    assert flat["wandb/api_key"] == REDACTED and flat["note"] == REDACTED
    assert flat["nested/credentials"] == REDACTED
    assert flat["mlflow/uri"] == f"https://alice:{REDACTED}@mlflow.example.com/api"
    assert "hunter2" not in json.dumps(flat)


def test_journal_holds_no_secret(tmp_path):
    publish(grpo_run(steps=1), [JournalSink(tmp_path / "j.jsonl")], config={"db": {"password": "hunter2-PLANTED"}})
    assert "hunter2-PLANTED" not in (tmp_path / "j.jsonl").read_text()


def test_a_hung_sink_never_holds_the_step_and_loses_nothing(tmp_path):
    import threading

    gate, entered = threading.Event(), threading.Event()
    released: list[bool] = []  # per write: whether the gate opened (False: it gave up after 60 s)

    class Slow(MemorySink):
        name = "slow"

        def write(self, frame):
            entered.set()
            released.append(gate.wait(60))  # a tracker that hangs until released
            super().write(frame)

    slow = Slow()
    pub = Publisher([JournalSink(tmp_path / "j.jsonl"), slow], adapters=GRPO_ADAPTERS, mode="thread")
    pub.start({})
    frames = grpo_run(steps=8)
    pub.publish(frames[0])
    assert entered.wait(60)  # the sink now hangs inside its first write
    for frame in frames[1:]:
        pub.publish(frame)
    # ordering, not a stopwatch: all 8 steps returned while the sink still hung in its first write
    assert released == [] and slow.frames == []
    assert len(read_journal(tmp_path / "j.jsonl").frames) == 8  # the journal has every frame
    gate.set()
    pub.close()
    # the journal is the queue: the sink gets every frame, in order, once
    assert [f.step for f in slow.frames] == list(range(1, 9))
    assert released[0] is True  # the first write was released by the test, not a timeout
    assert slow.closed is False


def test_close_waits_for_background_sinks_to_drain(tmp_path):
    import time

    class Sluggish(MemorySink):
        name = "sluggish"

        def write(self, frame):
            time.sleep(0.02)
            super().write(frame)

    sink = Sluggish()
    publish(grpo_run(steps=10), [sink])
    assert [f.step for f in sink.frames] == list(range(1, 11)) and sink.closed is False


@pytest.mark.parametrize("mode", ["inline", "thread"])
def test_a_sink_whose_start_fails_is_skipped_and_the_journal_keeps_everything(tmp_path, mode, caplog):
    class Unreachable(MemorySink):
        name = "unreachable"

        def start(self, run):
            raise ConnectionError("tracker unreachable at start")

    sink = Unreachable()
    pub = Publisher([sink, JournalSink(tmp_path / "j.jsonl")], adapters=GRPO_ADAPTERS, mode=mode)
    pub.start({})
    for frame in grpo_run(steps=4):
        pub.publish(frame)
    pub.close()
    assert any("failed in start" in m for m in caplog.messages), caplog.messages
    assert pub.unstarted == {"unreachable"} and pub.failures == {"unreachable": 1}  # one failure, not one per step
    assert sink.frames == [] and len(read_journal(tmp_path / "j.jsonl").frames) == 4


@pytest.mark.parametrize(
    ("text", "leak"),
    [("HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz123 python train.py", "hf_abcdefghijklmnopqrstuvwxyz123"),
     ("train.py --hf-token s3cr3t-value", "s3cr3t-value"),
     ("https://host/api?token=abc123secret&x=1", "abc123secret"),
     ("postgresql://user:p/ss@host/db", "p/ss"),
     ("postgresql://user:p@ss@host/db", "p@ss"),
     ("Authorization: Bearer abcdefghijklmnop", "abcdefghijklmnop")],
)
def test_secrets_embedded_in_strings_are_redacted(text, leak):
    from posttrain_metrics.core.redact import redact_text

    assert leak not in redact_text(text)
    assert REDACTED in redact_text(text)


def test_structured_and_non_finite_configs_reach_the_journal(tmp_path):
    import argparse
    import dataclasses

    @dataclasses.dataclass
    class Optim:
        max_grad_norm: float = math.inf  # a common way to turn clipping off
        wandb_api_key: str = "abcdef0123456789-PLANTED"

    config = {"optim": Optim(), "args": argparse.Namespace(hf_token="ns-PLANTED", steps=3), "pad_token_id": 0}
    publish(grpo_run(steps=1), [JournalSink(tmp_path / "j.jsonl")], config=config)
    journal = read_journal(tmp_path / "j.jsonl")
    assert journal.config["optim/max_grad_norm"] == "inf" and journal.config["args/steps"] == 3
    assert journal.config["pad_token_id"] == 0
    assert "PLANTED" not in (tmp_path / "j.jsonl").read_text()


def test_a_resumed_journal_survives_a_line_torn_by_the_crash(tmp_path):
    path = tmp_path / "j.jsonl"
    first = Publisher([JournalSink(path)], adapters=GRPO_ADAPTERS, run_id="runA", mode="inline")
    first.start({})
    for frame in grpo_run(steps=2):
        first.publish(frame)
    with open(path, "a") as f:
        f.write('{"kind":"frame","run_id":"runA","st')  # killed mid-line, no end record
    first.sinks[0].lock.release()  # the crashed process's exit releases its run lock (the kernel does)
    second = Publisher([JournalSink(path)], adapters=GRPO_ADAPTERS, run_id="runA", mode="inline")
    with pytest.warns(UserWarning, match="torn by a crash"):
        publish_more = second.start({})
        assert publish_more.run_id == "runA"
        for frame in grpo_run(steps=4)[2:]:
            second.publish(frame)
        second.close()
        journal = read_journal(path)
    assert [f.step for f in journal.frames] == [1, 2, 3, 4]
    assert journal.end is not None and journal.end["status"] == "finished"


def test_another_run_never_appends_to_a_journal(tmp_path, caplog):
    path = tmp_path / "journal.jsonl"
    publish(grpo_run(steps=2), [JournalSink(path)])
    pub = Publisher([JournalSink(path)], adapters=GRPO_ADAPTERS, run_id="second", mode="inline")
    pub.start({})
    pub.publish(grpo_run(steps=1)[0])
    pub.close()
    [said] = [r for r in caplog.records if "moved it to journal" in r.getMessage()]  # what it did, once
    assert said.name == "posttrain_metrics.journal", said.name
    assert read_journal(path).run_id == "second" and len(read_journal(path).frames) == 1
    (aside,) = [p for p in tmp_path.iterdir() if p.name not in ("journal.jsonl", "journal.jsonl.lock")]  # lock: the path's
    assert len(read_journal(aside).frames) == 2


def test_an_end_record_followed_by_more_frames_is_not_the_status(tmp_path):
    path = tmp_path / "j.jsonl"
    for _ in range(2):  # the same run, resumed once: its second session has not ended
        pub = Publisher([JournalSink(path)], adapters=GRPO_ADAPTERS, run_id="same", mode="inline")
        pub.start({})
        pub.publish(grpo_run(steps=1)[0])
        if _ == 0:
            pub.close()
    assert read_journal(path).end is None


def test_two_sinks_with_one_name_are_refused():
    with pytest.raises(MetricsError, match="two sinks are named"):
        Publisher([MemorySink(), MemorySink()], adapters=GRPO_ADAPTERS)


def test_an_import_error_while_writing_degrades_the_sink_and_keeps_its_thread(tmp_path, caplog):
    class LazyVendor(MemorySink):
        name = "lazy"
        calls = 0

        def write(self, frame):
            LazyVendor.calls += 1
            if LazyVendor.calls == 1:
                raise ImportError("the vendor imported something lazily and failed")
            super().write(frame)

    sink = LazyVendor()
    pub = publish(grpo_run(steps=3), [sink])
    assert any("failed in write" in m for m in caplog.messages), caplog.messages
    assert [f.step for f in sink.frames] == [2, 3] and sink.closed is False and pub.failures == {"lazy": 1}


def test_start_is_idempotent_and_publishing_after_close_is_counted():
    sink = MemorySink()
    pub = Publisher([sink], adapters=GRPO_ADAPTERS, mode="inline")
    run = pub.start({"a": 1})
    with pytest.warns(UserWarning, match="called again"):
        assert pub.start({"b": 2}) is run
    pub.close()
    with pytest.warns(UserWarning, match="after close"):
        pub.publish(grpo_run(steps=1)[0])
    assert pub.after_close == 1 and sink.frames == []


CRASH = """
import sys
sys.path.insert(0, sys.argv[2])
from _runs import GRPO_ADAPTERS, grpo_run
from posttrain_metrics.journal import JournalSink
from posttrain_metrics.publication import Publisher
pub = Publisher([JournalSink(sys.argv[1])], adapters=GRPO_ADAPTERS)
pub.start({})
pub.publish(grpo_run(steps=1)[0])
raise RuntimeError("training crashed; nobody called close()")
"""


def test_interpreter_exit_after_a_crash_records_a_failed_run(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    result = subprocess.run([sys.executable, "-c", CRASH, str(tmp_path / "j.jsonl"), str(Path(__file__).parent)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "training crashed" in result.stderr
    assert read_journal(tmp_path / "j.jsonl").end["status"] == "failed"


def test_before_the_process_group_exists_the_launchers_rank_decides(monkeypatch):
    from posttrain_metrics.core.distributed import global_rank

    monkeypatch.setenv("RANK", "1")
    assert global_rank() == 1 and not Publisher.publishes_here()
    monkeypatch.setenv("RANK", "0")
    assert Publisher.publishes_here()


def test_the_journal_reads_the_same_with_either_encoder(tmp_path, monkeypatch):
    """Frame lines go through orjson when it is installed (the training thread's main cost), else
    json: the same strict JSON, read back to the same frames."""
    import posttrain_metrics.journal.format as journal_module

    frames = [*grpo_run(steps=3), nonfinite_frame(4)]
    publish(frames, [JournalSink(tmp_path / "fast.jsonl")])
    monkeypatch.setattr(journal_module, "_orjson", None)
    publish(frames, [JournalSink(tmp_path / "plain.jsonl")])
    fast, plain = read_journal(tmp_path / "fast.jsonl"), read_journal(tmp_path / "plain.jsonl")
    assert len(fast.frames) == len(plain.frames) == len(frames)
    for a, b, want in zip(fast.frames, plain.frames, frames):
        assert a.step == b.step == want.step
        for key, value in want.metrics.items():
            for got in (a.metrics[key], b.metrics[key]):
                assert type(got) is type(value) and (got == value or (math.isnan(got) and math.isnan(value))), key
    for line in (tmp_path / "fast.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))


def test_display_frames_are_built_in_order_whatever_the_plan_cache_holds() -> None:
    """Label indicators right after their key, bools as 0/1, unknown strings kept, plain numbers as
    they are, in order; frames of one shape reuse a plan, and another keys mapping gets its own."""
    from posttrain_metrics.core.adapter import Metric, MetricAdapter
    from posttrain_metrics.core.reduction import Reduction as R
    from posttrain_metrics.publication.publisher import display_frame

    def adapter(labels: tuple[str, ...]) -> MetricAdapter:
        return MetricAdapter("shape", internal_prefix="shape_", metrics=[
            Metric("loss", R.MEAN, "A number"),
            Metric("outcome", R.CATEGORICAL, "A label", labels=labels, namespace="optim"),
            Metric("flag", R.LAST, "A flag", namespace="optim"),
        ])

    keys_ab, keys_abc = describe([adapter(("a", "b"))]), describe([adapter(("a", "b", "c"))])
    first = Frame(1, {"train/loss": 0.5, "optim/outcome": "b", "optim/flag": True, "other/note": "x", "n": 3})
    second = Frame(2, {"train/loss": 0.25, "optim/outcome": "a", "optim/flag": False, "other/note": "y", "n": 4})
    assert list(display_frame(first, keys_ab).metrics.items()) == [
        ("train/loss", 0.5), ("optim/outcome", "b"), ("optim/outcome/a", 0), ("optim/outcome/b", 1),
        ("optim/flag", 1), ("other/note", "x"), ("n", 3)]
    shown = display_frame(second, keys_ab)  # the same shape: the cached plan
    assert list(shown.metrics.items()) == [
        ("train/loss", 0.25), ("optim/outcome", "a"), ("optim/outcome/a", 1), ("optim/outcome/b", 0),
        ("optim/flag", 0), ("other/note", "y"), ("n", 4)]
    assert type(shown.metrics["optim/flag"]) is int and (shown.step, shown.phase) == (2, "train")
    assert list(display_frame(second, keys_abc).metrics)[2:5] == ["optim/outcome/a", "optim/outcome/b",
                                                                   "optim/outcome/c"]
    as_float = Frame(3, {"train/loss": 1, "optim/outcome": "a", "optim/flag": 1.0, "other/note": "z", "n": 5.0})
    assert list(display_frame(as_float, keys_ab).metrics.items()) == [  # other types: another plan
        ("train/loss", 1), ("optim/outcome", "a"), ("optim/outcome/a", 1), ("optim/outcome/b", 0),
        ("optim/flag", 1.0), ("other/note", "z"), ("n", 5.0)]
    plain = Frame(4, {"train/loss": 0.125, "n": 1})
    out = display_frame(plain, keys_ab)
    assert out.metrics == {"train/loss": 0.125, "n": 1} and out.metrics is not plain.metrics


def test_the_tail_reads_a_line_longer_than_its_read_size_and_reads_in_order(tmp_path):
    """The publisher's reader takes about max_bytes of the journal per read: a line longer than that
    (a header with a large config) is still read whole, and a torn last line waits for its end."""
    from posttrain_metrics.journal import JournalTail

    path = tmp_path / "j.jsonl"
    config = {f"key_{i}": "x" * 50 for i in range(40)}  # a header line of about 2.5 KB
    frames = grpo_run(steps=5)
    publish(frames, [JournalSink(path)], config=config)
    text = path.read_bytes()
    assert len(text.splitlines()[0]) > 2000
    tail = JournalTail(path)
    records = []
    for _ in range(50):
        got = tail.read(limit=2, max_bytes=256)
        if not got:
            break
        records += got
    assert [r.kind for r in records] == ["header", *["frame"] * 5, "end"]
    assert records[0].header["config"] == config
    assert [r.frame.step for r in records if r.frame is not None] == [f.step for f in frames]
    # a torn last line is not read until it ends
    torn = tmp_path / "torn.jsonl"
    torn.write_bytes(text.splitlines(keepends=True)[0] + text.splitlines(keepends=True)[1][:100])
    tail = JournalTail(torn)
    assert [r.kind for r in tail.read(max_bytes=64)] == ["header"] and tail.read(max_bytes=64) == []
    with open(torn, "ab") as f:
        f.write(text.splitlines(keepends=True)[1][100:])
    [frame] = tail.read(max_bytes=64)
    assert frame.frame is not None and frame.frame.step == frames[0].step


def test_the_tail_reads_a_full_batch_of_frames_larger_than_two_kilobytes(tmp_path):
    """The follower takes a full batch (512 lines) as a backlog to read on at once (and, when starved,
    as the signal to raise its priority): frames of 70 keys (~2.8 KB a line) must still come 512 to a
    read, not what fits in the tail's read size."""
    import json as json_module

    from posttrain_metrics.journal import JournalTail

    path = tmp_path / "j.jsonl"
    header = {"format": "posttrain-metrics-journal", "version": 1, "kind": "header", "run_id": "big01",
              "name": "big", "created": 1.7e9, "adapters": ["grpo"], "config": {}}
    metrics = {f"train/custom_metric_{i:03d}": 0.123456789 + i for i in range(70)}
    with open(path, "w") as f:
        f.write(json_module.dumps(header) + "\n")
        for step in range(1, 1201):
            f.write(json_module.dumps({"kind": "frame", "run_id": "big01", "step": step, "phase": "train",
                                       "time": 1.7e9, "metrics": metrics}) + "\n")
    assert path.stat().st_size / 1201 > 2048
    tail = JournalTail(path)
    sizes = [len(tail.read(512)) for _ in range(4)]
    assert sizes == [512, 512, 177, 0]  # 1 header + 1,200 frames
    assert tail.offset == path.stat().st_size



def test_reading_a_journal_while_the_run_writes_it_reads_what_was_there(tmp_path, monkeypatch):
    """doctor and plot read a live run's journal: a line being written when the reader reaches it is
    a torn last line (skipped with a warning), and what the run appends meanwhile is not read as a
    damaged line: the reader takes the file as it was when it opened it."""
    import warnings as warnings_module

    path = tmp_path / "j.jsonl"
    frames = grpo_run(steps=3)
    publish(frames, [JournalSink(path)])
    lines = path.read_bytes().splitlines(keepends=True)
    head, third = b"".join(lines[:3]), lines[3]  # the header, two frames; the third frame being written
    path.write_bytes(head + third[:40])

    def the_run_writes_on(message, *args, **kwargs):  # called when the reader warns of the torn line
        with open(path, "ab") as f:
            f.write(third[40:] + b"".join(lines[4:]))

    monkeypatch.setattr(warnings_module, "showwarning", the_run_writes_on)
    with warnings_module.catch_warnings():
        warnings_module.simplefilter("always")
        monkeypatch.setattr(warnings_module, "showwarning", the_run_writes_on)
        journal = read_journal(path)
    assert [f.step for f in journal.frames] == [frames[0].step, frames[1].step]
    assert any("torn last line" in note for note in journal.warnings)
    assert read_journal(path).frames[-1].step == frames[2].step  # read again: the whole run
