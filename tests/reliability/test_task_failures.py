"""The reliability suite's "no workflow task failed" check tells Temporal's refusal of a
closing task (a new event arrived while it ran) from failures in our code; this pins
that it does not swallow the latter."""

from __future__ import annotations

from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.api.history.v1 import HistoryEvent

from fleetq.testing.chaos import code_task_failures

E = EventType
C = WorkflowTaskFailedCause


def history(*types: int, cause: int = C.WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND,
            message: str = "") -> list[HistoryEvent]:
    events = []
    for i, t in enumerate(types, start=1):
        ev = HistoryEvent(event_id=i, event_type=t)  # type: ignore[arg-type]
        if t == E.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            ev.workflow_task_failed_event_attributes.cause = cause  # type: ignore[assignment]
            ev.workflow_task_failed_event_attributes.failure.message = message
        events.append(ev)
    return events


CLOSING = (E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED, E.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED,
           E.EVENT_TYPE_WORKFLOW_TASK_STARTED, E.EVENT_TYPE_WORKFLOW_TASK_FAILED)


def test_closing_task_refused_for_a_new_event_is_not_a_code_failure() -> None:
    for arrival in (E.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED,
                    E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED,
                    E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED):
        events = history(*CLOSING, arrival, E.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED)
        assert code_task_failures(events) == []


def test_nondeterminism_and_exceptions_are_code_failures() -> None:
    nondet = history(*CLOSING, E.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED,
                     cause=C.WORKFLOW_TASK_FAILED_CAUSE_NON_DETERMINISTIC_ERROR,
                     message="Nondeterminism error: command mismatch\nmore")
    [line] = code_task_failures(nondet)
    assert line.startswith("NON_DETERMINISTIC_ERROR Nondeterminism error: command mismatch")
    crash = history(*CLOSING, E.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED,
                    cause=C.WORKFLOW_TASK_FAILED_CAUSE_WORKFLOW_WORKER_UNHANDLED_FAILURE,
                    message="KeyError: 'x'")
    assert len(code_task_failures(crash)) == 1


def test_unhandled_command_without_a_new_event_is_listed() -> None:
    # the server refusing a task with nothing new to hand it is not the designed retry
    events = history(*CLOSING, E.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED)
    assert len(code_task_failures(events)) == 1
