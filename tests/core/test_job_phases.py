"""The decisions of a job's phases around the watch (fleetq.job_phases), without Temporal:
what a job is refused for at start, what it asks its quota workflow for and shows while
queued, what a bind, a failover, a passed deadline and a suspension record and show, and
whole lives (queued, admitted, bound, failed over, bound again) carried through them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from fleetq import job_phases, lifecycle
from fleetq.admission import Grant
from fleetq.fleet_config import RequeueSettings
from fleetq.job_input import JobInput
from fleetq.lifecycle import Announce, JobProgress, OldCopy, Reason, Transition
from fleetq.messages import (
    AdmissibilitySignal,
    Candidate,
    JobRef,
    PlacementVerdict,
    PreemptSignal,
    Resolution,
)
from fleetq.models import Gang, PropagationPolicy, PyTorchJob, gang_of, parse_job
from fleetq.quota import exceeds_max

T0 = datetime(2026, 1, 1, tzinfo=UTC)
JOB_ID = "pytorchjob/default/train"
REF = JobRef(namespace="default", name="train", workflow_id=JOB_ID, run_id="r1")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def manifest(annotations: dict[str, str] | None = None, workers: int = 1) -> dict[str, Any]:
    def spec(replicas: int) -> dict[str, Any]:
        return {"replicas": replicas, "restartPolicy": "OnFailure", "template": {"spec": {
            "containers": [{"name": "pytorch", "image": "pytorch:1.0",
                            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}}

    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": "train", "namespace": "default",
                         "annotations": annotations or {}},
            "spec": {"pytorchReplicaSpecs": {"Master": spec(1), "Worker": spec(workers)}}}


def policy_doc(namespace: str = "default", *, kind: str = "PropagationPolicy",
               purge: str = "Immediately", fencing: bool = False,
               preserve: bool = False) -> dict[str, Any]:
    application: dict[str, Any] = {"decisionConditions": {"tolerationSeconds": 30},
                                   "purgeMode": purge}
    if preserve:
        application["statePreservation"] = {"rules": [
            {"aliasLabelName": "step", "jsonPath": "{.step}"}]}
    metadata: dict[str, Any] = {"name": "p"}
    if kind == "PropagationPolicy":
        metadata["namespace"] = namespace
    if fencing:
        metadata["annotations"] = {"fleetq.io/fencing": "Strict"}
    return {"apiVersion": "policy.one.alibabacloud.com/v1alpha1", "kind": kind,
            "metadata": metadata,
            "spec": {"suspension": {"scheduling": True}, "propagateDeps": True,
                     "failover": {"application": application},
                     "placement": {"clusterAffinity": {"clusterNames": ["a", "b"]}},
                     "resourceSelectors": [{"apiVersion": "kubeflow.org/v1",
                                            "kind": "PyTorchJob"}]}}


def job() -> PyTorchJob:
    return parse_job(manifest())


def gang() -> Gang:
    return gang_of(job())


def policy(**kw: Any) -> PropagationPolicy:
    return job_phases.given_policy(policy_doc(**kw), "default")


def fresh() -> JobProgress:
    return job_phases.new_progress("default", "train", T0)


def bound_on(p: JobProgress, cluster: str, now: datetime, **kw: Any) -> list[Any]:
    options: dict[str, Any] = {"granted": True, "settings": RequeueSettings(),
                               "active_deadline_seconds": None}
    options.update(kw)
    return job_phases.bound(p, Candidate(cluster=cluster, score=1.0), {}, gang=gang(),
                            now=now, **options)


# ---------------------------------------------------------------------- the start


def test_a_job_is_refused_at_start_for_a_wrong_id_or_unreadable_preemption_annotations() -> None:
    inp, parsed = job_phases.read_input({"manifest": manifest()}, JOB_ID)
    assert parsed.metadata.name == "train" and inp.progress is None
    with pytest.raises(job_phases.Refused, match="workflow id must be 'pytorchjob/default/train'"):
        job_phases.read_input({"manifest": manifest()}, "pytorchjob/default/other")
    with pytest.raises(job_phases.Refused, match="fleetq.io/preemptible"):
        job_phases.read_input({"manifest": manifest({"fleetq.io/preemptible": "maybe"})},
                              JOB_ID)
    with pytest.raises(job_phases.Refused):
        job_phases.read_input({"manifest": {"kind": "PyTorchJob"}}, JOB_ID)


def test_a_namespaced_policy_applies_only_in_its_namespace_a_cluster_policy_anywhere() -> None:
    with pytest.raises(job_phases.Refused, match="must be the job's namespace default"):
        job_phases.given_policy(policy_doc("team-b"), "default")
    cluster_wide = job_phases.given_policy(policy_doc(kind="ClusterPropagationPolicy"),
                                           "default")
    assert cluster_wide.metadata.name == "p"


def test_a_continued_run_that_lost_its_policy_is_refused() -> None:
    p = fresh()
    with pytest.raises(job_phases.Refused, match="lost its policy across continue-as-new"):
        job_phases.carried_policy(p)
    p.resolution = Resolution(policy=policy_doc())
    assert job_phases.carried_policy(p).metadata.name == "p"


def test_a_resolved_job_shows_its_priority_queueing_and_gang() -> None:
    p = fresh()
    job_phases.show_request(p, gang(), policy())
    assert p.view.queued and p.view.priority == gang().priority
    assert p.view.gang and p.view.summary


# ---------------------------------------------------------------------- queueing


def test_the_request_keeps_the_original_submit_time_across_requeues() -> None:
    p = fresh()
    preemption = job_phases.preemption_policy(job())
    request = job_phases.admission_request(p, gang(), JOB_ID, preemption, at(3600))
    assert request.submitted_at == T0.timestamp()
    assert request.job_id == JOB_ID and request.request


def test_a_job_requeued_in_its_queue_sends_no_enqueue_there_once() -> None:
    p = fresh()
    p.requeued_in = "quota/tree"
    assert not job_phases.enqueue_needed(p, "quota/tree")
    assert job_phases.enqueue_needed(p, "quota/tree")
    assert job_phases.enqueue_needed(p, "quota/other")
    assert job_phases.tree_gone("quota/tree").reason == "quota workflow quota/tree is not running"


def test_inadmissible_is_shown_once_and_a_tree_change_queues_again() -> None:
    p = fresh()
    p.view.state, p.view.reason = "Queued", "waiting for quota"
    assert job_phases.admissibility(p) == []  # no news
    why = exceeds_max("team", "cpu", 12000, 8000)
    p.admissibility, p.admissibility_news = AdmissibilitySignal(inadmissible=why), True
    shown = job_phases.admissibility(p)
    assert shown == [Transition("Inadmissible", why.message),
                     Announce("Warning", Reason.INADMISSIBLE, why.message)]
    p.view.state, p.view.reason = "Inadmissible", why.message
    p.admissibility_news = True  # the same reason again: nothing new to say
    assert job_phases.admissibility(p) == []
    p.admissibility, p.admissibility_news = AdmissibilitySignal(), True
    assert job_phases.admissibility(p)[0] == Transition("Queued", "waiting for quota")
    assert not p.admissibility_news


def test_admission_shows_scheduling_the_queue_and_starts_the_placement_timeout() -> None:
    p = fresh()
    p.requeue_at = at(5)
    notices = job_phases.admit(p, Grant(job_id=JOB_ID, queue="team", node="root/team"), at(10))
    assert notices == [Transition("Scheduling", "admitted"),
                       Announce("Normal", Reason.ADMITTED,
                                "admitted by queue team (quota root/team)")]
    assert p.view.admitted and p.view.queue == "team"
    assert p.admitted_at == at(10) and p.requeue_at is None


# ---------------------------------------------------------------------- placing and binding


def test_placement_leaves_out_the_members_the_job_was_evicted_from() -> None:
    p = fresh()
    p.view.evicted = ["a"]
    placement = job_phases.placement_input(p, policy(), gang(), JOB_ID)
    assert placement.exclude == ["a"] and placement.job_ref == "default/train"
    assert placement.affinity is not None and placement.affinity["clusterNames"] == ["a", "b"]
    p.resolution.tree_workflow_id = "quota/tree"
    asked = job_phases.capacity_input(placement, p)
    assert asked.tree_workflow_id == "quota/tree" and asked.capacity_preemption


def test_the_member_write_reserves_each_pod_on_its_node_and_carries_preserved_labels() -> None:
    p = fresh()
    p.preserved_labels = {"step": "7"}
    inp = JobInput(manifest=manifest())
    plain = job_phases.bind_input(p, Candidate(cluster="a", score=1.0), job=REF, inp=inp,
                                  policy=policy(), gang=gang())
    assert plain.reserve is None and plain.request.labels == {"step": "7"}
    cand = Candidate(cluster="a", score=1.0, reservation=True,
                     assignment={"master-0": "n1", "worker-0": "n2"})
    reserving = job_phases.bind_input(p, cand, job=REF, inp=inp, policy=policy(), gang=gang())
    assert reserving.reserve is not None
    assert {(r.role, r.node) for r in reserving.reserve.pods} == {("master", "n1"),
                                                                   ("worker", "n2")}


def test_a_bind_shows_created_and_arms_the_deadline_only_at_the_first_bind() -> None:
    p = fresh()
    notices = bound_on(p, "a", at(10), active_deadline_seconds=100)
    assert notices[-1] == Transition("Created", "bound to a")
    assert isinstance(notices[0], Announce) and notices[0].reason == Reason.BOUND
    assert p.view.cluster == "a" and p.view.copies == ["a"]
    assert p.view.deadline_at == at(110) and p.ready_by is not None
    bound_on(p, "b", at(50), active_deadline_seconds=100)
    assert p.view.deadline_at == at(110)  # counts from the first bind


def test_a_job_without_quota_has_no_pods_ready_bound() -> None:
    p = fresh()
    bound_on(p, "a", at(0), granted=False)
    assert p.ready_by is None and p.view.deadline_at is None


def test_a_passed_deadline_is_said_then_fails_the_job() -> None:
    said, failed = job_phases.deadline_exceeded(60)
    assert said.reason == Reason.DEADLINE_EXCEEDED and failed.state == "Failed"
    assert said.message == failed.reason


# ---------------------------------------------------------------------- failover


def fail_over(p: JobProgress, pol: PropagationPolicy, *, deferred: bool = False,
              now: datetime = T0) -> tuple[OldCopy, list[Any]]:
    """One failover from ``a`` as the workflow carries it out: start, leave, deal with
    the old copy (a purge first is done, or deferred), Evicted."""
    plan, shown = job_phases.start_failover(p, pol, "a", "unhealthy on a for 30s",
                                            cluster_failure=False)
    after, more = job_phases.leave(p, "a", plan, cluster_failure=False, now=now)
    if plan.old_copy == OldCopy.PURGE_FIRST and deferred:
        p.view.pending_purges.append("a")
    return plan.old_copy, shown + more + job_phases.evicted(p, "a", plan, after)


def evicted_message(notices: list[Any]) -> str:
    (evicted,) = [n for n in notices if isinstance(n, Announce) and n.reason == Reason.EVICTED]
    return str(evicted.message)


def test_a_directly_purged_failover_forgets_the_old_copy_unless_its_purge_was_deferred() -> None:
    p = fresh()
    bound_on(p, "a", T0)
    p.view.unhealthy_since = T0
    old_copy, notices = fail_over(p, policy(purge="Directly"), now=at(30))
    assert old_copy == OldCopy.PURGE_FIRST
    assert notices[0] == Transition("FailingOver", "unhealthy on a for 30s")
    assert "evicted from a after 30s; old copy purged first" in evicted_message(notices)
    assert p.view.cluster is None and p.view.evicted == ["a"] and p.view.copies == []

    q = fresh()
    bound_on(q, "a", T0)
    _, notices = fail_over(q, policy(purge="Directly"), deferred=True)
    assert "not purged yet" in evicted_message(notices)
    assert "a" in q.view.copies  # still there until its purger purges it


def test_strict_fencing_waits_until_the_old_member_confirms_the_copy_is_gone() -> None:
    p = fresh()
    bound_on(p, "a", T0)
    old_copy, notices = fail_over(p, policy(purge="Directly", fencing=True))
    assert old_copy == OldCopy.CONFIRM_GONE
    assert Transition("FailingOver", "waiting until a confirms the old copy is gone "
                                     "(fleetq.io/fencing: Strict)") in notices


def test_gracefully_keeps_the_old_copy_until_its_grace_deadline_never_forgets_it() -> None:
    p = fresh()
    bound_on(p, "a", T0)
    old_copy, _ = fail_over(p, policy(purge="Gracefully"), now=at(5))
    assert old_copy == OldCopy.PURGE_LATER
    assert p.graceful_old == "a" and p.grace_deadline is not None and p.grace_deadline > at(5)
    q = fresh()
    bound_on(q, "a", T0)
    old_copy, notices = fail_over(q, policy(purge="Never"))
    assert old_copy == OldCopy.KEEP and q.view.copies == [] and q.graceful_old is None
    assert "old copy kept" in evicted_message(notices)


def test_state_preservation_labels_the_next_copy_or_warns_when_a_rule_fails() -> None:
    p = fresh()
    bound_on(p, "a", T0)
    p.synced_status = {"step": 7}
    _, notices = fail_over(p, policy(purge="Directly", preserve=True))
    assert p.preserved_labels == {"step": "7"}
    assert Announce("Normal", Reason.STATE_PRESERVED,
                    "from the copy on a, the new copy carries labels step=7") in notices
    q = fresh()
    bound_on(q, "a", T0)
    q.synced_status = {}
    _, notices = fail_over(q, policy(purge="Directly", preserve=True))
    assert q.preserved_labels == {}
    assert any(isinstance(n, Announce) and n.reason == Reason.STATE_NOT_PRESERVED
               for n in notices)


def test_a_life_through_a_failover_is_rescheduled_to_the_new_member() -> None:
    """Queued, admitted, bound on a, failed over, bound on b: the events a user reads."""
    p = fresh()
    job_phases.show_request(p, gang(), policy())
    shown = job_phases.enqueued("quota/tree")
    shown += job_phases.admit(p, Grant(job_id=JOB_ID, queue="team", node="root/team"), at(1))
    shown += bound_on(p, "a", at(2))
    assert job_phases.rescheduled(p, "a")  # (bound: a failover's placement would say so)
    _, more = fail_over(p, policy(purge="Directly"), now=at(40))
    shown += more
    assert job_phases.rescheduled(p, "a") == []  # not bound again yet
    shown += bound_on(p, "b", at(41))
    shown += job_phases.rescheduled(p, "a")
    reasons = [n.reason for n in shown if isinstance(n, Announce)]
    assert reasons == [Reason.QUEUED, Reason.ADMITTED, Reason.BOUND, Reason.FAILOVER_STARTED,
                       Reason.EVICTED, Reason.BOUND, Reason.RESCHEDULED]
    assert p.view.cluster == "b" and p.view.evicted == ["a"]
    assert shown[-1] == Announce("Normal", Reason.RESCHEDULED, "rescheduled from a to b")


# ---------------------------------------------------------------------- suspension


def test_a_suspension_leaves_the_queue_drops_a_preemption_and_forgets_the_placement() -> None:
    p = fresh()
    bound_on(p, "a", T0, active_deadline_seconds=100)
    p.view.admitted, p.view.queue = True, "team"
    p.preempt = PreemptSignal(preemptor="pytorchjob/default/high", reason="Priority",
                              message="priority 1000 > 10")
    p.preempt_at = at(30)
    p.suspension.ask_suspend(p.view.state)
    in_queue, notices = job_phases.suspend(p, granted=True)
    assert in_queue and p.preempt is None and p.preempt_at is None
    assert notices == [Announce("Normal", Reason.SUSPENDED,
                                "suspended: copies purged, quota released")]
    p.view.copies = []  # (every copy purged)
    assert job_phases.suspended(p)[0].state == "Suspended"  # type: ignore[union-attr]
    assert p.view.cluster is None and p.view.deadline_at is None and not p.view.admitted
    p.suspension.ask_resume()
    assert p.suspension.resume_wanted
    assert job_phases.resumed(p, queued=True)[-1] == Transition("Queued", "resumed")
    assert not p.suspension.active and not p.suspension.resume_wanted


def test_a_job_suspended_before_it_was_queued_or_placed_leaves_no_queue() -> None:
    p = fresh()
    p.view.state = "Scheduling"
    in_queue, notices = job_phases.suspend(p, granted=False)
    assert not in_queue
    assert notices == [Announce("Normal", Reason.SUSPENDED, lifecycle.suspended_message(False))]
    assert job_phases.resumed(p, queued=False)[-1] == Transition("Scheduling", "resumed")


def test_watching_follows_the_policys_failover_and_the_gang() -> None:
    w = job_phases.watching(policy(), gang(), job(), 10.0)
    assert w.tolerance == 30 and w.failover and w.pods == len(gang().pods) == 2
    assert w.rewatch_seconds == 10.0


# ---------------------------------------------------------------------- quota, preemption


def test_quota_goes_back_as_release_when_granted_cancel_when_waiting_nothing_without_tree(
) -> None:
    p = fresh()
    assert job_phases.give_back(p, queued=True, granted=True, job_id=JOB_ID) is None
    p.resolution.tree_workflow_id = "quota/tree"
    assert job_phases.give_back(p, queued=False, granted=True, job_id=JOB_ID) is None
    release = job_phases.give_back(p, queued=True, granted=True, job_id=JOB_ID)
    assert release is not None and release.signal == "release" and release.job_id == JOB_ID
    cancel = job_phases.give_back(p, queued=True, granted=False, job_id=JOB_ID)
    assert cancel is not None and cancel.signal == "cancel"
    request = job_phases.admission_request(p, gang(), JOB_ID,
                                           job_phases.preemption_policy(job()), at(99))
    again = job_phases.requeue(release, request)
    assert again.signal == "requeue" and again.tree_workflow_id == "quota/tree"
    assert again.request is not None and again.request.submitted_at == T0.timestamp()


def test_only_a_job_holding_quota_or_a_bound_copy_under_capacity_preemption_is_preempted(
) -> None:
    p = fresh()
    priority = PreemptSignal(preemptor="pytorchjob/default/high", reason="Priority",
                             message="priority 1000 > 10")
    capacity = PreemptSignal(preemptor="pytorchjob/default/high", reason="Capacity",
                             message="room on a")
    assert job_phases.holding(p, priority, granted=True)
    assert not job_phases.holding(p, priority, granted=False)
    assert not job_phases.holding(p, capacity, granted=False)  # nothing bound
    bound_on(p, "a", T0, granted=False)
    assert job_phases.holding(p, capacity, granted=False)
    assert not job_phases.holding(p, priority, granted=False)


def test_an_unschedulable_job_queues_again_once_some_member_may_fit() -> None:
    never = PlacementVerdict(candidates=[], never="no member has nodes big enough")
    assert not job_phases.may_fit(never)
    assert job_phases.may_fit(PlacementVerdict(candidates=[], never=""))
    assert job_phases.may_fit(PlacementVerdict(candidates=[Candidate(cluster="a", score=1)]))


# ---------------------------------------------------------------------- copies and endings


def test_the_graceful_old_copy_is_purged_once_and_forgotten_unless_deferred() -> None:
    p = fresh()
    bound_on(p, "a", T0)
    fail_over(p, policy(purge="Gracefully"))
    bound_on(p, "b", at(10))
    assert job_phases.take_graceful_old(p) == "a"
    assert job_phases.take_graceful_old(p) is None and p.grace_deadline is None
    assert job_phases.old_copy_purged(p, "a", "new copy on b is healthy") == [
        Announce("Normal", Reason.PURGED, "old copy on a purged: new copy on b is healthy")]
    assert p.view.copies == ["b"]
    q = fresh()
    q.view.copies, q.view.pending_purges = ["a", "b"], ["a"]
    assert job_phases.old_copy_purged(q, "a", "grace period ended") == []
    assert "a" in q.view.copies


def test_at_the_end_a_copy_left_while_unreachable_is_said_purged_only_when_it_was() -> None:
    p = fresh()
    p.view.pending_purges = ["a", "b"]
    assert job_phases.left_copy_purged(p.view, "a") == []  # PurgeFailed said why
    p.view.pending_purges.remove("b")  # its purger purged it
    assert job_phases.left_copy_purged(p.view, "b") == [
        Announce("Normal", Reason.PURGED, "copy on b purged as soon as it answered again")]
    assert p.view.pending_purges == []


def test_a_deleted_job_purges_every_copy_left_and_ends_deleted_with_none() -> None:
    p = fresh()
    bound_on(p, "a", T0)
    p.view.copies.append("b")
    p.view.pending_purges = ["c"]
    left, said = job_phases.deleted(p)
    assert set(left) == {"a", "b", "c"}
    assert said[0].reason == Reason.DELETED  # type: ignore[union-attr]
    job_phases.all_purged(p)
    assert job_phases.gone(p, at(5)) == [Transition("Deleted", "deleted")]
    assert p.view.copies == [] and p.view.cluster is None and p.view.finished_at == at(5)
