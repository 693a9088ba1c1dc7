"""The Kubernetes REST API of one emulated cluster, as aiohttp handlers.

Enough of the real API server for the official ``kubernetes`` client and ``kubectl``:
discovery, get/list/create/update/patch/delete/deletecollection/watch on the resources in
:mod:`fleetq.emulator.store`, ``/status`` subresources, label and field selectors,
optimistic concurrency and ``Status`` error bodies. Bearer-token auth and fault
injection (errors, latency) happen here too.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import re
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jsonpatch
import jsonpointer
import yaml
from aiohttp import web

from fleetq import resources as R
from fleetq.emulator.kube_objects import parse_time
from fleetq.emulator.selectors import SelectorError, parse_selectors, selector_matcher
from fleetq.emulator.store import (
    ApiError,
    Obj,
    ResourceType,
    Watcher,
    already_exists,
    dumps,
    invalid,
    not_found,
    status_details,
)
from fleetq.emulator.tables import table, wants_table
from fleetq.kube_values import parse_go_duration
from fleetq.models import DNS1123_LABEL, DNS1123_SUBDOMAIN, pod_requests

if TYPE_CHECKING:
    from fleetq.emulator.cluster import EmulatedCluster

JSON = "application/json"
VERSION = {
    "major": "1", "minor": "29", "gitVersion": "v1.29.0-fleetq", "gitCommit": "fleetq",
    "gitTreeState": "clean", "buildDate": "2024-01-01T00:00:00Z", "goVersion": "go1.21",
    "compiler": "gc", "platform": "linux/amd64",
}
CATEGORIES = {"pods": ["all"], "pytorchjobs": ["all", "kubeflow"]}
DEFAULT_WATCH_TIMEOUT = 1800.0


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    data = body if isinstance(body, bytes) else dumps(body)
    return web.Response(body=data, status=status, content_type=JSON, headers=headers)


def status_response(err: ApiError) -> web.Response:
    return _json(err.status(), err.code, err.headers)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


# ---------------------------------------------------------------------- discovery


def _resource_list(cluster: EmulatedCluster, group: str, version: str) -> dict[str, Any] | None:
    rts = [rt for rt in cluster.store.types.values()
           if rt.group == group and rt.version == version]
    if not rts:
        return None
    resources: list[dict[str, Any]] = []
    for rt in rts:
        entry: dict[str, Any] = {
            "name": rt.plural, "singularName": rt.singular, "namespaced": rt.namespaced,
            "kind": rt.kind, "verbs": list(rt.verbs),
        }
        if rt.short_names:
            entry["shortNames"] = list(rt.short_names)
        if rt.plural in CATEGORIES:
            entry["categories"] = CATEGORIES[rt.plural]
        resources.append(entry)
        if rt.has_status:
            resources.append({"name": f"{rt.plural}/status", "singularName": "",
                              "namespaced": rt.namespaced, "kind": rt.kind,
                              "verbs": ["get", "patch", "update"]})
    return {"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version, "resources": resources}


def _groups(cluster: EmulatedCluster) -> list[dict[str, Any]]:
    seen: dict[str, str] = {}
    for rt in cluster.store.types.values():
        if rt.group:
            seen.setdefault(rt.group, rt.version)
    return [
        {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v}],
         "preferredVersion": {"groupVersion": f"{g}/{v}", "version": v}}
        for g, v in sorted(seen.items())
    ]


# ---------------------------------------------------------------------- validation


def _validate_meta(rt: ResourceType, obj: Obj) -> None:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise invalid(rt, "", "metadata", "Required value")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise invalid(rt, "", "metadata.name", "Required value: name or generateName is required")
    if len(name) > 253 or not DNS1123_SUBDOMAIN.match(name):
        raise invalid(rt, name, "metadata.name",
                      f'Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist of '
                      "lower case alphanumeric characters, '-' or '.'")
    if rt.plural == "namespaces" and (len(name) > 63 or not DNS1123_LABEL.match(name)):
        raise invalid(rt, name, "metadata.name", f'Invalid value: "{name}": not a DNS label')
    for part in ("labels", "annotations"):
        val = meta.get(part)
        if val is None:
            continue
        if not isinstance(val, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in val.items()
        ):
            raise invalid(rt, name, f"metadata.{part}",
                          "Invalid value: must map strings to strings")


def _validate_pod_spec(rt: ResourceType, name: str, path: str, spec: Any) -> None:
    if not isinstance(spec, dict):
        raise invalid(rt, name, path, "Required value")
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        raise invalid(rt, name, f"{path}.containers", "Required value")
    try:
        pod_requests(spec)
    except (R.QuantityError, AttributeError, TypeError) as exc:
        raise invalid(
            rt, name, f"{path}.containers[*].resources", f"Invalid value: {exc}"
        ) from None


def validate(rt: ResourceType, obj: Obj) -> None:
    _validate_meta(rt, obj)
    check_spec = _SPEC_VALIDATORS.get(rt.plural)
    if check_spec is not None:
        check_spec(rt, obj["metadata"]["name"], obj.get("spec"))


def _validate_pod(rt: ResourceType, name: str, spec: Any) -> None:
    _validate_pod_spec(rt, name, "spec", spec)


def _validate_pytorchjob(rt: ResourceType, name: str, spec: Any) -> None:
    """Master/Worker replica specs, each with a non-negative replica count and a pod
    template."""
    specs = spec.get("pytorchReplicaSpecs") if isinstance(spec, dict) else None
    if not isinstance(specs, dict) or not specs:
        raise invalid(rt, name, "spec.pytorchReplicaSpecs", "Required value")
    for role, rs in specs.items():
        if role not in ("Master", "Worker"):
            raise invalid(rt, name, f"spec.pytorchReplicaSpecs.{role}",
                          "Unsupported value: must be Master or Worker")
        if not isinstance(rs, dict):
            raise invalid(rt, name, f"spec.pytorchReplicaSpecs.{role}", "Invalid value")
        reps = rs.get("replicas", 1)
        if isinstance(reps, bool) or not isinstance(reps, int) or reps < 0:
            raise invalid(rt, name, f"spec.pytorchReplicaSpecs.{role}.replicas",
                          "Invalid value: must be a non-negative integer")
        _validate_pod_spec(rt, name, f"spec.pytorchReplicaSpecs.{role}.template.spec",
                           (rs.get("template") or {}).get("spec"))


def _validate_reservation(rt: ResourceType, name: str, spec: Any) -> None:
    """A pod template, at least one owner, and a parseable ``ttl`` / ``expires``."""
    if not isinstance(spec, dict):
        raise invalid(rt, name, "spec", "Required value")
    _validate_pod_spec(rt, name, "spec.template.spec",
                       (spec.get("template") or {}).get("spec"))
    owners = spec.get("owners")
    if not isinstance(owners, list) or not owners:
        raise invalid(rt, name, "spec.owners", "Required value")
    if spec.get("ttl") is not None:
        try:
            parse_go_duration(str(spec["ttl"]))
        except ValueError as exc:
            raise invalid(rt, name, "spec.ttl", f"Invalid value: {exc}") from None
    if spec.get("expires") is not None:
        try:
            parse_time(str(spec["expires"]))
        except ValueError:
            raise invalid(rt, name, "spec.expires",
                          "Invalid value: must be an RFC3339 time") from None


#: ``metav1.MicroTime`` on the wire: RFC 3339 with exactly six fractional digits
MICRO_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}(Z|[+-]\d{2}:\d{2})$")
_MICRO_LAYOUT = "2006-01-02T15:04:05.000000Z07:00"


def _lease_invalid(rt: ResourceType, name: str, field_path: str, value: int,
                   rule: str) -> ApiError:
    """A Lease's 422 as kube-apiserver words it (``Lease.coordination.k8s.io "x"``)."""
    message = f"Invalid value: {value}: {rule}"
    return ApiError(
        422, "Invalid",
        f'{rt.kind}.{rt.group} "{name}" is invalid: {field_path}: {message}',
        {"name": name, "group": rt.group, "kind": rt.kind, "causes": [
            {"reason": "FieldValueInvalid", "message": message, "field": field_path}]},
    )


