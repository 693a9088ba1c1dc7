"""Fixtures for the adapter tests: live fleets (HTTP, no mocks) of two kinds, or real clusters.

Every test runs twice, once per ``members`` parameter:

* ``emulated`` — one :class:`fleetq.emulator.fleet.EmulatedFleet` for the session;
* ``real`` — one :class:`fleetq.controlplane.runner.RealFleet`: etcd, kube-apiserver and
  kube-scheduler built from the upstream Go modules (``fleetq controlplane build``; a
  cold build costs minutes, then it is cached) and our lifecycle controller, same
  topology. Real members run no Koordinator scheduler, so they are ``reservation: false``
  and the Reservation tests skip there.

Both have a hub (``propagateDeps`` source) and three members; tests isolate themselves by
namespace and job name, and ``cluster-c`` is reserved for capacity-sensitive tests.
``FLEETQ_TEST_MEMBERS=emulated`` (or ``real``) runs one kind only.

With ``FLEETQ_TEST_KUBECONFIG`` and ``FLEETQ_TEST_CONTEXTS`` (``a,b,c`` — three member
contexts; ``FLEETQ_TEST_SOURCE_CONTEXT`` optional, ``FLEETQ_TEST_RESERVATION=1`` if the
members run Koordinator) the same tests run against those clusters instead; tests that
need emulator fault injection take the ``emulator`` fixture and are skipped there.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from activities.fleet import Fleet
from activities.kube_api import KubeApi
from activities.member_cluster import KubernetesMemberCluster
from fleetq.messages import JobRef
from tests.conftest import real_control_plane
from tests.polling import eventually as eventually

REAL_KUBECONFIG = os.environ.get("FLEETQ_TEST_KUBECONFIG")
REAL_CONTEXTS = [c for c in os.environ.get("FLEETQ_TEST_CONTEXTS", "").split(",") if c]
REAL = bool(REAL_KUBECONFIG and REAL_CONTEXTS)

TOPOLOGY: dict[str, Any] = {
    "clusters": [
        {"name": "hub", "member": False,
         "nodeGroups": [{"count": 1, "cpu": 4, "memory": "8Gi"}]},
        {"name": "cluster-a", "reservation": True, "labels": {"region": "east"},
         "nodeGroups": [{"count": 3, "cpu": 8, "memory": "32Gi", "nvidia.com/gpu": 2}]},
        {"name": "cluster-b", "reservation": True, "labels": {"region": "west"},
         "nodeGroups": [{"count": 2, "cpu": 8, "memory": "16Gi"}]},
        {"name": "cluster-c", "reservation": True,
         "nodeGroups": [{"count": 2, "cpu": 4, "memory": "16Gi"}]},
    ]
}

def _is_real(live: Any) -> bool:
    from fleetq.controlplane.runner import RealFleet

    return isinstance(live, RealFleet)


CONNECT_S = 1.0
READ_S = 3.0
TTL_S = 0.5


def _load_topology(doc: dict[str, Any]) -> Any:
    from fleetq.topology import parse_topology

    return parse_topology(doc, "adapter test topology")


MEMBER_KINDS = [k for k in ("emulated", "real")
                if os.environ.get("FLEETQ_TEST_MEMBERS", "both") in ("both", k)]


#: members that can hold Reservations: the emulator (real members run no Koordinator
#: scheduler, so they are ``reservation: false``), or external clusters that say so
RESERVATION_MEMBERS = ["external"] if REAL else [k for k in MEMBER_KINDS if k != "real"]
#: for tests of Reservations: run on the members that have them, instead of skipping
on_reservation_members = pytest.mark.parametrize("members", RESERVATION_MEMBERS, indirect=True)


@pytest.fixture(scope="session", params=["external"] if REAL else MEMBER_KINDS)
def members(request: pytest.FixtureRequest) -> str:
    """Which kind of member clusters this run of the test talks to."""
    return str(request.param)


@pytest.fixture(scope="session")
def live_fleet(members: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The session's emulated or real fleet (None against external clusters)."""
    if members == "external":
        yield None
        return
    out = tmp_path_factory.mktemp(members)
    if members == "emulated":
        from fleetq.emulator.fleet import EmulatedFleet

        with EmulatedFleet(_load_topology(TOPOLOGY), out_dir=out) as fleet:
            yield fleet
        return
    from fleetq.controlplane.runner import RealFleet

    binaries = real_control_plane(say=True)
    with RealFleet(_load_topology(TOPOLOGY), binaries, out) as real:
        yield real


@pytest.fixture(scope="session")
def emulated(live_fleet: Any) -> Any:
    """The session's emulated fleet (None on real members or external clusters)."""
    from fleetq.emulator.fleet import EmulatedFleet

    return live_fleet if isinstance(live_fleet, EmulatedFleet) else None


