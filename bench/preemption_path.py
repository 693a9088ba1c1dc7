"""Where a quota preemption's time goes, hop by hop, read from the histories.

A preemptor waits from its enqueue to its grant while the quota workflow signals each
victim, the server delivers the signal, the victim's workflow task purges its copies and
sends ``requeue`` through the worker's outbox, and the quota workflow's task takes the
requeue and grants. ``fleetq bench kueue`` prints these hops for its large class, so the
gap to Kueue's in-process preemption is measured where it is, not guessed
(docs/scale.md "Beside Kueue"). Pure over history events; ``victims_of`` names the
histories to fetch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from temporalio.api.history.v1 import HistoryEvent

from bench.common import decode_json_payloads, event_seconds, quota_messages
from fleetq.testing.history import grants_in

#: the hops, in order; the first and the last two per preemptor, the rest per victim
ENQUEUE_TO_PREEMPT = "enqueue applied -> preemptions sent"
SENT_TO_SIGNALLED = "preemption sent -> victim signalled (server)"
SIGNALLED_TO_STARTED = "victim signalled -> its task started"
STARTED_TO_REQUEUE = "victim's task started -> its requeue at the quota workflow"
REQUEUE_TO_APPLIED = "requeue at the quota workflow -> applied"
APPLIED_TO_GRANT = "last requeue applied -> grant sent"
ENQUEUE_TO_GRANT = "enqueue applied -> grant sent"
PATH_STEPS = (ENQUEUE_TO_PREEMPT, SENT_TO_SIGNALLED, SIGNALLED_TO_STARTED, STARTED_TO_REQUEUE,
              REQUEUE_TO_APPLIED, APPLIED_TO_GRANT, ENQUEUE_TO_GRANT)

#: history event times are the server's; a signal is never recorded before it was sent,
#: but allow a clock step this small between the two workflows' shards
_SLACK = 0.001


@dataclass
class _Tree:
    """What the quota workflow's history says about messages, preemptions and grants."""

    #: (signal, job) -> each time it was applied: (task scheduled, update accepted)
    applied: dict[tuple[str, str], list[tuple[float, float]]] = field(default_factory=dict)
    #: preemptor -> (victim, when the preemption was sent, the task that sent it: a count
    #: of completed tasks over every run, as event ids start again in each run; the
    #: events one task records differ in their times)
    preempts: dict[str, list[tuple[str, float, int]]] = field(default_factory=dict)
    grants: dict[str, list[float]] = field(default_factory=dict)


def _read_tree(events: Iterable[HistoryEvent]) -> _Tree:
    tree = _Tree()
    scheduled = math.nan
    task = 0
    for ev in events:
        at = event_seconds(ev)
        if ev.HasField("workflow_task_scheduled_event_attributes"):
            scheduled = at
        elif ev.HasField("workflow_task_completed_event_attributes"):
            task += 1
        for _ev, m in quota_messages([ev]):
            tree.applied.setdefault((m.signal, m.subject()), []).append((scheduled, at))
        if ev.HasField("signal_external_workflow_execution_initiated_event_attributes"):
            sent = ev.signal_external_workflow_execution_initiated_event_attributes
            if sent.signal_name == "preempt" and sent.input.payloads:
                arg = decode_json_payloads(sent.input)[0]
                preemptor = arg.get("preemptor") if isinstance(arg, dict) else None
                if isinstance(preemptor, str):
                    tree.preempts.setdefault(preemptor, []).append(
                        (sent.workflow_execution.workflow_id, at, task))
        for job in grants_in(ev):
            tree.grants.setdefault(job, []).append(at)
    return tree


def enqueue_tasks(quota_events: Iterable[HistoryEvent]) -> dict[str, float]:
    """Each job's first ``enqueue``: when the quota workflow's task that applied it was
    scheduled (its arrival, or the end of the task in flight when it arrived)."""
    return {job: applied[0][0] for (signal, job), applied in _read_tree(quota_events)
            .applied.items() if signal == "enqueue" and applied}


