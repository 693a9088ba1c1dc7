"""Capacity preemption carried out by the real job workflows (issue 18) over a scripted
member whose placement activity plans it: a high-priority job that fits nowhere asks for
a plan only once a round found no room, tells its victim to stop (the victim's own
``preempt`` path: grace period, purge, release, queue again keeping its submit time),
waits for it (shown by ``describe``), is woken by it once purged, places on the planned
cluster, never plans twice meanwhile, and counts the preemption as ``Capacity``. A plan
that makes no room in time is dropped with an event and placement goes on."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.runtime import MetricBuffer
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from fleetq.cli.describe import describe_lines
from fleetq.client import connection
from fleetq.client.connection import DATA_CONVERTER
from fleetq.messages import (
    BindInput,
    BindResult,
    CapacityPlanned,
    CapacityVictim,
    JobView,
    PlacementInput,
    PlacementVerdict,
    PurgeInput,
    PurgeResult,
    QuotaTreeInput,
)
from fleetq.naming import job_workflow_id
from fleetq.testing.fake_fleet import ClusterScript, FakeFleet
from fleetq.testing.history import local_activity_type
from tests.workflows.fakes import (
    counted,
    load,
    metered_client,
    policy,
    view_of,
    walkthrough_job,
)
from tests.workflows.test_quota_workflow import wait_for
from workflows import ALL_WORKFLOWS
from workflows.quota_tree import QuotaTreeWorkflow

pytestmark = [pytest.mark.timeout(120)]

LOW, HIGH = 10, 1000
ROOM = "room on cluster-a for priority 1000 > 10"


@dataclass
class CapacityFleet(FakeFleet):
    """A :class:`FakeFleet` whose placement plans ``plan`` when asked for a capacity
    preemption and no cluster fits. Once a victim's copy is purged the room is the
    preemptor's only (``room_for``, as the real activity's claim), until it is bound.
    A planned victim's copy leaves (its purge returns) only once ``victims_leave`` is
    set: until then the preemptor waits for it, however late a test looks."""

    plan: CapacityPlanned | None = None
    room_for: str | None = None
    purged: set[str] = field(default_factory=set)
    inputs: list[PlacementInput] = field(default_factory=list)
    binds: list[BindInput] = field(default_factory=list)
    victims_leave: asyncio.Event = field(default_factory=asyncio.Event)

    @activity.defn(name="plan_placement")
    async def plan_placement(self, inp: PlacementInput) -> PlacementVerdict:
        self.inputs.append(inp)
        cluster = self.clusters["cluster-a"]
        fits = cluster.fits
        cluster.fits = fits or self.room_for == inp.job_ref
        try:
            verdict = await FakeFleet.plan_placement(self, inp)
        finally:
            cluster.fits = fits
        if inp.planned is not None:
            verdict.victims_left = [
                v.job_id for v in inp.planned.victims
                if v.job_id.rsplit("/", 1)[1] not in self.purged
            ]
        elif inp.capacity_preemption and not verdict.candidates and self.plan is not None:
            verdict.capacity_plan = self.plan
        return verdict

    @activity.defn(name="purge")
    async def purge(self, inp: PurgeInput) -> PurgeResult:
        planned = self.plan is not None and any(
            v.job_id == inp.job.workflow_id for v in self.plan.victims
        )
        if planned:
            await self.victims_leave.wait()
        self.purged.add(inp.job.name)
        if planned:
            self.room_for = "default/high"
        return await FakeFleet.purge(self, inp)

    @activity.defn(name="bind")
    async def bind(self, inp: BindInput) -> BindResult:
        self.binds.append(inp)
        if inp.request.job.ref == self.room_for:
            self.room_for = None
        return await FakeFleet.bind(self, inp)


@dataclass
class CapEnv:
    env: WorkflowEnvironment
    client: Client
    tq: str
    fleet: CapacityFleet
    metrics: MetricBuffer | None = None
    #: every workflow a test started, terminated when it ends: one left running on the
    #: session's time-skipping server (the quota workflow never ends by itself) would
    #: hold its clock for the tests after it, whose workers no longer poll its queue
    started: list[WorkflowHandle[Any, Any]] = field(default_factory=list)

    def counted(self, name: str, label: str) -> dict[str, int]:
        assert self.metrics is not None
        return counted(self.metrics, name, label)

    async def start_tree(self) -> WorkflowHandle[Any, Any]:
        """The walkthrough tree with room for ten jobs in its leaf (quota admits every
        job: only the member is full) and capacity preemption on."""
        doc = copy.deepcopy(load("elasticquotatree.yaml"))
        doc["metadata"]["annotations"] = {"fleetq.io/preemption": "LowerPriority"}
        doc["spec"]["root"]["children"][0]["max"]["kube-queue/max-jobs"] = 10
        tree_id = f"quota/kube-system/{uuid.uuid4().hex[:8]}"
        self.fleet.tree_workflow_id = tree_id
        handle = await self.client.start_workflow(
            QuotaTreeWorkflow.run, QuotaTreeInput(tree=doc), id=tree_id,
            task_queue=f"{self.tq}-control")
        self.started.append(handle)
        return handle

    async def start(self, name: str, priority: int, **annotations: str
                    ) -> WorkflowHandle[Any, Any]:
        doc = walkthrough_job(name, "default", Master={"priority": priority})
        doc["metadata"]["annotations"] = annotations
        handle = await self.client.start_workflow(
            "PyTorchJobWorkflow",
            {"manifest": doc, "policy": policy(queued=True), "rewatch_seconds": 1.0},
            id=job_workflow_id("default", name),
            task_queue=self.tq,
        )
        self.started.append(handle)
        return handle


async def _cap_env(env: WorkflowEnvironment, client: Client,
                   metrics: MetricBuffer | None = None) -> AsyncIterator[CapEnv]:
    # every job bound there is Running half a second later
    script = ClusterScript(timeline=[(0.5, "Healthy", "Running", "")])
    fleet = CapacityFleet(clusters={"cluster-a": script},
                          policy_doc=policy(queued=True), client=client)
    tq = f"tq-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=f"{tq}-control", workflows=[QuotaTreeWorkflow],
                      activities=[fleet.check_holders, fleet.purge_for_preemption]), \
            Worker(client, task_queue=tq, workflows=ALL_WORKFLOWS,
                   activities=fleet.activities()):
        cap = CapEnv(env, client, tq, fleet, metrics)
        try:
            yield cap
        finally:
            fleet.victims_leave.set()  # (a test that failed holding a victim's purge)
            for handle in cap.started:
                with contextlib.suppress(RPCError):  # (it ended already)
                    await handle.terminate("test over")


@pytest_asyncio.fixture
async def cenv(dev_env: WorkflowEnvironment) -> AsyncIterator[CapEnv]:
    """Dev server (real time), on a client whose runtime keeps metrics in a buffer."""
    client, buffer = await metered_client(dev_env)
    async for e in _cap_env(dev_env, client, buffer):
        yield e


@pytest_asyncio.fixture
async def tcenv() -> AsyncIterator[CapEnv]:
    """A time-skipping server of its own (a plan's time bound passes at once): the test
    moves its clock, which must not touch the session's server other tests share."""
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=str(connection.test_server_path()), data_converter=DATA_CONVERTER)
    try:
        async for e in _cap_env(env, env.client):
            yield e
    finally:
        await env.shutdown()


