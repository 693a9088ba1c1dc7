"""Gang placement: node-by-node fit, filters, scoring and the reasons users read."""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetq.capacity import ClusterSnapshot, NodeCapacity, Taint
from fleetq.models import ClusterAffinity, Gang, GangPod, Toleration, gang_of, parse_job
from fleetq.placement import (
    ClusterColumns,
    PlacementIndex,
    columns_of,
    estimate_sum_of_free,
    fits_node_by_node,
    forget,
    place_gang,
    tolerates,
)
from fleetq.rejection import Rejection, RejectionCode, Severity

GI = (1 << 30) * 1000
MANIFESTS = Path(__file__).resolve().parents[2] / "examples"


def node(name: str, cpu: float, mem_gi: int = 64, **kw: Any) -> NodeCapacity:
    alloc = {"cpu": int(cpu * 1000), "memory": mem_gi * GI}
    alloc.update(kw.pop("extra", {}))
    return NodeCapacity(name, alloc, **kw)


def cluster(name: str, *nodes: NodeCapacity, **kw: Any) -> ClusterSnapshot:
    return ClusterSnapshot(name, nodes=list(nodes), **kw)


def gang(workers: int, cpu: float = 2, mem_gi: int = 2, master_cpu: float = 1, **pod: Any) -> Gang:
    pods = [GangPod("master", 0, {"cpu": int(master_cpu * 1000), "memory": GI}, **pod)]
    pods += [
        GangPod("worker", i, {"cpu": int(cpu * 1000), "memory": mem_gi * GI}, **pod)
        for i in range(workers)
    ]
    return Gang(tuple(pods), priority=0)


def walkthrough_gang() -> Gang:
    doc = yaml.safe_load((MANIFESTS / "pytorch-test.yaml").read_text())
    return gang_of(parse_job(doc))


# --------------------------------------------------------------------------- node by node


def test_sum_of_free_says_yes_but_node_by_node_says_no() -> None:
    # 8 nodes with 1.5 free cpu each: 12 cpu in total, but no node takes a 2-cpu worker.
    frag = cluster("cluster-b", *(node(f"b{i}", 1.5) for i in range(8)))
    g = walkthrough_gang()
    assert estimate_sum_of_free(g, [frag]).best is not None
    decision = place_gang(g, [frag])
    assert decision.best is None
    assert decision.rejections["cluster-b"] == "worker-0 needs cpu 2, largest free node has 1.5"
    assert "cluster-b: worker-0 needs cpu 2, largest free node has 1.5" in decision.summary()
    why = decision.reasons["cluster-b"]
    assert why.code is RejectionCode.INSUFFICIENT_NODE_RESOURCE
    assert why.params == {
        "pod": "worker-0", "resource": "cpu", "request": 2000, "largest_free": 1500,
        "placed": 0, "pods": 3,
    }
    assert not why.retryable  # no node is that large, even empty


def test_walkthrough_gang_lands_whole_on_one_cluster_with_verified_assignment() -> None:
    g = walkthrough_gang()
    assert [p.name_suffix for p in g.pods] == ["master-0", "worker-0", "worker-1"]
    a = cluster("cluster-a", node("a1", 4, 8), node("a2", 4, 8))
    decision = place_gang(g, [a])
    assert decision.best is not None
    assignment = decision.best.assignment
    assert set(assignment) == {"master-0", "worker-0", "worker-1"}
    # Two 2-cpu workers fill one 4-cpu node; the master (10m) goes to the other.
    assert assignment["worker-0"] == assignment["worker-1"]
    assert assignment["master-0"] != assignment["worker-0"]


def test_fragmentation_reason_reports_pods_already_placed() -> None:
    # 8.5 cpu free in total for 8.5 requested, but only 3 of the 2-cpu workers fit.
    c = cluster("c", node("n1", 4), node("n2", 3), node("n3", 1.5))
    g = gang(4, master_cpu=0.5)
    assert estimate_sum_of_free(g, [c]).best is not None
    result = fits_node_by_node(g, c)
    assert result == "worker-3 needs cpu 2, largest free node has 1.5 (3 of 5 pods placed)"


