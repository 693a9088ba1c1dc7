"""Koordinator-style Reservations on one emulated cluster: admission (room is decided
before the object is stored, so two racing reservations never both get it), expiry, which
reservations a pod may consume, and consuming one when a pod is bound with it."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Mapping
from typing import Any

from fleetq import resources as R
from fleetq.emulator.kube_objects import cond, parse_time, set_condition
from fleetq.emulator.ledger import CapacityLedger, reservation_room
from fleetq.emulator.node_fit import PodShape, node_reject, unavailable_message
from fleetq.emulator.selectors import match_label_selector
from fleetq.emulator.store import Obj, Store
from fleetq.emulator.timers import Timers
from fleetq.kube_values import parse_go_duration

RESERVATION_AFFINITY = "scheduling.koordinator.sh/reservation-affinity"
RESERVATION_ALLOCATED = "scheduling.koordinator.sh/reservation-allocated"
DEFAULT_TTL = 24 * 3600.0

#: (reservation name, its node, the room it holds) a pod may consume
Option = tuple[str, str, R.Resources]


class ReservationController:
    """Admits, expires and hands out the reservations of one cluster."""

    def __init__(self, store: Store, ledger: CapacityLedger, timers: Timers) -> None:
        self.store = store
        self.ledger = ledger
        self.timers = timers

    def admit(self, res: Obj) -> None:
        """Decide a new reservation synchronously (called by the API before storing it;
        no await in between, so two racing reservations can never both get the room)."""
        now = time.time()
        spec = res.get("spec") or {}
        tmpl = (spec.get("template") or {}).get("spec") or {}
        status: dict[str, Any] = {}
        res["status"] = status
        expiry = reservation_expiry(res, now)
        if expiry is not None and expiry <= now:
            fail_reservation(status, "Expired", "the reservation expired before it was scheduled")
            return
        shape = PodShape(reservation_room(res), tmpl)
        pinned = tmpl.get("nodeName")
        nodes = self.ledger.nodes
        candidates = [pinned] if pinned else sorted(nodes)
        reasons: list[str] = []
        for node in candidates:
            st = nodes.get(node)
            if st is None:
                reasons.append(f"node {node} does not exist")
                continue
            why = node_reject(st, shape, self.ledger.free(node), 1)
            if why is None:
                status.update(
                    phase="Available",
                    nodeName=node,
                    allocatable=R.to_quantity_map(shape.requests),
                    conditions=[
                        cond("Scheduled", "True", "Scheduled", f"reserved on {node}"),
                        cond("Ready", "True", "Available", "the reservation is available"),
                    ],
                )
                return
            reasons.append(f"{node}: {why}" if pinned else why)
        if pinned:
            msg = f"cannot reserve on node {pinned}: {reasons[0] if reasons else 'no room'}"
        else:
            counts: dict[str, int] = {}
            for r in reasons:
                counts[r] = counts.get(r, 0) + 1
            msg = unavailable_message(len(nodes), counts)
        fail_reservation(status, "Unschedulable", msg)

    def created(self, res: Obj) -> None:
        """A reservation was stored: arm its expiry from now."""
        self.arm_expiry(res, time.time())

    def arm_expiry(self, res: Obj, created: float | None = None) -> None:
        st = res.get("status") or {}
        if st.get("phase") not in ("Available", "Pending", None):
            return
        if created is None:
            ts = res["metadata"].get("creationTimestamp")
            created = parse_time(ts) if ts else time.time()
        expiry = reservation_expiry(res, created)
        if expiry is None:
            return
        self.timers.later(expiry - time.time(), self._expire, res["metadata"]["name"],
                          res["metadata"]["uid"])

    def _expire(self, name: str, uid: str) -> None:
        cur = self.store.get("reservations", "", name)
        if cur is None or cur["metadata"]["uid"] != uid:
            return
        if (cur.get("status") or {}).get("phase") not in ("Available", "Pending", None):
            return
        new = copy.deepcopy(cur)
        status = new.setdefault("status", {})
        fail_reservation(status, "Expired", "the reservation expired")
        self.store.replace("reservations", new)

    def options_for(self, pod: Obj) -> list[Option] | None:
        """Available reservations this pod may consume, or None when it has no
        reservation affinity and matches no reservation."""
        if "reservations" not in self.store.types:
            return None
        meta = pod["metadata"]
        affinity = reservation_affinity(meta.get("annotations") or {})
        out: list[Option] = []
        for rname, (rnode, room) in sorted(self.ledger.held.items()):
            res = self.store.get("reservations", "", rname)
            if res is None:
                continue
            if affinity is not None and not match_label_selector(
                {"matchLabels": affinity}, res["metadata"].get("labels") or {}
            ):
                continue
            if owners_match(res, pod):
                out.append((rname, rnode, room))
        if affinity is not None:
            return out
        return out or None

    def allocated_annotation(self, rname: str) -> str | None:
        """The ``reservation-allocated`` annotation a pod bound with ``rname`` carries."""
        res = self.store.get("reservations", "", rname)
        if res is None:
            return None
        return json.dumps({"name": rname, "uid": res["metadata"]["uid"]}, separators=(",", ":"))

    def consume(self, rname: str, pod: Obj) -> None:
        """``pod`` was bound with reservation ``rname``: record it as the owner (and end an
        allocate-once reservation)."""
        res = self.store.get("reservations", "", rname)
        if res is None:
            return
        new = copy.deepcopy(res)
        st = new.setdefault("status", {})
        st["currentOwners"] = [
            {"namespace": pod["metadata"]["namespace"], "name": pod["metadata"]["name"],
             "uid": pod["metadata"]["uid"]}
        ]
        if (new.get("spec") or {}).get("allocateOnce", True) is not False:
            st["phase"] = "Succeeded"
            set_condition(st, cond("Ready", "False", "Succeeded",
                                   f"allocated to {pod['metadata']['name']}"))
        st["allocated"] = R.to_quantity_map(reservation_room(res))
        self.store.replace("reservations", new)


def reservation_affinity(annotations: Mapping[str, str]) -> dict[str, str] | None:
    """The reservation selector a pod asks for (``{}``: any), or None when it asks none."""
    raw = annotations.get(RESERVATION_AFFINITY)
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    sel = data.get("reservationSelector") if isinstance(data, dict) else None
    return {str(k): str(v) for k, v in (sel or {}).items()}


def owners_match(res: Obj, pod: Obj) -> bool:
    spec = res.get("spec") or {}
    tmpl_ns = ((spec.get("template") or {}).get("metadata") or {}).get("namespace")
    meta = pod["metadata"]
    if tmpl_ns and tmpl_ns != meta.get("namespace"):
        return False
    for owner in spec.get("owners") or []:
        obj = owner.get("object")
        if obj:
            if obj.get("name") == meta.get("name") and (
                not obj.get("namespace") or obj.get("namespace") == meta.get("namespace")
            ):
                return True
            continue
        sel = owner.get("labelSelector")
        if sel is not None and match_label_selector(sel, meta.get("labels") or {}):
            return True
    return False


def reservation_expiry(res: Obj, created: float) -> float | None:
    """When a reservation expires (epoch seconds), or None for never (``ttl: 0``)."""
    spec = res.get("spec") or {}
    if spec.get("expires"):
        try:
            return parse_time(spec["expires"])
        except ValueError:
            return created
    ttl = spec.get("ttl")
    seconds = DEFAULT_TTL if ttl is None else parse_go_duration(str(ttl))
    if seconds == 0:
        return None
    return created + seconds


def fail_reservation(status: dict[str, Any], reason: str, message: str) -> None:
    status["phase"] = "Failed"
    status["reason"] = reason
    status["message"] = message
    ctype = "Ready" if reason == "Expired" else "Scheduled"
    set_condition(status, cond(ctype, "False", reason, message))
