"""Whole admission waits of a queued job run through ``fleetq.job_queue`` alone (no
Temporal): admitted from its queue, waiting for a tree or a quota workflow that is not
there, backing off after a re-queue, no second ``enqueue`` after a ``requeue``, shown
Inadmissible and queued again, suspended at each point; and a Hypothesis property over
random waits (each ends once: admitted, or left the queue when it was in one)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TypeVar

from hypothesis import given
from hypothesis import strategies as st

from fleetq.admission import Grant
from fleetq.job_queue import (
    Admit,
    AwaitChange,
    BackoffEnded,
    Begin,
    Changed,
    Command,
    Done,
    Enqueue,
    Event,
    Leave,
    Pause,
    Queueing,
    Resolve,
    Resolved,
    Sent,
    Show,
    WaitBackoff,
)
from fleetq.lifecycle import Announce, JobProgress, Reason, Transition
from fleetq.messages import AdmissibilitySignal, JobView, Resolution
from fleetq.quota import exceeds_max

C = TypeVar("C")
T0 = datetime(2026, 1, 1, tzinfo=UTC)
TREE = "quota/kube-system/tree"
GRANT = Grant(job_id="pytorchjob/default/train", queue="team", node="root/team")


def queued(tree: str | None = TREE, **more: object) -> JobProgress:
    view = JobView(namespace="default", name="train", state="Validating", created_at=T0)
    return JobProgress(view=view, resolution=Resolution(tree_workflow_id=tree),
                       **more)  # type: ignore[arg-type]


@dataclass
class World:
    """What the wait meets, in turn: each ``enqueue`` delivered or not (``sends``), the
    tree each resolve finds (``trees``), what each wait for a change brings
    (``changes``: "grant", "suspend", "inadmissible", "admissible" or "nothing")."""

    sends: list[bool] = field(default_factory=list)
    trees: list[str | None] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)
    suspend_in_backoff: bool = False


@dataclass
class Wait:
    """Drives one admission wait as the workflow does: commands in order, the one it
    waits on last in its batch yields the next event; Show's transitions are carried out
    on the view (as ``_set_state`` does)."""

    progress: JobProgress
    world: World = field(default_factory=World)
    now: datetime = T0
    grant: Grant | None = None
    commands: list[Command] = field(default_factory=list)
    shown: list[Announce | Transition] = field(default_factory=list)

    def run(self, limit: int = 50) -> Command:
        queueing = Queueing()
        event: Event | None = Begin()
        end: Command | None = None
        while event is not None and limit:
            limit -= 1
            batch = queueing.step(self.progress, event, grant=self.grant, now=self.now)
            self.commands += batch
            event = None
            for command in batch:
                event = self._carry_out(command)
                if isinstance(command, Admit | Done):
                    end = command
        assert end is not None, "the wait ended with neither Admit nor Done"
        return end

    def _carry_out(self, command: Command) -> Event | None:
        p = self.progress
        if isinstance(command, Show):
            for n in command.notices:
                if isinstance(n, Transition):
                    p.view.state, p.view.reason = n.state, n.reason
                if isinstance(n, Announce | Transition):
                    self.shown.append(n)
            return None
        if isinstance(command, WaitBackoff):
            if self.world.suspend_in_backoff:
                p.suspension.ask_suspend(p.view.state)
            else:
                self.now += timedelta(seconds=command.seconds)
            return BackoffEnded()
        if isinstance(command, Enqueue):
            return Sent(command.tree_id, self.world.sends.pop(0) if self.world.sends else True)
        if isinstance(command, Pause):
            self.now += timedelta(seconds=command.seconds)
            return None
        if isinstance(command, Resolve):
            tree = self.world.trees.pop(0) if self.world.trees else TREE
            p.resolution = Resolution(tree_workflow_id=tree)
            return Resolved()
        if isinstance(command, AwaitChange):
            if not command.at_once:
                self._change(self.world.changes.pop(0) if self.world.changes else "grant")
            return Changed()
        return None

    def _change(self, change: str) -> None:
        p = self.progress
        if change == "grant":
            self.grant = GRANT
        elif change == "suspend":
            p.suspension.ask_suspend(p.view.state)
        elif change in ("inadmissible", "admissible"):
            why = exceeds_max("team", "cpu", 12000, 8000) if change == "inadmissible" else None
            p.admissibility, p.admissibility_news = AdmissibilitySignal(inadmissible=why), True

    def of(self, kind: type[C]) -> list[C]:
        return [c for c in self.commands if isinstance(c, kind)]

    @property
    def states(self) -> list[str]:
        return [n.state for n in self.shown if isinstance(n, Transition)]


def test_a_job_is_enqueued_once_waits_queued_and_is_admitted() -> None:
    wait = Wait(queued(), World(changes=["nothing", "grant"]))
    assert wait.run() == Admit(GRANT)
    assert wait.of(Enqueue) == [Enqueue(TREE)]
    assert wait.states == ["Queued"]
    assert Announce("Normal", Reason.QUEUED, f"enqueued in quota tree {TREE}") in wait.shown


def test_without_a_tree_the_job_waits_queued_with_doubling_pauses_until_one_is_applied() -> None:
    wait = Wait(queued(tree=None), World(trees=[None, None, None, TREE]))
    assert wait.run() == Admit(GRANT)
    assert [c.seconds for c in wait.of(Pause)] == [5, 10, 20, 40]
    assert wait.progress.view.state == "Queued"
    assert Transition("Queued", "no ElasticQuotaTree is applied to the fleet") in wait.shown
    assert wait.of(Enqueue) == [Enqueue(TREE)]


def test_a_quota_workflow_that_is_not_running_is_resolved_again_and_enqueued_when_back() -> None:
    wait = Wait(queued(), World(sends=[False, True]))
    assert wait.run() == Admit(GRANT)
    assert wait.of(Enqueue) == [Enqueue(TREE), Enqueue(TREE)]
    assert Transition("Queued", f"quota workflow {TREE} is not running") in wait.shown
    assert len(wait.of(Resolve)) == 1


def test_after_a_requeue_no_second_enqueue_is_sent() -> None:
    wait = Wait(queued(requeued_in=TREE))
    assert wait.run() == Admit(GRANT)
    assert wait.of(Enqueue) == []
    assert wait.progress.requeued_in is None


def test_a_requeued_job_backs_off_then_queues_again_with_a_requeued_event() -> None:
    p = queued(requeue_at=T0 + timedelta(seconds=30))
    wait = Wait(p)
    assert wait.run() == Admit(GRANT)
    assert wait.of(WaitBackoff) == [WaitBackoff(30.0)]
    assert wait.shown[0] == Announce("Normal", Reason.REQUEUED,
                                     "backoff over: queued again (original submit time)")
    assert p.requeue_at is None and wait.of(Enqueue) == [Enqueue(TREE)]


def test_a_suspension_during_the_backoff_ends_the_wait_before_any_enqueue() -> None:
    wait = Wait(queued(requeue_at=T0 + timedelta(seconds=30)), World(suspend_in_backoff=True))
    assert wait.run() == Done()
    assert wait.of(Enqueue) == [] and wait.of(Leave) == []


def test_a_suspension_while_queued_leaves_the_queue() -> None:
    wait = Wait(queued(), World(changes=["suspend"]))
    assert wait.run() == Done()
    assert wait.of(Leave) == [Leave()]


def test_a_suspension_before_the_quota_workflow_took_the_job_sends_nothing() -> None:
    p = queued(tree=None)
    wait = Wait(p, World(trees=[TREE]))
    p.suspension.ask_suspend("Validating")
    assert wait.run() == Done()
    assert wait.of(Enqueue) == [] and wait.of(Leave) == []


def test_inadmissible_is_shown_and_a_tree_change_queues_the_job_again() -> None:
    wait = Wait(queued(), World(changes=["inadmissible", "nothing", "admissible", "grant"]))
    assert wait.run() == Admit(GRANT)
    assert wait.states == ["Queued", "Inadmissible", "Queued"]
    reasons = [n.reason for n in wait.shown if isinstance(n, Announce)]
    assert reasons == [Reason.QUEUED, Reason.INADMISSIBLE, Reason.QUEUED]


def test_inadmissible_told_while_enqueueing_is_shown_again_after_queued() -> None:
    """A job re-queued while Inadmissible: Queued on enqueue, then Inadmissible again
    (the reason it was shown is judged on the state just shown, not the one before)."""
    why = exceeds_max("team", "cpu", 12000, 8000)
    p = queued()
    p.view.state, p.view.reason = "Inadmissible", why.message
    p.admissibility, p.admissibility_news = AdmissibilitySignal(inadmissible=why), True
    wait = Wait(p, World(changes=["grant"]))
    assert wait.run() == Admit(GRANT)
    assert wait.states == ["Queued", "Inadmissible"]


CHANGES = st.sampled_from(["grant", "suspend", "inadmissible", "admissible", "nothing"])


@given(st.lists(st.booleans(), max_size=4), st.lists(st.sampled_from([None, TREE]), max_size=4),
       st.lists(CHANGES, max_size=6), st.booleans(), st.booleans(), st.booleans())
def test_every_wait_ends_once_admitted_or_out_of_the_queue(
    sends: list[bool], trees: list[str | None], changes: list[str], tree: bool,
    requeued: bool, backoff: bool,
) -> None:
    p = queued(tree=TREE if tree else None, requeued_in=TREE if requeued else None,
               requeue_at=T0 + timedelta(seconds=10) if backoff else None)
    wait = Wait(p, World(sends=list(sends), trees=list(trees), changes=list(changes)))
    end = wait.run()
    assert len(wait.of(Admit)) + len(wait.of(Done)) == 1
    pauses = [c.seconds for c in wait.of(Pause)]
    assert pauses == [min(5 * 2**i, 120) for i in range(len(pauses))]
    if isinstance(end, Admit):
        assert wait.of(Leave) == []
    elif wait.of(Leave):  # it left a queue it was in: the enqueue reached it (or a requeue)
        assert wait.of(Enqueue) or requeued
