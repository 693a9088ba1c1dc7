"""Contract tests: the same requests to an emulated and a real member, pinning what the
real kube-apiserver answers. Each test names the divergence it was written for; the
emulator was fixed until both kinds pass."""

from __future__ import annotations

import uuid
from typing import Any

from .conftest import JOBS, MERGE, Raw, eventually

STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"


def pod(name: str, requests: dict[str, str] | None = None,
        limits: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": "contract"}},
            "spec": {"containers": [{"name": "main", "image": "busybox",
                                     "resources": resources}],
                     # never scheduled: these pods must stay Pending and untouched
                     "nodeSelector": {"fleetq.io/contract": "nowhere"}, **spec}}


def job(name: str) -> dict[str, Any]:
    tmpl = {"spec": {"containers": [{"name": "pytorch", "image": "busybox"}],
                     "nodeSelector": {"fleetq.io/contract": "nowhere"}}}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": name},
            "spec": {"pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": tmpl}}}}


def create(api: Raw, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = api("POST", path, body)
    assert r.status == 201, r.body
    assert isinstance(r.body, dict)
    return r.body


# ---------------------------------------------------------------- paging


def test_list_pages_with_limit_and_continue(api: Raw, ns: str) -> None:
    """Divergence: the emulator ignored ``limit`` and returned everything at once."""
    for i in range(5):
        create(api, f"/api/v1/namespaces/{ns}/configmaps",
               {"metadata": {"name": f"cm-{i}"}, "data": {"i": str(i)}})
    first = api("GET", f"/api/v1/namespaces/{ns}/configmaps?limit=2")
    assert first.status == 200
    assert [i["metadata"]["name"] for i in first.body["items"]] == ["cm-0", "cm-1"]
    meta = first.body["metadata"]
    assert meta["continue"] and meta["remainingItemCount"] == 3
    names: list[str] = []
    token = meta["continue"]
    while token:
        page = api("GET", f"/api/v1/namespaces/{ns}/configmaps?limit=2&continue={token}")
        assert page.status == 200
        assert page.body["metadata"]["resourceVersion"] == meta["resourceVersion"]
        names += [i["metadata"]["name"] for i in page.body["items"]]
        token = page.body["metadata"].get("continue")
    assert names == ["cm-2", "cm-3", "cm-4"]
    bad = api("GET", f"/api/v1/namespaces/{ns}/configmaps?limit=2&continue=not-a-token")
    assert bad.status == 400 and bad.body["reason"] == "BadRequest"


# ---------------------------------------------------------------- watch


def test_watch_from_a_compacted_resource_version_is_410_gone(api_uncached: Raw) -> None:
    """After a compaction, a watch from an older resourceVersion is answered with HTTP 200
    and one ERROR event carrying a 410 ``Expired`` Status (client-go then re-LISTs)."""
    api = api_uncached
    ns = f"c-{uuid.uuid4().hex[:8]}"
    create(api, "/api/v1/namespaces", {"metadata": {"name": ns}})
    create(api, f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": "a"}})
    rv = api("GET", f"/api/v1/namespaces/{ns}/configmaps").body["metadata"]["resourceVersion"]
    for name in ("b", "c"):  # etcd keeps the compaction revision itself: two writes
        create(api, f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": name}})
    api.compact()
    status, events = api.watch(f"/api/v1/namespaces/{ns}/configmaps?resourceVersion={rv}")
    assert status == 200
    assert [e["type"] for e in events] == ["ERROR"]
    err = events[0]["object"]
    assert err["kind"] == "Status" and err["code"] == 410 and err["reason"] == "Expired"
    # etcd's answer ("...provided watch is too old."), or the watch cache's ("too old
    # resource version: 10 (12)", what the emulator says): reason and code are the contract
    assert "too old" in err["message"]
    # the fresh LIST that follows, and a watch from its resourceVersion, work again
    rv = api("GET", f"/api/v1/namespaces/{ns}/configmaps").body["metadata"]["resourceVersion"]
    status, events = api.watch(f"/api/v1/namespaces/{ns}/configmaps?resourceVersion={rv}",
                               timeout_s=1)
    assert status == 200 and events == []


def test_watch_without_resource_version_starts_with_synthetic_adds(api: Raw, ns: str) -> None:
    create(api, f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": "a"}})
    status, events = api.watch(f"/api/v1/namespaces/{ns}/configmaps", timeout_s=1)
    assert status == 200
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "a")]


def test_watch_from_a_list_resource_version_sees_only_later_changes(api: Raw, ns: str) -> None:
    create(api, f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": "old"}})
    rv = api("GET", f"/api/v1/namespaces/{ns}/configmaps").body["metadata"]["resourceVersion"]
    create(api, f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": "new"}})
    api("DELETE", f"/api/v1/namespaces/{ns}/configmaps/old")
    _, events = api.watch(f"/api/v1/namespaces/{ns}/configmaps?resourceVersion={rv}",
                          timeout_s=1)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "new"), ("DELETED", "old")]
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert rvs == sorted(rvs) and rvs[0] > int(rv)


def test_watch_list_ends_its_initial_events_with_a_bookmark(api: Raw, ns: str) -> None:
    """Divergence: the emulator ignored ``sendInitialEvents`` (client-go's WatchList);
    the real server sends the state as ADDED, then a BOOKMARK annotated
    ``k8s.io/initial-events-end``, and refuses the request without NotOlderThan."""
    create(api, f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": "a"}})
    base = f"/api/v1/namespaces/{ns}/configmaps?sendInitialEvents=true"
    status, events = api.watch(
        f"{base}&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true", timeout_s=1)
    assert status == 200
    types = [e["type"] for e in events]
    assert types[:2] == ["ADDED", "BOOKMARK"], types
    # a real server may add its own bookmark as the watch is about to time out (seen in
    # one of two full runs): never anything but bookmarks after the initial events
    assert set(types[2:]) <= {"BOOKMARK"}, types
    assert all("k8s.io/initial-events-end" not in (e["object"]["metadata"].get("annotations")
                                                   or {}) for e in events[2:])
    mark = events[1]["object"]
    assert mark["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert int(mark["metadata"]["resourceVersion"]) >= int(
        events[0]["object"]["metadata"]["resourceVersion"])
    status, body = api.watch(base, timeout_s=1)
    assert status == 422 and body[0]["reason"] == "Invalid"
    assert "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan" in \
        body[0]["message"]


# ---------------------------------------------------------------- writes


def test_update_needs_the_current_resource_version(api: Raw, ns: str) -> None:
    """A stale resourceVersion is a 409 Conflict with the real message."""
    cm = create(api, f"/api/v1/namespaces/{ns}/configmaps",
                {"metadata": {"name": "cm"}, "data": {"a": "1"}})
    path = f"/api/v1/namespaces/{ns}/configmaps/cm"
    cm["data"] = {"a": "2"}
    assert api("PUT", path, cm).status == 200
    stale = api("PUT", path, cm)
    assert stale.status == 409 and stale.body["reason"] == "Conflict"
    assert stale.body["message"] == (
        'Operation cannot be fulfilled on configmaps "cm": the object has been modified; '
        "please apply your changes to the latest version and try again")


def test_create_with_a_resource_version_is_a_500(api: Raw, ns: str) -> None:
    """Divergence: the emulator dropped a client-set resourceVersion on create; the real
    server refuses it with a 500 without a reason (which clients retry as a server error,
    so code copying objects between clusters must strip it)."""
    r = api("POST", f"/api/v1/namespaces/{ns}/configmaps",
            {"metadata": {"name": "cm", "resourceVersion": "42"}})
    assert r.status == 500 and "reason" not in r.body
    assert r.body["message"] == "resourceVersion should not be set on objects to be created"


def test_strategic_merge_patch_is_refused_on_custom_resources(api: Raw, ns: str) -> None:
    """Divergence: the emulator applied a strategic merge patch to a PyTorchJob as a
    merge patch; the real API server answers 415."""
    create(api, f"{JOBS}/namespaces/{ns}/pytorchjobs", job("j"))
    path = f"{JOBS}/namespaces/{ns}/pytorchjobs/j"
    body = {"metadata": {"labels": {"x": "y"}}}
    r = api("PATCH", path, body, content_type=STRATEGIC)
    assert r.status == 415 and r.body["reason"] == "UnsupportedMediaType"
    assert api("PATCH", path, body, content_type=MERGE).status == 200
    r = api("PATCH", f"/api/v1/namespaces/{ns}/pods/nope", body, content_type=STRATEGIC)
    assert r.status == 404  # built-in types take it


def test_status_subresource_writes_only_status(api: Raw, ns: str) -> None:
    create(api, f"{JOBS}/namespaces/{ns}/pytorchjobs", job("j"))
    path = f"{JOBS}/namespaces/{ns}/pytorchjobs/j"
    r = api("PATCH", path + "/status", {"metadata": {"labels": {"via": "status"}},
                                        "status": {"conditions": [{"type": "Created",
                                                                   "status": "True"}]}},
            content_type=MERGE)
    assert r.status == 200, r.body
    assert "via" not in (r.body["metadata"].get("labels") or {})
    r = api("PATCH", path, {"status": {"conditions": []}, "metadata": {"labels": {"m": "1"}}},
            content_type=MERGE)
    assert r.status == 200
    assert r.body["metadata"]["labels"]["m"] == "1"
    assert r.body["status"]["conditions"][0]["type"] == "Created"  # main resource: ignored


def test_status_of_a_node_is_not_written_through_the_main_resource(api: Raw) -> None:
    """Divergence: the emulator took a Node's status from a PUT/PATCH of the node itself."""
    nodes = api("GET", "/api/v1/nodes").body["items"]
    name = nodes[0]["metadata"]["name"]
    r = api("PATCH", f"/api/v1/nodes/{name}",
            {"status": {"capacity": {"cpu": "999"}}}, content_type=MERGE)
    assert r.status == 200
    assert r.body["status"]["capacity"]["cpu"] != "999"


def test_new_pod_status_is_pending_with_its_qos_class(api: Raw, ns: str) -> None:
    """Divergence: the emulator called every pod Burstable."""
    base = f"/api/v1/namespaces/{ns}/pods"
    best = create(api, base, pod("best", status={"phase": "Running"}))
    assert best["status"]["phase"] == "Pending" and best["status"]["qosClass"] == "BestEffort"
    q = {"cpu": "100m", "memory": "64Mi"}
    assert create(api, base, pod("guaranteed", limits=q))["status"]["qosClass"] == "Guaranteed"
    burst = create(api, base, pod("burst", requests=q))
    assert burst["status"]["qosClass"] == "Burstable"
    guaranteed = api("GET", f"{base}/guaranteed").body
    assert guaranteed["spec"]["containers"][0]["resources"]["requests"] == q  # defaulted


def test_unknown_fields_of_a_custom_resource_are_pruned(api: Raw, ns: str) -> None:
    """Divergence: the emulator stored any field as sent; the structural schema of the
    PyTorchJob CRD drops unknown ones (``fieldValidation=Strict`` refuses them) and
    fills in its defaults."""
    body = job("j")
    body["spec"]["cleanPodPolicy"] = "None"  # the walkthrough writes it here (v1: runPolicy)
    body["spec"]["runPolicy"] = {"cleanPodPolicy": "None"}
    created = create(api, f"{JOBS}/namespaces/{ns}/pytorchjobs", body)
    assert "cleanPodPolicy" not in created["spec"]
    # ... and applies the schema's defaults
    assert created["spec"]["runPolicy"] == {"cleanPodPolicy": "None", "suspend": False}
    body["metadata"]["name"] = "warned"
    r = api("POST", f"{JOBS}/namespaces/{ns}/pytorchjobs", body)
    assert r.status == 201
    assert r.headers.get("Warning") == '299 - "unknown field \\"spec.cleanPodPolicy\\""'
    body["metadata"]["name"] = "strict"
    r = api("POST", f"{JOBS}/namespaces/{ns}/pytorchjobs?fieldValidation=Strict", body)
    assert r.status == 400 and 'unknown field "spec.cleanPodPolicy"' in r.body["message"]


# ---------------------------------------------------------------- selectors, errors


def test_field_selectors_on_pods_and_unsupported_fields(api: Raw, ns: str) -> None:
    base = f"/api/v1/namespaces/{ns}/pods"
    create(api, base, pod("p1"))
    create(api, base, pod("p2"))
    r = api("GET", f"{base}?fieldSelector=metadata.name%3Dp2")
    assert [i["metadata"]["name"] for i in r.body["items"]] == ["p2"]
    r = api("GET", f"{base}?fieldSelector=status.phase!%3DRunning,spec.nodeName%3D")
    assert sorted(i["metadata"]["name"] for i in r.body["items"]) == ["p1", "p2"]
    r = api("GET", f"{base}?fieldSelector=spec.priority%3D0")
    assert r.status == 400 and r.body["reason"] == "BadRequest"
    assert 'field label not supported: spec.priority' in r.body["message"]
    r = api("GET", f"{JOBS}/namespaces/{ns}/pytorchjobs?fieldSelector=status.phase%3DX")
    assert r.status == 400


def test_not_found_bodies(api: Raw, ns: str) -> None:
    r = api("GET", f"{JOBS}/namespaces/{ns}/pytorchjobs/missing")
    assert r.status == 404
    assert r.body["message"] == 'pytorchjobs.kubeflow.org "missing" not found'
    assert r.body["details"] == {"name": "missing", "group": "kubeflow.org",
                                 "kind": "pytorchjobs"}
    r = api("POST", "/api/v1/namespaces/absent-ns-x/configmaps", {"metadata": {"name": "c"}})
    assert r.status == 404 and r.body["message"] == 'namespaces "absent-ns-x" not found'


def test_list_items_of_builtin_types_carry_no_kind(api: Raw, ns: str) -> None:
    """The real server leaves ``kind``/``apiVersion`` out of built-in list items (custom
    resources keep theirs); code must not read an item's kind from a LIST."""
    create(api, f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": "c"}})
    items = api("GET", f"/api/v1/namespaces/{ns}/configmaps").body["items"]
    assert "kind" not in items[0] and "apiVersion" not in items[0]
    create(api, f"{JOBS}/namespaces/{ns}/pytorchjobs", job("j"))
    jobs = api("GET", f"{JOBS}/namespaces/{ns}/pytorchjobs").body["items"]
    assert jobs[0]["kind"] == "PyTorchJob"


def test_generation_counts_spec_changes_only(api: Raw, ns: str) -> None:
    created = create(api, f"{JOBS}/namespaces/{ns}/pytorchjobs", job("j"))
    assert created["metadata"]["generation"] == 1
    path = f"{JOBS}/namespaces/{ns}/pytorchjobs/j"
    r = api("PATCH", path, {"metadata": {"labels": {"a": "b"}}}, content_type=MERGE)
    assert r.body["metadata"]["generation"] == 1
    r = api("PATCH", path, {"spec": {"runPolicy": {"backoffLimit": 2}}}, content_type=MERGE)
    assert r.body["metadata"]["generation"] == 2


def test_running_pod_deletion_is_graceful_then_gone(api: Raw, ns: str) -> None:
    """A bound pod is deleted gracefully (the kubelet — here the lifecycle controller —
    confirms), an unbound one at once; either way it is gone shortly after."""
    base = f"/api/v1/namespaces/{ns}/pods"
    p = pod("run", requests={"cpu": "10m"})
    del p["spec"]["nodeSelector"]
    create(api, base, p)
    eventually(lambda: (api("GET", f"{base}/run").body.get("status") or {})
               .get("phase") == "Running")
    r = api("DELETE", f"{base}/run")
    assert r.status == 200 and r.body["kind"] == "Pod"
    eventually(lambda: api("GET", f"{base}/run").status == 404)
    create(api, base, pod("pending"))
    r = api("DELETE", f"{base}/pending")
    assert r.status == 200
    assert api("GET", f"{base}/pending").status == 404


def test_invalid_objects_are_422_with_causes(api: Raw, ns: str) -> None:
    """Divergence: the emulator's 422 named the resource (``pods``) in ``details.kind``;
    the real one names the Kind."""
    r = api("POST", f"/api/v1/namespaces/{ns}/pods",
            {"metadata": {"name": "empty"}, "spec": {"containers": []}})
    assert r.status == 422 and r.body["reason"] == "Invalid"
    assert r.body["message"].startswith('Pod "empty" is invalid: spec.containers: Required value')
    assert r.body["details"]["name"] == "empty" and r.body["details"]["kind"] == "Pod"
    assert any(c["field"] == "spec.containers" for c in r.body["details"]["causes"])
    r = api("POST", f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": "Bad_Name"}})
    assert r.status == 422 and r.body["reason"] == "Invalid"


def test_dry_run_create_persists_nothing(api: Raw, ns: str) -> None:
    r = api("POST", f"/api/v1/namespaces/{ns}/configmaps?dryRun=All",
            {"metadata": {"name": "dry"}})
    assert r.status == 201 and r.body["metadata"]["name"] == "dry"
    assert api("GET", f"/api/v1/namespaces/{ns}/configmaps/dry").status == 404


def test_delete_preconditions_and_bad_label_selectors(api: Raw, ns: str) -> None:
    create(api, f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": "c"}})
    r = api("DELETE", f"/api/v1/namespaces/{ns}/configmaps/c",
            {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": "nope"}})
    assert r.status == 409 and r.body["reason"] == "Conflict"
    assert r.body["message"].startswith(  # divergence: the emulator had its own words
        'Operation cannot be fulfilled on ConfigMap "c": the UID in the precondition (nope) '
        "does not match the UID in record (")
    r = api("DELETE", f"/api/v1/namespaces/{ns}/configmaps/c")
    assert r.status == 200 and r.body["kind"] == "Status" and r.body["status"] == "Success"
    assert r.body["details"]["name"] == "c" and r.body["details"]["kind"] == "configmaps"
    r = api("GET", f"/api/v1/namespaces/{ns}/configmaps?labelSelector=a%20in%20(")
    assert r.status == 400 and r.body["reason"] == "BadRequest"


def test_list_in_a_missing_namespace_is_empty(api: Raw) -> None:
    r = api("GET", f"{JOBS}/namespaces/no-such-ns-x/pytorchjobs")
    assert r.status == 200 and r.body["items"] == []


def test_a_pods_spec_is_immutable_but_for_images(api: Raw, ns: str) -> None:
    """Divergence: the emulator let any pod spec change through."""
    base = f"/api/v1/namespaces/{ns}/pods"
    create(api, base, pod("p"))
    r = api("PATCH", f"{base}/p", {"spec": {"nodeSelector": {"x": "y"}}}, content_type=MERGE)
    assert r.status == 422 and r.body["reason"] == "Invalid"
    assert r.body["message"].startswith('Pod "p" is invalid: spec: Forbidden: pod updates may '
                                        "not change fields other than")
    r = api("PATCH", f"{base}/p", {"metadata": {"labels": {"x": "y"}}}, content_type=MERGE)
    assert r.status == 200
    r = api("PATCH", f"{base}/p", [{"op": "replace", "path": "/spec/containers/0/image",
                                    "value": "busybox:2"}], content_type=JSON_PATCH)
    assert r.status == 200 and r.body["spec"]["containers"][0]["image"] == "busybox:2"


def test_server_side_apply_needs_a_field_manager(api: Raw, ns: str) -> None:
    """Divergence: the emulator applied without ``fieldManager``."""
    doc = f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: b\n  namespace: {ns}\n"
    path = f"/api/v1/namespaces/{ns}/configmaps/b"
    r = api("PATCH", path, doc.encode(), content_type="application/apply-patch+yaml")
    assert r.status == 422 and "fieldManager: Required value" in r.body["message"]
    r = api("PATCH", path + "?fieldManager=fleetq", doc.encode(),
            content_type="application/apply-patch+yaml")
    assert r.status in (200, 201) and r.body["metadata"]["name"] == "b"


def test_system_namespaces_cannot_be_deleted(api: Raw) -> None:
    """Divergence: the emulator deleted ``default`` (and everything in it)."""
    r = api("DELETE", "/api/v1/namespaces/default")
    assert r.status == 403 and r.body["reason"] == "Forbidden"
    assert r.body["message"] == (
        'namespaces "default" is forbidden: this namespace may not be deleted')


def test_a_deleted_namespace_goes_with_its_objects(api: Raw) -> None:
    """Real: Terminating (creates in it refused) until it is emptied and finalized — by
    the namespace controller, here the lifecycle controller's part of it; the emulator
    removes it at once. Either way it is gone shortly, with its objects."""
    name = f"c-{uuid.uuid4().hex[:8]}"
    create(api, "/api/v1/namespaces", {"metadata": {"name": name}})
    create(api, f"/api/v1/namespaces/{name}/configmaps", {"metadata": {"name": "c"}})
    create(api, f"{JOBS}/namespaces/{name}/pytorchjobs", job("j"))
    r = api("DELETE", f"/api/v1/namespaces/{name}")
    assert r.status == 200 and r.body["status"]["phase"] == "Terminating"
    r = api("POST", f"/api/v1/namespaces/{name}/configmaps", {"metadata": {"name": "new"}})
    assert r.status in (403, 404)  # real: "... because it is being terminated"
    eventually(lambda: api("GET", f"/api/v1/namespaces/{name}").status == 404)
    assert api("GET", f"{JOBS}/namespaces/{name}/pytorchjobs").body["items"] == []
