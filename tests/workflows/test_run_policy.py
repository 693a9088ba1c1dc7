"""runPolicy on the time-skipping server: activeDeadlineSeconds ends a job Failed
(DeadlineExceeded) with its copy purged; suspend (in the manifest or by signal) purges the
copy and waits, holding nothing, until resume."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from temporalio.client import WorkflowHandle

from fleetq.messages import JobView
from tests.workflows.fakes import Harness, walkthrough_job
from tests.workflows.test_job_lifecycle import events

pytestmark = [pytest.mark.timeout(60)]


def with_run_policy(name: str, **run_policy: Any) -> dict[str, Any]:
    doc = copy.deepcopy(walkthrough_job(name))
    doc["spec"]["runPolicy"] = {**doc["spec"].get("runPolicy", {}), **run_policy}
    return doc


async def state_of(handle: WorkflowHandle[Any, Any]) -> JobView:
    return JobView.model_validate(await handle.query("status"))


async def wait_state(handle: WorkflowHandle[Any, Any], state: str) -> JobView:
    for _ in range(400):
        view = await state_of(handle)
        if view.state == state:
            return view
        await asyncio.sleep(0.05)
    raise AssertionError(f"{handle.id} never {state} (last {view.state}: {view.reason})")


async def test_active_deadline_fails_the_job_and_purges_its_copy(two_clusters: Harness) -> None:
    two_clusters.fleet.clusters["cluster-a"].timeline = [
        (5, "Healthy", "Running", ""),
        (100_000, "Healthy", "Succeeded", ""),
    ]
    view = await two_clusters.run(with_run_policy("deadline", activeDeadlineSeconds=600))
    assert view.state == "Failed"
    assert view.reason == "DeadlineExceeded: active longer than runPolicy.activeDeadlineSeconds 600"
    (exceeded,) = events(view, "DeadlineExceeded")
    assert view.bound_at is not None
    ran = (exceeded.time - view.bound_at).total_seconds()
    assert 600 <= ran < 601, ran
    assert ("purge", "cluster-a") in two_clusters.fleet.calls
    assert two_clusters.fleet.copies == set()


async def test_a_job_that_ends_before_its_deadline_succeeds(two_clusters: Harness) -> None:
    two_clusters.fleet.clusters["cluster-a"].timeline = [
        (5, "Healthy", "Running", ""),
        (50, "Healthy", "Succeeded", ""),
    ]
    view = await two_clusters.run(with_run_policy("in-time", activeDeadlineSeconds=600))
    assert view.state == "Succeeded" and not events(view, "DeadlineExceeded")


async def test_suspended_at_submission_waits_holding_nothing_until_resumed(
        two_clusters: Harness) -> None:
    two_clusters.fleet.clusters["cluster-a"].timeline = [
        (5, "Healthy", "Running", ""),
        (20, "Healthy", "Succeeded", ""),
    ]
    handle = await two_clusters.start(with_run_policy("susp", suspend=True), rewatch_seconds=1.0)
    view = await wait_state(handle, "Suspended")
    assert view.cluster is None and two_clusters.fleet.count("bind") == 0
    assert two_clusters.fleet.count("plan_placement") == 0
    await handle.signal("resume")
    view = JobView.model_validate(await handle.result())
    assert view.state == "Succeeded" and view.cluster == "cluster-a"
    assert [e.reason for e in view.events if e.reason in ("Suspended", "Resumed")] == [
        "Suspended", "Resumed"]


async def test_suspending_a_running_job_purges_its_copy_and_resume_runs_it_again(
        two_clusters: Harness) -> None:
    two_clusters.fleet.clusters["cluster-a"].timeline = [
        (1, "Healthy", "Running", ""),
        (100_000, "Healthy", "Succeeded", ""),
    ]
    handle = await two_clusters.start(walkthrough_job("susp-run"), rewatch_seconds=1.0)
    await wait_state(handle, "Running")
    assert two_clusters.fleet.copies == {"cluster-a"}
    await handle.signal("suspend")
    view = await wait_state(handle, "Suspended")
    assert two_clusters.fleet.copies == set() and view.cluster is None
    assert ("purge", "cluster-a") in two_clusters.fleet.calls
    # the copy is gone: the next bind starts a fresh one, which succeeds after 30 s
    two_clusters.fleet.clusters["cluster-a"].jobs.pop("susp-run")
    two_clusters.fleet.clusters["cluster-a"].timeline = [
        (1, "Healthy", "Running", ""),
        (30, "Healthy", "Succeeded", ""),
    ]
    await handle.signal("resume")
    view = JobView.model_validate(await handle.result())
    assert view.state == "Succeeded" and two_clusters.fleet.count("bind") == 2
    assert [e.reason for e in view.events if e.reason in ("Suspended", "Resumed")] == [
        "Suspended", "Resumed"]
