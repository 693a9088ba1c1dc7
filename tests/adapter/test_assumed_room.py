"""A burst placed by one worker from one snapshot: each gang the placement activity
places is assumed on its nodes until its bind (kube-scheduler's assumed pods), so the
next placements do not pick the same node. Before this, every gang of a burst was put on
the member's best node: on a member with Reservations all but one reservation failed
there ("Insufficient cpu") and the jobs spilled to another member. Read on the member
itself, on the emulated member (Reservations) and on the real one (guarded binds)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from temporalio.testing import ActivityEnvironment

from activities.fleet import Fleet
from activities.member_cluster import KubernetesMemberCluster
from activities.scheduling import SchedulingActivities
from fleetq import resources as R
from fleetq.messages import (
    BindInput,
    BindRequest,
    Candidate,
    GangShape,
    JobRef,
    PlacementInput,
    PodReservation,
    ReserveRequest,
)
from fleetq.models import Gang, gang_of, parse_job

from .conftest import eventually, manifest, member

CPU = "1500m"  # two such pods fill most of a 4-cpu node


def idle(m: KubernetesMemberCluster) -> bool:
    """The member's cached snapshot shows nothing running (earlier tests' jobs gone)."""
    snap = m.capacity()
    return snap.reachable and all(not n.requested for n in snap.nodes)


def plan(acts: SchedulingActivities, job: JobRef, gang: Gang, cluster: str) -> Candidate:
    verdict = acts.plan_placement(PlacementInput(
        job_ref=job.ref, gang=GangShape.from_gang(gang), job_id=job.workflow_id,
        affinity={"clusterNames": [cluster]}, assume=True))
    (candidate,) = verdict.candidates
    return candidate


def bind_input(m: KubernetesMemberCluster, job: JobRef, doc: dict[str, Any], gang: Gang,
               cand: Candidate) -> BindInput:
    reserve = None
    if m.reservation:  # each pod on the node placement chose, as the job workflow asks
        reserve = ReserveRequest(job=job, pods=[
            PodReservation(role=p.role, index=p.index, node=cand.assignment[p.name_suffix],
                           requests=p.requests) for p in gang.pods])
    return BindInput(cluster=cand.cluster, reserve=reserve,
                     request=BindRequest(job=job, manifest=doc, run_seconds=30))


def test_a_burst_placed_from_one_snapshot_gets_its_own_nodes_and_binds_there(
    fleet: Fleet, names: dict[str, str], job_factory: Callable[..., JobRef]
) -> None:
    m = member(fleet, names["c"])
    eventually(lambda: idle(m), timeout_s=150)
    acts = SchedulingActivities(None, fleet)
    nodes = {n.name: n for n in m.capacity().nodes}
    jobs = [job_factory("burst") for _ in range(len(nodes))]
    docs = [manifest(j, cpu=CPU) for j in jobs]
    gangs = [gang_of(parse_job(d)) for d in docs]

    # every plan made before any bind, as a burst's are: together they fit the nodes
    chosen = [plan(acts, j, g, m.name) for j, g in zip(jobs, gangs, strict=True)]
    taken: dict[str, dict[str, int]] = {}
    for gang, cand in zip(gangs, chosen, strict=True):
        for pod in gang.pods:
            node = cand.assignment[pod.name_suffix]
            taken[node] = R.add(taken.get(node, {}), pod.requests)
    for node, requests in taken.items():
        assert R.fits(requests, nodes[node].allocatable), (node, requests)
    # the plan of one more gang finds no room left there
    extra = job_factory("burst")
    late = acts.plan_placement(PlacementInput(
        job_ref=extra.ref, gang=GangShape.from_gang(gang_of(parse_job(manifest(extra, cpu=CPU)))),
        job_id=extra.workflow_id, affinity={"clusterNames": [m.name]}))
    assert late.candidates == []

    # each binds where it was placed: no reservation lost, no bind refused
    for job, doc, gang, cand in zip(jobs, docs, gangs, chosen, strict=True):
        result = ActivityEnvironment().run(acts.bind, bind_input(m, job, doc, gang, cand))
        assert result.created and not result.reservation_lost, result
    for job in jobs:
        assert m.api.get(m._job_path(job.namespace, job.name)) is not None
