"""``fleetq bench chaos``: the crash matrix as a command. SIGKILL the fleetq worker at every
phase of a job, restart it, and check that nothing was lost, duplicated or leaked; then
restart the Temporal dev server and the member-cluster emulator mid-run.

The rig itself (:class:`fleetq.testing.chaos.ChaosRig`, the kill points, the history
readers) lives in the test library so that the reliability tests and this bench share it
without the tests importing a bench. ``python -m bench.chaos`` (or ``fleetq bench chaos``)
runs the full matrix and prints ``kill points tried / survived`` and
``RESULT chaos <survived/tried> (target 1.0)``; ``--members real`` runs the kill points
around the bind against real member control planes.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import typer

from bench.command import bench_app, run_command
from bench.common import temporal_option
from fleetq.runtime.embedded import TemporalKind
from fleetq.testing.chaos import (
    CLUSTER_RESTARTS,
    KILL_POINTS,
    REAL_KILL_POINTS,
    RESTARTS,
    run_matrix,
)


class Members(StrEnum):
    """Which member clusters the crash matrix runs on."""

    emulated = "emulated"
    real = "real"


@dataclass(frozen=True)
class Options:
    """``fleetq bench chaos``'s options as parsed (the defaults are the command's)."""

    points: str | None
    restarts: str | None
    members: str
    workdir: str | None
    json: bool
    temporal: str = "dev"


app = bench_app()


@app.command(help="fleetq crash matrix (kill points and restarts); loopback only")
def command(
    points: str | None = typer.Option(
        None, "--points",
        help=f"comma-separated kill points (default all: {','.join(KILL_POINTS)}; "
             f"on real members {','.join(REAL_KILL_POINTS)})"),
    restarts: str | None = typer.Option(
        None, "--restarts",
        help="comma-separated restarts, or '' for none (default all on emulated members, "
             "none on real ones)"),
    members: Members = typer.Option(
        Members.emulated, "--members",
        help="emulated members (default) or real control planes built from the Go modules "
             "(fleetq controlplane build)"),
    workdir: str | None = typer.Option(None, "--workdir", help="keep logs and state here"),
    json_too: bool = typer.Option(False, "--json", help="print results as JSON too"),
    temporal: TemporalKind = temporal_option(
        "the production-shaped Temporal built from its Go module, which adds the "
        "history-kill restart"),
) -> None:
    raise typer.Exit(run(Options(points, restarts, members.value, workdir, json_too,
                                 temporal.value)))


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(app, argv, "fleetq bench chaos")


def run(args: Options) -> int:
    """The crash matrix as the command line asked for it; prints and returns the exit code."""
    real = args.members == "real"
    have_points, have_restarts = (REAL_KILL_POINTS, ()) if real else (
        KILL_POINTS, CLUSTER_RESTARTS if args.temporal == "cluster" else RESTARTS)
    points = [p for p in (args.points or ",".join(have_points)).split(",") if p]
    restarts = [r for r in (",".join(have_restarts) if args.restarts is None
                            else args.restarts).split(",") if r]
    unknown = [p for p in points if p not in have_points] + [
        r for r in restarts if r not in have_restarts]
    if unknown:
        print(f"error: unknown kill point(s) {', '.join(unknown)} on {args.members} members "
              f"(have: {', '.join(have_points + have_restarts)})", file=sys.stderr)
        return 2
    workdir = Path(args.workdir) if args.workdir else None
    if workdir is not None:
        workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    result = asyncio.run(run_matrix(points, restarts, workdir=workdir,
                                    log=lambda m: print(f"chaos: {m}", flush=True),
                                    members=args.members, temporal=args.temporal))
    for r in result.results:
        print(r.line())
    for p in result.quota_problems:
        print(f"quota: {p}")
    print(f"kill points tried / survived: {result.tried} / {result.survived}"
          f"{'' if not result.quota_problems else ' (quota leaked)'}"
          f" in {time.monotonic() - started:.0f}s")
    if args.json:
        print(json.dumps([r.__dict__ for r in result.results], indent=2))
    ratio = result.survived / result.tried if result.tried else 0.0
    if result.quota_problems:
        ratio = 0.0
    print(f"RESULT chaos {ratio:.3f} (target 1.0)")
    return 0 if result.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
