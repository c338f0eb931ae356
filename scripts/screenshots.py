"""Retake the README's tracker screenshots from a demo run, in each tool's own default views.

    python scripts/screenshots.py runs/demo-<date>-<time>   # a run folder written by `posttrain-metrics demo`

Needs Chromium (Debian: `apt-get install chromium`) and `pip install playwright` (its Python driver
only: the browser is the system's). It starts a real TensorBoard and a real MLflow UI on
127.0.0.1 over the run's own files, opens each in headless Chromium at the page a user lands on
(the links the demo prints; no search box typed into), and writes docs/img/tensorboard.png,
docs/img/mlflow_overview.png and docs/img/mlflow.png. Paths are given relative to the run's parent folder, so no path of the capture
machine shows in TensorBoard's runs pane.

    python scripts/screenshots.py --health runs/health    # a run folder written by scripts/health_run.py

retakes docs/health.md's pictures of a live-health finding instead: MLflow's run page (its metrics
filtered to ``health/``, the ``health/kl_spike`` tag opened) as docs/img/health_mlflow.png,
TensorBoard's Text tab filtered to ``health`` as docs/img/health_tensorboard.png, and
docs/img/health_wandb.png, drawn with matplotlib from the offline W&B run read back from its
transaction log (the alert record, the summary's ``health/`` entry and end reason, the history
around the spike), as W&B's own UI needs the run synced to its server.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from posttrain_metrics.integrations.views import mlflow_link

ROOT = Path(__file__).resolve().parent.parent
IMG = ROOT / "docs" / "img"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]
HEALTH_EXPERIMENT = "posttrain-metrics-health"  # scripts/health_run.py's MLflow experiment
HEALTH_CHECK = "kl_spike"  # the finding it makes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def server(argv: list[str], url: str, cwd: Path, log: Path) -> Iterator[str]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(url, timeout=2).read(1)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"{argv[0]} did not come up at {url}; see {log}") from None
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        if proc.poll() is None:
            proc.kill()


def close_assistant(page: Any) -> None:
    """MLflow 3.17 opens its "Assistant" side panel on every page; closed, the charts get the width."""
    with contextlib.suppress(Exception):
        page.locator('[data-component-id="mlflow.assistant.chat_panel.close"]').first.click(timeout=3000)
        page.wait_for_timeout(1500)


@contextlib.contextmanager
def trackers(run: Path) -> Iterator[tuple[str, str]]:
    """A real TensorBoard and a real MLflow UI over ``run``'s own files: their base URLs."""
    parent, name = run.parent, run.name
    tb_port, ml_port = free_port(), free_port()
    bin_dir = Path(sys.executable).parent
    tensorboard = [str(bin_dir / "tensorboard"), "--logdir", f"{name}/tensorboard", "--host", "127.0.0.1",
                   "--port", str(tb_port)]
    mlflow = [str(bin_dir / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{name}/mlflow.db",
              "--host", "127.0.0.1", "--port", str(ml_port)]
    with (server(tensorboard, f"http://127.0.0.1:{tb_port}/", parent, Path("/tmp/screenshots-tb.log")) as tb,
          server(mlflow, f"http://127.0.0.1:{ml_port}/", parent, Path("/tmp/screenshots-mlflow.log")) as ml):
        yield tb, ml


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path, nargs="?", help="a run folder written by `posttrain-metrics demo`")
    parser.add_argument("--health", type=Path, metavar="RUN",
                        help="a run folder written by scripts/health_run.py: take docs/health.md's pictures")
    args = parser.parse_args()
    if args.health is not None:
        health_shots(args.health.resolve())
    if args.run is None:
        if args.health is None:
            parser.error("give a demo run folder, --health RUN, or both")
        return 0
    from playwright.sync_api import sync_playwright

    run = args.run.resolve()
    [tb_run] = [p for p in (run / "tensorboard").iterdir() if p.is_dir()]
    with trackers(run) as (tb, ml), sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        page = browser.new_page(viewport={"width": 1500, "height": 1060})
        # TensorBoard: the custom-scalars dashboard this package writes (its tab; nothing typed)
        page.goto(f"{tb}#custom_scalars")
        page.wait_for_timeout(8000)
        page.screenshot(path=str(IMG / "tensorboard.png"))
        # MLflow: the experiment page (it opens on the runs table: the experiment is tagged as model
        # training), then the run's page on its model-metrics tab
        from mlflow.tracking import MlflowClient

        client = MlflowClient(f"sqlite:///{run / 'mlflow.db'}")
        experiment = client.get_experiment_by_name("posttrain-metrics-demo")
        assert experiment is not None, "no posttrain-metrics-demo experiment in the run's store"
        # MLflow 3.17's UI picks an experiment's page by its global "GenAI / Model training" switch
        # (remembered per browser, GenAI at first), not by the experiment's kind tag: the link with
        # workflowType=machine_learning is the one that opens the runs table, and viewStateShareKey
        # its headline columns (the link the demo prints and the README gives).
        page.goto(mlflow_link(ml, experiment.experiment_id))
        page.wait_for_timeout(8000)
        close_assistant(page)
        page.screenshot(path=str(IMG / "mlflow_overview.png"))
        # its chart view, on the headline section of the same shared view (the run page's own
        # model-metrics tab opens on "optim" and keeps its layout in the browser only)
        page.goto(mlflow_link(ml, experiment.experiment_id, charts=True))
        page.wait_for_timeout(8000)
        close_assistant(page)
        page.screenshot(path=str(IMG / "mlflow.png"))
        browser.close()
    print(f"wrote {IMG / 'tensorboard.png'}, {IMG / 'mlflow_overview.png'}, {IMG / 'mlflow.png'} ({tb_run.name})")
    return 0


