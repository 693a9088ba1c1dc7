"""The simulated control plane behind one emulated cluster (what kwok does for nodes).

Three controllers share one asyncio loop with the API server, so every decision is
atomic with respect to API requests:

* the PyTorchJob controller (Kubeflow training-operator behaviour): pods per replica,
  conditions Created → Running → Succeeded/Failed, replica statuses, cascade delete;
* a gang scheduler: the pending pods of one job are bound all at once or not at all,
  honouring requests, nodeSelector/affinity, taints, cordons, pod slots and
  Koordinator-style Reservations;
* the pod lifecycle (Pending → Running → Succeeded after ``fleetq.io/run-seconds``) and
  reservation admission/expiry.

Capacity bookkeeping is incremental (a store hook), so the scheduler never rescans all
pods: benchmarks load thousands of running pods per cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from fleetq import resources as R
from fleetq.emulator.selectors import match_label_selector
from fleetq.emulator.store import Key, Obj, Store, now_iso
from fleetq.kube_values import parse_go_duration, parse_rfc3339
from fleetq.models import pod_requests
from fleetq.naming import KF_JOB_NAME as JOB_NAME
from fleetq.naming import KF_REPLICA_INDEX as REPLICA_INDEX
from fleetq.naming import KF_REPLICA_TYPE as REPLICA_TYPE
from fleetq.topology import ClusterSpec, node_names

OPERATOR_NAME = "training.kubeflow.org/operator-name"
RUN_SECONDS = "fleetq.io/run-seconds"
RESERVATION_AFFINITY = "scheduling.koordinator.sh/reservation-affinity"
RESERVATION_ALLOCATED = "scheduling.koordinator.sh/reservation-allocated"
DEFAULT_TTL = 24 * 3600.0
TERMINAL = ("Succeeded", "Failed")

def parse_duration(text: str) -> float:
    """Go ``time.Duration`` text → seconds (``fleetq.kube_values``)."""
    return parse_go_duration(text)


def parse_time(text: str) -> float:
    """RFC 3339 → epoch seconds; ValueError when it is not a timestamp."""
    parsed = parse_rfc3339(str(text))
    if parsed is None:
        raise ValueError(f"{str(text)[:40]!r} is not an RFC 3339 time")
    return parsed.timestamp()


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def tolerates(tolerations: list[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    for t in tolerations:
        effect = t.get("effect")
        if effect and effect != taint.get("effect"):
            continue
        key = t.get("key")
        if t.get("operator") == "Exists":
            if not key or key == taint.get("key"):
                return True
            continue
        if key == taint.get("key") and (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def _node_affinity_ok(spec: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    aff = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if not aff:
        return True
    terms = aff.get("nodeSelectorTerms") or []
    for term in terms:
        exprs = term.get("matchExpressions") or []
        if match_label_selector({"matchExpressions": exprs}, labels):
            return True
    return not terms


@dataclass
class NodeState:
    name: str
    allocatable: R.Resources
    pods: int
    labels: dict[str, str]
    taints: list[dict[str, Any]]
    unschedulable: bool


@dataclass
class PodShape:
    """What placement needs of one pod (or reservation template)."""

    requests: R.Resources
    spec: dict[str, Any]
    labels: dict[str, str] = field(default_factory=dict)
    namespace: str = ""
    needs_reservation: bool = False  # reservation affinity: only a reservation will do


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


class ClusterController:
    """Controllers and scheduler of one emulated cluster."""

    def __init__(self, store: Store, spec: ClusterSpec, *, start_delay: float = 0.2) -> None:
        self.store = store
        self.spec = spec
        self.name = spec.name
        self.start_delay = start_delay
        self.nodes: dict[str, NodeState] = {}
        self.used: dict[str, R.Resources] = {}
        self.pods_used: dict[str, int] = {}
        self.pod_usage: dict[Key, tuple[str, R.Resources]] = {}
        self.held: dict[str, tuple[str, R.Resources]] = {}  # reservation name -> node, room
        self.pending: dict[Key, None] = {}  # ordered set of unbound pods
        self.dirty_jobs: set[Key] = set()
        self.need_schedule = False
        self.unschedulable_msg: dict[str, str] = {}  # gang id -> last reported message
        self._wake = asyncio.Event()
        self._timers: set[asyncio.TimerHandle] = set()
        self._task: asyncio.Task[None] | None = None
        self._requests: dict[tuple[Key, str], R.Resources] = {}
        #: (namespace, PyTorchJob name) -> names of the pods it owns: reconciling one job
        #: must not scan every pod of the namespace (that made the emulator O(n^2))
        self.pods_by_owner: dict[Key, set[str]] = {}
        #: uids of finished jobs whose runPolicy.ttlSecondsAfterFinished deletion is armed
        self.ttl_armed: set[str] = set()
        store.hooks.append(self._on_change)

    # ------------------------------------------------------------------ setup

    def seed(self) -> None:
        """Create nodes and system namespaces for a fresh cluster."""
        for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
            if self.store.get("namespaces", "", ns) is None:
                self.store.create("namespaces", namespace_object(ns))
        for i, (name, group) in enumerate(node_names(self.spec)):
            if self.store.get("nodes", "", name) is None:
                self.store.create("nodes", node_object(name, group, self.name, i))

    def resync(self) -> None:
        """Rebuild bookkeeping and timers from stored objects (after a state reload)."""
        self.nodes.clear()
        self.used.clear()
        self.pods_used.clear()
        self.pod_usage.clear()
        self.held.clear()
        self.pending.clear()
        self.pods_by_owner.clear()
        for node in self.store.items("nodes"):
            self._on_change("nodes", "ADDED", node, None)
        for res in self.store.items("reservations") if "reservations" in self.store.types else []:
            self._on_change("reservations", "ADDED", res, None)
            self._arm_expiry(res)
        for pod in self.store.items("pods"):
            self._on_change("pods", "ADDED", pod, None)
            self._arm_pod(pod)
        for job in self.store.items("pytorchjobs"):
            self.dirty_jobs.add(_key(job))
        self.need_schedule = True
        self._wake.set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        for t in self._timers:
            t.cancel()
        self._timers.clear()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _later(self, delay: float, fn: Any, *args: Any) -> None:
        loop = asyncio.get_running_loop()
        handle: asyncio.TimerHandle

        def fire() -> None:
            self._timers.discard(handle)
            fn(*args)

        handle = loop.call_later(max(0.0, delay), fire)
        self._timers.add(handle)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                for _ in range(50):  # settle: job reconciles may create pods and vice versa
                    jobs, self.dirty_jobs = self.dirty_jobs, set()
                    for key in jobs:
                        self.reconcile_job(key)
                    if self.need_schedule:
                        self.need_schedule = False
                        self.schedule()
                    if not self.dirty_jobs and not self.need_schedule:
                        break
            except Exception as exc:  # keep the emulator alive; surface the bug as an event
                self.event("default", {"kind": "Node", "name": self.name}, "Warning",
                           "EmulatorError", f"controller error: {exc!r}")
            await asyncio.sleep(0)

    def wake(self) -> None:
        self._wake.set()

    # ------------------------------------------------------------------ bookkeeping hook

    def _on_change(self, plural: str, type_: str, new: Obj | None, old: Obj | None) -> None:
        if plural == "pods":
            obj = new or old
            assert obj is not None
            key = _key(obj)
            prev = self.pod_usage.pop(key, None)
            if prev is not None:
                node, req = prev
                R.add_into(self.used.setdefault(node, {}), req, -1)
                self.pods_used[node] = self.pods_used.get(node, 1) - 1
                self.need_schedule = True
            self.pending.pop(key, None)
            if new is not None:
                bound = (new.get("spec") or {}).get("nodeName")
                phase = (new.get("status") or {}).get("phase") or "Pending"
                if bound and phase not in TERMINAL:
                    req = self.requests_of(key, new)
                    self.pod_usage[key] = (bound, req)
                    R.add_into(self.used.setdefault(bound, {}), req)
                    self.pods_used[bound] = self.pods_used.get(bound, 0) + 1
                elif not bound and phase == "Pending":
                    self.pending[key] = None
                    self.need_schedule = True
            else:
                for k in [k for k in self._requests if k[0] == key]:
                    del self._requests[k]
            owner = job_owner(obj)
            if owner is not None:
                okey = (obj["metadata"].get("namespace", ""), owner)
                if new is not None:
                    self.pods_by_owner.setdefault(okey, set()).add(key[1])
                else:
                    names = self.pods_by_owner.get(okey)
                    if names is not None:
                        names.discard(key[1])
                        if not names:
                            del self.pods_by_owner[okey]
                self.dirty_jobs.add(okey)
            self._wake.set()
        elif plural == "pytorchjobs":
            obj = new or old
            assert obj is not None
            self.dirty_jobs.add(_key(obj))
            self._wake.set()
        elif plural == "nodes":
            if new is None:
                assert old is not None
                self.nodes.pop(old["metadata"]["name"], None)
            else:
                alloc = R.parse_resources((new.get("status") or {}).get("allocatable"))
                pods = alloc.pop(R.PODS, 110 * R.MILLI) // R.MILLI
                spec = new.get("spec") or {}
                self.nodes[new["metadata"]["name"]] = NodeState(
                    new["metadata"]["name"], alloc, pods,
                    dict(new["metadata"].get("labels") or {}),
                    list(spec.get("taints") or []), bool(spec.get("unschedulable")),
                )
            self.need_schedule = True
            self._wake.set()
        elif plural == "reservations":
            obj = new or old
            assert obj is not None
            name = obj["metadata"]["name"]
            if self.held.pop(name, None) is not None:
                self.need_schedule = True
            if new is not None:
                st = new.get("status") or {}
                if st.get("phase") == "Available" and st.get("nodeName"):
                    self.held[name] = (st["nodeName"], self.reservation_room(new))
                    self.need_schedule = True
            self._wake.set()

    def requests_of(self, key: Key, pod: Obj) -> R.Resources:
        ck = (key, pod["metadata"].get("uid", ""))
        got = self._requests.get(ck)
        if got is None:
            try:
                got = pod_requests(pod.get("spec") or {})
            except R.QuantityError:
                got = {}
            self._requests[ck] = got
        return got

    def reservation_room(self, res: Obj) -> R.Resources:
        spec = ((res.get("spec") or {}).get("template") or {}).get("spec") or {}
        try:
            return pod_requests(spec)
        except R.QuantityError:
            return {}

    # ------------------------------------------------------------------ capacity

    def free(self, node: str, release: tuple[str, ...] = ()) -> R.Resources:
        """Room left on a node: allocatable − bound pods − Available reservations (except
        the ones named in ``release``, which the pod being placed may consume)."""
        st = self.nodes[node]
        out = R.sub(st.allocatable, self.used.get(node, {}))
        for rname, (rnode, room) in self.held.items():
            if rnode == node and rname not in release:
                R.add_into(out, room, -1)
        return out

    def node_reject(
        self, st: NodeState, shape: PodShape, free: R.Resources, pods_free: int
    ) -> str | None:
        """Why ``shape`` cannot go on this node (kube-scheduler wording), or None."""
        spec = shape.spec
        if st.unschedulable:
            return "node(s) were unschedulable"
        sel = spec.get("nodeSelector") or {}
        if any(st.labels.get(k) != v for k, v in sel.items()) or not _node_affinity_ok(
            spec, st.labels
        ):
            return "node(s) didn't match Pod's node affinity/selector"
        tols = spec.get("tolerations") or []
        for taint in st.taints:
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tols, taint):
                shown = f"{taint.get('key')}: {taint.get('value', '')}"
                return f"node(s) had untolerated taint {{{shown}}}"
        if pods_free < 1:
            return "Too many pods"
        short = R.shortfalls(shape.requests, free)
        if short:
            return f"Insufficient {short[0]}"
        return None

    def place(
        self,
        shapes: list[PodShape],
        reservations: list[list[tuple[str, str, R.Resources]] | None],
    ) -> tuple[list[tuple[str, str | None]] | None, str]:
        """Place all shapes or none. ``reservations[i]`` lists (name, node, room) the i-th
        pod may consume; a non-None list is required (reservation affinity). Returns the
        assignment [(node, reservation name)] or None with the reason."""
        frees: dict[str, R.Resources] = {}
        slots: dict[str, int] = {}

        def free_of(node: str) -> R.Resources:
            if node not in frees:
                frees[node] = self.free(node)
                slots[node] = self.nodes[node].pods - self.pods_used.get(node, 0)
            return frees[node]

        used_res: set[str] = set()
        out: list[tuple[str, str | None]] = []
        for i, shape in enumerate(shapes):
            options = reservations[i]
            chosen: tuple[str, str | None] | None = None
            if options:
                for rname, rnode, room in options:
                    if rname in used_res or rnode not in self.nodes:
                        continue
                    free = R.add(free_of(rnode), room)
                    if slots[rnode] >= 1 and R.fits(shape.requests, free):
                        chosen = (rnode, rname)
                        frees[rnode] = R.sub(free, shape.requests)
                        slots[rnode] -= 1
                        used_res.add(rname)
                        break
                if chosen is None and shape.needs_reservation:
                    return None, (
                        f"pod {i}: no Available reservation matching its reservation affinity "
                        "has room"
                    )
            if chosen is None and shape.needs_reservation:
                return None, f"pod {i}: no Available reservation matches its reservation affinity"
            if chosen is None:
                reasons: dict[str, int] = {}
                best: tuple[int, str] | None = None
                for name, st in self.nodes.items():
                    free = free_of(name)
                    why = self.node_reject(st, shape, free, slots[name])
                    if why is not None:
                        reasons[why] = reasons.get(why, 0) + 1
                        continue
                    score = free.get(R.CPU, 0) - shape.requests.get(R.CPU, 0)
                    if best is None or score > best[0]:
                        best = (score, name)
                if best is None:
                    detail = ", ".join(f"{n} {w}" for w, n in sorted(reasons.items()))
                    return None, f"0/{len(self.nodes)} nodes are available: {detail or 'no nodes'}."
                node = best[1]
                frees[node] = R.sub(frees[node], shape.requests)
                slots[node] -= 1
                chosen = (node, None)
            out.append(chosen)
        return out, ""

    # ------------------------------------------------------------------ reservations

    def admit_reservation(self, res: Obj) -> None:
        """Decide a new reservation synchronously (called by the API before storing it;
        no await in between, so two racing reservations can never both get the room)."""
        now = time.time()
        spec = res.get("spec") or {}
        tmpl = (spec.get("template") or {}).get("spec") or {}
        status: dict[str, Any] = {}
        res["status"] = status
        expiry = reservation_expiry(res, now)
        if expiry is not None and expiry <= now:
            _fail_reservation(status, "Expired", "the reservation expired before it was scheduled")
            return
        shape = PodShape(self.reservation_room(res), tmpl)
        pinned = tmpl.get("nodeName")
        candidates = [pinned] if pinned else sorted(self.nodes)
        reasons: list[str] = []
        for node in candidates:
            st = self.nodes.get(node)
            if st is None:
                reasons.append(f"node {node} does not exist")
                continue
            free = self.free(node)
            why = self.node_reject(st, shape, free, 1)
            if why is None:
                status.update(
                    phase="Available",
                    nodeName=node,
                    allocatable=R.to_quantity_map(shape.requests),
                    conditions=[
                        _cond("Scheduled", "True", "Scheduled", f"reserved on {node}"),
                        _cond("Ready", "True", "Available", "the reservation is available"),
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
            detail = ", ".join(f"{n} {w}" for w, n in sorted(counts.items()))
            msg = f"0/{len(self.nodes)} nodes are available: {detail or 'no nodes'}."
        _fail_reservation(status, "Unschedulable", msg)

    def reservation_created(self, res: Obj) -> None:
        self._arm_expiry(res, time.time())

    def _arm_expiry(self, res: Obj, created: float | None = None) -> None:
        st = res.get("status") or {}
        if st.get("phase") not in ("Available", "Pending", None):
            return
        if created is None:
            ts = res["metadata"].get("creationTimestamp")
            created = parse_time(ts) if ts else time.time()
        expiry = reservation_expiry(res, created)
        if expiry is None:
            return
        self._later(expiry - time.time(), self._expire, res["metadata"]["name"],
                    res["metadata"]["uid"])

    def _expire(self, name: str, uid: str) -> None:
        cur = self.store.get("reservations", "", name)
        if cur is None or cur["metadata"]["uid"] != uid:
            return
        if (cur.get("status") or {}).get("phase") not in ("Available", "Pending", None):
            return
        new = copy.deepcopy(cur)
        status = new.setdefault("status", {})
        _fail_reservation(status, "Expired", "the reservation expired")
        self.store.replace("reservations", new)

    def reservations_for(self, pod: Obj) -> list[tuple[str, str, R.Resources]] | None:
        """Available reservations this pod may consume, or None when it has no
        reservation affinity and matches no reservation."""
        if "reservations" not in self.store.types:
            return None
        meta = pod["metadata"]
        affinity = _reservation_affinity(meta.get("annotations") or {})
        out: list[tuple[str, str, R.Resources]] = []
        for rname, (rnode, room) in sorted(self.held.items()):
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

    # ------------------------------------------------------------------ scheduling

    def schedule(self) -> None:
        """Try every pending gang in creation order; bind all of a gang or none."""
        if not self.pending:
            return
        gangs: dict[str, list[Obj]] = {}
        for key in list(self.pending):
            pod = self.store.get("pods", *key)
            if pod is None:
                self.pending.pop(key, None)
                continue
            owner = job_owner(pod)
            gid = f"{key[0]}/{owner}" if owner else f"{key[0]}/pod/{key[1]}"
            gangs.setdefault(gid, []).append(pod)
        order = sorted(
            gangs.items(),
            key=lambda kv: min(int(p["metadata"]["resourceVersion"]) for p in kv[1]),
        )
        for gid, pods in order:
            self._schedule_gang(gid, pods, self._gang_need(gid, pods))

    def _gang_need(self, gid: str, pending: list[Obj]) -> int | None:
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
            1 for p in self.owned_pods(job["metadata"]["namespace"], owner)
            if (p.get("spec") or {}).get("nodeName")
        )
        return max(0, minimum - bound)

    def _try_place(self, pods: list[Obj]) -> tuple[list[tuple[str, str | None]] | None, str]:
        shapes = []
        options = []
        for pod in pods:
            key = _key(pod)
            needs = _reservation_affinity(pod["metadata"].get("annotations") or {}) is not None
            shapes.append(
                PodShape(self.requests_of(key, pod), pod.get("spec") or {},
                         pod["metadata"].get("labels") or {}, key[0], needs)
            )
            options.append(self.reservations_for(pod))
        return self.place(shapes, options)

    def _schedule_gang(self, gid: str, pods: list[Obj], need: int | None = None) -> None:
        """Bind the gang's pods all at once, or none. With ``need`` (a PodGroup whose
        minMember is smaller than the job), the first ``need`` pods (Master, then Workers
        by index) go together and each one after that is bound on its own when it fits,
        as a gang scheduler does once minMember is running."""
        pods.sort(key=_pod_order)
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
            _set_condition(status, _cond("PodScheduled", "False", "Unschedulable", msg))
            self.store.replace("pods", new)
        first = pods[0]
        self.event(first["metadata"]["namespace"], _ref(first), "Warning", "FailedScheduling", msg)

    def _bind(self, pod: Obj, node: str, rname: str | None) -> None:
        new = copy.deepcopy(pod)
        new["spec"]["nodeName"] = node
        status = new.setdefault("status", {})
        status["phase"] = "Pending"
        status["hostIP"] = _node_ip(self.store, node)
        _set_condition(status, _cond("PodScheduled", "True", "", ""))
        if rname is not None:
            res = self.store.get("reservations", "", rname)
            if res is not None:
                new["metadata"].setdefault("annotations", {})[RESERVATION_ALLOCATED] = json.dumps(
                    {"name": rname, "uid": res["metadata"]["uid"]}, separators=(",", ":")
                )
        stored = self.store.replace("pods", new)
        ns = pod["metadata"]["namespace"]
        msg = f"Successfully assigned {ns}/{pod['metadata']['name']} to {node}"
        if rname is not None:
            msg += f" (reservation {rname})"
            self._consume_reservation(rname, stored)
        self.event(ns, _ref(pod), "Normal", "Scheduled", msg)
        self._arm_pod(stored)

    def _consume_reservation(self, rname: str, pod: Obj) -> None:
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
            _set_condition(st, _cond("Ready", "False", "Succeeded",
                                     f"allocated to {pod['metadata']['name']}"))
        st["allocated"] = R.to_quantity_map(self.reservation_room(res))
        self.store.replace("reservations", new)

    # ------------------------------------------------------------------ pod lifecycle

    def _arm_pod(self, pod: Obj, started: float | None = None) -> None:
        """Timers for a bound pod: start it, then finish it after run-seconds."""
        spec = pod.get("spec") or {}
        status = pod.get("status") or {}
        if not spec.get("nodeName"):
            return
        key = _key(pod)
        uid = pod["metadata"]["uid"]
        phase = status.get("phase") or "Pending"
        if phase == "Pending":
            self._later(self.start_delay, self._start_pod, key, uid)
        elif phase == "Running":
            run = self.run_seconds(pod)
            if run is not None:
                if started is None:
                    ts = status.get("startTime")
                    started = parse_time(ts) if ts else time.time()
                self._later(started + run - time.time(), self._finish_pod, key, uid, "Succeeded")

    def run_seconds(self, pod: Obj) -> float | None:
        ann = pod["metadata"].get("annotations") or {}
        value = ann.get(RUN_SECONDS)
        if value is None:
            owner = job_owner(pod)
            if owner:
                job = self.store.get("pytorchjobs", pod["metadata"]["namespace"], owner)
                if job is not None:
                    value = (job["metadata"].get("annotations") or {}).get(RUN_SECONDS)
        if value is None:
            return None
        try:
            return max(0.0, float(value))
        except ValueError:
            return None

    def _start_pod(self, key: Key, uid: str) -> None:
        pod = self.store.get("pods", *key)
        if pod is None or pod["metadata"]["uid"] != uid:
            return
        if (pod.get("status") or {}).get("phase", "Pending") != "Pending":
            return
        new = copy.deepcopy(pod)
        now = now_iso()
        st = new.setdefault("status", {})
        st["phase"] = "Running"
        st["startTime"] = st.get("startTime") or now
        st["podIP"] = f"10.244.{len(key[1]) % 250}.{abs(hash(uid)) % 250 + 2}"
        for ctype in ("Initialized", "Ready", "ContainersReady"):
            _set_condition(st, _cond(ctype, "True", "", ""))
        st["containerStatuses"] = [
            {
                "name": c.get("name", "main"),
                "image": c.get("image", ""),
                "imageID": "",
                "containerID": f"emulated://{uid[:8]}-{i}",
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": now}},
            }
            for i, c in enumerate(new.get("spec", {}).get("containers") or [{}])
        ]
        stored = self.store.replace("pods", new)
        self._arm_pod(stored, time.time())

    def _finish_pod(self, key: Key, uid: str, phase: str, reason: str = "Completed") -> None:
        pod = self.store.get("pods", *key)
        if pod is None or pod["metadata"]["uid"] != uid:
            return
        if (pod.get("status") or {}).get("phase") in TERMINAL:
            return
        self.store.replace("pods", finished_pod(pod, phase, reason))

    def fail_pod(self, pod: Obj, reason: str = "Error") -> None:
        self._finish_pod(_key(pod), pod["metadata"]["uid"], "Failed", reason)

    # ------------------------------------------------------------------ PyTorchJob controller

    def reconcile_job(self, key: Key) -> None:
        ns, name = key
        job = self.store.get("pytorchjobs", ns, name)
        owned = self.owned_pods(ns, name)
        if job is None:
            for p in owned:
                if self.store.get("pods", ns, p["metadata"]["name"]) is not None:
                    self.store.delete("pods", ns, p["metadata"]["name"])
            return
        uid = job["metadata"]["uid"]
        stale = [p for p in owned if _owner_uid(p) != uid]
        owned = [p for p in owned if _owner_uid(p) == uid]
        for p in stale:  # pods of an earlier job with the same name
            self.store.delete("pods", ns, p["metadata"]["name"])
        status = copy.deepcopy(job.get("status") or {})
        finished = _condition_true(status, "Succeeded") or _condition_true(status, "Failed")
        by_name = {p["metadata"]["name"]: p for p in owned}
        # runPolicy.suspend: the operator creates no pods for a suspended job
        suspended = ((job.get("spec") or {}).get("runPolicy") or {}).get("suspend") is True
        if not finished and not suspended:
            for role, index, tmpl, restart in replica_slots(job):
                pname = f"{name}-{role}-{index}"
                if pname not in by_name:
                    pod = self._pod_for(job, role, index, tmpl, restart)
                    try:
                        by_name[pname] = self.store.create("pods", pod)
                    except Exception:
                        continue
                    self.event(ns, _ref(job), "Normal", "SuccessfulCreatePod",
                               f"Created pod: {pname}")
        new_status = job_status(job, list(by_name.values()), status)
        if new_status != (job.get("status") or {}):
            new = {**job, "metadata": copy.deepcopy(job["metadata"]), "status": new_status}
            self.store.replace("pytorchjobs", new)
            self._job_events(job, status, new_status)
        self._arm_ttl(job, new_status)

    def _arm_ttl(self, job: Obj, status: Mapping[str, Any]) -> None:
        """The operator's TTL: a finished job with ``runPolicy.ttlSecondsAfterFinished``
        is deleted (with its pods) that long after its completionTime."""
        ttl = ((job.get("spec") or {}).get("runPolicy") or {}).get("ttlSecondsAfterFinished")
        uid = job["metadata"]["uid"]
        done = _condition_true(status, "Succeeded") or _condition_true(status, "Failed")
        if not done or not isinstance(ttl, int) or isinstance(ttl, bool) or uid in self.ttl_armed:
            return
        self.ttl_armed.add(uid)
        completion = status.get("completionTime")
        finished = parse_time(str(completion)) if completion else time.time()
        key = _key(job)
        self._later(finished + max(0, ttl) - time.time(), self._ttl_delete, key, uid)

    def _ttl_delete(self, key: Key, uid: str) -> None:
        self.ttl_armed.discard(uid)
        job = self.store.get("pytorchjobs", *key)
        if job is not None and job["metadata"]["uid"] == uid:
            self.store.delete("pytorchjobs", *key)

    def owned_pods(self, namespace: str, name: str) -> list[Obj]:
        """The pods whose ownerReference is the PyTorchJob ``namespace/name``."""
        out = []
        for pname in sorted(self.pods_by_owner.get((namespace, name), ())):
            pod = self.store.get("pods", namespace, pname)
            if pod is not None:
                out.append(pod)
        return out

    def _job_events(self, job: Obj, old: dict[str, Any], new: dict[str, Any]) -> None:
        for ctype in ("Created", "Running", "Succeeded", "Failed"):
            if _condition_true(new, ctype) and not _condition_true(old, ctype):
                cond = next(c for c in new["conditions"] if c["type"] == ctype)
                kind = "Warning" if ctype == "Failed" else "Normal"
                self.event(job["metadata"]["namespace"], _ref(job), kind, cond["reason"],
                           cond["message"])

    def _pod_for(self, job: Obj, role: str, index: int, tmpl: Mapping[str, Any],
                 restart: str | None) -> Obj:
        jmeta = job["metadata"]
        tmeta = copy.deepcopy(dict(tmpl.get("metadata") or {}))
        spec = copy.deepcopy(dict(tmpl.get("spec") or {}))
        if restart and restart != "ExitCode":
            spec["restartPolicy"] = restart
        spec.setdefault("schedulerName", "default-scheduler")
        spec.pop("nodeName", None)
        labels = dict(tmeta.get("labels") or {})
        labels.update({
            JOB_NAME: jmeta["name"],
            REPLICA_TYPE: role,
            REPLICA_INDEX: str(index),
            OPERATOR_NAME: "pytorchjob-controller",
        })
        if role == "master":
            labels["training.kubeflow.org/job-role"] = "master"
        annotations = dict(tmeta.get("annotations") or {})
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{jmeta['name']}-{role}-{index}",
                "namespace": jmeta["namespace"],
                "labels": labels,
                "annotations": annotations,
                "ownerReferences": [{
                    "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                    "name": jmeta["name"], "uid": jmeta["uid"],
                    "controller": True, "blockOwnerDeletion": True,
                }],
            },
            "spec": spec,
            "status": {"phase": "Pending", "qosClass": "Burstable"},
        }

    def fail_job(self, namespace: str, name: str) -> bool:
        """Fault injection: the job's pods fail and the job turns Failed."""
        job = self.store.get("pytorchjobs", namespace, name)
        if job is None:
            return False
        for pod in self.owned_pods(namespace, name):
            if (pod.get("status") or {}).get("phase") not in TERMINAL:
                self.store.replace("pods", finished_pod(pod, "Failed", "Error"))
        self.dirty_jobs.add((namespace, name))
        self.reconcile_job((namespace, name))
        return True

    def set_cordon(self, node: str, on: bool) -> bool:
        cur = self.store.get("nodes", "", node)
        if cur is None:
            return False
        new = copy.deepcopy(cur)
        if on:
            new.setdefault("spec", {})["unschedulable"] = True
        else:
            new.setdefault("spec", {}).pop("unschedulable", None)
        self.store.replace("nodes", new)
        return True

    # ------------------------------------------------------------------ events

    def event(self, namespace: str, ref: dict[str, Any], type_: str, reason: str,
              message: str) -> None:
        if self.store.get("namespaces", "", namespace) is None:
            return
        now = now_iso()
        name = f"{ref.get('name', 'object')}.{self.store.rv + 1:x}"
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
            self.store.create("events", ev)

    # ------------------------------------------------------------------ bulk load

    def add_running_pods(
        self,
        count: int,
        namespace: str,
        requests: Mapping[str, str],
        prefix: str,
        labels: Mapping[str, str],
    ) -> list[str]:
        """Create ``count`` already-running, ownerless pods spread over schedulable nodes
        (benchmark background load; no controller churn)."""
        req = R.parse_resources(requests)
        names: list[str] = []
        nodes = sorted(self.nodes)
        if not nodes:
            raise ValueError(f"cluster {self.name} has no nodes")
        if self.store.get("namespaces", "", namespace) is None:
            self.store.create("namespaces", namespace_object(namespace))
        now = now_iso()
        start = len(self.store.objects["pods"])
        i = 0
        misses = 0
        while len(names) < count:
            node = nodes[i % len(nodes)]
            i += 1
            st = self.nodes[node]
            if (st.unschedulable or self.pods_used.get(node, 0) >= st.pods
                    or not R.fits(req, self.free(node))):
                misses += 1
                if misses > len(nodes):
                    raise ValueError(
                        f"cluster {self.name}: no room for {count - len(names)} more pods"
                    )
                continue
            misses = 0
            name = f"{prefix}-{start + len(names)}"
            uid = str(uuid.uuid4())
            self._requests[((namespace, name), uid)] = req  # skip re-parsing quantities
            pod = {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace, "labels": dict(labels),
                             "uid": uid},
                "spec": {
                    "nodeName": node, "schedulerName": "default-scheduler",
                    "containers": [{"name": "load", "image": "pause",
                                    "resources": {"requests": dict(requests)}}],
                },
                "status": {
                    "phase": "Running", "startTime": now, "hostIP": _node_ip(self.store, node),
                    "conditions": [_cond(t, "True", "", "") for t in
                                   ("PodScheduled", "Initialized", "Ready", "ContainersReady")],
                    "containerStatuses": [{
                        "name": "load", "image": "pause", "imageID": "", "ready": True,
                        "started": True, "restartCount": 0,
                        "state": {"running": {"startedAt": now}},
                    }],
                },
            }
            self.store.create("pods", pod)
            names.append(name)
        return names


