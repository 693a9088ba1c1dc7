"""Temporal activities: thin adapters from workflows to the fleet and the pure core.

Each activity takes one small input object and returns a compact verdict. Member-cluster
work is synchronous ``kubernetes``-client code (``activities.member_cluster``), run by the
worker in a thread pool; the placement decision is the pure ``fleetq.placement`` core
running on cached snapshots, so node lists never reach workflow history.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from activities.fleet import Fleet
from activities.kube_api import ApiError, ClusterUnreachable
from activities.member_cluster import ConflictError
from activities.quota_outbox import QuotaOutbox, QuotaRefused
from fleetq.cluster_health import eviction_due
from fleetq.messages import (
    BindInput,
    BindResult,
    Candidate,
    HolderCheck,
    HolderVerdict,
    JobStatus,
    PlacementInput,
    PlacementVerdict,
    PurgeInput,
    PurgeResult,
    QuotaSignal,
    ReserveInput,
    ReserveResult,
    Resolution,
    ResolveInput,
    WatchInput,
)
from fleetq.models import ClusterAffinity, PropagationPolicy, Toleration, parse_policy
from fleetq.naming import REGISTRY_WORKFLOW_ID
from fleetq.placement import RejectionCode, place_gang
from fleetq.registry import RegistryState, resolve_from_state

#: how stale the worker's view of the fleet registry may be when resolving a job's policy
REGISTRY_MAX_AGE = 1.0
#: how often purge_when_reachable asks an unreachable member whether it answers again
PURGE_POLL_SECONDS = 1.0
#: purge_when_reachable's "do you answer?" waits at most this long for the member
PURGE_PROBE_READ_SECONDS = 5.0


async def deliver_quota_message(outbox: QuotaOutbox, inp: QuotaSignal) -> bool:
    """``signal_quota``'s work: True once the quota workflow applied the message, False
    when it is not running; a refused enqueue is a non-retryable failure naming why."""
    try:
        return await outbox.send(inp)
    except QuotaRefused as exc:
        raise ApplicationError(
            f"quota workflow {inp.tree_workflow_id} refused {inp.subject()}: {exc}",
            type="QuotaRefused",
            non_retryable=True,
        ) from None


class SchedulingActivities:
    """All activities of the fleetq worker; one instance per worker process."""

    def __init__(
        self,
        client: Client | None,
        fleet: Fleet | Callable[[], Fleet],
        *,
        search_attributes: bool = False,
    ) -> None:
        self._client = client
        self._fleet_source = fleet
        self._fleet: Fleet | None = fleet if isinstance(fleet, Fleet) else None
        self._lock = threading.Lock()
        self._search_attributes = search_attributes
        self._registry_lock = asyncio.Lock()
        self._registry: tuple[float, RegistryState, list[PropagationPolicy]] | None = None
        self._outbox: QuotaOutbox | None = None

    @property
    def fleet(self) -> Fleet:
        if self._fleet is None:
            with self._lock:
                if self._fleet is None:
                    source = self._fleet_source
                    assert callable(source)
                    self._fleet = source()
        return self._fleet

    def _member(self, name: str) -> Any:
        try:
            return self.fleet.get(name)
        except KeyError:
            raise ApplicationError(
                f"member cluster {name!r} is not in the fleet config",
                type="InvalidRequest",
                non_retryable=True,
            ) from None

    # ------------------------------------------------------------------ registry
    @activity.defn(name="resolve_policy")
    async def resolve_policy(self, inp: ResolveInput) -> Resolution:
        """Resolve from a snapshot of the registry shared by this worker's activities and
        refreshed at most every REGISTRY_MAX_AGE seconds (one query for a burst of jobs,
        not one each); a miss re-reads the registry once before it is believed."""
        res = Resolution()
        if self._client is not None:
            snapshot = await self._registry_snapshot()
            if snapshot is None:
                res = Resolution(
                    policy_reason="no PropagationPolicy applied to the fleet yet "
                    "(the fleet registry is empty)"
                )
            else:
                res = resolve_from_state(snapshot[0], snapshot[1], inp)
                if res.policy is None or res.tree_workflow_id is None:
                    fresh = await self._registry_snapshot(max_age=0.0)
                    if fresh is not None:
                        res = resolve_from_state(fresh[0], fresh[1], inp)
        res.search_attributes = self._search_attributes
        return res

    async def _registry_snapshot(
        self, max_age: float = REGISTRY_MAX_AGE
    ) -> tuple[RegistryState, list[PropagationPolicy]] | None:
        assert self._client is not None
        async with self._registry_lock:
            now = time.monotonic()
            if self._registry is not None and now - self._registry[0] <= max_age:
                return self._registry[1], self._registry[2]
            handle = self._client.get_workflow_handle(REGISTRY_WORKFLOW_ID)
            try:
                state = await handle.query("state", result_type=RegistryState)
            except RPCError as exc:
                if exc.status != RPCStatusCode.NOT_FOUND:
                    raise
                return None
            policies = [parse_policy(doc) for doc in state.policies.values()]
            self._registry = (time.monotonic(), state, policies)
            return state, policies

    @activity.defn(name="signal_quota")
    async def signal_quota(self, inp: QuotaSignal) -> bool:
        if self._client is None:
            raise ApplicationError("this worker has no Temporal client", non_retryable=True)
        if self._outbox is None:
            self._outbox = QuotaOutbox(self._client)
        return await deliver_quota_message(self._outbox, inp)

    @activity.defn(name="check_holders")
    async def check_holders(self, inp: HolderCheck) -> HolderVerdict:
        if self._client is None:
            return HolderVerdict()
        client = self._client
        sem = asyncio.Semaphore(20)

        async def gone(wid: str) -> bool:
            async with sem:
                try:
                    desc = await client.get_workflow_handle(wid).describe()
                except RPCError as exc:
                    if exc.status == RPCStatusCode.NOT_FOUND:
                        return True
                    raise
                return desc.status != WorkflowExecutionStatus.RUNNING

        flags = await asyncio.gather(*(gone(w) for w in inp.workflow_ids))
        return HolderVerdict(gone=[w for w, g in zip(inp.workflow_ids, flags, strict=True) if g])

    # ------------------------------------------------------------------ placement
    @activity.defn(name="plan_placement")
    def plan_placement(self, inp: PlacementInput) -> PlacementVerdict:
        fleet = self.fleet
        affinity = ClusterAffinity.model_validate(inp.affinity) if inp.affinity else None
        tolerations = [Toleration.model_validate(t) for t in inp.cluster_tolerations]
        members = fleet.clusters
        eligible = [
            name
            for name, m in members.items()
            if name not in inp.exclude and (affinity is None or affinity.allows(name, m.labels))
        ]
        snapshots = fleet.snapshots(eligible) if eligible else []
        decision = place_gang(
            inp.gang.to_gang(),
            snapshots,
            affinity=affinity,
            cluster_tolerations=tolerations,
            exclude=set(inp.exclude),
        )
        rejections = dict(decision.rejections)
        codes = {name: why.code for name, why in decision.reasons.items()}
        for name in members:
            if name not in eligible and name not in rejections:
                evicted = name in inp.exclude
                rejections[name] = (
                    f"{name}: excluded (evicted earlier)"
                    if evicted
                    else f"{name}: not selected by the policy's clusterAffinity"
                )
                codes[name] = (
                    RejectionCode.EVICTED if evicted else RejectionCode.AFFINITY_MISMATCH
                )
        return PlacementVerdict(
            candidates=[
                Candidate(
                    cluster=c.cluster,
                    score=c.score,
                    reservation=bool(members[c.cluster].reservation),
                    assignment=dict(c.assignment),
                )
                for c in decision.ranked
            ],
            rejections=rejections,
            codes=codes,
            eligible=eligible,
        )

    # ------------------------------------------------------------------ member writes
    @activity.defn(name="reserve")
    def reserve(self, inp: ReserveInput) -> ReserveResult:
        try:
            result: ReserveResult = self._member(inp.cluster).reserve(inp.request)
        except ClusterUnreachable as exc:
            return ReserveResult(ok=False, reason=f"{inp.cluster} unreachable: {exc}")
        return result

    @activity.defn(name="bind")
    def bind(self, inp: BindInput) -> BindResult:
        try:
            result: BindResult = self._member(inp.cluster).bind(inp.request)
        except ConflictError as exc:
            raise ApplicationError(str(exc), type="ConflictError", non_retryable=True) from None
        except ApiError as exc:  # a definite rejection (403, 422): retrying cannot help
            raise ApplicationError(str(exc), type="ApiError", non_retryable=True) from None
        return result

    @activity.defn(name="purge")
    def purge(self, inp: PurgeInput) -> PurgeResult:
        result: PurgeResult = self._member(inp.cluster).purge(inp.job)
        return result

    @activity.defn(name="purge_when_reachable")
    def purge_when_reachable(self, inp: PurgeInput) -> PurgeResult:
        """Purge a copy left on a member that did not answer: ask the member every
        PURGE_POLL_SECONDS and purge the moment it answers again, heartbeating meanwhile
        (a worker that dies hands the wait to another one within the heartbeat
        timeout). With ``confirm``, return only once the job and its pods are gone."""
        member = self._member(inp.cluster)
        deleted: list[str] = []
        while True:
            activity.heartbeat(len(deleted))
            # one quick request first, so a member that hangs (or answers 5xx, which the
            # purge's own calls would retry for a while) cannot outlast the heartbeat
            ready, _ = member.probe_ready(read_s=PURGE_PROBE_READ_SECONDS)
            try:
                if ready == "True":
                    deleted += member.purge(inp.job).deleted
                    if not inp.confirm or not member.leftovers(inp.job):
                        return PurgeResult(deleted=deleted)
            except ClusterUnreachable:
                pass
            activity.wait_for_cancelled_sync(PURGE_POLL_SECONDS)
            if activity.is_cancelled():
                raise asyncio.CancelledError()
            if activity.is_worker_shutdown():
                raise ApplicationError("worker shutting down; the purge resumes elsewhere")

    # ------------------------------------------------------------------ status
    @activity.defn(name="watch_status")
    def watch_status(self, inp: WatchInput) -> JobStatus:
        member = self._member(inp.cluster)

        def heartbeat() -> None:
            activity.heartbeat()
            if activity.is_cancelled():
                raise asyncio.CancelledError()
            if activity.is_worker_shutdown():
                # Hand the watch to another worker now instead of holding shutdown up.
                raise ApplicationError("worker shutting down; the watch resumes elsewhere")

        status: JobStatus = member.wait_for_change(
            inp.job, inp.since, inp.timeout_seconds, heartbeat=heartbeat
        )
        if status.taints:
            eviction = eviction_due(
                [t.to_taint() for t in status.taints],
                inp.cluster_tolerations,
                self.fleet.config.clusterFailover.settings(),
            )
            if eviction is not None:
                status.evict_at = datetime.fromtimestamp(eviction.at, UTC)
                status.evict_reason = f"{inp.cluster}: {eviction.message}"
        return status

    def all(self) -> list[Callable[..., Any]]:
        return [
            self.resolve_policy,
            self.signal_quota,
            self.check_holders,
            self.plan_placement,
            self.reserve,
            self.bind,
            self.purge,
            self.purge_when_reachable,
            self.watch_status,
        ]
