"""The run's record at close: its memory and time against the run's length.

When the publisher closes a run it writes the run's record (the redacted config, the doctor's report
and the one-page dashboard) and attaches it to the trackers. The record must not cost more memory
for a long run than for a short one: the publisher process sits beside the trainer for the whole run.

For each ``--steps`` length (default 4,000, 16,000, 64,000 and 128,000), a synthetic journal of K = 61 keys
(the same frames as ``bench_export.py``) is written once; then ``--repeat`` fresh processes each run
``write_record`` on it and report:

- the process's peak resident set (VmHWM from /proc/self/status) above its resident set just before
  the call, with matplotlib and the doctor already imported (their fixed cost is not the record's);
- the time of the call.

Flat: the longest run's peak above its baseline is within ``--tolerance-mb`` (default 2 MB) of the
next longest's (by default a run twice as long: 128k against 64k steps), and the growth from the
shortest run is printed in bytes a step. The dashboard's drawing (matplotlib's canvas and artists)
is a fixed cost of tens of MB that varies with what the curves look like: a curve thinned to the
lowest and highest point of each bucket zigzags, which matplotlib cannot simplify, so a long run's
page costs a few MB more than a short run's smooth one; what must not appear is a cost per step.

    python benchmarks/bench_record.py                       # 4k, 16k, 64k, 128k steps, 3 processes each
    python benchmarks/bench_record.py --quick               # 2k and 8k steps, 1 process each
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import ROOT, load, machine

MB = 1024 * 1024

CHILD = r"""
import json, sys, time, warnings
from pathlib import Path
import matplotlib
matplotlib.use("Agg")
import matplotlib.figure, matplotlib.backends.backend_agg  # noqa: F401  (fixed cost, before the baseline)
import posttrain_metrics.doctor, posttrain_metrics.plot, posttrain_metrics.journal  # noqa: F401
from posttrain_metrics.publication.artifacts import write_record

def status():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) / 1024
    return out

before = status()
t = time.perf_counter()
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    files = write_record(Path(sys.argv[1]))
seconds = time.perf_counter() - t
after = status()
print(json.dumps({"baseline": before["VmRSS"], "baseline_hwm": before["VmHWM"], "peak": after["VmHWM"],
                  "seconds": seconds, "files": sorted(Path(f).name for f in files)}))
"""


def write_journal(path: Path, steps: int) -> int:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_export import synthetic_frames
    from bench_export import write_journal as write

    write(path, synthetic_frames(steps))
    return path.stat().st_size


def measure(path: Path) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, nargs="+", default=[4_000, 16_000, 64_000, 128_000])
    parser.add_argument("--repeat", type=int, default=3, help="fresh processes per length (median reported)")
    parser.add_argument("--tolerance-mb", type=float, default=2.0)
    parser.add_argument("--quick", action="store_true", help="2,000 and 8,000 steps, one process each")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.repeat = [2_000, 8_000], 1
    print(f"# the run's record at close against the run's length ({machine()})\n")
    print("| steps | journal MB | record peak above baseline MB (median; all) | baseline MB | time s (median; all) |")
    print("|---:|---:|---:|---:|---:|")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-record-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as tmp:
        for steps in sorted(args.steps):
            path = Path(tmp) / f"journal-{steps}.jsonl"
            size = write_journal(path, steps)
            runs = [measure(path) for _ in range(args.repeat)]
            extra = [float(r["peak"]) - float(r["baseline"]) for r in runs]
            seconds = [float(r["seconds"]) for r in runs]
            files = runs[0]["files"]
            rows.append((steps, statistics.median(extra)))
            print(f"| {steps:,} | {size / MB:.1f} | {statistics.median(extra):.1f} ({', '.join(f'{e:.1f}' for e in extra)}) "
                  f"| {statistics.median(float(r['baseline']) for r in runs):.1f} "
                  f"| {statistics.median(seconds):.2f} ({', '.join(f'{s:.2f}' for s in seconds)}) |")
    growth = rows[-1][1] - rows[0][1]
    per_step = growth * MB / max(1, rows[-1][0] - rows[0][0])
    doubling = rows[-1][1] - rows[-2][1] if len(rows) > 1 else 0.0
    print(f"\nrecord files: {', '.join(files)}; the peak grows {growth:+.1f} MB from {rows[0][0]:,} to {rows[-1][0]:,} "
          f"steps ({per_step:+.0f} bytes a step)" + (f" and {doubling:+.1f} MB from {rows[-2][0]:,} to {rows[-1][0]:,}"
                                                     if len(rows) > 1 else "") + f"; load average after: {load()}\n")
    met = len(rows) > 1 and doubling <= args.tolerance_mb
    print(f"- target the record's memory flat in the run's length (the longest run's peak within "
          f"{args.tolerance_mb:g} MB of the next longest's): {'met' if met else 'MISSED'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
