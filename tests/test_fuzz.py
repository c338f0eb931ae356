"""Fuzz (hypothesis): random metric dicts into the reducer, random journal lines into the reader.

Nothing but ``MetricsError`` may come out, nothing may hang (bounded examples and a timeout per
test; no per-example wall-clock deadline, which a loaded machine breaks), and nothing published before a bad window is lost: every frame that was
published is in the journal and the memory sink at the end, exactly, and a good window right after a
bad one reduces to exactly what ``reduce_metrics`` gives for it alone.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import random
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _runs import GRPO_ADAPTERS, grpo_chunk
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from posttrain_metrics import Frame, MetricReducer, MetricsError, get_adapter, reduce_metrics
from posttrain_metrics.core.keys import describe
from posttrain_metrics.doctor import run_checks
from posttrain_metrics.integrations import MemorySink
from posttrain_metrics.journal import JournalSink, read_journal
from posttrain_metrics.publication import Publisher

pytestmark = pytest.mark.timeout(120)

ADAPTERS = [get_adapter(name) for name in GRPO_ADAPTERS]
SOURCES = sorted(source for adapter in ADAPTERS for source in adapter.metrics)
PUBLIC = set(describe(ADAPTERS))
LABELS = ["applied", "skipped", "accumulating", "discarded", "nonfinite_loss", "bogus", ""]
# derandomize, database and deadline come from the loaded profile (tests/_profiles.py): derandomized
# in CI, no wall-clock deadline anywhere. Only what is specific to these strategies is set here.
FUZZ = settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# -- values of every kind a producer might hand us ------------------------------------------------------

floats = st.floats(allow_nan=True, allow_infinity=True)
finite32 = st.floats(width=32, allow_nan=True, allow_infinity=True)
values = st.one_of(
    floats,
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=-10, max_value=10_000),
    st.booleans(),
    st.none(),
    st.text(max_size=8),
    st.sampled_from(LABELS),
    st.lists(floats, max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.builds(np.float32, finite32),
    st.builds(np.float64, floats),
    st.builds(np.longdouble, st.floats(allow_nan=False, allow_infinity=False)),
    st.builds(np.int64, st.integers(min_value=-(2**63), max_value=2**63 - 1)),
    st.builds(np.bool_, st.booleans()),
    st.builds(np.str_, st.sampled_from(LABELS)),
    st.builds(lambda x: torch.tensor(x, dtype=torch.float64), floats),
    st.builds(lambda x: torch.tensor(x, dtype=torch.float32), finite32),
    st.builds(lambda x: torch.tensor(x, dtype=torch.int64), st.integers(min_value=-(2**62), max_value=2**62)),
    st.builds(torch.tensor, st.booleans()),
    st.builds(lambda xs: torch.tensor(xs, dtype=torch.float32), st.lists(finite32, max_size=3)),
    st.builds(lambda x: torch.tensor([x]), st.integers(min_value=0, max_value=100)),
)
keys: st.SearchStrategy[Any] = st.one_of(
    st.sampled_from(SOURCES), st.sampled_from(SOURCES), st.text(max_size=12),
    st.sampled_from(["grpo_kl_maximum", "loss", "", "dpo_weight_sum", "x" * 300]),
    st.sampled_from([1, None, ("grpo_kl_max",), b"grpo_kl_max"]),  # not a string at all
)
chunks = st.dictionaries(keys, values, max_size=8)
windows = st.lists(chunks, max_size=3)


def good_window(step: int) -> list[dict[str, Any]]:
    rng = random.Random(step)
    return [grpo_chunk(rng, step, last=c == 1) for c in range(2)]


def same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and (a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)))


def assert_plain(frame: Frame) -> None:
    for key, value in frame.metrics.items():
        assert key in PUBLIC, key
        assert type(value) in (bool, int, float, str), (key, type(value))


def test_random_windows_raise_only_metrics_error_and_lose_nothing(tmp_path: Path) -> None:
    memory = MemorySink()
    pub = Publisher([JournalSink(tmp_path / "journal.jsonl"), memory], adapters=GRPO_ADAPTERS, mode="inline")
    pub.start({})
    reducer = MetricReducer(GRPO_ADAPTERS)
    published: list[Frame] = []
    steps = itertools.count(1)
    outcomes = {"frame": 0, "MetricsError": 0}

    @settings(FUZZ, max_examples=250)
    @given(window=windows)
    def run(window: list[dict[str, Any]]) -> None:
        step = next(steps)
        try:
            for chunk in window:
                reducer.add(chunk)
            frame = reducer.reduce(step)
        except MetricsError:
            outcomes["MetricsError"] += 1
            with contextlib.suppress(MetricsError):  # add() refused a chunk: drop what it had added
                reducer.reduce(step)
        else:
            outcomes["frame"] += 1
            assert_plain(frame)
            pub.publish(frame)
            published.append(frame)
        assert reducer.pending_chunks == 0  # the window is gone, good or bad
        good = good_window(step)
        for chunk in good:
            reducer.add(chunk)
        after = reducer.reduce(step)
        assert dict(after.metrics) == reduce_metrics(GRPO_ADAPTERS, [good])  # nothing of the bad window
        pub.publish(after)
        published.append(after)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # empty windows and non-finite values are warned about once
        run()
        pub.close()
    assert outcomes["frame"] >= 5 and outcomes["MetricsError"] >= 5, outcomes  # both paths were explored
    journal = read_journal(tmp_path / "journal.jsonl")
    assert len(journal.frames) == len(published)
    for got, want in zip(journal.frames, published):  # every frame ever published, exactly
        assert got.step == want.step and got.metrics.keys() == want.metrics.keys()
        assert all(same(got.metrics[k], v) for k, v in want.metrics.items()), want.step
    assert [f.step for f in memory.frames] == [f.step for f in published if f.metrics]


@settings(FUZZ, max_examples=150)
@given(per_rank=st.lists(windows, min_size=1, max_size=3))
def test_random_ranks_raise_only_metrics_error(per_rank: list[list[dict[str, Any]]]) -> None:
    try:
        metrics = reduce_metrics(GRPO_ADAPTERS, per_rank)
    except MetricsError:
        return
    assert_plain(Frame(0, metrics))
    if len(per_rank) == 1:  # one rank: the in-process reducer agrees
        reducer = MetricReducer(GRPO_ADAPTERS)
        for chunk in per_rank[0]:
            reducer.add(chunk)
        local = reducer.reduce(1).metrics
        assert local.keys() == metrics.keys()
        assert all(same(local[k], v) or (isinstance(v, float) and math.isclose(local[k], v))
                   for k, v in metrics.items())


# -- journal lines -------------------------------------------------------------------------------------------

HEADER = {"format": "posttrain-metrics-journal", "version": 1, "kind": "header", "run_id": "fuzz01",
          "name": "fuzz", "created": 0, "adapters": ["grpo"], "config": {"rl/kl_beta": 0.04}}
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**80), max_value=2**80),
                         st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=6))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)), max_leaves=8)
metric_values = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False), st.integers(min_value=-(2**60), max_value=2**60),
    st.booleans(), st.sampled_from(LABELS),
    st.sampled_from([{"$float": "NaN"}, {"$float": "Infinity"}, {"$float": "-Infinity"}]),
    st.builds(lambda v: {"$float": v}, json_values), json_values,
)
frames = st.fixed_dictionaries(
    {"kind": st.just("frame"), "run_id": st.just("fuzz01"),
     "step": st.one_of(st.integers(min_value=-5, max_value=10**6), json_values),
     "metrics": st.one_of(st.dictionaries(st.sampled_from(sorted(PUBLIC)) | st.text(max_size=6), metric_values,
                                          max_size=5), json_values)},
    optional={"phase": st.sampled_from(["train", "val"]) | json_values,
              "time": st.floats(allow_nan=False) | json_values},
)
records = st.one_of(
    frames, frames, frames,
    st.fixed_dictionaries({"kind": st.sampled_from(["end", "header", "nope"]), "status": json_values}),
    st.builds(lambda h: {**HEADER, **h}, st.dictionaries(st.sampled_from(sorted(HEADER)), json_values, max_size=2)),
    json_values,
)
lines = st.one_of(
    records.map(lambda r: json.dumps(r, separators=(",", ":"))),
    records.map(lambda r: json.dumps(r)).flatmap(lambda s: st.integers(0, len(s)).map(lambda n: s[:n])),  # cut
    st.text(max_size=40),  # garbage
    st.sampled_from(["NaN", "Infinity", '{"kind":"frame","step":Infinity,"metrics":{}}', "1e999999", "9" * 5000,
                     '{"kind":"frame","step":1e400,"metrics":{}}', "\x00\x00", "{" * 50]),
    st.integers(min_value=1, max_value=200_000).map(lambda n: "[" * n + "]" * n),  # deep nesting
    st.integers(min_value=1, max_value=50_000).map(lambda n: '{"a":' * n + "1" + "}" * n),
)


@settings(FUZZ, max_examples=300)
@given(head=st.one_of(st.just(json.dumps(HEADER)), lines), body=st.lists(lines, max_size=6), newline=st.booleans())
def test_random_journal_lines_raise_only_metrics_error(head: str, body: list[str], newline: bool) -> None:
    text = "\n".join([head, *body]) + ("\n" if newline else "")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "journal.jsonl"
        path.write_text(text, encoding="utf-8")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                journal = read_journal(path)
            except MetricsError:
                return
    for warning in caught:  # the only warnings: a torn last line (no final newline), or a line torn by
        message = str(warning.message)  # a crash that a resumed run's header follows
        assert ("torn last line" in message and not newline) or "the run resumed after it" in message, message
    for frame in journal.frames:
        assert type(frame.step) is int
        assert all(type(v) in (bool, int, float, str) for v in frame.metrics.values())
    with contextlib.suppress(MetricsError):
        run_checks(journal)  # the doctor reads whatever the reader accepted


# -- the hypothesis profile: derandomized in CI, never overridden by a test ------------------------------


def test_the_loaded_profile_follows_the_ci_variable() -> None:
    import os

    import _profiles

    ci = _profiles.profile_for(os.environ) == _profiles.CI_PROFILE
    assert settings._current_profile == ("ci" if ci else "dev")  # loaded by conftest.py
    assert settings.default.derandomize is ci
    assert settings.default.deadline is None and settings.default.database is None
    # the fuzz settings inherit it: nothing here re-randomizes or adds a deadline
    assert FUZZ.derandomize is ci and FUZZ.deadline is None and FUZZ.database is None
    assert _profiles.profile_for({"CI": "true"}) == "ci" and _profiles.profile_for({"CI": "1"}) == "ci"
    assert _profiles.profile_for({}) == "dev" and _profiles.profile_for({"CI": "false"}) == "dev"


def test_with_ci_set_the_profile_is_derandomized_in_a_fresh_process() -> None:
    import os
    import subprocess
    import sys

    code = ("import conftest, hypothesis; s = hypothesis.settings.default; "
            "print(conftest.HYPOTHESIS_PROFILE, s.derandomize, s.deadline, s.database)")
    env = {**os.environ, "CI": "true"}
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parent, env=env,
                         capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["ci", "True", "None", "None"], out.stderr


def test_no_test_sets_its_own_randomness_for_hypothesis() -> None:
    """A test's own ``derandomize=``/``database=``/``@seed``/``deadline=`` would override the profile."""
    here = Path(__file__).parent
    offenders = []
    for path in sorted(here.glob("*.py")):
        if path.name == "_profiles.py":
            continue
        text = path.read_text()
        for needle in ("derandomize=", "@seed(", "hypothesis import seed", "database=", "deadline="):
            # this file names the needles above; only a use in a settings(...) call counts
            if needle in text.replace(f'"{needle}"', "").replace(f"``{needle}", ""):
                offenders.append((path.name, needle))
    assert offenders == []


