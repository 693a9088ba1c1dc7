"""Crash matrix: SIGKILL the worker process at a phase of a job, restart it, and check the
job still ends where it would have, with one member copy, no held Reservation and no quota
left. The normal suite runs two kill points (mid-bind, while running); the full matrix and
the Temporal / emulator restarts are ``slow`` (and ``python -m bench.chaos``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.chaos import KILL_POINTS, RESTARTS, MatrixResult, run_matrix


def report(result: MatrixResult) -> str:
    return "\n".join([r.line() for r in result.results] + result.quota_problems)


@pytest.mark.timeout(280)
async def test_worker_killed_mid_bind_and_while_running_loses_nothing(tmp_path: Path) -> None:
    result = await run_matrix(["binding", "running"], [], workdir=tmp_path)
    assert [r.point for r in result.results] == ["binding", "running"]
    assert result.ok, report(result)
    assert all(r.state == "Succeeded" for r in result.results), report(result)


@pytest.mark.slow
@pytest.mark.timeout(1200)
async def test_full_crash_matrix_and_restarts(tmp_path: Path) -> None:
    result = await run_matrix(KILL_POINTS, RESTARTS, workdir=tmp_path)
    assert result.tried == len(KILL_POINTS) + len(RESTARTS)
    assert result.ok, report(result)
    states = {r.point: r.state for r in result.results}
    assert states["releasing"] == "Deleted"
    assert {s for p, s in states.items() if p != "releasing"} == {"Succeeded"}
