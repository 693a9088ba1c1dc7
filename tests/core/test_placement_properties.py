"""Property tests: placement never offers a cluster where the gang does not really fit,
and the engine (the whole fleet at once, with a warm index) decides exactly what the rule
(cluster by cluster, the specification) decides."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetq import placement
from fleetq.capacity import ClusterSnapshot, NodeCapacity, Taint
from fleetq.models import Gang, GangPod
from fleetq.placement import (
    PlacementIndex,
    SchedulingRequest,
    engine,
    estimate_sum_of_free,
    fits_node_by_node,
    place_gang,
    rule,
)
from fleetq.placement.columns import _derived, _node_columns, _node_columns_exact
from tests.tiers import examples

RES = ("cpu", "memory", "nvidia.com/gpu")
LABELS = {"pool": ("a", "b"), "zone": ("1", "2")}
TAINTS = (
    Taint("gpu", "yes", "NoSchedule"),
    Taint("spot", "", "NoExecute"),
    Taint("soft", "x", "PreferNoSchedule"),
)
TOLERATIONS: tuple[dict[str, str], ...] = (
    {"key": "gpu", "operator": "Exists"},
    {"key": "gpu", "operator": "Equal", "value": "no"},
    {"key": "spot", "operator": "Exists", "effect": "NoExecute"},
    {"operator": "Exists"},
)


@st.composite
def resources(draw: st.DrawFn, always: tuple[str, ...] = ("cpu",)) -> dict[str, int]:
    """Multiples of 500 milli-units (coarse, so pods collide on nodes often)."""
    out = {}
    for r in RES:
        if r in always or draw(st.booleans()):
            out[r] = draw(st.integers(min_value=0, max_value=16)) * 500
    return out


@st.composite
def nodes(draw: st.DrawFn, i: int) -> NodeCapacity:
    alloc = draw(resources(always=("cpu", "memory")))
    requested = {k: draw(st.integers(0, v + 1000)) for k, v in alloc.items() if draw(st.booleans())}
    labels = {k: draw(st.sampled_from(v)) for k, v in LABELS.items() if draw(st.booleans())}
    taints = tuple(draw(st.lists(st.sampled_from(TAINTS), max_size=2, unique=True)))
    slots = draw(st.integers(0, 6))
    return NodeCapacity(
        name=f"n{i}",
        allocatable=alloc,
        requested=requested,
        labels=labels,
        taints=taints,
        unschedulable=draw(st.integers(0, 9)) == 0,
        pods_allocatable=slots,
        pods_used=draw(st.integers(0, slots + 1)),
    )


@st.composite
def snapshots(draw: st.DrawFn, name: str = "c") -> ClusterSnapshot:
    n = draw(st.integers(0, 8))
    return ClusterSnapshot(name, nodes=[draw(nodes(i)) for i in range(n)])


@st.composite
def gangs(draw: st.DrawFn) -> Gang:
    shapes = draw(st.lists(st.tuples(resources(), st.integers(1, 5)), min_size=1, max_size=3))
    pods: list[GangPod] = []
    for role_i, (req, count) in enumerate(shapes):
        role = "master" if role_i == 0 else f"role{role_i}"
        count = 1 if role_i == 0 else count
        selector = {k: draw(st.sampled_from(v)) for k, v in LABELS.items() if draw(st.booleans())}
        tols = tuple(draw(st.lists(st.sampled_from(TOLERATIONS), max_size=2)))
        pods += [GangPod(role, i, dict(req), selector, tols) for i in range(count)]
    return Gang(tuple(pods), priority=0)


def _tolerated(taint: Taint, tols: tuple[dict[str, Any], ...]) -> bool:
    for t in tols:
        if t.get("effect") and t["effect"] != taint.effect:
            continue
        if t.get("key") and t["key"] != taint.key:
            continue
        if t.get("operator", "Equal") == "Exists" or t.get("value", "") == taint.value:
            return True
    return False


def check_assignment(gang: Gang, snap: ClusterSnapshot, assignment: Mapping[str, str]) -> None:
    """Recompute per-node usage from scratch and fail on any violated constraint."""
    by_name = {n.name: n for n in snap.nodes}
    assert sorted(assignment) == sorted(p.name_suffix for p in gang.pods)
    use: dict[str, dict[str, int]] = {}
    count: dict[str, int] = {}
    for pod in gang.pods:
        node = by_name[assignment[pod.name_suffix]]
        assert not node.unschedulable
        assert all(node.labels.get(k) == v for k, v in pod.node_selector.items())
        for taint in node.taints:
            if taint.effect in ("NoSchedule", "NoExecute"):
                assert _tolerated(taint, pod.tolerations), (pod, taint)
        acc = use.setdefault(node.name, {})
        for k, v in pod.requests.items():
            acc[k] = acc.get(k, 0) + v
        count[node.name] = count.get(node.name, 0) + 1
    for name, acc in use.items():
        node = by_name[name]
        for k, v in acc.items():
            if v > 0:
                assert v <= node.allocatable.get(k, 0) - node.requested.get(k, 0), (name, k)
        assert count[name] <= node.pods_allocatable - node.pods_used


@settings(max_examples=200, deadline=None)
@given(gang=gangs(), snaps=st.lists(snapshots(), min_size=1, max_size=3))
def test_every_offered_cluster_really_fits(gang: Gang, snaps: list[ClusterSnapshot]) -> None:
    for i, s in enumerate(snaps):
        s.name = f"cluster-{i}"
    decision = place_gang(gang, snaps)
    by_name = {s.name: s for s in snaps}
    assert set(decision.rejections) | {c.cluster for c in decision.ranked} == set(by_name)
    estimate = estimate_sum_of_free(gang, snaps)
    feasible_by_sum = {c.cluster for c in estimate.ranked}
    for choice in decision.ranked:
        check_assignment(gang, by_name[choice.cluster], choice.assignment)
        assert choice.cluster in feasible_by_sum  # node-by-node fit implies the sums fit
    for reason in decision.rejections.values():
        assert reason and "\n" not in reason
    scores = [(-c.score, c.cluster) for c in decision.ranked]
    assert scores == sorted(scores)


def documented_score(gang: Gang, snap: ClusterSnapshot, assignment: Mapping[str, str]) -> float:
    """Utilisation of the nodes the gang lands on, once it is there, averaged over the
    resources it requests (pod slots when it requests nothing)."""
    used = [n for n in snap.nodes if n.name in set(assignment.values())]
    utils = []
    for k, q in gang.total.items():
        alloc = sum(n.allocatable.get(k, 0) for n in used)
        if q > 0 and alloc > 0:
            free = sum(max(0, n.allocatable.get(k, 0) - n.requested.get(k, 0)) for n in used)
            utils.append(1.0 - (free - q) / alloc)
    if utils:
        return sum(utils) / len(utils)
    slots = sum(max(0, n.pods_allocatable - n.pods_used) for n in used)
    return len(gang.pods) / slots if slots else 0.0


@settings(max_examples=150, deadline=None)
@given(
    gang=gangs(),
    snaps=st.lists(snapshots(), min_size=1, max_size=5),
    versioned=st.lists(st.booleans(), min_size=5, max_size=5),
    judge_never=st.booleans(),
)
def test_the_engine_decides_what_the_rule_decides(
    gang: Gang, snaps: list[ClusterSnapshot], versioned: list[bool], judge_never: bool
) -> None:
    """The engine packs the whole fleet at once; it must decide exactly what the rule
    decides cluster by cluster (ranking, assignments, scores, reasons, "never"), cold or
    with a warm index, and every cluster gets what it gets alone, with the documented
    score."""
    for i, s in enumerate(snaps):
        s.name = f"cluster-{i}"
        s.resource_version = "v1" if versioned[i] else ""
    request = SchedulingRequest(gang, snaps, judge_never=judge_never)
    decision = rule.schedule(request)
    index = PlacementIndex()
    assert engine.place(request, index) == decision
    assert engine.place(request, index) == decision  # warm index
    assert place_gang(gang, snaps, judge_never=judge_never) == decision
    estimate = estimate_sum_of_free(gang, snaps)
    for s in snaps:
        alone = place_gang(gang, [s])
        single = fits_node_by_node(gang, s)
        if s.name in decision.reasons:
            why = decision.reasons[s.name]
            assert why.message == estimate.rejections.get(s.name, single)
            if s.name in estimate.reasons:
                assert why == estimate.reasons[s.name]
            assert alone.reasons == {s.name: why}
        else:
            (choice,) = [c for c in decision.ranked if c.cluster == s.name]
            assert choice.assignment == single
            assert alone.ranked == [choice]
            assert choice.score == pytest.approx(documented_score(gang, s, single), abs=1e-8)


@settings(max_examples=100, deadline=None)
@given(gang=gangs(), snap=snapshots(), extra=resources())
def test_single_node_with_room_for_the_whole_gang_is_found(
    gang: Gang, snap: ClusterSnapshot, extra: dict[str, int]
) -> None:
    total = gang.total
    labels: dict[str, str] = {}
    for pod in gang.pods:
        labels.update(pod.node_selector)
    if any(labels.get(k) != v for p in gang.pods for k, v in p.node_selector.items()):
        return  # pods disagree on a label value: no single node can satisfy all of them
    alloc = {k: total.get(k, 0) + extra.get(k, 0) for k in set(total) | set(extra)}
    big = NodeCapacity("big", alloc, labels=labels, pods_allocatable=len(gang.pods), pods_used=0)
    result = fits_node_by_node(gang, ClusterSnapshot("one", nodes=[big]))
    assert isinstance(result, dict), result
    assert set(result.values()) <= {"big"}
    # ... and adding more (possibly useless) nodes never loses that fit.
    snap.nodes.append(big)
    decision = place_gang(gang, [snap])
    assert decision.best is not None, decision.summary()
    check_assignment(gang, snap, decision.best.assignment)


@settings(max_examples=50, deadline=None)
@given(gang=gangs(), snaps=st.lists(snapshots(), min_size=1, max_size=4), data=st.data())
def test_decision_does_not_depend_on_cluster_order(
    gang: Gang, snaps: list[ClusterSnapshot], data: st.DataObject
) -> None:
    for i, s in enumerate(snaps):
        s.name = f"cluster-{i}"
    shuffled = data.draw(st.permutations(snaps))
    a, b = place_gang(gang, snaps), place_gang(gang, shuffled)
    assert a.ranked == b.ranked
    assert a.reasons == b.reasons


@settings(max_examples=150, deadline=None)
@given(gang=gangs(), snap=snapshots())
def test_unresolvable_means_not_even_an_empty_uncordoned_cluster_fits(
    gang: Gang, snap: ClusterSnapshot
) -> None:
    """A rejection may only claim that retrying cannot help when the gang does not fit
    the same nodes with nothing running on them and none cordoned."""
    why = place_gang(gang, [snap]).reasons.get(snap.name)
    if why is None or why.retryable:
        return
    empty = ClusterSnapshot(
        snap.name,
        nodes=[
            NodeCapacity(
                n.name,
                dict(n.allocatable),
                labels=dict(n.labels),
                taints=n.taints,
                pods_allocatable=max(n.pods_allocatable, len(gang.pods)),
            )
            for n in snap.nodes
        ],
    )
    assert place_gang(gang, [empty]).best is None, why


# --------------------------------------------------------------------------- incremental
#
# In a busy fleet some cluster's snapshot changes between any two decisions. The columnar
# views are cached per snapshot and the stacked fleet view is patched for the clusters
# that changed (in place, or copied from a fleet view another decision is using); every
# decision must be exactly the one a cold build gives.


@st.composite
def unordered_nodes(draw: st.DrawFn, i: int) -> NodeCapacity:
    """A node whose resources come in any order, with requests for resources it does not
    offer, negative or huge quantities now and then."""
    node = draw(nodes(i))
    keys = draw(st.permutations(list(node.allocatable)))
    alloc = {k: node.allocatable[k] for k in keys}
    requested = dict(node.requested)
    if draw(st.integers(0, 4)) == 0:
        requested[draw(st.sampled_from(RES))] = draw(st.integers(0, 4000))
    odd = draw(st.integers(0, 9))
    if odd == 0:
        alloc[draw(st.sampled_from(keys))] = draw(st.sampled_from([-500, 1 << 53, 1 << 70]))
    elif odd == 1:
        requested[draw(st.sampled_from(keys))] = draw(st.sampled_from([-500, (1 << 53) + 1]))
    node.allocatable = alloc
    node.requested = requested
    return node


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_vectorised_node_columns_equal_the_exact_ones(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 10))
    snap_nodes = [data.draw(unordered_nodes(i)) for i in range(n)]
    fast = _node_columns(snap_nodes)
    exact = _node_columns_exact(snap_nodes)
    quantities = [
        abs(v)
        for node in snap_nodes
        for d in (node.allocatable, node.requested)
        for v in d.values()
    ]
    if fast is None:
        assert max(quantities) >= 1 << 53
        return
    assert fast.order == exact.order
    assert list(fast.res_index.items()) == list(exact.res_index.items())
    for name in ("alloc", "requested", "slots", "schedulable"):
        a, b = getattr(fast, name), getattr(exact, name)
        assert a.dtype == b.dtype and a.shape == b.shape and (a == b).all(), name
        assert a.flags["C_CONTIGUOUS"], name  # rows are read as rows, as before
    assert (fast.total_free, fast.total_alloc, fast.total_slots) == (
        exact.total_free,
        exact.total_alloc,
        exact.total_slots,
    )


def renewed(node: NodeCapacity, **changes: Any) -> NodeCapacity:
    """A new object for ``node`` with ``changes`` (its dicts copied, as the capacity cache
    makes a node whose aggregates changed); unchanged nodes stay the same object."""
    fields: dict[str, Any] = {
        "name": node.name,
        "allocatable": dict(node.allocatable),
        "requested": dict(node.requested),
        "labels": dict(node.labels),
        "taints": node.taints,
        "unschedulable": node.unschedulable,
        "pods_allocatable": node.pods_allocatable,
        "pods_used": node.pods_used,
    }
    fields.update(changes)
    return NodeCapacity(**fields)


#: changes after which the new view is derived from the last one (not built in full)
DERIVED = frozenset({"pod", "cordon", "label", "taint", "resize"})


@st.composite
def change(draw: st.DrawFn, nodes_: list[NodeCapacity]) -> str:
    """Change ``nodes_`` in place as the capacity cache would after something happened:
    a pod more or less on a node, a node cordoned, relabelled or retainted (each a new
    node object, every other node the same object), a node added or removed, or
    everything different. Returns what happened."""
    what = draw(
        st.sampled_from(
            ["pod", "pod", "pod", "cordon", "label", "taint", "resize", "reorder", "add",
             "remove", "all"]
        )
    )
    if what == "all" or not nodes_:
        nodes_[:] = draw(snapshots()).nodes
        return "all"
    at = draw(st.integers(0, len(nodes_) - 1))
    node = nodes_[at]
    if what == "pod":
        key = draw(st.sampled_from(RES))
        requested = dict(node.requested)
        requested[key] = max(0, requested.get(key, 0) + draw(st.integers(-2000, 2000)))
        pods_used = max(0, node.pods_used + draw(st.sampled_from([-1, 1])))
        nodes_[at] = renewed(node, requested=requested, pods_used=pods_used)
    elif what == "cordon":
        nodes_[at] = renewed(node, unschedulable=not node.unschedulable)
    elif what == "label":
        labels = {k: draw(st.sampled_from(v)) for k, v in LABELS.items() if draw(st.booleans())}
        nodes_[at] = renewed(node, labels=labels)
    elif what == "taint":
        taints = tuple(draw(st.lists(st.sampled_from(TAINTS), max_size=2, unique=True)))
        nodes_[at] = renewed(node, taints=taints)
    elif what == "resize":  # same resources, new amounts
        alloc = {k: draw(st.integers(0, 16)) * 500 for k in node.allocatable}
        nodes_[at] = renewed(node, allocatable=alloc)
    elif what == "reorder":  # same amounts, resources in another order
        nodes_[at] = renewed(node, allocatable=dict(reversed(node.allocatable.items())))
    elif what == "add":
        nodes_.append(draw(nodes(len(nodes_) + 100)))
    else:
        nodes_.pop(at)
    return what


@st.composite
def changed(draw: st.DrawFn, snap: ClusterSnapshot, version: int) -> ClusterSnapshot:
    """``snap`` as the capacity cache would hand it over after something happened
    (:func:`change`): a new snapshot object and node list, sometimes reachable no more
    (or again)."""
    nodes_ = list(snap.nodes)
    draw(change(nodes_))
    reachable = snap.reachable if draw(st.integers(0, 9)) else not snap.reachable
    return ClusterSnapshot(
        snap.name, nodes=nodes_, reachable=reachable, resource_version=f"v{version}"
    )


def assert_same_columns(a: placement.ClusterColumns, b: placement.ClusterColumns) -> None:
    """Two views of the same nodes are equal field by field (arrays by dtype, shape and
    value; shares bit for bit), taints by what each node has, and every label mask
    ``a`` memoises equals the one ``b`` computes."""
    arrays = ("alloc", "requested", "free", "free_alloc", "slots", "schedulable", "order",
              "untainted", "names_arr", "names_snap")
    for name in arrays:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert x.tolist() == y.tolist(), name
        assert x.flags["C_CONTIGUOUS"] == y.flags["C_CONTIGUOUS"], name
    for name in ("names", "resources", "max_alloc", "max_free", "class_key", "labels",
                 "labels_snap", "total_free", "total_alloc", "total_slots"):
        assert getattr(a, name) == getattr(b, name), name
    assert list(a.res_index.items()) == list(b.res_index.items())
    assert len(a.nodes) == len(b.nodes) and all(map(lambda x, y: x is y, a.nodes, b.nodes))
    assert a.taint_groups.keys() == b.taint_groups.keys()
    for key, idx in a.taint_groups.items():
        other = b.taint_groups[key]
        assert idx.dtype == other.dtype and idx.tolist() == other.tolist(), key

    def hard(v: placement.ClusterColumns) -> list[Any]:
        by_code = {c: k for k, c in v.taint_index.items()}
        return [by_code.get(c) for c in v.taint_code.tolist()]

    assert hard(a) == hard(b)
    assert (a.raw is None) == (b.raw is None)
    if a.raw is not None and b.raw is not None:
        for name in ("alloc", "requested", "pods", "share", "schedulable"):
            x, y = getattr(a.raw, name), getattr(b.raw, name)
            assert x.dtype == y.dtype and x.shape == y.shape, name
            assert x.tobytes() == y.tobytes(), name
    for memo_key, mask in a.memo.items():
        if isinstance(memo_key, tuple) and memo_key[0] == "label":
            _tag, label, value = memo_key
            assert mask.tolist() == b.label_mask(label, value).tolist(), memo_key


def cold(snaps: list[ClusterSnapshot]) -> list[ClusterSnapshot]:
    """The same snapshots without a resource version: every view is built from scratch."""
    return [
        ClusterSnapshot(s.name, s.labels, s.taints, s.nodes, s.reservation, s.reachable, "")
        for s in snaps
    ]


@settings(max_examples=120, deadline=None)
@given(
    gang_list=st.lists(gangs(), min_size=1, max_size=2),
    first=st.lists(snapshots(), min_size=2, max_size=6),
    data=st.data(),
)
def test_decisions_after_clusters_change_equal_cold_decisions(
    gang_list: list[Gang], first: list[ClusterSnapshot], data: st.DataObject
) -> None:
    """Random sequences of cluster changes (one or several clusters per step, sometimes
    while another decision holds the fleet view): each decision with the warm index equals
    the rule's on the same snapshots built afresh."""
    index = PlacementIndex()

    def spec(gang: Gang, snaps: list[ClusterSnapshot]) -> placement.PlacementDecision:
        return rule.schedule(SchedulingRequest(gang, cold(snaps)))

    snaps = [
        ClusterSnapshot(f"cluster-{i}", nodes=s.nodes, resource_version="v0")
        for i, s in enumerate(first)
    ]
    for step in range(1, data.draw(st.integers(1, 8)) + 1):
        gang = data.draw(st.sampled_from(gang_list))
        busy = None
        if data.draw(st.integers(0, 3)) == 0:  # another decision is using the fleet view
            views = tuple(index.columns_of(s) for s in snaps if s.reachable)
            busy = index.fleet_of(views, True) if views else None
        try:
            assert place_gang(gang, snaps, index=index) == spec(gang, snaps)
        finally:
            if busy is not None:
                index.release(busy)
        which = data.draw(
            st.lists(st.integers(0, len(snaps) - 1), min_size=1, max_size=2, unique=True)
        )
        for c in which:
            snaps[c] = data.draw(changed(snaps[c], step))
        assert place_gang(gang, snaps, index=index) == spec(gang, snaps)
        for s in snaps:
            assert_same_columns(index.columns_of(s), placement.ClusterColumns(s))


