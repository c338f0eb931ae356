"""Weights & Biases sink: one step axis, summaries that follow each key's semantics, run aggregates.

## What a run shows in W&B

**Offline unless you have a key.** With `mode=None` (the default) the run is offline when no
API key is configured (neither `WANDB_API_KEY` nor `WANDB_IDENTITY_TOKEN_FILE` is set and the
netrc file holds no entry for the W&B host), so a machine without credentials or network never
waits on a login or a server; `wandb sync <dir>/wandb/offline-run-*` uploads it later.
`WANDB_MODE` is honoured, and an explicit `mode=` argument wins over both. `wandb.init` is
bounded by `init_timeout` seconds; a failure there degrades this sink (the publisher logs it once)
and never stops training. The run's files go to `<dir>/wandb/`.

**One step axis: `trainer/step`.** Every history row carries `trainer/step` (the frame's
step) and every namespace (`train`, `val`, `optim`, `timer`, `health` and any other a
declared key uses) is bound to it with `define_metric("<ns>/*", step_metric="trainer/step")`.
No `step=` is passed to `run.log`: W&B's own `_step` just counts rows, so a resumed run, a
replay or a validation frame at a step already logged is recorded, never dropped by W&B's
monotonic-step rule. Chart against `trainer/step` (the default x-axis of every key we declare).
A training frame and a validation frame of the same step are two rows with the same
`trainer/step`. Each row's `_timestamp` is the frame's wall time, so a replayed run keeps its
real clock.

**Alternate x-axes.** With throughput on (`perf`), the run's cumulative tokens, samples
and training time (`perf/tokens_total`, `perf/samples_total`, `perf/time_s`) are defined as step
metrics beside `trainer/step` (each with a `max` summary: the run's total), so any chart can
select them as its x-axis; `x_axis="tokens"` (or `"samples"`, `"time"`) binds every namespace to
that one instead of `trainer/step`, to compare runs by tokens seen.

**Summaries follow the key's semantics.** `define_metric` per declared key:

| reduction of the key | W&B summary (the runs table) |
| --- | --- |
| MAX (`train/kl_max`) | `max` |
| MIN | `min` |
| weighted mean, plain mean, pooled std | `last`, `min` and `max` |
| SUM (per-step counts), LAST (`grad_norm`), AGREED (optimizer counters and flags), categorical label | W&B's default: the last value, as a plain column |
| label indicator (`optim/update_outcome/skipped`) | `mean`: the share of logged windows with that outcome |

**Run aggregates under `run/`.** W&B cannot weight a mean, and one NaN poisons its `min` and
`max` for the rest of the run. So the sink folds every frame into
`RunSummary` (`posttrain_metrics.core.summary`) and writes, under its own prefix so that it
never fights with the summaries above: `run/<key>` = the token-weighted mean over the whole run
for weighted means, the mean over frames for plain means, the total for sums, the run maximum
(minimum) for maxima (minima), the pooled std over the run, the last value for last-value keys,
for an exact counter or flag what the catalogue declares (`RunAggregate`: the last value of
`optimizer_step`, the windows where `step_skipped` held, the total of `updates_skipped`),
and for a categorical key one count per label (`run/optim/update_outcome/skipped` = 1).
NaN is left out of these aggregates, and so is ±inf except from maxima and minima (an infinite
maximum is the run's maximum); every non-finite value is counted under `run/nonfinite/<key>`.
They are written every `summary_every` frames and at close.

**Categorical labels.** The label itself is logged (`optim/update_outcome = "skipped"`): it is in
every history row and the runs table shows the last one, but W&B cannot chart a string. Next to it
the publisher's 0/1 indicators (`optim/update_outcome/applied`, `.../skipped` ...) chart as
lines, and their `mean` summary is the share of windows per outcome; `run/...` holds the counts.

**Non-finite values are stored faithfully in history.** W&B keeps NaN, +inf and -inf in history
rows exactly (the transaction log holds `NaN`, `Infinity`, `-Infinity`), so nothing is
removed upstream for this sink (`stores_nonfinite = {"nan", "inf"}`, no
`health/nonfinite/*` keys). But W&B's own summaries are poisoned: after one NaN, `min` and
`max` stay NaN for the rest of the run (`last` recovers at the next finite value), and an
infinite value stays the `max`/`min`. Read `run/<key>` for figures that ignore them. A run
aggregate that is itself NaN (a key that was never finite) is stored by W&B as `null`.

**Absent stays absent.** A key missing from a frame is missing from that row (PPO's critic-warmup
steps have no policy keys); nothing is zero-filled.

**W&B's own environment variables.** Each of `project`, `entity`, `group`, `tags`, `notes`,
`job_type` and `dir` that the arguments leave out is read, when the sink is constructed, from
`WANDB_PROJECT`, `WANDB_ENTITY`, `WANDB_RUN_GROUP`, `WANDB_TAGS` (comma-separated), `WANDB_NOTES`,
`WANDB_JOB_TYPE` and `WANDB_DIR`, as `wandb.init` itself would; `WANDB_MODE` at start (above). An
explicit argument always wins. Without a project anywhere, W&B's default applies
(`uncategorized`). `run_settings()` (the project and entity) goes into the journal header, so
`posttrain-metrics export --to wandb` replays into the same place.

**Labels that no longer hold.** A categorical key absent from a later frame of its phase
(`optim/skip_reason` after an applied update) has its summary column set to null: the runs table
never shows a skip reason of an earlier window as the run's last one. History keeps every label.

**A run id seen before** is resumed (`resume="allow"` by default): a restarted job that passes its
run id again continues its W&B run; a new run id is a new run.

**Config and exit code.** The run config is nested as the trainer passed it (lists as lists,
`None` as null), redacted at every depth (`RunInfo.config_tree`). `close(failed=True)` finishes the run with exit code 1 (W&B shows it failed), else 0; a run that
never closed (its trainer was killed, the publisher drained its journal) with exit code 137, and
the summary's `posttrain_metrics/status` says `finished`, `failed` or `killed`. `close`
returns once W&B has acknowledged the end of the run; its background process finishes writing
`run-<id>.wandb` moments later, and wandb's exit hook waits for that (call `wandb.teardown()`
to wait explicitly, say before reading or syncing the file from the same process). W&B's own
run metadata (the command line, the program, the git remote and commit, the host) is **off by
default** (`x_disable_meta=True`): the command line can carry a secret (`--hf-token ...`) and a
git remote URL a token, both outside the config we redact. `settings={"x_disable_meta": False}`
turns it back on, on purpose.

**The training's span.** W&B's own start and runtime are its service's clock, from `wandb.init` in
the publisher to `finish` after the drain, and no client setting moves them (wandb 0.31: `wandb.init`
overwrites `x_start_time`, a logged `_runtime` is replaced). Each row's `_timestamp` is its frame's
wall time, and the summary holds the span: `posttrain_metrics/started_at` (the journal header's start,
or the first frame if earlier), `.../ended_at` (the last frame), ISO 8601 UTC, and `.../duration_s`
between them, MLflow's duration of the same run to the millisecond.
"""

