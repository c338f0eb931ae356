"""Every adapter's declarations travel in the journal header (issue 26 item 3): a journal alone rebuilds
its run, so a user's own adapter needs no import in the publisher process, ``export``, ``doctor`` or
``plot``, and the publisher stays a process. Expected values are computed by hand from the chunks."""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
from _runs import only_run, tensorboard_run
from test_run_folder import publisher_pid, tensorboard_steps

from posttrain_metrics import MetricsError, register_adapter
from posttrain_metrics.callbacks import MetricsCallback
from posttrain_metrics.cli import main
from posttrain_metrics.core.adapter import Metric, MetricAdapter
from posttrain_metrics.core.catalog import BUILTIN, get_adapter
from posttrain_metrics.core.frame import Frame
from posttrain_metrics.core.keys import describe, headline_keys
from posttrain_metrics.core.reducer import reduce_metrics
from posttrain_metrics.core.reduction import Reduction, RunAggregate
from posttrain_metrics.core.summary import RunSummary
from posttrain_metrics.integrations.memory import MemorySink
from posttrain_metrics.journal import (
    adapter_declaration,
    adapter_declarations,
    adapter_from_declaration,
    declarations,
    header_adapters,
    read_journal,
)
from posttrain_metrics.publication import Publisher


class StageTimes(MetricAdapter):
    """A user's own adapter, defined in this test module only and registered nowhere: no other process
    can import it."""

    def __init__(self) -> None:
        super().__init__("stage_times_h3", internal_prefix="stage_", metrics=[
            Metric("stage_tokens", Reduction.SUM, "Tokens the stage saw", count=True),
            Metric("stage_wait_s", Reduction.WEIGHTED_MEAN, "Token-weighted wait", unit="s", weight="stage_tokens",
                   headline=True),
            Metric("stage_peak_mb", Reduction.MAX, "Peak memory of the stage", unit="MB"),
        ])


STEPS = range(1, 5)


def chunks(step: int) -> list[dict[str, float]]:
    return [{"stage_tokens": 10, "stage_wait_s": 1.0 * step, "stage_peak_mb": 100.0 + step},
            {"stage_tokens": 30, "stage_wait_s": 2.0 * step, "stage_peak_mb": 50.0}]


# By hand: tokens 10 + 30; wait (10 * s + 30 * 2s) / 40 = 1.75 s; peak max(100 + s, 50).
WAIT = [(s, 1.75 * s) for s in STEPS]
PEAK = [(s, 100.0 + s) for s in STEPS]
TOKENS = [(s, 40.0) for s in STEPS]


def run(out: Path, publisher: str, sinks: list[dict[str, str]]) -> Path:
    cb = MetricsCallback(adapters=[StageTimes()], out_dir=out, sinks=sinks, run_name="stages", publisher=publisher)
    with cb:
        cb.on_run_start({"lr": 0.1})
        for step in STEPS:
            for chunk in chunks(step):
                cb.on_chunk_end(chunk)
            cb.on_window_end(step)
    return out / "journal.jsonl"


def test_every_builtin_adapter_rebuilds_from_its_declaration_as_json() -> None:
    for adapter in BUILTIN:
        record = json.loads(json.dumps(adapter_declaration(adapter), allow_nan=False))
        rebuilt = adapter_from_declaration(adapter.name, record)
        assert rebuilt.metrics == adapter.metrics, adapter.name
        assert (rebuilt.internal_prefix, rebuilt.phases, rebuilt.ignored, rebuilt.family_scopes) == (
            adapter.internal_prefix, adapter.phases, adapter.ignored, adapter.family_scopes), adapter.name
        assert describe([rebuilt]) == describe([adapter]), adapter.name


