"""Training-thread overhead of a full publish, against a training loop with no metrics at all.

One process, one rank (torch.distributed is not initialised, so ``MetricReducer.reduce`` is local:
the cross-rank collectives are measured by ``bench_reduce.py``). Each step of the loop does a fixed
amount of torch work (``--work-ms`` of 256x256 matmuls on one torch thread, calibrated at start);
the metrics loop also does, on the training thread, what a trainer does per optimizer step:
``MetricReducer.add`` of 4 chunks (GRPO objective + reward report + trainer keys, built from
``tests/_runs.grpo_chunk`` with every optional key of the three adapters filled in: K = 61 public
keys), ``reduce`` and ``Publisher.publish`` to five sinks: the journal and the console (to
/dev/null) on the training thread, W&B offline, MLflow and TensorBoard fed from the journal by the
publisher process (the default mode), or by a thread of the training process (``mode="thread"``,
the in-process option). MLflow is the README's default, an embedded ``sqlite:///`` store, or a real
local ``mlflow server`` (SQLite store), slow (a proxy adds ``--delay`` s per request) or dead (a
port nothing listens on).

Reported per case, over ``--steps`` steps after ``--warmup``: the step time with metrics, the
baseline step time (the same torch work without any metrics, in blocks of ``--block`` steps
alternating with the metrics steps, so both see the same machine load), overhead = median
with-metrics minus median baseline, the directly timed metrics section (add + reduce + publish),
the CPU time the other threads of the process used per step (they share the GIL with the training
thread), the CPU time of the helper processes per step (the MLflow server, wandb-core, the proxy:
they share the machine's cores), the time to ``close()`` (drain every sink), and each sink's ``write`` time on its own
thread. Cases: all five sinks with MLflow fast; the same with MLflow slow (a stdlib proxy in its own
process delays every request by ``--delay`` s before forwarding to the same server); then the
journal with one other sink at a time, to attribute the overhead (``--no-attribution`` skips them).
Overhead is also given as the median over blocks of (median metrics step - median baseline step) of
each adjacent pair of blocks, which follows the machine's load as it drifts. Targets (issue 13):
with the README's default sinks (MLflow on an embedded ``sqlite:///`` store) the overhead is at
most 1 ms and at most 1.2x the journal-only overhead; unchanged when MLflow is slow or dead.

Before timing, the reducer's frame is checked against ``reduce_metrics`` on the same chunks; after
each case, every sink is checked to hold every frame (journal lines, TensorBoard events read back
with ``EventAccumulator``, MLflow history read back from the server, W&B rows in its offline log).

    python benchmarks/bench_publish.py            # full run (about 2 minutes)
    python benchmarks/bench_publish.py --quick    # smaller, for a smoke test
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import http.client
import http.server
import json
import math
import multiprocessing
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from _common import CHUNKS, GRPO_ADAPTERS, load, machine, make_windows, stats
from _mlflow_server import free_port, start_server, stop_server  # tests/, put on sys.path by _common

from posttrain_metrics import Frame, MetricReducer, reduce_metrics
from posttrain_metrics.integrations.console import ConsoleSink
from posttrain_metrics.integrations.mlflow import RUN_ID_TAG, MlflowSink
from posttrain_metrics.integrations.tensorboard import TensorBoardSink
from posttrain_metrics.integrations.wandb import WandbSink
from posttrain_metrics.journal import JournalSink, read_journal
from posttrain_metrics.publication.publisher import Publisher, display_frame

PROBE_KEY = "train/loss_avg"


# -- the data --------------------------------------------------------------------------------------------


def check_reducer(windows: list[list[dict[str, object]]]) -> int:
    """The reducer's frame equals the offline reduction of the same chunks; returns K (public keys)."""
    reducer = MetricReducer(GRPO_ADAPTERS)
    for chunk in windows[0]:
        reducer.add(chunk)
    got = dict(reducer.reduce(1).metrics)
    want = reduce_metrics(GRPO_ADAPTERS, [windows[0]])
    if got.keys() != want.keys() or any(
        not (got[k] == want[k] or (isinstance(got[k], float) and math.isclose(got[k], want[k], rel_tol=1e-12)))  # type: ignore[arg-type]
        for k in got
    ):
        raise SystemExit("MetricReducer disagrees with reduce_metrics on the same chunks")
    keys = Publisher([], adapters=GRPO_ADAPTERS).keys
    return len(display_frame(Frame(1, got), keys).metrics)


