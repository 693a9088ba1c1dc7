"""Twelve workers' outboxes bursting at one quota workflow: the server's cap of ten
updates in flight per workflow delays messages, it never fails or loses one.

Each outbox stands for one worker process (its own client connection, its own
mailbox); the stand-in quota workflow holds every update open for a moment, so more than
ten are in flight at once and the server refuses the rest with RESOURCE_EXHAUSTED."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.quota_outbox import QuotaOutbox, _Mailbox
from fleetq.admission import AdmissionRequest
from fleetq.messages import QuotaAck, QuotaBatch, QuotaMessage, QuotaReceipt, QuotaSignal

WORKERS = 12
MESSAGES_PER_WORKER = 40


@workflow.defn(name="SlowQuotaTarget", sandboxed=False)
class SlowQuotaTarget:
    """Applies each batch after a short timer, so its update stays in flight."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.running = 0
        self.peak = 0  # most updates this run handled at once

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: False)

    @workflow.update
    async def submit(self, batch: QuotaBatch) -> QuotaReceipt:
        self.running += 1
        self.peak = max(self.peak, self.running)
        await workflow.sleep(timedelta(milliseconds=300))
        self.seen.extend(m.subject() for m in batch.messages)
        self.running -= 1
        return QuotaReceipt(applied=len(batch.messages))

    @workflow.query
    def messages(self) -> list[str]:
        return self.seen

    @workflow.query
    def peak_in_flight(self) -> int:
        return self.peak


class CountingOutbox(QuotaOutbox):
    """Counts the updates all outboxes have outstanding at once (sent, not answered)."""

    outstanding = 0
    peak = 0

    async def _deliver(self, *args: Any) -> Any:
        cls = CountingOutbox
        cls.outstanding += 1
        cls.peak = max(cls.peak, cls.outstanding)
        try:
            return await super()._deliver(*args)
        finally:
            cls.outstanding -= 1


def enqueue(tree: str, job: str) -> QuotaSignal:
    return QuotaSignal(
        tree_workflow_id=tree, signal="enqueue",
        request=AdmissionRequest(job_id=job, namespace="default", request={"cpu": 1000},
                                 submitted_at=1.0),
    )


async def test_twelve_workers_bursting_lose_and_fail_nothing(dev_env: WorkflowEnvironment) -> None:
    client = dev_env.client
    tq = f"many-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=tq, workflows=[SlowQuotaTarget]):
        handle = await client.start_workflow(SlowQuotaTarget.run, id=f"tree-{tq}",
                                             task_queue=tq)
        clients = [
            await Client.connect(client.service_client.config.target_host,
                                 namespace=client.namespace)
            for _ in range(WORKERS)
        ]
        # one message per worker at a time at first, so every worker has its own update
        # in flight at once (12 > the cap of 10), then the rest of the burst
        outboxes = [CountingOutbox(c) for c in clients]
        jobs = [f"w{w}-j{i}" for i in range(MESSAGES_PER_WORKER) for w in range(WORKERS)]
        results = await asyncio.gather(
            *(outboxes[int(j[1:].split("-")[0])].send(enqueue(handle.id, j)) for j in jobs),
            return_exceptions=True,
        )
        failed = [r for r in results if r != QuotaAck()]  # applied (the target grants none)
        assert failed == []
        seen = await handle.query(SlowQuotaTarget.messages)
        assert sorted(set(seen)) == sorted(jobs)  # every message applied (none lost)
        assert sum(o.failures for o in outboxes) == 0
        # More than the cap were outstanding at once, the workflow never handled more
        # than the cap at once: the server held the others back, and none failed for it.
        assert CountingOutbox.peak > 10
        assert await handle.query(SlowQuotaTarget.peak_in_flight) <= 10
        await handle.terminate()


class RefusingHandle:
    """A quota workflow handle whose server refuses the first updates for the cap."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.calls = 0

    async def execute_update(self, name: str, batch: QuotaBatch, result_type: Any) -> Any:
        self.calls += 1
        if self.calls <= self.refusals:
            raise RPCError("limit on number of concurrent in-flight updates has been reached",
                           RPCStatusCode.RESOURCE_EXHAUSTED, b"")
        return QuotaReceipt(applied=len(batch.messages))


async def test_an_update_the_sdk_gave_up_on_is_sent_again(dev_env: WorkflowEnvironment) -> None:
    """When the SDK's own retries of RESOURCE_EXHAUSTED run out, the outbox backs off and
    sends the batch again instead of failing its senders."""
    outbox = QuotaOutbox(dev_env.client, timeout_seconds=10.0)
    loop = asyncio.get_running_loop()
    future: asyncio.Future[QuotaAck] = loop.create_future()
    msg = QuotaMessage(signal="release", job_id="j")
    handle = RefusingHandle(refusals=3)
    box = _Mailbox()
    outcome = await outbox._deliver(handle, box, [(msg, future)])
    assert isinstance(outcome, QuotaReceipt)
    assert handle.calls == 4
    assert outbox.retries == 3
