"""What-if simulator: replay a workload trace against a quota tree, a queue policy and a
fleet topology in virtual time, before any of it is applied to the real fleet.

``fleetq sim replay`` calls :func:`load_trace` and :func:`simulate`. The simulation runs
the *same* pure code as the workflows (:class:`fleetq.admission.Admission`,
:func:`fleetq.placement.place_gang`, :mod:`fleetq.preemption`), so its answers are the
fleet's; only signals, activities and timers become a heap of events
(:mod:`~fleetq.simulator.engine`). Also :mod:`~fleetq.simulator.trace` (trace model),
:mod:`~fleetq.simulator.series` (step functions, time-weighted metrics) and
:mod:`~fleetq.simulator.report`. Pure: no Temporal, network or wall clock; random run
times come from the trace's ``seed``. Why it is fast: docs/decisions/009; figures:
BENCHMARKS.md.
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
