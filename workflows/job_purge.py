"""The delete of a finished job: purge what it left on every member, then it is gone.

A closed job workflow runs no activities, so ``fleetq delete`` of a Succeeded or Failed
job starts this short workflow under the job's own workflow id (the id is taken: no new
submission can start while it purges, and once it completed the job is gone from every
view). It asks every member of the fleet config to delete the job's PyTorchJob copies,
pods and Reservations (every submission of it: ``fleetq.io/owner``) and returns once each
member confirmed nothing is left; a member that does not answer is purged the moment it
answers again (``purge_when_reachable``), so the delete is never half done.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

from workflows import activity_calls

with workflow.unsafe.imports_passed_through():
    from fleetq import activity_refs
    from fleetq.messages import JobRef, PurgeInput, PurgeResult
    from fleetq.naming import JOB_PURGE_WORKFLOW, job_workflow_id
    from workflows.copies import PURGER_HEARTBEAT
    from workflows.errors import invalid_input

RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=10),
    non_retryable_error_types=["InvalidRequest"],
)


@workflow.defn(name=JOB_PURGE_WORKFLOW)
class PyTorchJobPurgeWorkflow:
    @workflow.run
    async def run(self, job: JobRef) -> PurgeResult:
        expected = job_workflow_id(job.namespace, job.name)
        if workflow.info().workflow_id != expected or job.workflow_id != expected:
            raise invalid_input(
                f"PyTorchJob {job.ref}: the purge runs under workflow id {expected!r} "
                f"(got {workflow.info().workflow_id!r}, job {job.workflow_id!r})"
            )
        ref = JobRef(namespace=job.namespace, name=job.name, workflow_id=expected)
        members = await activity_calls.execute(
            activity_refs.MEMBER_NAMES,
            None,
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RETRY,
            summary="the fleet's member clusters",
        )
        results = await asyncio.gather(
            *(
                activity_calls.execute(
                    activity_refs.PURGE_WHEN_REACHABLE,
                    PurgeInput(cluster=cluster, job=ref, confirm=True),
                    start_to_close_timeout=timedelta(hours=1),
                    heartbeat_timeout=PURGER_HEARTBEAT,
                    retry_policy=RETRY,
                    summary=f"purge {job.name} on {cluster}",
                )
                for cluster in members
            ),
            return_exceptions=True,
        )
        deleted: list[str] = []
        for cluster, result in zip(members, results, strict=True):
            if isinstance(result, ActivityError):  # the member left the fleet config
                workflow.logger.warning("could not purge %s on %s: %s", job.ref, cluster,
                                        result.cause or result)
                continue
            if isinstance(result, BaseException):
                raise result
            deleted += [f"{cluster}: {d}" for d in result.deleted]
        return PurgeResult(deleted=deleted)
