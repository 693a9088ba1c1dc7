# The kubernetes client's models make every field Optional and CustomObjectsApi returns
# `object`; in these tests a None where a value is expected fails the assertion anyway.
# mypy: disable-error-code="union-attr,index,arg-type,return-value,misc,operator,attr-defined"
"""The emulator's Kubernetes API, exercised through the official kubernetes client."""

from __future__ import annotations

import json
import threading

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from fleetq.emulator.fleet import EmulatedFleet
from fleetq.emulator.selectors import SelectorError, parse_label_selector

from .conftest import api_client


def _status(exc: ApiException) -> dict:
    return json.loads(exc.body)


def test_discovery_lists_core_and_custom_resources(alpha: client.ApiClient) -> None:
    core = {r.name for r in client.CoreV1Api(alpha).get_api_resources().resources}
    assert {"pods", "nodes", "namespaces", "configmaps", "secrets", "events",
            "persistentvolumeclaims", "serviceaccounts", "pods/status"} <= core
    groups = {g.name for g in client.ApisApi(alpha).get_api_versions().groups}
    assert {"kubeflow.org", "scheduling.koordinator.sh"} <= groups
    assert client.VersionApi(alpha).get_code().major == "1"
    crs = client.CustomObjectsApi(alpha).get_api_resources("kubeflow.org", "v1")
    assert {r.name for r in crs.resources} == {"pytorchjobs", "pytorchjobs/status"}


def test_cluster_without_reservation_support_has_no_reservation_api(
    fleet: EmulatedFleet,
) -> None:
    beta = api_client(fleet.kubeconfig_path, "beta")
    groups = {g.name for g in client.ApisApi(beta).get_api_versions().groups}
    assert "scheduling.koordinator.sh" not in groups
    with pytest.raises(ApiException) as err:
        client.CustomObjectsApi(beta).list_cluster_custom_object(
            "scheduling.koordinator.sh", "v1alpha1", "reservations"
        )
    assert err.value.status == 404


def test_nodes_come_from_the_topology(core: client.CoreV1Api) -> None:
    nodes = {n.metadata.name: n for n in core.list_node().items}
    assert set(nodes) == {"alpha-g0-0", "alpha-g0-1", "alpha-gpu-0"}
    gpu = nodes["alpha-gpu-0"]
    assert gpu.status.allocatable["nvidia.com/gpu"] == "2"
    assert gpu.spec.taints[0].key == "gpu"
    assert nodes["alpha-g0-0"].metadata.labels["pool"] == "cpu"


def test_crud_with_conflicts_and_status_bodies(core: client.CoreV1Api) -> None:
    cm = client.V1ConfigMap(metadata=client.V1ObjectMeta(name="crud"), data={"a": "1"})
    created = core.create_namespaced_config_map("default", cm)
    rv = created.metadata.resource_version
    assert created.metadata.uid and created.metadata.creation_timestamp

    with pytest.raises(ApiException) as err:
        core.create_namespaced_config_map("default", cm)
    assert err.value.status == 409 and _status(err.value)["reason"] == "AlreadyExists"

    created.data = {"a": "2"}
    updated = core.replace_namespaced_config_map("crud", "default", created)
    assert int(updated.metadata.resource_version) > int(rv)

    created.metadata.resource_version = rv  # stale
    created.data = {"a": "3"}
    with pytest.raises(ApiException) as err:
        core.replace_namespaced_config_map("crud", "default", created)
    body = _status(err.value)
    assert err.value.status == 409 and body["reason"] == "Conflict"
    assert body["kind"] == "Status" and body["details"]["name"] == "crud"

    patched = core.patch_namespaced_config_map(
        "crud", "default", {"metadata": {"labels": {"x": "y"}}, "data": {"b": "2"}}
    )
    assert patched.data == {"a": "2", "b": "2"} and patched.metadata.labels == {"x": "y"}

    core.delete_namespaced_config_map("crud", "default")
    with pytest.raises(ApiException) as err:
        core.read_namespaced_config_map("crud", "default")
    body = _status(err.value)
    assert err.value.status == 404 and body["reason"] == "NotFound"
    assert body["details"] == {"name": "crud", "kind": "configmaps"}


def test_invalid_objects_and_missing_namespaces_are_rejected(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as err:
        core.create_namespaced_config_map(
            "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="Bad_Name"))
        )
    assert err.value.status == 422 and _status(err.value)["reason"] == "Invalid"
    with pytest.raises(ApiException) as err:
        core.create_namespaced_config_map(
            "nowhere", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="x"))
        )
    assert err.value.status == 404 and "nowhere" in _status(err.value)["message"]
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="made")))
    core.create_namespaced_config_map(
        "made", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="x"))
    )
    core.delete_namespace("made")
    assert "x" not in {c.metadata.name for c in core.list_config_map_for_all_namespaces().items}


