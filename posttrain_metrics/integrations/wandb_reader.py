"""Read back an offline W&B run from its ``.wandb`` transaction log with wandb's own record classes.

wandb 0.31 has no Python reader of its transaction log any more (``wandb.sdk.internal.datastore``
went with the Go core), so this module parses the container format itself and decodes every entry
with ``wandb.proto.wandb_internal_pb2.Record``: the same protobuf messages ``wandb sync`` uploads.

The container is LevelDB's log format with a W&B header: a 7-byte file header (``:W&B``, magic
``0xBEE1``, version 0), then 32 KiB blocks of chunks, each chunk a 7-byte header (CRC-32 of the
type byte and the data, little-endian length, type FULL/FIRST/MIDDLE/LAST) and its data; a block
tail shorter than a chunk header is zero padding. Every checksum is verified.
"""

from __future__ import annotations

import dataclasses
import json
import struct
import zlib
from pathlib import Path
from typing import Any

from ..core.errors import MetricsError

try:
    from wandb.proto import wandb_internal_pb2 as pb
except ImportError as exc:  # say what is missing and how to get it
    raise ImportError("reading W&B runs needs wandb: pip install 'posttrain-metrics[wandb]'") from exc

__all__ = ["OfflineRun", "read_offline_run", "read_records", "run_file"]

_FILE_HEADER = struct.Struct("<4sHB")
_CHUNK_HEADER = struct.Struct("<IHB")
_IDENT, _MAGIC, _VERSION = b":W&B", 0xBEE1, 0
_BLOCK = 32768
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def run_file(path: str | Path) -> Path:
    """The one ``run-*.wandb`` file under ``path`` (a file, a run folder or any parent)."""
    p = Path(path)
    if p.is_file():
        return p
    found = sorted(p.rglob("run-*.wandb"))
    if len(found) != 1:
        raise MetricsError(f"expected exactly one run-*.wandb under {p}, found {[str(f) for f in found]}")
    return found[0]


def read_records(path: str | Path) -> list[Any]:
    """Every record of the transaction log, in write order, as ``wandb_internal_pb2.Record``."""
    data = run_file(path).read_bytes()
    if len(data) < _FILE_HEADER.size:
        raise MetricsError(f"{path}: {len(data)} bytes, too short for a W&B transaction log")
    ident, magic, version = _FILE_HEADER.unpack_from(data, 0)
    if (ident, magic, version) != (_IDENT, _MAGIC, _VERSION):
        raise MetricsError(f"{path}: not a W&B transaction log (header {ident!r} {magic:#x} v{version})")
    records: list[Any] = []
    pos = _FILE_HEADER.size
    pending = b""
    while pos < len(data):
        room = _BLOCK - pos % _BLOCK
        if room < _CHUNK_HEADER.size:  # zero padding at a block tail
            pos += room
            continue
        if pos + _CHUNK_HEADER.size > len(data):
            break
        crc, length, kind = _CHUNK_HEADER.unpack_from(data, pos)
        if crc == 0 and length == 0 and kind == 0:  # preallocated, never written
            break
        start = pos + _CHUNK_HEADER.size
        chunk = data[start : start + length]
        if len(chunk) != length:
            raise MetricsError(f"{path}: torn chunk at byte {pos}")
        if zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF != crc:
            raise MetricsError(f"{path}: checksum mismatch at byte {pos}")
        pos = start + length
        if kind == _FULL:
            whole = chunk
        elif kind == _FIRST:
            pending = chunk
            continue
        elif kind == _MIDDLE:
            pending += chunk
            continue
        elif kind == _LAST:
            whole, pending = pending + chunk, b""
        else:
            raise MetricsError(f"{path}: unknown chunk type {kind} at byte {pos}")
        record = pb.Record()  # type: ignore[attr-defined]
        record.ParseFromString(whole)
        records.append(record)
    return records


def _path(item: Any) -> list[str]:
    return list(item.nested_key) if item.nested_key else [item.key]


def _set(target: dict[str, Any], path: list[str], value: Any) -> None:
    for part in path[:-1]:
        target = target.setdefault(part, {})
    target[path[-1]] = value


@dataclasses.dataclass
class OfflineRun:
    """An offline run as W&B recorded it."""

    path: Path
    records: list[Any]
    run: Any  # wandb_internal_pb2.RunRecord
    history: list[dict[str, Any]]  # one dict per history row, values JSON-decoded
    summary: dict[str, Any]  # the final summary, every update applied in order
    metrics: list[Any]  # every MetricRecord (define_metric), in order
    config: dict[str, Any]
    exit_code: int | None

    def metric(self, name: str) -> Any:
        """The last ``define_metric`` record of an exact key or a glob."""
        found = [m for m in self.metrics if name in (m.name, m.glob_name)]
        if not found:
            raise MetricsError(f"no define_metric record for {name!r}")
        return found[-1]

    def column(self, key: str) -> dict[int, Any]:
        """``trainer/step -> value`` for every row holding ``key``."""
        return {row["trainer/step"]: row[key] for row in self.history if key in row}


def read_offline_run(path: str | Path) -> OfflineRun:
    """Decode the transaction log under ``path`` into history rows, summary, metrics and config."""
    file = run_file(path)
    records = read_records(file)
    run: Any = None
    history: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    metrics: list[Any] = []
    config: dict[str, Any] = {}
    exit_code: int | None = None

    def apply_config(update: Any) -> None:
        for item in update:
            _set(config, _path(item), json.loads(item.value_json))

    for record in records:
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
            apply_config(record.run.config.update)
        elif kind == "config":
            apply_config(record.config.update)
            for item in record.config.remove:
                config.pop(item.key, None)
        elif kind == "history":
            history.append({"/".join(_path(i)): json.loads(i.value_json) for i in record.history.item})
        elif kind == "summary":
            for item in record.summary.update:
                _set(summary, _path(item), json.loads(item.value_json))
            for item in record.summary.remove:
                summary.pop(item.key, None)
        elif kind == "metric":
            metrics.append(record.metric)
        elif kind == "exit":
            exit_code = record.exit.exit_code
    if run is None:
        raise MetricsError(f"{file}: no run record")
    return OfflineRun(file, records, run, history, summary, metrics, config, exit_code)
