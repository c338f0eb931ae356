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

Pure functions, no vendor import: the sinks store the state, the demo and the README print the links.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Mapping
from typing import Any

from ..core.keys import KeyInfo
from ..core.reduction import Reduction

__all__ = ["MLFLOW_VIEW_KEY", "MLFLOW_VIEW_TAG", "headline_metrics", "mlflow_link", "mlflow_view_state",
           "tensorboard_links"]

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


def mlflow_ui_base(tracking_uri: str | None) -> str:
    """The UI a user opens: the tracking server itself, or ``mlflow ui``'s default address for a
    SQLite file or a local folder (no UI serves those until ``mlflow ui`` runs)."""
    uri = (tracking_uri or "").rstrip("/")
    return uri if uri.startswith(("http://", "https://")) else MLFLOW_UI


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
