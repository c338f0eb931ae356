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

The overload case (``--overload-steps``, default 20,000; 0: none) is the README's default sinks:
journal, console, TensorBoard, W&B offline and MLflow on an embedded ``sqlite:///`` store. The loop
publishes ``--overload-rate`` steps per second (default 1,000), more than the trackers take together
(a few hundred frames per second on 2 cores; 200 steps/s was an overload until MLflow's SQLite store
was written directly, and no longer is), so the slowest replica falls further behind for the whole
loop: a sink holds at most its ``backlog`` of frames and the rest waits in the journal. The case
counts only if it was an overload: the slowest tracker lags by at least a tenth of the steps when the
loop ends. Once the publisher has started every tracker (20 steps, not sampled), a thread samples,
every half second through the loop and the drain in ``close``, the
trainer's VmRSS, the publisher process's VmRSS, the VmRSS of its child processes (wandb-core) and
the slowest tracker's lag. After close every tracker is read back with its vendor's reader
(TensorBoard ``EventAccumulator``, ``MlflowClient`` on the store, W&B's offline reader): each must
hold every step exactly once. Flat: the peak over the second half of the samples (in time) is less
than ``--tolerance-mb`` above the peak over the first half, for the trainer and for the publisher,
over the loop and the drain; the samples from the publisher's report of state ``recording`` on (every
replica has read the whole journal; the publisher writes the run's record, a fixed cost measured
against the run's length by ``bench_record.py``, then closes the trackers) are reported apart.

    python benchmarks/bench_memory.py                    # 100k steps, 20k traced, overload (about 8 minutes)
    python benchmarks/bench_memory.py --quick            # 20k steps sampled every 2k, 4k traced, 4k overload
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
import threading
import time
import tracemalloc
import warnings
from pathlib import Path
from typing import Any

from _common import GRPO_ADAPTERS, load, machine, make_windows

from posttrain_metrics import MetricReducer
from posttrain_metrics.integrations.console import ConsoleSink
from posttrain_metrics.integrations.tensorboard import TensorBoardSink
from posttrain_metrics.journal import JournalSink, read_journal
from posttrain_metrics.publication.publisher import Publisher

MB = 1024 * 1024
PROBE_KEY = "train/loss_avg"


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


def rss_mb(pid: int | None) -> float:
    """VmRSS of process ``pid`` in MB; NaN once it is gone."""
    if pid is None:
        return math.nan
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024 / MB
    return math.nan


def children_rss_mb(pid: int | None) -> float:
    """Summed VmRSS of the descendants of ``pid`` (the publisher's wandb-core), in MB."""
    if pid is None:
        return math.nan
    total, todo = 0.0, [pid]
    while todo:
        parent = todo.pop()
        with contextlib.suppress(OSError, ValueError):
            for task in os.listdir(f"/proc/{parent}/task"):
                with open(f"/proc/{parent}/task/{task}/children") as f:
                    for child in f.read().split():
                        todo.append(int(child))
                        value = rss_mb(int(child))
                        total += 0.0 if math.isnan(value) else value
    return total


def steps_held(root: Path, run_id: str) -> dict[str, list[int]]:
    """The steps each tracker holds of ``run_id`` (probe key), read back with the vendors' readers."""
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from posttrain_metrics.integrations.mlflow import RUN_ID_TAG
    from posttrain_metrics.integrations.wandb_reader import read_offline_run

    held = {"journal": [f.step for f in read_journal(root / "journal.jsonl").frames]}
    events = EventAccumulator(str(root / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    held["tensorboard"] = [e.step for e in events.Scalars(PROBE_KEY)]
    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    runs = [r for e in client.search_experiments()
            for r in client.search_runs([e.experiment_id], filter_string=f"tags.`{RUN_ID_TAG}` = '{run_id}'")]
    held["mlflow"] = [m.step for r in runs for m in client.get_metric_history(r.info.run_id, PROBE_KEY)]
    held["wandb"] = [int(row["trainer/step"]) for file in sorted(root.rglob(f"run-{run_id}.wandb"))
                     for row in read_offline_run(file).history if PROBE_KEY in row]
    return held


def overload(steps: int, rate: float, windows: list[list[dict[str, object]]], root: Path,
             devnull: Any) -> dict[str, Any]:
    """The README's default sinks fed faster than MLflow's embedded store takes frames; memory of the
    trainer and the publisher sampled in time through the loop and the drain; every tracker read back."""
    from posttrain_metrics.integrations.mlflow import MlflowSink
    from posttrain_metrics.integrations.wandb import WandbSink

    run_id = f"overload{int(time.time())}"
    sinks: list[Any] = [JournalSink(root / "journal.jsonl"), ConsoleSink(stream=devnull),
                        TensorBoardSink(log_dir=root / "tb"),
                        WandbSink(project="posttrain-metrics-bench", dir=root, mode="offline", settings={"quiet": True}),
                        MlflowSink(dir=root, experiment_name="bench-memory-overload")]
    pub = Publisher(sinks, adapters=GRPO_ADAPTERS, run_name="bench-memory-overload", run_id=run_id,
                    close_timeout=24 * 3600.0)
    reducer = MetricReducer(GRPO_ADAPTERS)
    samples: list[dict[str, float]] = []
    published = [0]
    phase = ["loop"]
    done = threading.Event()
    t0 = time.perf_counter()

    def sampler() -> None:
        while True:
            pid = pub.process.pid if pub.process is not None else None
            report = pub._report()
            sinks = report.get("sinks", {})
            lag = max((published[0] - int(sinks.get(n, {}).get("frames", 0)) for n in ("tensorboard", "wandb",
                       "mlflow")), default=0)
            if phase[0] == "drain" and report.get("state") == "recording":
                phase[0] = "record"  # every replica read the whole journal: the publisher writes the run's record
            samples.append({"t": time.perf_counter() - t0, "step": published[0], "trainer": status()["VmRSS"],
                            "publisher": rss_mb(pid), "children": children_rss_mb(pid), "lag": lag,
                            "drain": float(phase[0] != "loop"), "record": float(phase[0] == "record")})
            if done.wait(0.5):
                return

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pub.start({"bench": "memory-overload"})
        warmup = 20  # the publisher imports its vendors and starts every tracker first (not sampled)
        for step in range(1, warmup + 1):
            for chunk in windows[step % len(windows)]:
                reducer.add(chunk)
            pub.publish(reducer.reduce(step))
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and any(
                int(pub._report().get("sinks", {}).get(n, {}).get("frames", 0)) < warmup
                for n in ("tensorboard", "wandb", "mlflow")):
            time.sleep(0.1)
        published[0] = warmup
        thread = threading.Thread(target=sampler, daemon=True)
        t0 = time.perf_counter()
        thread.start()
        for step in range(warmup + 1, steps + 1):
            for chunk in windows[step % len(windows)]:
                reducer.add(chunk)
            pub.publish(reducer.reduce(step))
            published[0] = step
            ahead = (step - warmup) / rate - (time.perf_counter() - t0)
            if ahead > 0:
                time.sleep(ahead)
        loop = time.perf_counter() - t0
        phase[0] = "drain"
        pub.close()
        closed = time.perf_counter() - t0 - loop
        done.set()
        thread.join()
    import wandb

    wandb.teardown()
    held = steps_held(root, run_id)
    want = list(range(1, steps + 1))
    return {"samples": samples, "loop": loop, "close": closed, "steps": steps, "rate": rate,
            "held": {k: len(v) for k, v in held.items()},
            "exact": {k: sorted(v) == want for k, v in held.items()}, "failures": dict(pub.failures),
            "warnings": list(dict.fromkeys(str(w.message) for w in caught))}


def report_overload(res: dict[str, Any], tolerance: float) -> bool:
    samples = res["samples"]
    print("| s | phase | steps published | slowest tracker's lag (frames) | trainer VmRSS MB | publisher process "
          "VmRSS MB | its children (wandb-core) VmRSS MB |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    shown = samples if len(samples) <= 24 else [samples[round(i * (len(samples) - 1) / 23)] for i in range(24)]
    for r in shown:
        what = "record (close)" if r["record"] else "drain (close)" if r["drain"] else "loop"
        print(f"| {r['t']:.1f} | {what} | {int(r['step']):,} | {int(r['lag']):,} | "
              f"{r['trainer']:.1f} | {r['publisher']:.1f} | {r['children']:.1f} |")
    loop_rows = [r for r in samples if not r["drain"]]
    peak_lag = max((r["lag"] for r in samples), default=0)
    end_lag = int(loop_rows[-1]["lag"]) if loop_rows else 0
    overload = end_lag >= res["steps"] / 10  # the trackers fell behind, not a loop they kept up with
    print(f"\n{res['steps']:,} steps published in {res['loop']:.1f} s ({res['steps'] / res['loop']:,.0f} steps/s; "
          "the first 20, before sampling starts, once the publisher has started every tracker); "
          f"the slowest tracker's lag peaked at {int(peak_lag):,} frames (at the loop's end {end_lag:,}: "
          f"{'an overload' if overload else 'NOT an overload, the trackers kept up: raise --overload-rate'}); close "
          f"(the publisher draining the journal) {res['close']:.1f} s. {len(samples)} samples, every 0.5 s, "
          f"{len(shown)} shown.\n")
    print("| process | start MB | end MB | max MB | peak second half minus peak first half MB |")
    print("|---|---:|---:|---:|---:|")
    flat = True
    for label, key in (("trainer", "trainer"), ("publisher process", "publisher"), ("its children", "children")):
        values = [r[key] for r in samples if not math.isnan(r[key]) and not r["record"]]
        if len(values) < 4:
            print(f"| {label} | - | - | - | too few samples |")
            continue
        half = len(values) // 2
        growth = max(values[half:]) - max(values[:half])
        if key != "children":  # wandb-core is W&B's own process; reported, not judged
            flat = flat and growth < tolerance
        print(f"| {label} | {values[0]:.1f} | {values[-1]:.1f} | {max(values):.1f} | {growth:+.2f} |")
    record = [r["publisher"] for r in samples if r["record"] and not math.isnan(r["publisher"])]
    if record:
        print(f"\nthe run's record at close (state 'recording' in the publisher's report; not in the halves above): the "
              f"publisher peaked at {max(record):.1f} MB over {len(record)} samples; its cost against the run's "
              "length is bench_record.py's")
    exact = all(res["exact"].values())
    dropped = {k: res["steps"] - v for k, v in res["held"].items() if v != res["steps"]}
    print(f"\nread back after close: {res['held']} of {res['steps']:,} steps; every step exactly once in every "
          f"tracker: {'yes' if exact else 'NO: ' + str(res['exact'])}; frames dropped: "
          f"{sum(max(0, v) for v in dropped.values()):,}; sink failures: {res['failures'] or 'none'}; "
          f"load average after: {load()}\n")
    return flat and exact and not dropped and overload


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

        sinks.append(MlflowSink(tracking_uri=args.mlflow_uri, dir=root, experiment_name="bench-memory"))
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
    parser.add_argument("--overload-steps", type=int, default=20_000,
                        help="steps of the overload case with the README's default sinks (0: none)")
    parser.add_argument("--overload-rate", type=float, default=1000.0, help="steps per second of the overload loop")
    parser.add_argument("--quick", action="store_true", help="20k steps, and 4k traced")
    parser.add_argument("--json", default=None, help="also write the samples to this file")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.every, args.heap_steps, args.overload_steps = 20_000, 2_000, 4_000, 4_000

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
          f"{'met' if all(flat) else 'MISSED'}\n")
    warned = [t for res in results for t in res["warnings"]]
    if args.overload_steps:
        for var in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "WANDB_MODE"):
            os.environ.pop(var, None)
        with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp, open(os.devnull, "w") as devnull:
            over = overload(args.overload_steps, args.overload_rate, windows, Path(tmp), devnull)
        print(f"## overload: the README's default sinks (journal, console, TensorBoard, W&B offline, MLflow embedded "
              f"sqlite:///), {args.overload_steps:,} steps at up to {args.overload_rate:g} steps/s\n")
        met = report_overload(over, args.tolerance_mb)
        warned += over["warnings"]
        print(f"- target overload (the trackers lag behind the loop; memory flat in time, trainer and publisher "
              f"process; every tracker holds every step exactly once after close, 0 frames dropped): "
              f"{'met' if met else 'MISSED'}")
    for text in dict.fromkeys(warned):
        print(f"- warning: {text}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([res["rows"] for res in results], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
