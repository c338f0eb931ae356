"""The dashboard PNG: produced for GRPO, PPO and DPO journals, a valid PNG of a sensible size, with
findings and non-finite points drawn; clear errors without matplotlib or with a non-PNG name."""

from __future__ import annotations

import dataclasses
import math
import struct
import sys
import tracemalloc
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _runs import GRPO_ADAPTERS, dpo_run, grpo_run, nonfinite_frame, ppo_run

from posttrain_metrics import Frame, MetricsError
from posttrain_metrics.cli import main
from posttrain_metrics.doctor import Finding, Severity, run_checks
from posttrain_metrics.journal import Journal, JournalSink, read_journal
from posttrain_metrics.plot import BUCKETS, _Data, dashboard
from posttrain_metrics.publication import Publisher

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def journal_of(
    path: Path, frames: Iterable[Frame], adapters: object, config: dict[str, object] | None = None
) -> Journal:
    pub = Publisher([JournalSink(path)], adapters=adapters, run_name="plot-test", run_id="abc123")
    pub.start(config if config is not None else {"rl": {"n_mini": 2}, "rollout": {"max_tokens": 16}})
    for frame in frames:
        pub.publish(frame)
    pub.close()
    return read_journal(path)


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from the IHDR chunk, after checking the signature."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, "not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def check_png(path: Path) -> tuple[int, int]:
    import matplotlib.image

    width, height = png_size(path)
    assert width == 1500 and 500 <= height <= 6000, (width, height)
    pixels = matplotlib.image.imread(path)
    assert pixels.shape[:2] == (height, width)
    assert pixels[..., :3].std() > 0.05  # something was drawn, not a blank page
    assert 30_000 < path.stat().st_size < 5_000_000
    return width, height


def test_grpo_dashboard(tmp_path):
    journal = journal_of(tmp_path / "j.jsonl", grpo_run(steps=40), GRPO_ADAPTERS)
    out = dashboard(journal, run_checks(journal), tmp_path / "dash.png")
    assert out == tmp_path / "dash.png"
    check_png(out)


def test_grpo_dashboard_with_findings_and_non_finite_points(tmp_path, monkeypatch):
    frames = grpo_run(steps=20)
    changed = []
    for frame in frames:
        metrics = dict(frame.metrics)
        if frame.step in (8, 9):
            metrics.update({"optim/update_outcome": "skipped", "optim/skip_reason": "nonfinite_gradient",
                            "train/grad_norm": math.inf, "optim/nonfinite_skips_total": frame.step - 7})
        changed.append(Frame(frame.step, metrics, frame.phase, frame.wall_time))
    journal = journal_of(tmp_path / "j.jsonl", [*changed, nonfinite_frame(21)], GRPO_ADAPTERS,
                         config={"rl": {"n_mini": 1}})
    findings = run_checks(journal)
    assert {f.severity for f in findings} >= {Severity.ERROR, Severity.WARNING}
    saved = drawn_figure(monkeypatch)
    check_png(dashboard(journal, findings, tmp_path / "sick.png"))
    [figure] = saved
    axes = {ax.get_title(loc="left"): ax for ax in figure.axes if ax.get_title(loc="left")}
    # the doctor's findings, whatever they are, each get a row and their bars in the findings strip
    strip = axes["Doctor findings (where they fire)"]
    marked = [f for f in findings if f.steps]
    assert [t.get_text() for t in strip.get_yticklabels()] == [f"{f.severity.value}: {f.check}" for f in marked]
    assert len(spans(strip)) >= len(marked)
    # the skips at steps 8-9 made grad_norm infinite: its panel is shaded there (and x-marked)
    assert (7.5, 2.0) in [(x, w) for x, w, _, _ in spans(axes["Gradient norm (pre-clip)"])]


