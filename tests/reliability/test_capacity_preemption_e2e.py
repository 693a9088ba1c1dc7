"""Capacity preemption across clusters end to end (issue 18), on an embedded fleet of its
own: three member clusters of one 4-cpu node each, all full of low-priority two-pod jobs
(two per cluster, each pinned to its cluster by its policy, two of them opted out with
``fleetq.io/preemptible: "false"``). Quota admits a high-priority job of a tree with
``fleetq.io/preemption: LowerPriority``, but no member has room: it preempts on exactly
one cluster. Judged on the members themselves: only that cluster's victim copy was
deleted, the other clusters kept every copy, the preemptor was bound there, the victim
queued again and later ran, and no opted-out job was ever a victim."""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio
from temporalio.client import WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter

from activities.fleet import Fleet
from activities.scheduling import SchedulingActivities
from fleetq.cli.describe import describe_lines
from fleetq.emulator.fleet import EmulatedFleet
from fleetq.messages import JobView
from fleetq.naming import job_workflow_id
from fleetq.testing.chaos import (
    HELD_RUN_SECONDS,
    complete_held,
    job_manifest,
    member_copies,
    member_copy_uids,
    policy_manifest,
)
from fleetq.topology import parse_topology
from tests.conftest import quick_fleet_config, start_dev_server
from tests.reliability.conftest import CONNECT_S, READ_S, LogCapture, RequestLog, Stack
from tests.workflows.test_e2e import record
from worker import build_worker

pytestmark = [pytest.mark.timeout(240)]

MEMBERS = ("cluster-a", "cluster-b", "cluster-c")
LOW, HIGH = 10, 1000
LOW_NS, HIGH_NS = "cap-low", "cap-high"
TIGHT_NS = "cap-tight"  # a leaf with room for one job at a time (issue 24)
GRACE = 3


def topology() -> dict[str, Any]:
    node = {"count": 1, "cpu": "4", "memory": "16Gi", "pods": 110}
    return {"clusters": [{"name": "hub", "member": False}]
            + [{"name": c, "nodeGroups": [dict(node)]} for c in MEMBERS]}


def tree() -> dict[str, Any]:
    """Two leaves (the victims' and the preemptor's) with room for every job: quota
    admits them all; only the members are full. A third, ``cap-tight``, holds one job
    at a time: there a victim's quota is what a later job of its priority waits for."""
    leaf = {"cpu": "100", "memory": "1000Gi", "kube-queue/max-jobs": 100}
    return {
        "apiVersion": "scheduling.sigs.k8s.io/v1beta1", "kind": "ElasticQuotaTree",
        "metadata": {"name": "cap-tree", "namespace": "kube-system",
                     "annotations": {"fleetq.io/preemption": "LowerPriority"}},
        "spec": {"root": {
            "name": "root", "max": {"cpu": "1000", "memory": "10000Gi"},
            "min": {"cpu": "1000", "memory": "10000Gi"},
            "children": [{"name": ns, "namespaces": [ns], "max": dict(leaf)}
                         for ns in (LOW_NS, HIGH_NS)]
            + [{"name": TIGHT_NS, "namespaces": [TIGHT_NS],
                "max": {**leaf, "kube-queue/max-jobs": 1}}]}},
    }


