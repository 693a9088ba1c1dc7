"""Capacity preemption's adapter side (issue 18): the capacity cache reads which fleet
jobs run on a member, at what priority and whether they may be preempted, from the
pods alone (on the emulator and on a real API server alike); the placement activity
plans exactly one cluster only when the tree allows it and nothing fits, reports which
planned victims are still there, and keeps the room it made for its preemptor until
its plan is over or its copy is bound."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from activities.fleet import Fleet
from activities.scheduling import SchedulingActivities
from fleetq.capacity import ClusterSnapshot, NodeCapacity
from fleetq.messages import (
    BindRequest,
    CapacityPlanned,
    CapacityVictim,
    GangShape,
    JobRef,
    PlacementInput,
    PodGroupShape,
)
from fleetq.preemption import RunningGang, RunningPod
from fleetq.resources import CPU, MEMORY
from tests.workflows.fakes import StubCache, StubMember

from .conftest import eventually, manifest, member

GI = 1024**3 * 1000  # milli-units of a Gi


def _gang_of(m: Any, job: JobRef, pods: int) -> RunningGang | None:
    for g in m.cache.running_gangs():
        if g.job_id == job.workflow_id and len(g.pods) == pods:
            return g  # type: ignore[no-any-return]
    return None


def test_running_gangs_come_from_the_member_copys_pods(
    fleet: Fleet, names: dict[str, str], job_factory: Callable[..., JobRef]
) -> None:
    m = member(fleet, names["a"])
    job = job_factory("gang")
    m.bind(BindRequest(job=job, manifest=manifest(
        job, annotations={"fleetq.io/preemption-grace-seconds": "7"}),
        priority=42, run_seconds=120))
    gang = eventually(lambda: _gang_of(m, job, 2), timeout_s=30)
    assert (gang.cluster, gang.priority, gang.preemptible, gang.grace_seconds) == (
        m.name, 42, True, 7)
    nodes = {n.name for n in m.capacity().nodes}
    assert all(p.node in nodes and p.requests.get(CPU) == 100 for p in gang.pods)
    assert gang.started_at > 0

    opted = job_factory("optout")
    m.bind(BindRequest(job=opted, manifest=manifest(
        opted, annotations={"fleetq.io/preemptible": "false"}), priority=5, run_seconds=120))
    assert eventually(lambda: _gang_of(m, opted, 2), timeout_s=30).preemptible is False

    # a copy bound without a priority (by a workflow older than capacity preemption)
    # is never a candidate, even once its pods run
    old = job_factory("old")
    m.bind(BindRequest(job=old, manifest=manifest(old), run_seconds=120))

    def old_pods_bound() -> bool:
        pods, _ = m.api.list(f"/api/v1/namespaces/{old.namespace}/pods")
        return len([p for p in pods if (p.get("spec") or {}).get("nodeName")]) == 2

    eventually(old_pods_bound, timeout_s=30)
    assert all(g.job_id != old.workflow_id for g in m.cache.running_gangs())

    m.purge(job)
    eventually(lambda: all(g.job_id != job.workflow_id for g in m.cache.running_gangs()),
               timeout_s=30)


# ---------------------------------------------------------------- the placement activity


class StubFleet:
    """Two one-node clusters of 4 cpu, both full of low-priority gangs."""

    def __init__(self) -> None:
        self.clusters: dict[str, StubMember] = {}
        self.snaps: dict[str, ClusterSnapshot] = {}
        for i, name in enumerate(("cluster-a", "cluster-b")):
            gangs = [
                RunningGang(f"pytorchjob/low/{name}-{k}", name, 10,
                            (RunningPod(f"{name}-n0", {CPU: 1000}),
                             RunningPod(f"{name}-n0", {CPU: 1000})),
                            started_at=1000.0 + 10 * i + k)
                for k in range(2)
            ]
            self.clusters[name] = StubMember(StubCache(gangs))
            self.snaps[name] = ClusterSnapshot(name=name, nodes=[NodeCapacity(
                f"{name}-n0", {CPU: 4000, MEMORY: 16 * GI}, {CPU: 4000}, pods_used=4)],
                resource_version="1")

    def snapshots(self, names: Iterable[str]) -> list[ClusterSnapshot]:
        return [self.snaps[n] for n in names]


def _activities(allowed: bool) -> tuple[SchedulingActivities, StubFleet]:
    stub = StubFleet()
    acts = SchedulingActivities(None, lambda: stub)  # type: ignore[arg-type,return-value]
    acts.capacity_preemption_on = lambda tree_id: allowed  # type: ignore[method-assign]
    return acts, stub


def _input(job: str, cpu: int = 1000, priority: int = 1000, **kw: Any) -> PlacementInput:
    gang = GangShape(groups=[PodGroupShape(role="Master", count=2, requests={CPU: cpu})],
                     priority=priority)
    return PlacementInput(job_ref=job, gang=gang, job_id=f"pytorchjob/{job}",
                          tree_workflow_id="quota/kube-system/t", **kw)


def test_a_plan_takes_one_gang_on_exactly_one_cluster_when_the_tree_allows() -> None:
    acts, _ = _activities(allowed=True)
    verdict = acts.plan_placement(_input("hi/job", capacity_preemption=True))
    assert verdict.candidates == []
    plan = verdict.capacity_plan
    assert plan is not None and plan.cluster in ("cluster-a", "cluster-b")
    (victim,) = plan.victims
    assert victim.job_id.startswith(f"pytorchjob/low/{plan.cluster}-")
    assert victim.message == f"room on {plan.cluster} for priority 1000 > 10"
    # never when the tree says Never, nor when not asked, nor for a lower priority
    never, _ = _activities(allowed=False)
    assert never.plan_placement(_input("hi/job", capacity_preemption=True)).capacity_plan is None
    assert acts.plan_placement(_input("hi/other")).capacity_plan is None
    assert acts.plan_placement(
        _input("hi/low", priority=10, capacity_preemption=True)).capacity_plan is None


def test_the_planned_victims_left_and_the_room_kept_for_the_preemptor() -> None:
    acts, stub = _activities(allowed=True)
    plan = acts.plan_placement(_input("hi/job", capacity_preemption=True)).capacity_plan
    assert plan is not None
    planned = CapacityPlanned(cluster=plan.cluster, victims=plan.victims)
    waiting = acts.plan_placement(_input("hi/job", planned=planned))
    assert waiting.victims_left == [plan.victims[0].job_id] and waiting.capacity_plan is None
    # the victim is gone: its room is the preemptor's, not another job's
    victim = plan.victims[0].job_id
    cache = stub.clusters[plan.cluster].cache
    cache.gangs = [g for g in cache.gangs if g.job_id != victim]
    snap = stub.snaps[plan.cluster]
    stub.snaps[plan.cluster] = ClusterSnapshot(name=snap.name, nodes=[NodeCapacity(
        snap.nodes[0].name, dict(snap.nodes[0].allocatable), {CPU: 2000}, pods_used=2)],
        resource_version="2")
    other = acts.plan_placement(_input("lo/again", priority=10))
    assert other.candidates == []
    mine = acts.plan_placement(_input("hi/job", planned=planned))
    assert [c.cluster for c in mine.candidates] == [plan.cluster]
    assert mine.victims_left == []
    # room found, the copy not yet bound: the room is still the preemptor's (its bind
    # releases the claim: tests/workflows/test_room_claims_two_workers.py)
    assert acts.plan_placement(_input("lo/again", priority=10)).candidates == []
    # its plan over without a bind (the next round asks for neither): anyone's again
    assert acts.plan_placement(_input("hi/job", cpu=1500)).candidates == []
    assert [c.cluster for c in acts.plan_placement(_input("lo/again", priority=10)).candidates
            ] == [plan.cluster]


def test_a_victim_in_the_plan_is_a_capacity_victim_message() -> None:
    v = CapacityVictim(job_id="pytorchjob/a/b", priority=1, grace_seconds=2, message="m")
    assert CapacityPlanned(cluster="x", victims=[v]).victims[0].grace_seconds == 2
