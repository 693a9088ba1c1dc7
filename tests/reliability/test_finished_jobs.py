"""Finished means finished, and a new apply is a new run (issue 24 item 4), end to end on
the embedded fleet, reading the member itself over its API:

* applying a finished job's manifest again runs it again, with new pods (other uids),
  instead of adopting the finished copy and reporting ``Succeeded`` without running;
* ``fleetq delete`` of a Succeeded job purges its PyTorchJob and pods from the member and
  the job is gone from ``get``; applying it after that runs it with new pods;
* deleting it again is NotFound, as ``kubectl delete`` of a deleted object is.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle

from fleetq.client.errors import NotFound
from fleetq.client.jobs import delete_job, get_job, list_jobs, start_job
from fleetq.member_contract import OWNER_LABEL, RUN_LABEL
from fleetq.messages import JobView
from fleetq.models import parse_job
from fleetq.naming import KF_JOB_NAME, job_workflow_id, owner_id
from fleetq.testing.chaos import HELD_RUN_SECONDS, complete_pods, job_manifest, policy_manifest
from tests.reliability.conftest import Stack

NS = "rerun"
CLUSTER = "cluster-a"


@pytest.fixture(scope="module", autouse=True)
async def rerun_policy(stack: Stack) -> None:
    """Jobs of namespace ``rerun`` go to cluster-a, unqueued (no quota involved)."""
    await stack.apply(policy_manifest(NS, clusters=[CLUSTER], queued=False, name="rerun"))


def member_state(stack: Stack, name: str) -> dict[str, Any]:
    """What cluster-a holds of the job, read from its API server with the kubernetes
    client: the PyTorchJob, its pods by uid, the job's Reservations."""
    owner = owner_id(job_workflow_id(NS, name))
    with stack.emulated.api_client(CLUSTER) as api:
        objects = client.CustomObjectsApi(api)
        try:
            copy = objects.get_namespaced_custom_object("kubeflow.org", "v1", NS,
                                                        "pytorchjobs", name)
        except ApiException as exc:
            assert exc.status == 404, exc
            copy = None
        pods = api.sanitize_for_serialization(client.CoreV1Api(api).list_namespaced_pod(
            NS, label_selector=f"{KF_JOB_NAME}={name}"))["items"]
        listed: Any = objects.list_cluster_custom_object(
            "scheduling.koordinator.sh", "v1alpha1", "reservations",
            label_selector=f"{OWNER_LABEL}={owner}")
        res = listed["items"]
    return {"copy": copy, "pods": {p["metadata"]["uid"]: p for p in pods},
            "reservations": res}


async def apply(stack: Stack, name: str, run_seconds: int) -> str:
    """What ``fleetq apply`` does for a PyTorchJob manifest."""
    manifest = job_manifest(NS, name)
    return await start_job(stack.client, parse_job(manifest), manifest, run_seconds=run_seconds)


def latest(stack: Stack, name: str) -> WorkflowHandle[Any, Any]:
    return stack.client.get_workflow_handle(job_workflow_id(NS, name))


