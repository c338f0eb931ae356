"""The built-in catalogue is complete: every key of the metrics reference, declared with its aggregation.

``REFERENCE`` is transcribed by hand from ``metrics-reference.md`` (facts only: public key, adapter,
aggregation, and the weight where the reference names one), so that this test runs on any clone.
Where the reference states no aggregation (the reward/grouping report, the optimizer outcome keys,
some PPO diagnostics) the row records the catalogue's documented choice and says so in a comment.
"""

from __future__ import annotations

import fnmatch
import math
from typing import Any

import pytest

from posttrain_metrics import MetricAdapter, MetricsError, Reduction, get_adapter, reduce_metrics

R = Reduction
WM, SUM, MAX, MIN, MEAN, LAST, AGREED, STD, CAT = (
    R.WEIGHTED_MEAN, R.SUM, R.MAX, R.MIN, R.MEAN, R.LAST, R.AGREED, R.POOLED_STD, R.CATEGORICAL,
)

TOKENS = "<a token count>"
"""The reference says "token-weighted" without naming the weight key."""

# (public key, adapter, aggregation, weight key or None)
REFERENCE: list[tuple[str, str, Reduction, str | None]] = [
    # -- shared across algorithms
    ("train/loss_avg", "grpo", WM, "train/weight_sum"),
    ("train/loss_avg", "opd_direct", WM, "train/weight_sum"),
    ("train/loss_avg", "opd_advantage", WM, "train/weight_sum"),
    ("train/loss_avg", "nft", MEAN, None),  # DPO's is in the DPO rows
    ("train/loss_avg", "flow_bc", MEAN, None),
    ("train/weight_sum", "grpo", SUM, None),
    ("train/weight_sum", "opd_direct", SUM, None),
    ("train/weight_sum", "opd_advantage", SUM, None),
    ("train/weight_sum", "nft", SUM, None),  # shared; only DPO and flow-BC ignore it
    ("train/valid_sequence_count", "grpo", SUM, None),
    ("train/valid_token_count", "grpo", SUM, None),
    ("train/valid_token_count", "opd_direct", SUM, None),
    ("train/valid_token_count", "opd_advantage", SUM, None),
    ("train/grad_norm", "trainer", LAST, None),
    ("train/learning_rate", "trainer", MEAN, None),
    ("timer/e2e_step_s", "trainer", MEAN, None),
    # -- GRPO
    ("train/clip_frac", "grpo", WM, "train/valid_token_count"),
    ("train/ratio_absdev", "grpo", WM, "train/valid_token_count"),
    ("train/seq_clip_frac", "grpo", WM, "train/valid_sequence_count"),
    ("train/seq_log_ratio_abs", "grpo", WM, "train/valid_sequence_count"),
    ("train/routing_replay_pinned_tokens", "grpo", SUM, None),
    ("train/routing_replay_pinned_blocks", "grpo", MEAN, None),
    ("train/logprob_gap_mean", "grpo", WM, "train/logprob_gap_token_count"),
    ("train/mean_rank_logprob_gap_p99", "grpo", WM, "train/logprob_gap_token_count"),
    ("train/logprob_gap_gt0p5_frac", "grpo", WM, "train/logprob_gap_token_count"),
    ("train/logprob_gap_token_count", "grpo", SUM, None),
    ("train/kl_mean", "grpo", WM, "train/valid_token_count"),
    ("train/kl_max", "grpo", MAX, "train/valid_token_count"),  # its family's count: no tokens, no extremum
    ("train/kl_beta", "grpo", MEAN, None),
    ("train/response_count", "grpo", SUM, None),
    ("train/rollout_truncated_frac", "grpo", WM, "train/response_count"),
    ("train/response_len_mean", "grpo", WM, "train/response_count"),
    ("train/response_len_max", "grpo", MAX, "train/response_count"),
    ("train/sc_token_count", "grpo", SUM, None),
    ("train/sc_head_mass_q", "grpo", WM, "train/sc_token_count"),
    ("train/sc_head_mass_p", "grpo", WM, "train/sc_token_count"),
    ("train/sc_rho_mean", "grpo", WM, "train/sc_token_count"),
    ("train/sc_rho_max", "grpo", MAX, "train/sc_token_count"),
    ("train/sc_kl_head", "grpo", WM, "train/sc_token_count"),
    ("train/sc_correction_abs", "grpo", WM, "train/sc_token_count"),
    ("train/sc_token_weight", "grpo", WM, "train/sc_token_count"),
    ("train/sc_out_of_head_frac", "grpo", WM, "train/sc_token_count"),
    # -- reward and grouping. The reference gives no aggregation column here: "sample-weighted"
    # statistics (mean weighted by the trajectories scored, the std pooled over them, min/max as
    # extrema) and counts summed. Dynamic-sampling rounds and dispatches are per-shard durations
    # that every shard spends together: the catalogue takes their MAX (its documented choice).
    ("train/reward_mean", "reward", WM, "train/rollout_count"),
    ("train/reward_std", "reward", STD, "train/rollout_count"),
    ("train/reward_min", "reward", MIN, "train/rollout_count"),
    ("train/reward_max", "reward", MAX, "train/rollout_count"),
    ("train/rollout_count", "reward", SUM, None),
    ("train/grpo_group_count", "reward", SUM, None),
    ("train/grpo_informative_group_count", "reward", SUM, None),
    ("train/grpo_tied_group_count", "reward", SUM, None),
    ("train/grpo_all_zero_group_count", "reward", SUM, None),
    ("train/grpo_all_one_group_count", "reward", SUM, None),
    ("train/grpo_dynamic_sampling_extra_rollouts", "reward", MAX, None),  # catalogue's choice
    ("train/grpo_dynamic_sampling_refill_dispatches", "reward", MAX, None),  # catalogue's choice
    ("train/grpo_dynamic_sampling_idle_cells", "reward", SUM, None),
    ("train/grpo_dynamic_sampling_batch_informative_groups", "reward", SUM, None),
    ("train/grpo_dynamic_sampling_avoided_prompts", "reward", SUM, None),
    ("train/grpo_dynamic_sampling_dropped_trajectories", "reward", SUM, None),
    # -- PPO: both role windows, the prepared batch, the consistency diagnostics
    ("train/policy_total_loss", "ppo", WM, TOKENS),
    ("train/policy_loss", "ppo", WM, TOKENS),
    ("train/clip_fraction", "ppo", WM, TOKENS),
    ("train/ratio_mean", "ppo", WM, TOKENS),
    ("train/entropy", "ppo", WM, TOKENS),
    ("train/jsd_loss", "ppo", WM, TOKENS),
    ("train/value_loss", "ppo", WM, TOKENS),
    ("train/critic_loss", "ppo", WM, TOKENS),
    ("train/value_clip_fraction", "ppo", WM, TOKENS),
    ("train/reward_mean", "ppo", WM, "train/valid_action_tokens"),
    ("train/advantage_mean", "ppo", WM, "train/valid_action_tokens"),
    ("train/advantage_std", "ppo", STD, "train/valid_action_tokens"),
    ("train/value_advantage_mean", "ppo", WM, "train/valid_action_tokens"),
    ("train/return_mean", "ppo", WM, "train/valid_action_tokens"),
    ("train/value_mean", "ppo", WM, "train/valid_action_tokens"),
    # "batch mean": the catalogue makes it the mean over the batch's valid action tokens
    ("train/reference_kl_mean", "ppo", WM, "train/valid_action_tokens"),
    ("train/valid_action_tokens", "ppo", SUM, None),
    # "reduced across the complete policy model-DP world": token-weighted in the catalogue
    ("train/initial_clip_fraction", "ppo", WM, "train/valid_action_tokens"),
    ("train/initial_importance_ess", "ppo", WM, "train/valid_action_tokens"),
    ("train/policy_lr", "ppo", LAST, None),
    ("train/critic_lr", "ppo", LAST, None),
    # exact per-iteration flag and exact counters: the same on every rank, or a desynchronised run
    ("train/actor_warmup", "ppo", AGREED, None),
    ("optim/policy_optimizer_step", "ppo", AGREED, None),
    ("optim/critic_optimizer_step", "ppo", AGREED, None),
    # -- DPO (train and val); no key is in weighted_by, so every key is a plain mean
    *[
        (f"{phase}/{leaf}", "dpo", MEAN, None)
        for phase in ("train", "val")
        for leaf in (
            "loss_avg", "dpo_reward_margin", "dpo_reward_winner", "dpo_reward_loser", "dpo_accuracy",
            "dpo_err_pol_w", "dpo_err_ref_w", "dpo_err_pol_l", "dpo_err_ref_l",
            "dpo_raw_model_loss", "dpo_raw_ref_loss",
        )
    ],
    # -- OPD: both forms, token-weighted
    ("train/opd_divergence", "opd_direct", WM, "train/valid_token_count"),
    ("train/opd_divergence", "opd_advantage", WM, "train/valid_token_count"),
    ("train/opd_advantage", "opd_advantage", WM, "train/valid_token_count"),
    ("train/opd_teacher_credit", "opd_advantage", WM, "train/valid_token_count"),
    # -- NFT: reduction MEAN
    *[
        (f"train/{leaf}", "nft", MEAN, None)
        for leaf in (
            "policy_loss", "kl_loss", "advantage_mean", "optimality_mean", "optimality_second_moment",
            "positive_error", "negative_error", "reward_mean",
        )
    ],
    # the std of the optimality weights, consistent with the moments published beside it
    ("train/optimality_std", "nft", STD, None),
    # -- flow-BC (train and val)
    ("train/flow_bc_masked_elements", "flow_bc", SUM, None),
    ("val/loss_avg", "flow_bc", MEAN, None),
    ("val/flow_bc_masked_elements", "flow_bc", SUM, None),
    # -- optimizer outcome keys. The reference gives their values, not an aggregation: the labels
    # are categorical, and the counters and flags are per-window states read from the last chunk
    # that every data-parallel rank holds identically: ranks that disagree are desynchronised.
    ("optim/update_outcome", "trainer", CAT, None),
    ("optim/skip_reason", "trainer", CAT, None),
    ("optim/step_skipped", "trainer", AGREED, None),
    ("optim/attempt_id", "trainer", AGREED, None),
    ("optim/optimizer_step", "trainer", AGREED, None),
    ("optim/nonfinite_skips_total", "trainer", AGREED, None),
    ("optim/nonfinite_skips_consecutive", "trainer", AGREED, None),
    ("optim/zero_grad_skips_total", "trainer", AGREED, None),
    ("optim/finite_gradient_check_enabled", "trainer", AGREED, None),
    # -- validation phase (val/loss_avg of DPO is in the DPO rows)
    ("val/reward_avg", "validation", MEAN, None),
    ("val/reward_std", "validation", STD, None),
]

