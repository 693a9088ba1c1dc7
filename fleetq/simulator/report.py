"""What a finished simulation reports: the JSON-ready summary, the timeline, and the
placement failures grouped by rejection code.

:func:`build_result` reads a finished :class:`~fleetq.simulator.engine.Simulation`'s
counters and series; :class:`FailureReasons` tallies the jobs whose first placement
failed under every reason (a :class:`~fleetq.rejection.Rejection`'s code and summary) a
cluster gave. With preemption on, the summary also says how many jobs were preempted, by
reason, and the work they lost (cpu·s of the runs that were preempted).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from fleetq.preemption import PreemptionReason
from fleetq.rejection import Rejection, RejectionCode
from fleetq.simulator.series import StepSeries, resource_order, rounded, scaled, stats, units

if TYPE_CHECKING:
    from fleetq.simulator.engine import Job, Simulation

__all__ = ["TIMELINE_POINTS", "FailureReasons", "SimulationResult", "build_result"]

#: Points per series in the JSON timeline.
TIMELINE_POINTS = 200


@dataclass
class SimulationResult:
    """Everything :func:`~fleetq.simulator.simulate` measured. :meth:`summary` is the
    JSON-ready report; ``series`` holds the full step functions (for plots):
    ``queueLength`` per queue (plus ``admitted, unplaced``), ``quotaUtilisation`` per
    ``node/resource`` with a ``max``, ``clusterUtilisation`` per ``cluster/resource``
    (allocated / allocatable)."""

    summary_data: dict[str, Any]
    series: dict[str, dict[str, StepSeries]]
    t0: float
    end: float

    def summary(self, timeline_points: int = TIMELINE_POINTS) -> dict[str, Any]:
        out = dict(self.summary_data)
        out["timeline"] = self.timeline(timeline_points)
        return out

    def timeline(self, points: int = TIMELINE_POINTS) -> dict[str, Any]:
        """Every series sampled at ``points`` evenly spaced times over ``[t0, end]``."""
        n = max(2, points) if self.end > self.t0 else 1
        times = np.linspace(self.t0, self.end, n)
        out: dict[str, Any] = {"t": [rounded(float(t), 3) for t in times]}
        for kind, group in self.series.items():
            out[kind] = {
                name: [rounded(v, 4) for v in s.sample(times)] for name, s in group.items()
            }
        return out


# --------------------------------------------------------------------------- failure reasons

#: A reason as the report groups it: the rejection's code and its summary (the summary
#: adds what is missing -- a resource, a nodeSelector, an affinity rule -- to the code).
ReasonKey = tuple[RejectionCode, str]


@dataclass
class _Tally:
    jobs: int = 0
    clusters: set[str] = field(default_factory=set)
    example: str = ""


def grouped(rejections: Sequence[tuple[str, Rejection]]) -> dict[ReasonKey, tuple[list[str], str]]:
    """One gang's rejections by reason: the clusters that gave it and the first one's
    message (``cluster-b: worker-0 needs cpu 8, largest free node has 0``)."""
    out: dict[ReasonKey, tuple[list[str], str]] = {}
    for cluster, why in rejections:
        entry = out.setdefault((why.code, why.summary), ([], f"{cluster}: {why.message}"))
        entry[0].append(cluster)
    return out


class FailureReasons:
    """Jobs that held quota but fitted no cluster at first, counted under every reason
    a cluster gave (a job counts once per reason)."""

    def __init__(self) -> None:
        self._by_key: dict[ReasonKey, _Tally] = {}

    def count(self, reasons: dict[ReasonKey, tuple[list[str], str]]) -> None:
        """Count one job under each of ``reasons`` (from :func:`grouped`)."""
        for key, (clusters, example) in reasons.items():
            tally = self._by_key.setdefault(key, _Tally(example=example))
            tally.jobs += 1
            tally.clusters.update(clusters)

    def rows(self) -> list[dict[str, Any]]:
        """Report rows, most jobs first (then by reason)."""
        ordered = sorted(self._by_key.items(), key=lambda kv: (-kv[1].jobs, kv[0][1], kv[0][0]))
        return [
            {
                "reason": summary,
                "code": code.value,
                "jobs": t.jobs,
                "clusters": sorted(t.clusters),
                "example": t.example,
            }
            for (code, summary), t in ordered
        ]


# --------------------------------------------------------------------------- summary


def _group_stats(name: str, namespace: str, count: int, jobs: list[Job]) -> dict[str, Any]:
    """A group's times are those of each job's last run (a preempted job waits again
    from its original submit time)."""
    adm = [j.admitted - j.submitted for j in jobs if j.admitted is not None]
    start = [j.started - j.submitted for j in jobs if j.started is not None]
    completed = sum(1 for j in jobs if j.started is not None and not j.binding)
    return {
        "group": name,
        "namespace": namespace,
        "jobs": count,
        "completed": completed,
        "timeToAdmission": stats(adm),
        "timeToStart": stats(start),
        "preempted": sum(j.preempted for j in jobs),
        "wastedCpuSeconds": rounded(sum(j.wasted for j in jobs), 3),
    }


def _preemption(run: Simulation) -> dict[str, Any]:
    """Preemptions by reason and the work they wasted, against the work done."""
    policy = run.preemption
    done = sum(run.cpu[j.gid] * j.run for js in run.jobs for j in js
               if j.started is not None and not j.binding)
    total = done + run.wasted
    return {
        "preemption": policy.preemption.value,
        "reclaim": policy.reclaim.value,
        "fairShareWeights": dict(policy.weights),
        "preemptors": run.preemptors,
        "preempted": sum(run.preemptions.values()),
        "byReason": {r.value: run.preemptions[r] for r in PreemptionReason
                     if r in run.preemptions},
        "capacityPlans": run.capacity_planned,
        "finishedDuringGrace": run.finished_in_grace,
        "wastedCpuSeconds": rounded(run.wasted, 3),
        "completedCpuSeconds": rounded(done, 3),
        "wastedShare": rounded(run.wasted / total) if total else 0.0,
    }


def _class_rows(run: Simulation) -> list[dict[str, Any]]:
    """Per ``jobClass`` of the trace's groups: the jobs of all its groups together."""
    spec = run.trace.spec
    by_class: dict[str, list[int]] = {}
    for gid, g in enumerate(spec.jobs):
        if g.jobClass is not None:
            by_class.setdefault(g.jobClass, []).append(gid)
    classes = []
    for name, gids in by_class.items():
        js = [j for gid in gids for j in run.jobs[gid]]
        row = _group_stats(name, "", sum(spec.jobs[gid].count for gid in gids), js)
        row.pop("group")
        row.pop("namespace")
        classes.append({"class": name, "groups": len(gids), **row})
    return classes