# -- the reduction's inline fast path against its general one ------------------------------------------

# Numbers of every plain kind, counts and weights at their edges (0, negative, NaN, inf, beyond 2**53),
# and what is not a number at all, so that every branch of the inline path and every hand-off to the
# general ``_add`` is drawn: a weighted key beside a zero, negative, NaN, bool or missing weight, an
# extremum beside a zero count, NaN extrema, -0.0.
numbers = st.one_of(
    floats, st.sampled_from([0.0, -0.0, 1.0, -1.0, math.nan, math.inf, -math.inf]),
    st.integers(min_value=-5, max_value=50), st.integers(min_value=-(2**60), max_value=2**60),
    st.sampled_from([0, 2**53, 2**53 + 1, -(2**53)]), st.booleans(), st.none(), st.sampled_from(LABELS),
    st.builds(np.float64, floats), st.builds(np.int64, st.integers(min_value=-100, max_value=100)),
)
dense_windows = st.lists(st.dictionaries(st.sampled_from(SOURCES), numbers, max_size=len(SOURCES)), max_size=4)


@settings(FUZZ, max_examples=400)
@given(window=dense_windows)
def test_the_inline_fast_path_packs_exactly_what_the_general_path_packs(window: list[dict[str, Any]]) -> None:
    """``Layout.accumulate`` adds plain numbers inline (the training thread's cost); with that off,
    every value goes through ``Layout._add``. Both must give the same buffers bit for bit (NaN
    payloads and the sign of zero included) and record the same producer bugs."""
    import struct

    from posttrain_metrics.core.layout import Layout
    from posttrain_metrics.core.values import materialize

    def packed(fast: bool) -> tuple[bytes, bytes, dict[int, str]]:
        layout = Layout(tuple(ADAPTERS))
        layout._fast = fast
        state = layout.accumulate(materialize(window), rank=1, step=3)
        return struct.pack(f"{len(state.sum)}d", *state.sum), struct.pack(f"{len(state.max)}d", *state.max), state.errors

    assert packed(True) == packed(False)


