"""Fair sharing of borrowed quota (issue 18): when several quota nodes want the same idle
quota, the one with the lowest weighted dominant resource share gets it first, as in
Kueue; off (``Admission.fair_weights`` None), admission order is unchanged."""

from __future__ import annotations

from typing import Any

from fleetq.admission import Admission, AdmissionRequest, QueuePolicy
from fleetq.models import parse_tree
from fleetq.preemption import fair_sharing_weights


def tree(annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """Two teams guaranteed 2 cpu each, both allowed to borrow the root's other 8."""
    return {
        "apiVersion": "scheduling.sigs.k8s.io/v1beta1",
        "kind": "ElasticQuotaTree",
        "metadata": {"name": "t", "namespace": "kube-system",
                     "annotations": annotations or {}},
        "spec": {"root": {"name": "root", "min": {"cpu": 4}, "max": {"cpu": 12}, "children": [
            {"name": "a", "min": {"cpu": 2}, "max": {"cpu": 12}, "namespaces": ["team-a"]},
            {"name": "b", "min": {"cpu": 2}, "max": {"cpu": 12}, "namespaces": ["team-b"]},
        ]}},
    }


def job(ns: str, i: int, t: float, cpu: int = 1, prio: int = 0) -> AdmissionRequest:
    return AdmissionRequest(
        job_id=f"pytorchjob/{ns}/j{i}", namespace=ns, priority=prio,
        request={"cpu": cpu * 1000}, submitted_at=t,
    )


def admission(doc: dict[str, Any], fair: bool) -> Admission:
    a = Admission(parse_tree(doc), QueuePolicy.PRIORITY, 300)
    a.fair_weights = fair_sharing_weights(parse_tree(doc)) if fair else None
    return a


def split(doc: dict[str, Any], fair: bool) -> tuple[int, int]:
    """Team a submits 12 jobs, then team b 12, all while a pass is pending: cpu each
    gets from one scheduling pass."""
    a = admission(doc, fair)
    a.replace_tree(parse_tree(doc))  # a pass is pending: enqueue admits nobody at once
    for i in range(12):
        a.enqueue(job("team-a", i, float(i)), 0.0)
    for i in range(12):
        a.enqueue(job("team-b", i, 100.0 + i), 0.0)
    a.schedule(200.0)
    return a.usage("a")["cpu"] // 1000, a.usage("b")["cpu"] // 1000


def test_off_the_earlier_team_takes_all_the_borrowed_quota() -> None:
    assert split(tree(), fair=False) == (10, 2)


def test_on_equal_weights_split_the_borrowed_quota_evenly() -> None:
    on = tree({"fleetq.io/fair-share-weight": ""})
    assert fair_sharing_weights(parse_tree(on)) == {}
    assert split(on, fair=True) == (6, 6)
    # preemption or reclaim turn it on too
    assert fair_sharing_weights(parse_tree(tree({"fleetq.io/reclaim": "Any"}))) == {}
    assert fair_sharing_weights(parse_tree(tree())) is None


def test_weights_change_the_split() -> None:
    # a weighs 3: it borrows 3x what b borrows (6 vs 2 of the 8 idle cpu)
    doc = tree({"fleetq.io/fair-share-weight": "a=3"})
    assert split(doc, fair=True) == (2 + 6, 2 + 2)
    doc = tree({"fleetq.io/fair-share-weight": "b=3"})
    assert split(doc, fair=True) == (2 + 2, 2 + 6)


def fill(a: Admission) -> None:
    """a holds 7 cpu (borrows 5), b 5 (borrows 3): the root is full; then a 1-cpu job of
    each waits (a's first in priority), and one of b's jobs releases 1 cpu."""
    for i in range(7):
        a.enqueue(job("team-a", i, float(i)), 0.0)
    for i in range(5):
        a.enqueue(job("team-b", i, 10.0 + i), 0.0)
    assert (a.usage("a")["cpu"], a.usage("b")["cpu"]) == (7000, 5000)
    a.enqueue(job("team-b", 9, 20.0), 20.0)
    a.enqueue(job("team-a", 9, 21.0, prio=5), 21.0)
    assert a.release("pytorchjob/team-b/j0")


def test_the_lower_weighted_share_is_admitted_first() -> None:
    """a borrows 5 of the root's 12 cpu, b 2: b's later, lower-priority job gets the
    freed cpu with fair sharing on; a's higher-priority one does without."""
    doc = tree({"fleetq.io/fair-share-weight": ""})
    for fair, winner in ((True, "pytorchjob/team-b/j9"), (False, "pytorchjob/team-a/j9")):
        a = admission(doc, fair)
        fill(a)
        assert [g.job_id for g in a.schedule(30.0)] == [winner]


def test_weights_decide_who_is_below_its_share() -> None:
    # a weighing 3: a's share 5/36 < b's 2/12, a goes; weighing 2: 5/24 > 2/12, b goes;
    # b weighing 0.25: b's share 2/12/0.25 = 8/12 > 5/12, a goes
    for weights, winner in (("a=3", "pytorchjob/team-a/j9"), ("a=2", "pytorchjob/team-b/j9"),
                            ("b=0.25", "pytorchjob/team-a/j9")):
        a = admission(tree({"fleetq.io/fair-share-weight": weights}), True)
        fill(a)
        assert [g.job_id for g in a.schedule(30.0)] == [winner], weights
