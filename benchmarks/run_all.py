"""Run every benchmark in sequence and record each report on its results page.

    python benchmarks/run_all.py            # full runs (about 9 minutes on 2 cores), recorded
    python benchmarks/run_all.py --quick    # smoke test (about 4.5 minutes), printed only

Each benchmark runs in its own process (``bench_reduce.py``, ``bench_publish.py``,
``bench_export.py``, ``bench_memory.py``, ``bench_record.py``, ``bench_driver.py``, ``bench_start.py``,
``bench_samples.py``, ``bench_throughput.py``, ``bench_health.py``), in full mode with its defaults except ``bench_reduce.py --iters 100``
(``--reduce-iters``). Its standard output, a markdown report, goes to the terminal and, in full mode,
to its page ``benchmarks/results/<name>.md`` (``bench_publish.py`` -> ``publish.md``): a dated row in
the page's "Runs" table (date, commit, machine and load, the command with its time and status, the
report's target lines) and the report itself at the end of the page's history. ``--out FILE``
writes every report to one file instead, under a description of the machine. Standard error
(vendor log lines) goes to a log file in the system's temporary folder, named at the end. A
benchmark that fails is recorded as failed and the others still run; the exit code says whether
all passed.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
BENCHMARKS = ("bench_reduce.py", "bench_publish.py", "bench_export.py", "bench_memory.py", "bench_record.py",
              "bench_driver.py", "bench_start.py", "bench_samples.py", "bench_throughput.py", "bench_health.py")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown")
    except OSError:
        return "unknown"


def describe_machine() -> list[str]:
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
        f"- CPU: {cpu_model()}, {os.cpu_count()} cores; memory {mem}",
        f"- OS: {platform.platform()}",
        f"- Python {platform.python_version()}; " + ", ".join(f"{k} {v}" for k, v in versions.items()),
        f"- load average at start: {load()} (other work may share the machine)",
    ]


def commit() -> str:
    """The checkout's short commit, ``+changes`` when the tree differs from it; ``-`` outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=HERE,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "-"
    return head + ("+changes" if dirty else "")


def page_of(script: str) -> Path:
    """``bench_publish.py`` -> ``benchmarks/results/publish.md``."""
    return RESULTS / (script.removeprefix("bench_").removesuffix(".py") + ".md")


def demote(report: str, top: int = 4) -> str:
    """The report's headings moved down so that its top level is ``top``, under the page's history."""
    lines = report.splitlines()
    levels = [len(line) - len(line.lstrip("#")) for line in lines if re.match(r"#+ ", line)]
    shift = top - min(levels) if levels else 0
    out = []
    for line in lines:
        if re.match(r"#+ ", line):
            n = len(line) - len(line.lstrip("#"))
            line = "#" * min(6, n + shift) + line[n:]
        out.append(line)
    return "\n".join(out)


def targets(report: str) -> str:
    """The report's ``- target ...: verdict (figures)`` lines, shortened to fit one table cell."""
    found = [line[2:].strip() for line in report.splitlines() if line.startswith("- target")]
    return "; ".join(found).replace("|", "/") if found else "see the report"


def record(script: str, shown: str, seconds: float, status: str, before: str, after: str, report: str,
           date: str, rev: str) -> Path:
    """Append one dated row to the page's Runs table and the report to its history."""
    page = page_of(script)
    if not page.exists():
        page.write_text(f"# Results: `{script}`\n\n## Runs\n\n| date | commit | machine note | run | medians and ratios "
                        f"| report |\n|---|---|---|---|---|---|\n\n## History\n")
    text = page.read_text()
    anchor = f"run-{date}-{int(time.time())}-{script.removesuffix('.py')}"
    machine = f"{cpu_model()}, {os.cpu_count()} cores; load {before.split()[0]} before, {after.split()[0]} after"
    row = (f"| {date} | {rev} | {machine} | `{shown}`, {seconds:.0f} s, {status} | {targets(report)} "
           f"| [below](#{anchor}) |")
    runs, rest = text.split("## Runs\n", 1)
    table_end = rest.index("\n\n", rest.index("|---"))  # the blank line after the table's last row
    rest = rest[:table_end] + "\n" + row + rest[table_end:]
    entry = (f'\n<a id="{anchor}"></a>\n\n### {date}: `{shown}` (commit {rev})\n\n'
             f"{seconds:.0f} s, {status}; load average before {before}, after {after}\n\n{demote(report)}\n")
    page.write_text(runs + "## Runs\n" + rest.rstrip("\n") + "\n" + entry)
    return page


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="pass --quick to every benchmark (printed, not recorded)")
    parser.add_argument("--only", nargs="+", choices=BENCHMARKS, default=list(BENCHMARKS))
    parser.add_argument("--reduce-iters", type=int, default=100,
                        help="--iters for bench_reduce.py in full mode (default 100; its own default, 200, "
                             "takes about 8 minutes on 2 cores)")
    parser.add_argument("--out", default=None,
                        help="write every report to this one file instead of the pages of benchmarks/results/")
    parser.add_argument("--no-record", action="store_true", help="print only, even in full mode")
    args = parser.parse_args()
    date = datetime.date.today().isoformat()
    mode = "quick" if args.quick else "full"
    to_pages = not (args.quick or args.no_record or args.out)
    log = Path(tempfile.gettempdir()) / f"posttrain-metrics-benchmarks-{date}-{os.getpid()}.log"
    rev = commit()
    header = [f"# posttrain-metrics benchmarks, {date} ({mode} mode, commit {rev})", "", *describe_machine(), "",
              f"Command: `python {' '.join(['benchmarks/run_all.py', *sys.argv[1:]])}`", ""]
    print("\n".join(header), flush=True)
    out = Path(args.out) if args.out else None
    if out is not None:
        out.write_text("\n".join(header) + "\n")
    failed, pages = [], []
    started = time.perf_counter()
    with open(log, "w") as errors:
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
            after = load()
            status = "ok" if proc.returncode == 0 else f"FAILED (exit code {proc.returncode})"
            if proc.returncode:
                failed.append(script)
            report = proc.stdout.rstrip()
            section = (f"\n## `{shown}`\n\n{seconds:.0f} s, {status}; load average before {before}, after {after}\n\n"
                       f"{demote(report, top=3)}\n")
            print(section, flush=True)
            if out is not None:
                with open(out, "a") as results:
                    results.write(section)
            if to_pages:
                pages.append(record(script, shown, seconds, status, before, after, report, date, rev))
    total = time.perf_counter() - started
    footer = f"\nTotal {total / 60:.1f} min. " + (f"Failed: {', '.join(failed)}." if failed else "All passed.")
    if out is not None:
        with open(out, "a") as results:
            results.write(footer + "\n")
    print(footer)
    if out is not None:
        print(f"results: {out}")
    for page in pages:
        print(f"recorded: {page.relative_to(HERE.parent)}")
    print(f"vendor logs: {log}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
