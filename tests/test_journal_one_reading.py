"""One reading of a journal line (issue 24, item 8): the live tail the publisher reads with
(``JournalTail``) accepts and refuses exactly the lines the reader of ``export``/``doctor``/``plot``
does (2**53, labels, surrogates, steps, times, headers), so the publisher never sends a frame that
``export`` refuses. And bad input at the edges (item 10): a header nested 700 levels deep is a clear
error with exit 2 from ``doctor``, ``plot`` and ``export``; a 5 MB run name does not crash ``plot``."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain_metrics import Frame, MetricsError
from posttrain_metrics.cli import main
from posttrain_metrics.journal import JournalSink, JournalTail, read_journal
from posttrain_metrics.publication import Publisher

HEADER = {"format": "posttrain-metrics-journal", "version": 1, "kind": "header", "run_id": "fuzz01",
          "name": "fuzz", "created": 1.7e9, "adapters": ["grpo", "trainer"], "config": {}}

_KEYS = st.sampled_from(["train/kl_max", "optim/update_outcome", "optim/optimizer_step", "my/own", "train/loss_avg"])
_VALUES = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(-(2**54), 2**54),
    st.sampled_from([2**53, 2**53 + 1, -(2**53) - 1, 2**64, 10**30]),
    st.booleans(),
    st.sampled_from(["applied", "skipped", "bogus", "", "\ud800", "ok\udfff"]),
    st.sampled_from([{"$float": "NaN"}, {"$float": "Infinity"}, {"$float": "nope"}, {"other": 1}, [1], None]),
)
_STEPS = st.one_of(st.integers(-(2**54), 2**54), st.sampled_from([2**53 + 1, 1.0, 20.7, "21", True, None]))
_TIMES = st.one_of(st.floats(-1e10, 1e10), st.sampled_from([1e300, "now", None, True, 2**60]))


@st.composite
def lines(draw: Any) -> str:
    """One journal line after the header: a frame, an end record, another header, or not JSON."""
    kind = draw(st.sampled_from(["frame", "frame", "frame", "end", "header", "raw"]))
    if kind == "frame":
        record: dict[str, Any] = {"kind": "frame", "run_id": "fuzz01", "step": draw(_STEPS),
                                  "phase": draw(st.sampled_from(["train", "val", 3, "\ud800"])),
                                  "time": draw(_TIMES), "metrics": draw(st.dictionaries(_KEYS, _VALUES, max_size=4))}
        if draw(st.booleans()):
            del record["time"]
    elif kind == "end":
        record = {"kind": "end", "status": draw(st.sampled_from(["finished", "failed"])), "time": draw(_TIMES)}
    elif kind == "header":
        record = {**HEADER, **draw(st.fixed_dictionaries({}, optional={
            "run_id": st.sampled_from(["fuzz01", "../x", ""]), "version": st.sampled_from([1, 2, True]),
            "adapters": st.sampled_from([["grpo"], "grpo", [1]]), "name": st.sampled_from(["n", 5, "\ud800"]),
            "config": st.sampled_from([{}, [], {"a": "\udfff"}])}))}
    else:
        return draw(st.sampled_from(["{", "[1, 2]", '"text"', "{}", '{"kind": "other"}', "NaN"]))
    return json.dumps(record)  # ensure_ascii: a lone surrogate is written as its \\u escape, as JSON allows


def _readings(path: Path) -> tuple[Any, Any]:
    """What the reader and the tail make of the journal: its frames, or 'refused'."""
    def frames(got: list[Frame]) -> list[str]:
        return [repr((f.step, f.phase, f.wall_time, list(f.metrics.items()))) for f in got]

    try:
        reader: Any = frames(read_journal(path).frames)
    except MetricsError:
        reader = "refused"
    try:
        tail: Any = frames([r.frame for r in JournalTail(path).read(final=True) if r.frame is not None])
    except MetricsError:
        tail = "refused"
    return reader, tail


@settings(max_examples=400)
@given(st.lists(lines(), min_size=1, max_size=4))
def test_the_tail_accepts_and_refuses_what_the_reader_does(body: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "journal.jsonl"
        path.write_text("\n".join([json.dumps(HEADER), *body]) + "\n")
        reader, tail = _readings(path)
    assert reader == tail


@pytest.mark.parametrize("line", [
    {"kind": "frame", "step": 1, "time": 1.0, "metrics": {"optim/optimizer_step": 2**53 + 1}},  # beyond 2**53
    {"kind": "frame", "step": 1, "time": 1.0, "metrics": {"optim/update_outcome": "bogus"}},  # not a label
    {"kind": "frame", "step": 1, "time": 1.0, "metrics": {"train/kl_max": "high"}},  # text for a number
    {"kind": "frame", "step": 1, "time": 1.0, "metrics": {"my/x": "\ud800"}},  # a lone surrogate
    {"kind": "frame", "step": 2**53 + 1, "time": 1.0, "metrics": {}},
    {"kind": "end", "status": "finished", "time": "later"},
])
def test_lines_the_reader_refuses_never_reach_the_publisher(tmp_path: Path, line: dict[str, Any]) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_text(json.dumps(HEADER) + "\n" + json.dumps(line) + "\n")
    assert _readings(path) == ("refused", "refused")


# -- bad input at the edges ----------------------------------------------------------------------------


def _deep(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = {"a": value}
    return value


def _journal(path: Path, header: dict[str, Any], config_text: str = "{}") -> Path:
    """A journal of ``header`` (its config written as ``config_text``: json.dumps recurses) and 3 frames."""
    frames = [json.dumps({"kind": "frame", "run_id": "fuzz01", "step": s, "phase": "train", "time": 1.7e9 + s,
                          "metrics": {"train/kl_max": 0.5 * s}}) for s in (1, 2, 3)]
    text = json.dumps({**header, "config": {}}).replace('"config": {}', f'"config": {config_text}', 1)
    path.write_text("\n".join([text, *frames]) + "\n")
    return path


@pytest.mark.parametrize("command", ["doctor", "plot", "export"])
def test_a_header_nested_700_levels_is_a_clear_error_with_exit_2(tmp_path: Path, command: str,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = _journal(tmp_path / "journal.jsonl", HEADER, '{"a":' * 700 + "1" + "}" * 700)
    args = {"doctor": [], "plot": ["--out", str(tmp_path / "p.png")],
            "export": ["--to", "tensorboard", str(tmp_path / "tb"), "--quiet"]}[command]
    assert main([command, str(path), *args]) == 2
    err = capsys.readouterr().err
    assert "nest more than 100 levels" in err and "Traceback" not in err
    with pytest.raises(MetricsError, match="nest more than 100 levels"):
        JournalTail(path).read()  # the publisher's reader refuses it the same way


def test_the_writer_refuses_a_config_readers_would_refuse(tmp_path: Path) -> None:
    pub = Publisher([JournalSink(tmp_path / "journal.jsonl")], adapters=["grpo"], run_id="deep01")
    with pytest.raises(MetricsError, match=r"config nests 150 levels deep.*fix: flatten the config"):
        pub.start(_deep(150))
    pub = Publisher([JournalSink(tmp_path / "ok.jsonl")], adapters=["grpo"], run_id="deep02")
    pub.start(_deep(20))  # a config of ordinary depth still reads back
    pub.publish(Frame(1, {"train/kl_max": 0.5}))
    pub.close()
    assert read_journal(tmp_path / "ok.jsonl").frames[0].metrics == {"train/kl_max": 0.5}


def test_a_5_mb_run_name_does_not_crash_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _journal(tmp_path / "journal.jsonl", {**HEADER, "name": "n" * (5 << 20)})
    out = tmp_path / "p.png"
    assert main(["plot", str(path), "--out", str(out)]) == 0
    assert out.stat().st_size > 10_000 and "Traceback" not in capsys.readouterr().err
