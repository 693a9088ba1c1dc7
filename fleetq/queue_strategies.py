"""Queue policies as strategies: what a quota node's queue may admit next, and what its
waiting jobs are told. One class per policy (the ``fleetq.io/queue-policy`` value users
write), registered by name, as Kueue kept one ClusterQueue type per queueing strategy
(kueue v0.6.3 pkg/queue/cluster_queue_strict_fifo.go, cluster_queue_best_effort_fifo.go,
picked by the ``registry`` map of cluster_queue_interface.go; the seam they differed at,
``RequeueIfNotPresent``, is a ``queueingStrategy`` branch of pkg/cache/queue/
cluster_queue.go today). :class:`fleetq.admission.Admission` asks its strategy, never which
policy it has: a new policy is one class here and no edit there.

Pure and stateless: a strategy reads and marks the :class:`fleetq.queues.JobQueue` it is
given; the quota, the preemption plans and the cross-queue order stay in Admission.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Container, Sequence
from enum import StrEnum
from typing import Protocol, TypeVar

from fleetq.queues import JobQueue, Key


class QueuePolicy(StrEnum):
    """The names users write (``fleetq.io/queue-policy``, a trace's ``queuePolicy``)."""

    PRIORITY = "Priority"
    BLOCK = "Block"


#: what a waiting job that quota would admit is told
FITS = "fits; admitted at the next scheduling pass"


def display_job(job_id: str) -> str:
    """``pytorchjob/default/big`` -> ``default/big`` (workflow ids carry the kind first)."""
    parts = job_id.split("/")
    return "/".join(parts[1:]) if len(parts) >= 3 else job_id


class QueueStrategy(Protocol):
    """What :class:`~fleetq.admission.Admission` asks a queue's policy."""

    @property
    def policy(self) -> str:
        """The policy's name, as users write it and :class:`~fleetq.admission.QueueInfo`
        shows it (a :class:`QueuePolicy` value, to survive continue-as-new)."""
        ...

    def candidates(self, q: JobQueue) -> Sequence[tuple[Key, int]]:
        """The waiting jobs ``(key, shape)`` of ``q`` a pass may admit next, in queue
        order: the first that fits is admitted; while none fits, the queue waits (and is
        taken up again when quota one of them is short of is freed)."""
        ...

    def admitted(self, q: JobQueue, key: Key, now: float) -> None:
        """Bookkeeping once ``key`` was admitted from ``q`` at ``now`` (before it leaves
        ``q``)."""
        ...

    def preemptor(self, q: JobQueue, planned: Container[str]) -> Key | None:
        """The waiting job of ``q`` a preemption may be planned for next, if it does not
        fit (``planned``: job ids that have a plan already); None: none."""
        ...

    def reason(self, q: JobQueue, key: Key, quota: Callable[[], str | None]) -> str:
        """Why the waiting job ``key`` of ``q`` (no preemption plan) waits; ``quota()``
        is why its quota does not admit it (None: it fits)."""
        ...


_STRATEGIES: dict[str, QueueStrategy] = {}

S = TypeVar("S", bound=QueueStrategy)


def register(cls: type[S]) -> type[S]:
    """Class decorator: the policy named ``cls.policy`` is an instance of ``cls`` (a
    strategy is stateless: one instance serves every queue)."""
    strategy = cls()
    _STRATEGIES[strategy.policy] = strategy
    return cls


def strategy_for(policy: str) -> QueueStrategy:
    """The strategy of ``policy`` (a :class:`QueuePolicy` or a registered name)."""
    strategy = _STRATEGIES.get(policy)
    if strategy is None:
        known = ", ".join(_STRATEGIES)
        raise ValueError(f"unknown queue policy {str(policy)!r}: one of {known}")
    return strategy


@register
class PriorityStrategy:
    """``Priority`` (Kueue's BestEffortFIFO, plus a starvation bound): a job that does not
    fit is skipped and jobs behind it may go first, but once a job has been skipped for
    longer than ``starvation_seconds`` (:meth:`fleetq.queues.JobQueue.promote`) nothing
    behind it in its queue may overtake it."""

    policy = QueuePolicy.PRIORITY

    def candidates(self, q: JobQueue) -> Sequence[tuple[Key, int]]:
        # whether a job fits depends only on its shape: each shape's first job, up to
        # the first starving one
        limit = q.first_starving()
        if limit is None:
            return q.heads
        return q.heads[: bisect_right(q.heads, limit, key=lambda head: head[0])]

    def admitted(self, q: JobQueue, key: Key, now: float) -> None:
        q.mark_skipped_before(key, now)  # (the jobs it overtook)

    def preemptor(self, q: JobQueue, planned: Container[str]) -> Key | None:
        return next((key for key in q.order if key[2] not in planned), None)

    def reason(self, q: JobQueue, key: Key, quota: Callable[[], str | None]) -> str:
        why = quota()
        if why is not None:
            return why
        starving = q.starving_before(key)
        if starving is not None:
            return f"behind starving job {display_job(starving[2])}"
        return FITS


@register
class BlockStrategy:
    """``Block`` (Kueue's StrictFIFO): the head of a queue blocks the whole queue; only
    the head may be admitted, or preempted for."""

    policy = QueuePolicy.BLOCK

    def candidates(self, q: JobQueue) -> Sequence[tuple[Key, int]]:
        return q.heads[:1]  # (the first job overall is the first of its shape)

    def admitted(self, q: JobQueue, key: Key, now: float) -> None:
        pass  # nothing overtakes: no skip times

    def preemptor(self, q: JobQueue, planned: Container[str]) -> Key | None:
        head = q.head()
        return head if head is not None and head[2] not in planned else None

    def reason(self, q: JobQueue, key: Key, quota: Callable[[], str | None]) -> str:
        head = q.head()
        if head is not None and head != key:
            what = "higher-priority" if head[0] < key[0] else "earlier"
            return f"behind {what} job {display_job(head[2])} (Block)"
        why = quota()
        return why if why is not None else FITS
