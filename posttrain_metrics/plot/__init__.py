"""A one-page PNG dashboard of a run from its journal, with the doctor's findings marked.

Panels are chosen from what the journal holds. :data:`PANELS` groups the catalogue's families
(reward and groups, loss, KL, clipping, response length and truncation, logprob gap, score
centering, PPO counters, DPO accuracy and rewards, ...) by leaf name, so one table serves every
algorithm: a panel is drawn when at least one of its keys is present, and a key that is absent is
simply not drawn. Any headline key of the run's adapters (``Metric.headline``) that no panel shows
gets a panel of its own, so a user-registered adapter still gets its headline curves. Label-valued
keys (``optim/update_outcome``, ``optim/skip_reason``) become a strip of markers per label.

Findings are marked where they fire: a shaded span (red for errors, orange for warnings, blue for
info) on every panel that shows a key the finding is about, one row per finding in a findings strip,
and the list of findings as text under it. Non-finite points are marked with a red ``x`` along the
top edge of their panel.

matplotlib is imported inside :func:`dashboard` (the ``plot`` extra) and drives the Agg canvas
directly, so neither the import of this module nor a call changes pyplot's global backend.

The package: ``panels`` (the families, as data), ``series`` (the journal's series, read in two passes
and thinned as they come, so a run of any length takes bounded memory) and ``draw`` (the page).
"""

from __future__ import annotations

from .draw import dashboard
from .panels import PANELS, Panel
from .series import BUCKETS
from .series import _Data as _Data  # the tests read the thinned series without drawing them

__all__ = ["BUCKETS", "PANELS", "Panel", "dashboard"]
