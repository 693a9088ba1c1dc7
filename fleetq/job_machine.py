"""A job's life as pure decisions: which phase comes next (``next_phase``), the bound
job's watch as a transition function, ``step(progress, event, now, watching) ->
(progress, commands)``, and the placement phase as another (``Placing.step``, each
round's candidates tried by ``round_step``).

While a job is bound, everything that happens to it is one ``Event`` (a watch's
``Status``, a deadline's ``Timer``, a ``Suspend``, a ``Preempt`` signal, a deferred
purge ``PurgerDone``); ``step`` decides, on a copy of the run's ``JobProgress`` (the
one it is given is never changed), what the workflow must carry out, as ``Command``
values in order. The workflow only waits for the next event and carries the commands
out, so whole job lives run in plain tests (no server). The rules themselves are
``fleetq.lifecycle``'s; the admission wait is ``fleetq.job_queue``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import Enum

from fleetq import lifecycle
from fleetq.fleet_config import RequeueSettings
from fleetq.lifecycle import Announce, Deadline, Due, JobProgress, Pause, Reason, Show, Transition
from fleetq.messages import (
    TERMINAL_STATES,
    Candidate,
    CapacityPlanned,
    JobStatus,
    PlacementVerdict,
)
from fleetq.rejection import RejectionCode


class Supervision(Enum):
    """How watching the bound copy ended."""

    DONE = "done"  # the job ended (its state says how)
    FAILOVER = "failover"  # it left its member; placed again (or not) already
    SUSPEND = "suspend"  # a suspension was asked for
    CONTINUE = "continue"  # the history is long: continue-as-new
    PREEMPT = "preempt"  # preempted: its grace period ended
    REQUEUE = "requeue"  # its pods did not all run within podsReadyTimeoutSeconds


@dataclass(frozen=True)
class Watching:
    """What the bound job is watched under: its policy's failover and its manifest."""

    #: applicationFailover tolerationSeconds (None: no tolerance, or no failover)
    tolerance: int | None
    #: the policy has an applicationFailover (a Failed copy fails over, not the job)
    failover: bool
    #: the gang's pod count (pods-ready bound)
    pods: int
    active_deadline_seconds: int | None = None
    #: the pause after a watch window that ended quietly
    rewatch_seconds: float = 0.0


# ---------------------------------------------------------------------- events


@dataclass(frozen=True)
class Status:
    """A watch returned (``settling``: it was the short window after the bind)."""

    status: JobStatus
    settling: bool = False


@dataclass(frozen=True)
class Timer:
    """The deadline ``due`` (``next_deadline``) fired."""

    due: Due


@dataclass(frozen=True)
class Suspend:
    """A suspension was asked for (runPolicy.suspend, the ``suspend`` signal)."""


@dataclass(frozen=True)
class Preempt:
    """A ``preempt`` signal was taken: the deadline waited for may be nearer now."""


@dataclass(frozen=True)
class PurgerDone:
    """A copy left on a member that came back was purged."""


Event = Status | Timer | Suspend | Preempt | PurgerDone


# ---------------------------------------------------------------------- commands


@dataclass(frozen=True)
class FlushSettled:
    """Publish the search attributes held back while the bind settled, if still held."""


@dataclass(frozen=True)
class PurgeGracefulOld:
    """purgeMode Gracefully: purge the old copy now."""

    why: str


@dataclass(frozen=True)
class RetryPending:
    """Start purgers for copies waiting to be purged that have none."""


@dataclass(frozen=True)
class Failover:
    """Leave ``cluster`` (``why``) and place elsewhere; ``cluster_failure``: a NoExecute
    taint outlasted its toleration (clusterFailover)."""

    cluster: str
    why: str
    cluster_failure: bool = False


@dataclass(frozen=True)
class DeadlineExceeded:
    """runPolicy.activeDeadlineSeconds passed: purge every copy, end Failed."""


@dataclass(frozen=True)
class Rewatch:
    """Pause on a durable timer before the next watch window (``rewatch_pause``)."""


@dataclass(frozen=True)
class CollectPurgers:
    """Take in the purgers that finished."""


@dataclass(frozen=True)
class ContinueIfLong:
    """End the watch with ``Supervision.CONTINUE`` when the history is long."""


@dataclass(frozen=True)
class End:
    """Watching ends: ``outcome`` says how."""

    outcome: Supervision


Command = (
    Show
    | FlushSettled
    | PurgeGracefulOld
    | RetryPending
    | Failover
    | DeadlineExceeded
    | Rewatch
    | CollectPurgers
    | ContinueIfLong
    | End
)


# ---------------------------------------------------------------------- the function


def next_deadline(progress: JobProgress, watching: Watching, now: datetime) -> Deadline | None:
    """The deadline the watch waits for (a ``Timer`` event when it fires)."""
    return lifecycle.next_deadline(
        progress,
        tolerance=watching.tolerance,
        active_deadline_seconds=watching.active_deadline_seconds,
        now=now,
    )


#: how long after its window a watch may still return (scheduling and its answer's way
#: back; its start-to-close timeout allows this much beyond the window)
WATCH_SLACK_SECONDS = 60.0


def arms_timer(deadline: Deadline | None, window_left: float) -> bool:
    """Whether waiting beside a watch that ends by itself within ``window_left`` seconds
    needs a timer for ``deadline``. A deadline beyond the window (and its slack) is met
    by the watch's return, after which the next wait looks at it again: a timer for it
    (the 600 s pods-ready bound beside a 300 s window) would only be started and
    cancelled, two history events per window."""
    return deadline is not None and deadline.seconds <= window_left + WATCH_SLACK_SECONDS


def rewatch_pause(progress: JobProgress, watching: Watching, now: datetime) -> Deadline:
    """How long ``Rewatch`` pauses, and what its timer says (cut short by a deadline)."""
    deadline = next_deadline(progress, watching, now)
    seconds = lifecycle.rewatch_pause(watching.rewatch_seconds, deadline)
    summary = deadline.summary if deadline else (
        f"re-watch {progress.view.name} on {progress.view.cluster}"
    )
    return Deadline(deadline.due if deadline else Due.FAILOVER, seconds, summary)


def step(
    progress: JobProgress, event: Event, now: datetime, watching: Watching
) -> tuple[JobProgress, list[Command]]:
    """The bound job's next progress and what to carry out for ``event`` at ``now``."""
    progress = progress.model_copy(deep=True)
    if isinstance(event, Status):
        return progress, _on_status(progress, event, now, watching)
    if isinstance(event, Timer):
        return progress, _on_timer(progress, event.due, watching)
    if isinstance(event, Suspend):
        return progress, [End(Supervision.SUSPEND)]
    if isinstance(event, PurgerDone):
        return progress, [CollectPurgers()]
    return progress, []  # Preempt: the next wait looks at the deadlines again


def _on_status(
    progress: JobProgress, event: Status, now: datetime, watching: Watching
) -> list[Command]:
    status = event.status
    changed = lifecycle.watch_changed(progress, status)
    lifecycle.sync_status(progress, status)
    commands: list[Command] = [
        Show(tuple(lifecycle.observe(progress, status, now, tolerance=watching.tolerance)))
    ]
    lifecycle.pods_ready_seen(progress, status, watching.pods)
    if event.settling:
        commands.append(FlushSettled())
    verdict = lifecycle.judge(
        progress, status, tolerance=watching.tolerance, failover=watching.failover
    )
    if verdict.ending is not None:
        return [*commands, Show((verdict.ending,)), End(Supervision.DONE)]
    if verdict.purge_graceful_old:
        commands.append(PurgeGracefulOld(f"new copy on {progress.view.cluster} is healthy"))
    commands.append(RetryPending())
    if verdict.fail_over_now:
        cluster = progress.view.cluster or status.cluster
        return [*commands, Failover(cluster, f"unhealthy on {cluster} for 0s"),
                End(Supervision.FAILOVER)]
    if not changed:
        commands.append(Rewatch())
    return [*commands, ContinueIfLong()]


def _on_timer(progress: JobProgress, due: Due, watching: Watching) -> list[Command]:
    cluster = progress.view.cluster or ""
    if due in (Due.FAILOVER, Due.EVICT):
        why = lifecycle.failover_reason(due, cluster, watching.tolerance, progress.evict_reason)
        return [Failover(cluster, why, cluster_failure=due == Due.EVICT),
                End(Supervision.FAILOVER)]
    if due == Due.DEADLINE:
        return [DeadlineExceeded(), End(Supervision.DONE)]
    if due == Due.PREEMPT:
        return [End(Supervision.PREEMPT)]
    if due == Due.PODS_READY:
        if lifecycle.pods_ready_met(progress, watching.pods):
            return []
        return [End(Supervision.REQUEUE)]
    return [PurgeGracefulOld("grace period ended")]


# ---------------------------------------------------------------------- the phases


class Phase(Enum):
    """What the job's life does next (``next_phase``)."""

    FINISH = "finish"  # it ended: purge what is left, give the quota back
    SUSPEND = "suspend"  # a suspension was asked for
    PREEMPTED = "preempted"  # preempted, and its grace period is over (or nothing bound)
    UNSCHEDULABLE = "unschedulable"  # no member could ever hold it: wait for node changes
    ADMIT = "admit"  # queued: wait for its quota workflow's grant
    PLACE = "place"  # admitted (or not queued) and not bound: place, reserve, bind
    WATCH = "watch"  # bound: watch it (``step``)


def next_phase(progress: JobProgress, *, queued: bool, granted: bool, now: datetime) -> Phase:
    """The phase the job's life goes to next, from its progress (with what its signals
    asked for) and whether it queues for quota and holds a grant."""
    view = progress.view
    if view.state in TERMINAL_STATES:
        return Phase.FINISH
    if progress.suspension.wanted:
        return Phase.SUSPEND
    if lifecycle.preemption_due(progress, now):
        return Phase.PREEMPTED
    if view.state == "Unschedulable":
        return Phase.UNSCHEDULABLE
    if queued and not granted:
        return Phase.ADMIT
    if view.cluster is None:
        return Phase.PLACE
    return Phase.WATCH


# ---------------------------------------------------------------------- placing


class Gate(Enum):
    """What the next placement round of an unbound job does (``placement_gate``)."""

    PLACE = "place"  # run it
    DEADLINE = "deadline"  # runPolicy.activeDeadlineSeconds passed: fail the job
    PREEMPTED = "preempted"  # the life carries the preemption out (nothing is bound)
    TIMED_OUT = "timed-out"  # admitted, not placed within placementTimeoutSeconds


def placement_gate(
    progress: JobProgress, *, granted: bool, settings: RequeueSettings, now: datetime
) -> Gate:
    """Whether the next placement round runs, and why not."""
    if lifecycle.deadline_passed(progress.view, now):
        return Gate.DEADLINE
    if progress.preempt is not None:
        return Gate.PREEMPTED
    if granted and lifecycle.placement_timed_out(progress, settings, now):
        return Gate.TIMED_OUT
    return Gate.PLACE


def retry_pause(
    progress: JobProgress,
    delay: float,
    *,
    capacity: bool,
    granted: bool,
    settings: RequeueSettings,
    now: datetime,
) -> float:
    """The pause before the next placement round: the backoff ``delay``, cut short by the
    active deadline, a capacity plan's bound and the placement timeout."""
    pause = lifecycle.placement_pause(delay, progress.view.deadline_at, now)
    if capacity:
        pause = lifecycle.capacity_pause(pause, progress, now)
    if granted:
        pause = lifecycle.placement_timeout_pause(pause, progress, settings, now)
    return pause


@dataclass(frozen=True)
class NextRound:
    """A placement round may start: the phase begins, or the pause after a round ended."""


