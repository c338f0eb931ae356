"""Every adapter's declarations travel in the journal header (issue 26 item 3): a journal alone rebuilds
its run, so a user's own adapter needs no import in the publisher process, ``export``, ``doctor`` or
``plot``, and the publisher stays a process. Expected values are computed by hand from the chunks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from _runs import only_run, tensorboard_run
from test_run_folder import publisher_pid, tensorboard_steps

from posttrain_metrics import MetricsError
from posttrain_metrics.callbacks import MetricsCallback
from posttrain_metrics.cli import main
from posttrain_metrics.core.adapter import Metric, MetricAdapter
from posttrain_metrics.core.catalog import BUILTIN
from posttrain_metrics.core.keys import describe
from posttrain_metrics.core.reduction import Reduction
from posttrain_metrics.journal import (
    adapter_declaration,
    adapter_from_declaration,
    header_adapters,
    read_journal,
)


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
