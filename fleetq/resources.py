"""Exact resource arithmetic shared by quota, placement and the emulator.

Kubernetes quantities (``10m``, ``2Gi``, ``999900``) are parsed with
``kubernetes.utils.parse_quantity`` (exact ``Decimal``) and then held as integers in
*milli-units* (1 cpu = 1000, 1 byte = 1000, 1 job = 1000), which is exact for every
quantity Kubernetes accepts for requests and cheap to add and compare in hot loops.
A ``Resources`` mapping is a plain ``dict[str, int]``: absent means zero.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from kubernetes.utils import parse_quantity

Resources = dict[str, int]

CPU = "cpu"
MEMORY = "memory"
GPU = "nvidia.com/gpu"
MAX_JOBS = "kube-queue/max-jobs"
PODS = "pods"

MILLI = 1000
#: Largest quantity we accept (in canonical units); guards against absurd inputs such
#: as 1e400 that would otherwise become huge integers.
MAX_QUANTITY = Decimal(10) ** 21


class QuantityError(ValueError):
    """A value that is not a valid, non-negative Kubernetes quantity."""


def parse_milli(value: Any) -> int:
    """Parse one quantity (``"2Gi"``, ``3``, ``"10m"``) into milli-units, rounding up
    to the next milli-unit like Kubernetes does for cpu. Rejects negatives, NaN,
    booleans and non-scalars with a :class:`QuantityError` whose message quotes the value."""
    if isinstance(value, bool) or value is None or isinstance(value, (dict, list)):
        raise QuantityError(f"{value!r} is not a quantity")
    try:
        q = parse_quantity(value)
    except (ValueError, TypeError, InvalidOperation, OverflowError) as exc:
        raise QuantityError(f"{str(value)[:64]!r} is not a quantity") from exc
    if not q.is_finite():
        raise QuantityError(f"{str(value)[:64]!r} is not a finite quantity")
    if q < 0:
        raise QuantityError(f"{str(value)[:64]!r} must not be negative")
    if q > MAX_QUANTITY:
        raise QuantityError(f"{str(value)[:64]!r} is too large")
    milli = q * MILLI
    whole = int(milli)
    return whole if milli == whole else whole + 1


def parse_resources(mapping: Mapping[str, Any] | None) -> Resources:
    """Parse a ``{name: quantity}`` mapping; the error names the offending key."""
    out: Resources = {}
    for name, value in (mapping or {}).items():
        try:
            out[str(name)] = parse_milli(value)
        except QuantityError as exc:
            raise QuantityError(f"{name}: {exc}") from None
    return out


def add(a: Mapping[str, int], b: Mapping[str, int]) -> Resources:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out


def sub(a: Mapping[str, int], b: Mapping[str, int]) -> Resources:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) - v
    return out


def add_into(acc: Resources, b: Mapping[str, int], sign: int = 1) -> None:
    """In-place ``acc += sign * b`` (drops keys that fall to zero)."""
    for k, v in b.items():
        n = acc.get(k, 0) + sign * v
        if n:
            acc[k] = n
        else:
            acc.pop(k, None)


def scale(a: Mapping[str, int], factor: int) -> Resources:
    return {k: v * factor for k, v in a.items()}


def maximum(items: Iterable[Mapping[str, int]]) -> Resources:
    out: Resources = {}
    for r in items:
        for k, v in r.items():
            if v > out.get(k, 0):
                out[k] = v
    return out


def shortfalls(request: Mapping[str, int], free: Mapping[str, int]) -> list[str]:
    """Names of resources where ``request`` exceeds ``free`` (absent in free = 0)."""
    return [k for k, v in request.items() if v > 0 and v > free.get(k, 0)]


def fits(request: Mapping[str, int], free: Mapping[str, int]) -> bool:
    return all(v <= 0 or v <= free.get(k, 0) for k, v in request.items())


def within_max(request: Mapping[str, int], usage: Mapping[str, int],
               limit: Mapping[str, int]) -> bool:
    """Whether ``usage + request`` stays within ``limit`` for every positive request
    (a resource ``limit`` does not name is unbounded), as a quota node's ``max``."""
    for k, v in request.items():
        if v > 0:
            m = limit.get(k)
            if m is not None and usage.get(k, 0) + v > m:
                return False
    return True


def format_quantity(name: str, milli: int) -> str:
    """Human form of one quantity: cpu as cores (``1.5``, ``10m``), memory-like as binary
    units where exact (``4Gi``), everything else as a plain number."""
    if milli % MILLI:
        if name == CPU:
            return f"{milli}m" if milli < MILLI else _trim(Decimal(milli) / MILLI)
        return _trim(Decimal(milli) / MILLI)
    whole = milli // MILLI
    if name == MEMORY or name.endswith("storage"):
        for suffix, factor in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
            if whole and whole % factor == 0:
                return f"{whole // factor}{suffix}"
    return str(whole)


def _trim(d: Decimal) -> str:
    s = format(d.normalize(), "f")
    return s


def format_resources(r: Mapping[str, int]) -> str:
    """``cpu 4.01, memory 4Gi`` in a stable order (cpu, memory, gpu, the rest)."""
    order = {CPU: 0, MEMORY: 1, GPU: 2}
    keys = sorted((k for k, v in r.items() if v), key=lambda k: (order.get(k, 3), k))
    return ", ".join(f"{k} {format_quantity(k, r[k])}" for k in keys)


def to_quantity_map(r: Mapping[str, int]) -> dict[str, str]:
    """Back to Kubernetes quantity strings (for manifests we write)."""
    return {k: format_quantity(k, v) for k, v in r.items()}
