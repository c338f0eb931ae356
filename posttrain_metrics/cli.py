"""The ``posttrain-metrics`` command line: demo, export, publish, doctor, plot, keys."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import traceback
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import __version__
from .core.catalog import adapter_names, get_adapter
from .core.errors import MetricsError
from .core.log import LOGGER, line
from .core.printable import printable
from .core.redact import redact_text
from .core.reduction import Reduction, RunAggregate
from .journal import JournalOnDisk, header_adapters, open_journal

__all__ = ["main"]


DEMO_STEPS = 80
"""The demo's default length (``ToyConfig.steps``; stated here so that ``--help`` imports no torch)."""

_RUN_AGGREGATE = {
    RunAggregate.LAST: "the last value",
    RunAggregate.WINDOWS: "the windows where it held",
    RunAggregate.TOTAL: "the total",
    RunAggregate.MAX: "the longest streak",
}
"""How ``keys`` words each exact counter's run aggregate."""

KEYS_HEADER = ("adapter", "source name (pass this)", "published key", "reduction", "weight / count", "unit",
               "headline", "meaning")


def _keys_rows(adapters: Sequence[str]) -> list[tuple[str, ...]]:
    """One row per published key: the source name a producer passes (``on_chunk_end``, ``add``),
    the key it is published as, and its declared semantics."""
    rows: list[tuple[str, ...]] = []
    for name in adapters:
        adapter = get_adapter(name)
        for phase in sorted(adapter.phases, key=("train", "val").index):
            for source, metric in adapter.metrics.items():
                key = adapter.public_key(source, phase)
                if metric.namespace is not None and phase != min(adapter.phases, key=("train", "val").index):
                    continue  # a fixed namespace (optim/, timer/) is one key whatever the phase
                how = metric.reduction.value
                if metric.labels:
                    how += " {" + ", ".join(metric.labels) + "}"
                run = metric.run_aggregate
                if run is not None:
                    how += f" (run aggregate: {_RUN_AGGREGATE[run]})"
                if metric.second_moment:
                    prefix = key.rsplit("/", 1)[0]
                    how += f" from {prefix}/{metric.mean} and {prefix}/{metric.second_moment}"
                weight = ""
                if metric.weight:
                    weight_key = adapter.public_key(adapter.source_of_leaf(metric.weight), phase)
                    counted = metric.reduction in (Reduction.MAX, Reduction.MIN)
                    weight = f"{weight_key} > 0" if counted else weight_key
                elif source in adapter.counts:
                    weight = "(a count: >= 0)"
                if metric.derived:  # computed after the reduction: nothing to pass
                    source, how, weight = "(derived)", f"derived after the reduction (run: {how})", ""
                rows.append((name, source, key, how, weight, metric.unit, "yes" if metric.headline else "",
                             metric.meaning))
    return rows


def cmd_keys(args: argparse.Namespace) -> int:
    names = [args.adapter] if args.adapter else adapter_names()
    rows = _keys_rows(names)
    header = KEYS_HEADER
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in rows:
            cells = [c.replace("|", "\\|") for c in row]
            cells[1], cells[2] = f"`{row[1]}`", f"`{row[2]}`"
            print("| " + " | ".join(cells) + " |")
        return 0
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    for row in [header, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1])
    return 0