# -- the step's torch work ------------------------------------------------------------------------------


def make_work(work_ms: float) -> Callable[[], None]:
    """A fixed amount of torch work taking about ``work_ms`` on one thread (calibrated once)."""
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    for _ in range(20):
        a @ b
    t0 = time.perf_counter()
    for _ in range(50):
        a @ b
    per = (time.perf_counter() - t0) / 50
    reps = max(1, round(work_ms / 1000 / per))

    def work() -> None:
        for _ in range(reps):
            a @ b

    return work


# -- a slow MLflow server: a delaying proxy in its own process ------------------------------------------


def serve_proxy(port: int, upstream: int, delay: float, ready: Any) -> None:
    """Forward every request to 127.0.0.1:``upstream`` after sleeping ``delay`` seconds."""

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            time.sleep(delay)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
            conn = http.client.HTTPConnection("127.0.0.1", upstream, timeout=120)
            try:
                conn.request(self.command, self.path, body=body, headers=headers)
                response = conn.getresponse()
                data = response.read()
            finally:
                conn.close()
            self.send_response(response.status)
            skip = ("transfer-encoding", "connection", "content-length", "server", "date")
            for k, v in response.getheaders():
                if k.lower() not in skip:
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = forward

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    ready.set()
    server.serve_forever()


@contextlib.contextmanager
def slow_proxy(upstream_uri: str, delay: float) -> Iterator[str]:
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    port = free_port()
    proc = ctx.Process(target=serve_proxy, args=(port, int(upstream_uri.rsplit(":", 1)[1]), delay, ready), daemon=True)
    proc.start()
    if not ready.wait(60):
        proc.terminate()
        raise SystemExit("the slow proxy did not start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.join(10)


# -- the loops --------------------------------------------------------------------------------------------


def timed_writes(sink: Any) -> dict[str, list[float]]:
    """Wrap the sink instance's ``write`` to record each call's wall time and the CPU time of the
    thread that runs it (the sink's worker thread; the journal's is the training thread)."""
    samples: dict[str, list[float]] = {"wall": [], "cpu": []}
    write = sink.write

    def timed(frame: Frame) -> None:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            write(frame)
        finally:
            samples["cpu"].append(time.thread_time() - c0)
            samples["wall"].append(time.perf_counter() - t0)

    sink.write = timed
    return samples


def machine_busy() -> tuple[float, float]:
    """Busy and total CPU time of the whole machine so far, in core-seconds (from /proc/stat)."""
    try:
        with open("/proc/stat") as f:
            fields = [float(x) for x in f.readline().split()[1:9]]  # guest time is already in user
    except OSError:
        return math.nan, math.nan
    idle = fields[3] + fields[4]  # idle + iowait
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(fields) - idle) / tick, sum(fields) / tick


