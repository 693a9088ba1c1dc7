"""Fixtures of the workflow tests: a time-skipping harness over two scripted clusters."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio
from temporalio.testing import WorkflowEnvironment

from fleetq.testing.fake_fleet import ClusterScript, FakeFleet
from tests.workflows.fakes import Harness, policy, running_harness


@pytest_asyncio.fixture
async def two_clusters(ts_env: WorkflowEnvironment) -> AsyncIterator[Harness]:
    """cluster-a and cluster-b, both with room, and the walkthrough's Gang policy."""
    fleet = FakeFleet(
        clusters={"cluster-a": ClusterScript(), "cluster-b": ClusterScript()},
        policy_doc=policy(),
        client=ts_env.client,
    )
    async with running_harness(ts_env, fleet) as h:
        yield h
