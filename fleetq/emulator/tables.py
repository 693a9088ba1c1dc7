"""Server-side printing (``meta.k8s.io/v1`` Table) so ``kubectl get`` shows the usual
columns (pod STATUS and NODE, node STATUS, job STATE, reservation PHASE) instead of
just NAME and AGE."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from fleetq.emulator.store import Obj
from fleetq.kube_values import human_duration, parse_rfc3339

Column = tuple[str, str, int, Callable[[Obj], Any]]  # name, type, priority, cell


def _age(obj: Obj) -> str:
    """The AGE column as kube-apiserver prints it (translateTimestampSince)."""
    created = parse_rfc3339(obj["metadata"].get("creationTimestamp"))
    if created is None:
        return "<unknown>"
    return human_duration(time.time() - created.timestamp())


def _conds(obj: Obj) -> list[dict[str, Any]]:
    return list((obj.get("status") or {}).get("conditions") or [])


def _pod_ready(obj: Obj) -> str:
    cs = (obj.get("status") or {}).get("containerStatuses") or []
    total = len((obj.get("spec") or {}).get("containers") or [])
    return f"{sum(1 for c in cs if c.get('ready'))}/{total}"


def _pod_restarts(obj: Obj) -> int:
    cs = (obj.get("status") or {}).get("containerStatuses") or []
    return sum(int(c.get("restartCount") or 0) for c in cs)


def _pod_status(obj: Obj) -> str:
    st = obj.get("status") or {}
    if obj["metadata"].get("deletionTimestamp"):
        return "Terminating"
    if st.get("reason"):
        return str(st["reason"])
    return str(st.get("phase") or "Pending")


def _node_status(obj: Obj) -> str:
    ready = next((c for c in _conds(obj) if c.get("type") == "Ready"), None)
    out = "Ready" if ready and ready.get("status") == "True" else "NotReady"
    if (obj.get("spec") or {}).get("unschedulable"):
        out += ",SchedulingDisabled"
    return out


def _job_state(obj: Obj) -> str:
    state = ""
    for c in _conds(obj):
        if c.get("status") == "True":
            state = str(c.get("type"))
    return state


COLUMNS: dict[str, list[Column]] = {
    "pods": [
        ("Ready", "string", 0, _pod_ready),
        ("Status", "string", 0, _pod_status),
        ("Restarts", "integer", 0, _pod_restarts),
        ("Age", "string", 0, _age),
        ("IP", "string", 1, lambda o: (o.get("status") or {}).get("podIP") or "<none>"),
        ("Node", "string", 1, lambda o: (o.get("spec") or {}).get("nodeName") or "<none>"),
    ],
    "nodes": [
        ("Status", "string", 0, _node_status),
        ("Roles", "string", 0, lambda o: "<none>"),
        ("Age", "string", 0, _age),
        ("Version", "string", 0,
         lambda o: ((o.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion", "")),
    ],
    "namespaces": [
        ("Status", "string", 0, lambda o: (o.get("status") or {}).get("phase", "Active")),
        ("Age", "string", 0, _age),
    ],
    "pytorchjobs": [
        ("State", "string", 0, _job_state),
        ("Age", "string", 0, _age),
    ],
    "reservations": [
        ("Phase", "string", 0, lambda o: (o.get("status") or {}).get("phase", "")),
        ("Node", "string", 0, lambda o: (o.get("status") or {}).get("nodeName", "")),
        ("TTL", "string", 0, lambda o: (o.get("spec") or {}).get("ttl", "")),
        ("Age", "string", 0, _age),
    ],
    "events": [
        ("Type", "string", 0, lambda o: o.get("type", "")),
        ("Reason", "string", 0, lambda o: o.get("reason", "")),
        ("Object", "string", 0, lambda o: "{}/{}".format(
            str((o.get("involvedObject") or {}).get("kind", "")).lower(),
            (o.get("involvedObject") or {}).get("name", ""))),
        ("Message", "string", 0, lambda o: o.get("message", "")),
    ],
}
DEFAULT: list[Column] = [("Age", "string", 0, _age)]


def wants_table(accept: str) -> bool:
    return "as=Table" in accept and "g=meta.k8s.io" in accept


def table(plural: str, objs: Iterable[Obj], resource_version: str) -> dict[str, Any]:
    cols = COLUMNS.get(plural, DEFAULT)
    defs = [{"name": "Name", "type": "string", "format": "name", "description": "Name",
             "priority": 0}]
    defs += [{"name": n, "type": t, "format": "", "description": n, "priority": p}
             for n, t, p, _ in cols]
    rows = []
    for o in objs:
        meta = {k: v for k, v in o["metadata"].items() if k != "managedFields"}
        rows.append({
            "cells": [o["metadata"]["name"], *(fn(o) for _, _, _, fn in cols)],
            "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                       "metadata": meta},
        })
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": resource_version},
            "columnDefinitions": defs, "rows": rows}