# PPO keys whose suffixes the reference leaves open.
WILDCARDS: list[tuple[str, str]] = [
    ("train/behavior_logprob_delta_*", "ppo"),
    ("train/initial_ratio_*", "ppo"),
    ("train/reference_behavior_logprob_delta_*", "ppo"),
    ("train/policy_reference_logprob_delta_*", "ppo"),
]

OUTCOMES = {"accumulating", "applied", "skipped", "discarded"}
SKIP_REASONS = {"nonfinite_loss", "nonfinite_gradient"}
BUILTIN = ["grpo", "ppo", "dpo", "opd_direct", "opd_advantage", "nft", "flow_bc", "reward", "validation", "trainer"]
OBJECTIVE_PREFIX = {
    "grpo": "grpo_", "ppo": "ppo_", "dpo": "dpo_", "opd_direct": "opd_", "opd_advantage": "opd_",
    "nft": "nft_", "flow_bc": "flow_bc_",
}


def declared(adapter: MetricAdapter) -> dict[str, str]:
    """Every public key ``adapter`` can publish, to its source name."""
    return {
        adapter.public_key(source, phase): source
        for source in adapter.metrics
        for phase in adapter.phases
    }


def test_reference_table_is_well_formed() -> None:
    keys = [(key, adapter) for key, adapter, _, _ in REFERENCE]
    assert len(keys) == len(set(keys)), "a row is transcribed twice"
    assert {adapter for _, adapter in keys} == set(BUILTIN)
    assert len(REFERENCE) >= 125


