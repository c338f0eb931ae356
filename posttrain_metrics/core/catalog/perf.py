"""Throughput, step time, MFU and memory: the ``perf/`` namespace.

Two kinds of keys. *Reduced* keys travel in the step's one collective like every other key: the
window's wall time on each rank's training clock (``perf/window_s``: the MAX over ranks, since the
step waits for the slowest rank; ``perf/window_s_mean`` beside it, so imbalance shows), the peak
memory of the window (MAX over ranks), each rank's accelerator peak (SUM: the world's peak) and the
counts a producer may report itself (``perf_tokens``, ``perf_samples``, ``perf_generated_tokens``).
*Derived* keys (``derived=True``) are computed on every rank after the reduction from the reduced
figures, so they are exact and identical on every rank with no extra collective:

- ``perf/tokens_per_s`` = window tokens summed over ranks / slowest rank's window time, the tokens
  being ``train/valid_token_count`` (the objective adapters' own count), else ``perf/tokens``;
- ``perf/samples_per_s`` likewise from ``train/rollout_count``, else ``perf/samples``, else (in a
  run that never reported either) ``train/valid_sequence_count``;
- ``perf/tokens_total``, ``perf/samples_total``, ``perf/time_s``: the run's running totals (the
  alternate x-axes), ``perf/time_s`` summing the slowest rank's window times;
- ``perf/mfu`` = model FLOPs of the window / (slowest window time x the world's peak FLOPs).

Stage timers (``timer/<name>_s``, MAX over ranks, and ``timer/<name>_s_mean``) are the user's own
keys, declared per name when the callback is built (see ``posttrain_metrics.core.throughput``).
"""

from __future__ import annotations

from ..adapter import Metric, MetricAdapter
from ..reduction import Reduction as R

__all__ = ["PERF"]

GIB = "GiB"


def _perf(leaf: str, reduction: R, meaning: str, **kw: object) -> Metric:
    return Metric(leaf, reduction, meaning, namespace="perf", **kw)  # type: ignore[arg-type]


def _total(leaf: str, meaning: str, unit: str) -> Metric:
    """A running total of the run, the same on every rank (computed from reduced figures); it never
    decreases, so its run aggregate (MAX) is the run's total."""
    return _perf(leaf, R.MAX, meaning, unit=unit, count=True, derived=True)


PERF = MetricAdapter(
    "perf",
    internal_prefix="perf_",
    phases=("train",),
    metrics=[
        _perf("window_s", R.MAX, "Wall time of the window on the training clock (from the previous window's end), "
              "slowest rank", unit="s"),
        _perf("window_s_mean", R.MEAN, "Wall time of the window, mean over ranks (beside perf/window_s: imbalance)",
              unit="s"),
        _perf("tokens", R.SUM, "Tokens of the window the producer reported itself (when no objective adapter "
              "counts train/valid_token_count)", unit="tokens", count=True),
        _perf("samples", R.SUM, "Samples of the window the producer reported itself (when the reward adapter's "
              "train/rollout_count is absent)", unit="samples", count=True),
        _perf("generated_tokens", R.SUM, "Tokens generated in the window (rollouts), for MFU's 2N term",
              unit="tokens", count=True),
        _perf("peak_flops", R.SUM, "Peak FLOP/s of the world's accelerators (each rank's peak, summed)",
              unit="FLOP/s"),
        _perf("mem_allocated_peak_gib", R.MAX, "Peak CUDA memory allocated in the window, largest rank", unit=GIB),
        _perf("mem_reserved_peak_gib", R.MAX, "Peak CUDA memory reserved in the window, largest rank", unit=GIB),
        _perf("rss_peak_gib", R.MAX, "Peak resident memory of the process so far, largest rank (without CUDA)",
              unit=GIB),
        # Not a headline (the console line): on the demo's tiny model the window's signal-carrying tokens
        # swing from 0 to thousands, noise beside the reward; headline=True shows it on the line.
        _perf("tokens_per_s", R.MEAN, "Tokens of the window, summed over ranks, per second of the slowest rank's "
              "window time", unit="tokens/s", derived=True),
        _perf("samples_per_s", R.MEAN, "Samples of the window, summed over ranks, per second of the slowest "
              "rank's window time", unit="samples/s", derived=True),
        _perf("mfu", R.MEAN, "Model FLOPs utilisation: the window's model FLOPs (6N per trained token, 2N per "
              "generated one, or the given FLOPs per token) / (window time x the world's peak FLOP/s)",
              unit="fraction", derived=True),
        _total("tokens_total", "Tokens so far in the run (an x-axis)", "tokens"),
        _total("samples_total", "Samples so far in the run (an x-axis)", "samples"),
        _total("time_s", "Training time so far: the sum of the slowest rank's window times (an x-axis)", "s"),
    ],
)
