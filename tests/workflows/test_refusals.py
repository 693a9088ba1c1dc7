"""A start that fleetq refuses (not a PyTorchJob, wrong workflow id) fails the workflow
with our one line and no Python stack trace, in history as the Web UI and
``temporal workflow result`` show it."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from temporalio.api.failure.v1 import Failure
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from fleetq.client.connection import DATA_CONVERTER
from fleetq.testing.fake_fleet import ClusterScript, FakeFleet
from tests.workflows.fakes import policy, walkthrough_job
from workflows import ALL_WORKFLOWS


@pytest_asyncio.fixture
async def queue(ts_env: WorkflowEnvironment) -> AsyncIterator[str]:
    fleet = FakeFleet(
        clusters={"cluster-a": ClusterScript()}, policy_doc=policy(), client=ts_env.client
    )
    tq = f"tq-{uuid.uuid4().hex[:8]}"
    async with Worker(
        ts_env.client, task_queue=tq, workflows=ALL_WORKFLOWS, activities=fleet.activities()
    ):
        yield tq


POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "notajob"}, "spec": {}}


@pytest.mark.parametrize(
    ("arg", "workflow_id", "expected"),
    [
        (POD, "pytorchjob/default/notajob", "kind"),
        (walkthrough_job("right"), "pytorchjob/default/wrong",
         "workflow id must be 'pytorchjob/default/right'"),
    ],
    ids=["not-a-pytorchjob", "wrong-workflow-id"],
)
async def test_refused_start_is_one_line_without_a_stack_trace(
    ts_env: WorkflowEnvironment, queue: str, arg: dict[str, Any], workflow_id: str,
    expected: str,
) -> None:
    handle = await ts_env.client.start_workflow(
        "PyTorchJobWorkflow", arg, id=f"{workflow_id}", task_queue=queue
    )
    with pytest.raises(WorkflowFailureError) as caught:
        await handle.result()
    cause = caught.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "InvalidManifest"
    assert expected in cause.message and "\n" not in cause.message
    history = await handle.fetch_history()
    failed = [e for e in history.events if e.HasField(
        "workflow_execution_failed_event_attributes")]
    assert len(failed) == 1
    failure = failed[0].workflow_execution_failed_event_attributes.failure
    assert failure.message == cause.message
    assert failure.stack_trace == "", failure.stack_trace


def test_other_failures_keep_their_stack_trace() -> None:
    """Only refusals of input lose the trace: a failure in our code keeps it."""
    converter = DATA_CONVERTER.failure_converter
    for kind, kept in (("SomethingBroke", True), ("InvalidManifest", False)):
        failure = Failure()
        try:
            raise ApplicationError("boom", type=kind, non_retryable=True)
        except ApplicationError as exc:
            converter.to_failure(exc, DATA_CONVERTER.payload_converter, failure)
        assert ("test_refusals.py" in failure.stack_trace) is kept, (kind, failure.stack_trace)
