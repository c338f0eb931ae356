"""Cost per step of the MLflow completions tables over a long run (issue 23).

Publishes ``--steps`` steps of 16 sample rows (a ~300-character prompt, a ~1,500-character
completion) with ``MlflowSink.write_samples`` into an embedded ``sqlite:///`` store, and reports the
time per step for each tenth of the run: a cost that does not grow with the run stays flat from the
first tenth to the last. Also the tag's length and its number of tables at the end.

    python benchmarks/bench_mlflow_tables.py --steps 10000
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid

from posttrain_metrics.core.keys import describe
from posttrain_metrics.core.reducer import resolve_adapters
from posttrain_metrics.integrations import RunInfo
from posttrain_metrics.integrations.mlflow import MlflowSink
from posttrain_metrics.journal.samples import Samples

COLUMNS = ["group", "prompt", "completion", "reward", "advantage", "truncated"]


def rows(step: int) -> list[dict[str, object]]:
    return [{"group": i // 4, "prompt": f"{step}.{i} " + "p" * 300, "completion": "c" * 1500,
             "reward": float(i % 2), "advantage": i % 2 - 0.5, "truncated": ""} for i in range(16)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10_000)
    args = parser.parse_args()
    adapters = resolve_adapters(["trainer"])
    with tempfile.TemporaryDirectory() as tmp:
        sink = MlflowSink(dir=tmp, experiment_name="tables")
        sink.start(RunInfo(uuid.uuid4().hex[:16], "tables", {}, describe(adapters), ("trainer",), time.time()))
        times = []
        for step in range(1, args.steps + 1):
            t = time.perf_counter()
            sink.write_samples(Samples(step, rows(step), COLUMNS, offered=64))
            times.append(time.perf_counter() - t)
        sink.close()
        from mlflow import MlflowClient

        tag = MlflowClient(sink.tracking_uri).get_run(sink.run_id).data.tags["mlflow.loggedArtifacts"]
    tenth = max(1, args.steps // 10)
    for i in range(0, args.steps, tenth):
        part = times[i : i + tenth]
        print(f"steps {i + 1}-{i + len(part)}: mean {statistics.mean(part) * 1000:.1f} ms, "
              f"median {statistics.median(part) * 1000:.1f} ms, max {max(part) * 1000:.1f} ms")
    print(f"tag: {len(tag)} characters, {len(json.loads(tag))} tables (valid JSON); "
          f"all {args.steps} steps: mean {statistics.mean(times) * 1000:.1f} ms per step")


if __name__ == "__main__":
    main()
