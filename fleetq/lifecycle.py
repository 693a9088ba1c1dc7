"""The decisions of one PyTorchJob's life, apart from the workflow that carries them out.

``workflows/pytorch_job.py`` orchestrates; every *decision* lives here as a plain
function of the run's ``JobProgress`` (carried whole across continue-as-new) and of the
time the caller passes in, so each rule is unit- and property-tested without Temporal:
health and the failover timer (``observe``, ``next_deadline``, ``judge``), purge modes
(``failover_plan``, ``leave_cluster``), candidates and backoff, runPolicy deadlines and
suspension, quota and capacity preemption (docs/preemption.md), never versus not now and
re-queue with backoff (docs/requeue.md), and what a job shows (``record_event``,
``details_markdown``). Functions that change state change the ``JobProgress`` (or
``JobView``) given and return what the workflow must announce, in order (``Notice``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, Field

from fleetq.admission import Grant, ui_text
from fleetq.fleet_config import RequeueSettings
from fleetq.messages import (
    MISSING_PHASE,
    TERMINAL_STATES,
    AdmissibilitySignal,
    Candidate,
    CapacityPlanned,
    JobEvent,
    JobState,
    JobStatus,
    JobView,
    PlacementVerdict,
    PreemptSignal,
    Resolution,
)
from fleetq.models import ApplicationFailover, ClusterFailover, PurgeMode
from fleetq.naming import SA_CLUSTER, SA_JOB, SA_NAMESPACE, SA_PRIORITY, SA_QUEUE, SA_STATE

#: a job keeps its last MAX_EVENTS events (``fleetq describe`` shows them)
MAX_EVENTS = 30
#: states too short-lived to be worth a search-attribute upsert (a history event each)
TRANSIENT_STATES: tuple[JobState, ...] = ("Validating", "Scheduling")
#: states published to search attributes only once they last: a job normally leaves
#: Created for Running within seconds, so Created is upserted only if the first watch
#: window (SA_SETTLE_SECONDS) ends with the job still there
SETTLING_STATES: tuple[JobState, ...] = ("Created",)
SA_SETTLE_SECONDS = 10.0
#: a deadline nearer than this is slept out on a timer of its own, not beside a watch
DEADLINE_NEAR_SECONDS = 1.0
#: the shortest timer the workflow arms for a deadline already due
MIN_TIMER_SECONDS = 0.001
#: placement tries at most this many ranked candidates per round
MAX_CANDIDATES = 3
#: the first watch after a bind wakes on a phase or health change only, not on every pod
#: the member creates on the way to Running
FIRST_WATCH_SINCE = "Healthy/Created"
#: the grace period of purgeMode Gracefully when the policy names none
DEFAULT_GRACE_SECONDS = 600
#: a run continues-as-new once its history passes this many events
MAX_HISTORY_EVENTS = 1000

EventType = Literal["Normal", "Warning"]


class JobProgress(BaseModel):
    """The run's state: everything a run hands to the next one on continue-as-new."""

    view: JobView
    resolution: Resolution
    grant: Grant | None = None
    #: the change token of the last status seen (a watch returns when it differs)
    since: str = ""
    #: purgeMode Gracefully: the old copy, purged once the new one is healthy ...
    graceful_old: str | None = None
    #: ... or at this time
    grace_deadline: datetime | None = None
    #: a NoExecute health taint on the current member evicts the job at this time ...
    evict_at: datetime | None = None
    evict_reason: str = ""
    #: ... counting from this time (when the taint was added)
    evict_since: datetime | None = None
    #: the quota workflow preempted the job: purged, released and queued again at
    #: ``preempt_at`` (the end of its grace period), or at once when nothing is bound
    preempt: PreemptSignal | None = None
    preempt_at: datetime | None = None
    #: a capacity preemption the job is carrying out (or dropped) for its placement
    capacity: CapacityHold | None = None
    #: re-queue with backoff (issue 24): when the current admission began (the placement
    #: timeout counts from it) ...
    admitted_at: datetime | None = None
    #: ... the time the bound job's pods must all run by (podsReadyTimeoutSeconds) ...
    ready_by: datetime | None = None
    #: ... the re-queues after a timeout so far (requeueLimit counts them) ...
    requeues: int = 0
    #: ... and, backing off after one, when it queues again
    requeue_at: datetime | None = None
    #: statePreservation: the current copy's status as last synced, and the labels the
    #: copies bound after the last failover carry (``fleetq.state_preservation``)
    synced_status: dict[str, Any] = Field(default_factory=dict)
    preserved_labels: dict[str, str] = Field(default_factory=dict)
    #: runPolicy.suspend and the suspend / resume signals (``Suspension``)
    suspension: Suspension = Field(default_factory=lambda: Suspension())
    #: the quota workflow whose queue a ``requeue`` just put the job back in: the next
    #: admission wait sends no ``enqueue`` there (which, crossing the grant of the pass
    #: that follows the requeue, would make the quota workflow re-send it)
    requeued_in: str | None = None
    #: the quota workflow's last ``admissibility`` signal, and whether it is yet to be shown
    admissibility: AdmissibilitySignal | None = None
    admissibility_news: bool = False


class Reason(StrEnum):
    """The reasons of the events a job records (``fleetq describe``, like kubectl's)."""

    QUEUED = "Queued"
    #: the gang minimum exceeds a max of its quota chain (issue 24)
    INADMISSIBLE = "Inadmissible"
    ADMITTED = "Admitted"
    BOUND = "ScheduleBindingSucceed"
    BINDING_FAILED = "ScheduleBindingFailed"
    FAILED_SCHEDULING = "FailedScheduling"
    UNHEALTHY = "Unhealthy"
    RECOVERED = "Recovered"
    TAINT_EVICTION = "TaintEviction"
    FAILOVER_STARTED = "FailoverStarted"
    EVICTED = "Evicted"
    RESCHEDULED = "Rescheduled"
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    SUSPENDED = "Suspended"
    RESUMED = "Resumed"
    PURGED = "Purged"
    PURGE_DEFERRED = "PurgeDeferred"
    PURGE_FAILED = "PurgeFailed"
    DELETED = "Deleted"
    PREEMPTED = "Preempted"
    PREEMPTING = "Preempting"
    PREEMPTION_DROPPED = "PreemptionDropped"
    #: no member could ever hold the gang (a NeverFits rejection): quota given back
    UNSCHEDULABLE = "Unschedulable"
    #: queued again: after a backoff, or once an Unschedulable job may fit
    REQUEUED = "Requeued"
    PLACEMENT_TIMEOUT = "PlacementTimeout"
    PODS_READY_TIMEOUT = "PodsReadyTimeout"
    REQUEUE_LIMIT_EXCEEDED = "RequeueLimitExceeded"
    STATE_PRESERVED = "StatePreserved"
    STATE_NOT_PRESERVED = "StateNotPreserved"


