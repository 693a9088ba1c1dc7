"""QuotaTreeWorkflow: the semaphore. Serialising by max-jobs, priority order, borrowing and
min guarantees, continue-as-new under load, leak recovery, bad tree updates."""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
import pytest_asyncio
from temporalio.client import WorkflowHandle, WorkflowUpdateFailedError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from fleetq.admission import AdmissionRequest
from fleetq.messages import JobView, QuotaBatch, QuotaMessage, QuotaReceipt
from fleetq.naming import job_workflow_id
from fleetq.testing.fake_fleet import ClusterScript, FakeFleet
from fleetq.testing.history import RunStats, grants_received, grants_sent, run_chain
from fleetq.testing.holder import HolderInput, QuotaHolder
from tests.workflows.fakes import load, policy, walkthrough_job
from workflows import ALL_WORKFLOWS
from workflows.quota_tree import SETTLE_SHARE, QuotaTreeInput, QuotaTreeWorkflow, QuotaView


def tree(children: list[dict[str, Any]], root_max: dict[str, Any] | None = None) -> dict[str, Any]:
    doc = copy.deepcopy(load("elasticquotatree.yaml"))
    doc["spec"]["root"]["children"] = children
    if root_max is not None:
        doc["spec"]["root"]["max"] = root_max
        doc["spec"]["root"]["min"] = root_max
    return doc


class Env:
    def __init__(self, env: WorkflowEnvironment, tq: str, fleet: FakeFleet) -> None:
        self.env, self.tq, self.fleet = env, tq, fleet

    async def start_tree(self, doc: dict[str, Any], **kw: Any) -> WorkflowHandle[Any, Any]:
        wid = f"quota/kube-system/{uuid.uuid4().hex[:8]}"
        self.fleet.tree_workflow_id = wid
        return await self.env.client.start_workflow(
            QuotaTreeWorkflow.run, QuotaTreeInput(tree=doc, **kw), id=wid,
            task_queue=f"{self.tq}-control",
        )

    async def holder(
        self,
        tree_id: str,
        name: str,
        namespace: str = "default",
        request: dict[str, int] | None = None,
        **kw: Any,
    ) -> WorkflowHandle[Any, Any]:
        return await self.env.client.start_workflow(
            QuotaHolder.run,
            HolderInput(
                tree_id=tree_id,
                namespace=namespace,
                request=request or {"kube-queue/max-jobs": 1000},
                **{"linger_seconds": 0.5, **kw},  # a late duplicate grant is counted
            ),
            id=f"holder/{name}-{uuid.uuid4().hex[:6]}",
            task_queue=self.tq,
        )


async def _env(env: WorkflowEnvironment, client: Any) -> AsyncIterator[Env]:
    fleet = FakeFleet(clusters={"cluster-a": ClusterScript()}, policy_doc=policy(queued=True),
                      client=client)
    tq = f"tq-{uuid.uuid4().hex[:8]}"
    # as worker.py deploys it: the quota workflow on a control task queue of its own, so
    # its workflow tasks never wait behind the jobs' (whose enqueues wait for them); and
    # as worker.py stops them: the jobs first, while the quota workflow still answers
    async with Worker(client, task_queue=f"{tq}-control", workflows=[QuotaTreeWorkflow],
                      activities=[fleet.check_holders, fleet.purge_for_preemption]), \
            Worker(client, task_queue=tq, workflows=[*ALL_WORKFLOWS, QuotaHolder],
                   activities=fleet.activities()):
        yield Env(env, tq, fleet)


@pytest_asyncio.fixture
async def qenv(dev_env: WorkflowEnvironment) -> AsyncIterator[Env]:
    """Dev server: real time, for semaphore behaviour under concurrency."""
    async for e in _env(dev_env, dev_env.client):
        yield e


@pytest_asyncio.fixture
async def tsq(ts_env: WorkflowEnvironment) -> AsyncIterator[Env]:
    """Time-skipping server: for jobs that run for minutes of workflow time."""
    async for e in _env(ts_env, ts_env.client):
        yield e