def _validate_lease(rt: ResourceType, name: str, spec: Any) -> None:
    """What kube-apiserver checks of a ``coordination.k8s.io/v1`` Lease: its times decode
    as MicroTime (else 400, the body cannot be decoded), its counters are integers, the
    duration is positive and the transitions are not negative (else 422)."""
    if spec is None:
        return
    if not isinstance(spec, dict):
        raise bad_request(f'{rt.kind} in version "{rt.version}" cannot be handled as a '
                          f"{rt.kind}: spec must be an object")
    for key in ("acquireTime", "renewTime"):
        value = spec.get(key)
        if value is not None and (not isinstance(value, str) or not MICRO_TIME.match(value)):
            raise bad_request(f'{rt.kind} in version "{rt.version}" cannot be handled as a '
                              f'{rt.kind}: parsing time "{value}" as "{_MICRO_LAYOUT}": '
                              "cannot parse it")
    for key, low, rule in (("leaseDurationSeconds", 1, "must be greater than 0"),
                           ("leaseTransitions", 0, "must be greater than or equal to 0")):
        value = spec.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad_request(f'{rt.kind} in version "{rt.version}" cannot be handled as a '
                              f"{rt.kind}: spec.{key}: expected an integer")
        if value < low:
            raise _lease_invalid(rt, name, f"spec.{key}", value, rule)


#: resources whose updates must name a resourceVersion (their registry strategy's
#: ``AllowUnconditionalUpdate`` is false): a PUT without one is 422
CONDITIONAL_UPDATES = frozenset({"leases"})


#: per resource, the check of its ``spec`` (name, spec) beyond the common metadata
_SPEC_VALIDATORS: dict[str, Callable[[ResourceType, str, Any], None]] = {
    "pods": _validate_pod,
    "pytorchjobs": _validate_pytorchjob,
    "leases": _validate_lease,
    "reservations": _validate_reservation,
}


