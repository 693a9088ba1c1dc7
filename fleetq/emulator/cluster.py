"""One emulated member cluster: its store, controllers, faults and API listener.

The listener can be closed and reopened on the same port to simulate an unreachable
cluster: closing also drops every open connection (keep-alive and watches), so clients
see connection refused/reset rather than a slow answer.
"""

from __future__ import annotations

import secrets
import ssl

from aiohttp import web

from fleetq.emulator.api import build_app
from fleetq.emulator.controllers import ClusterController
from fleetq.emulator.faults import Faults
from fleetq.emulator.store import CORE, LEASES, PYTORCHJOBS, RESERVATIONS, Store
from fleetq.topology import ClusterSpec


class EmulatedCluster:
    def __init__(
        self, spec: ClusterSpec, *, token: str | None = None, start_delay: float = 0.2
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.token = token or secrets.token_hex(16)
        types = [*CORE, LEASES, PYTORCHJOBS] + ([RESERVATIONS] if spec.reservation else [])
        self.store = Store(types)
        self.controller = ClusterController(self.store, spec, start_delay=start_delay)
        self.faults = Faults()
        self.host = "127.0.0.1"
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self.ssl: ssl.SSLContext | None = None

    @property
    def url(self) -> str:
        host = self.host if self.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        scheme = "https" if self.ssl is not None else "http"
        return f"{scheme}://{host}:{self.port}"

    async def start(self, host: str, port: int, ssl_context: ssl.SSLContext | None = None) -> None:
        self.host = host
        self.ssl = ssl_context
        self._runner = web.AppRunner(
            build_app(self), access_log=None, shutdown_timeout=0.2, handle_signals=False
        )
        await self._runner.setup()
        self.port = port
        await self._listen()

    async def _listen(self) -> None:
        assert self._runner is not None
        site = web.TCPSite(
            self._runner, self.host, self.port, reuse_address=True, ssl_context=self.ssl
        )
        await site.start()
        self._site = site
        if not self.port:
            for addr in self._runner.addresses:
                if isinstance(addr, tuple):
                    self.port = int(addr[1])
                    break

    async def set_reachable(self, reachable: bool) -> None:
        self.faults.reachable = reachable
        if reachable:
            if self._site is None:
                await self._listen()
            return
        if self._site is not None:
            await self._site.stop()
            self._site = None
        self.store.close_watchers()
        if self._runner is not None and self._runner.server is not None:
            for conn in self._runner.server.connections:
                conn.force_close()

    async def stop(self) -> None:
        await self.controller.stop()
        self.store.close_watchers()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
            self._site = None
