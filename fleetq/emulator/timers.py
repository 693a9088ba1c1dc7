"""The timers of one emulated cluster's controllers (pod start and finish, reservation
expiry, job TTL), on the asyncio loop, cancelled together when the cluster stops."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


class Timers:
    """``call_later`` handles still pending, so :meth:`cancel_all` can stop them."""

    def __init__(self) -> None:
        self._handles: set[asyncio.TimerHandle] = set()

    def later(self, delay: float, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` after ``delay`` seconds (now when negative)."""
        loop = asyncio.get_running_loop()
        handle: asyncio.TimerHandle

        def fire() -> None:
            self._handles.discard(handle)
            fn(*args)

        handle = loop.call_later(max(0.0, delay), fire)
        self._handles.add(handle)

    def cancel_all(self) -> None:
        for t in self._handles:
            t.cancel()
        self._handles.clear()
