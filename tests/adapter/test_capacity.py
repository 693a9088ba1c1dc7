"""Capacity snapshots: what placement sees of a member, fed by watches."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from activities.fleet import Fleet
from fleetq.capacity import ClusterSnapshot
from fleetq.messages import BindRequest, JobRef, PodReservation, ReserveRequest
from fleetq.resources import CPU, fits

from .conftest import eventually, manifest, member, on_reservation_members


def _view(s: ClusterSnapshot) -> dict[str, tuple[Any, ...]]:
    return {
        n.name: (n.allocatable, {k: v for k, v in n.requested.items() if v}, n.pods_used,
                 n.unschedulable, n.taints)
        for n in s.nodes
    }


def test_every_member_has_a_snapshot_with_its_config(fleet: Fleet) -> None:
    snaps = fleet.snapshots()
    assert [s.name for s in snaps] == list(fleet.clusters)
    for s in snaps:
        m = fleet.get(s.name)
        assert s.reachable
        assert s.nodes, f"{s.name} shows no nodes"
        assert s.labels == m.labels and s.reservation == m.reservation
        assert all(n.allocatable.get(CPU, 0) > 0 for n in s.nodes)
    assert [s.name for s in fleet.snapshots(["cluster-b"] if "cluster-b" in fleet.clusters
                                             else list(fleet.clusters)[:1])]


def test_unchanged_cache_returns_the_same_prepared_snapshot(
    fleet: Fleet, names: dict[str, str]
) -> None:
    m = member(fleet, names["c"])
    first = m.capacity()
    assert m.capacity() is first  # O(1): no rebuild while nothing changed


def test_gang_fits_in_the_sum_but_not_node_by_node(
    fleet: Fleet, names: dict[str, str], job_factory: Callable[..., JobRef]
) -> None:
    """Free room summed over nodes hides fragmentation; the snapshot shows it per node,
    and a reservation for a pod bigger than any node's free room fails with a reason."""
    m = member(fleet, names["c"])
    snap = m.capacity()
    free = {n.name: n.free().get(CPU, 0) for n in snap.nodes if not n.unschedulable}
    biggest = max(free, key=lambda n: free[n])
    pod_cpu = free[biggest] + 500  # more than any node has, less than the total
    assert sum(free.values()) >= pod_cpu
    assert not any(fits({CPU: pod_cpu}, n.free()) for n in snap.nodes)
    if not m.reservation:
        return
    job = job_factory("frag")
    res = m.reserve(ReserveRequest(job=job, pods=[
        PodReservation(role="master", index=0, node=biggest, requests={CPU: pod_cpu}),
    ]))
    assert not res.ok
    assert res.reason.startswith(f"reservation master-0 on node {biggest}: Failed")
    assert "cpu" in res.reason


def test_cache_follows_pods_and_reservations_and_matches_a_cold_list(
    fleet: Fleet, names: dict[str, str], job_factory: Callable[..., JobRef]
) -> None:
    m = member(fleet, names["b"])
    before = m.capacity()
    node = before.nodes[0].name
    used_before = before.nodes[0].requested.get(CPU, 0)

    job = job_factory("cache")
    if m.reservation:
        r = m.reserve(ReserveRequest(job=job, pods=[
            PodReservation(role="master", index=0, node=node, requests={CPU: 250}),
        ]))
        assert r.ok, r.reason
        snap = eventually(lambda: m.capacity().nodes[0].requested.get(CPU, 0) == used_before + 250
                          and m.capacity())
        assert snap is not before  # rebuilt because something changed
        m.release_reservations(job)
        eventually(lambda: m.capacity().nodes[0].requested.get(CPU, 0) == used_before)

    m.bind(BindRequest(job=job, manifest=manifest(job, workers=2, cpu="300m")))

    def running() -> bool:
        st = m.status(job)
        return len(st.pods) == 3 and all(p.phase == "Running" for p in st.pods)

    eventually(running)
    total = sum(n.requested.get(CPU, 0) for n in m.capacity().nodes)
    eventually(lambda: _view(m.capacity()) == _view(m.snapshot_by_list()))
    assert total >= 900

    m.purge(job)
    eventually(lambda: sum(n.requested.get(CPU, 0) for n in m.capacity().nodes) == total - 900)
    eventually(lambda: _view(m.capacity()) == _view(m.snapshot_by_list()))


def test_cordoned_node_shows_unschedulable(
    emulator: Any, fleet: Fleet, names: dict[str, str]
) -> None:
    m = member(fleet, names["a"])
    node = m.capacity().nodes[-1].name
    emulator.cordon(names["a"], node, True)
    try:
        eventually(lambda: {n.name: n.unschedulable for n in m.capacity().nodes}[node])
    finally:
        emulator.cordon(names["a"], node, False)
    eventually(lambda: not {n.name: n.unschedulable for n in m.capacity().nodes}[node])


@on_reservation_members
def test_placement_on_live_snapshots_sees_fragmentation_and_reservations(
    emulator: Any, fleet: Fleet, names: dict[str, str], job_factory: Callable[..., JobRef]
) -> None:
    """cluster-c: 2 nodes x 4 cpu, empty. Three 2.5-cpu workers fit the summed free room
    (7.5 <= 8) but not node by node; placement on the cached snapshot says so. A gang that
    does fit is reserved as placed, after which the cache no longer offers that room."""
    from fleetq.models import Gang, GangPod
    from fleetq.placement import estimate_sum_of_free, place_gang

    m = member(fleet, names["c"])

    fragmented = Gang(tuple(GangPod("worker", i, {CPU: 2500}) for i in range(3)), 0)
    snap = m.capacity()
    assert estimate_sum_of_free(fragmented, [snap]).best is not None  # the reference's bug
    decision = place_gang(fragmented, [snap])
    assert decision.best is None and names["c"] in decision.rejections

    fitting = Gang(  # 0.5 + 3 cpu on one node, 3 cpu on the other
        (GangPod("master", 0, {CPU: 500}), *(GangPod("worker", i, {CPU: 3000}) for i in range(2))),
        0,
    )
    choice = place_gang(fitting, [snap]).best
    assert choice is not None
    job = job_factory("placed")
    res = m.reserve(ReserveRequest(job=job, pods=[
        PodReservation(role=p.role, index=p.index, node=choice.assignment[p.name_suffix],
                       requests=p.requests)
        for p in fitting.pods
    ]))
    assert res.ok, res.reason
    after = eventually(lambda: (s := m.capacity()) is not snap
                       and sum(n.requested.get(CPU, 0) for n in s.nodes) >= 6000 and s)
    assert place_gang(fitting, [after]).best is None  # no double booking of that room
    m.release_reservations(job)
    eventually(lambda: place_gang(fitting, [m.capacity()]).best is not None)


def test_missing_reservation_api_does_not_blind_the_cache(fleet: Fleet, emulator: Any) -> None:
    """A cluster configured with reservation: true whose API server lacks the CRD still
    reports its nodes (nothing is reserved there)."""
    from activities.member_cluster import KubernetesMemberCluster

    assert fleet.source is not None
    hub = KubernetesMemberCluster("hub", fleet.source, reservation=True)
    try:
        snap = hub.capacity()
        assert snap.reachable and snap.nodes
    finally:
        hub.close()
