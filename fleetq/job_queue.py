"""A queued job's wait for admission as a transition function: ``Queueing.step(progress,
event, grant, now) -> commands``.

The wait backs off after a re-queue, puts the job in its quota workflow's queue (no
``enqueue`` right after a ``requeue`` put it there), waits Queued or Inadmissible for
the grant, and without a tree or a running quota workflow waits with doubling pauses
and resolves the tree again. A suspension first makes it leave the queue. The workflow
carries the commands out in order; the last of a batch it waits on yields the next
``Event``, so whole queued lives run here in plain tests (tests/core/test_job_queue.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from fleetq import job_phases, lifecycle
from fleetq.admission import Grant
from fleetq.job_phases import QueueWait
from fleetq.lifecycle import RESOLVE_BACKOFF, JobProgress, Pause, Show, Transition

# ---------------------------------------------------------------------- events


@dataclass(frozen=True)
class Begin:
    """The admission phase starts."""


@dataclass(frozen=True)
class BackoffEnded:
    """The re-queue backoff's timer ended, or a suspension cut it short."""


@dataclass(frozen=True)
class Sent:
    """The ``enqueue`` to ``tree_id`` was delivered (``ok``), or its quota workflow is
    not running (or did not answer)."""

    tree_id: str
    ok: bool


@dataclass(frozen=True)
class Resolved:
    """The quota tree was looked up again."""


@dataclass(frozen=True)
class Changed:
    """While waiting for the grant: it came, a suspension was asked for, or the quota
    workflow's ``admissibility`` has news."""


Event = Begin | BackoffEnded | Sent | Resolved | Changed


# ---------------------------------------------------------------------- commands


@dataclass(frozen=True)
class WaitBackoff:
    """Wait ``seconds`` (a durable timer) or until a suspension is asked for; then
    ``BackoffEnded``."""

    seconds: float


@dataclass(frozen=True)
class Enqueue:
    """Send ``enqueue`` to the quota workflow ``tree_id``; then ``Sent``."""

    tree_id: str


@dataclass(frozen=True)
class Resolve:
    """Look the quota tree up again (keeping the policy); then ``Resolved``."""


@dataclass(frozen=True)
class AwaitChange:
    """Wait until the grant comes, a suspension is asked for or admissibility has news;
    then ``Changed`` (``at_once``: without waiting, so the admissibility told while the
    ``enqueue`` was sent is judged on the state the notices before it showed)."""

    at_once: bool = False


@dataclass(frozen=True)
class Leave:
    """Leave the quota workflow's queue (``cancel``, or ``release`` a grant)."""


@dataclass(frozen=True)
class Admit:
    """The quota workflow admitted the job with ``grant`` (``job_phases.admit``)."""

    grant: Grant


@dataclass(frozen=True)
class Done:
    """The wait ends without admission (a suspension came first)."""


Command = Show | WaitBackoff | Enqueue | Pause | Resolve | AwaitChange | Leave | Admit | Done


# ---------------------------------------------------------------------- the function


@dataclass
class Queueing:
    """One admission wait: the pause before the tree is resolved again (doubling)."""

    delay: float = RESOLVE_BACKOFF.initial

    def step(self, progress: JobProgress, event: Event, *, grant: Grant | None,
             now: datetime) -> list[Command]:
        """What to carry out after ``event`` (``progress`` is changed in place, as the
        lifecycle's rules do; ``grant``: the quota workflow's, if it came)."""
        if isinstance(event, Begin):
            left = lifecycle.backoff_left(progress, now)
            if left > 0:
                return [WaitBackoff(left)]
            return self._backoff_over(progress, grant)
        if isinstance(event, BackoffEnded):
            if progress.suspension.wanted:
                return [Done()]
            return self._backoff_over(progress, grant)
        if isinstance(event, Sent):
            if event.ok:
                return self._await(event.tree_id)
            return self._wait(job_phases.tree_gone(event.tree_id))
        if isinstance(event, Resolved):
            return self._next_try(progress, grant)
        shown = Show(tuple(job_phases.admissibility(progress)))
        if grant is not None:
            return [shown, Admit(grant)]
        if progress.suspension.wanted:  # suspended while waiting: leave the queue
            return [shown, Leave(), Done()]
        return [shown, AwaitChange()]

    def _backoff_over(self, progress: JobProgress, grant: Grant | None) -> list[Command]:
        said = lifecycle.backoff_over(progress) if progress.requeue_at is not None else []
        return [Show(tuple(said)), *self._next_try(progress, grant)]

    def _next_try(self, progress: JobProgress, grant: Grant | None) -> list[Command]:
        if grant is not None:
            return [Admit(grant)]
        if progress.suspension.wanted:  # suspended before the quota workflow took it
            return [Done()]
        tree_id = progress.resolution.tree_workflow_id
        if tree_id is None:
            return self._wait(job_phases.NO_TREE)
        if not job_phases.enqueue_needed(progress, tree_id):  # already back in its queue
            return self._await(tree_id)
        return [Enqueue(tree_id)]

    def _wait(self, wait: QueueWait) -> list[Command]:
        pause = Pause(self.delay, wait.summary)
        self.delay = RESOLVE_BACKOFF.after(self.delay)
        return [Show((Transition("Queued", wait.reason),)), pause, Resolve()]

    def _await(self, tree_id: str) -> list[Command]:
        return [Show(tuple(job_phases.enqueued(tree_id))), AwaitChange(at_once=True)]
