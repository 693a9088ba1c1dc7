"""A job reduced to its quota traffic — enqueue, wait for the grant, (hold), release —
used to load and test the quota workflow without member clusters (the deep-queue
benchmark and the semaphore tests share it). Like a job, it sends its messages through
the ``signal_quota`` local activity (the worker's ``QuotaOutbox``); ``via="signal"``
sends the single signals instead, as a hand-made ``temporal workflow signal`` or a job of
an earlier fleetq does."""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import BaseModel, Field
from temporalio import workflow
from temporalio.common import RetryPolicy

from fleetq.admission import AdmissionRequest, Grant
from fleetq.messages import QuotaAck, QuotaSignal

ONE_JOB = {"kube-queue/max-jobs": 1000}  # one job, in milli-units


class HolderInput(BaseModel):
    tree_id: str
    namespace: str = "default"
    request: dict[str, int] = Field(default_factory=lambda: dict(ONE_JOB))
    priority: int = 0
    hold: bool = False  # wait for the ``finish`` signal before releasing
    #: stay this long after releasing, so that a late duplicate grant would be counted
    linger_seconds: float = 0.0
    via: Literal["outbox", "signal"] = "outbox"


@workflow.defn(name="QuotaHolder", sandboxed=False)
class QuotaHolder:
    def __init__(self) -> None:
        self.grants: list[Grant] = []
        self.done = False

    @workflow.run
    async def run(self, inp: HolderInput) -> int:
        """Returns how many grants it received (exactly 1 when nothing is duplicated)."""
        wid = workflow.info().workflow_id
        request = AdmissionRequest(
            job_id=wid,
            namespace=inp.namespace,
            priority=inp.priority,
            request=inp.request,
            submitted_at=workflow.now().timestamp(),
        )
        await self._send(inp, QuotaSignal(tree_workflow_id=inp.tree_id, signal="enqueue",
                                          request=request))
        await workflow.wait_condition(lambda: bool(self.grants))
        if inp.hold:
            await workflow.wait_condition(lambda: self.done)
        await self._send(inp, QuotaSignal(tree_workflow_id=inp.tree_id, signal="release",
                                          job_id=wid))
        if inp.linger_seconds:
            await workflow.sleep(inp.linger_seconds)
        return len(self.grants)

    async def _send(self, inp: HolderInput, message: QuotaSignal) -> None:
        if inp.via == "signal":
            await workflow.get_external_workflow_handle(inp.tree_id).signal(
                message.signal, message.signal_arg())
            return
        ack = await workflow.execute_local_activity(
            "signal_quota",
            message,
            result_type=QuotaAck,
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=10)),
        )
        if not ack.running:
            raise RuntimeError(f"quota workflow {inp.tree_id} is not running")
        if ack.grant is not None:  # admitted at once: the reply carries the grant
            self.grants.append(ack.grant)

    @workflow.signal
    def admitted(self, grant: Grant) -> None:
        self.grants.append(grant)

    @workflow.signal
    def finish(self) -> None:
        self.done = True

    @workflow.query
    def granted(self) -> bool:
        return bool(self.grants)
