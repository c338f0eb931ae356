"""Throughput, stage timers, MFU and memory (issue 28), in process: a clock injected, figures by hand.

The real multi-rank path (gloo, 2 and 4 ranks) is in test_throughput_distributed.py; here the ranks
are simulated with ``reduce_metrics`` (the same merge) over each rank's window chunk.
"""

from __future__ import annotations

import pytest

from posttrain_metrics import MetricsError, get_adapter, reduce_metrics
from posttrain_metrics.callbacks import MetricsCallback, build_callback
from posttrain_metrics.core.extra import user_adapters
from posttrain_metrics.core.throughput import DEFAULT_STAGES, Throughput, peak_flops_of


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_window_time_runs_from_the_previous_window_end() -> None:
    clock = Clock()
    t = Throughput(clock=clock, memory=False)
    clock.t = 10.0
    t.start()
    clock.t = 12.5
    assert t.window_chunk() == {"perf_window_s": 2.5, "perf_window_s_mean": 2.5}
    t.start()  # already running: no restart
    clock.t = 13.0
    assert t.window_chunk()["perf_window_s"] == 0.5


def test_repeated_and_nested_stages_add_up_and_a_stage_nested_in_itself_counts_once() -> None:
    clock = Clock()
    t = Throughput(clock=clock, timers=["scoring"], memory=False)
    t.start()
    with t.timer("generation"):
        clock.t += 1.0
        with t.timer("scoring"):  # another stage inside: each counts its own time
            clock.t += 0.5
        with t.timer("generation"):  # itself inside: counted once, by the outer timing
            clock.t += 0.25
    with t.timer("generation"):  # repeated in the window: adds up
        clock.t += 2.0
    chunk = t.window_chunk()
    assert chunk["timer/generation_s"] == chunk["timer/generation_s_mean"] == 3.75
    assert chunk["timer/scoring_s"] == 0.5
    assert "timer/reward_s" not in chunk  # declared, not timed: absent
    assert "timer/generation_s" not in t.window_chunk()  # the next window starts empty


def test_an_undeclared_timer_is_refused_with_the_fix() -> None:
    t = Throughput(memory=False)
    with pytest.raises(MetricsError, match=r"perf=\{'timers': \['decode'\]\}"), t.timer("decode"):
        pass


def test_derived_figures_by_hand_and_running_totals() -> None:
    t = Throughput(memory=False)
    first = t.derive({"perf/window_s": 4.0, "train/valid_token_count": 1000, "train/rollout_count": 16})
    assert first["perf/tokens_per_s"] == 250.0 and first["perf/samples_per_s"] == 4.0
    second = t.derive({"perf/window_s": 1.0, "train/valid_token_count": 10, "perf/samples": 3})
    assert second["perf/tokens_total"] == 1010 and second["perf/samples_total"] == 19 and second["perf/time_s"] == 5.0
    # no time: counts still add up, no rate; no count: no rate
    third = t.derive({"train/valid_token_count": 5})
    assert "perf/tokens_per_s" not in third and third["perf/tokens_total"] == 1015 and third["perf/time_s"] == 5.0
    assert "perf/samples_per_s" not in t.derive({"perf/window_s": 2.0})


def test_a_total_with_no_count_yet_is_absent_not_zero() -> None:
    """Absent is not zero: a run with no sample count (grpo alone) has no perf/samples_total, not a
    column of zeros that an x-axis would draw every point at; once a count is seen the total runs on."""
    t = Throughput(memory=False)
    first = t.derive({"perf/window_s": 2.0, "train/valid_token_count": 10})
    assert first["perf/tokens_total"] == 10 and first["perf/time_s"] == 2.0
    assert "perf/samples_total" not in first and "perf/samples_per_s" not in first
    assert "perf/tokens_total" not in Throughput(memory=False).derive({"perf/window_s": 1.0})
    assert "perf/time_s" not in Throughput(memory=False).derive({"train/valid_token_count": 3})
    second = t.derive({"perf/window_s": 1.0, "perf/samples": 4})
    assert second["perf/samples_total"] == 4 and second["perf/tokens_total"] == 10 and second["perf/time_s"] == 3.0
    third = t.derive({"perf/window_s": 1.0})  # no count this window: the totals stay where they were
    assert (third["perf/tokens_total"], third["perf/samples_total"]) == (10, 4)


