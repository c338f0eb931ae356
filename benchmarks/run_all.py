"""Run every benchmark in sequence and write their tables to ``benchmarks/results-<date>.md``.

    python benchmarks/run_all.py            # full runs (about 9 minutes on 2 cores)
    python benchmarks/run_all.py --quick    # smoke test (about 4.5 minutes)

Each benchmark runs in its own process (``bench_reduce.py``, ``bench_publish.py``,
``bench_export.py``, ``bench_memory.py``, ``bench_record.py``, ``bench_driver.py``, ``bench_start.py``,
``bench_samples.py``, ``bench_throughput.py``), in full mode
with its defaults except
``bench_reduce.py --iters 100`` (``--reduce-iters``); its standard output, a markdown report, goes to the
terminal and into the results file under a heading with the exact command, its run time and the
load average before and after. Its standard error (vendor log lines) goes to
``benchmarks/results-<date>.log``. The file starts with a description of the machine. A benchmark
that fails is reported as failed and the others still run; the exit code says whether all passed.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = ("bench_reduce.py", "bench_publish.py", "bench_export.py", "bench_memory.py", "bench_record.py",
              "bench_driver.py", "bench_start.py", "bench_samples.py", "bench_throughput.py")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def describe_machine() -> list[str]:
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    mem = "unknown"
    try:
        with open("/proc/meminfo") as f:
            total = next(line for line in f if line.startswith("MemTotal"))
            mem = f"{int(total.split()[1]) / 1024 / 1024:.1f} GiB"
    except (OSError, StopIteration):
        pass
    versions = {}
    for package in ("torch", "mlflow", "wandb", "tensorboard", "protobuf", "posttrain-metrics"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return [
        f"- CPU: {model}, {os.cpu_count()} cores; memory {mem}",
        f"- OS: {platform.platform()}",
        f"- Python {platform.python_version()}; " + ", ".join(f"{k} {v}" for k, v in versions.items()),
        f"- load average at start: {load()} (other work may share the machine)",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="pass --quick to every benchmark")
    parser.add_argument("--only", nargs="+", choices=BENCHMARKS, default=list(BENCHMARKS))
    parser.add_argument("--reduce-iters", type=int, default=100,
                        help="--iters for bench_reduce.py in full mode (default 100; its own default, 200, "
                             "takes about 8 minutes on 2 cores)")
    parser.add_argument("--out", default=None, help="results file (default benchmarks/results-<date>.md)")
    args = parser.parse_args()
    date = datetime.date.today().isoformat()
    out = Path(args.out) if args.out else HERE / f"results-{date}.md"
    log = out.with_suffix(".log")
    mode = "quick" if args.quick else "full"
    header = [f"# posttrain-metrics benchmarks, {date} ({mode} mode)", "", *describe_machine(), "",
              f"Command: `python {' '.join(['benchmarks/run_all.py', *sys.argv[1:]])}`", ""]
    print("\n".join(header), flush=True)
    failed = []
    started = time.perf_counter()
    with open(out, "w") as results, open(log, "w") as errors:
        results.write("\n".join(header) + "\n")
        for script in args.only:
            options = ["--quick"] if args.quick else []
            if script == "bench_reduce.py" and not args.quick:
                options = ["--iters", str(args.reduce_iters)]
            command = [sys.executable, str(HERE / script), *options]
            shown = " ".join(["python", f"benchmarks/{script}", *options])
            before = load()
            t0 = time.perf_counter()
            errors.write(f"===== {shown}\n")
            errors.flush()
            proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=errors, text=True, cwd=HERE.parent)
            seconds = time.perf_counter() - t0
            status = "ok" if proc.returncode == 0 else f"FAILED (exit code {proc.returncode}; see {log.name})"
            if proc.returncode:
                failed.append(script)
            # the benchmark's own headings go two levels down, under this section's
            body = "\n".join("##" + line if line.startswith("#") else line for line in proc.stdout.rstrip().splitlines())
            section = (f"\n## `{shown}`\n\n{seconds:.0f} s, {status}; load average before {before}, after {load()}\n\n"
                       f"{body}\n")
            results.write(section)
            results.flush()
            print(section, flush=True)
        total = time.perf_counter() - started
        footer = f"\nTotal {total / 60:.1f} min. " + (f"Failed: {', '.join(failed)}." if failed else "All passed.")
        results.write(footer + "\n")
    print(footer)
    print(f"results: {out}\nvendor logs: {log}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
