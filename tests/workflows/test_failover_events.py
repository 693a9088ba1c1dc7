"""Failover events speak the policy's own words: purgeMode as the user spelled it
(``Immediately`` stays ``Immediately``, not the normalised ``Directly``)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from tests.workflows.fakes import ClusterScript, FakeFleet, policy, walkthrough_job
from tests.workflows.test_job_lifecycle import Harness, events
from workflows import ALL_WORKFLOWS

pytestmark = [pytest.mark.timeout(60)]


@pytest_asyncio.fixture
async def fleet_and_queue(ts_env: WorkflowEnvironment) -> AsyncIterator[tuple[FakeFleet, str]]:
    fleet = FakeFleet(
        clusters={"cluster-a": ClusterScript(), "cluster-b": ClusterScript()},
        client=ts_env.client,
    )
    tq = f"tq-{uuid.uuid4().hex[:8]}"
    async with Worker(
        ts_env.client, task_queue=tq, workflows=ALL_WORKFLOWS, activities=fleet.activities()
    ):
        yield fleet, tq


@pytest.mark.parametrize("spelling", ["Immediately", "Directly", "Graciously", "Never"])
async def test_failover_events_use_the_policys_purge_mode_spelling(
    ts_env: WorkflowEnvironment, fleet_and_queue: tuple[FakeFleet, str], spelling: str
) -> None:
    fleet, tq = fleet_and_queue
    fleet.policy_doc = policy(purge=spelling, toleration=10)
    fleet.clusters["cluster-a"].timeline = [
        (5, "Healthy", "Running", ""),
        (20, "Unhealthy", "Failed", "pods failed"),
    ]
    fleet.clusters["cluster-b"].timeline = [
        (5, "Healthy", "Running", ""),
        (40, "Healthy", "Succeeded", ""),
    ]
    view = await Harness(ts_env, fleet, tq).run(walkthrough_job(f"spell-{spelling.lower()}"))
    assert view.state == "Succeeded"
    (started,) = events(view, "FailoverStarted")
    assert started.message == f"job unhealthy on cluster-a for 10s; purgeMode {spelling}"
    if spelling == "Never":
        (evicted,) = events(view, "Evicted")
        assert evicted.message.endswith("(purgeMode Never)")
