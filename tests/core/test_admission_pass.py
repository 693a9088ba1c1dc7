"""The order of one scheduling pass (``fleetq.admission_pass.run_pass``): plans before
grants, so a preemption never takes a job the same pass admits, as Kueue's cycle
nominates every head and its targets against the snapshot taken when the cycle starts
(``pkg/scheduler/scheduler.go``, v0.17.0)."""

from __future__ import annotations

from fleetq.admission import Admission, AdmissionRequest
from fleetq.admission_pass import run_pass
from fleetq.preemption import plan_preemptions
from tests.core.trees import make_tree

JOBS = "kube-queue/max-jobs"
ANNOTATIONS = {"fleetq.io/preemption": "LowerPriority", "fleetq.io/queue-policy": "Priority"}


def team_of_four_cpus() -> Admission:
    big = {"cpu": 100, JOBS: 100}
    return Admission(make_tree(
        {"name": "root", "max": big, "min": big, "children": [
            {"name": "team", "max": {"cpu": 4, JOBS: 10}, "namespaces": ["team"]}]},
        **ANNOTATIONS))


def req(name: str, prio: int, cpu: int, at: float) -> AdmissionRequest:
    return AdmissionRequest(job_id=f"pytorchjob/team/{name}", namespace="team", priority=prio,
                            request={"cpu": cpu * 1000, JOBS: 1000}, submitted_at=at)


def test_a_pass_plans_before_it_grants_so_no_victim_is_a_job_it_admits() -> None:
    # "old" (priority 1, 2 cpu) runs; "big" (priority 10, 4 cpu: needs "old"'s room) and
    # "small" (priority 0, 2 cpu: fits now) arrive together
    a = team_of_four_cpus()
    a.enqueue(req("old", 1, 2, 0.0), 0.0)
    for r in (req("big", 10, 4, 1.0), req("small", 0, 2, 1.0)):
        a.enqueue(r, 1.0, at_once=False)
    granting_first = Admission.from_state(a.to_state())

    out = run_pass(a, 2.0, preempt=True)

    assert out.grants == [] and out.plan_error is None
    (plan,) = out.plans_before_grants
    assert (plan.preemptor, [v.job_id for v in plan.victims]) == (
        "pytorchjob/team/big", ["pytorchjob/team/old"])
    assert a.waiting() == ["pytorchjob/team/big", "pytorchjob/team/small"]
    # granting first (the order before) admitted "small" only to preempt it at once
    grants = granting_first.schedule(2.0)
    (plan,) = plan_preemptions(granting_first, 2.0)
    assert [g.job_id for g in grants] == ["pytorchjob/team/small"]
    assert "pytorchjob/team/small" in {v.job_id for v in plan.victims}


def test_a_job_admitted_at_once_is_no_victim_of_the_pass_after_its_message() -> None:
    # "big" waits (it needs "old"'s room and more); "small" passes it (Priority policy)
    # and is admitted at once by its own enqueue. The pass after small's message spares
    # it, so big waits for a later pass rather than taking a job just admitted.
    a = team_of_four_cpus()
    a.enqueue(req("old", 1, 2, 0.0), 0.0)
    a.enqueue(req("big", 10, 4, 1.0), 1.0, at_once=False)
    sparing_nobody = Admission.from_state(a.to_state())
    for adm in (a, sparing_nobody):
        adm.enqueue(req("small", 0, 2, 1.5), 1.5)
        assert adm.is_admitted("pytorchjob/team/small")

    out = run_pass(a, 2.0, preempt=True, granted={"pytorchjob/team/small"})

    assert out.plans == [] and a.waiting() == ["pytorchjob/team/big"]
    (plan,) = run_pass(sparing_nobody, 2.0, preempt=True).plans
    assert {v.job_id for v in plan.victims} == {"pytorchjob/team/old", "pytorchjob/team/small"}


def test_preemption_off_a_pass_only_grants() -> None:
    a = team_of_four_cpus()
    a.enqueue(req("old", 1, 2, 0.0), 0.0)
    for r in (req("big", 10, 4, 1.0), req("small", 0, 2, 1.0)):
        a.enqueue(r, 1.0, at_once=False)
    out = run_pass(a, 2.0, preempt=False)
    assert [g.job_id for g in out.grants] == ["pytorchjob/team/small"] and out.plans == []