def test_label_and_field_selectors(core: client.CoreV1Api) -> None:
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="sel")))
    for name, labels in [("a", {"tier": "web", "env": "prod"}), ("b", {"tier": "db"}),
                         ("c", {"env": "dev"})]:
        core.create_namespaced_config_map(
            "sel", client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name, labels=labels))
        )

    def names(**kw: str) -> set[str]:
        return {c.metadata.name for c in core.list_namespaced_config_map("sel", **kw).items}

    assert names(label_selector="tier=web") == {"a"}
    assert names(label_selector="tier==db") == {"b"}
    assert names(label_selector="tier!=web") == {"b", "c"}
    assert names(label_selector="tier in (web, db)") == {"a", "b"}
    assert names(label_selector="tier notin (web)") == {"b", "c"}
    assert names(label_selector="env") == {"a", "c"}
    assert names(label_selector="!env") == {"b"}
    assert names(label_selector="tier,env=prod") == {"a"}
    assert names(field_selector="metadata.name=b") == {"b"}
    assert names(field_selector="metadata.name!=b,metadata.namespace=sel") == {"a", "c"}
    with pytest.raises(ApiException) as err:
        names(label_selector="tier in web")
    assert err.value.status == 400


def test_label_selector_lists_follow_relabels_deletes_and_namespaces(
    core: client.CoreV1Api,
) -> None:
    # equality selectors are answered from a label index: it must follow every write
    for ns in ("lab-1", "lab-2"):
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
        for name in ("p", "q", "r"):
            core.create_namespaced_config_map(ns, client.V1ConfigMap(
                metadata=client.V1ObjectMeta(name=name, labels={"job": "j1", "role": name})))

    def names(ns: str | None, selector: str) -> list[tuple[str, str]]:
        items = (core.list_namespaced_config_map(ns, label_selector=selector).items if ns
                 else core.list_config_map_for_all_namespaces(label_selector=selector).items)
        return sorted((c.metadata.namespace, c.metadata.name) for c in items)

    assert names("lab-1", "job=j1") == [("lab-1", "p"), ("lab-1", "q"), ("lab-1", "r")]
    assert names(None, "job=j1,role=q") == [("lab-1", "q"), ("lab-2", "q")]
    core.patch_namespaced_config_map("q", "lab-1", {"metadata": {"labels": {"job": "j2"}}})
    core.delete_namespaced_config_map("r", "lab-2")
    assert names("lab-1", "job=j1") == [("lab-1", "p"), ("lab-1", "r")]
    assert names("lab-1", "job=j2") == [("lab-1", "q")]
    assert names(None, "job=j1,role=r") == [("lab-1", "r")]
    assert names(None, "job=j1,role!=p") == [("lab-1", "r"), ("lab-2", "q")]
    assert names(None, "job=nope") == []
    core.create_namespaced_config_map("lab-2", client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name="r", labels={"job": "j1"})))
    assert names("lab-2", "job=j1") == [("lab-2", "p"), ("lab-2", "q"), ("lab-2", "r")]


def test_pod_field_selectors(core: client.CoreV1Api, fleet: EmulatedFleet) -> None:
    fleet.add_running_pods("alpha", 4, namespace="bg", prefix="bg")
    pods = core.list_namespaced_pod("bg").items
    node = pods[0].spec.node_name
    on_node = core.list_namespaced_pod("bg", field_selector=f"spec.nodeName={node}").items
    assert on_node and all(p.spec.node_name == node for p in on_node)
    assert len(core.list_namespaced_pod("bg", field_selector="status.phase=Running").items) == 4
    assert core.list_namespaced_pod("bg", field_selector="status.phase!=Running").items == []
    listed = core.list_pod_for_all_namespaces(field_selector="metadata.namespace=bg").items
    assert len(listed) == 4


def test_selector_parser_rejects_garbage() -> None:
    match = parse_label_selector("a in (x,y),!b")
    assert match is not None and match({"a": "x"}) and not match({"a": "x", "b": "1"})
    with pytest.raises(SelectorError):
        parse_label_selector("a in (x")


def test_watch_resumes_from_a_resource_version(core: client.CoreV1Api) -> None:
    rv = core.list_namespaced_config_map("default").metadata.resource_version
    meta = client.V1ObjectMeta(name="watched")
    core.create_namespaced_config_map("default", client.V1ConfigMap(metadata=meta))
    core.patch_namespaced_config_map("watched", "default", {"data": {"k": "v"}})
    core.delete_namespaced_config_map("watched", "default")
    seen = []
    w = watch.Watch()
    for ev in w.stream(core.list_namespaced_config_map, "default", resource_version=rv,
                       timeout_seconds=2):
        seen.append((ev["type"], ev["object"].metadata.name))
        if len(seen) == 3:
            w.stop()
    assert seen == [("ADDED", "watched"), ("MODIFIED", "watched"), ("DELETED", "watched")]