from __future__ import annotations

import collections
import datetime
import math
import netrc
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from ..core.errors import MetricsError
from ..core.frame import Frame
from ..core.keys import KeyInfo, label_key
from ..core.redact import redact_text
from ..core.reduction import Reduction
from ..core.summary import RunSummary
from .base import Points, RunInfo, Sink

if TYPE_CHECKING:
    from wandb.sdk.wandb_run import Run

__all__ = ["KILLED_EXIT_CODE", "NAMESPACES", "RUN_PREFIX", "STATUS_KEY", "STEP_KEY", "WandbSink", "resolve_mode", "summary_for"]

STEP_KEY = "trainer/step"
"""The one x-axis of every chart: the frame's step, logged in every row."""

STATUS_KEY = "posttrain_metrics/status"
"""Summary key saying how the run ended: ``finished``, ``failed``, ``interrupted`` or ``killed`` (never
closed)."""

KILLED_EXIT_CODE = 137
"""The exit code a killed run is finished with (128 + SIGKILL, as a shell reports it)."""

INTERRUPTED_EXIT_CODE = 130
"""The exit code an interrupted run (Ctrl-C) is finished with (128 + SIGINT, as a shell reports it)."""

REASON_KEY = "posttrain_metrics/end_reason"
"""Summary key saying why a run failed or was interrupted (the exception's type and message, redacted)."""

