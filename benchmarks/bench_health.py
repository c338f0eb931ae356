"""What live health costs: the training step with and without it, and the publisher's CPU per frame.

1. Training-thread overhead. One process, one rank; each step is a fixed amount of torch work
   (``--work-ms`` of 256x256 matmuls on one torch thread) plus what a trainer does per optimizer step
   through ``MetricsCallback``: ``on_chunk_end`` x4 (``_common.full_chunk``: grpo + reward + trainer,
   K = 61 keys) and ``on_window_end``. Sinks: the README's defaults (journal, console to /dev/null,
   TensorBoard, MLflow on an embedded SQLite store; ``--wandb`` adds W&B offline), the trackers fed by
   the publisher process. Two runs live side by side, one without ``health`` and one with
   ``health: {kl_spike: stop, default: warn}``, stepped in alternating blocks of ``--block`` steps so
   that both see the same machine load (``--rounds`` pairs of ``--steps`` steps); reported: the median
   step and the median metrics section (chunks + window end) of each, and their ratios. With live health the training thread reads one
   attribute per step (the reducer's ``stop_request``); the watcher thread stats one file every 0.1 s.

2. The publisher's CPU per frame for the checks: ``LiveHealth`` over a journal of ``--frames`` frames
   (61 keys, healthy, so every check is watched at every frame: the worst case), the thread CPU of
   the checks alone (``LiveHealth.seconds``) and of reading + parsing + checking, per frame.

    python benchmarks/bench_health.py            # about 2 minutes
    python benchmarks/bench_health.py --quick
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from _common import GRPO_ADAPTERS, load, machine, make_windows, reduced_frames

from posttrain_metrics.callbacks import MetricsCallback
from posttrain_metrics.journal import JournalSink
from posttrain_metrics.publication import Publisher
from posttrain_metrics.publication.health import LiveHealth, parse_health

HEALTH = {"kl_spike": "stop", "default": "warn"}
CONFIG = {"rl": {"n_mini": 2}, "rollout": {"max_tokens": 16}}


def calibrate(work_ms: float) -> int:
    a = torch.randn(256, 256)
    for _ in range(5):
        a @ a
    t = time.perf_counter()
    for _ in range(50):
        a @ a
    per = (time.perf_counter() - t) / 50
    return max(1, round(work_ms / 1000 / per))


def run(out: Path, steps: int, reps: int, wandb: bool, block: int) -> dict[str, dict[str, list[float]]]:
    """Two runs side by side, without and with live health, in alternating blocks of ``block`` steps
    (both publishers live all along, so both see the same machine load): per run, the whole step and
    the metrics section (the chunks + the window's end) alone."""
    sinks: list[dict[str, object]] = [{"type": "journal"}, {"type": "console"}, {"type": "tensorboard"},
                                      {"type": "mlflow"}]
    if wandb:
        sinks.append({"type": "wandb", "mode": "offline", "project": "bench-health"})
    windows = make_windows(steps)
    a = torch.randn(256, 256)
    out_times: dict[str, dict[str, list[float]]] = {"without": {"step": [], "metrics": []},
                                                    "with": {"step": [], "metrics": []}}
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), contextlib.redirect_stderr(null):
        cbs = {"without": MetricsCallback(adapters=GRPO_ADAPTERS, sinks=sinks, out_dir=out / "without"),
               "with": MetricsCallback(adapters=GRPO_ADAPTERS, sinks=sinks, out_dir=out / "with", health=HEALTH)}
        for cb in cbs.values():
            cb.on_run_start(CONFIG)
        step = {name: 0 for name in cbs}
        for first in range(0, steps, block):
            for name, cb in cbs.items():
                for window in windows[first:first + block]:
                    step[name] += 1
                    t = time.perf_counter()
                    for _ in range(reps):
                        a @ a
                    m = time.perf_counter()
                    for chunk in window:
                        cb.on_chunk_end(chunk)
                    cb.on_window_end(step[name])
                    assert not cb.should_stop
                    done = time.perf_counter()
                    if step[name] > steps // 10:  # the first tenth: warm-up
                        out_times[name]["step"].append(done - t)
                        out_times[name]["metrics"].append(done - m)
        for cb in cbs.values():
            cb.on_run_end()
    return out_times


def checks_per_frame(frames: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "journal.jsonl"
        pub = Publisher([JournalSink(path)], adapters=GRPO_ADAPTERS, run_id="benchhealth", mode="inline")
        pub.start(CONFIG)
        for frame in reduced_frames(frames):
            pub.publish(frame)
        pub.close()
        health = LiveHealth(path, parse_health({}), live=False)
        t = time.thread_time()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            while health.step():
                pass
        whole = time.thread_time() - t
        return health.seconds / health.frames, whole / health.frames


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work-ms", type=float, default=10.0)
    parser.add_argument("--frames", type=int, default=5000)
    parser.add_argument("--block", type=int, default=25)
    parser.add_argument("--wandb", action="store_true")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.rounds, args.frames = 100, 1, 1000
    torch.set_num_threads(1)
    reps = calibrate(args.work_ms)
    print(f"# Live health: cost\n\n{machine()}\n\nload before: {load()}\n")
    times: dict[str, dict[str, list[float]]] = {"without": {"step": [], "metrics": []},
                                                "with": {"step": [], "metrics": []}}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            got = run(Path(tmp) / f"round{r}", args.steps, reps, args.wandb, args.block)
            for name in times:
                for part in times[name]:
                    times[name][part] += got[name][part]
    sinks = "journal, console, TensorBoard, MLflow (sqlite)" + (", W&B offline" if args.wandb else "")
    print(f"## 1. Training step ({args.work_ms:g} ms of torch work + 4 chunks + reduce + publish; {sinks}; "
          f"blocks of {args.block} steps alternating)\n")
    print("| | steps | median step (ms) | median metrics section (ms) |\n|---|---|---|---|")
    med = {n: {p: statistics.median(v) for p, v in parts.items()} for n, parts in times.items()}
    for name in times:
        print(f"| {name} live health | {len(times[name]['step'])} | {med[name]['step'] * 1e3:.3f} | "
              f"{med[name]['metrics'] * 1e3:.3f} |")
    print(f"\nratio with/without: step **{med['with']['step'] / med['without']['step']:.3f}**, metrics section "
          f"**{med['with']['metrics'] / med['without']['metrics']:.3f}** "
          f"({1e3 * (med['with']['metrics'] - med['without']['metrics']):+.3f} ms)\n")
    checks, whole = checks_per_frame(args.frames)
    print(f"## 2. Publisher CPU per frame ({args.frames} frames, 61 keys, every check watched)\n")
    print(f"- the checks (LiveHealth.see): **{checks * 1e6:.1f} us** per frame")
    print(f"- reading + parsing the journal + the checks: {whole * 1e6:.1f} us per frame\n")
    print(f"load after: {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