def drawn_figure(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Capture the figure ``dashboard`` saves, to inspect what it drew (the PNG alone cannot say)."""
    import matplotlib.figure

    saved: list[object] = []
    real = matplotlib.figure.Figure.savefig

    def savefig(self, *args, **kwargs):
        saved.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    return saved


def spans(ax) -> list[tuple[float, float, str, float]]:
    """Shaded step spans on an axis: (first step - 0.5, width, colour, alpha)."""
    from matplotlib.colors import to_hex
    from matplotlib.patches import Rectangle

    return [(float(p.get_x()), float(p.get_width()), to_hex(p.get_facecolor()), round(p.get_facecolor()[3], 2))
            for p in ax.patches if isinstance(p, Rectangle)]


RED, ORANGE, BLUE = "#d62728", "#ff7f0e", "#1f77b4"  # error, warning, info


def test_findings_are_marked_on_the_panels_that_show_their_keys(tmp_path, monkeypatch):
    frames = grpo_run(steps=20)
    changed = []
    for frame in frames:
        metrics = dict(frame.metrics)
        if frame.step in (8, 9):
            metrics.update({"optim/update_outcome": "skipped", "train/grad_norm": math.inf})
        changed.append(Frame(frame.step, metrics, frame.phase, frame.wall_time))
    journal = journal_of(tmp_path / "j.jsonl", changed, GRPO_ADAPTERS)
    # findings written by hand (not by the doctor): where each one fires and which keys it is about
    findings = [
        Finding("skipped_twice", Severity.ERROR, (8, 9), "two skips", "look", ("train/grad_norm",)),
        Finding("kl_spike", Severity.WARNING, (12, 13, 14, 18), "a spike", "look", ("train/kl_max",)),
        Finding("one_skip", Severity.INFO, (3,), "a zero-gradient skip", "none",
                ("train/grpo_informative_group_count",)),
        Finding("run_level", Severity.WARNING, (), "no steps: listed, not marked", "none", ("train/kl_max",)),
    ]
    saved = drawn_figure(monkeypatch)
    dashboard(journal, findings, tmp_path / "marked.png")
    [figure] = saved
    axes = {ax.get_title(loc="left"): ax for ax in figure.axes if ax.get_title(loc="left")}
    # steps 8-9 -> one span from 7.5, 2 steps wide; 12-14 and 18 -> two spans; 3 -> one span
    assert spans(axes["Gradient norm (pre-clip)"]) == [(7.5, 2.0, RED, 0.16)]
    assert spans(axes["KL to reference"]) == [(11.5, 3.0, ORANGE, 0.16), (17.5, 1.0, ORANGE, 0.16)]
    assert spans(axes["Groups (GRPO)"]) == [(2.5, 1.0, BLUE, 0.08)]
    for title in ("Reward", "Loss", "Clipping and importance ratio", "Learning rate"):
        assert spans(axes[title]) == [], title  # about none of these panels' keys
    # the findings strip: one row per finding that has steps, bars where it fires
    strip = axes["Doctor findings (where they fire)"]
    assert [t.get_text() for t in strip.get_yticklabels()] == [
        "error: skipped_twice", "warning: kl_spike", "info: one_skip"]
    assert sorted((x, w, c) for x, w, c, _ in spans(strip)) == [
        (2.5, 1.0, BLUE), (7.5, 2.0, RED), (11.5, 3.0, ORANGE), (17.5, 1.0, ORANGE)]
    # the grad_norm panel marks its two infinite points with a red x at steps 8 and 9
    marks = [line for line in axes["Gradient norm (pre-clip)"].get_lines() if line.get_marker() == "x"]
    assert [list(line.get_xdata()) for line in marks] == [[8, 9]]
    # every finding is listed in the text under the strip, the run-level one too
    text = " ".join(t.get_text() for ax in figure.axes for t in ax.texts)
    for needle in ("ERROR skipped_twice (steps 8-9)", "WARNING kl_spike (steps 12-14, 18)",
                   "INFO one_skip (steps 3)", "WARNING run_level: no steps"):
        assert needle in text, needle


def test_ppo_dashboard(tmp_path):
    journal = journal_of(tmp_path / "j.jsonl", ppo_run(steps=10, warmup=3), "ppo", config={})
    check_png(dashboard(journal, run_checks(journal), tmp_path / "ppo.png"))


def test_dpo_dashboard_with_val_frames(tmp_path):
    journal = journal_of(tmp_path / "j.jsonl", dpo_run(steps=6), "dpo", config={})
    check_png(dashboard(journal, run_checks(journal), tmp_path / "dpo.png"))


def test_dashboard_of_an_empty_run_and_an_unregistered_adapter(tmp_path):
    journal = journal_of(tmp_path / "j.jsonl", [], GRPO_ADAPTERS, config={})
    journal.header["adapters"] = [*journal.adapters, "not_registered_here"]
    png_size(dashboard(journal, run_checks(journal), tmp_path / "empty.png"))


def test_cli_plot_writes_the_png(tmp_path, capsys):
    journal_of(tmp_path / "j.jsonl", grpo_run(steps=8), GRPO_ADAPTERS)
    out = tmp_path / "sub" / "dash.png"
    assert main(["plot", str(tmp_path / "j.jsonl"), "-o", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    check_png(out)


def test_non_png_output_is_a_clear_error(tmp_path, capsys):
    journal_of(tmp_path / "j.jsonl", grpo_run(steps=2), GRPO_ADAPTERS)
    assert main(["plot", str(tmp_path / "j.jsonl"), "-o", str(tmp_path / "dash.pdf")]) == 2
    assert "FILE.png" in capsys.readouterr().err


def test_missing_matplotlib_names_the_extra(tmp_path, monkeypatch):
    journal = journal_of(tmp_path / "j.jsonl", grpo_run(steps=2), GRPO_ADAPTERS)
    for module in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, module, None)  # import of it raises ImportError
    with pytest.raises(MetricsError, match=r"pip install 'posttrain-metrics\[plot\]'"):
        dashboard(journal, [], tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_a_long_run_draws_bounded_points_that_keep_every_spike(tmp_path, monkeypatch):
    # 10,000 steps (more than four points per bucket of the page): each curve is drawn from a bounded
    # number of points, yet its first and last step, its spike and its dip, a step written twice (with
    # its last value), the mean +- std band and a label that occurs twice all stay on the page.
    header = {"format": "posttrain-metrics-journal", "version": 1, "kind": "header", "run_id": "long01",
              "name": "long", "created": 1.7e9, "adapters": list(GRPO_ADAPTERS), "config": {}}
    frames = []
    for step in range(1, 10_001):
        grad = 500.0 if step == 7777 else 0.001 if step == 4242 else 1.0 + (step % 7) * 0.01
        # a spike of the mean and one of the std, each inside a bucket of 10 steps (not its first or last)
        mean = 9.0 if step == 9005 else 0.5 + (step % 5) * 0.01
        frames.append(Frame(step, {"train/grad_norm": grad, "train/reward_mean": mean,
                                   "train/reward_std": 5.0 if step == 2505 else 0.1, "optim/update_outcome":
                                   "skipped" if step in (3333, 3334) else "applied"}, "train", 1.7e9 + step))
        if step == 5000:  # a resumed run wrote step 5000 again: the last value is the one drawn
            frames.append(Frame(5000, {**frames[-1].metrics, "train/grad_norm": 3.0}, "train", 1.7e9 + step))
    journal = Journal(tmp_path / "j.jsonl", header, frames, {"kind": "end", "status": "finished"}, [])
    saved = drawn_figure(monkeypatch)
    check_png(dashboard(journal, [], tmp_path / "long.png"))
    [figure] = saved
    axes = {ax.get_title(loc="left"): ax for ax in figure.axes if ax.get_title(loc="left")}
    [line] = [x for x in axes["Gradient norm (pre-clip)"].get_lines() if x.get_marker() != "x"]
    points = dict(zip(line.get_xdata().tolist(), line.get_ydata().tolist()))
    assert 1000 <= len(points) <= 4000, len(points)
    assert points[7777] == 500.0 and points[4242] == 0.001 and points[5000] == 3.0
    assert min(points) == 1 and max(points) == 10_000
    assert all(value == 1.0 + (step % 7) * 0.01 for step, value in points.items() if step not in (7777, 4242, 5000))
    [band] = axes["Reward"].collections
    vertices = {(round(float(x)), round(float(y), 9)) for x, y in band.get_paths()[0].vertices}
    assert len(vertices) >= 2 * 1000  # mean +- std at a thousand steps or more
    assert (9005, 9.1) in vertices and (9005, 8.9) in vertices  # the mean's spike, in the band
    assert (2505, 5.5) in vertices and (2505, -4.5) in vertices  # the std's spike (mean 0.5 at 2505)
    strip = axes["Label keys (one row per label)"]
    rows = {t.get_text(): i for i, t in enumerate(strip.get_yticklabels())}
    marked = {round(y): sorted(float(x) for x, yy in c.get_offsets() if round(yy) == round(y))
              for c in strip.collections for _, y in c.get_offsets()[:1]}
    assert marked[rows["update_outcome: skipped"]] == [3333.0]  # both skips fall in one bucket of 10 steps
    assert 900 <= len(marked[rows["update_outcome: applied"]]) <= 1000


NOISE = [(((j * 7919 + 1) * 2_654_435_761) % 2**32) / 2**32 for j in range(4099)]
"""Distinct values in [0, 1) that look random: the generated runs' values, made once (a run made on
the fly allocates little, so that what is measured is what reads it)."""


class GeneratedFrames:
    """A run's frames made on the fly, as a journal re-read from disk on each pass gives them: sized and
    iterable again and again, never indexable, held in no list; counts how often it is iterated.

    At steps ``first``, ``first + stride``, ... (``steps`` of them): ``keys - 3`` numeric keys
    ``train/k00``, ``train/k01``, ..., each with a spike (over 1000) and a dip (under -1000) every few
    thousand steps at steps of its own, the reward band ``train/reward_mean`` and ``train/reward_std``
    (spiking too) and a label key; ``train/k00`` is NaN at every ``nan_every``-th step. ``rewrite`` maps a step to metrics written again right after it
    (a resumed run replaying it); ``spikes`` maps a step to values written instead of the generated."""

    def __init__(self, steps: int, *, keys: int = 20, first: int = 1, stride: int = 1,
                 rewrite: dict[int, dict[str, Any]] | None = None,
                 spikes: dict[int, dict[str, Any]] | None = None, nan_every: int = 0) -> None:
        self.steps, self.first, self.stride, self.nan_every = steps, first, stride, nan_every
        self.names = [f"train/k{i:02d}" for i in range(keys - 3)] + ["train/reward_mean", "train/reward_std"]
        self.rewrite = rewrite or {}
        self.spikes: dict[int, dict[str, Any]] = {}
        for i, key in enumerate(self.names):
            for n in range(17 * i + 5, steps, 9973):
                self.spikes.setdefault(first + n * stride, {})[key] = 1000.0 + i + n / steps
            for n in range(13 * i + 3, steps, 7919):
                self.spikes.setdefault(first + n * stride, {})[key] = -1000.0 - i - n / steps
        for step, values in (spikes or {}).items():
            self.spikes.setdefault(step, {}).update(values)
        self.iterations = 0

    def __len__(self) -> int:
        return self.steps + len(self.rewrite)

    def __iter__(self) -> Iterator[Frame]:
        self.iterations += 1
        for step in range(self.first, self.first + self.steps * self.stride, self.stride):
            yield Frame(step, self.metrics(step))
            if step in self.rewrite:
                yield Frame(step, {**self.metrics(step), **self.rewrite[step]})

    def metrics(self, step: int) -> dict[str, Any]:
        at = step % (len(NOISE) - len(self.names))
        out: dict[str, Any] = dict(zip(self.names, NOISE[at : at + len(self.names)]))
        if step in self.spikes:
            out.update(self.spikes[step])
        if self.nan_every and step % self.nan_every == 0:
            out["train/k00"] = math.nan
        out["optim/update_outcome"] = "skipped" if step % 997 == 0 else "applied"
        return out


@dataclasses.dataclass
class RunLike:
    """What the dashboard reads of a journal, over generated frames."""

    frames: GeneratedFrames
    path: Path = Path("generated.jsonl")
    header: dict[str, Any] = dataclasses.field(default_factory=lambda: {"name": "generated"})
    end: dict[str, Any] | None = None
    warnings: list[str] = dataclasses.field(default_factory=list)
    run_id: str = "gen01"
    adapters: list[str] = dataclasses.field(default_factory=lambda: list(GRPO_ADAPTERS))
    config: dict[str, Any] = dataclasses.field(default_factory=dict)


def peak_bytes_reading(steps: int) -> int:
    """The peak of Python's allocations while the dashboard's data of a generated run is read."""
    run = RunLike(GeneratedFrames(steps, keys=10))
    tracemalloc.start()
    try:
        _Data(run)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert run.frames.iterations <= 2  # a journal re-read from disk on each pass: twice at most
    return peak


def test_the_dashboards_data_takes_memory_bounded_whatever_the_runs_length():
    # The record at close draws the dashboard in the long-running publisher: reading four times the
    # steps must not take more memory. Measured (Python 3.11): 6.1 MB and 6.6 MB (the longer run's
    # buckets keep a few more points); reading every point took 8.8 MB and 21.3 MB.
    _Data(RunLike(GeneratedFrames(5000, keys=10)))  # imports done before measuring
    short, long = peak_bytes_reading(10_000), peak_bytes_reading(40_000)
    assert long - short < 1_000_000, (short, long)
    assert long < 12_000_000, long



@pytest.mark.parametrize("steps", [2_000, 12_000])
def test_a_long_runs_nonfinite_points_are_marked_once_per_bucket(steps):
    # A key NaN at every other step: each NaN is marked in a short run; in a long one, the first of
    # each bucket (computed here by hand from the documented formula), not one mark per step.
    data = _Data(RunLike(GeneratedFrames(steps, keys=6, nan_every=2)))
    nan_steps = list(range(2, steps + 1, 2))
    if len(nan_steps) <= 4 * BUCKETS:
        assert data.nonfinite["train/k00"] == nan_steps
        return
    firsts: dict[int, int] = {}
    for step in nan_steps:
        firsts.setdefault((step - 1) * BUCKETS // steps, step)  # lo = 1, hi = steps
    assert len(firsts) == BUCKETS
    assert data.nonfinite["train/k00"] == sorted(firsts.values())

def test_the_dashboard_reads_frames_it_cannot_index(tmp_path):
    run = RunLike(GeneratedFrames(6000, keys=8, first=11, stride=2))
    check_png(dashboard(run, [], tmp_path / "generated.png"))
    assert run.frames.iterations <= 2


def by_bucket(points: Iterable[tuple[int, float]], lo: int, hi: int) -> dict[int, list[tuple[int, float]]]:
    """Points by bucket of the steps lo-hi, as plot.BUCKETS's docstring states the buckets."""
    out: dict[int, list[tuple[int, float]]] = {}
    for step, value in points:
        out.setdefault((step - lo) * BUCKETS // (hi - lo + 1), []).append((step, value))
    return out


def test_a_long_series_keeps_each_buckets_first_last_lowest_and_highest_point():
    # 4*BUCKETS + 1 points and more: 12,345 steps from 7, every 3 steps (buckets of 37 steps, not a
    # multiple of the stride): the points kept are generated points, and they hold the whole series'
    # extremes, its first and last step, and each bucket's first, last, lowest and highest point; the
    # label key keeps the first point of each label in each bucket.
    source = GeneratedFrames(12_345, keys=6, first=7, stride=3)
    data = _Data(RunLike(source))
    lo, hi = 7, 7 + 12_344 * 3
    for key in ("train/k00", "train/k02", "train/reward_mean"):
        everything = [(frame.step, frame.metrics[key]) for frame in source]
        kept = data.numeric[key]
        assert kept == sorted(set(kept)) and set(kept) <= set(everything)
        assert len(kept) <= (8 if key == "train/reward_mean" else 4) * BUCKETS  # a band's: either's steps
        assert max(everything, key=lambda p: p[1]) in kept and max(everything, key=lambda p: p[1])[1] > 999
        assert min(everything, key=lambda p: p[1]) in kept and min(everything, key=lambda p: p[1])[1] < -999
        assert kept[0] == everything[0] and kept[-1] == everything[-1]
        buckets = by_bucket(everything, lo, hi)
        assert len(buckets) == BUCKETS
        kept_by_bucket = by_bucket(kept, lo, hi)
        for bucket, points in buckets.items():
            ends = {points[0], points[-1], max(points, key=lambda p: p[1]), min(points, key=lambda p: p[1])}
            assert ends <= set(kept_by_bucket[bucket]), (key, bucket)
            if key != "train/reward_mean":
                assert len(kept_by_bucket[bucket]) == len(ends), (key, bucket)
    # the label key: the first point of each label in each bucket
    firsts: dict[tuple[int, str], int] = {}
    for frame in source:
        label = frame.metrics["optim/update_outcome"]
        firsts.setdefault(((frame.step - lo) * BUCKETS // (hi - lo + 1), label), frame.step)
    assert data.labels["optim/update_outcome"] == sorted((step, label) for (_, label), step in firsts.items())
    skips = sum(frame.metrics["optim/update_outcome"] == "skipped" for frame in source)
    assert skips > 10 and sum(label == "skipped" for _, label in data.labels["optim/update_outcome"]) == skips


def test_a_long_band_keeps_the_steps_either_series_kept():
    # The mean's and the std's spikes fall at different steps, inside buckets: each series keeps the
    # other's spike step too, with its own value there, so the band is drawn at both spikes.
    source = GeneratedFrames(10_000, keys=4)
    data = _Data(RunLike(source))
    mean, std = dict(data.numeric["train/reward_mean"]), dict(data.numeric["train/reward_std"])
    assert len(mean) <= 4 * BUCKETS * 2 and set(mean) == set(std)
    spikes = {frame.step for frame in source
              if abs(frame.metrics["train/reward_mean"]) > 999 or abs(frame.metrics["train/reward_std"]) > 999}
    assert len(spikes) >= 4
    for frame in source:
        if frame.step in spikes:
            assert mean[frame.step] == frame.metrics["train/reward_mean"]
            assert std[frame.step] == frame.metrics["train/reward_std"]


@pytest.mark.parametrize("steps", [50, 9000])
def test_a_step_written_twice_is_drawn_once_with_its_last_value(steps):
    # A resumed run wrote step 40 again (its first value was the run's top, the second its bottom),
    # and its label; the last value is the one drawn, in a short run (every point) as in a long one.
    rewrite = {40: {"train/k00": -5000.0, "train/k01": 0.25, "optim/update_outcome": "discarded"}}
    source = GeneratedFrames(steps, keys=5, rewrite=rewrite, spikes={40: {"train/k00": 5000.0}})
    data = _Data(RunLike(source))
    k00 = data.numeric["train/k00"]
    assert [p for p in k00 if p[0] == 40] == [(40, -5000.0)] and max(v for _, v in k00) < 5000
    assert [s for s, _ in k00] == sorted({s for s, _ in k00})  # each step once
    if steps <= 4 * BUCKETS:  # every point, the last of step 40
        written = {frame.step: frame.metrics["train/k01"] for frame in source}
        assert data.numeric["train/k01"] == sorted(written.items()) and written[40] == 0.25
    assert [label for step, label in data.labels["optim/update_outcome"] if step == 40] == ["discarded"]
    assert data.first_step == 1 and data.last_step == steps


def _short_journal(path: Path, rows: list[dict[str, float]]) -> Journal:
    header = {"format": "posttrain-metrics-journal", "version": 1, "kind": "header", "run_id": "short01",
              "name": "short", "created": 1.7e9, "adapters": list(GRPO_ADAPTERS), "config": {}}
    frames = [Frame(step, metrics, "train", 1.7e9 + step) for step, metrics in enumerate(rows, 1)]
    return Journal(path, header, frames, {"kind": "end", "status": "finished"}, [])


def test_the_reward_band_stays_within_the_rewards_logged_range(tmp_path, monkeypatch):
    # a 0/1 reward: mean 0.5, std 0.7 would draw a band from -0.2 to 1.2, values no sample had;
    # at step 3 the logged range is 0.25..0.75 (mean 0.5 +- 0.1 fits inside it: kept as is)
    rows = [{"train/reward_mean": 0.5, "train/reward_std": 0.7, "train/reward_min": 0.0, "train/reward_max": 1.0},
            {"train/reward_mean": 0.5, "train/reward_std": 0.7, "train/reward_min": 0.0, "train/reward_max": 1.0},
            {"train/reward_mean": 0.5, "train/reward_std": 0.1, "train/reward_min": 0.25, "train/reward_max": 0.75}]
    saved = drawn_figure(monkeypatch)
    assert dashboard(_short_journal(tmp_path / "j.jsonl", rows), [], tmp_path / "band.png").is_file()
    [figure] = saved
    [reward] = [ax for ax in figure.axes if ax.get_title(loc="left") == "Reward"]
    [band] = reward.collections
    vertices = {(round(float(x)), round(float(y), 9)) for x, y in band.get_paths()[0].vertices}
    assert {(1, 0.0), (1, 1.0), (2, 0.0), (2, 1.0), (3, 0.4), (3, 0.6)} <= vertices
    assert all(0.0 <= y <= 1.0 for _, y in vertices)


def test_a_long_finding_is_written_whole_within_the_page(tmp_path, monkeypatch):
    explanation = " ".join(f"word{i:03d}" for i in range(80))  # 639 characters
    finding = Finding("long_check", Severity.WARNING, (), explanation, "read it")
    rows = [{"train/reward_mean": 0.5, "train/grad_norm": 1.0}] * 3
    saved = drawn_figure(monkeypatch)
    assert dashboard(_short_journal(tmp_path / "j.jsonl", rows), [finding], tmp_path / "long.png").is_file()
    [figure] = saved
    texts = [t for t in figure.axes[-1].texts]
    assert " ".join(t.get_text().strip() for t in texts) == f"WARNING long_check: {explanation}"  # nothing cut
    renderer = figure.canvas.get_renderer()
    page = figure.bbox
    assert all(page.x0 <= t.get_window_extent(renderer).x0 and t.get_window_extent(renderer).x1 <= page.x1
               for t in texts)
