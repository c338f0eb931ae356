"""Single-controller reduction of one step: our portable states against verl's dict-of-lists mean.

A Ray driver (verl, OpenRLHF) collects what each worker returns for a step and reduces it. Two ways
of doing that, on the same GRPO windows (grpo + reward + trainer adapters, 58 of their 61 declared
keys reported, all but the window's update counts added later: ``tests/_runs.grpo_chunk`` plus its optional keys; C chunks per worker), for W = 2, 8
and 64 workers:

- ours: each worker returns ``WorkerMetrics.export(step)`` (a compact dict of the packed window);
  the driver validates and merges them with ``DriverReducer.merge`` (exact);
- dict-of-lists mean (verl's ``reduce_metrics``): each worker returns ``{key: [one value per
  chunk]}``; the driver concatenates the lists and takes ``np.max`` / ``np.min`` when the key's
  name says so, else ``np.mean``. Labels cannot be averaged, so that baseline drops them.

Printed per method: the driver's time per step (median / p90, microseconds), the worker's time to
produce what it returns, the JSON bytes one worker ships and the bytes of the whole step, and how
many published figures differ from the exact ones (relative error > 1e-9). A second table scales
the chunks per window at W = 8: our bytes do not grow with it, the lists do.

Workers are simulated in one process: the driver's work and the shipped bytes are what is measured;
Ray's own transport cost (the same for both, proportional to the bytes) is not included.

    python benchmarks/bench_driver.py            # full run (about a minute)
    python benchmarks/bench_driver.py --quick    # fewer iterations, for a smoke test
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "tests") not in sys.path:
    sys.path.insert(0, str(ROOT / "tests"))  # the realistic chunks of the tests

from _runs import GRPO_ADAPTERS, grpo_chunk  # noqa: E402

from posttrain_metrics import get_adapter, reduce_metrics  # noqa: E402
from posttrain_metrics.core.portable import DriverReducer, WorkerMetrics  # noqa: E402

ADAPTERS = [get_adapter(name) for name in GRPO_ADAPTERS]
PUBLIC = {source: f"{m.namespace or 'train'}/{m.leaf}" for a in ADAPTERS for source, m in a.metrics.items()}


def full_chunk(rng: random.Random, step: int, last: bool) -> dict[str, object]:
    """``grpo_chunk`` plus the optional keys it leaves out (sequence clip, routing replay, score
    centering, dynamic sampling, skip reason), so that 58 of the 61 declared keys are published (not the
    window's update counts ``updates_<outcome>``, declared after these benchmarks were first run)."""
    chunk = grpo_chunk(rng, step, last)
    tokens = int(chunk["grpo_valid_token_count"])  # type: ignore[call-overload]
    chunk.update(
        grpo_seq_clip_frac=rng.uniform(0, 0.3), grpo_seq_log_ratio_abs=rng.uniform(0, 0.1),
        grpo_routing_replay_pinned_tokens=rng.randint(0, tokens), grpo_routing_replay_pinned_blocks=2.0,
        grpo_sc_token_count=tokens, grpo_sc_head_mass_q=rng.uniform(0.8, 1), grpo_sc_head_mass_p=rng.uniform(0.8, 1),
        grpo_sc_rho_mean=rng.uniform(0.9, 1.1), grpo_sc_rho_max=rng.uniform(1, 3), grpo_sc_kl_head=rng.uniform(0, 0.1),
        grpo_sc_correction_abs=rng.uniform(0, 0.1), grpo_sc_token_weight=rng.uniform(0.5, 1),
        grpo_sc_out_of_head_frac=rng.uniform(0, 0.05),
    )
    if last:
        chunk.update(
            grpo_dynamic_sampling_extra_rollouts=rng.randint(0, 8), grpo_dynamic_sampling_refill_dispatches=2,
            grpo_dynamic_sampling_idle_cells=rng.randint(0, 4), grpo_dynamic_sampling_batch_informative_groups=3,
            grpo_dynamic_sampling_avoided_prompts=rng.randint(0, 2),
            grpo_dynamic_sampling_dropped_trajectories=rng.randint(0, 2), skip_reason="nonfinite_loss",
        )
    return chunk


def make_data(workers: int, chunks: int, step: int) -> list[list[dict[str, object]]]:
    rng = random.Random(workers * 1_000_003 + chunks * 101 + step)
    return [[full_chunk(rng, step, c == chunks - 1) for c in range(chunks)] for _ in range(workers)]


# -- what each worker returns ------------------------------------------------------------------------------


def ours_worker(chunks: list[dict[str, object]], worker: int, step: int) -> dict[str, Any]:
    metrics = WorkerMetrics(GRPO_ADAPTERS, worker_id=f"actor-{worker}")
    for chunk in chunks:
        metrics.add(chunk)
    return metrics.export(step)


def lists_worker(chunks: list[dict[str, object]]) -> dict[str, list[float]]:
    """verl's ``append_to_dict`` per micro-batch, keyed by the public name; labels dropped."""
    out: dict[str, list[float]] = {}
    for chunk in chunks:
        for source, value in chunk.items():
            if source in PUBLIC and not isinstance(value, str):
                out.setdefault(PUBLIC[source], []).append(float(value))  # type: ignore[arg-type]
    return out


# -- what the driver does ------------------------------------------------------------------------------------


def lists_driver(returned: list[dict[str, list[float]]]) -> dict[str, float]:
    """verl: ``DataProto.concat`` extends the lists, then ``reduce_metrics`` reduces each one."""
    merged: dict[str, list[float]] = {}
    for worker in returned:
        for key, values in worker.items():
            merged.setdefault(key, []).extend(values)
    out = {}
    for key, values in merged.items():
        if "max" in key:
            out[key] = float(np.max(values))
        elif "min" in key:
            out[key] = float(np.min(values))
        else:
            out[key] = float(np.mean(values))
    return out


def off_exact(got: Mapping[str, Any], exact: Mapping[str, Any]) -> int:
    """Published figures that differ from the exact ones (a key the method cannot publish counts)."""
    wrong = 0
    for key, want in exact.items():
        value = got.get(key)
        if value is None or isinstance(want, str):
            wrong += value != want
        elif not math.isclose(float(value), float(want), rel_tol=1e-9, abs_tol=1e-12):
            wrong += 1
    return wrong


def timed(fn: Callable[[], Any], iters: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return samples


def stats(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def json_bytes(obj: object) -> int:
    return len(json.dumps(obj, separators=(",", ":")).encode())


def bench(workers: int, chunks: int, iters: int, warmup: int) -> dict[str, dict[str, float]]:
    step = 3
    data = make_data(workers, chunks, step)
    exact = reduce_metrics(GRPO_ADAPTERS, data)
    driver = DriverReducer(GRPO_ADAPTERS)
    states = [ours_worker(c, i, step) for i, c in enumerate(data)]
    lists = [lists_worker(c) for c in data]
    ours_frame = driver.merge(states, step=step)
    if ours_frame.metrics != exact:
        raise SystemExit(f"W={workers}: the merged states differ from reduce_metrics; nothing to compare")
    results = {}
    for name, drive, work, shipped, got in (
        ("ours: merge W states", lambda: driver.merge(states, step=step),
         lambda: ours_worker(data[0], 0, step), states, ours_frame.metrics),
        ("dict-of-lists mean (verl)", lambda: lists_driver(lists),
         lambda: lists_worker(data[0]), lists, lists_driver(lists)),
    ):
        driver_median, driver_p90 = stats(timed(drive, iters, warmup))
        worker_median, _ = stats(timed(work, iters, warmup))
        sizes = [json_bytes(s) for s in shipped]
        results[name] = {
            "driver_median_us": driver_median * 1e6, "driver_p90_us": driver_p90 * 1e6,
            "worker_median_us": worker_median * 1e6, "bytes_per_worker": max(sizes),
            "bytes_per_step": sum(sizes), "off_exact": off_exact(got, exact), "published": len(exact),
        }
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 8, 64])
    parser.add_argument("--chunks", type=int, default=4)
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", default=None, help="also write the raw numbers to this file")
    args = parser.parse_args()
    iters, warmup = (30, 3) if args.quick else (args.iters, 20)
    report: dict[str, Any] = {"date": datetime.date.today().isoformat(), "cpus": os.cpu_count(),
                              "numpy": np.__version__, "python": sys.version.split()[0], "runs": {}, "chunks": {}}
    print(f"# driver-side reduction of one GRPO step ({os.cpu_count()} cores), {args.chunks} chunks per worker, "
          f"{iters} steps per method; times in microseconds (median / p90); bytes = compact JSON\n")
    print("| W | method | driver median us | driver p90 us | worker us | bytes/worker | bytes/step | figures off exact |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for workers in args.workers:
        scaled = max(5, iters * 2 // workers) if workers > 8 else iters
        results = bench(workers, args.chunks, scaled, warmup)
        report["runs"][workers] = results
        for name, r in results.items():
            print(f"| {workers} | {name} | {r['driver_median_us']:.0f} | {r['driver_p90_us']:.0f} | "
                  f"{r['worker_median_us']:.0f} | {r['bytes_per_worker']:.0f} | {r['bytes_per_step']:.0f} | "
                  f"{r['off_exact']:.0f} of {r['published']:.0f} |")
    print("\n## W = 8, chunks per window: bytes one worker ships")
    print("| chunks | ours bytes/worker | dict-of-lists bytes/worker | ours driver us | dict-of-lists driver us |")
    print("|---:|---:|---:|---:|---:|")
    for chunks in (1, 4, 16, 64):
        results = bench(8, chunks, max(5, iters // 4), warmup)
        ours, lists = results["ours: merge W states"], results["dict-of-lists mean (verl)"]
        report["chunks"][chunks] = results
        print(f"| {chunks} | {ours['bytes_per_worker']:.0f} | {lists['bytes_per_worker']:.0f} | "
              f"{ours['driver_median_us']:.0f} | {lists['driver_median_us']:.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
