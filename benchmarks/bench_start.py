"""How long ``MetricsCallback.on_run_start`` holds the training loop, with the README's sinks.

The README's default sinks (journal, console, TensorBoard, MLflow on an embedded ``sqlite:///`` file,
W&B offline), each repetition on a fresh ``out_dir`` (so MLflow creates its schema: the 12.5 s that
issue 15 measured when the trackers started on the training thread). Cases, by the callback's
``publisher`` mode:

- ``process`` (the default): the trackers start in the publisher process;
- ``thread``: they start on a follower thread of this process;
- ``inline``: they start on the calling thread (the mode ``export`` uses): ``on_run_start`` waits
  for every tracker, by design;
- baseline: the journal and the console alone (no tracker), measured in the same run.

Every repetition runs in a fresh Python process (as a trainer starts: nothing imported yet, so the
import of a vendor SDK on the calling thread counts).

Reported per case: the median and the worst time of the callback's construction and of
``on_run_start`` (what the training loop waits for), the ratio of the median ``on_run_start`` to the
baseline's, and, in the background modes, the time until the trackers were running (their run
handles reported), which the loop does not wait for. Each repetition then publishes one step and
closes (not timed), so nothing is left running.

    python benchmarks/bench_start.py            # 3 repetitions per case
    python benchmarks/bench_start.py --quick    # 1
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import redirect_stdout
from pathlib import Path

from _common import machine

from posttrain_metrics.callbacks import MetricsCallback

TRACKERS = [{"type": "tensorboard"}, {"type": "mlflow"},
            {"type": "wandb", "project": "bench-start", "mode": "offline", "settings": {"quiet": True}}]
BASE = [{"type": "journal"}, {"type": "console"}]


def one(mode: str, sinks: list[dict[str, object]], root: Path, index: int) -> tuple[float, float, float | None]:
    """(construction s, on_run_start s, s until the trackers were running or None)."""
    out = root / f"{mode}-{len(sinks)}-{index}"
    with redirect_stdout(io.StringIO()):  # the console's lines and any vendor banner: not the report's
        t0 = time.perf_counter()
        cb = MetricsCallback(adapters=["trainer"], sinks=sinks, out_dir=out, run_name=f"start-{mode}",
                             publisher=mode, close_timeout=300)
        t1 = time.perf_counter()
        cb.on_run_start({"lr": 1e-3, "seed": index})
        t2 = time.perf_counter()
        running: float | None = None
        wanted = {s["type"] for s in sinks} - {"journal", "console"}
        if mode != "inline" and wanted:
            deadline = t2 + 300
            while time.perf_counter() < deadline:
                if wanted <= set(cb.run_handles):
                    running = time.perf_counter() - t2
                    break
                time.sleep(0.05)
        cb.on_chunk_end({"grad_norm": 1.0, "update_outcome": "applied", "updates_applied": 1})
        cb.on_window_end(1)
        cb.on_run_end()
    return t1 - t0, t2 - t1, running


def fresh(mode: str, sinks: list[dict[str, object]], root: Path, index: int) -> tuple[float, float, float | None]:
    """:func:`one` in a fresh interpreter."""
    result = subprocess.run([sys.executable, __file__, "--one", json.dumps([mode, sinks, str(root), index])],
                            capture_output=True, text=True, timeout=900, check=False)
    if result.returncode:
        raise SystemExit(f"bench_start: {mode} failed:\n{result.stderr[-3000:]}")
    sys.stderr.write(result.stderr)  # vendor lines of the inline case: the runner's log, not the table
    build, start, running = json.loads(result.stdout.strip().splitlines()[-1])
    return build, start, running


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one repetition per case")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        mode, sinks, root, index = json.loads(args.one)
        print(json.dumps(one(mode, sinks, Path(root), index)))
        return 0
    repeat = 1 if args.quick else max(1, args.repeat)
    cases = [("baseline (journal + console)", "process", BASE), ("process (default)", "process", BASE + TRACKERS),
             ("thread", "thread", BASE + TRACKERS), ("inline", "inline", BASE + TRACKERS)]
    print("# on_run_start with the README's sinks\n")
    print(f"Machine: {machine()}; {repeat} repetition(s) per case, each on a fresh out_dir.\n")
    print("| case | construct median / max (ms) | on_run_start median / max (ms) | x baseline | trackers running after (s, median) |")
    print("|---|---|---|---|---|")
    baseline = None
    with tempfile.TemporaryDirectory(prefix="bench-start-") as tmp:
        for label, mode, sinks in cases:
            rows = [fresh(mode, sinks, Path(tmp), i) for i in range(repeat)]
            build = [r[0] * 1e3 for r in rows]
            start = [r[1] * 1e3 for r in rows]
            running = [r[2] for r in rows if r[2] is not None]
            median = statistics.median(start)
            baseline = median if baseline is None else baseline
            ratio = median / baseline if baseline > 0 else float("nan")
            after = f"{statistics.median(running):.1f}" if running else ("(waited in on_run_start)" if mode == "inline"
                                                                          else "-")
            print(f"| {label} | {statistics.median(build):.1f} / {max(build):.1f} | {median:.1f} / {max(start):.1f} "
                  f"| {ratio:.1f} | {after} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
