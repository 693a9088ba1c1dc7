"""A Kueue scheduler-performance generator config as a ``fleetq sim replay`` trace.

Kueue's performance test (``test/performance/scheduler/configs/*/generator.yaml`` in
sigs.k8s.io/kueue, read by ``runner/generator/generator.go``) describes cohorts of
ClusterQueues, each with a nominal cpu quota, a borrowing limit and a preemption policy,
and sets of workloads each ClusterQueue's namespace creates. :func:`trace_from_generator`
maps it onto an ElasticQuotaTree and job groups, so the same workload can be replayed
against fleetq's admission, preemption and placement: a cohort is a parent node whose
``min`` = ``max`` = the sum of its queues' nominal quota (a Kueue cohort has no quota of
its own, only what its queues lend), a ClusterQueue a leaf (``min`` = nominal, ``max`` =
nominal + borrowing limit), ``withinClusterQueue`` / ``reclaimWithinCohort`` the tree's
``fleetq.io/preemption`` / ``fleetq.io/reclaim``. Timing as the generator creates them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fleetq.simulator.trace import TraceError

__all__ = ["KueueGeneratorConfig", "trace_from_generator"]


class _Workload(BaseModel):
    model_config = ConfigDict(extra="ignore")
    className: str
    runtimeMs: int = Field(ge=0)
    priority: int = 0
    request: float | str
    podCount: int = Field(1, ge=0)


class _WorkloadsSet(BaseModel):
    model_config = ConfigDict(extra="ignore")
    count: int = Field(ge=0)
    creationIntervalMs: int = Field(ge=0)
    workloads: list[_Workload]


class _QueuesSet(BaseModel):
    model_config = ConfigDict(extra="ignore")
    className: str
    count: int = Field(ge=0)
    nominalQuota: float | str
    borrowingLimit: float | str | None = None
    reclaimWithinCohort: str = "Never"
    withinClusterQueue: str = "Never"
    workloadsSets: list[_WorkloadsSet]


class _Cohort(BaseModel):
    model_config = ConfigDict(extra="ignore")
    className: str
    count: int = Field(ge=0)
    queuesSets: list[_QueuesSet]


class KueueGeneratorConfig(BaseModel):
    """The part of Kueue's generator config a trace needs (TAS and DRA are ignored)."""

    model_config = ConfigDict(extra="ignore")
    cohorts: list[_Cohort] = Field(min_length=1)


def _cpu(value: float | str) -> float:
    return float(value)


def trace_from_generator(
    config: Mapping[str, Any],
    topology: Mapping[str, Any],
    *,
    preemption: bool = True,
    annotations: Mapping[str, str] | None = None,
    seed: int = 0,
    queue_policy: str = "Priority",
) -> dict[str, Any]:
    """The trace document (as :func:`fleetq.simulator.parse_trace` reads it) of Kueue's
    generator ``config`` on ``topology``. ``preemption=False`` leaves the tree's policy
    ``Never``/``Never`` (the run without preemption); ``annotations`` are put on every
    job (e.g. a grace period). Job names follow the generator's order: the ``k``-th
    workload of a set is created ``(k + 1) * creationIntervalMs`` after the start."""
    try:
        cfg = KueueGeneratorConfig.model_validate(dict(config))
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ()))
        raise TraceError(f"kueue generator config {where}: {err.get('msg')}") from None
    cohorts: list[dict[str, Any]] = []
    groups: list[dict[str, Any]] = []
    within: set[str] = set()
    reclaim: set[str] = set()
    total = 0.0
    for cset in cfg.cohorts:
        for ci in range(cset.count):
            cohort = _cohort(cset, f"{cset.className}-{ci}", groups, within, reclaim)
            cohorts.append(cohort)
            total += cohort["min"]["cpu"]
    notes: dict[str, str] = {}
    if preemption:
        notes["fleetq.io/preemption"] = _one(within, "withinClusterQueue")
        notes["fleetq.io/reclaim"] = _one(reclaim, "reclaimWithinCohort")
    if annotations:
        for g in groups:
            g["annotations"] = dict(annotations)
    return {
        "topology": dict(topology),
        "seed": seed,
        "queuePolicy": queue_policy,
        "quota": {
            "apiVersion": "scheduling.sigs.k8s.io/v1beta1",
            "kind": "ElasticQuotaTree",
            "metadata": {"name": "kueue-baseline", "namespace": "kube-system",
                         **({"annotations": notes} if notes else {})},
            "spec": {"root": {"name": "root", "min": {"cpu": total}, "max": {"cpu": total},
                              "children": cohorts}},
        },
        "jobs": groups,
    }


def _cohort(
    cset: _Cohort, cohort: str, groups: list[dict[str, Any]], within: set[str],
    reclaim: set[str],
) -> dict[str, Any]:
    """The tree node of one generated cohort: one leaf per ClusterQueue, its min the
    ClusterQueue's nominal quota, its max the nominal plus borrowing limit (no limit: the
    cohort's pool). Appends the cohort's trace groups to ``groups`` and its queues'
    preemption settings to ``within`` and ``reclaim``."""
    leaves: list[dict[str, Any]] = []
    pool = 0.0
    for qi, qset in enumerate(cset.queuesSets):
        within.add(qset.withinClusterQueue)
        reclaim.add(qset.reclaimWithinCohort)
        nominal = _cpu(qset.nominalQuota)
        borrow = _cpu(qset.borrowingLimit) if qset.borrowingLimit is not None else None
        for i in range(qset.count):
            # the generator's ClusterQueue and namespace name: class-set-index-cohort
            name = f"{qset.className}-{qi}-{i}-{cohort}"
            leaf: dict[str, Any] = {"name": name, "namespaces": [name],
                                    "min": {"cpu": nominal}}
            leaf["max"] = {"cpu": nominal + borrow} if borrow is not None else {}
            leaves.append(leaf)
            pool += nominal
            groups += _groups(name, qset.workloadsSets, len(groups))
    for leaf in leaves:
        if not leaf["max"]:
            leaf["max"] = {"cpu": pool}
        leaf["max"]["cpu"] = min(leaf["max"]["cpu"], pool)
    return {"name": cohort, "min": {"cpu": pool}, "max": {"cpu": pool}, "children": leaves}


def _one(values: set[str], what: str) -> str:
    """One tree-wide policy (fleetq's is per tree, Kueue's per ClusterQueue)."""
    if len(values) != 1:
        raise TraceError(f"kueue generator config: {what} differs between queues: "
                         f"{sorted(values)}; fleetq sets it per tree")
    value = next(iter(values))
    return value if value in ("Never", "LowerPriority", "Any") else "Never"


def _groups(namespace: str, sets: Sequence[_WorkloadsSet], offset: int) -> list[dict[str, Any]]:
    """One trace group per workload template of each set: the generator creates the
    set's templates in turn, one every ``creationIntervalMs``."""
    out: list[dict[str, Any]] = []
    for si, wset in enumerate(sets):
        step = wset.creationIntervalMs / 1000.0
        per = len(wset.workloads)
        for wi, w in enumerate(wset.workloads):
            out.append({
                "name": f"{w.className}-{offset + len(out)}",
                "namespace": namespace,
                "jobClass": w.className,
                "priority": w.priority,
                "count": wset.count,
                "start": round(step * (wi + 1), 6),
                "interval": round(step * per, 6),
                "workers": max(0, w.podCount - 1),
                "requests": {"cpu": str(w.request)},
                "runSeconds": w.runtimeMs / 1000.0,
            })
        del si
    return out
