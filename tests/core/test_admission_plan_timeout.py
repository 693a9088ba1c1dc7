"""Preemption plan timeout (issue 18): a victim that never releases (e.g. stuck purging
on an unreachable member) no longer keeps its preemptor waiting forever with the quota
held for it."""

from __future__ import annotations

from fleetq.admission import (
    PLAN_MARGIN_SECONDS,
    Admission,
    AdmissionRequest,
    Grant,
    QueuePolicy,
)
from fleetq.models import parse_tree
from fleetq.preemption import plan_preemptions
from fleetq.quota_state import pack_state, unpack_state
from tests.core.trees import tree_doc

TREE = tree_doc({"name": "root", "max": {"cpu": 4}, "namespaces": ["team"]}, "t",
               **{"fleetq.io/preemption": "LowerPriority"})
LOW, HIGH, SMALL = "pytorchjob/team/low", "pytorchjob/team/high", "pytorchjob/team/small"


def req(job_id: str, cpu: int, prio: int, t: float, grace: int = 30) -> AdmissionRequest:
    return AdmissionRequest(job_id=job_id, namespace="team", priority=prio,
                            request={"cpu": cpu * 1000}, submitted_at=t, grace_seconds=grace)


def planned() -> Admission:
    """low (3 cpu, grace 45 s) holds; high (4 cpu) has a plan preempting it, decided at
    t=10; small (1 cpu) would fit in the free cpu but it is held for high."""
    a = Admission(parse_tree(TREE), QueuePolicy.PRIORITY, 300)
    assert isinstance(a.enqueue(req(LOW, 3, 0, 0.0, grace=45), 0.0), Grant)
    a.enqueue(req(HIGH, 4, 10, 5.0), 5.0)
    [plan] = plan_preemptions(a, 10.0)
    assert [v.job_id for v in plan.victims] == [LOW]
    a.enqueue(req(SMALL, 1, 0, 11.0), 11.0)
    assert a.schedule(11.0) == []
    return a


def test_a_plan_expires_after_the_longest_grace_plus_the_margin() -> None:
    a = planned()
    deadline = 10.0 + 45 + PLAN_MARGIN_SECONDS
    assert a.next_plan_deadline() == deadline
    assert a.expire_plans(deadline - 0.5) == []
    assert a.preemptors() == {HIGH: [LOW]}
    [dropped] = a.expire_plans(deadline)
    assert dropped.preemptor == HIGH and [v.job_id for v in dropped.victims] == [LOW]
    assert a.preemptors() == {} and a.next_plan_deadline() is None
    # the quota held for high is free again: small takes it at the next pass
    assert [g.job_id for g in a.schedule(deadline)] == [SMALL]
    info = a.wait_info(HIGH)
    assert info is not None and info.victims == []
    assert "preemption timed out: team/low did not release quota in time" in info.reason
    # the stuck victim is not chosen again until it releases
    assert plan_preemptions(a, deadline) == []


def test_a_stuck_victim_that_releases_at_last_lets_the_preemptor_in() -> None:
    a = planned()
    a.expire_plans(1000.0)
    a.schedule(1000.0)  # small admitted
    assert a.release(LOW)
    assert a.release(SMALL)
    assert [g.job_id for g in a.schedule(1001.0)] == [HIGH]
    assert a.timed_out_victims(HIGH) == []


def test_a_plan_whose_victims_release_in_time_never_expires() -> None:
    a = planned()
    assert a.release(LOW)
    assert [g.job_id for g in a.schedule(20.0)] == [HIGH]
    assert a.next_plan_deadline() is None and a.expire_plans(10_000.0) == []


def test_deadlines_and_stuck_victims_survive_continue_as_new() -> None:
    a = planned()
    b = Admission.from_state(unpack_state(pack_state(a.to_state())))
    assert b.next_plan_deadline() == a.next_plan_deadline()
    b.expire_plans(10_000.0)
    c = Admission.from_state(unpack_state(pack_state(b.to_state())))
    assert c.timed_out_victims(HIGH) == [LOW]
    policy = c.holder_policy(LOW)
    assert policy is not None and not policy.preemptible
    assert plan_preemptions(c, 10_000.0) == []


def test_without_a_clock_plans_never_expire() -> None:
    """Plans decided without ``now`` (the quota workflow before the plan-timeout patch,
    states packed before it) carry no deadline."""
    a = Admission(parse_tree(TREE), QueuePolicy.PRIORITY, 300)
    a.enqueue(req(LOW, 3, 0, 0.0), 0.0)
    a.enqueue(req(HIGH, 4, 10, 5.0), 5.0)
    assert len(plan_preemptions(a)) == 1
    assert a.next_plan_deadline() is None
    assert a.expire_plans(1e12) == []
    assert a.preemptors() == {HIGH: [LOW]}
