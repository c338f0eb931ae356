"""Cross-rank reduction of one step: ours against the designs users would otherwise use.

Runs torch.distributed (gloo, CPU) in 2 and 4 processes for K = 10, 60, 250 keys and prints, per
method, the median and p90 time per step and the ratio to ours, all measured in the same run:

- ours: ``MetricReducer.reduce`` (local packing of the window's chunks, 1 all_gather, read-out);
- ours-collectives: only our two collectives and read-out of an already packed state;
- per-key all_reduce: one collective per key (Lightning ``sync_dist`` / OpenRLHF style), made exact;
- gather+barrier: a barrier and one ``all_gather`` per state (torchmetrics style);
- pickled dict: ``all_gather_object`` of the whole state dict, reduced on every rank;
- floor: one ``all_reduce`` of K floats (no semantics at all).

Every baseline's numbers are checked against ours before timing, so no ratio compares different
work. A second table scales chunks per window 1 -> 64 at K = 60.

    python benchmarks/bench_reduce.py            # full run (a few minutes on 2 cores)
    python benchmarks/bench_reduce.py --quick    # smaller, for a smoke test
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import random
import socket
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from posttrain_metrics import Metric, MetricAdapter, MetricReducer, Reduction, reduce_metrics
from posttrain_metrics.core.distributed import all_reduce_state

KINDS = (Reduction.WEIGHTED_MEAN, Reduction.WEIGHTED_MEAN, Reduction.SUM, Reduction.MAX, Reduction.MIN,
         Reduction.MEAN)


def make_adapter(k: int) -> MetricAdapter:
    """K keys: one token count (the weight) and K-1 keys cycling through the reductions."""
    metrics = [Metric("tokens", Reduction.SUM, "weight")]
    for i in range(k - 1):
        kind = KINDS[i % len(KINDS)]
        metrics.append(Metric(f"m{i}", kind, "bench", weight="tokens" if kind is Reduction.WEIGHTED_MEAN else None))
    return MetricAdapter(f"bench{k}", internal_prefix="b_", metrics=metrics)


def make_chunks(adapter: MetricAdapter, rank: int, chunks: int, step: int) -> list[dict[str, float]]:
    rng = random.Random(rank * 1_000_003 + step)
    out = []
    for _ in range(chunks):
        chunk: dict[str, float] = {"b_tokens": float(rng.randint(10, 500))}
        for source in adapter.metrics:
            if source != "b_tokens":
                chunk[source] = rng.uniform(-1.0, 1.0)
        out.append(chunk)
    return out


# -- baselines: each reduces the same per-rank chunks exactly ---------------------------------------


def local_states(adapter: MetricAdapter, chunks: list[dict[str, float]]) -> dict[str, list[float]]:
    """Per key, the exact local state a correct baseline must ship: [vw, w], [sum], [max], [min], [sum, n]."""
    states: dict[str, list[float]] = {}
    for source, metric in adapter.metrics.items():
        r = metric.reduction
        values = [c[source] for c in chunks]
        if r is Reduction.WEIGHTED_MEAN:
            states[source] = [sum(c[source] * c["b_tokens"] for c in chunks), sum(c["b_tokens"] for c in chunks)]
        elif r is Reduction.SUM:
            states[source] = [sum(values)]
        elif r is Reduction.MAX:
            states[source] = [max(values)]
        elif r is Reduction.MIN:
            states[source] = [min(values)]
        else:
            states[source] = [sum(values), float(len(values))]
    return states


def finish(adapter: MetricAdapter, merged: dict[str, list[float]]) -> dict[str, float]:
    out = {}
    for source, metric in adapter.metrics.items():
        s = merged[source]
        r = metric.reduction
        key = f"train/{metric.leaf}"
        if r is Reduction.WEIGHTED_MEAN:
            out[key] = s[0] / s[1] if s[1] else 0.0
        elif r is Reduction.MEAN:
            out[key] = s[0] / s[1]
        else:
            out[key] = s[0]
    return out


def op_of(metric: Metric) -> Any:
    return {Reduction.MAX: dist.ReduceOp.MAX, Reduction.MIN: dist.ReduceOp.MIN}.get(metric.reduction, dist.ReduceOp.SUM)


def per_key_all_reduce(adapter: MetricAdapter, chunks: list[dict[str, float]]) -> dict[str, float]:
    states = local_states(adapter, chunks)
    merged = {}
    for source, metric in adapter.metrics.items():
        t = torch.tensor(states[source], dtype=torch.float64)
        dist.all_reduce(t, op=op_of(metric))
        merged[source] = t.tolist()
    return finish(adapter, merged)


def gather_with_barrier(adapter: MetricAdapter, chunks: list[dict[str, float]]) -> dict[str, float]:
    states = local_states(adapter, chunks)
    world = dist.get_world_size()
    merged = {}
    for source, metric in adapter.metrics.items():
        dist.barrier()
        parts = []
        for value in states[source]:  # one all_gather per state, as torchmetrics does
            t = torch.tensor([value], dtype=torch.float64)
            out = [torch.empty_like(t) for _ in range(world)]
            dist.all_gather(out, t)
            parts.append([o.item() for o in out])
        merged[source] = [_combine(metric, column) for column in parts]
    return finish(adapter, merged)


def pickled_dict(adapter: MetricAdapter, chunks: list[dict[str, float]]) -> dict[str, float]:
    states = local_states(adapter, chunks)
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, states)
    merged = {
        source: [_combine(metric, [g[source][i] for g in gathered]) for i in range(len(states[source]))]
        for source, metric in adapter.metrics.items()
    }
    return finish(adapter, merged)


def _combine(metric: Metric, column: list[float]) -> float:
    if metric.reduction is Reduction.MAX:
        return max(column)
    if metric.reduction is Reduction.MIN:
        return min(column)
    return math.fsum(column)


def floor(k: int) -> Callable[[], None]:
    t = torch.zeros(k, dtype=torch.float64)

    def run() -> None:
        dist.all_reduce(t)
        t.tolist()

    return run


# -- the harness --------------------------------------------------------------------------------------


def time_it(fn: Callable[[], Any], iters: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    # the slowest rank decides a step's time
    t = torch.tensor(samples, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def close(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(math.isclose(a[k], b[k], rel_tol=1e-9, abs_tol=1e-12) for k in a)


def bench_keys(k: int, rank: int, world: int, cfg: dict[str, Any]) -> dict[str, list[float]]:
    """Every method at K keys, after checking that each baseline produces our numbers."""
    adapter = make_adapter(k)
    chunks = make_chunks(adapter, rank, cfg["chunks"], 0)
    reducer = MetricReducer(adapter)
    for c in chunks:
        reducer.add(c)
    ours = dict(reducer.reduce(0).metrics)
    offline = reduce_metrics(adapter, [make_chunks(adapter, r, cfg["chunks"], 0) for r in range(world)])
    checks = {"offline": offline, "per-key all_reduce": per_key_all_reduce(adapter, chunks),
              "gather+barrier": gather_with_barrier(adapter, chunks), "pickled dict": pickled_dict(adapter, chunks)}
    for name, got in checks.items():
        if not close(ours, got):
            raise SystemExit(f"K={k}: {name} disagrees with ours; the benchmark would compare different work")
    packed = reducer.layout.accumulate(chunks, rank=rank)

    def ours_step() -> None:
        for c in chunks:
            reducer.add(c)
        reducer.reduce(0)

    def ours_collectives() -> None:
        reducer.layout.read(all_reduce_state(packed), phase="train", world_size=world)

    methods = {
        "ours": ours_step,
        "ours-collectives": ours_collectives,
        "per-key all_reduce": lambda: per_key_all_reduce(adapter, chunks),
        "gather+barrier": lambda: gather_with_barrier(adapter, chunks),
        "pickled dict": lambda: pickled_dict(adapter, chunks),
        "floor: 1 all_reduce of K floats": floor(k),
    }
    slow = {"gather+barrier", "per-key all_reduce"} if k >= 250 else set()
    return {name: time_it(fn, cfg["iters"] // (4 if name in slow else 1), cfg["warmup"]) for name, fn in methods.items()}


def worker(rank: int, world: int, port: int, cfg: dict[str, Any], out: Any) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    results: dict[str, Any] = {"keys": {k: bench_keys(k, rank, world, cfg) for k in cfg["keys"]}, "chunks": {}}
    adapter = make_adapter(60)
    reducer = MetricReducer(adapter)
    for n in cfg["chunk_counts"]:
        chunks = make_chunks(adapter, rank, n, 1)

        def step(chunks: list[dict[str, float]] = chunks) -> None:
            for c in chunks:
                reducer.add(c)
            reducer.reduce(1)

        results["chunks"][n] = time_it(step, cfg["iters"], cfg["warmup"])
    if rank == 0:
        out.put(results)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stats(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--keys", type=int, nargs="+", default=[10, 60, 250])
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", default=None, help="also write the raw medians to this file")
    args = parser.parse_args()
    cfg = {"keys": args.keys, "iters": 40 if args.quick else args.iters, "warmup": 5 if args.quick else 20,
           "chunks": 4, "chunk_counts": [1, 4, 16, 64]}
    report: dict[str, Any] = {"date": datetime.date.today().isoformat(), "cpus": os.cpu_count(),
                              "torch": torch.__version__, "python": sys.version.split()[0], "runs": {}}
    print(f"# cross-rank reduction, gloo on CPU ({os.cpu_count()} cores), {cfg['chunks']} chunks per window, "
          f"{cfg['iters']} steps per method; times in microseconds (median / p90); ratio = median / ours\n")
    for world in args.ranks:
        ctx = mp.get_context("spawn")
        queue = ctx.SimpleQueue()
        mp.start_processes(worker, args=(world, free_port(), cfg, queue), nprocs=world, join=True,
                           start_method="spawn")
        results = queue.get()
        report["runs"][world] = {}
        for k, methods in results["keys"].items():
            ours_median = stats(methods["ours"])[0]
            print(f"## {world} ranks, K = {k}")
            print("| method | median us | p90 us | x ours |")
            print("|---|---:|---:|---:|")
            for name, samples in methods.items():
                median, p90 = stats(samples)
                print(f"| {name} | {median * 1e6:.0f} | {p90 * 1e6:.0f} | {median / ours_median:.2f} |")
                report["runs"][world].setdefault(str(k), {})[name] = median
            print()
        print(f"## {world} ranks, K = 60, chunks per window")
        print("| chunks | median us | p90 us |")
        print("|---:|---:|---:|")
        for n, samples in results["chunks"].items():
            median, p90 = stats(samples)
            print(f"| {n} | {median * 1e6:.0f} | {p90 * 1e6:.0f} |")
            report["runs"][world].setdefault("chunks", {})[str(n)] = median
        print()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