@pytest.mark.parametrize(("key", "adapter_name", "reduction", "weight"), REFERENCE, ids=lambda v: str(v))
def test_reference_key_is_declared(key: str, adapter_name: str, reduction: Reduction, weight: str | None) -> None:
    adapter = get_adapter(adapter_name)
    keys = declared(adapter)
    assert key in keys, f"{adapter_name} does not declare {key}"
    source = keys[key]
    metric = adapter.metrics[source]
    assert metric.reduction is reduction, f"{key}: {metric.reduction.name}, reference says {reduction.name}"
    phase = key.split("/", 1)[0]
    if weight is None:
        if reduction is R.WEIGHTED_MEAN:
            pytest.fail(f"{key}: the table must name the weight of a weighted mean")
        return
    assert metric.weight is not None, f"{key} declares no weight"
    weight_source = adapter.source_of_leaf(metric.weight)
    assert adapter.metrics[weight_source].reduction is R.SUM, "weights are summed"
    if weight == TOKENS:
        assert "token" in metric.weight, f"{key} is token-weighted, not by {metric.weight!r}"
    else:
        assert adapter.public_key(weight_source, phase if phase in ("train", "val") else "train") == weight
    if reduction is R.WEIGHTED_MEAN:
        assert adapter.weighted_by[source] == weight_source  # the reference's weighted_by field
    if reduction is R.MAX:
        assert source in adapter.max_reduced
    if reduction in (R.MAX, R.MIN, R.POOLED_STD):  # the count of an extremum or of a pooled std
        assert weight_source in adapter.counts