def test_requested_resources_already_in_use_are_respected() -> None:
    busy = node("n1", 8, requested={"cpu": 7000})
    c = cluster("c", busy)
    assert fits_node_by_node(gang(0, master_cpu=1), c) == {"master-0": "n1"}
    assert isinstance(fits_node_by_node(gang(0, master_cpu=1.5), c), str)


def test_missing_resource_is_named() -> None:
    g = Gang((GangPod("master", 0, {"cpu": 1000, "nvidia.com/gpu": 1000}),), 0)
    result = fits_node_by_node(g, cluster("c", node("n1", 8)))
    assert result == "master-0 needs nvidia.com/gpu 1, no node has any"


def test_request_larger_than_any_node_is_named() -> None:
    result = fits_node_by_node(gang(0, master_cpu=32), cluster("c", node("n1", 16)))
    assert result == "master-0 needs cpu 32, largest free node has 16"


def test_node_selector_must_match() -> None:
    g = gang(1, node_selector={"gpu": "a100"})
    plain = cluster("cluster-a", node("n1", 16))
    assert fits_node_by_node(g, plain) == "no node matches nodeSelector gpu=a100 for master-0"
    labelled = cluster("cluster-a", node("n1", 16), node("n2", 16, labels={"gpu": "a100"}))
    assert fits_node_by_node(g, labelled) == {"master-0": "n2", "worker-0": "n2"}


def test_unschedulable_nodes_are_never_used() -> None:
    c = cluster("c", node("n1", 16, unschedulable=True))
    assert fits_node_by_node(gang(1), c) == "no schedulable node for master-0 (1 cordoned)"
    c2 = cluster("c", node("n1", 16, unschedulable=True), node("n2", 16))
    assert fits_node_by_node(gang(1), c2) == {"master-0": "n2", "worker-0": "n2"}


def test_pod_slots_are_counted() -> None:
    c = cluster("c", node("n1", 64, pods_allocatable=110, pods_used=108))
    assert isinstance(fits_node_by_node(gang(1), c), dict)
    # Workers (the larger pods) are placed first and take the last two slots.
    result = fits_node_by_node(gang(2), c)
    assert (
        result
        == "master-0 needs a pod slot, all 1 nodes it could use are full (2 of 3 pods placed)"
    )


def test_tainted_nodes_need_tolerations() -> None:
    t = Taint("nvidia.com/gpu", "present", "NoSchedule")
    c = cluster("c", node("g1", 16, taints=(t,)))
    result = fits_node_by_node(gang(1), c)
    assert isinstance(result, str)
    assert "does not tolerate" in result and "nvidia.com/gpu=present:NoSchedule" in result
    tol = ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},)
    assert isinstance(fits_node_by_node(gang(1, tolerations=tol), c), dict)


def test_prefer_no_schedule_taint_does_not_block() -> None:
    c = cluster("c", node("n1", 16, taints=(Taint("spot", "true", "PreferNoSchedule"),)))
    assert isinstance(fits_node_by_node(gang(1), c), dict)


@pytest.mark.parametrize(
    ("toleration", "taint", "expected"),
    [
        ({"operator": "Exists"}, Taint("anything", "x", "NoExecute"), True),  # empty key + Exists
        ({"operator": "Exists", "effect": "NoSchedule"}, Taint("k", "v", "NoExecute"), False),
        ({"key": "k", "operator": "Exists"}, Taint("k", "v", "NoSchedule"), True),
        ({"key": "k", "operator": "Equal", "value": "v"}, Taint("k", "v", "NoSchedule"), True),
        ({"key": "k", "value": "v"}, Taint("k", "v", "NoSchedule"), True),  # default Equal
        ({"key": "k", "operator": "Equal", "value": "w"}, Taint("k", "v", "NoSchedule"), False),
        ({"key": "k", "operator": "Equal"}, Taint("k", "", "NoSchedule"), True),
        ({"key": "other", "operator": "Exists"}, Taint("k", "v", "NoSchedule"), False),
        ({"key": "k", "value": "v", "effect": "NoExecute"}, Taint("k", "v", "NoExecute"), True),
        ({"key": "k", "operator": "Bogus"}, Taint("k", "", "NoSchedule"), False),
    ],
)
def test_toleration_matching_follows_kubernetes(
    toleration: dict[str, str], taint: Taint, expected: bool
) -> None:
    assert tolerates(toleration, taint) is expected


