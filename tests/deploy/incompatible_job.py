"""Test-only "version B" of the job workflow: same workflow type name, same handlers, but
its first command is a memo upsert that no history written by the real workflow has. A
replay of any version-A history on it fails with a nondeterminism error (the rollout test
checks that), so it only runs correctly if Worker Versioning keeps A's jobs on A."""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import RawValue, VersioningBehavior

with workflow.unsafe.imports_passed_through():
    from fleetq.messages import JobView

from workflows.pytorch_job import PyTorchJobWorkflow

#: the memo key version B writes first; its presence in a history says "ran on B"
MEMO_KEY = "fleetq-rollout"


@workflow.defn(name="PyTorchJobWorkflow", versioning_behavior=VersioningBehavior.PINNED)
class IncompatibleJobWorkflow(PyTorchJobWorkflow):
    @workflow.run
    async def run(self, arg: RawValue) -> JobView:
        workflow.upsert_memo({MEMO_KEY: "B"})
        return await super().run(arg)
