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

    One stacked copy per device for the whole window. A tensor with more than one element is left
    in place as a :class:`BadValue` so the caller reports it against its key.
    """
    out = [dict(chunk) for chunk in chunks]
    pending: dict[Any, list[tuple[dict[str, Any], str, Any]]] = {}
    for chunk in out:
        for key, value in chunk.items():
            if is_tensor(value):
                if value.numel() != 1:
                    chunk[key] = BadValue(
                        f"a tensor of shape {tuple(value.shape)}; fix: reduce it to one element first"
                    )
                    continue
                if value.dtype.is_complex:  # the float64 copy would drop the imaginary part
                    chunk[key] = BadValue(f"a complex tensor ({value.dtype}); fix: pass a real number")
                    continue
                pending.setdefault(value.device, []).append((chunk, key, value))
    if not pending:
        return out
    import torch

    for items in pending.values():
        stacked = torch.stack([t.detach().reshape(()).to(torch.float64) for _, _, t in items])
        for (chunk, key, tensor), number in zip(items, stacked.cpu().tolist()):
            if tensor.dtype == torch.bool:
                chunk[key] = bool(number)
            elif not tensor.dtype.is_floating_point:
                chunk[key] = int(number)
            else:
                chunk[key] = number
    return out
