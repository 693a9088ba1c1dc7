"""Watch-fed capacity cache of one member cluster, so placement never LISTs a cluster.

LIST+WATCH like a client-go informer, with plain dicts: watches on nodes, pods and
Reservations update per-node aggregates per event, a PyTorchJob watch wakes
``wait_for_change`` callers, and a ``GET /version`` probe checks reachability.
:meth:`CapacityCache.snapshot` returns the same read-only :class:`ClusterSnapshot` object
until something changes (rebuilt in O(nodes), never O(pods)), so callers may cache views
per snapshot; :meth:`CapacityCache.snapshot_by_list` is the cold path. A broken watch or
probe serves the last snapshot for at most ``cacheTTLSeconds``, then ``reachable=False``.
Staleness bound and what is counted: docs/member-contract.md "The capacity cache".
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from activities.kube_api import ApiError, ClusterUnreachable, Gone, KubeApi, NotFound, WatchStream
from fleetq import resources as R
from fleetq.capacity import ClusterSnapshot, NodeCapacity, Taint
from fleetq.cluster_health import READY, ClusterCondition, TaintSettings, cluster_taints
from fleetq.member_contract import (
    PYTORCHJOB_API,
    RESERVATION_API,
    GangPod,
    copy_key,
    gang_pod,
    job_phase,
    kept_for_status,
    meta_of,
)
from fleetq.models import pod_requests
from fleetq.naming import KF_JOB_NAME
from fleetq.preemption import RunningGang

log = logging.getLogger(__name__)

NODES = "/api/v1/nodes"
PODS = "/api/v1/pods"
RESERVATIONS = f"{RESERVATION_API}/reservations"
JOBS = f"{PYTORCHJOB_API}/pytorchjobs"
TERMINATED = ("Succeeded", "Failed")


@dataclass(frozen=True)
class _Node:
    allocatable: R.Resources
    labels: dict[str, str]
    taints: tuple[Taint, ...]
    unschedulable: bool
    pods_allocatable: int


@dataclass(frozen=True)
class _Use:
    """What one pod or reservation takes on one node."""

    node: str
    requests: R.Resources
    pod: bool


def _key(obj: Mapping[str, Any]) -> str:
    m = meta_of(obj)
    return f"{m.get('namespace') or ''}/{m.get('name') or ''}"


def condense_node(obj: Mapping[str, Any]) -> _Node:
    status = obj.get("status") or {}
    spec = obj.get("spec") or {}
    try:
        alloc = R.parse_resources(status.get("allocatable") or status.get("capacity") or {})
    except R.QuantityError:
        alloc = {}
    pods = alloc.pop(R.PODS, 110 * R.MILLI) // R.MILLI
    taints = tuple(
        Taint(
            str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or "NoSchedule")
        )
        for t in spec.get("taints") or []
        if isinstance(t, dict)
    )
    unschedulable = bool(spec.get("unschedulable"))
    for cond in status.get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == "Ready" and cond.get("status") != "True":
            unschedulable = True  # NotReady nodes take no new pods
    labels = meta_of(obj).get("labels") or {}
    return _Node(alloc, dict(labels), taints, unschedulable, int(pods))


def condense_pod(obj: Mapping[str, Any]) -> _Use | None:
    spec = obj.get("spec") or {}
    node = spec.get("nodeName")
    phase = (obj.get("status") or {}).get("phase")
    if not node or phase in TERMINATED:
        return None
    return _Use(str(node), _requests(spec), True)


def condense_reservation(obj: Mapping[str, Any]) -> _Use | None:
    status = obj.get("status") or {}
    if status.get("phase") != "Available":
        return None
    tspec = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
    node = status.get("nodeName") or tspec.get("nodeName")
    if not node:
        return None
    return _Use(str(node), _requests(tspec), False)


def _requests(spec: Mapping[str, Any]) -> R.Resources:
    """The pod spec's requests; one whose quantities do not parse counts as none."""
    try:
        return pod_requests(spec)
    except (R.QuantityError, ValueError):
        return {}


