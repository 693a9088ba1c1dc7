"""Temporal history events as the benches' readers meet them, built for their tests: the
quota workflow's tasks, its ``submit`` updates (accepted, with their messages; completed,
with their grants), the signals it sends and the signals a workflow takes."""

from __future__ import annotations

import json
from typing import Any

from temporalio.api.common.v1 import Payload, Payloads
from temporalio.api.history.v1 import HistoryEvent


def at(t: float) -> HistoryEvent:
    """An event at ``t`` seconds (of no type yet)."""
    ev = HistoryEvent()
    ev.event_time.FromNanoseconds(int(round(t * 1e9)))
    return ev


def task_scheduled(t: float) -> HistoryEvent:
    ev = at(t)
    ev.workflow_task_scheduled_event_attributes.SetInParent()
    return ev


def task_started(t: float) -> HistoryEvent:
    ev = at(t)
    ev.workflow_task_started_event_attributes.SetInParent()
    return ev


def task_completed(t: float, event_id: int) -> HistoryEvent:
    ev = at(t)
    ev.event_id = event_id
    ev.workflow_task_completed_event_attributes.SetInParent()
    return ev


def admission_request(job: str, cpu: int = 1000) -> dict[str, Any]:
    return {"job_id": job, "namespace": "q", "request": {"cpu": cpu}, "submitted_at": 0.0}


def submit(t: float, *messages: tuple[str, str]) -> HistoryEvent:
    """A ``submit`` update accepted at ``t`` carrying ``(signal, job)`` messages."""
    ev = at(t)
    req = ev.workflow_execution_update_accepted_event_attributes.accepted_request
    req.input.name = "submit"
    body = {"messages": [{"signal": s, "request": admission_request(j)} for s, j in messages]}
    req.input.args.CopyFrom(Payloads(payloads=[Payload(data=json.dumps(body).encode())]))
    return ev


def answered(t: float, grants: list[str]) -> HistoryEvent:
    """A ``submit`` update completing at ``t`` whose receipt grants ``grants`` (jobs
    admitted in the pass the update ran)."""
    ev = at(t)
    receipt = {"applied": len(grants), "refused": {},
               "grants": {j: {"job_id": j, "queue": "q", "node": "n"} for j in grants}}
    done = ev.workflow_execution_update_completed_event_attributes
    done.outcome.success.payloads.add(data=json.dumps(receipt).encode())
    return ev


def sent(t: float, signal: str, to: str, arg: Any = None) -> HistoryEvent:
    """The workflow sending ``signal(arg)`` to workflow ``to`` at ``t``."""
    ev = at(t)
    initiated = ev.signal_external_workflow_execution_initiated_event_attributes
    initiated.signal_name = signal
    initiated.workflow_execution.workflow_id = to
    if arg is not None:
        initiated.input.payloads.add(data=json.dumps(arg).encode())
    return ev


def signalled(t: float, name: str, arg: Any = None) -> HistoryEvent:
    """The workflow taking the signal ``name(arg)`` at ``t``."""
    ev = at(t)
    taken = ev.workflow_execution_signaled_event_attributes
    taken.signal_name = name
    if arg is not None:
        taken.input.payloads.add(data=json.dumps(arg).encode())
    return ev


def purged(t: float, jobs: list[str]) -> HistoryEvent:
    """The marker of the quota workflow's own ``purge_for_preemption`` at ``t``, whose
    result lists ``jobs`` (the victims it parked)."""
    ev = at(t)
    details = ev.marker_recorded_event_attributes.details
    details["data"].payloads.add(data=json.dumps(
        {"seq": 1, "attempt": 1, "activity_type": "purge_for_preemption"}).encode())
    details["result"].payloads.add(data=json.dumps(jobs).encode())
    return ev
