"""The dashboard PNG: produced for GRPO, PPO and DPO journals, a valid PNG of a sensible size, with
findings and non-finite points drawn; clear errors without matplotlib or with a non-PNG name."""

from __future__ import annotations

import math
import struct
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest
from _runs import GRPO_ADAPTERS, dpo_run, grpo_run, nonfinite_frame, ppo_run

from posttrain_metrics import Frame, MetricsError
from posttrain_metrics.cli import main
from posttrain_metrics.doctor import Finding, Severity, run_checks
from posttrain_metrics.journal import Journal, JournalSink, read_journal
from posttrain_metrics.plot import dashboard
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
