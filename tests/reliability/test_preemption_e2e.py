"""Quota preemption and reclaim end to end on the embedded fleet (dev server, emulated
members, the real adapter and worker), judged on the members and the quota workflow: a
high-priority job preempts the running low one in a ``kube-queue/max-jobs: 1`` leaf (the
low one's copy is gone from every member before the high one's exists, and it runs
again afterwards); a team below its ``min`` takes quota back from a borrower; an
opted-out job is never preempted. A sampler reads the quota workflow all along: no
node's usage ever exceeds its ``max``."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from temporalio.client import WorkflowHandle

from fleetq.messages import QuotaView
from fleetq.naming import job_workflow_id, quota_workflow_id
from fleetq.testing.chaos import (
    HELD_RUN_SECONDS,
    complete_held,
    job_manifest,
    member_copies,
    policy_manifest,
    tree_manifest,
)
from fleetq.testing.history import grants_in, grants_received
from tests.reliability.conftest import LEAVES, REL_TREE, Stack

pytestmark = [pytest.mark.timeout(180)]

JOBS = "kube-queue/max-jobs"
LOW, HIGH = 10, 1000
PRIO_NS, BORROW_NS, OWN_NS = "pre-prio", "pre-borrow", "pre-own"


def preempting_tree() -> dict[str, Any]:
    """The reliability tree plus a ``max-jobs: 1`` leaf and a two-team subtree (owner:
    min 1 job, borrower: min 0, both max 2, sharing 2), with preemption and reclaim on."""
    doc = tree_manifest(LEAVES, max_jobs=100, name=REL_TREE)
    doc["metadata"]["annotations"] = {
        "fleetq.io/preemption": "LowerPriority",
        "fleetq.io/reclaim": "Any",
    }
    children = doc["spec"]["root"]["children"]
    children.append({"name": PRIO_NS, "namespaces": [PRIO_NS],
                     "max": {"cpu": "100", "memory": "1000Gi", JOBS: 1}})
    children.append({
        "name": "pre-team", "min": {JOBS: 2}, "max": {JOBS: 2},
        "children": [
            {"name": BORROW_NS, "namespaces": [BORROW_NS], "min": {JOBS: 0}, "max": {JOBS: 2}},
            {"name": OWN_NS, "namespaces": [OWN_NS], "min": {JOBS: 1}, "max": {JOBS: 2}},
        ],
    })
    return doc


class UsageSampler:
    """Reads the quota workflow's view every 50 ms; keeps every (node, resource) seen
    above its ``max``."""

    def __init__(self, stack: Stack) -> None:
        self._handle = stack.client.get_workflow_handle(quota_workflow_id("kube-system",
                                                                          REL_TREE))
        self.over: list[str] = []
        self.samples = 0

    async def run(self) -> None:
        while True:
            view = QuotaView.model_validate(await self._handle.query("view"))
            self.samples += 1
            for q in view.queues:
                for k, limit in q.max.items():
                    if q.usage.get(k, 0) > limit:
                        self.over.append(f"{q.node} {k} {q.usage[k]} > {limit}")
            await asyncio.sleep(0.05)


@pytest_asyncio.fixture(scope="module")
async def preempting(stack: Stack) -> AsyncIterator[Stack]:
    original = copy.deepcopy(stack.tree)
    await stack.apply_tree(preempting_tree())
    try:
        yield stack
    finally:
        await stack.apply_tree(original)


@pytest_asyncio.fixture
async def sampler(preempting: Stack) -> AsyncIterator[UsageSampler]:
    s = UsageSampler(preempting)
    task = asyncio.ensure_future(s.run())
    try:
        yield s
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert s.samples > 0
    assert s.over == [], s.over


def job(namespace: str, prefix: str, priority: int, **annotations: str) -> dict[str, Any]:
    doc = job_manifest(namespace, f"{prefix}-{uuid.uuid4().hex[:6]}")
    for spec in doc["spec"]["pytorchReplicaSpecs"].values():
        spec["template"]["spec"]["priority"] = priority
    doc["metadata"]["annotations"] = annotations
    return doc


async def start(stack: Stack, doc: dict[str, Any], run_seconds: int, toleration: int = 2
                ) -> WorkflowHandle[Any, Any]:
    ns = doc["metadata"]["namespace"]
    arg = {"manifest": doc, "rewatch_seconds": 1.0, "run_seconds": run_seconds,
           "policy": policy_manifest(ns, queued=True, toleration=toleration)}
    return await stack.client.start_workflow(
        "PyTorchJobWorkflow", arg, id=job_workflow_id(ns, doc["metadata"]["name"]),
        task_queue="fleetq")


def messages(view: Any, reason: str) -> list[str]:
    # one entry per occurrence: a repeated event is kept once with its count
    return [e.message for e in view.events if e.reason == reason for _ in range(e.count)]


async def high_preempts_running_low(
        stack: Stack, suffix: str, grace: str, toleration: int = 2,
) -> tuple[dict[str, Any], WorkflowHandle[Any, Any], dict[str, Any],
           WorkflowHandle[Any, Any], Any]:
    """A held low job (preemption grace ``grace``) runs in the one-job leaf, then a held
    high one comes: both documents and handles, and the high one's view once bound."""
    low_doc = job(PRIO_NS, f"low{suffix}", LOW,
                  **{"fleetq.io/preemption-grace-seconds": grace})
    low = await start(stack, low_doc, run_seconds=HELD_RUN_SECONDS, toleration=toleration)
    await stack.wait_state(low, "Running", timeout=60)
    high_doc = job(PRIO_NS, f"high{suffix}", HIGH)
    high = await start(stack, high_doc, run_seconds=HELD_RUN_SECONDS)
    high_view = await stack.wait_state(high, "Created", "Running", timeout=60)
    return low_doc, low, high_doc, high, high_view


