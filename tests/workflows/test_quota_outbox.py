"""QuotaOutbox: jobs' quota messages coalesced into updates, against a real dev server.

A stand-in quota workflow records what it is sent, so the tests see the batches."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from temporalio import workflow
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.quota_outbox import QuotaOutbox, QuotaRefused
from activities.scheduling import deliver_quota_message
from fleetq.admission import AdmissionRequest
from fleetq.messages import QuotaAck, QuotaBatch, QuotaReceipt, QuotaSignal


@workflow.defn(name="OutboxTarget", sandboxed=False)
class OutboxTarget:
    """Takes ``submit`` batches (refusing any enqueue of a job named ``bad*``) and
    records every message with the size of the batch it came in."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, int]] = []

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: False)

    @workflow.update
    def submit(self, batch: QuotaBatch) -> QuotaReceipt:
        receipt = QuotaReceipt()
        for m in batch.messages:
            self.seen.append((m.signal, m.subject(), len(batch.messages)))
            if m.signal == "enqueue" and m.subject().startswith("bad"):
                receipt.refused[m.subject()] = "no quota node can ever admit it"
            receipt.applied += 1
        return receipt

    @workflow.query
    def messages(self) -> list[tuple[str, str, int]]:
        return self.seen


@workflow.defn(name="OldQuotaTarget", sandboxed=False)
class OldQuotaTarget:
    """A quota workflow of an earlier fleetq: single signals only."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: False)

    @workflow.signal
    def enqueue(self, req: AdmissionRequest) -> None:
        self.seen.append(("enqueue", req.job_id))

    @workflow.signal
    def release(self, job_id: str) -> None:
        self.seen.append(("release", job_id))

    @workflow.query
    def messages(self) -> list[tuple[str, str]]:
        return self.seen


def enqueue(tree: str, job: str) -> QuotaSignal:
    return QuotaSignal(
        tree_workflow_id=tree,
        signal="enqueue",
        request=AdmissionRequest(job_id=job, namespace="default", request={"cpu": 1000},
                                 submitted_at=1.0),
    )


@pytest_asyncio.fixture
async def target(dev_env: WorkflowEnvironment) -> AsyncIterator[tuple[Client, str, str]]:
    client = dev_env.client
    tq = f"outbox-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=tq, workflows=[OutboxTarget, OldQuotaTarget]):
        new = await client.start_workflow(OutboxTarget.run, id=f"new-{tq}", task_queue=tq)
        old = await client.start_workflow(OldQuotaTarget.run, id=f"old-{tq}", task_queue=tq)
        yield client, new.id, old.id
        await new.terminate()
        await old.terminate()


async def test_a_burst_of_messages_goes_out_in_few_batches_in_order(
    target: tuple[Client, str, str],
) -> None:
    client, tree, _ = target
    outbox = QuotaOutbox(client, max_batch=50)
    jobs = [f"job-{i:03d}" for i in range(300)]
    sent = await asyncio.gather(*(outbox.send(enqueue(tree, j)) for j in jobs))
    assert sent == [QuotaAck()] * 300  # applied, none granted (the target grants none)
    seen = await client.get_workflow_handle(tree).query(OutboxTarget.messages)
    assert [s[1] for s in seen] == jobs  # every message once, in the order sent
    # one update in flight at a time: the first goes alone, the rest wait and coalesce
    assert outbox.updates_sent < 30 and outbox.messages_sent == 300
    assert max(s[2] for s in seen) == 50  # no batch over max_batch


async def test_release_and_cancel_carry_the_job_id(target: tuple[Client, str, str]) -> None:
    client, tree, _ = target
    outbox = QuotaOutbox(client)
    for kind in ("release", "cancel"):
        msg = QuotaSignal(tree_workflow_id=tree, signal=kind, job_id=f"{kind}-me")
        assert await outbox.send(msg) == QuotaAck()
    seen = await client.get_workflow_handle(tree).query(OutboxTarget.messages)
    assert [(s[0], s[1]) for s in seen] == [("release", "release-me"), ("cancel", "cancel-me")]


async def test_no_such_quota_workflow_is_false(target: tuple[Client, str, str]) -> None:
    client, _, _ = target
    assert await QuotaOutbox(client).send(enqueue("quota/none/such", "j")) == QuotaAck(
        running=False)


async def test_a_refused_enqueue_fails_only_its_own_sender(
    target: tuple[Client, str, str],
) -> None:
    client, tree, _ = target
    outbox = QuotaOutbox(client)
    good, bad = await asyncio.gather(
        outbox.send(enqueue(tree, "good-1")),
        outbox.send(enqueue(tree, "bad-1")),
        return_exceptions=True,
    )
    assert good == QuotaAck()
    assert isinstance(bad, QuotaRefused) and "can ever admit" in str(bad)
    # the local activity turns it into one non-retryable failure naming the job and why
    with pytest.raises(ApplicationError) as err:
        await deliver_quota_message(outbox, enqueue(tree, "bad-2"))
    assert err.value.non_retryable and err.value.type == "QuotaRefused"
    assert err.value.message == (
        f"quota workflow {tree} refused bad-2: no quota node can ever admit it"
    )


async def test_a_quota_workflow_without_submit_gets_single_signals(
    target: tuple[Client, str, str],
) -> None:
    client, _, old = target
    outbox = QuotaOutbox(client)
    sent = await asyncio.gather(
        outbox.send(enqueue(old, "a")),
        outbox.send(QuotaSignal(tree_workflow_id=old, signal="release", job_id="a")),
    )
    assert sent == [QuotaAck(), QuotaAck()]
    seen = await client.get_workflow_handle(old).query(OldQuotaTarget.messages)
    assert [tuple(s) for s in seen] == [("enqueue", "a"), ("release", "a")]


async def test_no_answer_fails_the_senders_within_the_timeout(
    dev_env: WorkflowEnvironment,
) -> None:
    """A quota workflow nobody runs (no control worker): senders fail (and their local
    activity retries) instead of waiting for ever."""
    client = dev_env.client
    handle = await client.start_workflow(
        OutboxTarget.run, id=f"orphan-{uuid.uuid4().hex[:8]}", task_queue="nobody-polls-this"
    )
    try:
        outbox = QuotaOutbox(client, timeout_seconds=1.0)
        with pytest.raises(ApplicationError, match="no answer to the submit update in 1 s"):
            await outbox.send(enqueue(handle.id, "j"))
    finally:
        await handle.terminate()


@workflow.defn(name="GatedQuotaTarget", sandboxed=False)
class GatedQuotaTarget:
    """Holds any batch with a ``requeue`` of a job named ``held*`` until ``open`` is
    signalled; records the jobs and signals in the order their batches were applied."""

    def __init__(self) -> None:
        self.applied: list[str] = []
        self.signals: list[str] = []
        self.holding = 0
        self.opened = False

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: False)

    @workflow.update
    async def submit(self, batch: QuotaBatch) -> QuotaReceipt:
        if any(m.signal == "requeue" and m.subject().startswith("held")
               for m in batch.messages):
            self.holding += 1
            await workflow.wait_condition(lambda: self.opened)
        self.applied.extend(m.subject() for m in batch.messages)
        self.signals.extend(m.signal for m in batch.messages)
        return QuotaReceipt(applied=len(batch.messages))

    @workflow.signal
    def open(self) -> None:
        self.opened = True

    @workflow.query
    def state(self) -> tuple[int, list[str]]:
        return self.holding, self.applied

    @workflow.query
    def order(self) -> list[str]:
        return self.signals


async def test_a_jobs_release_is_applied_after_its_requeue_still_in_flight(
    dev_env: WorkflowEnvironment,
) -> None:
    """A job's messages reach the quota workflow in the order it sent them, even when it
    gave up waiting on one (its workflow was cancelled mid-requeue) while the update
    carrying it is still in flight: a release that overtook the requeue would leave the
    quota workflow queueing, and later granting, a job that has given its quota back.
    A second lane for ``requeue`` (tried, docs/decisions/005) broke this."""
    client = dev_env.client
    tq = f"outbox-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=tq, workflows=[GatedQuotaTarget]):
        handle = await client.start_workflow(GatedQuotaTarget.run, id=f"gated-{tq}",
                                             task_queue=tq)
        try:
            outbox = QuotaOutbox(client)
            requeue = QuotaSignal(tree_workflow_id=handle.id, signal="requeue",
                                  request=enqueue(handle.id, "held-1").request)
            sender = asyncio.create_task(outbox.send(requeue))
            while (await handle.query(GatedQuotaTarget.state))[0] < 1:  # the requeue in flight
                await asyncio.sleep(0.05)
            sender.cancel()  # the job gave up on it
            release = QuotaSignal(tree_workflow_id=handle.id, signal="release", job_id="held-1")
            released = asyncio.create_task(outbox.send(release))
            await handle.signal(GatedQuotaTarget.open)
            assert await released == QuotaAck()
            assert (await handle.query(GatedQuotaTarget.state))[1] == ["held-1", "held-1"]
            assert await handle.query(GatedQuotaTarget.order) == ["requeue", "release"]
        finally:
            await handle.terminate()
