"""Preemption carried out by the admission core: a plan's preemptor is admitted only once
every victim has released, the quota its victims free is held for it meanwhile, a
waiting preemptor shows whom it waits for, and plans and holders' priorities survive
continue-as-new (and older states without them still load)."""

from __future__ import annotations

from fleetq.admission import (
    Admission,
    AdmissionRequest,
    Grant,
    HolderPolicy,
)
from fleetq.models import ElasticQuotaTree
from fleetq.preemption import PreemptionReason, plan_preemptions
from fleetq.quota_state import pack_state, unpack_state
from tests.core.trees import make_tree

JOBS = "kube-queue/max-jobs"




def one_job_leaf(**annotations: str) -> ElasticQuotaTree:
    """A leaf ``team`` (namespace ``team``) that runs one job at a time, and a leaf
    ``other`` (namespace ``other``) with room."""
    big = {"cpu": 100, JOBS: 100}
    return make_tree(
        {
            "name": "root",
            "max": big,
            "min": big,
            "children": [
                {"name": "team", "max": {"cpu": 10, JOBS: 1}, "namespaces": ["team"]},
                {"name": "other", "max": {"cpu": 10, JOBS: 10}, "namespaces": ["other"]},
            ],
        },
        **annotations,
    )


def req(
    name: str,
    ns: str = "team",
    *,
    prio: int = 0,
    at: float = 0.0,
    cpu: int = 1,
    preemptible: bool = True,
    grace: int = 30,
) -> AdmissionRequest:
    return AdmissionRequest(
        job_id=f"pytorchjob/{ns}/{name}",
        namespace=ns,
        priority=prio,
        request={"cpu": cpu * 1000, JOBS: 1000},
        submitted_at=at,
        preemptible=preemptible,
        grace_seconds=grace,
    )


def admitted(a: Admission, r: AdmissionRequest, now: float = 0.0) -> None:
    assert isinstance(a.enqueue(r, now), Grant)


def test_high_priority_preempts_the_low_one_and_is_admitted_only_after_it_released() -> None:
    a = Admission(one_job_leaf(**{"fleetq.io/preemption": "LowerPriority"}))
    admitted(a, req("low", prio=10, grace=5))
    a.enqueue(req("high", prio=1000, at=1), 1)
    assert a.schedule(1) == []
    plans = plan_preemptions(a)
    assert [(p.preemptor, [v.job_id for v in p.victims]) for p in plans] == [
        ("pytorchjob/team/high", ["pytorchjob/team/low"])
    ]
    victim = plans[0].victims[0]
    assert (victim.reason, victim.message, victim.grace_seconds) == (
        PreemptionReason.PRIORITY,
        "priority 1000 > 10",
        5,
    )
    info = a.wait_info("pytorchjob/team/high")
    assert info is not None
    assert info.victims == ["pytorchjob/team/low"]
    assert info.reason == "waiting for 1 preempted job to release quota: team/low"
    # the victim still holds: nothing happens, and no second plan is made
    assert a.schedule(2) == [] and plan_preemptions(a) == []
    # the victim releases and queues again with its original submit time
    assert a.release("pytorchjob/team/low")
    a.enqueue(req("low", prio=10, grace=5), 3)
    grants = a.schedule(3)
    assert [g.job_id for g in grants] == ["pytorchjob/team/high"]
    assert a.plans() == []
    assert a.waiting() == ["pytorchjob/team/low"]
    assert a.usage("team")[JOBS] == 1000  # never two jobs in a max-jobs 1 leaf


def test_quota_freed_by_a_victim_is_held_for_the_preemptor() -> None:
    a = Admission(one_job_leaf(**{"fleetq.io/preemption": "LowerPriority"}))
    admitted(a, req("low", prio=10))
    a.enqueue(req("high", prio=1000, at=1), 1)
    a.schedule(1)
    assert len(plan_preemptions(a)) == 1
    # a second victim-to-be of the same plan would be needed... here: another low job
    # arrives while the victim stops, and must not take the slot the victim frees
    a.enqueue(req("late", prio=500, at=2), 2)
    assert a.schedule(2) == []
    assert plan_preemptions(a) == []  # low is promised already; nothing left to take
    a.release("pytorchjob/team/low")
    assert [g.job_id for g in a.schedule(3)] == ["pytorchjob/team/high"]
    assert a.waiting() == ["pytorchjob/team/late"]


