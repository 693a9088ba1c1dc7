"""Exact resource arithmetic shared by quota, placement and the emulator.

Kubernetes quantities (``10m``, ``2Gi``, ``999900``) are parsed by :func:`parse_quantity`,
which follows apimachinery's ``resource.ParseQuantity`` (pkg/api/resource/quantity.go and
suffix.go), and then held as integers in *milli-units* (1 cpu = 1000, 1 byte = 1000,
1 job = 1000), which is exact for every quantity Kubernetes accepts for requests and
cheap to add and compare in hot loops. A ``Resources`` mapping is a plain
``dict[str, int]``: absent means zero. The parser is our own (not
``kubernetes.utils.parse_quantity``) so that reading a quantity does not import the
whole kubernetes client: ``fleetq get`` and ``fleetq validate`` load this module.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

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
MAX_QUANTITY_INT = 10**21
_MAX_DIGITS = 22  # digits of MAX_QUANTITY_INT


class QuantityError(ValueError):
    """A value that is not a valid, non-negative Kubernetes quantity."""


#: apimachinery's suffix.go: decimalSI suffixes (base 10) and their exponents
DECIMAL_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12,
                    "P": 15, "E": 18}
#: binarySI suffixes (base 2) and their exponents
BINARY_SUFFIXES = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
#: the characters quantity.go's scanner takes as the start of a suffix
_SUFFIX_CHARS = frozenset("eEinumkKMGTP")
#: quantity.go caps a binarySI quantity, silently, at 2^63-1 ("8Ei" parses as 2^63-1)
MAX_BINARY = (1 << 63) - 1
_DIGITS = frozenset("0123456789")


@dataclass(frozen=True)
class Quantity:
    """A parsed quantity, exactly: ``sign * mantissa * 10**exp10 * 2**exp2``."""

    negative: bool
    mantissa: int
    exp10: int
    exp2: int = 0

    def ceil_scaled(self, factor: int) -> int:
        """``ceil(self * factor)`` (``factor`` > 0), exact; callers bound the size first."""
        num = self.mantissa * factor << self.exp2
        # (a negative exp10: the ceiling of a non-negative fraction)
        value = num * 10**self.exp10 if self.exp10 >= 0 else -((-num) // 10**-self.exp10)
        return -value if self.negative else value


def _scan(text: str) -> tuple[bool, str, str, str] | None:
    """quantity.go's ``parseQuantityString``: (positive, integer digits, fraction digits,
    suffix), or None when the text is not ``<signedNumber><suffix>`` at all. As upstream,
    a lone sign or ``.`` is zero, and ``1.`` and ``.5`` are numbers."""
    pos, end = 0, len(text)
    positive = True
    if pos < end and text[0] in "+-":
        positive = text[0] == "+"
        pos += 1
    start = pos
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    num = text[start:pos].lstrip("0") or "0"
    denom = ""
    if pos < end and text[pos] == ".":
        pos += 1
        start = pos
        while pos < end and text[pos] in _DIGITS:
            pos += 1
        denom = text[start:pos]
    suffix_start = pos
    while pos < end and text[pos] in _SUFFIX_CHARS:
        pos += 1
    if pos < end and text[pos] in "+-":
        pos += 1
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    if pos < end:  # a character that is neither number, suffix nor exponent
        return None
    return positive, num, denom, text[suffix_start:]


def _exponent(suffix: str) -> tuple[int, int] | None:
    """suffix.go's ``interpret``: (exponent of 10, exponent of 2), or None for an unknown
    suffix. ``e``/``E`` followed by a signed integer is a decimal exponent (``1e3``,
    ``5E-2``); a lone ``E`` is exa."""
    if suffix in DECIMAL_SUFFIXES:
        return DECIMAL_SUFFIXES[suffix], 0
    if suffix in BINARY_SUFFIXES:
        return 0, BINARY_SUFFIXES[suffix]
    if len(suffix) > 1 and suffix[0] in "eE":  # strconv.ParseInt(suffix[1:], 10, 64)
        rest = suffix[1:]
        digits = rest[1:] if rest[0] in "+-" else rest
        if not digits or not set(digits) <= _DIGITS:
            return None
        value = -int(digits) if rest[0] == "-" else int(digits)
        if not -(1 << 63) <= value < 1 << 63:
            return None
        return value, 0
    return None


def parse_quantity(text: str) -> Quantity:
    """Parse a Kubernetes quantity string exactly, by apimachinery's rules
    (``<signedNumber><suffix>``, suffix one of ``n u m k M G T P E``, ``Ki`` ... ``Ei``,
    or ``e``/``E`` and a signed integer; no spaces, no ``K``, no ``inf``); binarySI
    values are capped at 2^63-1 as upstream caps them. :class:`ValueError` otherwise.

    Unlike upstream it keeps every digit (upstream rounds to nano, away from zero, which
    :func:`parse_milli`'s rounding up to milli makes no difference to) and an exponent
    outside int32 is not truncated (upstream's ``int32(parsed)`` makes ``1e4294967296``
    one)."""
    if not text:
        raise ValueError("empty quantity")
    scanned = _scan(text)
    if scanned is None:
        raise ValueError(f"{text!r}: quantities must match <signedNumber><suffix>")
    positive, num, denom, suffix = scanned
    exponent = _exponent(suffix)
    if exponent is None:
        raise ValueError(f"{text!r}: unable to parse quantity's suffix")
    exp10, exp2 = exponent
    q = Quantity(not positive, int(num + denom), exp10 - len(denom), exp2)
    if q.mantissa == 0:
        return Quantity(False, 0, 0)
    if exp2 and not q.negative and q.ceil_scaled(1) > MAX_BINARY:
        return Quantity(False, MAX_BINARY, 0)
    return q


def _quantity_text(value: Any) -> str:
    """The text Kubernetes parses for a manifest value: a YAML/JSON number reaches the
    API server as its literal (``0.1``, not the binary float nearest to it), which
    ``repr`` gives back for a float."""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float, Decimal)):
        return repr(value) if isinstance(value, float) else str(value)
    raise TypeError(type(value).__name__)


def parse_milli(value: Any) -> int:
    """Parse one quantity (``"2Gi"``, ``3``, ``"10m"``) into milli-units, rounding up
    to the next milli-unit like Kubernetes does for cpu. Rejects negatives, NaN,
    booleans and non-scalars with a :class:`QuantityError` whose message quotes the value."""
    if isinstance(value, bool) or value is None or isinstance(value, (dict, list)):
        raise QuantityError(f"{value!r} is not a quantity")
    if (isinstance(value, float) and not math.isfinite(value)) or (
            isinstance(value, Decimal) and not value.is_finite()):
        raise QuantityError(f"{str(value)[:64]!r} is not a finite quantity")
    try:
        q = parse_quantity(_quantity_text(value))
    except (ValueError, TypeError) as exc:
        raise QuantityError(f"{str(value)[:64]!r} is not a quantity") from exc
    if q.negative:
        raise QuantityError(f"{str(value)[:64]!r} must not be negative")
    # digits before the point, roughly: beyond MAX_QUANTITY's, it is too large
    magnitude = len(str(q.mantissa)) + q.exp10 + (q.exp2 * 3 + 9) // 10
    if q.mantissa == 0:
        return 0
    if magnitude < -6:  # below a milli-unit by far: one milli-unit (rounded up)
        return 1
    if magnitude > _MAX_DIGITS + 1 or q.ceil_scaled(1) > MAX_QUANTITY_INT:
        raise QuantityError(f"{str(value)[:64]!r} is too large")
    return q.ceil_scaled(MILLI)


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
