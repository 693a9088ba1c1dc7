"""Scheduler metrics recorded from workflow code: counters and histograms through
Temporal's replay-safe meter (the SDK drops their updates during replay), and the quota
tree's gauges as process state the worker's /metrics renders itself.

Why the tree is not a Temporal gauge: a Temporal gauge keeps its last value for the life
of the process, so a worker that once ran the quota workflow would report its holders
and queue lengths for ever (after a rollout, 1 holder where the truth was 0). The quota
workflow therefore records its state here (:func:`tree_state`, also on replay, so a
worker that takes it over has the whole table), and ``fleetq.runtime.telemetry`` exports
it only while this worker runs the workflow's current run on the workflow's version.
Label values are known up front (:data:`LABELS`): the worker exports every counter at 0.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from fleetq.preemption import PreemptionReason
    from fleetq.rejection import RejectionCode

if TYPE_CHECKING:
    from fleetq.admission import Admission
    from fleetq.messages import JobView

PREFIX = "fleetq_"

#: seconds from 0.1 s to 8 h: an admission or a bind takes 0.2 s on an idle fleet and
#: hours behind a full quota, and each should land in a bucket of its own size
DURATION_BUCKETS: tuple[float, ...] = (
    0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 28800,
)
ADMISSION_LATENCY = PREFIX + "admission_latency_seconds"
TIME_TO_BIND = PREFIX + "time_to_bind_seconds"
#: histogram buckets by metric name (``PrometheusConfig.histogram_bucket_overrides``)
BUCKETS: dict[str, list[float]] = {
    ADMISSION_LATENCY: list(DURATION_BUCKETS),
    TIME_TO_BIND: list(DURATION_BUCKETS),
}

JOB_STATES = (
    "Validating", "Queued", "Scheduling", "Pending", "Created", "Running", "Unhealthy",
    "FailingOver",
    "Suspended", "Succeeded", "Failed", "Deleted",
)
#: pending reasons of ``fleetq_pending_jobs`` (as Kueue's pending workloads by status):
#: ``Preempting``: its victims are giving quota back; ``QuotaUnavailable``: the rest,
#: waiting for quota (max, borrowing, a Block queue's head, starvation order)
PENDING_REASONS = ("Preempting", "QuotaUnavailable")
#: ``spec.failover.application.purgeMode`` as a policy may spell it (Karmada
#: release-1.18 ``PurgeMode``: Immediately, Graciously, Never; the older Directly and
#: Gracefully are accepted too, ``fleetq.models``), the ``purge_mode`` label as written
PURGE_MODES = ("Immediately", "Graciously", "Never", "Directly", "Gracefully")


@dataclass(frozen=True)
class Counter:
    name: str
    help: str
    #: the workflow type (and task queue) that records it, and its label values
    workflow_type: str
    labels: dict[str, tuple[str, ...]]


#: every counter, with the label values it can take (``cluster`` of failovers: the
#: fleet's members, known only to the worker: ``fleetq.runtime.telemetry``)
COUNTERS: tuple[Counter, ...] = (
    Counter(PREFIX + "job_state_transitions", "PyTorchJob state transitions",
            "PyTorchJobWorkflow", {"state": JOB_STATES}),
    Counter(PREFIX + "placement_failures", "placement attempts that found no cluster",
            "PyTorchJobWorkflow", {"reason": tuple(c.value for c in RejectionCode)}),
    Counter(PREFIX + "failovers", "jobs evicted from a member cluster",
            "PyTorchJobWorkflow", {"purge_mode": PURGE_MODES, "cluster": ()}),
    Counter(PREFIX + "preemptions", "admitted jobs preempted to admit another",
            "QuotaTreeWorkflow",
            {"reason": (PreemptionReason.PRIORITY.value, PreemptionReason.RECLAIM.value)}),
    Counter(PREFIX + "preemptions", "admitted jobs preempted to admit another",
            "PyTorchJobWorkflow", {"reason": (PreemptionReason.CAPACITY.value,)}),
)


def _counter(name: str, help_: str) -> Any:
    return workflow.metric_meter().create_counter(name, help_, "1")


def job_state(state: str) -> None:
    """One job entered ``state`` (jobs by state = rate of entries per state)."""
    _counter(PREFIX + "job_state_transitions", "PyTorchJob state transitions").add(
        1, {"state": state}
    )


def admission_latency(seconds: float, queue: str) -> None:
    workflow.metric_meter().create_histogram_float(
        ADMISSION_LATENCY, "submit to quota admission", "s"
    ).record(max(seconds, 0.0), {"queue": queue})


def time_to_bind(view: JobView) -> None:
    """The job was just bound: seconds from its submission (``created_at``) to now, by
    the queue that admitted it (``""`` without queueing)."""
    if view.created_at is None:
        return
    seconds = (workflow.now() - view.created_at).total_seconds()
    workflow.metric_meter().create_histogram_float(
        TIME_TO_BIND, "submit to bound on a member cluster", "s"
    ).record(max(seconds, 0.0), {"queue": view.queue or ""})


def placement_failure(code: RejectionCode) -> None:
    """One cluster turned a placement attempt down, counted by the rejection's code."""
    _counter(PREFIX + "placement_failures", "placement attempts that found no cluster").add(
        1, {"reason": code.value}
    )


