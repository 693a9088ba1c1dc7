"""Property tests: placement never offers a cluster where the gang does not really fit."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetq.capacity import ClusterSnapshot, NodeCapacity, Taint
from fleetq.models import Gang, GangPod
from fleetq.placement import estimate_sum_of_free, fits_node_by_node, place_gang

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
)
def test_fleet_decision_equals_cluster_by_cluster_decision(
    gang: Gang, snaps: list[ClusterSnapshot], versioned: list[bool]
) -> None:
    """The whole fleet is packed at once; every cluster must get exactly what the
    one-cluster check gives it (same assignment, same reason) whatever else is in the
    fleet, with the documented score, cold or with warm caches."""
    for i, s in enumerate(snaps):
        s.name = f"cluster-{i}"
        s.resource_version = "v1" if versioned[i] else ""
    decision = place_gang(gang, snaps)
    assert place_gang(gang, snaps) == decision  # warm caches
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
