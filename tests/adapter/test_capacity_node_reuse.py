"""The capacity cache's snapshots reuse the node objects of nodes that did not change.

Placement derives a changed cluster's columnar view from the nodes that changed, by
object identity (:meth:`fleetq.placement.ClusterColumns.updated`). That is right only
if the cache hands over the same NodeCapacity object exactly for a node whose info,
requests and pod count are unchanged, and never changes an object it handed over.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from activities.capacity_cache import _State, _Use, condense_node
from fleetq import placement
from fleetq.capacity import NodeCapacity
from tests.core.test_placement_properties import assert_same_columns

NODES = ("n0", "n1", "n2", "n3", "n4")
PODS = ("p0", "p1", "p2", "p3", "p4", "p5")


def node_object(name: str, cpu: int, pool: str, tainted: bool, cordoned: bool) -> dict[str, Any]:
    """A Node as the member's API serves it."""
    taints = [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}] if tainted else []
    return {
        "metadata": {"name": name, "labels": {"pool": pool}},
        "spec": {"taints": taints, "unschedulable": cordoned},
        "status": {"allocatable": {"cpu": str(cpu), "memory": "64Gi", "pods": "8"}},
    }


def values(n: NodeCapacity) -> tuple[Any, ...]:
    """What placement reads of a node (requests of 0 are no requests)."""
    return (
        n.name, dict(n.allocatable), {k: v for k, v in n.requested.items() if v},
        dict(n.labels), n.taints, n.unschedulable, n.pods_allocatable, n.pods_used,
    )


def fresh_build(state: _State) -> list[NodeCapacity]:
    """The same state built from scratch (a fresh LIST of everything)."""
    other = _State()
    other.nodes = dict(state.nodes)
    for kind in ("pods", "reservations"):
        other.replace(kind, state.uses[kind])
    return other.build("c", {}, (), True, "rv").nodes


events = st.one_of(
    st.tuples(
        st.just("node"), st.sampled_from(NODES), st.integers(1, 8),
        st.sampled_from(["a", "b"]), st.booleans(), st.booleans(),
    ),
    st.tuples(st.just("node-gone"), st.sampled_from(NODES)),
    st.tuples(
        st.just("pod"), st.sampled_from(PODS), st.sampled_from(NODES), st.integers(0, 4),
    ),
    st.tuples(st.just("pod-gone"), st.sampled_from(PODS)),
    st.tuples(
        st.just("reservation"), st.sampled_from(PODS), st.sampled_from(NODES),
        st.integers(0, 4),
    ),
    st.tuples(st.just("relist-nodes")),
)


def apply(state: _State, event: tuple[Any, ...]) -> set[str]:
    """Apply one watch event (or re-LIST) as the cache does; the node names it touched."""
    kind = event[0]
    if kind == "node":
        _k, name, cpu, pool, tainted, cordoned = event
        info = condense_node(node_object(name, cpu, pool, tainted, cordoned))
        if state.nodes.get(name) == info:
            return set()
        state.nodes[name] = info
        return {name}
    if kind == "node-gone":
        return {event[1]} if state.nodes.pop(event[1], None) is not None else set()
    if kind == "relist-nodes":  # new, equal objects for every node
        state.nodes = {n: dataclasses.replace(i) for n, i in state.nodes.items()}
        return set()
    table = "reservations" if kind == "reservation" else "pods"
    old = state.uses[table].get(event[1])
    use = None if kind == "pod-gone" else _Use(event[2], {"cpu": event[3] * 500}, kind == "pod")
    state.set_use(table, event[1], use)
    return {u.node for u in (old, use) if u is not None}


@settings(max_examples=150, deadline=None)
@given(steps=st.lists(st.lists(events, min_size=1, max_size=3), min_size=1, max_size=10))
def test_unchanged_nodes_are_the_same_objects_and_snapshots_equal_fresh_ones(
    steps: list[list[tuple[Any, ...]]],
) -> None:
    state = _State()
    for name in NODES[:3]:
        state.nodes[name] = condense_node(node_object(name, 4, "a", False, False))
    prev = state.build("c", {}, (), True, "rv-0")
    index = placement.PlacementIndex()  # as the scheduling activities keep one
    index.columns_of(prev)
    for version, step in enumerate(steps, start=1):
        before = [values(n) for n in prev.nodes]
        touched: set[str] = set()
        for event in step:
            touched |= apply(state, event)
        snap = state.build("c", {}, (), True, f"rv-{version}")
        assert [values(n) for n in snap.nodes] == [values(n) for n in fresh_build(state)]
        assert [values(n) for n in prev.nodes] == before  # handed-over objects never change
        old = {n.name: n for n in prev.nodes}
        for n in snap.nodes:
            if n.name in old and n.name not in touched:
                assert n is old[n.name], n.name
        view = index.columns_of(snap)  # derived from the last view
        assert_same_columns(view, placement.ClusterColumns(snap))
        prev = snap