COUNTED_DIAGNOSTICS = [
    f"train/{stem}_{end}"
    for stem in ("behavior_logprob_delta", "initial_ratio", "reference_behavior_logprob_delta",
                 "policy_reference_logprob_delta")
    for end in ("max", "min")
]


@pytest.mark.parametrize("key", COUNTED_DIAGNOSTICS)
def test_ppo_diagnostic_extrema_are_counted_by_valid_action_tokens(key: str) -> None:
    ppo = get_adapter("ppo")
    metric = ppo.metrics[declared(ppo)[key]]
    assert metric.weight == "valid_action_tokens"


@pytest.mark.parametrize("name", BUILTIN)
def test_every_summed_key_and_exact_counter_is_a_count(name: str) -> None:
    """Every SUM of the built-in catalogue counts things (tokens, groups, elements ...), and so does
    every AGREED key that is not a flag: all are refused when negative or non-finite."""
    adapter = get_adapter(name)
    for source, metric in adapter.metrics.items():
        flag = metric.leaf.endswith(("skipped", "enabled", "warmup"))
        if metric.reduction is R.SUM or (metric.reduction is R.AGREED and not flag):
            assert source in adapter.counts, f"{name}: {source} is not declared a count"


@pytest.mark.parametrize(("pattern", "adapter_name"), WILDCARDS)
def test_wildcard_keys_are_declared(pattern: str, adapter_name: str) -> None:
    matches = [key for key in declared(get_adapter(adapter_name)) if fnmatch.fnmatchcase(key, pattern)]
    assert matches, f"no key of {adapter_name} matches {pattern}"


