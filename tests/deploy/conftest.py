"""Fixtures the deploy tests share: the emulated member clusters their worker processes
schedule onto."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fleetq.emulator.fleet import EmulatedFleet


@pytest.fixture(scope="module")
def members() -> Iterator[EmulatedFleet]:
    emulated = EmulatedFleet(start_delay=0.05).start()
    try:
        yield emulated
    finally:
        emulated.stop()
