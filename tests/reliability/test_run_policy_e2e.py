"""Upstream PyTorchJob shapes and runPolicy end to end on the embedded fleet (dev server,
emulated members, the real adapter), judged on the members themselves: a Master-only
job and an elastic Worker-only job run; activeDeadlineSeconds ends a job Failed with its
copy purged; a job the member deletes after it finished (ttlSecondsAfterFinished) stays
Succeeded and is never dispatched again; suspend and resume."""

from __future__ import annotations

import asyncio
import copy
import time
import uuid
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus

from fleetq.messages import JobView
from fleetq.naming import job_workflow_id
from fleetq.testing.chaos import (
    HELD_RUN_SECONDS,
    activity_scheduled,
    complete_pods,
    history_events,
    job_manifest,
    member_copies,
    policy_manifest,
)
from tests.reliability.conftest import Stack

NS = "runpolicy"


async def start(stack: Stack, doc: dict[str, Any], run_seconds: int) -> Any:
    ns, name = doc["metadata"]["namespace"], doc["metadata"]["name"]
    arg = {"manifest": doc, "rewatch_seconds": 1.0, "run_seconds": run_seconds,
           "policy": policy_manifest(NS, queued=False, clusters=["cluster-a", "cluster-b"])}
    return await stack.client.start_workflow(
        "PyTorchJobWorkflow", arg, id=job_workflow_id(ns, name), task_queue="fleetq")


def job(prefix: str, **run_policy: Any) -> dict[str, Any]:
    doc = job_manifest(NS, f"{prefix}-{uuid.uuid4().hex[:6]}")
    if run_policy:
        doc["spec"]["runPolicy"] = run_policy
    return doc


def member_pods(stack: Stack, cluster: str, name: str) -> list[dict[str, Any]]:
    return [p for p in stack.emulated.objects(cluster, "pods")
            if p["metadata"].get("namespace") == NS
            and (p["metadata"].get("labels") or {}).get("training.kubeflow.org/job-name") == name]


def reasons(view: JobView, reason: str) -> list[str]:
    # one entry per occurrence: a repeated event is kept once with its count
    return [e.message for e in view.events if e.reason == reason for _ in range(e.count)]


async def test_master_only_job_runs_as_a_single_pod(stack: Stack) -> None:
    doc = job("solo")
    del doc["spec"]["pytorchReplicaSpecs"]["Worker"]
    handle = await start(stack, doc, run_seconds=2)
    view = await stack.wait_end(handle, timeout=60)
    assert view.state == "Succeeded", view.reason
    (bound,) = reasons(view, "ScheduleBindingSucceed")
    assert bound.endswith(f"{{{view.cluster}:0,[{{master 1}}]}}")
    assert view.cluster is not None
    names = sorted(p["metadata"]["name"] for p in member_pods(stack, view.cluster, view.name))
    assert names == [f"{view.name}-master-0"]


async def test_elastic_worker_only_job_runs_from_its_minimum(stack: Stack) -> None:
    doc = job("elastic")
    specs = doc["spec"]["pytorchReplicaSpecs"]
    del specs["Master"]
    specs["Worker"]["replicas"] = 3
    doc["spec"]["elasticPolicy"] = {"minReplicas": 2, "maxReplicas": 3, "rdzvBackend": "c10d"}
    handle = await start(stack, doc, run_seconds=2)
    view = await stack.wait_end(handle, timeout=60)
    assert view.state == "Succeeded", view.reason
    assert view.gang == "gang minimum 2 of 3 pods (elasticPolicy.minReplicas)"
    assert view.cluster is not None
    names = sorted(p["metadata"]["name"] for p in member_pods(stack, view.cluster, view.name))
    assert names == [f"{view.name}-worker-{i}" for i in range(3)]
    (member_job,) = [o for o in stack.emulated.objects(view.cluster, "pytorchjobs")
                     if o["metadata"]["name"] == view.name]
    # the member copy keeps the manifest as written, with the gang minimum fleetq placed
    assert member_job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 3
    assert member_job["spec"]["runPolicy"]["schedulingPolicy"]["minAvailable"] == 2