class _State:
    """Nodes plus per-node aggregates; not thread-safe by itself (the cache locks)."""

    def __init__(self) -> None:
        self.nodes: dict[str, _Node] = {}
        self.uses: dict[str, dict[str, _Use]] = {"pods": {}, "reservations": {}}
        self.requested: dict[str, R.Resources] = {}
        self.pod_count: dict[str, int] = {}
        #: nodes whose requests or pod count changed since the last build
        self.dirty: set[str] = set()
        #: node name -> the node info and the NodeCapacity the last build made of it
        self.built: dict[str, tuple[_Node, NodeCapacity]] = {}

    def set_use(self, kind: str, key: str, use: _Use | None) -> bool:
        table = self.uses[kind]
        old = table.pop(key, None)
        if old == use:
            if use is not None:
                table[key] = use
            return False
        if old is not None:
            self.dirty.add(old.node)
            R.add_into(self.requested.setdefault(old.node, {}), old.requests, -1)
            if old.pod:
                self.pod_count[old.node] = self.pod_count.get(old.node, 0) - 1
        if use is not None:
            table[key] = use
            self.dirty.add(use.node)
            R.add_into(self.requested.setdefault(use.node, {}), use.requests)
            if use.pod:
                self.pod_count[use.node] = self.pod_count.get(use.node, 0) + 1
        return True

    def replace(self, kind: str, uses: Mapping[str, _Use]) -> None:
        for key in list(self.uses[kind]):
            if key not in uses:
                self.set_use(kind, key, None)
        for key, use in uses.items():
            self.set_use(kind, key, use)

    def build(
        self, name: str, labels: dict[str, str], taints: tuple[Taint, ...], reservation: bool,
        rv: str,
    ) -> ClusterSnapshot:
        """A new snapshot whose unchanged nodes (same node info, no request or pod count
        change since the last build) are the very NodeCapacity objects of the last
        snapshot, so placement derives its view from the nodes that changed only
        (:meth:`fleetq.placement.ClusterColumns.updated`). Nobody changes a snapshot's
        node objects (see the module doc): a changed node is a new object."""
        built: dict[str, tuple[_Node, NodeCapacity]] = {}
        nodes: list[NodeCapacity] = []
        last = self.built
        dirty = self.dirty
        for n, info in sorted(self.nodes.items()):
            got = last.get(n)
            if got is not None and n not in dirty and (got[0] is info or got[0] == info):
                cap = got[1]
            else:
                cap = NodeCapacity(
                    name=n,
                    allocatable=dict(info.allocatable),
                    requested=dict(self.requested.get(n) or {}),
                    labels=dict(info.labels),
                    taints=info.taints,
                    unschedulable=info.unschedulable,
                    pods_allocatable=info.pods_allocatable,
                    pods_used=self.pod_count.get(n, 0),
                )
            built[n] = (info, cap)
            nodes.append(cap)
        self.built = built
        self.dirty = set()
        return ClusterSnapshot(
            name=name, labels=dict(labels), taints=taints, nodes=nodes,
            reservation=reservation, reachable=True, resource_version=rv,
        )


