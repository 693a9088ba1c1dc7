"""The Kubernetes member-cluster adapter: everything fleetq does to one member cluster.

Activities call a :class:`MemberCluster` from a thread pool; this is plain synchronous,
thread-safe code speaking only the standard Kubernetes REST API plus PyTorchJob and
Reservation resources (docs/member-contract.md), so one code drives real clusters and the
emulator. Adapter only: transport, retries and typed errors are ``activities.kube_api``'s,
what to write and how to read answers the pure ``fleetq.member_contract``'s, and values
exchanged with workflows are ``fleetq.messages`` models. Its rules (idempotent writes,
:class:`ConflictError`, no raise when unreachable, a bind under the member's Lease that
never over-commits, else :class:`MemberFull`): docs/member-contract.md "Rules every
adapter call follows".
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable
from urllib.parse import quote

from temporalio.exceptions import ApplicationError

from activities.kube_api import ApiError, ClusterUnreachable, Conflict, KubeApi, NotFound
from activities.member_lease import LeaseBusy, MemberLease
from fleetq import resources as R
from fleetq.capacity import ClusterSnapshot, NodeCapacity, Taint
from fleetq.cluster_health import ReadyStatus, TaintSettings
from fleetq.fleet_config import FleetConfigError
from fleetq.member_contract import (
    DEP_KINDS,
    OWNER_LABEL,
    PYTORCHJOB_API,
    RESERVATION_API,
    controlled_by_job,
    copy_dep,
    finished_status,
    is_ours,
    job_copy_key,
    job_phase,
    job_status,
    labels_of,
    member_manifest,
    meta_of,
    missing_status,
    observed_changed,
    observed_version,
    of_this_run,
    owned_by,
    referenced_deps,
    reservation_body,
    reservation_name,
    reservation_node,
    reservation_seconds_left,
    reservation_why,
    unknown_status,
)
from fleetq.member_contract import (
    MIN_MEMBER_ANNOTATION as MIN_MEMBER,
)
from fleetq.messages import (
    BindRequest,
    BindResult,
    JobRef,
    JobStatus,
    PodReservation,
    PurgeResult,
    ReserveRequest,
    ReserveResult,
)
from fleetq.models import Gang, ManifestErrors, gang_of, parse_job
from fleetq.naming import KF_JOB_NAME, KF_REPLICA_TYPE
from fleetq.placement import place_gang
from fleetq.rejection import Rejection, RejectionCode

if TYPE_CHECKING:
    from activities.capacity_cache import CapacityCache

__all__ = [
    "BindStats",
    "ConflictError",
    "KubernetesMemberCluster",
    "MemberCluster",
    "MemberFull",
]

log = logging.getLogger(__name__)

#: who holds a member's bind Lease: this process (each adapter adds its own number)
PROCESS_IDENTITY = f"{socket.gethostname()}/{os.getpid()}"
_ADAPTERS = itertools.count(1)
TERMINATED = ("Succeeded", "Failed")
#: how long a bind waits for an earlier submission's copy to go before it retries
REPLACE_WAIT_S = 20.0


class ConflictError(Exception):
    """An object with our name exists on the member and belongs to another fleet job.
    Non-retryable: retrying cannot make it ours. (Not the HTTP 409 of
    :class:`activities.kube_api.Conflict`: this one is about ownership.)"""


class MemberFull(ApplicationError):
    """The gang no longer fits the member when its bind re-checks under the bind Lease
    (another bind took the room since placement read its cache). Raised through the bind
    activity as is: a non-retryable ``MemberFull`` failure whose details are the
    rejection's code and parameters; the job records a failed bind and places again."""

    def __init__(self, cluster: str, rejection: Rejection) -> None:
        super().__init__(
            f"{cluster}: no room left when binding (another gang was bound there since "
            f"placement): {rejection.message}",
            RejectionCode.MEMBER_FULL_AT_BIND.value,
            dict(rejection.params),
            type="MemberFull",
            non_retryable=True,
        )
        self.cluster = cluster
        self.rejection = rejection


class BindStats:
    """Counters of the guarded binds of one member (benchmarks and tests read them)."""

    def __init__(self) -> None:
        self.guarded = 0  # binds that re-checked under the Lease
        self.batches = 0  # Lease holds (one fresh read each) that served them
        self.full = 0  # of which refused with MemberFull
        self.lease_waits = 0  # times a bind found the Lease taken and waited
        self.lease_conflicts = 0  # 409s lost to another writer of the Lease
        self.assumed_gangs = 0  # in-flight gangs whose room was assumed
        self.seconds = 0.0  # wall time of guarded binds (Lease wait included)


@dataclass
class PurgeStats:
    """Counters of one member's purges (benchmarks read them)."""

    purges: int = 0
    seconds: float = 0.0  # wall time of the purges, every request they sent included


@dataclass
class _PendingBind:
    req: BindRequest
    body: dict[str, Any]
    deps: list[str]
    result: BindResult | None = None
    error: BaseException | None = None


