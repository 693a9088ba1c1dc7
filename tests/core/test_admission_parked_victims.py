"""A quota preemption's victim whose copies the quota workflow purged itself is *parked*
(``Admission.park``, docs/decisions/023): its quota admits its preemptor at once, without
waiting for the victim's own ``requeue``, yet it keeps its place (issue 24: no later job
of its priority takes the room it freed) and is granted nothing until its ``requeue``
arrives, so no grant can overtake that message."""

from __future__ import annotations

from fleetq.admission import (
    Admission,
    AdmissionRequest,
    Grant,
    PendingPlan,
    PlannedVictim,
    WaitInfo,
)
from fleetq.models import ElasticQuotaTree
from fleetq.quota_state import pack_next, pack_state, restore
from tests.core.trees import make_tree

JOBS = "kube-queue/max-jobs"


def four_cpu_leaf() -> ElasticQuotaTree:
    big = {"cpu": 100, JOBS: 100}
    return make_tree({"name": "root", "max": big, "min": big, "children": [
        {"name": "team", "max": {"cpu": 4, JOBS: 10}, "namespaces": ["team"]}]})


def req(name: str, *, prio: int = 0, at: float = 0.0, cpu: int = 1) -> AdmissionRequest:
    return AdmissionRequest(job_id=f"pytorchjob/team/{name}", namespace="team",
                            priority=prio, request={"cpu": cpu * 1000, JOBS: 1000},
                            submitted_at=at, grace_seconds=0)


VICTIM = req("victim", at=0, cpu=2)
HOLDER = req("holder", at=1, cpu=1)
LATER = req("later", at=5, cpu=1)  # the victim's priority, submitted after it
PREEMPTOR = req("preemptor", prio=100, at=10, cpu=1)


def full_leaf_with_a_plan() -> Admission:
    """The leaf's 4 CPU are full (victim 2, holder 1, other 1), ``later`` (1) and the
    preemptor (1) wait, and the preemptor's plan names the victim."""
    a = Admission(four_cpu_leaf())
    assert isinstance(a.enqueue(VICTIM, 0), Grant)
    assert isinstance(a.enqueue(HOLDER, 1), Grant)
    assert isinstance(a.enqueue(req("other", at=2, cpu=1), 2), Grant)
    assert isinstance(a.enqueue(LATER, 5), WaitInfo)
    assert isinstance(a.enqueue(PREEMPTOR, 10), WaitInfo)
    a.add_plan(PendingPlan(
        preemptor=PREEMPTOR.job_id, node="team", priority=100,
        request=PREEMPTOR.request,
        victims=[PlannedVictim(job_id=VICTIM.job_id, reason="Priority", message="100 > 0",
                               grace_seconds=0, node="team")],
    ), 10)
    assert a.schedule(10) == []  # the victim still holds its quota
    return a


def granted(grants: list[Grant]) -> list[str]:
    return [g.job_id for g in grants]


def test_a_parked_victims_quota_admits_its_preemptor_in_the_next_pass() -> None:
    a = full_leaf_with_a_plan()
    assert a.park(VICTIM.job_id)
    assert granted(a.schedule(11)) == [PREEMPTOR.job_id]
    assert a.preemptors() == {} and a.parked() == [VICTIM.job_id]
    assert not a.is_admitted(VICTIM.job_id)


def test_no_later_job_of_its_priority_takes_the_room_held_for_a_parked_victim() -> None:
    """1 CPU is free once the preemptor (1) replaced the victim (2): ``later`` (1) would
    fit, but the room is the victim's until it has queued again, and then the victim,
    submitted first, is admitted before it (as a ``requeue`` does, issue 24)."""
    a = full_leaf_with_a_plan()
    a.park(VICTIM.job_id)
    assert granted(a.schedule(11)) == [PREEMPTOR.job_id]
    a.release(HOLDER.job_id)  # 2 CPU free now, and still held for the victim
    assert granted(a.schedule(12)) == []
    assert isinstance(a.requeue(VICTIM, 13), WaitInfo)
    assert granted(a.schedule(13)) == [VICTIM.job_id]
    assert a.waiting() == [LATER.job_id]


def test_released_before_its_requeue_the_later_job_would_have_taken_the_room() -> None:
    """Why a victim is parked, not released: released early, its room goes to ``later``
    and the victim queues behind it."""
    a = full_leaf_with_a_plan()
    a.release(VICTIM.job_id)
    assert granted(a.schedule(11)) == [PREEMPTOR.job_id, LATER.job_id]
    a.release(HOLDER.job_id)
    a.requeue(VICTIM, 12)
    assert granted(a.schedule(12)) == []  # 1 CPU free: the victim (2) waits behind


def test_a_parked_victim_is_granted_nothing_until_its_requeue() -> None:
    a = full_leaf_with_a_plan()
    a.park(VICTIM.job_id)
    a.schedule(11)
    for job in (HOLDER, LATER, req("other")):
        a.release(job.job_id) or a.cancel(job.job_id)
    assert granted(a.schedule(12)) == []  # room for it, but it has not asked yet
    assert a.request_of(VICTIM.job_id) is None
    a.requeue(VICTIM, 13)
    assert granted(a.schedule(13)) == [VICTIM.job_id]


def test_an_enqueue_is_not_admitted_at_once_into_room_held_for_a_parked_victim() -> None:
    a = full_leaf_with_a_plan()
    a.park(VICTIM.job_id)
    a.schedule(11)
    a.cancel(LATER.job_id)
    a.release(HOLDER.job_id)
    a.schedule(12)
    assert isinstance(a.enqueue(req("newcomer", at=14, cpu=2), 14), WaitInfo)
    assert granted(a.schedule(14)) == []


def test_a_parked_victim_deleted_meanwhile_frees_what_was_held() -> None:
    for give_back in ("release", "cancel"):
        a = full_leaf_with_a_plan()
        a.park(VICTIM.job_id)
        a.schedule(11)
        a.release(HOLDER.job_id)
        assert getattr(a, give_back)(VICTIM.job_id)
        assert a.parked() == [] and not getattr(a, give_back)(VICTIM.job_id)
        assert granted(a.schedule(12)) == [LATER.job_id], give_back


def test_only_a_holder_is_parked() -> None:
    a = full_leaf_with_a_plan()
    assert not a.park(LATER.job_id)  # waiting: it holds nothing
    a.requeue(VICTIM, 11)  # its own requeue came first
    assert not a.park(VICTIM.job_id)
    assert a.parked() == []


def test_a_parked_victim_survives_continue_as_new() -> None:
    a = full_leaf_with_a_plan()
    carried = pack_state(a.to_state())
    b, _ = restore(carried)
    b.park(VICTIM.job_id)  # in a run restored from a carried state (the journal's delta)
    c, _ = restore(pack_next(b, None))
    assert c.parked() == [VICTIM.job_id] and c.to_state() == b.to_state()
    assert granted(c.schedule(11)) == [PREEMPTOR.job_id]
    c.release(HOLDER.job_id)
    assert granted(c.schedule(12)) == []
    c.requeue(VICTIM, 13)
    assert granted(c.schedule(13)) == [VICTIM.job_id]