def test_live_watch_streams_changes_and_times_out(core: client.CoreV1Api) -> None:
    seen: list[tuple[str, str]] = []
    # from the list's version: every change after it is streamed, however late the
    # watch is established (no sleep waiting for it)
    rv = core.list_namespaced_secret("default").metadata.resource_version

    def run() -> None:
        w = watch.Watch()
        for ev in w.stream(core.list_namespaced_secret, "default", label_selector="live=1",
                           resource_version=rv, timeout_seconds=2):
            seen.append((ev["type"], ev["object"].metadata.name))

    t = threading.Thread(target=run)
    t.start()
    meta = client.V1ObjectMeta(name="s1", labels={"live": "1"})
    core.create_namespaced_secret("default", client.V1Secret(metadata=meta))
    core.create_namespaced_secret(
        "default", client.V1Secret(metadata=client.V1ObjectMeta(name="other"))
    )
    core.patch_namespaced_secret("s1", "default", {"metadata": {"labels": {"live": "0"}}})
    t.join(10)
    assert not t.is_alive()  # the server ended the watch at its timeoutSeconds
    # leaving the selector reads as DELETED, like the real API server's watch cache
    assert seen == [("ADDED", "s1"), ("DELETED", "s1")]


def test_watch_from_a_too_old_version_is_gone(core: client.CoreV1Api) -> None:
    w = watch.Watch()
    with pytest.raises(ApiException) as err:
        for _ in w.stream(core.list_namespaced_config_map, "default", resource_version="-5",
                          timeout_seconds=1):
            pass
    assert err.value.status in (400, 410)


def test_requests_need_the_bearer_token(fleet: EmulatedFleet) -> None:
    good = api_client(fleet.kubeconfig_path, "alpha").configuration
    for key in ({"BearerToken": "Bearer wrong"}, {}):
        cfg = client.Configuration(host=good.host)
        cfg.ssl_ca_cert = good.ssl_ca_cert
        cfg.api_key = key
        with pytest.raises(ApiException) as err:
            client.CoreV1Api(client.ApiClient(cfg)).list_node()
        assert err.value.status == 401 and _status(err.value)["reason"] == "Unauthorized"


def test_json_patch_and_status_subresource(core: client.CoreV1Api,
                                           custom: client.CustomObjectsApi) -> None:
    core.create_namespaced_config_map(
        "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="jp"), data={"a": "1"})
    )
    out = core.patch_namespaced_config_map(
        "jp", "default", [{"op": "replace", "path": "/data/a", "value": "2"}]
    )
    assert out.data == {"a": "2"}
    res = custom.create_cluster_custom_object(
        "scheduling.koordinator.sh", "v1alpha1", "reservations",
        {"apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Reservation",
         "metadata": {"name": "status-only"},
         "spec": {"template": {"spec": {"containers": [{"name": "r", "resources": {
             "requests": {"cpu": "10m"}}}]}},
             "owners": [{"labelSelector": {"matchLabels": {"x": "y"}}}], "ttl": "10m"}},
    )
    assert res["status"]["phase"] == "Available"
    # a spec update keeps the status; only /status changes it
    spec_update = custom.patch_cluster_custom_object(
        "scheduling.koordinator.sh", "v1alpha1", "reservations", "status-only",
        {"spec": {"ttl": "20m"}, "status": {"phase": "Failed"}},
    )
    assert spec_update["status"]["phase"] == "Available"
    assert spec_update["metadata"]["generation"] == 2
    custom.delete_cluster_custom_object(
        "scheduling.koordinator.sh", "v1alpha1", "reservations", "status-only"
    )


def test_json_patch_failures_are_refused_as_the_api_server_does(
    core: client.CoreV1Api, alpha: client.ApiClient
) -> None:
    core.create_namespaced_config_map(
        "default",
        client.V1ConfigMap(metadata=client.V1ObjectMeta(name="jp-fail"), data={"a": "1"}),
    )
    # an operation that cannot be applied: 422 Invalid, and nothing of the patch is kept
    for ops in (
        [{"op": "replace", "path": "/data/a", "value": "3"},
         {"op": "test", "path": "/data/a", "value": "2"}],
        [{"op": "remove", "path": "/data/missing"}],
        [{"op": "frobnicate", "path": "/data/a"}],
    ):
        with pytest.raises(ApiException) as err:
            core.patch_namespaced_config_map("jp-fail", "default", ops)
        assert (err.value.status, _status(err.value)["reason"]) == (422, "Invalid"), ops
    # a body that is not a list of operations cannot be decoded: 400 BadRequest (sent
    # raw: the kubernetes client turns a non-list JSON patch into a strategic merge)
    _, url, headers, _, _ = alpha.param_serialize(
        "PATCH", "/api/v1/namespaces/default/configmaps/jp-fail",
        header_params={"Content-Type": "application/json-patch+json"},
        auth_settings=["BearerToken"],
    )
    response = alpha.rest_client.pool_manager.request(
        "PATCH", url, headers=headers, body=json.dumps({"op": "remove", "path": "/data"})
    )
    assert (response.status, json.loads(response.data)["reason"]) == (400, "BadRequest")
    assert core.read_namespaced_config_map("jp-fail", "default").data == {"a": "1"}
