"""Quota preemption and reclaim carried out by the real workflows (the quota workflow and
the job workflows) over scripted member clusters, on the dev server in real time: a
high-priority job preempts the running low one, which is purged, gives its quota back
and queues again with its original submit time; a team below its ``min`` takes quota
back from a borrower; an opted-out job is never preempted; bad annotations are refused
in one line."""

from __future__ import annotations

import copy
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from temporalio.api.enums.v1 import EventType
from temporalio.client import (
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.exceptions import ApplicationError
from temporalio.runtime import MetricBuffer
from temporalio.testing import WorkflowEnvironment

from fleetq.admission import WaitInfo
from fleetq.cli.describe import describe_lines
from fleetq.messages import JobEvent, JobView
from fleetq.naming import job_workflow_id
from fleetq.registry import RegistryState
from fleetq.testing.history import local_activity_type
from tests.workflows.fakes import (
    counted,
    load,
    metered_client,
    policy,
    view_of,
    walkthrough_job,
)
from tests.workflows.test_e2e import record
from tests.workflows.test_quota_workflow import Env, _env, wait_for
from workflows.fleet_registry import FleetRegistryWorkflow
from workflows.quota_tree import QuotaTreeWorkflow, QuotaView

pytestmark = [pytest.mark.timeout(120)]

LOW, HIGH = 10, 1000


class Metered(Env):
    metrics: MetricBuffer

    def counted(self, name: str, label: str) -> dict[str, int]:
        return counted(self.metrics, name, label)


@pytest_asyncio.fixture
async def penv(dev_env: WorkflowEnvironment) -> AsyncIterator[Metered]:
    """The workers of ``_env`` on a client whose runtime keeps the metrics in a buffer."""
    client, buffer = await metered_client(dev_env)
    async for e in _env(dev_env, client):
        e.fleet.clusters["cluster-a"].timeline = [(0.5, "Healthy", "Running", "")]
        metered = Metered(e.env, e.tq, e.fleet)
        metered.metrics = buffer
        yield metered


def preempting_tree(**annotations: str) -> dict[str, Any]:
    """The walkthrough tree (leaf child-2, namespace default, ``kube-queue/max-jobs: 1``)
    with ``annotations``."""
    doc = copy.deepcopy(load("elasticquotatree.yaml"))
    doc["metadata"]["annotations"] = annotations
    return doc


def job(name: str, priority: int, namespace: str = "default", **annotations: str
        ) -> dict[str, Any]:
    doc = walkthrough_job(name, namespace, Master={"priority": priority})
    doc["metadata"]["annotations"] = annotations
    return doc


async def start(env: Env, manifest: dict[str, Any]) -> WorkflowHandle[Any, Any]:
    ns, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
    doc = policy(queued=True)
    doc["metadata"]["namespace"] = ns
    return await env.env.client.start_workflow(
        "PyTorchJobWorkflow",
        {"manifest": manifest, "policy": doc, "rewatch_seconds": 1.0},
        id=job_workflow_id(ns, name),
        task_queue=env.tq,
    )


async def in_state(handle: WorkflowHandle[Any, Any], *states: str) -> JobView:
    holder: list[JobView] = []

    async def reached() -> bool:
        holder[:] = [await view_of(handle)]
        return holder[0].state in states

    await wait_for(reached, timeout=60)
    return holder[0]


def named(view: JobView, reason: str) -> list[JobEvent]:
    return [e for e in view.events if e.reason == reason]


async def quota_view(qh: WorkflowHandle[Any, Any]) -> QuotaView:
    return QuotaView.model_validate(await qh.query(QuotaTreeWorkflow.view))


async def finish(env: Env, handle: WorkflowHandle[Any, Any]) -> JobView:
    name = handle.id.rsplit("/", 1)[1]
    env.fleet.job("cluster-a", name).set("Healthy", "Succeeded")
    return JobView.model_validate(await handle.result())


async def test_high_priority_preempts_the_running_low_job_which_runs_again_after(
        penv: Metered) -> None:
    qh = await penv.start_tree(preempting_tree(**{"fleetq.io/preemption": "LowerPriority"}))
    low = await start(penv, job("low", LOW, **{"fleetq.io/preemption-grace-seconds": "2"}))
    await in_state(low, "Running")
    later = await start(penv, job("later", LOW))  # same priority, submitted after low
    await wait_for(lambda: _waiting(qh, 1))
    high = await start(penv, job("high", HIGH))
    # (how the high job waits for its victim through the victim's grace period, as the
    # quota workflow and ``fleetq describe`` show it, is checked on a victim held for
    # 600 s: ``stopping_victim``; this one's 2 s could pass between two queries)

    # the victim is purged, gives its quota back and queues again; the high job runs
    await in_state(high, "Running")
    low_view = await in_state(low, "Queued")
    assert low_view.cluster is None and not low_view.admitted
    (preempted,) = named(low_view, "Preempted")
    assert preempted.type == "Warning"
    assert preempted.message == (
        "preempted by default/high: priority 1000 > 10; stopping within 2s"
    )
    assert penv.fleet.calls.index(("purge", "cluster-a")) < [
        i for i, c in enumerate(penv.fleet.calls) if c == ("bind", "cluster-a")
    ][1], "the victim's copy is purged before the preemptor is bound"
    view = await quota_view(qh)
    assert view.holders == 1 and view.preempting == {} and view.preemptions_sent == 1
    assert penv.counted("fleetq_preemptions", "reason") == {"Priority": 1}

    # keeping its original submit time, low goes before the later job of its priority
    high_view = await finish(penv, high)
    assert high_view.state == "Succeeded"
    await in_state(low, "Running")
    assert (await view_of(later)).state == "Queued"
    low_view = await finish(penv, low)
    assert low_view.state == "Succeeded"
    # admitted twice: one event counted twice (repeats aggregate, as kubectl shows them)
    assert sum(e.count for e in named(low_view, "Admitted")) == 2
    assert len(named(low_view, "Preempted")) == 1
    await in_state(later, "Running")
    assert (await finish(penv, later)).state == "Succeeded"
    view = await quota_view(qh)
    assert view.holders == 0 and view.waiting == 0
    assert all(not any(q.usage.values()) for q in view.queues)
    # FLEETQ_RECORD_HISTORIES=1: the replay test then guards the preemption paths
    await record(low, "preempted-victim")
    await record(high, "preemptor")
    await record(qh, "quota-preemption")


async def stopping_victim(env: Env, qh: WorkflowHandle[Any, Any], victim: str,
                          preemptor: str) -> tuple[WorkflowHandle[Any, Any],
                                                   WorkflowHandle[Any, Any]]:
    """A low job ``victim`` Running with a 600 s grace period, and a high ``preemptor``
    whose preemption plan names it: the victim is stopping."""
    low = await start(env, job(victim, LOW, **{"fleetq.io/preemption-grace-seconds": "600"}))
    await in_state(low, "Running")
    high = await start(env, job(preemptor, HIGH))

    async def planned() -> bool:
        return (await quota_view(qh)).preempting == {high.id: [low.id]}

    await wait_for(planned)
    # the preemptor waits for its victim, which keeps running through its grace period
    waiting = f"waiting for 1 preempted job to release quota: default/{victim}"
    info = await wait_info(qh, high.id)
    assert info is not None and info.victims == [low.id] and info.reason == waiting
    # what ``fleetq describe`` shows of the waiting preemptor
    assert f"Waiting:      {waiting}" in describe_lines(await view_of(high), info)

    async def told() -> bool:
        return bool(named(await view_of(low), "Preempted"))

    await wait_for(told)
    (preempted,) = named(await view_of(low), "Preempted")
    assert preempted.type == "Warning"
    assert preempted.message == (
        f"preempted by default/{preemptor}: priority 1000 > 10; stopping within 600s")
    assert (await view_of(low)).state == "Running"  # still, within its grace period
    return low, high


async def test_a_victim_terminated_while_stopping_is_released_and_the_plan_completes(
        penv: Env) -> None:
    qh = await penv.start_tree(
        preempting_tree(**{"fleetq.io/preemption": "LowerPriority"}), leak_check_seconds=1)
    low, high = await stopping_victim(penv, qh, "doomed", "next")
    await low.terminate("gone while stopping")
    # the holder check returns the victim's quota; the preemptor is admitted and runs
    await in_state(high, "Running")
    view = await quota_view(qh)
    assert view.preempting == {} and low.id in view.leaks_recovered
    assert (await finish(penv, high)).state == "Succeeded"


async def test_a_victim_with_nothing_bound_gives_way_at_once(penv: Metered) -> None:
    cluster = penv.fleet.clusters["cluster-a"]
    cluster.fits = False  # admitted by quota, but no member has room: Pending
    qh = await penv.start_tree(preempting_tree(**{"fleetq.io/preemption": "LowerPriority"}))
    low = await start(penv, job("stuck", LOW, **{"fleetq.io/preemption-grace-seconds": "600"}))
    await in_state(low, "Pending")
    high = await start(penv, job("first", HIGH))
    # no grace period to sit out: nothing of the victim runs anywhere
    await wait_for(lambda: _admitted(high))
    low_view = await in_state(low, "Queued")
    (preempted,) = named(low_view, "Preempted")
    assert preempted.message.endswith("nothing bound: queued again now")
    assert penv.fleet.count("bind") == 0
    cluster.fits = True
    await high.signal("retry_placement")
    await in_state(high, "Running")
    assert (await finish(penv, high)).state == "Succeeded"
    await in_state(low, "Running")
    assert (await finish(penv, low)).state == "Succeeded"
    assert (await quota_view(qh)).holders == 0


async def test_a_victim_deleted_while_stopping_releases_and_the_preemptor_runs(
        penv: Metered) -> None:
    qh = await penv.start_tree(preempting_tree(**{"fleetq.io/preemption": "LowerPriority"}))
    low, high = await stopping_victim(penv, qh, "dropped", "wanted")
    await low.cancel()  # fleetq delete: its copy is purged and its quota released
    await in_state(high, "Running")
    assert (await view_of(low)).state == "Deleted"
    assert low.id not in (await quota_view(qh)).leaks_recovered  # released by itself
    assert (await finish(penv, high)).state == "Succeeded"


async def _admitted(handle: WorkflowHandle[Any, Any]) -> bool:
    return (await view_of(handle)).admitted


async def test_an_opted_out_job_is_never_preempted_and_the_high_one_waits(penv: Env) -> None:
    qh = await penv.start_tree(preempting_tree(**{"fleetq.io/preemption": "LowerPriority"}))
    low = await start(penv, job("keep", LOW, **{"fleetq.io/preemptible": "false"}))
    await in_state(low, "Running")
    high = await start(penv, job("urgent", HIGH))
    # the quota workflow decides in the pass that queues the high job
    await wait_for(lambda: _waiting(qh, 1))
    view = await quota_view(qh)
    assert view.preempting == {} and view.preemptions_sent == 0
    info = await wait_info(qh, high.id)
    assert info is not None and info.victims == []
    assert "kube-queue/max-jobs" in info.reason
    assert named(await view_of(low), "Preempted") == []
    # it runs once the opted-out job is done
    assert (await finish(penv, low)).state == "Succeeded"
    await in_state(high, "Running")
    assert (await finish(penv, high)).state == "Succeeded"


async def test_a_team_below_min_reclaims_quota_from_a_borrower(penv: Metered) -> None:
    jobs = "kube-queue/max-jobs"
    doc = copy.deepcopy(load("elasticquotatree.yaml"))
    doc["metadata"]["annotations"] = {"fleetq.io/reclaim": "Any"}
    doc["spec"]["root"]["max"][jobs] = 2
    doc["spec"]["root"]["min"][jobs] = 2
    doc["spec"]["root"]["children"] = [
        {"name": "borrower", "namespaces": ["borrow"], "min": {jobs: 0}, "max": {jobs: 2}},
        {"name": "owner", "namespaces": ["own"], "min": {jobs: 1}, "max": {jobs: 2}},
    ]
    qh = await penv.start_tree(doc)
    first = await start(penv, job("b-first", LOW, "borrow"))
    await in_state(first, "Running")
    second = await start(penv, job("b-second", LOW, "borrow", **{
        "fleetq.io/preemption-grace-seconds": "0"}))
    await in_state(second, "Running")
    mine = await start(penv, job("mine", LOW, "own"))  # same priority: reclaim Any
    await in_state(mine, "Running")
    # the most recently admitted borrower gave way, the other one kept running
    second_view = await in_state(second, "Queued")
    (preempted,) = named(second_view, "Preempted")
    assert preempted.message == (
        "preempted by own/mine: reclaim for owner below min; stopping within 0s"
    )
    assert (await view_of(first)).state == "Running"
    view = await quota_view(qh)
    assert view.holders == 2 and view.waiting == 1
    assert penv.counted("fleetq_preemptions", "reason") == {"Reclaim": 1}
    # the borrower runs again once there is room
    assert (await finish(penv, mine)).state == "Succeeded"
    await in_state(second, "Running")
    for h in (first, second):
        assert (await finish(penv, h)).state == "Succeeded"


async def test_a_victim_without_grace_gives_its_quota_back_before_its_watch_ends(
        penv: Metered) -> None:
    """A Running victim with no grace period: its copy purged, it sends its quota back at
    once, without first waiting for the watch it had open on that copy (held open here,
    as a real watch stays open until it sees the copy go): no settle timer between the
    purge and the requeue, and the preemptor runs while that watch is still open."""
    qh = await penv.start_tree(preempting_tree(**{"fleetq.io/preemption": "LowerPriority"}))
    low_doc = job("nograce", LOW, **{"fleetq.io/preemption-grace-seconds": "0"})
    low = await start(penv, low_doc)
    await in_state(low, "Running")
    member = penv.fleet.clusters["cluster-a"]
    member.hold_watches.add(low_doc["metadata"]["name"])
    try:
        async def watch_held() -> bool:
            return member.held_watches > 0

        await wait_for(watch_held)  # the victim's next watch is open on its copy
        high = await start(penv, job("nograce-high", HIGH))
        await in_state(high, "Running")
        assert member.hold_watches and member.held_watches == 1  # still open
        events = (await low.fetch_history()).events
        kinds = [EventType.Name(e.event_type) for e in events]
        # the purge is a local activity (docs/decisions/019) and the requeue follows it
        # in the same workflow task: nothing between the two markers
        purged = max(i for i, e in enumerate(events) if local_activity_type(e) == "purge")
        requeued = next(i for i, e in enumerate(events) if i > purged
                        and local_activity_type(e) is not None)
        assert local_activity_type(events[requeued]) == "signal_quota"
        assert requeued == purged + 1, kinds[purged:]
        assert (await view_of(low)).state == "Queued"
    finally:
        member.release_watches()
    # the quota workflow purged the victim itself (docs/decisions/023) before granting
    assert ("purge_for_preemption", "nograce") in penv.fleet.calls
    assert (await finish(penv, high)).state == "Succeeded"
    await in_state(low, "Running")
    assert (await finish(penv, low)).state == "Succeeded"
    # FLEETQ_RECORD_HISTORIES=1: the replay test then guards the tree's own purge
    await record(low, "preempted-victim-at-once")
    await record(qh, "quota-preemption-at-once")


async def test_bad_preemption_annotations_are_refused_in_one_line(penv: Env) -> None:
    qh = await penv.start_tree(preempting_tree())
    with pytest.raises(WorkflowUpdateFailedError) as info:
        await qh.execute_update(
            QuotaTreeWorkflow.apply_tree, preempting_tree(**{"fleetq.io/reclaim": "always"}))
    message = str(info.value.cause)
    assert message.endswith(
        "ElasticQuotaTree kube-system/elasticquotatree: metadata.annotations."
        "fleetq.io/reclaim must be Never, LowerPriority or Any, got 'always'")
    assert "\n" not in message
    assert (await quota_view(qh)).policy == "Priority"  # the tree in force is untouched
    # the fleet registry refuses to keep such a tree too (a direct update, not `fleetq apply`)
    registry = await penv.env.client.start_workflow(
        FleetRegistryWorkflow.run, RegistryState(), id=f"registry-{uuid.uuid4().hex[:8]}",
        task_queue=penv.tq)
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await registry.execute_update(
            FleetRegistryWorkflow.apply, preempting_tree(**{"fleetq.io/reclaim": "always"}))
    assert str(refused.value.cause).endswith("got 'always'")
    await registry.terminate()

    bad = await start(penv, job("bad", LOW, **{"fleetq.io/preemptible": "maybe"}))
    with pytest.raises(WorkflowFailureError) as caught:
        await bad.result()
    cause = caught.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "InvalidManifest"
    assert cause.message == (
        "PyTorchJob default/bad: metadata.annotations.fleetq.io/preemptible must be "
        "\"true\" or \"false\", got 'maybe'")


async def wait_info(qh: WorkflowHandle[Any, Any], job_id: str) -> WaitInfo | None:
    info = await qh.query(QuotaTreeWorkflow.wait_info, job_id)
    return None if info is None else WaitInfo.model_validate(info)


async def _waiting(qh: WorkflowHandle[Any, Any], n: int) -> bool:
    return (await quota_view(qh)).waiting == n