def scan_journal(path: str) -> JournalOnDisk:
    """Open a journal for a subcommand, to be read pass by pass (``open_journal``: memory flat in the
    run's length): torn-line notes go to stderr, and every adapter it names must be known here
    (the header declares them; an older header names catalogue adapters)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        journal = open_journal(path)
    for note in journal.warnings:
        print(f"posttrain-metrics: warning: {note}", file=sys.stderr)
    header_adapters(journal.header)  # MetricsError names an unknown adapter (or a bad user key) and the fix
    return journal


def cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import exit_status, format_findings, run_checks
    from .publication.health import read_thresholds

    journal = scan_journal(args.journal)
    findings = run_checks(journal, read_thresholds(Path(journal.path)))  # the run's own, as its record
    print(format_findings(findings, as_json=args.json, journal=journal))
    return exit_status(findings)


def cmd_plot(args: argparse.Namespace) -> int:
    from .doctor import run_checks
    from .plot import dashboard

    journal = scan_journal(args.journal)
    path = dashboard(journal, run_checks(journal), args.output, x=args.x)
    print(f"wrote {path}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from .export import export

    kind, *rest = args.to
    if kind not in ("tensorboard", "mlflow", "wandb") or len(rest) > 1:
        raise MetricsError(f"--to {' '.join(args.to)}; fix: --to tensorboard [DIR] | mlflow [URI] | wandb [DIR]")
    return int(export(scan_journal(args.journal), kind, rest[0] if rest else None, quiet=args.quiet,
                      project=args.project, entity=args.entity))


def cmd_publish(args: argparse.Namespace) -> int:
    from .integrations.factory import build_sink
    from .publication.follower import TRIM_EVERY, follow
    from .publication.output import redacted_output
    from .publication.process import sinks_path

    journal = Path(args.journal)
    spec = sinks_path(journal)
    try:
        configs = json.loads(spec.read_text())["sinks"]
    except FileNotFoundError:
        raise MetricsError(
            f"{spec} does not exist: it lists the trackers a run publishes to, and the training process writes "
            f"it at the start of the run; fix: `posttrain-metrics export {journal} --to KIND [TARGET]` replays "
            "a journal into one tracker you name"
        ) from None
    except (ValueError, KeyError, TypeError) as exc:
        raise MetricsError(f"{spec}: not a sinks file ({exc!r:.100}); fix: use export --to KIND") from None
    if not args.follow and not journal.is_file():
        raise MetricsError(f"journal {journal} does not exist or is not a file; fix: pass the path of a journal.jsonl")
    if args.parent_pid is not None and hasattr(os, "nice"):
        # Started by a trainer: the trackers can lag (the journal holds every frame), the training
        # step cannot; on a busy machine the scheduler serves the trainer first.
        with contextlib.suppress(OSError):
            os.nice(10)
    _hold_run_lock()
    sinks = []
    for config in configs:
        options = dict(config)
        name = options.pop("name", None)  # two sinks of one kind, told apart by name
        sink = build_sink(options)
        if name is not None:
            sink.name = str(name)
        sinks.append(sink)
    forward: logging.Handler | None = None
    with warnings.catch_warnings(), redacted_output():  # every line the trackers print leaves redacted
        if args.quiet:
            warnings.simplefilter("ignore")
        else:
            forward = _forward_our_warnings()
        package = logging.getLogger(LOGGER)
        level = package.level
        if not args.quiet:
            package.setLevel(logging.INFO)  # our process: its log says when a tracker came back too
        try:
            result = follow(journal, sinks, follow=args.follow, parent_pid=args.parent_pid, trim_heap=TRIM_EVERY)
        finally:
            package.setLevel(level)
            if forward is not None:
                package.removeHandler(forward)
    if not args.quiet:
        done = ", ".join(f"{name} {info['written']} sent, {info['already_held']} already there"
                         for name, info in result["sinks"].items())
        print(f"published {journal} (run {result['status']}): {done}")
    # Following, the run ended: a tracker's failures are in the status report, and the trainer must
    # not take a non-zero exit for a publisher that died (it would restart it). By hand: exit 1.
    return 1 if result.get("failures") and not args.follow else 0


def _hold_run_lock() -> None:
    """A publisher process started by a trainer holds its run's lock until it exits (see
    :class:`~posttrain_metrics.journal.RunLock`): listed as a holder, kept from its own children."""
    from .journal import LOCK_FD_ENV, RunLock

    try:
        fd = int(os.environ.pop(LOCK_FD_ENV))
        os.set_inheritable(fd, False)  # a tracker's helper process (wandb-core) must not keep the run locked
        RunLock(fd).note("publisher")
    except (KeyError, ValueError, OSError):
        return


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _forward_our_warnings() -> logging.Handler | None:
    """In the publisher process (whose output goes to its log file): our own warnings and the
    package's log records (:mod:`~posttrain_metrics.core.log`) also go, one line each, to the trainer's
    stderr, whose descriptor the trainer passed in the environment. The trackers' warnings stay in the
    log. Call inside ``warnings.catch_warnings()``: it restores; the log handler returned is for the
    caller to remove."""
    from .publication.process import WARNINGS_FD_ENV

    try:
        stream = os.fdopen(int(os.environ[WARNINGS_FD_ENV]), "w", buffering=1, closefd=False)
    except (KeyError, ValueError, OSError):
        return None
    logged = warnings.showwarning

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: Any = None, line: str | None = None) -> None:
        logged(message, category, filename, lineno, file, line)  # the log keeps every warning
        # ours: raised in the package, or named at the process's first frame, the publisher's bootstrap
        # (``python -c``, see publication.process.BOOTSTRAP), when no frame outside the package called it
        if filename == "<string>" or os.path.abspath(filename).startswith(_PACKAGE_DIR):
            with contextlib.suppress(OSError, ValueError):
                stream.write(printable(redact_text(f"posttrain-metrics publisher: warning: {message}")) + "\n")

    warnings.showwarning = show

    class Forward(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            with contextlib.suppress(OSError, ValueError):
                stream.write(printable(redact_text(f"posttrain-metrics publisher: {line(record)}")) + "\n")

    handler = Forward()
    logging.getLogger(LOGGER).addHandler(handler)
    return handler


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo.main import run_demo

    return int(run_demo(args))


def _at_least_one(text: str) -> int:
    """An argparse type: a whole number >= 1 (argparse turns the error into exit status 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; fix: pass 1 or more") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is less than 1; fix: pass 1 or more")
    return value