async def until(handle: WorkflowHandle[Any, Any], ok: Any, timeout: float = 60) -> JobView:
    holder: list[JobView] = []

    async def reached() -> bool:
        holder[:] = [await view_of(handle)]
        return bool(ok(holder[0]))

    await wait_for(reached, timeout=timeout)
    return holder[0]


def messages(view: JobView, reason: str) -> list[str]:
    # one entry per occurrence: a repeated event is kept once with its count
    return [e.message for e in view.events if e.reason == reason for _ in range(e.count)]


async def test_the_preemptor_stops_one_victim_waits_for_it_and_takes_its_room(
        cenv: CapEnv) -> None:
    fleet = cenv.fleet
    await cenv.start_tree()
    low = await cenv.start("low", LOW, **{"fleetq.io/preemption-grace-seconds": "1"})
    await until(low, lambda v: v.state == "Running")
    fleet.clusters["cluster-a"].fits = False  # the member is full from now on
    fleet.plan = CapacityPlanned(cluster="cluster-a", victims=[
        CapacityVictim(job_id=low.id, priority=LOW, grace_seconds=1, message=ROOM)])
    high = await cenv.start("high", HIGH)

    waiting = await until(high, lambda v: v.reason.startswith("waiting for 1 preempted"))
    assert waiting.state == "Pending"
    assert waiting.reason == "waiting for 1 preempted job to leave cluster-a: default/low"
    assert f"Reason:       {waiting.reason}" in describe_lines(waiting)
    assert messages(waiting, "Preempting") == [
        f"no member has room: preempting 1 lower-priority job on cluster-a ({ROOM}): "
        "default/low; dropped after 61s"
    ]
    fleet.victims_leave.set()  # low's grace period is over: its purge returns now

    running = await until(high, lambda v: v.state == "Running")
    assert running.cluster == "cluster-a"
    low_view = await view_of(low)
    assert messages(low_view, "Preempted") == [
        f"preempted by default/high: {ROOM}; stopping within 1s"]
    assert low_view.state in ("Queued", "Pending") and low_view.cluster is None

    # capacity asked for only once a round had found no room; one plan, then only the
    # outstanding plan's victims were asked about until the job was bound
    high_rounds = [i for i in fleet.inputs if i.job_ref == "default/high"]
    assert not high_rounds[0].capacity_preemption and high_rounds[0].tree_workflow_id is None
    asked = [i for i in high_rounds if i.capacity_preemption]
    assert len(asked) == 1 and asked[0].job_id == high.id
    assert asked[0].tree_workflow_id == fleet.tree_workflow_id
    after = high_rounds[high_rounds.index(asked[0]) + 1:]
    assert after and all(i.planned == fleet.plan and not i.capacity_preemption for i in after)
    # the victim woke it once purged (no backoff waited out)
    signals = [e.workflow_execution_signaled_event_attributes.signal_name
               async for e in high.fetch_history_events()
               if e.HasField("workflow_execution_signaled_event_attributes")]
    assert "retry_placement" in signals
    assert cenv.counted("fleetq_preemptions", "reason") == {"Capacity": 1}
    # the victim purged as a local activity and gave its quota back in the same workflow
    # task (docs/decisions/019); the preemptor's bind releases the room claimed for it
    events = (await low.fetch_history()).events
    purged = max(i for i, e in enumerate(events) if local_activity_type(e) == "purge")
    requeued = next(i for i, e in enumerate(events)
                    if i > purged and local_activity_type(e) is not None)
    assert local_activity_type(events[requeued]) == "signal_quota"
    between = [EventType.Name(e.event_type) for e in events[purged:requeued]]
    assert "EVENT_TYPE_WORKFLOW_TASK_COMPLETED" not in between, between
    assert [b.release_room for b in fleet.binds if b.request.job.name == "high"] == [True]

    # the victim runs again once there is room, and completes
    fleet.job("cluster-a", "high").set("Healthy", "Succeeded")
    assert JobView.model_validate(await high.result()).state == "Succeeded"
    fleet.clusters["cluster-a"].fits = True
    await until(low, lambda v: v.state == "Running")
    fleet.job("cluster-a", "low").set("Healthy", "Succeeded")
    low_end = JobView.model_validate(await low.result())
    assert low_end.state == "Succeeded"
    assert sum(e.count for e in low_end.events if e.reason == "Admitted") == 2
    # (a bind of a job that preempted nobody has no room to release)
    assert [b.release_room for b in fleet.binds if b.request.job.name == "low"][0] is False