_EDGE_NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 2.0**53, 2.0**63, -(2.0**63), 2.0**64, 1e19, 1e-300, 5e-324, 1.7976931348623157e308,
                     0.1 + 0.2, 1e-5 / 3]),
    st.integers(-(2**53), 2**53),
    st.integers(-(2**70), 2**70),  # beyond 2**53: refused; beyond 64 bits orjson would read a float
    st.booleans(),
)
_LINE_METRICS = st.dictionaries(
    st.one_of(st.sampled_from(["train/kl_max", "train/loss_avg", "optim/update_outcome", "train/grad_norm"]),
              st.text(min_size=1, max_size=12)),
    st.one_of(_EDGE_NUMBERS, st.text(max_size=8), st.sampled_from(["applied", "skipped"])),
    max_size=12,
)


def _by_hand(line: str) -> dict[str, Any]:
    """A frame line's metrics as the format defines them, read with json and decoded here."""
    out: dict[str, Any] = {}
    for key, value in json.loads(line)["metrics"].items():
        out[key] = float(value["$float"]) if isinstance(value, dict) else value
    return out


@settings(FUZZ, max_examples=300)
@given(frames=st.lists(_LINE_METRICS, min_size=1, max_size=6), orjson_lines=st.booleans(),
       phase=st.one_of(st.just("train"), st.sampled_from(["val", ""]), st.integers(-(2**70), 2**70)))
