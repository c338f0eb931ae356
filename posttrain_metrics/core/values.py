"""Turning what producers hand us (Python, numpy and torch scalars) into plain Python values.

Torch tensors are never read one by one: :func:`materialize` copies every tensor of a window to the
host in one stacked copy per device, so a step costs one device-to-host transfer, not one ``.item()``
per key.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["MAX_EXACT_INT", "BadValue", "Scalar", "is_tensor", "materialize", "to_scalar"]

Scalar = float | int | bool | str
MAX_EXACT_INT = 2**53
_PLAIN = frozenset({float, int, bool, str})  # never a tensor: no module name to look at
"""The largest integer a float64 buffer (and so a collective) carries exactly."""


class BadValue(Exception):
    """A value that cannot be a metric; the text says why (wrapped into a MetricsError upstream)."""


def is_tensor(value: object) -> bool:
    """A torch tensor, recognised without importing torch."""
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


def to_scalar(value: object) -> Scalar:
    """A plain ``bool``, ``int``, ``float`` or ``str`` for ``value``, or :class:`BadValue`."""
    if isinstance(value, (bool, str, float)):
        return value
    if isinstance(value, int):
        if abs(value) > MAX_EXACT_INT:
            raise BadValue(
                f"integer {value} exceeds 2**53, beyond which a float64 reduction is not exact; "
                "fix: report it as a float or in larger units"
            )
        return value
    if type(value).__module__ == "numpy" and hasattr(value, "item"):
        size = getattr(value, "size", 1)
        if size != 1:
            raise BadValue(f"a numpy array of shape {getattr(value, 'shape', '?')}; fix: pass a scalar")
        item = value.item()  # type: ignore[attr-defined]
        if type(item).__module__ == "numpy":  # longdouble has no Python twin: item() returns itself
            if not isinstance(item, numbers.Real):
                raise BadValue(f"numpy {type(item).__name__} {item!r:.80}; fix: pass a real number")
            item = float(item)
        return to_scalar(item)
    if is_tensor(value):
        raise BadValue("an unmaterialised tensor")  # materialize() runs first; never reached
    if isinstance(value, numbers.Real):
        try:
            return float(value)
        except (OverflowError, ValueError, TypeError) as exc:
            raise BadValue(
                f"{type(value).__name__} {value!r:.80} has no float value ({exc}); fix: pass a float"
            ) from None
    raise BadValue(
        f"{type(value).__name__} {value!r:.80}; fix: pass a number (Python, numpy or a one-element "
        "torch tensor), or a label string for a categorical key"
    )


def materialize(chunks: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Copies of ``chunks`` with every torch tensor replaced by its Python value.

    One stacked copy per device for the whole window. A tensor that cannot be a metric (more than
    one element, complex) or cannot be read at all (a meta, sparse or quantized tensor, or any error
    while copying it) is left in place as a :class:`BadValue` naming the cause, so the caller
    reports it against its key and the rank still joins the step's collectives. Never raises for
    what a tensor holds. Anything that is not a mapping (a refused chunk) is passed through as is.
    """
    out: list[Any] = [dict(chunk) if isinstance(chunk, Mapping) else chunk for chunk in chunks]
    pending: dict[Any, list[tuple[dict[str, Any], str, Any]]] = {}
    for chunk in out:
        if not isinstance(chunk, dict):
            continue
        for key, value in chunk.items():
            if type(value) in _PLAIN or not is_tensor(value):
                continue
            try:
                problem = _tensor_problem(value)
                if problem is None:
                    pending.setdefault(value.device, []).append((chunk, key, value))
            except Exception as exc:  # a tensor that breaks on inspection is a producer bug too
                problem = f"a tensor that could not be inspected ({type(exc).__name__}: {exc})"
            if problem is not None:
                chunk[key] = BadValue(problem)
    if not pending:
        return out
    for items in pending.values():
        numbers_: list[float | BadValue]
        try:
            numbers_ = list(_copy_to_host([tensor for _, _, tensor in items]))
        except Exception:  # one unreadable tensor must not cost the others: read them one by one
            numbers_ = [_read_one(tensor) for _, _, tensor in items]
        for (chunk, key, tensor), number in zip(items, numbers_):
            chunk[key] = number if isinstance(number, BadValue) else _typed_item(tensor, number)
    return out


def _tensor_problem(value: Any) -> str | None:
    if value.numel() != 1:
        return f"a tensor of shape {tuple(value.shape)}; fix: reduce it to one element first"
    if value.dtype.is_complex:  # the float64 copy would drop the imaginary part
        return f"a complex tensor ({value.dtype}); fix: pass a real number"
    layout = str(getattr(value, "layout", "torch.strided"))
    if layout != "torch.strided":
        return f"a {layout} tensor; fix: pass a dense tensor (.to_dense()) or a Python number"
    if getattr(value, "is_quantized", False):
        return f"a quantized tensor ({value.dtype}); fix: pass value.dequantize() or a Python number"
    if getattr(value, "is_meta", False):
        return "a meta tensor, which holds no data; fix: report a tensor computed on a real device"
    return None


def _copy_to_host(tensors: list[Any]) -> list[float]:
    import torch

    stacked = torch.stack([t.detach().reshape(()).to(torch.float64) for t in tensors])
    return list(stacked.cpu().tolist())


def _read_one(tensor: Any) -> float | BadValue:
    try:
        return _copy_to_host([tensor])[0]
    except Exception as exc:
        return BadValue(
            f"a {tensor.dtype} tensor that could not be read ({type(exc).__name__}: {str(exc)[:200]}); "
            "fix: pass a readable tensor or a Python number"
        )


def _typed_item(tensor: Any, number: float) -> Scalar:
    import torch

    if tensor.dtype == torch.bool:
        return bool(number)
    if not tensor.dtype.is_floating_point:
        return int(number)
    return number