def test_a_run_counts_samples_from_one_source_not_a_fallback_per_window() -> None:
    """GSPO with exact_grpo and a generation every 2 optimizer steps: the generation windows carry
    train/rollout_count (4 rollouts), every window train/valid_sequence_count (the rows trained on).
    Samples are the rollouts: a window without them must not fall back to the rows, which would
    count each rollout twice in perf/samples_total (8 here, not 4)."""
    t = Throughput(memory=False)
    first = t.derive({"perf/window_s": 1.0, "train/rollout_count": 4, "train/valid_sequence_count": 4})
    second = t.derive({"perf/window_s": 1.0, "train/valid_sequence_count": 4})
    assert first["perf/samples_per_s"] == 4.0 and first["perf/samples_total"] == 4
    assert "perf/samples_per_s" not in second and second["perf/samples_total"] == 4
    # a run whose only count is the rows keeps using them
    rows = Throughput(memory=False)
    rows.derive({"perf/window_s": 1.0, "train/valid_sequence_count": 3})
    assert rows.derive({"perf/window_s": 1.0, "train/valid_sequence_count": 3})["perf/samples_total"] == 6


def test_derive_does_not_mutate_the_reduced_figures() -> None:
    metrics = {"perf/window_s": 2.0, "train/valid_token_count": 8}
    Throughput(memory=False).derive(metrics)
    assert metrics == {"perf/window_s": 2.0, "train/valid_token_count": 8}


def test_mfu_uses_6n_per_trained_and_2n_per_generated_token() -> None:
    n, peak = 1.0e9, 100.0e12
    t = Throughput(params=n, peak_flops=peak, memory=False)
    assert t.window_chunk()["perf_peak_flops"] == peak
    # two ranks: the world's peak is the sum of their peaks
    m = t.derive({"perf/window_s": 2.0, "perf/peak_flops": 2 * peak, "train/valid_token_count": 30_000,
                  "perf/generated_tokens": 50_000})
    assert m["perf/mfu"] == pytest.approx((6 * n * 30_000 + 2 * n * 50_000) / (2.0 * 2 * peak), rel=1e-12)
    given = Throughput(flops_per_token=5.0e9, peak_flops=peak, memory=False)
    m = given.derive({"perf/window_s": 1.0, "perf/peak_flops": peak, "train/valid_token_count": 1000})
    assert m["perf/mfu"] == pytest.approx(5.0e9 * 1000 / peak, rel=1e-12)
    assert "perf/mfu" not in Throughput(memory=False).derive({"perf/window_s": 1.0, "train/valid_token_count": 9})


def test_mfu_without_a_known_peak_is_an_error_when_built() -> None:
    with pytest.raises(MetricsError, match="peak_flops="):
        Throughput(params=1e9, memory=False)  # no CUDA device here to look up
    with pytest.raises(MetricsError, match="positive number"):
        Throughput(params=-1, peak_flops=1e12)


def test_a_number_read_as_text_by_pyyaml_gets_the_yaml_fix() -> None:
    """PyYAML reads ``params: 7.0e9`` (the docs' form, fine under Hydra/OmegaConf) as the string '7.0e9'."""
    import yaml

    perf = yaml.safe_load("params: 7.0e9\npeak_flops: 1.0e12")
    assert perf == {"params": "7.0e9", "peak_flops": "1.0e12"}
    with pytest.raises(MetricsError, match=r"params='7.0e9' is text.*7\.0e\+9"):
        build_callback({"adapters": ["grpo"], "sinks": [{"type": "memory"}], "perf": perf})


