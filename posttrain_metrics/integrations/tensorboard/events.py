"""TensorBoard's event-file format written directly: the records' framing and checksum
(:class:`_EventFile`) and a frame's ``Summary`` bytes packed in one call (:class:`_Encoding`).

TensorBoard's own writer builds a proto per value and hands every event to a queue it flushes every
two minutes; a step here is one record whose bytes are mostly constant, and the file is flushed when
the sink says so (a killed run leaves readable files).
"""

from __future__ import annotations

import itertools
import operator
import os
import queue
import socket
import struct
import threading
import time
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ...core.values import Scalar

__all__ = ["INSTALL"]

INSTALL = "pip install 'posttrain-metrics[tensorboard]'"


def _import_tensorboard() -> Any:
    try:
        from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2
        from tensorboard.plugins.custom_scalar import layout_pb2
        from tensorboard.plugins.custom_scalar import metadata as layout_metadata
        from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2
        from tensorboard.plugins.hparams import metadata as hparams_metadata
        from tensorboard.plugins.hparams import summary_v2 as hparams_summary
        from tensorboard.plugins.scalar import metadata as scalar_metadata
        from tensorboard.plugins.text import metadata as text_metadata
    except ImportError as exc:
        raise ImportError(
            f"the TensorBoard sink needs the tensorboard package, which could not be imported "
            f"({exc}); fix:\n{INSTALL}"
        ) from exc

    return types.SimpleNamespace(
        event_pb2=event_pb2, summary_pb2=summary_pb2, tensor_pb2=tensor_pb2, types_pb2=types_pb2,
        layout_pb2=layout_pb2, layout_metadata=layout_metadata, api_pb2=api_pb2,
        plugin_data_pb2=plugin_data_pb2, hparams_metadata=hparams_metadata,
        hparams_summary=hparams_summary, scalar_metadata=scalar_metadata, text_metadata=text_metadata,
        crc32c=_crc32c(),
    )


def _crc32c() -> Callable[[bytes], int]:
    """CRC-32C in C (``google-crc32c``, a dependency of the tensorboard extra), else TensorBoard's own
    pure-Python one, several times slower: the checksum would then be most of a frame's cost."""
    try:
        import google_crc32c

        if google_crc32c.implementation == "c":
            value: Callable[[bytes], int] = google_crc32c.value
            return value
    except ImportError:
        pass
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import crc32c  # pure Python

    slow: Callable[[bytes], int] = crc32c
    return slow


_UID = itertools.count()
_Q = struct.Struct("<Q")
_D = struct.Struct("<d")
_WALL = struct.Struct("<Bd")
_F = struct.Struct("<f")
_I = struct.Struct("<I")


_SMALL = [bytes((n,)) for n in range(0x80)]
_STEPS = [b"\x10" + bytes((n,)) for n in range(0x80)]


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _SMALL[n]
    out = bytearray()
    while True:
        bits = n & 0x7F
        n >>= 7
        if n:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


