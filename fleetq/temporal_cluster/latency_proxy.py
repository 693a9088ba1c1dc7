"""A loopback TCP proxy that adds a fixed latency, for putting the production-shaped
Temporal's PostgreSQL "far away" (``bench/sustained.py``: the database at 0, 5 and 20 ms).

Each chunk is written to the other side ``delay`` seconds after it was read, both ways
(a query round trip costs at least two delays). Chunks wait in a per-direction queue
rather than being slept on one by one, so order is kept and throughput is not divided by
the delay (as ``tc netem delay``, without root or a network namespace).
:class:`ProxyStats` counts connections, chunks, bytes and hold times, which is how a test
checks the delay was applied. It runs as its own process (``python -m
fleetq.temporal_cluster.latency_proxy --listen PORT --target HOST:PORT --delay-ms N
[--stats FILE]``), so its CPU is not the benchmark worker's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import signal
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: bytes read at once from a socket
CHUNK = 64 * 1024


@dataclass
class Direction:
    """What one direction (client -> server, or back) carried."""

    chunks: int = 0
    bytes: int = 0
    #: shortest and longest time a chunk spent in the proxy (read -> written), seconds
    min_held: float = math.inf
    max_held: float = 0.0
    total_held: float = 0.0

    def record(self, size: int, held: float) -> None:
        self.chunks += 1
        self.bytes += size
        self.min_held = min(self.min_held, held)
        self.max_held = max(self.max_held, held)
        self.total_held += held


@dataclass
class ProxyStats:
    """The proxy's counters; ``delay`` is the configured one-way delay (seconds)."""

    delay: float
    connections: int = 0
    upstream: Direction = field(default_factory=Direction)  # client -> target
    downstream: Direction = field(default_factory=Direction)  # target -> client

    def as_dict(self) -> dict[str, object]:
        out = asdict(self)
        for d in ("upstream", "downstream"):
            if out[d]["min_held"] == math.inf:
                out[d]["min_held"] = None
        return out


class LatencyProxy:
    """Listen on ``host:port`` (0: any free port, see :attr:`port`) and forward every
    connection to ``target`` with ``delay`` seconds added to each chunk, both ways."""

    def __init__(self, target: tuple[str, int], delay: float, host: str = "127.0.0.1",
                 port: int = 0) -> None:
        if delay < 0:
            raise ValueError(f"latency proxy: delay must not be negative, got {delay}")
        self.target = target
        self.delay = delay
        self.host = host
        self._port = port
        self.stats = ProxyStats(delay=delay)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        if self._server is None:
            return self._port
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def start(self) -> LatencyProxy:
        self._server = await asyncio.start_server(self._accept, self.host, self._port)
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def __aenter__(self) -> LatencyProxy:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        self.stats.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        try:
            await asyncio.gather(self._pipe(reader, up_writer, self.stats.upstream),
                                 self._pipe(up_reader, writer, self.stats.downstream))
        finally:
            for w in (writer, up_writer):
                w.close()
            if task is not None:
                self._tasks.discard(task)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    direction: Direction) -> None:
        """Copy ``reader`` to ``writer``, each chunk ``delay`` after it was read."""
        loop = asyncio.get_running_loop()
        held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def release() -> None:
            while True:
                read_at, data = await held.get()
                if not data:  # end of stream, after the chunks before it
                    with contextlib.suppress(OSError):
                        writer.write_eof()
                    return
                wait = read_at + self.delay - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                direction.record(len(data), loop.time() - read_at)
                await writer.drain()

        releaser = asyncio.ensure_future(release())
        try:
            while True:
                data = await reader.read(CHUNK)
                held.put_nowait((loop.time(), data))
                if not data:
                    break
            await releaser
        except (OSError, asyncio.IncompleteReadError):
            writer.close()  # the other way's reader then ends too (same sockets)
        finally:
            releaser.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await releaser


async def _serve(args: argparse.Namespace) -> None:
    host, _, port = args.target.rpartition(":")
    proxy = await LatencyProxy((host or "127.0.0.1", int(port)), args.delay_ms / 1000,
                               port=args.listen).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    stats = Path(args.stats) if args.stats else None

    def dump() -> None:
        if stats is not None:
            tmp = stats.with_suffix(".tmp")
            tmp.write_text(json.dumps(proxy.stats.as_dict()))
            tmp.replace(stats)

    print(f"latency proxy 127.0.0.1:{proxy.port} -> {args.target}, "
          f"{args.delay_ms:g} ms each way", flush=True)
    while not stop.is_set():
        dump()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
    dump()
    await proxy.close()


def read_stats(path: Path) -> dict[str, Any] | None:
    """The counters a proxy process wrote with ``--stats`` (None when not yet)."""
    try:
        got: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return got


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fleetq.temporal_cluster.latency_proxy",
                                     description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--listen", type=int, required=True, help="loopback port to listen on")
    parser.add_argument("--target", required=True, help="HOST:PORT to forward to")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="added each way, per chunk")
    parser.add_argument("--stats", help="write the counters here as JSON (every second)")
    args = parser.parse_args(argv)
    if args.delay_ms < 0:
        print("error: latency proxy --delay-ms must not be negative", file=sys.stderr)
        return 2
    asyncio.run(_serve(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
