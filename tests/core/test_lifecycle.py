"""The job lifecycle's decisions (fleetq.lifecycle), without Temporal: what a user sees
in ``fleetq describe`` / the Temporal UI and when a job fails over, purges or fails."""

from __future__ import annotations

from typing import Any

import pytest

from fleetq import lifecycle
from fleetq.job_input import InvalidJobInput, JobInput
from fleetq.lifecycle import (
    Announce,
    Due,
    OldCopy,
    Reason,
    Refresh,
    Transition,
)
from fleetq.messages import (
    Candidate,
    JobStatus,
    MemberTaint,
    PlacementVerdict,
)
from fleetq.models import ApplicationFailover, ClusterFailover, PurgeMode
from fleetq.naming import SA_CLUSTER, SA_PRIORITY, SA_QUEUE, SA_STATE
from fleetq.rejection import Rejection, RejectionCode
from tests.core.job_progress import at
from tests.core.job_progress import job_progress as progress


def status(health: str = "Healthy", phase: str = "Running", **more: Any) -> JobStatus:
    return JobStatus(cluster="a", health=health, phase=phase, **more)  # type: ignore[arg-type]




# ---------------------------------------------------------------------- health


def test_unhealthy_starts_the_failover_timer_once_and_says_so() -> None:
    p = progress(cluster="a")
    notices = lifecycle.observe(
        p, status("Unhealthy", reason="pod crashed"), at(0), tolerance=30
    )
    assert p.view.unhealthy_since == at(0)
    assert notices == [
        Announce("Warning", Reason.UNHEALTHY, "job unhealthy on a: pod crashed"),
        Transition(
            "Unhealthy",
            "unhealthy on a since 2026-01-01T00:00:00Z: pod crashed; fails over at "
            "2026-01-01T00:00:30Z unless it recovers",
        ),
    ]
    # still unhealthy later: the timer keeps its start, no second event
    notices = lifecycle.observe(
        p, status("Unhealthy", reason="pod crashed"), at(20), tolerance=30
    )
    assert p.view.unhealthy_since == at(0)
    assert not any(isinstance(n, Announce) for n in notices)


def test_unknown_neither_starts_nor_resets_the_timer_and_keeps_the_state() -> None:
    p = progress(cluster="a", state="Running", unhealthy_since=at(0))
    notices = lifecycle.observe(p, status("Unknown", "Unknown"), at(5))
    assert p.view.unhealthy_since == at(0)
    assert notices == [Transition("Running", "a: unreachable")]
    assert p.view.unreachable == {"a": at(5)}
    fresh = progress(cluster="a")
    lifecycle.observe(fresh, status("Unknown", "Unknown"), at(5))
    assert fresh.view.unhealthy_since is None


def test_unreachable_since_is_the_taint_time_when_the_member_says_it() -> None:
    p = progress(cluster="a")
    taints = [
        MemberTaint(key="cluster.karmada.io/unreachable", effect="NoSchedule", time_added=at(-30)),
        MemberTaint(key="cluster.karmada.io/not-ready", effect="NoSchedule", time_added=at(-10)),
    ]
    lifecycle.observe(p, status("Unknown", "Unknown", taints=taints), at(0))
    assert p.view.unreachable == {"a": at(-30)}
    lifecycle.observe(p, status("Healthy"), at(1))
    assert p.view.unreachable == {}


def test_healthy_again_resets_the_timer_with_a_recovered_event() -> None:
    p = progress(cluster="a", unhealthy_since=at(0))
    notices = lifecycle.observe(p, status("Healthy"), at(10))
    assert p.view.unhealthy_since is None
    assert notices[0] == Announce("Normal", Reason.RECOVERED, "job healthy again on a")


def test_taint_eviction_is_announced_once_and_cleared_when_the_taint_goes() -> None:
    p = progress(cluster="a")
    evicting = status(
        "Healthy",
        evict_at=at(300),
        evict_reason="a: taint cluster.karmada.io/not-ready:NoExecute outlasted "
        "tolerationSeconds 300",
        evict_taint="cluster.karmada.io/not-ready:NoExecute",
        evict_tolerated=300,
    )
    first = lifecycle.observe(p, evicting, at(0))
    assert first[0] == Announce(
        "Warning",
        Reason.TAINT_EVICTION,
        "a: taint cluster.karmada.io/not-ready:NoExecute tolerated for 300s: will evict at "
        "2026-01-01T00:05:00Z unless it recovers",
    )
    assert p.evict_at == at(300)
    again = lifecycle.observe(p, evicting, at(1))
    assert not any(isinstance(n, Announce) for n in again)
    lifecycle.observe(p, status("Healthy"), at(2))
    assert p.evict_at is None and p.evict_reason == ""


def test_shown_state_follows_the_member_phase() -> None:
    p = progress(state="Created")
    assert lifecycle.observe(p, status("Healthy", "Running"), at(0))[-1] == Transition(
        "Running", "running on a"
    )
    # a copy failed under a failover policy shows Unhealthy until it fails over
    created = progress(state="Created")
    failed = status("Unhealthy", "Failed", reason="OOM")
    assert lifecycle.observe(created, failed, at(1), tolerance=30)[-1] == Transition(
        "Unhealthy",
        "unhealthy on a since 2026-01-01T00:00:01Z: OOM; fails over at 2026-01-01T00:00:31Z "
        "unless it recovers",
    )
    # without a failover policy a failed copy ends the job (judge): no Unhealthy first
    assert lifecycle.observe(progress(), failed, at(1))[-1] == Refresh()
    assert lifecycle.observe(progress(), status("Healthy", "Missing"), at(0))[-1] == Refresh()


def test_a_quiet_window_is_no_change_and_a_failed_watch_is_unknown() -> None:
    p = progress()
    p.since = "Healthy/Running/3"
    assert not lifecycle.watch_changed(p, status(observed="Healthy/Running/3"))
    assert lifecycle.watch_changed(p, status(observed="Healthy/Running/4"))
    failed = lifecycle.unknown_status("a", "heartbeat timeout")
    assert failed.health == "Unknown" and failed.reason == "watch failed: heartbeat timeout"
    assert lifecycle.watch_changed(p, failed)


# ---------------------------------------------------------------------- what a status ends


def test_judge_ends_the_job_on_success_and_on_failure_without_failover() -> None:
    p = progress(cluster="a")
    ok = lifecycle.judge(p, status("Healthy", "Succeeded"), tolerance=None, failover=False)
    assert ok.ending == Transition("Succeeded", "completed on a")
    bad = lifecycle.judge(
        p,
        status("Unhealthy", "Failed", reason="BackoffLimitExceeded"),
        tolerance=None,
        failover=False,
    )
    assert bad.ending == Transition("Failed", "BackoffLimitExceeded")
    kept = lifecycle.judge(p, status("Unhealthy", "Failed"), tolerance=30, failover=True)
    assert kept.ending is None


def test_judge_purges_the_graceful_old_copy_once_the_new_one_runs_healthy() -> None:
    p = progress(cluster="b")
    p.graceful_old = "a"
    assert lifecycle.judge(
        p, status("Healthy", "Running"), tolerance=30, failover=True
    ).purge_graceful_old
    assert not lifecycle.judge(
        p, status("Healthy", "Created"), tolerance=30, failover=True
    ).purge_graceful_old
    assert not lifecycle.judge(
        p, status("Unhealthy", "Running"), tolerance=30, failover=True
    ).purge_graceful_old


def test_tolerance_zero_fails_over_at_the_first_unhealthy_status() -> None:
    p = progress(cluster="a", unhealthy_since=at(0))
    assert lifecycle.judge(p, status("Unhealthy"), tolerance=0, failover=True).fail_over_now
    assert not lifecycle.judge(p, status("Unhealthy"), tolerance=1, failover=True).fail_over_now


# ---------------------------------------------------------------------- deadlines


def test_the_nearest_deadline_wins() -> None:
    p = progress(cluster="a", unhealthy_since=at(0), deadline_at=at(100))
    p.evict_at, p.evict_reason = at(50), "a: unreachable"
    p.graceful_old, p.grace_deadline = "old", at(40)
    d = lifecycle.next_deadline(p, tolerance=30, active_deadline_seconds=100, now=at(10))
    assert d is not None and (d.due, d.seconds) == (Due.FAILOVER, 20.0)
    assert d.summary == "failover tolerance 30s on a"
    d = lifecycle.next_deadline(p, tolerance=60, active_deadline_seconds=100, now=at(10))
    assert d is not None and (d.due, d.summary) == (Due.GRACE, "grace period before purging old")
    p.graceful_old = None
    d = lifecycle.next_deadline(p, tolerance=None, active_deadline_seconds=100, now=at(10))
    assert d is not None and (d.due, d.summary) == (Due.EVICT, "evict: a: unreachable")
    p.evict_at = None
    d = lifecycle.next_deadline(p, tolerance=None, active_deadline_seconds=100, now=at(10))
    assert d is not None and d.due == Due.DEADLINE
    assert d.summary == "runPolicy.activeDeadlineSeconds 100"
    assert (
        lifecycle.next_deadline(progress(), tolerance=30, active_deadline_seconds=None, now=at(0))
        is None
    )


def test_a_deadline_due_is_negative_near_and_armed_at_the_shortest_timer() -> None:
    p = progress(cluster="a", unhealthy_since=at(0))
    d = lifecycle.next_deadline(p, tolerance=10, active_deadline_seconds=None, now=at(15))
    assert d is not None and d.seconds == -5.0 and d.near
    assert d.timer_seconds == lifecycle.MIN_TIMER_SECONDS
    far = lifecycle.next_deadline(p, tolerance=10, active_deadline_seconds=None, now=at(0))
    assert far is not None and not far.near and far.timer_seconds == 10.0
    assert lifecycle.rewatch_pause(10.0, None) == 10.0
    assert lifecycle.rewatch_pause(10.0, d) == lifecycle.MIN_TIMER_SECONDS


def test_failover_reasons_name_the_tolerance_or_the_taint() -> None:
    assert lifecycle.failover_reason(Due.FAILOVER, "a", 30, "") == "unhealthy on a for 30s"
    assert lifecycle.failover_reason(Due.EVICT, "a", 30, "a: unreachable for 300s") == (
        "on a: unreachable for 300s"
    )


# ---------------------------------------------------------------------- purge modes


def failover(**spec: Any) -> ApplicationFailover:
    return ApplicationFailover.model_validate(spec)


@pytest.mark.parametrize(
    ("spec", "strict", "old_copy", "name"),
    [
        ({"purgeMode": "Immediately"}, False, OldCopy.PURGE_FIRST, "Immediately"),
        ({"purgeMode": "Directly"}, True, OldCopy.CONFIRM_GONE, "Directly"),
        ({"purgeMode": "Graciously"}, False, OldCopy.PURGE_LATER, "Graciously"),
        ({}, False, OldCopy.PURGE_LATER, "Gracefully"),
        ({"purgeMode": "Never"}, False, OldCopy.KEEP, "Never"),
    ],
)
def test_purge_modes(spec: dict[str, Any], strict: bool, old_copy: OldCopy, name: str) -> None:
    plan = lifecycle.failover_plan(failover(**spec), strict_fencing=strict)
    assert plan.old_copy == old_copy
    assert plan.started_message("unhealthy on a for 30s") == (
        f"job unhealthy on a for 30s; purgeMode {name}"
    )


def test_a_taint_eviction_without_failover_policy_purges_the_old_copy_first() -> None:
    plan = lifecycle.failover_plan(None, strict_fencing=False)
    assert (plan.mode, plan.old_copy, plan.mode_name) == (
        PurgeMode.DIRECTLY,
        OldCopy.PURGE_FIRST,
        "Immediately",
    )
    assert plan.evicted_message("a") == "evicted from a; old copy purged first"


def test_gracefully_keeps_the_old_copy_for_its_grace_period() -> None:
    p = progress(cluster="a", copies=["a"], unhealthy_since=at(0))
    p.evict_at, p.since = at(99), "Unhealthy/Running"
    plan = lifecycle.failover_plan(
        failover(purgeMode="Gracefully", gracePeriodSeconds=90), strict_fencing=False
    )
    lifecycle.leave_cluster(p, "a")
    lifecycle.keep_old_copy(p, "a", plan, at(30))
    assert p.view.cluster is None and p.view.evicted == ["a"] and p.view.copies == ["a"]
    assert p.view.unhealthy_since is None and p.evict_at is None and p.since == ""
    assert (p.graceful_old, p.grace_deadline) == ("a", at(120))
    assert plan.evicted_message("a") == (
        "evicted from a; old copy purged once the new one is healthy or after 90s"
    )
    default = lifecycle.failover_plan(failover(purgeMode="Gracefully"), strict_fencing=False)
    assert default.grace_seconds == lifecycle.DEFAULT_GRACE_SECONDS == 600


def test_never_leaves_the_old_copy_running_and_forgets_it() -> None:
    p = progress(cluster="a", copies=["a"])
    plan = lifecycle.failover_plan(failover(purgeMode="Never"), strict_fencing=False)
    lifecycle.leave_cluster(p, "a")
    lifecycle.keep_old_copy(p, "a", plan, at(0))
    assert p.view.copies == [] and p.graceful_old is None
    assert plan.evicted_message("a") == "evicted from a; old copy kept (purgeMode Never)"


# ---------------------------------------------------------------------- placement


def test_placement_tries_the_three_best_candidates_in_rank_order() -> None:
    ranked = [Candidate(cluster=f"c{i}", score=10 - i) for i in range(5)]
    verdict = PlacementVerdict(candidates=ranked, eligible=[c.cluster for c in ranked])
    assert [c.cluster for c in lifecycle.candidates(verdict)] == ["c0", "c1", "c2"]


def test_unplaceable_only_when_no_member_is_eligible() -> None:
    never = PlacementVerdict(rejections=[Rejection.of(
        RejectionCode.AFFINITY_MISMATCH, "a: not selected by the policy's clusterAffinity"
    ).at("a")])
    assert lifecycle.unplaceable_reason(never) == (
        "no member cluster is eligible: a: not selected by the policy's clusterAffinity"
    )
    full = PlacementVerdict(rejections=[Rejection.of(
        RejectionCode.INSUFFICIENT_CLUSTER_RESOURCE, "insufficient cpu").at("a")], eligible=["a"])
    assert lifecycle.unplaceable_reason(full) is None
    assert lifecycle.pending_reason({"b": "no gpu", "a": "insufficient cpu"}) == (
        "a: insufficient cpu; b: no gpu"
    )
    assert lifecycle.pending_reason({}) == "no member cluster has room"


def test_placement_backoff_doubles_to_a_minute() -> None:
    delays = [lifecycle.PLACEMENT_BACKOFF.initial]
    for _ in range(8):
        delays.append(lifecycle.PLACEMENT_BACKOFF.after(delays[-1]))
    assert delays == [2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0, 60.0]


def test_placement_pause_stops_at_the_active_deadline() -> None:
    assert lifecycle.placement_pause(32.0, None, at(0)) == 32.0
    assert lifecycle.placement_pause(32.0, at(5), at(0)) == 5.0
    assert lifecycle.placement_pause(32.0, at(5), at(9)) == lifecycle.MIN_TIMER_SECONDS


def test_a_bind_records_the_copy_once_and_watches_for_phase_changes() -> None:
    p = progress(state="Scheduling", copies=["a"])
    lifecycle.record_bind(p, "a", {"b": "no room"}, at(3))
    assert (p.view.cluster, p.view.copies, p.view.bound_at) == ("a", ["a"], at(3))
    assert p.view.rejections == {"b": "no room"} and p.since == lifecycle.FIRST_WATCH_SINCE


# ---------------------------------------------------------------------- runPolicy


def test_active_deadline_is_armed_once_from_the_first_bind() -> None:
    view = progress().view
    assert not lifecycle.deadline_to_arm(view, None)
    assert lifecycle.deadline_to_arm(view, 60)
    view.deadline_at = lifecycle.deadline_at(60, at(0))
    assert view.deadline_at == at(60)
    assert not lifecycle.deadline_to_arm(view, 60)  # a failover's bind keeps it
    assert not lifecycle.deadline_passed(view, at(59.999))
    assert lifecycle.deadline_passed(view, at(60))
    assert lifecycle.deadline_at(-5, at(0)) == at(0)
    assert lifecycle.deadline_exceeded_reason(60) == (
        "DeadlineExceeded: active longer than runPolicy.activeDeadlineSeconds 60"
    )


def test_a_suspension_forgets_the_placement_and_its_deadline() -> None:
    p = progress(cluster="a", pods=[{"name": "x"}], unhealthy_since=at(0), deadline_at=at(9))
    p.evict_at, p.evict_reason, p.since = at(5), "a: gone", "Healthy/Running"
    lifecycle.forget_placement(p)
    v = p.view
    assert (v.cluster, v.pods, v.unhealthy_since, v.deadline_at) == (None, [], None, None)
    assert (p.evict_at, p.evict_reason, p.since) == (None, "", "")
    assert lifecycle.suspended_message(True) == "suspended: copies purged, quota released"
    assert lifecycle.suspended_message(False) == "suspended"


def test_every_copy_is_purged_once() -> None:
    p = progress(cluster="b", copies=["a", "b"], pending_purges=["c", "a"])
    p.graceful_old = "d"
    assert lifecycle.copies_to_purge(p) == ["b", "a", "c", "d"]
    assert lifecycle.copies_to_purge(p, current=False) == ["a", "b", "c", "d"]
    lifecycle.forget_copy(p.view, "a")
    assert (p.view.copies, p.view.pending_purges) == (["b"], ["c"])


# ---------------------------------------------------------------------- what a job shows


def test_repeated_events_count_up_and_only_the_last_ones_are_kept() -> None:
    view = progress().view
    lifecycle.record_event(view, "Warning", Reason.FAILED_SCHEDULING, "no room", at(0))
    lifecycle.record_event(view, "Warning", Reason.FAILED_SCHEDULING, "no room", at(5))
    assert len(view.events) == 1
    assert (view.events[0].count, view.events[0].time) == (2, at(5))
    assert view.events[0].reason == "FailedScheduling"
    for i in range(lifecycle.MAX_EVENTS + 5):
        lifecycle.record_event(view, "Normal", Reason.PURGED, f"copy {i}", at(i))
    assert len(view.events) == lifecycle.MAX_EVENTS
    assert view.events[-1].message == f"copy {lifecycle.MAX_EVENTS + 4}"


def test_details_markdown() -> None:
    view = progress(
        state="Pending",
        reason="a: no room",
        queued=True,
        priority=5,
        evicted=["a"],
        pending_purges=["a"],
    ).view
    lifecycle.record_event(view, "Warning", Reason.FAILED_SCHEDULING, "a: no room", at(0))
    assert lifecycle.details_markdown(view) == "\n".join(
        [
            "**Pending** — a: no room",
            "",
            "- cluster: `-`",
            "- queue: `waiting`",
            "- priority: 5",
            "- evicted from: a",
            "- purge pending on: a",
            "- last event: FailedScheduling: a: no room",
        ]
    )


def test_search_attributes_change_only_in_lasting_states() -> None:
    view = progress(state="Scheduling", cluster="a", priority=3).view
    assert lifecycle.search_attribute_changes(view, {}) == {}
    view.state = "Created"
    assert lifecycle.search_attribute_changes(view, {}) == {}
    assert lifecycle.settling(view, {})
    flushed = lifecycle.search_attribute_changes(view, {}, flush=True)
    assert flushed[SA_STATE] == "Created" and flushed[SA_PRIORITY] == 3
    assert SA_QUEUE not in flushed  # an empty keyword never set stays unset
    assert not lifecycle.settling(view, flushed)
    view.state, view.cluster = "Running", None
    assert lifecycle.search_attribute_changes(view, flushed) == {
        SA_STATE: "Running",
        SA_CLUSTER: "",
    }


# ---------------------------------------------------------------------- continue-as-new


def test_progress_continues_as_new_whole() -> None:
    p = progress(cluster="a", copies=["a"], unhealthy_since=at(0), deadline_at=at(60))
    p.since, p.graceful_old, p.grace_deadline = "Healthy/Running", "b", at(30)
    p.evict_at, p.evict_reason = at(40), "a: unreachable"
    lifecycle.record_event(p.view, "Normal", Reason.BOUND, "bound", at(1))
    carried = JobInput(manifest={"kind": "PyTorchJob"}, progress=p)
    again = JobInput.model_validate_json(carried.model_dump_json())
    assert again.progress == p


def test_bad_workflow_input_is_refused_in_the_core() -> None:
    with pytest.raises(InvalidJobInput, match="must be a PyTorchJob manifest"):
        JobInput.from_arg(["not", "a", "manifest"])
    with pytest.raises(InvalidJobInput, match="workflow input"):
        JobInput.from_arg({"manifest": "nope"})
    assert JobInput.from_arg({"kind": "PyTorchJob"}).manifest == {"kind": "PyTorchJob"}


# ---------------------------------------------------------------------- suspend / resume


def test_a_resume_before_the_suspension_is_carried_out_cancels_it() -> None:
    s = lifecycle.Suspension()
    s.ask_suspend("Running")
    assert s.wanted
    s.ask_resume()
    assert (s.wanted, s.active, s.resume_wanted) == (False, False, False)


def test_a_suspended_job_resumes_on_resume_only() -> None:
    s = lifecycle.Suspension()
    s.ask_resume()  # not suspended: nothing to resume
    assert not s.resume_wanted
    s.ask_suspend("Queued")
    s.begin()
    assert (s.wanted, s.active) == (False, True)
    s.ask_suspend("Suspended")  # already suspended: nothing more
    assert not s.wanted
    s.ask_resume()
    assert s.resume_wanted
    s.end()
    assert (s.wanted, s.active, s.resume_wanted) == (False, False, False)


@pytest.mark.parametrize("state", ["Succeeded", "Failed", "Deleted"])
def test_a_finished_job_cannot_be_suspended(state: str) -> None:
    s = lifecycle.Suspension()
    s.ask_suspend(state)  # type: ignore[arg-type]
    assert not s.wanted


def test_the_run_continues_as_new_on_a_long_history() -> None:
    assert not lifecycle.continue_as_new_due(lifecycle.MAX_HISTORY_EVENTS, suggested=False)
    assert lifecycle.continue_as_new_due(lifecycle.MAX_HISTORY_EVENTS + 1, suggested=False)
    assert lifecycle.continue_as_new_due(10, suggested=True)


def test_a_policy_of_another_namespace_is_refused() -> None:
    assert lifecycle.policy_refusal("default", "p", "default") is None
    assert lifecycle.policy_refusal("other", "p", "default") == (
        "PropagationPolicy other/p: metadata.namespace must be the job's namespace default"
    )


def test_quota_is_released_when_granted_else_the_queue_is_left() -> None:
    assert lifecycle.quota_return(granted=True) == "release"
    assert lifecycle.quota_return(granted=False) == "cancel"


# Karmada release-1.18 PropagationPolicy API: "failover.cluster ... If this value is nil,
# the failover behavior in case of cluster failure will be controlled by the controller's
# no-execute-taint-eviction-purge-mode parameter. If set, the failover behavior in case of
# cluster failure will be defined by this value"; purgeMode Directly or Gracefully,
# defaulting to Gracefully (graceful eviction: kept until the new copy is healthy or the
# controller's --graceful-eviction-timeout, 10m, passes).
@pytest.mark.parametrize(
    ("cluster", "strict", "old_copy", "name"),
    [
        ({"purgeMode": "Directly"}, False, OldCopy.PURGE_FIRST, "Directly"),
        ({"purgeMode": "Directly"}, True, OldCopy.CONFIRM_GONE, "Directly"),
        ({"purgeMode": "Gracefully"}, False, OldCopy.PURGE_LATER, "Gracefully"),
        ({}, False, OldCopy.PURGE_LATER, "Gracefully"),  # the CRD's default
    ],
)
def test_a_cluster_failure_purges_as_failover_cluster_says(
        cluster: dict[str, Any], strict: bool, old_copy: OldCopy, name: str) -> None:
    app = failover(purgeMode="Never")  # what an application failure would do
    plan = lifecycle.failover_plan(app, strict_fencing=strict,
                                   cluster=ClusterFailover.model_validate(cluster))
    assert (plan.old_copy, plan.mode_name) == (old_copy, name)
    if old_copy == OldCopy.PURGE_LATER:
        assert plan.grace_seconds == 600
        assert plan.evicted_message("a") == (
            "evicted from a; old copy purged once the new one is healthy or after 600s")
    # without failover.cluster a cluster failure purges as the application failover says
    assert lifecycle.failover_plan(app, strict_fencing=strict).old_copy == OldCopy.KEEP