@pytest_asyncio.fixture(scope="module")
async def fleet3(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    env = await start_dev_server(data_converter=pydantic_data_converter,
                                 dev_server_log_level="error")
    out = tmp_path_factory.mktemp("cap-emulator")
    emulated = EmulatedFleet(parse_topology(topology()), out_dir=out, start_delay=0.2).start()
    cfg = quick_fleet_config(emulated.fleet_config_path, out / "fleet-cap.yaml",
                             CONNECT_S, READ_S)
    fleet = Fleet.from_config(cfg)
    logs = LogCapture()
    logs.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    worker = build_worker(env.client, SchedulingActivities(env.client, fleet,
                                                           search_attributes=True))
    st = Stack(env, emulated, fleet, cfg, RequestLog(), logs)
    try:
        async with worker:
            await st.apply_tree(tree())
            yield st
    finally:
        fleet.close()
        emulated.stop()
        await env.shutdown()


def low_job(cluster: str, index: int, *, preemptible: bool) -> dict[str, Any]:
    doc = job_manifest(LOW_NS, f"low-{cluster[-1]}{index}-{uuid.uuid4().hex[:4]}", cpu="1")
    for spec in doc["spec"]["pytorchReplicaSpecs"].values():
        spec["template"]["spec"]["priority"] = LOW
    doc["metadata"]["annotations"] = (
        {"fleetq.io/preemption-grace-seconds": str(GRACE)} if preemptible
        else {"fleetq.io/preemptible": "false"})
    return doc


def high_job() -> dict[str, Any]:
    doc = job_manifest(HIGH_NS, f"high-{uuid.uuid4().hex[:6]}", cpu="1")
    for spec in doc["spec"]["pytorchReplicaSpecs"].values():
        spec["template"]["spec"]["priority"] = HIGH
    return doc


async def start(stack: Stack, doc: dict[str, Any], clusters: tuple[str, ...], run_seconds: int
                ) -> WorkflowHandle[Any, Any]:
    ns = doc["metadata"]["namespace"]
    arg = {"manifest": doc, "rewatch_seconds": 1.0, "run_seconds": run_seconds,
           "policy": policy_manifest(ns, queued=True, clusters=clusters)}
    return await stack.client.start_workflow(
        "PyTorchJobWorkflow", arg, id=job_workflow_id(ns, doc["metadata"]["name"]),
        task_queue="fleetq")


def messages(view: JobView, reason: str) -> list[str]:
    # one entry per occurrence: a repeated event is kept once with its count
    return [e.message for e in view.events if e.reason == reason for _ in range(e.count)]


def copies(stack: Stack, doc: dict[str, Any]) -> dict[str, int]:
    return member_copies(stack.emulated, doc["metadata"]["namespace"], doc["metadata"]["name"],
                         MEMBERS)


def copy_uids(stack: Stack, doc: dict[str, Any]) -> set[str]:
    return member_copy_uids(stack.emulated, doc["metadata"]["namespace"],
                            doc["metadata"]["name"], MEMBERS)


def running_pods(stack: Stack, cluster: str) -> int:
    return sum(1 for p in stack.emulated.objects(cluster, "pods")
               if (p.get("status") or {}).get("phase") == "Running")


async def wait_view(stack: Stack, handle: WorkflowHandle[Any, Any],
                    ok: Callable[[JobView], bool], timeout: float = 60.0) -> JobView:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        view = await stack.view(handle)
        if ok(view):
            return view
        if loop.time() > deadline:
            raise AssertionError(f"{handle.id}: not as expected within {timeout}s "
                                 f"({view.state}: {view.reason})")
        await asyncio.sleep(0.05)


async def wait_until(what: str, check: Any, timeout: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await check():
        if loop.time() > deadline:
            raise AssertionError(f"not {what} within {timeout}s")
        await asyncio.sleep(0.1)


async def test_capacity_preemption_chooses_one_of_three_full_clusters(fleet3: Stack) -> None:
    stack = fleet3
    # every cluster full: one preemptible and one opted-out low job each, the opted-out
    # ones started last (least work lost: a cost-only choice would take them first).
    # Every job is held (it runs until the test completes it), so the members are still
    # full when the preemptor comes and it still runs while it is looked at, however
    # slow the machine.
    lows: dict[str, list[dict[str, Any]]] = {c: [] for c in MEMBERS}
    handles: dict[str, WorkflowHandle[Any, Any]] = {}
    for preemptible in (True, False):
        for c in MEMBERS:
            doc = low_job(c, len(lows[c]), preemptible=preemptible)
            lows[c].append(doc)
            handles[doc["metadata"]["name"]] = await start(stack, doc, (c,),
                                                           run_seconds=HELD_RUN_SECONDS)
    for h in handles.values():
        await stack.wait_state(h, "Running", timeout=60)

    async def full() -> bool:
        return all(running_pods(stack, c) == 4 for c in MEMBERS)

    await wait_until("every member full", full)
    first_copies = {doc["metadata"]["name"]: copy_uids(stack, doc)
                    for docs in lows.values() for doc in docs}

    high_doc = high_job()
    high_name = high_doc["metadata"]["name"]
    high = await start(stack, high_doc, MEMBERS, run_seconds=HELD_RUN_SECONDS)
    # the preemptor says where it preempts, and whom. (Its reason "waiting for 1
    # preempted job to leave <cluster>" lasts only the victim's grace period, too short
    # to be sure to be seen on a loaded machine: tests/workflows/
    # test_capacity_preemption.py checks it and its describe line; the event stays.)
    announced = await wait_view(stack, high, lambda v: bool(messages(v, "Preempting")))
    (preempting,) = messages(announced, "Preempting")
    found = re.match(r"no member has room: preempting 1 lower-priority job on (\S+) \(",
                     preempting)
    assert found is not None, preempting
    chosen = found.group(1)
    assert chosen in MEMBERS
    assert f"on {chosen} (room on {chosen} for priority {HIGH} > {LOW})" in preempting
    victim_doc, opted_out_doc = lows[chosen]
    assert f": {LOW_NS}/{victim_doc['metadata']['name']}; dropped after " in preempting, \
        preempting
    assert any("Preempting" in line and preempting in line
               for line in describe_lines(announced)), describe_lines(announced)

    high_view = await stack.wait_state(high, "Created", "Running", timeout=60)
    assert high_view.cluster == chosen
    assert copies(stack, high_doc) == {chosen: 1}
    assert messages(high_view, "Preempting") == [preempting]

    # exactly one victim: the preemptible job of the chosen cluster; its copy is gone,
    # every other job kept its copy, still runs and was never told to stop. (Every low
    # job is held, and the preemptor took the victim's room: the victim cannot be
    # placed again yet.)
    victim = handles[victim_doc["metadata"]["name"]]
    assert not copy_uids(stack, victim_doc) & first_copies[victim_doc["metadata"]["name"]]
    assert copies(stack, victim_doc) == {}
    victim_view = await stack.view(victim)
    assert messages(victim_view, "Preempted") == [
        f"preempted by {HIGH_NS}/{high_name}: room on {chosen} for priority {HIGH} > {LOW}; "
        f"stopping within {GRACE}s"
    ]
    assert victim_view.state in ("Queued", "Scheduling", "Pending"), victim_view.state
    assert any("queued again with its original submit time" in e.message
               or e.reason == "Queued" for e in victim_view.events), \
        [e.message for e in victim_view.events]
    for c in MEMBERS:
        for doc in lows[c]:
            if doc is victim_doc:
                continue
            name = doc["metadata"]["name"]
            assert copies(stack, doc) == {c: 1}, (name, copies(stack, doc))
            assert copy_uids(stack, doc) == first_copies[name], name
            view = await stack.view(handles[name])
            assert view.state == "Running", (name, view.state)
            assert messages(view, "Preempted") == [], name
    assert (await stack.view(handles[opted_out_doc["metadata"]["name"]])).cluster == chosen

    assert await complete_held(stack.emulated, high) == chosen
    high_end = await stack.wait_end(high, timeout=60)
    assert high_end.state == "Succeeded", high_end.reason
    await record(high, "capacity-preemptor")
    # the victim runs again once there is room, from the queue, and completes
    assert await complete_held(stack.emulated, victim, binds=2) == chosen
    victim_end = await stack.wait_end(victim, timeout=120)
    assert victim_end.state == "Succeeded", victim_end.reason
    assert len(messages(victim_end, "Admitted")) == 2
    assert len(messages(victim_end, "ScheduleBindingSucceed")) == 2
    await record(victim, "capacity-victim")
    for c in MEMBERS:
        for doc in lows[c]:
            if doc is not victim_doc:
                assert await complete_held(stack.emulated, handles[doc["metadata"]["name"]]) == c
    for name, h in handles.items():
        end = await stack.wait_end(h, timeout=120)
        assert end.state == "Succeeded", (name, end.reason)
        if h is not victim:
            assert messages(end, "Preempted") == [], name


async def test_opted_out_jobs_are_never_capacity_victims(fleet3: Stack) -> None:
    stack = fleet3
    docs = [(c, low_job(c, i, preemptible=False)) for c in MEMBERS for i in range(2)]
    # held: they run until completed below, so the high job is sure to find no room
    handles = [await start(stack, d, (c,), run_seconds=HELD_RUN_SECONDS) for c, d in docs]
    for h in handles:
        await stack.wait_state(h, "Running", timeout=60)
    high = await start(stack, high_job(), MEMBERS, run_seconds=1)
    pending = await stack.wait_state(high, "Pending", timeout=60)
    assert messages(pending, "Preempting") == []
    for h, (c, _) in zip(handles, docs, strict=True):
        assert await complete_held(stack.emulated, h) == c
    ends = [await stack.wait_end(h, timeout=60) for h in handles]
    assert all(e.state == "Succeeded" and messages(e, "Preempted") == [] for e in ends)
    high_end = await stack.wait_end(high, timeout=60)
    assert high_end.state == "Succeeded", high_end.reason
    assert messages(high_end, "Preempting") == []
    first_end = min(e.finished_at for e in ends if e.finished_at is not None)
    assert high_end.bound_at is not None and high_end.bound_at >= first_end


async def test_a_capacity_victim_is_readmitted_before_a_later_job_of_its_priority(
    fleet3: Stack,
) -> None:
    """Issue 24: a capacity-preemption victim gives its quota back and queues again in
    one step (the ``requeue`` message, ``fleetq.admission.Admission.requeue``), so the
    later job of its priority waiting in its one-job leaf does not take the room: the
    victim is admitted again first, binds on its member again, and only once it has
    finished does the later job get the quota and a copy. Read on the member."""
    stack = fleet3
    # cluster-a is full: the victim (2 cpu, preemptible) and an opted-out filler
    victim_doc = low_job("cluster-a", 0, preemptible=True)
    victim_doc["metadata"]["namespace"] = TIGHT_NS
    filler_doc = low_job("cluster-a", 1, preemptible=False)
    # held (they run until completed below): the victim still holds its quota and its
    # room, and the filler its room, whenever the later and the high job come
    victim = await start(stack, victim_doc, ("cluster-a",), run_seconds=HELD_RUN_SECONDS)
    filler = await start(stack, filler_doc, ("cluster-a",), run_seconds=HELD_RUN_SECONDS)
    for h in (victim, filler):
        await stack.wait_state(h, "Running", timeout=60)
    # a later job of the victim's priority in its leaf: queued behind the victim's quota
    later_doc = low_job("cluster-b", 0, preemptible=True)
    later_doc["metadata"]["namespace"] = TIGHT_NS
    later = await start(stack, later_doc, ("cluster-b",), run_seconds=1)
    await wait_view(stack, later, lambda v: v.state == "Queued" and not v.admitted)
    # a high-priority job that only cluster-a may hold preempts the victim there
    high_doc = high_job()
    # held too: it still runs (and keeps cluster-a full) while it is looked at
    high = await start(stack, high_doc, ("cluster-a",), run_seconds=HELD_RUN_SECONDS)
    high_view = await stack.wait_state(high, "Created", "Running", timeout=60)
    assert high_view.cluster == "cluster-a"
    readmitted = await wait_view(
        stack, victim, lambda v: len(messages(v, "Admitted")) == 2, timeout=60)
    # the victim is back first: the later job still waits and has no copy anywhere
    later_view = await stack.view(later)
    assert not later_view.admitted and later_view.state == "Queued", later_view.state
    assert copies(stack, later_doc) == {}
    (preempted,) = [e for e in readmitted.events if e.reason == "Preempted"]
    # the preemptor ends: the victim binds on cluster-a again, then ends too
    assert await complete_held(stack.emulated, high) == "cluster-a"
    assert await complete_held(stack.emulated, victim, binds=2) == "cluster-a"
    victim_end = await stack.wait_end(victim, timeout=120)
    assert victim_end.state == "Succeeded", victim_end.reason
    assert len(messages(victim_end, "ScheduleBindingSucceed")) == 2
    later_end = await stack.wait_end(later, timeout=120)
    assert later_end.state == "Succeeded", later_end.reason
    (later_admitted,) = [e for e in later_end.events if e.reason == "Admitted"]
    second_admission = [e for e in readmitted.events if e.reason == "Admitted"][-1]
    assert preempted.time <= second_admission.time <= later_admitted.time
    assert (await stack.wait_end(high, timeout=60)).state == "Succeeded"
    assert await complete_held(stack.emulated, filler) == "cluster-a"
    assert (await stack.wait_end(filler, timeout=120)).state == "Succeeded"
