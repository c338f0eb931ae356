"""Keys the Hugging Face Trainer and TRL's ``GRPOTrainer`` log that have no counterpart in our catalogue.

The keys whose meaning *is* one of ours (``reward`` is ``train/reward_mean``, ``kl`` is
``train/kl_mean`` ...) are not declared here: the Hugging Face callback feeds them to the catalogue
adapter that owns that meaning (see ``docs/frameworks.md`` and
``posttrain_metrics.callbacks.transformers.TRL_GRPO_MAPPING``). Everything else TRL logs passes
through under ``train/trl_<key>`` (``/`` in TRL's key becomes ``_``) as a plain mean: TRL has
already reduced each value over the ranks and averaged it over the logging interval, so the figure
is TRL's, with TRL's averaging, and the ``trl_`` prefix says so.

The source name of each key is its leaf (``trl_clip_ratio_low_mean``, from TRL's
``clip_ratio/low_mean`` by :func:`passthrough_leaf`), which keeps them apart from the bare source
names of the ``reward`` and ``trainer`` adapters (TRL's ``reward_std`` is not ours). Declared for
TRL 1.x and transformers 4.46-5.x.
"""

from __future__ import annotations

from ..adapter import Metric, MetricAdapter
from ..reduction import Reduction as R

__all__ = ["HF_TRAINER", "TRL_GRPO", "TRL_GRPO_EXACT", "passthrough_leaf"]


def passthrough_leaf(logged: str) -> str:
    """The leaf a logged key with no counterpart is published under: ``trl_`` + the key, ``/`` as ``_``.

    >>> passthrough_leaf("clip_ratio/low_mean")
    'trl_clip_ratio_low_mean'
    """
    return "trl_" + logged.replace("/", "_")


def _pass(logged: str, meaning: str, unit: str = "") -> Metric:
    return Metric(passthrough_leaf(logged), R.MEAN, meaning, unit=unit)


_INTERVAL = "TRL's value averaged over the logging interval"

TRL_GRPO = MetricAdapter(
    "trl_grpo",
    internal_prefix="trl_",
    phases=("train",),
    metrics=[
        # Trainer bookkeeping (transformers; the epoch is HF_TRAINER's train/epoch)
        _pass("num_input_tokens_seen", "Input tokens the Trainer has seen so far (include_num_input_tokens_seen)", unit="tokens"),
        # rewards
        _pass("reward_std", "Sample std (Bessel-corrected, n-1) of the generation batch's rewards; "
              f"{_INTERVAL}. Not train/reward_std, a population std pooled exactly"),
        _pass("frac_reward_zero_std", "Fraction of completions whose group's rewards tied (zero std): "
              f"tied groups over all groups; {_INTERVAL}", unit="fraction"),
        # policy statistics
        _pass("entropy", f"Token mean of the policy's entropy, token-weighted per micro-batch over ranks; {_INTERVAL}",
              unit="nats"),
        _pass("kl", "TRL's kl with use_bias_correction_kl on and an off-policy ratio (num_iterations > 1, "
              f"vLLM): K3 times the importance ratio, so not train/kl_mean; {_INTERVAL}", unit="nats"),
        _pass("clip_ratio/low_mean", f"Fraction of tokens clipped at the lower bound (ratio < 1-eps, A < 0); {_INTERVAL}",
              unit="fraction"),
        _pass("clip_ratio/high_mean", f"Fraction of tokens clipped at the upper bound (ratio > 1+eps, A > 0); {_INTERVAL}",
              unit="fraction"),
        _pass("clip_ratio/low_min", f"Smallest per-sequence lower-clip fraction of a micro-batch; {_INTERVAL}",
              unit="fraction"),
        _pass("clip_ratio/high_max", f"Largest per-sequence upper-clip fraction of a micro-batch; {_INTERVAL}",
              unit="fraction"),
        _pass("cispo_clip_ratio", f"Fraction of tokens whose CISPO importance weight was truncated; {_INTERVAL}",
              unit="fraction"),
        _pass("vespo/phi_seq_mean", f"Token mean of VESPO's sequence weight phi; {_INTERVAL}"),
        _pass("policy_loss", f"Policy part of the loss (before the entropy bonus); {_INTERVAL}"),
        _pass("entropy_coef", "Entropy-bonus coefficient at the optimizer step"),
        _pass("aux_loss", f"Router auxiliary loss of a mixture-of-experts policy; {_INTERVAL}"),
        # completions
        _pass("completions/max_length", "Mean of the per-generation longest completion when a logging interval "
              "spans more than one generation (otherwise published as train/response_len_max)", unit="tokens"),
        _pass("completions/min_length", f"Shortest completion of a generation batch; {_INTERVAL}", unit="tokens"),
        _pass("completions/mean_terminated_length", f"Mean length of the completions that ended with EOS; {_INTERVAL}",
              unit="tokens"),
        _pass("completions/min_terminated_length", f"Shortest completion that ended with EOS; {_INTERVAL}",
              unit="tokens"),
        _pass("completions/max_terminated_length", f"Longest completion that ended with EOS; {_INTERVAL}",
              unit="tokens"),
        _pass("num_tokens", "Prompt and completion tokens processed so far, all ranks (TRL's counter)", unit="tokens"),
        _pass("step_time", "Wall time of one optimizer step's training_step calls (generation included) on "
              "global rank 0; not timer/e2e_step_s", unit="s"),
        # tools and vLLM importance sampling
        _pass("tools/call_frequency", f"Tool calls per completion; {_INTERVAL}"),
        _pass("tools/failure_frequency", f"Fraction of tool calls that failed; {_INTERVAL}", unit="fraction"),
        _pass("sampling/sampling_logp_difference/mean", "Mean over ranks of each rank's token mean of "
              f"|logp_train - logp_vllm|; {_INTERVAL}. Not the train/logprob_gap_* family", unit="nats"),
        _pass("sampling/sampling_logp_difference/max", f"Largest |logp_train - logp_vllm| of a generation; {_INTERVAL}",
              unit="nats"),
        _pass("sampling/importance_sampling_ratio/min", f"Smallest vLLM importance-sampling ratio; {_INTERVAL}"),
        _pass("sampling/importance_sampling_ratio/mean", f"Mean over ranks of the mean vLLM importance-sampling ratio; {_INTERVAL}"),
        _pass("sampling/importance_sampling_ratio/max", f"Largest vLLM importance-sampling ratio; {_INTERVAL}"),
    ],
)


