"""The ``bind`` activity reserves, then binds, as one member write; a retried attempt (its
first one's answer lost) makes no second copy and no second set of reservations: read on
the member itself."""

from __future__ import annotations

import dataclasses
import uuid

from temporalio.testing import ActivityEnvironment

from activities.scheduling import SchedulingActivities
from fleetq.messages import BindInput, BindRequest, JobRef, PodReservation, ReserveRequest
from fleetq.naming import job_workflow_id
from fleetq.testing.chaos import job_manifest, job_reservations, member_copies
from tests.reliability.conftest import Stack

NS = "faults"
CLUSTER = "cluster-a"


def test_a_retried_bind_makes_no_second_copy_or_reservation(stack: Stack) -> None:
    acts = SchedulingActivities(stack.env.client, stack.fleet)
    node = stack.emulated.objects(CLUSTER, "nodes")[0]["metadata"]["name"]
    name = f"retry-{uuid.uuid4().hex[:6]}"
    job = JobRef(namespace=NS, name=name, workflow_id=job_workflow_id(NS, name))
    pods = [PodReservation(role="Master", index=0, node=node,
                           requests={"cpu": 100, "memory": 128 * 1024 * 1024 * 1000})]
    inp = BindInput(
        cluster=CLUSTER,
        request=BindRequest(job=job, manifest=job_manifest(NS, name, workers=0)),
        reserve=ReserveRequest(job=job, pods=pods),
    )
    env = ActivityEnvironment()
    first = env.run(acts.bind, inp)
    assert first.created and not first.reservation_lost
    held = job_reservations(stack.emulated, job.workflow_id, [CLUSTER])
    assert len(held) == 1
    env.info = dataclasses.replace(env.info, attempt=2)  # its answer was lost: retried
    again = env.run(acts.bind, inp)
    assert not again.created and again.uid == first.uid and not again.reservation_lost
    assert member_copies(stack.emulated, NS, name, [CLUSTER]) == {CLUSTER: 1}
    names = [r[1] for r in job_reservations(stack.emulated, job.workflow_id, [CLUSTER])]
    assert len(names) <= 1 and set(names) <= {held[0][1]}
