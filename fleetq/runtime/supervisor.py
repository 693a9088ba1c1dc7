"""The one supervisor of child processes: start a program logging to a file, wait until
it is ready, stop it with SIGTERM and a deadline then SIGKILL, and read the end of its
log for an error line.

``fleetq up``/``demo`` (:mod:`fleetq.runtime.embedded`), the real control planes and the
crash-matrix benchmark all run their pieces through it. Each child runs in its own
session (a Ctrl-C in the terminal reaches only us; we stop the children in order) and,
on Linux, gets a signal when this process dies, even by SIGKILL, so nothing outlives
its parent.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import os
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path


class ProcessError(RuntimeError):
    """A child exited early or did not become ready in time; the message is one line."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_in_use(host: str, port: int) -> bool:
    """Whether something accepts connections on ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.3)
        return s.connect_ex((host, port)) == 0


def _die_with_parent(sig: int = signal.SIGTERM) -> None:  # pragma: no cover - in the child
    """Linux: deliver ``sig`` to the child when this process dies (even by SIGKILL)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, sig)  # PR_SET_PDEATHSIG


@dataclass
class Child:
    """One running child process and the file its stdout and stderr go to."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, lines: int = 5) -> str:
        """The last ``lines`` lines of its log, joined with `` | `` (empty if none)."""
        try:
            text = self.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(line.strip() for line in text[-lines:])

    def _check(self, what: str, deadline: float, error: type[Exception]) -> None:
        if not self.alive():
            raise error(f"{what} exited with code {self.proc.returncode}: "
                        f"{self.tail() or 'no output'} (log: {self.log})")
        if time.monotonic() > deadline:
            raise error(f"{what} did not become ready in time (log: {self.log})")

    def wait_ready(self, ready: Callable[[], bool], deadline: float, *, what: str = "",
                   error: type[Exception] = ProcessError, poll: float = 0.1) -> None:
        """Return once ``ready()`` is true; ``error`` (one line, with the end of the log)
        when the child exits first or ``deadline`` (``time.monotonic()``) passes."""
        while not ready():
            self._check(what or self.name, deadline, error)
            time.sleep(poll)

    async def wait_ready_async(self, ready: Callable[[], Awaitable[bool]], deadline: float,
                               *, what: str = "", error: type[Exception] = ProcessError,
                               poll: float = 0.2) -> None:
        """:meth:`wait_ready` for a coroutine check (an exception from it counts as not
        ready yet)."""
        while True:
            try:
                if await ready():
                    return
            except Exception:
                pass
            self._check(what or self.name, deadline, error)
            await asyncio.sleep(poll)

    def stop(self, grace: float = 10.0, sig: int = signal.SIGTERM) -> None:
        """Send ``sig`` (SIGTERM: a graceful stop), then SIGKILL after ``grace`` seconds."""
        if not self.alive():
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(sig)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            self.proc.wait(5)


def spawn_child(name: str, argv: list[str], log_dir: Path,
                env: dict[str, str] | None = None,
                death_signal: int = signal.SIGTERM, *, log: Path | None = None,
                cwd: Path | None = None) -> Child:
    """Start ``argv`` in its own session, appending its output to ``log`` (default
    ``<log_dir>/<name>.log``), with the environment plus ``env``; on Linux it gets
    ``death_signal`` when this process dies."""
    path = log or log_dir / f"{name}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as fh:  # the child has its own copy of the descriptor
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})}, cwd=cwd, start_new_session=True,
            preexec_fn=(functools.partial(_die_with_parent, death_signal)
                        if sys.platform.startswith("linux") else None),
        )
    return Child(name, proc, path)


@dataclass
class RestartBudget:
    """At most ``limit`` restarts within any ``window`` seconds: a child that keeps dying
    is a fault to report, not to hide behind restarts."""

    limit: int = 5
    window: float = 600.0
    _times: deque[float] = field(default_factory=deque)

    def take(self, now: float | None = None) -> bool:
        """Record one restart at ``now`` (``time.monotonic()``) if the budget allows it;
        False (nothing recorded) when ``limit`` restarts already fell within the window."""
        t = time.monotonic() if now is None else now
        while self._times and t - self._times[0] >= self.window:
            self._times.popleft()
        if len(self._times) >= self.limit:
            return False
        self._times.append(t)
        return True

    @property
    def used(self) -> int:
        """Restarts within the window as of the last :meth:`take`."""
        return len(self._times)


def stop_child(child: Child, grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds."""
    child.stop(grace)
