"""What ``fleetq controlplane`` and ``fleetq temporal-cluster`` share: both build Go
binaries into a cache (reused when warm) and run servers in the foreground until
SIGINT/SIGTERM, saying progress on stderr and failing with one ``error:`` line.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import Annotated, TypeVar

import typer

from fleetq.cli.output import fail, say
from fleetq.gobuild import BuildError, Progress

T = TypeVar("T")

#: a build command's ``--force``
Force = Annotated[bool, typer.Option(help="Rebuild even if the cache is warm")]


def build_or_reuse(cached: Callable[[], T | None], build: Callable[..., T],
                   force: bool) -> tuple[T, str]:
    """The warm build (unless ``force``) or a fresh one, and how it came: ``cached`` or
    ``built in Ns``. A build error fails the command."""
    warm = None if force else cached()
    start = time.monotonic()
    progress: Progress = say
    try:
        done = warm or build(force=force, progress=progress)
    except BuildError as exc:
        raise fail(str(exc)) from None
    return done, "cached" if warm else f"built in {time.monotonic() - start:.0f}s"


def stop_on_signals() -> threading.Event:
    """An event SIGINT and SIGTERM set, for a foreground loop to wait on."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop
