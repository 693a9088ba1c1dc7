"""Scripted stand-ins for fleetq's member clusters, as the job workflow's activities
(registered under the same names): a fake fleet of clusters whose jobs go through a
timeline (seconds after bind: health, phase, reason) on the time-skipping server's clock.
The workflow tests drive orchestration (timers, failover, purge modes, quota) with it
and the history bench runs a days-long job on it; the real activities are exercised end
to end against the emulator."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from activities.quota_outbox import QuotaOutbox
from activities.scheduling import deliver_quota_message
from fleetq.messages import (
    BindInput,
    BindResult,
    Candidate,
    HolderCheck,
    HolderVerdict,
    JobStatus,
    PlacementInput,
    PlacementVerdict,
    PodStatus,
    PurgeInput,
    PurgeResult,
    QuotaAck,
    QuotaSignal,
    Resolution,
    ResolveInput,
    VictimsPurge,
    WatchInput,
)
from fleetq.rejection import Rejection, RejectionCode


@dataclass
class JobScript:
    """What one job's copy on one fake cluster reports."""

    cluster: ClusterScript
    timeline: list[tuple[float, str, str, str]]
    bound_at: Any
    health: str = "Healthy"
    phase: str = "Created"
    reason: str = ""
    version: int = 1
    applied: int = 0

    def advance(self, now: Any) -> None:
        if self.bound_at is None:  # first watch: the clock starts (server time)
            self.bound_at = now
        elapsed = (now - self.bound_at).total_seconds()
        while self.applied < len(self.timeline) and self.timeline[self.applied][0] <= elapsed:
            _, health, phase, reason = self.timeline[self.applied]
            self.applied += 1
            if health == "Unreachable":
                self.cluster.reachable = False
            elif health == "Reachable":
                self.cluster.reachable = True
            else:
                self._apply(health, phase, reason)

    def _apply(self, health: str, phase: str, reason: str = "") -> None:
        self.health, self.phase, self.reason = health, phase, reason
        self.version += 1

    def set(self, health: str, phase: str, reason: str = "") -> None:
        """Set the state by hand; it supersedes what is left of the scripted timeline."""
        self.applied = len(self.timeline)
        self._apply(health, phase, reason)


@dataclass
class ClusterScript:
    """A fake member cluster; ``timeline`` is what every job bound to it goes through:
    (seconds after bind, health, phase, reason); health "Unreachable"/"Reachable" toggles
    the whole cluster."""

    fits: bool = True
    reservation: bool = False
    reserve_ok: bool = True
    reachable: bool = True
    timeline: list[tuple[float, str, str, str]] = field(default_factory=list)
    jobs: dict[str, JobScript] = field(default_factory=dict)
    #: the jobs whose watches, started from now on, stay open (heartbeating) until
    #: ``release_watches``, as a real watch of a copy that does not change stays open
    #: for its window
    hold_watches: set[str] = field(default_factory=set)
    held_watches: int = 0  # watches that were held open (ended or not)
    _released: asyncio.Event = field(default_factory=asyncio.Event)

    def release_watches(self) -> None:
        self.hold_watches.clear()
        self._released.set()


