"""Temporal activities: thin adapters from workflows to the fleet and the pure core.

Each activity takes one small input object and returns a compact verdict. Member-cluster
work is synchronous ``kubernetes``-client code (``activities.member_cluster``), run by the
worker in a thread pool; the placement decision is the pure ``fleetq.placement`` core
running on cached snapshots, so node lists never reach workflow history. So does capacity
preemption (``fleetq.preemption.plan_capacity_preemption``), on the same snapshots and the
gangs the capacity caches see running on each member.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from activities.capacity_cache import CapacityCache
from activities.fleet import Fleet
from activities.kube_api import ApiError, ClusterUnreachable
from activities.member_cluster import ConflictError, KubernetesMemberCluster
from activities.quota_outbox import QuotaOutbox, QuotaRefused
from activities.room_claim_store import ClaimStore, LocalClaims, RegistryClaims, run_on_loop
from activities.run_copies import purge_earlier_runs
from activities.unschedulable_wake import wake_unschedulable
from fleetq import cluster_groups
from fleetq.capacity import ClusterSnapshot
from fleetq.cluster_health import eviction_due, taint_text
from fleetq.fleet_config import FleetConfig, RequeueSettings, requeue_settings
from fleetq.handler_refs import JobHandlers, RegistryHandlers
from fleetq.messages import (
    MISSING_PHASE,
    BindInput,
    BindResult,
    Candidate,
    CapacityPlanned,
    CapacityVictim,
    HolderCheck,
    HolderVerdict,
    JobRef,
    JobStatus,
    PlacementInput,
    PlacementVerdict,
    PurgeInput,
    PurgeResult,
    QuotaAck,
    QuotaSignal,
    ReserveRequest,
    ReserveResult,
    Resolution,
    ResolveInput,
    VictimsPurge,
    WatchInput,
)
from fleetq.models import (
    ClusterAffinity,
    ClusterAffinityTerm,
    Gang,
    PropagationPolicy,
    Toleration,
    parse_policy,
)
from fleetq.naming import JOB_PURGE_WORKFLOW, REGISTRY_WORKFLOW_ID
from fleetq.placement import ClusterChoice, PlacementIndex, place_gang
from fleetq.preemption import RunningGang, plan_capacity_preemption
from fleetq.registry import (
    RegistryState,
    may_hold_claims,
    preempts_for_capacity,
    resolve_from_state,
)
from fleetq.room_claims import RoomClaim, claim_of, with_claims

#: how stale the worker's view of the fleet registry may be when resolving a job's policy
REGISTRY_MAX_AGE = 1.0
#: a capacity preemption's claimed room outlives its longest victim grace period by this
#: long at most (the preemptor drops its plan after lifecycle.CAPACITY_MARGIN_SECONDS)
CLAIM_MARGIN_SECONDS = 90.0
#: how long this worker's placements assume a gang it just placed takes the nodes it
#: was placed on, unless its bind ends first (kube-scheduler's assumed pods)
ASSUME_SECONDS = 10.0
log = logging.getLogger(__name__)

#: how often purge_when_reachable asks an unreachable member whether it answers again
PURGE_POLL_SECONDS = 1.0
#: purge_when_reachable's "do you answer?" waits at most this long for the member
PURGE_PROBE_READ_SECONDS = 5.0


def _in_groups(
    terms: Sequence[ClusterAffinityTerm],
    observed: str,
    ranked: Sequence[ClusterChoice],
    members: Mapping[str, Any],
) -> cluster_groups.GroupChoice:
    """The round's candidates: with clusterAffinities, those of the first group that
    fits (``fleetq.cluster_groups.choose``); without, every fit."""
    if not terms:
        return cluster_groups.GroupChoice("", list(ranked))
    labels = {n: m.labels for n, m in members.items()}
    return cluster_groups.choose(terms, observed, ranked, labels)


async def deliver_quota_message(outbox: QuotaOutbox, inp: QuotaSignal) -> QuotaAck:
    """``signal_quota``'s work: applied (with the grant of an enqueue admitted at once)
    or not running; a refused enqueue is a non-retryable failure naming why."""
    try:
        return await outbox.send(inp)
    except QuotaRefused as exc:
        raise ApplicationError(
            f"quota workflow {inp.tree_workflow_id} refused {inp.subject()}: {exc}",
            type="QuotaRefused",
            non_retryable=True,
        ) from None


@dataclasses.dataclass(frozen=True)
class _RegistryRead:
    """The worker's last read of the fleet registry."""

    #: monotonic and wall time the read was sent
    read_mono: float
    read_wall: float
    #: the run and its history length when it was read (``_registry_snapshot``)
    run_id: str | None
    history_length: int
    state: RegistryState
    policies: list[PropagationPolicy]


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
        self._registry: _RegistryRead | None = None
        self.registry_max_age = REGISTRY_MAX_AGE
        #: registry reads made: queries of its state, and describes that found it
        #: unchanged since the last query (for benchmarks and tests)
        self.registry_queries = 0
        self.registry_checks = 0
        self._outbox: QuotaOutbox | None = None
        #: room capacity preemptions made, by preemptor (fleetq.room_claims): in the
        #: fleet registry workflow, seen by every worker
        self._room: ClaimStore = (
            RegistryClaims(client, lambda: self._loop) if client is not None else LocalClaims()
        )
        #: gangs this worker placed and has not bound yet, by job (``ASSUME_SECONDS``):
        #: the placements that follow see their nodes taken, so a burst placed from one
        #: snapshot does not pick the same node for every gang (its reservations then
        #: failing on that node, or its guarded binds refused)
        self._assumed = LocalClaims()
        self._memo_lock = threading.Lock()
        #: placement's views of the members' snapshots (the capacity caches hand over
        #: the same snapshot objects until something changes), shared by the activity
        #: threads, hence the locks
        self._placement_index = PlacementIndex(threading.Lock)
        #: the worker's event loop (the placement activity's thread queries through it)
        self._loop: asyncio.AbstractEventLoop | None = None
        with contextlib.suppress(RuntimeError):
            self._loop = asyncio.get_running_loop()
        #: Unschedulable jobs (no member could ever hold them) -> the members they were
        #: judged on: woken with ``retry_placement`` when one of those members' nodes
        #: change (their workflow's long timer is the backstop after a worker restart)
        self._parked: dict[str, frozenset[str]] = {}
        self._listening: set[str] = set()
        #: ... which a restart forgets: a starting worker wakes every Unschedulable job
        #: it finds by search attribute, so each is judged (and listened for) again
        self.startup_wake: asyncio.Task[list[str]] | None = None
        if client is not None and self._loop is not None and search_attributes:
            self.startup_wake = self._loop.create_task(wake_unschedulable(client))

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
        not one each), and read after the job was submitted, so a policy applied before
        the job is always seen; a miss re-reads the registry once before it is believed."""
        self._loop = asyncio.get_running_loop()
        res = Resolution()
        if self._client is not None:
            snapshot = await self._registry_snapshot(newer_than=inp.submitted_at)
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
                        snapshot = fresh
                        res = resolve_from_state(fresh[0], fresh[1], inp)
                res.requeue = self._requeue_settings(snapshot[0])
        res.search_attributes = self._search_attributes
        return res

    def _requeue_settings(self, state: RegistryState) -> RequeueSettings:
        """The fleet's ``requeue`` settings with the tree's annotations applied (a tree
        the registry took has valid ones; a fleet without a config file: defaults)."""
        config = getattr(self.fleet, "config", None)
        base = config.requeue if isinstance(config, FleetConfig) else RequeueSettings()
        try:
            return requeue_settings(base, state.tree_annotations, f"ElasticQuotaTree {state.tree}")
        except ValueError as exc:
            log.warning("%s; using the fleet's requeue settings", exc)
            return base

    async def _registry_snapshot(
        self, max_age: float | None = None, newer_than: float | None = None
    ) -> tuple[RegistryState, list[PropagationPolicy]] | None:
        """The registry as read at most ``max_age`` seconds ago (the worker's default) and,
        with ``newer_than`` (epoch seconds), read no earlier than that: waiters share one
        read, and every read serves all the jobs submitted before it was sent.

        A read describes the registry workflow first: while its run and history length
        are those of the last query, nothing has changed its state (only events do), so
        that state is current and no query is sent. A query costs a task on a worker
        and the state's payload; a describe is answered by the server alone."""
        assert self._client is not None
        limit = self.registry_max_age if max_age is None else max_age
        async with self._registry_lock:
            last = self._registry
            if last is not None and time.monotonic() - last.read_mono <= limit and (
                newer_than is None or last.read_wall >= newer_than
            ):
                return last.state, last.policies
            sent_mono, sent_wall = time.monotonic(), time.time()
            handle = self._client.get_workflow_handle(REGISTRY_WORKFLOW_ID)
            try:
                # described before the query: the state it answers holds at least the
                # events counted, so an equal count later proves it current then
                desc = await handle.describe()
                if last is not None and (last.run_id, last.history_length) == (
                        desc.run_id, desc.history_length):
                    self.registry_checks += 1
                    self._registry = dataclasses.replace(
                        last, read_mono=sent_mono, read_wall=sent_wall)
                    return last.state, last.policies
                ref = RegistryHandlers.STATE
                state = await handle.query(ref.name, result_type=ref.result)
            except RPCError as exc:
                if exc.status != RPCStatusCode.NOT_FOUND:
                    raise
                self._registry = None
                return None
            self.registry_queries += 1
            policies = [parse_policy(doc) for doc in state.policies.values()]
            self._registry = _RegistryRead(sent_mono, sent_wall, desc.run_id,
                                           desc.history_length, state, policies)
            return state, policies

    @activity.defn(name="signal_quota")
    async def signal_quota(self, inp: QuotaSignal) -> QuotaAck:
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
                # a purge run under a job's id is a deleted job: it holds nothing
                return (desc.status != WorkflowExecutionStatus.RUNNING
                        or desc.workflow_type == JOB_PURGE_WORKFLOW)

        flags = await asyncio.gather(*(gone(w) for w in inp.workflow_ids))
        return HolderVerdict(gone=[w for w, g in zip(inp.workflow_ids, flags, strict=True) if g])

    def capacity_preemption_on(self, tree_id: str) -> bool:
        """Whether a job of the quota tree ``tree_id`` may plan a capacity preemption now,
        as the fleet registry (which holds the tree's annotations; its snapshot at most
        REGISTRY_MAX_AGE old) says: ``registry.preempts_for_capacity``. Without a
        Temporal client (a bare adapter) never."""
        if self._client is None:
            return False
        state = self._registry_now()
        return state is not None and preempts_for_capacity(
            state, tree_id, datetime.now(UTC), REGISTRY_MAX_AGE)

    def _registry_now(self) -> RegistryState | None:
        """The registry snapshot (at most REGISTRY_MAX_AGE old), from an activity thread."""
        snapshot = run_on_loop(self._loop, self._registry_snapshot())
        return snapshot[0] if snapshot is not None else None

    def _live_claims(self) -> list[RoomClaim]:
        """The room claims a placement respects: read afresh when the registry (at most
        REGISTRY_MAX_AGE old) says some may exist, none otherwise (no query)."""
        if self._client is None:
            return self._room.read()
        state = self._registry_now()
        return self._room.read() if state is not None and may_hold_claims(state) else []

    def _running_gangs(self, names: Iterable[str]) -> list[RunningGang]:
        """Fleet jobs running on the members ``names``, from their capacity caches."""
        out: list[RunningGang] = []
        for name in names:
            cache: CapacityCache | None = getattr(self.fleet.clusters.get(name), "cache", None)
            if cache is not None:
                out.extend(cache.running_gangs())
        return out

    # ------------------------------------------------------------------ unschedulable
    def _park(self, job_id: str, members: list[str] | None) -> None:
        """Remember ``job_id`` as never placeable on ``members`` (None: forget it), and
        listen to those members' node changes."""
        with self._memo_lock:
            if members is None:
                self._parked.pop(job_id, None)
                return
            self._parked[job_id] = frozenset(members)
            new = [m for m in members if m not in self._listening]
            self._listening.update(new)
        for name in new:
            cache: CapacityCache | None = getattr(self.fleet.clusters.get(name), "cache", None)
            if cache is not None:
                cache.add_node_listener(self._nodes_changed)

    def _nodes_changed(self, cluster: str) -> None:
        """A member's nodes changed (called on its cache's watch thread): wake every job
        parked on it once (it parks again if it still fits nowhere)."""
        with self._memo_lock:
            woken = [j for j, ms in self._parked.items() if cluster in ms]
            for j in woken:
                del self._parked[j]
        loop, client = self._loop, self._client
        if not woken or client is None or loop is None or loop.is_closed():
            return
        for job_id in woken:
            with contextlib.suppress(RuntimeError):
                asyncio.run_coroutine_threadsafe(self._wake(client, job_id), loop)

    @staticmethod
    async def _wake(client: Client, job_id: str) -> None:
        try:
            await client.get_workflow_handle(job_id).signal(JobHandlers.RETRY_PLACEMENT.name)
        except RPCError as exc:  # gone: nothing to wake
            log.info("could not wake %s after a node change: %s", job_id, exc)

    # ------------------------------------------------------------------ placement
    @activity.defn(name="plan_placement")
    def plan_placement(self, inp: PlacementInput) -> PlacementVerdict:
        """Rank the members where the gang fits now. For a job carrying out a capacity
        preemption (``inp.planned``), also say which of its victims still run there;
        asked to (``inp.capacity_preemption``) when it fits nowhere, plan one: exactly
        one cluster where evicting lower-priority preemptible gangs makes room."""
        fleet = self.fleet
        affinity = ClusterAffinity.model_validate(inp.affinity) if inp.affinity else None
        tolerations = [Toleration.model_validate(t) for t in inp.cluster_tolerations]
        members = fleet.clusters
        terms = [ClusterAffinityTerm.model_validate(t) for t in inp.cluster_groups]
        scope = cluster_groups.round_scope(
            {n: m.labels for n, m in members.items()}, inp.exclude, affinity, terms, inp.group)
        eligible = scope.judged
        snapshots = fleet.snapshots(eligible) if eligible else []
        claims = self._live_claims()
        others = [c for c in claims if c.preemptor != inp.job_id]
        held = others + [c for c in self._assumed.read() if c.preemptor != inp.job_id]
        if held:
            snapshots = with_claims(snapshots, held,
                                    self._running_gangs({c.cluster for c in held}))
        gang = inp.gang.to_gang()
        decision = place_gang(
            gang,
            snapshots,
            affinity=affinity,
            cluster_tolerations=tolerations,
            exclude=set(inp.exclude),
            judge_never=True,
            index=self._placement_index,
        )
        rejections = {name: why.at(name) for name, why in decision.reasons.items()}
        chosen = _in_groups(terms, inp.group, decision.ranked, members)
        for name, why in scope.ruled_out.items():
            rejections.setdefault(name, why.at(name))
        verdict = PlacementVerdict(
            candidates=[
                Candidate(
                    cluster=c.cluster,
                    score=c.score,
                    reservation=bool(members[c.cluster].reservation),
                    assignment=dict(c.assignment),
                    group=chosen.group,
                )
                for c in chosen.ranked
            ],
            rejections=list(rejections.values()),
            eligible=eligible,
            never=decision.never.message if decision.never is not None else "",
            group=chosen.group,
        )
        if inp.job_id:
            self._park(inp.job_id, eligible if decision.never is not None else None)
            if verdict.candidates and inp.assume:  # its bind follows: hold those nodes
                first = verdict.candidates[0]
                self._assumed.claim(claim_of(inp.job_id, gang, first.cluster,
                                             first.assignment, ASSUME_SECONDS))
        if len(others) < len(claims) and not verdict.candidates and (
            inp.planned is None and not inp.capacity_preemption
        ):  # its plan is over: the room is anyone's (once it fits, its bind releases it)
            self._room.release(inp.job_id)
        if inp.planned is not None or inp.capacity_preemption:
            room = [
                s for s in snapshots
                if not terms or cluster_groups.in_first(terms, inp.group, s.name, s.labels)
            ]
            self._capacity(inp, gang, room, affinity, tolerations, verdict)
        return verdict

    def _capacity(
        self,
        inp: PlacementInput,
        gang: Gang,
        snapshots: list[ClusterSnapshot],
        affinity: ClusterAffinity | None,
        tolerations: list[Toleration],
        verdict: PlacementVerdict,
    ) -> None:
        """Capacity preemption's part of ``plan_placement`` (fills ``verdict``)."""
        if inp.planned is not None:
            running = {
                g.job_id for g in self._running_gangs([inp.planned.cluster])
            }
            verdict.victims_left = [
                v.job_id for v in inp.planned.victims if v.job_id in running
            ]
            return
        if (
            verdict.candidates
            or not inp.capacity_preemption
            or not inp.job_id
            or inp.tree_workflow_id is None
            or not self.capacity_preemption_on(inp.tree_workflow_id)
        ):
            return
        plan = plan_capacity_preemption(
            inp.job_id,
            gang,
            snapshots,
            self._running_gangs(s.name for s in snapshots),
            time.time(),
            affinity=affinity,
            cluster_tolerations=tolerations,
            exclude=set(inp.exclude),
            index=self._placement_index,
        )
        if plan is None:
            return
        verdict.capacity_plan = CapacityPlanned(
            cluster=plan.cluster,
            victims=[
                CapacityVictim(
                    job_id=v.job_id,
                    priority=v.priority,
                    grace_seconds=v.grace_seconds,
                    message=v.message,
                )
                for v in plan.victims
            ],
        )
        bound = max(v.grace_seconds for v in plan.victims) + CLAIM_MARGIN_SECONDS
        # recorded before the verdict returns, so before any victim is told to stop
        self._room.claim(claim_of(inp.job_id, gang, plan.cluster, plan.choice.assignment, bound))

    # ------------------------------------------------------------------ member writes
    @activity.defn(name="bind")
    def bind(self, inp: BindInput) -> BindResult:
        """Reserve (when ``inp.reserve``: the member reserves) then bind, as one member
        write. Retry-safe: reservations are named by the job's pods and the copy by the
        job, so a retried call finds what an earlier attempt made; once this run's copy
        exists (its pods may have consumed the reservations) it is not reserved again."""
        job = inp.request.job
        try:
            result = self._write_copy(inp)
        finally:  # written or refused: the member's objects (or a new placement) say now
            self._assumed.release(job.workflow_id)
        if result.reservation_lost:
            return result
        purge_earlier_runs(self.fleet.clusters, inp.cluster, job)
        if inp.watch is not None:
            result.status = self._first_watch(inp, result.uid)
        if inp.release_room:
            self._release_room(job.workflow_id)
        return result

    def _write_copy(self, inp: BindInput) -> BindResult:
        """The member write: the reservations (where asked), then the copy."""
        member = self._member(inp.cluster)
        request = inp.request
        try:
            if inp.reserve is not None and not self._copy_exists(member, inp):
                lost = self._reserve(member, inp.cluster, inp.reserve)
                if lost:
                    return BindResult(reservation_lost=lost)
                request = request.model_copy(update={"reserved": True})
            result: BindResult = member.bind(request)
        except ConflictError as exc:
            raise ApplicationError(str(exc), type="ConflictError", non_retryable=True) from None
        except ApiError as exc:  # a definite rejection (403, 422): retrying cannot help
            raise ApplicationError(str(exc), type="ApiError", non_retryable=True) from None
        return result

    def _release_room(self, job_id: str) -> None:
        """The job's copy is bound: the room a capacity preemption made for it is its
        own now (its pods count in the snapshots as they bind; until then the claim,
        less those pods, keeps it). A registry that does not answer leaves the claim to
        expire; the bind has landed either way."""
        try:
            self._room.release(job_id)
        except (RPCError, WorkflowUpdateFailedError, RuntimeError) as exc:
            log.warning("room claim of %s not released (it expires): %s", job_id, exc)

    def _first_watch(self, inp: BindInput, uid: str) -> JobStatus | None:
        """The bound copy's first watch (``BindInput.watch``), of the copy with ``uid``;
        None when it is cut short (the worker shuts down, the member stops answering):
        the bind has landed, and the job's own watch reads the copy again."""
        assert inp.watch is not None
        watch = WatchInput(
            cluster=inp.cluster,
            job=inp.request.job,
            since=inp.watch.since,
            timeout_seconds=inp.watch.timeout_seconds,
            cluster_tolerations=inp.watch.cluster_tolerations,
        )
        try:
            return self._watch(watch, uid)
        except (asyncio.CancelledError, ApplicationError, ClusterUnreachable, ApiError) as exc:
            log.info("first watch of %s on %s cut short: %s", inp.request.job.name,
                     inp.cluster, exc)
            return None

    @staticmethod
    def _copy_exists(member: Any, inp: BindInput) -> bool:
        """On a retried attempt: whether an earlier one already made this run's copy."""
        if activity.info().attempt <= 1:
            return False
        status: JobStatus = member.status(inp.request.job)
        return status.phase not in (MISSING_PHASE, "Unknown")

    @staticmethod
    def _reserve(member: Any, cluster: str, request: ReserveRequest) -> str:
        """Hold the gang's room on the member; why not ("" when held)."""
        try:
            result: ReserveResult = member.reserve(request)
        except ClusterUnreachable as exc:
            return f"{cluster} unreachable: {exc}"
        return "" if result.ok else result.reason

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

    @activity.defn(name="purge_for_preemption")
    def purge_for_preemption(self, inp: VictimsPurge) -> list[str]:
        """Purge one scheduling pass's grace-0 victims on every member, in parallel, for
        the quota workflow (its local activity, docs/decisions/023): the workflow ids of
        those every member answered for, whose quota it may take back before they have
        heard of their preemption. A member whose capacity cache vouches that it holds no
        PyTorchJob of that name is not asked; one that does not answer leaves that victim
        out (its own ``requeue`` then gives the quota back, as before)."""
        if not inp.jobs:
            return []
        pool = ThreadPoolExecutor(max_workers=min(16, len(inp.jobs)),
                                  thread_name_prefix="fleetq-victims-purge")
        try:
            done = list(pool.map(self._purge_everywhere, inp.jobs))
        finally:
            pool.shutdown(wait=False)
        return [job.workflow_id for job, ok in zip(inp.jobs, done, strict=True) if ok]

    def _purge_everywhere(self, job: JobRef) -> bool:
        for name, member in self.fleet.clusters.items():
            if isinstance(member, KubernetesMemberCluster) and member.cache.holds_no_job(
                    job.namespace, job.name):
                continue
            try:
                if isinstance(member, KubernetesMemberCluster):
                    member.purge_shown(job)
                else:
                    member.purge(job)
            except ClusterUnreachable as exc:
                log.info("%s not purged on %s for its preemption: %s", job.ref, name, exc)
                return False
        return True

    @activity.defn(name="member_names")
    def member_names(self) -> list[str]:
        """The member clusters of the fleet config, in its order (where a finished job's
        delete looks for what is left of it)."""
        return list(self.fleet.clusters)

    # ------------------------------------------------------------------ status
    @activity.defn(name="watch_status")
    def watch_status(self, inp: WatchInput) -> JobStatus:
        return self._watch(inp)

    def _watch(self, inp: WatchInput, uid: str = "") -> JobStatus:
        """Wait for the copy's status to change from ``inp.since`` or the window to end;
        with the eviction a NoExecute health taint brings, the policy's tolerations
        considered. ``uid``: the copy a bind just made (the first watch)."""
        member = self._member(inp.cluster)

        def heartbeat() -> None:
            activity.heartbeat()
            if activity.is_cancelled():
                raise asyncio.CancelledError()
            if activity.is_worker_shutdown():
                # Hand the watch to another worker now instead of holding shutdown up.
                raise ApplicationError("worker shutting down; the watch resumes elsewhere")

        status: JobStatus = member.wait_for_change(
            inp.job, inp.since, inp.timeout_seconds, heartbeat=heartbeat, uid=uid
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
                status.evict_taint = taint_text(eviction.taint)
                status.evict_tolerated = eviction.tolerated
        return status

    def all(self) -> list[Callable[..., Any]]:
        return [
            self.resolve_policy,
            self.signal_quota,
            self.check_holders,
            self.plan_placement,
            self.bind,
            self.purge,
            self.purge_when_reachable,
            self.purge_for_preemption,
            self.member_names,
            self.watch_status,
        ]