# ---------------------------------------------------------------------- helpers


def namespace_object(name: str) -> Obj:
    return {
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}},
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    }


def _key(obj: Obj) -> Key:
    meta = obj["metadata"]
    return (meta.get("namespace") or "", meta["name"])


def _ref(obj: Obj) -> dict[str, Any]:
    return {
        "apiVersion": obj.get("apiVersion", "v1"), "kind": obj.get("kind", ""),
        "name": obj["metadata"]["name"], "uid": obj["metadata"].get("uid", ""),
    }


def _node_ip(store: Store, node: str) -> str:
    n = store.get("nodes", "", node)
    for a in ((n or {}).get("status") or {}).get("addresses") or []:
        if a.get("type") == "InternalIP":
            return str(a.get("address"))
    return ""


def job_owner(pod: Obj) -> str | None:
    for ref in pod["metadata"].get("ownerReferences") or []:
        if ref.get("kind") == "PyTorchJob":
            return str(ref.get("name"))
    return None


def _owner_uid(pod: Obj) -> str | None:
    for ref in pod["metadata"].get("ownerReferences") or []:
        if ref.get("kind") == "PyTorchJob":
            return str(ref.get("uid"))
    return None


def _pod_order(pod: Obj) -> tuple[int, int, str]:
    labels = pod["metadata"].get("labels") or {}
    role = 0 if labels.get(REPLICA_TYPE) == "master" else 1
    try:
        idx = int(labels.get(REPLICA_INDEX, "0"))
    except ValueError:
        idx = 0
    return (role, idx, pod["metadata"]["name"])