class _EventFile:
    """TensorBoard's event file format (TFRecord framing of ``Event`` protos) with a C CRC-32C: the same
    bytes as ``EventFileWriter``. Records are framed on the calling thread and written at ``flush``.

    A flush of a large batch (``_BACKGROUND_BYTES``, the follower's: hundreds of frames) is written by a
    writer thread, so that framing the next batch overlaps a disk that throttles writes (an export
    of a long run is hundreds of MB). At most ``_QUEUED`` batches wait for it
    (then ``flush`` blocks: memory stays bounded); a small flush (a step's event) is written on the
    calling thread unless batches are still queued (order is kept), so a training process never hands
    a step to another thread. A write that fails (a full disk) is raised by the next ``flush`` or
    ``close``, on either thread. The file is written unbuffered and a failed write keeps exactly the
    bytes that did not reach it (part of a record, possibly), which the next write sends first: when
    the disk has room again every record is in the file once, whole and in order, never twice (a
    buffered file would keep its own copy of a failed write besides ours: a step written again and again).
    """

    def __init__(self, log_dir: Path, tb: Any) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{next(_UID)}"
        self.path = log_dir / name
        self._crc = tb.crc32c
        self._file = open(self.path, "wb", buffering=0)  # noqa: SIM115 - held for the run
        self._pending: list[bytes] = []
        self._unwritten = b""  # what a failed write did not get into the file: written first, next time
        self._queue: queue.Queue[bytes | None] | None = None  # the writer thread's, once started
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        version = tb.event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2")
        self.add(version.SerializeToString())
        self.flush()

    def add(self, data: bytes) -> None:
        """Frame one record (length, its masked CRC, data, its masked CRC); it is written at the next
        ``flush`` (one write per batch)."""
        crc = self._crc
        header = _Q.pack(len(data))
        h, d = crc(header), crc(data)
        self._pending.append(b"".join((header, _I.pack((((h >> 15) | (h << 17)) + 0xA282EAD8) & 0xFFFFFFFF), data,
                                       _I.pack((((d >> 15) | (d << 17)) + 0xA282EAD8) & 0xFFFFFFFF))))

    def add_event(self, event: Any) -> None:
        self.add(event.SerializeToString())

    def flush(self) -> None:
        if self._pending or self._unwritten:
            data = b"".join(self._pending)
            self._pending.clear()  # from here on, what does not reach the file is in _unwritten
            self._write(data)
        self._raise()

    def _write(self, data: bytes) -> None:
        q = self._queue
        if q is not None and q.unfinished_tasks:  # batches still queued: after them, in order
            q.put(data)
        elif len(data) >= _BACKGROUND_BYTES:
            if q is None:
                q = self._queue = queue.Queue(maxsize=_QUEUED)
                self._thread = threading.Thread(target=self._drain, args=(q,), daemon=True,
                                                name="posttrain-metrics-tensorboard-writer")
                self._thread.start()
            q.put(data)
        else:
            self._write_all(data)

    def _write_all(self, data: bytes) -> None:
        """Write what an earlier failed write left, then ``data``; on a failure keep exactly the bytes
        that did not reach the file (see the class docstring). One writer at a time: the calling
        thread writes only when the writer thread has no batch left."""
        data = self._unwritten + data if self._unwritten else data
        view = memoryview(data)
        done = 0
        try:
            while done < len(data):
                done += self._file.write(view[done:]) or 0  # a raw file may take part of it
        finally:
            self._unwritten = data[done:]

    def _drain(self, q: queue.Queue[bytes | None]) -> None:
        while True:
            data = q.get()
            try:
                if data is None:
                    return
                self._write_all(data)
            except BaseException as exc:  # kept for the next write (see _write_all): raised once
                with self._lock:
                    self._error = self._error or exc
            finally:
                q.task_done()

    def _raise(self) -> None:
        """The writer thread's first failure since the last one raised, raised once (a new exception
        each time: the same one raised again would grow its traceback)."""
        with self._lock:
            error, self._error = self._error, None
        if error is not None:
            raise OSError(f"writing {self.path.name} failed: {type(error).__name__}: {error}") from error

    def close(self) -> None:
        if self._file.closed:
            return
        try:
            self.flush()
        finally:
            if self._thread is not None:  # started with its queue
                assert self._queue is not None
                self._queue.put(None)
                self._thread.join()
            self._file.close()
        self._raise()


_BACKGROUND_BYTES = 256 << 10  # a flush this large is written by the writer thread (see _EventFile)
_QUEUED = 4  # batches waiting for the writer thread at most

_MAX_ENCODINGS = 256  # frames of ever new key sets are encoded value by value