@pytest.mark.parametrize(("name", "peak"), [
    ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12), ("NVIDIA A100-SXM4-80GB", 312e12),
    ("NVIDIA L40S", 362e12), ("NVIDIA L4", 121e12), ("NVIDIA A10G", 70e12), ("Tesla T4", 65e12),
    ("NVIDIA GeForce GTX 1080", None),
])
def test_peak_table_matches_cuda_device_names(name: str, peak: float | None) -> None:
    assert peak_flops_of(name) == peak


def test_without_cuda_memory_is_the_process_peak_resident_memory() -> None:
    chunk = Throughput().window_chunk()
    assert chunk["perf_rss_peak_gib"] > 0.001  # this process holds more than a MiB
    assert "perf_mem_allocated_peak_gib" not in chunk


def test_derived_keys_take_no_slot_and_cannot_be_reported() -> None:
    perf = get_adapter("perf")
    derived = {m.leaf for m in perf.metrics.values() if m.derived}
    assert derived == {"tokens_per_s", "samples_per_s", "mfu", "tokens_total", "samples_total", "time_s"}
    with pytest.raises(MetricsError, match="perf_tokens_per_s"):
        reduce_metrics("perf", [[{"perf_tokens_per_s": 1.0}]])


def test_simulated_ranks_reduce_to_the_hand_computed_figures() -> None:
    """Three ranks, each with its own clock: the reduced window time is the slowest rank's, the
    stage time the max with the mean beside it, a stage timed on one rank only is that rank's."""
    adapters = [get_adapter("grpo"), get_adapter("perf"), *user_adapters(Throughput(memory=False).declarations)]
    chunks = []
    for rank, (window, gen, tokens) in enumerate([(3.0, 1.0, 100), (5.0, 2.0, 300), (4.0, 1.5, 50)]):
        clock = Clock()
        t = Throughput(clock=clock, memory=False)
        t.start()
        with t.timer("generation"):
            clock.t += gen
        if rank == 1:
            with t.timer("reward"):
                clock.t += 0.5
        clock.t = window
        chunks.append([{"grpo_valid_token_count": tokens}, t.window_chunk()])
    reduced = reduce_metrics(adapters, chunks)
    m = Throughput(memory=False).derive(reduced)
    assert m["perf/window_s"] == 5.0 and m["perf/window_s_mean"] == 4.0
    assert m["perf/tokens_per_s"] == 450 / 5.0
    assert m["timer/generation_s"] == 2.0 and m["timer/generation_s_mean"] == 1.5
    assert m["timer/reward_s"] == 0.5 and m["timer/reward_s_mean"] == 0.5
    assert not any(k.startswith("timer/train") for k in m)


def test_callback_publishes_perf_and_timers_and_refuses_timer_without_perf() -> None:
    clock = Clock()
    cb = MetricsCallback(adapters=["grpo"], sinks=[{"type": "memory"}], publisher="inline",
                         perf=Throughput(clock=clock, memory=False))
    with cb:
        cb.on_run_start()
        with cb.timer("train"):
            clock.t += 0.5
        cb.on_chunk_end({"grpo_valid_token_count": 40})
        clock.t = 2.0
        m = cb.on_window_end(1).metrics
    assert m["perf/window_s"] == 2.0 and m["perf/tokens_per_s"] == 20.0 and m["timer/train_s"] == 0.5
    assert cb.sinks[0].frames[-1].metrics == m  # type: ignore[attr-defined]
    plain = MetricsCallback(adapters=["grpo"], sinks=[{"type": "memory"}], publisher="inline")
    with pytest.raises(MetricsError, match="perf=True"):
        plain.timer("train")
    plain.on_run_end()


