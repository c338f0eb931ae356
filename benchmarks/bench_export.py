"""Export throughput: frames per second replaying a journal into TensorBoard and into MLflow.

A synthetic journal of ``--frames`` steps (default 100k) and K = 61 keys (grpo + reward + trainer,
every declared key, the label indicators counted) is written with the real ``JournalSink``, so the
format is the real one; to be fast, its frames are 64 frames reduced by the real ``MetricReducer``
recycled with perturbed float values, a new step and a new wall time each. Then
``posttrain_metrics.export.export(journal, to, target, quiet=True)`` (what ``posttrain-metrics
export`` runs) is timed into TensorBoard (all ``--frames``), MLflow's embedded ``sqlite:///``
store (``--mlflow-frames``, default 5k: MLflow stores about 100-150 frames/s here, so 100k would
take a quarter of an hour) and a real local ``mlflow server`` with SQLite (``--server-frames``,
default 2k).

Before timing, the synthetic journal is read back and compared with the frames written; after each
export, the target is read back (the event files decoded with TensorBoard's ``Event`` message;
``MlflowClient.get_metric_history``) and must hold every step. The TensorBoard export is then
profiled (cProfile) on ``--profile-frames`` frames; the top functions by own time are listed, and
the CPU cost of TensorBoard's own record framing is measured. Target (issues 7 and 13): at least
20k frames/s into TensorBoard at K = 61.

The TensorBoard export is timed ``--repeat`` times (median). Two baselines are measured in the same
run, under the same load: the **floor**, the same replay (journal frames through the publisher
path, display frames built) into a sink that writes nothing, which no sink can beat; and
**TensorBoard's own writer**: the same display frames as ``Event`` protos built with TensorBoard's
proto classes and written by its ``EventFileWriter`` (what a sink built on TensorBoard's API costs),
on ``--profile-frames`` frames.

    python benchmarks/bench_export.py                 # 100k frames (about 2.5 minutes)
    python benchmarks/bench_export.py --quick         # 5k frames
    python benchmarks/bench_export.py --frames 20000
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import statistics
import struct
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from _common import GRPO_ADAPTERS, load, machine, reduced_frames
from _mlflow_server import start_server, stop_server  # tests/, put on sys.path by _common

from posttrain_metrics import Frame
from posttrain_metrics.export import export
from posttrain_metrics.integrations.base import RunInfo
from posttrain_metrics.integrations.mlflow import RUN_ID_TAG
from posttrain_metrics.journal import Journal, JournalOnDisk, JournalSink, open_journal, read_journal
from posttrain_metrics.publication.publisher import Publisher

PROBE_KEY = "train/loss_avg"
RUN_ID = "benchexport0001"


def synthetic_frames(n: int, seed: int = 0) -> list[Frame]:
    """``n`` frames: 64 reduced frames recycled, floats perturbed, steps 1..n, one second apart."""
    base = reduced_frames(64, seed)
    start = 1_700_000_000.0
    out = []
    for i in range(n):
        src = base[i % len(base)].metrics
        eps = 1.0 + (i % 997) * 1e-6
        metrics = {k: (v * eps if type(v) is float else v) for k, v in src.items()}
        out.append(Frame(i + 1, metrics, "train", start + i))
    return out


def write_journal(path: Path, frames: list[Frame], run_id: str = RUN_ID) -> None:
    sink = JournalSink(path, fsync="close")
    keys = Publisher([], adapters=GRPO_ADAPTERS).keys
    sink.start(RunInfo(run_id=run_id, name="bench-export", config={"bench/frames": len(frames)}, keys=keys,
                       adapters=tuple(GRPO_ADAPTERS), started=1_700_000_000.0))
    for frame in frames:
        sink.write(frame)
    sink.close()


def check_journal(journal: Journal, frames: list[Frame]) -> None:
    if len(journal.frames) != len(frames):
        raise SystemExit(f"journal holds {len(journal.frames)} frames, {len(frames)} were written")
    for i in (0, len(frames) // 2, len(frames) - 1):
        got, want = journal.frames[i], frames[i]
        if got.step != want.step or dict(got.metrics) != dict(want.metrics):
            raise SystemExit(f"journal frame {i} does not read back as written")


def tensorboard_steps(log_dir: Path) -> int:
    """Steps holding the probe key in the event files under ``log_dir``, decoded with TensorBoard's
    own ``Event`` message. The record framing (length, CRC, data, CRC) is walked directly, without
    verifying the CRCs: ``EventAccumulator`` takes about 0.45 ms per event here (45 s for 100k), this
    about 5 us."""
    from tensorboard.compat.proto.event_pb2 import Event

    steps = set()
    for path in sorted(log_dir.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        pos = 0
        while pos + 12 <= len(data):
            (length,) = struct.unpack_from("<Q", data, pos)
            event = Event.FromString(data[pos + 12 : pos + 12 + length])
            pos += 12 + length + 4
            if any(v.tag == PROBE_KEY for v in event.summary.value):
                steps.add(event.step)
    return len(steps)


def mlflow_steps(uri: str, run_id: str) -> int:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    runs = [r for e in client.search_experiments()
            for r in client.search_runs([e.experiment_id], filter_string=f"tags.`{RUN_ID_TAG}` = '{run_id}'")]
    return len({m.step for r in runs for m in client.get_metric_history(r.info.run_id, PROBE_KEY)})


def timed_export(journal: Journal | JournalOnDisk, to: str, target: str) -> tuple[float, list[str], str]:
    """Seconds to export, the warnings raised, and what export printed."""
    printed = io.StringIO()
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(printed):
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        export(journal, to, target, quiet=True)
        seconds = time.perf_counter() - t0
    return seconds, list(dict.fromkeys(str(w.message) for w in caught)), printed.getvalue().strip()


def profile_tensorboard(journal: Journal, target: Path, top: int) -> tuple[str, float]:
    """cProfile of ``export`` into TensorBoard (the calling thread: export publishes synchronously;
    TensorBoard's own writer thread is not in it)."""
    profiler = cProfile.Profile()
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        profiler.enable()
        export(journal, "tensorboard", str(target), quiet=True)
        profiler.disable()
    stats = pstats.Stats(profiler)
    total = stats.total_tt  # type: ignore[attr-defined]
    rows = sorted(stats.stats.items(), key=lambda item: item[1][2], reverse=True)  # type: ignore[attr-defined]
    lines = ["| function | calls | own s | own % | cumulative s |", "|---|---:|---:|---:|---:|"]
    for (file, line, name), (_, calls, own, cumulative, _) in rows[:top]:
        where = f"{Path(file).name}:{line}({name})" if line else name
        lines.append(f"| `{where}` | {calls} | {own:.2f} | {100 * own / total:.0f} | {cumulative:.2f} |")
    return "\n".join(lines), total


def subset(journal: Journal, n: int, path: Path, run_id: str) -> Journal:
    """The first ``n`` frames of ``journal`` as its own journal file, under its own run id (so that
    two exports to the same MLflow server do not see each other's run)."""
    write_journal(path, journal.frames[:n], run_id)
    return read_journal(path)


def floor_rate(journal: Journal) -> float:
    """Frames/s of the export path into a sink that writes nothing (the journal's frames through the
    same Replica and Publisher, display frames built): what no sink's export can beat."""
    from posttrain_metrics.journal import Record
    from posttrain_metrics.publication.follower import Replica

    class Nothing:
        name = "nothing"
        stores_nonfinite = frozenset({"nan", "inf"})

        def start(self, run: RunInfo) -> None:
            pass

        def write(self, frame: Frame) -> None:
            pass

        def close(self, *, failed: bool = False) -> None:
            pass

    replica = Replica(journal.path, Nothing(), lazy=True)
    replica.feed([Record("header", header=journal.header)])
    t0 = time.perf_counter()
    for i in range(0, len(journal.frames), 512):
        replica.feed(Record("frame", frame=f) for f in journal.frames[i : i + 512])
        replica.flush()
    replica.close("finished")
    return len(journal.frames) / (time.perf_counter() - t0)


def own_writer_rate(journal: Journal, n: int, log_dir: Path) -> float:
    """Frames/s of TensorBoard's own API on the first ``n`` display frames: one ``Event`` proto per
    frame (the first point of a tag with scalar metadata, labels as text tensors) written by its
    ``EventFileWriter`` (its queue thread and pure-Python CRC), until its ``close`` returns."""
    from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2
    from tensorboard.plugins.scalar import metadata as scalar_metadata
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    from posttrain_metrics.publication.publisher import display_frame

    keys = Publisher([], adapters=GRPO_ADAPTERS, mode="inline").keys
    frames = [display_frame(f, keys) for f in journal.frames[:n]]
    t0 = time.perf_counter()
    writer = EventFileWriter(str(log_dir), max_queue_size=1024, flush_secs=3600)
    seen: set[str] = set()
    for frame in frames:
        values = []
        for key, value in frame.metrics.items():
            if isinstance(value, str):
                v = summary_pb2.Summary.Value(tag=key, tensor=tensor_pb2.TensorProto(
                    dtype=types_pb2.DT_STRING, string_val=[value.encode()]))
            else:
                v = summary_pb2.Summary.Value(tag=key, simple_value=float(value))
                if key not in seen:
                    v.metadata.CopyFrom(scalar_metadata.create_summary_metadata("", ""))
            seen.add(key)
            values.append(v)
        writer.add_event(event_pb2.Event(wall_time=frame.wall_time, step=frame.step,
                                         summary=summary_pb2.Summary(value=values)))
    writer.close()
    return len(frames) / (time.perf_counter() - t0)


def run_folder(target: Path) -> Path:
    """The run's own folder that ``export --to tensorboard DIR`` writes: ``DIR/<name>-<run id>``."""
    [run] = [p for p in target.iterdir() if p.is_dir()]
    return run


def crc_cost(log_dir: Path, frames: int) -> tuple[float, float]:
    """Bytes per frame in the event files, and the microseconds TensorBoard's pure-Python
    CRC-32C (``tensorboard.compat.tensorflow_stub.pywrap_tensorflow.masked_crc32c``, which its
    ``RecordWriter`` calls on every record) takes on that many bytes."""
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    size = sum(f.stat().st_size for f in log_dir.glob("events.out.tfevents.*")) / frames
    data = os.urandom(round(size))
    t0 = time.perf_counter()
    for _ in range(50):
        masked_crc32c(data)
    return size, (time.perf_counter() - t0) / 50 * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=100_000)
    parser.add_argument("--mlflow-frames", type=int, default=5_000,
                        help="frames exported to the embedded MLflow store (default 5k)")
    parser.add_argument("--server-frames", type=int, default=2_000,
                        help="frames exported to the MLflow server (default 2k)")
    parser.add_argument("--profile-frames", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3, help="TensorBoard exports timed (median)")
    parser.add_argument("--quick", action="store_true", help="5k frames (2k to embedded MLflow, 500 to the server)")
    parser.add_argument("--json", default=None, help="also write the raw figures to this file")
    args = parser.parse_args()
    if args.quick:
        args.frames, args.mlflow_frames, args.server_frames, args.profile_frames = 5_000, 2_000, 500, 5_000
    n = args.frames
    sizes = {"tensorboard": n, "mlflow-embedded": min(n, args.mlflow_frames),
             "mlflow-server": min(n, args.server_frames)}
    n_profile = min(n, args.profile_frames)
    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        os.environ.pop(var, None)

    print(f"# export throughput ({machine()})\n")
    figures: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-export-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        frames = synthetic_frames(n)
        built = time.perf_counter() - t0
        t0 = time.perf_counter()
        write_journal(root / "journal.jsonl", frames)
        written = time.perf_counter() - t0
        t0 = time.perf_counter()
        journal = read_journal(root / "journal.jsonl")
        read = time.perf_counter() - t0
        read_frames_s = n / read
        check_journal(journal, frames)
        k = len(frames[0].metrics)
        size = (root / "journal.jsonl").stat().st_size
        del frames
        print(f"journal: {n} frames x {k} keys (K = 61 once published, with the label indicators), "
              f"{size / 1e6:.0f} MB; built in {built:.1f} s, written with JournalSink in {written:.1f} s "
              f"({n / written:,.0f} frames/s), read with read_journal in {read:.1f} s ({n / read:,.0f} frames/s)\n")

        proc, server = start_server(root / "mlflow-server")
        try:
            for name, count in sizes.items():
                folder = root / name
                # the whole journal as is, else its first frames under their own run id (so that two
                # exports to the one MLflow server do not see each other's run)
                run_id = journal.run_id if count == n else f"bench{name.replace('-', '')}"
                source = journal if count == n else subset(journal, count, folder / "journal.jsonl", run_id)
                to = "tensorboard" if name == "tensorboard" else "mlflow"
                target = {"tensorboard": str(folder / "tb"), "mlflow-server": server,
                          "mlflow-embedded": f"sqlite:///{(folder / 'mlflow.db').as_posix()}"}[name]
                seconds, caught, said = timed_export(source, to, target)
                held = tensorboard_steps(run_folder(Path(target))) if to == "tensorboard" else mlflow_steps(target, run_id)
                figures[name] = {"frames": count, "seconds": seconds, "held": held, "warnings": caught, "said": said}
        finally:
            stop_server(proc)
        # what `posttrain-metrics export JOURNAL --to tensorboard` runs: open_journal checks the file,
        # export replays it pass by pass (memory flat in the run's length, the file read twice)
        t0 = time.perf_counter()
        opened = open_journal(root / "journal.jsonl")
        _, _, said = timed_export(opened, "tensorboard", str(root / "tb-end-to-end"))
        end_to_end = time.perf_counter() - t0
        assert f"exported {n} of {n}" in said, said
        bytes_per_frame, crc_us = crc_cost(run_folder(root / "tensorboard" / "tb"), n)
        rates = [n / figures["tensorboard"]["seconds"]]
        floors = [floor_rate(journal)]
        for r in range(1, args.repeat):
            seconds, _, _ = timed_export(journal, "tensorboard", str(root / f"tb-repeat{r}"))
            rates.append(n / seconds)
            floors.append(floor_rate(journal))
        figures["tensorboard"]["seconds"] = n / statistics.median(rates)  # the table shows the median
        tb_own = own_writer_rate(journal, n_profile, root / "tb-own")
        median, floor = statistics.median(rates), statistics.median(floors)
        print(f"TensorBoard export, {len(rates)} runs: {', '.join(f'{r:,.0f}' for r in rates)} frames/s, median "
              f"**{median:,.0f}**; in the same run the floor (the same replay into a sink that writes nothing) "
              f"{floor:,.0f} frames/s (median; the sink's own work is {1e6 / median - 1e6 / floor:.1f} us of the "
              f"{1e6 / median:.1f} us per frame), TensorBoard's own writer (Event protos + EventFileWriter, "
              f"{n_profile} frames) {tb_own:,.0f} frames/s: the sink is {median / tb_own:.1f}x faster.\n")

        labels = {"tensorboard": "TensorBoard (event files)", "mlflow-embedded": "MLflow, embedded sqlite:///",
                  "mlflow-server": "MLflow, local `mlflow server` (SQLite)"}
        print("| target | frames | seconds | frames/s | steps held (read back) |")
        print("|---|---:|---:|---:|---|")
        for name, fig in figures.items():
            print(f"| {labels[name]} | {fig['frames']} | {fig['seconds']:.1f} | {fig['frames'] / fig['seconds']:,.0f} | "
                  f"{fig['held']} of {fig['frames']} |")
        print("\nexport = `posttrain_metrics.export.export(journal, to, target, quiet=True)`, what `posttrain-metrics "
              "export` runs, into an empty target (it reads the target back first, then publishes every frame and "
              "waits for the sink to confirm). Journal reading is not included (above). Steps held are read back "
              "from the event files (TensorBoard's Event proto) / with MlflowClient. "
              f"Load average after: {load()}\n")
        for name, fig in figures.items():
            if fig["said"]:
                print(f"- {name}: export printed: {fig['said']!r}")
            for text in fig["warnings"]:
                if "noload" not in text:  # an SQLAlchemy deprecation inside MLflow
                    print(f"  - {name} warning: {text}")

        profile_journal = journal if n_profile == n else subset(journal, n_profile, root / "prof" / "journal.jsonl",
                                                                RUN_ID)
        table, total = profile_tensorboard(profile_journal, root / "tb-profile", top=8)
        print(f"\nwhere the time goes, TensorBoard: profile of the export of {n_profile} frames (cProfile, "
              f"{total:.1f} s profiled, the calling thread), top functions by own time:\n")
        print(table)
        from posttrain_metrics.integrations.tensorboard.events import _crc32c

        c_crc = _crc32c()
        data = os.urandom(round(bytes_per_frame))
        t0 = time.perf_counter()
        for _ in range(2000):
            c_crc(data)
        c_us = (time.perf_counter() - t0) / 2000 * 1e6
        print(f"\nrecord framing: TensorBoard's own writer frames every record with a pure-Python CRC-32C "
              f"(`masked_crc32c`): {bytes_per_frame:,.0f} bytes per frame cost {crc_us:.0f} us (a cap of "
              f"{1e6 / crc_us:,.0f} frames/s); the sink frames the same format on the calling thread with "
              f"`{getattr(c_crc, '__module__', '?')}.{getattr(c_crc, '__name__', '?')}`: {c_us:.2f} us per frame (a "
              "batch's write goes to a writer thread, so framing the next batch overlaps a throttled disk).")

    tb = figures["tensorboard"]
    rate = tb["frames"] / tb["seconds"]
    print(f"\n`posttrain-metrics export JOURNAL --to tensorboard` end to end (open_journal checks every line, then "
          f"export replays the file a batch at a time), into a fresh directory: {end_to_end:.1f} s = "
          f"{n / end_to_end:,.0f} frames/s (a journal read whole, then exported: read {read:.1f} s + export "
          f"{tb['seconds']:.1f} s = {n / (read + tb['seconds']):,.0f} frames/s)")
    print(f"\n- target >= 20,000 frames/s into TensorBoard: {'met' if rate >= 20_000 else 'MISSED'} "
          f"({rate:,.0f} frames/s)")
    incomplete = {name: f"{fig['held']} of {fig['frames']}" for name, fig in figures.items()
                  if fig["held"] != fig["frames"]}
    print(f"- check, every target holds every step after export: {'yes' if not incomplete else f'NO: {incomplete}'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**{name: {k: v for k, v in fig.items() if k != "warnings"} for name, fig in figures.items()},
                   "read_journal": {"frames": n, "seconds": read, "frames_s": read_frames_s}}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