def _error(command: str, text: str) -> int:
    """Print one error on stderr, secrets redacted and control characters escaped; exit status 2."""
    print(f"posttrain-metrics {command}: error: {printable(redact_text(text))}", file=sys.stderr)
    return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="posttrain-metrics",
        description="Exact post-training metrics: run the demo, replay journals into trackers, publish a run, "
        "check a run's health, plot it, list the metric catalogue.",
    )
    parser.add_argument("--version", action="version", version=f"posttrain-metrics {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser(
        "demo", help="a real small GRPO run on the CPU, published to every sink",
        description=f"A real small GRPO run on the CPU (a GRU policy learns a toy digit-sum task), published "
        f"through MetricsCallback to the journal, the console, TensorBoard, MLflow (SQLite) and W&B (offline). "
        f"Defaults: {DEMO_STEPS} steps, 2 ranks over gloo, seed 0; per step and rank 8 prompts x 8 samples, "
        "2 optimizer updates (n_mini 2) of 2 accumulation chunks each; validation every 10 steps; output in "
        "./runs/demo-<date>-<time>/. Takes about a minute on 2 CPU cores.")
    demo.add_argument("--out", default=None, help="output folder (default: a new folder under ./runs/)")
    demo.add_argument("--steps", type=_at_least_one, default=DEMO_STEPS,
                      help=f"optimizer steps, one published step each (default {DEMO_STEPS})")
    demo.add_argument("--ranks", type=_at_least_one, default=2, help="data-parallel ranks over gloo (default 2)")
    demo.add_argument("--seed", type=int, default=0, help="seed of the policy and the sampling (default 0)")
    demo.add_argument("--mlflow-uri", default=None,
                      help="an MLflow tracking URI instead of the SQLite file (default <out>/mlflow.db)")
    for sink in ("wandb", "mlflow", "tensorboard", "console"):
        demo.add_argument(f"--no-{sink}", action="store_true", help=f"leave the {sink} sink out")
    demo.set_defaults(func=cmd_demo)

    export = sub.add_parser("export", help="replay a journal into TensorBoard, MLflow or W&B (idempotent)")
    export.add_argument("journal", help="path of a journal.jsonl")
    export.add_argument("--to", required=True, nargs="+", metavar=("KIND", "TARGET"),
                        help="tensorboard [LOG_DIR] | mlflow [TRACKING_URI] | wandb [DIR]; the target "
                        "defaults to the journal's folder (where the live sinks wrote)")
    export.add_argument("--quiet", action="store_true", help="no progress bar")
    export.add_argument("--project", default=None, help="W&B project (default: the live run's, from the journal)")
    export.add_argument("--entity", default=None, help="W&B entity (default: the live run's, from the journal)")
    export.set_defaults(func=cmd_export)

    publish = sub.add_parser("publish", help="feed a run's trackers from its journal (what the publisher "
                             "process runs; by hand, it finishes what a stopped publisher left)")
    publish.add_argument("journal", help="path of a journal.jsonl (its trackers are in <journal>.sinks.json)")
    publish.add_argument("--follow", action="store_true",
                         help="tail the journal until the run's end record (or until --parent-pid is gone)")
    publish.add_argument("--parent-pid", type=int, default=None, metavar="PID",
                         help="the trainer's pid: when it is gone, drain the journal and mark the run killed")
    publish.add_argument("--quiet", action="store_true", help="no summary line, no warnings")
    publish.set_defaults(func=cmd_publish)

    doctor = sub.add_parser("doctor", help="health report of a run from its journal")
    doctor.add_argument("journal")
    doctor.add_argument("--json", action="store_true", help="machine-readable findings")
    doctor.set_defaults(func=cmd_doctor)

    plot = sub.add_parser("plot", help="a one-page PNG dashboard of a run from its journal")
    plot.add_argument("journal")
    plot.add_argument("-o", "--output", required=True, help="PNG file to write")
    plot.add_argument("--x", choices=("step", "tokens", "samples", "time"), default="step",
                      help="x-axis: the step, or the run's cumulative tokens, samples or training time "
                           "(runs with perf on; default step)")
    plot.set_defaults(func=cmd_plot)

    keys = sub.add_parser("keys", help="the metric catalogue: key, reduction, weight, unit, meaning")
    keys.add_argument("adapter", nargs="?", choices=adapter_names(), default=None)
    keys.add_argument("--markdown", action="store_true", help="a Markdown table (the README's)")
    keys.set_defaults(func=cmd_keys)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv:
        parser.print_help()  # no command: list them, as --help does
        return 0
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except MetricsError as exc:
        return _error(args.command, str(exc))
    except BrokenPipeError:  # `posttrain-metrics doctor run.jsonl | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        return 130
    except Exception:  # a bug or a library's own error: the traceback, with secrets redacted
        text = printable(redact_text(traceback.format_exc())).replace("\\n", "\n")
        print(f"posttrain-metrics {args.command}: unexpected error:\n{text}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
