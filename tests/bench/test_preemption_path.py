"""`fleetq bench kueue` splits a preemptor's wait hop by hop (bench.preemption_path):
read from the quota workflow's history and its victims', each hop's seconds must come
out as the events say, with the victims' hops once per victim and the grant counted
from the last requeue the quota workflow applied."""

from __future__ import annotations

import pytest
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
from tests.bench.history_events import (
    sent,
    signalled,
    submit,
    task_completed,
    task_scheduled,
    task_started,
)


def _preempt(t: float, victim: str, preemptor: str) -> HistoryEvent:
    return sent(t, "preempt", victim, {"preemptor": preemptor, "reason": "Preempted",
                                        "message": "", "grace_seconds": 0})


def test_each_hop_of_a_preemption_is_read_from_the_histories() -> None:
    tree = [
        # one task's events carry times microseconds apart: still one round
        task_scheduled(10.00), task_completed(10.05, 3), submit(10.05, ("enqueue", "big")),
        _preempt(10.0501, "v1", "big"), _preempt(10.0502, "v2", "big"),
        task_scheduled(10.40), submit(10.42, ("requeue", "v1")),
        task_scheduled(10.60), submit(10.65, ("requeue", "v2")),
        sent(10.65, "admitted", "big"),
    ]
    victims = {
        "v1": [signalled(5.0, "preempt"), task_started(5.1),  # an earlier preemption
               signalled(10.15, "preempt"), task_scheduled(10.15), task_started(10.20)],
        "v2": [signalled(10.25, "preempt"), task_started(10.35)],
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
        task_scheduled(1.0), submit(1.0, ("enqueue", "big"), ("enqueue", "mid")),
        _preempt(1.0, "v1", "big"), _preempt(1.0, "v2", "mid"),
        task_scheduled(2.0), submit(2.1, ("requeue", "v1"), ("requeue", "v2")),
        sent(2.1, "admitted", "big"), sent(2.1, "admitted", "mid"),
    ]
    # v1's history is of a later run (it continued as new): no preempt signal in it
    victims = {"v1": [task_started(3.0)], "v2": [signalled(1.5, "preempt"),
                                                  task_started(1.6)]}
    assert preemption_path(tree, victims, {"big"}) == {
        ENQUEUE_TO_PREEMPT: [0.0], ENQUEUE_TO_GRANT: [pytest.approx(1.1)]}
    mid = preemption_path(tree, victims, {"mid"})
    assert mid[SENT_TO_SIGNALLED] == [pytest.approx(0.5)]
    assert mid[STARTED_TO_REQUEUE] == [pytest.approx(0.4)]


def test_rounds_in_two_runs_of_the_quota_workflow_stay_apart() -> None:
    """Event ids start again in each continue-as-new run: a round in the second run
    whose task has the same id as one in the first is its own round."""
    tree = [
        task_scheduled(1.0), task_completed(1.0, 3), submit(1.0, ("enqueue", "big")),
        _preempt(1.0, "v1", "big"),
        task_scheduled(1.2), submit(1.3, ("requeue", "v1")), sent(1.3, "admitted", "big"),
        # the next run
        task_scheduled(5.0), task_completed(5.0, 3), submit(5.0, ("requeue", "big")),
        _preempt(5.0, "v2", "big"),
        task_scheduled(5.2), submit(5.4, ("requeue", "v2")), sent(5.4, "admitted", "big"),
    ]
    victims = {"v1": [signalled(1.1, "preempt"), task_started(1.15)],
               "v2": [signalled(5.1, "preempt"), task_started(5.15)]}
    path = preemption_path(tree, victims)
    assert path[ENQUEUE_TO_GRANT] == [pytest.approx(0.3), pytest.approx(0.4)]
    assert path[SENT_TO_SIGNALLED] == [pytest.approx(0.1), pytest.approx(0.1)]


def test_a_grant_after_two_rounds_is_counted_once_from_the_last() -> None:
    """A first round that did not free enough is followed by a second; the way to the
    grant is the preemptor's once, and its last hop starts at the second round's last
    requeue."""
    tree = [
        task_scheduled(1.0), task_completed(1.0, 3), submit(1.0, ("enqueue", "big")),
        _preempt(1.0, "v1", "big"),
        task_scheduled(1.4), task_completed(1.5, 6), submit(1.5, ("requeue", "v1")),
        _preempt(1.5, "v2", "big"),
        task_scheduled(1.8), task_completed(2.0, 9), submit(2.0, ("requeue", "v2")),
        sent(2.0, "admitted", "big"),
    ]
    victims = {"v1": [signalled(1.1, "preempt"), task_started(1.2)],
               "v2": [signalled(1.6, "preempt"), task_started(1.7)]}
    path = preemption_path(tree, victims)
    assert path[ENQUEUE_TO_PREEMPT] == [pytest.approx(0.0), pytest.approx(0.5)]
    assert path[ENQUEUE_TO_GRANT] == [pytest.approx(1.0)]
    assert path[APPLIED_TO_GRANT] == [pytest.approx(0.0)]


def test_a_victim_that_took_no_requeue_is_not_matched_to_a_later_ones() -> None:
    """A victim that finished instead of requeueing, and was preempted again later,
    has its later requeue counted for the later preemption only."""
    tree = [
        task_scheduled(1.0), task_completed(1.0, 3), submit(1.0, ("enqueue", "a")),
        _preempt(1.0, "v", "a"),
        task_scheduled(3.0), task_completed(3.0, 6), submit(3.0, ("enqueue", "b")),
        _preempt(3.0, "v", "b"),
        task_scheduled(3.4), submit(3.5, ("requeue", "v")), sent(3.5, "admitted", "b"),
    ]
    victims = {"v": [signalled(1.1, "preempt"), task_started(1.2),
                     signalled(3.1, "preempt"), task_started(3.2)]}
    path = preemption_path(tree, victims)
    assert path[STARTED_TO_REQUEUE] == [pytest.approx(0.2)]