def health_shots(run: Path) -> None:
    """docs/health.md's pictures of the finding in each tracker (see the module's docstring)."""
    from mlflow.tracking import MlflowClient
    from playwright.sync_api import sync_playwright

    client = MlflowClient(f"sqlite:///{run / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(HEALTH_EXPERIMENT)
    assert experiment is not None, f"no {HEALTH_EXPERIMENT} experiment in the run's store"
    [ml_run] = client.search_runs([experiment.experiment_id])
    tag = f"health/{HEALTH_CHECK}"
    assert tag in ml_run.data.tags, f"the run has no {tag} tag: did the finding fire?"
    with trackers(run) as (tb, ml), sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        page = browser.new_page(viewport={"width": 1500, "height": 860})
        # TensorBoard: the Text tab, its tag filter on health (in the link: the finding's text entry first)
        page.goto(f"{tb}#text&tagFilter=health")
        page.wait_for_timeout(8000)
        page.screenshot(path=str(IMG / "health_tensorboard.png"))
        # MLflow: the run's page in the "Model training" view, its metrics filtered to health/ (the
        # 0/1 series of every check), and the finding's tag opened (its value is cut in the tag list);
        # the page is tall enough that the tag's dialog leaves the health/kl_spike row in view
        page.set_viewport_size({"width": 1500, "height": 1200})
        run_page = f"{ml}/#/experiments/{experiment.experiment_id}/runs/{ml_run.info.run_id}"
        page.goto(run_page)
        page.wait_for_timeout(6000)
        close_assistant(page)
        with contextlib.suppress(Exception):  # the UI's GenAI / Model training switch (the page's own click)
            page.get_by_text("Model training", exact=True).first.click(timeout=3000)
            page.wait_for_timeout(3000)
            page.goto(run_page)
            page.wait_for_timeout(6000)
        close_assistant(page)
        page.get_by_placeholder("Search metrics").fill("health/")
        page.wait_for_timeout(1500)
        page.locator(f'[role=status][title="{tag}"]').first.click()
        page.wait_for_timeout(2000)
        page.screenshot(path=str(IMG / "health_mlflow.png"))
        browser.close()
    draw_wandb_health(run, IMG / "health_wandb.png")
    print(f"wrote {IMG / 'health_tensorboard.png'}, {IMG / 'health_mlflow.png'}, {IMG / 'health_wandb.png'}")


def draw_wandb_health(run: Path, out: Path) -> None:
    """What the offline W&B run recorded of the finding, read back from its transaction log: the alert
    record (title, level, text), the summary's ``health/<check>`` entry and end reason, and the history
    of the finding's keys with the alert's step marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator
    from matplotlib.transforms import Bbox

    from posttrain_metrics.integrations.wandb_reader import read_offline_run

    wb = read_offline_run(run / "wandb")
    alerts = [r.alert for r in wb.records if r.WhichOneof("record_type") == "alert"]
    assert alerts, f"{wb.path}: no alert record"
    entry = wb.summary[f"health/{HEALTH_CHECK}"]
    step = int(entry["step"])
    last = max(int(row["trainer/step"]) for row in wb.history)
    fig = plt.figure(figsize=(13, 8.8), dpi=100)
    grid = fig.add_gridspec(3, 2, height_ratios=[1.0, 0.6, 0.55], hspace=0.42, wspace=0.18,
                            left=0.06, right=0.97, top=0.87, bottom=0.03)
    fig.suptitle(f"W&B offline run {wb.run.display_name}  ({wb.run.project} / {wb.run.run_id})",
                 fontsize=14, fontweight="bold")
    fig.text(0.5, 0.92, f"read back from the offline W&B run's transaction log ({wb.path.name}): "
             f"{len(alerts)} alert record(s), {len(wb.history)} history rows keyed by trainer/step, "
             f"exit code {wb.exit_code}", ha="center", color="0.35", fontsize=10)
    for col, (title, keys, log) in enumerate((("KL to reference (history)", ["train/kl_max", "train/kl_mean"], True),
                                              ("Gradient norm (history)", ["train/grad_norm"], False))):
        ax = fig.add_subplot(grid[0, col])
        for key, colour in zip(keys, ("tab:red", "tab:green")):
            series = sorted(wb.column(key).items())
            ax.plot([s for s, _ in series], [v for _, v in series], marker=".", color=colour, label=key)
        ax.axvline(step, color="tab:orange", linestyle="--", linewidth=1.5, label=f"alert: step {step}")
        ax.set_yscale("log" if log else "linear")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(f"{title}; the run stopped after step {last}", loc="left", fontsize=11)
        ax.set_xlabel("trainer/step")
        ax.legend(loc="upper left", fontsize=9)
    alert = alerts[0]  # its level, title and text, as the record holds them
    ax = fig.add_subplot(grid[1, :])
    ax.axis("off")
    ax.set_title("Alert (run.alert, the record wandb sync sends)", loc="left", fontsize=11)
    body = "\n".join(textwrap.fill(par, 136) if par else "" for par in alert.text.split("\n"))
    ax.text(0.0, 0.93, f"[{alert.level}]  {alert.title}", fontsize=12, fontweight="bold", va="top",
            transform=ax.transAxes, color="#8a5a00",
            bbox={"boxstyle": "round,pad=0.6", "facecolor": "#fff4d6", "edgecolor": "#e0a800"})
    ax.text(0.0, 0.58, body, fontsize=9.5, va="top", transform=ax.transAxes, family="monospace",
            bbox={"boxstyle": "round,pad=0.6", "facecolor": "#fbfbfb", "edgecolor": "0.8"})
    ax = fig.add_subplot(grid[2, :])
    ax.axis("off")
    ax.set_title(f"Summary: health/{HEALTH_CHECK} and the run's end", loc="left", fontsize=11)
    rows = [[f"health/{HEALTH_CHECK}.{field}", textwrap.shorten(str(entry[field]), 120)]
            for field in ("severity", "step", "action", "steps")]
    for key in ("posttrain_metrics/status", "posttrain_metrics/end_reason"):
        rows.append([key, textwrap.shorten(str(wb.summary.get(key)), 120)])
    table = ax.table(cellText=rows, colLabels=["summary key", "value"], colWidths=[0.24, 0.76],
                     bbox=Bbox.from_bounds(0.0, 0.0, 1.0, 0.96), cellLoc="left", colLoc="left")
    table.auto_set_font_size(False)
    table.set_fontsize(9.5)
    for (r, _), cell in table.get_celld().items():
        cell.set_edgecolor("0.8")
        cell.PAD = 0.02
        if r == 0:
            cell.set_facecolor("#eef1f5")
            cell.set_text_props(fontweight="bold")
    fig.savefig(out)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
