"""propagateDeps: what the pod templates reference travels with the job, nothing else."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

from activities.fleet import Fleet
from activities.kube_api import KubeApi
from fleetq.member_contract import referenced_deps
from fleetq.messages import BindRequest, JobRef

from .conftest import manifest, member


def put(api: KubeApi, ns: str, plural: str, body: dict[str, Any]) -> None:
    api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                      "metadata": {"name": ns}})
    body["metadata"]["namespace"] = ns
    assert api.create(f"/api/v1/namespaces/{ns}/{plural}", body) is not None


def cm(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
            "data": {"k": name}}


def secret(name: str, value: str = "s3cr3t") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "type": "Opaque",
            "data": {"token": base64.b64encode(value.encode()).decode()}}


DEPS_SPEC: dict[str, Any] = {
    "serviceAccountName": "trainer",
    "imagePullSecrets": [{"name": "pull"}],
    "volumes": [
        {"name": "cfg", "configMap": {"name": "cfg-vol"}},
        {"name": "data", "persistentVolumeClaim": {"claimName": "dataset"}},
        {"name": "proj", "projected": {"sources": [{"secret": {"name": "proj-secret"}}]}},
        {"name": "elsewhere", "configMap": {"name": "only-in-other-ns", "optional": True}},
    ],
}


def with_env(m: dict[str, Any]) -> dict[str, Any]:
    c = m["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    c["envFrom"] = [{"configMapRef": {"name": "env-cm"}}]
    c["env"] = [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "env-secret",
                                                                "key": "token"}}}]
    return m


def test_references_are_found_in_every_place_a_pod_can_name_them() -> None:
    job = JobRef(namespace="ns", name="j", workflow_id="w")
    m = with_env(manifest(job, extra_spec=DEPS_SPEC))
    assert referenced_deps(m) == [
        ("ConfigMap", "cfg-vol"), ("ConfigMap", "env-cm"), ("ConfigMap", "only-in-other-ns"),
        ("PersistentVolumeClaim", "dataset"),
        ("Secret", "env-secret"), ("Secret", "proj-secret"), ("Secret", "pull"),
        ("ServiceAccount", "trainer"),
    ]


def test_propagate_deps_copies_what_is_referenced_and_nothing_else(
    fleet: Fleet, names: dict[str, str], source_api: KubeApi,
    job_factory: Callable[..., JobRef],
) -> None:
    job = job_factory("deps")
    ns, other = job.namespace, f"{job.namespace}-other"
    for name in ("cfg-vol", "env-cm", "unused-cm"):
        put(source_api, ns, "configmaps", cm(name))
    for name in ("env-secret", "proj-secret", "pull", "unused-secret"):
        put(source_api, ns, "secrets", secret(name))
    put(source_api, ns, "serviceaccounts",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "trainer"}})
    put(source_api, ns, "persistentvolumeclaims", {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "dataset"},
        "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": "pv-on-the-hub",
                 "resources": {"requests": {"storage": "1Gi"}}},
    })
    put(source_api, other, "configmaps", cm("only-in-other-ns"))  # wrong namespace

    mb = member(fleet, names["b"])
    result = mb.bind(BindRequest(job=job, manifest=with_env(manifest(job, extra_spec=DEPS_SPEC)),
                                 propagate_deps=True))
    assert sorted(result.deps) == sorted([
        f"ConfigMap {ns}/cfg-vol", f"ConfigMap {ns}/env-cm",
        f"PersistentVolumeClaim {ns}/dataset",
        f"Secret {ns}/env-secret", f"Secret {ns}/proj-secret", f"Secret {ns}/pull",
        f"ServiceAccount {ns}/trainer",
    ])
    assert "s3cr3t" not in result.model_dump_json()  # names only, never data

    def names_on_member(plural: str, namespace: str = ns) -> set[str]:
        items, _ = mb.api.list(f"/api/v1/namespaces/{namespace}/{plural}")
        return {i["metadata"]["name"] for i in items
                if i["metadata"].get("labels", {}).get("fleetq.io/owner") == job.owner_id}

    assert names_on_member("configmaps") == {"cfg-vol", "env-cm"}
    assert names_on_member("secrets") == {"env-secret", "proj-secret", "pull"}
    assert names_on_member("serviceaccounts") == {"trainer"}
    assert names_on_member("persistentvolumeclaims") == {"dataset"}
    assert mb.api.get(f"/api/v1/namespaces/{other}/configmaps/only-in-other-ns") is None
    assert mb.api.get(f"/api/v1/namespaces/{ns}/configmaps/only-in-other-ns") is None

    copied = mb.api.get(f"/api/v1/namespaces/{ns}/secrets/env-secret")
    assert copied is not None and copied["data"] == secret("env-secret")["data"]
    pvc = mb.api.get(f"/api/v1/namespaces/{ns}/persistentvolumeclaims/dataset")
    assert pvc is not None
    assert "volumeName" not in pvc["spec"] and pvc["spec"]["accessModes"] == ["ReadWriteOnce"]

    again = mb.bind(BindRequest(job=job, manifest=with_env(manifest(job, extra_spec=DEPS_SPEC)),
                                propagate_deps=True))
    assert not again.created and sorted(again.deps) == sorted(result.deps)
