"""Whole job lives through the pure core alone, driven as ``PyTorchJobWorkflow``'s loop
drives them (no Temporal, no time-skipping server): ``next_phase`` picks the phase, the
admission wait is ``job_queue.Queueing.step``, a placement round ``round_step`` with
``job_phases.bound``, the watch ``job_machine.step``, a failover ``job_phases``'. Each
life is checked by what a user reads: its states and events, where it runs."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fleetq import job_machine, job_phases, lifecycle
from fleetq.job_machine import Failover, Phase, Show, Status, Supervision, Timer
from fleetq.lifecycle import Announce, Due, Notice, Reason, Transition
from fleetq.messages import Candidate, JobStatus, PlacementVerdict, PodStatus, PreemptSignal
from tests.core.test_job_phases import T0, gang, job, policy
from tests.core.test_job_queue import GRANT, TREE, Wait, World


def status(cluster: str, health: str = "Healthy", phase: str = "Running",
           **more: Any) -> JobStatus:
    pods = [PodStatus(name=f"p{i}", phase="Running", ready=True, restarts=0) for i in range(2)]
    return JobStatus(cluster=cluster, health=health, phase=phase,  # type: ignore[arg-type]
                     observed=f"{health}/{phase}", pods=pods, **more)


class Run:
    """One job's life: the phases in the order ``next_phase`` picks them, each carried
    out through the pure core; notices are shown on the view as the workflow does."""

    def __init__(self, members: list[str], **policy_kw: Any) -> None:
        self.members = members
        self.policy = policy(**policy_kw)
        self.p = job_phases.new_progress("default", "train", T0)
        self.p.resolution.tree_workflow_id = TREE
        self.shown: list[Announce | Transition] = []
        self.show(job_phases.show_request(self.p, gang(), self.policy))
        self.granted = False
        self.now = T0
        self.watching = job_phases.watching(self.policy, gang(), job(), 10.0)

    def show(self, notices: list[Notice] | tuple[Notice, ...]) -> None:
        for n in notices:
            if isinstance(n, Transition):
                self.p.view.state, self.p.view.reason = n.state, n.reason
            if isinstance(n, Announce | Transition):
                self.shown.append(n)

    def at(self, seconds: float) -> None:
        self.now = T0 + timedelta(seconds=seconds)

    @property
    def phase(self) -> Phase:
        return job_machine.next_phase(self.p, queued=True, granted=self.granted, now=self.now)

    def queue(self, world: World | None = None) -> None:
        assert self.phase == Phase.ADMIT
        wait = Wait(self.p, world or World(), now=self.now)
        wait.run()
        self.shown += wait.shown
        if wait.grant is not None:
            self.show(job_phases.admit(self.p, GRANT, self.now))
            self.granted = True

    def place(self) -> str:
        """One placement round: every member not evicted from is a candidate; the first
        takes the job."""
        placement = job_phases.placement_input(self.p, self.policy, gang(), GRANT.job_id)
        fits = [c for c in self.members if c not in placement.exclude]
        verdict = PlacementVerdict(candidates=[Candidate(cluster=c, score=1.0) for c in fits],
                                   eligible=fits)
        current = job_machine.start_round(verdict)
        (bind,) = job_machine.round_step(current)
        assert isinstance(bind, job_machine.BindOn)
        self.show(job_phases.bound(self.p, bind.candidate, current.rejections, gang=gang(),
                                   granted=self.granted, settings=self.p.resolution.requeue,
                                   active_deadline_seconds=None, now=self.now))
        assert job_machine.round_step(current, job_machine.Bound(bind.candidate.cluster)) == [
            job_machine.RoundEnd.PLACED]
        return bind.candidate.cluster

    def watch(self, seconds: float, event: job_machine.Event) -> Supervision | None:
        """One watch event at ``seconds``; a failover is carried out (and placed again)."""
        self.at(seconds)
        self.p, commands = job_machine.step(self.p, event, self.now, self.watching)
        for command in commands:
            if isinstance(command, Show):
                self.show(command.notices)
            elif isinstance(command, Failover):
                self.fail_over(command)
            elif isinstance(command, job_machine.End):
                return command.outcome
        return None

    def fail_over(self, command: Failover) -> None:
        old = command.cluster
        plan, notices = job_phases.start_failover(self.p, self.policy, old, command.why,
                                                  cluster_failure=command.cluster_failure)
        self.show(notices)
        after, notices = job_phases.leave(self.p, old, plan,
                                          cluster_failure=command.cluster_failure, now=self.now)
        self.show(notices)
        self.show(job_phases.evicted(self.p, old, plan, after))
        self.place()
        self.show(job_phases.rescheduled(self.p, old))

    @property
    def states(self) -> list[str]:
        """The states shown, each once while it lasts (as ``fleetq get`` shows them)."""
        shown = [n.state for n in self.shown if isinstance(n, Transition)]
        return [s for i, s in enumerate(shown) if i == 0 or shown[i - 1] != s]

    @property
    def events(self) -> list[Reason]:
        return [n.reason for n in self.shown if isinstance(n, Announce)]


def test_a_queued_job_is_admitted_bound_and_succeeds() -> None:
    run = Run(["a", "b"])
    run.queue(World(changes=["nothing", "grant"]))
    assert run.phase == Phase.PLACE
    assert run.place() == "a"
    assert run.phase == Phase.WATCH
    run.watch(5, Status(status("a", phase="Created"), settling=True))
    run.watch(10, Status(status("a")))
    assert run.watch(600, Status(status("a", phase="Succeeded"))) == Supervision.DONE
    assert run.phase == Phase.FINISH
    assert run.states == ["Queued", "Scheduling", "Created", "Running", "Succeeded"]
    assert run.events == [Reason.QUEUED, Reason.ADMITTED, Reason.BOUND]


def test_an_unhealthy_job_fails_over_to_the_other_member_and_succeeds_there() -> None:
    run = Run(["a", "b"], purge="Directly")
    run.queue()
    run.place()
    run.watch(10, Status(status("a")))
    run.watch(20, Status(status("a", "Unhealthy", reason="pod crashed")))
    deadline = job_machine.next_deadline(run.p, run.watching, run.now)
    assert deadline is not None and deadline.due == Due.FAILOVER
    assert run.watch(20 + deadline.seconds, Timer(Due.FAILOVER)) == Supervision.FAILOVER
    view = run.p.view
    assert view.cluster == "b" and view.evicted == ["a"] and view.copies == ["b"]
    assert run.events[-4:] == [Reason.FAILOVER_STARTED, Reason.EVICTED, Reason.BOUND,
                               Reason.RESCHEDULED]
    assert run.shown[-1] == Announce("Normal", Reason.RESCHEDULED, "rescheduled from a to b")
    assert run.phase == Phase.WATCH
    assert run.watch(900, Status(status("b", phase="Succeeded"))) == Supervision.DONE
    assert run.states[-1] == "Succeeded"


def test_a_job_suspended_while_queued_resumes_into_its_queue_and_runs() -> None:
    run = Run(["a"])
    run.queue(World(changes=["suspend"]))
    assert run.phase == Phase.SUSPEND and not run.granted
    in_queue, notices = job_phases.suspend(run.p, granted=run.granted)
    assert in_queue  # it left the queue it waited in
    run.show(notices)
    run.show(job_phases.suspended(run.p))
    run.p.suspension.ask_resume()
    run.show(job_phases.resumed(run.p, queued=True))
    assert run.phase == Phase.ADMIT
    run.queue()
    assert run.place() == "a"
    assert run.states == ["Queued", "Suspended", "Queued", "Scheduling", "Created"]
    assert Reason.SUSPENDED in run.events and Reason.RESUMED in run.events


def test_a_preempted_job_stops_after_its_grace_and_queues_again_with_its_submit_time() -> None:
    run = Run(["a"])
    run.queue()
    run.place()
    run.watch(10, Status(status("a")))
    signal = PreemptSignal(preemptor="pytorchjob/default/high", reason="Priority",
                           message="priority 1000 > 10", grace_seconds=30)
    run.at(20)
    holding = job_phases.holding(run.p, signal, granted=run.granted)
    run.show(lifecycle.take_preemption(run.p, signal, holding=holding, now=run.now))
    assert run.watch(20, job_machine.Preempt()) is None  # it may still finish meanwhile
    deadline = job_machine.next_deadline(run.p, run.watching, run.now)
    assert deadline is not None and deadline.due == Due.PREEMPT and deadline.seconds == 30
    assert run.watch(50, Timer(Due.PREEMPT)) == Supervision.PREEMPT
    assert run.phase == Phase.PREEMPTED
    run.show(lifecycle.requeue_after_preemption(run.p))
    run.granted = False  # (the requeue gave the quota back)
    assert run.phase == Phase.ADMIT and run.p.view.cluster is None
    assert run.states[-1] == "Queued" and "2026-01-01T00:00:00Z" in run.p.view.reason
    request = job_phases.admission_request(run.p, gang(), GRANT.job_id,
                                           job_phases.preemption_policy(job()), run.now)
    assert request.submitted_at == T0.timestamp()
