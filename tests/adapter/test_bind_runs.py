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
from fleetq.member_contract import RUN_LABEL
from fleetq.messages import BindRequest, JobRef, PodReservation, ReserveRequest
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
    st = ma.status(second)
    assert st.phase == "Running" and st.health == "Healthy"
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