def test_a_first_window_whose_start_is_unknown_has_no_time_and_no_rate() -> None:
    """Without on_run_start (the sinks start lazily) or a timer, the clock starts at the first chunk's
    end: the work of that chunk is not in the window, so the window has no time (tokens/s would read
    1000 x too high here), its tokens still count; the next window is timed in full."""
    clock = Clock()
    cb = MetricsCallback(adapters=["grpo"], sinks=[{"type": "memory"}], publisher="inline",
                         perf=Throughput(clock=clock, memory=False))
    frames = []
    with cb:
        for step in (1, 2):
            clock.t += 1.0  # the chunk's work
            cb.on_chunk_end({"grpo_valid_token_count": 100})
            clock.t += 0.001
            frames.append(cb.on_window_end(step).metrics)
    first, second = frames
    assert "perf/window_s" not in first and "perf/tokens_per_s" not in first, first
    assert first["perf/tokens_total"] == 100 and "perf/time_s" not in first
    assert second["perf/window_s"] == pytest.approx(1.001) and second["perf/tokens_per_s"] == pytest.approx(100 / 1.001)
    assert second["perf/tokens_total"] == 200 and second["perf/time_s"] == pytest.approx(1.001)


def test_totals_across_a_discarded_window_and_a_validation() -> None:
    """Pins docs/throughput.md: a window every rank discarded (a bad source name) counts in no total and
    its stage time does not leak into the next; a validation counts no token and its time is in the
    next training window. Figures by hand from the injected clock."""
    clock = Clock()
    cb = MetricsCallback(adapters=["grpo", "validation"], sinks=[{"type": "memory"}], publisher="inline",
                         perf=Throughput(clock=clock, memory=False))
    with cb:
        cb.on_run_start()
        cb.on_chunk_end({"grpo_valid_token_count": 100})
        clock.t = 2.0
        first = cb.on_window_end(1).metrics
        with cb.timer("generation"):
            clock.t += 0.5
        cb.on_chunk_end({"grpo_valid_token_count": 30, "not_a_source": 1.0})
        clock.t = 5.0
        with pytest.raises(MetricsError, match="not_a_source"):
            cb.on_window_end(2)
        clock.t = 6.0
        val = cb.on_validation_end(2, {"reward_avg": 1.0}).metrics
        cb.on_chunk_end({"grpo_valid_token_count": 50})
        clock.t = 9.0
        third = cb.on_window_end(3).metrics
    assert (first["perf/tokens_total"], first["perf/time_s"]) == (100, 2.0)
    assert val == {"val/reward_avg": 1.0}
    assert third["perf/window_s"] == 4.0  # from the discarded window's end (5.0), the validation inside
    assert (third["perf/tokens_total"], third["perf/time_s"], third["perf/tokens_per_s"]) == (150, 6.0, 12.5)
    assert "timer/generation_s" not in third


def test_callback_config_takes_perf_options() -> None:
    cb = build_callback({"adapters": ["grpo"], "sinks": [{"type": "memory"}],
                         "perf": {"timers": ["decode"], "params": 1e9, "peak_flops": 1e12}})
    assert cb.throughput is not None and cb.throughput.stages == (*DEFAULT_STAGES, "decode")
    assert "perf" in [a.name for a in cb.publisher.adapters]
    with pytest.raises(MetricsError, match="unknown option"):
        build_callback({"adapters": ["grpo"], "sinks": [{"type": "memory"}], "perf": {"param": 1}})


# -- the doctor and the plot read the perf keys ---------------------------------------------------------


def perf_journal(tmp_path, rates: list[float]):  # type: ignore[no-untyped-def]
    """A journal of windows of 1,000 tokens each whose tokens/s are ``rates`` (an injected clock)."""
    from posttrain_metrics.journal import read_journal

    clock = Clock()
    cb = MetricsCallback(adapters=["grpo"], sinks=[{"type": "journal"}], publisher="inline", out_dir=tmp_path,
                         perf=Throughput(clock=clock, memory=False))
    with cb:
        cb.on_run_start()
        for step, rate in enumerate(rates, 1):
            cb.on_chunk_end({"grpo_valid_token_count": 1000})
            clock.t += 1000 / rate
            cb.on_window_end(step)
    return read_journal(tmp_path / "journal.jsonl")