class _GroupCommit:
    """Binds waiting for the member's bind Lease, run in batches: the first caller to
    find no batch running runs every waiting bind (``run(batch)`` fills each one's
    result or error), the others wait for theirs. With N binds queued the member is
    read once, not N times."""

    MAX_BATCH = 64

    def __init__(self, run: Callable[[list[_PendingBind]], None], wait_s: float) -> None:
        self._run = run
        self._wait_s = wait_s
        self._cond = threading.Condition()
        self._pending: list[_PendingBind] = []
        self._busy = False

    def submit(self, item: _PendingBind) -> BindResult:
        deadline = time.monotonic() + self._wait_s
        with self._cond:
            self._pending.append(item)
            while item.result is None and item.error is None and self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    if item in self._pending:
                        self._pending.remove(item)
                        raise LeaseBusy(f"bind waited {self._wait_s:g}s for this worker's "
                                        "other binds on the member")
                    left = 1.0  # already in a running batch: its answer comes
                self._cond.wait(left)
            lead = item.result is None and item.error is None
            if lead:
                self._busy = True
        if lead:
            try:
                while item.result is None and item.error is None:
                    with self._cond:
                        batch = self._pending[: self.MAX_BATCH]
                        del self._pending[: self.MAX_BATCH]
                    self._run(batch)
                    with self._cond:
                        self._cond.notify_all()
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
        if item.error is not None:
            raise item.error
        assert item.result is not None
        return item.result


@runtime_checkable
class MemberCluster(Protocol):
    """What activities need of a member cluster (the adapter below; test doubles)."""

    name: str
    labels: dict[str, str]
    reservation: bool

    def capacity(self) -> ClusterSnapshot: ...
    def reserve(self, req: ReserveRequest) -> ReserveResult: ...
    def release_reservations(self, job: JobRef) -> list[str]: ...
    def bind(self, req: BindRequest) -> BindResult: ...
    def status(self, job: JobRef) -> JobStatus: ...
    def wait_for_change(
        self,
        job: JobRef,
        since: str,
        timeout_s: float,
        heartbeat: Callable[[], None] | None = None,
        uid: str = "",
    ) -> JobStatus: ...
    def purge(self, job: JobRef) -> PurgeResult: ...
    def leftovers(self, job: JobRef) -> list[str]: ...
    def probe_ready(self, read_s: float | None = None) -> tuple[ReadyStatus, str]: ...


def _q(name: str) -> str:
    return quote(name, safe="")


# --------------------------------------------------------------------------- the adapter


class _ReserveFailed(Exception):
    pass


class KubernetesMemberCluster:
    """One member cluster reached through a kubeconfig context.

    ``capacity()`` reads the watch-fed :class:`~activities.capacity_cache.CapacityCache`;
    every other method talks to the API server directly."""

    def __init__(
        self,
        name: str,
        api: KubeApi,
        *,
        labels: Mapping[str, str] | None = None,
        reservation: bool = False,
        taints: tuple[Taint, ...] = (),
        source: KubeApi | None = None,
        cache_ttl_s: float = 2.0,
        cache: CapacityCache | None = None,
        start_cache: bool = True,
        reserve_poll_s: float = 5.0,
        unschedulable_grace_s: float = 60.0,
        recheck_s: float = 15.0,
        heartbeat_s: float = 5.0,
        settle_s: float = 0.05,
        settle_max_s: float = 0.5,
        failover: TaintSettings | None = None,
        bind_guard: bool = True,
    ) -> None:
        self.name = name
        #: False: binds skip the Lease and the re-check (benchmarks measure the guard
        #: against it; a fleet whose members all hold Reservations never needs it)
        self.bind_guard = bind_guard
        self.labels = dict(labels or {})
        self.reservation = reservation
        self.taints = taints
        self.api = api
        self.source = source
        self.reserve_poll_s = reserve_poll_s
        self.unschedulable_grace_s = unschedulable_grace_s
        self.recheck_s = recheck_s
        self.heartbeat_s = heartbeat_s
        #: ``wait_for_change`` reads after a job's watch events pause this long (at most
        #: ``settle_max_s``): one status per burst of writes (``_until_quiet``)
        self.settle_s = settle_s
        self.settle_max_s = settle_max_s
        if cache is None:
            from activities.capacity_cache import CapacityCache

            cache = CapacityCache(
                api,
                name=name,
                labels=self.labels,
                taints=taints,
                reservation=reservation,
                ttl_s=cache_ttl_s,
                failover=failover,
            )
        self.cache = cache
        self.lease = MemberLease(api)
        self.identity = f"{PROCESS_IDENTITY}/{next(_ADAPTERS)}"
        self.bind_stats = BindStats()
        self.purge_stats = PurgeStats()
        #: namespaces this adapter has seen on the member or created there: a bind into
        #: one sends no GET for it; a create that finds it gone (``_create_in``) makes it
        #: again
        self._namespaces: set[str] = set()
        self._binds = _GroupCommit(self._bind_batch, wait_s=self.lease.wait_s * 2 + 10)
        if start_cache:
            self.cache.start()

    def close(self) -> None:
        self.cache.close()

    def __repr__(self) -> str:
        return f"KubernetesMemberCluster({self.name!r})"

    # -- paths

    @staticmethod
    def _job_path(ns: str, name: str = "") -> str:
        base = f"{PYTORCHJOB_API}/namespaces/{_q(ns)}/pytorchjobs"
        return f"{base}/{_q(name)}" if name else base

    @staticmethod
    def _reservation_path(name: str = "") -> str:
        base = f"{RESERVATION_API}/reservations"
        return f"{base}/{_q(name)}" if name else base

    @staticmethod
    def _core_path(ns: str, plural: str, name: str = "") -> str:
        base = f"/api/v1/namespaces/{_q(ns)}/{plural}"
        return f"{base}/{_q(name)}" if name else base

    # -- capacity

    def capacity(self) -> ClusterSnapshot:
        """The cached snapshot (shared, treat as read-only); ``reachable=False`` when
        the cache cannot vouch for the cluster."""
        return self.cache.snapshot()

    def snapshot_by_list(self) -> ClusterSnapshot:
        """Cold path: a fresh LIST of nodes, pods and reservations."""
        return self.cache.snapshot_by_list()

    # -- reservations

    def _ensure_reservation(self, job: JobRef, pod: PodReservation, ttl_s: int) -> dict[str, Any]:
        body = reservation_body(job, pod, ttl_s)
        name = body["metadata"]["name"]
        path = self._reservation_path(name)
        for _ in range(5):
            created = self.api.create(self._reservation_path(), body)
            if created is not None:
                return created
            existing = self.api.get(path)
            if existing is None:
                continue  # deleted in between: create again
            theirs = labels_of(existing).get(OWNER_LABEL)
            if theirs != job.owner_id:
                raise ConflictError(
                    f"cluster {self.name}: Reservation {name} belongs to another fleet job "
                    f"(fleetq.io/owner {theirs or 'unset'})"
                )
            phase = (existing.get("status") or {}).get("phase") or "Pending"
            left = reservation_seconds_left(existing, time.time())
            fresh = left is None or left > min(60.0, ttl_s / 2)
            if (
                phase in ("Pending", "Available")
                and reservation_node(existing) == pod.node
                and fresh
                and of_this_run(existing, job)
            ):
                return existing  # ours from an earlier attempt, still good
            # Expired, used, failed, pinned elsewhere or an earlier submission's: never
            # reuse, replace it.
            self.api.delete(path)
            self._wait_gone(path, 2.0)
        raise _ReserveFailed(
            f"reservation {pod.role.lower()}-{pod.index} on node {pod.node}: "
            f"could not replace the previous {name}"
        )

    def _wait_gone(self, path: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.api.get(path) is None:
                return
            time.sleep(0.05)

    def reserve(self, req: ReserveRequest) -> ReserveResult:
        """Hold room for every pod of the gang, or for none.

        One Reservation per pod, pinned to the node placement chose. A reservation that
        ends ``Failed`` (or is not ``Available`` after ``reserve_poll_s``) rolls back all
        of this request's reservations and the result says why. If the cluster stops
        answering midway the result is ``ok=False`` too; anything the rollback could not
        delete expires with its TTL (and ``release_reservations`` is safe to repeat)."""
        job = req.job
        if not self.reservation:
            return ReserveResult(
                ok=False, reason=f"cluster {self.name} does not support Reservations"
            )
        names = [reservation_name(job, p.role, p.index) for p in req.pods]
        state: dict[str, tuple[PodReservation, dict[str, Any]]] = {}
        try:
            for pod, name in zip(req.pods, names, strict=True):
                obj = self._ensure_reservation(job, pod, req.ttl_seconds)
                state[name] = (pod, obj)
                if (obj.get("status") or {}).get("phase") in ("Failed", "Succeeded"):
                    raise _ReserveFailed(reservation_why(pod, obj))
            self._await_available(state)
            return ReserveResult(ok=True, reservations=names)
        except _ReserveFailed as exc:
            self._rollback(names)
            return ReserveResult(ok=False, reason=str(exc))
        except ClusterUnreachable as exc:
            self._rollback(names, retry=False)
            return ReserveResult(ok=False, reason=str(exc))
        except ApiError as exc:  # e.g. the Reservation CRD is not installed
            self._rollback(names)
            return ReserveResult(ok=False, reason=str(exc))
        except ConflictError:
            self._rollback([n for n in names if n in state])
            raise

    def _await_available(self, state: dict[str, tuple[PodReservation, dict[str, Any]]]) -> None:
        """Poll the reservations in ``state`` (updated in place) until all are
        ``Available``; raises :class:`_ReserveFailed` when one fails, is deleted, or
        ``reserve_poll_s`` passes first."""
        deadline = time.monotonic() + self.reserve_poll_s
        step = 0.05
        while True:
            waiting = [
                n for n, (_, o) in state.items()
                if (o.get("status") or {}).get("phase") != "Available"
            ]
            if not waiting:
                return
            if time.monotonic() >= deadline:
                pod, obj = state[waiting[0]]
                why = reservation_why(pod, obj)
                raise _ReserveFailed(f"{why} (not Available after {self.reserve_poll_s:g}s)")
            time.sleep(step)
            step = min(step * 2, 0.5)
            for n in waiting:
                self._reread_reservation(state, n)

    def _reread_reservation(
        self, state: dict[str, tuple[PodReservation, dict[str, Any]]], n: str
    ) -> None:
        pod, _ = state[n]
        fresh = self.api.get(self._reservation_path(n))
        if fresh is None:
            raise _ReserveFailed(
                f"reservation {pod.role.lower()}-{pod.index} on node {pod.node}: "
                "deleted while waiting"
            )
        state[n] = (pod, fresh)
        if (fresh.get("status") or {}).get("phase") in ("Failed", "Succeeded"):
            raise _ReserveFailed(reservation_why(pod, fresh))

    def _rollback(self, names: list[str], retry: bool = True) -> None:
        for n in names:
            try:
                self.api.delete(self._reservation_path(n), retry=retry)
            except (ClusterUnreachable, ApiError) as exc:
                # It expires with its TTL; release_reservations() can be repeated later.
                log.warning("cluster %s: could not roll back Reservation %s: %s", self.name, n, exc)
                if not retry:
                    return

    def release_reservations(self, job: JobRef) -> list[str]:
        """Delete every reservation of this job (by owner label); names deleted.
        Safe to repeat; raises :class:`ClusterUnreachable` if it cannot be done now."""
        try:
            items, _ = self.api.list(
                self._reservation_path(), label_selector=f"{OWNER_LABEL}={job.owner_id}"
            )
        except NotFound:  # no Reservation API on this cluster: nothing to release
            return []
        deleted = []
        for obj in items:
            name = str(meta_of(obj).get("name") or "")
            if name and self.api.delete(self._reservation_path(name)):
                deleted.append(name)
        return sorted(deleted)

    # -- bind

    def _ensure_namespace(self, ns: str) -> None:
        """Make sure the member has namespace ``ns``: once this adapter has seen it or
        made it, without a request (a bind's create that finds it gone makes it again,
        :meth:`_create_in`)."""
        if ns in self._namespaces:
            return
        path = f"/api/v1/namespaces/{_q(ns)}"
        if self.api.get(path) is None:
            self.api.create(
                "/api/v1/namespaces",
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
            )
        self._namespaces.add(ns)

    def _create_in(self, ns: str, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """``api.create`` of an object in namespace ``ns``; if the namespace has gone since
        this adapter last saw it (the API server's NamespaceLifecycle admission answers
        404 ``namespaces "<ns>" not found``, k8s.io/apiserver
        ``pkg/admission/plugin/namespace/lifecycle/admission.go``), make it and create
        once more."""
        try:
            return self.api.create(path, body)
        except NotFound as exc:
            if not exc.message.startswith(f'namespaces "{ns}"'):
                raise
            self._namespaces.discard(ns)
            self._ensure_namespace(ns)
            return self.api.create(path, body)

    def _propagate(self, req: BindRequest) -> list[str]:
        deps = referenced_deps(req.manifest)
        if not deps:  # nothing to copy (Karmada wants propagateDeps with app failover)
            return []
        if self.source is None:
            raise FleetConfigError(
                "source: propagateDeps needs a source cluster in the fleet config"
            )
        job = req.job
        out = []
        for kind, name in deps:
            plural = DEP_KINDS[kind]
            # Same namespace only: a pod template cannot reference another namespace.
            obj = self.source.get(self._core_path(job.namespace, plural, name))
            if obj is None:
                log.warning(
                    "cluster %s: %s %s/%s referenced by %s is missing on the source",
                    self.name, kind, job.namespace, name, job.ref,
                )
                continue
            body = copy_dep(kind, obj, job)
            if body is None:
                continue
            # An existing copy is left alone: it may be shared with another job.
            self._create_in(job.namespace, self._core_path(job.namespace, plural), body)
            out.append(f"{kind} {job.namespace}/{name}")
        return out

    def bind(self, req: BindRequest) -> BindResult:
        """Create the member PyTorchJob (and its deps); idempotent across retries.

        Without Reservations the creation happens under the member's bind Lease, after
        re-checking that the gang still fits (:meth:`_bind_batch`); :class:`MemberFull`
        when it does not."""
        job = req.job
        self._ensure_namespace(job.namespace)
        deps = self._propagate(req) if req.propagate_deps else []
        body = member_manifest(req)
        path = self._job_path(job.namespace, job.name)
        if req.reserved or not self.bind_guard:  # Reservations hold the room already
            return self._create_job(req, body, deps)
        existing = self.api.get(path)
        if existing is not None and self._replace_earlier_run(job, existing):
            existing = None  # an earlier submission's copy, deleted: this one creates its own
        if existing is not None:  # a retry after the creation landed: no new room taken
            return self._existing(req, existing, deps)
        start = time.monotonic()
        try:
            return self._binds.submit(_PendingBind(req, body, deps))
        finally:
            self.bind_stats.seconds += time.monotonic() - start

    def _bind_batch(self, batch: list[_PendingBind]) -> None:
        """The group commit of guarded binds: one Lease hold and one fresh read of the
        member for every bind this process has waiting, each gang assumed on the
        snapshot once accepted so the next one of the batch sees its room taken."""
        stats = self.bind_stats
        try:
            with self.lease.held(self.identity) as hold:
                stats.guarded += len(batch)
                stats.batches += 1
                stats.lease_waits += hold.waits
                stats.lease_conflicts += hold.conflicts
                snapshot, unbound = self._fresh_view(
                    exclude={(b.req.job.namespace, b.req.job.name) for b in batch})
                stats.assumed_gangs += len(unbound)
                for gang in unbound:
                    choice = place_gang(gang, [snapshot]).best
                    if choice is not None:
                        _assume(snapshot, gang, choice.assignment)
                for b in batch:
                    try:
                        b.result = self._bind_if_room(b, snapshot)
                    except Exception as exc:  # noqa: BLE001 - handed to that bind's caller
                        b.error = exc
                    self.lease.renew_if_old(hold)
        except Exception as exc:  # noqa: BLE001 - the Lease or the read failed: all fail
            for b in batch:
                if b.result is None and b.error is None:
                    b.error = exc

    def _bind_if_room(self, b: _PendingBind, snapshot: ClusterSnapshot) -> BindResult:
        gang = gang_of(parse_job(b.req.manifest))
        decision = place_gang(gang, [snapshot])
        choice = decision.best
        if choice is None:
            self.bind_stats.full += 1
            why = decision.reasons.get(self.name) or Rejection.of(
                RejectionCode.MEMBER_FULL_AT_BIND, "no room")
            raise MemberFull(self.name, why)
        result = self._create_job(b.req, b.body, b.deps)
        _assume(snapshot, gang, choice.assignment)
        return result

    def _existing(self, req: BindRequest, existing: dict[str, Any], deps: list[str]) -> BindResult:
        job = req.job
        theirs = labels_of(existing).get(OWNER_LABEL)
        if theirs != job.owner_id:
            raise ConflictError(
                f"cluster {self.name}: PyTorchJob {job.ref} already exists and belongs to "
                f"another fleet job (fleetq.io/owner {theirs or 'unset'})"
            )
        return BindResult(created=False, uid=str(meta_of(existing).get("uid") or ""), deps=deps)

    def _fresh_view(
        self, exclude: Collection[tuple[str, str]] = ()
    ) -> tuple[ClusterSnapshot, list[Gang]]:
        """The member read now (not from the watch cache, which may trail the previous
        Lease holder's writes): a snapshot of its nodes, bound pods and Available
        Reservations, and the unbound part of each fleetq gang on it, oldest first."""
        from activities.capacity_cache import JOBS, NODES, PODS, RESERVATIONS

        nodes, _ = self.api.list(NODES)
        pods, _ = self.api.list(PODS)
        res, _ = self.api.list(RESERVATIONS) if self.reservation else ([], "")
        jobs, _ = self.api.list(JOBS, label_selector=OWNER_LABEL)
        caps = _node_capacities(nodes)
        bound = _take_bound(caps, pods, res)
        snapshot = ClusterSnapshot(
            name=self.name, labels=dict(self.labels), taints=self.taints,
            nodes=[caps[n] for n in sorted(caps)], reservation=self.reservation,
        )
        return snapshot, _unbound_gangs(jobs, bound, exclude)

    def _create_job(self, req: BindRequest, body: dict[str, Any], deps: list[str]) -> BindResult:
        job = req.job
        path = self._job_path(job.namespace, job.name)
        for _ in range(3):
            created = self._create_in(job.namespace, self._job_path(job.namespace), body)
            if created is not None:
                uid = str(meta_of(created).get("uid") or "")
                return BindResult(created=True, uid=uid, deps=deps)
            existing = self.api.get(path)
            if existing is None or self._replace_earlier_run(job, existing):
                continue
            return self._existing(req, existing, deps)
        raise ClusterUnreachable(self.name, f"PyTorchJob {job.ref} kept vanishing")

    def _replace_earlier_run(self, job: JobRef, existing: dict[str, Any]) -> bool:
        """If ``existing`` is the copy an earlier submission of this job left (ours by
        owner, another ``fleetq.io/run-id``), delete it and its pods and return True
        once it is gone, so that this submission creates a copy of its own (never runs
        on, or reports, one it did not create). False for this submission's copy or
        another fleet job's (which :meth:`_existing` refuses)."""
        if not is_ours(existing, job) or of_this_run(existing, job):
            return False
        meta = meta_of(existing)
        uid = str(meta.get("uid") or "")
        path = self._job_path(job.namespace, job.name)
        log.info("cluster %s: replacing PyTorchJob %s of an earlier submission (uid %s)",
                 self.name, job.ref, uid)
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1",
                                "propagationPolicy": "Background"}
        if uid:  # that copy, not one created meanwhile by a retry of this bind
            body["preconditions"] = {"uid": uid}
        with contextlib.suppress(NotFound, Conflict):  # gone, or replaced: read again below
            self.api.request("DELETE", path, body=body)
        pods, _ = self.api.list(
            self._core_path(job.namespace, "pods"), label_selector=f"{KF_JOB_NAME}={job.name}"
        )
        for pod in pods:
            if (uid and owned_by(pod, uid)) or (is_ours(pod, job) and not of_this_run(pod, job)):
                self.api.delete(self._core_path(job.namespace, "pods",
                                                str(meta_of(pod).get("name"))))
        deadline = time.monotonic() + REPLACE_WAIT_S
        while time.monotonic() < deadline:
            now = self.api.get(path)
            if now is None or str(meta_of(now).get("uid") or "") != uid:
                return True
            time.sleep(0.1)
        raise ClusterUnreachable(
            self.name, f"the earlier submission's PyTorchJob {job.ref} is still being deleted"
        )

    def purge_earlier_runs(self, job: JobRef, read_s: float | None = None) -> list[str]:
        """Delete what an earlier submission of ``job`` left on this member (ours by owner,
        another ``fleetq.io/run-id``): its PyTorchJob (with a uid precondition, so a copy
        of this submission created meanwhile stays), its pods and Reservations; what was
        deleted. This submission's own objects and other fleet jobs' are left alone. The
        bind of a new submission calls it on every other member (``activities.run_copies``),
        so the common answer is one GET, without retries (read timeout ``read_s``): no
        such copy, nothing more is asked (an orphaned pod goes with the garbage collector,
        a Reservation with its TTL). It does not wait for the objects to go; safe to
        repeat."""
        if not job.run_id:  # a ref without a run id cannot tell submissions apart
            return []
        path = self._job_path(job.namespace, job.name)
        timeout = None if read_s is None else (self.api.connect_s, min(self.api.read_s, read_s))
        try:
            obj = self.api.request("GET", path, retry=False, timeout=timeout)
        except NotFound:
            return []
        if not is_ours(obj, job) or of_this_run(obj, job):
            return []
        deleted: list[str] = []
        uid = str(meta_of(obj).get("uid") or "")
        with contextlib.suppress(Conflict):  # not that copy any more
            if self._delete_copy(job, uid):
                deleted.append(f"PyTorchJob {job.ref}")
        deleted += self._purge_earlier_pods(job, uid)
        if self.reservation:
            deleted += self._purge_earlier_reservations(job)
        return deleted

    def _purge_earlier_pods(self, job: JobRef, uid: str) -> list[str]:
        """Delete the pods of the earlier copy (uid ``uid``) or of another run of ``job``."""
        deleted: list[str] = []
        pods, _ = self.api.list(
            self._core_path(job.namespace, "pods"), label_selector=f"{KF_JOB_NAME}={job.name}"
        )
        for pod in pods:
            if (uid and owned_by(pod, uid)) or (is_ours(pod, job) and not of_this_run(pod, job)):
                name = str(meta_of(pod).get("name"))
                if self.api.delete(self._core_path(job.namespace, "pods", name)):
                    deleted.append(f"Pod {job.namespace}/{name}")
        return deleted

    def _purge_earlier_reservations(self, job: JobRef) -> list[str]:
        """Delete the Reservations another run of ``job`` left."""
        deleted: list[str] = []
        try:
            items, _ = self.api.list(
                self._reservation_path(), label_selector=f"{OWNER_LABEL}={job.owner_id}"
            )
        except NotFound:  # no Reservation API on this cluster
            items = []
        for r in items:
            name = str(meta_of(r).get("name") or "")
            if name and not of_this_run(r, job) and self.api.delete(
                    self._reservation_path(name)):
                deleted.append(f"Reservation {name}")
        return deleted

    # -- status

    def _unknown(self, reason: str) -> JobStatus:
        return unknown_status(self.name, reason, self.cache.condition(), self.cache.failover)

    def status(self, job: JobRef) -> JobStatus:
        """Where the job stands on this member. Never raises: a member that does not
        answer within the timeout (or keeps failing) yields ``Unknown``."""
        try:
            return self._status(job)
        except (ClusterUnreachable, ApiError) as exc:
            return self._unknown(str(exc))

    def _status(self, job: JobRef) -> JobStatus:
        obj = self.api.get(self._job_path(job.namespace, job.name))
        if obj is None:
            finished = self.cache.finished_job(job.namespace, job.name, job_copy_key(job))
            if finished is not None:  # finished, then deleted by the member (its TTL)
                return finished_status(self.name, *finished)
        if obj is None or not of_this_run(obj, job):
            return missing_status(self.name, job, found=obj is not None,
                                  earlier_run=is_ours(obj, job))
        pods, _ = self.api.list(
            self._core_path(job.namespace, "pods"), label_selector=f"{KF_JOB_NAME}={job.name}"
        )
        return job_status(
            self.name,
            obj,
            pods,
            now=time.time(),
            unschedulable_grace_s=self.unschedulable_grace_s,
        )

    def _watched_status(self, job: JobRef, uid: str = "", since: str = "") -> JobStatus:
        """:meth:`status` as the cache's watches show it, with no request to the member
        when the cache can vouch for the copy (``CapacityCache.job_copy``), as a
        controller reads its informer's lister on each event; else read the member. With
        ``uid`` (the copy a bind just made) a cached copy with another uid, one deleted
        whose ``DELETED`` event has not come yet, is not taken for it. With ``since``
        (the status last reported) the cache must have seen the job's version in it: one
        read from the member while the watch lagged is not followed by an older one."""
        seen = self.cache.job_copy(job.namespace, job.name, uid, observed_version(since))
        if seen is None or not of_this_run(seen[0], job):
            return self.status(job)
        obj, pods = seen
        return job_status(self.name, obj, pods, now=time.time(),
                          unschedulable_grace_s=self.unschedulable_grace_s)

    def wait_for_change(
        self,
        job: JobRef,
        since: str,
        timeout_s: float,
        heartbeat: Callable[[], None] | None = None,
        uid: str = "",
    ) -> JobStatus:
        """Block until ``status(job).observed != since`` or ``timeout_s`` passes.

        Woken by the cache's watches (the job's pods and the PyTorchJob itself) and by
        reachability changes, it reads the status from the watches then
        (:meth:`_watched_status`; ``uid``: the copy a bind just made); every
        ``recheck_s`` without an event it reads the member itself, a safety net for a
        time-based health change (the unschedulable grace) and for a member whose
        watches stall while its ``/version`` still answers. ``heartbeat`` is called at
        least every ``heartbeat_s``."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        event = self.cache.subscribe(job.namespace, job.name)
        try:
            # a copy just bound: its watch event comes within milliseconds, and then the
            # first read needs no request either (a copy that is gone is read from the
            # member after the wait and the quiet window, at most 2 x ``settle_max_s``)
            if self.cache.awaits_copy(job.namespace, job.name, uid) and event.wait(
                min(self.settle_max_s, max(0.0, timeout_s))
            ):
                self._until_quiet(event, deadline)
            recheck = False
            while True:
                event.clear()
                st = self.status(job) if recheck else self._watched_status(job, uid, since)
                last_check = time.monotonic()
                if observed_changed(st.observed, since) or time.monotonic() >= deadline:
                    return st
                while True:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    woke = event.wait(min(remaining, self.heartbeat_s))
                    if heartbeat is not None:
                        heartbeat()
                    if woke:
                        self._until_quiet(event, deadline)
                        recheck = False
                        break
                    if time.monotonic() - last_check >= self.recheck_s:
                        recheck = True
                        break
                if time.monotonic() >= deadline and not event.is_set():
                    return self._watched_status(job, uid, since)
        finally:
            self.cache.unsubscribe(job.namespace, job.name, event)

    def _until_quiet(self, event: threading.Event, deadline: float) -> None:
        """After a watch event about the job, wait until its events pause for
        ``settle_s`` (at most ``settle_max_s``, never past ``deadline``): the writes of
        one step (the operator's status, each pod's) come in a burst, and one read after
        it reports the step once, as a read made over the network a moment later did."""
        until = min(deadline, time.monotonic() + self.settle_max_s)
        while True:
            event.clear()
            wait = min(self.settle_s, until - time.monotonic())
            if wait <= 0 or not event.wait(wait):
                return

    # -- purge

    def probe_ready(self, read_s: float | None = None) -> tuple[ReadyStatus, str]:
        """Does the member answer now (one quick request, no retries)?"""
        return self.api.probe_ready(read_s)

    def leftovers(self, job: JobRef) -> list[str]:
        """What of the job is still on the member (its PyTorchJob and pods, terminating
        ones included): empty once a purge is complete."""
        left: list[str] = []
        if is_ours(self.api.get(self._job_path(job.namespace, job.name)), job):
            left.append(f"PyTorchJob {job.ref}")
        items, _ = self.api.list(
            self._core_path(job.namespace, "pods"), label_selector=f"{KF_JOB_NAME}={job.name}"
        )
        for pod in items:
            if is_ours(pod, job) or controlled_by_job(pod, job.name):
                left.append(f"Pod {job.namespace}/{meta_of(pod).get('name')}")
        return left

    def purge(self, job: JobRef) -> PurgeResult:
        """Delete the job, its pods and its reservations; safe to repeat. Objects with
        our names that belong to another fleet job are left alone. Propagated deps stay
        (they may be shared by other jobs of the namespace)."""
        return self._counted_purge(lambda: self._purge(job))

    def _counted_purge(self, purge: Callable[[], PurgeResult]) -> PurgeResult:
        """Run one purge: timed into ``purge_stats``, an API error raised as
        :class:`ClusterUnreachable`."""
        start = time.monotonic()
        try:
            return purge()
        except ApiError as exc:
            raise ClusterUnreachable(self.name, f"HTTP {exc.status} on purge", str(exc)) from exc
        finally:
            self.purge_stats.purges += 1
            self.purge_stats.seconds += time.monotonic() - start

    def purge_shown(self, job: JobRef) -> PurgeResult:
        """``purge`` for the quota workflow's purge of a grace-0 victim, which its workflow
        task waits for (docs/decisions/023): the PyTorchJob the capacity cache's watches
        show is deleted, with no GET and no LIST first, and with background propagation:
        the member's garbage collector takes its pods (their owner), as it does for
        ``kubectl delete`` (a DELETE of each pod after it found them gone already, on both
        kinds of member). One request where ``purge`` sends four or more while the tree's
        task waits. The delete carries the shown copy's uid: a copy made since is not taken
        for it, and is purged as ``purge`` does. Anything left, an orphaned pod, is the
        victim's own purge's: its ``preempt`` signal brings it, and it reads the member.
        Without a shown copy of this job, ``purge``."""
        shown = self.cache.job_copy(job.namespace, job.name)
        if shown is None or not is_ours(shown[0], job):
            return self.purge(job)
        obj = shown[0]

        def purge() -> PurgeResult:
            try:
                return self._purge_shown(job, obj)
            except Conflict:  # not the copy shown any more
                return self._purge(job)

        return self._counted_purge(purge)

    def _delete_copy(self, job: JobRef, uid: str) -> bool:
        """DELETE the PyTorchJob ``job`` with background propagation (the member's garbage
        collector takes its pods) and, with ``uid``, only that copy of it (a 409
        ``Conflict`` when the member's has another uid); False when it is gone."""
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1",
                                "propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            self.api.request("DELETE", self._job_path(job.namespace, job.name), body=body)
        except NotFound:
            return False
        return True

    def _purge_shown(self, job: JobRef, obj: Mapping[str, Any]) -> PurgeResult:
        deleted: list[str] = []
        if self._delete_copy(job, str(meta_of(obj).get("uid") or "")):
            deleted.append(f"PyTorchJob {job.ref}")
        if self.reservation:  # (fleetq makes Reservations only where a member allows them)
            deleted += [f"Reservation {n}" for n in self.release_reservations(job)]
        return PurgeResult(deleted=deleted)

    def _purge(self, job: JobRef) -> PurgeResult:
        deleted: list[str] = []
        path = self._job_path(job.namespace, job.name)
        obj = self.api.get(path)
        foreign = False
        if obj is not None:
            if is_ours(obj, job):
                if self.api.delete(path, propagation="Background"):
                    deleted.append(f"PyTorchJob {job.ref}")
            else:
                foreign = True
        pods_path = self._core_path(job.namespace, "pods")
        items, _ = self.api.list(pods_path, label_selector=f"{KF_JOB_NAME}={job.name}")
        for pod in items:
            pm = meta_of(pod)
            # Ours: labelled with our owner id, or (unless a foreign job holds the name)
            # owned by a PyTorchJob of this name, which was ours or is already gone.
            ours = is_ours(pod, job) or (not foreign and controlled_by_job(pod, job.name))
            pod_path = self._core_path(job.namespace, "pods", str(pm.get("name")))
            if ours and self.api.delete(pod_path):
                deleted.append(f"Pod {job.namespace}/{pm.get('name')}")
        for name in self.release_reservations(job):
            deleted.append(f"Reservation {name}")
        return PurgeResult(deleted=deleted)


def _node_capacities(nodes: list[dict[str, Any]]) -> dict[str, NodeCapacity]:
    """Each node's capacity, before any pod or Reservation is taken from it."""
    from activities.capacity_cache import condense_node

    caps: dict[str, NodeCapacity] = {}
    for n in nodes:
        info = condense_node(n)
        name = str(meta_of(n).get("name") or "")
        caps[name] = NodeCapacity(
            name=name, allocatable=dict(info.allocatable), labels=dict(info.labels),
            taints=info.taints, unschedulable=info.unschedulable,
            pods_allocatable=info.pods_allocatable,
        )
    return caps


def _take_bound(
    caps: dict[str, NodeCapacity], pods: list[dict[str, Any]], res: list[dict[str, Any]]
) -> dict[tuple[str, str], Counter[str]]:
    """Take the bound pods and Available Reservations from ``caps``; the pods bound per
    ``(namespace, PyTorchJob)`` and role."""
    from activities.capacity_cache import condense_pod, condense_reservation

    bound: dict[tuple[str, str], Counter[str]] = {}  # (ns, job) -> role -> pods bound
    for p in pods:
        use = condense_pod(p)
        if use is None:
            continue
        meta = meta_of(p)
        labels = meta.get("labels") or {}
        if KF_JOB_NAME in labels:
            key = (str(meta.get("namespace") or ""), str(labels[KF_JOB_NAME]))
            bound.setdefault(key, Counter())[
                str(labels.get(KF_REPLICA_TYPE) or "").lower()] += 1
        _take(caps, use.node, use.requests, pod=True)
    for r in res:
        ruse = condense_reservation(r)
        if ruse is not None:
            _take(caps, ruse.node, ruse.requests, pod=False)
    return bound


def _unbound_gangs(
    jobs: list[dict[str, Any]],
    bound: dict[tuple[str, str], Counter[str]],
    exclude: Collection[tuple[str, str]],
) -> list[Gang]:
    """The unbound part of each fleetq gang among ``jobs``, oldest first."""
    unbound: list[Gang] = []
    for obj in sorted(jobs, key=lambda o: (str(meta_of(o).get("creationTimestamp") or ""),
                                            str(meta_of(o).get("name") or ""))):
        meta = meta_of(obj)
        ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        if (ns, name) in exclude or job_phase(obj)[0] in TERMINATED:
            continue
        gang = _unbound_part(obj, bound.get((ns, name), Counter()))
        if gang is not None:
            unbound.append(gang)
    return unbound


def _unbound_part(obj: dict[str, Any], left: Counter[str]) -> Gang | None:
    """The pods of ``obj``'s gang not among those bound (``left``, per role), or None."""
    meta = meta_of(obj)
    try:  # every pod of the gang fleetq placed is bound: counted with the pods
        if sum(left.values()) >= int((meta.get("annotations") or {})[MIN_MEMBER]):
            return None
    except (KeyError, ValueError):
        pass
    try:
        gang = gang_of(parse_job(obj))
    except (ManifestErrors, ValueError, R.QuantityError):
        return None  # not a copy fleetq can read: the member's own business
    left = Counter(left)
    missing = []
    for pod in gang.pods:
        if left[pod.role] > 0:
            left[pod.role] -= 1
        else:
            missing.append(pod)
    if missing:
        return Gang(pods=tuple(missing), priority=gang.priority)
    return None


def _take(caps: dict[str, NodeCapacity], node: str, requests: R.Resources, *, pod: bool) -> None:
    cap = caps.get(node)
    if cap is None:
        return  # a pod on a node that is gone: it takes nothing placement can use
    R.add_into(cap.requested, requests)
    if pod:
        cap.pods_used += 1


def _assume(snapshot: ClusterSnapshot, gang: Gang, assignment: Mapping[str, str]) -> None:
    """Take the room of ``gang`` on the nodes ``assignment`` gives its pods."""
    caps = {n.name: n for n in snapshot.nodes}
    for pod in gang.pods:
        node = assignment.get(pod.name_suffix)
        if node is not None:
            _take(caps, node, pod.requests, pod=True)
