"""The sample completions of an MLflow run as tables the MLflow UI shows, for a run of any length.

MLflow's UI shows a ``.json`` artifact as a table (rather than as text) only when the run's
``mlflow.loggedArtifacts`` tag lists it (``[{"path": ..., "type": "table"}]``: its artifact view and
its evaluation view read the tag, nothing else), and ``log_table`` adds one entry per file to that tag.
A tag holds at most ``MAX_TAG_VAL_LENGTH`` (8,000) characters and MLflow cuts a longer value, so one
table per step breaks past about a hundred steps: the tag becomes invalid JSON, every table loses its
view and ``log_table`` itself fails on it. ``log_table`` also downloads and rewrites a file it appends to.

So the rows go two ways, each at a cost per step that does not grow with the run:

- each step's own file, ``posttrain_metrics/samples/step_<step>.json`` (MLflow's table format,
  ``{"columns": [...], "data": [...]}``), written once: the step's rows, read back by anyone;
- block tables, ``posttrain_metrics/tables/steps_<first>-<last>.json``: the same rows with a
  leading ``step`` column, :data:`BLOCK` steps per file, and the tag lists these only, in compact
  JSON (about 80 characters each), so it stays valid whatever the run's length. The open block's
  file is rewritten when its step count reaches a power of two (1, 2, 4 ... 128 steps: each row
  is written about twice in all, not once per later step of its block); a step
  not yet in its block's file is in its own file. When the tag has no room for another block, the
  blocks are merged in pairs (read back from the run's artifacts) and blocks are twice as long from
  then on: each row is rewritten once more per doubling, about seven times for a million steps.

Merged and rewritten block files that the tag no longer lists stay in the artifact store (MLflow has
no artifact delete in its client). Entries of the tag that are not ours (your own ``log_table``
calls) are kept, and ours from an earlier publisher of the same run are replaced: a restarted
publisher sends every step's samples again.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["BLOCK", "LOGGED_ARTIFACTS", "SampleTables"]

LOGGED_ARTIFACTS = "mlflow.loggedArtifacts"
"""The run tag MLflow's UI reads to show a ``.json`` artifact as a table."""

STEP_DIR = "posttrain_metrics/samples"
BLOCK_DIR = "posttrain_metrics/tables"
BLOCK = 128
"""Steps per block table at first (doubled whenever the tag has no room for another block)."""


def _split(columns: list[str], data: list[list[Any]]) -> str:
    """A table as ``log_table`` writes a ``.json`` file (pandas' ``orient="split"`` without index)."""
    return json.dumps({"columns": columns, "data": data}, default=str)


