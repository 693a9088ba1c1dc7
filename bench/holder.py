"""A job reduced to its quota traffic — enqueue, wait for the grant, (hold), release —
used to load and test the quota workflow without member clusters (the deep-queue
benchmark and the semaphore tests share it)."""

from __future__ import annotations

from pydantic import BaseModel, Field
from temporalio import workflow

from fleetq.admission import AdmissionRequest, Grant

ONE_JOB = {"kube-queue/max-jobs": 1000}  # one job, in milli-units


class HolderInput(BaseModel):
    tree_id: str
    namespace: str = "default"
    request: dict[str, int] = Field(default_factory=lambda: dict(ONE_JOB))
    priority: int = 0
    hold: bool = False  # wait for the ``finish`` signal before releasing
    #: stay this long after releasing, so that a late duplicate grant would be counted
    linger_seconds: float = 0.0


@workflow.defn(name="QuotaHolder", sandboxed=False)
class QuotaHolder:
    def __init__(self) -> None:
        self.grants: list[Grant] = []
        self.done = False

    @workflow.run
    async def run(self, inp: HolderInput) -> int:
        """Returns how many grants it received (exactly 1 when nothing is duplicated)."""
        quota = workflow.get_external_workflow_handle(inp.tree_id)
        wid = workflow.info().workflow_id
        await quota.signal(
            "enqueue",
            AdmissionRequest(
                job_id=wid,
                namespace=inp.namespace,
                priority=inp.priority,
                request=inp.request,
                submitted_at=workflow.now().timestamp(),
            ),
        )
        await workflow.wait_condition(lambda: bool(self.grants))
        if inp.hold:
            await workflow.wait_condition(lambda: self.done)
        await quota.signal("release", wid)
        if inp.linger_seconds:
            await workflow.sleep(inp.linger_seconds)
        return len(self.grants)

    @workflow.signal
    def admitted(self, grant: Grant) -> None:
        self.grants.append(grant)

    @workflow.signal
    def finish(self) -> None:
        self.done = True

    @workflow.query
    def granted(self) -> bool:
        return bool(self.grants)
