"""Whole watched lives of a bound job run through ``fleetq.job_machine.step`` alone (no
Temporal, no time-skipping server): scripted event sequences for the lives a user sees
(succeeds, fails, fails over after its tolerance, recovers in time, misses the pods-ready
bound, is suspended or preempted) and a Hypothesis state machine for random lives."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from fleetq import job_machine, lifecycle
from fleetq.fleet_config import RequeueSettings
from fleetq.job_machine import (
    CollectPurgers,
    Command,
    ContinueIfLong,
    DeadlineExceeded,
    End,
    Event,
    Failover,
    Preempt,
    PurgeGracefulOld,
    PurgerDone,
    RetryPending,
    Rewatch,
    Show,
    Status,
    Supervision,
    Suspend,
    Timer,
    Watching,
)
from fleetq.lifecycle import Announce, Due, JobProgress, Reason, Transition
from fleetq.messages import (
    TERMINAL_STATES,
    JobStatus,
    JobView,
    PlacementVerdict,
    PodStatus,
    PreemptSignal,
    Resolution,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
WATCHING = Watching(tolerance=30, failover=True, pods=2, rewatch_seconds=60.0)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def bound(**more: Any) -> JobProgress:
    """A job just bound to member ``a`` (state Created)."""
    view = JobView(namespace="default", name="train", state="Created", cluster="a",
                   reason="bound to a", copies=["a"])
    return JobProgress(view=view, resolution=Resolution(), **more)


def status(health: str = "Healthy", phase: str = "Running", token: str = "",
           running: int = 2, **more: Any) -> JobStatus:
    pods = [PodStatus(name=f"p{i}", phase="Running", ready=True, restarts=0)
            for i in range(running)]
    return JobStatus(cluster="a", health=health, phase=phase,  # type: ignore[arg-type]
                     observed=token or f"{health}/{phase}/{running}", pods=pods, **more)


class Life:
    """Drives one job life through ``step`` as the workflow's watch loop does: each event
    at its time, the commands collected, the progress replaced by the step's (with the
    transitions it shows carried out, as the workflow's ``_set_state`` does)."""

    def __init__(self, progress: JobProgress, watching: Watching = WATCHING) -> None:
        self.progress = progress
        self.watching = watching
        self.commands: list[Command] = []
        self.outcome: Supervision | None = None

    def __call__(self, seconds: float, event: Event) -> list[Command]:
        assert self.outcome is None, "the watch already ended"
        before = self.progress.model_dump()
        new, commands = job_machine.step(self.progress, event, at(seconds), self.watching)
        assert self.progress.model_dump() == before, "step changed the progress it was given"
        self.progress = new
        self.commands += commands
        for command in commands:  # the workflow shows a transition on the job's view
            if isinstance(command, Show):
                for notice in command.notices:
                    if isinstance(notice, Transition):
                        new.view.state, new.view.reason = notice.state, notice.reason
        ends = [c for c in commands if isinstance(c, End)]
        assert len(ends) <= 1 and (not ends or commands[-1] == ends[0])
        self.outcome = ends[0].outcome if ends else None
        return commands

    def deadline(self, seconds: float) -> job_machine.Deadline | None:
        return job_machine.next_deadline(self.progress, self.watching, at(seconds))

    @property
    def states(self) -> list[str]:
        return [n.state for c in self.commands if isinstance(c, Show)
                for n in c.notices if isinstance(n, Transition)]

    @property
    def events(self) -> list[Reason]:
        return [n.reason for c in self.commands if isinstance(c, Show)
                for n in c.notices if isinstance(n, Announce)]


def test_a_job_that_runs_and_succeeds_shows_running_then_succeeded() -> None:
    life = Life(bound())
    life(1, Status(status(phase="Created", running=0), settling=True))
    assert life.outcome is None
    life(5, Status(status()))
    life(100, Status(status(phase="Succeeded", running=0)))
    assert life.outcome == Supervision.DONE
    assert life.states[-1] == "Succeeded" and life.states[-1] in TERMINAL_STATES
    assert "Running" in life.states
    assert not any(isinstance(c, Failover) for c in life.commands)


def test_failed_without_a_failover_policy_ends_the_job_failed() -> None:
    life = Life(bound(), Watching(tolerance=None, failover=False, pods=2))
    life(3, Status(status("Unhealthy", "Failed", reason="exit 1")))
    assert life.outcome == Supervision.DONE
    assert life.states[-1] == "Failed"


