"""Costs of issue 16: sample completions, the run's record at close, the user's own keys.

- Samples: bytes per step in ``journal.samples.jsonl`` (rows with a ~300-character prompt and a
  ~1,500-character completion, 16 and 64 kept per step); the training thread's cost of
  ``on_samples`` (select + append) for 256 offered rows; the time each tracker takes to publish one
  64-row table (``write_samples``), against the same sink's ``write`` of one 61-key frame measured
  in the same run (the ratio says what a table costs in scalar steps).
- The record at close (journal, config, doctor's report, dashboard PNG): the time to write it for a
  journal of ``--steps`` steps.
- User keys: ``reduce`` time of grpo + reward + trainer with 8 ``extra`` keys against without.

    python benchmarks/bench_samples.py            # full
    python benchmarks/bench_samples.py --quick
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import GRPO_ADAPTERS, full_chunk, load, machine, reduced_frames

from posttrain_metrics import MetricReducer
from posttrain_metrics.callbacks import MetricsCallback
from posttrain_metrics.callbacks.samples import select
from posttrain_metrics.core.extra import user_adapters
from posttrain_metrics.integrations.base import RunInfo
from posttrain_metrics.journal import JournalSink
from posttrain_metrics.journal.samples import samples_path
from posttrain_metrics.publication import Publisher
from posttrain_metrics.publication.artifacts import write_record

WORDS = ["the", "of", "model", "reward", "group", "token", "policy", "answer", "step", "because", "therefore"]


def text(rng: random.Random, chars: int) -> str:
    out: list[str] = []
    while sum(len(w) + 1 for w in out) < chars:
        out.append(rng.choice(WORDS))
    return " ".join(out)[:chars]


def rows(rng: random.Random, n: int, group_size: int = 8) -> list[dict[str, Any]]:
    return [{"group": i // group_size, "prompt": text(rng, 300), "completion": text(rng, rng.randint(1000, 2000)),
             "reward": rng.random(), "advantage": rng.uniform(-1, 1)} for i in range(n)]


def median_ms(fn: Callable[[], object], n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def bench_samples_file(iters: int) -> None:
    rng = random.Random(0)
    print("## Samples file and the training thread\n")
    print("| kept per step | bytes per step | on_samples (256 rows offered), median ms |")
    print("|---|---|---|")
    for limit in (16, 64):
        with tempfile.TemporaryDirectory() as d:
            cb = MetricsCallback(adapters=["trainer"], out_dir=d, publisher="inline", samples_per_step=limit,
                                 sinks=[{"type": "journal"}])
            cb.on_run_start({})
            offered = rows(rng, 256)
            steps = iter(range(iters))
            ms = median_ms(lambda c=cb, it=steps, r=offered: c.on_samples(next(it), r), iters)
            cb.on_run_end()
            size = samples_path(Path(d) / "journal.jsonl").stat().st_size
            print(f"| {limit} | {size / iters:,.0f} | {ms:.2f} |")
    print()


def bench_sinks(iters: int, mlflow_uri: str | None) -> None:
    from posttrain_metrics.integrations.mlflow import MlflowSink
    from posttrain_metrics.integrations.tensorboard import TensorBoardSink
    from posttrain_metrics.integrations.wandb import WandbSink

    rng = random.Random(1)
    table = select(1, rows(rng, 64), limit=64)
    frames = reduced_frames(iters + 1)
    pub = Publisher([], adapters=GRPO_ADAPTERS)
    keys = pub.keys
    run = RunInfo("benchsamples", "bench-samples", {}, keys, tuple(GRPO_ADAPTERS), time.time())
    size = len(json.dumps(table.to_record()).encode())
    print(f"## Publishing one 64-row table ({size:,} bytes as JSON) per sink\n")
    print("| sink | write_samples (64 rows), median ms | write (one 61-key frame), median ms | ratio |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        sinks: list[tuple[str, Any]] = [
            ("tensorboard", TensorBoardSink(log_dir=Path(d) / "tb")),
            ("mlflow (embedded sqlite)", MlflowSink(dir=Path(d), experiment_name="bench")),
            ("wandb (offline)", WandbSink(project="bench", dir=Path(d), settings={"quiet": True})),
        ]
        if mlflow_uri:
            sinks.insert(2, ("mlflow (server)", MlflowSink(tracking_uri=mlflow_uri, dir=Path(d), experiment_name="bench")))
        for name, sink in sinks:
            sink.start(run)
            fit = iter(frames)

            def frame_write(s: Any = sink, it: Any = fit) -> None:
                s.write(next(it))
                if hasattr(s, "end_batch"):
                    s.end_batch()

            steps = iter(range(1, 10**6))
            frame_ms = median_ms(frame_write, iters)
            table_ms = median_ms(lambda s=sink, it=steps: s.write_samples(_at(table, next(it))), iters)
            sink.close()
            print(f"| {name} | {table_ms:.2f} | {frame_ms:.3f} | {table_ms / frame_ms:.0f}x |")
    print()


def _at(table: Any, step: int) -> Any:
    import dataclasses

    return dataclasses.replace(table, step=step)


def bench_record(steps: int, iters: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        journal = Path(d) / "journal.jsonl"
        sink = JournalSink(journal)
        pub = Publisher([sink], adapters=GRPO_ADAPTERS, mode="inline")
        pub.start({"rl": {"kl_beta": 0.04}})
        for frame in reduced_frames(steps):
            pub.publish(frame)
        pub.close()
        ms = median_ms(lambda: write_record(journal), iters)
        sizes = {p.name: p.stat().st_size for p in write_record(journal)}
    print(f"## The run's record at close ({steps} steps)\n")
    print(f"write_record median {ms:.0f} ms over {iters}; files: "
          + ", ".join(f"{k} {v:,} B" for k, v in sizes.items()) + "\n")


def bench_user_keys(iters: int) -> None:
    extra = {f"my/k{i}": r for i, r in enumerate(["mean", "sum", "max", "min", "last", "mean", "sum", "max"])}
    rng = random.Random(2)
    chunks = [full_chunk(rng, 1, c == 3) for c in range(4)]
    with_extra = [{**c, **{k: 1.0 for k in extra}} for c in chunks]
    base = MetricReducer(GRPO_ADAPTERS)
    more = MetricReducer([*GRPO_ADAPTERS, *user_adapters(extra)])

    def run(reducer: MetricReducer, window: list[dict[str, Any]]) -> None:
        for chunk in window:
            reducer.add(chunk)
        reducer.reduce(1)

    a = median_ms(lambda: run(base, chunks), iters)
    b = median_ms(lambda: run(more, with_extra), iters)
    print("## User keys\n")
    print(f"add x4 + reduce: {a:.3f} ms without, {b:.3f} ms with 8 extra keys (ratio {b / a:.2f})\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--mlflow-server", action="store_true", help="also a real local mlflow server")
    args = parser.parse_args()
    iters = 5 if args.quick else 30
    print(f"# bench_samples ({machine()}; load {load()})\n")
    bench_samples_file(iters)
    uri = None
    server = None
    if args.mlflow_server:
        from _mlflow_server import start_server

        tmp = tempfile.mkdtemp()
        server, uri = start_server(Path(tmp) / "server")
    try:
        bench_sinks(iters, uri)
    finally:
        if server is not None:
            from _mlflow_server import stop_server

            stop_server(server)
    bench_record(200 if args.quick else 1000, 3)
    bench_user_keys(50 if args.quick else 300)


if __name__ == "__main__":
    main()
