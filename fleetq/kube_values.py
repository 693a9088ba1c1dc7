"""Kubernetes' value formats, parsed once for the adapter, the emulator, the control-plane
lifecycle and the CLI: RFC 3339 timestamps and Go ``time.Duration`` text (a
Reservation's ``spec.ttl``). Each had its own hand copy, with different rules.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

# Go's time.ParseDuration: optionally signed, a sequence of decimal numbers each with a
# unit ("300ms", "-1.5h", "2h45m", ".5s"); "0" alone needs no unit.
_DURATION_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0,
         "h": 3600.0}


def parse_go_duration(text: str) -> float:
    """Go duration text -> seconds, as ``time.ParseDuration`` reads it; ValueError
    (one line) otherwise."""
    s = str(text).strip()
    sign = -1.0 if s.startswith("-") else 1.0
    body = s[1:] if s[:1] in "+-" else s
    if body == "0":
        return 0.0
    pos, total = 0, 0.0
    for m in _DURATION_PART.finditer(body):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT[m.group(2)]
        pos = m.end()
    if not body or pos != len(body):
        raise ValueError(f"{str(text)[:32]!r} is not a duration (like 10m, 1h30m, 30s)")
    return sign * total


def go_duration_or_none(value: Any) -> float | None:
    """:func:`parse_go_duration` for a field read off an object: None when absent or not
    a duration."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return parse_go_duration(value)
    except ValueError:
        return None


def parse_rfc3339(value: Any) -> datetime | None:
    """An RFC 3339 timestamp (``2026-11-30T14:26:20Z``) or a datetime -> an aware
    datetime (UTC when it names no zone); None when absent or not a timestamp."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def format_go_duration(seconds: int) -> str:
    """Whole seconds as the shortest Go duration text (``2h``, ``10m``, ``45s``)."""
    if seconds % 3600 == 0:
        return f"{seconds // 3600}h"
    if seconds % 60 == 0:
        return f"{seconds // 60}m"
    return f"{seconds}s"


def human_duration(seconds: float) -> str:
    """kubectl's ``duration.HumanDuration``: 45s, 3m44s, 15m, 5h2m, 15d, 2y10d."""
    s = int(max(seconds, 0))
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return _two_units(minutes, "m", s % 60, "s")
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return _two_units(hours, "h", minutes % 60, "m")
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return _two_units(hours // 24, "d", hours % 24, "h")
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    years, days = hours // (24 * 365), (hours // 24) % 365
    if hours < 24 * 365 * 8:
        return _two_units(years, "y", days, "d")
    return f"{years}y"


def _two_units(whole: int, unit: str, rest: int, rest_unit: str) -> str:
    """``5h2m``, or ``5h`` when nothing is left over."""
    return f"{whole}{unit}" if rest == 0 else f"{whole}{unit}{rest}{rest_unit}"