def _initialize_created(rt: ResourceType, obj: Obj) -> None:
    """What the API server sets on an object it is creating: a pod's default requests
    and Pending status with its QoS class, a namespace's Active status, ``kubernetes``
    finalizer and name label; the status a client sent on a custom resource or claim is
    dropped (a claim starts Bound)."""
    meta = obj["metadata"]
    if rt.plural == "pods":
        if isinstance(obj.get("spec"), dict):
            default_requests(obj["spec"])
        obj["status"] = {"phase": "Pending", "qosClass": qos_class(obj.get("spec") or {})}
    elif rt.plural == "namespaces":
        obj["status"] = {"phase": "Active"}
        obj.setdefault("spec", {"finalizers": ["kubernetes"]})
        meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta["name"]
    elif rt.plural in ("pytorchjobs", "reservations", "persistentvolumeclaims"):
        obj.pop("status", None)
        if rt.plural == "persistentvolumeclaims":
            obj["status"] = {"phase": "Bound"}


# ---------------------------------------------------------------------- custom resources

#: The structural schemas of the two CRDs (upstream training-operator v1.8.1 and
#: Koordinator v1.7.0), down to where they stop constraining (None: any value kept;
#: "*": any key). A real API server drops fields these do not name and fills defaults.
Schema = dict[str, Any]
_SCHED = dict.fromkeys(("minAvailable", "minResources", "priorityClass", "queue",
                        "scheduleTimeoutSeconds"))
_RUN_POLICY: Schema = {**dict.fromkeys(("activeDeadlineSeconds", "backoffLimit",
                                         "cleanPodPolicy", "suspend",
                                         "ttlSecondsAfterFinished")),
                       "schedulingPolicy": _SCHED}
SCHEMAS: dict[str, Schema] = {
    "pytorchjobs": {
        "spec": {"elasticPolicy": None, "nprocPerNode": None, "runPolicy": _RUN_POLICY,
                 "pytorchReplicaSpecs": {"*": dict.fromkeys(
                     ("replicas", "restartPolicy", "template"))}},
        "status": dict.fromkeys(("completionTime", "conditions", "lastReconcileTime",
                                 "replicaStatuses", "startTime")),
    },
    "reservations": {
        "spec": dict.fromkeys(("allocateOnce", "allocatePolicy", "expires", "owners",
                               "preAllocation", "taints", "template", "ttl",
                               "unschedulable")),
        "status": dict.fromkeys(("allocatable", "allocated", "conditions", "currentOwners",
                                 "nodeName", "phase")),
    },
}
#: (path of the parent object, field, default) — applied when the parent is present.
DEFAULTS: dict[str, list[tuple[tuple[str, ...], str, Any]]] = {
    "pytorchjobs": [(("spec", "runPolicy"), "suspend", False)],
    "reservations": [(("spec",), "allocateOnce", True), (("spec",), "ttl", "24h")],
}
_TOP = ("apiVersion", "kind", "metadata")


def prune(rt: ResourceType, obj: Obj) -> list[str]:
    """Drop the fields a custom resource's schema does not know (in place), fill its
    defaults; returns the dropped paths (``spec.cleanPodPolicy``)."""
    schema = SCHEMAS.get(rt.plural)
    if schema is None:
        return []
    dropped: list[str] = []
    _drop_unknown(obj, schema, "", dropped)
    _fill_defaults(obj, DEFAULTS.get(rt.plural, []))
    return dropped


def _drop_unknown(node: Any, sch: Schema, path: str, dropped: list[str]) -> None:
    """Delete the keys of ``node`` (at ``path``) that ``sch`` does not name, recursively,
    appending each dropped path to ``dropped``; the top-level object keys stay."""
    if not isinstance(node, dict):
        return
    for key in list(node):
        if path == "" and key in _TOP:
            continue
        sub = sch.get("*", sch.get(key, ...)) if "*" in sch else sch.get(key, ...)
        if sub is ...:
            dropped.append(f"{path}{key}")
            del node[key]
        elif isinstance(sub, dict):
            _drop_unknown(node[key], sub, f"{path}{key}.", dropped)


def _fill_defaults(obj: Obj, defaults: list[tuple[tuple[str, ...], str, Any]]) -> None:
    """Set each default field whose parent object is present and lacks it."""
    for parent_path, key, value in defaults:
        parent: Any = obj
        for part in parent_path:
            parent = parent.get(part) if isinstance(parent, dict) else None
        if isinstance(parent, dict) and key not in parent:
            parent[key] = value


def strict_error(rt: ResourceType, dropped: list[str]) -> ApiError:
    fields = ", ".join(f'unknown field "{f}"' for f in dropped)
    return bad_request(f'{rt.kind} in version "{rt.version}" cannot be handled as a '
                       f"{rt.kind}: strict decoding error: {fields}")


def warning_headers(dropped: list[str]) -> dict[str, str]:
    if not dropped:
        return {}
    return {"Warning": ", ".join(f'299 - "unknown field \\"{f}\\""' for f in dropped)}


#: Field selectors each resource supports (the real ones; the rest get 400).
FIELD_LABELS: dict[str, tuple[str, ...]] = {
    "pods": ("spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
             "spec.serviceAccountName", "spec.hostNetwork", "status.phase", "status.podIP",
             "status.podIPs", "status.nominatedNodeName"),
    "nodes": ("spec.unschedulable",),
    "namespaces": ("status.phase",),
    "secrets": ("type",),
    "events": ("involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
               "involvedObject.uid", "involvedObject.apiVersion",
               "involvedObject.resourceVersion", "involvedObject.fieldPath", "reason",
               "reportingComponent", "source", "type"),
}
_FIELD_KEY = re.compile(r"^\s*([^!=\s]+)\s*(?:!=|==|=)")


