"""Scheduler metrics recorded from workflow code through Temporal's replay-safe meter.

They leave the worker the way Temporal's own worker metrics do: a Prometheus endpoint
(``python worker.py --prometheus-port``) or OpenTelemetry (``OTEL_EXPORTER_OTLP_*``), see
``worker.py``. Replays never double-count: the SDK drops metric updates during replay.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from fleetq.rejection import RejectionCode

PREFIX = "fleetq_"


def job_state(state: str) -> None:
    """One job entered ``state`` (jobs by state = rate of entries per state)."""
    workflow.metric_meter().create_counter(
        PREFIX + "job_state_transitions", "PyTorchJob state transitions", "1"
    ).add(1, {"state": state})


def admission_latency(seconds: float, queue: str) -> None:
    workflow.metric_meter().create_histogram_float(
        PREFIX + "admission_latency_seconds", "submit to quota admission", "s"
    ).record(max(seconds, 0.0), {"queue": queue})


def placement_failure(code: RejectionCode) -> None:
    """One cluster turned a placement attempt down, counted by the rejection's code."""
    workflow.metric_meter().create_counter(
        PREFIX + "placement_failures", "placement attempts that found no cluster", "1"
    ).add(1, {"reason": code.value})


def failover(cluster: str, purge_mode: str) -> None:
    workflow.metric_meter().create_counter(
        PREFIX + "failovers", "jobs evicted from a member cluster", "1"
    ).add(1, {"cluster": cluster, "purge_mode": purge_mode})


def queue_lengths(lengths: dict[str, int], holders: int) -> None:
    meter = workflow.metric_meter()
    gauge = meter.create_gauge(PREFIX + "queue_length", "jobs waiting per queue", "1")
    for queue, n in lengths.items():
        gauge.set(n, {"queue": queue})
    meter.create_gauge(PREFIX + "quota_holders", "jobs holding quota", "1").set(holders)



def preemption(reason: str) -> None:
    """The quota workflow told one victim to give its quota back, counted by
    ``fleetq.preemption.PreemptionReason`` (Priority, Reclaim, Capacity)."""
    workflow.metric_meter().create_counter(
        PREFIX + "preemptions", "admitted jobs preempted to admit another", "1"
    ).add(1, {"reason": reason})
