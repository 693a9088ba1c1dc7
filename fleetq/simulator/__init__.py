"""What-if simulator: replay a workload trace against a quota tree, a queue policy and a
fleet topology in virtual time, before any of it is applied to the real fleet.

``fleetq sim replay`` calls :func:`load_trace` and :func:`simulate`. The simulation runs
the *same* code as the Temporal workflows: :class:`fleetq.admission.Admission` for quota
and queues, :func:`fleetq.placement.place_gang` for gang placement on
:class:`fleetq.capacity.ClusterSnapshot` s, and :func:`fleetq.models.gang_of` /
:func:`fleetq.models.quota_request` to turn each job into a gang and a quota request.
Only the plumbing around them (signals, activities, timers) is replaced by a heap of
events in virtual time:

* *submit* -> ``Admission.enqueue``; a job admitted at once is placed at once;
* an admitted job is placed with ``place_gang`` over the member clusters' current
  snapshots; if a cluster fits, the gang is bound to the best one (its pods' requests are
  added to the assigned nodes) and a *finish* event is scheduled ``runSeconds`` later;
* if no cluster fits, the job keeps its quota and is retried when capacity is freed (a
  job finishes), like the workflow's ``retry_placement`` signal. For every job whose first
  attempt fails, each cluster's rejection is counted under its code and summary
  (``InsufficientNodeResource``: ``needs cpu; no node has enough free``, see
  :class:`fleetq.rejection.Rejection`);
* *finish* -> node requests are freed, ``Admission.release`` then ``Admission.schedule``
  grants quota to waiting jobs, which are then placed.

Speed (15,000 jobs in a few seconds): placement is only retried for admitted-but-unplaced
jobs, only after capacity was freed, and once per job *shape* (trace group) per capacity
change: binds only take capacity away, so a gang that did not fit keeps not fitting until
something finishes. Before ``place_gang`` runs, a cheap necessary check (enough pod copies
on the eligible nodes of a cluster; exact for gangs whose pods share one shape) drops the
clusters that cannot fit, so ``place_gang`` sees only candidates (same best choice) and
is skipped when there are none. Rejection reasons are computed with ``place_gang`` only
for clusters that changed since they last rejected that gang. (The placement heuristic is
sound but not complete; a gang it rejects could in rare cases fit once other gangs moved,
and such a gang is simply retried at the next finish.)

Preemption (issue 18): the tree's ``fleetq.io/preemption`` / ``fleetq.io/reclaim``
annotations turn on the quota workflow's own preemption pass
(:func:`fleetq.preemption.plan_preemptions`) after every scheduling pass; victims stop
after their grace period, lose their run and wait again with their original submit time,
and the report counts preemptions by reason and the cpu·s they wasted (see
:mod:`~fleetq.simulator.engine`). Capacity preemption (a gang quota admits that no
cluster can hold now) is simulated with :func:`fleetq.preemption.plan_capacity_preemption`
on the engine's running gangs; a gang no cluster could ever hold
(:func:`fleetq.placement.never_fits`) gives its quota back at once (``states``).

Metrics use time-weighted integration of step functions over ``[first submit, end]``.

The package: :mod:`~fleetq.simulator.trace` (the trace model, validation and loading),
:mod:`~fleetq.simulator.engine` (the event loop over the fleet's nodes),
:mod:`~fleetq.simulator.series` (step functions of virtual time) and
:mod:`~fleetq.simulator.report` (the summary and the failure reasons).

Pure: no Temporal, no network, no wall clock; run times drawn from ``runSeconds: {min,
max}`` come from a :class:`random.Random` seeded from the trace's ``seed``, so the same
trace always gives the same result.
"""

from __future__ import annotations

from fleetq.simulator.engine import SimulationError, cluster_snapshots, simulate
from fleetq.simulator.report import TIMELINE_POINTS, SimulationResult
from fleetq.simulator.series import StepSeries
from fleetq.simulator.trace import (
    MAX_JOBS,
    JobGroupSpec,
    RunRange,
    Trace,
    TraceError,
    TraceSpec,
    load_trace,
    parse_trace,
    with_overrides,
)

__all__ = [
    "MAX_JOBS",
    "TIMELINE_POINTS",
    "JobGroupSpec",
    "RunRange",
    "SimulationError",
    "SimulationResult",
    "StepSeries",
    "Trace",
    "TraceError",
    "TraceSpec",
    "cluster_snapshots",
    "load_trace",
    "parse_trace",
    "simulate",
    "with_overrides",
]
