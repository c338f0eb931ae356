"""What throughput costs the training thread per window (issue 28 item 8), at K = 61.

One process, one rank (no process group: the collective is the same one either way, and
``tests/test_throughput_distributed.py`` counts it). Every window adds the 4 chunks of
``_common.make_windows`` (grpo + reward + trainer: K = 61 public keys) and ends with
``MetricsCallback.on_window_end`` over a memory sink (inline: no journal or tracker I/O, so the
difference is the throughput work alone). Two callbacks, built the same way but for ``perf``, run the
same windows in alternating rounds (so that drift of the machine hits both alike); per round the
median window time of each, then the median over rounds of:

- ``window``: ``on_window_end`` with perf on minus without (the perf chunk: clock, memory probe,
  the perf and timer keys in the reduction; the derived figures);
- ``timers``: two ``with callback.timer(...)`` blocks per window (generation, train), the time the
  training thread spends in them beyond an empty ``with nullcontext()``;
- the parts alone: ``Throughput.window_chunk`` and ``Throughput.figures``.

Target: ``window + timers`` under 20 us. Before timing, the two callbacks' frames are checked to hold
the same figures on every key the plain one publishes.

    python benchmarks/bench_throughput.py            # 15 rounds of 400 windows
    python benchmarks/bench_throughput.py --quick    # 5 rounds of 100
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from typing import Any

from _common import GRPO_ADAPTERS, load, machine, make_windows

from posttrain_metrics.callbacks import MetricsCallback
from posttrain_metrics.core.throughput import Throughput

US = 1e6


def build(perf: bool) -> MetricsCallback:
    cb = MetricsCallback(adapters=list(GRPO_ADAPTERS), sinks=[{"type": "memory"}], publisher="inline", perf=perf)
    cb.on_run_start()
    return cb


def run_windows(cb: MetricsCallback, windows: list[list[dict[str, object]]], step0: int) -> list[float]:
    """Per window: the seconds of ``on_window_end`` alone (the chunks are added before)."""
    out = []
    for i, chunks in enumerate(windows):
        for chunk in chunks:
            cb.on_chunk_end(chunk)
        begin = time.perf_counter()
        cb.on_window_end(step0 + i)
        out.append(time.perf_counter() - begin)
    sink = cb.sinks[0]
    frames = getattr(sink, "frames", None)
    if isinstance(frames, list):
        del frames[:-1]  # keep memory flat over rounds
    return out


def time_timers(cb: MetricsCallback, n: int) -> tuple[float, float]:
    """Seconds per window of two timer blocks, and of two empty nullcontext blocks."""
    begin = time.perf_counter()
    for _ in range(n):
        with cb.timer("generation"):
            pass
        with cb.timer("train"):
            pass
    timed = (time.perf_counter() - begin) / n
    null = contextlib.nullcontext()
    begin = time.perf_counter()
    for _ in range(n):
        with null:
            pass
        with null:
            pass
    empty = (time.perf_counter() - begin) / n
    cb.throughput.window_chunk()  # type: ignore[union-attr]  # drop what the loop timed
    return timed, empty


def time_parts(n: int) -> tuple[float, float]:
    t = Throughput()
    t.start()
    begin = time.perf_counter()
    for _ in range(n):
        t.window_chunk()
    chunk = (time.perf_counter() - begin) / n
    reduced: dict[str, Any] = {f"train/k{i}": float(i) for i in range(61)}
    reduced.update({"perf/window_s": 0.5, "train/valid_token_count": 4096, "train/rollout_count": 64})
    begin = time.perf_counter()
    for _ in range(n):
        t.figures(reduced)
    derive = (time.perf_counter() - begin) / n
    return chunk, derive


def check_same(windows: list[list[dict[str, object]]]) -> int:
    plain, perf = build(False), build(True)
    keys = 0
    for step, chunks in enumerate(windows[:5], 1):
        for chunk in chunks:
            plain.on_chunk_end(chunk)
            perf.on_chunk_end(chunk)
        a, b = plain.on_window_end(step).metrics, perf.on_window_end(step).metrics
        assert all(b[k] == v for k, v in a.items()), "perf changed a figure"
        assert "perf/tokens_per_s" in b and "perf/window_s" in b
        keys = len(a)
    plain.on_run_end()
    perf.on_run_end()
    return keys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--windows", type=int, default=400)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.windows = 5, 100
    windows = make_windows(args.windows)
    keys = check_same(windows)
    print("# Throughput: the training thread's extra work per window (issue 28)\n")
    print(machine())
    print(f"\nload before: {load()}; K = {keys} frame keys without perf (61 with the label indicators); {args.rounds} rounds x "
          f"{args.windows} windows, alternating\n")
    plain, perf = build(False), build(True)
    with_perf, without, extra = [], [], []
    step = 1
    for r in range(args.rounds):
        order = (plain, perf) if r % 2 == 0 else (perf, plain)
        medians = {}
        for cb in order:
            medians[id(cb)] = statistics.median(run_windows(cb, windows, step))
        step += args.windows
        without.append(medians[id(plain)])
        with_perf.append(medians[id(perf)])
        extra.append(medians[id(perf)] - medians[id(plain)])
    timed, empty = time_timers(perf, 20_000)
    chunk, derive = time_parts(20_000)
    plain.on_run_end()
    perf.on_run_end()
    w0, w1, dw = (statistics.median(x) for x in (without, with_perf, extra))
    timers = timed - empty
    print("| what | median per window |")
    print("|---|---|")
    print(f"| on_window_end without perf (K = {keys}) | {w0 * US:.1f} us |")
    print(f"| on_window_end with perf | {w1 * US:.1f} us (ratio {w1 / w0:.3f}) |")
    print(f"| window: extra of perf | {dw * US:.1f} us |")
    print(f"| timers: two `with callback.timer(...)` beyond two empty `with` | {timers * US:.1f} us |")
    print(f"| **total extra on the training thread** | **{(dw + timers) * US:.1f} us** (target < 20 us) |")
    print(f"| part: Throughput.window_chunk (clock, memory probe) | {chunk * US:.2f} us |")
    print(f"| part: Throughput.figures (the derived keys) | {derive * US:.2f} us |")
    print(f"\nload after: {load()}")


if __name__ == "__main__":
    main()