def test_pydantic_tolerations_match_like_dicts() -> None:
    assert tolerates(Toleration(key="k", operator="Exists"), Taint("k", "v", "NoSchedule"))
    assert not tolerates(Toleration(key="k", value="w"), Taint("k", "v", "NoSchedule"))


def test_larger_pods_placed_first_so_gang_fits() -> None:
    # Big worker (6 cpu) must take n1; small master must then fit on n2. Placing the
    # master first on the most-allocated node (n1) would strand the worker.
    c = cluster("c", node("n1", 8, requested={"cpu": 1000}), node("n2", 2))
    result = fits_node_by_node(gang(1, cpu=6, master_cpu=1), c)
    assert isinstance(result, dict)
    assert result["worker-0"] == "n1"


def test_returned_assignment_never_overcommits_a_node() -> None:
    c = cluster("c", *(node(f"n{i}", 4 + i, requested={"cpu": 500 * i}) for i in range(6)))
    g = gang(7, cpu=2, mem_gi=8, master_cpu=3)
    result = fits_node_by_node(g, c)
    assert isinstance(result, dict)
    use: dict[str, dict[str, int]] = {}
    by_name = {p.name_suffix: p for p in g.pods}
    for pod, node_name in result.items():
        for k, v in by_name[pod].requests.items():
            use.setdefault(node_name, {}).setdefault(k, 0)
            use[node_name][k] += v
    for n in c.nodes:
        for k, v in use.get(n.name, {}).items():
            assert v <= n.allocatable[k] - n.requested.get(k, 0)


# --------------------------------------------------------------------------- cluster filters


def test_unreachable_and_excluded_clusters_are_rejected_with_reasons() -> None:
    g = gang(1)
    down = cluster("cluster-d", node("n", 16), reachable=False)
    evicted = cluster("cluster-c", node("n", 16))
    ok = cluster("cluster-a", node("n", 16))
    decision = place_gang(g, [down, evicted, ok], exclude={"cluster-c"})
    assert decision.best is not None and decision.best.cluster == "cluster-a"
    assert decision.rejections == {
        "cluster-c": "excluded (evicted)",
        "cluster-d": "unreachable",
    }


def test_cluster_affinity_filters() -> None:
    g = gang(1)
    a = cluster("cluster-a", node("n", 16), labels={"region": "eu"})
    b = cluster("cluster-b", node("n", 16), labels={"region": "us"})
    c = cluster("cluster-c", node("n", 16), labels={"region": "eu"})
    names = ClusterAffinity(clusterNames=["cluster-a", "cluster-b"], exclude=["cluster-b"])
    d1 = place_gang(g, [a, b, c], affinity=names)
    assert [x.cluster for x in d1.ranked] == ["cluster-a"]
    assert d1.rejections["cluster-b"] == "excluded by clusterAffinity.exclude"
    assert d1.rejections["cluster-c"] == "not in clusterAffinity.clusterNames"
    labels = ClusterAffinity.model_validate({"labelSelector": {"matchLabels": {"region": "eu"}}})
    d2 = place_gang(g, [a, b, c], affinity=labels)
    assert [x.cluster for x in d2.ranked] == ["cluster-a", "cluster-c"]
    assert d2.rejections["cluster-b"] == "labels do not match clusterAffinity.labelSelector"