def test_a_custom_adapter_is_declared_in_the_header_and_exports_without_an_import(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    journal = run(tmp_path / "run", "inline", [{"type": "journal"}])
    header = read_journal(journal).header
    assert header["adapters"] == ["stage_times_h3"]
    assert header["declarations"]["stage_times_h3"]["metrics"][1] == {
        "leaf": "stage_wait_s", "reduction": "weighted_mean", "meaning": "Token-weighted wait", "unit": "s",
        "weight": "stage_tokens", "headline": True}
    assert [type(a) for a in header_adapters(header)] == [MetricAdapter]  # rebuilt as data, not the class
    assert main(["export", str(journal), "--to", "tensorboard", str(tmp_path / "tb"), "--quiet"]) == 0
    exported = only_run(tmp_path / "tb")
    assert tensorboard_steps(exported, "train/stage_wait_s") == WAIT
    assert tensorboard_steps(exported, "train/stage_peak_mb") == PEAK
    assert tensorboard_steps(exported, "train/stage_tokens") == TOKENS
    capsys.readouterr()
    assert main(["doctor", str(journal), "--json"]) in (0, 1)
    assert "unknown adapter" not in capsys.readouterr().err


def test_a_header_without_declarations_names_catalogue_adapters(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A journal written before the declarations were recorded: its adapters are the catalogue's, by name;
    one the catalogue lacks is refused, named."""
    journal = run(tmp_path / "run", "inline", [{"type": "journal"}])
    lines = journal.read_text().splitlines()
    header = json.loads(lines[0])
    del header["declarations"]
    old = tmp_path / "old.jsonl"
    old.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    assert main(["export", str(old), "--to", "tensorboard", str(tmp_path / "tb"), "--quiet"]) == 2
    assert "unknown adapter 'stage_times_h3'" in capsys.readouterr().err
    header["adapters"], header["declarations"] = ["grpo", "trainer"], {}
    assert [a.metrics for a in header_adapters(header)] == [a.metrics for a in BUILTIN if a.name in ("grpo", "trainer")]


@pytest.mark.parametrize(("declarations", "said"), [
    ([], "declarations [] is not a JSON object"),
    ({"stage_times_h3": {"metrics": [{"leaf": "x", "reduction": "median", "meaning": ""}]}},
     "declaration of adapter 'stage_times_h3' is malformed ('median' is not a valid Reduction)"),
    ({"stage_times_h3": {"metrics": [{"leaf": "x", "reduction": "weighted_mean", "meaning": ""}]}},
     "declaration of adapter 'stage_times_h3': adapter 'stage_times_h3', leaf 'x': a weighted mean needs"),
    ({"stage_times_h3": {"metrics": "all"}}, "metrics 'all' is not a list of objects"),
    ({"stage_times_h3": {"metrics": [], "code": "import os"}}, "unknown field(s) ['code']"),
])
def test_a_malformed_declaration_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   declarations: object, said: str) -> None:
    journal = run(tmp_path / "run", "inline", [{"type": "journal"}])
    lines = journal.read_text().splitlines()
    header = json.loads(lines[0])
    header["declarations"] = declarations
    journal.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    assert main(["export", str(journal), "--to", "tensorboard", str(tmp_path / "tb"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err, err
    with pytest.raises(MetricsError):
        header_adapters(header)


# The fresh process's command line: this test module, and the tests folder, cannot be imported there.
UNIMPORTABLE = ("import sys\n"
                "sys.modules['tests'] = sys.modules['test_declarations'] = sys.modules['_runs'] = None\n"
                "from posttrain_metrics.cli import main\n"
                "sys.exit(main(sys.argv[1:]))\n")


@pytest.mark.slow
def test_a_custom_adapter_publishes_from_the_publisher_process_and_reads_in_a_fresh_one(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        journal = run(out, "process", [{"type": "journal"}, {"type": "tensorboard"}])
    assert not [str(w.message) for w in caught], [str(w.message) for w in caught]
    pid = publisher_pid(journal)
    assert pid and pid != os.getpid()  # the trackers were fed by the publisher process, not a thread
    live = tensorboard_run(out)
    assert tensorboard_steps(live, "train/stage_wait_s") == WAIT
    assert tensorboard_steps(live, "train/stage_peak_mb") == PEAK
    assert tensorboard_steps(live, "train/stage_tokens") == TOKENS

    def fresh(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", UNIMPORTABLE, *argv], cwd=tmp_path, capture_output=True,
                              text=True, timeout=240)

    done = fresh("export", str(journal), "--to", "tensorboard", str(tmp_path / "tb"), "--quiet")
    assert done.returncode == 0, done.stderr
    exported = only_run(tmp_path / "tb")
    assert tensorboard_steps(exported, "train/stage_wait_s") == WAIT
    assert tensorboard_steps(exported, "train/stage_peak_mb") == PEAK
    done = fresh("doctor", str(journal), "--json")
    assert done.returncode in (0, 1) and "unknown adapter" not in done.stderr, done.stderr
    report = json.loads(done.stdout)
    assert report["run"]["adapters"] == ["stage_times_h3"], report["run"]


# -- a rebuilt adapter publishes what the original does -------------------------------------------------

# ``derived`` (a key computed after the reduction, issue 28) where Metric has it: set, so that the round
# trip covers it; reported by no chunk either way.
DERIVED = {"derived": True} if "derived" in {f.name for f in dataclasses.fields(Metric)} else {}

EVERY_OPTION = MetricAdapter(
    "every_option", internal_prefix="eo_", phases=("train", "val"), ignored=("eo_debug",),
    family_scopes={"gap": "gap_tokens"},
    metrics=[
        Metric("tokens", Reduction.SUM, "Tokens of the window", unit="tokens", count=True),
        Metric("loss", Reduction.WEIGHTED_MEAN, "Token-weighted loss", unit="nats", weight="tokens", headline=True),
        Metric("gap_tokens", Reduction.SUM, "Tokens with a logprob gap", family="gap"),
        Metric("gap_mean", Reduction.WEIGHTED_MEAN, "Mean gap", weight="gap_tokens", family="gap"),
        Metric("gap_max", Reduction.MAX, "Largest gap", weight="gap_tokens", family="gap", headline=True,
               headline_if="gap_tokens"),
        Metric("adv_min", Reduction.MIN, "Smallest advantage"),
        Metric("adv_mean", Reduction.MEAN, "Mean advantage"),
        Metric("adv_sq", Reduction.MEAN, "Second moment of the advantage"),
        Metric("adv_std", Reduction.POOLED_STD, "Std of the advantage", mean="adv_mean", second_moment="adv_sq"),
        Metric("lr", Reduction.LAST, "Learning rate", namespace="optim"),
        Metric("opt_step", Reduction.AGREED, "Optimizer steps", namespace="optim"),
        Metric("skipped", Reduction.AGREED, "The window's update was skipped", namespace="optim",
               run=RunAggregate.WINDOWS),
        Metric("skips", Reduction.AGREED, "Updates skipped in the window", namespace="optim", count=True,
               run=RunAggregate.TOTAL),
        Metric("streak", Reduction.AGREED, "Skips in a row", namespace="optim", run=RunAggregate.MAX),
        Metric("outcome", Reduction.CATEGORICAL, "The update's outcome", namespace="optim",
               labels=("applied", "skipped")),
        Metric("loss_avg", Reduction.MEAN, "Loss by its own source name", source="eo_raw_loss"),
        Metric("eo_prefixed", Reduction.SUM, "A leaf that already starts with the prefix"),
        Metric("tokens_per_s", Reduction.MEAN, "Tokens per second, computed after the reduction", unit="tokens/s",
               **DERIVED),
    ])


def every_option_chunks(step: int) -> list[list[dict[str, object]]]:
    """Two ranks, one chunk each; rank 1 counted no gap tokens (its gap_max is a placeholder)."""
    flags = {"eo_lr": 0.125, "eo_opt_step": step, "eo_skipped": step != 2, "eo_skips": [1, 0, 2][step - 1],
             "eo_streak": [1, 0, 2][step - 1], "eo_outcome": "applied" if step == 2 else "skipped", "eo_debug": 7}
    return [[{**flags, "eo_tokens": 10, "eo_loss": 1.0 * step, "eo_gap_tokens": 4, "eo_gap_mean": 0.5,
              "eo_gap_max": 2.0, "eo_adv_min": -1.0, "eo_adv_mean": 0.0, "eo_adv_sq": 1.0, "eo_adv_std": 1.0,
              "eo_raw_loss": 1.0, "eo_prefixed": 3}],
            [{**flags, "eo_tokens": 30, "eo_loss": 3.0 * step, "eo_gap_tokens": 0, "eo_gap_mean": 0.0,
              "eo_gap_max": 99.0, "eo_adv_min": -3.0, "eo_adv_mean": 2.0, "eo_adv_sq": 5.0, "eo_adv_std": 9.0,
              "eo_raw_loss": 2.0, "eo_prefixed": 4}]]


def rebuilt(adapter: MetricAdapter) -> MetricAdapter:
    """``adapter`` as a reader of the journal rebuilds it: its declaration through JSON, then the header."""
    header = json.loads(json.dumps({"adapters": [adapter.name], "declarations": adapter_declarations([adapter])},
                                   allow_nan=False))
    (out,) = header_adapters(header)
    return out


def some_chunks(adapter: MetricAdapter, step: int) -> list[list[dict[str, object]]]:
    """Two ranks of two chunks that every key of ``adapter`` accepts (its families whole, its flags agreed)."""
    def chunk(rank: int, i: int) -> dict[str, object]:
        out: dict[str, object] = {}
        for source, m in adapter.metrics.items():
            if getattr(m, "derived", False):
                continue  # computed after the reduction: no producer reports it
            if m.reduction is Reduction.CATEGORICAL:
                out[source] = m.labels[step % len(m.labels)]
            elif m.reduction is Reduction.AGREED:
                out[source] = step % 3 if m.count else step
            elif source in adapter.counts:
                out[source] = 1 + rank + 2 * i + step
            elif m.reduction is Reduction.POOLED_STD:
                out[source] = 0.5 + 0.25 * rank + 0.125 * i
            else:
                out[source] = 0.5 * (1 + rank) + 0.25 * i + 0.0625 * step
        for m in adapter.metrics.values():
            if m.second_moment is not None and m.mean is not None:
                mean = out[adapter.source_of_leaf(m.mean)]
                assert isinstance(mean, float)
                out[adapter.source_of_leaf(m.second_moment)] = mean * mean + 1.0 + rank
        return out
    return [[chunk(rank, i) for i in range(2)] for rank in range(2)]


def typed(frame: dict[str, object]) -> list[tuple[str, object, type]]:
    return [(k, v, type(v)) for k, v in frame.items()]


def published(adapter: MetricAdapter, chunks_of: Callable[[int], list[list[dict[str, object]]]],
              phase: str) -> tuple[list[list[tuple[str, object, type]]], dict[str, object], list[list[str]]]:
    """The frames of three steps, the run aggregates over them and each frame's headline keys."""
    keys = describe([adapter])
    frames = [reduce_metrics(adapter, chunks_of(step), phase=phase) for step in (1, 2, 3)]
    summary = RunSummary(keys)
    for step, metrics in enumerate(frames, 1):
        summary.add(Frame(step, metrics, phase))
    return [typed(f) for f in frames], summary.values(), [headline_keys(keys, f) for f in frames]


@pytest.mark.parametrize("adapter", [*BUILTIN, EVERY_OPTION], ids=lambda a: a.name)
def test_a_rebuilt_adapter_reduces_describes_and_aggregates_as_the_original(adapter: MetricAdapter) -> None:
    again = rebuilt(adapter)
    assert describe([again]) == describe([adapter])
    chunks_of = (every_option_chunks if adapter is EVERY_OPTION else lambda step: some_chunks(adapter, step))
    for phase in sorted(adapter.phases):
        original = published(adapter, chunks_of, phase)
        assert original[0][0], (adapter.name, phase)  # the chunks reduce to something
        assert published(again, chunks_of, phase) == original, (adapter.name, phase)


def test_every_field_of_a_metric_and_an_adapter_is_declared() -> None:
    """A field added to Metric or MetricAdapter must be added to the declaration (its reader checks each
    field's type), and set in EVERY_OPTION so that the round trip above covers it."""
    fields = {f.name: f for f in dataclasses.fields(Metric)}
    flags = {name for name, f in fields.items() if f.type in ("bool", bool)}  # headline, count, ...
    assert set(fields) == {*declarations._TEXT, *declarations._ENUMS, "labels", *flags}
    unset = [name for name, f in fields.items() if f.default is not dataclasses.MISSING
             and all(getattr(m, name) == f.default for m in EVERY_OPTION.metrics.values())]
    assert not unset, f"no metric of EVERY_OPTION sets {unset}"
    taken = set(inspect.signature(MetricAdapter.__init__).parameters) - {"self", "name"}
    assert taken == set(adapter_declaration(EVERY_OPTION))


def test_every_metric_option_survives_the_header_with_its_figures_by_hand() -> None:
    again = rebuilt(EVERY_OPTION)
    assert again.metrics == EVERY_OPTION.metrics and list(again.metrics) == list(EVERY_OPTION.metrics)
    assert (again.internal_prefix, again.phases, again.ignored, again.family_scopes) == (
        "eo_", frozenset({"train", "val"}), frozenset({"eo_debug"}), {"gap": "gap_tokens"})
    assert again.counts == EVERY_OPTION.counts == {"eo_tokens", "eo_gap_tokens", "eo_skips"}
    assert again.families == {"gap": {"eo_gap_tokens", "eo_gap_mean", "eo_gap_max"}}
    keys = describe([again])
    assert keys["val/loss"].weight_key == "val/tokens" and keys["train/adv_std"].mean_key == "train/adv_mean"
    assert keys["train/loss_avg"].metric.source == "eo_raw_loss" and again.public_key("eo_raw_loss", "val") == "val/loss_avg"
    assert again.public_key("eo_prefixed", "train") == "train/eo_prefixed"
    assert keys["optim/skipped"].metric.run_aggregate is RunAggregate.WINDOWS
    assert keys["optim/opt_step"].metric.run_aggregate is RunAggregate.LAST
    assert (keys["train/loss"].metric.unit, keys["train/tokens"].metric.unit) == ("nats", "tokens")
    frames, run, heads = published(again, every_option_chunks, "val")
    step3 = {k: (v, t) for k, v, t in frames[2]}
    # By hand, step 3: loss (10 * 3 + 30 * 9) / 40; gap_max ignores rank 1's placeholder (no gap tokens);
    # adv_std = sqrt(E[x^2] - E[x]^2) = sqrt((1 + 5) / 2 - 1); eo_debug is ignored.
    assert step3["val/loss"] == (7.5, float) and step3["val/tokens"] == (40, int)
    assert step3["val/gap_max"] == (2.0, float) and step3["val/gap_mean"] == (0.5, float)
    assert step3["val/adv_std"] == (math.sqrt(2.0), float) and step3["val/adv_min"] == (-3.0, float)
    assert step3["optim/skipped"] == (True, bool) and step3["optim/outcome"] == ("skipped", str)
    assert step3["val/loss_avg"] == (1.5, float) and step3["val/eo_prefixed"] == (7, int)
    assert not any("debug" in k for k in step3)
    # Over the run: the flag held in 2 windows, 1 + 0 + 2 skips, the longest streak 2, the last step 3;
    # the loss weighted by tokens over the run: (40 * 2.5 + 40 * 5 + 40 * 7.5) / 120.
    assert (run["optim/skipped"], run["optim/skips"], run["optim/streak"], run["optim/opt_step"]) == (2, 3, 2, 3)
    assert run["val/loss"] == 5.0 and run["optim/outcome/skipped"] == 2 and run["optim/outcome/applied"] == 1
    assert heads[0] == ["val/loss", "val/gap_max"]


def start(out: Path, adapters: list[MetricAdapter]) -> None:
    with MetricsCallback(adapters=adapters, out_dir=out, sinks=[{"type": "journal"}], publisher="inline") as cb:
        cb.on_run_start({})


def test_two_adapters_of_one_name_are_refused_before_the_header_loses_one(tmp_path: Path) -> None:
    """The header declares adapters by name: two different adapters named alike would leave one
    declaration, and every reader would rebuild the run without the other's keys."""
    first = MetricAdapter("mine", internal_prefix="a_", metrics=[Metric("tokens", Reduction.SUM, "Tokens")])
    second = MetricAdapter("mine", internal_prefix="b_", metrics=[Metric("peak_mb", Reduction.MAX, "Peak")])
    with pytest.raises(MetricsError, match=r"two adapters are named 'mine'.*fix: give each adapter its own name"):
        start(tmp_path, [first, second])
    with pytest.raises(MetricsError, match="two adapters are named 'mine'"):
        Publisher([MemorySink()], adapters=[first, second], mode="inline")  # on every rank, before any collective
    same = {"adapters": ["grpo", "grpo"], "declarations": adapter_declarations([get_adapter("grpo")])}
    assert describe(header_adapters(same)) == describe([get_adapter("grpo")])  # one declaration, named twice: read


class Renamed(MetricAdapter):
    """A subclass that publishes under a namespace of its own by overriding a method, which the header
    (data only) cannot carry."""

    def __init__(self) -> None:
        super().__init__("renamed", metrics=[Metric("tokens", Reduction.SUM, "Tokens")])

    def public_key(self, source: str, phase: str) -> str:
        return f"mine/{self.metrics[source].leaf}"


def test_a_subclass_that_describes_its_keys_otherwise_is_refused_naming_the_override(tmp_path: Path) -> None:
    with pytest.raises(MetricsError, match=r"adapter 'renamed' \(Renamed\) overrides public_key.*"
                                           r"mine/tokens.*train/tokens.*fix: declare it"):
        start(tmp_path, [Renamed()])
    with pytest.raises(MetricsError, match="overrides public_key"):
        Publisher([MemorySink()], adapters=[Renamed()], mode="inline")
    # A subclass that only builds its metrics (StageTimes) describes what its declarations do: accepted.
    assert adapter_declarations([StageTimes()])["stage_times_h3"]["internal_prefix"] == "stage_"


def test_an_undeclared_unknown_adapter_is_refused_with_a_fix_that_works(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A header without declarations naming an adapter the catalogue lacks: the command line imports
    nothing of the user's (there is no --import), so the fix is to register it in Python and run the
    command from there; followed, it exports."""
    journal = run(tmp_path / "run", "inline", [{"type": "journal"}])
    lines = journal.read_text().splitlines()
    header = json.loads(lines[0])
    del header["declarations"]
    journal.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    argv = ["export", str(journal), "--to", "tensorboard", str(tmp_path / "tb"), "--quiet"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "the journal header names adapter 'stage_times_h3' without declaring it" in err, err
    assert "register_adapter(adapter)" in err and "posttrain_metrics.cli.main([" in err, err
    registry = sys.modules["posttrain_metrics.core.catalog"]._REGISTRY  # type: ignore[attr-defined]
    register_adapter(StageTimes())
    try:
        assert main(argv) == 0
    finally:
        del registry["stage_times_h3"]
    assert tensorboard_steps(only_run(tmp_path / "tb"), "train/stage_wait_s") == WAIT


class Patched(MetricAdapter):
    """A subclass that changes its declarations after MetricAdapter checked them."""

    def __init__(self) -> None:
        super().__init__("patched", metrics=[Metric("tokens", Reduction.SUM, "Tokens")])
        self.family_scopes = {"nope": "tokens"}


def test_a_subclass_its_readers_could_not_rebuild_is_refused_as_the_runs_own_error() -> None:
    with pytest.raises(MetricsError) as caught:
        Publisher([MemorySink()], adapters=[Patched()], mode="inline")
    said = str(caught.value)
    assert said.startswith("adapter 'patched' (Patched) cannot be rebuilt from its declarations"), said
    assert "family_scopes 'nope'" in said and "fix: declare it through MetricAdapter(...)" in said, said
    assert "journal header" not in said.split(":")[0]