def _quota_rows(run: Simulation, end: float) -> list[dict[str, Any]]:
    """Per quota node: each resource's max and its average and peak usage."""
    quota = []
    for node in run.admission.quota:
        res = {}
        for r in run.quota_res[node.name]:
            s = run.quota_series[f"{node.name}/{r}"]
            mx = node.max.get(r)
            avg = s.average(end)
            res[r] = {
                "max": units(r, mx) if mx is not None else None,
                "averageUsage": units(r, avg),
                "peakUsage": units(r, s.peak()),
                "averageUtilisation": rounded(avg / mx) if mx else None,
                "peakUtilisation": rounded(s.peak() / mx) if mx else None,
            }
        quota.append({"node": node.name, "queue": node.queue, "resources": res})
    return quota


def _cluster_rows(run: Simulation, end: float) -> list[dict[str, Any]]:
    """Per cluster: each resource's allocatable and its average and peak allocation."""
    clusters = []
    for c, tot in run.alloc_total.items():
        res = {}
        for r in sorted(tot, key=resource_order):
            s = run.cluster_series[f"{c}/{r}"]
            avg = s.average(end)
            res[r] = {
                "allocatable": units(r, tot[r]),
                "averageAllocated": units(r, avg),
                "peakAllocated": units(r, s.peak()),
                "averageUtilisation": rounded(avg / tot[r]),
                "peakUtilisation": rounded(s.peak() / tot[r]),
            }
        clusters.append({"cluster": c, "resources": res})
    return clusters