def test_cluster_taints_need_cluster_tolerations() -> None:
    g = gang(1)
    tainted = cluster("cluster-t", node("n", 16), taints=(Taint("maintenance", "", "NoSchedule"),))
    d = place_gang(g, [tainted])
    assert d.rejections["cluster-t"] == (
        "cluster taint maintenance:NoSchedule not tolerated by clusterTolerations"
    )
    d2 = place_gang(
        g, [tainted], cluster_tolerations=[Toleration(key="maintenance", operator="Exists")]
    )
    assert d2.best is not None and d2.best.cluster == "cluster-t"


def test_duplicate_cluster_names_are_an_error() -> None:
    with pytest.raises(ValueError, match="'x': name is given twice"):
        place_gang(gang(1), [cluster("x", node("n", 4)), cluster("x", node("n", 4))])


# --------------------------------------------------------------------------- scoring


def test_identical_clusters_tie_break_by_name() -> None:
    g = gang(2)
    clusters = [cluster(n, node("n1", 8), node("n2", 8)) for n in ("zeta", "alpha", "mid")]
    decision = place_gang(g, clusters)
    assert [c.cluster for c in decision.ranked] == ["alpha", "mid", "zeta"]
    assert len({c.score for c in decision.ranked}) == 1
    assert decision.summary().startswith("alpha (score ")


def test_scoring_prefers_the_cluster_the_gang_packs_into_tightly() -> None:
    g = gang(3, cpu=2, mem_gi=2, master_cpu=2)  # 8 cpu in total
    snug = cluster("cluster-z", node("n1", 8, 16))  # the gang fills the node exactly
    roomy = cluster("cluster-a", node("n1", 64, 256))
    decision = place_gang(g, [roomy, snug])
    assert [c.cluster for c in decision.ranked] == ["cluster-z", "cluster-a"]
    assert decision.ranked[0].score > decision.ranked[1].score


def test_gang_fills_most_allocated_nodes_first() -> None:
    c = cluster("c", node("empty", 8), node("busy", 8, requested={"cpu": 6000, "memory": 60 * GI}))
    assert fits_node_by_node(gang(0, master_cpu=2), c) == {"master-0": "busy"}


def test_summary_without_any_fit() -> None:
    d = place_gang(gang(1), [cluster("cluster-d", reachable=False)])
    assert d.best is None
    assert d.summary() == "no cluster fits; rejected: cluster-d: unreachable"


def test_sum_of_free_estimate_rejects_on_totals() -> None:
    d = estimate_sum_of_free(gang(10), [cluster("small", node("n1", 4), node("n2", 4))])
    assert d.rejections["small"] == "needs cpu 21 in total, 8 free summed over 2 schedulable nodes"
    assert (
        place_gang(gang(10), [cluster("small", node("n1", 4))])
        .rejections["small"]
        .startswith("needs cpu 21 in total")
    )


# --------------------------------------------------------------------------- columnar cache


def test_columns_cached_per_resource_version_and_forgettable() -> None:
    index = PlacementIndex()
    snap = cluster("c", node("n1", 4), resource_version="1")
    first = columns_of(snap, index)
    assert columns_of(snap, index) is first
    assert columns_of(snap) is not first  # without an index: built afresh
    snap.nodes[0].requested = {"cpu": 4000}
    snap.resource_version = "2"  # whoever mutates in place changes the version
    second = columns_of(snap, index)
    assert second is not first
    assert isinstance(fits_node_by_node(gang(0), snap, index), str)
    forget(snap, index)
    assert columns_of(snap, index) is not second


def test_snapshots_without_resource_version_are_never_stale() -> None:
    snap = cluster("c", node("n1", 4))
    assert isinstance(fits_node_by_node(gang(0), snap), dict)
    snap.nodes[0].requested = {"cpu": 4000}
    assert isinstance(fits_node_by_node(gang(0), snap), str)