async def wait_for(pred: Any, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await pred():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def test_max_jobs_one_serialises_three_jobs(tsq: Env) -> None:
    qh = await tsq.start_tree(load("elasticquotatree.yaml"))
    tsq.fleet.clusters["cluster-a"].timeline = [(1, "Healthy", "Running", "")]
    handles = []
    for i in range(3):
        handles.append(
            await tsq.env.client.start_workflow(
                "PyTorchJobWorkflow",
                walkthrough_job(f"job-{i}"),
                id=job_workflow_id("default", f"job-{i}"),
                task_queue=tsq.tq,
            )
        )

    # the fake cluster never finishes a job by itself: finish them one by one
    views: list[JobView] = []
    for _ in range(3):

        async def one_running() -> bool:
            states = [JobView.model_validate(await h.query("status")).state for h in handles]
            return states.count("Running") + states.count("Created") == 1

        await wait_for(one_running)
        running = [
            h
            for h in handles
            if JobView.model_validate(await h.query("status")).state in ("Running", "Created")
        ]
        assert len(running) == 1  # max-jobs 1: never two at once
        name = running[0].id.rsplit("/", 1)[1]
        tsq.fleet.job("cluster-a", name).set("Healthy", "Succeeded")
        views.append(JobView.model_validate(await running[0].result()))
        handles.remove(running[0])
    for earlier, later in zip(views, views[1:], strict=False):
        assert later.bound_at is not None and earlier.finished_at is not None
        assert later.bound_at >= earlier.finished_at
    view = QuotaView.model_validate(await qh.query(QuotaTreeWorkflow.view))
    assert view.holders == 0 and view.waiting == 0
    assert all(not any(q.usage.values()) for q in view.queues)


async def test_high_priority_submitted_last_runs_before_earlier_low_ones(qenv: Env) -> None:
    qh = await qenv.start_tree(load("elasticquotatree.yaml"))
    first = await qenv.holder(qh.id, "first", hold=True)
    await wait_for(lambda: first.query(QuotaHolder.granted))
    lows = [await qenv.holder(qh.id, f"low-{i}", priority=0, hold=True) for i in range(2)]
    high = await qenv.holder(qh.id, "high", priority=1000, hold=True)
    await wait_for(lambda: _waiting(qh, 3))
    await first.signal(QuotaHolder.finish)
    await wait_for(lambda: high.query(QuotaHolder.granted))
    assert not await lows[0].query(QuotaHolder.granted)
    assert not await lows[1].query(QuotaHolder.granted)
    for h in [high, *lows]:
        await wait_for(lambda h=h: h.query(QuotaHolder.granted))
        await h.signal(QuotaHolder.finish)
        assert await h.result() == 1


async def _waiting(qh: WorkflowHandle[Any, Any], n: int) -> bool:
    return QuotaView.model_validate(await qh.query(QuotaTreeWorkflow.view)).waiting == n


async def test_borrowing_up_to_max_and_min_guarantee(qenv: Env) -> None:
    doc = tree(
        [
            {"name": "team-a", "min": {"cpu": 4}, "max": {"cpu": 8}, "namespaces": ["team-a"]},
            {"name": "team-b", "min": {"cpu": 4}, "max": {"cpu": 8}, "namespaces": ["team-b"]},
        ],
        root_max={"cpu": 8, "memory": "1Ti", "kube-queue/max-jobs": 100},
    )
    qh = await qenv.start_tree(doc)
    two_cpu = {"cpu": 2000, "kube-queue/max-jobs": 1000}
    # team-a borrows team-b's idle min: 4 jobs x 2 cpu = 8 cpu (its max), a 5th waits
    a = [await qenv.holder(qh.id, f"a{i}", "team-a", two_cpu, hold=True) for i in range(5)]
    await wait_for(lambda: _granted_count(a, 4))
    await wait_for(lambda: _waiting(qh, 1))
    (waiter,) = [h for h in a if not await h.query(QuotaHolder.granted)]
    info = await qh.query(QuotaTreeWorkflow.wait_info, waiter.id)
    assert info is not None and "cpu" in info.reason
    # team-b (below its min) is served before team-a's waiting borrower when room frees
    b = await qenv.holder(qh.id, "b0", "team-b", two_cpu, hold=True)
    await wait_for(lambda: _waiting(qh, 2))
    running = next(h for h in a if h is not waiter)
    await running.signal(QuotaHolder.finish)
    await wait_for(lambda: b.query(QuotaHolder.granted))
    assert not await waiter.query(QuotaHolder.granted)
    for h in [*(h for h in a if h is not running), b]:
        await wait_for(lambda h=h: h.query(QuotaHolder.granted))
        await h.signal(QuotaHolder.finish)
    await wait_for(lambda: _waiting(qh, 0))
    view = QuotaView.model_validate(await qh.query(QuotaTreeWorkflow.view))
    await wait_for(lambda: _holders(qh, 0))
    assert view.waiting == 0


async def _granted_count(handles: list[WorkflowHandle[Any, Any]], n: int) -> bool:
    got = [await h.query(QuotaHolder.granted) for h in handles]
    return sum(got) == n


async def _holders(qh: WorkflowHandle[Any, Any], n: int) -> bool:
    return QuotaView.model_validate(await qh.query(QuotaTreeWorkflow.view)).holders == n


async def _enqueued(qh: WorkflowHandle[Any, Any], n: int) -> bool:
    """``n`` jobs admitted or waiting: the quota workflow has processed their enqueues."""
    view = QuotaView.model_validate(await qh.query(QuotaTreeWorkflow.view))
    return view.holders + view.waiting == n


async def _load_through_continue_as_new(qenv: Env, via: str) -> list[RunStats]:
    """200 holders through a leaf of 10 while the quota workflow continues-as-new every
    ~150 events: every holder is admitted exactly once; returns the quota runs."""
    doc = tree([{"name": "busy", "max": {"kube-queue/max-jobs": 10}, "namespaces": ["default"]}])
    qh = await qenv.start_tree(doc, max_history_events=150)
    handles = await asyncio.gather(*(qenv.holder(qh.id, f"h{i}", via=via) for i in range(200)))
    counts = await asyncio.gather(*(h.result() for h in handles))
    assert counts == [1] * 200  # every job admitted exactly once
    view = QuotaView.model_validate(await qh.query(QuotaTreeWorkflow.view))
    assert view.generation >= 2, "the quota workflow should have continued-as-new"
    await wait_for(lambda: _holders(qh, 0))
    runs, _ = await run_chain(qenv.env.client, qh.id, qh.result_run_id)
    return runs


async def test_continue_as_new_under_load_loses_no_message_and_is_never_refused(
    qenv: Env,
) -> None:
    """Jobs' messages are updates, which never make Temporal refuse a continue-as-new: no
    workflow task fails, and no run grows far past its threshold while they keep coming
    (with one signal a message, runs overshoot and continue-as-new tasks are refused)."""
    runs = await _load_through_continue_as_new(qenv, "outbox")
    refused = sum(r.event_counts.get("workflow_task_failed", 0) for r in runs)
    assert refused == 0, f"{refused} quota workflow tasks failed: {runs}"
    # the threshold is checked after each task; while a run settles its deliveries it
    # still answers enqueues in their replies, up to half its threshold past it
    # (quota_tree.SETTLE_SHARE); the closing task adds its grants (2 events each, at
    # most 10) and its batch updates
    assert max(r.events for r in runs[:-1]) <= 150 * (1 + SETTLE_SHARE) + 60, [
        r.events for r in runs]


async def test_through_continue_as_new_a_job_admitted_at_once_is_answered_in_the_reply(
    qenv: Env,
) -> None:
    """With room for every job, no grant goes by signal, also around continue-as-new:
    an enqueue that arrives while a run settles is answered in its reply, not carried to
    the next run and granted there by signal (one write on the tree's execution each;
    at 400 enqueues/s with the database at 5 ms those signals stalled the tree)."""
    doc = tree([{"name": "roomy", "max": {"kube-queue/max-jobs": 1000},
                 "namespaces": ["default"]}])
    qh = await qenv.start_tree(doc, max_history_events=50)
    handles = await asyncio.gather(*(qenv.holder(qh.id, f"r{i}") for i in range(150)))
    assert await asyncio.gather(*(h.result() for h in handles)) == [1] * 150
    view = QuotaView.model_validate(await qh.query(QuotaTreeWorkflow.view))
    assert view.generation >= 2, "the quota workflow should have continued-as-new"
    _runs, events = await run_chain(qenv.env.client, qh.id, qh.result_run_id,
                                    keep_events=True)
    by = Counter(ev.WhichOneof("attributes") for ev, _job in grants_sent(events))
    assert by == {"workflow_execution_update_completed_event_attributes": 150}, by


async def test_single_signals_still_work_through_continue_as_new(qenv: Env) -> None:
    """What ``temporal workflow signal`` and jobs of an earlier fleetq send."""
    await _load_through_continue_as_new(qenv, "signal")


async def test_quota_of_a_terminated_holder_comes_back(qenv: Env) -> None:
    qh = await qenv.start_tree(load("elasticquotatree.yaml"), leak_check_seconds=1)
    h1 = await qenv.holder(qh.id, "leaky", hold=True)
    await wait_for(lambda: h1.query(QuotaHolder.granted))
    h2 = await qenv.holder(qh.id, "next", hold=True)
    await h1.terminate("simulated crash without release")
    await wait_for(lambda: h2.query(QuotaHolder.granted), timeout=30)
    view = QuotaView.model_validate(await qh.query(QuotaTreeWorkflow.view))
    assert h1.id in view.leaks_recovered
    await h2.signal(QuotaHolder.finish)
    assert await h2.result() == 1


async def test_a_grant_to_a_job_that_is_gone_comes_back_at_once(qenv: Env) -> None:
    """A waiting job terminated without cancelling (no ``cancel`` signal) is granted when
    its turn comes; the delivery finds its workflow gone and returns the quota in the
    same pass, so the next job is admitted at once, not after the periodic leak check."""
    qh = await qenv.start_tree(load("elasticquotatree.yaml"), leak_check_seconds=600)
    blocker = await qenv.holder(qh.id, "blocker", hold=True)
    await wait_for(lambda: blocker.query(QuotaHolder.granted))
    ghost = await qenv.holder(qh.id, "ghost", hold=True)
    await wait_for(lambda: _waiting(qh, 1))
    await ghost.terminate("simulated crash while queued")
    nxt = await qenv.holder(qh.id, "next", hold=True)
    await wait_for(lambda: _waiting(qh, 2))
    await blocker.signal(QuotaHolder.finish)
    await wait_for(lambda: nxt.query(QuotaHolder.granted), timeout=15)
    view = QuotaView.model_validate(await qh.query(QuotaTreeWorkflow.view))
    assert ghost.id in view.leaks_recovered
    assert view.holders == 1 and view.waiting == 0
    await nxt.signal(QuotaHolder.finish)
    assert await nxt.result() == 1


async def test_bad_tree_update_is_rejected_and_running_tree_untouched(qenv: Env) -> None:
    qh = await qenv.start_tree(load("elasticquotatree.yaml"))
    bad = load("elasticquotatree.yaml")
    bad["spec"]["root"]["children"][0]["max"]["cpu"] = "-5"
    with pytest.raises(WorkflowUpdateFailedError) as info:
        await qh.execute_update(QuotaTreeWorkflow.apply_tree, bad)
    assert "spec.root.children[0].max.cpu" in str(info.value.cause)
    view = QuotaView.model_validate(await qh.query(QuotaTreeWorkflow.view))
    assert [q.name.rsplit("-", 1)[0] for q in view.queues] == ["root", "root-child-2"]
    child = next(q for q in view.queues if q.node == "child-2")
    assert child.max["cpu"] == 10000 * 1000
    assert (
        await qh.execute_update(QuotaTreeWorkflow.apply_tree, load("elasticquotatree.yaml"))
        == "unchanged"
    )
    _ = timedelta


async def test_block_vs_priority_chosen_by_tree_annotation(qenv: Env) -> None:
    doc = tree([{"name": "team", "max": {"cpu": 8, "kube-queue/max-jobs": 100},
                 "namespaces": ["default"]}])
    cpu = {"kube-queue/max-jobs": 1000}

    async def scenario(qh: WorkflowHandle[Any, Any], tag: str) -> bool:
        """A 4-cpu job runs, an 8-cpu gang waits at the head, a 2-cpu job comes last:
        returns whether the small job overtook the gang."""
        first = await qenv.holder(qh.id, f"{tag}-first", request={**cpu, "cpu": 4000}, hold=True)
        await wait_for(lambda: first.query(QuotaHolder.granted))
        big = await qenv.holder(qh.id, f"{tag}-big", request={**cpu, "cpu": 8000}, hold=True)
        await wait_for(lambda: _waiting(qh, 1))
        small = await qenv.holder(qh.id, f"{tag}-small", request={**cpu, "cpu": 2000}, hold=True)
        # small's enqueue processed: it is admitted (overtaking) or waits behind the gang
        await wait_for(lambda: _enqueued(qh, 3))
        overtook = small.id in await qh.query(QuotaTreeWorkflow.holders)
        if overtook:  # and its grant reaches it
            await wait_for(lambda: small.query(QuotaHolder.granted))
        else:
            assert not await small.query(QuotaHolder.granted)
        info = await qh.query(QuotaTreeWorkflow.wait_info, (small if not overtook else big).id)
        assert info is not None and info.reason
        for h in (first, big, small):
            await h.signal(QuotaHolder.finish)
        return overtook

    priority = await qenv.start_tree(doc)
    assert await scenario(priority, "p") is True
    block = await qenv.start_tree(doc)
    blocked = copy.deepcopy(doc)
    blocked["metadata"]["annotations"] = {"fleetq.io/queue-policy": "Block"}
    assert await block.execute_update(QuotaTreeWorkflow.apply_tree, blocked) == "configured"
    assert await scenario(block, "b") is False
    view = QuotaView.model_validate(await block.query(QuotaTreeWorkflow.view))
    assert view.policy == "Block"


async def test_bad_queue_policy_annotation_is_rejected(qenv: Env) -> None:
    qh = await qenv.start_tree(load("elasticquotatree.yaml"))
    bad = load("elasticquotatree.yaml")
    bad["metadata"]["annotations"] = {"fleetq.io/queue-policy": "Fair"}
    with pytest.raises(WorkflowUpdateFailedError) as info:
        await qh.execute_update(QuotaTreeWorkflow.apply_tree, bad)
    assert ("ElasticQuotaTree kube-system/elasticquotatree: metadata.annotations."
            "fleetq.io/queue-policy must be Priority or Block") in str(info.value.cause)


async def test_a_job_admitted_at_once_gets_its_grant_in_the_reply_not_by_signal(
    qenv: Env,
) -> None:
    """Admitted in the pass its own ``submit`` update runs, a job learns of the grant from
    the update's reply: no ``admitted`` signal (no write on the tree's execution per
    grant, no event and workflow task on the job's side). A job that has to wait still
    gets its grant by signal when its turn comes. Each job is granted exactly once."""
    qh = await qenv.start_tree(load("elasticquotatree.yaml"))  # max-jobs 1 at the leaf
    first = await qenv.holder(qh.id, "first", hold=True)
    await wait_for(lambda: first.query(QuotaHolder.granted))
    second = await qenv.holder(qh.id, "second", hold=True)
    await wait_for(lambda: _waiting(qh, 1))
    await first.signal(QuotaHolder.finish)
    await wait_for(lambda: second.query(QuotaHolder.granted))
    await second.signal(QuotaHolder.finish)
    assert await first.result() == 1 and await second.result() == 1

    first_events = (await first.fetch_history()).events
    (got,) = grants_received(first_events)
    assert got.HasField("marker_recorded_event_attributes")  # the enqueue's answer
    second_events = (await second.fetch_history()).events
    (got,) = grants_received(second_events)
    assert got.workflow_execution_signaled_event_attributes.signal_name == "admitted"

    tree_events = (await qh.fetch_history()).events  # (one run: no continue-as-new yet)
    sent = [(ev.WhichOneof("attributes"), job) for ev, job in grants_sent(tree_events)]
    assert sent == [
        ("workflow_execution_update_completed_event_attributes", first.id),
        ("signal_external_workflow_execution_initiated_event_attributes", second.id),
    ]


async def test_the_leak_check_timer_runs_on_across_passes(qenv: Env) -> None:
    """The quota workflow wakes for its leak check (while anyone holds quota) on one
    timer that runs on while its moment stands: a pass (an enqueue, a grant, a release)
    records no timer events, so its history grows by the messages alone and continues
    as new less often. The timer is let go once nobody holds quota."""
    doc = load("elasticquotatree.yaml")
    doc = copy.deepcopy(doc)
    doc["spec"]["root"]["children"][0]["max"]["kube-queue/max-jobs"] = 10
    qh = await qenv.start_tree(doc, leak_check_seconds=600)
    anchor = await qenv.holder(qh.id, "anchor", hold=True)
    await wait_for(lambda: anchor.query(QuotaHolder.granted))
    for i in range(4):  # each: enqueue, grant, release, each in a pass of its own
        brief = await qenv.holder(qh.id, f"brief-{i}")
        assert await brief.result() == 1
    await anchor.signal(QuotaHolder.finish)
    assert await anchor.result() == 1
    await wait_for(lambda: _holders(qh, 0))

    kinds = Counter(ev.WhichOneof("attributes") for ev in (await qh.fetch_history()).events)
    assert kinds["workflow_task_completed_event_attributes"] >= 10
    assert kinds["timer_started_event_attributes"] == 1
    assert kinds["timer_canceled_event_attributes"] == 1  # nobody holds quota any more


def test_the_main_loop_wakes_for_the_earlier_of_the_leak_check_and_a_plans_expiry() -> None:
    """The leak check is due ``leak_check_seconds`` after the last one, only while
    anyone holds quota; a preemption plan's deadline wins when it is earlier (a tie
    goes to the leak check, which also runs a pass)."""
    from workflows.quota_tree import _next_wake

    assert _next_wake(60.0, 1000.0, holding=True, plan_deadline=None) == (1060.0, False)
    assert _next_wake(60.0, 1000.0, holding=True, plan_deadline=1030.0) == (1030.0, True)
    assert _next_wake(60.0, 1000.0, holding=True, plan_deadline=1060.0) == (1060.0, False)
    assert _next_wake(60.0, 1000.0, holding=False, plan_deadline=1500.0) == (1500.0, True)
    assert _next_wake(60.0, 1000.0, holding=False, plan_deadline=None) is None


def test_a_fired_wake_is_kept_until_the_loop_handles_it() -> None:
    """The main loop keeps one timer: a running one while its moment stands (replaced
    when the moment moves, dropped when nothing is due); one that fired while the run
    settled before continuing as new, and grants sent the loop round again, is kept
    and handled at once (it was re-armed at the 1 s floor, and the leak check or the
    plan's expiry came a second late)."""
    from workflows.quota_tree import _keeps_wake, _Wake

    loop = asyncio.new_event_loop()
    try:
        running, fired = loop.create_future(), loop.create_future()
        fired.set_result(None)
        leak = _Wake(running, 1060.0, False)
        assert _keeps_wake(leak, (1060.0, False))
        assert not _keeps_wake(leak, (1030.0, True))  # a plan expires first: replaced
        assert not _keeps_wake(leak, None)  # nobody holds quota: dropped
        assert not _keeps_wake(None, (1060.0, False))
        for due in ((1060.0, False), (1030.0, True), (2000.0, False), None):
            assert _keeps_wake(_Wake(fired, 1060.0, False), due)
            assert _keeps_wake(_Wake(fired, 1030.0, True), due)
    finally:
        loop.close()


async def test_jobs_arriving_in_one_batch_are_ordered_by_priority_not_by_arrival(
    qenv: Env,
) -> None:
    """Two enqueues in one ``submit`` batch, room for one, preemption on: the
    high-priority job, second in the batch, is granted in the reply and the low-priority
    one waits. Admitting the first at once, as a lone enqueue is, made it the victim of
    the second in the same task (granted, then told to stop). Kueue orders a cycle's
    heads by priority (``pkg/scheduler/scheduler.go``, v0.17.0)."""
    doc = load("elasticquotatree.yaml")  # max-jobs 1 at the leaf
    doc["metadata"]["annotations"] = {"fleetq.io/preemption": "LowerPriority"}
    qh = await qenv.start_tree(doc)

    def enqueue(name: str, priority: int) -> QuotaMessage:
        return QuotaMessage(signal="enqueue", request=AdmissionRequest(
            job_id=job_workflow_id("default", name), namespace="default",
            priority=priority, request={"kube-queue/max-jobs": 1000}, submitted_at=1.0))

    receipt = QuotaReceipt.model_validate(await qh.execute_update(
        QuotaTreeWorkflow.submit, QuotaBatch(messages=[enqueue("low", 0), enqueue("high", 100)])))
    assert list(receipt.grants) == [job_workflow_id("default", "high")]
    view = QuotaView.model_validate(await qh.query(QuotaTreeWorkflow.view))
    assert (view.holders, view.waiting, view.preempting) == (1, 1, {})
    assert await qh.query(QuotaTreeWorkflow.holders) == [job_workflow_id("default", "high")]