class _Encoding:
    """The ``Summary`` bytes of frames with one set of keys, in one order, as one ``struct`` format.

    A scalar value is a tiny fixed protobuf (``0a <len> 0a <len> <tag> 15 <float32>``): everything
    up to the float is the tag's constant prefix. A label's text value is constant bytes per (key,
    label) once its tag is described. So a frame is its numbers packed between constant byte strings:
    one ``Struct.pack`` per frame, with one format per combination of labels (``formats``). The
    bytes are those of the value-by-value encoding, which any frame falls back to: when a tag is new,
    a label's text is not built yet, a number is beyond float32 (warned and stored as inf there) or
    a value changes type.
    """

    def __init__(self, names: tuple[str, ...], prefixes: tuple[bytes, ...],
                 numbers: Callable[[Any], tuple[Any, ...]], texts: tuple[tuple[str, int, int], ...]) -> None:
        self.names = names
        self.prefixes = prefixes  # per number, its tag's prefix
        self.numbers = numbers  # the numbers of a frame's values
        self.texts = texts  # (key, position among the values, index of the number it precedes)
        self.count = len(prefixes)
        at = [i for _, i, _ in texts]
        self.labels: Callable[[Any], tuple[Any, ...]] = (
            operator.itemgetter(*at) if len(at) > 1 else (lambda values: (values[at[0]],)) if at else (lambda values: ()))
        self.formats: dict[tuple[Any, ...], tuple[struct.Struct, list[Any]]] = {}

    @classmethod
    def of(cls, names: tuple[str, ...], metrics: Mapping[str, Scalar], prefixes: Mapping[str, bytes]
           ) -> _Encoding | None:
        """The encoding of frames with ``metrics``' keys, or None when a key has no prefix yet."""
        numbers: list[int] = []
        tags: list[bytes] = []
        labels: list[tuple[str, int, int]] = []
        for i, (key, value) in enumerate(metrics.items()):
            if isinstance(value, str):
                labels.append((key, i, len(numbers)))
                continue
            prefix = prefixes.get(key)
            if prefix is None:
                return None
            numbers.append(i)
            tags.append(prefix)
        getter: Callable[[Any], tuple[Any, ...]]
        if len(numbers) == 1:
            only = numbers[0]
            getter = lambda values: (values[only],)  # noqa: E731
        else:
            getter = operator.itemgetter(*numbers) if numbers else (lambda values: ())
        return cls(names, tuple(tags), getter, tuple(labels))

    def encode(self, values: tuple[Scalar, ...], texts: Mapping[tuple[str, str], bytes]) -> bytes | None:
        """The frame's bytes, or None when it does not fit this encoding (see the class docstring)."""
        labels = self.labels(values) if self.texts else ()
        compiled = self.formats.get(labels)
        if compiled is None:
            compiled = self._compile(labels, texts)
            if compiled is None:
                return None
        layout, args = compiled
        args[1 : 2 * self.count : 2] = self.numbers(values)
        try:
            data: bytes = layout.pack(*args)
        except (struct.error, OverflowError):
            return None
        return data

    def _compile(self, labels: tuple[Any, ...], texts: Mapping[tuple[str, str], bytes]
                 ) -> tuple[struct.Struct, list[Any]] | None:
        before: dict[int, list[bytes]] = {}
        for (key, _, at), label in zip(self.texts, labels):
            text = texts.get((key, label)) if isinstance(label, str) else None
            if text is None:
                return None
            before.setdefault(at, []).append(text)
        pieces = [b"".join(before.get(j, ())) + prefix for j, prefix in enumerate(self.prefixes)]
        tail = b"".join(before.get(self.count, ()))
        fmt = "<" + "".join(f"{len(p)}sf" for p in pieces) + (f"{len(tail)}s" if tail else "")
        args: list[Any] = [x for p in pieces for x in (p, 0.0)] + ([tail] if tail else [])
        if len(self.formats) < _MAX_ENCODINGS:
            self.formats[labels] = (struct.Struct(fmt), args)
        return struct.Struct(fmt), args
