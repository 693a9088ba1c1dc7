"""`fleetq bench kueue` splits a preemptor's wait hop by hop (bench.preemption_path):
read from the quota workflow's history and its victims', each hop's seconds must come
out as the events say, with the victims' hops once per victim and the grant counted
from the last requeue the quota workflow applied."""

from __future__ import annotations

import json
from typing import Any

import pytest
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.api.history.v1 import HistoryEvent

from bench.preemption_path import (
    APPLIED_TO_GRANT,
    ENQUEUE_TO_GRANT,
    ENQUEUE_TO_PREEMPT,
    REQUEUE_TO_APPLIED,
    SENT_TO_SIGNALLED,
    SIGNALLED_TO_STARTED,
    STARTED_TO_REQUEUE,
    preemption_path,
    victims_of,
)


def _at(t: float) -> HistoryEvent:
    ev = HistoryEvent()
    ev.event_time.FromNanoseconds(int(round(t * 1e9)))
    return ev


def _task_scheduled(t: float) -> HistoryEvent:
    ev = _at(t)
    ev.workflow_task_scheduled_event_attributes.SetInParent()
    return ev


def _task_started(t: float) -> HistoryEvent:
    ev = _at(t)
    ev.workflow_task_started_event_attributes.SetInParent()
    return ev


def _task_completed(t: float, event_id: int) -> HistoryEvent:
    ev = _at(t)
    ev.event_id = event_id
    ev.workflow_task_completed_event_attributes.SetInParent()
    return ev


def _request(job: str) -> dict[str, Any]:
    return {"job_id": job, "namespace": "q", "request": {"cpu": 1000}, "submitted_at": 0.0}


def _submit(t: float, *messages: tuple[str, str]) -> HistoryEvent:
    """A ``submit`` update accepted at ``t`` carrying (signal, job) messages."""
    ev = _at(t)
    req = ev.workflow_execution_update_accepted_event_attributes.accepted_request
    req.input.name = "submit"
    body = {"messages": [{"signal": s, "request": _request(j)} for s, j in messages]}
    req.input.args.CopyFrom(Payloads(payloads=[Payload(data=json.dumps(body).encode())]))
    return ev


def _sent(t: float, signal: str, to: str, arg: Any = None) -> HistoryEvent:
    ev = _at(t)
    sent = ev.signal_external_workflow_execution_initiated_event_attributes
    sent.signal_name = signal
    sent.workflow_execution.workflow_id = to
    if arg is not None:
        sent.input.payloads.add(data=json.dumps(arg).encode())
    return ev


def _preempt(t: float, victim: str, preemptor: str) -> HistoryEvent:
    return _sent(t, "preempt", victim, {"preemptor": preemptor, "reason": "Preempted",
                                        "message": "", "grace_seconds": 0})


def _signalled(t: float, name: str) -> HistoryEvent:
    ev = _at(t)
    ev.workflow_execution_signaled_event_attributes.signal_name = name
    return ev


def test_each_hop_of_a_preemption_is_read_from_the_histories() -> None:
    tree = [
        # one task's events carry times microseconds apart: still one round
        _task_scheduled(10.00), _task_completed(10.05, 3), _submit(10.05, ("enqueue", "big")),
        _preempt(10.0501, "v1", "big"), _preempt(10.0502, "v2", "big"),
        _task_scheduled(10.40), _submit(10.42, ("requeue", "v1")),
        _task_scheduled(10.60), _submit(10.65, ("requeue", "v2")),
        _sent(10.65, "admitted", "big"),
    ]
    victims = {
        "v1": [_signalled(5.0, "preempt"), _task_started(5.1),  # an earlier preemption
               _signalled(10.15, "preempt"), _task_scheduled(10.15), _task_started(10.20)],
        "v2": [_signalled(10.25, "preempt"), _task_started(10.35)],
    }
    assert victims_of(tree) == {"v1", "v2"}
    path = preemption_path(tree, victims)
    got = {step: [round(x, 3) for x in xs] for step, xs in path.items()}
    assert got == {
        ENQUEUE_TO_PREEMPT: [0.0],
        SENT_TO_SIGNALLED: [0.10, 0.20],  # from each one's own sending
        SIGNALLED_TO_STARTED: [0.05, 0.10],
        STARTED_TO_REQUEUE: [0.20, 0.25],
        REQUEUE_TO_APPLIED: [0.02, 0.05],
        APPLIED_TO_GRANT: [0.0],  # granted in the task that applied the last requeue
        ENQUEUE_TO_GRANT: [0.60],
    }