def test_unhealthy_past_its_tolerance_fails_over_at_the_timer() -> None:
    """applicationFailover.decisionConditions.tolerationSeconds: unhealthy this long,
    the job leaves its member (Karmada's application failover)."""
    life = Life(bound())
    life(0, Status(status()))
    life(10, Status(status("Unhealthy", reason="pod crashed")))
    assert Reason.UNHEALTHY in life.events and life.states[-1] == "Unhealthy"
    deadline = life.deadline(10)
    assert deadline is not None and deadline.due == Due.FAILOVER and deadline.seconds == 30
    commands = life(40, Timer(Due.FAILOVER))
    assert commands == [Failover("a", "unhealthy on a for 30s"), End(Supervision.FAILOVER)]


def test_a_job_that_recovers_in_time_keeps_its_member() -> None:
    life = Life(bound())
    life(10, Status(status("Unhealthy", reason="pod crashed")))
    life(25, Status(status()))
    assert Reason.RECOVERED in life.events
    assert life.deadline(25) is None  # no failover timer left
    assert life.outcome is None and life.states[-1] == "Running"


def test_tolerance_zero_fails_over_at_the_first_unhealthy_status() -> None:
    life = Life(bound(), Watching(tolerance=0, failover=True, pods=2))
    commands = life(3, Status(status("Unhealthy", reason="pod crashed")))
    assert commands[-2:] == [Failover("a", "unhealthy on a for 0s"), End(Supervision.FAILOVER)]


def test_pods_not_running_by_the_pods_ready_bound_requeue_the_job() -> None:
    """waitForPodsReady: a gang whose pods do not all run within the timeout gives its
    quota back and queues again (Kueue's PodsReady condition)."""
    life = Life(bound(ready_by=at(60)))
    life(5, Status(status(running=1)))  # one of two pods running
    deadline = life.deadline(5)
    assert deadline is not None and deadline.due == Due.PODS_READY
    assert life(60, Timer(Due.PODS_READY)) == [End(Supervision.REQUEUE)]


def test_pods_all_running_meet_the_pods_ready_bound() -> None:
    life = Life(bound(ready_by=at(60)))
    life(5, Status(status()))
    assert life.progress.ready_by is None and life.deadline(5) is None


def test_active_deadline_fails_the_job() -> None:
    life = Life(bound())
    life.progress.view.deadline_at = at(50)
    life(1, Status(status()))
    assert life(50, Timer(Due.DEADLINE)) == [DeadlineExceeded(), End(Supervision.DONE)]


def test_suspend_preempt_and_a_finished_purger_are_carried_out_by_the_loop() -> None:
    life = Life(bound())
    assert life(1, Preempt()) == []  # the next wait looks at the deadlines again
    assert life(2, PurgerDone()) == [CollectPurgers()]
    assert life(3, Suspend()) == [End(Supervision.SUSPEND)]


def test_a_preempted_job_stops_at_the_end_of_its_grace_period() -> None:
    life = Life(bound())
    assert life(0, Timer(Due.PREEMPT)) == [End(Supervision.PREEMPT)]


def test_a_quiet_watch_window_pauses_before_the_next_and_a_change_does_not() -> None:
    life = Life(bound())
    changed = life(1, Status(status(token="t1")))
    assert Rewatch() not in changed and changed[-1] == ContinueIfLong()
    quiet = life(301, Status(status(token="t1")))
    assert Rewatch() in quiet
    pause = job_machine.rewatch_pause(life.progress, life.watching, at(301))
    assert pause.seconds == 60.0 and pause.summary == "re-watch train on a"


def test_gracefully_kept_old_copy_goes_once_the_new_one_is_healthy() -> None:
    life = Life(bound(graceful_old="b", grace_deadline=at(600)))
    commands = life(5, Status(status()))
    assert PurgeGracefulOld("new copy on a is healthy") in commands
    assert RetryPending() in commands
    life2 = Life(bound(graceful_old="b", grace_deadline=at(600)))
    assert life2(600, Timer(Due.GRACE)) == [PurgeGracefulOld("grace period ended")]


STATUSES = st.builds(
    status,
    health=st.sampled_from(["Healthy", "Unhealthy", "Unknown"]),
    phase=st.sampled_from(["Created", "Running", "Running", "Succeeded", "Failed"]),
    running=st.integers(0, 2),
)


class RandomLife(RuleBasedStateMachine):
    """Random watched lives: statuses at random times, and the deadline the workflow
    would wait for firing when it is due. Whatever the order, a life ends at most once,
    a Succeeded status always ends it Succeeded, an unhealthy job fails over exactly at
    its tolerance, and step never changes the progress it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.life = Life(bound(ready_by=at(120)))
        self.now = 0.0

    @precondition(lambda self: self.life.outcome is None)
    @rule(gap=st.floats(0.1, 50), seen=STATUSES)
    def a_watch_returns(self, gap: float, seen: JobStatus) -> None:
        deadline = self.life.deadline(self.now)
        if deadline is not None and deadline.seconds <= gap:
            return  # the deadline comes first (the fire rule)
        self.now += gap
        commands = self.life(self.now, Status(seen))
        if seen.phase == "Succeeded":
            assert commands[-2:] == [Show((Transition("Succeeded", "completed on a"),)),
                                     End(Supervision.DONE)]

    @precondition(lambda self: self.life.outcome is None)
    @rule()
    def the_next_deadline_fires(self) -> None:
        deadline = self.life.deadline(self.now)
        if deadline is None:
            return
        unhealthy_since = self.life.progress.view.unhealthy_since
        self.now += max(deadline.seconds, 0)
        commands = self.life(self.now, Timer(deadline.due))
        if deadline.due == Due.FAILOVER:
            assert unhealthy_since is not None
            assert at(self.now) - unhealthy_since == timedelta(seconds=30)
            assert isinstance(commands[0], Failover)

    @precondition(lambda self: self.life.outcome is not None)
    @rule()
    def bound_again(self) -> None:
        """The watch ended (a failover places the job again): a new watched life."""
        self.life = Life(bound(ready_by=at(self.now + 120)))

    @invariant()
    def shown_state_is_terminal_only_when_done(self) -> None:
        states = self.life.states
        if states and states[-1] in ("Succeeded", "Failed"):
            assert self.life.outcome == Supervision.DONE

    @invariant()
    def unhealthy_timer_only_while_unhealthy(self) -> None:
        view = self.life.progress.view
        if view.unhealthy_since is not None:
            assert self.life.deadline(self.now) is not None


TestRandomLife = RandomLife.TestCase
TestRandomLife.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)


# ---------------------------------------------------------------------- phases


def phase_of(progress: JobProgress, *, suspend: bool = False, queued: bool = True,
             granted: bool = True) -> job_machine.Phase:
    progress = progress.model_copy(deep=True)
    if suspend:
        progress.suspension.wanted = True
    return job_machine.next_phase(progress, queued=queued, granted=granted, now=at(0))


def test_phases_of_a_queued_job_from_submit_to_its_end() -> None:
    Phase = job_machine.Phase
    p = bound()
    p.view.cluster, p.view.state = None, "Queued"
    assert phase_of(p, granted=False) == Phase.ADMIT
    assert phase_of(p) == Phase.PLACE  # admitted, not bound
    assert phase_of(p, queued=False, granted=False) == Phase.PLACE  # a policy without quota
    p.view.cluster, p.view.state = "a", "Running"
    assert phase_of(p) == Phase.WATCH
    p.view.state = "Succeeded"
    assert phase_of(p, suspend=True) == Phase.FINISH  # an ended job is never suspended


def test_a_suspension_comes_before_anything_else_and_preemption_before_placing() -> None:
    Phase = job_machine.Phase
    p = bound(preempt=PreemptSignal(preemptor="pytorchjob/default/big", reason="priority",
                                    message="priority 1000 > 10", grace_seconds=60),
              preempt_at=at(60))
    assert phase_of(p, suspend=True) == Phase.SUSPEND
    assert phase_of(p) == Phase.WATCH  # bound: it runs through its grace period
    p.view.cluster = None
    assert phase_of(p) == Phase.PREEMPTED  # nothing bound: carried out at once
    p.preempt, p.view.state = None, "Unschedulable"
    assert phase_of(p, granted=False) == Phase.UNSCHEDULABLE


# ---------------------------------------------------------------------- placing


def unbound(**more: Any) -> JobProgress:
    p = bound(**more)
    p.view.cluster, p.view.state = None, "Scheduling"
    return p


def test_placement_rounds_stop_at_the_deadline_a_preemption_and_the_timeout() -> None:
    """Kueue's waitForPodsReady-style placement timeout counts from the admission; the
    active deadline fails the job before anything else."""
    Gate = job_machine.Gate
    settings_ = RequeueSettings(placementTimeoutSeconds=120)
    p = unbound(admitted_at=at(0))
    gate = job_machine.placement_gate
    assert gate(p, granted=True, settings=settings_, now=at(60)) == Gate.PLACE
    assert gate(p, granted=True, settings=settings_, now=at(120)) == Gate.TIMED_OUT
    assert gate(p, granted=False, settings=settings_, now=at(120)) == Gate.PLACE
    p.view.deadline_at = at(100)
    assert gate(p, granted=True, settings=settings_, now=at(120)) == Gate.DEADLINE


def test_the_retry_pause_is_the_backoff_cut_short_by_the_placement_timeout() -> None:
    settings_ = RequeueSettings(placementTimeoutSeconds=120)
    p = unbound(admitted_at=at(0))
    pause = job_machine.retry_pause
    assert pause(p, 60, capacity=False, granted=True, settings=settings_, now=at(10)) == 60
    assert pause(p, 60, capacity=False, granted=True, settings=settings_, now=at(100)) == 20
    assert pause(p, 60, capacity=False, granted=False, settings=settings_, now=at(100)) == 60
    p.view.deadline_at = at(105)
    assert pause(p, 60, capacity=False, granted=False, settings=settings_, now=at(100)) == 5


def test_placing_asks_for_capacity_preemption_only_holding_quota_of_a_quota_workflow() -> None:
    full = PlacementVerdict(candidates=[], eligible=["a"])
    waiting = job_machine.Placing()
    waiting.saw(full)
    assert not waiting.round_capacity(unbound(), granted=True)  # no quota workflow
    p = unbound()
    p.resolution.tree_workflow_id = "quota/tree"
    assert not waiting.round_capacity(p, granted=True)  # decided once for the phase
    holding = job_machine.Placing()
    holding.saw(full)
    assert not holding.round_capacity(p, granted=False) and holding.capacity is False


def test_placing_stops_for_a_suspension_or_a_preemption() -> None:
    p = unbound()
    assert not job_machine.placing_stops(p)
    p.suspension.ask_suspend("Pending")
    assert job_machine.placing_stops(p)
    q = unbound()
    q.preempt = PreemptSignal(preemptor="x", reason="Priority", message="m")
    assert job_machine.placing_stops(q)


def placing_run(p: JobProgress, rounds: list[bool | None], *, granted: bool = True,
                settings_: RequeueSettings | None = None,
                between: Any = None) -> list[job_machine.PlacingCommand]:
    """Drive the placement phase as the workflow does: each round's verdict finds no
    room, each ``PlaceRound`` ends as ``rounds`` say (then None), each pause passes;
    ``between(p, n)`` runs after the n-th pause."""
    placing = job_machine.Placing()
    event: job_machine.PlacingEvent = job_machine.NextRound()
    full = PlacementVerdict(candidates=[], eligible=["a"])
    now, seen, paused = 0.0, [], 0
    for _ in range(60):
        commands = placing.step(p, event, granted=granted,
                                settings=settings_ or RequeueSettings(), now=at(now))
        seen += commands
        last = commands[-1]
        if isinstance(last, job_machine.StopPlacing | job_machine.Placed):
            return seen
        if isinstance(last, job_machine.Plan):
            event = job_machine.Planned(full)
        elif isinstance(last, job_machine.PlaceRound):
            event = job_machine.RoundOver(rounds.pop(0) if rounds else None)
        else:
            assert isinstance(last, job_machine.Pause)
            now += last.seconds
            paused += 1
            if between is not None:
                between(p, paused)
            event = job_machine.NextRound()
    raise AssertionError("the placement phase never ended")


def test_placing_runs_rounds_with_doubling_pauses_until_one_binds() -> None:
    p = unbound()
    p.resolution.tree_workflow_id = "quota/tree"
    seen = placing_run(p, [None, None, None, True])
    assert seen[-1] == job_machine.Placed(True)
    assert [c.seconds for c in seen if isinstance(c, job_machine.Pause)] == [2, 4, 8]
    plans = [c.capacity for c in seen if isinstance(c, job_machine.Plan)]
    assert plans == [False, True, True, True]  # from the round after no room
    shown = [c for c in seen if isinstance(c, Show)]
    assert len(shown) == 4 and shown[0].notices == (
        Transition("Scheduling", "evaluating member clusters"),)


def test_placing_ends_failed_when_no_member_ever_could() -> None:
    assert placing_run(unbound(), [False])[-1] == job_machine.Placed(False)


def test_a_placement_timeout_stops_placing_and_a_passed_deadline_fails_it() -> None:
    settings_ = RequeueSettings(placementTimeoutSeconds=10)
    seen = placing_run(unbound(admitted_at=at(0)), [], settings_=settings_)
    assert seen[-1] == job_machine.StopPlacing(job_machine.Gate.TIMED_OUT)
    assert sum(isinstance(c, job_machine.Pause) for c in seen) == 3  # 2 + 4 + 4 (cut)
    late = unbound()
    late.view.deadline_at = at(0)
    assert placing_run(late, []) == [job_machine.StopPlacing(job_machine.Gate.DEADLINE)]


def test_a_suspension_during_a_pause_ends_placing_with_nothing_bound() -> None:
    def suspend(p: JobProgress, paused: int) -> None:
        if paused == 2:
            p.suspension.ask_suspend(p.view.state)

    seen = placing_run(unbound(), [], between=suspend)
    assert seen[-1] == job_machine.Placed(True)
    assert sum(isinstance(c, job_machine.Plan) for c in seen) == 2


# ---------------------------------------------------------------------- whole lives


def test_a_queued_job_from_submit_to_succeeded_through_the_pure_core_alone() -> None:
    """Submit → admitted → bound → Created → Running → Succeeded, each phase chosen by
    ``next_phase`` and the watch by ``step``, as the workflow's loops drive them."""
    Phase = job_machine.Phase
    p = JobProgress(view=JobView(namespace="default", name="train", state="Queued"),
                    resolution=Resolution())
    assert phase_of(p, granted=False) == Phase.ADMIT
    lifecycle.admitted_now(p, at(1))
    assert phase_of(p) == Phase.PLACE
    assert job_machine.placement_gate(p, granted=True, settings=RequeueSettings(),
                                      now=at(2)) == job_machine.Gate.PLACE
    lifecycle.record_bind(p, "a", {}, at(3))
    lifecycle.arm_pods_ready(p, RequeueSettings(), at(3))
    p.view.state = "Created"
    assert phase_of(p) == Phase.WATCH
    life = Life(p)
    deadline = life.deadline(3)
    assert deadline is not None and deadline.due == Due.PODS_READY  # 600 s by default
    life(4, Status(status(phase="Created", running=0), settling=True))
    life(10, Status(status()))
    assert life.progress.ready_by is None  # the gang runs: the bound is met
    life(500, Status(status(phase="Succeeded", running=0)))
    assert life.outcome == Supervision.DONE
    assert life.states == ["Created", "Running", "Succeeded"]
    assert phase_of(life.progress) == Phase.FINISH