class CapacityCache:
    """LIST+WATCH cache of one cluster's nodes, pods and reservations (see module doc)."""

    WATCH_TIMEOUT_S = 60
    #: how many of each PyTorchJob's latest resourceVersions the cache remembers
    JOB_VERSIONS_KEPT = 8
    #: how long a watch being opened again still vouches (``_watching``)
    REOPEN_GRACE_S = 3.0
    MAX_FINISHED = 10_000
    #: Watch-loop backoff after a failed LIST or WATCH, as client-go's reflector
    #: (tools/cache/reflector.go: 800 ms initial, factor 2, jitter 1.0, i.e. each wait is
    #: drawn from [d, 2d]); capped at 5 s rather than the reflector's 30 s because the
    #: probe loop wakes every loop as soon as the member answers again.
    INITIAL_BACKOFF_S = 0.8
    MAX_BACKOFF_S = 5.0

    def __init__(
        self,
        api: KubeApi,
        *,
        name: str,
        labels: Mapping[str, str] | None = None,
        taints: tuple[Taint, ...] = (),
        reservation: bool = False,
        ttl_s: float = 2.0,
        watch_jobs: bool = True,
        failover: TaintSettings | None = None,
    ) -> None:
        self.api = api
        self.name = name
        self.labels = dict(labels or {})
        self.taints = taints
        self.reservation = reservation
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._state = _State()
        self._version = 0
        self._built: tuple[int, ClusterSnapshot] | None = None
        self._rv: dict[str, str] = {}
        self._kinds = ["nodes", "pods"] + (["reservations"] if reservation else [])
        self._synced: set[str] = set()
        self._initial = threading.Event()
        self._broken_since: dict[str, float] = {}  # kind or "probe" -> monotonic
        self._streams: dict[str, WatchStream] = {}
        #: each kind whose watch is open (None) or is being opened again from the
        #: resourceVersion its last stream reached (when that stream ended, monotonic: a
        #: normal end, ``timeoutSeconds``). As a client-go lister serves through the
        #: reflector's re-watch, the cache vouches for such a kind (:meth:`_vouches`),
        #: a re-open for at most ``REOPEN_GRACE_S`` (a healthy one takes one round trip;
        #: past it the re-open is taken for hung). A failed LIST or WATCH, or a probe
        #: that recovers, drops the kind until its watch is open again.
        self._watching: dict[str, float | None] = {}
        self._stop = threading.Event()
        self._wake = threading.Condition()
        self._wake_gen = 0
        self._threads: list[threading.Thread] = []
        self._watch_jobs = watch_jobs
        self._subs: dict[tuple[str, str], set[threading.Event]] = {}
        #: PyTorchJobs seen finished: (namespace, name) -> (copy key: owner and submission,
        #: phase, message),
        #: kept after the member deletes them (ttlSecondsAfterFinished), bounded
        self._finished: OrderedDict[tuple[str, str], tuple[str, str, str]] = OrderedDict()
        #: every PyTorchJob the member holds now, (namespace, name) -> what status reads
        #: of it as last watched (``kept_for_status``), any owner
        self._jobs: dict[tuple[str, str], Mapping[str, Any]] = {}
        #: the last resourceVersions the jobs watch showed of each PyTorchJob, newest
        #: last: a status read serves a job from the cache only once the cache has seen
        #: the version last reported of it (``job_copy``'s ``seen_rv``)
        self._job_rvs: dict[tuple[str, str], deque[str]] = {}
        #: the pods labelled with a PyTorchJob's name, (namespace, job name) -> pod key ->
        #: what status reads of the pod as last watched, and each such pod's job
        #: (:meth:`job_copy`)
        self._job_pods: dict[tuple[str, str], dict[str, Mapping[str, Any]]] = {}
        self._pod_job: dict[str, tuple[str, str]] = {}
        self._subs_lock = threading.Lock()
        self.failover = failover or TaintSettings()
        #: the last probe's verdict ("Unknown"/"False" with a one-line reason)
        self._probe_verdict: tuple[str, str] = ("True", "")
        self._last_failure = ""
        self._unreachable: tuple[ClusterCondition, ClusterSnapshot] | None = None
        #: running pods of fleet jobs' copies (pod key -> what it says of its gang), for
        #: capacity preemption (:meth:`running_gangs`)
        self._gang_pods: dict[str, GangPod] = {}
        #: called with the cluster name whenever a node is added, removed or changes
        #: what placement reads of it (``add_node_listener``)
        self._node_listeners: list[Callable[[str], None]] = []

    # -- lifecycle

    def add_node_listener(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(cluster name)`` after each change of this member's nodes
        (allocatable, labels, taints, cordon/readiness, pod slots; not their usage), on
        the watch thread: it must be quick and must not block."""
        with self._lock:
            if listener not in self._node_listeners:
                self._node_listeners.append(listener)

    def _nodes_changed(self) -> None:
        for listener in list(self._node_listeners):
            try:
                listener(self.name)
            except Exception:  # a listener's bug must not stop the watch
                log.exception("node listener of %s failed", self.name)

    def start(self) -> None:
        if self._threads:
            return
        specs: list[tuple[str, Callable[[], None]]] = [
            ("nodes", lambda: self._run("nodes", NODES, self._apply_nodes)),
            ("pods", lambda: self._run("pods", PODS, self._apply_pods)),
        ]
        if self.reservation:
            specs.append(
                ("reservations", lambda: self._run("reservations", RESERVATIONS, self._apply_res))
            )
        if self._watch_jobs:
            specs.append(("jobs", lambda: self._run("jobs", JOBS, self._apply_jobs)))
        specs.append(("probe", self._probe_loop))
        for kind, target in specs:
            t = threading.Thread(
                target=target, name=f"fleetq-cache-{self.name}-{kind}", daemon=True
            )
            t.start()
            self._threads.append(t)

    def close(self) -> None:
        self._stop.set()
        self._kick()
        with self._lock:
            streams = list(self._streams.values())
        for s in streams:
            s.close()
        for t in self._threads:
            t.join(timeout=2.0)
        self._threads.clear()

    # -- reading

    @property
    def synced(self) -> bool:
        return self._initial.is_set()

    def watching(self) -> bool:
        """Is every watched kind's stream open and nothing broken (the steady state, in
        which the cache sends the member no request but the probe)?"""
        with self._lock:
            # (reservations: not when the member has no Reservation API, see _run)
            watched = [k for k in self._kinds if k != "reservations" or k in self._streams]
            if self._watch_jobs:
                watched.append("jobs")
            return (
                self._initial.is_set()
                and all(k in self._streams for k in watched)
                and not self._broken_since
            )

    def healthy(self) -> bool:
        """Can the cached snapshot be served (see the staleness bound)?"""
        with self._lock:
            if not all(k in self._synced for k in self._kinds):
                return False
            broken = [t for k, t in self._broken_since.items() if k != "jobs"]
        return not broken or time.monotonic() - min(broken) <= self.ttl_s

    def condition(self) -> ClusterCondition:
        """The member's Ready condition: ``True`` while the snapshot can be served; else
        ``False`` (its API answers with errors) or ``Unknown`` (it does not answer),
        since the moment the cache stopped vouching for it (first failure + TTL)."""
        with self._lock:
            synced = all(k in self._synced for k in self._kinds)
            broken = [t for k, t in self._broken_since.items() if k != "jobs"]
            verdict, failure = self._probe_verdict, self._last_failure
        now = time.monotonic()
        if synced and (not broken or now - min(broken) <= self.ttl_s):
            return READY
        start = (min(broken) + self.ttl_s) if broken else now
        since = time.time() - max(0.0, now - start)
        ready, reason = verdict
        if ready == "True":  # the probe answers but the watches fail (or never synced)
            ready, reason = "Unknown", failure or f"{self.name}: unreachable (not synced yet)"
        return ClusterCondition(ready, round(since, 3), reason)  # type: ignore[arg-type]

    def unreachable_snapshot(self) -> ClusterSnapshot:
        """The snapshot served while the cache cannot vouch for the member: no nodes,
        ``reachable=False``, and the member's health taints (same object while the
        condition stays the same, so per-snapshot memos stay valid)."""
        cond = self.condition()
        cached = self._unreachable
        if cached is not None and cached[0] == cond:
            return cached[1]
        snap = ClusterSnapshot(
            name=self.name,
            labels=dict(self.labels),
            taints=self.taints + cluster_taints(cond, self.failover),
            reservation=self.reservation,
            reachable=False,
        )
        self._unreachable = (cond, snap)
        return snap

    def snapshot(self, wait_s: float | None = None) -> ClusterSnapshot:
        """The current snapshot; the first call waits up to ``wait_s`` (default connect +
        read timeout) for the initial LISTs."""
        if not self._initial.is_set():
            wait = self.api.connect_s + self.api.read_s if wait_s is None else wait_s
            self._initial.wait(wait)
        if not self.healthy():
            return self.unreachable_snapshot()
        with self._lock:
            built = self._built
            if built is not None and built[0] == self._version:
                return built[1]
            rv = "/".join(f"{k}={self._rv.get(k, '')}" for k in self._kinds)
            snap = self._state.build(self.name, self.labels, self.taints, self.reservation, rv)
            self._built = (self._version, snap)
            return snap

    def running_gangs(self) -> list[RunningGang]:
        """The fleet jobs running on this member, one per owning workflow, with their
        pods' nodes and requests, priority and preemption policy (what their pods say,
        :func:`fleetq.member_contract.gang_pod`): capacity preemption's candidates. Empty
        while the snapshot cannot be served (no victims on a member we cannot see)."""
        if not self.healthy():
            return []
        with self._lock:
            pods = list(self._gang_pods.values())
        by_job: dict[str, list[GangPod]] = {}
        for p in pods:
            by_job.setdefault(p.job_id, []).append(p)
        out: list[RunningGang] = []
        for job_id, members in sorted(by_job.items()):
            first = members[0]
            out.append(
                RunningGang(
                    job_id=job_id,
                    cluster=self.name,
                    priority=first.priority,
                    pods=tuple(m.pod for m in members),
                    started_at=min(m.started_at for m in members),
                    preemptible=all(m.preemptible for m in members),
                    grace_seconds=max(m.grace_seconds for m in members),
                )
            )
        return out

    def invalidate(self) -> None:
        """Force the next :meth:`snapshot` to rebuild (benchmarks, diagnostics)."""
        with self._lock:
            self._version += 1

    def snapshot_nowait(self) -> ClusterSnapshot | None:
        """The snapshot if the initial LISTs are done, else None (do not block)."""
        return self.snapshot() if self._initial.is_set() else None

    def snapshot_by_list(self) -> ClusterSnapshot:
        """Cold path: LIST nodes, pods and reservations now and condense them."""
        try:
            nodes, nrv = self.api.list(NODES)
            pods, prv = self.api.list(PODS)
            res, rrv = self.api.list(RESERVATIONS) if self.reservation else ([], "")
        except (ClusterUnreachable, ApiError):
            return self.unreachable_snapshot()
        state = _State()
        state.nodes = {str(meta_of(n).get("name")): condense_node(n) for n in nodes}
        for p in pods:
            state.set_use("pods", _key(p), condense_pod(p))
        for r in res:
            state.set_use("reservations", _key(r), condense_reservation(r))
        rv = f"nodes={nrv}/pods={prv}" + (f"/reservations={rrv}" if self.reservation else "")
        return state.build(self.name, self.labels, self.taints, self.reservation, rv)

    # -- change notification (wait_for_change)

    def subscribe(self, namespace: str, name: str) -> threading.Event:
        ev = threading.Event()
        with self._subs_lock:
            self._subs.setdefault((namespace, name), set()).add(ev)
        return ev

    def unsubscribe(self, namespace: str, name: str, ev: threading.Event) -> None:
        with self._subs_lock:
            subs = self._subs.get((namespace, name))
            if subs is not None:
                subs.discard(ev)
                if not subs:
                    del self._subs[(namespace, name)]

    def _notify(self, namespace: str, name: str) -> None:
        with self._subs_lock:
            subs = list(self._subs.get((namespace, name), ()))
        for ev in subs:
            ev.set()

    def _notify_all(self) -> None:
        with self._subs_lock:
            subs = [ev for evs in self._subs.values() for ev in evs]
        for ev in subs:
            ev.set()

    # -- applying events (called with the lock held)

    def _apply_nodes(self, etype: str, obj: Mapping[str, Any]) -> bool:
        name = str(meta_of(obj).get("name") or "")
        if etype == "DELETED":
            gone = self._state.nodes.pop(name, None) is not None
            if gone:
                self._nodes_changed()
            return gone
        info = condense_node(obj)
        if self._state.nodes.get(name) == info:
            return False
        self._state.nodes[name] = info
        self._nodes_changed()
        return True

    def _apply_pods(self, etype: str, obj: Mapping[str, Any]) -> bool:
        meta = meta_of(obj)
        job = (meta.get("labels") or {}).get(KF_JOB_NAME)
        key = _key(obj)
        owner = (str(meta.get("namespace") or ""), str(job)) if job else None
        before = self._keep_job_pod(key, None if etype == "DELETED" else obj)
        if owner is not None:
            self._notify(*owner)
        if before is not None and before != owner:
            self._notify(*before)  # its job-name label changed: the old job lost a pod
        use = None if etype == "DELETED" else condense_pod(obj)
        member = None if etype == "DELETED" else gang_pod(obj)
        if member is None:
            self._gang_pods.pop(key, None)
        else:
            self._gang_pods[key] = member
        return self._state.set_use("pods", key, use)

    def _keep_job_pod(self, key: str, obj: Mapping[str, Any] | None) -> tuple[str, str] | None:
        """(Under the lock.) Keep pod ``key`` as ``obj`` among its job's pods (None: the
        pod is gone); a pod without a job-name label is not kept. The job it was kept
        under before, if any."""
        before = self._pod_job.pop(key, None)
        if before is not None:
            pods = self._job_pods.get(before)
            if pods is not None:
                pods.pop(key, None)
                if not pods:
                    del self._job_pods[before]
        if obj is None:
            return before
        meta = meta_of(obj)
        job = (meta.get("labels") or {}).get(KF_JOB_NAME)
        if job:
            owner = (str(meta.get("namespace") or ""), str(job))
            self._pod_job[key] = owner
            self._job_pods.setdefault(owner, {})[key] = kept_for_status(obj)
        return before

    def _apply_res(self, etype: str, obj: Mapping[str, Any]) -> bool:
        use = None if etype == "DELETED" else condense_reservation(obj)
        return self._state.set_use("reservations", _key(obj), use)

    def _apply_jobs(self, etype: str, obj: Mapping[str, Any]) -> bool:
        meta = meta_of(obj)
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        if etype == "DELETED":
            self._jobs.pop(key, None)
            self._job_rvs.pop(key, None)
        else:
            self._jobs[key] = kept_for_status(obj)
            seen = self._job_rvs.get(key)
            if seen is None:
                seen = self._job_rvs[key] = deque(maxlen=self.JOB_VERSIONS_KEPT)
            seen.append(str(meta.get("resourceVersion") or ""))
        phase, message = job_phase(obj)
        if phase in TERMINATED:
            owner = copy_key(meta.get("labels") or {})  # owner, and submission if any
            self._finished[key] = (owner, phase, message)
            self._finished.move_to_end(key)
            while len(self._finished) > self.MAX_FINISHED:
                self._finished.popitem(last=False)
        self._notify(*key)
        return False

    def holds_no_job(self, namespace: str, name: str) -> bool:
        """Whether the jobs watch vouches that the member holds no PyTorchJob
        ``namespace/name`` (listed, connected, none seen); False when it holds one or
        the cache cannot say. The answer trails the member by the watch's latency."""
        with self._lock:
            return ("jobs" in self._synced and "jobs" not in self._broken_since
                    and (namespace, name) not in self._jobs)

    def job_copy(
        self, namespace: str, name: str, uid: str = "", seen_rv: str = ""
    ) -> tuple[Mapping[str, Any], list[Mapping[str, Any]]] | None:
        """The PyTorchJob ``namespace/name`` (with ``uid``: that copy of it) and the pods
        labelled with its name, as the watches last saw them, as a client-go lister
        serves them: only while the jobs and pods watches are open and nothing (the
        probe included) is broken, and only once a watch has shown the copy (with
        ``seen_rv``: shown that version of it, which a read of the member returned, so
        what is served is never older than what was reported). None otherwise: the
        caller reads the member. Trails the member by the watches' latency; the objects
        must not be changed."""
        with self._lock:
            obj = self._shown(namespace, name, uid) if self._vouches() else None
            if obj is not None and seen_rv and seen_rv not in self._job_rvs.get(
                (namespace, name), ()
            ):
                return None
            if obj is None:
                return None
            return obj, list(self._job_pods.get((namespace, name), {}).values())

    def awaits_copy(self, namespace: str, name: str, uid: str = "") -> bool:
        """Whether the watches could vouch for the PyTorchJob ``namespace/name`` but have
        not shown it (with ``uid``: not that copy of it): a copy just created shows up
        with its ``ADDED`` event."""
        with self._lock:
            return self._vouches() and self._shown(namespace, name, uid) is None

    def _shown(self, namespace: str, name: str, uid: str) -> Mapping[str, Any] | None:
        """(Under the lock.) The PyTorchJob as watched, if it is there (and has ``uid``)."""
        obj = self._jobs.get((namespace, name))
        if obj is None or (uid and meta_of(obj).get("uid") != uid):
            return None
        return obj

    def _vouches(self) -> bool:
        """(Under the lock.) The jobs and pods watches are listed and open (or being
        opened again from where their last stream ended, ``_watching``), and nothing,
        the probe included, is broken: what they show is the member's, a watch's latency
        ago."""
        return (
            self._watch_jobs
            and "jobs" in self._synced
            and "pods" in self._synced
            and not self._broken_since
            and self._watch_vouches("jobs")
            and self._watch_vouches("pods")
        )

    def _watch_vouches(self, kind: str) -> bool:
        """(Under the lock.) ``kind``'s watch is open, or has been opening again for no
        longer than ``REOPEN_GRACE_S``."""
        if kind not in self._watching:
            return False
        ended = self._watching[kind]
        return ended is None or time.monotonic() - ended <= self.REOPEN_GRACE_S

    def finished_job(self, namespace: str, name: str, owner: str) -> tuple[str, str] | None:
        """``(phase, message)`` if this cache saw the job (the copy of this owner and
        submission, ``member_contract.copy_key``) Succeeded or Failed: a member that
        deletes a finished job (``ttlSecondsAfterFinished``) must not make fleetq think
        the job vanished and dispatch it again."""
        with self._lock:
            seen = self._finished.get((namespace, name))
        if seen is None or seen[0] != owner:
            return None
        return seen[1], seen[2]

    def _replace(self, kind: str, items: list[dict[str, Any]]) -> bool:
        if kind == "nodes":
            new = {str(meta_of(n).get("name")): condense_node(n) for n in items}
            changed = new != self._state.nodes
            self._state.nodes = new
            if changed:
                self._nodes_changed()
            return changed
        if kind == "jobs":
            gone = set(self._jobs)
            self._jobs = {}
            for obj in items:
                self._apply_jobs("ADDED", obj)
            for key in gone - set(self._jobs):  # deleted while the watch was away
                self._job_rvs.pop(key, None)
                self._notify(*key)
            return False
        condense = condense_pod if kind == "pods" else condense_reservation
        if kind == "pods":
            self._gang_pods = {
                _key(obj): member for obj in items if (member := gang_pod(obj)) is not None
            }
            had = set(self._job_pods)
            self._job_pods, self._pod_job = {}, {}
            for obj in items:
                self._keep_job_pod(_key(obj), obj)
            for owner in had - set(self._job_pods):  # their pods went while away
                self._notify(*owner)
        uses = {}
        for obj in items:
            use = condense(obj)
            if use is not None:
                uses[_key(obj)] = use
            if kind == "pods":
                job = (meta_of(obj).get("labels") or {}).get(KF_JOB_NAME)
                if job:
                    self._notify(str(meta_of(obj).get("namespace") or ""), str(job))
        before = dict(self._state.uses[kind])
        self._state.replace(kind, uses)
        return before != self._state.uses[kind]

    # -- background loops

    def _mark_broken(self, kind: str) -> None:
        with self._lock:
            first = kind not in self._broken_since
            self._broken_since.setdefault(kind, time.monotonic())
        if first:
            self._notify_all()

    def _mark_ok(self, kind: str) -> None:
        with self._lock:
            was = self._broken_since.pop(kind, None)
        if was is not None:
            self._notify_all()

    def _run(
        self, kind: str, path: str, apply: Callable[[str, Mapping[str, Any]], bool]
    ) -> None:
        backoff = self.INITIAL_BACKOFF_S
        need_list = True
        rv = ""
        while not self._stop.is_set():
            try:
                if need_list:
                    rv = self._list(kind, path)
                    need_list = False
                self._mark_ok(kind)
                watched = self._watch(kind, path, rv, apply)
                if watched is None:
                    return
                rv = watched
                backoff = self.INITIAL_BACKOFF_S
            except ApiError as exc:
                if self._stop.is_set():
                    return
                need_list = True
                self._watch_failed(kind)
                backoff = self._after_api_error(kind, exc, backoff)
            except Exception as exc:  # connection drops, decode errors: never kill the loop
                if self._stop.is_set():
                    return
                need_list = True
                self._watch_failed(kind)
                self._failed(kind, exc, backoff)
                backoff = min(backoff * 2, self.MAX_BACKOFF_S)

    def _watch_failed(self, kind: str) -> None:
        """``kind``'s LIST or WATCH failed: the cache no longer vouches for it until its
        watch is open again after a LIST."""
        with self._lock:
            self._watching.pop(kind, None)

    def _list(self, kind: str, path: str) -> str:
        """LIST ``kind`` and replace what the cache holds of it; the resourceVersion."""
        # One attempt: this loop is the retry (its backoff, not the
        # transport's, paces a failing member; nested retries multiplied
        # the requests a 5xx member got from each loop).
        items, rv = self.api.list(path, retry=False)
        with self._lock:
            if self._replace(kind, items):
                self._version += 1
            self._rv[kind] = rv
            self._mark_synced(kind)
        return rv

    def _mark_synced(self, kind: str) -> None:
        """(Under the lock.) ``kind`` has been listed; the cache is ready once all have."""
        self._synced.add(kind)
        if all(k in self._synced for k in self._kinds):
            self._initial.set()

    def _watch(
        self, kind: str, path: str, rv: str, apply: Callable[[str, Mapping[str, Any]], bool]
    ) -> str | None:
        """WATCH ``kind`` from ``rv`` until the stream ends; the resourceVersion reached,
        or None when the cache is stopping."""
        stream = self.api.watch(path, rv, self.WATCH_TIMEOUT_S)
        with self._lock:
            self._streams[kind] = stream
            self._watching[kind] = None
        try:
            if self._stop.is_set():
                return None
            for event in stream:
                rv = self._apply_event(kind, path, event, rv, apply)
        finally:
            with self._lock:
                self._streams.pop(kind, None)
                if kind in self._watching:  # (not after a probe's recovery dropped it)
                    self._watching[kind] = time.monotonic()
            stream.close()
        return rv

    def _apply_event(
        self, kind: str, path: str, event: Mapping[str, Any], rv: str,
        apply: Callable[[str, Mapping[str, Any]], bool],
    ) -> str:
        """Apply one watch event; the resourceVersion after it."""
        etype = str(event.get("type") or "")
        obj = event.get("object") or {}
        if etype == "ERROR":  # a Status: 410 Gone when rv is too old
            raise self.api.watch_error(path, obj)
        new_rv = str(meta_of(obj).get("resourceVersion") or "")
        if etype == "BOOKMARK":
            return new_rv or rv
        with self._lock:
            if apply(etype, obj):
                self._version += 1
            if new_rv:
                rv = new_rv
                self._rv[kind] = rv
        return rv

    def _after_api_error(self, kind: str, exc: ApiError, backoff: float) -> float:
        """Handle a failed LIST or WATCH of ``kind``; the backoff for the next one."""
        if isinstance(exc, Gone):  # our resourceVersion is too old: list again
            return backoff
        if isinstance(exc, NotFound) and kind == "reservations":
            # The Reservation API is not installed: nothing is reserved. Say so
            # once, count the kind as synced (empty), and look again later.
            with self._lock:
                first = "reservations" not in self._synced
                if self._replace(kind, []):
                    self._version += 1
                self._mark_synced(kind)
            self._mark_ok(kind)
            if first:
                log.warning("cluster %s: no Reservation API (%s)", self.name, exc)
            self._stop.wait(30.0)
            return backoff
        self._failed(kind, exc, backoff)
        return min(backoff * 2, self.MAX_BACKOFF_S)

    def _failed(self, kind: str, exc: BaseException, backoff: float) -> None:
        log.debug("cluster %s: %s watch failed: %s", self.name, kind, exc)
        if kind != "jobs":
            with self._lock:
                self._last_failure = (
                    str(exc) if isinstance(exc, ClusterUnreachable | ApiError)
                    else f"{self.name}: unreachable ({type(exc).__name__})"
                )
        if kind != "jobs":
            self._mark_broken(kind)
        with self._wake:
            gen = self._wake_gen
            self._wake.wait_for(
                lambda: self._wake_gen != gen, timeout=backoff * random.uniform(1.0, 2.0)
            )

    def _kick(self) -> None:
        """Cut short every watch loop's backoff (the cluster is back, or we stop)."""
        with self._wake:
            self._wake_gen += 1
            self._wake.notify_all()

    def _probe_loop(self) -> None:
        interval = max(1.0, self.ttl_s)
        while not self._stop.wait(interval):
            verdict = self.api.probe_ready()
            with self._lock:
                self._probe_verdict = verdict
            if verdict[0] == "True":
                with self._lock:
                    recovered = "probe" in self._broken_since
                if recovered:
                    # Watches may have hung silently meanwhile: make them re-LIST (and
                    # vouch again only once they are open again).
                    with self._lock:
                        streams = list(self._streams.values())
                        self._watching.clear()
                    for s in streams:
                        with contextlib.suppress(Exception):
                            s.close()
                    self._mark_ok("probe")
                    self._kick()
            else:
                self._mark_broken("probe")
