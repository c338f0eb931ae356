"""The TensorBoard sink, published through the real publisher and read back with TensorBoard's own
``EventAccumulator`` (size guidance 0: keep every event)."""

from __future__ import annotations

import builtins
import math
import re
import struct
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest
from _runs import (
    GRPO_ADAPTERS,
    HAND_INDICATORS,
    HAND_RUN,
    dpo_run,
    grpo_run,
    hand_frames,
    nonfinite_frame,
    ppo_run,
    tracked,
)

from posttrain_metrics import Frame, Metric, MetricAdapter, MetricsError, Reduction, get_adapter
from posttrain_metrics.core.catalog.ppo import POLICY_WINDOW_LEAVES
from posttrain_metrics.core.keys import describe
from posttrain_metrics.core.redact import REDACTED
from posttrain_metrics.integrations import Sink
from posttrain_metrics.integrations.tensorboard import (
    AGGREGATE_PREFIX,
    CONFIG_TAG,
    HPARAMS_DIR,
    INSTALL,
    TensorBoardSink,
    dashboard_layout,
    samples_markdown,
)
from posttrain_metrics.journal import JournalSink, read_journal
from posttrain_metrics.publication import Publisher

try:
    from tensorboard.backend.event_processing import event_accumulator as ea
    from tensorboard.plugins.custom_scalar import layout_pb2
    from tensorboard.plugins.custom_scalar import metadata as layout_metadata
    from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2
    from tensorboard.plugins.hparams import metadata as hparams_metadata

    MISSING = ""
except ImportError as exc:  # fail every test with the reason; never skip
    MISSING = f"tensorboard is not installed ({exc}); fix: {INSTALL}"


@pytest.fixture(autouse=True)
def _needs_tensorboard() -> None:
    if MISSING:
        pytest.fail(MISSING)


def publish(tmp_path: Path, frames: list[Frame], adapters=GRPO_ADAPTERS, *, config=None, failed=False,
            close=True, **options) -> tuple[Publisher, TensorBoardSink]:
    sink = TensorBoardSink(log_dir=tmp_path / "tb", **options)
    # mode="inline": these tests check the sink's own flushing, not the publisher's threads
    pub = Publisher([JournalSink(tmp_path / "journal.jsonl"), sink], adapters=adapters, run_name="t",
                    mode="inline")
    pub.start(config or {"rl": {"kl_beta": 0.04, "lr": 1e-3}, "seed": 3})
    for frame in frames:
        pub.publish(frame)
    if close:
        pub.close(failed=failed)
    assert pub.failures == {}, "the publisher swallowed a sink failure"
    return pub, sink


