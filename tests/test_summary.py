"""RunSummary over long runs: frames held and folded a key at a time (core/summary.py) give the
figures of a plain oracle written here, and exactly the figures of folding frame by frame."""

from __future__ import annotations

import math

import pytest
from _runs import GRPO_ADAPTERS, grpo_run

from posttrain_metrics import Frame, Reduction, get_adapter
from posttrain_metrics.core.keys import describe
from posttrain_metrics.core.reduction import RunAggregate
from posttrain_metrics.core.summary import BATCH, RunSummary

KEYS = describe([get_adapter(a) for a in GRPO_ADAPTERS])


def long_run() -> list[Frame]:
    """More than two batches of GRPO frames, with what breaks a batch's plan: a NaN, infinities, a
    key missing for a while, an int key that turns float, frames of other keys in between."""
    base = grpo_run(steps=40, seed=1)
    frames: list[Frame] = []
    for step in range(1, 2 * BATCH + 90):
        metrics = dict(base[step % len(base)].metrics)
        metrics["train/loss_avg"] = float(metrics["train/loss_avg"]) + step * 1e-3  # every step differs
        if step == 100:
            metrics["train/kl_max"] = math.nan
        if step == 150:
            metrics["train/kl_mean"] = -math.inf
        if step == 151:
            metrics["train/kl_max"] = math.inf
        if 300 <= step < 310:
            del metrics["train/clip_frac"]
        if step == 420:
            metrics["train/valid_token_count"] = 33.5  # an int key turns float
        frames.append(Frame(step, metrics, "train", float(step)))
        if step % 97 == 0:
            frames.append(Frame(step, {"train/kl_max": 0.25, "eval/x": 1.0}, "val", float(step)))
    return frames


def finite(x: object) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def oracle(frames: list[Frame]) -> dict[str, object]:
    """Each key's run aggregate from its declaration, the plain way: lists of values, then math."""
    out: dict[str, object] = {}
    for key, info in KEYS.items():
        seen = [(f.metrics[key], f.metrics) for f in frames if key in f.metrics]
        if not seen:
            continue
        r = info.metric.reduction
        if r is Reduction.CATEGORICAL:
            for label in info.metric.labels:
                out[f"{key}/{label}"] = sum(1 for v, _ in seen if v == label)
            continue
        values = [v for v, _ in seen]
        ok = [(v, m) for v, m in seen if finite(v)]
        floats = any(type(v) is float for v in values)
        if not ok and r not in (Reduction.MAX, Reduction.MIN):
            out[key] = values[-1]
        elif r is Reduction.WEIGHTED_MEAN:
            w = [float(m.get(info.weight_key, 0)) if finite(m.get(info.weight_key)) else 0.0 for _, m in ok]
            total = math.fsum(w)
            out[key] = math.fsum(float(v) * x for (v, _), x in zip(ok, w)) / total if total > 0 else 0.0
        elif r is Reduction.SUM:
            total = math.fsum(float(v) for v, _ in ok)
            out[key] = total if floats else int(total)
        elif r in (Reduction.MAX, Reduction.MIN):
            kept = [float(v) for v in values if not math.isnan(v)]
            best = max(kept) if r is Reduction.MAX else min(kept)
            out[key] = best if floats or not math.isfinite(best) else (bool(best) if type(values[0]) is bool else int(best))
        elif r is Reduction.MEAN:
            out[key] = math.fsum(float(v) for v, _ in ok) / len(ok)
        elif r is Reduction.POOLED_STD:
            n = [float(m.get(info.weight_key, 1.0)) for _, m in ok]
            mu = [float(m.get(info.mean_key, 0.0)) for _, m in ok]
            total = math.fsum(n)
            mean = math.fsum(a * b for a, b in zip(n, mu)) / total
            second = math.fsum(a * (float(v) ** 2 + b * b) for a, (v, _), b in zip(n, ok, mu)) / total
            out[key] = math.sqrt(max(second - mean * mean, 0.0))
        elif r is Reduction.AGREED and info.metric.run is RunAggregate.WINDOWS:  # windows where the flag held
            out[key] = sum(1 for v, _ in ok if v)
        elif r is Reduction.AGREED and info.metric.run is RunAggregate.TOTAL:
            out[key] = sum(v for v, _ in ok)
        elif r is Reduction.AGREED and info.metric.run is RunAggregate.MAX:
            out[key] = max(v for v, _ in ok)
        else:  # LAST, and AGREED running counters
            out[key] = values[-1]
    return out


def test_long_run_matches_the_oracle():
    frames = long_run()
    summary = RunSummary(KEYS)
    for frame in frames:
        summary.add(frame)
    got, want = summary.values(), oracle(frames)
    assert set(got) == set(want)
    for key, value in want.items():
        assert type(got[key]) is type(value), (key, got[key], value)
        if isinstance(value, float) and math.isfinite(value):
            assert got[key] == pytest.approx(value, rel=1e-12, abs=1e-300), key
        else:
            assert got[key] == value or (math.isnan(value) and math.isnan(got[key])), key  # type: ignore[arg-type]
    assert isinstance(got["train/valid_token_count"], float)  # widened at step 420
    assert got["train/kl_max"] == math.inf
    assert summary.nonfinite == {"train/kl_max": 2, "train/kl_mean": 1}
    assert summary.frames == len(frames)


def test_held_frames_fold_to_the_same_bits_as_frame_by_frame():
    """values() after every frame folds each frame on its own (a batch of one): the figures of a
    run folded in batches are bit for bit the same."""
    frames = long_run()
    batched, single = RunSummary(KEYS), RunSummary(KEYS)
    for frame in frames:
        batched.add(frame)
        single.add(frame)
        single.values()
    a, b = batched.values(), single.values()
    assert list(a) == list(b)
    for key in a:
        x, y = a[key], b[key]
        assert type(x) is type(y) and (x == y or (x != x and y != y)), key
        if isinstance(x, float):
            assert math.copysign(1.0, x) == math.copysign(1.0, y), key
    assert batched.nonfinite == single.nonfinite