def test_a_new_snapshot_of_a_cluster_reuses_what_did_not_change() -> None:
    """The capacity cache hands over a new snapshot whose unchanged nodes are the same
    objects: the view of those nodes is reused, a renewed node is seen as it is now, and
    a node changed in place (then forgotten) is never mistaken for an unchanged one."""
    index = PlacementIndex()
    a, b, c = node("a", 8), node("b", 4, requested={"cpu": 1000}), node("c", 16)
    first = cluster("cluster-r", a, b, c, resource_version="1")
    view = columns_of(first, index)
    assert columns_of(cluster("cluster-r", a, b, c, resource_version="2"), index) is view
    assert fits_node_by_node(gang(0, master_cpu=3), first, index) == {"master-0": "b"}
    full = node("b", 4, requested={"cpu": 4000})  # a pod started on b: a new object
    second = cluster("cluster-r", a, full, c, resource_version="3")
    assert fits_node_by_node(gang(0, master_cpu=3), second, index) == {"master-0": "a"}
    a.requested = {"cpu": 8000}  # changed in place (against the rules), then forgotten
    forget(second, index)
    third = cluster("cluster-r", a, full, c, resource_version="5")
    assert fits_node_by_node(gang(0, master_cpu=3), third, index) == {"master-0": "c"}
    assert fits_node_by_node(gang(0, master_cpu=3), second, index) == {"master-0": "c"}


def test_columns_hold_free_resources_and_slots() -> None:
    cols = ClusterColumns.from_snapshot(
        cluster("c", node("n1", 4, requested={"cpu": 5000}, pods_used=3, pods_allocatable=10))
    )
    assert cols.free[cols.res_index["cpu"]].tolist() == [0]  # overcommitted clips to 0
    assert cols.slots.tolist() == [7]


# --------------------------------------------------------------------------- fleet-wide pass


def test_fleet_cache_goes_stale_with_its_snapshots() -> None:
    g = gang(1)
    index = PlacementIndex()
    a = cluster("cluster-a", node("a1", 8), resource_version="1")
    b = cluster("cluster-b", node("b1", 64), resource_version="1")
    assert place_gang(g, [a, b], index=index).best is not None
    ranked = place_gang(g, [a, b], index=index).ranked
    assert [c.cluster for c in ranked] == ["cluster-a", "cluster-b"]
    a.nodes[0].requested = {"cpu": 8000}
    a.resource_version = "2"
    after = place_gang(g, [a, b], index=index)
    assert [c.cluster for c in after.ranked] == ["cluster-b"]
    assert after.rejections["cluster-a"].startswith("needs cpu 3 in total")
    b.nodes[0].requested = {"cpu": 64000}  # mutated in place, version kept: forget() it
    forget(b, index)
    assert place_gang(g, [a, b], index=index).best is None


def test_decisions_in_parallel_while_clusters_change_equal_cold_decisions() -> None:
    """Placement runs in activity threads; the cached fleet view is patched in place only
    when no decision is using it. Several threads placing while clusters change must each
    get exactly the decision a cold build gives for the snapshots they passed."""
    rng = random.Random(19)

    def snapshot(c: int, version: int) -> ClusterSnapshot:
        nodes = [
            node(f"c{c}-n{i}", rng.choice([4, 8, 16]), requested={"cpu": rng.randrange(0, 9000)},
                 pods_used=rng.randrange(0, 4), pods_allocatable=4)
            for i in range(rng.randrange(3, 8))
        ]
        return cluster(f"cluster-{c}", *nodes, resource_version=f"v{version}")

    fleet = [snapshot(c, 0) for c in range(8)]
    index = PlacementIndex(threading.Lock)  # one index, as the scheduling activities own
    lock = threading.Lock()
    gangs = [gang(2), gang(5, cpu=1), gang(3, cpu=4)]
    mismatches: list[tuple[int, int]] = []

    def work(seed: int) -> None:
        for step in range(60):
            with lock:
                if rng.random() < 0.4:
                    c = rng.randrange(len(fleet))
                    fleet[c] = snapshot(c, seed * 1000 + step)
                snaps = list(fleet)
                g = gangs[rng.randrange(len(gangs))]
            cold = [cluster(s.name, *s.nodes) for s in snaps]  # no version: built afresh
            if place_gang(g, snaps, index=index) != place_gang(g, cold):
                mismatches.append((seed, step))

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert mismatches == []