def load(path: Path) -> ea.EventAccumulator:
    acc = ea.EventAccumulator(str(path), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    acc.Reload()
    return acc


def f32(value: float) -> float:
    """What a float32 scalar holds for ``value``."""
    return struct.unpack("<f", struct.pack("<f", value))[0] if math.isfinite(value) else value


def same(got: float, want: float) -> bool:
    return (math.isnan(got) and math.isnan(want)) or got == f32(float(want))


def assert_scalars_match(acc: ea.EventAccumulator, frames: list[Frame]) -> None:
    """Every numeric key of every frame, as a tracker shows it (_runs.tracked, an oracle independent
    of the publisher: label indicators added, bools as 0/1), is a point at its step; nothing else is."""
    expected: dict[str, list[tuple[int, float, float]]] = {}
    for frame in frames:
        for key, value in tracked(frame).items():
            if not isinstance(value, str):
                expected.setdefault(key, []).append((frame.step, float(value), frame.wall_time))
    assert set(acc.Tags()["scalars"]) == set(expected)
    for key, points in expected.items():
        events = acc.Scalars(key)
        assert [e.step for e in events] == [s for s, _, _ in points], key
        for event, (step, value, wall) in zip(events, points):
            assert same(event.value, value), (key, step, event.value, value)
            assert event.wall_time == wall


# -- scalars, labels, absent keys, non-finite values ------------------------------------------------


def test_grpo_run_every_scalar_per_step_equals_the_frame(tmp_path):
    frames = grpo_run(steps=6)
    _, sink = publish(tmp_path, frames)
    assert isinstance(sink, Sink)
    assert sink.path == tmp_path / "tb"
    assert len(list(sink.path.glob("events.out.tfevents.*"))) == 1
    acc = load(sink.path)
    assert_scalars_match(acc, frames)
    # one event per step holds the step's scalars (plus the config and layout event at step 0)
    assert "optim/update_outcome/skipped" in acc.Tags()["scalars"]
    assert [e.value for e in acc.Scalars("optim/update_outcome/skipped")] == [0, 0, 1, 0, 0, 0]
    # the catalogue's meaning travels as the tag's description
    assert "epsilon clip" in acc.SummaryMetadata("train/clip_frac").summary_description
    assert "train/valid_token_count" in acc.SummaryMetadata("train/clip_frac").summary_description


def test_one_event_per_step_holds_every_value_of_the_step(tmp_path):
    frames = grpo_run(steps=3)
    _, sink = publish(tmp_path, frames)
    from tensorboard.backend.event_processing import event_file_loader

    [path] = sink.path.glob("events.out.tfevents.*")
    events = [e for e in event_file_loader.EventFileLoader(str(path)).Load() if e.HasField("summary")]
    assert [e.step for e in events] == [0, 1, 2, 3]  # config + layout at 0, then one per step
    for event, frame in zip(events[1:], frames):
        tags = {v.tag for v in event.summary.value}
        assert set(frame.metrics) <= tags


def test_labels_are_text_and_their_indicators_are_scalars(tmp_path):
    frames = grpo_run(steps=4)
    _, sink = publish(tmp_path, frames)
    acc = load(sink.path)
    assert "optim/update_outcome" in acc.PluginTagToContent("text")
    assert "optim/update_outcome" not in acc.Tags()["scalars"]
    texts = acc.Tensors("optim/update_outcome")
    assert [t.step for t in texts] == [1, 2, 3, 4]
    assert [t.tensor_proto.string_val[0].decode() for t in texts] == ["applied", "applied", "skipped", "applied"]
    # steps 1-4: applied, applied, skipped (grpo_run's step 3), applied
    assert [e.value for e in acc.Scalars("optim/update_outcome/applied")] == [1.0, 1.0, 0.0, 1.0]
    assert [e.value for e in acc.Scalars("optim/update_outcome/skipped")] == [0.0, 0.0, 1.0, 0.0]
    assert [e.value for e in acc.Scalars("optim/update_outcome/accumulating")] == [0.0, 0.0, 0.0, 0.0]
    assert [e.value for e in acc.Scalars("optim/update_outcome/discarded")] == [0.0, 0.0, 0.0, 0.0]


def test_indicators_of_a_hand_written_run(tmp_path):
    _, sink = publish(tmp_path, hand_frames())
    acc = load(sink.path)
    texts = acc.Tensors("optim/update_outcome")
    assert [t.tensor_proto.string_val[0].decode() for t in texts] == ["applied", "skipped", "applied"]
    for key, want in HAND_INDICATORS.items():
        assert [(e.step, e.value) for e in acc.Scalars(key)] == [(1, want[0]), (2, want[1]), (3, want[2])], key
    assert [e.value for e in acc.Scalars("train/kl_max")] == [0.25, 0.75, math.inf]
    assert [e.step for e in acc.Scalars("train/reward_mean")] == [1, 2]  # absent at step 3, not 0


def test_ppo_critic_warmup_steps_have_no_policy_keys(tmp_path):
    frames = ppo_run(steps=4, warmup=2)
    _, sink = publish(tmp_path, frames, "ppo")
    acc = load(sink.path)
    assert_scalars_match(acc, frames)
    policy_tags = [t for t in acc.Tags()["scalars"] if t.split("/", 1)[1] in POLICY_WINDOW_LEAVES]
    assert "train/policy_loss" in policy_tags and "optim/policy_optimizer_step" in policy_tags
    for tag in policy_tags:
        assert [e.step for e in acc.Scalars(tag)] == [3, 4], tag  # absent at 1 and 2, not zero
    assert [e.step for e in acc.Scalars("train/value_loss")] == [1, 2, 3, 4]


def test_dpo_train_and_val_keys_both_present(tmp_path):
    frames = dpo_run(steps=3)
    _, sink = publish(tmp_path, frames, "dpo")
    acc = load(sink.path)
    assert_scalars_match(acc, frames)
    tags = acc.Tags()["scalars"]
    for leaf in ("loss_avg", "dpo_accuracy", "dpo_reward_margin"):
        assert f"train/{leaf}" in tags and f"val/{leaf}" in tags
        assert [e.step for e in acc.Scalars(f"val/{leaf}")] == [1, 2, 3]


def test_nan_and_inf_are_stored_as_nan_and_inf(tmp_path):
    frames = [*grpo_run(steps=2), nonfinite_frame(3)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the sink stores them: the publisher must not skip or warn
        _, sink = publish(tmp_path, frames)
    acc = load(sink.path)
    assert_scalars_match(acc, frames)
    last = {k: acc.Scalars(k)[-1] for k in ("train/loss_avg", "train/kl_max", "train/kl_mean")}
    assert all(e.step == 3 for e in last.values())
    assert math.isnan(last["train/loss_avg"].value)
    assert last["train/kl_max"].value == math.inf
    assert last["train/kl_mean"].value == -math.inf
    assert not [t for t in acc.Tags()["scalars"] if t.startswith("health/")]
    journal = read_journal(tmp_path / "journal.jsonl")  # and the journal holds them exactly
    assert math.isnan(journal.frames[-1].metrics["train/loss_avg"])
    assert journal.frames[-1].metrics["train/kl_mean"] == -math.inf


def test_a_finite_value_beyond_float32_is_logged_once(tmp_path, caplog):
    frames = [Frame(s, dict(grpo_run(steps=1)[0].metrics, **{"train/kl_max": 1e39})) for s in (1, 2)]
    _, sink = publish(tmp_path, frames)
    # the run's value, not a misuse: a record of the sink's logger
    said = [(r.name, r.getMessage()) for r in caplog.records if "float32" in r.getMessage()]
    assert len(said) == 1 and said[0][0] == "posttrain_metrics.integrations.tensorboard", said
    assert "train/kl_max = 1e+39 is beyond float32" in said[0][1], said
    assert [e.value for e in load(sink.path).Scalars("train/kl_max")] == [math.inf, math.inf]


# -- flushing: a killed run leaves readable files ---------------------------------------------------


KILLED = """
import os, sys
sys.path.insert(0, sys.argv[2])
from _runs import GRPO_ADAPTERS, grpo_run
from posttrain_metrics.publication import Publisher
from posttrain_metrics.integrations.tensorboard import TensorBoardSink

# mode="inline": the sink's flush at each step boundary is under test, not the publisher's queue
pub = Publisher([TensorBoardSink(log_dir=sys.argv[1])], adapters=GRPO_ADAPTERS, mode="inline")
pub.start()
for frame in grpo_run(steps=4):
    pub.publish(frame)
os._exit(0)  # killed: no close(), no atexit, the writer thread dies with whatever it still queues
"""


def test_a_killed_run_is_readable_up_to_its_last_step(tmp_path):
    # Without the flush at each step boundary this loses every step (the events wait in the
    # writer's queue): the case of pytorch issue 24234.
    subprocess.run([sys.executable, "-c", KILLED, str(tmp_path / "tb"), str(Path(__file__).parent)],
                   check=True, timeout=120)
    acc = load(tmp_path / "tb")
    assert [e.step for e in acc.Scalars("train/loss_avg")] == [1, 2, 3, 4]
    assert [e.step for e in acc.Tensors("optim/update_outcome")] == [1, 2, 3, 4]
    assert CONFIG_TAG in acc.Tags()["tensors"] and layout_metadata.CONFIG_SUMMARY_TAG in acc.Tags()["tensors"]
    assert not (tmp_path / "tb" / HPARAMS_DIR).exists()  # written at close only


def test_flush_every_n_steps(tmp_path):
    frames = dpo_run(steps=3)  # train and val frames share each step
    pub, sink = publish(tmp_path, frames, "dpo", close=False, flush=2)
    # frames of steps 1 and 2 span two steps: flushed at step 2's first frame
    steps = [e.step for e in load(sink.path).Scalars("train/loss_avg")]
    assert steps[:2] == [1, 2]
    pub.close()
    assert [e.step for e in load(sink.path).Scalars("val/loss_avg")] == [1, 2, 3]


def test_configuration_is_checked_and_the_constructor_does_no_io(tmp_path):
    for bad in ("epoch", 0, -1, True, 1.5):
        with pytest.raises(MetricsError, match="flush="):
            TensorBoardSink(log_dir=tmp_path / "x", flush=bad)  # type: ignore[arg-type]
    sink = TensorBoardSink(log_dir=tmp_path / "x")
    assert not (tmp_path / "x").exists()
    with pytest.raises(MetricsError, match="start"):
        sink.write(Frame(1, {"train/loss_avg": 1.0}))
    sink.close()  # closing a sink never started is a no-op


def test_close_is_idempotent_and_log_dir_takes_the_run_name(tmp_path):
    sink = TensorBoardSink(log_dir=tmp_path / "{name}-{run_id}")
    pub = Publisher([sink], adapters=GRPO_ADAPTERS, run_name="exp", run_id="abc", mode="inline")
    pub.start()
    pub.publish(grpo_run(steps=1)[0])
    sink.close()
    sink.close()
    pub.close()
    assert pub.failures == {}
    assert sink.path == tmp_path / "exp-abc"
    assert len(list((sink.path / HPARAMS_DIR).glob("events.out.tfevents.*"))) == 1  # written once
    # and within it, one session end: a close that ran again would write a second one
    from tensorboard.backend.event_processing import event_file_loader

    ends = [v for path in (sink.path / HPARAMS_DIR).glob("events.out.tfevents.*")
            for e in event_file_loader.EventFileLoader(str(path)).Load() if e.HasField("summary")
            for v in e.summary.value if v.tag == hparams_metadata.SESSION_END_INFO_TAG]
    assert len(ends) == 1


def test_constructing_the_sink_imports_no_tensorboard():
    code = (
        "import sys; from posttrain_metrics.integrations.tensorboard import TensorBoardSink; "
        "TensorBoardSink(log_dir='unused'); "
        "print(sorted(m for m in sys.modules if m == 'tensorboard' or m.startswith('tensorboard.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_missing_tensorboard_names_the_install_line(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_tensorboard(name, *args, **kwargs):
        if name == "tensorboard" or name.startswith("tensorboard."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    pub = Publisher([], adapters=GRPO_ADAPTERS)
    with pytest.raises(ImportError) as info:
        TensorBoardSink(log_dir=tmp_path / "tb").start(pub.start())
    pub.close()
    assert "pip install 'posttrain-metrics[tensorboard]'" in str(info.value).splitlines()
    assert not (tmp_path / "tb").exists()


# -- custom-scalars layout ------------------------------------------------------------------------


def read_layout(acc: ea.EventAccumulator) -> layout_pb2.Layout:
    assert "custom_scalars__config__" in acc.PluginTagToContent(layout_metadata.PLUGIN_NAME)
    point = acc.Tensors(layout_metadata.CONFIG_SUMMARY_TAG)[-1]  # TensorBoard shows the latest
    layout = layout_pb2.Layout()
    layout.ParseFromString(point.tensor_proto.string_val[0])
    return layout


def charted(category: layout_pb2.Category, tag: str) -> bool:
    for chart in category.chart:
        if chart.HasField("multiline") and any(re.match(rx, tag) for rx in chart.multiline.tag):
            return True
        if chart.HasField("margin") and any(
            tag in (s.value, s.lower, s.upper) for s in chart.margin.series
        ):
            return True
    return False


def test_layout_groups_headline_keys_and_families_and_charts_every_key(tmp_path):
    frames = grpo_run(steps=3)
    _, sink = publish(tmp_path, frames)
    acc = load(sink.path)
    layout = read_layout(acc)
    categories = {c.title: c for c in layout.category}
    assert layout.category[0].title == "GRPO headline" and not categories["GRPO headline"].closed
    headline = categories["GRPO headline"]
    for key in ("train/loss_avg", "train/reward_mean", "train/grad_norm", "train/grpo_informative_group_count",
                "train/kl_mean", "train/kl_max", "optim/update_outcome/skipped"):
        assert charted(headline, key), key
    assert not charted(headline, "train/clip_frac")
    # each outcome label its own chart, titled with it: one multiline chart drew them all in one colour
    outcome = [c for c in headline.chart if "update_outcome" in c.title]
    assert [c.title for c in outcome] == [f"optim/update_outcome = {label} (1 at its steps)"
                                          for label in ("accumulating", "applied", "skipped", "discarded")]
    assert [list(c.multiline.tag) for c in outcome] == [[f"^(?:optim/update_outcome/{label})$"]
                                                        for label in ("accumulating", "applied", "skipped", "discarded")]
    expected = {
        "GRPO logprob gap": ["train/logprob_gap_mean", "train/logprob_gap_token_count"],
        "GRPO KL": ["train/kl_mean", "train/kl_max", "train/kl_beta"],
        "GRPO response length": ["train/response_len_mean", "train/response_len_max",
                                 "train/rollout_truncated_frac"],
        "reward & groups": ["train/reward_mean", "train/reward_max", "train/grpo_tied_group_count"],
        "optimizer outcome": ["optim/update_outcome/applied", "optim/optimizer_step"],
        "timing": ["timer/e2e_step_s"],
    }
    for title, keys in expected.items():
        assert title in categories, (title, list(categories))
        assert categories[title].closed
        for key in keys:
            assert charted(categories[title], key), (title, key)
    assert "GRPO score centering" not in categories  # grpo_run publishes no score-centering key
    topical = [c for c in layout.category if c.title != "GRPO headline"]
    for tag in acc.Tags()["scalars"]:  # every published scalar sits in exactly one topic
        assert sum(charted(c, tag) for c in topical) == 1, tag


def test_layout_of_ppo_dpo_and_a_users_own_adapter():
    def titles(adapters):
        return {c.title: c for c in dashboard_layout(describe([get_adapter(a) if isinstance(a, str) else a
                                                                for a in adapters]),
                                                     [a if isinstance(a, str) else a.name for a in adapters])}

    ppo = titles(["ppo"])
    assert list(ppo)[:3] == ["PPO headline", "PPO policy", "PPO critic"]

    def keys_of(category):
        return {rx for chart in category.charts for rx in chart.tags}

    assert any("train/clip_fraction" in rx for rx in keys_of(ppo["PPO policy"]))
    assert any("train/value_loss" in rx for rx in keys_of(ppo["PPO critic"]))
    assert not any("policy_reference" in rx for rx in keys_of(ppo["PPO policy"]))  # another population
    assert any(c.bands for c in ppo["PPO"].charts)  # <x>_mean/_min/_max as a band
    dpo = titles(["dpo"])
    [loss] = [c for c in dpo["DPO headline"].charts if "loss_avg" in c.title]
    assert re.match(loss.tags[0], "train/loss_avg") and re.match(loss.tags[0], "val/loss_avg")

    mine = MetricAdapter("my_algo", internal_prefix="my_", metrics=[
        Metric("loss", Reduction.MEAN, "My loss", headline=True),
        Metric("tokens", Reduction.SUM, "Tokens"),
        Metric("ent_mean", Reduction.WEIGHTED_MEAN, "Entropy", weight="tokens"),
        Metric("ent_max", Reduction.MAX, "Max entropy"),
        Metric("ent_min", Reduction.MIN, "Min entropy"),
        Metric("ent_coef", Reduction.LAST, "Entropy coefficient"),
        Metric("ent_target", Reduction.LAST, "Entropy target"),
    ])
    own = titles([mine])
    assert list(own) == ["my_algo headline", "my_algo", "my_algo ent"]
    assert [c.title for c in own["my_algo ent"].charts] == [
        "train/ent (mean, min to max)", "train/ent_coef", "train/ent_target"]


# -- hparams with the run aggregates -----------------------------------------------------------------


def hparams_session(path: Path) -> tuple[ea.EventAccumulator, plugin_data_pb2.SessionStartInfo,
                                         plugin_data_pb2.SessionEndInfo]:
    acc = load(path / HPARAMS_DIR)
    content = acc.PluginTagToContent(hparams_metadata.PLUGIN_NAME)
    start = hparams_metadata.parse_session_start_info_plugin_data(content[hparams_metadata.SESSION_START_INFO_TAG])
    end = hparams_metadata.parse_session_end_info_plugin_data(content[hparams_metadata.SESSION_END_INFO_TAG])
    return acc, start, end


def test_hparams_hold_the_config_and_the_run_aggregates(tmp_path):
    config = {"rl": {"kl_beta": 0.04, "clip": True}, "model": "tiny", "wandb": {"api_key": "PLANTED-secret"}}
    _, sink = publish(tmp_path, hand_frames(), config=config)
    acc, start, end = hparams_session(sink.path)
    assert start.hparams["rl/kl_beta"].number_value == 0.04
    assert start.hparams["rl/clip"].bool_value is True
    assert start.hparams["model"].string_value == "tiny"
    assert start.hparams["wandb/api_key"].string_value == REDACTED
    assert start.hparams["adapters"].string_value == "grpo,reward,trainer"
    assert end.status == api_pb2.STATUS_SUCCESS
    # every aggregate is the hand-computed figure of _runs.HAND_RUN (the arithmetic is written there)
    assert set(acc.Tags()["scalars"]) == {AGGREGATE_PREFIX + k for k in HAND_RUN}
    for key, want in HAND_RUN.items():
        [point] = acc.Scalars(AGGREGATE_PREFIX + key)
        assert point.step == 3 and same(point.value, float(want)), (key, point.value, want)
    agg = {k: acc.Scalars(AGGREGATE_PREFIX + k)[0].value for k in HAND_RUN}
    assert agg["train/loss_avg"] == 0.125  # (0.5*10 + 0.0*30) / 40: the NaN of step 3 and its weight left out
    assert agg["train/valid_token_count"] == 60  # 10 + 30 + 20: a run total, not the last value 20
    assert agg["train/clip_frac"] == 0.25  # (0.5*10 + 0.25*30 + 0.125*20) / 60
    assert agg["train/kl_max"] == math.inf
    assert agg["train/reward_std"] == f32(0.4330127018922193)  # pooled: sqrt(0.75 - 0.75^2)
    assert agg["optim/update_outcome/skipped"] == 1 and agg["optim/update_outcome/applied"] == 2
    for path in sink.path.rglob("events.out.tfevents.*"):
        assert b"PLANTED-secret" not in path.read_bytes()


def test_a_failed_run_closes_its_session_as_failed(tmp_path):
    _, sink = publish(tmp_path, ppo_run(steps=3, warmup=2), "ppo", failed=True)
    acc, _, end = hparams_session(sink.path)
    assert end.status == api_pb2.STATUS_FAILURE
    assert AGGREGATE_PREFIX + "train/policy_loss" in acc.Tags()["scalars"]  # only the step that had it
    assert AGGREGATE_PREFIX + "train/value_loss" in acc.Tags()["scalars"]


def test_layout_and_hparams_can_be_turned_off(tmp_path):
    _, sink = publish(tmp_path, grpo_run(steps=2), layout=False, hparams=False)
    acc = load(sink.path)
    assert layout_metadata.CONFIG_SUMMARY_TAG not in acc.Tags()["tensors"]
    assert not (sink.path / HPARAMS_DIR).exists()


# -- the sink's own encoding, proven against TensorBoard's writer --------------------------------------


def expected_description(key: str, keys) -> str:
    """The description a tag must carry, written out here from the catalogue declarations."""
    if key not in keys:
        parent, _, label = key.rpartition("/")
        if parent in keys and label in keys[parent].metric.labels:
            return f"1 when `{parent}` is `{label}` at this step, else 0"
        return ""  # a key no adapter declares
    metric = keys[key].metric
    how = metric.reduction.value.replace("_", " ")
    if metric.reduction is Reduction.WEIGHTED_MEAN and keys[key].weight_key:
        how += f" by `{keys[key].weight_key}`"
    unit = f"{metric.unit}; " if metric.unit else ""
    return f"{metric.meaning} ({unit}{how} over chunks and ranks)" if metric.meaning else f"({unit}{how})"


def oracle_events(frames: list[Frame], keys) -> list:
    """Each frame's ``Event`` built with TensorBoard's own proto classes and metadata helpers (the
    first point of a tag with its description, values as float32: beyond its range, inf)."""
    from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2
    from tensorboard.plugins.scalar import metadata as scalar_metadata
    from tensorboard.plugins.text import metadata as text_metadata

    seen: set[str] = set()
    events = []
    for frame in frames:
        values = []
        for key, value in tracked(frame).items():
            first = key not in seen
            seen.add(key)
            if isinstance(value, str):
                v = summary_pb2.Summary.Value(tag=key, tensor=tensor_pb2.TensorProto(
                    dtype=types_pb2.DT_STRING, string_val=[value.encode()]))
                if first:
                    v.metadata.CopyFrom(text_metadata.create_summary_metadata(None, expected_description(key, keys)))
            else:
                number = float(value)
                if math.isfinite(number) and abs(number) > 3.4028235677973366e38:
                    number = math.copysign(math.inf, number)
                v = summary_pb2.Summary.Value(tag=key, simple_value=number)
                if first:
                    v.metadata.CopyFrom(scalar_metadata.create_summary_metadata("", expected_description(key, keys)))
            values.append(v)
        events.append(event_pb2.Event(wall_time=frame.wall_time, step=frame.step,
                                      summary=summary_pb2.Summary(value=values)))
    return events


def records(path: Path) -> list[bytes]:
    """The record payloads of the event files in ``path`` (TFRecord framing: length, CRC, data, CRC)."""
    [file] = path.glob("events.out.tfevents.*")
    data, out, pos = file.read_bytes(), [], 0
    while pos < len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        out.append(data[pos + 12 : pos + 12 + length])
        pos += 12 + length + 4
    return out


def mixed_run() -> list[Frame]:
    """Frames that take every path of the encoding: repeated keys (the packed path), a label that
    changes, a key that appears mid-run, a frame of other keys (undeclared ones), NaN and infinities, a
    finite value beyond float32, steps past one varint byte."""
    frames = grpo_run(steps=8)
    val = Frame(4, {"eval/score": 0.5, "eval/count": 12}, "val", 1_700_000_004.5)
    odd = dict(frames[5].metrics)
    odd["train/kl_max"], odd["train/loss_avg"], odd["train/grad_norm"] = math.nan, math.inf, 1e39
    more = [Frame(step, dict(frames[step % 8].metrics), "train", 1_700_000_000.0 + step) for step in (127, 128, 300, 70000)]
    return [*frames[:4], val, *frames[4:5], Frame(6, odd, "train", frames[5].wall_time), *frames[6:], *more]


class SlowDisk:
    """A file whose writes take 20 ms on the sink's writer thread (immediate on any other thread)."""

    def __init__(self, file):
        self.file = file

    def write(self, data: bytes) -> int:
        if threading.current_thread().name == "posttrain-metrics-tensorboard-writer":
            time.sleep(0.02)
        return self.file.write(data)

    def __getattr__(self, name: str):
        return getattr(self.file, name)


@pytest.mark.parametrize("background, flush", [(None, "step"), (1, "step"), (5000, 3)],
                         ids=["on the calling thread", "every flush by the writer thread", "mixed"])
def test_event_bytes_equal_tensorboards_own_protos_and_read_back_like_its_writer(tmp_path, monkeypatch,
                                                                                  background, flush):
    # background: the flush size from which the writer thread writes (None: the sink's own, which a
    # step's event never reaches). "mixed": flushes of 1-3 steps (2-7 KB) on either side of 5 KB, and a
    # queue of one batch, so small flushes also go after queued ones: the file must keep their order.
    from tensorboard.compat.proto import event_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    from posttrain_metrics.integrations.tensorboard import events as tb_module

    if background is not None:
        monkeypatch.setattr(tb_module, "_BACKGROUND_BYTES", background)
        monkeypatch.setattr(tb_module, "_QUEUED", 1)
    if background == 5000:  # a slow disk: the writer thread is still busy when the next, small, flush comes
        monkeypatch.setattr(tb_module, "open", lambda *a, **kw: SlowDisk(open(*a, **kw)), raising=False)  # noqa: SIM115
    frames = mixed_run()
    keys = describe([get_adapter(a) for a in GRPO_ADAPTERS])
    _, sink = publish(tmp_path, frames, layout=False, hparams=False, flush=flush)  # float32 overflow: logged
    want = oracle_events(frames, keys)
    got = records(sink.path)[2:]  # after the file version and the config event
    assert len(got) == len(want)
    for i, (data, event) in enumerate(zip(got, want)):
        assert data == event.SerializeToString(), f"event {i} (step {frames[i].step}) differs"
        assert event_pb2.Event.FromString(data) == event

    # TensorBoard's own writer, given the same events, reads back the same series
    writer = EventFileWriter(str(tmp_path / "oracle"))
    for event in want:
        writer.add_event(event)
    writer.close()
    ours, theirs = load(sink.path), load(tmp_path / "oracle")
    assert set(ours.Tags()["scalars"]) == set(theirs.Tags()["scalars"])
    for tag in theirs.Tags()["scalars"]:
        a, b = ours.Scalars(tag), theirs.Scalars(tag)
        assert [(e.step, e.wall_time) for e in a] == [(e.step, e.wall_time) for e in b], tag
        assert all(same(x.value, y.value) for x, y in zip(a, b)), tag
        assert ours.SummaryMetadata(tag) == theirs.SummaryMetadata(tag), tag
    assert ours.Scalars("train/grad_norm")[5].value == math.inf  # 1e39 is beyond float32
    assert math.isnan(ours.Scalars("train/kl_max")[5].value)
    assert [e.step for e in ours.Scalars("train/loss_avg")][-4:] == [127, 128, 300, 70000]



def test_a_write_that_fails_on_the_writer_thread_is_the_sinks_failure_not_a_hang(tmp_path, monkeypatch, caplog):
    # A disk that fills up mid-run: the writer thread's OSError reaches the publisher (warned once,
    # counted), the run closes without hanging, and what was written before the failure reads back.
    from posttrain_metrics.integrations.tensorboard import events as tb_module

    monkeypatch.setattr(tb_module, "_BACKGROUND_BYTES", 1)  # every flush by the writer thread
    monkeypatch.setattr(tb_module, "_QUEUED", 1)
    frames = grpo_run(steps=6)
    sink = TensorBoardSink(log_dir=tmp_path / "tb")
    pub = Publisher([sink], adapters=GRPO_ADAPTERS, run_name="t", mode="inline")
    pub.start({"seed": 1})
    for frame in frames[:3]:
        pub.publish(frame)
    sink._writer._queue.join()  # steps 1-3 written; the disk fills up from step 4 on
    real = sink._writer._file

    class Full:
        closed = False

        def write(self, data: bytes) -> int:
            raise OSError(28, "No space left on device")

        def flush(self) -> None:
            real.flush()

        def close(self) -> None:
            real.close()
            self.closed = True

    sink._writer._file = Full()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for frame in frames[3:]:
            pub.publish(frame)
        pub.close()
    said = [m for m in [str(w.message) for w in caught] + caplog.messages if "tensorboard" in m]  # logged: degraded
    assert len(said) == 1 and "No space left on device" in said[0], said
    assert pub.failures.get("tensorboard", 0) >= 1
    assert [e.step for e in load(sink.path).Scalars("train/loss_avg")] == [1, 2, 3]


class FlakyDisk:
    """A file whose first ``failures`` writes fail (a disk full for a moment), then write."""

    def __init__(self, file, failures: int):
        self.file, self.failures = file, failures

    def write(self, data: bytes) -> int:
        if self.failures:
            self.failures -= 1
            raise OSError(28, "No space left on device")
        return self.file.write(data)

    def __getattr__(self, name: str):
        return getattr(self.file, name)


def test_a_failed_write_on_the_calling_thread_is_written_again_by_the_next_flush(tmp_path):
    from posttrain_metrics.integrations.tensorboard import events as tb_module

    writer = tb_module._EventFile(tmp_path, tb_module._import_tensorboard())
    writer._file = FlakyDisk(writer._file, failures=1)
    writer.add(b"first")
    with pytest.raises(OSError, match="No space"):
        writer.flush()
    writer.add(b"second")
    writer.flush()
    writer.close()
    assert records(tmp_path)[1:] == [b"first", b"second"]  # after the file version record


def test_a_failed_write_on_the_writer_thread_is_raised_once_and_written_again_before_later_batches(
        tmp_path, monkeypatch):
    import traceback

    from posttrain_metrics.integrations.tensorboard import events as tb_module

    monkeypatch.setattr(tb_module, "_BACKGROUND_BYTES", 1)  # every flush by the writer thread
    writer = tb_module._EventFile(tmp_path, tb_module._import_tensorboard())
    writer._file = FlakyDisk(writer._file, failures=1)
    writer.add(b"lost")
    writer.flush()
    writer._queue.join()  # the thread has tried it
    raised = []
    for name in (b"kept-1", b"kept-2", b"kept-3"):
        writer.add(name)
        try:
            writer.flush()
        except OSError as exc:
            raised.append(exc)
    writer.close()
    assert len(raised) == 1 and "No space left on device" in str(raised[0])  # once, naming the cause
    assert len(traceback.extract_tb(raised[0].__traceback__)) < 5  # a new exception, not one re-raised
    # issue 23 (nothing lost): the failed batch is written again before the next, once
    assert records(tmp_path)[1:] == [b"lost", b"kept-1", b"kept-2", b"kept-3"]

# -- one directory per run; what the dashboard opens on ------------------------------------------------


def run_into(out_dir: Path, run_id: str, name: str, frames: list[Frame]) -> Publisher:
    """A run with the callback's default TensorBoard sink (``{"type": "tensorboard"}`` in out_dir)."""
    from posttrain_metrics.integrations.factory import build_sink

    pub = Publisher([build_sink({"type": "tensorboard"}, out_dir=out_dir)], adapters=GRPO_ADAPTERS,
                    run_name=name, run_id=run_id, mode="inline")
    pub.start({"seed": 1})
    for frame in frames:
        pub.publish(frame)
    pub.close()
    assert pub.failures == {}
    return pub


def test_two_runs_into_one_out_dir_each_write_their_own_directory_and_a_resumed_run_continues_its_own(tmp_path):
    frames = grpo_run(steps=4)
    first = run_into(tmp_path, "aaa111", "exp", frames)
    second = run_into(tmp_path, "bbb222", "exp", frames)
    root = tmp_path / "tensorboard"
    assert sorted(p.name for p in root.iterdir()) == ["exp-aaa111", "exp-bbb222"]
    assert first.run_handles()["tensorboard"]["log_dir"] == str((root / "exp-aaa111").resolve())
    assert second.run_handles()["tensorboard"]["log_dir"] == str((root / "exp-bbb222").resolve())
    for run in ("exp-aaa111", "exp-bbb222"):
        assert [e.step for e in load(root / run).Scalars("train/loss_avg")] == [1, 2, 3, 4], run  # once each
        _, start, _ = hparams_session(root / run)
        assert start.group_name == run  # the hparams session is named after its run
    # the first run resumed (same id), even under another name: it goes on in its own directory
    more = [Frame(step, dict(frames[step - 5].metrics), "train", 1_700_000_000.0 + step) for step in (5, 6)]
    resumed = run_into(tmp_path, "aaa111", "exp-resumed", more)
    assert sorted(p.name for p in root.iterdir()) == ["exp-aaa111", "exp-bbb222"]
    assert resumed.run_handles()["tensorboard"]["log_dir"] == str((root / "exp-aaa111").resolve())
    assert [e.step for e in load(root / "exp-aaa111").Scalars("train/loss_avg")] == [1, 2, 3, 4, 5, 6]
    assert [e.step for e in load(root / "exp-bbb222").Scalars("train/loss_avg")] == [1, 2, 3, 4]


def test_export_finds_the_runs_own_directory(tmp_path):
    """export into the default target writes the live run's directory: it holds every step, so
    there is nothing to export; a run name with odd characters gets a safe directory name."""
    from posttrain_metrics.export import export
    from posttrain_metrics.integrations.factory import build_sink

    frames = grpo_run(steps=3)
    pub = Publisher([JournalSink(tmp_path / "journal.jsonl"), build_sink({"type": "tensorboard"}, out_dir=tmp_path)],
                    adapters=GRPO_ADAPTERS, run_name="my run/1", run_id="ccc333", mode="inline")
    pub.start({})
    for frame in frames:
        pub.publish(frame)
    pub.close()
    [run_dir] = (tmp_path / "tensorboard").iterdir()
    assert run_dir.name == "my-run-1-ccc333"
    journal = read_journal(tmp_path / "journal.jsonl")
    assert export(journal, "tensorboard", quiet=True) == 0
    assert [e.step for e in load(run_dir).Scalars("train/loss_avg")] == [1, 2, 3]  # not written twice
    assert [p.name for p in (tmp_path / "tensorboard").iterdir()] == ["my-run-1-ccc333"]


def first_steps(acc: ea.EventAccumulator) -> dict[str, int]:
    return {tag: acc.Scalars(tag)[0].step for tag in acc.Tags()["scalars"]}


def layout_tags(layout: layout_pb2.Layout, tags: set[str]) -> set[str]:
    """The tags among ``tags`` that the layout charts; asserts that no chart matches none of them."""
    charted_tags: set[str] = set()
    for category in layout.category:
        for chart in category.chart:
            if chart.HasField("multiline"):
                hits = {t for rx in chart.multiline.tag for t in tags if re.match(rx, t)}
            else:
                hits = {t for s in chart.margin.series for t in (s.value, s.lower, s.upper) if t in tags}
                assert all({s.value, s.lower, s.upper} <= tags for s in chart.margin.series), chart.title
            assert hits, f"{category.title}: chart {chart.title} matches no written tag"
            charted_tags |= hits
    return charted_tags


def test_layout_lists_only_written_tags_and_grows_with_new_keys(tmp_path):
    frames = grpo_run(steps=4)
    late = dict(frames[3].metrics, **{"train/sc_token_count": 120, "train/sc_rho_max": 1.5})
    frames[3] = Frame(4, late, "train", frames[3].wall_time)
    _, sink = publish(tmp_path, frames)
    acc = load(sink.path)
    written = first_steps(acc)
    points = acc.Tensors(layout_metadata.CONFIG_SUMMARY_TAG)
    assert [p.step for p in points] == [1, 4]  # with the first frame, again when keys were added
    for point in points:
        layout = layout_pb2.Layout()
        layout.ParseFromString(point.tensor_proto.string_val[0])
        by_then = {t for t, step in written.items() if step <= point.step}
        # every chart matches a tag written by then, and no tag written later
        assert layout_tags(layout, set(written)) == layout_tags(layout, by_then)
    first, last = (layout_pb2.Layout.FromString(p.tensor_proto.string_val[0]) for p in points)
    assert "GRPO score centering" not in [c.title for c in first.category]
    assert {"train/sc_token_count", "train/sc_rho_max"} <= layout_tags(last, set(written))
    assert not any(t.startswith(AGGREGATE_PREFIX) for t in layout_tags(last, set(written)))


def test_every_tag_carries_its_catalogue_meaning_written_once(tmp_path):
    from tensorboard.compat.proto import event_pb2

    keys = describe([get_adapter(a) for a in GRPO_ADAPTERS])
    _, sink = publish(tmp_path, grpo_run(steps=4))
    acc = load(sink.path)
    described = 0
    for tag in acc.Tags()["scalars"]:
        description = acc.SummaryMetadata(tag).summary_description
        if tag in keys:  # the declaration's meaning (catalogue data), then how it is reduced
            meaning = keys[tag].metric.meaning
            assert meaning and re.fullmatch(re.escape(meaning) + r" \(.+ over chunks and ranks\)", description), tag
            described += 1
        else:  # a label indicator
            parent, _, label = tag.rpartition("/")
            assert label in keys[parent].metric.labels
            assert description == f"1 when `{parent}` is `{label}` at this step, else 0"
    assert described >= 30
    text = acc.SummaryMetadata("optim/update_outcome").summary_description
    assert text.startswith(keys["optim/update_outcome"].metric.meaning)
    # the description travels once per tag: with its first point only (the raw records: TensorBoard's
    # loader adds metadata to every legacy scalar it reads)
    with_metadata: dict[str, int] = {}
    for data in records(sink.path):
        for value in event_pb2.Event.FromString(data).summary.value:
            if value.HasField("metadata") and value.tag != layout_metadata.CONFIG_SUMMARY_TAG:
                with_metadata[value.tag] = with_metadata.get(value.tag, 0) + 1
    assert set(with_metadata.values()) == {1}, {t: n for t, n in with_metadata.items() if n != 1}


def test_run_aggregates_are_hparams_session_metrics_not_series_of_the_run(tmp_path):
    _, sink = publish(tmp_path, hand_frames())
    run_tags = load(sink.path).Tags()["scalars"]
    assert run_tags and not [t for t in run_tags if t.startswith(AGGREGATE_PREFIX)]
    acc, start, end = hparams_session(sink.path)
    assert sorted(acc.Tags()["scalars"]) == sorted(AGGREGATE_PREFIX + k for k in HAND_RUN)
    assert all(len(acc.Scalars(t)) == 1 for t in acc.Tags()["scalars"])  # one value per metric
    assert start.group_name == sink.path.name and end.status == api_pb2.STATUS_SUCCESS


def test_a_full_disk_that_clears_leaves_each_step_once_in_the_event_file(tmp_path):
    # A real fault: the child's file-size limit stops the event file mid-run (a write may take part
    # of a record), then is lifted. Each step of 1-40 reads back once per tag, with its own value.
    from _faults import run_child

    proc = run_child(f"""
        import logging
        import warnings
        from pathlib import Path
        from posttrain_metrics import Frame
        from posttrain_metrics.integrations.tensorboard import TensorBoardSink
        from posttrain_metrics.publication import Publisher

        log_dir = Path({str(tmp_path / "tb")!r})
        pub = Publisher([TensorBoardSink(log_dir=log_dir)], adapters=["trainer"], run_name="t", mode="inline")
        pub.start()
        said = []  # the sink's failure is an operational message: a log record

        class Keep(logging.Handler):
            def emit(self, record):
                said.append(record.getMessage())

        logging.getLogger("posttrain_metrics").addHandler(Keep())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for step in range(1, 41):
                if step == 20:
                    disk_full(next(log_dir.glob("events.*")).stat().st_size + 150)  # room for part of a step
                if step == 30:
                    disk_room()
                pub.publish(Frame(step, {{"train/grad_norm": step / 4, "train/learning_rate": step * 1e-3}},
                                  "train", 1_700_000_000.0 + step))
            pub.close()
        print(len([m for m in [str(w.message) for w in caught] + said if "tensorboard" in m]),
              pub.failures.get("tensorboard", 0))
    """, tmp_path)
    warned, failures = map(int, proc.stdout.split())
    assert warned == 1 and failures >= 1  # the fault happened, and was the sink's, said once
    events = load(tmp_path / "tb")
    for tag, scale in (("train/grad_norm", 0.25), ("train/learning_rate", 1e-3)):
        points = [(e.step, e.value) for e in events.Scalars(tag)]
        assert [s for s, _ in points] == list(range(1, 41)), tag
        assert [v for _, v in points] == pytest.approx([s * scale for s in range(1, 41)], rel=1e-6)


def test_a_long_completion_leaves_the_samples_table_so_the_other_columns_stay_readable(tmp_path):
    """TensorBoard's text tab sizes a table's columns to their longest cell: a 2,000-character
    completion squeezed the group and reward columns to a letter a line. A column with a cell over
    WIDE_CELL characters is written under a numbered table instead, whole, as written."""
    from posttrain_metrics.integrations import RunInfo
    from posttrain_metrics.journal.samples import Samples

    long = "think " * 333 + "<b>|*_#"  # 1,998 + 7 characters: Markdown and HTML specials at the end
    samples = Samples(step=3, rows=[{"group": "r0-g1", "completion": long, "reward": 1.0},
                                    {"group": "r0-g1", "completion": "short\nanswer", "reward": 0.0}],
                      columns=["group", "completion", "reward"], offered=8, wall_time=1_700_000_003.0)
    sink = TensorBoardSink(log_dir=tmp_path / "tb")
    sink.start(RunInfo(run_id="longtext", name="t", config={}, keys=describe([get_adapter("grpo")]),
                       adapters=("grpo",), started=1_700_000_000.0))
    sink.write_samples(samples)
    sink.close()
    [text] = [e.tensor_proto.string_val[0].decode() for e in load(tmp_path / "tb").Tensors("samples/completions")]
    assert text == "\n".join([
        "step 3: 2 of 8 rows (completion: below the table)", "",
        "| # | group | reward |", "|---|---|---|",
        "| 1 | r0-g1 | 1.0 |",
        "| 2 | r0-g1 | 0.0 |", "",
        "**#1 completion**", "",
        "think " * 333 + "&lt;b&gt;\\|\\*\\_\\#", "",
        "**#2 completion**", "",
        "short<br>answer",
    ])
    short = Samples(step=4, rows=[{"group": "g", "completion": "ok", "reward": 1.0}], columns=["group", "completion", "reward"],
                    offered=1)
    assert samples_markdown(short) == short.markdown()  # short text keeps the plain table

