"""Crash matrix, whole, in the normal suite: SIGKILL the worker process at every phase of a
job (all kill points at once on one fleet, each in its own namespace, quota leaf and
worker process), then restart the Temporal dev server and the emulator mid-run, and check
every point on its own: the job ends where it would have, its history has no failed
workflow task, it was admitted exactly once, exactly one member copy exists (none after a
delete, read from the members), no Reservation holds room, and its quota leaf holds
nothing. ``python -m bench.chaos`` runs the same matrix and prints it.

The matrix runs once (about 2 minutes on 2 cores; it prints its time, and pytest-timeout
stops a hang at 6) and each point is a test of its own."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from fleetq.testing.chaos import KILL_POINTS, RESTARTS, MatrixResult, run_matrix

#: the hang guard: the whole matrix, fleet start to teardown, takes about 120 s on this
#: project's 2-core machines (a time, not an assertion: the suite asserts no wall clock)
HANG_GUARD_SECONDS = 360


@pytest_asyncio.fixture(scope="module")
async def matrix(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[MatrixResult]:
    started = time.monotonic()
    result = await run_matrix(KILL_POINTS, RESTARTS,
                              workdir=tmp_path_factory.mktemp("chaos"))
    result.seconds = time.monotonic() - started
    print(f"\ncrash matrix: {result.tried} points in {result.seconds:.0f}s\n{result.report()}")
    yield result


@pytest.mark.timeout(HANG_GUARD_SECONDS)
@pytest.mark.parametrize("point", [*KILL_POINTS, *RESTARTS])
async def test_kill_point_loses_nothing(matrix: MatrixResult, point: str) -> None:
    r = matrix.point(point)
    assert r.survived, r.line()
    assert not r.problems, r.line()
    assert r.hit != "(phase not reached)" and r.hit != "(not reached)", r.line()
    assert r.state == ("Deleted" if point == "releasing" else "Succeeded"), r.line()


@pytest.mark.timeout(60)
async def test_matrix_leaves_no_quota(matrix: MatrixResult) -> None:
    assert [r.point for r in matrix.results] == [*KILL_POINTS, *RESTARTS]
    assert matrix.quota_problems == [], matrix.report()
    assert matrix.ok, matrix.report()