CATALOGUE_ADDITIONS = {
    ("train/policy_token_count", "ppo"),  # the weights of "token-weighted" policy-window keys
    ("train/critic_token_count", "ppo"),  # ... and of critic-window keys
    ("train/valid_sequence_count", "opd_direct"),  # the shared count, declared with the token count
    ("train/valid_sequence_count", "opd_advantage"),
    # a window's updates by outcome (n_mini > 1): the last label alone hides an applied update
    ("optim/updates_applied", "trainer"),
    ("optim/updates_skipped", "trainer"),
    ("optim/updates_discarded", "trainer"),
}


def test_every_declared_key_is_accounted_for() -> None:
    """The other direction: a key the catalogue adds beyond the reference is a conscious addition."""
    rows = {(key, adapter) for key, adapter, _, _ in REFERENCE}
    extra = {
        (key, name)
        for name in BUILTIN
        for key in declared(get_adapter(name))
        if (key, name) not in rows
        and not any(fnmatch.fnmatchcase(key, p) for p, a in WILDCARDS if a == name)
    }
    assert extra == CATALOGUE_ADDITIONS


def test_max_reduced_is_exactly_the_maxima() -> None:
    grpo = get_adapter("grpo")
    assert {grpo.names[s] for s in grpo.max_reduced} == {"kl_max", "response_len_max", "sc_rho_max"}
    assert not (set(grpo.weighted_by) & grpo.max_reduced)


def test_opd_direct_publishes_no_advantage_keys() -> None:
    direct = declared(get_adapter("opd_direct"))
    assert "train/opd_advantage" not in direct
    assert "train/opd_teacher_credit" not in direct


@pytest.mark.parametrize(("name", "phases"), [
    ("grpo", {"train"}), ("ppo", {"train"}), ("dpo", {"train", "val"}), ("opd_direct", {"train"}),
    ("opd_advantage", {"train"}), ("nft", {"train"}), ("flow_bc", {"train", "val"}),
    ("reward", {"train"}), ("validation", {"val"}), ("trainer", {"train"}),
])
def test_adapter_phases(name: str, phases: set[str]) -> None:
    adapter = get_adapter(name)
    assert adapter.name == name
    assert set(adapter.phases) == phases


@pytest.mark.parametrize("name", ["dpo", "flow_bc"])
def test_weight_sum_is_not_published_by_dpo_and_flow_bc(name: str) -> None:
    adapter = get_adapter(name)
    assert "train/weight_sum" not in declared(adapter)
    assert adapter.internal_prefix + "weight_sum" in adapter.ignored


def test_every_declared_key_has_a_meaning() -> None:
    for name in BUILTIN:
        for source, metric in get_adapter(name).metrics.items():
            assert metric.meaning.strip(), f"{name}: {source} has no meaning"


def test_unknown_adapter_name() -> None:
    with pytest.raises(MetricsError, match="grpo"):
        get_adapter("gpro")


# -- the source-name convention ------------------------------------------------------------------


@pytest.mark.parametrize(("adapters", "chunk", "key", "value"), [
    ("grpo", {"grpo_loss": 1.5, "grpo_weight_sum": 4.0}, "train/loss_avg", 1.5),
    ("grpo", {"grpo_clip_frac": 0.25, "grpo_valid_token_count": 8}, "train/clip_frac", 0.25),
    ("dpo", {"dpo_accuracy": 0.75}, "train/dpo_accuracy", 0.75),
    ("ppo", {"ppo_policy_optimizer_step": 12}, "optim/policy_optimizer_step", 12),
    ("flow_bc", {"flow_bc_masked_elements": 96}, "train/flow_bc_masked_elements", 96),
    ("reward", {"reward_mean": 0.5, "rollout_count": 4}, "train/reward_mean", 0.5),
    ("reward", {"grpo_informative_group_count": 3}, "train/grpo_informative_group_count", 3),
    ("trainer", {"grad_norm": 2.5}, "train/grad_norm", 2.5),
    ("trainer", {"update_outcome": "applied"}, "optim/update_outcome", "applied"),
    ("trainer", {"e2e_step_s": 3.0}, "timer/e2e_step_s", 3.0),
    ("validation", {"reward_avg": 0.5}, "val/reward_avg", 0.5),
])
def test_source_names(adapters: str, chunk: dict[str, Any], key: str, value: Any) -> None:
    phase = "val" if adapters == "validation" else "train"
    result = reduce_metrics(adapters, [[chunk]], phase=phase)
    assert result[key] == value
    assert type(result[key]) is type(value)


