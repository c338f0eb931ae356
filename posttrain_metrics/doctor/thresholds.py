"""The doctor's thresholds and the journal keys its checks read.

Each threshold says why it has the value it has. The reference establishes only two numbers
(``clip_frac == ratio_absdev == 0.0`` at ``n_mini == 1``, and a bf16 clip rate 17x the fp32 one);
every other threshold here is a judgement, chosen to stay silent on a healthy run's noise and to fire
on the signature the reference describes.

Two values come from the run config in the journal header, matched on the last ``/`` component of a
flat config key (``rl/n_mini``, ``rollout/max_tokens``): the minibatch count
(:data:`MINIBATCH_CONFIG_NAMES`) and the rollout token budget (:data:`BUDGET_CONFIG_NAMES`). When
several keys match with different values, a key under ``rl/`` (minibatches) or ``rollout/``
(budget) wins; if that does not settle it the value is unknown.
"""

from __future__ import annotations

# -- thresholds ------------------------------------------------------------------------------------

RATIO_ABSDEV_TOLERANCE = 1e-6
"""``ratio_absdev`` at or below this counts as zero at ``n_mini == 1``. The reference says exactly
0.0 (the ratio is identically 1); the tolerance only forgives float noise of a recomputed, bitwise
non-deterministic pi_old forward. ``clip_frac`` has no tolerance: a clipped token needs the ratio
outside ``1 +- eps``, which noise never reaches, so any value above 0.0 fires."""

INFORMATIVE_FRACTION_MIN = 0.1
"""Informative groups at or below this fraction of the groups scored count as "near zero": at most
one group in ten produces a nonzero advantage, so nine tenths of the sampling bought no signal."""

INFORMATIVE_WARM_FRACTION = 0.25
INFORMATIVE_COLD_STEPS = 20
"""A GRPO run often starts cold: the policy solves none of a group's samples, every group ties at 0
and carries no signal, until it solves a few. Low steps before the run first reaches this fraction
of informative groups (a quarter of its groups giving signal), within its first
``INFORMATIVE_COLD_STEPS`` scored steps, are a cold start (info), not a collapse; so are low steps
where most tied groups scored all 1 (the policy solves the prompts: they are too easy now). A run
still cold after 20 steps has a reward or data problem (a verifier that always fails): warning.
The demo's five seeds start cold for up to 9 steps and end with solved prompts."""

KL_RATIO_MIN = 1000.0
"""``kl_max / kl_mean`` at or above this is "orders of magnitude above": three decades means one
token's K3 penalty outweighs the mean of about a thousand tokens, i.e. one token owns the KL term."""

KL_MAX_MIN = 1.0
"""...and ``kl_max`` must also be at least this many nats (K3 = 1 at a log-ratio of about 1.15 to the
reference). At the first steps the policy is the reference, ``kl_mean`` is ~1e-6 and any ratio is
huge but harmless; a penalty below 1 nat cannot own a step."""

GRAD_JUMP_FACTOR = 5.0
"""A ``grad_norm`` at least this many times the median of the preceding window is a jump. Pre-clip
norms wander by 2-3x on healthy runs; 5x is outside that."""

GRAD_BASELINE_WINDOW = 10
"""Steps of ``grad_norm`` history the jump is measured against (median, robust to earlier jumps)."""

GRAD_BASELINE_MIN = 3
"""Fewer preceding steps than this and no jump is declared: there is no baseline yet."""

TREND_MIN_FRAMES = 4
"""DPO accuracy needs at least this many frames carrying the key: with fewer there is no "before" to
compare "after" with."""

BASELINE_FRACTION = 0.25
"""DPO accuracy is judged over the last quarter of the run's frames (at least one)."""

TREND_BASELINE = 8
"""Truncation and the logprob gap take their baseline from the series' first 8 points, and judge the
points after it (the baseline's own points are not judged: it is not complete before its last one).
A fixed count, not a fraction of the run, keeps the checks causal: a finding at a step depends on the
frames up to it only, so live health fires at the step the offline doctor names. Eight is the first
quarter of a 32-step run; fewer would let one noisy step set the baseline (a median of 4 moves with
one outlier), more would leave a short run's early rise unjudged."""

