"""Shared fixtures: one small emulated fleet per test module, and kubernetes clients for it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from fleetq.emulator.fleet import EmulatedFleet
from fleetq.topology import parse_topology
from tests.polling import eventually

SMALL = {
    "clusters": [
        {"name": "hub", "member": False},
        {
            "name": "alpha",
            "labels": {"region": "east"},
            "reservation": True,
            "nodeGroups": [
                {"count": 2, "cpu": "4", "memory": "8Gi", "pods": 20, "labels": {"pool": "cpu"}},
                {"count": 1, "cpu": "8", "memory": "32Gi", "nvidia.com/gpu": 2,
                 "labels": {"pool": "gpu"}, "namePrefix": "gpu",
                 "taints": [{"key": "gpu", "value": "true", "effect": "NoSchedule"}]},
            ],
        },
        {"name": "beta", "nodeGroups": [{"count": 1, "cpu": "4", "memory": "8Gi"}]},
    ]
}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatedFleet]:
    out = tmp_path_factory.mktemp("fleet")
    with EmulatedFleet(parse_topology(SMALL), out_dir=out, start_delay=0.05) as f:
        yield f


def api_client(kubeconfig: Path | str, context: str) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(kubeconfig), context=context)


@pytest.fixture(scope="module")
def alpha(fleet: EmulatedFleet) -> client.ApiClient:
    return api_client(fleet.kubeconfig_path, "alpha")


@pytest.fixture(scope="module")
def core(alpha: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(alpha)


@pytest.fixture(scope="module")
def custom(alpha: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(alpha)


def wait_for(pred: Callable[[], Any], timeout: float = 5.0, every: float = 0.05) -> Any:
    """:func:`tests.polling.eventually` with the emulator's 5 s."""
    return eventually(pred, timeout, every)


def pytorchjob(
    name: str,
    workers: int = 2,
    *,
    worker_cpu: str = "1",
    master_cpu: str = "10m",
    annotations: dict[str, str] | None = None,
    template_annotations: dict[str, str] | None = None,
    namespace: str = "default",
) -> dict[str, Any]:
    def tmpl(cpu: str) -> dict[str, Any]:
        return {
            "metadata": {"annotations": dict(template_annotations or {})},
            "spec": {
                "schedulerName": "default-scheduler",
                "containers": [{"name": "pytorch", "image": "pytorch",
                                "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}],
            },
        }

    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": namespace, "annotations": dict(annotations or {})},
        "spec": {
            "runPolicy": {"schedulingPolicy": {"minAvailable": 1 + workers}},
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "restartPolicy": "Never", "template": tmpl(master_cpu)},
                "Worker": {"replicas": workers, "restartPolicy": "OnFailure",
                           "template": tmpl(worker_cpu)},
            },
        },
    }


def conditions(obj: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions") or []}