@pytest.fixture
def emulator(live_fleet: Any) -> Any:
    """The live fleet, for tests that inject faults: the emulator, or real members (API
    server frozen by SIGSTOP, errors and latency from their fault proxy, pods failed and
    nodes cordoned through the API). Skipped on external clusters."""
    if live_fleet is None:
        pytest.skip("needs fault injection (emulated or real members started here)")
    return live_fleet


def write_fleet_config(path: Path, emulated: Any) -> Path:
    """The fleet config of the tests: ``emulated`` is the live fleet (emulated or real),
    None for external clusters."""
    if emulated is None:
        assert REAL_KUBECONFIG
        names = REAL_CONTEXTS
        doc: dict[str, Any] = {
            "kubeconfig": REAL_KUBECONFIG,
            "source": {"context": os.environ.get("FLEETQ_TEST_SOURCE_CONTEXT", names[0])},
            "clusters": [
                {"name": n, "context": n,
                 "reservation": os.environ.get("FLEETQ_TEST_RESERVATION") == "1"}
                for n in names
            ],
        }
    else:
        doc = {
            "kubeconfig": str(emulated.kubeconfig_path),
            "source": {"context": "hub"},
            "clusters": [
                {"name": c["name"], "context": c["name"], "labels": c.get("labels", {}),
                 "reservation": c.get("reservation", False) and not _is_real(emulated)}
                for c in TOPOLOGY["clusters"] if c.get("member", True)
            ],
        }
    doc["timeouts"] = {"connectSeconds": CONNECT_S, "readSeconds": READ_S}
    doc["cacheTTLSeconds"] = TTL_S
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="session")
def fleet(live_fleet: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    path = write_fleet_config(tmp_path_factory.mktemp("fleetcfg") / "fleet.yaml", live_fleet)
    f = Fleet.from_config(path)
    try:
        yield f
    finally:
        f.close()


@pytest.fixture(scope="session")
def names(fleet: Fleet) -> dict[str, str]:
    """Logical member names a/b/c -> configured cluster names."""
    members = list(fleet.clusters)
    return {"a": members[0], "b": members[1 % len(members)], "c": members[2 % len(members)]}


def member(fleet: Fleet, name: str) -> KubernetesMemberCluster:
    m = fleet.get(name)
    assert isinstance(m, KubernetesMemberCluster)
    return m


@pytest.fixture
def faulty(emulator: Any, fleet: Fleet, names: dict[str, str]) -> Iterator[KubernetesMemberCluster]:
    """Member ``cluster-b`` for a fault-injection test; its faults are cleared after, and
    the test ends once its capacity cache vouches for it again."""
    m = member(fleet, names["b"])
    try:
        yield m
    finally:
        emulator.clear_faults(m.name)
        eventually(lambda: m.capacity().reachable, timeout_s=15)


@pytest.fixture(scope="session")
def source_api(fleet: Fleet) -> KubeApi:
    assert fleet.source is not None
    return fleet.source


@pytest.fixture
def job_factory(fleet: Fleet) -> Iterator[Callable[..., JobRef]]:
    """Unique job refs (own namespace each); purges them everywhere afterwards."""
    made: list[JobRef] = []

    def make(prefix: str = "job", namespace: str | None = None) -> JobRef:
        suffix = uuid.uuid4().hex[:6]
        ref = JobRef(
            namespace=namespace or f"t-{suffix}",
            name=f"{prefix}-{suffix}",
            workflow_id=f"fleetq-job-{prefix}-{suffix}",
        )
        made.append(ref)
        return ref

    yield make
    for ref in made:
        for m in fleet.clusters.values():
            with contextlib.suppress(Exception):  # best effort: it may be unreachable
                m.purge(ref)


def manifest(
    job: JobRef,
    workers: int = 1,
    cpu: str = "100m",
    memory: str = "128Mi",
    extra_spec: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A minimal PyTorchJob manifest like the walkthrough's."""

    def template() -> dict[str, Any]:
        spec: dict[str, Any] = {
            "containers": [
                {
                    "name": "pytorch",
                    "image": "registry.example/pytorch-mnist:1.0",
                    "resources": {"requests": {"cpu": cpu, "memory": memory},
                                  "limits": {"cpu": cpu, "memory": memory}},
                }
            ]
        }
        spec.update(extra_spec or {})
        return {"spec": spec}

    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": job.name, "namespace": job.namespace,
                     "annotations": dict(annotations or {})},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": template()},
                "Worker": {"replicas": workers, "restartPolicy": "OnFailure",
                           "template": template()},
            }
        },
    }