def _reservation_affinity(annotations: Mapping[str, str]) -> dict[str, str] | None:
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
    seconds = DEFAULT_TTL if ttl is None else parse_duration(str(ttl))
    if seconds == 0:
        return None
    return created + seconds


def _cond(type_: str, status: str, reason: str, message: str) -> dict[str, Any]:
    now = now_iso()
    c: dict[str, Any] = {"type": type_, "status": status, "lastTransitionTime": now}
    if reason:
        c["reason"] = reason
    if message:
        c["message"] = message
    return c


def _set_condition(status: dict[str, Any], cond: dict[str, Any]) -> None:
    conds = status.setdefault("conditions", [])
    for i, c in enumerate(conds):
        if c.get("type") == cond["type"]:
            if c.get("status") == cond["status"]:
                cond["lastTransitionTime"] = c.get("lastTransitionTime", cond["lastTransitionTime"])
            conds[i] = cond
            return
    conds.append(cond)


def _condition_true(status: Mapping[str, Any], ctype: str) -> bool:
    return any(
        c.get("type") == ctype and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def _fail_reservation(status: dict[str, Any], reason: str, message: str) -> None:
    status["phase"] = "Failed"
    status["reason"] = reason
    status["message"] = message
    ctype = "Ready" if reason == "Expired" else "Scheduled"
    _set_condition(status, _cond(ctype, "False", reason, message))


def finished_pod(pod: Obj, phase: str, reason: str) -> Obj:
    new = copy.deepcopy(pod)
    now = now_iso()
    st = new.setdefault("status", {})
    st["phase"] = phase
    code = 0 if phase == "Succeeded" else 1
    for ctype in ("Ready", "ContainersReady"):
        _set_condition(st, _cond(ctype, "False", "PodCompleted" if code == 0 else "PodFailed", ""))
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


def min_member(job: Obj) -> int | None:
    """``runPolicy.schedulingPolicy.minAvailable`` of a PyTorchJob (what the operator makes
    its PodGroup's minMember), at least 1; None when not set."""
    run_policy = (job.get("spec") or {}).get("runPolicy") or {}
    value = (run_policy.get("schedulingPolicy") or {}).get("minAvailable")
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return max(1, value)


def replica_slots(job: Obj) -> list[tuple[str, int, Mapping[str, Any], str | None]]:
    specs = (job.get("spec") or {}).get("pytorchReplicaSpecs") or {}
    out = []
    for role in ("Master", "Worker"):
        rs = specs.get(role)
        if not isinstance(rs, Mapping):
            continue
        n = rs.get("replicas", 1)
        n = n if isinstance(n, int) and n >= 0 else 1
        tmpl = rs.get("template") or {}
        for i in range(n):
            out.append((role.lower(), i, tmpl, rs.get("restartPolicy")))
    return out


def job_status(job: Obj, pods: list[Obj], old: dict[str, Any]) -> dict[str, Any]:
    """Kubeflow-style status from the job's pods (idempotent: unchanged in → unchanged out)."""
    status = copy.deepcopy(old)
    name = job["metadata"]["name"]
    ns = job["metadata"]["namespace"]
    counts: dict[str, dict[str, int]] = {}
    phases: dict[str, list[str]] = {}
    for p in pods:
        role = (p["metadata"].get("labels") or {}).get(REPLICA_TYPE, "worker")
        rtype = role.capitalize()
        phase = (p.get("status") or {}).get("phase") or "Pending"
        c = counts.setdefault(rtype, {"active": 0, "succeeded": 0, "failed": 0})
        if phase == "Succeeded":
            c["succeeded"] += 1
        elif phase == "Failed":
            c["failed"] += 1
        else:
            c["active"] += 1
        phases.setdefault(rtype, []).append(phase)
    expected = len(replica_slots(job))
    status["replicaStatuses"] = {
        rtype: {k: v for k, v in c.items() if v} for rtype, c in sorted(counts.items())
    }
    if not status.get("startTime"):
        status["startTime"] = now_iso()
    _ensure(status, "Created", "PyTorchJobCreated", f"PyTorchJob {name} is created.")
    done = _condition_true(status, "Succeeded") or _condition_true(status, "Failed")
    if done:
        return status
    failed = {r: c["failed"] for r, c in counts.items() if c["failed"]}
    all_phases = [ph for lst in phases.values() for ph in lst]
    if failed:
        role, n = next(iter(sorted(failed.items())))
        _ensure(status, "Failed", "PyTorchJobFailed",
                f"PyTorchJob {ns}/{name} has failed because {n} {role} replica(s) failed.")
        _unset(status, "Running", "PyTorchJobFailed")
        status["completionTime"] = now_iso()
    elif _succeeded(job, counts):
        _ensure(status, "Succeeded", "PyTorchJobSucceeded",
                f"PyTorchJob {ns}/{name} successfully completed.")
        _unset(status, "Running", "PyTorchJobSucceeded")
        status["completionTime"] = now_iso()
    else:
        # Every pod runs; or, for a PodGroup smaller than the job (minAvailable), at least
        # minMember pods run (the others wait for room, as they do under a gang scheduler).
        minimum = min_member(job)
        need = expected if minimum is None else min(minimum, expected)
        running = sum(1 for ph in all_phases if ph == "Running")
        if expected and running >= need and all(
            ph in ("Running", "Pending") for ph in all_phases
        ) and (need < expected or len(all_phases) >= expected):
            _ensure(status, "Running", "PyTorchJobRunning",
                    f"PyTorchJob {ns}/{name} is running.")
    return status


def _succeeded(job: Obj, counts: Mapping[str, Mapping[str, int]]) -> bool:
    """The operator's rule: a job with a Master succeeds when the Master has; a job
    without one when every Worker has, or, with an elasticPolicy, when any Worker has."""
    specs = (job.get("spec") or {}).get("pytorchReplicaSpecs") or {}
    if "Master" in specs:
        return counts.get("Master", {}).get("succeeded", 0) > 0
    workers = sum(1 for role, *_ in replica_slots(job) if role == "worker")
    done = counts.get("Worker", {}).get("succeeded", 0)
    elastic = (job.get("spec") or {}).get("elasticPolicy") is not None
    return workers > 0 and (done >= workers or (elastic and done > 0))


def _ensure(status: dict[str, Any], ctype: str, reason: str, message: str) -> None:
    conds = status.setdefault("conditions", [])
    for c in conds:
        if c.get("type") == ctype:
            if c.get("status") != "True":
                now = now_iso()
                c.update(status="True", reason=reason, message=message,
                         lastUpdateTime=now, lastTransitionTime=now)
            return
    now = now_iso()
    conds.append({"type": ctype, "status": "True", "reason": reason, "message": message,
                  "lastUpdateTime": now, "lastTransitionTime": now})


def _unset(status: dict[str, Any], ctype: str, reason: str) -> None:
    for c in status.get("conditions") or []:
        if c.get("type") == ctype and c.get("status") == "True":
            now = now_iso()
            c.update(status="False", reason=reason, lastUpdateTime=now, lastTransitionTime=now)
