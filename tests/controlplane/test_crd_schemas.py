"""What the adapter writes, checked by a real API server against the upstream CRDs
(training-operator's PyTorchJob, Koordinator's Reservation), with
``fieldValidation=Strict`` so an unknown field fails instead of being dropped silently."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from activities.kube_api import KubeApi
from activities.member_cluster import KubernetesMemberCluster
from fleetq.member_contract import member_manifest, reservation_body
from fleetq.messages import BindRequest, JobRef, PodReservation, ReserveRequest
from fleetq.resources import CPU, MEMORY

from .conftest import CLUSTER, Raw

WALKTHROUGH = Path(__file__).resolve().parents[2] / "examples" / "pytorch-test.yaml"
RESERVATIONS = "/apis/scheduling.koordinator.sh/v1alpha1/reservations"
STRICT = "?fieldValidation=Strict&dryRun=All"


@pytest.fixture(scope="module")
def real(real_plane: Any) -> Raw:
    return Raw("real", Path(real_plane.kubeconfig_path), CLUSTER, real_plane.plane(CLUSTER).compact)


@pytest.fixture(scope="module")
def adapter(real_plane: Any) -> Iterator[KubernetesMemberCluster]:
    """The adapter on the real member, told it has Reservations (no Koordinator runs)."""
    api = KubeApi.from_kubeconfig(CLUSTER, str(real_plane.kubeconfig_path), CLUSTER)
    m = KubernetesMemberCluster(CLUSTER, api, reservation=True, start_cache=False,
                                reserve_poll_s=0.5)
    try:
        yield m
    finally:
        m.close()


JOB = JobRef(namespace="team-a", name="pytorch-test", workflow_id="fleetq-job-pytorch-test")
RESERVATION_SHAPES = [
    PodReservation(role="master", index=0, node="cluster-x-g0-0", requests={CPU: 500}),
    PodReservation(role="worker", index=3, node="cluster-x-g1-0",
                   requests={CPU: 4000, MEMORY: 16 * 2**30 * 1000, "nvidia.com/gpu": 2000},
                   node_selector={"pool": "gpu"},
                   tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists",
                                 "effect": "NoSchedule"}]),
]


@pytest.mark.parametrize("ttl", [1, 600, 86400 + 61])
@pytest.mark.parametrize("pod", RESERVATION_SHAPES, ids=lambda p: f"{p.role}-{p.index}")
def test_every_reservation_we_write_is_schema_valid(
    real: Raw, pod: PodReservation, ttl: int
) -> None:
    body = reservation_body(JOB, pod, ttl)
    r = real("POST", RESERVATIONS + STRICT, body)
    assert r.status == 201, r.body
    assert r.body["spec"]["ttl"] == body["spec"]["ttl"]
    assert r.body["spec"]["owners"] == body["spec"]["owners"]
    assert r.body["spec"]["template"] == body["spec"]["template"]  # nothing pruned


def test_reserve_writes_reservations_and_rolls_back_when_none_becomes_available(
    real: Raw, adapter: KubernetesMemberCluster
) -> None:
    """The adapter's own write path on a real server: created (schema-valid), then — no
    Koordinator makes them Available — rolled back and reported."""
    job = JOB.model_copy(update={"name": "rollback", "workflow_id": "fleetq-job-rollback"})
    res = adapter.reserve(ReserveRequest(job=job, pods=RESERVATION_SHAPES, ttl_seconds=60))
    assert not res.ok and "not Available" in res.reason
    left = real("GET", f"{RESERVATIONS}?labelSelector=fleetq.io/owner%3D{job.owner_id}")
    assert left.status == 200 and left.body["items"] == []


def test_the_pytorchjob_we_bind_is_schema_valid_with_the_walkthroughs_clean_pod_policy(
    real: Raw,
) -> None:
    """The walkthrough's manifest puts ``cleanPodPolicy`` under ``spec`` (training-operator
    v1 has it under ``spec.runPolicy``, and a real server would drop it): the member copy
    carries it under ``runPolicy``, and strict validation accepts everything we bind."""
    manifest = yaml.safe_load(WALKTHROUGH.read_text())
    assert manifest["spec"]["cleanPodPolicy"] == "None"
    real("POST", "/api/v1/namespaces", {"metadata": {"name": "team-a"}})
    path = f"/apis/kubeflow.org/v1/namespaces/{JOB.namespace}/pytorchjobs{STRICT}"
    body = member_manifest(BindRequest(job=JOB, manifest=manifest, reserved=True,
                                       run_seconds=30))
    r = real("POST", path, body)
    assert r.status == 201, r.body
    assert r.body["spec"]["runPolicy"]["cleanPodPolicy"] == "None"
    assert r.body["spec"]["runPolicy"]["schedulingPolicy"] == \
        body["spec"]["runPolicy"]["schedulingPolicy"]