async def both_run_to_success(stack: Stack, high: WorkflowHandle[Any, Any], high_view: Any,
                              low: WorkflowHandle[Any, Any]) -> Any:
    """The high job completes where it runs, then the low one runs again (its second
    bind) and completes: the low job's last view."""
    assert await complete_held(stack.emulated, high) == high_view.cluster
    assert (await stack.wait_end(high, timeout=60)).state == "Succeeded"
    await complete_held(stack.emulated, low, binds=2)
    low_view = await stack.wait_end(low, timeout=90)
    assert low_view.state == "Succeeded", low_view.reason
    return low_view


async def test_priority_preemption_in_a_one_job_leaf(preempting: Stack,
                                                    sampler: UsageSampler) -> None:
    stack = preempting
    # both held (they run until completed below): the low job still runs when the high
    # one comes, and the high one still holds the leaf while the low one is looked at
    low_doc, low, high_doc, high, high_view = await high_preempts_running_low(stack, "", "1")
    # the victim's copy was purged before the preemptor was bound: none left anywhere
    assert member_copies(stack.emulated, PRIO_NS, low_doc["metadata"]["name"]) == {}
    assert member_copies(stack.emulated, PRIO_NS, high_doc["metadata"]["name"]) == {
        high_view.cluster: 1}
    assert high_view.cluster is not None
    low_view = await stack.view(low)
    assert low_view.state == "Queued" and not low_view.admitted
    high_name = high_doc["metadata"]["name"]
    assert messages(low_view, "Preempted") == [
        f"preempted by {PRIO_NS}/{high_name}: priority {HIGH} > {LOW}; stopping within 1s"
    ]
    # the low job runs again, from the queue, and completes
    low_view = await both_run_to_success(stack, high, high_view, low)
    assert len(messages(low_view, "Admitted")) == 2
    assert len(messages(low_view, "ScheduleBindingSucceed")) == 2


async def test_reclaim_from_a_borrower_for_a_team_below_min(preempting: Stack,
                                                           sampler: UsageSampler) -> None:
    stack = preempting
    borrowers = [job(BORROW_NS, f"b{i}", LOW, **{"fleetq.io/preemption-grace-seconds": "1"})
                 for i in range(2)]
    # all held (they run until completed below): both borrowers still run when the owner
    # comes, and the owner still holds its quota while the borrowers are looked at
    handles = []
    for doc in borrowers:
        handles.append(await start(stack, doc, run_seconds=HELD_RUN_SECONDS))
        await stack.wait_state(handles[-1], "Running", timeout=60)
    mine_doc = job(OWN_NS, "mine", LOW)  # same priority: reclaim Any
    mine = await start(stack, mine_doc, run_seconds=HELD_RUN_SECONDS)
    await stack.wait_state(mine, "Created", "Running", timeout=60)
    # the most recently admitted borrower gave way; the first kept running
    second = await stack.view(handles[1])
    assert messages(second, "Preempted") == [
        f"preempted by {OWN_NS}/{mine_doc['metadata']['name']}: reclaim for {OWN_NS} "
        "below min; stopping within 1s"
    ]
    assert second.state == "Queued" and second.cluster is None
    assert member_copies(stack.emulated, BORROW_NS, borrowers[1]["metadata"]["name"]) == {}
    assert (await stack.view(handles[0])).state == "Running"
    await complete_held(stack.emulated, mine)
    assert (await stack.wait_end(mine, timeout=60)).state == "Succeeded"
    # the preempted borrower runs again (its second bind); the first one ran all along
    await complete_held(stack.emulated, handles[1], binds=2)
    await complete_held(stack.emulated, handles[0])
    for h in handles:
        assert (await stack.wait_end(h, timeout=90)).state == "Succeeded"