SPAN_KEYS = ("posttrain_metrics/started_at", "posttrain_metrics/ended_at", "posttrain_metrics/duration_s")
"""Summary keys of the training's span (see the module docstring)."""

RUN_PREFIX = "run/"
"""Our run aggregates live under ``run/<key>`` in the run summary."""

NAMESPACES = ("train", "val", "optim", "timer", "health")
"""Namespaces bound to :data:`STEP_KEY` even before a key of theirs is seen."""
X_AXES = {"step": STEP_KEY, "tokens": "perf/tokens_total", "samples": "perf/samples_total", "time": "perf/time_s"}
"""The x-axes a run can bind its namespaces to (``x_axis=``); the last three need ``perf`` on."""

MODES = ("online", "offline", "disabled", "shared")
_DEFAULT_BASE_URL = "https://api.wandb.ai"
_INSTALL = "pip install 'posttrain-metrics[wandb]'"

_SUMMARIES: dict[Reduction, str | None] = {
    Reduction.MAX: "max",
    Reduction.MIN: "min",
    Reduction.WEIGHTED_MEAN: "last,min,max",
    Reduction.MEAN: "last,min,max",
    Reduction.POOLED_STD: "last,min,max",
    Reduction.SUM: None,  # None: W&B's default summary, the last value as a plain column
    Reduction.LAST: None,
    Reduction.AGREED: None,
    Reduction.CATEGORICAL: None,
}
_LABEL_SUMMARY = "mean"


def summary_for(info: KeyInfo) -> str | None:
    """The ``define_metric(summary=...)`` a declared key gets (``None``: W&B's default, last)."""
    return _SUMMARIES[info.reduction]


def _has_credentials(environ: Mapping[str, str], settings: Mapping[str, Any]) -> bool:
    """Whether wandb would find credentials: an API key or identity token in its settings or
    environment variables, or a netrc entry for its host."""
    if settings.get("api_key") or settings.get("identity_token_file"):
        return True
    if environ.get("WANDB_API_KEY") or environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    base_url = settings.get("base_url") or environ.get("WANDB_BASE_URL") or _DEFAULT_BASE_URL
    host = urlsplit(str(base_url)).netloc
    if not host:
        return False
    if environ.get("NETRC"):
        paths = [Path(environ["NETRC"]).expanduser()]
    else:
        paths = [Path("~/.netrc").expanduser(), Path("~/_netrc").expanduser()]
    for path in paths:
        if not path.is_file():
            continue
        try:
            entry = netrc.netrc(path).authenticators(host)
        except (netrc.NetrcParseError, OSError):
            return False  # wandb cannot read it either
        return bool(entry and entry[2])
    return False


def resolve_mode(
    mode: str | None, environ: Mapping[str, str] | None = None, settings: Mapping[str, Any] | None = None
) -> str | None:
    """The W&B mode to pass to ``wandb.init``: an explicit ``mode`` wins, then ``WANDB_MODE``;
    without either, ``"offline"`` when no API key is configured (``environ``, default
    ``os.environ``, the netrc file, and the ``settings`` given to the sink), else ``None``
    (wandb's own default: online, or what its settings file says).

    >>> resolve_mode("online", {"WANDB_MODE": "offline"})
    'online'
    >>> resolve_mode(None, {"WANDB_MODE": "disabled"})
    'disabled'
    >>> resolve_mode(None, {"NETRC": "/nonexistent"})
    'offline'
    >>> resolve_mode(None, {"WANDB_API_KEY": "x" * 40}) is None
    True
    """
    env = os.environ if environ is None else environ
    if mode is not None:
        if mode not in MODES:
            raise MetricsError(f"WandbSink mode={mode!r}; fix: use one of {list(MODES)} or None")
        return mode
    if env.get("WANDB_MODE"):
        return env["WANDB_MODE"]
    return None if _has_credentials(env, settings or {}) else "offline"