async def test_active_deadline_fails_the_job_and_purges_the_member_copy(stack: Stack) -> None:
    handle = await start(stack, job("deadline", activeDeadlineSeconds=3), run_seconds=600)
    view = await stack.wait_end(handle, timeout=60)
    assert view.state == "Failed"
    assert view.reason.startswith("DeadlineExceeded"), view.reason
    assert view.bound_at is not None
    (exceeded,) = [e for e in view.events if e.reason == "DeadlineExceeded"]
    assert 3 <= (exceeded.time - view.bound_at).total_seconds() < 10  # a busy worker is late
    assert member_copies(stack.emulated, NS, view.name) == {}


async def test_a_job_its_member_deletes_after_success_is_never_dispatched_again(
        stack: Stack) -> None:
    doc = job("ttl", ttlSecondsAfterFinished=0, cleanPodPolicy="All")
    handle = await start(stack, doc, run_seconds=2)
    name = doc["metadata"]["name"]
    view = await stack.wait_end(handle, timeout=60)
    assert view.state == "Succeeded", view.reason
    assert len(reasons(view, "ScheduleBindingSucceed")) == 1
    # the member deleted its copy (TTL 0), and nobody made another one
    deadline = time.monotonic() + 10
    while member_copies(stack.emulated, NS, name):
        assert time.monotonic() < deadline, "the member never applied the TTL"
        await asyncio.sleep(0.1)
    # "Nobody made another one", asserted on what could make one: the workflow is closed
    # (it schedules nothing more) and its history bound exactly once.
    assert (await handle.describe()).status == WorkflowExecutionStatus.COMPLETED
    binds = [e for e in await history_events(handle)
             if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
             and e.activity_task_scheduled_event_attributes.activity_type.name == "bind"]
    assert len(binds) == 1
    assert member_copies(stack.emulated, NS, name) == {}


async def test_suspend_purges_the_copy_and_releases_nothing_held_then_resume_runs_it(
        stack: Stack) -> None:
    doc = job("susp")
    name = doc["metadata"]["name"]
    # held: it runs until completed below, so the suspend signal finds it running however
    # late it is sent
    handle = await start(stack, doc, run_seconds=HELD_RUN_SECONDS)
    running = await stack.wait_state(handle, "Running")
    assert member_copies(stack.emulated, NS, name) == {running.cluster: 1}
    await handle.signal("suspend")
    view = await stack.wait_state(handle, "Suspended")
    assert view.cluster is None
    assert member_copies(stack.emulated, NS, name) == {}
    assert all(not member_pods(stack, c, name) for c in ("cluster-a", "cluster-b"))
    await handle.signal("resume")
    running = await stack.wait_state(handle, "Running")
    await complete_pods(stack.emulated, str(running.cluster), running.namespace, running.name)
    view = await stack.wait_end(handle, timeout=60)
    assert view.state == "Succeeded"
    assert [e.reason for e in view.events if e.reason in ("Suspended", "Resumed")] == [
        "Suspended", "Resumed"]
    assert len(reasons(view, "ScheduleBindingSucceed")) == 2


async def test_suspended_at_submission_creates_nothing_until_resumed(stack: Stack) -> None:
    doc = job("held", suspend=True)
    name = doc["metadata"]["name"]
    handle = await start(stack, copy.deepcopy(doc), run_seconds=2)
    view = await stack.wait_state(handle, "Suspended")
    # Nothing created while suspended, asserted on the events, not over a pause: no
    # reserve or bind was ever scheduled, and no copy exists.
    events = await history_events(handle)
    assert not activity_scheduled(events, "reserve") and not activity_scheduled(events, "bind")
    assert member_copies(stack.emulated, NS, name) == {} and view.cluster is None
    await handle.signal("resume")
    view = await stack.wait_end(handle, timeout=60)
    assert view.state == "Succeeded"
    assert view.cluster is not None
    # the member copy runs: fleetq carries out the suspension, not the member
    (member_job,) = [o for o in stack.emulated.objects(view.cluster, "pytorchjobs")
                     if o["metadata"]["name"] == name]
    assert member_job["spec"].get("runPolicy", {}).get("suspend") is not True
