"""Benchmark: what reading the durable room claims adds to a placement.

The placement activity (``plan_placement``) over 20 clusters x 200 generated nodes,
reading the claims from the fleet registry workflow on a Temporal dev server (with the
tree's preemption LowerPriority and one live claim: one query per placement; Never: none),
against the same activity reading them from process memory (what one worker did before
claims were durable), in the same run, median of N. Figures: BENCHMARKS.md §3.

Run: ``python -m bench.room_claims [--clusters 20] [--nodes 200] [--repeat 200]``. Last
two lines: ``RESULT roomclaimsnever <ratio>``, ``RESULT roomclaimslowerpriority <ratio>``.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import typer
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.room_claim_store import LocalClaims
from activities.scheduling import SchedulingActivities
from bench.command import bench_app, help_text, run_command
from bench.placement import build_fleet
from fleetq.capacity import ClusterSnapshot
from fleetq.client.connection import DATA_CONVERTER, temporal_cli_path
from fleetq.messages import GangShape, PlacementInput, PodGroupShape
from fleetq.naming import REGISTRY_WORKFLOW_ID
from fleetq.preemption import PREEMPTION_ANNOTATION
from fleetq.registry import RegistryState
from fleetq.resources import CPU
from fleetq.room_claims import NodeClaim, RoomClaim
from workflows.fleet_registry import FleetRegistryWorkflow


@dataclass
class _Member:
    labels: dict[str, str] = field(default_factory=dict)
    reservation: bool = False
    cache: None = None


class _Fleet:
    def __init__(self, snaps: list[ClusterSnapshot]) -> None:
        self.snaps = {s.name: s for s in snaps}
        self.clusters = {s.name: _Member() for s in snaps}

    def snapshots(self, names: Iterable[str]) -> list[ClusterSnapshot]:
        return [self.snaps[n] for n in names]


def _timed(acts: SchedulingActivities, inp: PlacementInput, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        acts.plan_placement(inp)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


async def _run(clusters: int, nodes: int, repeat: int, mode: str) -> tuple[float, float]:
    snaps = build_fleet(clusters, nodes)
    fleet = _Fleet(snaps)
    claim = RoomClaim(preemptor="pytorchjob/hi/job", cluster=snaps[0].name, bound_seconds=3600,
                      nodes={snaps[0].nodes[0].name: NodeClaim(requests={CPU: 1000}, pods=1)})
    inp = PlacementInput(job_ref="lo/job", job_id="pytorchjob/lo/job", gang=GangShape(
        groups=[PodGroupShape(role="Worker", count=4, requests={CPU: 2000})]))
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(temporal_cli_path()), data_converter=DATA_CONVERTER)
    try:
        async with Worker(env.client, task_queue="bench-claims",
                          workflows=[FleetRegistryWorkflow]):
            registry = await env.client.start_workflow(
                FleetRegistryWorkflow.run, RegistryState(
                    tree="kube-system/t", tree_annotations={PREEMPTION_ANNOTATION: mode},
                    preemption_changed=datetime.now(UTC) - timedelta(hours=1)),
                id=REGISTRY_WORKFLOW_ID, task_queue="bench-claims")
            durable = SchedulingActivities(env.client, lambda: fleet)  # type: ignore[arg-type,return-value]
            local = SchedulingActivities(None, lambda: fleet)  # type: ignore[arg-type,return-value]
            assert isinstance(local._room, LocalClaims)
            if mode == "LowerPriority":
                await asyncio.to_thread(durable._room.claim, claim)
            local._room.claim(claim)
            for acts in (durable, local):  # warm: columnar views, sticky workflow cache
                await asyncio.to_thread(_timed, acts, inp, 5)
            d = await asyncio.to_thread(_timed, durable, inp, repeat)
            m = await asyncio.to_thread(_timed, local, inp, repeat)
            await registry.terminate()
            return d, m
    finally:
        await env.shutdown()


app = bench_app()


@app.command(help=help_text(__doc__))
def command(
    clusters: int = typer.Option(20, "--clusters"),
    nodes: int = typer.Option(200, "--nodes"),
    repeat: int = typer.Option(200, "--repeat"),
) -> None:
    for mode in ("Never", "LowerPriority"):
        durable, memory = asyncio.run(_run(clusters, nodes, repeat, mode))
        print(f"tree {mode}: plan_placement with claims in process memory (median of "
              f"{repeat}) {memory * 1000:.2f} ms, from the registry {durable * 1000:.2f} ms")
        print(f"RESULT roomclaims{mode.lower()} {durable / memory:.2f}")


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(app, argv, "python -m bench.room_claims")


if __name__ == "__main__":
    raise SystemExit(main())
