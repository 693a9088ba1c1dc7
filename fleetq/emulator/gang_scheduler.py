"""The gang scheduler of one emulated cluster: the pending pods of one job are bound all
at once or not at all (its PodGroup's ``minMember`` first when that is smaller than the
job), honouring the node predicates of :mod:`fleetq.emulator.node_fit` and the
Koordinator-style reservations a pod may consume."""

from __future__ import annotations

import copy

from fleetq import resources as R
from fleetq.emulator.kube_objects import (
    cond,
    job_owner,
    key_of,
    node_ip,
    record_event,
    ref_of,
    set_condition,
)
from fleetq.emulator.ledger import CapacityLedger
from fleetq.emulator.node_fit import PodShape, node_reject, unavailable_message
from fleetq.emulator.pods import PodLifecycle
from fleetq.emulator.pytorchjob_operator import (
    REPLICA_INDEX,
    REPLICA_TYPE,
    PyTorchJobOperator,
    min_member,
    replica_slots,
)
from fleetq.emulator.reservations import (
    RESERVATION_ALLOCATED,
    Option,
    ReservationController,
    reservation_affinity,
)
from fleetq.emulator.store import Obj, Store

#: where each pod of a gang goes: (node, reservation consumed or None)
Plan = list[tuple[str, str | None]]


class _TentativeRoom:
    """Free resources and pod slots per node while one gang is being placed: read from the
    ledger on first use, then reduced by each pod placed so far (nothing is bound yet)."""

    def __init__(self, ledger: CapacityLedger) -> None:
        self._ledger = ledger
        self.frees: dict[str, R.Resources] = {}
        self.slots: dict[str, int] = {}

    def free_of(self, node: str) -> R.Resources:
        """What ``node`` has left, counting the pods placed so far."""
        if node not in self.frees:
            self.frees[node] = self._ledger.free(node)
            self.slots[node] = self._ledger.pods_free(node)
        return self.frees[node]

    def take(self, node: str, free: R.Resources, requests: R.Resources) -> None:
        """Place one pod of ``requests`` on ``node``, which had ``free`` for it."""
        self.frees[node] = R.sub(free, requests)
        self.slots[node] -= 1


