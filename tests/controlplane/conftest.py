"""Fixtures for the control-plane tests: one real member (built or reused binaries) and
one emulated member of the same shape, each behind a raw HTTP client (:class:`Raw`), so
a contract test can send the very same request to both and pin what the real API
server answers.
"""

from __future__ import annotations

import base64
import contextlib
import json
import ssl
import tempfile
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetq.topology import ClusterSpec, Topology, parse_topology
from tests.conftest import real_control_plane
from tests.polling import eventually as eventually

CLUSTER = "cluster-x"
TOPOLOGY: dict[str, Any] = {"clusters": [{
    "name": CLUSTER, "labels": {"region": "east"},
    "nodeGroups": [
        {"count": 2, "cpu": 4, "memory": "16Gi", "labels": {"pool": "cpu"}},
        {"count": 1, "cpu": 8, "memory": "32Gi", "nvidia.com/gpu": 2,
         "labels": {"pool": "gpu"},
         "taints": [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]},
    ]}]}


def topology() -> Topology:
    return parse_topology(TOPOLOGY, "control-plane test topology")


def cluster_spec() -> ClusterSpec:
    return topology().cluster(CLUSTER)


@dataclass
class Response:
    status: int
    body: Any
    headers: dict[str, str]


class Raw:
    """Plain HTTPS requests to one API server, as the kubeconfig context says."""

    def __init__(self, kind: str, kubeconfig: Path, context: str,
                 compact: Callable[[], int]) -> None:
        self.kind = kind
        self.compact = compact  # etcd compaction (emulated: the store's history)
        doc = yaml.safe_load(kubeconfig.read_text())
        ctx = next(c["context"] for c in doc["contexts"] if c["name"] == context)
        cluster = next(c["cluster"] for c in doc["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in doc["users"] if u["name"] == ctx["user"])
        self.server = str(cluster["server"])
        self.token = str(user["token"])
        ca = cluster.get("certificate-authority-data")
        self.ssl = (ssl.create_default_context(cadata=base64.b64decode(ca).decode())
                    if ca else None)

    def open(self, method: str, path: str, body: Any = None,
             content_type: str = "application/json", timeout: float = 10.0) -> Any:
        data = body if isinstance(body, bytes) else (
            json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.server + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Accept": "application/json",
            "Content-Type": content_type})
        return urllib.request.urlopen(req, timeout=timeout, context=self.ssl)

    def __call__(self, method: str, path: str, body: Any = None,
                 content_type: str = "application/json") -> Response:
        try:
            with self.open(method, path, body, content_type) as resp:
                raw, status, headers = resp.read(), int(resp.status), dict(resp.headers)
        except urllib.error.HTTPError as exc:
            raw, status, headers = exc.read(), exc.code, dict(exc.headers)
        try:
            decoded = json.loads(raw) if raw else None
        except ValueError:
            decoded = raw.decode(errors="replace")
        return Response(status, decoded, headers)

    def watch(self, path: str, timeout_s: int = 2) -> tuple[int, list[dict[str, Any]]]:
        """A watch that ends by itself after ``timeout_s``: (HTTP status, its events)."""
        sep = "&" if "?" in path else "?"
        full = f"{path}{sep}watch=true&timeoutSeconds={timeout_s}"
        try:
            with self.open("GET", full, timeout=timeout_s + 10) as resp:
                return int(resp.status), [json.loads(line) for line in resp if line.strip()]
        except urllib.error.HTTPError as exc:
            return exc.code, [json.loads(exc.read() or b"null")]


@pytest.fixture(scope="session")
def real_plane() -> Iterator[Any]:
    """One real member: etcd, kube-apiserver, KWOK, the training-operator,
    kube-scheduler and the lifecycle controller (garbage collector), talked to directly
    (no fault proxy between: the contract is the API server's and the operator's)."""
    from fleetq.controlplane.runner import RealFleet

    binaries = real_control_plane(say=True)
    with tempfile.TemporaryDirectory(prefix="fleetq-cp-") as out, \
            RealFleet(topology(), binaries, Path(out), fault_proxy=False) as fleet:
        yield fleet


@pytest.fixture(scope="session")
def uncached_plane() -> Iterator[Any]:
    """A real member whose API server has no watch cache: watches go to etcd, so a
    compaction turns an older resourceVersion into 410 Gone at once (with the cache, a
    real server serves history it still holds in memory, minutes of it)."""
    from fleetq.controlplane.runner import RealFleet

    binaries = real_control_plane()
    hub = parse_topology({"clusters": [{"name": CLUSTER, "member": False}]})
    with tempfile.TemporaryDirectory(prefix="fleetq-cp-") as out, \
            RealFleet(hub, binaries, Path(out), apiserver_args=("--watch-cache=false",),
                      fault_proxy=False) as fleet:
        yield fleet


@pytest.fixture(scope="session")
def emulated_member() -> Iterator[Any]:
    from fleetq.emulator.fleet import EmulatedFleet

    with tempfile.TemporaryDirectory(prefix="fleetq-emu-") as out, \
            EmulatedFleet(topology(), out_dir=Path(out)) as fleet:
        yield fleet


def raw_client(request: pytest.FixtureRequest, kind: str) -> Raw:
    if kind != "emulated":
        real = request.getfixturevalue("real_plane" if kind == "real" else "uncached_plane")
        return Raw(kind, Path(real.kubeconfig_path), CLUSTER, real.plane(CLUSTER).compact)
    emu = request.getfixturevalue("emulated_member")

    def compact() -> int:
        return int(emu._call(lambda: emu.emulator.cluster(CLUSTER).store.compact()))

    return Raw("emulated", Path(emu.kubeconfig_path), CLUSTER, compact)


@pytest.fixture(scope="session", params=["emulated", "real"])
def api(request: pytest.FixtureRequest) -> Raw:
    """The same raw client over an emulated or a real member."""
    return raw_client(request, str(request.param))


@pytest.fixture(scope="session", params=["emulated", "real-uncached"])
def api_uncached(request: pytest.FixtureRequest) -> Raw:
    """Like ``api``, the real side without a watch cache (for 410 Gone)."""
    return raw_client(request, str(request.param))


#: the PyTorchJob API group's path, and the merge-patch content type
JOBS = "/apis/kubeflow.org/v1"
MERGE = "application/merge-patch+json"


@contextlib.contextmanager
def fresh_namespace(api: Raw, prefix: str) -> Iterator[str]:
    """A namespace of its own on ``api``'s member (``<prefix><8 hex>``), deleted after."""
    name = f"{prefix}{uuid.uuid4().hex[:8]}"
    created = api("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    assert created.status == 201, created.body
    try:
        yield name
    finally:
        api("DELETE", f"/api/v1/namespaces/{name}")


@pytest.fixture
def ns(api: Raw) -> Iterator[str]:
    """A namespace of the test's own on the member it runs against."""
    with fresh_namespace(api, "ns-") as name:
        yield name