def test_only_the_named_preemptors_and_victims_with_the_preemption_count() -> None:
    tree = [
        _task_scheduled(1.0), _submit(1.0, ("enqueue", "big"), ("enqueue", "mid")),
        _preempt(1.0, "v1", "big"), _preempt(1.0, "v2", "mid"),
        _task_scheduled(2.0), _submit(2.1, ("requeue", "v1"), ("requeue", "v2")),
        _sent(2.1, "admitted", "big"), _sent(2.1, "admitted", "mid"),
    ]
    # v1's history is of a later run (it continued as new): no preempt signal in it
    victims = {"v1": [_task_started(3.0)], "v2": [_signalled(1.5, "preempt"),
                                                  _task_started(1.6)]}
    assert preemption_path(tree, victims, {"big"}) == {
        ENQUEUE_TO_PREEMPT: [0.0], ENQUEUE_TO_GRANT: [pytest.approx(1.1)]}
    mid = preemption_path(tree, victims, {"mid"})
    assert mid[SENT_TO_SIGNALLED] == [pytest.approx(0.5)]
    assert mid[STARTED_TO_REQUEUE] == [pytest.approx(0.4)]


def test_rounds_in_two_runs_of_the_quota_workflow_stay_apart() -> None:
    """Event ids start again in each continue-as-new run: a round in the second run
    whose task has the same id as one in the first is its own round."""
    tree = [
        _task_scheduled(1.0), _task_completed(1.0, 3), _submit(1.0, ("enqueue", "big")),
        _preempt(1.0, "v1", "big"),
        _task_scheduled(1.2), _submit(1.3, ("requeue", "v1")), _sent(1.3, "admitted", "big"),
        # the next run
        _task_scheduled(5.0), _task_completed(5.0, 3), _submit(5.0, ("requeue", "big")),
        _preempt(5.0, "v2", "big"),
        _task_scheduled(5.2), _submit(5.4, ("requeue", "v2")), _sent(5.4, "admitted", "big"),
    ]
    victims = {"v1": [_signalled(1.1, "preempt"), _task_started(1.15)],
               "v2": [_signalled(5.1, "preempt"), _task_started(5.15)]}
    path = preemption_path(tree, victims)
    assert path[ENQUEUE_TO_GRANT] == [pytest.approx(0.3), pytest.approx(0.4)]
    assert path[SENT_TO_SIGNALLED] == [pytest.approx(0.1), pytest.approx(0.1)]


def test_a_grant_after_two_rounds_is_counted_once_from_the_last() -> None:
    """A first round that did not free enough is followed by a second; the way to the
    grant is the preemptor's once, and its last hop starts at the second round's last
    requeue."""
    tree = [
        _task_scheduled(1.0), _task_completed(1.0, 3), _submit(1.0, ("enqueue", "big")),
        _preempt(1.0, "v1", "big"),
        _task_scheduled(1.4), _task_completed(1.5, 6), _submit(1.5, ("requeue", "v1")),
        _preempt(1.5, "v2", "big"),
        _task_scheduled(1.8), _task_completed(2.0, 9), _submit(2.0, ("requeue", "v2")),
        _sent(2.0, "admitted", "big"),
    ]
    victims = {"v1": [_signalled(1.1, "preempt"), _task_started(1.2)],
               "v2": [_signalled(1.6, "preempt"), _task_started(1.7)]}
    path = preemption_path(tree, victims)
    assert path[ENQUEUE_TO_PREEMPT] == [pytest.approx(0.0), pytest.approx(0.5)]
    assert path[ENQUEUE_TO_GRANT] == [pytest.approx(1.0)]
    assert path[APPLIED_TO_GRANT] == [pytest.approx(0.0)]


def test_a_victim_that_took_no_requeue_is_not_matched_to_a_later_ones() -> None:
    """A victim that finished instead of requeueing, and was preempted again later,
    has its later requeue counted for the later preemption only."""
    tree = [
        _task_scheduled(1.0), _task_completed(1.0, 3), _submit(1.0, ("enqueue", "a")),
        _preempt(1.0, "v", "a"),
        _task_scheduled(3.0), _task_completed(3.0, 6), _submit(3.0, ("enqueue", "b")),
        _preempt(3.0, "v", "b"),
        _task_scheduled(3.4), _submit(3.5, ("requeue", "v")), _sent(3.5, "admitted", "b"),
    ]
    victims = {"v": [_signalled(1.1, "preempt"), _task_started(1.2),
                     _signalled(3.1, "preempt"), _task_started(3.2)]}
    path = preemption_path(tree, victims)
    assert path[STARTED_TO_REQUEUE] == [pytest.approx(0.2)]
