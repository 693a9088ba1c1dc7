"""Binds from many workers never over-commit a member without Reservations.

Each "worker" here is its own :class:`KubernetesMemberCluster` on its own connection, so
they share nothing but the member (as separate worker processes do) and meet only at its
bind Lease. Runs on the emulated and on the real member."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import pytest

from activities.fleet import Fleet
from activities.kube_api import KubeApi
from activities.member_cluster import KubernetesMemberCluster, MemberFull
from activities.member_lease import LEASE_NAME, LEASE_NAMESPACE, LeaseBusy, MemberLease
from fleetq.messages import BindRequest, BindResult, JobRef
from fleetq.models import gang_of, parse_job
from fleetq.placement import place_gang
from fleetq.rejection import RejectionCode
from fleetq.testing.chaos import HELD_RUN_SECONDS

from .conftest import eventually, manifest
from .test_bind_status import complete_job

WORKERS = 4


def gangs_that_fit(m: KubernetesMemberCluster, doc: dict[str, Any]) -> int:
    """How many copies of ``doc``'s gang the member takes now, assumed one after another
    on the nodes placement chooses."""
    snapshot, _ = m._fresh_view()
    gang = gang_of(parse_job(doc))
    count = 0
    while (choice := place_gang(gang, [snapshot]).best) is not None:
        caps = {n.name: n for n in snapshot.nodes}
        for pod in gang.pods:
            node = caps[choice.assignment[pod.name_suffix]]
            for k, v in pod.requests.items():
                node.requested[k] = node.requested.get(k, 0) + v
            node.pods_used += 1
        count += 1
    return count


def live_jobs(m: KubernetesMemberCluster, namespace: str) -> int:
    items, _ = m.api.list(m._job_path(namespace))
    return sum(
        1 for o in items
        if not any(c.get("type") in ("Succeeded", "Failed") and c.get("status") == "True"
                   for c in (o.get("status") or {}).get("conditions") or [])
    )


@pytest.fixture
def workers(fleet: Fleet, names: dict[str, str]) -> Iterator[list[KubernetesMemberCluster]]:
    """Independent adapters of member c, as separate worker processes have: each its own
    connection pool and bind Lease object (no lock shared in this process)."""
    name = names["c"]
    cfg = next(c for c in fleet.config.clusters if c.name == name)
    made = [
        KubernetesMemberCluster(
            name,
            KubeApi.from_kubeconfig(name, fleet.config.cluster_kubeconfig(cfg),
                                    cfg.context_name, 3.0, 10.0),
            labels=cfg.labels, start_cache=False,
        )
        for _ in range(WORKERS)
    ]
    yield made
    for m in made:
        m.api.close()


def test_concurrent_binds_never_exceed_the_room_and_the_rest_bind_later(
    emulator: Any, workers: list[KubernetesMemberCluster], job_factory: Callable[..., JobRef]
) -> None:
    """Every job is held running (run-seconds :data:`HELD_RUN_SECONDS`) until the test
    lets it finish: the room the first binds took stays taken while the others race for
    it, and is freed one gang at a time."""
    first = workers[0]
    namespace = f"g-{uuid.uuid4().hex[:6]}"
    probe = job_factory("probe", namespace)
    # two pods of 1.5 cpu each: a 4-cpu node takes two such pods, so the room is exact
    cpu = "1500m"
    room = gangs_that_fit(first, manifest(probe, cpu=cpu))
    assert room >= 1
    jobs = [job_factory("gang", namespace) for _ in range(2 * room)]

    def bind(i: int, job: JobRef) -> BindResult | MemberFull:
        # half the binds from one adapter (its threads batch: one Lease hold and one
        # read of the member for all that wait), the rest spread over the others
        w = workers[0] if i % 2 else workers[i % len(workers)]
        req = BindRequest(job=job, manifest=manifest(job, cpu=cpu),
                          run_seconds=HELD_RUN_SECONDS)
        try:
            return w.bind(req)
        except MemberFull as exc:
            return exc

    with ThreadPoolExecutor(len(jobs)) as pool:
        outcomes = list(pool.map(bind, range(len(jobs)), jobs))
    created = [j for j, o in zip(jobs, outcomes, strict=True) if isinstance(o, BindResult)]
    refused = [o for o in outcomes if isinstance(o, MemberFull)]
    assert len(created) == room, outcomes
    assert len(refused) == room
    for exc in refused:
        assert exc.type == "MemberFull" and exc.non_retryable
        assert exc.details[0] == RejectionCode.MEMBER_FULL_AT_BIND.value
    assert live_jobs(first, namespace) == room
    assert sum(w.bind_stats.guarded for w in workers) == len(jobs)

    # The refused jobs retry, as the job workflow does, and bind once room is freed:
    # the created jobs finish one after another (the test lets each, once its pods run),
    # and a refused one binds in the room each leaves; the member never holds more live
    # gangs than it has room for.
    waiting = [j for j in jobs if j not in created]
    peak = 0

    def one_more_binds() -> bool:
        nonlocal peak
        for job in list(waiting):
            try:
                workers[0].bind(BindRequest(job=job, manifest=manifest(job, cpu=cpu),
                                            run_seconds=HELD_RUN_SECONDS))
            except MemberFull:
                peak = max(peak, live_jobs(first, namespace))
                continue
            waiting.remove(job)
            peak = max(peak, live_jobs(first, namespace))
            return True
        return False

    for done in created:
        eventually(partial(complete_job, emulator, first.name, done), timeout_s=60)
        eventually(one_more_binds, timeout_s=120, step_s=0.2)
    assert not waiting, f"{len(waiting)} jobs never bound"
    assert peak <= room


def test_a_dead_holders_lease_is_taken_over_after_its_duration(
    workers: list[KubernetesMemberCluster],
) -> None:
    """A holder that never releases (a worker killed mid-bind) blocks the Lease for its
    duration, then the next binder takes it; a second holder meanwhile gets LeaseBusy."""
    api = workers[0].api
    name = f"{LEASE_NAME}-{uuid.uuid4().hex[:6]}"
    dead = MemberLease(api, duration_s=2, name=name)
    held = dead.held("dead-worker/job")
    hold = held.__enter__()  # never released: the process "died" here
    assert hold.holder == "dead-worker/job"
    impatient = MemberLease(api, duration_s=2, wait_s=0.5, name=name)
    with pytest.raises(LeaseBusy, match="held by dead-worker/job"), impatient.held("other/a"):
        pass
    patient = MemberLease(api, duration_s=2, wait_s=10, name=name)
    start = time.monotonic()
    with patient.held("other/b") as taken:
        assert taken.holder == "other/b"
        assert taken.waits > 0
        spec = api.get(patient.path)["spec"]  # type: ignore[index]
        assert spec["holderIdentity"] == "other/b"
        assert spec["leaseTransitions"] == 1
    assert time.monotonic() - start >= 2
    after = eventually(lambda: api.get(patient.path))
    assert not after["spec"].get("holderIdentity")
    assert after["metadata"]["namespace"] == LEASE_NAMESPACE