@dataclass(frozen=True)
class Announce:
    """Record an event on the job."""

    type: EventType
    reason: Reason
    message: str


@dataclass(frozen=True)
class Transition:
    """Move the job to ``state`` (or keep it there) for ``reason``."""

    state: JobState
    reason: str


@dataclass(frozen=True)
class Refresh:
    """Nothing to announce, but what the job shows may have changed: publish it."""


Notice = Announce | Transition | Refresh


@dataclass(frozen=True)
class Show:
    """A command of the job's machines (``job_machine``, ``job_queue``): announce these
    notices (events, state transitions, a refresh), in order."""

    notices: tuple[Notice, ...]


@dataclass(frozen=True)
class Pause:
    """A command of the job's machines: pause ``seconds`` on a durable timer (its
    ``summary``), cut short by ``retry_placement``."""

    seconds: float
    summary: str


# ---------------------------------------------------------------------- backoff


@dataclass(frozen=True)
class Backoff:
    """Doubling retry pauses from ``initial`` seconds, never above ``cap``."""

    initial: float
    cap: float

    def after(self, delay: float) -> float:
        return min(delay * 2, self.cap)


#: retrying placement while nothing fits
PLACEMENT_BACKOFF = Backoff(initial=2.0, cap=60.0)
#: waiting for a PropagationPolicy, an ElasticQuotaTree or its quota workflow
RESOLVE_BACKOFF = Backoff(initial=5.0, cap=120.0)
#: purging on durable timers (workflows started before purge_when_reachable)
PURGE_BACKOFF = Backoff(initial=5.0, cap=300.0)


# ---------------------------------------------------------------------- deadlines


class Due(StrEnum):
    """What a deadline of the bound job is for."""

    FAILOVER = "failover"  # unhealthy for the policy's tolerationSeconds
    DEADLINE = "deadline"  # runPolicy.activeDeadlineSeconds
    EVICT = "evict"  # a NoExecute taint outlasted its toleration
    GRACE = "grace"  # purgeMode Gracefully: the old copy's grace period
    PREEMPT = "preempt"  # preempted: the victim's grace period
    PODS_READY = "pods-ready"  # bound, pods not all running within podsReadyTimeoutSeconds


@dataclass(frozen=True)
class Deadline:
    due: Due
    #: seconds from now; <= 0 once due
    seconds: float
    #: what the workflow's timer says it waits for
    summary: str

    @property
    def near(self) -> bool:
        """Near enough to be slept out on a timer of its own, then acted on."""
        return self.seconds < DEADLINE_NEAR_SECONDS

    @property
    def timer_seconds(self) -> float:
        return max(self.seconds, MIN_TIMER_SECONDS)


def next_deadline(
    progress: JobProgress,
    *,
    tolerance: int | None,
    active_deadline_seconds: int | None,
    now: datetime,
) -> Deadline | None:
    """The nearest deadline of the bound job (on a tie, the first of failover tolerance,
    active deadline, taint eviction, grace period, preemption, pods ready), or None."""
    view = progress.view
    best: Deadline | None = None

    def consider(due: Due, at: datetime, summary: str) -> None:
        nonlocal best
        seconds = (at - now).total_seconds()
        if best is None or seconds < best.seconds:
            best = Deadline(due, seconds, summary)

    if tolerance is not None and view.unhealthy_since is not None:
        consider(
            Due.FAILOVER,
            view.unhealthy_since + timedelta(seconds=tolerance),
            f"failover tolerance {tolerance}s on {view.cluster}",
        )
    if view.deadline_at is not None:
        consider(
            Due.DEADLINE,
            view.deadline_at,
            f"runPolicy.activeDeadlineSeconds {active_deadline_seconds}",
        )
    if progress.evict_at is not None:
        consider(Due.EVICT, progress.evict_at, f"evict: {progress.evict_reason}")
    if progress.graceful_old and progress.grace_deadline is not None:
        consider(
            Due.GRACE,
            progress.grace_deadline,
            f"grace period before purging {progress.graceful_old}",
        )
    if progress.preempt is not None and progress.preempt_at is not None:
        consider(
            Due.PREEMPT,
            progress.preempt_at,
            f"preempted by {_display(progress.preempt.preemptor)}: "
            f"{progress.preempt.grace_seconds}s to stop",
        )
    if progress.ready_by is not None:
        consider(Due.PODS_READY, progress.ready_by, f"pods running on {view.cluster} by then")
    return best


def failover_reason(due: Due, cluster: str, tolerance: int | None, evict_reason: str) -> str:
    """Why the job leaves ``cluster`` at a FAILOVER or EVICT deadline."""
    if due == Due.EVICT:
        return f"on {evict_reason}"
    return f"unhealthy on {cluster} for {tolerance or 0}s"


def rewatch_pause(rewatch_seconds: float, deadline: Deadline | None) -> float:
    """The pause after a watch window that ended quietly, cut short by a deadline."""
    if deadline is None:
        return rewatch_seconds
    return min(rewatch_seconds, deadline.timer_seconds)


# ---------------------------------------------------------------------- health


def watch_changed(progress: JobProgress, status: JobStatus) -> bool:
    """The watch returned a change (not the end of a quiet window)."""
    return status.observed != progress.since or not status.observed


