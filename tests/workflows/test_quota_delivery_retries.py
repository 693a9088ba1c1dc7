"""A job whose enqueue fails more often than any fixed attempt limit still gets admitted
(issue 28 item 5).

Under overload (``fleetq bench workers --workers 12 --jobs 2000`` on 2 cores) the quota
workflow did not answer ``submit`` updates for minutes, and two jobs failed with
``quota workflow ...: no answer to the submit update in 20 s`` after the ``signal_quota``
local activity's 5 attempts. A message given up on is a job waiting for nothing, or quota
held by nobody, so the job workflow retries the delivery until it succeeds (only deleting
the job stops it). Here the worker's deliveries fail the first 5 times with the outbox's
own error, as an overloaded quota workflow makes them fail; the job is admitted on the
6th and succeeds, and its history records that attempt.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.fleet import Fleet
from activities.scheduling import SchedulingActivities
from fleetq.messages import JobView, QuotaAck, QuotaSignal
from fleetq.naming import job_workflow_id
from fleetq.testing.history import grants_received, local_activity_type
from tests.workflows.fakes import load, policy, walkthrough_job
from tests.workflows.test_e2e import Stack, stack  # noqa: F401  (the module's real stack)
from worker import build_worker

#: the attempts the job workflow gave ``signal_quota`` before it retried without limit
OLD_ATTEMPT_LIMIT = 5


class OverloadedDelivery(SchedulingActivities):
    """The real activities, but each job's enqueue fails its first
    ``OLD_ATTEMPT_LIMIT`` deliveries with the error the outbox raises when the quota
    workflow does not answer."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.failed: Counter[str] = Counter()

    @activity.defn(name="signal_quota")
    async def signal_quota(self, inp: QuotaSignal) -> QuotaAck:
        subject = inp.subject()
        if inp.signal == "enqueue" and self.failed[subject] < OLD_ATTEMPT_LIMIT:
            self.failed[subject] += 1
            raise ApplicationError(
                f"quota workflow {inp.tree_workflow_id}: no answer to the submit update "
                "in 20 s", type="Delivery")
        return await super().signal_quota(inp)


def marker_attempt(event: Any) -> int:
    data = event.marker_recorded_event_attributes.details["data"]
    return int(json.loads(data.payloads[0].data)["attempt"])


async def test_an_enqueue_failing_past_the_old_attempt_limit_is_still_delivered(
    stack: Stack,  # noqa: F811
) -> None:
    await stack.apply(load("elasticquotatree.yaml"), policy(queued=True))
    task_queue = f"overloaded-{uuid.uuid4().hex[:6]}"
    fleet = Fleet.from_config(stack.emulated.fleet_config_path)
    activities = OverloadedDelivery(stack.client, fleet, search_attributes=True)
    manifest = walkthrough_job(f"retried-{uuid.uuid4().hex[:6]}")
    ns, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
    try:
        async with build_worker(stack.client, activities, task_queue=task_queue,
                                control_task_queue=None):
            handle = await stack.client.start_workflow(
                "PyTorchJobWorkflow", {"manifest": manifest, "run_seconds": 2},
                id=job_workflow_id(ns, name), task_queue=task_queue)
            view = JobView.model_validate(await handle.result())
    finally:
        fleet.close()
    assert view.state == "Succeeded" and view.admitted, view
    assert list(activities.failed.values()) == [OLD_ATTEMPT_LIMIT]
    events = (await handle.fetch_history()).events
    enqueues = [e for e in events if local_activity_type(e) == "signal_quota"
                and e in grants_received(events)]
    # the grant came in the answer to the delivery that finally got through
    assert [marker_attempt(e) for e in enqueues] == [OLD_ATTEMPT_LIMIT + 1]
