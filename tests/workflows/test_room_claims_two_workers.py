"""Capacity preemptions' room claims hold across workers (issue 25 item 4): the plan is
made on worker A, the evicted victim is placed again on worker B (its own memory, the
same fleet registry workflow), and B keeps it out of the room made for the preemptor
until the preemptor's copy is bound, not merely found room for (the bind releases the
claim); the claim survives the registry's continue-as-new."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from temporalio.client import WorkflowHandle
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment

from activities.scheduling import SchedulingActivities
from fleetq.capacity import ClusterSnapshot, NodeCapacity
from fleetq.messages import (
    BindInput,
    BindRequest,
    BindResult,
    CapacityPlanned,
    GangShape,
    JobRef,
    PlacementInput,
    PodGroupShape,
)
from fleetq.naming import REGISTRY_WORKFLOW_ID
from fleetq.preemption import PREEMPTION_ANNOTATION, RunningGang, RunningPod
from fleetq.registry import RegistryState
from fleetq.resources import CPU
from fleetq.room_claims import RoomClaim
from tests.workflows.fakes import StubCache, StubMember, registry_running
from workflows.fleet_registry import FleetRegistryWorkflow

MEMBER = "cluster-a"
LOW = [f"pytorchjob/low/j{k}" for k in range(2)]


class MemberView:
    """One worker's view of one member (a 4-cpu node): its capacity cache."""

    def __init__(self) -> None:
        self.clusters = {MEMBER: StubMember(StubCache())}
        self.show(LOW)

    def show(self, running: list[str]) -> None:
        self.clusters[MEMBER].cache.gangs = [
            RunningGang(j, MEMBER, 10, (RunningPod("n0", {CPU: 1000}),) * 2, started_at=1.0 + k)
            for k, j in enumerate(running)
        ]
        self.snap = ClusterSnapshot(name=MEMBER, nodes=[NodeCapacity(
            "n0", {CPU: 4000}, {CPU: 2000 * len(running)}, pods_used=2 * len(running))],
            resource_version=str(len(running)))

    def snapshots(self, names: Iterable[str]) -> list[ClusterSnapshot]:
        return [self.snap for n in names if n == MEMBER]

    def get(self, name: str) -> MemberView:
        assert name == MEMBER
        return self

    def bind(self, req: BindRequest) -> BindResult:
        """The member write: the copy is made (its pods bind later, ``show``)."""
        self.bound = req.job
        return BindResult(created=True, uid="uid-1")


def worker(env: WorkflowEnvironment, view: MemberView) -> SchedulingActivities:
    """A worker's activities: the tree's preemption mode comes from the registry."""
    return SchedulingActivities(env.client, lambda: view)  # type: ignore[arg-type,return-value]


def ask(job_id: str, priority: int, **kw: object) -> PlacementInput:
    gang = GangShape(groups=[PodGroupShape(role="Worker", count=2, requests={CPU: 1000})],
                     priority=priority)
    return PlacementInput(job_ref=job_id.removeprefix("pytorchjob/"), gang=gang, job_id=job_id,
                          tree_workflow_id="quota/kube-system/t", **kw)  # type: ignore[arg-type]


async def claims(handle: WorkflowHandle[FleetRegistryWorkflow, None]) -> list[RoomClaim]:
    return await handle.query(FleetRegistryWorkflow.room_claims)


async def test_a_victim_placed_on_another_worker_stays_out_of_the_claimed_room(
    ts_env: WorkflowEnvironment,
) -> None:
    state = RegistryState(
        tree="kube-system/t", tree_annotations={PREEMPTION_ANNOTATION: "LowerPriority"},
        preemption_changed=datetime.now(UTC) - timedelta(hours=1), max_history_events=12)
    async with registry_running(ts_env, state, REGISTRY_WORKFLOW_ID) as handle:
        view_a, view_b = MemberView(), MemberView()
        a, b = worker(ts_env, view_a), worker(ts_env, view_b)
        first_run = (await handle.describe()).run_id

        # worker A plans room for the preemptor: one low gang is to go
        planned = await asyncio.to_thread(
            a.plan_placement, ask("pytorchjob/hi/job", 1000, capacity_preemption=True))
        plan = planned.capacity_plan
        assert plan is not None and plan.cluster == MEMBER
        (victim,) = plan.victims
        assert [c.preemptor for c in await claims(handle)] == ["pytorchjob/hi/job"]

        # the registry continues as new; the claim is carried over
        for _ in range(8):
            await handle.query(FleetRegistryWorkflow.state)
            await handle.execute_update(FleetRegistryWorkflow.release_room, "nobody")
            if (await handle.describe()).run_id != first_run:
                break
        assert (await handle.describe()).run_id != first_run
        assert [c.preemptor for c in await claims(handle)] == ["pytorchjob/hi/job"]

        # the victim stopped; both workers' caches see its room free
        still = [j for j in LOW if j != victim.job_id]
        view_a.show(still)
        view_b.show(still)
        again = await asyncio.to_thread(b.plan_placement, ask(victim.job_id, 10))
        assert again.candidates == [], "the victim went back into the preemptor's room"
        assert "cpu" in again.reason()

        # the preemptor finds its room (on worker A): found, not yet bound, the room is
        # still its own, so the victim placed meanwhile on B is still kept out of it
        placed = await asyncio.to_thread(a.plan_placement, ask(
            "pytorchjob/hi/job", 1000,
            planned=CapacityPlanned(cluster=plan.cluster, victims=plan.victims)))
        assert [c.cluster for c in placed.candidates] == [MEMBER]
        assert [c.preemptor for c in await claims(handle)] == ["pytorchjob/hi/job"]
        meanwhile = await asyncio.to_thread(b.plan_placement, ask(victim.job_id, 10))
        assert meanwhile.candidates == [], "the victim took the room before the preemptor bound"

        # the preemptor's bind (worker A) makes its copy, then releases the claim
        env = ActivityEnvironment()
        env.info = dataclasses.replace(env.info, workflow_id="pytorchjob/hi/job")
        job = JobRef(namespace="hi", name="job", workflow_id="pytorchjob/hi/job")
        bound = await asyncio.to_thread(env.run, a.bind, BindInput(
            cluster=MEMBER, release_room=True, request=BindRequest(job=job, manifest={})))
        assert bound.created and view_a.bound.name == "job"
        assert await claims(handle) == []
        # its pods bound: no room for the victim; once they are gone, the room is anyone's
        view_b.show([*still, "pytorchjob/hi/job"])
        full = await asyncio.to_thread(b.plan_placement, ask(victim.job_id, 10))
        assert full.candidates == []
        view_b.show(still)
        free = await asyncio.to_thread(b.plan_placement, ask(victim.job_id, 10))
        assert [c.cluster for c in free.candidates] == [MEMBER]