@dataclass(frozen=True)
class Planned:
    """The round's placement (a local activity) returned ``verdict``."""

    verdict: PlacementVerdict


@dataclass(frozen=True)
class RoundOver:
    """The round over the verdict ended (``placed``: True bound, False never placeable,
    None waiting Pending for the next round)."""

    placed: bool | None


PlacingEvent = NextRound | Planned | RoundOver


@dataclass(frozen=True)
class StopPlacing:
    """No round runs (``gate``): the deadline passed, a preemption, the placement timeout."""

    gate: Gate


@dataclass(frozen=True)
class Plan:
    """Run the round's placement, with the capacity preemption part when ``capacity``;
    then ``Planned``."""

    capacity: bool


@dataclass(frozen=True)
class PlaceRound:
    """Try the verdict's candidates (``start_round`` / ``round_step``); then ``RoundOver``."""

    verdict: PlacementVerdict
    capacity: bool


@dataclass(frozen=True)
class Placed:
    """The phase ends: ``placed`` False when the job can never be placed."""

    placed: bool


PlacingCommand = Show | StopPlacing | Plan | PlaceRound | Pause | Placed


@dataclass
class Placing:
    """The placement phase as a transition function (``step``), and its state across
    rounds: the backoff delay, whether its rounds may consider capacity preemption
    (decided once, at the start of the round after one that found no room: the job
    holds quota from a quota workflow), and whether the last round found no room."""

    delay: float = lifecycle.PLACEMENT_BACKOFF.initial
    capacity: bool | None = None
    no_room: bool = False
    rounds: int = 0

    def step(self, progress: JobProgress, event: PlacingEvent, *, granted: bool,
             settings: RequeueSettings, now: datetime) -> list[PlacingCommand]:
        """What to carry out after ``event``; the last command of each batch but
        ``StopPlacing`` and ``Placed`` yields the next event."""
        if isinstance(event, Planned):
            self.saw(event.verdict)
            return [PlaceRound(event.verdict, bool(self.capacity))]
        if isinstance(event, RoundOver):
            if event.placed is not None:
                return [Placed(event.placed)]
            seconds = self.pause(progress, granted=granted, settings=settings, now=now)
            return [Pause(seconds, f"retry placement in {int(seconds)}s")]  # then NextRound
        if self.rounds and placing_stops(progress):
            return [Placed(True)]  # the life suspends, or is preempted (nothing was bound)
        gate = placement_gate(progress, granted=granted, settings=settings, now=now)
        if gate != Gate.PLACE:
            return [StopPlacing(gate)]
        self.rounds += 1
        return [Show((Transition("Scheduling", "evaluating member clusters"),)),
                Plan(self.round_capacity(progress, granted=granted))]

    def round_capacity(self, progress: JobProgress, *, granted: bool) -> bool:
        """Whether the round starting now asks for capacity preemption too."""
        if self.capacity is None and self.no_room:
            self.capacity = granted and progress.resolution.tree_workflow_id is not None
        return bool(self.capacity)

    def saw(self, verdict: PlacementVerdict) -> None:
        """The round's verdict: did it find no room anywhere?"""
        self.no_room = lifecycle.no_room(verdict)

    def pause(self, progress: JobProgress, *, granted: bool, settings: RequeueSettings,
              now: datetime) -> float:
        """The pause before the next round (``retry_pause``); the backoff doubles."""
        pause = retry_pause(progress, self.delay, capacity=bool(self.capacity), granted=granted,
                            settings=settings, now=now)
        self.delay = lifecycle.PLACEMENT_BACKOFF.after(self.delay)
        return pause


def placing_stops(progress: JobProgress) -> bool:
    """After a placement pause: placing stops (nothing was bound) when a suspension was
    asked for or the job was preempted; the life carries those out."""
    return progress.suspension.wanted or progress.preempt is not None


# ---------------------------------------------------------------------- one placement round