def unknown_status(cluster: str, why: str) -> JobStatus:
    """What a failed watch means: the member's state is unknown (like an unreachable
    member, it neither starts nor resets the failover timer)."""
    return JobStatus(
        cluster=cluster,
        health="Unknown",
        phase="Unknown",
        reason=f"watch failed: {why}",
        observed="watch-failed",
    )


def observe(
    progress: JobProgress, status: JobStatus, now: datetime, *, tolerance: int | None = None
) -> list[Notice]:
    """Take in a watch's status: pods, the copy's creation time, unreachable members,
    taint eviction (announced when scheduled, and when called off), the failover timer
    (started by Unhealthy, reset by Healthy, untouched by Unknown) and the state shown
    (``Unhealthy`` through the failover policy's ``tolerance``, saying until when)."""
    view = progress.view
    notices: list[Notice] = []
    progress.since = status.observed
    view.pods = [p.model_dump() for p in status.pods]
    if status.created_at is not None:
        view.copy_created[status.cluster] = status.created_at
    if status.health == "Unknown":
        added = [t.time_added for t in status.taints if t.time_added is not None]
        view.unreachable.setdefault(status.cluster, min(added) if added else now)
    else:
        view.unreachable.pop(status.cluster, None)
    if status.health != "Unknown" or status.taints:  # the member's taints are known
        notices += _eviction_news(progress, status)
    if status.health == "Unhealthy":
        if view.unhealthy_since is None:
            view.unhealthy_since = now
            notices.append(
                Announce(
                    "Warning",
                    Reason.UNHEALTHY,
                    f"job unhealthy on {status.cluster}: {status.reason or status.phase}",
                )
            )
    elif status.health == "Healthy":
        if view.unhealthy_since is not None:
            notices.append(
                Announce("Normal", Reason.RECOVERED, f"job healthy again on {status.cluster}")
            )
        view.unhealthy_since = None
    notices.append(_shown_state(view, status, tolerance))
    return notices