def test_clusters_with_different_group_orders_in_one_fleet() -> None:
    # The worker (1 gpu) dominates on a cluster with 1-gpu nodes, the master (4 cpu) on
    # one with 4-cpu, 8-gpu nodes; each is packed in its own order, as when alone.
    worker = {"cpu": 1000, "memory": GI, "nvidia.com/gpu": 1000}
    g = Gang(
        (GangPod("master", 0, {"cpu": 4000, "memory": GI}), GangPod("worker", 0, worker)),
        priority=0,
    )
    gpu1 = {"nvidia.com/gpu": 1000}
    gpu8 = {"nvidia.com/gpu": 8000}
    x = cluster("cluster-x", node("x1", 8, extra=gpu1), node("x2", 4, requested={"cpu": 500}))
    y = cluster("cluster-y", node("y1", 4, extra=gpu8, requested={"cpu": 1000}), node("y2", 4))
    decision = place_gang(g, [x, y])
    assert {c.cluster: c.assignment for c in decision.ranked} == {
        "cluster-x": fits_node_by_node(g, x),
        "cluster-y": fits_node_by_node(g, y),
    }
    assert fits_node_by_node(g, y) == {"master-0": "y2", "worker-0": "y1"}


def test_huge_quantities_are_divided_exactly() -> None:
    # 2q - 1 free holds one copy of q, not two; in float64, (2q - 1) / q rounds to 2.0.
    q = (1 << 52) + 2
    pods = tuple(GangPod(role, 0, {"memory": q}) for role in ("master", "worker"))
    g = Gang(pods, priority=0)
    c = cluster(
        "c",
        NodeCapacity("big", {"memory": 2 * q - 1}),
        NodeCapacity("small", {"memory": q - 1}),
        resource_version="1",
    )
    decision = place_gang(g, [c])
    assert decision.best is None
    assert decision.rejections["c"] == fits_node_by_node(g, c)
    c.nodes.append(NodeCapacity("more", {"memory": q}))
    c.resource_version = "2"
    best = place_gang(g, [c]).best
    assert best is not None and sorted(best.assignment.values()) == ["big", "more"]


def test_absurd_request_is_rejected_with_a_reason() -> None:
    # Columns hold quantities clipped to 2**62 (sound: free only shrinks); a request
    # beyond that fits nowhere, even where the unclipped sums say it might.
    g = Gang(tuple(GangPod(role, 0, {"cpu": 10**30}) for role in ("master", "worker")), 0)
    huge = cluster("huge", NodeCapacity("n1", {"cpu": 3 * 10**30}), resource_version="1")
    small = cluster("small", node("n1", 8), resource_version="1")
    decision = place_gang(g, [huge, small])
    assert decision.best is None
    assert decision.rejections["huge"].startswith("master-0 needs cpu 1000000000000000000000000")
    assert decision.rejections["small"].startswith("needs cpu 2000000000000000000000000")


# --------------------------------------------------------------------------- structured reasons


def _why(g: Gang, c: ClusterSnapshot, **kw: Any) -> Rejection:
    decision = place_gang(g, [c], **kw)
    assert decision.best is None
    return decision.reasons[c.name]