TRUNCATION_RISE = 0.1
"""``rollout_truncated_frac`` at least this far (absolute) above its baseline counts as risen: ten
more completions in a hundred now end at the budget. A healthy run's truncation wanders by a few
points. Only steps after the baseline window are judged, so a run whose truncation starts high and
*falls* (the policy learns to stop within the budget) never fires."""

GAP_RISE_FACTOR = 3.0
GAP_RISE_MIN = 0.02
"""``logprob_gap_mean`` has risen when it is at least ``GAP_RISE_FACTOR`` times its baseline *and* at
least ``GAP_RISE_MIN`` nats above it. On a dense model the gap is kernel and precision noise of a few
thousandths of a nat that jitters by a factor of two or three; the absolute floor keeps that noise
from firing, the factor keeps a run whose baseline is already large from firing on drift."""

NONFINITE_CONSECUTIVE_MAX = 3
"""``optim/nonfinite_skips_consecutive`` at or above this is an error: one rejection is a bad batch,
two can be a coincidence, three in a row means the state (weights or optimizer moments), not the
data, produces the non-finite values, and every further step is wasted."""

DPO_CHANCE = 0.5
DPO_MIN_RISE = 0.05
"""DPO accuracy starts near ``DPO_CHANCE``; a run whose last quarter averages below
``DPO_CHANCE + DPO_MIN_RISE`` has not risen. Five points is above the sampling noise of an accuracy
measured on a few hundred pairs per step, and far below what a learning run reaches."""

SC_RHO_MAX_LARGE = 100.0
"""``sc_rho_max`` (``q_tail / p_tail``, both floored at 1e-6; 1.0 when sampler and trainer agree) at
or above this is large: somewhere the sampler puts a hundred times the trainer's tail mass, a
confident trainer against an unsure sampler, which is where the floor starts to bite."""

MINIBATCH_CONFIG_NAMES = ("n_mini", "n_minibatches", "num_minibatches")
"""Config leaves that give the optimizer updates per collected batch (``rl/n_mini``)."""

BUDGET_CONFIG_NAMES = ("max_tokens", "max_new_tokens")
"""Config leaves that give the rollout token budget (``rollout/max_tokens``)."""


# -- keys --------------------------------------------------------------------------------------------

CLIP_FRAC = "train/clip_frac"
RATIO_ABSDEV = "train/ratio_absdev"
GROUPS = "train/grpo_group_count"
INFORMATIVE = "train/grpo_informative_group_count"
ALL_ZERO = "train/grpo_all_zero_group_count"
ALL_ONE = "train/grpo_all_one_group_count"
ZERO_GRAD = "optim/zero_grad_skips_total"
KL_MEAN = "train/kl_mean"
KL_MAX = "train/kl_max"
GRAD_NORM = "train/grad_norm"
LOSS = "train/loss_avg"
TRUNCATED = "train/rollout_truncated_frac"
LEN_MAX = "train/response_len_max"
VALID_SEQ = "train/valid_sequence_count"
VALID_TOKENS = "train/valid_token_count"
GAP_MEAN = "train/logprob_gap_mean"
GAP_P99 = "train/mean_rank_logprob_gap_p99"
GAP_COUNT = "train/logprob_gap_token_count"
OUTCOME = "optim/update_outcome"
SKIP_REASON = "optim/skip_reason"
NONFINITE_TOTAL = "optim/nonfinite_skips_total"
NONFINITE_CONSECUTIVE = "optim/nonfinite_skips_consecutive"
POLICY_STEP = "optim/policy_optimizer_step"
CRITIC_STEP = "optim/critic_optimizer_step"
DPO_ACCURACY = "train/dpo_accuracy"
SC_RHO_MAX = "train/sc_rho_max"
SC_TOKENS = "train/sc_token_count"

# throughput
TOKENS_PER_S = "perf/tokens_per_s"
THROUGHPUT_DROP_FRACTION = 0.5
"""tokens/s below this fraction of the recent median is a sudden drop: halving is far outside the
window-to-window noise of a steady run, and what a straggler, a swap storm or a throttled device does."""
THROUGHPUT_BASELINE = 8
"""The recent median is over this many previous windows that counted tokens (a window with no
counted token says nothing about speed and is left out)."""
