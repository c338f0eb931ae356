"""No path where a published number is silently wrong (issue 12, items 1-8, 10 and 14).

Every expected value is computed by hand in the test (the arithmetic is written out beside it),
never by the code under test. The multi-rank halves of items 4, 5, 9 and 11 run on real gloo ranks in
``test_distributed.py``.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from posttrain_metrics import MetricReducer, MetricsError, Reduction, get_adapter, reduce_metrics
from posttrain_metrics.callbacks import MetricsCallback, build_callback
from posttrain_metrics.integrations.memory import MemorySink

R = Reduction
BUILTIN = ["grpo", "ppo", "dpo", "opd_direct", "opd_advantage", "nft", "flow_bc", "reward", "validation", "trainer"]


def raises(adapters: Any, per_rank: list[list[dict[str, Any]]], *needles: str) -> str:
    with pytest.raises(MetricsError) as info:
        reduce_metrics(adapters, per_rank)
    message = str(info.value)
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"
    return message


# -- 1. NFT optimality_std agrees with the moments published beside it --------------------------------


def nft_chunk(weights: list[float], *, bessel: bool = False) -> dict[str, Any]:
    """What an NFT producer reports for one chunk of optimality weights (moments by hand below)."""
    n = len(weights)
    mean = sum(weights) / n
    second = sum(w * w for w in weights) / n
    var = sum((w - mean) ** 2 for w in weights) / (n - 1 if bessel and n > 1 else n)
    return {"nft_optimality_mean": mean, "nft_optimality_second_moment": second, "nft_optimality_std": math.sqrt(var)}


def test_nft_optimality_std_over_two_ranks_is_the_std_of_all_weights() -> None:
    # rank 0 weights {1, 1}: mean 1, E[x^2] 1, std 0; rank 1 weights {3, 3}: mean 3, E[x^2] 9, std 0.
    # Over both: mean 2, E[x^2] 5, std sqrt(5 - 2^2) = 1 (a mean of the stds would say 0).
    got = reduce_metrics("nft", [[nft_chunk([1, 1])], [nft_chunk([3, 3])]])
    assert got["train/optimality_mean"] == 2.0
    assert got["train/optimality_second_moment"] == 5.0
    assert got["train/optimality_std"] == 1.0


def test_nft_optimality_std_squared_is_second_moment_minus_mean_squared() -> None:
    # contributions (plain means, one per chunk): {1, 2} -> m 1.5, E[x^2] 2.5; {4} -> m 4, E[x^2] 16;
    # {0, 2, 4} -> m 2, E[x^2] 20/3. Published: mean (1.5 + 4 + 2)/3 = 2.5,
    # second moment (2.5 + 16 + 20/3)/3 = 151/18, std sqrt(151/18 - 6.25) = sqrt(77/36).
    data = [[nft_chunk([1, 2]), nft_chunk([4])], [nft_chunk([0, 2, 4], bessel=True)]]
    got = reduce_metrics("nft", data)
    assert got["train/optimality_mean"] == pytest.approx(2.5, rel=1e-12)
    assert got["train/optimality_second_moment"] == pytest.approx(151 / 18, rel=1e-12)
    assert got["train/optimality_std"] == pytest.approx(math.sqrt(77 / 36), rel=1e-12)
    # the identity holds with the published figures, whatever std convention the producer used
    assert got["train/optimality_std"] ** 2 == pytest.approx(
        got["train/optimality_second_moment"] - got["train/optimality_mean"] ** 2, rel=1e-12
    )


def test_nft_optimality_std_without_a_second_moment_pools_the_reported_stds() -> None:
    # chunk 1: mean 2, std 1, so E[x^2] = 1 + 2^2 = 5; chunk 2: mean 5, std 0, so E[x^2] = 25.
    # One contribution per chunk, as the plain-mean moments count them: E[x] = (2 + 5)/2 = 3.5,
    # E[x^2] = (5 + 25)/2 = 15, std = sqrt(15 - 3.5^2) = sqrt(2.75)
    got = reduce_metrics("nft", [[{"nft_optimality_std": 1.0, "nft_optimality_mean": 2.0}],
                                 [{"nft_optimality_std": 0.0, "nft_optimality_mean": 5.0}]])
    assert got["train/optimality_std"] == pytest.approx(math.sqrt(2.75), rel=1e-12)


def test_nft_optimality_std_needs_its_mean_in_the_chunk() -> None:
    raises("nft", [[{"nft_optimality_std": 0.5, "nft_optimality_second_moment": 1.0}]], "'nft_optimality_mean'",
           "same chunk")


# -- 2. NFT takes the shared weight_sum --------------------------------------------------------------------


def test_nft_accepts_and_sums_weight_sum() -> None:
    got = reduce_metrics("nft", [[{"nft_loss": 1.0, "nft_weight_sum": 6}], [{"nft_loss": 3.0, "nft_weight_sum": 10}]])
    assert got == {"train/loss_avg": 2.0, "train/weight_sum": 16}  # loss a plain mean (1+3)/2; 6+10


def test_dpo_and_flow_bc_still_ignore_weight_sum() -> None:
    assert reduce_metrics("dpo", [[{"dpo_loss": 0.5, "dpo_weight_sum": 8}]]) == {"train/loss_avg": 0.5}
    assert reduce_metrics("flow_bc", [[{"flow_bc_loss": 0.5, "flow_bc_weight_sum": 8}]]) == {"train/loss_avg": 0.5}


# -- 3. extrema of a counted family skip contributions that counted nothing --------------------------------


def test_a_rank_that_scored_no_rollouts_has_no_reward_extrema() -> None:
    empty = {"reward_mean": 0.0, "reward_std": 0.0, "reward_min": 0.0, "reward_max": 0.0, "rollout_count": 0}
    scored = {"reward_mean": 0.5, "reward_std": 0.25, "reward_min": 0.25, "reward_max": 0.75, "rollout_count": 4}
    got = reduce_metrics("reward", [[empty], [scored]])
    assert got["train/reward_min"] == 0.25  # not the placeholder 0.0
    assert got["train/reward_max"] == 0.75
    assert got["train/reward_mean"] == 0.5 and got["train/rollout_count"] == 4
    # the same placeholder in a chunk of the same rank
    assert reduce_metrics("reward", [[scored, empty]])["train/reward_min"] == 0.25


def test_extrema_with_no_counted_contribution_are_absent() -> None:
    empty = {"reward_mean": 0.0, "reward_std": 0.0, "reward_min": 0.0, "reward_max": 0.0, "rollout_count": 0}
    got = reduce_metrics("reward", [[empty], [empty]])
    assert "train/reward_min" not in got and "train/reward_max" not in got
    assert got["train/rollout_count"] == 0 and got["train/reward_mean"] == 0.0  # how a reader tells "no data"


def test_a_nan_placeholder_with_zero_count_does_not_poison_an_extremum() -> None:
    got = reduce_metrics("grpo", [[{"grpo_kl_max": math.nan, "grpo_valid_token_count": 0}],
                                  [{"grpo_kl_max": 0.125, "grpo_valid_token_count": 30}]])
    assert got == {"train/kl_max": 0.125, "train/valid_token_count": 30}


def _counted_extrema() -> list[tuple[str, str, str, Reduction]]:
    out = []
    for name in BUILTIN:
        adapter = get_adapter(name)
        for source, metric in adapter.metrics.items():
            if metric.reduction in (R.MAX, R.MIN) and metric.weight is not None:
                out.append((name, source, adapter.source_of_leaf(metric.weight), metric.reduction))
    return out


COUNTED = _counted_extrema()


def test_the_reference_counted_extrema_are_all_declared() -> None:
    names = {source for _, source, _, _ in COUNTED}
    for expected in ("reward_min", "reward_max", "grpo_kl_max", "grpo_response_len_max", "grpo_sc_rho_max",
                     "ppo_behavior_logprob_delta_max", "ppo_behavior_logprob_delta_min", "ppo_initial_ratio_max"):
        assert expected in names


@pytest.mark.parametrize(("adapter", "source", "count", "reduction"), COUNTED, ids=lambda v: str(v))
def test_every_counted_extremum_ignores_zero_count_contributions(
    adapter: str, source: str, count: str, reduction: Reduction
) -> None:
    # a placeholder that would win (-1e9 for a MIN, 1e9 for a MAX) with count 0, and two real
    # contributions 2.0 and 5.0 with counts 3 and 1: the extremum is 2.0 (MIN) or 5.0 (MAX)
    placeholder = -1e9 if reduction is R.MIN else 1e9
    data = [[{source: placeholder, count: 0}, {source: 2.0, count: 3}], [{source: 5.0, count: 1}]]
    got = reduce_metrics(adapter, data)
    key = get_adapter(adapter).public_key(source, "train")
    assert got[key] == (2.0 if reduction is R.MIN else 5.0)


# -- 4. all-or-nothing families hold per batch, not per rank ----------------------------------------------

GAP = {"grpo_logprob_gap_mean": 0.05, "grpo_mean_rank_logprob_gap_p99": 0.4, "grpo_logprob_gap_gt0p5_frac": 0.001,
       "grpo_logprob_gap_token_count": 800}
WITH_GAP = {"grpo_clip_frac": 0.1, "grpo_valid_token_count": 900, **GAP}
WITHOUT_GAP = {"grpo_clip_frac": 0.2, "grpo_valid_token_count": 100}


def test_family_in_some_chunks_of_one_rank_fails() -> None:
    raises("grpo", [[WITH_GAP, WITHOUT_GAP]], "logprob_gap", "1 of the 2 chunks")
    raises("grpo", [[WITHOUT_GAP, WITH_GAP], [WITH_GAP]], "2 of the 3 chunks")


def test_chunks_without_the_adapters_keys_do_not_count() -> None:
    got = reduce_metrics(["grpo", "trainer"], [[WITH_GAP, {"grad_norm": 2.0}], [{"grad_norm": 2.0}]])
    assert got["train/logprob_gap_token_count"] == 800
    assert got["train/grad_norm"] == 2.0


def test_a_window_with_the_family_everywhere_or_nowhere_is_accepted() -> None:
    assert reduce_metrics("grpo", [[WITH_GAP, WITH_GAP], [WITH_GAP]])["train/logprob_gap_token_count"] == 2400
    assert "train/logprob_gap_token_count" not in reduce_metrics("grpo", [[WITHOUT_GAP, WITHOUT_GAP], [WITHOUT_GAP]])


# -- 5. exact counters and flags agree across ranks -------------------------------------------------------

AGREED_KEYS = [
    ("trainer", "optimizer_step", 5, 6),
    ("trainer", "attempt_id", 11, 12),
    ("trainer", "nonfinite_skips_total", 0, 1),
    ("trainer", "nonfinite_skips_consecutive", 2, 0),
    ("trainer", "zero_grad_skips_total", 3, 4),
    ("trainer", "step_skipped", True, False),
    ("trainer", "finite_gradient_check_enabled", False, True),
    ("ppo", "ppo_policy_optimizer_step", 8, 9),
    ("ppo", "ppo_critic_optimizer_step", 8, 10),
    ("ppo", "ppo_actor_warmup", 1.0, 0.0),
]


@pytest.mark.parametrize(("adapter", "source", "a", "b"), AGREED_KEYS)
def test_exact_counters_and_flags_that_disagree_across_ranks_fail(adapter: str, source: str, a: Any, b: Any) -> None:
    key = get_adapter(adapter).public_key(source, "train")
    raises(adapter, [[{source: a}], [{source: b}]], f"ranks disagree on {key!r}", "desynchronised")
    assert get_adapter(adapter).metrics[source].reduction is R.AGREED


@pytest.mark.parametrize(("adapter", "source", "a", "b"), AGREED_KEYS)
def test_exact_counters_and_flags_that_agree_come_back_exactly(adapter: str, source: str, a: Any, b: Any) -> None:
    key = get_adapter(adapter).public_key(source, "train")
    got = reduce_metrics(adapter, [[{source: b}, {source: a}], [{source: a}]])  # the last chunk counts
    assert got[key] == a and type(got[key]) is type(a)


def test_gradient_norm_and_learning_rates_keep_last_then_mean() -> None:
    got = reduce_metrics("trainer", [[{"grad_norm": 9.0}, {"grad_norm": 1.0}], [{"grad_norm": 2.0}]])
    assert got["train/grad_norm"] == 1.5  # last on each rank (1.0, 2.0), then their mean
    lr = reduce_metrics("ppo", [[{"ppo_policy_lr": 1e-4}], [{"ppo_policy_lr": 3e-4}]])
    assert lr["train/policy_lr"] == pytest.approx(2e-4, rel=1e-12)


# -- 6. negative counts and weights are refused wherever they appear ---------------------------------------


def test_a_negative_token_count_in_a_chunk_of_its_own_is_refused() -> None:
    raises("grpo", [[{"grpo_valid_token_count": -15}], [{"grpo_valid_token_count": 10}]],
           "'grpo_valid_token_count'", "-15", ">= 0")


def _count_keys() -> list[tuple[str, str]]:
    return [(name, source) for name in BUILTIN for source in sorted(get_adapter(name).counts)]


@pytest.mark.parametrize(("adapter", "source"), _count_keys(), ids=lambda v: str(v))
@pytest.mark.parametrize("bad", [-1, -0.5, math.inf, math.nan])
def test_every_count_is_refused_negative_or_non_finite(adapter: str, source: str, bad: float) -> None:
    declared = get_adapter(adapter)
    phase = sorted(declared.phases)[0]
    family = next((members for members in declared.families.values() if source in members), frozenset())
    chunk = {**dict.fromkeys(family, 0.0), source: bad}  # a whole family, so only the count is wrong
    with pytest.raises(MetricsError, match=f"'{source}'.*>= 0"):
        reduce_metrics(adapter, [[chunk]], phase=phase)


def test_counts_are_still_counts() -> None:
    got = reduce_metrics("reward", [[{"rollout_count": 0}, {"rollout_count": 7}], [{"rollout_count": True}]])
    assert got == {"train/rollout_count": 8}  # 0 + 7 + True(1)


# -- 8. a call that raises leaves nothing behind --------------------------------------------------------------


@pytest.mark.parametrize("bad", [5, {"reward_avg": "high"}, {"reward_avg_typo": 1.0}, None])
def test_refused_validation_call_leaves_nothing_pending(bad: Any) -> None:
    sink = MemorySink()
    cb = MetricsCallback(adapters=["grpo", "validation"], sinks=[sink])
    cb.on_run_start({})
    c1, c2 = {"reward_avg": 100.0, "reward_std": 0.0}, {"reward_avg": 100.0, "reward_std": 0.0}
    with pytest.raises(MetricsError):
        cb.on_validation_end(10, [c1, c2, bad])
    frame = cb.on_validation_end(20, {"reward_avg": 0.0, "reward_std": 0.0})
    assert frame.metrics == {"val/reward_avg": 0.0, "val/reward_std": 0.0}  # not 66.7: c1, c2 did not leak
    cb.on_run_end()
    assert [f.step for f in sink.frames] == [20]


def test_refused_reduce_leaves_nothing_pending() -> None:
    reducer = MetricReducer("grpo")
    reducer.add({"grpo_kl_max": 100.0})
    reducer.add({"grpo_kl_max": "oops"})
    with pytest.raises(MetricsError, match="grpo_kl_max"):
        reducer.reduce(1)
    assert reducer.pending_chunks == 0
    reducer.add({"grpo_kl_max": 0.5})
    assert reducer.reduce(2).metrics == {"train/kl_max": 0.5}


def test_refused_add_records_nothing() -> None:
    reducer = MetricReducer("grpo")
    reducer.add({"grpo_kl_max": 0.25})
    with pytest.raises(MetricsError, match="mapping"):
        reducer.add([("grpo_kl_max", 9.0)])  # type: ignore[arg-type]
    assert reducer.pending_chunks == 1
    assert reducer.reduce(1).metrics == {"train/kl_max": 0.25}


@pytest.mark.parametrize("step", ["3", 2.5, None, True, 2**60])
def test_a_bad_step_is_refused_and_the_window_discarded(step: Any) -> None:
    reducer = MetricReducer("grpo")
    reducer.add({"grpo_kl_max": 100.0})
    with pytest.raises(MetricsError, match="step"):
        reducer.reduce(step)
    reducer.add({"grpo_kl_max": 0.5})
    assert reducer.reduce(3).metrics == {"train/kl_max": 0.5}


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")
def test_unreadable_tensors_are_refused_naming_the_key() -> None:
    import torch
    for bad, what in [
        (torch.tensor(1.0, device="meta"), "meta tensor"),
        (torch.tensor([1.0]).to_sparse(), "sparse"),
        (torch.quantize_per_tensor(torch.tensor([1.0]), 0.1, 0, torch.quint8), "quantized"),
    ]:
        reducer = MetricReducer("grpo")
        reducer.add({"grpo_kl_max": bad, "grpo_valid_token_count": torch.tensor(3)})
        with pytest.raises(MetricsError, match=f"'grpo_kl_max'.*{what}"):
            reducer.reduce(1)
        reducer.add({"grpo_kl_max": torch.tensor(0.5)})
        assert reducer.reduce(2).metrics == {"train/kl_max": 0.5}


# -- 10. a launcher without a process group is not silent ---------------------------------------------------


def test_world_size_without_a_process_group_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "0")
    reducer = MetricReducer("grpo")
    reducer.add({"grpo_kl_max": 0.5})
    with pytest.raises(MetricsError, match=r"WORLD_SIZE=4.*init_process_group.*local=True"):
        reducer.reduce(1)
    cb = build_callback({"adapters": ["grpo"], "sinks": [{"type": "memory"}]})
    cb.on_chunk_end({"grpo_kl_max": 0.5})
    with pytest.raises(MetricsError, match="init_process_group"):
        cb.on_window_end(1)
    cb.on_run_end()


def test_an_explicit_local_reduction_is_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "0")
    reducer = MetricReducer("grpo", local=True)
    reducer.add({"grpo_kl_max": 0.5})
    assert reducer.reduce(1).metrics == {"train/kl_max": 0.5}
    sink = MemorySink()
    cb = build_callback({"adapters": ["grpo"], "sinks": [sink], "local": True})
    cb.on_chunk_end({"grpo_kl_max": 0.75})
    assert cb.on_window_end(1).metrics == {"train/kl_max": 0.75}
    cb.on_run_end()
    assert [f.metrics for f in sink.frames] == [{"train/kl_max": 0.75}]


def test_a_single_process_launch_needs_no_opt_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "1")
    reducer = MetricReducer("grpo")
    reducer.add({"grpo_kl_max": 0.5})
    assert reducer.reduce(1).metrics == {"train/kl_max": 0.5}


# -- 14. "did you mean" suggests the closest declared names -------------------------------------------------


@pytest.mark.parametrize(("typo", "adapters", "suggestion"), [
    ("grpo_kl_maximum", ["grpo"], "'grpo_kl_max'"),
    ("grpo_clipfrac", ["grpo"], "'grpo_clip_frac'"),
    ("reward_mena", ["reward"], "'reward_mean'"),
    ("grad_nrom", ["grpo", "trainer"], "'grad_norm'"),
    ("clip_frac", ["grpo"], "'grpo_clip_frac'"),  # the prefix forgotten
    ("ppo_clip_frac", ["grpo"], "'grpo_clip_frac'"),  # another algorithm's prefix
])
def test_unknown_source_names_get_the_closest_declared_names(typo: str, adapters: list[str], suggestion: str) -> None:
    message = raises(adapters, [[{typo: 1.0}]], "did you mean")
    hint = message.split("did you mean", 1)[1]
    assert suggestion in hint
    assert f"{typo!r}" not in hint  # the suggestion is a declared name, not the typo echoed back


def test_nothing_close_gets_no_suggestion() -> None:
    message = raises("grpo", [[{"completely_unrelated_metric_name": 1.0}]], "not declared")
    assert "did you mean" not in message


def test_a_refused_worker_export_leaves_nothing_pending() -> None:
    from posttrain_metrics.core.portable import WorkerMetrics, merge_exported

    worker = WorkerMetrics("grpo", worker_id="actor-0")
    worker.add({"grpo_kl_max": 100.0})
    with pytest.raises(MetricsError, match="step"):
        worker.export("3")  # type: ignore[arg-type]
    assert worker.pending_chunks == 0
    worker.add({"grpo_kl_max": 0.5})
    assert merge_exported("grpo", [worker.export(4)]).metrics == {"train/kl_max": 0.5}


# -- found by a second read ------------------------------------------------------------------------------


def test_a_nan_std_is_a_value_and_drops_out_with_a_zero_count() -> None:
    nan = math.nan
    empty = {"reward_mean": nan, "reward_std": nan, "reward_min": nan, "reward_max": nan, "rollout_count": 0}
    scored = {"reward_mean": 1.0, "reward_std": 0.5, "reward_min": 0.0, "reward_max": 2.0, "rollout_count": 4}
    got = reduce_metrics("reward", [[empty], [scored]])
    assert got == {"train/reward_mean": 1.0, "train/reward_std": 0.5, "train/reward_min": 0.0,
                   "train/reward_max": 2.0, "train/rollout_count": 4}
    val = reduce_metrics("validation", [[{"reward_avg": 1.0, "reward_std": nan}]], phase="val")
    assert val["val/reward_avg"] == 1.0 and math.isnan(val["val/reward_std"])  # one sample's torch.std()


def test_nft_chunk_with_both_moments_and_no_std_still_counts_for_the_std() -> None:
    # {1,1} reported with its std, {3,3} with its moments only: E[x] 2, E[x^2] 5, std sqrt(5 - 4) = 1
    got = reduce_metrics("nft", [[nft_chunk([1, 1])],
                                 [{"nft_optimality_mean": 3.0, "nft_optimality_second_moment": 9.0}]])
    assert (got["train/optimality_mean"], got["train/optimality_second_moment"], got["train/optimality_std"]) == (
        2.0, 5.0, 1.0)


def test_step_level_grpo_chunks_are_not_part_of_the_gap_familys_batch() -> None:
    # the gap is measured over completion tokens: a chunk of step-level values (a logged loss with a
    # unit weight_sum, the kl_beta echo) holds no trajectory, so it needs no gap record
    gap_only = dict(GAP)
    step_level = {"grpo_loss": 0.5, "grpo_weight_sum": 1, "grpo_kl_beta": 0.04}
    got = reduce_metrics("grpo", [[gap_only, gap_only, step_level]])
    assert got["train/logprob_gap_token_count"] == 1600 and got["train/kl_beta"] == 0.04
    # ... but a chunk with completion tokens and no record is a partial batch
    raises("grpo", [[gap_only, {"grpo_valid_token_count": 10, "grpo_clip_frac": 0.5}]], "1 of the 2 chunks",
           "'grpo_valid_token_count'")


def test_a_step_that_breaks_while_read_is_recorded_not_raised_raw() -> None:
    import torch

    class BadIndex:
        def __index__(self) -> int:
            raise ValueError("boom")

    for step in (torch.empty((), dtype=torch.long, device="meta"), BadIndex()):
        reducer = MetricReducer("grpo")
        reducer.add({"grpo_kl_max": 1.0})
        with pytest.raises(MetricsError, match="step could not be read"):
            reducer.reduce(step)
        reducer.add({"grpo_kl_max": 0.5})
        assert reducer.reduce(2).metrics == {"train/kl_max": 0.5}


def test_local_must_be_a_bool_and_never_runs_a_collective(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(MetricsError, match="local must be True or False, got str 'false'"):
        build_callback({"adapters": ["trainer"], "sinks": [{"type": "memory"}], "local": "false"})


def test_lightning_chunk_with_non_string_keys_is_recorded_not_raised() -> None:
    from posttrain_metrics.callbacks.lightning import OUTPUT_KEY, LightningMetricsCallback

    callback = LightningMetricsCallback(adapters=["grpo"], sinks=[{"type": "memory"}])
    refused = callback._chunk({"loss": 0.0, OUTPUT_KEY: {0: 1.0}}, "training_step")
    callback.metrics.on_chunk_end(refused)  # type: ignore[arg-type]
    with pytest.raises(MetricsError, match="dict of source names"):
        callback.metrics.on_window_end(1)
    callback.metrics.on_run_end()


def test_the_driver_names_the_workers_that_disagree_on_an_exact_counter() -> None:
    from posttrain_metrics.core.portable import WorkerMetrics, merge_exported

    states = []
    for worker, value in (("actor-0", 5), ("actor-1", 6), ("actor-2", 5)):
        w = WorkerMetrics("trainer", worker_id=worker)
        w.add({"optimizer_step": value})
        states.append(w.export(3))
    with pytest.raises(MetricsError, match=r"5\.0 from workers \['actor-0', 'actor-2'\], 6\.0 from workers \['actor-1'\]"):
        merge_exported("trainer", states)