@dataclass
class FakeFleet:
    clusters: dict[str, ClusterScript]
    policy_doc: dict[str, Any] | None = None
    tree_workflow_id: str | None = None
    client: Client | None = None
    calls: list[tuple[str, str]] = field(default_factory=list)
    copies: set[str] = field(default_factory=set)
    on_bind: Callable[[str], None] | None = None
    outbox: QuotaOutbox | None = None

    def names(self) -> list[str]:
        return sorted(self.clusters)

    # --------------------------------------------------------------- activities
    @activity.defn(name="resolve_policy")
    async def resolve_policy(self, inp: ResolveInput) -> Resolution:
        self.calls.append(("resolve_policy", inp.name))
        return Resolution(
            policy=self.policy_doc, policy_reason="fake", tree_workflow_id=self.tree_workflow_id
        )

    @activity.defn(name="plan_placement")
    async def plan_placement(self, inp: PlacementInput) -> PlacementVerdict:
        self.calls.append(("plan_placement", ",".join(inp.exclude)))
        cands, rej = [], {}
        eligible = [c for c in self.names() if c not in inp.exclude]
        for name in self.names():
            c = self.clusters[name]
            if name in inp.exclude:
                rej[name] = "excluded (evicted)"
            elif not c.fits:
                rej[name] = f"{name}: worker-1 needs cpu 2, largest free node has 1.5"
            else:
                assignment = {
                    f"{g.role}-{i}": f"{name}-node-0"
                    for g in inp.gang.groups
                    for i in range(g.count)
                }
                cands.append(
                    Candidate(
                        cluster=name, score=1.0, reservation=c.reservation, assignment=assignment
                    )
                )
        return PlacementVerdict(candidates=cands, rejections=[
            Rejection.of(RejectionCode.EVICTED if name in inp.exclude
                         else RejectionCode.INSUFFICIENT_NODE_RESOURCE, why).at(name)
            for name, why in rej.items()], eligible=eligible)

    @activity.defn(name="bind")
    async def bind(self, inp: BindInput) -> BindResult:
        """Reserve (when asked; recorded as a ``reserve`` call) then bind."""
        if inp.reserve is not None:
            self.calls.append(("reserve", inp.cluster))
            if not self.clusters[inp.cluster].reserve_ok:
                return BindResult(
                    reservation_lost="reservation master-0 on node x: Failed: insufficient cpu"
                )
        self.calls.append(("bind", inp.cluster))
        created = inp.cluster not in self.copies
        self.copies.add(inp.cluster)
        c = self.clusters[inp.cluster]
        if inp.request.job.name not in c.jobs:
            # bind is a local activity, whose clock is the worker's, not the (skipping)
            # server's: the script's clock starts at the first watch, scheduled in the
            # same workflow task as the bind
            c.jobs[inp.request.job.name] = JobScript(c, list(c.timeline), None)
        if self.on_bind:
            self.on_bind(inp.cluster)
        return BindResult(created=created, uid=f"uid-{inp.cluster}")

    @activity.defn(name="watch_status")
    async def watch_status(self, inp: WatchInput) -> JobStatus:
        c = self.clusters[inp.cluster]
        if inp.job.name in c.hold_watches:
            c.held_watches += 1
            while inp.job.name in c.hold_watches:
                activity.heartbeat()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(c._released.wait(), 5.0)
        j = c.jobs[inp.job.name]
        j.advance(activity.info().current_attempt_scheduled_time)
        if not c.reachable:
            return JobStatus(
                cluster=inp.cluster,
                health="Unknown",
                phase="Unknown",
                reason="connection refused",
                observed="unknown",
            )
        pods = [
            PodStatus(
                name=f"{inp.job.name}-master-0",
                node=f"{inp.cluster}-node-0",
                phase=j.phase,
                ready=j.health == "Healthy",
                restarts=0,
            )
        ]
        return JobStatus(
            cluster=inp.cluster,
            health=j.health,  # type: ignore[arg-type]
            phase=j.phase,  # type: ignore[arg-type]
            reason=j.reason,
            pods=pods,
            observed=f"{j.health}/{j.phase}/{j.version}",
        )

    @activity.defn(name="purge")
    async def purge(self, inp: PurgeInput) -> PurgeResult:
        job = self.clusters[inp.cluster].jobs.get(inp.job.name)
        if job is not None:
            job.advance(activity.info().current_attempt_scheduled_time)
        self.calls.append(("purge", inp.cluster))
        if not self.clusters[inp.cluster].reachable:
            raise ApplicationError(f"cluster {inp.cluster}: connection refused")
        existed = inp.cluster in self.copies
        self.copies.discard(inp.cluster)
        return PurgeResult(
            deleted=[f"PyTorchJob {inp.job.namespace}/{inp.job.name}"] if existed else []
        )

    @activity.defn(name="purge_when_reachable")
    async def purge_when_reachable(self, inp: PurgeInput) -> PurgeResult:
        """The real one polls the member every second; here each retry (a server timer,
        which time skipping skips) is one poll."""
        self.calls.append(("purge_when_reachable", inp.cluster))
        return await self.purge(inp)

    @activity.defn(name="purge_for_preemption")
    async def purge_for_preemption(self, inp: VictimsPurge) -> list[str]:
        """The quota workflow's purge of a pass's grace-0 victims (docs/decisions/023):
        every reachable cluster answers (the victim's own purge still updates
        ``copies``); none when one is unreachable, as the real one."""
        self.calls += [("purge_for_preemption", job.name) for job in inp.jobs]
        if not all(c.reachable for c in self.clusters.values()):
            return []
        return [job.workflow_id for job in inp.jobs]

    @activity.defn(name="signal_quota")
    async def signal_quota(self, inp: QuotaSignal) -> QuotaAck:
        """The real delivery (the worker's outbox): the quota workflow under test is real."""
        assert self.client is not None
        self.calls.append(("signal_quota", inp.signal))
        if self.outbox is None:
            self.outbox = QuotaOutbox(self.client)
        return await deliver_quota_message(self.outbox, inp)

    @activity.defn(name="check_holders")
    async def check_holders(self, inp: HolderCheck) -> HolderVerdict:
        assert self.client is not None
        gone = []
        for wid in inp.workflow_ids:
            try:
                desc = await self.client.get_workflow_handle(wid).describe()
            except RPCError as exc:
                if exc.status == RPCStatusCode.NOT_FOUND:
                    gone.append(wid)
                    continue
                raise
            if desc.status != WorkflowExecutionStatus.RUNNING:
                gone.append(wid)
        return HolderVerdict(gone=gone)

    def activities(self) -> list[Callable[..., Any]]:
        return [
            self.resolve_policy,
            self.plan_placement,
            self.bind,
            self.watch_status,
            self.purge,
            self.purge_when_reachable,
            self.purge_for_preemption,
            self.signal_quota,
            self.check_holders,
        ]

    def job(self, cluster: str, name: str) -> JobScript:
        return self.clusters[cluster].jobs[name]

    def count(self, name: str, cluster: str | None = None) -> int:
        return sum(1 for n, c in self.calls if n == name and (cluster is None or c == cluster))
