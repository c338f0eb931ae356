"""MLflow requests sent off the caller's thread, and held while the server does not answer.

The sink turns each frame into a :class:`_Batch`; :class:`_Sender` merges held batches into requests
up to MLflow's batch limits (a request's fixed cost is most of a small one's) and hands them to
MLflow's asynchronous ``log_batch`` or, for a SQLite store, to a writer thread of its own
(:mod:`.direct`). Nothing is dropped: a request that fails for a transient reason (server down,
timeout, a locked database) goes back to the head of the queue and the sender is *degraded*: one
request at a time, as a probe, until one lands; a request MLflow refuses as invalid (HTTP 4xx: the
run was deleted meanwhile) is handed to ``rejected`` and not retried.

The held batches are bounded by the journal, not here: fed by the publisher, the sink says it is not
``ready()`` once ``backlog`` frames are held, and the publisher stops reading the journal for it
until MLflow answers (the journal is the queue). A sink written directly holds every frame.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import time
from collections.abc import Callable
from typing import Any

from ...core.log import get_logger
from ...core.redact import redact_text
from .direct import _SqlitePoints

__all__: list[str] = []

log = get_logger("integrations.mlflow")  # a server down and back is the run's state: logged, not warned


@dataclasses.dataclass
class _Batch:
    """What goes to MLflow in one request: the points and changed label tags of one or more frames,
    or a slice of params.

    Plain tuples, not MLflow entities, so that held batches stay small; a point's timestamp is
    fixed when it is built, so that a resent point is recognised by MLflow as the same point.
    """

    steps: list[int]  # the frames' steps, for messages; empty for a params batch
    metrics: list[tuple[str, float, int, int]]  # key, value, timestamp (ms), step
    tags: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    params: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    def size(self) -> int:
        return len(self.metrics) + len(self.tags) + len(self.params)


class _Sender:
    """The requests of one MLflow run (see the module docstring). ``limits`` are MLflow's per request:
    metrics, params or tags, entities; ``where`` names the store in messages (redacted);
    ``rejected(what, exc)`` is told of a request MLflow refused as invalid."""

    def __init__(self, client: Any, run_id: str, entities: Any, *, direct: _SqlitePoints | None,
                 max_pending: int, backlog: int, limits: tuple[int, int, int], where: str,
                 rejected: Callable[[str, BaseException], None], batched: bool = False) -> None:
        self.client, self.run_id, self.entities = client, run_id, entities
        self.direct = direct
        # one writer thread for a SQLite store: SQLite takes one writer at a time anyway
        self.writer = (concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="posttrain-metrics-mlflow")
                       if direct is not None else None)
        self.max_pending, self.backlog = max_pending, backlog
        self.max_metrics, self.max_tags, self.max_entities = limits
        self.where = where
        self.rejected = rejected
        self.batched = batched  # once a publisher ends batches, frames go at batch ends only
        self.pending: collections.deque[tuple[Any, _Batch, int]] = collections.deque()  # ops, batch, seq
        self.sent = 0  # sequence number of the next request
        self.probe_from = 0  # when degraded, only a request sent from this one on proves recovery
        self.held: collections.deque[_Batch] = collections.deque()
        self.degraded = False
        self.failed_probes = 0

    def queue(self, batch: _Batch) -> None:
        self.held.append(batch)  # never dropped: see ready() for how a publisher holds back
        if not self.batched:
            self.pump()

    def ready(self) -> bool:
        return sum(len(b.steps) for b in self.held) < self.backlog

    def end_batch(self) -> None:
        self.batched = True
        self.reap()
        self.pump()

    def pump(self) -> None:
        """Send held batches: up to ``max_pending`` in flight when healthy, one (a probe) when
        degraded. Held frames are merged into one request up to MLflow's batch limits, so that a
        backlog drains in few requests."""
        limit = 1 if self.degraded else self.max_pending
        while self.held and len(self.pending) < limit:
            batch = self.held.popleft()
            while self.held and not self.degraded and self._fits(batch, self.held[0]):
                nxt = self.held.popleft()
                tags = dict(batch.tags)
                tags.update(nxt.tags)  # a tag holds the last label: the later frame's wins
                batch = _Batch(batch.steps + nxt.steps, batch.metrics + nxt.metrics,
                               list(tags.items()), batch.params + nxt.params)
            self.pending.append((self._send(batch), batch, self.sent))
            self.sent += 1

    def _fits(self, a: _Batch, b: _Batch) -> bool:
        return (
            len(a.metrics) + len(b.metrics) <= self.max_metrics
            and len(a.tags) + len(b.tags) <= self.max_tags
            and len(a.params) + len(b.params) <= self.max_tags
            and a.size() + b.size() <= self.max_entities
        )

    def _send(self, batch: _Batch) -> Any:
        """Hand ``batch`` over; what comes back is polled with :func:`_futures`."""
        if self.writer is not None:
            return self.writer.submit(self._write_direct, batch)
        return self._log_batch(batch, metrics=True, synchronous=False)

    def _log_batch(self, batch: _Batch, *, metrics: bool, synchronous: bool) -> Any:
        metric, param, run_tag = self.entities
        return self.client.log_batch(
            self.run_id,
            metrics=[metric(k, v, t, step) for k, v, t, step in batch.metrics] if metrics else [],
            params=[param(k, v) for k, v in batch.params],
            tags=[run_tag(k, v) for k, v in batch.tags],
            synchronous=synchronous,
        )

    def _write_direct(self, batch: _Batch) -> None:
        """On the writer thread: the points straight into the SQLite store, then params and tags
        (few, and rare) through ``log_batch``."""
        assert self.direct is not None
        self.direct.write(self.run_id, batch.metrics)
        if batch.params or batch.tags:
            self._log_batch(batch, metrics=False, synchronous=True)

    def reap(self) -> None:
        """Collect finished batches (non-blocking); requeue what failed for a transient reason."""
        recovered = False
        while self.pending and all(f.done() for f in _futures(self.pending[0][0])):
            operations, batch, seq = self.pending.popleft()
            errors = [e for e in (f.exception() for f in _futures(operations)) if e is not None]
            if not errors:
                # A request sent before the failure that landed proves nothing about the server now.
                if self.degraded and seq >= self.probe_from:
                    self.degraded = False
                    recovered = True
                continue
            exc = errors[0]
            status = getattr(exc, "get_http_status_code", lambda: 500)()
            if 400 <= status < 500 and status not in (401, 403, 408, 429):  # invalid: resending won't help
                self.rejected(f"the batch of steps {_span(batch.steps)}" if batch.steps else "the batch of params", exc)
                continue
            if self.degraded and seq >= self.probe_from:
                self.failed_probes += 1
            if not self.degraded:
                self.probe_from = self.sent
                log.warning(
                    f"mlflow: sending to {self.where} failed ({type(exc).__name__}: {redact_text(str(exc))}); the "
                    f"sink is degraded: frames are held (up to backlog={self.backlog}) and resent when "
                    "the server answers again; training continues"
                )
            self.degraded = True
            self.held.appendleft(batch)
        if recovered:
            log.info(f"mlflow: {self.where} answers again; resending {sum(len(b.steps) for b in self.held)} "
                     "held frame(s)")

    def drain(self, deadline: float) -> list[_Batch]:
        """Send everything held and wait for it until ``deadline`` (``time.monotonic()``), or until a
        probe sent now fails too (the server is down: no reason to hold the process up); what was not
        confirmed is returned (the journal has it). The writer thread is stopped either way."""
        probes = self.failed_probes
        while self.pending or self.held:
            self.reap()
            if self.degraded and self.failed_probes > probes:
                break  # a probe sent now failed too: do not hold the process up for nothing
            self.pump()
            left = deadline - time.monotonic()
            if left <= 0 or not self.pending:
                break
            concurrent.futures.wait(_futures(self.pending[0][0]), timeout=min(left, 1.0))
        if self.writer is not None:  # what did not land by now is reported, not written later
            self.writer.shutdown(wait=False, cancel_futures=True)
        return [b for _, b, _ in self.pending] + list(self.held)


def _futures(operations: Any) -> list[concurrent.futures.Future[Any]]:
    # RunOperations exposes only wait(), which blocks; its futures let the training thread poll.
    if isinstance(operations, concurrent.futures.Future):  # a direct write (_SqlitePoints)
        return [operations]
    return list(getattr(operations, "_operation_futures", None) or [])


def _span(steps: list[int]) -> str:
    if not steps:
        return "none"
    return str(steps[0]) if len(steps) == 1 else f"{steps[0]}..{steps[-1]}"