def _queue_rows(run: Simulation, end: float) -> list[dict[str, Any]]:
    """Per queue: its longest and average length and how many wait at the end."""
    queues = []
    for node_name, q in run.queue_of_node.items():
        s = run.qlen_series[q]
        queues.append({
            "queue": q, "node": node_name, "maxLength": int(s.peak()),
            "averageLength": rounded(s.average(end), 3), "waitingAtEnd": run.qlen[q],
        })
    return queues


def build_result(run: Simulation, end: float) -> SimulationResult:
    """The report of ``run``, which ended at virtual time ``end``."""
    t0 = run.t0
    spec = run.trace.spec
    all_jobs = [j for js in run.jobs for j in js]
    groups = []
    for gid, g in enumerate(spec.jobs):
        js = run.jobs[gid]
        groups.append(_group_stats(g.name, g.namespace, g.count, js))
    groups.append(_group_stats("all", "", len(all_jobs), all_jobs))
    classes = _class_rows(run)
    quota = _quota_rows(run, end)
    clusters = _cluster_rows(run, end)
    queues = _queue_rows(run, end)
    reasons = run.reasons.rows()
    never: dict[str, int] = {}
    never_at: dict[str, int] = {}
    for job_id, why in run.inadmissible.items():
        never[why.message] = never.get(why.message, 0) + 1
        request = run.by_id[job_id].request
        leaf = run.admission.quota.leaf_for(request.namespace) if request else ""
        never_at[leaf] = never_at.get(leaf, 0) + 1
    for row in queues:
        row["inadmissibleAtEnd"] = never_at.get(str(row["node"]), 0)
    started = sum(1 for j in all_jobs if j.started is not None)
    admitted = sum(1 for j in all_jobs if j.admitted is not None)
    makespan = (run.last_finish - t0) if run.last_finish is not None else 0.0
    summary: dict[str, Any] = {
        "policy": run.policy.value,
        "starvationSeconds": spec.starvationSeconds,
        "seed": spec.seed,
        "start": rounded(t0),
        "end": rounded(end),
        "makespan": rounded(makespan),
        "jobs": {
            "submitted": len(all_jobs),
            "admitted": admitted,
            "started": started,
            "completed": run.completed,
            "waitingForQuotaAtEnd": len(run.waiting),
            "unplacedAtEnd": run.unplaced_count,
        },
        "groups": groups,
        "classes": classes,
        "queues": queues,
        "quota": quota,
        "clusters": clusters,
        "placementFailures": {
            "delayedJobs": run.delayed,
            "failedAttempts": run.failed_attempts,
            "reasons": reasons,
        },
        "preemption": _preemption(run),
        "states": dict(sorted(run.states.items())),
        # jobs the trace's tree can never admit, by reason (issue 24)
        "inadmissible": {
            "jobs": len(run.inadmissible),
            "reasons": [{"reason": msg, "jobs": n} for msg, n in sorted(never.items())],
        },
    }
    series = {
        "queueLength": dict(run.qlen_series),
        "quotaUtilisation": {
            f"{name}/{r}": scaled(run.quota_series[f"{name}/{r}"], 1.0 / mx)
            for name, res in run.quota_res.items()
            for r in res
            if (mx := run.admission.quota.nodes[name].max.get(r))
        },
        "clusterUtilisation": {
            f"{c}/{r}": scaled(run.cluster_series[f"{c}/{r}"], 1.0 / tot[r])
            for c, tot in run.alloc_total.items()
            for r in sorted(tot, key=resource_order)
        },
    }
    return SimulationResult(summary, series, t0, end)
