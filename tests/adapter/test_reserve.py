"""Reservations: all or nothing, never twice on the same room, idempotent by name."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from activities.fleet import Fleet
from activities.kube_api import KubeApi
from activities.member_cluster import KubernetesMemberCluster
from fleetq.member_contract import OWNER_LABEL, reservation_name
from fleetq.messages import JobRef, PodReservation, ReserveRequest, ReserveResult
from fleetq.resources import CPU

from .conftest import eventually, member, on_reservation_members


@pytest.fixture
def cm(fleet: Fleet, names: dict[str, str]) -> KubernetesMemberCluster:
    m = member(fleet, names["c"])
    if not m.reservation:
        pytest.skip("the cluster does not support Reservations")
    return m


def owned(m: KubernetesMemberCluster, job: JobRef) -> list[str]:
    items, _ = m.api.list(m._reservation_path(), label_selector=f"{OWNER_LABEL}={job.owner_id}")
    return sorted(str(i["metadata"]["name"]) for i in items)


def free_cpu(m: KubernetesMemberCluster) -> dict[str, int]:
    return {n.name: n.free().get(CPU, 0) for n in m.snapshot_by_list().nodes if not n.unschedulable}


def race(
    cm: KubernetesMemberCluster, jobs: list[JobRef], node: str, cpu: int
) -> list[ReserveResult]:
    """Both jobs reserve ``cpu`` on ``node`` at the same moment, from two threads."""
    results: dict[int, ReserveResult] = {}
    barrier = threading.Barrier(len(jobs))

    def run(i: int) -> None:
        barrier.wait()
        results[i] = cm.reserve(ReserveRequest(job=jobs[i], pods=[
            PodReservation(role="worker", index=0, node=node, requests={CPU: cpu}),
        ]))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return [results[i] for i in range(len(jobs))]


@on_reservation_members
def test_racing_jobs_never_both_get_the_same_room(
    cm: KubernetesMemberCluster, job_factory: Callable[..., JobRef]
) -> None:
    for _round in range(5):
        free = free_cpu(cm)
        node = max(free, key=lambda n: free[n])
        jobs = [job_factory("race"), job_factory("race")]
        # Each fits alone, both together do not.
        results = race(cm, jobs, node, free[node] * 6 // 10)
        oks = [i for i, r in enumerate(results) if r.ok]
        assert len(oks) == 1, [r.model_dump() for r in results]
        loser = 1 - oks[0]
        assert "cpu" in results[loser].reason
        assert owned(cm, jobs[loser]) == []  # the loser holds nothing
        assert owned(cm, jobs[oks[0]]) == results[oks[0]].reservations
        cm.release_reservations(jobs[oks[0]])


@on_reservation_members
def test_gang_reservation_is_all_or_nothing(
    cm: KubernetesMemberCluster, job_factory: Callable[..., JobRef]
) -> None:
    free = free_cpu(cm)
    small, big = min(free, key=lambda n: free[n]), max(free, key=lambda n: free[n])
    job = job_factory("gang")
    res = cm.reserve(ReserveRequest(job=job, pods=[
        PodReservation(role="master", index=0, node=small, requests={CPU: 100}),
        PodReservation(role="worker", index=0, node=small, requests={CPU: 100}),
        PodReservation(role="worker", index=1, node=big, requests={CPU: free[big] + 1000}),
    ]))
    assert not res.ok
    assert res.reason.startswith(f"reservation worker-1 on node {big}: Failed")
    assert res.reservations == []
    assert owned(cm, job) == []  # the two that fitted were rolled back
    assert free_cpu(cm) == free


@on_reservation_members
def test_reserve_is_idempotent_and_release_is_repeatable(
    cm: KubernetesMemberCluster, job_factory: Callable[..., JobRef]
) -> None:
    node = cm.capacity().nodes[0].name
    job = job_factory("idem")
    req = ReserveRequest(job=job, pods=[
        PodReservation(role="master", index=0, node=node, requests={CPU: 100}),
        PodReservation(role="worker", index=0, node=node, requests={CPU: 100}),
    ], ttl_seconds=300)
    first = cm.reserve(req)
    assert first.ok, first.reason
    expected = sorted(reservation_name(job, r, 0) for r in ("master", "worker"))
    assert sorted(first.reservations) == expected
    again = cm.reserve(req)  # an activity retry
    assert again.ok and again.reservations == first.reservations
    assert owned(cm, job) == expected
    obj = cm.api.get(cm._reservation_path(expected[0]))
    assert obj is not None
    assert obj["spec"]["ttl"] == "5m"
    assert obj["spec"]["template"]["spec"]["nodeName"] == node
    assert obj["spec"]["owners"][0]["labelSelector"]["matchLabels"] == {
        "training.kubeflow.org/job-name": job.name,
        "training.kubeflow.org/replica-type": "master",
        "training.kubeflow.org/replica-index": "0",
    }
    assert cm.release_reservations(job) == expected
    assert cm.release_reservations(job) == []
    assert owned(cm, job) == []


@on_reservation_members
def test_reservation_pinned_elsewhere_is_replaced_not_reused(
    cm: KubernetesMemberCluster, job_factory: Callable[..., JobRef]
) -> None:
    nodes = [n.name for n in cm.capacity().nodes]
    job = job_factory("move")
    first = cm.reserve(ReserveRequest(job=job, pods=[
        PodReservation(role="master", index=0, node=nodes[0], requests={CPU: 100})]))
    assert first.ok, first.reason
    moved = cm.reserve(ReserveRequest(job=job, pods=[
        PodReservation(role="master", index=0, node=nodes[-1], requests={CPU: 100})]))
    assert moved.ok, moved.reason
    obj = cm.api.get(cm._reservation_path(moved.reservations[0]))
    assert obj is not None and obj["status"]["nodeName"] == nodes[-1]
    cm.release_reservations(job)


@on_reservation_members
def test_expired_reservation_is_never_reused(
    cm: KubernetesMemberCluster, job_factory: Callable[..., JobRef]
) -> None:
    node = cm.capacity().nodes[0].name
    job = job_factory("ttl")
    req = ReserveRequest(job=job, ttl_seconds=1, pods=[
        PodReservation(role="master", index=0, node=node, requests={CPU: 100})])
    first = cm.reserve(req)
    assert first.ok, first.reason
    path = cm._reservation_path(first.reservations[0])
    old = cm.api.get(path)
    assert old is not None

    def expired() -> bool:
        obj = cm.api.get(path)
        return obj is not None and obj.get("status", {}).get("phase") == "Failed"

    eventually(expired, timeout_s=5)
    again = cm.reserve(req.model_copy(update={"ttl_seconds": 600}))
    assert again.ok, again.reason
    new = cm.api.get(path)
    assert new is not None
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    assert new["status"]["phase"] == "Available"
    cm.release_reservations(job)


def test_cluster_without_reservations_says_so(
    emulator: Any, source_api: KubeApi, job_factory: Callable[..., JobRef]
) -> None:
    hub = KubernetesMemberCluster("hub", source_api, reservation=False, start_cache=False)
    job = job_factory("nores")
    res = hub.reserve(ReserveRequest(job=job, pods=[
        PodReservation(role="master", index=0, node="hub-g0-0", requests={CPU: 100})]))
    assert not res.ok and "does not support Reservations" in res.reason
    assert hub.release_reservations(job) == []  # no Reservation API there: nothing to do