def victims_of(quota_events: Iterable[HistoryEvent]) -> set[str]:
    """Every workflow the quota workflow sent a preemption to."""
    return {v for sent in _read_tree(quota_events).preempts.values() for v, _at, _task in sent}


def _victim_hops(events: Sequence[HistoryEvent], sent: float) -> tuple[float, float] | None:
    """(signalled, task started) for the first ``preempt`` the victim took after
    ``sent``, or None if its history (this run) does not have it."""
    signalled = None
    for ev in events:
        t = event_seconds(ev)
        if signalled is None:
            if (ev.HasField("workflow_execution_signaled_event_attributes")
                    and ev.workflow_execution_signaled_event_attributes.signal_name == "preempt"
                    and t >= sent - _SLACK):
                signalled = t
        elif ev.HasField("workflow_task_started_event_attributes"):
            return signalled, t
    return None


def preemption_path(quota_events: Sequence[HistoryEvent],
                    victim_events: Mapping[str, Sequence[HistoryEvent]],
                    preemptors: set[str] | None = None) -> dict[str, list[float]]:
    """Seconds on each hop (``PATH_STEPS``) of every preemption by ``preemptors`` (all
    if None): the victim hops once per victim, the preemptions sent once per preemption
    round (the preemptions one task sent), the way to the grant once per grant, from the
    last round before it. A victim whose history lacks the preemption (it continued as
    new since), or that took no requeue before its next preemption, is left out of the
    hops it lacks."""
    tree = _read_tree(quota_events)
    out: dict[str, list[float]] = {}

    def add(step: str, a: float | None, b: float | None) -> None:
        if a is not None and b is not None and not math.isnan(a) and not math.isnan(b):
            out.setdefault(step, []).append(b - a)

    #: victim -> when each preemption was sent to it (a requeue is matched to the
    #: preemption before it, never to a later one's)
    sent_to: dict[str, list[float]] = {}
    for sent_all in tree.preempts.values():
        for victim, at, _task in sent_all:
            sent_to.setdefault(victim, []).append(at)
    for preemptor, sent_all in tree.preempts.items():
        if preemptors is not None and preemptor not in preemptors:
            continue
        rounds: dict[int, list[tuple[str, float]]] = {}
        for victim, at, task in sent_all:
            rounds.setdefault(task, []).append((victim, at))
        ordered = [rounds[task] for task in sorted(rounds)]
        starts = [min(at for _v, at in round_) for round_ in ordered]
        for i, round_ in enumerate(ordered):
            sent = starts[i]
            enqueued = max((applied for signal in ("enqueue", "requeue")
                            for _s, applied in tree.applied.get((signal, preemptor), [])
                            if applied <= sent + _SLACK), default=None)
            grant = min((g for g in tree.grants.get(preemptor, []) if g >= sent), default=None)
            # the grant belongs to the last round before it: an earlier one that did not
            # free enough had its victims' hops, not a wait of its own to the grant
            last_round = grant is None or i + 1 == len(ordered) or starts[i + 1] > grant
            add(ENQUEUE_TO_PREEMPT, enqueued, sent)
            if last_round:
                add(ENQUEUE_TO_GRANT, enqueued, grant)
            last_applied: float | None = None
            for victim, at in round_:
                hops = _victim_hops(victim_events.get(victim, ()), at)
                if hops is None:
                    continue
                signalled, started = hops
                until = min((t for t in sent_to[victim] if t > at + _SLACK), default=math.inf)
                requeue = min((x for x in tree.applied.get(("requeue", victim), [])
                               if signalled <= x[1] < until), default=None)
                add(SENT_TO_SIGNALLED, at, signalled)
                add(SIGNALLED_TO_STARTED, signalled, started)
                if requeue is not None:
                    add(STARTED_TO_REQUEUE, started, requeue[0])
                    add(REQUEUE_TO_APPLIED, requeue[0], requeue[1])
                    if grant is None or requeue[1] <= grant:  # one after did not hold it up
                        last_applied = (requeue[1] if last_applied is None
                                        else max(last_applied, requeue[1]))
            if last_round:
                add(APPLIED_TO_GRANT, last_applied, grant)
    return out
