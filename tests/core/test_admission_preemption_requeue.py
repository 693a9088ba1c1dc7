"""A preempted job is back in its queue, in its original place, before its quota is freed
(issue 24): :meth:`fleetq.admission.Admission.requeue` releases and re-enqueues in one
step, so the pass that hands out the room it freed sees it, ranked by its original
submit time (queue order: priority desc, submit time asc, as Kube Queue's
``queue.Less``), and no later job of its priority takes that room first."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fleetq.admission import Admission, AdmissionRequest, Grant, QueuePolicy, WaitInfo
from fleetq.models import ElasticQuotaTree
from tests.core.trees import make_tree

JOBS = "kube-queue/max-jobs"




def one_job_leaf() -> ElasticQuotaTree:
    big = {"cpu": 100, JOBS: 100}
    return make_tree({"name": "root", "max": big, "min": big, "children": [
        {"name": "team", "max": {"cpu": 10, JOBS: 1}, "namespaces": ["team"]}]})


def req(name: str, *, prio: int = 0, at: float = 0.0, cpu: int = 1,
        ns: str = "team") -> AdmissionRequest:
    return AdmissionRequest(job_id=f"pytorchjob/{ns}/{name}", namespace=ns, priority=prio,
                            request={"cpu": cpu * 1000, JOBS: 1000}, submitted_at=at)


def test_the_victim_is_readmitted_before_a_later_job_of_its_priority() -> None:
    a = Admission(one_job_leaf())
    victim, later = req("victim", prio=10, at=0), req("later", prio=10, at=5)
    assert isinstance(a.enqueue(victim, 0), Grant)
    assert isinstance(a.enqueue(later, 5), WaitInfo)
    # preempted for room on a member (its quota is not held for anyone): one step
    res = a.requeue(victim, 20)
    assert isinstance(res, WaitInfo)  # never admitted at once: the pass decides
    assert [g.job_id for g in a.schedule(20)] == [victim.job_id]
    assert a.waiting() == [later.job_id]


def test_a_requeue_of_a_waiting_job_changes_nothing() -> None:
    a = Admission(one_job_leaf())
    holder, victim = req("holder", prio=10, at=0), req("victim", prio=10, at=1)
    a.enqueue(holder, 0)
    a.enqueue(victim, 1)
    assert isinstance(a.requeue(victim, 2), WaitInfo)
    assert a.holders() == [holder.job_id] and a.waiting() == [victim.job_id]


def test_release_then_enqueue_let_the_later_job_take_the_room() -> None:
    """What happened before: the quota came back first, a pass gave it to the later job
    of the same priority, and the victim queued behind it (it waited 93 s more)."""
    a = Admission(one_job_leaf())
    victim, later = req("victim", prio=10, at=0), req("later", prio=10, at=5)
    a.enqueue(victim, 0)
    a.enqueue(later, 5)
    a.release(victim.job_id)
    assert [g.job_id for g in a.schedule(20)] == [later.job_id]
    assert isinstance(a.enqueue(victim, 20), WaitInfo)


def test_a_requeued_victim_survives_continue_as_new_with_its_original_place() -> None:
    a = Admission(one_job_leaf())
    victim, later = req("victim", prio=10, at=0), req("later", prio=10, at=5)
    a.enqueue(victim, 0)
    a.enqueue(later, 5)
    a.requeue(victim, 20)
    b = Admission.from_state(a.to_state())
    assert [g.job_id for g in b.schedule(20)] == [victim.job_id]


# --------------------------------------------------------------------------- property


def _tree(draw: st.DrawFn) -> ElasticQuotaTree:
    leaves: list[dict[str, Any]] = []
    for i in range(draw(st.integers(1, 3))):
        mx = draw(st.integers(2, 8))
        leaves.append({"name": f"l{i}", "namespaces": [f"l{i}"],
                       "min": {"cpu": draw(st.integers(0, mx))},
                       "max": {"cpu": mx, JOBS: draw(st.integers(1, 4))}})
    floor = sum(leaf["min"]["cpu"] for leaf in leaves)
    root = {"cpu": max(floor, draw(st.integers(4, 12)))}
    notes = draw(st.sampled_from([{}, {"fleetq.io/fair-share-weight": ""}]))
    return make_tree({"name": "root", "min": root, "max": root, "children": leaves}, **notes)


@st.composite
def streams(draw: st.DrawFn) -> tuple[ElasticQuotaTree, QueuePolicy, list[tuple[Any, ...]]]:
    tree = _tree(draw)
    leaves = [c.name for c in tree.spec.root.children]
    ops: list[tuple[Any, ...]] = []
    for i in range(draw(st.integers(4, 24))):
        kind = draw(st.sampled_from(["submit", "submit", "finish", "requeue"]))
        if kind == "submit":
            ops.append(("submit", f"j{i}", draw(st.sampled_from(leaves)),
                        draw(st.sampled_from([0, 10, 10, 100])), draw(st.integers(1, 4))))
        else:
            ops.append((kind, draw(st.integers(0, 1000))))
    return tree, draw(st.sampled_from(list(QueuePolicy))), ops


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=streams())
def test_no_later_job_of_its_priority_is_admitted_before_a_requeued_victim(
    case: tuple[ElasticQuotaTree, QueuePolicy, list[tuple[Any, ...]]],
) -> None:
    """Random trees and job streams; any admitted job may be requeued (as a capacity
    victim: nothing is held for a preemptor). From its requeue until it is admitted
    again, no job of its queue with its priority, submitted after it, and asking no
    more than it, is admitted: such a job would fit only where the victim fits too,
    and the victim ranks first in their queue."""
    tree, policy, ops = case
    a = Admission(tree, policy, starvation_seconds=1e9)
    reqs: dict[str, AdmissionRequest] = {}
    waiting_victims: dict[str, AdmissionRequest] = {}
    t = 0.0
    checked = 0

    def grant(job_ids: list[str]) -> None:
        nonlocal checked
        for job_id in job_ids:
            waiting_victims.pop(job_id, None)
            r = reqs[job_id]
            for v in waiting_victims.values():
                if (v.namespace == r.namespace and v.priority == r.priority
                        and v.submitted_at < r.submitted_at
                        and all(v.request.get(k, 0) <= q for k, q in r.request.items())):
                    raise AssertionError(f"{job_id} admitted before requeued victim {v.job_id}")
                checked += 1

    for op in ops:
        t += 1.0
        if op[0] == "submit":
            _, name, leaf, prio, cpu = op
            r = req(name, prio=prio, at=t, cpu=cpu, ns=leaf)
            reqs[r.job_id] = r
            res = a.enqueue(r, t)
            if isinstance(res, Grant):
                grant([r.job_id])
            continue
        holders = a.holders()
        if not holders:
            continue
        job_id = holders[op[1] % len(holders)]
        if op[0] == "finish":
            a.release(job_id)
        else:
            waiting_victims[job_id] = reqs[job_id]
            assert not isinstance(a.requeue(reqs[job_id], t), Grant)
        grant([g.job_id for g in a.schedule(t)])
    event(f"{checked // 5 * 5}+ admissions checked")
