"""What a job says while its copy is unhealthy and as it fails over (issue 27 item 4), on
the time-skipping server with scripted clusters: ``Unhealthy`` through the toleration
window and ``Running`` again when the copy recovers (Karmada's application failover
controller forgets a workload's unhealthy stamp once it is healthy again:
pkg/controllers/applicationfailover ``deleteIrrelevantClusters``), and purge events that
never contradict each other (a purge deferred because the member does not answer is
reported as deferred; only the purge done says purged)."""

from __future__ import annotations

from datetime import UTC, timedelta
from typing import Any

import pytest
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from fleetq.messages import JobView
from tests.workflows.fakes import Harness, walkthrough_job
from tests.workflows.test_job_lifecycle import events, harness

__all__ = ["harness"]

pytestmark = [pytest.mark.timeout(60)]


async def view_at(env: WorkflowEnvironment, handle: WorkflowHandle[Any, Any],
                  seconds: float) -> JobView:
    """The job's view once ``seconds`` more of (skipped) time have passed."""
    await env.sleep(seconds)
    return JobView.model_validate(await handle.query("status"))


async def test_unhealthy_through_the_toleration_then_running_again(
    harness: Harness, ts_env: WorkflowEnvironment
) -> None:
    harness.fleet.clusters["cluster-a"].timeline = [
        (5, "Healthy", "Running", ""),
        (20, "Unhealthy", "Running", "pod master-0 restarting"),
        (40, "Healthy", "Running", ""),
        (100, "Healthy", "Succeeded", ""),
    ]
    handle = await harness.start(walkthrough_job("truthful"))
    during = await view_at(ts_env, handle, 32)
    assert during.state == "Unhealthy", (during.state, during.reason)
    assert during.cluster == "cluster-a"
    assert during.reason.startswith("unhealthy on cluster-a since ")
    assert "pod master-0 restarting" in during.reason
    assert during.unhealthy_since is not None
    # since when, and tolerationSeconds 30 (the policy's) after that
    since = during.unhealthy_since.astimezone(UTC)
    fails_over_at = since + timedelta(seconds=30)
    assert f"since {since:%Y-%m-%dT%H:%M:%SZ}" in during.reason
    assert during.reason.endswith(f"fails over at {fails_over_at:%Y-%m-%dT%H:%M:%SZ} unless "
                                  "it recovers")
    after = await view_at(ts_env, handle, 15)
    assert after.state == "Running", (after.state, after.reason)
    assert after.unhealthy_since is None
    view = JobView.model_validate(await handle.result())
    assert view.state == "Succeeded" and view.cluster == "cluster-a"
    reasons = [e.reason for e in view.events]
    assert reasons.index("Unhealthy") < reasons.index("Recovered")
    assert "FailoverStarted" not in reasons


async def test_a_deferred_purge_is_never_reported_as_purged(harness: Harness) -> None:
    """Directly, but the old member is unreachable at the failover: PurgeDeferred, an
    Evicted event that says the old copy is not purged yet, and Purged only once the
    member answered and the copy is gone."""
    harness.fleet.clusters["cluster-a"].timeline = [
        (5, "Healthy", "Running", ""),
        (20, "Unhealthy", "Failed", "pods failed"),
        (25, "Unreachable", "", ""),
        (200, "Reachable", "", ""),
    ]
    harness.fleet.clusters["cluster-b"].timeline = [(30, "Healthy", "Succeeded", "")]
    view = await harness.run(walkthrough_job("deferred"))
    assert view.state == "Succeeded"
    (deferred,) = events(view, "PurgeDeferred")
    (evicted,) = events(view, "Evicted")
    (purged,) = events(view, "Purged")
    assert "purged first" not in evicted.message
    assert evicted.message.startswith("evicted from cluster-a after 3")  # ~30 s unhealthy
    assert "old copy not purged yet" in evicted.message
    assert deferred.time <= evicted.time < purged.time
    assert purged.message == "copy on cluster-a purged as soon as it answered again"
    assert harness.fleet.copies == {"cluster-b"}