def stamp(at: datetime) -> str:
    """A time as events and reasons print it (RFC 3339, UTC, seconds)."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _eviction_news(progress: JobProgress, status: JobStatus) -> list[Notice]:
    """A NoExecute taint's eviction as the member's taints now say: announced when it is
    scheduled (or moved), called off when the taint goes, never said done before it is
    (Karmada's taint manager queues a tolerated binding ``AddAfter`` its toleration
    and evicts only once it runs out: pkg/controllers/cluster/taint_manager.go)."""
    before = progress.evict_at
    progress.evict_at, progress.evict_reason = status.evict_at, status.evict_reason
    at = status.evict_at
    if at is None:
        progress.evict_since = None
        if before is None:
            return []
        return [
            Announce(
                "Normal",
                Reason.TAINT_EVICTION,
                f"{status.cluster}: its NoExecute taint is gone; the eviction due at "
                f"{stamp(before)} is called off",
            )
        ]
    tolerated = status.evict_tolerated
    progress.evict_since = at - timedelta(seconds=tolerated or 0)
    if before == at:
        return []
    return [Announce("Warning", Reason.TAINT_EVICTION, eviction_scheduled_message(status))]


def eviction_scheduled_message(status: JobStatus) -> str:
    """``cluster-a: taint K:NoExecute tolerated for 300s: will evict at T unless it
    recovers``: the event that schedules a taint eviction."""
    assert status.evict_at is not None
    taint = status.evict_taint or "a NoExecute taint"
    if status.evict_tolerated is None and status.evict_taint:
        why = f"taint {taint} is not tolerated"
    elif status.evict_taint:
        why = f"taint {taint} tolerated for {status.evict_tolerated}s"
    else:  # a status of an earlier release: only its reason
        why = status.evict_reason.removeprefix(f"{status.cluster}: ") or taint
    return (
        f"{status.cluster}: {why}: will evict at {stamp(status.evict_at)} unless it recovers"
    )


def unhealthy_reason(view: JobView, status: JobStatus, tolerance: int | None) -> str:
    """What an ``Unhealthy`` job shows: where, since when, why, and when it fails over
    (the failover policy's tolerationSeconds after it turned unhealthy) unless its copy
    recovers first."""
    since = view.unhealthy_since
    why = status.reason or status.phase
    head = f"unhealthy on {status.cluster}"
    if since is not None:
        head += f" since {stamp(since)}"
    if tolerance is None:
        return f"{head}: {why}; no failover.application in its policy"
    if since is None:
        return f"{head}: {why}; fails over after tolerationSeconds {tolerance}"
    at = since + timedelta(seconds=tolerance)
    return f"{head}: {why}; fails over at {stamp(at)} unless it recovers"


def _shown_state(
    view: JobView, status: JobStatus, tolerance: int | None = None
) -> Transition | Refresh:
    if status.health == "Unhealthy" and (
        status.phase in ("Running", "Created", MISSING_PHASE)
        or (status.phase == "Failed" and tolerance is not None)  # else judge ends the job
    ):
        return Transition("Unhealthy", unhealthy_reason(view, status, tolerance))
    if status.phase in ("Running", "Created") and status.health != "Unknown":
        state: JobState = "Running" if status.phase == "Running" else "Created"
        reason = status.reason or f"{status.phase.lower()} on {status.cluster}"
        return Transition(state, reason)
    if status.health == "Unknown":
        return Transition(view.state, status.reason or f"{status.cluster}: unreachable")
    return Refresh()


@dataclass(frozen=True)
class Judgement:
    """What a watch's status (already observed) asks of the workflow, in this order."""

    #: the job is over (Succeeded, or Failed without a failover policy)
    ending: Transition | None = None
    #: purgeMode Gracefully: the new copy is healthy, the old one goes now
    purge_graceful_old: bool = False
    #: fail over at once (tolerationSeconds 0 and unhealthy)
    fail_over_now: bool = False


def judge(
    progress: JobProgress, status: JobStatus, *, tolerance: int | None, failover: bool
) -> Judgement:
    cluster = status.cluster
    if status.phase == "Succeeded":
        return Judgement(ending=Transition("Succeeded", f"completed on {cluster}"))
    if status.phase == "Failed" and not failover:
        return Judgement(ending=Transition("Failed", status.reason or f"failed on {cluster}"))
    return Judgement(
        purge_graceful_old=bool(progress.graceful_old)
        and status.health == "Healthy"
        and status.phase == "Running",
        fail_over_now=tolerance == 0 and progress.view.unhealthy_since is not None,
    )


# ---------------------------------------------------------------------- failover


class OldCopy(StrEnum):
    """What a failover does with the copy on the member it leaves."""

    CONFIRM_GONE = "confirm-gone"  # Directly + fleetq.io/fencing Strict
    PURGE_FIRST = "purge-first"  # Directly: purged (or deferred) before placing again
    PURGE_LATER = "purge-later"  # Gracefully: once the new copy is healthy, or grace ends
    KEEP = "keep"  # Never


@dataclass(frozen=True)
class FailoverPlan:
    mode: PurgeMode
    #: purgeMode as the policy spells it (``Immediately`` stays ``Immediately``)
    mode_name: str
    old_copy: OldCopy
    grace_seconds: int

    def started_message(self, why: str) -> str:
        return f"job {why}; purgeMode {self.mode_name}"

    def evicted_message(
        self, old: str, *, after: float | None = None, deferred: bool = False
    ) -> str:
        """The ``Evicted`` event, recorded once the eviction is done: from where, after
        how long (unhealthy, or tainted), and what became of the old copy as it stands
        now: a purge that was deferred is said to be pending, never done."""
        head = f"evicted from {old}" + ("" if after is None else f" after {after:.0f}s")
        if self.old_copy == OldCopy.CONFIRM_GONE:
            return (
                f"{head}; old copy confirmed gone before rescheduling "
                "(fleetq.io/fencing: Strict)"
            )
        if self.old_copy == OldCopy.PURGE_FIRST:
            if deferred:
                return (
                    f"{head}; old copy not purged yet: {old} did not answer, it is purged "
                    "as soon as it does"
                )
            return f"{head}; old copy purged first"
        if self.old_copy == OldCopy.PURGE_LATER:
            return (
                f"{head}; old copy purged once the new one is healthy "
                f"or after {self.grace_seconds}s"
            )
        return f"{head}; old copy kept (purgeMode {self.mode_name})"


def failover_plan(
    fo: ApplicationFailover | None,
    *,
    strict_fencing: bool,
    cluster: ClusterFailover | None = None,
) -> FailoverPlan:
    """purgeMode semantics; a job without a failover policy (evicted by a taint) purges
    its old copy directly. ``cluster``: the policy's ``failover.cluster`` when the job
    leaves a failed cluster (a NoExecute taint outlasted its toleration): its purgeMode
    decides then, as Karmada's taint manager uses ``failover.cluster`` when set and the
    controller's ``--no-execute-taint-eviction-purge-mode`` otherwise (here: the
    application failover's, else Directly); Gracefully keeps the old copy for the
    controller's ``--graceful-eviction-timeout`` (10m)."""
    if cluster is not None:
        graceful = cluster.purgeMode == "Gracefully"
        return FailoverPlan(
            mode=PurgeMode.GRACEFULLY if graceful else PurgeMode.DIRECTLY,
            mode_name=cluster.purgeMode,
            old_copy=OldCopy.PURGE_LATER if graceful else (
                OldCopy.CONFIRM_GONE if strict_fencing else OldCopy.PURGE_FIRST
            ),
            grace_seconds=DEFAULT_GRACE_SECONDS,
        )
    mode = fo.purgeMode if fo else PurgeMode.DIRECTLY
    if mode == PurgeMode.DIRECTLY:
        old_copy = OldCopy.CONFIRM_GONE if strict_fencing else OldCopy.PURGE_FIRST
    elif mode == PurgeMode.GRACEFULLY:
        old_copy = OldCopy.PURGE_LATER
    else:
        old_copy = OldCopy.KEEP
    return FailoverPlan(
        mode=mode,
        mode_name=fo.purge_mode_name if fo else "Immediately",
        old_copy=old_copy,
        grace_seconds=fo.grace_seconds if fo else DEFAULT_GRACE_SECONDS,
    )


def evicted_after(progress: JobProgress, now: datetime, *, taint: bool) -> float | None:
    """How long the job had been on notice when it is evicted (before ``leave_cluster``):
    unhealthy (an application failover) or under its NoExecute taint (a taint
    eviction); None when not known."""
    since = progress.evict_since if taint else progress.view.unhealthy_since
    if since is None:
        return None
    return max(0.0, (now - since).total_seconds())


def purge_deferred(view: JobView, old: str) -> bool:
    """After a purge of the old copy on ``old`` was asked for: it was not done (its
    member did not answer; ``PurgeDeferred`` was said and a purger waits for it), so no
    event may say it was purged."""
    return old in view.pending_purges


def leave_cluster(progress: JobProgress, old: str) -> None:
    """The job is evicted from ``old``: no cluster, no health timer, no eviction."""
    view = progress.view
    view.evicted.append(old)
    view.cluster = None
    view.unhealthy_since = None
    progress.evict_at, progress.evict_reason, progress.evict_since = None, "", None
    progress.since = ""
    progress.ready_by = None  # the next bind arms it again


def keep_old_copy(progress: JobProgress, old: str, plan: FailoverPlan, now: datetime) -> None:
    """The old copy's bookkeeping for the plans that do not purge it first."""
    view = progress.view
    if plan.old_copy == OldCopy.PURGE_LATER:
        progress.graceful_old = old
        progress.grace_deadline = now + timedelta(seconds=plan.grace_seconds)
    elif plan.old_copy == OldCopy.KEEP and old in view.copies:
        view.copies.remove(old)


# ---------------------------------------------------------------------- placement


def candidates(verdict: PlacementVerdict, progress: JobProgress | None = None) -> list[Candidate]:
    """The ranked candidates one placement round tries, best first (the planned cluster
    of an outstanding capacity preemption first)."""
    ranked = (
        verdict.candidates if progress is None else placement_order(verdict.candidates, progress)
    )
    return ranked[:MAX_CANDIDATES]


def unplaceable_reason(verdict: PlacementVerdict) -> str | None:
    """Why the job can never be placed (no member is eligible at all), else None."""
    if not verdict.candidates and not verdict.eligible:
        return "no member cluster is eligible: " + verdict.reason()
    return None


def no_room(verdict: PlacementVerdict) -> bool:
    """Some member is eligible but none has room for the gang right now."""
    return not verdict.candidates and bool(verdict.eligible)


def pending_reason(rejections: dict[str, str]) -> str:
    """Why the job waits for room: every member's rejection, in cluster order."""
    return "; ".join(f"{c}: {r}" for c, r in sorted(rejections.items())) or (
        "no member cluster has room"
    )


def placement_pause(delay: float, deadline_at: datetime | None, now: datetime) -> float:
    """The pause before the next placement round: the backoff, cut at the active
    deadline (acted on at the next round)."""
    if deadline_at is None:
        return delay
    left = (deadline_at - now).total_seconds()
    return max(MIN_TIMER_SECONDS, min(delay, left))


def record_bind(
    progress: JobProgress,
    cluster: str,
    rejections: dict[str, str],
    now: datetime,
    group: str = "",
) -> None:
    """The job is bound on ``cluster``, in clusterAffinities ``group`` if any (a capacity
    preemption it carried out is over)."""
    view = progress.view
    progress.capacity = None
    view.cluster = cluster
    view.cluster_group = group
    progress.synced_status = {}
    if cluster not in view.copies:
        view.copies.append(cluster)
    view.bound_at = now
    view.rejections = rejections
    progress.since = FIRST_WATCH_SINCE


def sync_status(progress: JobProgress, status: JobStatus) -> None:
    """Keep the current copy's status as last read (an unreadable copy keeps the last)."""
    if status.status and status.cluster == progress.view.cluster:
        progress.synced_status = dict(status.status)


def group_note(group: str) -> str:
    """The binding event's tail naming the clusterAffinities group (none without)."""
    return f" (clusterAffinities group {group})" if group else ""


# ---------------------------------------------------------------------- runPolicy


def deadline_to_arm(view: JobView, active_deadline_seconds: int | None) -> bool:
    """runPolicy.activeDeadlineSeconds counts from the first bind (again from the first
    bind after a suspension, as the operator resets startTime on resume)."""
    return active_deadline_seconds is not None and view.deadline_at is None


def deadline_at(active_deadline_seconds: int, now: datetime) -> datetime:
    return now + timedelta(seconds=max(0, active_deadline_seconds))


def deadline_passed(view: JobView, now: datetime) -> bool:
    return view.deadline_at is not None and now >= view.deadline_at


def deadline_exceeded_reason(active_deadline_seconds: int | None) -> str:
    return (
        "DeadlineExceeded: active longer than runPolicy.activeDeadlineSeconds "
        f"{active_deadline_seconds}"
    )


def suspended_message(had_copy: bool) -> str:
    return "suspended: copies purged, quota released" if had_copy else "suspended"


class Suspension(BaseModel):
    """runPolicy.suspend and the suspend / resume signals: what was asked for and not yet
    carried out. A resume before the suspension was carried out cancels it; a resume of a
    job that is not suspended, or a suspension of a finished one, changes nothing."""

    #: a suspension asked for and not yet carried out
    wanted: bool = False
    #: the job is suspending or suspended
    active: bool = False
    #: a resume asked for while suspended
    resume_wanted: bool = False

    def ask_suspend(self, state: JobState) -> None:
        if state not in TERMINAL_STATES and state != "Suspended":
            self.wanted = True
            self.resume_wanted = False

    def ask_resume(self) -> None:
        if self.wanted:  # not carried out yet: forget it
            self.wanted = False
        elif self.active:
            self.resume_wanted = True

    def begin(self) -> None:
        self.wanted, self.active = False, True

    def end(self) -> None:
        self.resume_wanted, self.active = False, False


# ---------------------------------------------------------------------- the run


def continue_as_new_due(history_length: int, suggested: bool) -> bool:
    """Whether the run hands its progress to a new run (bounded history)."""
    return history_length > MAX_HISTORY_EVENTS or suggested


def policy_refusal(policy_namespace: str, policy_name: str, job_namespace: str,
                   *, cluster_scoped: bool = False) -> str | None:
    """Why a PropagationPolicy given with the job can never apply to it, else None."""
    if cluster_scoped or policy_namespace == job_namespace:
        return None
    return (
        f"PropagationPolicy {policy_namespace}/{policy_name}: metadata.namespace must be "
        f"the job's namespace {job_namespace}"
    )


def quota_return(granted: bool) -> Literal["release", "cancel"]:
    """How a job gives its quota back: release what was granted, else leave the queue."""
    return "release" if granted else "cancel"


# ---------------------------------------------------------------------- preemption


def _display(job_id: str) -> str:
    """``pytorchjob/default/big`` -> ``default/big``."""
    parts = job_id.split("/")
    return "/".join(parts[1:]) if len(parts) >= 3 else job_id


def take_preemption(
    progress: JobProgress, signal: PreemptSignal, *, holding: bool, now: datetime
) -> list[Notice]:
    """The quota workflow preempts the job. Only a job that holds quota (``holding``:
    it has its grant) and is not over can be preempted; a second signal while the first
    is being carried out changes nothing. The grace period starts now."""
    view = progress.view
    if not holding or view.state in TERMINAL_STATES or progress.preempt is not None:
        return []
    progress.preempt = signal
    progress.preempt_at = now + timedelta(seconds=signal.grace_seconds)
    by = _display(signal.preemptor)
    stop = (
        f"stopping within {signal.grace_seconds}s"
        if view.cluster is not None
        else "nothing bound: queued again now"
    )
    return [
        Announce("Warning", Reason.PREEMPTED, f"preempted by {by}: {signal.message}; {stop}"),
        Transition(view.state, f"preempted by {by} ({signal.message}); {stop}"),
    ]


def preemption_due(progress: JobProgress, now: datetime) -> bool:
    """Whether a preemption is to be carried out now: at once when no copy is bound,
    else once its grace period has ended (watching goes on until then: the job may
    finish first)."""
    if progress.preempt is None:
        return False
    if progress.view.cluster is None or progress.preempt_at is None:
        return True
    return now >= progress.preempt_at


def requeue_after_preemption(progress: JobProgress) -> list[Notice]:
    """The preempted job's copies are purged and its quota released: it holds nothing,
    is bound nowhere and waits in its queue again (with its original submit time)."""
    signal = progress.preempt
    forget_placement(progress)
    progress.preempt, progress.preempt_at = None, None
    view = progress.view
    view.admitted, view.queue = False, None
    by = _display(signal.preemptor) if signal is not None else "the quota workflow"
    return [Transition("Queued", f"preempted by {by}; {requeued_text(view.created_at)}")]


def requeued_text(submitted: datetime | None) -> str:
    """What a preempted job's ``Queued`` transition says of its place in the queue: it
    is back with its original submit time (issue 24), named when known."""
    if submitted is None:
        return "queued again with its original submit time"
    stamp = submitted.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"queued again with its original submit time {stamp}"


# ---------------------------------------------------------------------- capacity preemption

#: a capacity preemption is dropped when its victims have not made room this long after
#: the longest grace period among them (purging a copy takes seconds)
CAPACITY_MARGIN_SECONDS = 60


class CapacityHold(BaseModel):
    """A capacity preemption the job carries out: its victims on ``plan.cluster`` were
    told to stop; the job places again once they are gone, the planned cluster first.
    While it is outstanding no other is planned (never preempt on two clusters for one
    job); past ``deadline`` it is dropped (``dropped``: none other for this placement)."""

    plan: CapacityPlanned
    deadline: datetime
    #: victims still running on the planned cluster, as the last placement round saw
    left: list[str]
    dropped: bool = False

    @property
    def outstanding(self) -> bool:
        return not self.dropped


def capacity_bound_seconds(plan: CapacityPlanned) -> int:
    """How long a plan may take: the longest victim grace period plus a margin."""
    return max((v.grace_seconds for v in plan.victims), default=0) + CAPACITY_MARGIN_SECONDS


def may_plan_capacity(progress: JobProgress) -> bool:
    """A capacity preemption may be planned: none is outstanding, and none was dropped
    since the job last left a cluster or queued again."""
    return progress.capacity is None


def planned_capacity(progress: JobProgress) -> CapacityPlanned | None:
    """The outstanding plan, for the placement activity (which victims are left)."""
    hold = progress.capacity
    return hold.plan if hold is not None and hold.outstanding else None


def _victims_line(job_ids: list[str]) -> str:
    return ", ".join(_display(j) for j in job_ids)


def capacity_waiting_reason(hold: CapacityHold) -> str:
    """What the job shows while its victims stop (``fleetq describe``'s reason)."""
    cluster = hold.plan.cluster
    if not hold.left:
        return f"preempted jobs left {cluster}; placing there as soon as it has room"
    n = len(hold.left)
    return (
        f"waiting for {n} preempted job{'s' if n != 1 else ''} to leave {cluster}: "
        f"{_victims_line(hold.left)}"
    )


def start_capacity_preemption(
    progress: JobProgress, plan: CapacityPlanned, now: datetime
) -> list[Notice]:
    """Record ``plan`` (the caller then tells each victim to stop) and say so."""
    bound = capacity_bound_seconds(plan)
    hold = CapacityHold(
        plan=plan,
        deadline=now + timedelta(seconds=bound),
        left=[v.job_id for v in plan.victims],
    )
    progress.capacity = hold
    n = len(plan.victims)
    why = plan.victims[0].message if plan.victims else f"room on {plan.cluster}"
    return [
        Announce(
            "Normal",
            Reason.PREEMPTING,
            f"no member has room: preempting {n} lower-priority job{'s' if n != 1 else ''} "
            f"on {plan.cluster} ({why}): {_victims_line(hold.left)}; dropped after {bound}s",
        ),
        Transition("Pending", capacity_waiting_reason(hold)),
    ]


def victims_gone(progress: JobProgress, job_ids: list[str]) -> None:
    """Victims that will not be waited for (their workflow is gone)."""
    hold = progress.capacity
    if hold is not None:
        hold.left = [j for j in hold.left if j not in job_ids]


def observe_capacity(
    progress: JobProgress, verdict: PlacementVerdict, now: datetime
) -> list[Notice]:
    """Take in a placement round while a plan is outstanding: the victims still on its
    cluster; past its deadline with no room there, drop it (placement goes on as
    usual; no other plan for this placement)."""
    hold = progress.capacity
    if hold is None or not hold.outstanding:
        return []
    hold.left = [j for j in hold.left if j in verdict.victims_left]
    if now < hold.deadline or any(c.cluster == hold.plan.cluster for c in verdict.candidates):
        return []
    hold.dropped = True
    bound = capacity_bound_seconds(hold.plan)
    still = (
        f"{len(hold.left)} preempted job(s) still there after {bound}s"
        if hold.left
        else f"still no room there {bound}s after its preempted jobs were told to stop"
    )
    return [
        Announce(
            "Warning",
            Reason.PREEMPTION_DROPPED,
            f"capacity preemption on {hold.plan.cluster} dropped: {still}; placing as usual",
        )
    ]


def placement_order(candidates: list[Candidate], progress: JobProgress) -> list[Candidate]:
    """The candidates to try, the planned cluster of an outstanding plan first."""
    hold = progress.capacity
    if hold is None or not hold.outstanding:
        return candidates
    return sorted(candidates, key=lambda c: c.cluster != hold.plan.cluster)


def capacity_pause(pause: float, progress: JobProgress, now: datetime) -> float:
    """The placement pause, cut at an outstanding plan's deadline (a victim that has
    stopped wakes the job before: ``retry_placement``)."""
    hold = progress.capacity
    if hold is None or not hold.outstanding:
        return pause
    left = (hold.deadline - now).total_seconds()
    return max(MIN_TIMER_SECONDS, min(pause, left))


# ---------------------------------------------------------------------- never / not now

#: an Unschedulable job is placed again when a member's nodes change (the worker's
#: capacity caches wake it with ``retry_placement``) and at least this often (a worker
#: restart forgets whom to wake)
UNSCHEDULABLE_BACKSTOP_SECONDS = 600.0


def unschedulable(progress: JobProgress, verdict: PlacementVerdict) -> list[Notice]:
    """No member could ever hold the gang (``verdict.never``): the job gives its quota
    back (the caller releases it) and waits ``Unschedulable`` for a member's nodes to
    change; [] when some member could (waiting for room helps)."""
    if verdict.candidates or not verdict.never:
        return []
    view = progress.view
    view.admitted, view.queue = False, None
    progress.admitted_at = None
    progress.capacity = None
    return [
        Announce("Warning", Reason.UNSCHEDULABLE, verdict.never),
        Transition(
            "Unschedulable",
            f"{verdict.never}; holds no quota, placed again when a member's nodes change",
        ),
    ]


def unparked(progress: JobProgress, *, queued: bool) -> list[Notice]:
    """An Unschedulable job may fit now (a member's nodes changed): it queues again with
    its original submit time (or places at once under a policy that does not queue)."""
    return [
        Announce(
            "Normal",
            Reason.REQUEUED,
            "a member's nodes changed and the gang may fit: "
            + ("queued again (original submit time)" if queued else "placing again"),
        ),
        Transition("Queued" if queued else "Scheduling", "a member's nodes changed"),
    ]


# ---------------------------------------------------------------------- re-queue with backoff


class RequeueCause(StrEnum):
    """Why an admitted job gives its quota back and queues again (Kueue's eviction
    reason ``PodsReadyTimeout``; Kube Queue's re-enqueue of long-pending jobs)."""

    PLACEMENT_TIMEOUT = "PlacementTimeout"
    PODS_READY_TIMEOUT = "PodsReadyTimeout"


def admitted_now(progress: JobProgress, now: datetime) -> None:
    """A new admission began (the placement timeout counts from here)."""
    progress.admitted_at = now
    progress.requeue_at = None


def placement_timeout_at(progress: JobProgress, settings: RequeueSettings) -> datetime | None:
    """When an admitted job not placed by then gives its quota back, or None."""
    seconds = settings.placementTimeoutSeconds
    if seconds is None or progress.admitted_at is None or progress.view.cluster is not None:
        return None
    return progress.admitted_at + timedelta(seconds=seconds)


def placement_timed_out(progress: JobProgress, settings: RequeueSettings, now: datetime) -> bool:
    at = placement_timeout_at(progress, settings)
    return at is not None and now >= at


def arm_pods_ready(progress: JobProgress, settings: RequeueSettings, now: datetime) -> None:
    """At a bind: the pods must all run within podsReadyTimeoutSeconds (None: no bound).
    The placement timeout is over: the job is placed."""
    seconds = settings.podsReadyTimeoutSeconds
    progress.ready_by = None if seconds is None else now + timedelta(seconds=seconds)
    progress.admitted_at = None


def pods_ready(status: JobStatus, expected: int) -> bool:
    """The bound gang runs: the job is Running (or done) with at least ``expected`` pods
    running (or done), as Kueue's PodsReady condition asks of a workload."""
    if status.phase == "Succeeded":
        return True
    if status.phase != "Running":
        return False
    if not status.pods:  # a member that lists no pods: its job's phase is all we know
        return True
    up = sum(1 for p in status.pods if p.phase in ("Running", "Succeeded"))
    return up >= expected


def pods_ready_seen(progress: JobProgress, status: JobStatus, expected: int) -> None:
    """Take in a watch's status: once the gang runs, the pods-ready bound is met (for
    this bind; a failover's new bind arms it again)."""
    if progress.ready_by is not None and pods_ready(status, expected):
        progress.ready_by = None


def _secs(value: float | None) -> str:
    return "off" if value is None else f"{value:g}"


def requeue_after_timeout(
    progress: JobProgress,
    settings: RequeueSettings,
    cause: RequeueCause,
    now: datetime,
    *,
    cluster: str | None = None,
) -> list[Notice]:
    """The job timed out (``cause``), its copies are purged and its quota released by
    the caller: it queues again with its original submit time after a backoff
    (``requeue_at``), or, past ``requeueLimit`` re-queues, ends Failed."""
    progress.requeues += 1
    n = progress.requeues
    if cause == RequeueCause.PLACEMENT_TIMEOUT:
        seconds = _secs(settings.placementTimeoutSeconds)
        what = f"not placed within placementTimeoutSeconds {seconds}"
        reason = Reason.PLACEMENT_TIMEOUT
    else:
        where = f" on {cluster}" if cluster else ""
        what = (
            f"pods not all running{where} within podsReadyTimeoutSeconds "
            f"{_secs(settings.podsReadyTimeoutSeconds)}"
        )
        reason = Reason.PODS_READY_TIMEOUT
    forget_placement(progress)
    progress.ready_by, progress.admitted_at = None, None
    view = progress.view
    view.admitted, view.queue = False, None
    limit = settings.requeueLimit
    if limit is not None and n > limit:
        progress.requeue_at = None
        why = f"{cause.value}: {what}; re-queued {limit} time{'s' if limit != 1 else ''} " \
            f"already (requeueLimit {limit})"
        return [
            Announce("Warning", Reason.REQUEUE_LIMIT_EXCEEDED, why),
            Transition("Failed", why),
        ]
    delay = settings.backoff_seconds(n)
    progress.requeue_at = now + timedelta(seconds=delay)
    of = f" of {limit}" if limit is not None else ""
    return [
        Announce(
            "Warning",
            reason,
            f"{what}: quota given back; queued again in {delay:g}s "
            f"(re-queue {n}{of}, original submit time)",
        ),
        Transition(
            "Queued",
            f"backing off after {cause.value} (re-queue {n}{of}): queued again at "
            f"{progress.requeue_at.isoformat(timespec='seconds')}",
        ),
    ]


def placement_timeout_pause(
    pause: float, progress: JobProgress, settings: RequeueSettings, now: datetime
) -> float:
    """The placement pause, cut at the placement timeout (acted on at the next round)."""
    at = placement_timeout_at(progress, settings)
    if at is None:
        return pause
    return max(MIN_TIMER_SECONDS, min(pause, (at - now).total_seconds()))


def pods_ready_met(progress: JobProgress, expected: int) -> bool:
    """At the pods-ready deadline: whether the last status seen already shows the gang
    running (a watch that had not returned yet); the bound is then met, not missed."""
    view = progress.view
    up = sum(1 for p in view.pods if p.get("phase") in ("Running", "Succeeded"))
    if view.state == "Running" and (up >= expected or not view.pods):
        progress.ready_by = None
        return True
    return False


def backoff_left(progress: JobProgress, now: datetime) -> float:
    """Seconds left of the backoff before queueing again (0 when none or over)."""
    if progress.requeue_at is None:
        return 0.0
    return max(0.0, (progress.requeue_at - now).total_seconds())


def backoff_over(progress: JobProgress) -> list[Notice]:
    """The backoff ended: the job queues again (the caller enqueues it)."""
    progress.requeue_at = None
    return [
        Announce("Normal", Reason.REQUEUED, "backoff over: queued again (original submit time)")
    ]


# ---------------------------------------------------------------------- copies


def copies_to_purge(progress: JobProgress, *, current: bool = True) -> list[str]:
    """Every member holding (or maybe holding) a copy of the job, once each: the current
    one (with ``current``), those left behind, those pending a purge, the graceful old."""
    view = progress.view
    return list(
        dict.fromkeys(
            ([view.cluster] if current and view.cluster else [])
            + view.copies
            + view.pending_purges
            + ([progress.graceful_old] if progress.graceful_old else [])
        )
    )


def forget_copy(view: JobView, cluster: str) -> None:
    """``cluster``'s copy is gone."""
    if cluster in view.pending_purges:
        view.pending_purges.remove(cluster)
    if cluster in view.copies:
        view.copies.remove(cluster)
    view.copy_created.pop(cluster, None)


def forget_placement(progress: JobProgress) -> None:
    """A suspension purged every copy: nothing bound, nothing watched, no deadline."""
    view = progress.view
    view.cluster, view.pods, view.unhealthy_since = None, [], None
    view.deadline_at = None
    progress.evict_at, progress.evict_reason, progress.since = None, "", ""
    progress.evict_since = None
    held = set(view.copies) | set(view.pending_purges)
    view.copy_created = {c: t for c, t in view.copy_created.items() if c in held}
    progress.capacity = None
    progress.ready_by = None


# ---------------------------------------------------------------------- what a job shows


def record_event(
    view: JobView, kind: EventType, reason: Reason | str, message: str, now: datetime
) -> None:
    """Append an event; a repeat of any kept event with the same type, reason and
    message counts that one up instead and moves it last (client-go's EventCorrelator
    dedups by that key, tools/record/events_cache.go ``getEventKey``; kubectl describe
    shows it ``(x7 over 21m)``). Only the last MAX_EVENTS are kept."""
    reason = str(reason)
    events = view.events
    for i in range(len(events) - 1, -1, -1):
        e = events[i]
        if e.reason == reason and e.message == message and e.type == kind:
            if e.first_time is None:
                e.first_time = e.time
            e.count += 1
            e.time = now
            if i != len(events) - 1:
                events.append(events.pop(i))
            break
    else:
        events.append(JobEvent(type=kind, reason=reason, message=message, time=now))
    del events[:-MAX_EVENTS]


def details_markdown(view: JobView) -> str:
    """The workflow's current details (Markdown, shown by the Temporal UI): state and
    reason, then a list (the UI draws lists with their bullets; tables need
    :func:`~fleetq.admission.markdown_row`). Free text goes through
    :func:`~fleetq.admission.ui_text`: ``max-jobs 1/1`` is no fraction."""
    last = view.events[-1] if view.events else None
    lines = [
        f"**{view.state}** — {ui_text(view.reason)}" if view.reason else f"**{view.state}**",
        "",
        f"- cluster: `{view.cluster or '-'}`",
        f"- queue: `{view.queue or ('waiting' if view.queued and not view.admitted else '-')}`",
        f"- priority: {view.priority}",
    ]
    if view.evicted:
        lines.append(f"- evicted from: {', '.join(view.evicted)}")
    if view.pending_purges:
        lines.append(f"- purge pending on: {', '.join(view.pending_purges)}")
    if last is not None:
        lines.append(f"- last event: {last.reason}: {ui_text(last.message)}")
    return "\n".join(lines)


def search_attributes(view: JobView) -> dict[str, str | int]:
    """fleetq's search attributes of the job (``fleetq list`` filters on them)."""
    return {
        SA_STATE: view.state,
        SA_CLUSTER: view.cluster or "",
        SA_QUEUE: view.queue or "",
        SA_JOB: f"{view.namespace}/{view.name}",
        SA_NAMESPACE: view.namespace,
        SA_PRIORITY: view.priority,
    }


def search_attribute_changes(
    view: JobView, last: dict[str, Any], *, flush: bool = False
) -> dict[str, str | int]:
    """The search attributes to upsert, given those set already (``last``): none in a
    transient state, none in a settling one unless ``flush``; an empty keyword never set
    is the same as unset."""
    if view.state in TRANSIENT_STATES or (view.state in SETTLING_STATES and not flush):
        return {}
    return {
        k: v
        for k, v in search_attributes(view).items()
        if last.get(k) != v and not (v == "" and k not in last)
    }


def settling(view: JobView, last: dict[str, Any]) -> bool:
    """The job is in a state published only once it lasts, and not published yet."""
    return view.state in SETTLING_STATES and last.get(SA_STATE) != view.state


# JobProgress names CapacityHold, defined below it: completed here, at import, not on
# first use (see fleetq.messages)
JobProgress.model_rebuild()