def _forget_a_gone_service() -> None:
    """wandb leaves its service's address in ``WANDB_SERVICE`` for child processes; a process started
    by one whose wandb-core has since exited (a launcher, a killed trainer) inherits an address that
    leads nowhere, and ``wandb.init`` then fails to connect. A Unix-socket address whose socket file
    is gone is dropped, so that wandb starts its own service; a live one is used as wandb intends."""
    token = os.environ.get("WANDB_SERVICE", "")
    _, unix, path = token.partition("-unix-")
    if unix and path and not os.path.exists(path):
        os.environ.pop("WANDB_SERVICE", None)


class WandbSink(Sink):
    """Publishes frames to a W&B run (see the module documentation for what the run shows).

    Keyword-only and cheap: nothing is imported or written until :meth:`start`. ``dir`` is the
    folder the run's files go to (``<dir>/wandb/``; wandb's default, the working directory or
    ``WANDB_DIR``, when ``None``). ``settings`` adds or overrides ``wandb.Settings`` fields (for
    example ``{"base_url": ...}`` or ``{"x_disable_meta": True}``); ``mode`` is set with ``mode=``.
    ``system_metrics`` keeps W&B's CPU/GPU monitor and ``capture_console`` its copy of stdout and
    stderr (off: the trainer's own logging stays untouched). ``resume`` is passed to
    ``wandb.init`` for a run restarted under the same run id.
    """

    name = "wandb"
    config_type = "wandb"  # rebuilt from its options in the publisher process
    path_options = ("dir",)
    # Verified on wandb 0.31: history rows keep NaN, +inf and -inf exactly.
    stores_nonfinite = frozenset({"nan", "inf"})

    def __init__(
        self,
        *,
        project: str | None = None,
        entity: str | None = None,
        dir: str | os.PathLike[str] | None = None,
        mode: str | None = None,
        tags: Sequence[str] | None = None,
        group: str | None = None,
        job_type: str | None = None,
        notes: str | None = None,
        resume: Literal["allow", "never", "must", "auto"] | None = "allow",
        init_timeout: float = 30.0,
        system_metrics: bool = True,
        capture_console: bool = False,
        summary_every: int = 10,
        settings: Mapping[str, Any] | None = None,
        x_axis: str = "step",
    ) -> None:
        if x_axis not in X_AXES:
            raise MetricsError(f"WandbSink x_axis={x_axis!r}; fix: use one of {list(X_AXES)}")
        self.x_axis = x_axis
        if mode is not None and mode not in MODES:
            raise MetricsError(f"WandbSink mode={mode!r}; fix: use one of {list(MODES)} or None")
        if isinstance(tags, str):
            raise MetricsError(f"WandbSink tags={tags!r} is a string; fix: pass a list, tags=[{tags!r}]")
        if settings is not None and "mode" in settings:
            raise MetricsError("WandbSink settings={'mode': ...}; fix: pass mode=... instead")
        if summary_every < 0:
            raise MetricsError(f"WandbSink summary_every={summary_every}; fix: use 0 (close only) or more")
        # W&B's own environment variables fill what the arguments leave out, never the reverse.
        env = os.environ
        self.project = project if project is not None else env.get("WANDB_PROJECT") or None
        self.entity = entity if entity is not None else env.get("WANDB_ENTITY") or None
        if dir is None and env.get("WANDB_DIR"):
            dir = env["WANDB_DIR"]
        self.dir = None if dir is None else Path(dir)
        self.mode = mode
        if tags is None:
            tags = [t.strip() for t in env.get("WANDB_TAGS", "").split(",") if t.strip()]
        self.tags = tuple(tags)
        self.group = group if group is not None else env.get("WANDB_RUN_GROUP") or None
        self.job_type = job_type if job_type is not None else env.get("WANDB_JOB_TYPE") or None
        self.notes = notes if notes is not None else env.get("WANDB_NOTES") or None
        self.resume = resume
        self.init_timeout = float(init_timeout)
        self.system_metrics = system_metrics
        self.capture_console = capture_console
        self.summary_every = int(summary_every)
        self.settings = dict(settings or {})
        self._run: Run | None = None
        self._handles: dict[str, Any] = {}
        self._summary: RunSummary | None = None
        self._bound: set[str] = set()
        self._axis = STEP_KEY  # what the namespaces are bound to (x_axis, once its key is known at start)
        self._labels: dict[str, str] = {}  # categorical key -> phase of the frame that last held it
        self._frames = 0
        self._started: float | None = None  # the run's start, as the journal header records it
        self._frames_span: tuple[float, float] | None = None  # the first and last frame's wall times

    @property
    def run(self) -> Run | None:
        """The live ``wandb`` run between ``start`` and ``close``."""
        return self._run

    def start(self, run: RunInfo) -> None:
        if self._run is not None:
            raise MetricsError(f"WandbSink already started run {self._run.id!r}; fix: close() it first")
        try:
            import wandb
        except ImportError as exc:
            raise ImportError(f"WandbSink needs the wandb package, which is not installed; fix:\n{_INSTALL}") from exc
        settings: dict[str, Any] = {
            "init_timeout": self.init_timeout,
            "x_disable_stats": not self.system_metrics,
            "console": "auto" if self.capture_console else "off",
            # W&B's metadata records the command line (and the git remote, the host): a secret
            # passed as an argument would reach the run. Off unless settings ask for it.
            "x_disable_meta": True,
        }
        mode = resolve_mode(self.mode, settings=self.settings)
        if mode is not None:
            settings["mode"] = mode
        settings.update(self.settings)
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)  # wandb falls back to a temp dir otherwise
        _forget_a_gone_service()
        wb_run = wandb.init(
            project=self.project,
            entity=self.entity,
            dir=None if self.dir is None else str(self.dir),
            id=run.run_id,
            name=run.name,
            config=dict(run.config_tree),
            # what W&B stores besides the config is redacted like it
            tags=[redact_text(t) for t in self.tags] or None,
            group=None if self.group is None else redact_text(self.group),
            job_type=None if self.job_type is None else redact_text(self.job_type),
            notes=None if self.notes is None else redact_text(self.notes),
            resume=self.resume,
            reinit="create_new",  # our run never finishes, nor is finished by, another wandb run
            settings=wandb.Settings(**settings),
        )
        self._run = wb_run
        self._handles = {"run_id": wb_run.id, "url": wb_run.url, "dir": wb_run.dir, "project": wb_run.project}
        self._summary = RunSummary(run.keys)
        self._bound = set()
        self._labels = {}
        self._frames = 0
        self._started = run.started if run.started > 0 and math.isfinite(run.started) else None
        self._frames_span = None
        wb_run.define_metric(STEP_KEY)
        axes = [axis for axis in X_AXES.values() if axis in run.keys]  # step metrics beside trainer/step
        for axis in axes:
            wb_run.define_metric(axis, summary="max")
        self._axis = X_AXES[self.x_axis] if X_AXES[self.x_axis] in (STEP_KEY, *axes) else STEP_KEY
        for namespace in (*NAMESPACES, *(info.namespace for info in run.keys.values())):
            self._bind(namespace)
        for key, info in run.keys.items():
            if key in axes:
                continue
            wb_run.define_metric(key, step_metric=self._axis, summary=summary_for(info))
            for label in info.metric.labels:
                wb_run.define_metric(label_key(key, label), step_metric=self._axis, summary=_LABEL_SUMMARY)

    def write(self, frame: Frame) -> None:
        run, summary = self._run, self._summary
        if run is None or summary is None:
            raise MetricsError("WandbSink.write() before start() or after close(); fix: start the publisher first")
        row: dict[str, Any] = {}
        for key, value in frame.metrics.items():
            namespace = key.split("/", 1)[0]
            if namespace not in self._bound and "/" in key:
                self._bind(namespace)
            row[key] = value
        row[STEP_KEY] = frame.step
        if frame.wall_time > 0 and math.isfinite(frame.wall_time):
            row["_timestamp"] = frame.wall_time
            seen, wall = self._frames_span, frame.wall_time
            self._frames_span = (wall, wall) if seen is None else (min(seen[0], wall), max(seen[1], wall))
        run.log(row)  # no step=: rows are never dropped for a step that goes backwards
        self._clear_stale_labels(run, frame)
        summary.add(frame)
        self._frames += 1
        if self.summary_every and self._frames % self.summary_every == 0:
            self._push_summary(run, summary)

    def _clear_stale_labels(self, run: Run, frame: Frame) -> None:
        """A categorical key absent from a frame of its phase has no label for that window (an applied
        update has no ``optim/skip_reason``): its summary column is emptied, so that the runs table
        never shows a reason that no longer holds."""
        stale = [key for key, phase in self._labels.items() if phase == frame.phase and key not in frame.metrics]
        for key in stale:
            del self._labels[key]
        for key, value in frame.metrics.items():
            if isinstance(value, str):
                self._labels[key] = frame.phase
        if stale:
            run.summary.update(dict.fromkeys(stale))

    def close(self, *, failed: bool = False, killed: bool = False, interrupted: bool = False,
              reason: str = "") -> None:
        """Finish the run: exit code 0, 1 when it failed, 130 (128 + SIGINT) when it was interrupted,
        137 (128 + SIGKILL) when it was killed (a run that never closed). W&B's SDK can mark a run only
        finished (0) or failed (any other code), so the summary's ``posttrain_metrics/status`` says
        ``finished``, ``failed``, ``interrupted`` or ``killed``, and ``posttrain_metrics/end_reason`` why
        (the exception's type and message, when there is one)."""
        run, summary = self._run, self._summary
        if run is None:
            return
        self._run = self._summary = None
        status = "killed" if killed else "interrupted" if interrupted else "failed" if failed else "finished"
        code = KILLED_EXIT_CODE if killed else INTERRUPTED_EXIT_CODE if interrupted else 1 if failed else 0
        try:
            if summary is not None and summary.frames:
                self._push_summary(run, summary)
            run.summary.update({STATUS_KEY: status, **({REASON_KEY: reason} if reason else {}), **self._span_summary()})
        finally:
            run.finish(exit_code=code)

    def _span_summary(self) -> dict[str, Any]:
        """:data:`SPAN_KEYS`: the start (the header's, or an earlier first frame's), the last frame and
        the seconds between, in whole milliseconds; a run with no frame has a start only."""
        started, ended, duration = SPAN_KEYS
        frames = self._frames_span
        if frames is None:
            return {} if self._started is None else {started: _utc(int(self._started * 1000))}
        start = frames[0] if self._started is None else min(self._started, frames[0])
        first, last = int(start * 1000), int(frames[1] * 1000)  # cut to the ms, as MLflow stores its times
        return {started: _utc(first), ended: _utc(last), duration: (last - first) / 1000}

    def write_finding(self, event: Mapping[str, Any]) -> None:
        """A live-health finding (:mod:`posttrain_metrics.publication.health`): a W&B alert (recorded in
        an offline run too) and ``health/<check>`` in the summary (severity, step, action, explanation)."""
        run = self._run
        if run is None or event.get("kind") != "finding":
            return
        check, severity = str(event["check"]), str(event["severity"])
        level = {"error": "ERROR", "warning": "WARN"}.get(severity, "INFO")  # wandb.AlertLevel's values
        text = f"{event['explanation']}\n\nNext: {event['next_step']}" + (
            "\n\nAction: stop (the run stops at the next step every rank reduces)" if event.get("action") == "stop" else "")
        run.alert(title=f"{check} ({severity}) at step {event['step']}", text=text[:4000], level=level,
                  wait_duration=0)
        run.summary[f"health/{check}"] = {"severity": severity, "step": event["step"], "action": event.get("action"),
                                          "steps": event.get("step_ranges", ""), "explanation": event["explanation"]}

    def attach(self, files: Sequence[Path]) -> None:
        """Attach the run's own record (journal, config, doctor's report, dashboard) as run files under
        ``posttrain_metrics/`` (copied into the run's files folder, uploaded at the end of the run or
        by ``wandb sync``); the publisher calls it just before ``close``."""
        import shutil

        run = self._run
        if run is None:
            return
        folder = Path(run.dir) / "posttrain_metrics"
        folder.mkdir(parents=True, exist_ok=True)
        for path in files:
            target = folder / Path(path).name
            shutil.copyfile(path, target)
            run.save(str(target), base_path=run.dir, policy="end")

    def write_samples(self, samples: Any) -> None:
        """A step's sample completions as a W&B Table under ``samples/completions`` and its histograms
        (``samples/reward`` ...) as W&B histograms, on the step axis."""
        import wandb

        run = self._run
        if run is None or not (samples.rows or samples.histograms):
            return
        self._bind("samples")
        row: dict[str, Any] = {STEP_KEY: samples.step}
        if samples.rows:
            row["samples/completions"] = wandb.Table(columns=list(samples.columns), data=samples.table())
        for column, h in samples.histograms.items():
            row[f"samples/{column}"] = wandb.Histogram(np_histogram=(h.counts, h.edges))
        run.log(row)

    # -- the publisher process ---------------------------------------------------------------------

    def run_settings(self) -> dict[str, Any]:
        """Where the run goes, as resolved from the arguments and W&B's environment variables:
        recorded in the journal header, so ``posttrain-metrics export --to wandb`` sends a replay to
        the same project and entity."""
        return {"project": self.project, "entity": self.entity}

    def held_points(self, run_id: str, name: str, keys: Any) -> Any:
        """The (key, step) points the offline runs of ``run_id`` under ``dir`` already hold."""
        return wandb_points(self.dir if self.dir is not None else Path.cwd(), run_id)

    def run_handles(self) -> dict[str, Any]:
        """The W&B run's id, URL (None offline), files folder and project, from ``start`` on."""
        return dict(self._handles)

    def _bind(self, namespace: str) -> None:
        if self._run is None or namespace in self._bound or namespace == STEP_KEY.split("/", 1)[0]:
            return
        self._bound.add(namespace)
        self._run.define_metric(f"{namespace}/*", step_metric=self._axis)

    @staticmethod
    def _push_summary(run: Run, summary: RunSummary) -> None:
        update: dict[str, Any] = {f"{RUN_PREFIX}{key}": value for key, value in summary.values().items()}
        for key, count in summary.nonfinite.items():
            update[f"{RUN_PREFIX}nonfinite/{key}"] = count
        run.summary.update(update)


def _utc(ms: int) -> str:
    """A wall time in whole milliseconds as ISO 8601 UTC: ``2023-11-14T22:13:21.000Z``."""
    second = datetime.datetime.fromtimestamp(ms // 1000, datetime.timezone.utc)
    return f"{second:%Y-%m-%dT%H:%M:%S}.{ms % 1000:03d}Z"


def wandb_points(directory: Path, run_id: str) -> Points:
    points: Points = collections.Counter()
    files = sorted(directory.rglob(f"run-{run_id}.wandb")) if directory.is_dir() else []
    if not files:
        return points
    from .wandb_reader import read_offline_run

    for file in files:
        for row in read_offline_run(file).history:
            step = row.get("trainer/step")
            if isinstance(step, int):
                points.update((key, step) for key in row if not key.startswith(("_", "trainer/")))
    return points
