"""Failover events speak the policy's own words: purgeMode as the user spelled it
(``Immediately`` stays ``Immediately``, not the normalised ``Directly``)."""

from __future__ import annotations

import pytest

from tests.workflows.fakes import Harness, policy, walkthrough_job
from tests.workflows.test_job_lifecycle import events

pytestmark = [pytest.mark.timeout(60)]


@pytest.mark.parametrize("spelling", ["Immediately", "Directly", "Graciously", "Never"])
async def test_failover_events_use_the_policys_purge_mode_spelling(
    two_clusters: Harness, spelling: str
) -> None:
    fleet = two_clusters.fleet
    fleet.policy_doc = policy(purge=spelling, toleration=10)
    fleet.clusters["cluster-a"].timeline = [
        (5, "Healthy", "Running", ""),
        (20, "Unhealthy", "Failed", "pods failed"),
    ]
    fleet.clusters["cluster-b"].timeline = [
        (5, "Healthy", "Running", ""),
        (40, "Healthy", "Succeeded", ""),
    ]
    view = await two_clusters.run(walkthrough_job(f"spell-{spelling.lower()}"))
    assert view.state == "Succeeded"
    (started,) = events(view, "FailoverStarted")
    assert started.message == f"job unhealthy on cluster-a for 10s; purgeMode {spelling}"
    if spelling == "Never":
        (evicted,) = events(view, "Evicted")
        assert evicted.message.endswith("(purgeMode Never)")