HF_TRAINER = MetricAdapter(
    "hf_trainer",
    internal_prefix="hf_",
    phases=("train", "val"),
    metrics=[
        Metric("epoch", R.MEAN, "Fractional epoch the Trainer had reached when it logged", unit="epochs",
               namespace="train"),
        Metric("loss", R.MEAN, "The Trainer's evaluation loss (eval_loss): its mean over the evaluation batches of "
               "every rank", namespace="val"),
        Metric("runtime_s", R.MEAN, "Wall time of the Trainer's evaluation loop (eval_runtime)", unit="s",
               namespace="val"),
        Metric("samples_per_s", R.MEAN, "Evaluation samples per second (eval_samples_per_second)",
               unit="samples/s", namespace="val"),
        Metric("steps_per_s", R.MEAN, "Evaluation batches per second (eval_steps_per_second)", unit="steps/s",
               namespace="val"),
    ],
)
"""The plain ``transformers.Trainer`` keys with a name of their own (not TRL's): ``epoch`` and the
evaluation loop's loss and throughput. Each is a value the Trainer has already reduced, contributed
once by global rank 0. The end-of-training summary (``train_samples_per_second``, ``train_runtime``)
is not a step and is not published."""

_TOK = "policy_token_count"
_SEQ = "policy_sequence_count"
_GEN = "completion_count"
_TERM = "terminated_count"
_WINDOW = "over the optimizer window and every rank"


def _exact(leaf: str, meaning: str, weight: str, unit: str = "fraction") -> Metric:
    return Metric(leaf, R.WEIGHTED_MEAN, f"{meaning}, {_WINDOW}", weight=weight, unit=unit)


TRL_GRPO_EXACT = MetricAdapter(
    "trl_grpo_exact",
    internal_prefix="trl_exact_",
    phases=("train",),
    metrics=[
        Metric(_TOK, R.SUM, "Completion tokens under TRL's loss mask (completion_mask x tool_mask): the weight of "
               "the token means TRL computes in _compute_loss; equals train/valid_token_count", unit="tokens",
               count=True),
        Metric(_SEQ, R.SUM, "Rows of the micro-batches (TRL's weight of a sequence-level mean, masked rows included)",
               unit="sequences", count=True),
        _exact("entropy_mean", "Token mean of the policy's per-token entropy", _TOK, unit="nats"),
        _exact("clip_low_frac", "Fraction of tokens clipped at the lower bound (ratio < 1-eps_low with A < 0)", _TOK),
        _exact("clip_high_frac", "Fraction of tokens clipped at the upper bound (ratio > 1+eps_high with A > 0)", _TOK),
        _exact("seq_clip_low_frac", "GSPO: fraction of sequences clipped at the lower bound", _SEQ),
        _exact("seq_clip_high_frac", "GSPO: fraction of sequences clipped at the upper bound", _SEQ),
        Metric("clip_low_seq_min", R.MIN, f"Smallest per-sequence fraction of tokens clipped low, {_WINDOW}",
               unit="fraction"),
        Metric("clip_high_seq_max", R.MAX, f"Largest per-sequence fraction of tokens clipped high, {_WINDOW}",
               unit="fraction"),
        _exact("kl_ratio_mean", "Token mean of K3 times the importance ratio (TRL's kl with use_bias_correction_kl "
               "off-policy; train/kl_mean when the ratio is 1)", _TOK, unit="nats"),
        Metric(_GEN, R.SUM, "Completions generated (TRL's generation batch, every rank)", unit="completions",
               count=True),
        Metric("response_len_min", R.MIN, f"Shortest generated completion, {_WINDOW}", unit="tokens", weight=_GEN),
        Metric(_TERM, R.SUM, "Completions that ended with EOS (not cut at max_completion_length)",
               unit="completions", count=True),
        _exact("terminated_len_mean", "Mean length of the completions that ended with EOS", _TERM, unit="tokens"),
        Metric("terminated_len_min", R.MIN, f"Shortest completion that ended with EOS, {_WINDOW}", unit="tokens",
               weight=_TERM),
        Metric("terminated_len_max", R.MAX, f"Longest completion that ended with EOS, {_WINDOW}", unit="tokens",
               weight=_TERM),
    ],
)
"""TRL GRPO statistics with no counterpart in the reference, exact: recorded per micro-batch (or per
generation) on every rank by :func:`posttrain_metrics.callbacks.trl.exact_grpo`, each TRL global
figure weighted by this rank's share of its tokens, sequences or completions. Absent without it (the
callback alone publishes TRL's interval means under ``train/trl_<key>`` instead)."""