class GangScheduler:
    """Binds the pending pods of one cluster, a gang at a time, in creation order."""

    def __init__(
        self,
        store: Store,
        ledger: CapacityLedger,
        reservations: ReservationController,
        operator: PyTorchJobOperator,
        pods: PodLifecycle,
    ) -> None:
        self.store = store
        self.ledger = ledger
        self.reservations = reservations
        self.operator = operator
        self.pods = pods
        self.unschedulable_msg: dict[str, str] = {}  # gang id -> last reported message

    def schedule(self) -> None:
        """Try every pending gang in creation order; bind all of a gang or none."""
        pending = self.ledger.pending
        if not pending:
            return
        gangs: dict[str, list[Obj]] = {}
        for key in list(pending):
            pod = self.store.get("pods", *key)
            if pod is None:
                pending.pop(key, None)
                continue
            owner = job_owner(pod)
            gid = f"{key[0]}/{owner}" if owner else f"{key[0]}/pod/{key[1]}"
            gangs.setdefault(gid, []).append(pod)
        order = sorted(
            gangs.items(),
            key=lambda kv: min(int(p["metadata"]["resourceVersion"]) for p in kv[1]),
        )
        for gid, pods in order:
            self._schedule_gang(gid, pods, self._gang_need(pods))

    def place(
        self, shapes: list[PodShape], reservations: list[list[Option] | None]
    ) -> tuple[Plan | None, str]:
        """Place all shapes or none. ``reservations[i]`` lists (name, node, room) the i-th
        pod may consume; a non-None list is required (reservation affinity). Returns the
        assignment [(node, reservation name)] or None with the reason."""
        room = _TentativeRoom(self.ledger)
        used_res: set[str] = set()
        out: Plan = []
        for i, shape in enumerate(shapes):
            options = reservations[i]
            chosen = self._place_in_reservation(shape, options, room, used_res) if options else None
            if chosen is None and shape.needs_reservation:
                if options:
                    return None, (
                        f"pod {i}: no Available reservation matching its reservation affinity "
                        "has room"
                    )
                return None, f"pod {i}: no Available reservation matches its reservation affinity"
            if chosen is None:
                node, reason = self._place_on_best_node(shape, room)
                if node is None:
                    return None, reason
                chosen = (node, None)
            out.append(chosen)
        return out, ""

    def _place_in_reservation(
        self, shape: PodShape, options: list[Option], room: _TentativeRoom, used_res: set[str]
    ) -> tuple[str, str | None] | None:
        """The first unused reservation in ``options`` whose node (plus the reservation's
        room) fits ``shape``, consumed from ``room``; None when none has room."""
        for rname, rnode, reserved in options:
            if rname in used_res or rnode not in self.ledger.nodes:
                continue
            free = R.add(room.free_of(rnode), reserved)
            if room.slots[rnode] >= 1 and R.fits(shape.requests, free):
                room.take(rnode, free, shape.requests)
                used_res.add(rname)
                return rnode, rname
        return None

    def _place_on_best_node(
        self, shape: PodShape, room: _TentativeRoom
    ) -> tuple[str | None, str]:
        """The fitting node with the most CPU left after ``shape`` (consumed from ``room``),
        or None with the unschedulable message counting why each node was rejected."""
        nodes = self.ledger.nodes
        reasons: dict[str, int] = {}
        best: tuple[int, str] | None = None
        for name, st in nodes.items():
            free = room.free_of(name)
            why = node_reject(st, shape, free, room.slots[name])
            if why is not None:
                reasons[why] = reasons.get(why, 0) + 1
                continue
            score = free.get(R.CPU, 0) - shape.requests.get(R.CPU, 0)
            if best is None or score > best[0]:
                best = (score, name)
        if best is None:
            return None, unavailable_message(len(nodes), reasons)
        node = best[1]
        room.take(node, room.frees[node], shape.requests)
        return node, ""

    def _gang_need(self, pending: list[Obj]) -> int | None:
        """How many of a job's pending pods must be bound together: its PodGroup's
        ``minMember`` (``runPolicy.schedulingPolicy.minAvailable``) less the pods already
        bound; None when the gang is every pod (no minAvailable, or not fewer pods)."""
        owner = job_owner(pending[0])
        if owner is None:
            return None
        job = self.store.get("pytorchjobs", pending[0]["metadata"]["namespace"], owner)
        if job is None:
            return None
        total = len(replica_slots(job))
        minimum = min_member(job)
        if minimum is None or minimum >= total:
            return None
        bound = sum(
            1 for p in self.operator.owned_pods(job["metadata"]["namespace"], owner)
            if (p.get("spec") or {}).get("nodeName")
        )
        return max(0, minimum - bound)

    def _try_place(self, pods: list[Obj]) -> tuple[Plan | None, str]:
        shapes = []
        options = []
        for pod in pods:
            key = key_of(pod)
            needs = reservation_affinity(pod["metadata"].get("annotations") or {}) is not None
            shapes.append(
                PodShape(self.ledger.requests_of(key, pod), pod.get("spec") or {},
                         pod["metadata"].get("labels") or {}, key[0], needs)
            )
            options.append(self.reservations.options_for(pod))
        return self.place(shapes, options)

    def _schedule_gang(self, gid: str, pods: list[Obj], need: int | None = None) -> None:
        """Bind the gang's pods all at once, or none. With ``need`` (a PodGroup whose
        minMember is smaller than the job), the first ``need`` pods (Master, then Workers
        by index) go together and each one after that is bound on its own when it fits,
        as a gang scheduler does once minMember is running."""
        pods.sort(key=pod_order)
        together = pods if need is None else pods[:need]
        if together:
            plan, why = self._try_place(together)
            if plan is None:
                self._report_unschedulable(gid, together, why)
                return
            self.unschedulable_msg.pop(gid, None)
            for pod, (node, rname) in zip(together, plan, strict=True):
                self._bind(pod, node, rname)
        for pod in pods[len(together):]:
            pid = f"{gid}/{pod['metadata']['name']}"
            plan, why = self._try_place([pod])
            if plan is None:
                self._report_unschedulable(pid, [pod], why)
                continue
            self.unschedulable_msg.pop(pid, None)
            self._bind(pod, *plan[0])

    def _report_unschedulable(self, gid: str, pods: list[Obj], why: str) -> None:
        total = len(pods)
        msg = why if total == 1 else f"gang of {total} pods cannot be placed together: {why}"
        if self.unschedulable_msg.get(gid) == msg:
            return
        self.unschedulable_msg[gid] = msg
        for pod in pods:
            new = copy.deepcopy(pod)
            status = new.setdefault("status", {})
            status["phase"] = "Pending"
            set_condition(status, cond("PodScheduled", "False", "Unschedulable", msg))
            self.store.replace("pods", new)
        first = pods[0]
        record_event(self.store, first["metadata"]["namespace"], ref_of(first), "Warning",
                     "FailedScheduling", msg)

    def _bind(self, pod: Obj, node: str, rname: str | None) -> None:
        new = copy.deepcopy(pod)
        new["spec"]["nodeName"] = node
        status = new.setdefault("status", {})
        status["phase"] = "Pending"
        status["hostIP"] = node_ip(self.store, node)
        set_condition(status, cond("PodScheduled", "True", "", ""))
        if rname is not None:
            allocated = self.reservations.allocated_annotation(rname)
            if allocated is not None:
                new["metadata"].setdefault("annotations", {})[RESERVATION_ALLOCATED] = allocated
        stored = self.store.replace("pods", new)
        ns = pod["metadata"]["namespace"]
        msg = f"Successfully assigned {ns}/{pod['metadata']['name']} to {node}"
        if rname is not None:
            msg += f" (reservation {rname})"
            self.reservations.consume(rname, stored)
        record_event(self.store, ns, ref_of(pod), "Normal", "Scheduled", msg)
        self.pods.arm(stored)


def pod_order(pod: Obj) -> tuple[int, int, str]:
    """A gang's binding order: the Master, then Workers by replica index."""
    labels = pod["metadata"].get("labels") or {}
    role = 0 if labels.get(REPLICA_TYPE) == "master" else 1
    try:
        idx = int(labels.get(REPLICA_INDEX, "0"))
    except ValueError:
        idx = 0
    return (role, idx, pod["metadata"]["name"])
