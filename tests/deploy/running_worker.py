"""``run_worker`` (what ``fleetq worker …`` runs) in a thread with its own event loop,
stopped as SIGTERM would stop it: the deploy tests' worker under test."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleetq.runtime.worker_health import WorkerHealth
from worker import run_worker


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:  # not listening yet
        return 0, str(exc)


async def poll(check: Callable[[], tuple[bool, str]], what: str, timeout: float) -> str:
    """Poll the (blocking) ``check`` until it says ok; its detail, or AssertionError."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        ok, last = await asyncio.to_thread(check)
        if ok:
            return last
        await asyncio.sleep(0.2)
    raise AssertionError(f"not within {timeout}s: {what} (last: {last})")


@dataclass
class RunningWorker:
    kwargs: dict[str, Any]
    health: WorkerHealth = field(default_factory=WorkerHealth)
    health_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    _box: dict[str, Any] = field(default_factory=dict)
    _thread: threading.Thread | None = None

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.health_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def start(self) -> RunningWorker:
        started = threading.Event()

        def main() -> None:
            async def go() -> None:
                self._box["loop"] = asyncio.get_running_loop()
                self._box["stop"] = asyncio.Event()
                started.set()
                await run_worker(health_port=self.health_port, health=self.health,
                                 prometheus_port=self.metrics_port, stop=self._box["stop"],
                                 **self.kwargs)

            try:
                asyncio.run(go())
            except BaseException as exc:  # surfaced by stop()
                self._box["error"] = exc
            finally:
                started.set()

        self._thread = threading.Thread(target=main, name="worker-under-test", daemon=True)
        self._thread.start()
        assert started.wait(30)
        return self

    def stop(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            loop = self._box.get("loop")
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(self._box["stop"].set)
            self._thread.join(60)
        assert "error" not in self._box, self._box.get("error")

    async def ready(self, timeout: float = 60) -> str:
        url = self.health_url + "/readyz?verbose"
        return await poll(lambda: (get(url)[0] == 200, get(url)[1]), "worker ready", timeout)
