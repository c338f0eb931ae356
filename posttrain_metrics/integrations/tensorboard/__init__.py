"""The TensorBoard sink: event files in TensorBoard's own format; no torch, no TensorFlow.

``TensorBoardSink(log_dir=...)`` writes one run into ``log_dir`` (``{name}`` and ``{run_id}`` in the
path are filled in at start); point ``tensorboard --logdir`` at its parent to compare runs. The
callback's default, ``{"type": "tensorboard"}``, is ``<out_dir>/tensorboard/{name}-{run_id}``: one
directory (one TensorBoard run) per run, so a second run into the same ``out_dir`` never mixes its
points with the first, and a resumed run (same id, even under another name) goes on in its own
directory. ``posttrain-metrics export --to tensorboard`` writes the same directory by default. What
the dashboard then shows:

- **Scalars.** Every numeric key of a step under its own tag (``train/loss_avg``,
  ``train/grad_norm``, ``optim/optimizer_step`` ...), all of a step's keys in *one* event: one
  record, one checksum and one queue hand-off per step instead of one per key. The first point of
  each tag (only it) carries the catalogue's meaning, unit and reduction as the chart's
  description. Each categorical key also charts as one 0/1 series per label (``optim/update_outcome/skipped``).
  A key a step did not publish has no point at that step: PPO's critic-only warmup iterations
  leave the policy charts empty there, never zero.
- **Text.** The label of each categorical key at each step (``optim/update_outcome``:
  ``skipped``), and the run's config (flattened, secrets redacted) as a table under ``config``,
  written at start so that a killed run shows it too.
- **Custom scalars.** A layout derived from the catalogue, so the dashboard opens organised, listing
  only the tags the run has written: it is written with the first step and again, in the step's
  event, whenever a charted tag is first written (TensorBoard shows a run's latest layout), so no
  chart opens empty and the layout grows as keys appear:
  first ``<ALGO> headline`` (the keys the catalogue marks as headline: loss, reward, pre-clip
  gradient norm, informative groups, KL, the update outcome), expanded; then one collapsed
  category per topic: a key's declared family (``GRPO logprob gap``); a leaf prefix shared by at
  least three keys of an adapter (``GRPO KL``, ``GRPO score centering``, ``GRPO response length``,
  ``PPO policy``, ``PPO critic``), which also takes the keys weighted by its token count and admits
  no key weighted by another one; the adapter's other keys (``GRPO``, ``PPO``, ``reward & groups``,
  ``trainer``); last the fixed namespaces (``optimizer outcome`` for ``optim/*``, ``timing`` for
  ``timer/*``). One chart per key; ``train/`` and ``val/`` of one leaf share a chart;
  ``<x>_mean`` with ``<x>_min`` and ``<x>_max`` is one band chart; a categorical key is one chart
  of its label series. A user's own adapter is laid out by the same rules from its declarations.
  Keys a run never publishes (score centering when it is off) have no chart.
- **HParams.** At close, a session in ``<log_dir>/hparams``, its group named after the run (the
  run's directory name), with the config as hyperparameters
  (plus ``adapters``), the status (success, or failure when the run failed) and, as its metrics,
  the run aggregate of every key under ``run/<key>``: computed with each key's own semantics
  (token-weighted means over the whole run, totals for sums, the run's maximum and minimum, the
  last value of counters, the number of steps per outcome label), not TensorBoard's last value.
  They are the session's metrics in the hparams view; the run's own series hold none of them.
  No experiment summary is written, so TensorBoard takes the union of every run's hyperparameters
  and the runs of one logdir compare side by side.

Files are flushed after every step by default (``flush="step"``; ``flush=N`` flushes once the
frames since the last flush span N steps) and at close, so a short or killed run leaves readable
files (TensorBoard's writer otherwise holds events in a queue and flushes every two minutes).
Values are float32, TensorBoard's scalar type: about seven significant digits, integers exact up to
2**24. NaN, +inf and -inf are stored as such; a finite value beyond float32's range would become
+/-inf and is logged once per key (``posttrain_metrics.integrations.tensorboard``). The journal keeps every value exactly.

>>> sink = TensorBoardSink(log_dir="runs/{name}", flush=10)  # no I/O and no tensorboard import yet
>>> sink.name, sorted(sink.stores_nonfinite)
('tensorboard', ['inf', 'nan'])

One job per module: :mod:`.layout` (the custom-scalars layout, as data), :mod:`.text` (the config
table, descriptions and samples as Markdown), :mod:`.events` (the event-file encoder and writer),
:mod:`.sink` (the sink), :mod:`.read` (reading back what a log dir holds).
"""

from __future__ import annotations

from .events import INSTALL
from .layout import Category, Chart, dashboard_layout, written_layout
from .read import tensorboard_points
from .sink import (
    AGGREGATE_PREFIX,
    CONFIG_TAG,
    END_TAG,
    HPARAMS_DIR,
    REASON_HPARAM,
    STATUS_HPARAM,
    TensorBoardSink,
)
from .text import samples_markdown

__all__ = [
    "AGGREGATE_PREFIX",
    "CONFIG_TAG",
    "END_TAG",
    "HPARAMS_DIR",
    "INSTALL",
    "REASON_HPARAM",
    "STATUS_HPARAM",
    "Category",
    "Chart",
    "TensorBoardSink",
    "dashboard_layout",
    "samples_markdown",
    "tensorboard_points",
    "written_layout",
]