@pytest.mark.parametrize("name", sorted(OBJECTIVE_PREFIX))
def test_objective_source_names_follow_the_prefix_rule(name: str) -> None:
    adapter = get_adapter(name)
    prefix = OBJECTIVE_PREFIX[name]
    assert adapter.internal_prefix == prefix
    for source, metric in adapter.metrics.items():
        if metric.leaf == "loss_avg":
            assert source == f"{prefix}loss"
        elif metric.leaf.startswith(prefix):
            assert source == metric.leaf
        else:
            assert source == prefix + metric.leaf


@pytest.mark.parametrize("name", ["reward", "validation", "trainer"])
def test_report_adapters_take_bare_leaves(name: str) -> None:
    adapter = get_adapter(name)
    for source, metric in adapter.metrics.items():
        assert source == metric.leaf


@pytest.mark.parametrize(("name", "phase", "chunk", "key"), [
    ("dpo", "train", {"dpo_weight_sum": 7.0, "dpo_loss": 0.5}, "train/loss_avg"),
    ("dpo", "val", {"dpo_weight_sum": 7.0, "dpo_loss": 0.5}, "val/loss_avg"),
    ("flow_bc", "train", {"flow_bc_weight_sum": 3.0, "flow_bc_loss": 0.5}, "train/loss_avg"),
])
def test_ignored_sources_are_accepted_and_not_published(name: str, phase: str, chunk: dict[str, Any], key: str) -> None:
    result = reduce_metrics(name, [[chunk], [{"dpo_weight_sum" if name == "dpo" else "flow_bc_weight_sum": 1.0}]], phase=phase)
    assert result == {key: 0.5}


@pytest.mark.parametrize(("name", "source"), [
    ("grpo", "grpo_bogus"),
    ("grpo", "clip_frac"),  # the leaf is not the source name
    ("grpo", "train/clip_frac"),  # nor is the public key
    ("reward", "grpo_reward_mean"),
    ("dpo", "dpo_reward"),
    ("trainer", "optim/update_outcome"),
])
def test_undeclared_source_is_an_error(name: str, source: str) -> None:
    with pytest.raises(MetricsError) as info:
        reduce_metrics(name, [[{source: 1.0}], []])
    assert repr(source) in str(info.value)
    assert "fix" in str(info.value)


def test_each_source_belongs_to_one_adapter() -> None:
    # the reward report's keys are not GRPO objective keys, and vice versa
    result = reduce_metrics(["grpo", "reward"], [[{"grpo_kl_max": 0.5, "grpo_group_count": 4}]])
    assert result == {"train/kl_max": 0.5, "train/grpo_group_count": 4}
    with pytest.raises(MetricsError, match="grpo_group_count"):
        reduce_metrics("grpo", [[{"grpo_group_count": 4}]])


@pytest.mark.parametrize(("a", "b", "key"), [
    ("ppo", "reward", "reward_mean"),
    ("nft", "reward", "reward_mean"),
    ("grpo", "opd_direct", "loss_avg"),
    ("dpo", "flow_bc", "loss_avg"),
    ("opd_direct", "opd_advantage", "opd_"),
    ("reward", "validation", "reward_std"),
])
def test_adapters_publishing_the_same_key_cannot_be_combined(a: str, b: str, key: str) -> None:
    with pytest.raises(MetricsError, match=key):
        reduce_metrics([a, b], [[{}]])


