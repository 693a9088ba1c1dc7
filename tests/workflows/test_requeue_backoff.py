"""Re-queue with backoff after a placement timeout (issue 24 item 3), carried out by the
real job and quota workflows over a scripted member that never has room, on a
time-skipping server of its own (the timeouts and backoffs pass at once): the admitted
job gives its quota back after ``placementTimeoutSeconds``, waits its backoff, is
admitted again and, past ``requeueLimit``, ends Failed naming the limit. Kube Queue
re-enqueues long-pending jobs the same way; the backoff follows Kueue's
``requeuingStrategy`` (apis/config/v1beta1 configuration_types.go)."""

from __future__ import annotations

import contextlib
import copy
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio
from temporalio import activity
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from fleetq.client import connection
from fleetq.client.connection import DATA_CONVERTER
from fleetq.fleet_config import RequeueSettings
from fleetq.messages import JobView, QuotaTreeInput, Resolution, ResolveInput
from fleetq.naming import job_workflow_id
from fleetq.testing.fake_fleet import ClusterScript, FakeFleet
from tests.workflows.fakes import load, policy, walkthrough_job
from workflows import ALL_WORKFLOWS
from workflows.quota_tree import QuotaTreeWorkflow, QuotaView

pytestmark = [pytest.mark.timeout(120)]

SETTINGS = RequeueSettings(placementTimeoutSeconds=30, backoffBaseSeconds=10,
                           backoffMaxSeconds=20, requeueLimit=1)


@dataclass
class TimeoutFleet(FakeFleet):
    """A :class:`FakeFleet` whose resolution carries :data:`SETTINGS`."""

    @activity.defn(name="resolve_policy")
    async def resolve_policy(self, inp: ResolveInput) -> Resolution:
        res = await FakeFleet.resolve_policy(self, inp)
        res.requeue = SETTINGS
        return res


@pytest_asyncio.fixture
async def env() -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=str(connection.test_server_path()), data_converter=DATA_CONVERTER)
    try:
        yield env
    finally:
        await env.shutdown()


async def test_an_admitted_job_never_placed_is_requeued_with_backoff_then_fails(
    env: WorkflowEnvironment,
) -> None:
    client = env.client
    fleet = TimeoutFleet(clusters={"cluster-a": ClusterScript(fits=False)},
                         policy_doc=policy(queued=True), client=client)
    tree_id = f"quota/kube-system/{uuid.uuid4().hex[:8]}"
    fleet.tree_workflow_id = tree_id
    tq = f"tq-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=f"{tq}-control", workflows=[QuotaTreeWorkflow],
                      activities=[fleet.check_holders, fleet.purge_for_preemption]), \
            Worker(client, task_queue=tq, workflows=ALL_WORKFLOWS,
                   activities=fleet.activities()):
        tree = await client.start_workflow(
            QuotaTreeWorkflow.run,
            QuotaTreeInput(tree=copy.deepcopy(load("elasticquotatree.yaml"))),
            id=tree_id, task_queue=f"{tq}-control")
        try:
            handle = await client.start_workflow(
                "PyTorchJobWorkflow",
                {"manifest": walkthrough_job("slow"), "policy": policy(queued=True)},
                id=job_workflow_id("default", "slow"), task_queue=tq)
            view = JobView.model_validate(await handle.result())
            assert view.state == "Failed"
            assert view.reason == (
                "PlacementTimeout: not placed within placementTimeoutSeconds 30; "
                "re-queued 1 time already (requeueLimit 1)"
            )
            (timeout,) = [e for e in view.events if e.reason == "PlacementTimeout"]
            assert timeout.message == (
                "not placed within placementTimeoutSeconds 30: quota given back; queued "
                "again in 10s (re-queue 1 of 1, original submit time)"
            )
            (admitted,) = [e for e in view.events if e.reason == "Admitted"]
            assert admitted.count == 2
            assert admitted.first_time is not None
            # the second admission came after the 30 s timeout and the 10 s backoff
            assert (admitted.time - admitted.first_time).total_seconds() >= 40
            failed = [e for e in view.events if e.reason == "FailedScheduling"]
            assert len(failed) == 1 and failed[0].count >= 2  # aggregated, every round
            quota = QuotaView.model_validate(await tree.query(QuotaTreeWorkflow.view))
            assert quota.holders == 0 and quota.waiting == 0
            assert not [c for c in fleet.calls if c[0] == "bind"]
        finally:
            with contextlib.suppress(RPCError):  # (its latest run, after continue-as-new)
                await client.get_workflow_handle(tree_id).terminate("test over")
