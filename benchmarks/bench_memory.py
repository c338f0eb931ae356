"""Memory of a long run, trainer and publisher process: flat in steps, and nothing dropped.

One process publishes ``--steps`` steps (default 100k) of K = 61 keys (grpo + reward + trainer,
every declared key) through a Publisher with the journal, TensorBoard and the console (to
/dev/null); ``--wandb`` adds W&B offline and ``--mlflow`` MLflow (embedded ``sqlite:///``, or
``--mlflow-uri``). Frames come from the real ``MetricReducer``: every step adds 4 chunks and
reduces (the chunks are 64 pre-built windows, recycled, so the input itself takes no growing
memory). The loop runs as fast as it can, faster than the publisher process feeds the trackers: the
publisher falls behind (the journal is the queue: it reads from its own offset) and catches up after
the loop; ``close`` waits for it. That is the overload case: nothing may be dropped, and neither
process's memory may grow with the lag.

Every ``--every`` steps (default 10k) it samples the process's resident set (VmRSS and its peak
VmHWM from /proc/self/status; not ``ru_maxrss``, which survives ``exec`` and so reports the peak of
whatever launched the benchmark), ``sys.getallocatedblocks()``, the publisher process's VmRSS, and
how many frames the slowest tracker lags behind the journal (from the publisher's status report).
After close, TensorBoard is read back (``EventAccumulator``): it must hold every step. ``tracemalloc`` slows the loop about six times, so the Python heap it traces (current and
peak) is measured in a second, shorter run of ``--heap-steps`` steps (default 20k, 0: none).
Memory is flat when, in each run, the peak over the second half of the steps is less than
``--tolerance-mb`` (default 2 MB) above the peak over the first half.

    python benchmarks/bench_memory.py                    # 100k steps, then 20k traced (about 2 minutes)
    python benchmarks/bench_memory.py --quick            # 20k steps sampled every 2k, then 4k traced
    python benchmarks/bench_memory.py --wandb --mlflow   # with the optional sinks
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
import time
import tracemalloc
import warnings
from pathlib import Path
from typing import Any

from _common import GRPO_ADAPTERS, load, machine, make_windows

from posttrain_metrics import MetricReducer
from posttrain_metrics.integrations.console import ConsoleSink
from posttrain_metrics.integrations.tensorboard import TensorBoardSink
from posttrain_metrics.journal import JournalSink
from posttrain_metrics.publication.publisher import Publisher

MB = 1024 * 1024


def status() -> dict[str, float]:
    """VmRSS and VmHWM of this process, in MB."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024 / MB
    return out


