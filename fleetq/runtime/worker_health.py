"""The worker's health endpoints: ``/readyz`` and ``/livez`` on a small HTTP server in a
thread of its own (so it answers even when the worker's event loops do not).

* **Readiness** is a set of named checks the worker sets once true (it polls the jobs'
  task queue, it polls the control task queue, its member caches are warm) and clears
  when it starts shutting down. Ready = every registered check is true.
* **Liveness** is heartbeats: a task on each event loop stamps the time every
  ``beat_seconds``; the HTTP thread fails ``/livez`` when any loop has not stamped for
  ``stall_seconds`` (a blocked loop: a synchronous call in a coroutine, a deadlock).

Both answer ``200 ok`` or ``503`` with one line per failing check, and a JSON body
with ``?verbose`` (``{"ok": bool, "checks": {name: detail}}``).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable

from fleetq.runtime.http_thread import QuietHandler, ServerThread

READY_PATH = "/readyz"
LIVE_PATH = "/livez"
#: a loop that has not beaten for this long fails liveness
DEFAULT_STALL_SECONDS = 30.0


class WorkerHealth:
    """Thread-safe health state shared by the worker's loops and the HTTP thread."""

    def __init__(self, *, stall_seconds: float = DEFAULT_STALL_SECONDS,
                 beat_seconds: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stall_seconds = stall_seconds
        self.beat_seconds = beat_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._checks: dict[str, tuple[bool, str]] = {}
        self._beats: dict[str, float] = {}
        self._stopping = False

    # ---------------------------------------------------------------- readiness
    def require(self, *names: str) -> None:
        """Register readiness checks, initially failing."""
        with self._lock:
            for n in names:
                self._checks.setdefault(n, (False, "not yet"))

    def set(self, name: str, ok: bool, detail: str = "") -> None:
        with self._lock:
            self._checks[name] = (ok, detail or ("ok" if ok else "failing"))

    def stopping(self) -> None:
        """Shutdown began: not ready any more (liveness is unaffected)."""
        with self._lock:
            self._stopping = True

    def readiness(self) -> tuple[bool, dict[str, str]]:
        with self._lock:
            checks = {n: ("ok" if ok else f"failing: {d}") for n, (ok, d) in self._checks.items()}
            ok = bool(self._checks) and all(v[0] for v in self._checks.values())
            if self._stopping:
                checks["shutdown"] = "failing: shutting down"
                ok = False
        return ok, checks

    # ---------------------------------------------------------------- liveness
    def beat(self, loop: str) -> None:
        with self._lock:
            self._beats[loop] = self._clock()

    async def heartbeat(self, loop: str) -> None:
        """Stamp ``loop``'s heartbeat every ``beat_seconds`` until cancelled; run it as a
        task on the loop to watch."""
        while True:
            self.beat(loop)
            await asyncio.sleep(self.beat_seconds)

    def forget(self, loop: str) -> None:
        with self._lock:
            self._beats.pop(loop, None)

    def liveness(self) -> tuple[bool, dict[str, str]]:
        now = self._clock()
        with self._lock:
            ages = {n: now - t for n, t in self._beats.items()}
        checks = {
            f"loop:{n}": (f"ok ({age:.1f}s ago)" if age <= self.stall_seconds
                          else f"failing: event loop stuck for {age:.1f}s")
            for n, age in ages.items()
        }
        ok = bool(ages) and all(a <= self.stall_seconds for a in ages.values())
        if not ages:
            checks["loops"] = "failing: no event loop heartbeat yet"
        return ok, checks


class _Handler(QuietHandler):
    health: WorkerHealth

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        path, _, query = self.path.partition("?")
        if path == READY_PATH:
            ok, checks = self.health.readiness()
        elif path == LIVE_PATH:
            ok, checks = self.health.liveness()
        else:
            self.reply(404, "not found\n", "text/plain")
            return
        if "verbose" in query:
            self.reply(200 if ok else 503, json.dumps({"ok": ok, "checks": checks}) + "\n",
                       "application/json")
            return
        lines = [f"{n}: {d}" for n, d in sorted(checks.items()) if not d.startswith("ok")]
        self.reply(200 if ok else 503, "ok\n" if ok else "\n".join(lines) + "\n",
                   "text/plain")


class HealthServer(ServerThread):
    """``/readyz`` and ``/livez`` of ``health`` on ``host:port`` (port 0: any free one),
    served from a daemon thread."""

    def __init__(self, health: WorkerHealth, port: int, host: str = "127.0.0.1") -> None:
        handler = type("Handler", (_Handler,), {"health": health})
        super().__init__(handler, port, host, "fleetq-health")

    def __enter__(self) -> HealthServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