async def test_an_opted_out_job_is_never_preempted(preempting: Stack,
                                                  sampler: UsageSampler) -> None:
    stack = preempting
    # held: it runs until completed below, so the high job is sure to find it running
    keep_doc = job(PRIO_NS, "keep", LOW, **{"fleetq.io/preemptible": "false"})
    keep = await start(stack, keep_doc, run_seconds=HELD_RUN_SECONDS)
    await stack.wait_state(keep, "Running", timeout=60)
    high = await start(stack, job(PRIO_NS, "urgent", HIGH), run_seconds=1)
    await stack.wait_state(high, "Queued", timeout=30)
    await complete_held(stack.emulated, keep)
    keep_view = await stack.wait_end(keep, timeout=60)
    assert keep_view.state == "Succeeded" and messages(keep_view, "Preempted") == []
    high_view = await stack.wait_end(high, timeout=60)
    assert high_view.state == "Succeeded"
    assert keep_view.finished_at is not None and high_view.bound_at is not None
    assert high_view.bound_at >= keep_view.finished_at


def _payloads_mention(event: Any, *needles: bytes) -> bool:
    """Whether one payload of ``event`` (a marker's details or an update's input)
    contains every one of ``needles``."""
    payloads: list[Any] = []
    if event.HasField("marker_recorded_event_attributes"):
        for entry in event.marker_recorded_event_attributes.details.values():
            payloads += entry.payloads
    if event.HasField("workflow_execution_update_accepted_event_attributes"):
        request = event.workflow_execution_update_accepted_event_attributes.accepted_request
        payloads += request.input.args.payloads
    return any(all(n in p.data for n in needles) for p in payloads)


async def test_the_tree_purges_a_victim_without_grace_and_admits_its_preemptor_at_once(
        preempting: Stack, sampler: UsageSampler) -> None:
    """A victim with no grace period (docs/decisions/023): the quota workflow purges its
    copy itself (a local activity) and grants the preemptor before the victim's own
    ``requeue`` has arrived, in the reply to the preemptor's own enqueue (no ``admitted``
    signal); the victim still ends queued, with no copy anywhere, keeps its place and
    runs again once the preemptor is done."""
    stack = preempting
    low_doc, low, high_doc, high, high_view = await high_preempts_running_low(stack, "0", "0")
    assert member_copies(stack.emulated, PRIO_NS, low_doc["metadata"]["name"]) == {}
    low_view = await stack.wait_state(low, "Queued", timeout=60)
    assert messages(low_view, "Preempted") == [
        f"preempted by {PRIO_NS}/{high_doc['metadata']['name']}: priority {HIGH} > {LOW}; "
        "stopping within 0s"
    ]
    # in the quota workflow's history: its purge of the victim, then the preemptor's grant
    # (the reply to its enqueue), and only after that the victim's own requeue
    tree_id = quota_workflow_id("kube-system", REL_TREE)
    events: list[Any] = []
    async for run in stack.client.list_workflows(f"WorkflowId = '{tree_id}'"):
        handle = stack.client.get_workflow_handle(tree_id, run_id=run.run_id)
        events += (await handle.fetch_history()).events
    low_id = job_workflow_id(PRIO_NS, low_doc["metadata"]["name"]).encode()
    high_id = job_workflow_id(PRIO_NS, high_doc["metadata"]["name"])
    purged = [i for i, e in enumerate(events)
              if _payloads_mention(e, b"purge_for_preemption")]  # (its one victim)
    granted = [i for i, e in enumerate(events) if high_id in grants_in(e)]
    requeued = [i for i, e in enumerate(events)
                if _payloads_mention(e, b'"requeue"', low_id)]
    assert purged and granted and requeued, (purged, granted, requeued)
    assert purged[0] < granted[0] < requeued[0]
    assert [events[i].WhichOneof("attributes") for i in granted] == [
        "workflow_execution_update_completed_event_attributes"]
    (got,) = grants_received((await high.fetch_history()).events)
    assert got.HasField("marker_recorded_event_attributes")  # signal_quota's answer
    low_view = await both_run_to_success(stack, high, high_view, low)
    assert len(messages(low_view, "Admitted")) == 2


async def test_a_victim_that_fails_over_at_once_when_the_tree_purged_it_still_stops(
        preempting: Stack, sampler: UsageSampler) -> None:
    """docs/decisions/023, its third constraint: the victim's watch may see its copy gone
    (the quota workflow purged it) before the ``preempt`` signal arrives. With
    ``tolerationSeconds: 0`` it may fail over at once and bind a copy elsewhere; the
    signal then stops that copy too. It ends queued with no copy on any member, the
    preemptor runs, and the victim runs again afterwards."""
    stack = preempting
    low_doc, low, high_doc, high, high_view = await high_preempts_running_low(
        stack, "-tol0", "0", toleration=0)
    low_view = await stack.wait_state(low, "Queued", timeout=60)
    assert len(messages(low_view, "Preempted")) == 1
    assert member_copies(stack.emulated, PRIO_NS, low_doc["metadata"]["name"]) == {}
    assert member_copies(stack.emulated, PRIO_NS, high_doc["metadata"]["name"]) == {
        high_view.cluster: 1}
    await both_run_to_success(stack, high, high_view, low)
