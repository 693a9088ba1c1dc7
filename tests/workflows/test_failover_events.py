"""Failover events speak the policy's own words: purgeMode as the user spelled it
(``Immediately`` stays ``Immediately``, not the normalised ``Directly``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from temporalio.testing import WorkflowEnvironment

from tests.workflows.fakes import (
    ClusterScript,
    FakeFleet,
    Harness,
    policy,
    running_harness,
    walkthrough_job,
)
from tests.workflows.test_job_lifecycle import events

pytestmark = [pytest.mark.timeout(60)]


@pytest_asyncio.fixture
async def harness(ts_env: WorkflowEnvironment) -> AsyncIterator[Harness]:
    fleet = FakeFleet(
        clusters={"cluster-a": ClusterScript(), "cluster-b": ClusterScript()},
        client=ts_env.client,
    )
    async with running_harness(ts_env, fleet) as h:
        yield h


@pytest.mark.parametrize("spelling", ["Immediately", "Directly", "Graciously", "Never"])
async def test_failover_events_use_the_policys_purge_mode_spelling(
    harness: Harness, spelling: str
) -> None:
    fleet = harness.fleet
    fleet.policy_doc = policy(purge=spelling, toleration=10)
    fleet.clusters["cluster-a"].timeline = [
        (5, "Healthy", "Running", ""),
        (20, "Unhealthy", "Failed", "pods failed"),
    ]
    fleet.clusters["cluster-b"].timeline = [
        (5, "Healthy", "Running", ""),
        (40, "Healthy", "Succeeded", ""),
    ]
    view = await harness.run(walkthrough_job(f"spell-{spelling.lower()}"))
    assert view.state == "Succeeded"
    (started,) = events(view, "FailoverStarted")
    assert started.message == f"job unhealthy on cluster-a for 10s; purgeMode {spelling}"
    if spelling == "Never":
        (evicted,) = events(view, "Evicted")
        assert evicted.message.endswith("(purgeMode Never)")