def helpers_cpu(server_pgid: int | None) -> float:
    """CPU seconds used so far by the processes that serve the sinks: the MLflow server's process
    group and this process's descendants (the publisher process and its wandb-core, the slow proxy).
    They compete for the 2 cores, not for the GIL."""
    procs: dict[int, tuple[int, int, float]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
        procs[int(entry.name)] = (int(fields[1]), int(fields[2]), cpu)
    mine = {os.getpid()}
    grew = True
    while grew:  # descendants, by parent links
        new = {pid for pid, (ppid, _, _) in procs.items() if ppid in mine and pid not in mine}
        mine |= new
        grew = bool(new)
    mine.discard(os.getpid())
    return sum(cpu for pid, (_, pgrp, cpu) in procs.items()
               if pid in mine or (server_pgid is not None and pgrp == server_pgid))


def wait_idle(pub: Publisher, published: int, timeout: float = 5.0) -> None:
    """Until the publisher (process or thread) has fed every tracker what was published, as its
    status report says (updated twice a second), or ``timeout``; then a short pause more."""
    deadline = time.monotonic() + timeout
    followed = [s.name for s in (*pub.in_child, *pub.in_process)]
    while followed and time.monotonic() < deadline:
        sinks = pub._report().get("sinks", {})
        if all(sinks.get(name, {}).get("frames", 0) >= published for name in followed):
            break
        time.sleep(0.01)
    time.sleep(0.02)


def interleaved_loop(work: Callable[[], None], windows: list[list[dict[str, object]]], warmup: int, block: int,
                     pub: Publisher, server_pgid: int | None) -> dict[str, Any]:
    """Blocks of ``block`` baseline steps (torch work only) and ``block`` metrics steps in turn, so
    that both see the same machine load; the sinks are idle when a baseline block starts."""
    reducer = MetricReducer(GRPO_ADAPTERS)
    out: dict[str, Any] = {"baseline": [], "step": [], "metrics": [], "reduce": [], "publish": [], "pairs": []}
    busy = {"baseline": [0.0, 0.0], "metrics": [0.0, 0.0]}  # machine busy and total core-seconds

    def metrics_step(i: int, chunks: list[dict[str, object]]) -> tuple[float, float, float, float]:
        t0 = time.perf_counter()
        work()
        t1 = time.perf_counter()
        for chunk in chunks:
            reducer.add(chunk)
        frame = reducer.reduce(i + 1)
        t2 = time.perf_counter()
        pub.publish(frame)
        t3 = time.perf_counter()
        return t3 - t0, t3 - t1, t2 - t1, t3 - t2

    for i in range(warmup):
        metrics_step(i, windows[i])
        work()
    wait_idle(pub, warmup, timeout=60.0)  # the publisher process starts its trackers meanwhile
    process_cpu, thread_cpu, helpers = time.process_time(), time.thread_time(), helpers_cpu(server_pgid)
    for start in range(warmup, len(windows), block):
        wait_idle(pub, start)
        m0 = machine_busy()
        for _ in range(min(block, len(windows) - start)):
            t0 = time.perf_counter()
            work()
            out["baseline"].append(time.perf_counter() - t0)
        m1 = machine_busy()
        for i in range(start, min(start + block, len(windows))):
            for name, value in zip(("step", "metrics", "reduce", "publish"), metrics_step(i, windows[i])):
                out[name].append(value)
        m2 = machine_busy()
        n = min(block, len(windows) - start)
        out["pairs"].append(stats(out["step"][-n:])[0] - stats(out["baseline"][-n:])[0])
        for kind, (x, y) in (("baseline", (m0, m1)), ("metrics", (m1, m2))):
            busy[kind][0] += y[0] - x[0]
            busy[kind][1] += y[1] - x[1]
    wait_idle(pub, len(windows))
    # CPU time of every thread of this process but the training thread, per metrics step: what
    # competes with the training thread for the GIL (the MLflow server and wandb-core are other
    # processes). Baseline blocks start with the sinks idle, so this is the sinks' work.
    out["background_cpu"] = ((time.process_time() - process_cpu) - (time.thread_time() - thread_cpu)) / len(out["step"])
    out["helpers_cpu"] = (helpers_cpu(server_pgid) - helpers) / len(out["step"])
    cores = os.cpu_count() or 1
    out["baseline_cores"], out["cores"] = (b / t * cores if t > 0 else math.nan for b, t in busy.values())
    return out


ALL_SINKS = ("journal", "wandb", "mlflow", "tensorboard", "console")
MAIN_CASES = ("journal", "all-sqlite", "all-fast", "all-slow", "all-dead", "thread-sqlite")


def pool(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One case's rounds as one result: samples pooled, CPU figures averaged, the worst of the rest."""
    out = dict(rounds[-1])
    for key in ("step", "baseline", "metrics", "reduce", "publish", "pairs"):
        out[key] = [x for r in rounds for x in r[key]]
    for key in ("background_cpu", "helpers_cpu", "baseline_cores", "cores"):
        out[key] = sum(r[key] for r in rounds) / len(rounds)
    out["start_s"], out["close_s"] = max(r["start_s"] for r in rounds), max(r["close_s"] for r in rounds)
    out["writes"] = {n: {k: [x for r in rounds for x in r["writes"].get(n, {}).get(k, [])] for k in ("wall", "cpu")}
                     for n in rounds[-1]["writes"]}
    out["held"] = {n: min(r["held"][n] for r in rounds) for n in rounds[-1]["held"]}
    out["failures"] = {n: sum(r["failures"].get(n, 0) for r in rounds) for r in rounds for n in r["failures"]}
    out["dropped"] = {n: max(r["dropped"].get(n, 0) for r in rounds) for r in rounds for n in r["dropped"]}
    out["warnings"] = [w for r in rounds for w in r["warnings"]]
    out["status"] = "/".join(dict.fromkeys(str(r["status"]) for r in rounds))
    return out


def make_sinks(names: tuple[str, ...], folder: Path, mlflow_uri: str, stream: Any) -> list[Any]:
    makers: dict[str, Callable[[], Any]] = {
        "journal": lambda: JournalSink(folder / "journal.jsonl"),
        "wandb": lambda: WandbSink(project="posttrain-metrics-bench", dir=folder, mode="offline",
                                   settings={"quiet": True}),
        "mlflow": lambda: MlflowSink(tracking_uri=mlflow_uri, experiment_name="bench-publish"),
        "tensorboard": lambda: TensorBoardSink(log_dir=folder / "tensorboard"),
        "console": lambda: ConsoleSink(stream=stream),
    }
    return [makers[name]() for name in names]


def run_case(name: str, sinks_used: tuple[str, ...], uri: str, server_uri: str, root: Path,
             work: Callable[[], None], windows: list[list[dict[str, object]]], cfg: dict[str, Any],
             mode: str = "process") -> dict[str, Any]:
    """The interleaved baseline and metrics loop with the given sinks; close; check every sink holds
    every frame."""
    folder = root / name
    run_id = f"bench-{name}-{int(time.time())}"
    with open(os.devnull, "w") as devnull:
        if uri == "sqlite":
            uri = server_uri = f"sqlite:///{folder / 'mlflow.db'}"  # the README's default: embedded
        sinks = make_sinks(sinks_used, folder, uri, devnull)
        writes = {s.name: timed_writes(s) for s in sinks}  # in the publisher process: not timed here
        pub = Publisher(sinks, adapters=GRPO_ADAPTERS, run_name=f"bench-{name}", run_id=run_id, mode=mode,
                        close_timeout=300)
        t0 = time.perf_counter()
        pub.start({"bench": {"case": name}})
        started = time.perf_counter() - t0
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            samples = interleaved_loop(work, windows, cfg["warmup"], cfg["block"], pub, cfg.get("server_pgid"))
            t0 = time.perf_counter()
            pub.close()
            closed = time.perf_counter() - t0
    report = pub._report()
    held = check_sinks(sinks_used, folder, server_uri, run_id)
    total = len(windows)
    return {
        "sinks": sinks_used, **samples, "start_s": started, "close_s": closed,
        "writes": {n: w for n, w in writes.items() if w["wall"]},
        "dropped": {n: total - v for n, v in held.items() if v != total}, "failures": dict(pub.failures),
        "warnings": [str(w.message) for w in caught], "status": report.get("status", "?"),
        "held": held, "folder": folder, "mode": mode,
    }


def check_sinks(sinks_used: tuple[str, ...], folder: Path, server_uri: str, run_id: str) -> dict[str, int]:
    """How many frames each sink holds, read back with the vendors' own readers (W&B: at the end,
    once wandb has finished writing its offline logs)."""
    held = {"journal": len(read_journal(folder / "journal.jsonl").frames)}
    if "tensorboard" in sinks_used:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        events = EventAccumulator(str(folder / "tensorboard"), size_guidance={"scalars": 0})
        events.Reload()
        held["tensorboard"] = len(events.Scalars(PROBE_KEY))
    if "mlflow" in sinks_used:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=server_uri)  # straight from the server, not through the proxy
        experiment = client.get_experiment_by_name("bench-publish")
        runs = [] if experiment is None else client.search_runs(
            [experiment.experiment_id], filter_string=f"tags.`{RUN_ID_TAG}` = '{run_id}'")
        held["mlflow"] = len(client.get_metric_history(runs[0].info.run_id, PROBE_KEY)) if runs else 0
    return held


DEAD_URI = "http://127.0.0.1:9"  # the discard port: nothing answers


def wandb_rows(folder: Path) -> int:
    """Rows over every offline run file of the case (a restarted publisher writes a second one)."""
    from posttrain_metrics.integrations.wandb_reader import read_offline_run

    return sum(1 for file in folder.rglob("run-*.wandb") for row in read_offline_run(file).history
               if PROBE_KEY in row)


# -- report -------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--block", type=int, default=50, help="baseline and metrics steps alternate in blocks of this")
    parser.add_argument("--work-ms", type=float, default=10.0, help="torch work per step (default 10 ms)")
    parser.add_argument("--delay", type=float, default=2.0, help="seconds the slow proxy adds per request")
    parser.add_argument("--switch-interval", type=float, default=None,
                        help="sys.setswitchinterval in seconds (default: Python's, 0.005)")
    parser.add_argument("--no-attribution", action="store_true",
                        help="skip the per-sink cases (journal + one sink each)")
    parser.add_argument("--cases", nargs="+", choices=MAIN_CASES, default=list(MAIN_CASES),
                        help="the main cases to run (journal is always run: the ratios are against it)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run the main cases this many times in turn and pool the samples, so that each "
                             "sees the machine's load as it drifts (default 1)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", default=None, help="also write the raw medians to this file")
    args = parser.parse_args()
    cfg = {"steps": 60 if args.quick else args.steps, "warmup": 10 if args.quick else args.warmup,
           "block": 30 if args.quick else args.block}
    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "WANDB_MODE"):
        os.environ.pop(var, None)
    torch.set_num_threads(1)
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)

    windows = make_windows(cfg["steps"] + cfg["warmup"])
    k = check_reducer(windows)
    work = make_work(args.work_ms)
    print(f"# training-thread overhead of a full publish ({machine()})\n")
    print(f"1 process, 1 rank (local reduce; collectives: bench_reduce.py). K = {k} public keys per frame "
          f"(grpo + reward + trainer, label indicators included), {CHUNKS} chunks per window, "
          f"{cfg['steps']} steps after {cfg['warmup']} warm-up; step = {args.work_ms:g} ms of torch matmuls "
          f"on 1 thread; GIL switch interval {sys.getswitchinterval() * 1e3:g} ms. Sinks: journal + console to "
          "/dev/null (training thread) + W&B offline + MLflow + TensorBoard (the publisher process, unless in-process "
          "mode). Times in microseconds.\n")

    results: dict[str, dict[str, Any]] = {}
    labels = {"journal": "journal only", "all-sqlite": "all five, MLflow embedded sqlite:/// (README default)",
              "all-fast": "all five, MLflow server", "all-slow": f"all five, MLflow slow (+{args.delay:g} s/request)",
              "all-dead": "all five, MLflow dead", "thread-sqlite": "all five, embedded MLflow, in-process mode"}
    attribution = {} if args.no_attribution else {
        "console": ("journal", "console"), "tensorboard": ("journal", "tensorboard"),
        "wandb": ("journal", "wandb"), "mlflow": ("journal", "mlflow"),
    }
    labels.update({name: " + ".join(sinks) for name, sinks in attribution.items()})
    with tempfile.TemporaryDirectory(prefix="bench-publish-") as tmp:
        root = Path(tmp)
        proc, server = start_server(root / "mlflow-server")
        cfg["server_pgid"] = proc.pid  # start_new_session: the server leads its own process group
        try:
            cases = ["journal", *(c for c in args.cases if c != "journal")]
            rounds: dict[str, list[dict[str, Any]]] = {case: [] for case in cases}
            for r in range(args.rounds):
                tag = f"-r{r + 1}" if args.rounds > 1 else ""
                for case in cases:
                    if case == "journal":
                        res = run_case("journal" + tag, ("journal",), server, server, root, work, windows, cfg)
                    elif case == "all-slow":
                        with slow_proxy(server, args.delay) as slow_uri:
                            res = run_case(case + tag, ALL_SINKS, slow_uri, server, root, work, windows, cfg)
                    else:
                        uri = {"all-sqlite": "sqlite", "all-fast": server, "all-dead": DEAD_URI,
                               "thread-sqlite": "sqlite"}[case]
                        res = run_case(case + tag, ALL_SINKS, uri, server, root, work, windows, cfg,
                                       mode="thread" if case == "thread-sqlite" else "process")
                    rounds[case].append(res)
            for name, sinks in attribution.items():
                results[name] = run_case(name, sinks, server, server, root, work, windows, cfg)
        finally:
            stop_server(proc)
        import wandb

        wandb.teardown()  # the offline logs are complete on disk
        for res in [*results.values(), *(r for case in rounds.values() for r in case)]:
            if "wandb" in res["sinks"]:
                res["held"]["wandb"] = wandb_rows(res["folder"])
        total = cfg["steps"] + cfg["warmup"]
        for done in rounds.values():
            for res in done:
                res["dropped"] = {n: total - v for n, v in res["held"].items() if v != total}
        results = {**{case: pool(done) for case, done in rounds.items()}, **results}

    overhead = {case: stats(res["step"])[0] - stats(res["baseline"])[0] for case, res in results.items()}
    journal_only = overhead["journal"]

    def us(samples: list[float]) -> str:
        median, p90 = stats(samples)
        return f"{median * 1e6:.0f} / {p90 * 1e6:.0f}"

    pairs = {case: stats(res["pairs"])[0] for case, res in results.items()}

    def times(a: float, b: float) -> float:
        return a / b if b > 0 else float("nan")

    print("| sinks | baseline step | step with metrics | overhead (median) | x journal only | overhead, median of "
          "block pairs | x journal only | metrics section "
          "(add x4 + reduce + publish) | of which publish | CPU of other threads per step | CPU of MLflow server, "
          "wandb-core, proxy per step | machine cores busy: baseline / with metrics |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for case, res in results.items():
        ratio, paired = times(overhead[case], journal_only), times(pairs[case], pairs["journal"])
        print(f"| {labels[case]} | {us(res['baseline'])} | {us(res['step'])} | {overhead[case] * 1e6:.0f} | "
              f"{ratio:.2f} | {pairs[case] * 1e6:.0f} | {paired:.2f} | {us(res['metrics'])} | {us(res['publish'])} | {res['background_cpu'] * 1e6:.0f} | "
              f"{res['helpers_cpu'] * 1e6:.0f} | "
              f"{res['baseline_cores']:.2f} / {res['cores']:.2f} |")
    print("\nmicroseconds, median / p90. Overhead = median step with metrics minus median baseline step (the "
          "same torch work with no metrics, in blocks alternating with the metrics steps); it includes the time the training "
          "thread waits for the GIL held by the sink threads, and for a core taken by the other processes (the MLflow "
          "server, wandb-core, anything else running). The metrics section is timed directly; CPU of other threads "
          "is this process's CPU time minus the training thread's (they take the GIL); the MLflow server, wandb-core "
          "and the proxy are other processes (they take a core: there are 2); cores busy is the whole machine "
          "(/proc/stat), other people's work included.\n")

    total = cfg["steps"] + cfg["warmup"]
    print("| sinks | start() s | close() (drain) s | frames missing from a tracker | sink failures | publisher status "
          "| frames held |")
    print("|---|---:|---:|---|---|---|---|")
    for case, res in results.items():
        held = ", ".join(f"{k} {v}" for k, v in res["held"].items())
        print(f"| {labels[case]} | {res['start_s']:.2f} | {res['close_s']:.2f} | {res['dropped'] or 'none'} | "
              f"{res['failures'] or 'none'} | {res['status']} | {held} (of {total}) |")
    print("\nsink `write` in this process (the journal and the console on the training thread; the in-process "
          "mode's trackers on its thread; the publisher process's are not timed here), microseconds median / p90, "
          "wall time then CPU time of that thread:\n")
    print("| sinks | " + " | ".join(ALL_SINKS) + " |")
    print("|---|" + "---:|" * len(ALL_SINKS))
    for case, res in results.items():
        cells = [f"{us(res['writes'][n]['wall'])}; cpu {us(res['writes'][n]['cpu'])}" if n in res["writes"] else "-"
                 for n in ALL_SINKS]
        print(f"| {labels[case]} | " + " | ".join(cells) + " |")
    for case, res in results.items():
        for text in dict.fromkeys(res["warnings"]):
            print(f"\nwarning during {labels[case]}: {text}")
    print(f"\nload average after: {load()}\n")

    if "all-sqlite" in overhead:
        sqlite = overhead["all-sqlite"]
        print(f"- target median overhead <= 1 ms at K = {k} with the README's default sinks (embedded MLflow): "
              f"{'met' if sqlite <= 1e-3 else 'MISSED'} ({sqlite * 1e6:.0f} us; median of block pairs "
              f"{pairs['all-sqlite'] * 1e6:.0f} us)")
        ratio = times(sqlite, journal_only)
        print(f"- target within 1.2x of the journal-only overhead ({journal_only * 1e6:.0f} us): "
              f"{'met' if sqlite <= 1.2 * journal_only else 'MISSED'} ({ratio:.2f} x; median of block pairs "
              f"{times(pairs['all-sqlite'], pairs['journal']):.2f} x)")
        for case in [c for c in ("all-fast", "all-slow", "all-dead") if c in overhead]:
            within = overhead[case] <= 1e-3 and overhead[case] <= 1.2 * journal_only
            print(f"- {labels[case]}: {overhead[case] * 1e6:.0f} us ({times(overhead[case], journal_only):.2f} x journal "
                  f"only; block pairs {times(pairs[case], pairs['journal']):.2f} x): {'met' if within else 'MISSED'}")
    missing = {labels[c]: r["held"] for c, r in results.items()
               if c != "all-dead" and any(v != total for v in r["held"].values())}
    print(f"- check, every sink holds every frame (MLflow dead aside): {'yes' if not missing else f'NO: {missing}'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": datetime.date.today().isoformat(), "k": k,
                       "overhead_us": {c: v * 1e6 for c, v in overhead.items()},
                       "pairs_us": {c: v * 1e6 for c, v in pairs.items()},
                       "close_s": {c: r["close_s"] for c, r in results.items()}}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
