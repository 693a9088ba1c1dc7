"""The placement rule: which member cluster can run *all* pods of a gang, node by node.
The specification; :mod:`fleetq.placement.engine` computes the same decisions fleet-wide
(tests/core/test_placement_properties.py holds the two equal).

1. Filters (:mod:`~fleetq.placement.filters`); free resources and slots must cover the gang.
2. Pods of one shape (requests, nodeSelector, tolerations) form a group; groups go largest
   dominant share of the cluster's largest node first (:func:`pod_groups`, :func:`plan_order`).
3. A node holds ``min(free // request)`` copies (slots cap; 0 if cordoned, unselected or an
   untolerated NoSchedule/NoExecute taint), most-allocated first like kube-scheduler's
   ``MostAllocated``, keeping empty nodes free. Sound, not complete.
4. Score in [0, 1]: utilisation of the landed nodes; ties to the lower cluster name.
Why a cluster fails: :mod:`~fleetq.placement.explain`. Pure: no I/O, clock or randomness.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from fleetq.capacity import ClusterSnapshot
from fleetq.models import Gang, GangPod
from fleetq.placement.columns import ClusterColumns, IntArray
from fleetq.placement.decision import ClusterChoice, PlacementDecision, SchedulingRequest
from fleetq.placement.estimate import _sum_shortfall
from fleetq.placement.explain import _NO_NODES, _explain_ineligible, _explain_short, _node_shortfall
from fleetq.placement.filters import _cluster_reason, _ordered, _rank
from fleetq.placement.tolerations import _tol_fields
from fleetq.rejection import Rejection, RejectionCode
from fleetq.resources import format_quantity

if TYPE_CHECKING:
    from fleetq.placement.index import PlacementIndex


# --------------------------------------------------------------------------- gang shapes


@dataclass
class PodGroup:
    """Pods of one gang with identical requests, nodeSelector and tolerations: they
    compete for the same nodes, so placement packs them together."""

    pods: list[GangPod]
    requests: tuple[tuple[str, int], ...]  # only positive requests, sorted by name
    selector: tuple[tuple[str, str], ...]
    tolerations: tuple[tuple[str, str, str, str], ...]
    order: int  # position of its first pod in the gang
    names: list[str] = field(default_factory=list)
    key: str = ""  # memo key of (selector, tolerations) for ClusterColumns.eligible_slots


def pod_groups(gang: Gang) -> list[PodGroup]:
    """The gang's pods grouped by shape (requests, nodeSelector, tolerations), groups in
    the order of their first pod."""
    out: dict[Any, PodGroup] = {}
    prev: GangPod | None = None
    g: PodGroup | None = None
    for pos, pod in enumerate(gang.pods):
        if (
            g is not None
            and prev is not None
            and pod.requests == prev.requests
            and pod.node_selector == prev.node_selector
            and pod.tolerations == prev.tolerations
        ):  # same shape as the pod before (the usual run of workers): same group
            g.pods.append(pod)
            g.names.append(pod.name_suffix)
            continue
        prev = pod
        req = tuple(sorted((k, int(v)) for k, v in pod.requests.items() if v > 0))
        sel = tuple(sorted((str(k), str(v)) for k, v in pod.node_selector.items()))
        tols = tuple(_tol_fields(t) for t in pod.tolerations)
        key = (req, sel, tols)
        g = out.get(key)
        if g is None:
            g = out[key] = PodGroup([], req, sel, tols, pos, key=repr((sel, tols)))
        g.pods.append(pod)
        g.names.append(pod.name_suffix)
    return list(out.values())


def plan_order(groups: Sequence[PodGroup], cols: ClusterColumns) -> tuple[int, ...]:
    """The order groups are placed in on ``cols``: largest dominant share (of the
    cluster's largest node per resource) first, ties in gang order. A cluster lacking a
    requested resource gets gang order (the gang cannot fit there in any order)."""
    keys: list[tuple[float, int, int]] = []
    for gi, g in enumerate(groups):
        share = 0.0
        for name, q in g.requests:
            r = cols.res_index.get(name)
            if r is None or cols.max_alloc[r] == 0:
                return tuple(range(len(groups)))
            share = max(share, q / cols.max_alloc[r])
        keys.append((-share, g.order, gi))
    if len(keys) > 1:
        keys.sort()
    return tuple(gi for _s, _o, gi in keys)


# --------------------------------------------------------------------------- the greedy


@dataclass
class _Packed:
    assignment: dict[str, str]
    used: IntArray  # distinct node indices the gang lands on


Plan = list[tuple["PodGroup", list[tuple[int, int]]]]


def _plans(groups: Sequence[PodGroup], cols: ClusterColumns, total_pods: int) -> Plan | Rejection:
    """Each group with its requests as ``(resource row, quantity)``, in gang order, or
    why the gang cannot fit: a resource no node offers, a request larger than any
    schedulable node's free amount (the first such pod in gang order)."""
    plans: Plan = []
    for g in groups:
        rq: list[tuple[int, int]] = []
        for name, q in g.requests:
            r = cols.res_index.get(name)
            if r is None or cols.max_alloc[r] == 0:
                return Rejection.of(
                    RejectionCode.RESOURCE_NOT_OFFERED,
                    f"{g.names[0]} needs {name} {format_quantity(name, q)}, no node has any",
                    pod=g.names[0],
                    resource=name,
                    request=q,
                )
            rq.append((r, q))
        plans.append((g, rq))
    max_free = cols.max_free
    for g, rq in plans:
        for r, q in rq:
            if q > max_free[r]:
                if max_free[r] == 0 and not cols.schedulable.any():
                    return _explain_ineligible(cols, g, g.names[0])
                return _node_shortfall(cols, g, g.names[0], r, q, max_free[r], 0, total_pods)
    return plans


def _copies(
    g: PodGroup,
    rq: Sequence[tuple[int, int]],
    cols: ClusterColumns,
    free: IntArray,
    slots: IntArray,
) -> IntArray:
    """``k[i]``: copies of ``g``'s pod node ``i`` can still hold (0 where it may not go)."""
    k = np.minimum(cols.eligible_slots(g.selector, g.tolerations, g.key), slots)
    for r, q in rq:
        np.minimum(k, free[r] // q, out=k)
    return k


def _pack(groups: list[PodGroup], cols: ClusterColumns, total_pods: int) -> _Packed | Rejection:
    """Assign every pod of ``groups`` to a node of ``cols`` (groups in :func:`plan_order`,
    nodes in fill order, each filled with as many copies as it holds) or explain the
    first pod that does not fit."""
    if total_pods == 0:
        return _Packed({}, np.zeros(0, dtype=np.int64))
    if len(cols) == 0:
        return _NO_NODES
    plans = _plans(groups, cols, total_pods)
    if isinstance(plans, Rejection):
        return plans
    plans = [plans[i] for i in plan_order(groups, cols)]
    free = cols.free.copy()
    slots = cols.slots.copy()
    assignment: dict[str, str] = {}
    used: list[IntArray] = []
    placed_before = 0
    for g, rq in plans:
        need = len(g.names)
        k = _copies(g, rq, cols, free, slots)
        cs = np.cumsum(k)
        got = int(cs[-1])
        if got < need:
            return _explain_short(cols, g, free, slots, k, got, placed_before, total_pods, groups)
        pos = int(cs.searchsorted(need))  # the fill stops at node `pos`
        nodes = np.flatnonzero(k[: pos + 1])
        takes = k[nodes]
        takes[-1] -= int(cs[pos]) - need
        picked = nodes.repeat(takes).tolist()
        assignment.update(zip(g.names, [cols.names[j] for j in picked], strict=True))
        placed_before += need
        used.append(nodes)
        for r, q in rq:
            free[r, nodes] -= takes * q
        slots[nodes] -= takes
    return _Packed(assignment, np.unique(np.concatenate(used)))


def _score(
    gang_total: Mapping[str, int], npods: int, cols: ClusterColumns, used: IntArray
) -> float:
    """Mean utilisation, over the resources the gang requests, of the nodes it lands on
    after it is there (pod slots when it requests nothing)."""
    if not len(used):
        return 0.0
    sums = cols.free_alloc[:, used].sum(axis=1).tolist()
    nres = len(cols.resources)
    total = 0.0
    count = 0
    for name, q in gang_total.items():
        r = cols.res_index.get(name)
        if q <= 0 or r is None or sums[nres + r] <= 0:
            continue
        total += 1.0 - (sums[r] - q) / sums[nres + r]
        count += 1
    if not count:
        cap = int(cols.slots[used].sum())
        return round(npods / cap, 9) if cap else 0.0
    return round(total / count, 9)


# --------------------------------------------------------------------------- the decision


def decide(
    gang: Gang, groups: list[PodGroup], snap: ClusterSnapshot, cols: ClusterColumns
) -> ClusterChoice | Rejection:
    """One cluster past the cluster filters: the summed-free check, then the greedy."""
    npods = len(gang.pods)
    quick = _sum_shortfall(gang.total, npods, cols)
    if quick is not None:
        return quick
    packed = _pack(groups, cols, npods)
    if isinstance(packed, Rejection):
        return packed
    return ClusterChoice(snap.name, _score(gang.total, npods, cols, packed.used), packed.assignment)


def schedule(request: SchedulingRequest, index: PlacementIndex | None = None) -> PlacementDecision:
    """The decision for ``request``, cluster by cluster (views from ``index`` if given)."""
    gang = request.gang
    groups = pod_groups(gang)
    snaps = _ordered(request.clusters)
    ranked: list[ClusterChoice] = []
    rejected: dict[str, Rejection] = {}
    for snap in snaps:
        got: ClusterChoice | Rejection | None = _cluster_reason(
            snap, request.affinity, request.cluster_tolerations, request.exclude
        )
        if got is None:  # past the cluster filters: look at its nodes
            cols = index.columns_of(snap) if index is not None else ClusterColumns(snap)
            got = decide(gang, groups, snap, cols)
        if isinstance(got, Rejection):
            rejected[snap.name] = got
        else:
            ranked.append(got)
    never = None
    if not ranked and request.judge_never:
        from fleetq.placement.ever_fits import never_fits  # ever_fits builds on this rule

        never = never_fits(gang, snaps, rejected, groups=groups, index=index)
    return PlacementDecision(_rank(ranked), rejected, never)

