"""The process supervisor behind ``fleetq up``/``demo``, the real control planes and the
crash matrix: a child that exits early or never gets ready is one line naming the end of
its log, and a stop escalates from SIGTERM to SIGKILL when the child does not go."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from pathlib import Path

import pytest

from fleetq.runtime.supervisor import (
    ProcessError,
    RestartBudget,
    free_port,
    port_in_use,
    spawn_child,
)

PY = sys.executable


def test_a_child_that_exits_early_is_one_line_with_its_last_words(tmp_path: Path) -> None:
    child = spawn_child("early", [PY, "-c", "print('bad flag --x'); raise SystemExit(3)"],
                        tmp_path)
    with pytest.raises(ProcessError) as err:
        child.wait_ready(lambda: False, time.monotonic() + 30, what="the thing")
    message = str(err.value)
    assert message.startswith("the thing exited with code 3: bad flag --x")
    assert str(tmp_path / "early.log") in message and "\n" not in message


def test_a_child_that_never_gets_ready_fails_at_the_deadline(tmp_path: Path) -> None:
    child = spawn_child("slow", [PY, "-c", "import time; time.sleep(60)"], tmp_path)
    try:
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="slow did not become ready in time"):
            child.wait_ready(lambda: False, started + 0.5, error=RuntimeError)
        assert child.alive()
    finally:
        child.stop(grace=5)
    assert not child.alive()


def test_stop_kills_a_child_that_ignores_sigterm(tmp_path: Path) -> None:
    code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('up', flush=True); time.sleep(60)")
    child = spawn_child("stubborn", [PY, "-c", code], tmp_path)
    child.wait_ready(lambda: "up" in child.tail(), time.monotonic() + 30)
    child.stop(grace=0.5)
    assert child.proc.returncode == -signal.SIGKILL


def test_stop_lets_a_child_finish_on_sigterm(tmp_path: Path) -> None:
    code = ("import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *_: (print('draining', flush=True), "
            "sys.exit(0)))\n"
            "print('up', flush=True)\n"
            "time.sleep(60)\n")
    child = spawn_child("polite", [PY, "-c", code], tmp_path,
                        log=tmp_path / "logs" / "polite-1.log")
    child.wait_ready(lambda: "up" in child.tail(), time.monotonic() + 30)
    child.stop(grace=30)
    assert child.proc.returncode == 0
    assert child.tail() == "up | draining"
    assert child.log == tmp_path / "logs" / "polite-1.log"


def test_async_readiness_retries_a_check_that_raises(tmp_path: Path) -> None:
    port = free_port()
    server = (f"import socket, time; time.sleep(0.3); s = socket.socket(); "
              f"s.bind(('127.0.0.1', {port})); s.listen(); time.sleep(60)")
    child = spawn_child("listener", [PY, "-c", server], tmp_path)
    calls = 0

    async def listening() -> bool:
        nonlocal calls
        calls += 1
        if not port_in_use("127.0.0.1", port):
            raise ConnectionRefusedError(port)
        return True

    try:
        asyncio.run(child.wait_ready_async(listening, time.monotonic() + 30, poll=0.05))
        assert calls > 1 and port_in_use("127.0.0.1", port)
    finally:
        child.stop(grace=5)


def test_restart_budget_allows_limit_restarts_per_sliding_window() -> None:
    """``fleetq up`` restarts its worker at most 5 times in 10 minutes."""
    budget = RestartBudget(limit=3, window=600.0)
    assert [budget.take(t) for t in (0.0, 10.0, 20.0)] == [True, True, True]
    assert budget.take(30.0) is False  # a 4th within 600 s of the first
    assert budget.used == 3
    assert budget.take(599.9) is False
    assert budget.take(600.0) is True  # the first restart left the window
    assert budget.used == 3
    assert budget.take(605.0) is False
