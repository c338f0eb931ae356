"""GRPO objective keys (the reference's GRPO table plus the shared loss and counts)."""

from __future__ import annotations

from ..adapter import Metric, MetricAdapter
from ..reduction import Reduction as R
from .shared import loss_avg, token_counts, weight_sum

__all__ = ["GRPO"]

TOK = "valid_token_count"
SEQ = "valid_sequence_count"
GAP = "logprob_gap_token_count"
RESP = "response_count"
SC = "sc_token_count"


def _tok(leaf: str, meaning: str, weight: str = TOK, **kw: object) -> Metric:
    return Metric(leaf, R.WEIGHTED_MEAN, meaning, weight=weight, **kw)  # type: ignore[arg-type]


GRPO = MetricAdapter(
    "grpo",
    internal_prefix="grpo_",
    phases=("train",),
    # The gap is measured over loss-masked completion tokens: every chunk with completion tokens
    # carries the record, or none does. A chunk of step-level values (a logged loss, the kl_beta
    # echo) holds no trajectory and so no record.
    family_scopes={"logprob_gap": TOK},
    metrics=[
        loss_avg("grpo_", R.WEIGHTED_MEAN, weight="weight_sum"),
        weight_sum,
        *token_counts,
        # clipping and importance ratio
        _tok("clip_frac", "Fraction of tokens where the epsilon clip bound the update", unit="fraction"),
        _tok("ratio_absdev", "Mean |importance ratio - 1| over tokens"),
        _tok("seq_clip_frac", "Fraction of responses the sequence-level clip touched (GSPO)", SEQ, unit="fraction"),
        _tok("seq_log_ratio_abs", "Mean |sequence-level log ratio| over responses", SEQ, unit="nats"),
        # routing replay (MoE, rl.routing_replay=rollout only)
        Metric("routing_replay_pinned_tokens", R.SUM, "Token rows dispatched through the pinned routing", unit="tokens", count=True),
        Metric("routing_replay_pinned_blocks", R.MEAN, "Sparse-MoE blocks pinned per token (a model constant)", unit="blocks"),
        # train/infer logprob consistency: emitted all together or not at all
        _tok("logprob_gap_mean", "Mean |log pi_train - log pi_rollout| over compared tokens", GAP, unit="nats", family="logprob_gap"),
        _tok("mean_rank_logprob_gap_p99", "Token-weighted mean of each rank's and chunk's 99th percentile gap", GAP, unit="nats", family="logprob_gap"),
        _tok("logprob_gap_gt0p5_frac", "Fraction of compared tokens whose gap exceeds 0.5 nats", GAP, unit="fraction", family="logprob_gap"),
        Metric(GAP, R.SUM, "Tokens the gap was measured over; 0 means no data, not no gap", unit="tokens", family="logprob_gap", count=True),
        # KL to the frozen reference
        _tok("kl_mean", "Token mean of the unscaled K3 penalty toward the reference", unit="nats", headline=True, headline_if="kl_beta"),
        Metric("kl_max", R.MAX, "Largest per-token K3 penalty of the step", unit="nats", weight=TOK, headline=True, headline_if="kl_beta"),
        Metric("kl_beta", R.MEAN, "The configured KL coefficient, echoed"),
        # response length and truncation
        Metric(RESP, R.SUM, "Completions handed to the objective, before any masking", unit="responses", count=True),
        _tok("rollout_truncated_frac", "Fraction of completions cut at the token budget", RESP, unit="fraction"),
        _tok("response_len_mean", "Mean generated completion length", RESP, unit="tokens"),
        Metric("response_len_max", R.MAX, "Longest generated completion of the step", unit="tokens", weight=RESP),
        # score centering
        Metric(SC, R.SUM, "Completion tokens the score-centering correction covered", unit="tokens", count=True),
        _tok("sc_head_mass_q", "Sampler probability mass inside its top-k head", SC, unit="probability"),
        _tok("sc_head_mass_p", "Trainer probability mass inside the sampler's top-k head", SC, unit="probability"),
        _tok("sc_rho_mean", "Token mean of the tail-mass ratio q_tail / p_tail", SC),
        Metric("sc_rho_max", R.MAX, "Largest tail-mass ratio q_tail / p_tail of the step", weight=SC),
        _tok("sc_kl_head", "Sampler-vs-trainer KL on the head at the same temperature", SC, unit="nats"),
        _tok("sc_correction_abs", "Token mean of the absolute score-centering correction", SC),
        _tok("sc_token_weight", "Token mean of the composed sampled-token weight", SC),
        _tok("sc_out_of_head_frac", "Fraction of sampled tokens outside the sampler's top-k head", SC, unit="fraction"),
    ],
)
