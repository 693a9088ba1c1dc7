"""Polling a synchronous check until it holds, for tests against members, emulators and
control planes that act asynchronously."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def eventually(check: Callable[[], Any], timeout_s: float = 10.0, step_s: float = 0.05) -> Any:
    """Poll ``check`` until it returns something truthy; fail with its last value."""
    deadline = time.monotonic() + timeout_s
    value = check()
    while not value and time.monotonic() < deadline:
        time.sleep(step_s)
        value = check()
    assert value, f"condition not met within {timeout_s}s (last value {value!r})"
    return value
