""""Not now" versus "never" (issue 24): could the gang fit a member with all its nodes
empty? kube-scheduler tells the two apart by filter status (``Unschedulable`` versus
``UnschedulableAndUnresolvable``, pkg/scheduler/framework/interface.go); its
NodeResourcesFit filter (plugins/noderesources/fit.go ``fitsRequest``) compares a pod's
requests with the node's allocatable minus what is requested there, so with nothing
requested a pod that exceeds every eligible node's allocatable can never run."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetq import placement
from fleetq.capacity import ClusterSnapshot, NodeCapacity, Taint
from fleetq.models import Gang, GangPod
from fleetq.placement import ever_fits_cluster, never_fits
from fleetq.rejection import RejectionCode, Severity
from tests.core.test_placement_properties import gangs, snapshots
from tests.tiers import examples

GI = 1 << 30


def place_gang(gang: Gang, clusters: list[ClusterSnapshot]) -> placement.PlacementDecision:
    """:func:`fleetq.placement.place_gang` asked to judge "never" too."""
    return placement.place_gang(gang, clusters, judge_never=True)


def cpu_node(name: str, cpu: int, used: int = 0, **kw: object) -> NodeCapacity:
    return NodeCapacity(name, {"cpu": cpu * 1000, "memory": 256 * GI},
                        {"cpu": used * 1000} if used else {}, **kw)  # type: ignore[arg-type]


def one_pod(cpu: int, **pod: object) -> Gang:
    return Gang((GangPod("master", 0, {"cpu": cpu * 1000}, **pod),), priority=0)  # type: ignore[arg-type]


def fleet(*clusters: tuple[str, list[NodeCapacity]], **kw: object) -> list[ClusterSnapshot]:
    return [ClusterSnapshot(name, nodes=nodes, **kw) for name, nodes in clusters]  # type: ignore[arg-type]


def test_a_pod_larger_than_every_node_never_fits_and_says_so() -> None:
    """The issue's job: one 40-cpu pod, the largest node anywhere has 32 allocatable."""
    clusters = fleet(("cluster-a", [cpu_node("a1", 32, used=30), cpu_node("a2", 16)]),
                     ("cluster-b", [cpu_node("b1", 8)]))
    decision = place_gang(one_pod(40), clusters)
    assert decision.ranked == []
    assert not decision.ever_fits
    assert decision.never is not None
    assert decision.never.code == RejectionCode.NEVER_FITS
    assert decision.never.severity == Severity.UNRESOLVABLE
    assert decision.never.message == (
        "no member can ever hold master-0 (cpu 40): the largest eligible node has 32"
    )


def test_a_pod_that_fits_an_empty_node_but_not_now_waits() -> None:
    clusters = fleet(("cluster-a", [cpu_node("a1", 32, used=30)]))
    decision = place_gang(one_pod(30), clusters)
    assert decision.ranked == []
    assert decision.ever_fits and decision.never is None
    assert "2 free summed over 1 schedulable nodes" in decision.rejections["cluster-a"]


def test_never_is_judged_only_when_asked() -> None:
    """Hot loops (the simulator, capacity-preemption planning) want a fit only."""
    clusters = fleet(("cluster-a", [cpu_node("a1", 32)]))
    assert placement.place_gang(one_pod(40), clusters).never is None
    assert place_gang(one_pod(40), clusters).never is not None


def test_fitting_now_is_ever_fitting() -> None:
    decision = place_gang(one_pod(4), fleet(("cluster-a", [cpu_node("a1", 32)])))
    assert decision.best is not None and decision.ever_fits


def test_node_selector_no_node_carries_is_never() -> None:
    g = one_pod(1, node_selector={"pool": "gpu"})
    decision = place_gang(g, fleet(("cluster-a", [cpu_node("a1", 32, labels={"pool": "cpu"})])))
    assert decision.never is not None
    assert "no node matches nodeSelector pool=gpu for master-0" in decision.never.message


def test_untolerated_node_taints_are_never_and_tolerated_ones_are_not() -> None:
    tainted = cpu_node("a1", 32, taints=(Taint("gpu", "yes", "NoSchedule"),))
    assert place_gang(one_pod(1), fleet(("cluster-a", [tainted]))).never is not None
    tol = one_pod(1, tolerations=({"key": "gpu", "operator": "Exists"},))
    assert place_gang(tol, fleet(("cluster-a", [tainted]))).never is None


