"""PyTorchJobWorkflow on the time-skipping server: placement retries, binding events,
failover with each purgeMode, recovery inside the toleration, deletion, bad input."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from fleetq.messages import JobView
from fleetq.testing.fake_fleet import ClusterScript, FakeFleet
from tests.workflows.fakes import Harness, policy, running_harness, walkthrough_job

# No reruns: a test here that depends on the machine's speed is a bug to fix. (One was:
# at a failover or grace deadline the job started a watch with a 1 ms timer beside it; a
# fake watch answers at once, so the task cancelled a timer the test server was firing at
# that instant, which it refuses and never retries (temporalio/sdk-java#2606): the
# workflow hung, more often on a loaded machine. `no_short_timer_beside_a_watch` pins it.)
pytestmark = [pytest.mark.timeout(60)]

#: How late a deadline may be acted on. Its timer fires on time, but the server's clock
#: also runs with the real time the worker takes for the tasks around it, more on a busy
#: machine. A deadline missed (acted on at the next watch) comes a rewatch pause, 10 s,
#: later, so this still tells the two apart without depending on the machine's speed.
LATE = 5.0


@pytest_asyncio.fixture
async def harness(ts_env: WorkflowEnvironment) -> AsyncIterator[Harness]:
    fleet = FakeFleet(
        clusters={
            "cluster-a": ClusterScript(),
            "cluster-b": ClusterScript(),
            "cluster-c": ClusterScript(fits=False),
        },
        policy_doc=policy(),
        client=ts_env.client,
    )
    async with running_harness(ts_env, fleet) as h:
        yield h


async def run_history_lengths(env: WorkflowEnvironment, wid: str, run_id: str | None) -> list[int]:
    """History length of every run of a workflow, following the continue-as-new chain."""
    lengths = []
    while run_id:
        hist = await env.client.get_workflow_handle(wid, run_id=run_id).fetch_history()
        lengths.append(len(hist.events))
        last = hist.events[-1]
        attrs = last.workflow_execution_continued_as_new_event_attributes
        run_id = (
            attrs.new_execution_run_id
            if last.HasField("workflow_execution_continued_as_new_event_attributes")
            else None
        )
    return lengths


def events(view: JobView, reason: str) -> list[Any]:
    return [e for e in view.events if e.reason == reason]


async def short_timers_beside_watches(handle: WorkflowHandle[Any, Any]) -> list[str]:
    """Timers under a second started by the same workflow task as a watch. Such a timer
    races the watch: when the watch answers first, the next task cancels the timer while
    the server may be firing it, which the time-skipping server cannot take
    (temporalio/sdk-java#2606) and a machine's speed decides. A deadline that close is
    waited for on a timer alone."""
    history = await handle.fetch_history()
    watches_by_task: set[int] = set()
    short: list[tuple[int, int, float]] = []
    for e in history.events:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = e.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == "watch_status":
                watches_by_task.add(attrs.workflow_task_completed_event_id)
        elif e.event_type == EventType.EVENT_TYPE_TIMER_STARTED:
            t = e.timer_started_event_attributes
            seconds = t.start_to_fire_timeout.ToTimedelta().total_seconds()
            if seconds < 1:
                short.append((e.event_id, t.workflow_task_completed_event_id, seconds))
    return [f"event {eid}: {seconds:g}s timer started with a watch"
            for eid, task, seconds in short if task in watches_by_task]


async def run_checked(harness: Harness, manifest: dict[str, Any]) -> JobView:
    """Run a job to its end; its history must have no short timer racing a watch."""
    handle = await harness.start(manifest)
    view = JobView.model_validate(await handle.result())
    assert await short_timers_beside_watches(handle) == []
    return view


async def test_gang_walkthrough_binds_all_replicas_on_one_cluster(harness: Harness) -> None:
    harness.fleet.clusters["cluster-a"].timeline = [
        (5, "Healthy", "Running", ""),
        (60, "Healthy", "Succeeded", ""),
    ]
    view = await harness.run(walkthrough_job())
    assert view.state == "Succeeded"
    assert view.cluster == "cluster-a"
    (bound,) = events(view, "ScheduleBindingSucceed")
    assert bound.message == (
        "Binding has been scheduled successfully. Result: {cluster-a:0,[{master 1} {worker 2}]}"
    )
    assert harness.fleet.count("bind") == 1
    assert (
        view.summary
        == "PyTorchJob default/pytorch-test: 1 master + 2 workers, cpu 4.01, memory 4Gi"
    )


async def test_invalid_manifest_fails_with_field_message_and_touches_nothing(
    harness: Harness,
) -> None:
    bad = walkthrough_job("bad-job")
    bad["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = -1
    handle = await harness.start(bad)
    with pytest.raises(WorkflowFailureError) as info:
        await handle.result()
    assert (
        "PyTorchJob default/bad-job: spec.pytorchReplicaSpecs.Worker.replicas must be at least 1"
        in str(info.value.cause)
    )
    assert harness.fleet.calls == []


async def test_nothing_fits_is_pending_with_reasons_then_binds_on_retry(harness: Harness) -> None:
    for c in harness.fleet.clusters.values():
        c.fits = False
    handle = await harness.start(walkthrough_job("waits"))
    for _ in range(100):
        view = JobView.model_validate(await handle.query("status"))
        if view.state == "Pending":
            break
        await asyncio.sleep(0.05)
    assert view.state == "Pending"
    assert "cluster-b: worker-1 needs cpu 2, largest free node has 1.5" in view.reason
    harness.fleet.clusters["cluster-b"].fits = True
    harness.fleet.clusters["cluster-b"].timeline = [(1, "Healthy", "Succeeded", "")]
    await handle.signal("retry_placement")
    view = JobView.model_validate(await handle.result())
    assert view.state == "Succeeded" and view.cluster == "cluster-b"
    assert events(view, "FailedScheduling")


async def test_lost_reservation_falls_through_to_next_candidate(harness: Harness) -> None:
    a = harness.fleet.clusters["cluster-a"]
    a.reservation, a.reserve_ok = True, False
    harness.fleet.clusters["cluster-b"].timeline = [(1, "Healthy", "Succeeded", "")]
    view = await harness.run(walkthrough_job("race"))
    assert view.cluster == "cluster-b"
    assert harness.fleet.count("reserve", "cluster-a") == 1
    assert harness.fleet.count("bind", "cluster-a") == 0
    assert "reservation lost" in view.rejections["cluster-a"]


async def test_failover_directly_after_toleration_purges_old_copy_first(harness: Harness) -> None:
    harness.fleet.clusters["cluster-a"].timeline = [
        (5, "Healthy", "Running", ""),
        (20, "Unhealthy", "Failed", "pods failed"),
    ]
    harness.fleet.clusters["cluster-b"].timeline = [
        (5, "Healthy", "Running", ""),
        (50, "Healthy", "Succeeded", ""),
    ]
    view = await run_checked(harness, walkthrough_job("fo-direct"))
    assert view.state == "Succeeded" and view.cluster == "cluster-b"
    assert view.evicted == ["cluster-a"]
    (unhealthy,) = events(view, "Unhealthy")
    (started,) = events(view, "FailoverStarted")
    waited = (started.time - unhealthy.time).total_seconds()
    assert 30 <= waited < 30 + LATE, waited
    order = [(n, c) for n, c in harness.fleet.calls if n in ("purge", "bind")]
    assert order.index(("purge", "cluster-a")) < order.index(("bind", "cluster-b"))
    assert harness.fleet.copies == {"cluster-b"}
    assert [
        e.reason for e in view.events if e.reason in ("FailoverStarted", "Evicted", "Rescheduled")
    ] == ["FailoverStarted", "Evicted", "Rescheduled"]
    assert (
        "cluster-a"
        in harness.fleet.calls[[n for n, _ in harness.fleet.calls].index("plan_placement", 2)][1]
    )


async def test_recovery_inside_toleration_does_not_fail_over(harness: Harness) -> None:
    harness.fleet.clusters["cluster-a"].timeline = [
        (5, "Healthy", "Running", ""),
        (20, "Unhealthy", "Running", "pod restarting"),
        (40, "Healthy", "Running", ""),
        (100, "Healthy", "Succeeded", ""),
    ]
    view = await harness.run(walkthrough_job("recovers"))
    assert view.state == "Succeeded" and view.cluster == "cluster-a"
    assert not events(view, "FailoverStarted")
    assert events(view, "Recovered")
    assert harness.fleet.count("bind") == 1


async def test_unknown_health_does_not_reset_the_failover_timer(harness: Harness) -> None:
    harness.fleet.clusters["cluster-a"].timeline = [
        (5, "Healthy", "Running", ""),
        (20, "Unhealthy", "Failed", "pods failed"),
        (25, "Unreachable", "", ""),
        (200, "Reachable", "", ""),
    ]
    harness.fleet.clusters["cluster-b"].timeline = [(30, "Healthy", "Succeeded", "")]
    view = await run_checked(harness, walkthrough_job("unknown"))
    (unhealthy,) = events(view, "Unhealthy")
    (started,) = events(view, "FailoverStarted")
    assert 30 <= (started.time - unhealthy.time).total_seconds() < 30 + LATE
    # Directly, but cluster-a was unreachable: its copy was purged once it came back.
    assert events(view, "PurgeDeferred")
    assert harness.fleet.copies == {"cluster-b"}
    assert view.pending_purges == []


async def test_graceful_purges_old_copy_once_new_copy_is_healthy(harness: Harness) -> None:
    harness.fleet.policy_doc = policy(purge="Graciously")
    harness.fleet.clusters["cluster-a"].timeline = [
        (5, "Healthy", "Running", ""),
        (20, "Unhealthy", "Failed", "pods failed"),
    ]
    harness.fleet.clusters["cluster-b"].timeline = [
        (15, "Healthy", "Running", ""),
        (300, "Healthy", "Succeeded", ""),
    ]
    view = await run_checked(harness, walkthrough_job("fo-graceful"))
    order = [(n, c) for n, c in harness.fleet.calls if n in ("purge", "bind")]
    assert order.index(("bind", "cluster-b")) < order.index(("purge", "cluster-a"))
    (purged,) = events(view, "Purged")
    (resched,) = events(view, "Rescheduled")
    assert "healthy" in purged.message
    assert (purged.time - resched.time).total_seconds() < 60  # not the 600 s grace period
    assert harness.fleet.copies == {"cluster-b"}


async def test_graceful_purges_old_copy_after_grace_period(harness: Harness) -> None:
    harness.fleet.policy_doc = policy(purge="Gracefully", grace=600)
    harness.fleet.clusters["cluster-a"].timeline = [
        (5, "Healthy", "Running", ""),
        (20, "Unhealthy", "Failed", "pods failed"),
    ]
    harness.fleet.clusters["cluster-b"].timeline = [
        (2000, "Healthy", "Succeeded", "")
    ]  # stays Created
    view = await run_checked(harness, walkthrough_job("fo-grace"))
    (evicted,) = events(view, "Evicted")
    (purged,) = events(view, "Purged")
    assert "grace period" in purged.message
    assert 600 <= (purged.time - evicted.time).total_seconds() < 600 + LATE
    assert harness.fleet.copies == {"cluster-b"}


async def test_never_keeps_the_old_copy(harness: Harness) -> None:
    harness.fleet.policy_doc = policy(purge="Never")
    harness.fleet.clusters["cluster-a"].timeline = [(20, "Unhealthy", "Failed", "pods failed")]
    harness.fleet.clusters["cluster-b"].timeline = [(30, "Healthy", "Succeeded", "")]
    view = await run_checked(harness, walkthrough_job("fo-never"))
    assert view.cluster == "cluster-b"
    assert harness.fleet.count("purge", "cluster-a") == 0
    assert harness.fleet.copies == {"cluster-a", "cluster-b"}


async def test_failover_with_no_cluster_left_ends_failed(harness: Harness) -> None:
    harness.fleet.clusters.pop("cluster-b")
    harness.fleet.clusters.pop("cluster-c")
    harness.fleet.clusters["cluster-a"].timeline = [(10, "Unhealthy", "Failed", "pods failed")]
    view = await harness.run(walkthrough_job("nowhere"))
    assert view.state == "Failed"
    assert "no member cluster is eligible" in view.reason


async def test_delete_purges_member_copy(harness: Harness) -> None:
    handle = await harness.start(walkthrough_job("deleted"))
    for _ in range(100):
        if harness.fleet.copies:
            break
        await asyncio.sleep(0.05)
    assert harness.fleet.copies == {"cluster-a"}
    await handle.cancel()
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    assert harness.fleet.copies == set()
    view = JobView.model_validate(await handle.query("status"))
    assert view.state == "Deleted"


@pytest.mark.full_tier  # ~15 s of time-skipped watch windows; the full suite runs it
async def test_week_long_job_keeps_each_run_history_bounded(harness: Harness) -> None:
    harness.fleet.clusters["cluster-a"].timeline = [
        (5, "Healthy", "Running", ""),
        (7 * 86400, "Healthy", "Succeeded", ""),
    ]
    handle = await harness.start(walkthrough_job("week"), rewatch_seconds=600)
    view = JobView.model_validate(await handle.result())
    assert view.state == "Succeeded"
    lengths = await run_history_lengths(harness.env, handle.id, handle.first_execution_run_id)
    assert len(lengths) >= 2, lengths  # it continued-as-new
    assert max(lengths) < 1100, lengths
