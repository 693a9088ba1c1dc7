"""The Kubernetes objects the emulator's controllers write, and how they read them.

One place for the shapes every controller shares (conditions, owner references, events,
Node and Namespace objects, a finished pod) so the operator, the gang scheduler, the
reservation controller and the pod lifecycle word them alike; the real control planes'
lifecycle driver (``fleetq.controlplane``) writes the same shapes.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from fleetq.emulator.store import Key, Obj, Store, now_iso
from fleetq.kube_values import parse_rfc3339

TERMINAL = ("Succeeded", "Failed")


def parse_time(text: str) -> float:
    """RFC 3339 → epoch seconds; ValueError when it is not a timestamp."""
    parsed = parse_rfc3339(str(text))
    if parsed is None:
        raise ValueError(f"{str(text)[:40]!r} is not an RFC 3339 time")
    return parsed.timestamp()


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def key_of(obj: Obj) -> Key:
    meta = obj["metadata"]
    return (meta.get("namespace") or "", meta["name"])


def ref_of(obj: Obj) -> dict[str, Any]:
    """An ``involvedObject`` reference to ``obj``."""
    return {
        "apiVersion": obj.get("apiVersion", "v1"), "kind": obj.get("kind", ""),
        "name": obj["metadata"]["name"], "uid": obj["metadata"].get("uid", ""),
    }


def node_ip(store: Store, node: str) -> str:
    n = store.get("nodes", "", node)
    for a in ((n or {}).get("status") or {}).get("addresses") or []:
        if a.get("type") == "InternalIP":
            return str(a.get("address"))
    return ""


def job_owner(pod: Obj) -> str | None:
    """The name of the PyTorchJob owning ``pod``, if any."""
    for ref in pod["metadata"].get("ownerReferences") or []:
        if ref.get("kind") == "PyTorchJob":
            return str(ref.get("name"))
    return None


def owner_uid(pod: Obj) -> str | None:
    for ref in pod["metadata"].get("ownerReferences") or []:
        if ref.get("kind") == "PyTorchJob":
            return str(ref.get("uid"))
    return None


def cond(type_: str, status: str, reason: str, message: str) -> dict[str, Any]:
    now = now_iso()
    c: dict[str, Any] = {"type": type_, "status": status, "lastTransitionTime": now}
    if reason:
        c["reason"] = reason
    if message:
        c["message"] = message
    return c


def set_condition(status: dict[str, Any], new: dict[str, Any]) -> None:
    """Replace the condition of ``new``'s type (keeping its transition time when its
    status did not change) or append it."""
    conds = status.setdefault("conditions", [])
    for i, c in enumerate(conds):
        if c.get("type") == new["type"]:
            if c.get("status") == new["status"]:
                new["lastTransitionTime"] = c.get("lastTransitionTime", new["lastTransitionTime"])
            conds[i] = new
            return
    conds.append(new)


def condition_true(status: Mapping[str, Any], ctype: str) -> bool:
    return any(
        c.get("type") == ctype and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def namespace_object(name: str) -> Obj:
    return {
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}},
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    }


def node_object(name: str, group: Any, cluster: str, index: int) -> Obj:
    capacity = {k: str(v) for k, v in group.capacity_quantities().items()}
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "fleetq-emulated",
        "fleetq.io/cluster": cluster,
        **group.labels,
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": {}},
        "spec": {"taints": [t.model_dump() for t in group.taints]} if group.taints else {},
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady",
                 "message": "emulated kubelet is posting ready status",
                 "lastHeartbeatTime": now_iso(), "lastTransitionTime": now_iso()},
            ],
            "addresses": [
                {"type": "InternalIP", "address": f"10.{(index >> 8) & 255}.{index & 255}.1"},
                {"type": "Hostname", "address": name},
            ],
            "nodeInfo": {
                "kubeletVersion": "v1.29.0-fleetq", "containerRuntimeVersion": "emulated://1",
                "operatingSystem": "linux", "architecture": "amd64",
                "osImage": "fleetq emulator", "kernelVersion": "0",
                "kubeProxyVersion": "v1.29.0-fleetq", "machineID": "", "systemUUID": "",
                "bootID": "",
            },
        },
    }


def finished_pod(pod: Obj, phase: str, reason: str) -> Obj:
    """A copy of ``pod`` terminated in ``phase`` (its containers exited 0 or 1)."""
    new = copy.deepcopy(pod)
    now = now_iso()
    st = new.setdefault("status", {})
    st["phase"] = phase
    code = 0 if phase == "Succeeded" else 1
    for ctype in ("Ready", "ContainersReady"):
        set_condition(st, cond(ctype, "False", "PodCompleted" if code == 0 else "PodFailed", ""))
    statuses = st.get("containerStatuses") or [
        {"name": c.get("name", "main"), "image": c.get("image", ""), "imageID": "",
         "restartCount": 0}
        for c in (new.get("spec") or {}).get("containers") or [{}]
    ]
    for cs in statuses:
        started = ((cs.get("state") or {}).get("running") or {}).get("startedAt", now)
        cs["ready"] = False
        cs["started"] = False
        cs["state"] = {"terminated": {"exitCode": code, "reason": reason,
                                      "startedAt": started, "finishedAt": now}}
    st["containerStatuses"] = statuses
    if phase == "Failed":
        st["reason"] = reason
    return new


def record_event(store: Store, namespace: str, ref: dict[str, Any], type_: str, reason: str,
                 message: str) -> None:
    """Store an Event about ``ref`` (dropped when its namespace is gone)."""
    if store.get("namespaces", "", namespace) is None:
        return
    now = now_iso()
    name = f"{ref.get('name', 'object')}.{store.rv + 1:x}"
    ev = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": namespace},
        "involvedObject": {**ref, "namespace": namespace},
        "reason": reason,
        "message": message,
        "type": type_,
        "source": {"component": "fleetq-emulator"},
        "reportingComponent": "fleetq-emulator",
        "firstTimestamp": now,
        "lastTimestamp": now,
        "eventTime": None,
        "count": 1,
    }
    with contextlib.suppress(Exception):
        store.create("events", ev)