def test_journal_frames_read_as_json_reads_them_whichever_parser_reads(frames: list[dict[str, Any]],
                                                                     orjson_lines: bool, phase: Any) -> None:
    # read_journal and the publisher's JournalTail parse frame lines with orjson when installed: what
    # they return must be what json returns (decoded by hand above), value for value and type for type;
    # a frame the catalogue refuses must be refused whichever parser read it, with the same error.
    import orjson

    import posttrain_metrics.journal.format as journal_module
    from posttrain_metrics.journal import JournalTail

    header = {"format": "posttrain-metrics-journal", "version": 1, "kind": "header", "run_id": "fuzz01",
              "name": "fuzz", "created": 1.7e9, "adapters": ["grpo", "trainer"], "config": {}}
    lines = [json.dumps(header)]
    for step, metrics in enumerate(frames, 1):
        encoded = {k: {"$float": "NaN" if v != v else "Infinity" if v > 0 else "-Infinity"}
                   if isinstance(v, float) and not math.isfinite(v) else v for k, v in metrics.items()}
        record = {"kind": "frame", "run_id": "fuzz01", "step": step, "phase": phase, "time": 1.7e9 + step,
                  "metrics": encoded}
        try:
            lines.append(orjson.dumps(record).decode() if orjson_lines else json.dumps(record, allow_nan=False))
        except TypeError:  # orjson writes no integer beyond 64 bits
            lines.append(json.dumps(record, allow_nan=False))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "journal.jsonl"
        path.write_text("\n".join(lines) + "\n")
        results = []
        for parser in (orjson, None):
            journal_module._orjson = parser
            try:
                results.append(read_journal(path).frames)
            except MetricsError as exc:
                results.append(str(exc))
            finally:
                journal_module._orjson = orjson
        try:
            tail: Any = [r.frame for r in JournalTail(path).read() if r.frame is not None]
        except MetricsError as exc:
            tail = str(exc)
    fast, plain = results
    if isinstance(plain, str):
        assert fast == plain  # refused the same way
        assert isinstance(tail, str), tail  # and by the publisher's tail: one reading of a line (issue 24)
        return
    assert not isinstance(fast, str), fast
    for got in (fast, plain, tail):
        assert len(got) == len(frames)
        for frame, line in zip(got, lines[1:]):
            assert frame.phase == str(json.loads(line)["phase"])  # a number there reads as json writes it
            want = _by_hand(line)
            assert list(frame.metrics) == list(want)
            for key, value in want.items():
                have = frame.metrics[key]
                assert type(have) is type(value), (key, have, value)
                assert have == value or (value != value and have != have), (key, have, value)
                if isinstance(value, float):
                    assert math.copysign(1.0, have) == math.copysign(1.0, value), key  # -0.0 stays -0.0