def test_a_suspension_asked_just_before_continue_as_new_is_carried_to_the_next_run() -> None:
    """The whole run's state is one value: what a suspend / requeue / admissibility
    signal left is in ``JobProgress``, so continue-as-new hands it over."""
    p = bound()
    p.suspension.ask_suspend(p.view.state)
    p.requeued_in = "quota/kube-system/tree"
    carried = JobProgress.model_validate_json(p.model_dump_json())
    assert carried.suspension.wanted and carried.requeued_in == "quota/kube-system/tree"
    assert phase_of(carried) == job_machine.Phase.SUSPEND


def test_a_deadline_beyond_the_watch_window_arms_no_timer_one_inside_does() -> None:
    """The 600 s pods-ready bound beside a 300 s watch: the watch returns first and the
    next wait looks at the deadline again, so no timer is started (and cancelled) for it;
    a failover tolerance inside the window still gets its timer, and one just past the
    window's end still does (the watch may come back a little late)."""
    progress = bound(ready_by=at(600))
    pods_ready = job_machine.next_deadline(progress, WATCHING, at(0))
    assert pods_ready is not None and pods_ready.due == Due.PODS_READY
    assert not job_machine.arms_timer(pods_ready, window_left=300.0)
    assert not job_machine.arms_timer(pods_ready, window_left=10.0)  # the settle window
    assert job_machine.arms_timer(pods_ready, window_left=600.0)
    assert job_machine.arms_timer(pods_ready, window_left=600.0 - job_machine.WATCH_SLACK_SECONDS)
    assert job_machine.arms_timer(None, window_left=300.0) is False

    unhealthy = bound()
    unhealthy.view.unhealthy_since = at(0)
    failover = job_machine.next_deadline(unhealthy, WATCHING, at(5))
    assert failover is not None and failover.due == Due.FAILOVER
    assert job_machine.arms_timer(failover, window_left=300.0)
    assert job_machine.arms_timer(failover, window_left=0.0)  # a watch past its window