async def wait_for(check: Any, what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        await asyncio.sleep(0.1)


async def run_to_success(stack: Stack, name: str, old_pods: set[str], *, held: bool = False
                         ) -> tuple[JobView, dict[str, Any]]:
    """The run just applied: it runs on new pods (none of ``old_pods``), its copy carries
    its own run id, and it succeeds (``held``: applied with HELD_RUN_SECONDS, its pods
    are completed once they run)."""
    handle = latest(stack, name)
    desc = await handle.describe()
    running = await stack.wait_state(handle, *(("Running",) if held else
                                               ("Running", "Succeeded")), timeout=60)
    assert running.cluster == CLUSTER
    state = member_state(stack, name)
    assert state["copy"] is not None
    assert state["copy"]["metadata"]["labels"][RUN_LABEL] == desc.run_id
    if held:
        await complete_pods(stack.emulated, CLUSTER, NS, name)
    view = await stack.wait_end(handle, timeout=60)
    assert view.state == "Succeeded", (view.state, view.reason)
    done = member_state(stack, name)
    assert done["pods"] and old_pods.isdisjoint(done["pods"]), "the new run reused old pods"
    assert all(p["metadata"]["labels"][RUN_LABEL] == desc.run_id for p in done["pods"].values())
    return view, done


async def test_apply_again_runs_a_finished_job_again_with_new_pods(stack: Stack) -> None:
    name = f"again-{uuid.uuid4().hex[:6]}"
    assert await apply(stack, name, run_seconds=1) == "created"
    _, first = await run_to_success(stack, name, set())
    created = {p["metadata"]["creationTimestamp"] for p in first["pods"].values()}

    # held: it runs until completed (in run_to_success), so it is still running when
    # applied again however slowly its state is seen
    assert await apply(stack, name, run_seconds=HELD_RUN_SECONDS) == "created"  # not unchanged
    # while it runs, the same apply is unchanged: one run per name at a time
    await stack.wait_state(latest(stack, name), "Scheduling", "Pending", "Created", "Running",
                           timeout=30)
    assert await apply(stack, name, run_seconds=HELD_RUN_SECONDS) == "unchanged (already exists)"
    view, second = await run_to_success(stack, name, set(first["pods"]), held=True)
    assert second["copy"]["metadata"]["uid"] != first["copy"]["metadata"]["uid"]
    later = {p["metadata"]["creationTimestamp"] for p in second["pods"].values()}
    assert max(created) <= min(later)
    assert view.finished_at is not None
    await delete_job(stack.client, NS, name, wait=True, timeout=60)


async def test_delete_of_a_succeeded_job_leaves_nothing_and_apply_runs_it_again(
        stack: Stack) -> None:
    name = f"delapply-{uuid.uuid4().hex[:6]}"
    assert await apply(stack, name, run_seconds=1) == "created"
    _, first = await run_to_success(stack, name, set())
    assert (await get_job(stack.client, NS, name)) is not None  # Succeeded stays listed

    await delete_job(stack.client, NS, name, wait=True, timeout=60)
    gone = member_state(stack, name)
    assert gone == {"copy": None, "pods": {}, "reservations": []}
    assert await get_job(stack.client, NS, name) is None
    assert name not in [v.name for v in await list_jobs(stack.client, NS)]
    desc = await latest(stack, name).describe()
    assert desc.status == WorkflowExecutionStatus.COMPLETED  # the purge run, done
    with pytest.raises(NotFound):  # a deleted job is gone: deleting it again is NotFound
        await delete_job(stack.client, NS, name, wait=True, timeout=60)

    assert await apply(stack, name, run_seconds=1) == "created"
    await run_to_success(stack, name, set(first["pods"]))
    await delete_job(stack.client, NS, name, wait=True, timeout=60)
    assert member_state(stack, name) == {"copy": None, "pods": {}, "reservations": []}


async def test_delete_waits_for_a_purge_under_way_and_apply_explains_it(stack: Stack) -> None:
    """A second delete while the first one purges waits for it (idempotent); an apply
    meanwhile is refused with one line, never a half-deleted job running again."""
    from fleetq.client.errors import ClientError

    name = f"delrace-{uuid.uuid4().hex[:6]}"
    assert await apply(stack, name, run_seconds=1) == "created"
    await run_to_success(stack, name, set())
    member = stack.fleet.get(CLUSTER)
    stack.emulated.set_reachable(CLUSTER, False)  # the purge waits for the member
    try:
        await delete_job(stack.client, NS, name, wait=False, timeout=60)
        with pytest.raises(ClientError, match=f"PyTorchJob {NS}/{name} is being deleted"):
            await apply(stack, name, run_seconds=1)
        with pytest.raises(ClientError, match="continues in the background"):
            await delete_job(stack.client, NS, name, wait=True, timeout=1)
        assert await get_job(stack.client, NS, name) is None  # deleted, being purged
    finally:
        stack.emulated.clear_faults(CLUSTER)
        stack.emulated.set_reachable(CLUSTER, True)
    await delete_job(stack.client, NS, name, wait=True, timeout=60)  # waits for that one
    assert member_state(stack, name) == {"copy": None, "pods": {}, "reservations": []}
    await wait_for(lambda: member.capacity().reachable, "cluster-a reachable again")