def test_doctor_notes_a_sudden_drop_in_tokens_per_s(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from posttrain_metrics.doctor import Severity, run_checks

    rates = [1000.0, 1100.0, 900.0, 1000.0, 1050.0, 950.0, 1000.0, 1000.0, 400.0, 1000.0, 980.0]
    journal = perf_journal(tmp_path, rates)
    assert [f.metrics["perf/tokens_per_s"] for f in journal.frames] == pytest.approx(rates, rel=1e-9)
    (finding,) = [f for f in run_checks(journal) if f.check == "throughput_drop"]
    assert finding.severity is Severity.INFO and finding.steps == (9,)  # 400 < 0.5 x median 1000
    assert "40%" in finding.explanation


def test_doctor_is_silent_on_steady_throughput(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from posttrain_metrics.doctor import run_checks

    journal = perf_journal(tmp_path, [1000.0, 800.0, 1200.0] * 4)
    assert not [f for f in run_checks(journal) if f.check == "throughput_drop"]


def test_plot_x_axis_is_the_running_total(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from posttrain_metrics.plot.series import _Data, _on_x_axis

    data = _Data(perf_journal(tmp_path, [1000.0, 500.0, 250.0]))
    _on_x_axis(data, "perf/tokens_total")
    assert data.numeric["perf/tokens_per_s"] == [(1000, 1000.0), (2000, 500.0), (3000, 250.0)]
    data = _Data(perf_journal(tmp_path / "b", [1000.0, 500.0, 250.0]))
    _on_x_axis(data, "perf/time_s")
    assert [x for x, _ in data.numeric["train/valid_token_count"]] == pytest.approx([1.0, 3.0, 7.0])


def test_plot_x_without_perf_says_so(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from posttrain_metrics.journal import read_journal
    from posttrain_metrics.plot.series import _Data, _on_x_axis

    cb = MetricsCallback(adapters=["grpo"], sinks=[{"type": "journal"}], publisher="inline", out_dir=tmp_path)
    with cb:
        cb.on_chunk_end({"grpo_valid_token_count": 10})
        cb.on_window_end(1)
    with pytest.raises(MetricsError, match="perf=True"):
        _on_x_axis(_Data(read_journal(tmp_path / "journal.jsonl")), "perf/tokens_total")


# -- the framework callbacks publish them too --------------------------------------------------------------


def test_hugging_face_callback_publishes_perf_and_timers() -> None:
    from types import SimpleNamespace

    import transformers

    from posttrain_metrics.callbacks.transformers import PosttrainMetricsCallback
    from posttrain_metrics.integrations.memory import MemorySink

    clock, sink = Clock(), MemorySink()
    cb = PosttrainMetricsCallback(sinks=[sink], perf=Throughput(clock=clock, memory=False))
    args = type("GRPOConfig", (SimpleNamespace,), {})(
        importance_sampling_level="token", use_bias_correction_kl=False, logging_steps=1, logging_strategy="steps",
        gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1, beta=0.0, to_dict=dict)
    state, control = transformers.TrainerState(), transformers.TrainerControl()
    cb.on_train_begin(args, state, control)
    for step in (1, 2):
        state.global_step = step
        cb.on_step_begin(args, state, control)
        with cb.timer("generation"):
            clock.t += 0.25
        cb.on_chunk_end({"grpo_valid_token_count": 100 * step})
        clock.t = 2.0 * step
        control.should_log = False
        cb.on_step_end(args, state, control)
    cb.on_train_end(args, state, control)
    got = [(f.step, f.metrics["perf/tokens_per_s"], f.metrics["perf/tokens_total"], f.metrics["timer/generation_s"])
           for f in sink.frames]
    assert got == [(1, 50.0, 100, 0.25), (2, 100.0, 300, 0.25)]


def test_hugging_face_logged_values_unit_weights_are_not_tokens_or_samples() -> None:
    """The callback alone: TRL's logged kl / clip ratio / reward are contributed with a unit weight
    (train/valid_token_count = 1, train/rollout_count = 1, never published). Those are not counts:
    no tokens/s or samples/s from them, no total; the window time is still there."""
    from types import SimpleNamespace

    import transformers

    from posttrain_metrics.callbacks.transformers import PosttrainMetricsCallback
    from posttrain_metrics.integrations.memory import MemorySink

    clock, sink = Clock(), MemorySink()
    cb = PosttrainMetricsCallback(sinks=[sink], perf=Throughput(clock=clock, memory=False))
    args = type("GRPOConfig", (SimpleNamespace,), {})(
        importance_sampling_level="token", use_bias_correction_kl=False, logging_steps=1, logging_strategy="steps",
        gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1, beta=0.04, to_dict=dict)
    state, control = transformers.TrainerState(), transformers.TrainerControl()
    cb.on_train_begin(args, state, control)
    state.global_step = 1
    cb.on_step_begin(args, state, control)
    clock.t = 2.0
    control.should_log = True
    cb.on_step_end(args, state, control)
    cb.on_log(args, state, control, logs={"loss": 1.0, "kl": 0.1, "clip_ratio/region_mean": 0.2, "reward": 0.5,
                                          "completions/mean_length": 5.0})
    cb.on_train_end(args, state, control)
    (frame,) = sink.frames
    m = frame.metrics
    assert m["train/kl_mean"] == 0.1 and m["train/reward_mean"] == 0.5 and m["perf/window_s"] == 2.0
    assert not {"perf/tokens_per_s", "perf/samples_per_s", "perf/tokens_total", "perf/samples_total"} & set(m), m


def test_lightning_callback_publishes_perf_and_timers() -> None:
    from posttrain_metrics.callbacks.lightning import LightningMetricsCallback

    clock = Clock()
    cb = LightningMetricsCallback(adapters=["grpo"], sinks=[{"type": "memory"}],
                                  perf=Throughput(clock=clock, memory=False))
    with cb.metrics.timer("train"):
        clock.t += 1.0
    cb.metrics.on_chunk_end({"grpo_valid_token_count": 30})
    clock.t = 3.0
    m = cb.metrics.on_window_end(1).metrics
    assert (m["perf/window_s"], m["perf/tokens_per_s"], m["timer/train_s"]) == (3.0, 10.0, 1.0)
    cb.metrics.on_run_end()


class FakeCuda:
    """torch.cuda's memory and device calls, for a machine without CUDA."""

    def __init__(self) -> None:
        self.resets = 0

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def max_memory_allocated(self) -> int:
        return 3 * 2**30

    def max_memory_reserved(self) -> int:
        return 5 * 2**29

    def reset_peak_memory_stats(self) -> None:
        self.resets += 1

    def get_device_name(self) -> str:
        return "NVIDIA H100 80GB HBM3"


def test_with_cuda_memory_is_the_windows_peak_then_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    cuda = FakeCuda()
    monkeypatch.setitem(__import__("sys").modules, "torch", SimpleNamespace(cuda=cuda))
    t = Throughput(params=1e9)  # the peak from the device table
    assert t.peak_flops == 989e12
    chunk = t.window_chunk()
    assert chunk["perf_mem_allocated_peak_gib"] == 3.0 and chunk["perf_mem_reserved_peak_gib"] == 2.5
    assert "perf_rss_peak_gib" not in chunk and cuda.resets == 1
    t.window_chunk()
    assert cuda.resets == 2  # every window its own peak
