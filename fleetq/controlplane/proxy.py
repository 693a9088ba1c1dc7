"""A fault-injecting loopback proxy in front of a real kube-apiserver.

fleetq's kubeconfig for real members points here (same CA and token: requests go on as
they came), so the emulator's faults (API errors at a rate with ``Retry-After``, added
latency) hit real members too, as a network fault between fleetq and the member would;
the member's own controllers talk to the API server directly. Responses stream, so
watches pass; all proxies of a fleet share one asyncio loop in a daemon thread. A delayed
request is already held whole, so a write whose sender dies meanwhile still arrives (the
crash tests on real members rely on it); a request is resent upstream only when the API
server's connection failed, never because the client went away.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp
from aiohttp import web

from fleetq.emulator.faults import Faults
from fleetq.emulator.store import ApiError
from fleetq.runtime.supervisor import free_port

T = TypeVar("T")
#: Headers that belong to one hop (or that aiohttp recomputes), never forwarded.
HOP = frozenset({"host", "connection", "keep-alive", "transfer-encoding", "content-length",
                 "content-encoding", "upgrade", "proxy-connection", "te", "trailer"})


@dataclass
class Proxy:
    """One listening port that forwards to ``upstream`` (``https://127.0.0.1:PORT``)."""

    upstream: str
    server_ssl: ssl.SSLContext
    client_ssl: ssl.SSLContext
    faults: Faults = field(default_factory=Faults)
    port: int = 0
    _runner: web.AppRunner | None = None
    _session: aiohttp.ClientSession | None = None

    async def start(self, host: str = "127.0.0.1") -> None:
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=None),
            auto_decompress=True)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        # open watches are cut at shutdown, not awaited
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        self.port = self.port or free_port(host)
        site = web.TCPSite(self._runner, host, self.port, ssl_context=self.server_ssl)
        await site.start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.shutdown()
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        f = self.faults
        # The request is taken in whole before the latency, as a network delays what was
        # already sent: a write whose sender dies meanwhile (a SIGKILLed worker) still
        # reaches the API server.
        try:
            body = await request.read()
        except (ConnectionResetError, aiohttp.ClientPayloadError):
            # the client went away before it finished sending: nothing to forward
            return web.Response(status=400, text="fault proxy: request incomplete")
        if f.latency > 0:
            await asyncio.sleep(f.latency)
        if (err := f.injected_error()) is not None:
            return web.json_response(err.status(), status=err.code, headers=err.headers)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        for attempt in range(3):
            try:
                return await self._forward(request, headers, body)
            except (aiohttp.ClientConnectionError, ConnectionResetError) as exc:
                # nothing reached the API server (a connection it reset): try again
                if attempt == 2:
                    err = ApiError(502, "InternalError", f"fault proxy: upstream: {exc}")
                    return web.json_response(err.status(), status=502)
                await asyncio.sleep(0.05 * (attempt + 1))
        raise AssertionError("unreachable")

    async def _forward(self, request: web.Request, headers: dict[str, str],
                       body: bytes) -> web.StreamResponse:
        assert self._session is not None
        async with self._session.request(request.method, self.upstream + request.path_qs,
                                         headers=headers, data=body or None,
                                         ssl=self.client_ssl) as up:
            resp = web.StreamResponse(status=up.status, headers={
                k: v for k, v in up.headers.items() if k.lower() not in HOP})
            try:
                # inside the try: a client gone by now (its worker killed) must not make
                # the caller send the request upstream again
                await resp.prepare(request)
                async for chunk in up.content.iter_any():
                    await resp.write(chunk)
                await resp.write_eof()
            except (ConnectionResetError, aiohttp.ClientError, RuntimeError):
                pass  # the client went away (a watch closed), or the API server did
            return resp


class ProxyLoop:
    """The daemon thread and loop that run a fleet's proxies."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.proxies: list[Proxy] = []
        self._apps: list[web.AppRunner] = []
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                         name="fleetq-fault-proxy")
        self._thread.start()

    def call(self, fn: Callable[[], Awaitable[T]], timeout: float = 30.0) -> T:
        async def run() -> T:
            return await fn()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout)

    def add(self, upstream: str, server_ssl: ssl.SSLContext,
            client_ssl: ssl.SSLContext) -> Proxy:
        proxy = Proxy(upstream, server_ssl, client_ssl)
        self.call(proxy.start)
        self.proxies.append(proxy)
        return proxy

    def serve(self, app: web.Application, host: str = "127.0.0.1") -> str:
        """Serve another aiohttp app (the fault control endpoint) on this loop; its URL."""

        async def start() -> int:
            runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
            await runner.setup()
            port = free_port(host)
            await web.TCPSite(runner, host, port).start()
            self._apps.append(runner)
            return port

        return f"http://{host}:{self.call(start)}"

    def close(self) -> None:
        """Stop every proxy and cancel what still streams (open watches)."""

        async def stop_all() -> None:
            for runner in self._apps:
                await runner.cleanup()
            for p in self.proxies:
                await p.stop()
            current = asyncio.current_task()
            pending = [t for t in asyncio.all_tasks() if t is not current]
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

        # The loop itself keeps running (an idle daemon thread): aiohttp's request
        # handlers finish on it after their connections close, and one finished on a
        # closed loop would be garbage-collected mid-flight.
        try:
            self.call(stop_all, timeout=15)
        finally:
            self.proxies.clear()
            self._apps.clear()


def set_faults(proxy: Proxy, **changes: Any) -> None:
    """Change a proxy's fault state (plain attribute writes, read by its loop)."""
    for key, value in changes.items():
        setattr(proxy.faults, key, value)
