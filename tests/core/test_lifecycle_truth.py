"""States and events that tell the truth (issue 27 item 4), decided by fleetq.lifecycle:
a job whose copy is unhealthy shows ``Unhealthy`` through its toleration window (since
when, and when it fails over unless it recovers); a taint eviction is announced when it
is scheduled and recorded when it is done; a deferred purge is never called a purge; a
copy's AGE is the copy's own ``metadata.creationTimestamp``.

Upstream, Karmada's application failover controller stamps the time a workload turned
unhealthy on a cluster, evicts only once ``tolerationSeconds`` have passed since then and
forgets the stamp when the workload is no longer unhealthy there
(pkg/controllers/applicationfailover/rb_application_failover_controller.go
``detectFailure`` / ``deleteIrrelevantClusters``). Its taint manager queues a binding on a
tolerated NoExecute taint ``AddAfter`` the toleration and evicts only once
``needEviction`` says it ran out (pkg/controllers/cluster/taint_manager.go
``syncBindingEviction``); the eviction event is recorded after the eviction, "Evict from
cluster %s succeed." (pkg/util/helper ``EmitClusterEvictionEventForResourceBinding``).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from fleetq import lifecycle
from fleetq.cli.get import copy_rows
from fleetq.cli.output import age
from fleetq.lifecycle import Announce, JobProgress, Reason, Transition
from fleetq.messages import JobStatus, JobView, MemberTaint
from fleetq.models import ApplicationFailover
from fleetq.naming import SA_STATE
from tests.core.job_progress import at, job_progress
from workflows.metrics import JOB_STATES

UNREACHABLE = "cluster.karmada.io/unreachable:NoExecute"




def progress(**view: Any) -> JobProgress:
    return job_progress(**{"cluster": "a", "copies": ["a"], **view})


def status(health: str = "Healthy", phase: str = "Running", **more: Any) -> JobStatus:
    return JobStatus(cluster="a", health=health, phase=phase, **more)  # type: ignore[arg-type]


def tainted(evict_in: float, tolerated: int | None = 300, **more: Any) -> JobStatus:
    """The member of the job is unreachable: its NoExecute taint evicts at ``evict_in``."""
    return status(
        "Unknown", "Unknown",
        taints=[MemberTaint(key="cluster.karmada.io/unreachable", effect="NoExecute",
                            time_added=at(evict_in - (tolerated or 0)))],
        evict_at=at(evict_in),
        evict_reason=f"a: taint {UNREACHABLE} outlasted tolerationSeconds {tolerated}",
        evict_taint=UNREACHABLE,
        evict_tolerated=tolerated,
        **more,
    )


def announced(notices: list[lifecycle.Notice]) -> list[Announce]:
    return [n for n in notices if isinstance(n, Announce)]


def carried_out(p: JobProgress, notices: list[lifecycle.Notice]) -> list[lifecycle.Notice]:
    """What the workflow does with the notices (``_announce``): a transition sets the
    state shown."""
    for n in notices:
        if isinstance(n, Transition):
            p.view.state, p.view.reason = n.state, n.reason
    return notices


def shown(notices: list[lifecycle.Notice]) -> Transition:
    last = notices[-1]
    assert isinstance(last, Transition)
    return last


# ---------------------------------------------------------------------- Unhealthy


def test_an_unhealthy_copy_shows_unhealthy_through_its_toleration_then_running_again() -> None:
    p = progress()
    first = lifecycle.observe(p, status("Unhealthy", reason="pod master-0 Failed: OOMKilled"),
                              at(0), tolerance=300)
    assert shown(first) == Transition(
        "Unhealthy",
        "unhealthy on a since 2026-01-01T00:00:00Z: pod master-0 Failed: OOMKilled; "
        "fails over at 2026-01-01T00:05:00Z unless it recovers",
    )
    # later in the window: still Unhealthy, still counting from the first unhealthy status
    later = lifecycle.observe(p, status("Unhealthy", reason="pod master-0 Failed: OOMKilled"),
                              at(120), tolerance=300)
    assert shown(later).state == "Unhealthy"
    assert "fails over at 2026-01-01T00:05:00Z" in shown(later).reason
    # it recovers before the deadline: Running again, with a Recovered event, no timer
    back = lifecycle.observe(p, status("Healthy"), at(200), tolerance=300)
    assert announced(back) == [Announce("Normal", Reason.RECOVERED, "job healthy again on a")]
    assert shown(back) == Transition("Running", "running on a")
    assert p.view.unhealthy_since is None
    assert lifecycle.next_deadline(p, tolerance=300, active_deadline_seconds=None,
                                   now=at(200)) is None


def test_a_failed_copy_under_a_failover_policy_is_unhealthy_not_running() -> None:
    p = progress(state="Running")
    notices = lifecycle.observe(p, status("Unhealthy", "Failed", reason="BackoffLimitExceeded"),
                                at(10), tolerance=30)
    assert shown(notices).state == "Unhealthy"
    assert shown(notices).reason.endswith("fails over at 2026-01-01T00:00:40Z unless it recovers")
    # the failover deadline is the one the reason names
    deadline = lifecycle.next_deadline(p, tolerance=30, active_deadline_seconds=None, now=at(10))
    assert deadline is not None and deadline.due == lifecycle.Due.FAILOVER
    assert deadline.seconds == 30


def test_unhealthy_without_a_failover_policy_says_it_will_not_fail_over() -> None:
    p = progress()
    notices = lifecycle.observe(p, status("Unhealthy", reason="pod worker-1 cannot be scheduled"),
                                at(0), tolerance=None)
    assert shown(notices) == Transition(
        "Unhealthy",
        "unhealthy on a since 2026-01-01T00:00:00Z: pod worker-1 cannot be scheduled; "
        "no failover.application in its policy",
    )


def test_an_unreachable_member_keeps_the_unhealthy_state_and_its_deadline() -> None:
    p = progress()
    carried_out(p, lifecycle.observe(p, status("Unhealthy", reason="OOM"), at(0), tolerance=60))
    notices = lifecycle.observe(p, status("Unknown", "Unknown"), at(20), tolerance=60)
    assert shown(notices).state == "Unhealthy"
    assert p.view.unhealthy_since == at(0)


def test_unhealthy_is_a_lasting_state_published_to_fleetq_state() -> None:
    view = progress(state="Unhealthy").view
    assert lifecycle.search_attribute_changes(view, {SA_STATE: "Running"})[SA_STATE] == (
        "Unhealthy"
    )
    assert "Unhealthy" in JOB_STATES  # fleetq_job_state_transitions{state="Unhealthy"}


# ---------------------------------------------------------------------- taint eviction


def test_a_taint_eviction_is_announced_as_scheduled_never_as_done() -> None:
    p = progress()
    notices = lifecycle.observe(p, tainted(evict_in=300), at(0))
    (event,) = announced(notices)
    assert event == Announce(
        "Warning", Reason.TAINT_EVICTION,
        f"a: taint {UNREACHABLE} tolerated for 300s: will evict at 2026-01-01T00:05:00Z "
        "unless it recovers",
    )
    assert "outlasted" not in event.message
    # the same schedule seen again: nothing new to say
    assert announced(lifecycle.observe(p, tainted(evict_in=300), at(60))) == []
    # the eviction itself, when done, counts from the taint's time added
    assert lifecycle.evicted_after(p, at(300), taint=True) == 300
    assert lifecycle.failover_reason(lifecycle.Due.EVICT, "a", None, p.evict_reason) == (
        f"on a: taint {UNREACHABLE} outlasted tolerationSeconds 300"
    )


def test_a_taint_that_goes_calls_the_eviction_off_and_says_so() -> None:
    p = progress()
    lifecycle.observe(p, tainted(evict_in=300), at(0))
    notices = lifecycle.observe(p, status("Healthy"), at(100))
    assert announced(notices) == [
        Announce("Normal", Reason.TAINT_EVICTION,
                 "a: its NoExecute taint is gone; the eviction due at 2026-01-01T00:05:00Z "
                 "is called off")
    ]
    assert p.evict_at is None and p.evict_since is None
    assert lifecycle.next_deadline(p, tolerance=None, active_deadline_seconds=None,
                                   now=at(100)) is None


def test_an_untolerated_taint_says_so_and_a_moved_eviction_is_announced_again() -> None:
    p = progress()
    (now_event,) = announced(lifecycle.observe(p, tainted(evict_in=0, tolerated=None), at(0)))
    assert now_event.message == (
        f"a: taint {UNREACHABLE} is not tolerated: will evict at 2026-01-01T00:00:00Z "
        "unless it recovers"
    )
    q = progress()
    lifecycle.observe(q, tainted(evict_in=300), at(0))
    (moved,) = announced(lifecycle.observe(q, tainted(evict_in=400), at(10)))
    assert "will evict at 2026-01-01T00:06:40Z" in moved.message


# ---------------------------------------------------------------------- Evicted, purges


def test_the_evicted_event_says_after_how_long_and_never_purged_when_deferred() -> None:
    plan = lifecycle.failover_plan(ApplicationFailover.model_validate(
        {"decisionConditions": {"tolerationSeconds": 30}, "purgeMode": "Immediately"}
    ), strict_fencing=False)
    p = progress(unhealthy_since=at(0))
    after = lifecycle.evicted_after(p, at(31), taint=False)
    assert after == 31
    assert plan.evicted_message("a", after=after) == (
        "evicted from a after 31s; old copy purged first"
    )
    # the member did not answer the purge: PurgeDeferred was said, the copy is pending
    p.view.pending_purges.append("a")
    assert lifecycle.purge_deferred(p.view, "a")
    deferred = plan.evicted_message("a", after=after, deferred=True)
    assert deferred == (
        "evicted from a after 31s; old copy not purged yet: a did not answer, it is purged as "
        "soon as it does"
    )
    assert "purged first" not in deferred
    lifecycle.forget_copy(p.view, "a")  # the purger purged it once a answered
    assert not lifecycle.purge_deferred(p.view, "a")


# ---------------------------------------------------------------------- AGE


def test_a_copys_age_is_its_own_creation_timestamp_also_while_unreachable() -> None:
    p = progress(bound_at=at(5), created_at=at(0))
    lifecycle.observe(p, status("Healthy", created_at=at(7)), at(8))
    assert p.view.copy_created == {"a": at(7)}
    # unreachable: what was read stays (not when fleetq last saw the member)
    lifecycle.observe(p, status("Unknown", "Unknown"), at(500))
    assert p.view.copy_created == {"a": at(7)}
    lifecycle.forget_copy(p.view, "a")
    assert p.view.copy_created == {}


def test_get_pytorchjob_m_without_members_shows_each_copys_own_age() -> None:
    now = datetime.now(UTC)
    view = JobView(namespace="default", name="train", state="Running", cluster="b",
                   copies=["a", "b"], created_at=now - timedelta(minutes=1),
                   bound_at=now - timedelta(minutes=1),
                   copy_created={"a": now - timedelta(days=3), "b": now - timedelta(hours=5)})
    _, rows = copy_rows([view], all_namespaces=False)
    ages = {r[1]: r[3] for r in rows}
    assert ages == {"a": age(view.copy_created["a"]), "b": age(view.copy_created["b"])}
    assert ages["a"].endswith("d") and ages["b"].endswith("h")
    unread = view.model_copy(update={"copy_created": {}})
    _, rows = copy_rows([unread], all_namespaces=False)
    assert {r[3] for r in rows} == {"<unknown>"}


def test_a_pods_age_is_its_creation_timestamp_as_kubectl_shows_it() -> None:
    """kubectl's printPod: AGE is ``translateTimestampSince(pod.CreationTimestamp)``
    (kubernetes pkg/printers/internalversion/printers.go), not its startTime."""
    from fleetq.cli.get import pod_rows
    from fleetq.member_contract import job_status

    now = datetime.now(UTC)
    created = (now - timedelta(days=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    started = (now - timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    job = {"metadata": {"name": "train", "namespace": "default", "uid": "u1",
                        "creationTimestamp": created}, "status": {}}
    pod = {"metadata": {"name": "train-master-0", "creationTimestamp": created},
           "status": {"phase": "Running", "startTime": started}}
    st = job_status("a", job, [pod], now=now.timestamp(), unschedulable_grace_s=60)
    assert st.created_at is not None and st.pods[0].created_at == created
    view = JobView(namespace="default", name="train", state="Running", cluster="a",
                   pods=[p.model_dump() for p in st.pods])
    _, rows = pod_rows([view], all_namespaces=False)
    assert rows[0][-1] == age(created) and rows[0][-1].endswith("d")
