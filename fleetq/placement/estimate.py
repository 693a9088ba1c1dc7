"""The reference fleet's capacity estimate (:func:`estimate_sum_of_free`): a cluster fits
when the gang's total request is at most the free resources summed over its schedulable
nodes, blind to fragmentation. Placement uses its shortfall (:func:`_sum_shortfall`) as
a cheap necessary check before packing; the estimate itself is kept for comparison."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

from fleetq.capacity import ClusterSnapshot
from fleetq.models import ClusterAffinity, Gang
from fleetq.placement.columns import ClusterColumns
from fleetq.placement.decision import ClusterChoice, PlacementDecision
from fleetq.placement.filters import _cluster_reason, _ordered, _rank
from fleetq.placement.tolerations import TolerationLike
from fleetq.rejection import Rejection, RejectionCode
from fleetq.resources import Resources, format_quantity

if TYPE_CHECKING:
    from fleetq.placement.index import PlacementIndex


def _sum_shortfall(total: Resources, npods: int, cols: ClusterColumns) -> Rejection | None:
    """Why the summed free resources of the schedulable nodes cannot hold the gang."""
    for name, q in total.items():
        if q <= 0:
            continue
        r = cols.res_index.get(name)
        have = cols.total_free[r] if r is not None else 0
        if q > have:
            n = int(cols.schedulable.sum())
            # all nodes, cordoned ones included, empty: still too little
            whole = sum(cols.alloc[r].tolist()) if r is not None else 0
            return Rejection.of(
                RejectionCode.INSUFFICIENT_CLUSTER_RESOURCE,
                f"needs {name} {format_quantity(name, q)} in total, "
                f"{format_quantity(name, have)} free summed over {n} schedulable nodes",
                unresolvable=q > whole,
                resource=name,
                request=q,
                free=have,
                nodes=n,
            )
    if npods > cols.total_slots:
        n = int(cols.schedulable.sum())
        return Rejection.of(
            RejectionCode.INSUFFICIENT_CLUSTER_POD_SLOTS,
            f"needs {npods} pod slots, {cols.total_slots} free over {n} schedulable nodes",
            pods=npods,
            free=cols.total_slots,
            nodes=n,
        )
    return None


def estimate_sum_of_free(
    gang: Gang,
    clusters: Sequence[ClusterSnapshot],
    *,
    affinity: ClusterAffinity | None = None,
    cluster_tolerations: Sequence[TolerationLike] = (),
    exclude: Collection[str] = (),
    index: PlacementIndex | None = None,
) -> PlacementDecision:
    """The reference fleet's estimate: a cluster fits when the gang's total request is at
    most the free resources (and pod slots) summed over its schedulable nodes, ignoring
    fragmentation, nodeSelector and node taints. Choices carry no assignment; the score is
    the cluster-wide utilisation after placement, averaged over requested resources."""
    total = gang.total
    npods = len(gang.pods)
    ranked: list[ClusterChoice] = []
    rejected: dict[str, Rejection] = {}
    for snap in _ordered(clusters):
        reason = _cluster_reason(snap, affinity, cluster_tolerations, exclude)
        if reason is not None:
            rejected[snap.name] = reason
            continue
        cols = index.columns_of(snap) if index is not None else ClusterColumns(snap)
        reason = _sum_shortfall(total, npods, cols)
        if reason is not None:
            rejected[snap.name] = reason
            continue
        utils = []
        for name, q in total.items():
            r = cols.res_index.get(name)
            if q > 0 and r is not None and cols.total_alloc[r] > 0:
                utils.append(1.0 - (cols.total_free[r] - q) / cols.total_alloc[r])
        score = round(sum(utils) / len(utils), 9) if utils else 0.0
        ranked.append(ClusterChoice(snap.name, score, {}))
    return PlacementDecision(_rank(ranked), rejected)
