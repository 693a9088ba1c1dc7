"""History walking the tests and the benches share: a workflow's runs followed along its
continue-as-new links, with per-run event counts and payload sizes (the quota workflow's
tests check its history stays bounded; ``bench.history``, ``bench.queue`` and
``bench.e2e`` print the same figures)."""

from __future__ import annotations

from dataclasses import dataclass, field

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
