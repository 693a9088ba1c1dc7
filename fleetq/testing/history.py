"""History walking the tests and the benches share: a workflow's runs followed along its
continue-as-new links, with per-run event counts and payload sizes (the quota workflow's
tests check its history stays bounded; ``bench.history``, ``bench.queue`` and
``bench.e2e`` print the same figures), and the grants a quota workflow sent and a job
received, by signal or in the ``submit`` update's reply."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client


@dataclass
class RunStats:
    """One run of a workflow (between continue-as-new boundaries)."""

    run_id: str
    events: int
    largest_payload: int  # bytes, largest single event's payloads
    continue_as_new_input: int  # bytes of the continue-as-new input, 0 for the last run
    event_counts: dict[str, int] = field(default_factory=dict)


def payload_bytes(event: HistoryEvent) -> int:
    attrs_name = event.WhichOneof("attributes")
    if attrs_name is None:
        return 0
    attrs = getattr(event, attrs_name)
    groups = []
    for fname in ("input", "result", "details", "heartbeat_details", "last_completion_result"):
        if not hasattr(attrs, fname):
            continue
        value = getattr(attrs, fname)
        if hasattr(value, "payloads"):
            if attrs.HasField(fname):
                groups.append(value)
        else:  # a map of payloads (a marker's details: local-activity results)
            groups.extend(value.values())
    return sum(len(p.data) + sum(len(v) for v in p.metadata.values())
               for g in groups for p in g.payloads)


def event_type_name(event: HistoryEvent) -> str:
    name = event.WhichOneof("attributes") or "unknown"
    return name.removesuffix("_event_attributes")


async def run_chain(client: Client, workflow_id: str, run_id: str | None = None,
                    *, keep_events: bool = False) -> tuple[list[RunStats], list[HistoryEvent]]:
    """Every run of a workflow from ``run_id`` (default: the first run of the current
    chain is not known to the server, so pass the first run id) following the
    continue-as-new links; returns per-run stats (and all events if ``keep_events``)."""
    runs: list[RunStats] = []
    kept: list[HistoryEvent] = []
    rid = run_id
    while True:
        hist = await client.get_workflow_handle(workflow_id, run_id=rid).fetch_history()
        counts: dict[str, int] = {}
        largest = 0
        for ev in hist.events:
            name = event_type_name(ev)
            counts[name] = counts.get(name, 0) + 1
            largest = max(largest, payload_bytes(ev))
        last = hist.events[-1]
        can_input = 0
        next_rid: str | None = None
        if last.HasField("workflow_execution_continued_as_new_event_attributes"):
            attrs = last.workflow_execution_continued_as_new_event_attributes
            can_input = sum(len(p.data) for p in attrs.input.payloads)
            next_rid = attrs.new_execution_run_id
        runs.append(RunStats(hist.run_id, len(hist.events), largest, can_input, counts))
        if keep_events:
            kept.extend(hist.events)
        if next_rid is None:
            return runs, kept
        rid = next_rid


def _json_payloads(payloads: Any) -> list[Any]:
    return [json.loads(p.data) if p.data else None for p in payloads.payloads]


def local_activity_type(event: HistoryEvent) -> str | None:
    """The activity type of a local-activity marker event, else None."""
    if not event.HasField("marker_recorded_event_attributes"):
        return None
    attrs = event.marker_recorded_event_attributes
    if attrs.marker_name != "core_local_activity":
        return None
    data = attrs.details.get("data")
    doc = json.loads(data.payloads[0].data) if data is not None and data.payloads else {}
    return str(doc.get("activity_type") or "local activity")


def local_activity_result(event: HistoryEvent, activity_type: str) -> Any:
    """The decoded result of a local activity of ``activity_type`` recorded by this
    marker event, else None."""
    if local_activity_type(event) != activity_type:
        return None
    result = event.marker_recorded_event_attributes.details.get("result")
    return _json_payloads(result)[0] if result is not None and result.payloads else None


def grants_received(events: Iterable[HistoryEvent]) -> list[HistoryEvent]:
    """The events of a job's history that brought it a grant: an ``admitted`` signal, or
    the marker of a ``signal_quota`` whose answer carries one (admitted at once, in the
    quota workflow's reply)."""
    out: list[HistoryEvent] = []
    for ev in events:
        if ev.HasField("workflow_execution_signaled_event_attributes"):
            if ev.workflow_execution_signaled_event_attributes.signal_name == "admitted":
                out.append(ev)
        else:
            ack = local_activity_result(ev, "signal_quota")
            if isinstance(ack, dict) and ack.get("grant") is not None:
                out.append(ev)
    return out


def grants_in(ev: HistoryEvent) -> list[str]:
    """The jobs a quota workflow's history event granted: an ``admitted`` signal it sent
    (its initiated event), or the grants its ``submit`` update answered (the update's
    completed event)."""
    if ev.HasField("signal_external_workflow_execution_initiated_event_attributes"):
        sent = ev.signal_external_workflow_execution_initiated_event_attributes
        return [sent.workflow_execution.workflow_id] if sent.signal_name == "admitted" else []
    if ev.HasField("workflow_execution_update_completed_event_attributes"):
        outcome = ev.workflow_execution_update_completed_event_attributes.outcome
        if outcome.HasField("success") and outcome.success.payloads:
            receipt = _json_payloads(outcome.success)[0]
            if isinstance(receipt, dict):
                return list(receipt.get("grants") or {})
    return []


def grants_sent(events: Iterable[HistoryEvent]) -> Iterator[tuple[HistoryEvent, str]]:
    """The grants in a quota workflow's history, in order, with the job each went to."""
    for ev in events:
        for job in grants_in(ev):
            yield ev, job