def test_other_nodes_keep_admitting_while_a_plan_is_carried_out() -> None:
    a = Admission(one_job_leaf(**{"fleetq.io/preemption": "LowerPriority"}))
    admitted(a, req("low", prio=10))
    a.enqueue(req("high", prio=1000, at=1), 1)
    a.schedule(1)
    plan_preemptions(a)
    other = a.enqueue(req("elsewhere", ns="other", at=2), 2)
    # a pending plan makes enqueue wait for a pass instead of admitting at once
    assert not isinstance(other, Grant)
    assert [g.job_id for g in a.schedule(2)] == ["pytorchjob/other/elsewhere"]


def test_without_the_annotation_nothing_is_preempted() -> None:
    a = Admission(one_job_leaf())
    admitted(a, req("low", prio=10))
    a.enqueue(req("high", prio=1000, at=1), 1)
    a.schedule(1)
    assert plan_preemptions(a) == []
    info = a.wait_info("pytorchjob/team/high")
    assert info is not None and info.victims == []


def test_an_opted_out_job_is_never_a_victim() -> None:
    a = Admission(one_job_leaf(**{"fleetq.io/preemption": "LowerPriority"}))
    admitted(a, req("keep", prio=10, preemptible=False))
    a.enqueue(req("high", prio=1000, at=1), 1)
    a.schedule(1)
    assert plan_preemptions(a) == []
    assert a.holder_policy("pytorchjob/team/keep") == HolderPolicy(
        priority=10, preemptible=False, grace_seconds=30
    )


def test_a_cancelled_preemptor_holds_nothing_and_its_victim_is_not_chosen_again() -> None:
    a = Admission(one_job_leaf(**{"fleetq.io/preemption": "LowerPriority"}))
    admitted(a, req("low", prio=10))
    a.enqueue(req("high", prio=1000, at=1), 1)
    a.schedule(1)
    plan_preemptions(a)
    assert a.cancel("pytorchjob/team/high")
    assert a.preemptors() == {} and a.plans() == []
    assert [p.preemptor for p in a.draining()] == ["pytorchjob/team/high"]
    # the victim was told to stop already: no second plan takes it again
    a.enqueue(req("other", prio=1000, at=2), 2)
    a.schedule(2)
    assert plan_preemptions(a) == []
    # once it has released, its plan is forgotten and nothing is held: its quota goes to
    # whoever is first in the queue
    a.release("pytorchjob/team/low")
    a.enqueue(req("low", prio=10), 3)
    assert [g.job_id for g in a.schedule(3)] == ["pytorchjob/team/other"]
    assert a.plans() == [] and a.draining() == []


def test_reclaim_takes_back_from_a_borrower_for_a_team_below_min() -> None:
    big = {"cpu": 10, JOBS: 100}
    tree = make_tree(
        {
            "name": "root",
            "max": big,
            "min": big,
            "children": [
                {"name": "borrower", "min": {"cpu": 2}, "max": {"cpu": 10},
                 "namespaces": ["borrower"]},
                {"name": "owner", "min": {"cpu": 8}, "max": {"cpu": 10},
                 "namespaces": ["owner"]},
            ],
        },
        **{"fleetq.io/reclaim": "Any"},
    )
    a = Admission(tree)
    for i in range(5):
        admitted(a, req(f"b{i}", ns="borrower", cpu=2, at=i), float(i))
    a.enqueue(req("mine", ns="owner", cpu=4, at=10), 10)
    assert a.schedule(10) == []
    (plan,) = plan_preemptions(a)
    # the most recently admitted borrowers first (least work lost), as few as fit
    assert [v.job_id for v in plan.victims] == [
        "pytorchjob/borrower/b4",
        "pytorchjob/borrower/b3",
    ]
    assert {v.message for v in plan.victims} == {"reclaim for owner below min"}
    a.release("pytorchjob/borrower/b4")
    assert a.schedule(11) == []  # one victim still holds
    a.release("pytorchjob/borrower/b3")
    assert [g.job_id for g in a.schedule(12)] == ["pytorchjob/owner/mine"]
    assert a.usage("root")["cpu"] == 10_000