@dataclass
class Round:
    """One placement round: the verdict's candidates, tried in order (``round_step``),
    and why each member did not take the job (``rejections``, with their ``codes``)."""

    verdict: PlacementVerdict
    candidates: list[Candidate]
    rejections: dict[str, str]
    codes: dict[str, RejectionCode]
    tried: int = 0


def start_round(verdict: PlacementVerdict, progress: JobProgress | None = None) -> Round:
    """A round over ``verdict`` (with ``progress``: a capacity preemption's planned
    member first)."""
    return Round(verdict, lifecycle.candidates(verdict, progress), verdict.messages(),
                 verdict.codes())


@dataclass(frozen=True)
class Bound:
    """The write on ``cluster`` bound the job."""

    cluster: str


@dataclass(frozen=True)
class BindFailed:
    """The write on ``cluster`` failed (``message``); ``reserved``: the member reserves,
    so reservations may be left."""

    cluster: str
    message: str
    reserved: bool = False


@dataclass(frozen=True)
class ReservationLost:
    """The member on ``cluster`` could not hold the gang's reservations (``reason``)."""

    cluster: str
    reason: str


RoundEvent = Bound | BindFailed | ReservationLost


@dataclass(frozen=True)
class BindOn:
    """Reserve (where the member reserves) and bind on ``candidate``."""

    candidate: Candidate


@dataclass(frozen=True)
class ReleaseReservations:
    """Purge what a failed write may have left on ``cluster``."""

    cluster: str


class RoundEnd(Enum):
    """How a placement round ended."""

    PLACED = "placed"  # bound on the last candidate tried
    NEVER = "never"  # no member is eligible at all: the job failed
    NO_CANDIDATE = "no-candidate"  # nothing took it: Unschedulable or Pending follows


RoundCommand = Show | BindOn | ReleaseReservations | RoundEnd


def round_step(current: Round, event: RoundEvent | None = None) -> list[RoundCommand]:
    """What follows in ``current`` (changed in place) after ``event`` (None: the round
    starts): the next candidate's write, or how the round ended."""
    commands: list[RoundCommand] = []
    if isinstance(event, Bound):
        return [RoundEnd.PLACED]
    if isinstance(event, BindFailed):
        current.rejections[event.cluster] = f"binding failed: {event.message}"
        current.codes[event.cluster] = RejectionCode.BINDING_FAILED
        commands.append(Show((Announce("Warning", Reason.BINDING_FAILED,
                                       f"Binding on {event.cluster} failed: {event.message}"),)))
        if event.reserved:
            commands.append(ReleaseReservations(event.cluster))
    elif isinstance(event, ReservationLost):
        current.rejections[event.cluster] = f"reservation lost: {event.reason}"
        current.codes[event.cluster] = RejectionCode.RESERVATION_LOST
    if current.tried < len(current.candidates):
        current.tried += 1
        return [*commands, BindOn(current.candidates[current.tried - 1])]
    never = lifecycle.unplaceable_reason(current.verdict)
    if never is not None:
        notices = (Announce("Warning", Reason.BINDING_FAILED, never), Transition("Failed", never))
        return [*commands, Show(notices), RoundEnd.NEVER]
    return [*commands, RoundEnd.NO_CANDIDATE]


def room_plan(progress: JobProgress, current: Round, *, capacity: bool) -> CapacityPlanned | None:
    """After a round in which nothing fitted: the capacity preemption to start (the
    round may consider one, the verdict planned one, none is outstanding), else None."""
    plan = current.verdict.capacity_plan
    if capacity and plan is not None and lifecycle.may_plan_capacity(progress):
        return plan
    return None


def pending(progress: JobProgress, current: Round, *, capacity: bool) -> Transition:
    """The Pending the job waits in for the next round: every member's rejection, or
    (a capacity preemption outstanding) the victims it waits for."""
    hold = progress.capacity if capacity else None
    if hold is not None and hold.outstanding:
        return Transition("Pending", lifecycle.capacity_waiting_reason(hold))
    return Transition("Pending", lifecycle.pending_reason(current.rejections))
