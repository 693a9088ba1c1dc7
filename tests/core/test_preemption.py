"""Preemption decisions as a user sees them: which annotations turn what on (and which
values are refused, with which message), which running jobs give way to a waiting one,
why, and on which one member cluster."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from fleetq.admission import Admission, AdmissionRequest, Grant
from fleetq.capacity import ClusterSnapshot, NodeCapacity
from fleetq.models import Gang, GangPod, ManifestError, parse_job
from fleetq.placement import place_gang
from fleetq.preemption import (
    AdmittedJob,
    HolderInfo,
    JobPreemptionPolicy,
    PreemptionMode,
    PreemptionReason,
    Preemptor,
    QuotaNodeLimits,
    QuotaSnapshot,
    ReclaimMode,
    RunningGang,
    RunningPod,
    TreePreemptionPolicy,
    fair_share_order,
    job_policy,
    plan_capacity_preemption,
    plan_for_request,
    plan_quota_preemption,
    preemptor_from_request,
    snapshot_after,
    snapshot_from_admission,
    tree_policy,
    weighted_shares,
)
from tests.core.trees import make_tree

JOBS = "kube-queue/max-jobs"
CPU = "cpu"




def job_doc(**annotations: str) -> dict[str, Any]:
    pod = {"spec": {"containers": [{"name": "pytorch", "image": "x"}]}}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "train", "namespace": "team-a", "annotations": annotations},
        "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": pod}}},
    }


def cpu(n: float, jobs: int = 1) -> dict[str, int]:
    out = {CPU: int(n * 1000)}
    if jobs:
        out[JOBS] = jobs * 1000
    return out


def node(
    name: str,
    parent: str | None,
    mn: Mapping[str, int] | None = None,
    mx: Mapping[str, int] | None = None,
) -> QuotaNodeLimits:
    return QuotaNodeLimits(name, parent, dict(mn or {}), dict(mx or {}))


def held(
    job_id: str, at: str, request: Mapping[str, int], prio: int, seq: int, preemptible: bool = True
) -> AdmittedJob:
    return AdmittedJob(job_id, at, dict(request), prio, seq, preemptible)


def victims(plan: Any) -> list[str]:
    assert plan is not None
    return [v.job_id for v in plan.victims]


PRIORITY = TreePreemptionPolicy(preemption=PreemptionMode.LOWER_PRIORITY)
RECLAIM_ANY = TreePreemptionPolicy(reclaim=ReclaimMode.ANY)


# --------------------------------------------------------------------------- policy parsing


def test_without_annotations_nothing_is_preempted() -> None:
    tree = make_tree({"name": "root", "max": {"cpu": 4}})
    assert tree_policy(tree) == TreePreemptionPolicy()
    assert tree_policy(None) == TreePreemptionPolicy()
    assert not tree_policy(tree).enabled


def test_tree_annotations_are_read() -> None:
    tree = make_tree(
        {"name": "root", "children": [{"name": "child-1"}, {"name": "child_2"}]},
        **{
            "fleetq.io/preemption": "LowerPriority",
            "fleetq.io/reclaim": "Any",
            "fleetq.io/fair-share-weight": "child-1=2, child_2=0.5,root=1",
        },
    )
    policy = tree_policy(tree)
    assert policy.preemption is PreemptionMode.LOWER_PRIORITY
    assert policy.reclaim is ReclaimMode.ANY
    assert policy.weight("child-1") == 2.0
    assert policy.weight("child_2") == 0.5
    assert policy.weight("root") == 1.0
    assert policy.enabled


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        (
            {"fleetq.io/preemption": "Always"},
            "ElasticQuotaTree kube-system/tree: metadata.annotations.fleetq.io/preemption "
            "must be Never or LowerPriority, got 'Always'",
        ),
        (
            {"fleetq.io/reclaim": "lowerpriority"},
            "ElasticQuotaTree kube-system/tree: metadata.annotations.fleetq.io/reclaim "
            "must be Never, LowerPriority or Any, got 'lowerpriority'",
        ),
        (
            {"fleetq.io/fair-share-weight": "child-1=0"},
            "ElasticQuotaTree kube-system/tree: metadata.annotations.fleetq.io/fair-share-weight "
            "weight of 'child-1' must be a positive number, got '0'",
        ),
        (
            {"fleetq.io/fair-share-weight": "child-1=-2"},
            "weight of 'child-1' must be a positive number, got '-2'",
        ),
        ({"fleetq.io/fair-share-weight": "child-1=nan"}, "must be a positive number, got 'nan'"),
        ({"fleetq.io/fair-share-weight": "child-1=inf"}, "must be a positive number, got 'inf'"),
        ({"fleetq.io/fair-share-weight": "child-1=two"}, "must be a positive number, got 'two'"),
        ({"fleetq.io/fair-share-weight": "2"}, "must be node=weight pairs separated by commas"),
        ({"fleetq.io/fair-share-weight": "team-x=2"}, "names no node of the tree: 'team-x'"),
        (
            {"fleetq.io/fair-share-weight": "child-1=2,child-1=3"},
            "gives node 'child-1' a weight twice",
        ),
    ],
)
def test_bad_tree_annotations_name_the_tree_and_the_field(
    annotations: dict[str, str], message: str
) -> None:
    tree = make_tree({"name": "root", "children": [{"name": "child-1"}]}, **annotations)
    with pytest.raises(ManifestError) as err:
        tree_policy(tree)
    assert message in str(err.value)
    assert str(err.value).startswith("ElasticQuotaTree kube-system/tree: metadata.annotations.")


def test_job_annotations_opt_out_and_grace() -> None:
    assert job_policy(parse_job(job_doc())) == JobPreemptionPolicy(True, 30)
    got = job_policy(
        parse_job(
            job_doc(**{"fleetq.io/preemptible": "false", "fleetq.io/preemption-grace-seconds": "0"})
        )
    )
    assert got == JobPreemptionPolicy(preemptible=False, grace_seconds=0)
    got = job_policy(parse_job(job_doc(**{"fleetq.io/preemption-grace-seconds": "120"})))
    assert got == JobPreemptionPolicy(preemptible=True, grace_seconds=120)


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        (
            {"fleetq.io/preemptible": "no"},
            'PyTorchJob team-a/train: metadata.annotations.fleetq.io/preemptible must be "true" '
            "or \"false\", got 'no'",
        ),
        (
            {"fleetq.io/preemption-grace-seconds": "-1"},
            "PyTorchJob team-a/train: metadata.annotations.fleetq.io/preemption-grace-seconds "
            "must be a whole number of seconds between 0 and 86400, got '-1'",
        ),
        ({"fleetq.io/preemption-grace-seconds": "1.5"}, "got '1.5'"),
        ({"fleetq.io/preemption-grace-seconds": "soon"}, "got 'soon'"),
        ({"fleetq.io/preemption-grace-seconds": "86401"}, "got '86401'"),
        ({"fleetq.io/preemption-grace-seconds": "٣"}, "whole number"),
    ],
)
def test_bad_job_annotations_name_the_job_and_the_field(
    annotations: dict[str, str], message: str
) -> None:
    with pytest.raises(ManifestError) as err:
        job_policy(parse_job(job_doc(**annotations)))
    assert message in str(err.value)


# --------------------------------------------------------------------------- priority preemption


def one_leaf(
    max_: Mapping[str, int], *jobs: AdmittedJob, policy: TreePreemptionPolicy = PRIORITY
) -> QuotaSnapshot:
    return QuotaSnapshot((node("root", None), node("team", "root", mx=max_)), tuple(jobs), policy)


def test_higher_priority_job_preempts_in_a_max_jobs_1_leaf() -> None:
    snap = one_leaf({JOBS: 1000}, held("low", "team", cpu(1), 10, 0))
    plan = plan_quota_preemption(snap, Preemptor("high", "team", 1000, cpu(1)))
    assert plan is not None
    assert plan.preemptor == "high" and plan.node == "team"
    [v] = plan.victims
    assert (v.job_id, v.reason, v.message) == (
        "low",
        PreemptionReason.PRIORITY,
        "priority 1000 > 10",
    )
    assert v.reason.value == "Priority"
    assert v.grace_seconds == 30 and v.node == "team"
    assert plan.reasons == {PreemptionReason.PRIORITY: 1}


def test_preemption_never_by_default_and_only_strictly_lower_priority() -> None:
    low = held("low", "team", cpu(1), 10, 0)
    off = one_leaf({JOBS: 1000}, low, policy=TreePreemptionPolicy())
    assert plan_quota_preemption(off, Preemptor("high", "team", 1000, cpu(1))) is None
    on = one_leaf({JOBS: 1000}, low)
    assert plan_quota_preemption(on, Preemptor("same", "team", 10, cpu(1))) is None


def test_opted_out_job_is_never_a_victim() -> None:
    snap = one_leaf({JOBS: 1000}, held("keep", "team", cpu(1), 0, 0, preemptible=False))
    assert plan_quota_preemption(snap, Preemptor("high", "team", 1000, cpu(1))) is None


def test_a_job_that_fits_needs_no_preemption() -> None:
    snap = one_leaf({JOBS: 2000}, held("low", "team", cpu(1), 0, 0))
    assert plan_quota_preemption(snap, Preemptor("high", "team", 1000, cpu(1))) is None


def test_victims_are_minimal_not_just_the_first_in_order() -> None:
    # Lowest priority first would take a (1 cpu) then b (2 cpu); b alone is enough.
    snap = one_leaf(
        {CPU: 4000},
        held("a", "team", cpu(1, 0), 1, 0),
        held("b", "team", cpu(2, 0), 2, 1),
        held("c", "team", cpu(1, 0), 3, 2),
    )
    plan = plan_quota_preemption(snap, Preemptor("p", "team", 10, cpu(2, 0)))
    assert victims(plan) == ["b"]


def test_lowest_priority_then_most_recently_admitted_then_name() -> None:
    snap = one_leaf(
        {CPU: 3000},
        held("old", "team", cpu(1, 0), 1, 0),
        held("new", "team", cpu(1, 0), 1, 5),
        held("higher", "team", cpu(1, 0), 2, 9),
    )
    assert victims(plan_quota_preemption(snap, Preemptor("p", "team", 10, cpu(1, 0)))) == ["new"]
    assert victims(plan_quota_preemption(snap, Preemptor("p", "team", 10, cpu(2, 0)))) == [
        "new",
        "old",
    ]
    tie = one_leaf(
        {CPU: 2000}, held("b", "team", cpu(1, 0), 1, 3), held("a", "team", cpu(1, 0), 1, 3)
    )
    assert victims(plan_quota_preemption(tie, Preemptor("p", "team", 10, cpu(1, 0)))) == ["a"]


def test_never_preempts_for_a_job_that_would_still_not_fit() -> None:
    snap = one_leaf(
        {CPU: 8000},
        held("a", "team", cpu(4, 0), 1, 0),
        held("vip", "team", cpu(4, 0), 100, 1),
    )
    # Only "a" may go (vip's priority is not lower): 4 cpu free is short of 6.
    assert plan_quota_preemption(snap, Preemptor("p", "team", 10, cpu(6, 0))) is None
    # Larger than the leaf's max: nothing could ever make room.
    assert plan_quota_preemption(snap, Preemptor("p", "team", 1000, cpu(9, 0))) is None


def test_priority_preemption_stays_in_the_preemptors_node() -> None:
    snap = QuotaSnapshot(
        (node("root", None, mx={CPU: 2000}), node("a", "root"), node("b", "root")),
        (held("other", "b", cpu(2, 0), 0, 0),),
        PRIORITY,
    )
    assert plan_quota_preemption(snap, Preemptor("p", "a", 10, cpu(1, 0))) is None


# --------------------------------------------------------------------------- reclaim


def two_teams(*jobs: AdmittedJob, policy: TreePreemptionPolicy = RECLAIM_ANY) -> QuotaSnapshot:
    return QuotaSnapshot(
        (
            node("root", None, {CPU: 40_000}, {CPU: 40_000}),
            node("child-1", "root", {CPU: 20_000}, {CPU: 40_000}),
            node("child-2", "root", {CPU: 20_000}, {CPU: 40_000}),
        ),
        tuple(jobs),
        policy,
    )


BORROWER = [held(f"b{i}", "child-2", cpu(10), 5, i) for i in range(4)]  # 40 of min 20


def test_reclaim_takes_back_from_a_borrower_for_a_team_below_min() -> None:
    plan = plan_quota_preemption(two_teams(*BORROWER), Preemptor("p", "child-1", 0, cpu(10)))
    assert plan is not None
    [v] = plan.victims
    assert (v.job_id, v.reason, v.message) == (
        "b3",
        PreemptionReason.RECLAIM,
        "reclaim for child-1 below min",
    )
    assert v.node == "child-2"


def test_reclaim_lower_priority_spares_equal_or_higher_priority_borrowers() -> None:
    policy = TreePreemptionPolicy(reclaim=ReclaimMode.LOWER_PRIORITY)
    snap = two_teams(*BORROWER, policy=policy)
    assert plan_quota_preemption(snap, Preemptor("p", "child-1", 5, cpu(10))) is None
    assert victims(plan_quota_preemption(snap, Preemptor("p", "child-1", 6, cpu(10)))) == ["b3"]


def test_reclaim_never_takes_a_borrower_below_its_own_min() -> None:
    # child-2 holds exactly its min; it is not borrowing, so nothing is reclaimed.
    snap = two_teams(*BORROWER[:2], held("x", "child-1", cpu(10), 0, 9))
    root_full = QuotaSnapshot(
        (node("root", None, mx={CPU: 20_000}), *snap.nodes[1:]), snap.admitted, RECLAIM_ANY
    )
    assert plan_quota_preemption(root_full, Preemptor("p", "child-1", 0, cpu(5))) is None


def test_reclaim_only_serves_a_node_below_min_that_stays_within_it() -> None:
    at_min = two_teams(*BORROWER[:2], held("mine", "child-1", cpu(20), 0, 9))
    assert plan_quota_preemption(at_min, Preemptor("p", "child-1", 0, cpu(10))) is None
    # 15 of min 20 used: 10 more would borrow, so reclaim does not serve it; 5 does.
    near = two_teams(*BORROWER[:3], held("mine", "child-1", cpu(15), 0, 9))
    root = QuotaSnapshot(
        (node("root", None, mx={CPU: 45_000}), *near.nodes[1:]), near.admitted, RECLAIM_ANY
    )
    assert plan_quota_preemption(root, Preemptor("p", "child-1", 0, cpu(10))) is None
    assert victims(plan_quota_preemption(root, Preemptor("p", "child-1", 0, cpu(5)))) == ["b2"]


def test_reclaim_counts_the_preemptors_own_victims_out_of_its_min() -> None:
    """child-1 (min 20) runs 10 of lower priority; a job of 20 arrives. With them counted
    it would end at 30, over its min, and reclaim would not serve it; but a plan that
    also stops them leaves child-1 at 20, within its min, so it reclaims the 10 the root
    lacks from child-2's borrowing and stops its own 10: Kueue's ReclaimWithoutBorrowing
    candidates are judged "after all preemptions and the admission of the incoming
    workload" (sigs.k8s.io/kueue v0.17.0 pkg/scheduler/preemption/classical/
    hierarchical_preemption.go; preemption.go ``classicalPreemptions`` removes same-queue
    and other-queue candidates alike until ``workloadFits`` without borrowing)."""
    both = TreePreemptionPolicy(PreemptionMode.LOWER_PRIORITY, ReclaimMode.ANY)
    borrowers = [held(f"b{i}", "child-2", cpu(10), 5, i) for i in range(3)]  # 30 of min 20
    snap = two_teams(*borrowers, held("mine", "child-1", cpu(10), 0, 9), policy=both)
    plan = plan_quota_preemption(snap, Preemptor("p", "child-1", 10, cpu(20)))
    assert plan is not None
    assert {(v.job_id, v.reason) for v in plan.victims} == {
        ("b2", PreemptionReason.RECLAIM), ("mine", PreemptionReason.PRIORITY)}
    # without priority preemption its own job stays, so reclaim cannot serve it
    assert plan_quota_preemption(dataclasses.replace(snap, policy=RECLAIM_ANY),
                                 Preemptor("p", "child-1", 10, cpu(20))) is None


def test_reclaim_spares_the_preemptors_own_jobs_when_it_stays_within_min_with_them() -> None:
    """child-1 runs 5 of lower priority and a job of 10 arrives: 15 is within its min of
    20, so the borrowers give all the room and its own job keeps running (Kueue tries
    other queues' candidates before its own and stops at the first fit)."""
    both = TreePreemptionPolicy(PreemptionMode.LOWER_PRIORITY, ReclaimMode.ANY)
    borrowers = [held(f"b{i}", "child-2", cpu(5), 5, i) for i in range(7)]  # 35 of min 20
    snap = two_teams(*borrowers, held("mine", "child-1", cpu(5), 0, 9), policy=both)
    plan = plan_quota_preemption(snap, Preemptor("p", "child-1", 10, cpu(10)))
    assert sorted(victims(plan)) == ["b5", "b6"]


def test_reclaim_counts_only_the_resources_a_quota_names() -> None:
    mem = {**cpu(10), "memory": 8 << 30}
    jobs = [held(f"b{i}", "child-2", mem, 5, i) for i in range(4)]
    # The tree names cpu only: memory is neither guaranteed nor limited, reclaim works.
    plan = plan_quota_preemption(two_teams(*jobs), Preemptor("p", "child-1", 0, mem))
    assert victims(plan) == ["b3"]
    # child-1's max names memory but its min does not: it is guaranteed no memory, so a
    # job asking for memory is not within child-1's guarantee and reclaims nothing.
    snap = two_teams(*jobs)
    limited = dataclasses.replace(
        snap,
        nodes=(
            snap.nodes[0],
            node("child-1", "root", {CPU: 20_000}, {CPU: 40_000, "memory": 64 << 30}),
            snap.nodes[2],
        ),
    )
    assert plan_quota_preemption(limited, Preemptor("p", "child-1", 0, mem)) is None
    assert victims(plan_quota_preemption(limited, Preemptor("p", "child-1", 0, cpu(10)))) == ["b3"]


def test_reclaim_protects_a_sibling_within_min_under_a_borrowing_parent() -> None:
    nodes = (
        node("root", None, {CPU: 40_000}, {CPU: 40_000}),
        node("team-1", "root", {CPU: 20_000}, {CPU: 40_000}),
        node("org-2", "root", {CPU: 20_000}, {CPU: 40_000}),
        node("team-3", "org-2", {CPU: 10_000}, {CPU: 40_000}),
        node("team-4", "org-2", {CPU: 10_000}, {CPU: 40_000}),
    )
    jobs = (
        held("guaranteed", "team-4", cpu(10), 0, 5),  # team-4 at its min: protected
        held("borrow-1", "team-3", cpu(15), 9, 0),
        held("borrow-2", "team-3", cpu(15), 9, 1),
    )
    plan = plan_quota_preemption(
        QuotaSnapshot(nodes, jobs, RECLAIM_ANY), Preemptor("p", "team-1", 0, cpu(10))
    )
    assert victims(plan) == ["borrow-2"]


def test_reclaim_comes_before_the_preemptors_own_lower_priority_jobs() -> None:
    both = TreePreemptionPolicy(PreemptionMode.LOWER_PRIORITY, ReclaimMode.ANY)
    snap = two_teams(*BORROWER, held("mine", "child-1", cpu(0, 1), 0, 9), policy=both)
    plan = plan_quota_preemption(snap, Preemptor("p", "child-1", 10, cpu(10)))
    assert victims(plan) == ["b3"]


def test_reclaim_takes_from_the_borrower_furthest_above_its_fair_share() -> None:
    nodes = (
        node("root", None, mx={CPU: 60_000}),
        node("a", "root", {CPU: 20_000}, {CPU: 60_000}),
        node("b", "root", {CPU: 10_000}, {CPU: 60_000}),
        node("c", "root", {CPU: 10_000}, {CPU: 60_000}),
    )
    jobs = (
        held("b-1", "b", cpu(10), 0, 0),
        held("b-2", "b", cpu(10), 0, 1),  # b borrows 10 (share 1/6)
        held("c-1", "c", cpu(10), 5, 2),
        held("c-2", "c", cpu(10), 5, 3),
        held("c-3", "c", cpu(10), 5, 4),
        held("c-4", "c", cpu(10), 5, 5),  # c borrows 30 (share 1/2)
    )
    # c is further above its fair share: its job goes although b's have lower priority.
    plan = plan_quota_preemption(
        QuotaSnapshot(nodes, jobs, RECLAIM_ANY), Preemptor("p", "a", 0, cpu(10))
    )
    assert victims(plan) == ["c-4"]
    shares = weighted_shares(QuotaSnapshot(nodes, jobs, RECLAIM_ANY))
    assert shares["c"] == pytest.approx(0.5) and shares["b"] == pytest.approx(1 / 6)
    assert shares["a"] == 0.0 and shares["root"] == 0.0
    # Weight 4 on c brings its weighted share (1/8) below b's: b gives way first.
    heavy = TreePreemptionPolicy(reclaim=ReclaimMode.ANY, weights={"c": 4.0})
    plan = plan_quota_preemption(QuotaSnapshot(nodes, jobs, heavy), Preemptor("p", "a", 0, cpu(10)))
    assert victims(plan) == ["b-2"]


def test_fair_share_order_of_nodes_wanting_the_same_idle_quota() -> None:
    nodes = (
        node("root", None, mx={CPU: 100_000}),
        node("a", "root", {CPU: 10_000}, {CPU: 100_000}),
        node("b", "root", {CPU: 10_000}, {CPU: 100_000}),
        node("c", "root", {CPU: 10_000}, {CPU: 100_000}),
    )
    jobs = (held("a-1", "a", cpu(30), 0, 0), held("b-1", "b", cpu(20), 0, 1))
    snap = QuotaSnapshot(nodes, jobs)
    wanting = [("a", cpu(5)), ("b", cpu(5)), ("c", cpu(5))]
    assert fair_share_order(snap, wanting) == ["c", "b", "a"]
    weighted = QuotaSnapshot(nodes, jobs, TreePreemptionPolicy(weights={"a": 3.0}))
    assert fair_share_order(weighted, wanting) == ["c", "a", "b"]
    # A big request counts as borrowed once admitted.
    assert fair_share_order(snap, [("c", cpu(60)), ("b", cpu(5))]) == ["b", "c"]
    with pytest.raises(KeyError):
        fair_share_order(snap, [("nope", cpu(1))])


# --------------------------------------------------------------------------- adapter


def test_snapshot_from_admission_and_a_preemptor_from_its_request() -> None:
    tree = make_tree(
        {
            "name": "root",
            "max": {"cpu": 4},
            "children": [{"name": "team", "max": {"cpu": 4, JOBS: 2}, "namespaces": ["default"]}],
        },
        **{"fleetq.io/preemption": "LowerPriority"},
    )
    admission = Admission(tree)

    def request(name: str, prio: int) -> AdmissionRequest:
        return AdmissionRequest(
            job_id=f"pytorchjob/default/{name}",
            namespace="default",
            priority=prio,
            request=cpu(1),
            submitted_at=0.0,
        )

    for name in ("first", "second"):
        assert isinstance(admission.enqueue(request(name, 0), 0.0), Grant)
    waiting = request("urgent", 1000)
    admission.enqueue(waiting, 1.0)
    infos = {
        "pytorchjob/default/first": HolderInfo(0),
        "pytorchjob/default/second": HolderInfo(0, JobPreemptionPolicy(grace_seconds=5)),
    }
    snap = snapshot_from_admission(admission, infos)
    assert snap.policy.preemption is PreemptionMode.LOWER_PRIORITY
    assert [j.admitted_seq for j in snap.admitted] == [0, 1]
    preemptor = preemptor_from_request(admission, waiting)
    assert preemptor.node == "team"
    plan = plan_quota_preemption(snap, preemptor)
    assert plan is not None
    [v] = plan.victims
    assert v.job_id == "pytorchjob/default/second" and v.grace_seconds == 5
    # A holder the caller knows nothing about counts for usage and is never a victim.
    partial = snapshot_from_admission(admission, {"pytorchjob/default/first": HolderInfo(5)})
    plan = plan_quota_preemption(partial, preemptor)
    assert victims(plan) == ["pytorchjob/default/first"]
    assert plan_quota_preemption(snapshot_from_admission(admission, {}), preemptor) is None


def test_plans_being_carried_out_never_reuse_a_victim_or_promise_quota_twice() -> None:
    tree = make_tree(
        {"name": "root", "children": [{"name": "team", "max": {JOBS: 2}, "namespaces": ["ml"]}]},
        **{"fleetq.io/preemption": "LowerPriority"},
    )
    admission = Admission(tree)

    def request(name: str, prio: int) -> AdmissionRequest:
        return AdmissionRequest(
            job_id=name, namespace="ml", priority=prio, request=cpu(1), submitted_at=0.0
        )

    for name in ("low-1", "low-2"):
        assert isinstance(admission.enqueue(request(name, 0), 0.0), Grant)
    holders = {"low-1": HolderInfo(0), "low-2": HolderInfo(0)}
    first = plan_for_request(admission, holders, request("a", 10))
    assert victims(first) == ["low-2"]
    assert first is not None and first.priority == 10 and first.request == cpu(1)
    second = plan_for_request(admission, holders, request("b", 10), [first])
    assert victims(second) == ["low-1"]
    assert second is not None
    # Both slots are promised to a and b; their own plans do not make them victims.
    assert plan_for_request(admission, holders, request("c", 20), [first, second]) is None
    # Once low-2 released and a was admitted for real, a's plan is simply skipped.
    admission.release("low-2")
    admission.enqueue(request("a", 10), 1.0)
    assert [g.job_id for g in admission.schedule(1.0)] == ["a"]
    holders["a"] = HolderInfo(10)
    after = snapshot_after(snapshot_from_admission(admission, holders), [first, second])
    assert sorted(j.job_id for j in after.admitted) == ["a", "b"]
    assert [j.preemptible for j in after.admitted if j.job_id == "b"] == [False]


def test_a_malformed_snapshot_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown 'nowhere'"):
        plan_quota_preemption(
            QuotaSnapshot((node("root", None),), (held("j", "nowhere", cpu(1), 0, 0),)),
            Preemptor("p", "root", 0, cpu(1)),
        )
    with pytest.raises(KeyError):
        plan_quota_preemption(QuotaSnapshot((node("root", None),), ()), Preemptor("p", "x", 0, {}))


# --------------------------------------------------------------------------- capacity


def pod_gang(pods: int, cpus: float, prio: int) -> Gang:
    return Gang(tuple(GangPod("worker", i, {CPU: int(cpus * 1000)}) for i in range(pods)), prio)


def busy_cluster(
    name: str, gangs: Sequence[tuple[str, int, float, float]]
) -> tuple[ClusterSnapshot, list[RunningGang]]:
    """One 8-cpu node per running gang ``(job, priority, cpu used, started_at)``."""
    nodes: list[NodeCapacity] = []
    running: list[RunningGang] = []
    for i, (job, prio, used, started) in enumerate(gangs):
        n = f"{name}-n{i}"
        nodes.append(NodeCapacity(n, {CPU: 8000}, {CPU: int(used * 1000)}, pods_used=1))
        running.append(
            RunningGang(job, name, prio, (RunningPod(n, {CPU: int(used * 1000)}),), started)
        )
    return ClusterSnapshot(name, nodes=nodes), running


def test_capacity_preemption_picks_the_one_cheapest_of_three_clusters() -> None:
    a, run_a = busy_cluster("cluster-a", [("a1", 50, 8, 0.0)])
    b, run_b = busy_cluster("cluster-b", [("b1", 1, 8, 0.0), ("b2", 1, 8, 0.0)])
    c, run_c = busy_cluster("cluster-c", [("c1", 1, 8, 0.0)])
    gang = pod_gang(1, 6, 100)
    assert place_gang(gang, [a, b, c]).best is None
    plan = plan_capacity_preemption("big", gang, [a, b, c], run_a + run_b + run_c, now=100.0)
    assert plan is not None
    # b and c cost one priority-1 victim each, equal work lost: the name decides.
    assert plan.cluster == "cluster-b"
    [v] = plan.victims
    assert (v.job_id, v.cluster, v.reason) == ("b1", "cluster-b", PreemptionReason.CAPACITY)
    assert v.message == "room on cluster-b for priority 100 > 1"
    assert plan.choice.cluster == "cluster-b" and plan.choice.assignment == {
        "worker-0": "cluster-b-n0"
    }
    assert plan.work_lost == pytest.approx(800.0)  # 8 cpu for 100 s


def test_capacity_preemption_loses_the_least_work() -> None:
    a, run_a = busy_cluster("cluster-a", [("old", 1, 8, 0.0)])
    b, run_b = busy_cluster("cluster-b", [("young", 1, 8, 90.0)])
    plan = plan_capacity_preemption("big", pod_gang(1, 6, 100), [a, b], run_a + run_b, now=100.0)
    assert plan is not None and plan.cluster == "cluster-b"
    assert [v.job_id for v in plan.victims] == ["young"] and plan.work_lost == pytest.approx(80.0)


def test_capacity_preemption_prefers_lower_priority_victims_over_fewer() -> None:
    a, run_a = busy_cluster("cluster-a", [("mid", 50, 8, 0.0)])
    b, run_b = busy_cluster("cluster-b", [("low-1", 1, 4, 0.0)])
    b.nodes[0].requested[CPU] = 8000  # two low gangs share the node
    run_b.append(
        RunningGang("low-2", "cluster-b", 1, (RunningPod("cluster-b-n0", {CPU: 4000}),), 0.0)
    )
    b.nodes[0].pods_used = 2
    plan = plan_capacity_preemption("big", pod_gang(1, 6, 100), [a, b], run_a + run_b, now=10.0)
    assert plan is not None and plan.cluster == "cluster-b"
    assert sorted(v.job_id for v in plan.victims) == ["low-1", "low-2"]


def test_capacity_preemption_spares_opted_out_and_not_lower_priority_gangs() -> None:
    a, run_a = busy_cluster("cluster-a", [("peer", 100, 8, 0.0)])
    b, _ = busy_cluster("cluster-b", [("keep", 1, 8, 0.0)])
    keep = RunningGang(
        "keep", "cluster-b", 1, (RunningPod("cluster-b-n0", {CPU: 8000}),), 0.0, preemptible=False
    )
    assert (
        plan_capacity_preemption("big", pod_gang(1, 6, 100), [a, b], [*run_a, keep], now=1.0)
        is None
    )


def test_capacity_preemption_only_when_needed_and_possible() -> None:
    a, run_a = busy_cluster("cluster-a", [("low", 1, 2, 0.0)])
    # Fits already (6 of 8 free): place normally, preempt nothing.
    assert plan_capacity_preemption("p", pod_gang(1, 6, 100), [a], run_a, now=1.0) is None
    # Larger than any node: no victims could ever make room.
    assert plan_capacity_preemption("p", pod_gang(1, 9, 100), [a], run_a, now=1.0) is None


def test_capacity_preemption_needs_the_whole_gang_to_fit_and_respects_exclusions() -> None:
    a, run_a = busy_cluster("cluster-a", [("x", 1, 8, 0.0), ("y", 1, 8, 0.0), ("z", 5, 8, 0.0)])
    b, run_b = busy_cluster("cluster-b", [("w", 1, 8, 0.0)])
    gang = pod_gang(2, 5, 100)  # two pods of 5 cpu: two nodes must be emptied
    plan = plan_capacity_preemption("g", gang, [a, b], run_a + run_b, now=1.0)
    assert plan is not None and plan.cluster == "cluster-a"
    assert sorted(v.job_id for v in plan.victims) == ["x", "y"]
    assert (
        plan_capacity_preemption("g", gang, [a, b], run_a + run_b, now=1.0, exclude={"cluster-a"})
        is None
    )


def shared_node(
    name: str, gangs: Sequence[tuple[str, int, float]]
) -> tuple[NodeCapacity, list[RunningGang]]:
    """One 8-cpu node of ``cluster-a`` running one-pod gangs ``(job, priority, cpu)``."""
    used = int(sum(c for _, _, c in gangs) * 1000)
    n = NodeCapacity(name, {CPU: 8000}, {CPU: used}, pods_used=len(gangs))
    return n, [
        RunningGang(job, "cluster-a", prio, (RunningPod(name, {CPU: int(c * 1000)}),), 0.0)
        for job, prio, c in gangs
    ]


def test_capacity_victims_are_concentrated_on_the_nodes_that_open_up() -> None:
    a, run_a = shared_node("n-a", [(f"a{i}", 0, 2) for i in range(4)])
    b, run_b = shared_node("n-b", [("b0", 0, 2), ("b1", 0, 2), ("b2", 1, 2), ("b3", 1, 2)])
    snap = ClusterSnapshot("cluster-a", nodes=[b, a])
    plan = plan_capacity_preemption("p", pod_gang(1, 8, 5), [snap], run_b + run_a, now=1.0)
    assert plan is not None
    assert sorted(v.job_id for v in plan.victims) == ["a0", "a1", "a2", "a3"]
    # One big gang rather than four small ones of the same priority.
    big, run_big = shared_node("n-big", [("z-big", 0, 8)])
    small, run_small = shared_node("n-small", [(f"s{i}", 0, 2) for i in range(4)])
    snap = ClusterSnapshot("cluster-a", nodes=[small, big])
    plan = plan_capacity_preemption("p", pod_gang(1, 8, 5), [snap], run_small + run_big, now=1.0)
    assert plan is not None and [v.job_id for v in plan.victims] == ["z-big"]


def test_capacity_victims_lose_the_least_work_and_node_order_only_breaks_ties() -> None:
    """Issue 24: work lost (cpu x seconds run) decides before node order. n0 runs one
    8-cpu gang for 100 s (800 cpu·s), n1 two 4-cpu gangs for 10 s (80): the two young
    ones go, though n0 needs fewer evictions and came first in node order."""
    old, run_old = shared_node("n0", [("old", 0, 8)])
    young, run_young = shared_node("n1", [("young-1", 0, 4), ("young-2", 0, 4)])
    run_young = [dataclasses.replace(g, started_at=90.0) for g in run_young]
    snap = ClusterSnapshot("cluster-a", nodes=[old, young])
    plan = plan_capacity_preemption("p", pod_gang(1, 8, 5), [snap], run_old + run_young,
                                    now=100.0)
    assert plan is not None
    assert sorted(v.job_id for v in plan.victims) == ["young-1", "young-2"]
    assert plan.work_lost == pytest.approx(80.0)
    # Equal work, priority and count on both nodes: node order (then name) decides.
    a, run_a = shared_node("n0", [("on-n0", 0, 8)])
    b, run_b = shared_node("n1", [("on-n1", 0, 8)])
    plan = plan_capacity_preemption("p", pod_gang(1, 8, 5), [ClusterSnapshot(
        "cluster-a", nodes=[b, a])], run_b + run_a, now=100.0)
    assert plan is not None and [v.job_id for v in plan.victims] == ["on-n0"]


def test_the_cheapest_cluster_is_the_one_losing_least_work_before_fewest_victims() -> None:
    a, run_a = busy_cluster("cluster-a", [("old", 1, 8, 0.0)])
    b, run_b = shared_node("cluster-b-n0", [("y1", 1, 4), ("y2", 1, 4)])
    run_b = [dataclasses.replace(g, cluster="cluster-b", started_at=95.0) for g in run_b]
    plan = plan_capacity_preemption(
        "p", pod_gang(1, 8, 5), [a, ClusterSnapshot("cluster-b", nodes=[b])], run_a + run_b,
        now=100.0)
    assert plan is not None and plan.cluster == "cluster-b"  # 40 cpu·s against 800