def test_a_cordoned_big_node_does_not_count_until_uncordoned() -> None:
    """Only schedulable nodes can ever hold it; uncordoning is a node change, which
    re-evaluates the job (the workflow is woken)."""
    nodes = [cpu_node("big", 64, unschedulable=True), cpu_node("small", 8)]
    assert place_gang(one_pod(40), fleet(("cluster-a", nodes))).never is not None
    nodes[0] = dataclasses.replace(nodes[0], unschedulable=False)
    decision = place_gang(one_pod(40), fleet(("cluster-a", nodes)))
    assert decision.best is not None


def test_pod_slots_count_allocatable_not_free() -> None:
    pods = tuple(GangPod("worker", i, {"cpu": 1000}) for i in range(5))
    g = Gang(pods, priority=0)
    full = [cpu_node("a1", 32, pods_allocatable=2, pods_used=2),
            cpu_node("a2", 32, pods_allocatable=2, pods_used=2)]
    decision = place_gang(g, fleet(("cluster-a", full)))
    assert decision.never is not None  # 4 slots on the whole member, 5 pods
    roomy = [dataclasses.replace(n, pods_allocatable=3) for n in full]
    assert place_gang(g, fleet(("cluster-a", roomy))).never is None  # 6 slots once empty


def test_an_unreachable_or_health_tainted_member_may_still_hold_it() -> None:
    small = ("cluster-a", [cpu_node("a1", 8)])
    big = [cpu_node("b1", 64)]
    away = fleet(small) + [ClusterSnapshot("cluster-b", nodes=big, reachable=False)]
    assert place_gang(one_pod(40), away).never is None
    sick = fleet(small) + [ClusterSnapshot(
        "cluster-b", nodes=big, taints=(Taint("cluster.karmada.io/not-ready", "", "NoSchedule"),)
    )]
    assert place_gang(one_pod(40), sick).never is None


def test_a_configured_cluster_taint_not_tolerated_is_never_for_that_member() -> None:
    big = ClusterSnapshot("cluster-b", nodes=[cpu_node("b1", 64)],
                          taints=(Taint("dedicated", "infra", "NoSchedule"),))
    decision = place_gang(one_pod(40), fleet(("cluster-a", [cpu_node("a1", 8)])) + [big])
    assert decision.never is not None
    assert "cluster-b: cluster taint dedicated=infra:NoSchedule" in decision.never.message


def test_fragmented_now_but_fits_empty_is_not_never() -> None:
    pods = tuple(GangPod("worker", i, {"cpu": 2000}) for i in range(4))
    frag = [cpu_node(f"n{i}", 4, used=3) for i in range(4)]
    decision = place_gang(Gang(pods, priority=0), fleet(("cluster-a", frag)))
    assert decision.ranked == [] and decision.never is None


def test_the_gang_total_beyond_all_allocatable_is_never() -> None:
    pods = tuple(GangPod("worker", i, {"cpu": 6000}) for i in range(3))
    nodes = [cpu_node("a1", 8), cpu_node("a2", 8)]  # each pod fits a node, 2 of 3 fit
    decision = place_gang(Gang(pods, priority=0), fleet(("cluster-a", nodes)))
    assert decision.never is not None
    assert "cluster-a:" in decision.never.message


def _emptied(snap: ClusterSnapshot) -> ClusterSnapshot:
    nodes = [dataclasses.replace(n, requested={}, pods_used=0) for n in snap.nodes]
    return ClusterSnapshot(snap.name, nodes=nodes)


@settings(max_examples=examples(300), deadline=None)
@given(gang=gangs(), snaps=st.lists(snapshots(), min_size=1, max_size=3))
def test_fits_now_implies_ever_fits_and_never_implies_not_even_empty(
    gang: Gang, snaps: list[ClusterSnapshot]
) -> None:
    """Per member: a gang placed now always ever-fits; a gang that never-fits there is
    placed neither now nor on the same member with every node empty. For the fleet:
    ``never`` only when nothing fits now."""
    for i, s in enumerate(snaps):
        s.name = f"cluster-{i}"
    decision = place_gang(gang, snaps)
    placed = {c.cluster for c in decision.ranked}
    for snap in snaps:
        never = ever_fits_cluster(gang, snap)
        if snap.name in placed:
            assert never is None, (snap.name, never)
        if never is not None:
            assert snap.name not in placed
            assert place_gang(gang, [_emptied(snap)]).ranked == []
            assert never.message and "\n" not in never.message
    if decision.never is not None:
        assert decision.ranked == []
        assert all(ever_fits_cluster(gang, s) is not None for s in snaps)
        assert never_fits(gang, [_emptied(s) for s in snaps]) is not None
    if placed:
        assert decision.ever_fits
