"""The sink contract (issue 26 item 2): one base class, ``Sink``, with no-op optional hooks.

Every sink of the package subclasses it; a plain object with the three methods is still accepted
(wrapped), and one that defines an optional hook without subclassing is refused with the fix, never
silently ignored. A sink keeps the options it was built with; a tracker sink is rebuilt from them in
the publisher process.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

import pytest

from posttrain_metrics import MetricsError
from posttrain_metrics.core.frame import Frame
from posttrain_metrics.integrations import MemorySink
from posttrain_metrics.integrations.base import Sink, as_sink
from posttrain_metrics.integrations.factory import SINK_TYPES, build_sink
from posttrain_metrics.journal import JournalSink
from posttrain_metrics.publication import Publisher


@pytest.mark.parametrize("kind", sorted(SINK_TYPES))
def test_every_sink_type_subclasses_sink(kind: str) -> None:
    module, name, _, _ = SINK_TYPES[kind]
    assert issubclass(getattr(importlib.import_module(module), name), Sink)


class Plain:
    name = "plain"
    stores_nonfinite = frozenset({"nan", "inf"})

    def __init__(self) -> None:
        self.frames: list[Frame] = []
        self.closes: list[bool] = []

    def start(self, run: Any) -> None:
        pass

    def write(self, frame: Frame) -> None:
        self.frames.append(frame)

    def close(self, *, failed: bool = False) -> None:
        self.closes.append(failed)


def test_a_plain_object_with_the_three_methods_is_wrapped_and_fed(tmp_path: Path) -> None:
    plain = Plain()
    pub = Publisher([JournalSink(tmp_path / "journal.jsonl"), plain], adapters="trainer", mode="inline")
    pub.start({})
    pub.publish(Frame(1, {"optim/grad_norm": 1.5}, "train", 1.0))
    pub.close(status="killed")
    assert [f.step for f in plain.frames] == [1] and plain.closes == [True]  # killed: a failed end
    assert pub.failures == {}


def test_a_plain_object_with_an_optional_hook_is_refused_with_the_fix() -> None:
    class Attaching(Plain):
        def attach(self, files: Any) -> None:
            pass

    with pytest.raises(MetricsError, match=r"defines \['attach'\] .* fix: class Attaching\(Sink\)"):
        as_sink(Attaching())
    with pytest.raises(MetricsError, match="a sink must be a mapping"):
        build_sink(object())  # type: ignore[arg-type]


def test_the_hooks_default_to_nothing_and_say_what_a_sink_takes() -> None:
    sink = MemorySink()
    assert sink.ready() and sink.held_points("r", "n", ["k"]) == {} and sink.run_handles() == {}
    assert sink.run_settings() == {} and sink.to_config() is None
    assert not sink.takes_samples and not sink.takes_files

    class Taker(MemorySink):
        def write_samples(self, samples: Any) -> None:
            pass

    assert Taker().takes_samples and not Taker().takes_files


def test_a_tracker_sink_keeps_the_options_it_was_built_with(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    from posttrain_metrics.integrations.tensorboard import TensorBoardSink

    sink = TensorBoardSink(log_dir="tb/{run_id}", flush=5)
    assert sink.options == {"log_dir": "tb/{run_id}", "flush": 5}
    assert sink.to_config() == {"type": "tensorboard", "log_dir": os.path.join(str(tmp_path), "tb/{run_id}"),
                                "flush": 5}
    built = build_sink({"type": "tensorboard", "flush": 3}, out_dir=tmp_path / "out")
    assert built.to_config() == {"type": "tensorboard", "flush": 3,
                                 "log_dir": str((tmp_path / "out").resolve() / "tensorboard/{name}-{run_id}")}
    assert JournalSink(tmp_path / "j.jsonl").to_config() is None  # written in the training process

    class Mine(TensorBoardSink):  # not what the factory builds: fed in the training process, as it is
        pass

    assert Mine(log_dir="tb").to_config() is None


def test_a_tracker_sink_built_directly_is_rebuilt_with_its_default_paths(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A path option left at its constructor default (MLflow's store in ``runs/``) goes into the config
    made absolute, as a given one does: the factory's own default (the working directory) would put the
    publisher process's store elsewhere than the same sink writes in the training process."""
    monkeypatch.chdir(tmp_path)
    from posttrain_metrics.integrations.mlflow import MlflowSink

    config = MlflowSink(experiment_name="e").to_config()
    assert config == {"type": "mlflow", "experiment_name": "e", "dir": os.path.join(str(tmp_path), "runs")}
    rebuilt = build_sink(config)
    assert isinstance(rebuilt, MlflowSink) and rebuilt.dir == tmp_path / "runs"



class FirstContract(Sink):
    """A subclass written to the first contract: ``close(*, failed=False)``, nothing else."""

    name = "first"

    def __init__(self) -> None:
        self.closes: list[bool] = []

    def start(self, run: Any) -> None:
        pass

    def write(self, frame: Frame) -> None:
        pass

    def close(self, *, failed: bool = False) -> None:  # type: ignore[override]  # the first contract
        self.closes.append(failed)


class Ending(Plain):
    """A plain object whose close takes the run's end as the package's sinks do."""

    name = "ending"

    def __init__(self) -> None:
        super().__init__()
        self.ends: list[tuple[bool, bool, str]] = []

    def close(self, *, failed: bool = False, killed: bool = False, reason: str = "") -> None:  # type: ignore[override]
        self.ends.append((failed, killed, reason))


@pytest.mark.parametrize("status", ["finished", "failed", "interrupted", "killed"])
def test_every_sink_is_closed_with_the_end_its_close_takes(tmp_path: Path, status: str) -> None:
    first, ending = FirstContract(), Ending()
    pub = Publisher([JournalSink(tmp_path / "journal.jsonl"), first, ending], adapters="trainer", mode="inline")
    pub.start({})
    pub.publish(Frame(1, {"optim/grad_norm": 1.5}, "train", 1.0))
    pub.close(status=status, reason="" if status == "finished" else "RuntimeError: boom")
    failed = status != "finished"
    assert pub.failures == {}
    assert first.closes == [failed]
    assert ending.ends == [(failed, status == "killed", "RuntimeError: boom" if failed else "")]



@pytest.mark.parametrize("hook", ["show_links", "write_finding"])
def test_a_plain_object_with_a_hook_of_the_closing_or_of_live_health_is_refused(hook: str) -> None:
    kind = type("Hooked", (Plain,), {hook: lambda self, arg: None})
    with pytest.raises(MetricsError, match=rf"defines \['{hook}'\] .* fix: class Hooked\(Sink\)"):
        as_sink(kind())


def test_every_optional_hook_of_the_base_class_is_refused_on_a_plain_object() -> None:
    """A hook added to :class:`Sink` and not to the list ``as_sink`` checks would be silently ignored on
    a plain object: each public method and setting of the base class but the three required is on it."""
    from posttrain_metrics.integrations import base

    defined = {name for name, value in vars(Sink).items() if not name.startswith("_")
               and (callable(value) or name in ("inline", "raw_frames"))}
    assert defined - {"start", "write", "close"} == set(base._HOOKS)
