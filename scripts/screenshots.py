"""Retake the README's tracker screenshots from a demo run, in each tool's own default views.

    python scripts/screenshots.py runs/demo-<date>-<time>   # a run folder written by `posttrain-metrics demo`

Needs Chromium (Debian: `apt-get install chromium`) and `pip install playwright` (its Python driver
only: the browser is the system's). It starts a real TensorBoard and a real MLflow UI on
127.0.0.1 over the run's own files, opens each in headless Chromium at the page a user lands on
(the links the demo prints; no search box typed into), and writes docs/img/tensorboard.png,
docs/img/mlflow_overview.png and docs/img/mlflow.png. Paths are given relative to the run's parent folder, so no path of the capture
machine shows in TensorBoard's runs pane.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path, help="a run folder written by `posttrain-metrics demo`")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    run = args.run.resolve()
    parent, name = run.parent, run.name
    [tb_run] = [p for p in (run / "tensorboard").iterdir() if p.is_dir()]
    tb_port, ml_port = free_port(), free_port()
    bin_dir = Path(sys.executable).parent
    tensorboard = [str(bin_dir / "tensorboard"), "--logdir", f"{name}/tensorboard", "--host", "127.0.0.1",
                   "--port", str(tb_port)]
    mlflow = [str(bin_dir / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{name}/mlflow.db",
              "--host", "127.0.0.1", "--port", str(ml_port)]
    with (server(tensorboard, f"http://127.0.0.1:{tb_port}/", parent, Path("/tmp/screenshots-tb.log")) as tb,
          server(mlflow, f"http://127.0.0.1:{ml_port}/", parent, Path("/tmp/screenshots-mlflow.log")) as ml,
          sync_playwright() as p):
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


if __name__ == "__main__":
    raise SystemExit(main())
