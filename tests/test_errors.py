"""Bad declarations and bad values raise MetricsError saying which key, what was received, and the fix.

Also: the value types producers hand us (numpy scalars, 0-d torch tensors) are accepted and typed
right, and the dicts handed to ``add`` / ``reduce_metrics`` are never modified.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from posttrain_metrics import (
    Metric,
    MetricAdapter,
    MetricReducer,
    MetricsError,
    Reduction,
    reduce_metrics,
)

R = Reduction


def message(fn: Callable[[], object]) -> str:
    with pytest.raises(MetricsError) as info:
        fn()
    assert isinstance(info.value, ValueError)
    return str(info.value)


def assert_names(text: str, *parts: str) -> None:
    for part in parts:
        assert part in text, f"{part!r} not in the message: {text}"
    assert "fix" in text.lower(), f"the message gives no fix: {text}"


# -- bad declarations ---------------------------------------------------------------------------------


def test_leaf_with_a_slash() -> None:
    text = message(lambda: MetricAdapter("toy", metrics=[Metric("train/frac", R.MEAN, "a fraction")]))
    assert_names(text, "'train/frac'", "'/'", "'frac'")


def test_leaf_with_a_slash_from_fields() -> None:
    text = message(lambda: MetricAdapter.from_fields("toy", internal_prefix="toy_", names={"toy_frac": "train/frac"}))
    assert_names(text, "'train/frac'", "'/'")


def test_key_both_weighted_and_max_reduced() -> None:
    text = message(lambda: MetricAdapter.from_fields(
        "toy",
        internal_prefix="toy_",
        names={"toy_kl": "kl", "toy_tokens": "tokens"},
        weighted_by={"toy_kl": "toy_tokens"},
        max_reduced={"toy_kl"},
        summed={"toy_tokens"},
    ))
    assert_names(text, "'toy_kl'", "weighted_by", "max_reduced")


def test_weight_key_not_declared_from_fields() -> None:
    text = message(lambda: MetricAdapter.from_fields(
        "toy", internal_prefix="toy_", names={"toy_kl": "kl"}, weighted_by={"toy_kl": "toy_tokens"}
    ))
    assert_names(text, "'toy_kl'", "'toy_tokens'")


def test_weight_key_not_declared() -> None:
    text = message(lambda: MetricAdapter("toy", metrics=[Metric("kl", R.WEIGHTED_MEAN, "", weight="tokens")]))
    assert_names(text, "'kl'", "weight='tokens'", "declare 'tokens'")


def test_weight_key_that_is_not_summed() -> None:
    text = message(lambda: MetricAdapter("toy", metrics=[
        Metric("tokens", R.MAX, ""), Metric("kl", R.WEIGHTED_MEAN, "", weight="tokens"),
    ]))
    assert_names(text, "'kl'", "'tokens'", "MAX", "SUM")


def test_weighted_mean_without_weight() -> None:
    text = message(lambda: MetricAdapter("toy", metrics=[Metric("kl", R.WEIGHTED_MEAN, "")]))
    assert "'kl'" in text
    assert "weight=" in text


@pytest.mark.parametrize("phases", [("train", "eval"), ("test",), ()])
def test_unknown_phase(phases: tuple[str, ...]) -> None:
    text = message(lambda: MetricAdapter("toy", phases=phases, metrics=[Metric("x", R.MEAN, "")]))
    assert_names(text, "'toy'", "'train'", "'val'")
    for phase in phases:
        assert repr(phase) in text


def test_unknown_phase_at_reduce() -> None:
    assert "'eval'" in message(lambda: reduce_metrics("grpo", [[{}]], phase="eval"))
    assert "'eval'" in message(lambda: MetricReducer("grpo").reduce(1, phase="eval"))


def test_phase_the_adapter_does_not_publish() -> None:
    text = message(lambda: reduce_metrics("grpo", [[{"grpo_kl_max": 1.0}]], phase="val"))
    assert_names(text, "'grpo'", "'val'", "grpo_kl_max")


def test_duplicate_leaf() -> None:
    text = message(lambda: MetricAdapter("toy", metrics=[Metric("x", R.MEAN, ""), Metric("x", R.SUM, "")]))
    assert_names(text, "'x'", "twice")


def test_duplicate_leaf_from_fields() -> None:
    text = message(lambda: MetricAdapter.from_fields("toy", internal_prefix="toy_", names={"toy_a": "x", "toy_b": "x"}))
    assert_names(text, "'x'", "twice")


def test_from_fields_builds_the_reference_shape() -> None:
    adapter = MetricAdapter.from_fields(
        "toy",
        internal_prefix="toy_",
        names={"toy_kl": "kl", "toy_kl_max": "kl_max", "toy_tokens": "tokens", "toy_beta": "beta"},
        weighted_by={"toy_kl": "toy_tokens"},
        max_reduced={"toy_kl_max"},
        summed={"toy_tokens"},
        ignored={"toy_w"},
    )
    assert adapter.weighted_by == {"toy_kl": "toy_tokens"}
    assert adapter.max_reduced == {"toy_kl_max"}
    assert adapter.metrics["toy_beta"].reduction is R.MEAN
    result = reduce_metrics(adapter, [[{"toy_kl": 1.0, "toy_tokens": 1, "toy_kl_max": 3, "toy_w": 5}],
                                      [{"toy_kl": 2.0, "toy_tokens": 3, "toy_kl_max": 2}]])
    assert result == {"train/kl": 1.75, "train/kl_max": 3, "train/tokens": 4}


def test_declared_and_ignored() -> None:
    text = message(lambda: MetricAdapter("toy", internal_prefix="toy_", ignored={"toy_x"}, metrics=[Metric("x", R.MEAN, "")]))
    assert_names(text, "toy_x", "ignored")


def test_categorical_without_labels() -> None:
    assert "labels" in message(lambda: MetricAdapter("toy", metrics=[Metric("x", R.CATEGORICAL, "")]))


def test_empty_adapter_list() -> None:
    assert_names(message(lambda: reduce_metrics([], [[{}]])), "adapter")


# -- bad values ----------------------------------------------------------------------------------------


def _both_paths(adapters: Any, chunk: dict[str, Any]) -> list[str]:
    """The message from reduce_metrics over two ranks, and from a local MetricReducer."""
    texts = [message(lambda: reduce_metrics(adapters, [[{}, chunk], []]))]
    reducer = MetricReducer(adapters)
    reducer.add(chunk)
    texts.append(message(lambda: reducer.reduce(3)))
    assert reducer.pending_chunks == 0  # the window is discarded, the next one starts clean
    assert reducer.reduce(4).metrics == {}
    return texts


GAP_FAMILY = {
    "grpo_logprob_gap_mean": 0.1,
    "grpo_mean_rank_logprob_gap_p99": 0.5,
    "grpo_logprob_gap_gt0p5_frac": 0.01,
    "grpo_logprob_gap_token_count": 100,
}

BAD_VALUES = [
    pytest.param("grpo", {"grpo_kl_max": "high"}, ("'grpo_kl_max'", "'high'", "number"), id="string-for-number"),
    pytest.param("grpo", {"grpo_kl_max": None}, ("'grpo_kl_max'", "None"), id="none"),
    pytest.param("grpo", {"grpo_kl_max": [1.0]}, ("'grpo_kl_max'", "[1.0]"), id="list"),
    pytest.param("trainer", {"update_outcome": "stepped"}, ("'update_outcome'", "'stepped'", "'applied'", "'discarded'"), id="label-outside-set"),
    pytest.param("trainer", {"skip_reason": "nonfinite"}, ("'skip_reason'", "'nonfinite'", "'nonfinite_loss'"), id="skip-reason-outside-set"),
    pytest.param("trainer", {"update_outcome": 1}, ("'update_outcome'", "1"), id="number-for-label"),
    pytest.param("grpo", {"grpo_clip_frac": 0.1, "grpo_valid_token_count": -4}, ("'grpo_clip_frac'", "'grpo_valid_token_count'", "-4"), id="negative-weight"),
    pytest.param("grpo", {"grpo_clip_frac": 0.1, "grpo_valid_token_count": math.nan}, ("'grpo_clip_frac'", "'grpo_valid_token_count'", "nan"), id="nan-weight"),
    pytest.param("grpo", {"grpo_clip_frac": 0.1, "grpo_valid_token_count": math.inf}, ("'grpo_clip_frac'", "inf"), id="inf-weight"),
    pytest.param("reward", {"reward_mean": 0.5, "reward_std": 0.1, "rollout_count": -2}, ("'reward_std'", "'rollout_count'", "-2"), id="negative-count"),
    pytest.param("grpo", {"grpo_kl_max": torch.tensor([0.1, 0.2])}, ("'grpo_kl_max'", "(2,)"), id="tensor-two-elements"),
    pytest.param("grpo", {"grpo_kl_max": torch.zeros(2, 3)}, ("'grpo_kl_max'", "(2, 3)"), id="tensor-matrix"),
    pytest.param("grpo", {"grpo_kl_max": np.array([0.1, 0.2])}, ("'grpo_kl_max'", "(2,)"), id="numpy-array"),
    pytest.param("grpo", {"grpo_response_count": 2**53 + 1}, ("'grpo_response_count'", str(2**53 + 1), "2**53"), id="int-beyond-2**53"),
    pytest.param("grpo", {"grpo_response_count": -(2**60)}, ("'grpo_response_count'", str(-(2**60))), id="negative-int-beyond-2**53"),
    pytest.param("grpo", {"grpo_response_count": torch.tensor(2**60)}, ("'grpo_response_count'", str(2**60), "2**53"), id="int-tensor-beyond-2**53"),
    pytest.param("grpo", {"grpo_response_count": np.int64(2**60)}, ("'grpo_response_count'", str(2**60), "2**53"), id="numpy-int-beyond-2**53"),
    pytest.param("grpo", {"grpo_kl_maximum": 1.0}, ("'grpo_kl_maximum'", "grpo"), id="unknown-key"),
    pytest.param("grpo", {"grpo_clip_frac": 0.1}, ("'grpo_clip_frac'", "'grpo_valid_token_count'"), id="weighted-without-weight"),
    pytest.param("reward", {"reward_std": 0.1, "rollout_count": 4}, ("'reward_std'", "'reward_mean'"), id="pooled-std-without-mean"),
    pytest.param("grpo", {"grpo_logprob_gap_mean": 0.1, "grpo_logprob_gap_token_count": 5}, ("'grpo_logprob_gap_mean'", "grpo_logprob_gap_gt0p5_frac", "all together"), id="partial-family"),
]


@pytest.mark.parametrize(("adapters", "chunk", "parts"), BAD_VALUES)
def test_bad_value(adapters: str, chunk: dict[str, Any], parts: tuple[str, ...]) -> None:
    for text in _both_paths(adapters, chunk):
        assert_names(text, *parts)


def test_the_first_bad_value_names_its_chunk_and_rank() -> None:
    text = message(lambda: reduce_metrics("grpo", [[{"grpo_kl_max": 1.0}], [{}, {"grpo_kl_max": "x"}]]))
    assert "rank 1" in text
    assert "chunk 1" in text


def test_bad_value_on_one_rank_fails_the_whole_reduction() -> None:
    good = [{"grpo_kl_max": 0.5}]
    assert reduce_metrics("grpo", [good, good]) == {"train/kl_max": 0.5}
    with pytest.raises(MetricsError):
        reduce_metrics("grpo", [good, good, [{"grpo_kl_max": "oops"}]])


def test_int_at_2_power_53_is_accepted() -> None:
    assert reduce_metrics("grpo", [[{"grpo_response_count": 2**53}]]) == {"train/response_count": 2**53}


def test_add_takes_a_mapping() -> None:
    reducer = MetricReducer("grpo")
    text = message(lambda: reducer.add([("grpo_kl_max", 1.0)]))  # type: ignore[arg-type]
    assert "mapping" in text
    assert "list" in text


def test_steps_and_adapters_given_wrong() -> None:
    assert "'gpro'" in message(lambda: reduce_metrics("gpro", [[{}]]))
    assert "int" in message(lambda: reduce_metrics([3], [[{}]]))  # type: ignore[list-item]
    assert "per_rank_chunks" in message(lambda: reduce_metrics("grpo", []))


# -- what producers hand us ---------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "want"), [
    (np.float64(0.25), 0.25),
    (np.float32(0.5), 0.5),
    (np.float16(1.5), 1.5),
    (np.int64(7), 7),
    (np.int32(-3), -3),
    (np.uint8(200), 200),
    (np.bool_(True), True),
    (np.bool_(False), False),
    (torch.tensor(0.25, dtype=torch.float64), 0.25),
    (torch.tensor(0.5), 0.5),
    (torch.tensor(1.5, dtype=torch.bfloat16), 1.5),
    (torch.tensor(7), 7),
    (torch.tensor(-3, dtype=torch.int32), -3),
    (torch.tensor(True), True),
    (torch.tensor(False), False),
    (torch.tensor([4.0]), 4.0),  # one element, any shape
    (torch.tensor(2.0, requires_grad=True) * 1.5, 3.0),
])
def test_numpy_and_torch_scalars_are_typed(value: Any, want: Any) -> None:
    # LAST returns the exact value with its type when every rank agrees (grad_norm is LAST and,
    # unlike the optimizer counters, not a count, so a negative value is a value here)
    for result in (
        reduce_metrics("trainer", [[{"grad_norm": value}], [{"grad_norm": value}]]),
        _local("trainer", {"grad_norm": value}),
    ):
        got = result["train/grad_norm"]
        assert got == want
        assert type(got) is type(want)


def _local(adapters: Any, chunk: dict[str, Any]) -> dict[str, Any]:
    reducer = MetricReducer(adapters)
    reducer.add(chunk)
    return dict(reducer.reduce(1).metrics)


def test_tensor_sums_and_maxima_keep_integer_types() -> None:
    chunks = [
        [{"grpo_response_count": torch.tensor(3), "grpo_response_len_max": torch.tensor(120, dtype=torch.int32)},
         {"grpo_response_count": np.int64(4), "grpo_response_len_max": 512}],
        [{"grpo_response_count": 5, "grpo_response_len_max": np.int16(77)}],
    ]
    result = reduce_metrics("grpo", chunks)
    assert result == {"train/response_count": 12, "train/response_len_max": 512}
    assert type(result["train/response_count"]) is int
    assert type(result["train/response_len_max"]) is int


def test_tensor_and_numpy_weighted_means() -> None:
    chunks = [[{"grpo_clip_frac": torch.tensor(0.5), "grpo_valid_token_count": torch.tensor(10)}],
              [{"grpo_clip_frac": np.float32(0.0), "grpo_valid_token_count": np.int64(30)}]]
    result = reduce_metrics("grpo", chunks)
    assert result == {"train/clip_frac": 0.125, "train/valid_token_count": 40}
    assert type(result["train/clip_frac"]) is float


def test_numpy_string_label() -> None:
    result = reduce_metrics("trainer", [[{"update_outcome": np.str_("applied")}]])
    assert result == {"optim/update_outcome": "applied"}
    assert type(result["optim/update_outcome"]) is str


def test_flags_from_bool_tensors() -> None:
    result = _local("trainer", {"step_skipped": torch.tensor(True), "finite_gradient_check_enabled": np.bool_(False)})
    assert result["optim/step_skipped"] is True
    assert result["optim/finite_gradient_check_enabled"] is False


# -- never mutate what you are handed ---------------------------------------------------------------


def _window() -> list[dict[str, Any]]:
    return [
        {"grpo_clip_frac": torch.tensor(0.5), "grpo_valid_token_count": torch.tensor(10), "grpo_kl_max": np.float32(2.0),
         "update_outcome": "accumulating", "grad_norm": 1.0},
        {"grpo_clip_frac": 0.25, "grpo_valid_token_count": 30, "grpo_kl_max": torch.tensor([1.0, 2.0]),
         "update_outcome": "applied", "grad_norm": torch.tensor(2.0)},
    ]


def _snapshot(chunk: dict[str, Any]) -> dict[str, Any]:
    return {k: (type(v), v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)) for k, v in chunk.items()}


def _same(chunk: dict[str, Any], snap: dict[str, Any]) -> bool:
    if chunk.keys() != snap.keys():
        return False
    for key, value in chunk.items():
        kind, old = snap[key]
        if type(value) is not kind:
            return False
        if isinstance(value, torch.Tensor):
            if not torch.equal(value, old):
                return False
        elif value != old:
            return False
    return True


def test_add_never_mutates_its_input() -> None:
    window = _window()
    snaps = [_snapshot(c) for c in window]
    reducer = MetricReducer(["grpo", "trainer"])
    for chunk in window:
        reducer.add(chunk)
    with pytest.raises(MetricsError):  # the 2-element tensor is a bad value
        reducer.reduce(1)
    assert all(_same(c, s) for c, s in zip(window, snaps))

    good = _window()
    good[1]["grpo_kl_max"] = torch.tensor(1.0)
    snaps = [_snapshot(c) for c in good]
    for chunk in good:
        reducer.add(chunk)
    frame = reducer.reduce(2)
    assert frame.metrics["train/kl_max"] == 2.0
    assert all(_same(c, s) for c, s in zip(good, snaps))


def test_add_copies_its_input() -> None:
    """Changing the dict after add() does not change the window (a trainer may reuse its dict)."""
    reducer = MetricReducer("grpo")
    chunk: dict[str, Any] = {"grpo_kl_max": 1.0}
    reducer.add(chunk)
    chunk["grpo_kl_max"] = 9.0
    chunk["grpo_bogus"] = 1
    assert reducer.reduce(1).metrics == {"train/kl_max": 1.0}


def test_reduce_metrics_never_mutates_its_input() -> None:
    window = _window()
    window[1]["grpo_kl_max"] = torch.tensor(1.0)
    snaps = [_snapshot(c) for c in window]
    per_rank = [window, [], [dict(window[1])]]
    reduce_metrics(["grpo", "trainer"], per_rank)
    assert all(_same(c, s) for c, s in zip(window, snaps))
    assert per_rank[1] == []