_SHAPE_VALUES = st.one_of(st.floats(allow_nan=True), st.integers(-5, 5), st.booleans(),
                          st.sampled_from(["a", "b", "c", "other", ""]), st.just(np.float64(0.5)), st.just(np.bool_(True)))


@settings(FUZZ, max_examples=300)
@given(frames=st.lists(st.lists(_SHAPE_VALUES, min_size=4, max_size=4), min_size=1, max_size=8),
       keys_of=st.lists(st.sampled_from(["shape/outcome", "shape/loss", "shape/flag", "n", "optim/verdict",
                                         "shape/outcome/a", "optim/verdict/c"]),  # named like indicators
                        min_size=4, max_size=4, unique=True))
def test_display_frames_are_what_the_rule_says_whatever_shapes_came_before(frames: list[list[Any]],
                                                                           keys_of: list[str]) -> None:
    # display_frame works out a frame's shape once (keys and value types) and reuses it: frames of
    # one key set whose types change from one to the next must still display by the rule, written
    # out here by hand: bools as 0/1 ints, a label of a categorical key followed by one 0/1 int per
    # declared label (all 0 for a value that is none of them), everything else as it is, in order; a
    # frame key named like an indicator: whichever comes later wins, in the place of the first.
    from posttrain_metrics.core.adapter import Metric, MetricAdapter
    from posttrain_metrics.core.reduction import Reduction as R
    from posttrain_metrics.publication.publisher import display_frame

    adapter = MetricAdapter("shapefuzz", internal_prefix="shapefuzz_", metrics=[
        Metric("outcome", R.CATEGORICAL, "A label", labels=("a", "b"), namespace="shape"),
        Metric("verdict", R.CATEGORICAL, "A label", labels=("c",), namespace="optim"),
        Metric("loss", R.MEAN, "A number", namespace="shape"),
    ])
    keys = describe([adapter])
    labels = {"shape/outcome": ("a", "b"), "optim/verdict": ("c",)}
    assert set(labels) <= set(keys)
    for step, values in enumerate(frames):
        frame = Frame(step, dict(zip(keys_of, values)))
        want: dict[str, Any] = {}  # assigned in order: a later assignment keeps the first place
        for key, value in frame.metrics.items():
            if isinstance(value, bool):
                want[key] = int(value)
                continue
            want[key] = value
            if isinstance(value, str) and key in labels:
                for label in labels[key]:
                    want[f"{key}/{label}"] = int(value == label)
        got = list(display_frame(frame, keys).metrics.items())
        assert [k for k, _ in got] == list(want)
        for (key, have), value in zip(got, want.values()):
            assert type(have) is type(value), (key, have, value)
            assert have == value or (have != have and value != value), (key, have, value)