def failover(cluster: str, purge_mode: str) -> None:
    """``purge_mode`` as the policy spells it (``FailoverPlan.mode_name``)."""
    _counter(PREFIX + "failovers", "jobs evicted from a member cluster").add(
        1, {"cluster": cluster, "purge_mode": purge_mode}
    )


def preemption(reason: str) -> None:
    """The quota workflow told one victim to give its quota back, counted by
    ``fleetq.preemption.PreemptionReason`` (Priority, Reclaim, Capacity)."""
    _counter(PREFIX + "preemptions", "admitted jobs preempted to admit another").add(
        1, {"reason": reason}
    )


# ------------------------------------------------------------ the tree, as state


@dataclass
class TreeReport:
    """What one quota workflow run last recorded in this process."""

    run_id: str
    lengths: dict[str, int] = field(default_factory=dict)
    holders: int = 0
    preempting: dict[str, int] = field(default_factory=dict)


_LOCK = threading.Lock()
#: by quota workflow id; read by the worker's /metrics (fleetq.runtime.telemetry)
_TREES: dict[str, TreeReport] = {}


def tree_reports() -> dict[str, TreeReport]:
    """A copy of every tree report of this process, by quota workflow id."""
    with _LOCK:
        return {
            k: TreeReport(r.run_id, dict(r.lengths), r.holders, dict(r.preempting))
            for k, r in _TREES.items()
        }


def forget_tree(workflow_id: str) -> None:
    with _LOCK:
        _TREES.pop(workflow_id, None)


def _record(lengths: dict[str, int], holders: int, preempting: dict[str, int] | None) -> None:
    info = workflow.info()
    with _LOCK:
        report = _TREES.get(info.workflow_id)
        if report is None or report.run_id != info.run_id:
            report = _TREES[info.workflow_id] = TreeReport(info.run_id)
        report.lengths.update(lengths)
        report.holders = holders
        if preempting is not None:
            report.preempting = preempting


def queue_lengths(lengths: dict[str, int], holders: int) -> None:
    """The quota workflow's queue lengths (the queues whose row changed) and holders."""
    _record(lengths, holders, None)


def tree_state(admission: Admission, lengths: dict[str, int]) -> None:
    """The quota workflow's state after a workflow task: ``lengths`` of the queues whose
    row changed (``QueueTable.update``), holders, and preemptors waiting per queue (a
    handful: ``Admission.preemptors``). Cost independent of the number waiting."""
    preempting: dict[str, int] = {}
    for job_id in admission.preemptors():
        req = admission.request_of(job_id)
        if req is not None:
            queue = admission.queue_for(req.namespace)
            preempting[queue] = preempting.get(queue, 0) + 1
    _record(lengths, admission.counts()[0], preempting)
