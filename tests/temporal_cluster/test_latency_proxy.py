"""The database latency proxy (``fleetq.temporal_cluster.latency_proxy``) and the
sustained-load benchmark that puts PostgreSQL behind it (``fleetq bench sustained``).

The proxy: bytes pass through unchanged both ways, in order, and by its own counters
every chunk was held at least the configured delay (no wall-clock bound here: the
machine is shared). The benchmark: a tiny run on the production-shaped Temporal with
the database behind the proxy admits every holder exactly once and prints its table and
``RESULT`` line.
"""

from __future__ import annotations

import asyncio
import os
import re

import pytest

from fleetq.temporal_cluster.latency_proxy import LatencyProxy

DELAY = 0.02


async def echo_server() -> asyncio.Server:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(4096):
            writer.write(data)
            await writer.drain()
        writer.close()

    return await asyncio.start_server(echo, "127.0.0.1", 0)


async def test_bytes_pass_unchanged_and_every_chunk_is_held_the_delay() -> None:
    server = await echo_server()
    port = server.sockets[0].getsockname()[1]
    payloads = [os.urandom(n) for n in (1, 100, 5000, 70_000)]
    async with server, LatencyProxy(("127.0.0.1", port), DELAY) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        for payload in payloads:  # a request, then its answer: round trips, as a query
            writer.write(payload)
            await writer.drain()
            assert await reader.readexactly(len(payload)) == payload
        writer.write_eof()
        assert await reader.read() == b""  # the end of the stream passes through too
        writer.close()
    stats = proxy.stats
    assert stats.connections == 1
    total = sum(len(p) for p in payloads)
    assert stats.upstream.bytes == stats.downstream.bytes == total
    assert stats.upstream.chunks >= len(payloads)
    assert stats.downstream.chunks >= len(payloads)
    for direction in (stats.upstream, stats.downstream):
        assert direction.min_held >= DELAY, direction
        assert direction.total_held >= DELAY * direction.chunks


async def test_without_delay_the_proxy_still_forwards_both_ways() -> None:
    server = await echo_server()
    port = server.sockets[0].getsockname()[1]
    async with server, LatencyProxy(("127.0.0.1", port), 0.0) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"SELECT 1")
        await writer.drain()
        assert await reader.readexactly(8) == b"SELECT 1"
        writer.close()
    assert proxy.stats.upstream.bytes == proxy.stats.downstream.bytes == 8


def test_a_negative_delay_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match="delay must not be negative"):
        LatencyProxy(("127.0.0.1", 1), -0.001)


def test_a_tiny_sustained_run_admits_every_holder_once(
        capsys: pytest.CaptureFixture[str]) -> None:
    from bench import sustained

    code = sustained.main(["--latencies", "1", "--rates", "2", "--seconds", "3",
                           "--window", "1", "--drain", "120"])
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    # exit code 1: a 2/s point cannot reach the 100/s target; the run itself completed
    assert code == 1, out
    assert re.fullmatch(r"RESULT sustained \d+\.\d+ \(target 100\.0\)", lines[-1]), lines[-1]
    header = next(line for line in lines if line.startswith("| feed "))
    assert [c.strip() for c in header.strip("|").split("|")] == list(sustained.COLUMNS)
    row = next(line for line in lines if line.startswith("| jobs "))
    cells = dict(zip(sustained.COLUMNS, (c.strip() for c in row.strip("|").split("|")),
                     strict=True))
    assert cells["offered/s"] == "2"
    assert cells["jobs"] == cells["admitted"] == "6"
    assert int(cells["max events"]) > 0
    detail = next(line for line in lines if line.startswith("  jobs feed"))
    assert "6/6 admitted" in detail
    # where the holders spent their time, read from their own histories
    assert re.search(r"holders' dispatch p50 [\d.]+ / p99 [\d.]+ s", detail), detail
    assert "problem:" not in out
    # the database really was behind the proxy, at the asked delay
    held = re.search(r"db proxy (\d+) chunks, each held >= ([\d.]+) ms", detail)
    assert held, detail
    assert int(held[1]) > 0 and float(held[2]) >= 1.0


def test_a_tiny_tree_feed_admits_every_job_once_in_the_submit_reply(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The tree feed: jobs' enqueues and releases from two workers' outboxes, no job
    workflow; every job is granted exactly once, in its enqueue's reply (the grants are
    read from the quota workflow's history)."""
    from bench import sustained

    code = sustained.main(["--feed", "tree", "--outboxes", "2", "--shards", "2",
                           "--latencies", "1", "--rates", "4", "--seconds", "3",
                           "--window", "1", "--drain", "120"])
    out = capsys.readouterr().out
    assert code == 1, out  # 4/s cannot reach the 100/s target; the run completed
    row = next(line for line in out.splitlines() if line.startswith("| tree "))
    cells = dict(zip(sustained.COLUMNS, (c.strip() for c in row.strip("|").split("|")),
                     strict=True))
    assert (cells["feed"], cells["shards"], cells["db ms"]) == ("tree", "2", "1")
    assert cells["jobs"] == cells["admitted"] == "12"
    assert cells["grant signal p99 s"] == "nan"  # no grant went by signal
    detail = next(line for line in out.splitlines() if line.startswith("  tree feed"))
    assert "12/12 admitted" in detail and "0 granted by signal" in detail, detail
    assert "problem:" not in out


@pytest.mark.parametrize(("argv", "says"), [
    (["--rates", "10,abc"], "--rates: a comma-separated list of numbers, got '10,abc'"),
    (["--rates", "0"], "--rates: every rate must be positive"),
    (["--latencies", "-5"], "--latencies: at least one number, none negative"),
    (["--feed", "pods"], "--feed: one of jobs, tree; got 'pods'"),
])
def test_a_bad_ladder_is_one_line_before_anything_starts(
        argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    from bench import sustained

    assert sustained.main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err