def test_builtin_adapters_that_fit_together_combine() -> None:
    assert reduce_metrics(["grpo", "reward", "trainer"], [[{}]]) == {}
    assert reduce_metrics(["ppo", "trainer"], [[{}]]) == {}
    assert reduce_metrics(["dpo", "validation"], [[{}]], phase="val") == {}


# -- outcome labels and types -----------------------------------------------------------------------


def test_outcome_label_sets() -> None:
    trainer = get_adapter("trainer")
    assert set(trainer.categorical) == {"update_outcome", "skip_reason"}
    assert set(trainer.categorical["update_outcome"]) == OUTCOMES
    assert set(trainer.categorical["skip_reason"]) == SKIP_REASONS


@pytest.mark.parametrize("label", sorted(OUTCOMES))
def test_every_outcome_label_round_trips(label: str) -> None:
    result = reduce_metrics("trainer", [[{"update_outcome": "accumulating"}, {"update_outcome": label}], [{"update_outcome": label}]])
    assert result == {"optim/update_outcome": label}


COUNTERS = ["attempt_id", "optimizer_step", "nonfinite_skips_total", "nonfinite_skips_consecutive", "zero_grad_skips_total"]
FLAGS = ["step_skipped", "finite_gradient_check_enabled"]


def test_counters_come_back_as_int_and_flags_as_bool() -> None:
    def chunk(i: int) -> dict[str, Any]:
        return {
            **{name: 40 + i for name in COUNTERS},
            **{name: i % 2 == 0 for name in FLAGS},
            "update_outcome": "skipped",
            "skip_reason": "nonfinite_gradient",
        }

    # every rank ends its window in the same state (chunk 2), after different histories
    result = reduce_metrics("trainer", [[chunk(0), chunk(1), chunk(2)], [chunk(2)], []])
    for name in COUNTERS:
        assert result[f"optim/{name}"] == 42
        assert type(result[f"optim/{name}"]) is int
    for name in FLAGS:
        assert result[f"optim/{name}"] is True
    assert result["optim/skip_reason"] == "nonfinite_gradient"
    ppo = reduce_metrics("ppo", [[{"ppo_policy_optimizer_step": 5, "ppo_critic_optimizer_step": 5}], [{"ppo_policy_optimizer_step": 5, "ppo_critic_optimizer_step": 5}]])
    assert ppo == {"optim/policy_optimizer_step": 5, "optim/critic_optimizer_step": 5}
    assert all(type(v) is int for v in ppo.values())


def test_summed_counts_come_back_as_int() -> None:
    counts = ["grpo_valid_sequence_count", "grpo_valid_token_count", "grpo_logprob_gap_token_count", "grpo_response_count"]
    gap = {"grpo_logprob_gap_mean": 0.0, "grpo_mean_rank_logprob_gap_p99": 0.0, "grpo_logprob_gap_gt0p5_frac": 0.0}
    data = [[{**gap, **{c: 3 for c in counts}}, {**gap, **{c: 4 for c in counts}}], [{**gap, **{c: 5 for c in counts}}]]
    result = reduce_metrics("grpo", data)
    for c in counts:
        key = "train/" + c.removeprefix("grpo_")
        assert result[key] == 12
        assert type(result[key]) is int


def test_integer_maxima_come_back_as_int() -> None:
    result = reduce_metrics("grpo", [[{"grpo_response_len_max": 300}, {"grpo_response_len_max": 512}], [{"grpo_response_len_max": 17}]])
    assert result == {"train/response_len_max": 512}
    assert type(result["train/response_len_max"]) is int
    floats = reduce_metrics("grpo", [[{"grpo_kl_max": 0.5}], [{"grpo_kl_max": 2}]])
    assert math.isclose(floats["train/kl_max"], 2.0)