class SampleTables:
    """The completions tables of one MLflow run (see the module docstring). ``client`` is an
    ``MlflowClient``; ``limit`` the tag's longest value (MLflow's ``MAX_TAG_VAL_LENGTH``)."""

    def __init__(self, client: Any, run_id: str, *, limit: int, block: int | None = None) -> None:
        self.client = client
        self.run_id = run_id
        self.limit = limit
        self.block = block or BLOCK
        self.blocks: list[tuple[int, int]] = []  # (first, last) step of each block file the tag lists
        self.others: list[Any] | None = None  # the tag's entries that are not ours, read at the first write
        self.open_first = 0  # the open block: its first step (0: none yet), its rows (step first), columns
        self.open_rows: list[list[Any]] = []
        self.open_columns: list[str] = []
        self.open_steps: set[int] = set()
        self.written = 0  # the open block's step count when its file was last written

    def add(self, step: int, columns: list[str], data: list[list[Any]]) -> None:
        """A step's rows: its own file, then the open block (the block holding the step; the one open
        before is written first)."""
        self._upload(f"{STEP_DIR}/step_{step:08d}.json", _split(columns, data))
        first = self._first(step)
        if first != self.open_first:
            self.flush()
            self._open(first)
        self.open_columns += [c for c in columns if c not in self.open_columns]
        index = {c: i for i, c in enumerate(columns)}
        self.open_rows = [r for r in self.open_rows if r[0] != step]  # a step sent again replaces its rows
        self.open_rows += [[step, *[row[index[c]] if c in index else None for c in self.open_columns]]
                           for row in data]
        self.open_steps.add(step)
        n = len(self.open_steps)
        if n & (n - 1) == 0 or n >= self.block:
            self.flush()

    def flush(self) -> None:
        """Write the open block's file (if it changed) and list it in the tag."""
        if not self.open_steps or self.written == len(self.open_steps):
            return
        span = self._span(self.open_first)
        self._upload(self._path(span), self._open_table())
        self.written = len(self.open_steps)
        if span not in self.blocks:
            self.blocks.append(span)
            if len(self._tag()) > self.limit:
                self._merge()
            self._set_tag()

    def _first(self, step: int) -> int:
        """The first step of the block that holds ``step``."""
        return (step - 1) // self.block * self.block + 1

    def _span(self, first: int) -> tuple[int, int]:
        return first, first + self.block - 1

    def _open(self, first: int) -> None:
        """Make the block starting at ``first`` the open one, with the rows its file holds already (a
        block merged, or reopened by steps that go back: a resumed run)."""
        self.open_first, self.open_rows, self.open_columns, self.open_steps = first, [], [], set()
        span = self._span(first)
        if span in self.blocks:
            columns, data = self._read(span)
            self.open_columns = columns[1:]
            self.open_rows = [list(row) for row in data]
            self.open_steps = {row[0] for row in data}
        self.written = len(self.open_steps)

    def _open_table(self) -> str:
        width = 1 + len(self.open_columns)
        rows = [r + [None] * (width - len(r)) for r in sorted(self.open_rows, key=lambda r: r[0])]
        return _split(["step", *self.open_columns], rows)

    def _merge(self) -> None:
        """Blocks twice as long, the listed ones merged into them (read back from the run), until the
        tag fits; the open block is then the merged one that holds its steps."""
        last = max(self.open_steps)
        while len(self._tag()) > self.limit and len(self.blocks) > 1:
            self.block *= 2
            groups: dict[int, list[tuple[int, int]]] = {}
            for span in self.blocks:
                groups.setdefault(self._first(span[0]), []).append(span)
            for first, spans in groups.items():
                self._upload(self._path(self._span(first)), self._joined(spans))
            self.blocks = [self._span(first) for first in groups]
        self._open(self._first(last))

    def _read(self, span: tuple[int, int]) -> tuple[list[str], list[list[Any]]]:
        """A listed block's columns and rows, read back from the run's artifacts."""
        with tempfile.TemporaryDirectory() as tmp:
            local = self.client.download_artifacts(self.run_id, self._path(span), tmp)
            table = json.loads(Path(local).read_text())
        return list(table["columns"]), list(table["data"])

    def _joined(self, spans: list[tuple[int, int]]) -> str:
        tables = [self._read(span) for span in spans]
        columns: list[str] = []
        for names, _ in tables:
            columns += [c for c in names if c not in columns]
        data: list[list[Any]] = []
        for names, rows in tables:
            index = {c: i for i, c in enumerate(names)}
            data += [[row[index[c]] if c in index else None for c in columns] for row in rows]
        return _split(columns, data)

    @staticmethod
    def _path(span: tuple[int, int]) -> str:
        return f"{BLOCK_DIR}/steps_{span[0]:08d}-{span[1]:08d}.json"

    def _tag(self) -> str:
        if self.others is None:
            held = self.client.get_run(self.run_id).data.tags.get(LOGGED_ARTIFACTS, "[]")
            try:
                entries = json.loads(held)
            except ValueError:  # cut by MLflow (one table per step, logged by hand): nothing readable
                entries = []
            self.others = [e for e in entries if not (isinstance(e, dict) and str(e.get("path", "")).startswith(
                (f"{STEP_DIR}/", f"{BLOCK_DIR}/")))]
        entries = [*self.others, *({"path": self._path(s), "type": "table"} for s in self.blocks)]
        return json.dumps(entries, separators=(",", ":"))

    def _set_tag(self) -> None:
        self.client.set_tag(self.run_id, LOGGED_ARTIFACTS, self._tag())

    def _upload(self, path: str, text: str) -> None:
        folder, name = path.rsplit("/", 1)
        with tempfile.TemporaryDirectory() as tmp:
            local = Path(tmp) / name
            local.write_text(text)
            self.client.log_artifact(self.run_id, str(local), artifact_path=folder)