def check_field_selector(rt: ResourceType, text: str | None) -> None:
    for term in (text or "").split(","):
        m = _FIELD_KEY.match(term)
        if not m:
            continue  # the selector parser reports malformed terms
        key = m.group(1)
        if key not in ("metadata.name", "metadata.namespace") + FIELD_LABELS.get(rt.plural, ()):
            raise bad_request(f"field label not supported: {key}")


def qos_class(spec: Mapping[str, Any]) -> str:
    """The pod's QoS class, as the API server computes it on create."""
    containers = [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    for c in containers:
        res = (c or {}).get("resources") or {}
        for k, v in (res.get("requests") or {}).items():
            requests.setdefault(k, []).append(v)
        for k, v in (res.get("limits") or {}).items():
            limits.setdefault(k, []).append(v)
    if not requests and not limits:
        return "BestEffort"
    for c in containers:
        res = (c or {}).get("resources") or {}
        lim = res.get("limits") or {}
        req = res.get("requests") or {}
        for name in ("cpu", "memory"):
            if name not in lim or R.parse_milli(req.get(name, lim[name])) != R.parse_milli(
                    lim[name]):
                return "Burstable"
    return "Guaranteed"


def default_requests(spec: dict[str, Any]) -> None:
    """Requests default to limits, per container (what the real server stores)."""
    for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        res = (c or {}).get("resources") if isinstance(c, dict) else None
        if not isinstance(res, dict) or not isinstance(res.get("limits"), dict):
            continue
        req = res.setdefault("requests", {})
        if isinstance(req, dict):
            for k, v in res["limits"].items():
                req.setdefault(k, v)


# ---------------------------------------------------------------------- patches


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (strategic merge is treated the same on built-in
    types; custom resources refuse it, as the real server does)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902 JSON patch (the ``jsonpatch`` library) on a copy of ``doc``, failing as
    kube-apiserver does: a body that is not a list of operations is 400 BadRequest (it
    cannot be decoded); an operation that cannot be applied (a failed ``test``, a missing
    path, an unknown op) is 422 Invalid. A pointer without its leading ``/`` is 422 too
    (kube-apiserver's evanphx/json-patch drops its first segment and applies the rest)."""
    if not isinstance(ops, list) or not all(isinstance(op, dict) for op in ops):
        raise bad_request("a JSON patch must be a list of operations")
    try:
        return jsonpatch.JsonPatch(ops).apply(doc)
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException,
            KeyError, IndexError, TypeError, ValueError) as exc:
        raise ApiError(422, "Invalid", f"JSON patch failed: {exc}") from None


# ---------------------------------------------------------------------- handlers


#: the resource paths below ``/api/{version}`` and ``/apis/{group}/{version}``; a namespaced
#: path's resource is never ``status``/``finalize`` (``namespaces/{name}/status`` is the
#: namespace's subresource)
_NAMESPACED = "/namespaces/{namespace}/{resource:(?!(?:status|finalize)(?:/|$))[^/]+}"
RESOURCE_PATHS = (
    _NAMESPACED,
    _NAMESPACED + "/{name}",
    _NAMESPACED + "/{name}/{subresource}",
    "/{resource}",
    "/{resource}/{name}",
    "/{resource}/{name}/{subresource}",
)
#: served without a token (probes and ``GET /version``)
OPEN_PATHS = frozenset({"/healthz", "/livez", "/readyz", "/version"})


@dataclass(frozen=True)
class Target:
    """What a resource path names: a collection (``name`` None), an object, or one of its
    subresources."""

    rt: ResourceType
    namespace: str | None
    name: str | None
    subresource: str | None


class Handler:
    """The request handlers of one cluster's API port."""

    def __init__(self, cluster: EmulatedCluster) -> None:
        self.cluster = cluster
        self.store = cluster.store

    def add_routes(self, router: web.UrlDispatcher) -> None:
        """Discovery, probes and every resource path, each with and without a trailing
        slash (the kubernetes client asks ``/apis/``, ``/api/v1/``, ``/version/``). Any
        method: a verb the path does not take is 405 once the path is known to exist."""

        def add(path: str, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> None:
            router.add_route("*", path, handler)
            router.add_route("*", path + "/", handler)

        for path in ("/healthz", "/livez", "/readyz"):
            add(path, self.ok)
        add("/version", self.version)
        router.add_route("*", "/", self.root)
        add("/api", self.core_versions)
        add("/apis", self.group_list)
        add("/apis/{group}", self.api_group)
        for prefix in ("/api/{version}", "/apis/{group}/{version}"):
            add(prefix, self.resource_list)
            for path in RESOURCE_PATHS:
                add(prefix + path, self.resource)

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Bearer-token auth and injected faults before any handler; errors (an
        :class:`ApiError`, a path no route matches) as ``Status`` bodies."""
        resource = request.match_info.route.resource
        if resource is not None and resource.canonical.rstrip("/") in OPEN_PATHS:
            return await handler(request)
        auth = request.headers.get("Authorization", "")
        if not secrets.compare_digest(auth.encode(), f"Bearer {self.cluster.token}".encode()):
            return status_response(ApiError(401, "Unauthorized", "Unauthorized"))
        faults = self.cluster.faults
        if faults.latency > 0:
            await asyncio.sleep(faults.latency)
        if (err := faults.injected_error()) is not None:
            return status_response(err)
        try:
            return await handler(request)
        except web.HTTPNotFound:
            return status_response(_no_route())
        except ApiError as exc:
            return status_response(exc)
        except SelectorError as exc:
            return status_response(bad_request(str(exc)))

    # ------------------------------------------------------------------ discovery

    async def ok(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def version(self, request: web.Request) -> web.Response:
        return _json(VERSION)

    async def root(self, request: web.Request) -> web.Response:
        return _json({"paths": ["/api", "/api/v1", "/apis", "/version", "/healthz"]})

    async def core_versions(self, request: web.Request) -> web.Response:
        return _json({"kind": "APIVersions", "versions": ["v1"],
                      "serverAddressByClientCIDRs": [
                          {"clientCIDR": "0.0.0.0/0", "serverAddress": request.host}]})

    async def group_list(self, request: web.Request) -> web.Response:
        return _json({"kind": "APIGroupList", "apiVersion": "v1",
                      "groups": _groups(self.cluster)})

    async def api_group(self, request: web.Request) -> web.Response:
        for g in _groups(self.cluster):
            if g["name"] == request.match_info["group"]:
                return _json({"kind": "APIGroup", "apiVersion": "v1", **g})
        raise _no_route()

    async def resource_list(self, request: web.Request) -> web.Response:
        m = request.match_info
        listing = _resource_list(self.cluster, m.get("group", ""), m["version"])
        if listing is None:
            raise _no_route()
        return _json(listing)

    # ------------------------------------------------------------------ resources

    def target(self, request: web.Request) -> Target:
        """The resource type and object a resource path names; 404 for a type this
        group/version does not serve, a namespace on a cluster-scoped type, an unknown
        subresource or a namespaced object named without its namespace."""
        m = request.match_info
        rt = self.store.types.get(m["resource"])
        if rt is None or rt.group != m.get("group", "") or rt.version != m["version"]:
            raise _no_route()
        namespace, name, sub = m.get("namespace"), m.get("name"), m.get("subresource")
        if namespace is not None and not rt.namespaced:
            raise _no_route()
        if (sub is not None and (sub != "status" or not rt.has_status)
                and not (rt.plural == "namespaces" and sub == "finalize")):
            raise _no_route()
        if rt.namespaced and name is not None and namespace is None:
            raise _no_route()
        return Target(rt, namespace, name, sub)

    async def resource(self, request: web.Request) -> web.StreamResponse:
        t = self.target(request)
        if t.name is None:
            return await self.collection(request, t.rt, t.namespace)
        return await self.item(request, t.rt, t.namespace or "", t.name, t.subresource)

    async def collection(
        self, request: web.Request, rt: ResourceType, namespace: str | None
    ) -> web.StreamResponse:
        method = request.method
        q = request.query
        if method == "GET":
            check_field_selector(rt, q.get("fieldSelector"))
            selection = parse_selectors(q.get("labelSelector"), q.get("fieldSelector"))
            matcher = selection.matcher
            if q.get("watch") in ("true", "1", "True"):
                return await self.watch(request, rt, namespace, matcher)
            if wants_table(request.headers.get("Accept", "")):
                objs = [o for o in self.store.items(rt.plural, namespace)
                        if matcher is None or matcher(o)]
                return _json(table(rt.plural, objs, str(self.store.rv)))
            try:
                limit = int(q.get("limit") or 0)
            except ValueError:
                raise bad_request(f"invalid limit {q.get('limit')!r}") from None
            return _json(self.store.list_json(
                rt.plural, namespace, matcher, selection.equality, limit=limit,
                token=q.get("continue") or ""))
        if method == "POST":
            if rt.namespaced and namespace is None:
                raise _no_route()
            return self.create(rt, namespace, await _body(request), q.get("dryRun"),
                               q.get("fieldValidation"))
        if method == "DELETE":
            check_field_selector(rt, q.get("fieldSelector"))
            matcher = selector_matcher(q.get("labelSelector"), q.get("fieldSelector"))
            return self.delete_collection(rt, namespace, matcher)
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported here")

    async def item(
        self, request: web.Request, rt: ResourceType, ns: str, name: str, sub: str | None
    ) -> web.StreamResponse:
        method = request.method
        q = request.query
        if method == "GET":
            obj = self.store.get(rt.plural, ns, name)
            if obj is None:
                raise not_found(rt, name)
            if wants_table(request.headers.get("Accept", "")):
                return _json(table(rt.plural, [obj], str(self.store.rv)))
            return _json(self.store.cached_json(obj))
        if method == "PUT":
            return self.update(rt, ns, name, sub, await _body(request), q.get("dryRun"),
                               q.get("fieldValidation"))
        if method == "PATCH":
            body = await _body(request)
            return self.patch(rt, ns, name, sub, body, request.content_type, q.get("dryRun"),
                              q.get("fieldValidation"), q.get("fieldManager"))
        if method == "DELETE":
            raw = await request.read()
            opts: Any = {}
            if raw:
                with contextlib.suppress(ValueError):
                    opts = json.loads(raw) or {}
            return self.delete(rt, ns, name, opts if isinstance(opts, dict) else {})
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported here")

    # ------------------------------------------------------------------ verbs

    def _ensure_namespace(self, namespace: str) -> None:
        if self.store.get("namespaces", "", namespace) is None:
            raise ApiError(404, "NotFound", f'namespaces "{namespace}" not found',
                           {"name": namespace, "kind": "namespaces"})

    def _check_identity(self, rt: ResourceType, obj: Obj, namespace: str | None) -> None:
        if not isinstance(obj, dict):
            raise bad_request("the request body must be a JSON object")
        kind = obj.get("kind")
        if kind and kind != rt.kind:
            raise bad_request(f"the kind {kind!r} does not match the resource {rt.plural!r}")
        api_version = obj.get("apiVersion")
        if api_version and api_version != rt.api_version:
            raise bad_request(
                f"the API version {api_version!r} does not match the expected API version "
                f"{rt.api_version!r}"
            )
        meta = obj.get("metadata")
        if meta is None:
            obj["metadata"] = meta = {}
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        if rt.namespaced:
            body_ns = meta.get("namespace")
            if body_ns and namespace and body_ns != namespace:
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent "
                    "on the request"
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)

    def create(
        self, rt: ResourceType, namespace: str | None, obj: Any, dry_run: str | None,
        field_validation: str | None = None,
    ) -> web.Response:
        self._check_identity(rt, obj, namespace)
        meta = obj["metadata"]
        if meta.get("resourceVersion"):
            raise ApiError(500, "", "resourceVersion should not be set on objects to be "
                                    "created")
        dropped = prune(rt, obj)
        if dropped and field_validation == "Strict":
            raise strict_error(rt, dropped)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = str(meta["generateName"]) + secrets.token_hex(3)[:5]
        validate(rt, obj)
        if rt.namespaced:
            assert namespace is not None
            self._ensure_namespace(namespace)
        for k in ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp",
                  "generation"):
            meta.pop(k, None)
        if self.store.get(rt.plural, namespace or "", meta["name"]) is not None:
            raise already_exists(rt, meta["name"])
        _initialize_created(rt, obj)
        if rt.plural == "reservations":
            self.cluster.controller.admit_reservation(obj)
        if dry_run:
            return _json(obj, 201, warning_headers(dropped))
        stored = self.store.create(rt.plural, obj)
        if rt.plural == "reservations":
            self.cluster.controller.reservation_created(stored)
        return _json(self.store.cached_json(stored), 201, warning_headers(dropped))

    def _write(
        self, rt: ResourceType, cur: Obj, new: Any, sub: str | None, expect_rv: str | None,
        dry_run: str | None, field_validation: str | None = None,
    ) -> web.Response:
        if not isinstance(new, dict):
            raise bad_request("the request body must be a JSON object")
        dropped = prune(rt, new)
        if dropped and field_validation == "Strict":
            raise strict_error(rt, dropped)
        if sub == "status":
            obj = copy.deepcopy(cur)
            obj["status"] = new.get("status")
            if obj["status"] is None:
                obj.pop("status")
        else:
            obj = new
            if rt.has_status:  # the main resource never writes status (nodes neither)
                if "status" in cur:
                    obj["status"] = copy.deepcopy(cur["status"])
                else:
                    obj.pop("status", None)
            ns = cur["metadata"].get("namespace")
            self._check_identity(rt, obj, ns)
            if obj["metadata"].get("name") != cur["metadata"]["name"]:
                raise bad_request("the name of the object does not match the name on the URL")
            obj["metadata"].pop("deletionTimestamp", None)
            validate(rt, obj)
            if rt.plural == "pods" and mutable_pod_spec(obj.get("spec")) != mutable_pod_spec(
                    cur.get("spec")):
                raise invalid(rt, cur["metadata"]["name"], "spec",
                              "Forbidden: pod updates may not change fields other than "
                              "`spec.containers[*].image`,`spec.initContainers[*].image`,"
                              "`spec.activeDeadlineSeconds`,`spec.tolerations` (only "
                              "additions to existing tolerations),"
                              "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 "
                              "if it was previously negative)")
        if dry_run:
            return _json(obj, headers=warning_headers(dropped))
        stored = self.store.replace(rt.plural, obj, expect_rv=expect_rv)
        return _json(self.store.cached_json(stored), headers=warning_headers(dropped))

    def update(
        self, rt: ResourceType, ns: str, name: str, sub: str | None, body: Any,
        dry_run: str | None, field_validation: str | None = None,
    ) -> web.Response:
        cur = self.store.get(rt.plural, ns, name)
        if cur is None:
            raise not_found(rt, name)
        if not isinstance(body, dict):
            raise bad_request("the request body must be a JSON object")
        raw_meta = body.get("metadata")
        meta: dict[str, Any] = raw_meta if isinstance(raw_meta, dict) else {}
        if meta.get("name") and meta["name"] != name:
            raise bad_request(
                f'the name of the object ({meta["name"]}) does not match the name on the URL '
                f"({name})"
            )
        rv = meta.get("resourceVersion") or None
        if rv is None and rt.plural in CONDITIONAL_UPDATES:
            message = "Invalid value: 0: must be specified for an update"
            raise ApiError(
                422, "Invalid",
                f'{rt.group_resource} "{name}" is invalid: metadata.resourceVersion: {message}',
                status_details(rt, name, causes=[{
                    "reason": "FieldValueInvalid", "message": message,
                    "field": "metadata.resourceVersion"}]),
            )
        if sub == "status":
            return self._write(rt, cur, body, sub, rv, dry_run, field_validation)
        body.setdefault("metadata", {})["name"] = name
        return self._write(rt, cur, body, sub, rv, dry_run, field_validation)

    def patch(
        self, rt: ResourceType, ns: str, name: str, sub: str | None, body: Any,
        content_type: str, dry_run: str | None, field_validation: str | None = None,
        field_manager: str | None = None,
    ) -> web.Response:
        if content_type == "application/strategic-merge-patch+json" and rt.plural in SCHEMAS:
            raise ApiError(415, "UnsupportedMediaType",
                           "the body of the request was in an unknown format - accepted "
                           "media types include: application/json-patch+json, "
                           "application/merge-patch+json, application/apply-patch+yaml")
        if content_type == "application/apply-patch+yaml" and not field_manager:
            raise ApiError(422, "Invalid", 'PatchOptions.meta.k8s.io "" is invalid: '
                           "fieldManager: Required value: is required for apply patch",
                           {"group": "meta.k8s.io", "kind": "PatchOptions", "causes": [{
                               "reason": "FieldValueRequired", "field": "fieldManager",
                               "message": "Required value: is required for apply patch"}]})
        cur = self.store.get(rt.plural, ns, name)
        if cur is None:
            if content_type == "application/apply-patch+yaml" and sub is None:
                return self.create(rt, ns or None, body, dry_run)
            raise not_found(rt, name)
        if content_type == "application/json-patch+json":
            merged = json_patch(cur, body)
            expect = None
        else:
            if not isinstance(body, dict):
                raise bad_request("a merge patch must be a JSON object")
            merged = merge_patch(copy.deepcopy(cur), body)
            pmeta = body.get("metadata")
            expect = pmeta.get("resourceVersion") if isinstance(pmeta, dict) else None
        if sub == "status":
            return self._write(rt, cur, merged, sub, expect, dry_run, field_validation)
        if not isinstance(merged, dict):
            raise ApiError(422, "Invalid", "the patched object is not a JSON object")
        merged.setdefault("metadata", {})
        if isinstance(merged["metadata"], dict):
            merged["metadata"]["name"] = name
            merged["metadata"].pop("resourceVersion", None)
        return self._write(rt, cur, merged, sub, expect, dry_run, field_validation)

    def delete(self, rt: ResourceType, ns: str, name: str, opts: dict[str, Any]) -> web.Response:
        cur = self.store.get(rt.plural, ns, name)
        if cur is None:
            raise not_found(rt, name)
        pre = opts.get("preconditions") or {}
        if pre.get("uid") and pre["uid"] != cur["metadata"]["uid"]:
            raise ApiError(409, "Conflict",
                           f'Operation cannot be fulfilled on {rt.kind} "{name}": the UID in '
                           f'the precondition ({pre["uid"]}) does not match the UID in record '
                           f'({cur["metadata"]["uid"]}). The object might have been deleted '
                           "and then recreated", status_details(rt, name))
        if rt.plural == "namespaces" and name in PROTECTED_NAMESPACES:
            raise ApiError(403, "Forbidden",
                           f'namespaces "{name}" is forbidden: this namespace may not be '
                           "deleted", status_details(rt, name))
        if rt.plural == "namespaces":
            for other in self.store.types.values():
                if other.namespaced:
                    for obj in self.store.items(other.plural, name):
                        self.store.delete(other.plural, name, obj["metadata"]["name"])
        gone = self.store.delete(rt.plural, ns, name, expect_rv=pre.get("resourceVersion"))
        if rt.plural in ("pods", "namespaces"):
            if rt.plural == "namespaces":
                gone = {**gone, "status": {"phase": "Terminating"}}
            return _json(gone)
        return _json(_success(rt, name, gone["metadata"].get("uid", "")))

    def delete_collection(
        self, rt: ResourceType, namespace: str | None, matcher: Any
    ) -> web.Response:
        for obj in list(self.store.items(rt.plural, namespace)):
            if matcher is None or matcher(obj):
                meta = obj["metadata"]
                if rt.plural == "namespaces":
                    self.delete(rt, "", meta["name"], {})
                else:
                    self.store.delete(rt.plural, meta.get("namespace", ""), meta["name"])
        return _json({"kind": "Status", "apiVersion": "v1", "metadata": {},
                      "status": "Success"})

    async def watch(
        self, request: web.Request, rt: ResourceType, namespace: str | None, matcher: Any
    ) -> web.StreamResponse:
        since, timeout, initial = _watch_options(request.query)
        resp = web.StreamResponse(status=200, headers={"Content-Type": JSON})
        resp.enable_chunked_encoding()
        try:
            watcher = self.store.watch(rt.plural, namespace, matcher, since)
            if initial:  # then the bookmark that ends the initial events (WatchList)
                mark = {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": {
                    "resourceVersion": str(self.store.rv),
                    "annotations": {"k8s.io/initial-events-end": "true"}}}
                watcher.queue.put_nowait(b'{"type":"BOOKMARK","object":' + dumps(mark) + b"}\n")
        except ApiError as exc:
            await resp.prepare(request)
            await resp.write(b'{"type":"ERROR","object":' + dumps(exc.status()) + b"}\n")
            await resp.write_eof()
            return resp
        try:
            await resp.prepare(request)
            await _stream_events(resp, watcher, timeout)
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError, RuntimeError):
            pass
        finally:
            self.store.unwatch(watcher)
        return resp


def _watch_options(q: Mapping[str, str]) -> tuple[int | None, float, bool]:
    """A watch's (resource version to start after, timeout in seconds, whether the
    initial state comes first as events); 400 for a bad ``resourceVersion`` or
    ``timeoutSeconds``."""
    raw_rv = q.get("resourceVersion") or ""
    since: int | None = None
    if raw_rv not in ("", "0"):
        try:
            since = int(raw_rv)
        except ValueError:
            raise bad_request(f"invalid resourceVersion {raw_rv!r}") from None
    try:
        timeout = float(q.get("timeoutSeconds") or DEFAULT_WATCH_TIMEOUT)
    except ValueError:
        raise bad_request("timeoutSeconds must be a number") from None
    initial = watch_list(q)
    if initial:
        since = None  # the current state first, "not older than" any given version
    return since, timeout, initial


async def _stream_events(resp: web.StreamResponse, watcher: Watcher, timeout: float) -> None:
    """Write the watcher's event lines to ``resp`` (up to 1000 a chunk) until the
    timeout passes or the watch is closed."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(0.0, timeout)
    while True:
        remaining = deadline - loop.time()
        if remaining <= 0:
            return
        try:
            line = await asyncio.wait_for(watcher.queue.get(), remaining)
        except TimeoutError:
            return
        if line is None:
            return
        buf = [line]
        while not watcher.queue.empty() and len(buf) < 1000:
            nxt = watcher.queue.get_nowait()
            if nxt is None:
                watcher.closed = True
                break
            buf.append(nxt)
        await resp.write(b"".join(buf))
        if watcher.closed and watcher.queue.empty():
            return


#: Namespaces the real API server refuses to delete.
PROTECTED_NAMESPACES = frozenset({"default", "kube-system", "kube-public"})


def mutable_pod_spec(spec: Any) -> Any:
    """A pod spec without what an update may change (images, activeDeadlineSeconds,
    tolerations, terminationGracePeriodSeconds): two specs that differ here are a 422."""
    if not isinstance(spec, dict):
        return spec
    out = {k: v for k, v in spec.items() if k not in (
        "activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds")}
    for key in ("containers", "initContainers"):
        if isinstance(out.get(key), list):
            out[key] = [{k: v for k, v in c.items() if k != "image"}
                        if isinstance(c, dict) else c for c in out[key]]
    return out


def watch_list(q: Mapping[str, str]) -> bool:
    """Whether a watch asks for its initial state as events (``sendInitialEvents``, the
    WatchList protocol); 422 unless it also asks what the real server requires."""
    raw = q.get("sendInitialEvents")
    if raw is None:
        return False
    for field_name, ok, want in (
        ("resourceVersionMatch", q.get("resourceVersionMatch") == "NotOlderThan",
         "resourceVersionMatch to NotOlderThan"),
        ("allowWatchBookmarks", q.get("allowWatchBookmarks") in ("true", "1"),
         "allowWatchBookmarks to true"),
    ):
        if not ok:
            msg = f"Forbidden: sendInitialEvents requires setting {want}"
            raise ApiError(422, "Invalid",
                           f'ListOptions.meta.k8s.io "" is invalid: {field_name}: {msg}',
                           {"group": "meta.k8s.io", "kind": "ListOptions", "causes": [
                               {"reason": "FieldValueForbidden", "message": msg,
                                "field": field_name}]})
    return raw in ("true", "1")


def _success(rt: ResourceType, name: str, uid: str) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name, "kind": rt.plural, "uid": uid}
    if rt.group:
        details["group"] = rt.group
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
            "details": details}


def _no_route() -> ApiError:
    cause = {"reason": "UnexpectedServerResponse", "message": "404 page not found"}
    return ApiError(404, "NotFound", "the server could not find the requested resource",
                    {"causes": [cause]})


_YAML_TYPES = re.compile(r"yaml", re.I)


async def _body(request: web.Request) -> Any:
    raw = await request.read()
    if not raw:
        raise bad_request("the request body is empty")
    try:
        if _YAML_TYPES.search(request.content_type or ""):
            return yaml.safe_load(raw)
        return json.loads(raw)
    except (ValueError, yaml.YAMLError) as exc:
        raise bad_request(f"the request body is not valid JSON: {str(exc)[:120]}") from None


def build_app(cluster: EmulatedCluster) -> web.Application:
    handler = Handler(cluster)
    app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[handler.middleware])
    handler.add_routes(app.router)
    return app