async def test_a_plan_that_makes_no_room_in_time_is_dropped_and_not_made_again(
        tcenv: CapEnv) -> None:
    fleet = tcenv.fleet
    fleet.clusters["cluster-a"].fits = False
    await tcenv.start_tree()
    # the planned victim's workflow is gone: nobody stops, no room is made
    fleet.plan = CapacityPlanned(cluster="cluster-a", victims=[
        CapacityVictim(job_id="pytorchjob/default/gone", priority=LOW, grace_seconds=5,
                       message=ROOM)])
    high = await tcenv.start("high", HIGH)
    # the victim's workflow is gone, so the signal to it fails and it is not waited for
    # (the reason says "waiting for 1 preempted job" only until that signal has failed)
    planned = await until(high, lambda v: bool(messages(v, "Preempting"))
                          and not v.reason.startswith("waiting for"))
    assert planned.reason == (
        "preempted jobs left cluster-a; placing there as soon as it has room")
    await tcenv.env.sleep(90)  # virtual time: past the plan's bound (5 s grace + 60 s)
    dropped = await until(high, lambda v: messages(v, "PreemptionDropped"))
    assert messages(dropped, "PreemptionDropped") == [
        "capacity preemption on cluster-a dropped: still no room there 65s after its "
        "preempted jobs were told to stop; placing as usual"
    ]
    assert dropped.state == "Pending" and not dropped.reason.startswith("waiting for")
    rounds = len(fleet.inputs)
    fleet.clusters["cluster-a"].fits = True
    # virtual time past the placement backoff's cap (60 s): the next round runs now, not
    # after up to a minute of real time (time skipping is locked while the test polls)
    await tcenv.env.sleep(120)
    await until(high, lambda v: v.state in ("Created", "Running"))
    high_rounds = [i for i in fleet.inputs if i.job_ref == "default/high"]
    assert sum(i.capacity_preemption for i in high_rounds) == 1  # never planned again
    assert len(fleet.inputs) > rounds