@settings(max_examples=examples(150), deadline=None)
@given(gang=gangs(), data=st.data())
def test_views_derived_after_node_changes_equal_full_builds(
    gang: Gang, data: st.DataObject
) -> None:
    """One cluster's snapshots over random changes that reuse the unchanged node objects
    (up to three per step; resource orders differing between nodes, ties in shares,
    now and then a quantity of 2**53 or more): every view equals a full build field by
    field and gives the same decision, and it is derived from the last view, not built
    in full, whenever only pods, cordons, labels, taints or amounts changed."""
    n = data.draw(st.integers(1, 40))
    snap = ClusterSnapshot(
        "derived", nodes=[data.draw(unordered_nodes(i)) for i in range(n)], resource_version="v0"
    )
    index = PlacementIndex()
    prev = index.columns_of(snap)
    assert_same_columns(prev, placement.ClusterColumns(snap))
    for step in range(1, data.draw(st.integers(1, 6)) + 1):
        new_nodes = list(snap.nodes)
        kinds = {data.draw(change(new_nodes)) for _ in range(data.draw(st.integers(1, 3)))}
        snap = ClusterSnapshot("derived", nodes=new_nodes, resource_version=f"v{step}")
        full = placement.ClusterColumns(snap)
        derived = _derived(prev, new_nodes)
        renewed_nodes = [b for a, b in zip(prev.nodes, new_nodes, strict=False) if a is not b]
        ordinary = all(
            abs(v) < 1 << 53
            for b in renewed_nodes
            for d in (b.allocatable, b.requested)
            for v in d.values()
        )
        if kinds <= DERIVED and prev.raw is not None and ordinary:
            assert derived is not None, kinds
        if derived is not None:
            assert_same_columns(derived, full)
        view = index.columns_of(snap)
        assert_same_columns(view, full)
        assert place_gang(gang, [snap], index=index) == place_gang(gang, cold([snap]))
        prev = view