def test_plans_and_holder_policies_survive_continue_as_new() -> None:
    a = Admission(one_job_leaf(**{"fleetq.io/preemption": "LowerPriority"}))
    admitted(a, req("low", prio=10, grace=7))
    a.enqueue(req("high", prio=1000, at=1, preemptible=False, grace=9), 1)
    a.schedule(1)
    plan_preemptions(a)
    b = Admission.from_state(unpack_state(pack_state(a.to_state())))
    assert b.plans() == a.plans()
    assert b.holder_policy("pytorchjob/team/low") == HolderPolicy(
        priority=10, preemptible=True, grace_seconds=7
    )
    request = b.request_of("pytorchjob/team/high")
    assert request is not None and (request.preemptible, request.grace_seconds) == (False, 9)
    b.release("pytorchjob/team/low")
    assert [g.job_id for g in b.schedule(2)] == ["pytorchjob/team/high"]
    assert b.holder_policy("pytorchjob/team/high") == HolderPolicy(
        priority=1000, preemptible=False, grace_seconds=9
    )


def shared_leaf() -> ElasticQuotaTree:
    """One leaf ``team`` of 10 cpu, priority preemption on."""
    return make_tree(
        {"name": "root", "max": {"cpu": 10},
         "children": [{"name": "team", "namespaces": ["team"]}]},
        **{"fleetq.io/preemption": "LowerPriority"},
    )


def test_a_victim_readmitted_before_its_preemptor_is_not_waited_for_again() -> None:
    """issue 18: victims stop, queue again with their submit time and are re-admitted
    into room freed elsewhere; the preemptor still gets in once they all released."""
    a = Admission(shared_leaf())
    admitted(a, req("filler", prio=10, cpu=4), 0)
    admitted(a, req("v1", prio=10, cpu=2, at=1), 1)
    admitted(a, req("v2", prio=10, cpu=2, at=2), 2)
    a.enqueue(req("high", prio=1000, cpu=6, at=5), 5)
    (plan,) = plan_preemptions(a)
    assert [v.job_id for v in plan.victims] == ["pytorchjob/team/v2", "pytorchjob/team/v1"]
    a.release("pytorchjob/team/filler")
    assert a.schedule(10) == []  # the 4 cpu freed are held for high
    a.release("pytorchjob/team/v2")
    a.enqueue(req("v2", prio=10, cpu=2, at=2), 35)
    assert [g.job_id for g in a.schedule(35)] == ["pytorchjob/team/v2"]  # room is left
    assert a.waiting_for("pytorchjob/team/high") == ["pytorchjob/team/v1"]
    a.release("pytorchjob/team/v1")
    a.enqueue(req("v1", prio=10, cpu=2, at=1), 36)
    # high first (its plan is done), then v1 into the 2 cpu left
    assert [g.job_id for g in a.schedule(36)] == ["pytorchjob/team/high", "pytorchjob/team/v1"]
    assert a.plans() == [] and a.usage("root")["cpu"] == 10_000


def test_a_readmitted_victim_is_not_counted_as_leaving_by_a_later_plan() -> None:
    """Its quota was promised once: a draining plan ends when its victims released, and a
    later preemptor must free the re-admitted victim's quota again (a plan naming it)."""
    a = Admission(shared_leaf())
    admitted(a, req("v1", prio=10, cpu=4), 0)
    admitted(a, req("v2", prio=10, cpu=4, at=1), 1)
    admitted(a, req("filler", prio=10, cpu=2, at=2), 2)
    a.enqueue(req("high", prio=1000, cpu=8, at=5), 5)
    (plan,) = plan_preemptions(a)
    assert [v.job_id for v in plan.victims] == ["pytorchjob/team/v2", "pytorchjob/team/v1"]
    assert a.cancel("pytorchjob/team/high")  # its plan drains: both were told to stop
    a.release("pytorchjob/team/v2")
    a.enqueue(req("v2", prio=10, cpu=4, at=1), 40)
    assert [g.job_id for g in a.schedule(40)] == ["pytorchjob/team/v2"]  # nothing held
    a.release("pytorchjob/team/v1")
    assert a.schedule(41) == []
    assert a.draining() == []  # both victims released: the plan is over
    a.enqueue(req("next", prio=1000, cpu=6, at=42), 42)
    assert a.schedule(42) == []  # 4 cpu free
    (later,) = plan_preemptions(a)
    assert [v.job_id for v in later.victims] == ["pytorchjob/team/v2"]  # the newest
    a.release("pytorchjob/team/v2")
    assert [g.job_id for g in a.schedule(43)] == ["pytorchjob/team/next"]


