"""The views a tracker opens on: the headline keys (loss, reward, KL, grad norm) first, not the
bookkeeping keys that sort before them (``optim/attempt_id``, ``optim/...`` flags).

Neither UI takes a default view from the data, so each one gets the state its own UI honours:

- **MLflow** (3.17's experiment page): a *shared view state*, the experiment tag
  ``mlflow.sharedViewState.<key>`` holding the page's UI state as JSON, opened by the URL parameter
  ``viewStateShareKey=<key>`` (what the page's own "Share" button writes and reads). Ours selects the
  headline keys and their ``run/`` aggregates as visible columns of the runs table, which otherwise
  shows every metric column hidden, and opens its chart view on a ``headline`` section (otherwise
  sections by namespace, ``optim`` first).
- **TensorBoard**: its custom-scalars tab (``#custom_scalars``), whose layout
  (:mod:`.tensorboard`) opens on the headline group; and the Time Series tab's ``pinnedCards`` URL
  parameter, which pins the headline charts above the alphabetical list.

Pure functions, no vendor import: the sinks store the state; the console's closing summary
(:func:`closing_links`, for any run with a console sink), the demo and the README print the links.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..core.keys import KeyInfo
from ..core.redact import redact_text
from ..core.reduction import Reduction

__all__ = ["MLFLOW_VIEW_KEY", "MLFLOW_VIEW_TAG", "TENSORBOARD_UI", "closing_links", "headline_metrics",
           "mlflow_link", "mlflow_view_state", "tensorboard_links"]

MLFLOW_VIEW_KEY = "posttrain-metrics"
"""The share key of the experiment's view state (one per experiment: the latest run's keys)."""
MLFLOW_VIEW_TAG = f"mlflow.sharedViewState.{MLFLOW_VIEW_KEY}"
"""MLflow 3.17's experiment tag for a shared view (its UI's prefix ``mlflow.sharedViewState.``)."""
RUN_PREFIX = "run/"
"""The MLflow sink's prefix of the run aggregates (``run/train/loss_avg``)."""
# MLflow's own default visible columns are Source, Models and Dataset (the page's
# ``getDefaultSelectedColumns``); a shared state replaces the whole list: Source is kept, the wide
# Dataset and Models columns (empty for a training run) would push the metrics off the screen.
_MLFLOW_DEFAULT_COLUMNS = ("attributes.`Source`",)
MLFLOW_UI = "http://127.0.0.1:5000"
"""Where ``mlflow ui`` serves by default: the link's host for a store that is not a server."""


def headline_metrics(keys: Mapping[str, KeyInfo]) -> list[str]:
    """The numeric headline keys in declaration order (loss, KL, reward, grad norm...): a label key
    is a tag, not a chart or a column, so it is left out."""
    return [key for key, info in keys.items()
            if info.metric.headline and info.reduction is not Reduction.CATEGORICAL]


def mlflow_view_state(keys: Mapping[str, KeyInfo]) -> dict[str, Any]:
    """The experiment page's UI state: each headline key and its run aggregate as columns of the runs
    table (``selectedColumns``, as ``metrics.`<key>``` names), and, in its chart view, a first
    section ``headline`` with one line chart per headline key; the page adds every other metric's
    chart after it, by namespace, as it does by default."""
    headline = headline_metrics(keys)
    columns = list(_MLFLOW_DEFAULT_COLUMNS)
    for key in headline:
        columns += [f"metrics.`{key}`", f"metrics.`{RUN_PREFIX}{key}`"]
    # the table sorts selected metric columns by name (run/... before train/...) unless the state
    # gives an order: each key next to its run aggregate, in declaration order
    return {"selectedColumns": columns, "columnOrder": columns,
            "compareRunSections": [{"uuid": _SECTION, "name": "headline", "display": True, "isReordered": False,
                                    "deleted": False, "isGenerated": False}],
            "compareRunCharts": [_line_chart(key) for key in headline],
            "isAccordionReordered": True}


_SECTION = "posttrain-metrics-headline"


def _line_chart(key: str) -> dict[str, Any]:
    """One line chart card of MLflow 3.17's chart view over steps (the fields of its
    ``RunsChartsLineCardConfig``, defaults kept)."""
    return {"uuid": f"posttrain-metrics-{key}", "type": "LINE", "runsCountToCompare": 10,
            "metricSectionId": _SECTION, "deleted": False, "isGenerated": True, "metricKey": key,
            "displayName": key, "lineSmoothness": 0, "xAxisScaleType": "linear", "scaleType": "linear",
            "range": {}, "xAxisKey": "step", "selectedXAxisMetricKey": "", "yAxisKey": "metric",
            "yAxisExpressions": [], "ignoreOutliers": False, "useGlobalXaxisKey": True,
            "useGlobalLineSmoothing": True}


TENSORBOARD_UI = "http://localhost:6006"
"""Where ``tensorboard --logdir`` serves by default."""


