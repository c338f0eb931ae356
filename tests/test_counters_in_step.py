"""An exact counter reported by some ranks and not others is a desynchronised run (issue 24, item 7):
a MetricsError on every rank, as a disagreement is, on real gloo ranks; the next window is normal.
A rank that added no chunk at all to a window still reports nothing (uneven data), as before."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
from _runs import gloo_rank, run_ranks

from posttrain_metrics import MetricReducer, MetricsError, reduce_metrics

pytestmark = pytest.mark.timeout(300)


def test_in_process_a_rank_without_the_counter_is_refused() -> None:
    with pytest.raises(MetricsError, match=r"'optim/updates_skipped'.*reported by 1 of the 2 ranks.*desynchronised"):
        reduce_metrics("trainer", [[{"updates_skipped": 1, "grad_norm": 1.0}], [{"grad_norm": 1.0}]])
    with pytest.raises(MetricsError, match=r"'optim/step_skipped'.*reported by 2 of the 3 ranks"):
        reduce_metrics("trainer", [[{"step_skipped": True}], [{"grad_norm": 1.0}], [{"step_skipped": True}]])
    # every rank that added a chunk reports it: fine; a rank with no chunk at all adds nothing
    assert reduce_metrics("trainer", [[{"updates_skipped": 1}], [{"updates_skipped": 1}], []]) == {
        "optim/updates_skipped": 1}


def _scenario(rank: int, world: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    reducer = MetricReducer(["trainer"])
    # the last rank never reports updates_skipped; the others report 1
    reducer.add({"update_outcome": "skipped", **({} if rank == world - 1 else {"updates_skipped": 1})})
    try:
        out["first"] = reducer.reduce(1).metrics
    except MetricsError as exc:
        out["first"] = f"MetricsError: {exc}"
    reducer.add({"update_outcome": "applied", "updates_skipped": 0, "grad_norm": float(rank)})
    out["next"] = reducer.reduce(2).metrics
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_gloo_ranks_raise_together_and_stay_in_step(tmp_path: Path, world: int) -> None:
    got = run_ranks(functools.partial(gloo_rank, _scenario, world=world), tmp_path / "store", world=world)
    for rank in range(world):
        assert "crash" not in got[rank], got[rank]
        first = got[rank]["first"]
        assert first.startswith("MetricsError:") and "'optim/updates_skipped'" in first, first
        assert f"reported by {world - 1} of the {world} ranks" in first
        # the next window is normal on every rank: grad_norm is LAST, the mean of 0..world-1 over ranks
        assert got[rank]["next"] == {"optim/update_outcome": "applied", "optim/updates_skipped": 0,
                                     "train/grad_norm": sum(range(world)) / world}
