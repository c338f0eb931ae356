"""``posttrain-metrics demo``: the toy GRPO run, published through the callback to every sink.

Each rank builds a :class:`~posttrain_metrics.callbacks.MetricsCallback` (the same object a user
adds to a trainer config); rank 0 publishes. At the end the demo says where everything is, how to
look at it, and what the doctor thinks of the run.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..callbacks.generic import MetricsCallback
from ..integrations.views import mlflow_link
from .grpo_toy import ToyConfig, run_distributed

__all__ = ["DEMO_ADAPTERS", "demo_sinks", "make_callback", "run_demo"]

DEMO_ADAPTERS = ("grpo", "reward", "trainer", "validation")
TENSORBOARD_UI = "http://localhost:6006"
"""Where ``tensorboard --logdir`` serves by default."""


def demo_sinks(
    *,
    wandb: bool = True,
    mlflow: bool = True,
    tensorboard: bool = True,
    console: bool = True,
    mlflow_uri: str | None = None,
) -> list[dict[str, Any]]:
    """The demo's sink configs: everything embedded under the output folder by default."""
    sinks: list[dict[str, Any]] = [{"type": "journal"}]
    if console:
        sinks.append({"type": "console", "min_interval": 0})  # a short run: every step's line is worth reading
    if tensorboard:
        sinks.append({"type": "tensorboard"})
    if mlflow:
        sinks.append({"type": "mlflow", "experiment_name": "posttrain-metrics-demo",
                      **({"tracking_uri": mlflow_uri} if mlflow_uri else {})})
    if wandb:
        sinks.append({"type": "wandb", "project": "posttrain-metrics-demo", "settings": {"quiet": True}})
    return sinks


def make_callback(
    rank: int,
    world_size: int,
    *,
    sinks: Sequence[Mapping[str, Any]],
    out_dir: str,
    run_name: str,
    run_id: str,
    total_steps: int | None = None,
) -> MetricsCallback:
    """One rank's callback (module level, so spawned ranks can unpickle it)."""
    return MetricsCallback(adapters=list(DEMO_ADAPTERS), sinks=list(sinks), out_dir=out_dir,
                           run_name=run_name, run_id=run_id, total_steps=total_steps, perf=True,
                           health={})  # live health, every check on warn (docs/health.md)


def run_demo(args: argparse.Namespace) -> int:
    started = time.time()
    name = f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    out = Path(args.out) if args.out else Path("runs") / name
    out.mkdir(parents=True, exist_ok=True)
    out = out.resolve()
    config = ToyConfig(seed=args.seed, **({"steps": args.steps} if args.steps is not None else {}))
    sinks = demo_sinks(wandb=not args.no_wandb, mlflow=not args.no_mlflow, tensorboard=not args.no_tensorboard,
                       console=not args.no_console, mlflow_uri=args.mlflow_uri)
    print(f"posttrain-metrics demo: GRPO on a toy digit-sum task, {config.steps} steps, {args.ranks} "
          f"rank(s) over gloo, seed {args.seed}; output in {out}", flush=True)
    factory = functools.partial(make_callback, sinks=sinks, out_dir=str(out), run_name=name,
                                run_id=uuid.uuid4().hex[:16], total_steps=config.steps)
    summaries = run_distributed(config, factory, ranks=args.ranks)
    report(out, summaries[0], sinks, time.time() - started)
    return 0


def _mlflow_experiment(out: Path) -> str | None:
    """The MLflow experiment id the publisher reported (its status file), for the printed link."""
    from ..publication.follower import status_path

    try:
        status = json.loads(status_path(out / "journal.jsonl").read_text())
        experiment = status["sinks"]["mlflow"]["handles"]["experiment_id"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return str(experiment) if experiment is not None else None


def report(out: Path, summary: Mapping[str, Any], sinks: Sequence[Mapping[str, Any]], seconds: float) -> None:
    """Where everything is, the commands to look at it, and a short health summary."""
    from ..doctor import run_checks
    from ..journal import read_journal

    kinds = {s["type"] for s in sinks}
    if "console" in kinds:  # the console's closing summary has just printed each tracker's command and link
        kinds -= {"tensorboard", "mlflow", "wandb"}
    rel = os.path.relpath(out)
    lines = [f"\nDone in {seconds:.0f} s. Everything is under {rel}/", f"  journal       {rel}/journal.jsonl"]
    if "tensorboard" in kinds:
        lines.append(f"  TensorBoard   tensorboard --logdir {rel}/tensorboard")
        lines.append(f"                then open {TENSORBOARD_UI}/#custom_scalars (loss, reward, KL first)")
    mlflow = next((s for s in sinks if s["type"] == "mlflow" and s["type"] in kinds), None)
    if mlflow is not None:
        uri = mlflow.get("tracking_uri") or f"sqlite:///{rel}/mlflow.db"
        lines.append(f"  MLflow        mlflow ui --backend-store-uri {uri}")
        experiment = _mlflow_experiment(out)
        if experiment is not None:
            tracking = mlflow.get("tracking_uri")
            lines.append(f"                runs table: {mlflow_link(tracking, experiment)}")
            lines.append(f"                charts:     {mlflow_link(tracking, experiment, charts=True)}")
    if "wandb" in kinds:
        runs = sorted((out / "wandb").glob("offline-run-*"))
        lines.append(f"  W&B           wandb sync {os.path.relpath(runs[-1]) if runs else rel + '/wandb'}")
    lines.append(f"  dashboard     posttrain-metrics plot {rel}/journal.jsonl -o {rel}/dashboard.png")
    rewards = [float(r) for r in summary.get("reward_mean", [])]
    if rewards:
        tenth = max(1, len(rewards) // 10)
        first, last = sum(rewards[:tenth]) / tenth, sum(rewards[-tenth:]) / tenth
        lines.append(f"\nHealth: train/reward_mean {first:.3f} over the first tenth of the steps -> "
                     f"{last:.3f} over the last tenth")
    findings = run_checks(read_journal(out / "journal.jsonl"))
    counts = {sev: sum(f.severity == sev for f in findings) for sev in ("error", "warning", "info")}
    lines.append(f"Doctor: {counts['error']} error(s), {counts['warning']} warning(s), {counts['info']} note(s)"
                 f" -- details: posttrain-metrics doctor {rel}/journal.jsonl")
    for finding in findings:
        if finding.severity != "info":
            lines.append(f"  [{finding.severity.value}] {finding.check}: {finding.explanation}")
    print("\n".join(lines), file=sys.stdout, flush=True)