def sample(step: int, pub: Publisher, seconds: float, published: int) -> dict[str, float]:
    row: dict[str, float] = {"step": step, "seconds": seconds, **status()}
    if tracemalloc.is_tracing():
        current, peak = tracemalloc.get_traced_memory()
        row["heap"], row["heap_peak"] = current / MB, peak / MB
    row["blocks"] = sys.getallocatedblocks()
    sinks = pub._report().get("sinks", {})
    followed = [s.name for s in (*pub.in_child, *pub.in_process)]
    row["lag"] = max((published - int(sinks.get(n, {}).get("frames", 0)) for n in followed), default=0)
    row["publisher"] = math.nan
    if pub.process is not None and pub.process.pid is not None:
        with contextlib.suppress(OSError), open(f"/proc/{pub.process.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    row["publisher"] = int(line.split()[1]) * 1024 / MB
    return row


def tensorboard_steps(log_dir: Path) -> int:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    return len(events.Scalars("train/loss_avg"))


def run(steps: int, every: int, trace: bool, windows: list[list[dict[str, object]]], args: argparse.Namespace,
        root: Path, devnull: Any) -> dict[str, Any]:
    """One run of ``steps`` steps through a fresh publisher, sampled every ``every`` steps."""
    sinks: list[Any] = [JournalSink(root / "journal.jsonl"), TensorBoardSink(log_dir=root / "tb"),
                        ConsoleSink(stream=devnull)]
    if args.wandb:
        from posttrain_metrics.integrations.wandb import WandbSink

        sinks.append(WandbSink(project="posttrain-metrics-bench", dir=root, mode="offline", settings={"quiet": True}))
    if args.mlflow:
        from posttrain_metrics.integrations.mlflow import MlflowSink

        sinks.append(MlflowSink(tracking_uri=args.mlflow_uri, dir=root, experiment="bench-memory"))
    pub = Publisher(sinks, adapters=GRPO_ADAPTERS, run_name="bench-memory", close_timeout=24 * 3600.0)
    reducer = MetricReducer(GRPO_ADAPTERS)
    rows = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pub.start({"bench": "memory"})
        if trace:
            tracemalloc.start()
        rows.append(sample(0, pub, 0.0, 0))
        t0 = time.perf_counter()
        for step in range(1, steps + 1):
            for chunk in windows[step % len(windows)]:
                reducer.add(chunk)
            pub.publish(reducer.reduce(step))
            if step % every == 0:
                rows.append(sample(step, pub, time.perf_counter() - t0, step))
        loop = time.perf_counter() - t0
        t0 = time.perf_counter()
        pub.close()
        closed = time.perf_counter() - t0
        rows.append(sample(steps, pub, loop + closed, steps))
        rows[-1]["step"] = -1  # after close
        tracemalloc.stop()
    held = {"tensorboard": tensorboard_steps(root / "tb")}
    return {"rows": rows, "loop": loop, "close": closed, "steps": steps, "every": every, "heap": trace,
            "held": held, "missing": {k: steps - v for k, v in held.items() if v != steps},
            "sinks": ", ".join(s.name for s in sinks), "journal_mb": (root / "journal.jsonl").stat().st_size / MB,
            "warnings": list(dict.fromkeys(str(w.message) for w in caught))}


def report(res: dict[str, Any], tolerance: float) -> bool:
    heap = res["heap"]
    cols = ["step", "s", "VmRSS MB", "VmHWM MB", "allocated blocks"]
    cols += ["traced heap MB", "traced heap peak MB"] if heap else []
    cols += ["publisher process VmRSS MB", "slowest tracker's lag (frames)"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---:|" * len(cols))
    for r in res["rows"]:
        step = "after close" if r["step"] < 0 else f"{int(r['step']):,}"
        cells = [step, f"{r['seconds']:.0f}", f"{r['VmRSS']:.1f}", f"{r['VmHWM']:.1f}", f"{int(r['blocks']):,}"]
        if heap:
            cells += [f"{r['heap']:.2f}", f"{r['heap_peak']:.2f}"]
        cells += [f"{r['publisher']:.1f}", f"{int(r['lag']):,}"]
        print("| " + " | ".join(cells) + " |")
    print(f"\nloop {res['loop']:.0f} s ({res['steps'] / res['loop']:,.0f} steps/s), close (the publisher catching "
          f"up) {res['close']:.1f} s; journal {res['journal_mb']:.0f} MB on disk; read back after close: "
          f"{res['held']} of {res['steps']:,} steps; frames dropped: "
          f"{sum(res['missing'].values()):,}; load average after: {load()}")
    # Flat: the second half of the run never needs more than the first half did. (The queues fill,
    # and may drain and refill as the machine's load changes; what they hold is bounded.)
    half = res["steps"] / 2
    first = [r for r in res["rows"] if 0 < r["step"] <= half]
    second = [r for r in res["rows"] if r["step"] > half]
    keys = {"VmRSS": "VmRSS", "VmHWM": "VmHWM", "publisher VmRSS": "publisher",
            **({"traced heap": "heap"} if heap else {})}
    growth = {label: max(r[k] for r in second) - max(r[k] for r in first) for label, k in keys.items()}
    print("peak in the second half of the run minus peak in the first half: "
          + ", ".join(f"{label} {v:+.2f} MB" for label, v in growth.items())
          + f"; allocated blocks {int(max(r['blocks'] for r in second) - max(r['blocks'] for r in first)):+,}\n")
    return all(v < tolerance for v in growth.values()) and not res["missing"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--every", type=int, default=10_000)
    parser.add_argument("--heap-steps", type=int, default=20_000, help="steps of the tracemalloc run (0: none)")
    parser.add_argument("--wandb", action="store_true", help="add W&B (offline)")
    parser.add_argument("--mlflow", action="store_true", help="add MLflow (embedded sqlite:/// unless --mlflow-uri)")
    parser.add_argument("--mlflow-uri", default=None)
    parser.add_argument("--tolerance-mb", type=float, default=2.0)
    parser.add_argument("--quick", action="store_true", help="20k steps, and 4k traced")
    parser.add_argument("--json", default=None, help="also write the samples to this file")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.every, args.heap_steps = 20_000, 2_000, 4_000

    windows = make_windows(64)
    print(f"# publisher memory over {args.steps:,} steps ({machine()})\n")
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp, open(os.devnull, "w") as devnull:
        results.append(run(args.steps, args.every, False, windows, args, Path(tmp) / "rss", devnull))
        if args.heap_steps:
            results.append(run(args.heap_steps, max(1, args.heap_steps // 10), True, windows, args,
                               Path(tmp) / "heap", devnull))
    print(f"sinks: {results[0]['sinks']} (journal and console to /dev/null on the training thread; the trackers "
          "fed by the publisher process from the journal); frames from the real MetricReducer, 4 chunks per step, "
          "K = 61. The loop outruns the publisher, which lags and catches up at close (the worst case).\n")
    flat = []
    for res in results:
        what = ("with tracemalloc (Python heap; tracing slows the loop, hence fewer steps)" if res["heap"]
                else "without tracemalloc (resident set; allocated blocks = sys.getallocatedblocks())")
        print(f"## {res['steps']:,} steps, {what}\n")
        flat.append(report(res, args.tolerance_mb))
    print(f"- target memory flat in steps (the second half of each run peaks less than {args.tolerance_mb:g} MB "
          f"above the first half, trainer and publisher process) and 0 frames dropped: "
          f"{'met' if all(flat) else 'MISSED'}")
    for text in dict.fromkeys(t for res in results for t in res["warnings"]):
        print(f"- warning: {text}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([res["rows"] for res in results], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
