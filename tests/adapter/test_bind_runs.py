"""A new submission under a finished job's name is a new run: bind replaces the copy an
earlier submission left (``fleetq.io/run-id``), never adopts it, and the watch does not
read it as this submission's (issue 24 item 4). Read on the member itself.

Upstream, a controller never adopts what another object controls: Kubernetes'
``ClaimObject`` (k8s.io/kubernetes pkg/controller/controller_ref_manager.go) releases an
object whose controller ownerReference has another uid, and the training-operator claims
a PyTorchJob's pods through it (kubeflow/training-operator pkg/controller.v1/common/pod.go,
``GetPodsForJob``): a PyTorchJob created anew under the same name owns new pods. The old
copy is deleted with ``DeleteOptions.preconditions.uid`` (k8s.io/apimachinery
pkg/apis/meta/v1/types.go, ``Preconditions``) so only that copy goes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from activities.fleet import Fleet
from activities.member_cluster import ConflictError, KubernetesMemberCluster
from activities.scheduling import SchedulingActivities
from fleetq.member_contract import RUN_LABEL
from fleetq.messages import (
    BindInput,
    BindRequest,
    GangShape,
    JobRef,
    PlacementInput,
    PodReservation,
    ReserveRequest,
)
from fleetq.models import gang_of, parse_job
from fleetq.resources import CPU

from .conftest import eventually, manifest, member, on_reservation_members

RUN_1 = "0b1e8a52-0000-4000-8000-000000000001"
RUN_2 = "0b1e8a52-0000-4000-8000-000000000002"


@pytest.fixture
def ma(fleet: Fleet, names: dict[str, str]) -> KubernetesMemberCluster:
    return member(fleet, names["a"])


def submission(job: JobRef, run_id: str) -> JobRef:
    return job.model_copy(update={"run_id": run_id})


def pods_of(m: KubernetesMemberCluster, job: JobRef) -> list[dict[str, Any]]:
    items, _ = m.api.list(m._core_path(job.namespace, "pods"),
                          label_selector=f"training.kubeflow.org/job-name={job.name}")
    return items


def copy_of(m: KubernetesMemberCluster, job: JobRef) -> dict[str, Any] | None:
    return m.api.get(m._job_path(job.namespace, job.name))


def succeeded(m: KubernetesMemberCluster, job: JobRef) -> Callable[[], Any]:
    def check() -> Any:
        st = m.status(job)
        return st if st.phase == "Succeeded" and st.pods and all(
            p.phase == "Succeeded" for p in st.pods) else None
    return check


def running(m: KubernetesMemberCluster, job: JobRef) -> Callable[[], Any]:
    """The job ``Running`` on the member, by its PyTorchJob's conditions. The
    training-operator turns ``Running`` True in its status update after it counts the
    master's active pods (kubeflow/training-operator v1.9.4
    pkg/controller.v1/pytorch/pytorchjob_controller.go, ``UpdateJobStatus``: ``running > 0``
    from ``ReplicaStatuses``), a reconcile after the kubelet reported the pods Running."""
    def check() -> Any:
        st = m.status(job)
        return st if st.phase == "Running" else None
    return check


def test_a_new_submission_replaces_the_finished_copy_with_new_pods(
    ma: KubernetesMemberCluster, job_factory: Callable[..., JobRef]
) -> None:
    base = job_factory("rerun")
    first, second = submission(base, RUN_1), submission(base, RUN_2)
    ma.bind(BindRequest(job=first, manifest=manifest(first), run_seconds=1))
    eventually(succeeded(ma, first), timeout_s=20)
    old = copy_of(ma, first)
    assert old is not None and old["metadata"]["labels"][RUN_LABEL] == RUN_1
    old_pods = {p["metadata"]["uid"] for p in pods_of(ma, first)}
    assert len(old_pods) == 2

    # The second submission's watch does not take the finished copy for its own ...
    st = ma.status(second)
    assert (st.phase, st.health) == ("Missing", "Unhealthy")
    assert "earlier submission" in st.reason

    # ... and its bind replaces it: a new PyTorchJob, never the finished one reused.
    result = ma.bind(BindRequest(job=second, manifest=manifest(second), run_seconds=30))
    assert result.created and result.uid != old["metadata"]["uid"]
    new = copy_of(ma, second)
    assert new is not None and new["metadata"]["uid"] == result.uid
    assert new["metadata"]["labels"][RUN_LABEL] == RUN_2
    for spec in new["spec"]["pytorchReplicaSpecs"].values():
        assert spec["template"]["metadata"]["labels"][RUN_LABEL] == RUN_2

    def new_pods_running() -> Any:
        pods = pods_of(ma, second)
        uids = {p["metadata"]["uid"] for p in pods}
        return pods if len(pods) == 2 and not uids & old_pods and all(
            (p.get("status") or {}).get("phase") == "Running" for p in pods) else None

    pods = eventually(new_pods_running, timeout_s=20)
    assert all(p["metadata"]["labels"][RUN_LABEL] == RUN_2 for p in pods)
    assert all(ref["uid"] == result.uid for p in pods for ref in p["metadata"]["ownerReferences"])
    # The job's phase is its conditions', which the operator sets on a later reconcile
    # than the kubelet's pod phase: wait for the Running condition, never read it at the
    # instant the pods run (a loaded real member showed ``Created`` there).
    st = eventually(running(ma, second), timeout_s=20)
    assert st.health == "Healthy"
    # the first submission's view of the member: its copy is gone, not running again
    assert ma.status(first).phase == "Missing"


def test_a_reserved_bind_replaces_the_earlier_copy_too(
    ma: KubernetesMemberCluster, job_factory: Callable[..., JobRef]
) -> None:
    """A bind with Reservations creates without the bind Lease: its AlreadyExists answer
    is checked the same way, so the finished copy is replaced there as well."""
    base = job_factory("rerunres")
    first, second = submission(base, RUN_1), submission(base, RUN_2)
    ma.bind(BindRequest(job=first, manifest=manifest(first), run_seconds=1))
    eventually(succeeded(ma, first), timeout_s=20)
    old = copy_of(ma, first)
    assert old is not None
    result = ma.bind(BindRequest(job=second, manifest=manifest(second), reserved=True))
    assert result.created and result.uid != old["metadata"]["uid"]
    new = copy_of(ma, second)
    assert new is not None and new["metadata"]["labels"][RUN_LABEL] == RUN_2


def test_a_retry_of_the_same_submission_adopts_its_own_copy(
    ma: KubernetesMemberCluster, job_factory: Callable[..., JobRef]
) -> None:
    job = submission(job_factory("retry"), RUN_1)
    req = BindRequest(job=job, manifest=manifest(job), run_seconds=30)
    first = ma.bind(req)
    again = ma.bind(req)
    assert first.created and not again.created and again.uid == first.uid


def test_another_fleet_jobs_copy_is_still_a_conflict_whatever_its_run(
    ma: KubernetesMemberCluster, job_factory: Callable[..., JobRef]
) -> None:
    job = submission(job_factory("theirs"), RUN_1)
    ma.bind(BindRequest(job=job, manifest=manifest(job), run_seconds=30))
    intruder = job.model_copy(update={"workflow_id": "someone-else", "run_id": RUN_2})
    with pytest.raises(ConflictError, match="another fleet job"):
        ma.bind(BindRequest(job=intruder, manifest=manifest(intruder)))
    obj = copy_of(ma, job)
    assert obj is not None and obj["metadata"]["labels"][RUN_LABEL] == RUN_1


def test_a_finished_copy_the_member_deleted_is_not_the_next_submissions(
    ma: KubernetesMemberCluster, job_factory: Callable[..., JobRef]
) -> None:
    """The cache remembers copies that finished and were then deleted by the member
    (ttlSecondsAfterFinished) per submission: a new submission whose copy is missing is
    Missing, not reported Succeeded on the strength of the earlier run."""
    base = job_factory("ttlrun")
    first, second = submission(base, RUN_1), submission(base, RUN_2)
    ma.bind(BindRequest(job=first, manifest=manifest(first), run_seconds=1))
    eventually(succeeded(ma, first), timeout_s=20)
    ma.api.delete(ma._job_path(first.namespace, first.name))
    eventually(lambda: copy_of(ma, first) is None)
    assert ma.status(first).phase == "Succeeded"  # that submission did finish
    assert ma.status(second).phase == "Missing"


@on_reservation_members
def test_an_earlier_submissions_reservations_are_replaced(
    ma: KubernetesMemberCluster, job_factory: Callable[..., JobRef]
) -> None:
    base = job_factory("resrun")
    first, second = submission(base, RUN_1), submission(base, RUN_2)
    node = ma.capacity().nodes[0].name
    pods = [PodReservation(role="master", index=0, node=node, requests={CPU: 100}),
            PodReservation(role="worker", index=0, node=node, requests={CPU: 100})]
    assert ma.reserve(ReserveRequest(job=first, pods=pods)).ok
    selector = f"fleetq.io/owner={base.owner_id}"
    old, _ = ma.api.list(ma._reservation_path(), label_selector=selector)
    assert len(old) == 2

    res = ma.reserve(ReserveRequest(job=second, pods=pods))
    assert res.ok, res.reason
    now, _ = ma.api.list(ma._reservation_path(), label_selector=selector)
    assert sorted(r["metadata"]["name"] for r in now) == sorted(res.reservations)
    assert {r["metadata"]["uid"] for r in now}.isdisjoint({r["metadata"]["uid"] for r in old})
    assert all(r["metadata"]["labels"][RUN_LABEL] == RUN_2 for r in now)


# --------------------------------------------------------------------------- another member


def cordon(m: KubernetesMemberCluster, on: bool) -> None:
    """``kubectl cordon`` (``spec.unschedulable``) every node of the member, and wait
    until its capacity cache (what placement reads) shows it."""
    for node in m.snapshot_by_list().nodes:
        m.api.request("PATCH", f"/api/v1/nodes/{node.name}",
                      body={"spec": {"unschedulable": on or None}},
                      content_type="application/merge-patch+json")
    eventually(lambda: all(n.unschedulable == on for n in m.capacity().nodes), timeout_s=15)


def placed(acts: SchedulingActivities, job: JobRef, among: list[str]) -> list[str]:
    """Where plan_placement would put the job now, best first, among ``among``."""
    gang = GangShape.from_gang(gang_of(parse_job(manifest(job))))
    verdict = acts.plan_placement(PlacementInput(
        job_ref=job.ref, gang=gang, affinity={"clusterNames": among}, job_id=job.workflow_id))
    return [c.cluster for c in verdict.candidates]


def gone_from(m: KubernetesMemberCluster, job: JobRef) -> Callable[[], bool]:
    """Nothing of the job left on the member: no PyTorchJob, no pod (terminating ones
    included)."""
    return lambda: copy_of(m, job) is None and not pods_of(m, job)


def test_a_new_run_placed_on_another_member_leaves_no_earlier_copy_behind(
    fleet: Fleet, names: dict[str, str], job_factory: Callable[..., JobRef]
) -> None:
    """Run 1 succeeds on cluster-a; cluster-a is cordoned, so run 2 of the same job is
    placed on cluster-b: its bind purges run 1's PyTorchJob and pods from cluster-a (the
    old copy is replaced, not left until a delete), and cluster-b runs run 2 with new
    pods. A retry of the bind activity changes nothing."""
    a, b = names["a"], names["b"]
    ma, mb = member(fleet, a), member(fleet, b)
    acts = SchedulingActivities(None, fleet)
    base = job_factory("moved")
    first, second = submission(base, RUN_1), submission(base, RUN_2)

    assert a in placed(acts, first, [a, b])
    acts.bind(BindInput(cluster=a, request=BindRequest(
        job=first, manifest=manifest(first), run_seconds=1)))
    eventually(succeeded(ma, first), timeout_s=20)
    old_pods = {p["metadata"]["uid"] for p in pods_of(ma, first)}
    assert len(old_pods) == 2

    cordon(ma, True)
    try:
        where = placed(acts, second, [a, b])
        assert where and where[0] == b and a not in where
        req = BindInput(cluster=b, request=BindRequest(
            job=second, manifest=manifest(second), run_seconds=30))
        result = acts.bind(req)
    finally:
        cordon(ma, False)
    assert result.created

    # cluster-a, read on the member: run 1's PyTorchJob and its pods are gone
    eventually(gone_from(ma, first), timeout_s=30)
    # cluster-b holds run 2's own copy, whose new pods run
    new = copy_of(mb, second)
    assert new is not None and new["metadata"]["uid"] == result.uid
    assert new["metadata"]["labels"][RUN_LABEL] == RUN_2

    def new_pods_running() -> Any:
        pods = pods_of(mb, second)
        return pods if len(pods) == 2 and all(
            (p.get("status") or {}).get("phase") == "Running"
            and p["metadata"]["labels"][RUN_LABEL] == RUN_2
            and p["metadata"]["uid"] not in old_pods for p in pods) else None

    eventually(new_pods_running, timeout_s=20)
    eventually(running(mb, second), timeout_s=20)

    # the activity retried (its first attempt's answer lost): same copy, nothing else goes
    again = acts.bind(req)
    assert not again.created and again.uid == result.uid
    assert copy_of(mb, second) is not None and gone_from(ma, first)()


def test_an_unreachable_member_does_not_hold_the_bind_and_delete_still_purges_it(
    emulator: Any, fleet: Fleet, names: dict[str, str], job_factory: Callable[..., JobRef]
) -> None:
    """The member holding run 1's copy does not answer (every request outlasts the read
    timeout): run 2's bind on another member succeeds all the same and the old copy
    stays there, for the purge of ``fleetq delete`` (by owner, every run) to remove once
    the member answers again."""
    a, b = names["a"], names["b"]
    ma, mb = member(fleet, a), member(fleet, b)
    acts = SchedulingActivities(None, fleet)
    base = job_factory("unreach")
    first, second = submission(base, RUN_1), submission(base, RUN_2)
    ma.bind(BindRequest(job=first, manifest=manifest(first), run_seconds=1))
    eventually(succeeded(ma, first), timeout_s=20)

    emulator.set_latency(a, 60.0)
    try:
        result = acts.bind(BindInput(cluster=b, request=BindRequest(
            job=second, manifest=manifest(second), run_seconds=30)))
        assert result.created
    finally:
        emulator.clear_faults(a)
    eventually(lambda: ma.probe_ready()[0] == "True", timeout_s=15)
    left = copy_of(ma, first)
    assert left is not None and left["metadata"]["labels"][RUN_LABEL] == RUN_1
    assert copy_of(mb, second) is not None

    ma.purge(base)  # what the delete's purge does on every member
    eventually(gone_from(ma, first), timeout_s=30)


def test_a_first_submission_asks_no_other_member_and_a_copy_there_is_still_purged(
    fleet: Fleet, names: dict[str, str], job_factory: Callable[..., JobRef]
) -> None:
    """The bind asks another member about earlier runs only when that member's capacity
    cache cannot vouch it holds no PyTorchJob of the name: a first submission's bind
    reads no other member, while a copy the cache has seen there is still found and
    purged (read on the member)."""
    a, b = names["a"], names["b"]
    ma, mb = member(fleet, a), member(fleet, b)
    acts = SchedulingActivities(None, fleet)
    asked: list[str] = []
    real = ma.purge_earlier_runs

    def spy(job: JobRef, read_s: float | None = None) -> list[str]:
        asked.append(job.name)
        return real(job, read_s=read_s)

    ma.purge_earlier_runs = spy  # type: ignore[method-assign]
    try:
        fresh = submission(job_factory("fresh"), RUN_1)
        eventually(lambda: ma.cache.holds_no_job(fresh.namespace, fresh.name), timeout_s=20)
        assert acts.bind(BindInput(cluster=b, request=BindRequest(
            job=fresh, manifest=manifest(fresh), run_seconds=30))).created
        assert asked == []
        assert copy_of(ma, fresh) is None and copy_of(mb, fresh) is not None

        base = job_factory("seen")
        first, second = submission(base, RUN_1), submission(base, RUN_2)
        ma.bind(BindRequest(job=first, manifest=manifest(first), run_seconds=1))
        eventually(lambda: not ma.cache.holds_no_job(first.namespace, first.name),
                   timeout_s=20)
        assert acts.bind(BindInput(cluster=b, request=BindRequest(
            job=second, manifest=manifest(second), run_seconds=30))).created
        assert asked == [base.name]
        eventually(gone_from(ma, first), timeout_s=30)
        # gone from the member, gone from its cache: the name is free there again
        eventually(lambda: ma.cache.holds_no_job(first.namespace, first.name), timeout_s=20)
    finally:
        del ma.purge_earlier_runs