def test_each_check_has_its_code_severity_and_summary() -> None:
    tol = ({"key": "gpu", "operator": "Exists"},)
    gpu = Taint("gpu", "", "NoSchedule")
    cases: list[tuple[Gang, ClusterSnapshot, dict[str, Any], RejectionCode, bool, str]] = [
        (gang(1), cluster("c", reachable=False), {}, RejectionCode.CLUSTER_UNREACHABLE,
         True, "unreachable"),
        (gang(1), cluster("c", node("n", 16)), {"exclude": {"c"}}, RejectionCode.EVICTED,
         False, "excluded"),
        (gang(1), cluster("c", node("n", 16)),
         {"affinity": ClusterAffinity(clusterNames=["other"])},
         RejectionCode.AFFINITY_MISMATCH, False, "not in clusterAffinity.clusterNames"),
        (gang(1), cluster("c", node("n", 16), taints=(gpu,)), {},
         RejectionCode.UNTOLERATED_CLUSTER_TAINT, True,
         "cluster taint gpu:NoSchedule not tolerated by clusterTolerations"),
        (gang(0), cluster("c"), {}, RejectionCode.INSUFFICIENT_CLUSTER_RESOURCE, False,
         "needs cpu; not enough free in the whole cluster"),
        (gang(5), cluster("c", node("n", 16, requested={"cpu": 8000})), {},
         RejectionCode.INSUFFICIENT_CLUSTER_RESOURCE, True,
         "needs cpu; not enough free in the whole cluster"),
        (gang(1), cluster("c", node("n", 16, pods_allocatable=1)), {},
         RejectionCode.INSUFFICIENT_CLUSTER_POD_SLOTS, True,
         "needs pod slots; not enough free in the whole cluster"),
        (Gang((GangPod("master", 0, {"nvidia.com/gpu": 1000}),), 0), cluster("c", node("n", 16)),
         {}, RejectionCode.INSUFFICIENT_CLUSTER_RESOURCE, False,
         "needs nvidia.com/gpu; not enough free in the whole cluster"),
        (gang(1, cpu=3), cluster("c", node("n1", 8, requested={"cpu": 6000}), node("n2", 2)), {},
         RejectionCode.INSUFFICIENT_NODE_RESOURCE, True, "needs cpu; no node has enough free"),
        (gang(1, node_selector={"pool": "gpu"}), cluster("c", node("n", 16)), {},
         RejectionCode.NODE_SELECTOR_MISMATCH, False, "no node matches nodeSelector pool=gpu"),
        (gang(1, node_selector={"pool": "a"}),
         cluster("c", node("n", 16, labels={"pool": "a"}, unschedulable=True), node("m", 16)),
         {}, RejectionCode.NODES_CORDONED, True, "no schedulable node (all cordoned)"),
        (gang(1), cluster("c", node("n", 16, taints=(gpu,))), {},
         RejectionCode.UNTOLERATED_NODE_TAINTS, False,
         "does not tolerate the taints of any node it could use"),
        (gang(1), cluster("c", node("n", 16, taints=(gpu,)), node("m", 16, unschedulable=True)),
         {}, RejectionCode.UNTOLERATED_NODE_TAINTS, True,  # once m is uncordoned, it fits
         "does not tolerate the taints of any node it could use"),
        (gang(1, tolerations=tol), cluster("c", node("n", 16, pods_allocatable=2, pods_used=1)),
         {}, RejectionCode.INSUFFICIENT_CLUSTER_POD_SLOTS, True,
         "needs pod slots; not enough free in the whole cluster"),
        (gang(2, node_selector={"pool": "a"}),
         cluster("c", node("n", 16, labels={"pool": "a"}, pods_allocatable=2), node("m", 16)),
         {}, RejectionCode.NODE_POD_SLOTS_EXHAUSTED, True,
         "needs a pod slot; all usable nodes full"),
        (gang(0, master_cpu=2), cluster("c", node("n", 4, mem_gi=0), node("m", 1)), {},
         RejectionCode.NO_NODE_FITS_ALL, True,
         "needs all its requests on one node; no node has all of them free"),
    ]
    for g, c, kw, code, retryable, summary in cases:
        why = _why(g, c, **kw)
        assert (why.code, why.retryable, why.summary) == (code, retryable, summary), why
        assert why.severity is (Severity.UNSCHEDULABLE if retryable else Severity.UNRESOLVABLE)
        assert str(why) == why.message == place_gang(g, [c], **kw).rejections["c"]


def test_summaries_group_rejections_that_differ_only_in_pods_and_numbers() -> None:
    busy = node("n1", 8, requested={"cpu": 3000})
    small = _why(gang(1, cpu=6), cluster("c", busy, node("n2", 2)))
    large = _why(gang(3, cpu=20), cluster("c", *(node(f"n{i}", 8) for i in range(10))))
    assert small.message != large.message
    assert small.summary == large.summary == "needs cpu; no node has enough free"
    assert (small.retryable, large.retryable) == (True, False)
