"""A preempted job's decisions (fleetq.lifecycle), without Temporal: what it shows when
the quota workflow preempts it, when it stops (at once when nothing is bound, else when
its grace period ends: it may finish first), and what it holds afterwards."""

from __future__ import annotations

from typing import Any

from fleetq import lifecycle
from fleetq.lifecycle import Announce, Due, JobProgress, Reason, Transition
from fleetq.messages import JobStatus, PreemptSignal
from tests.core.job_progress import at, job_progress


def progress(**view: Any) -> JobProgress:
    return job_progress(**{"name": "low", **view})


def signal(grace: int = 30, message: str = "priority 1000 > 10") -> PreemptSignal:
    return PreemptSignal(
        preemptor="pytorchjob/default/high", reason="Priority", message=message,
        grace_seconds=grace,
    )


def test_a_bound_job_is_told_and_stops_when_its_grace_period_ends() -> None:
    p = progress(cluster="a", admitted=True, queue="q")
    notices = lifecycle.take_preemption(p, signal(), holding=True, now=at(0))
    assert notices == [
        Announce(
            "Warning",
            Reason.PREEMPTED,
            "preempted by default/high: priority 1000 > 10; stopping within 30s",
        ),
        Transition("Running", "preempted by default/high (priority 1000 > 10); "
                              "stopping within 30s"),
    ]
    assert not lifecycle.preemption_due(p, at(29.9))
    assert lifecycle.preemption_due(p, at(30))
    deadline = lifecycle.next_deadline(p, tolerance=None, active_deadline_seconds=None,
                                       now=at(10))
    assert deadline is not None
    assert (deadline.due, deadline.seconds) == (Due.PREEMPT, 20)
    assert deadline.summary == "preempted by default/high: 30s to stop"


def test_the_failover_timer_still_wins_when_it_is_nearer() -> None:
    p = progress(cluster="a", unhealthy_since=at(0))
    lifecycle.take_preemption(p, signal(grace=60), holding=True, now=at(0))
    deadline = lifecycle.next_deadline(p, tolerance=30, active_deadline_seconds=None,
                                       now=at(0))
    assert deadline is not None and deadline.due == Due.FAILOVER


def test_a_job_with_nothing_bound_is_requeued_at_once() -> None:
    p = progress(state="Pending", admitted=True, queue="q")
    notices = lifecycle.take_preemption(p, signal(), holding=True, now=at(0))
    assert notices[0] == Announce(
        "Warning",
        Reason.PREEMPTED,
        "preempted by default/high: priority 1000 > 10; nothing bound: queued again now",
    )
    assert lifecycle.preemption_due(p, at(0))


def test_only_a_quota_holder_that_is_not_over_can_be_preempted_and_only_once() -> None:
    assert lifecycle.take_preemption(progress(), signal(), holding=False, now=at(0)) == []
    done = progress(state="Succeeded")
    assert lifecycle.take_preemption(done, signal(), holding=True, now=at(0)) == []
    assert done.preempt is None and not lifecycle.preemption_due(done, at(100))
    p = progress(cluster="a")
    assert lifecycle.take_preemption(p, signal(grace=30), holding=True, now=at(0))
    assert lifecycle.take_preemption(p, signal(grace=0), holding=True, now=at(5)) == []
    assert p.preempt_at == at(30)  # the first grace period stands


def test_after_the_preemption_the_job_holds_nothing_and_waits_in_its_queue() -> None:
    p = progress(cluster="a", admitted=True, queue="q", deadline_at=at(600),
                 pods=[{"name": "low-master-0"}], created_at=at(-90))
    p.since = "Healthy/Running/3"
    lifecycle.take_preemption(p, signal(), holding=True, now=at(0))
    notices = lifecycle.requeue_after_preemption(p)
    # issue 24: the event says the job is back with its original submit time, named
    stamp = at(-90).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert notices == [
        Transition(
            "Queued",
            f"preempted by default/high; queued again with its original submit time {stamp}",
        )
    ]
    view = p.view
    assert (view.cluster, view.admitted, view.queue, view.pods) == (None, False, None, [])
    assert view.deadline_at is None  # activeDeadlineSeconds counts again from the next bind
    assert p.preempt is None and p.preempt_at is None and p.since == ""
    assert not lifecycle.preemption_due(p, at(100))


def test_a_preemption_survives_continue_as_new() -> None:
    p = progress(cluster="a")
    lifecycle.take_preemption(p, signal(grace=45), holding=True, now=at(0))
    carried = JobProgress.model_validate_json(p.model_dump_json())
    assert carried.preempt == signal(grace=45) and carried.preempt_at == at(45)
    older = JobProgress.model_validate(
        {"view": {"namespace": "default", "name": "x", "state": "Running"}, "resolution": {}}
    )
    assert older.preempt is None  # progress written before preemption existed


def test_a_job_that_finishes_during_its_grace_period_just_ends() -> None:
    p = progress(cluster="a")
    lifecycle.take_preemption(p, signal(), holding=True, now=at(0))
    verdict = lifecycle.judge(
        p, JobStatus(cluster="a", health="Healthy", phase="Succeeded"), tolerance=None,
        failover=False,
    )
    assert verdict.ending == Transition("Succeeded", "completed on a")