def mlflow_ui_base(tracking_uri: str | None) -> str:
    """The UI a user opens: the tracking server itself (without a ``user:password@`` part: a browser
    asks for those), or ``mlflow ui``'s default address for a SQLite file or a local folder (no UI
    serves those until ``mlflow ui`` runs)."""
    uri = (tracking_uri or "").rstrip("/")
    if not uri.startswith(("http://", "https://")):
        return MLFLOW_UI
    parts = urllib.parse.urlsplit(uri)
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def mlflow_link(tracking_uri: str | None, experiment_id: str, *, charts: bool = False) -> str:
    """The experiment's runs table with the headline columns shown (``charts``: its chart view, the
    headline section first): ``workflowType`` flips 3.17's GenAI/Model-training switch (a fresh
    browser opens GenAI), ``viewStateShareKey`` loads the state (read on the ``/runs`` route only: the
    bare experiment route drops it), ``compareRunsMode=CHART`` picks the chart view."""
    params = {"workflowType": "machine_learning", "viewStateShareKey": MLFLOW_VIEW_KEY}
    query = urllib.parse.urlencode({**params, **({"compareRunsMode": "CHART"} if charts else {})})
    return f"{mlflow_ui_base(tracking_uri)}/#/experiments/{experiment_id}/runs?{query}"


def tensorboard_links(keys: Mapping[str, KeyInfo], base: str = "http://localhost:6006") -> dict[str, str]:
    """``custom_scalars``: the custom-scalars tab (headline group first, open); ``time_series``: the
    default tab with the headline charts pinned on top (TensorBoard's ``pinnedCards`` parameter)."""
    pinned = [{"plugin": "scalars", "tag": key} for key in headline_metrics(keys)]
    query = urllib.parse.urlencode({"pinnedCards": json.dumps(pinned, separators=(",", ":"))})
    return {"custom_scalars": f"{base}/#custom_scalars", "time_series": f"{base}/?{query}#timeseries"}


def _shown_path(path: str | os.PathLike[str]) -> str:
    """A folder as a user types it: relative to the current folder when it is under it."""
    p = Path(path)
    try:
        return os.path.relpath(p) if p.resolve().is_relative_to(Path.cwd().resolve()) else str(p)
    except (OSError, ValueError):
        return str(p)


def closing_links(handles: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The lines of the console's closing summary that open each tracker of the run on its headline
    view, from the trackers' own names for the run (``Publisher.run_handles()``, one entry per sink,
    each told by what it holds: MLflow its ``experiment_id``, TensorBoard its ``log_dir``, W&B its
    ``url`` and ``dir``); empty when no tracker reported one.

    >>> for line in closing_links({"mlflow": {"experiment_id": "7", "tracking_uri": "http://mlf:5000"}}):
    ...     print(line)
    trackers, opened on loss and reward:
      MLflow        runs table: http://mlf:5000/#/experiments/7/runs?workflowType=machine_learning&viewStateShareKey=posttrain-metrics
                    charts:     http://mlf:5000/#/experiments/7/runs?workflowType=machine_learning&viewStateShareKey=posttrain-metrics&compareRunsMode=CHART
    """
    lines: list[str] = []
    pad = " " * 16
    for handle in handles.values():
        if handle.get("log_dir"):  # TensorBoard: the run's folder; its parent holds the runs to compare
            lines.append(f"  TensorBoard   tensorboard --logdir {_shown_path(Path(handle['log_dir']).parent)}")
            lines.append(f"{pad}then open {TENSORBOARD_UI}/#custom_scalars (loss, reward, KL first)")
        elif handle.get("experiment_id") is not None:  # MLflow
            uri = redact_text(str(handle.get("tracking_uri") or ""))
            if uri.startswith("databricks"):  # its workspace has a UI of its own, not this page
                continue
            first = "  MLflow        "
            if uri and not uri.startswith(("http://", "https://")):  # no UI serves a file until `mlflow ui` runs
                if uri.startswith("sqlite:///"):
                    uri = "sqlite:///" + _shown_path(uri[len("sqlite:///"):])
                lines.append(f"{first}mlflow ui --backend-store-uri {uri}")
                first = pad
            link = mlflow_link(uri or None, str(handle["experiment_id"]))
            lines.append(f"{first}runs table: {link}")
            lines.append(f"{pad}charts:     {mlflow_link(uri or None, str(handle['experiment_id']), charts=True)}")
        elif "url" in handle and "dir" in handle:  # W&B: its page online, the command that uploads it offline
            if handle.get("url"):
                lines.append(f"  W&B           {redact_text(str(handle['url']))}")
            elif handle.get("dir"):
                lines.append(f"  W&B           wandb sync {_shown_path(Path(handle['dir']).parent)}")
    return ["trackers, opened on loss and reward:", *lines] if lines else []
