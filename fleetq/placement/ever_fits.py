""""Not now" versus "never": could the gang fit a member if every pod on it were gone?

The answer must be certain when it says never (the job then gives its quota back and
parks), so it is a relaxation of the packing, not the greedy itself: on the member's
nodes with nothing requested and every pod slot free (cordoned nodes stay unusable,
nodeSelector and taints apply as always), each pod group must fit on its own and the
gang's total must fit the schedulable nodes' allocatable. Each check is monotone in
free capacity, so a gang that fits now always ever-fits (tests/core/
test_placement_ever_fits.py pins both directions with hypothesis)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from operator import attrgetter

from fleetq.capacity import ClusterSnapshot
from fleetq.models import Gang
from fleetq.placement.columns import ClusterColumns
from fleetq.placement.filters import _ordered
from fleetq.placement.index import PlacementIndex
from fleetq.placement.rule import PodGroup, _pack, pod_groups
from fleetq.rejection import Rejection, RejectionCode
from fleetq.resources import Resources, format_quantity

_EMPTY_VIEW = ("empty-view",)
#: cluster taints that come and go with a member's health (cluster_health): a member
#: tainted so may take the gang later, so it never makes the gang "never"
_HEALTH_TAINT_PREFIX = "cluster.karmada.io/"


def _empty_view(snap: ClusterSnapshot, index: PlacementIndex | None) -> ClusterColumns:
    """The view of ``snap`` with every node empty (allocatable free, all pod slots),
    memoised on the snapshot's own view."""
    cols = (index or PlacementIndex()).columns_of(snap)
    got = cols.memo.get(_EMPTY_VIEW)
    if got is None:
        nodes = [dataclasses.replace(n, requested={}, pods_used=0) for n in snap.nodes]
        got = cols._remember(_EMPTY_VIEW, ClusterColumns(ClusterSnapshot(snap.name, nodes=nodes)))
    return got  # type: ignore[no-any-return]


def _never_on_empty(
    groups: Sequence[PodGroup], total: Resources, npods: int, cols: ClusterColumns
) -> Rejection | None:
    """Why the gang can never fit the empty cluster ``cols``, or None when it may."""
    if npods == 0:
        return None
    for g in sorted(groups, key=attrgetter("order")):
        got = _pack([g], cols, len(g.names))
        if isinstance(got, Rejection):
            return got
    for name, q in total.items():
        r = cols.res_index.get(name)
        have = cols.total_free[r] if r is not None else 0
        if q > have:
            n = int(cols.schedulable.sum())
            return Rejection.of(
                RejectionCode.INSUFFICIENT_CLUSTER_RESOURCE,
                f"the gang needs {name} {format_quantity(name, q)} in total, "
                f"its {n} schedulable nodes have {format_quantity(name, have)} allocatable",
                unresolvable=True,
                resource=name,
                request=q,
                free=have,
                nodes=n,
            )
    if npods > cols.total_slots:
        return Rejection.of(
            RejectionCode.INSUFFICIENT_CLUSTER_POD_SLOTS,
            f"the gang has {npods} pods, its schedulable nodes have {cols.total_slots} "
            "pod slots",
            unresolvable=True,
            pods=npods,
            free=cols.total_slots,
        )
    return None


def ever_fits_cluster(
    gang: Gang, cluster: ClusterSnapshot, index: PlacementIndex | None = None
) -> Rejection | None:
    """Why ``gang`` can never fit ``cluster``'s nodes even with them all empty, or None
    when it may (node level only: no cluster filters)."""
    groups = pod_groups(gang)
    return _never_on_empty(groups, gang.total, len(gang.pods), _empty_view(cluster, index))


def _static_cluster_rejection(reason: Rejection | None) -> bool:
    """A cluster-level rejection that waiting does not lift (affinity, an eviction, a
    configured cluster taint; not a health taint, not unreachability)."""
    if reason is None:
        return False
    code = reason.code
    if code in (RejectionCode.AFFINITY_MISMATCH, RejectionCode.EVICTED):
        return True
    if code == RejectionCode.UNTOLERATED_CLUSTER_TAINT:
        return not str(reason.params.get("taint", "")).startswith(_HEALTH_TAINT_PREFIX)
    return False


_CLUSTER_LEVEL = frozenset({
    RejectionCode.AFFINITY_MISMATCH,
    RejectionCode.EVICTED,
    RejectionCode.UNTOLERATED_CLUSTER_TAINT,
    RejectionCode.CLUSTER_UNREACHABLE,
})


def never_fits(
    gang: Gang,
    clusters: Sequence[ClusterSnapshot],
    reasons: Mapping[str, Rejection] | None = None,
    *,
    groups: Sequence[PodGroup] | None = None,
    index: PlacementIndex | None = None,
) -> Rejection | None:
    """A :data:`RejectionCode.NEVER_FITS` rejection when no cluster could ever hold the
    gang, None when one could (or may: unreachable, health-tainted). ``reasons`` are the
    cluster-level rejections :func:`place_gang` found (affinity, taints, exclusions);
    ``clusters`` without a node-level look are judged on their empty nodes.

    The message names the first pod that fits nowhere when every cluster says so for
    the same pod and resource: ``no member can ever hold master-0 (cpu 40): the largest
    eligible node has 32``; else each cluster's reason."""
    reasons = reasons or {}
    groups = list(groups) if groups is not None else pod_groups(gang)
    total, npods = gang.total, len(gang.pods)
    if not clusters or npods == 0:
        return None
    why: dict[str, Rejection] = {}
    for snap in _ordered(clusters):
        reason = reasons.get(snap.name)
        if reason is not None and reason.code in _CLUSTER_LEVEL:
            if not _static_cluster_rejection(reason):
                return None  # may come back
            why[snap.name] = reason
            continue
        empty = _never_on_empty(groups, total, npods, _empty_view(snap, index))
        if empty is None:
            return None
        why[snap.name] = empty
    return _never_rejection(why, npods)


def _never_rejection(why: Mapping[str, Rejection], npods: int) -> Rejection:
    node_level = [r for r in why.values() if r.code == RejectionCode.INSUFFICIENT_NODE_RESOURCE]
    if node_level and all(r.params.get("placed", 0) == 0 for r in node_level):
        keys = {(r.params["pod"], r.params["resource"], r.params["request"]) for r in node_level}
        if len(keys) == 1:
            ((pod, res, q),) = keys
            largest = max(int(r.params.get("largest_free", 0)) for r in node_level)
            rest = {c: r for c, r in why.items() if r not in node_level}
            tail = "".join(f"; {c}: {r.message}" for c, r in sorted(rest.items()))
            assert isinstance(res, str) and isinstance(q, int)
            return Rejection.of(
                RejectionCode.NEVER_FITS,
                f"no member can ever hold {pod} ({res} {format_quantity(res, q)}): the "
                f"largest eligible node has {format_quantity(res, largest)}{tail}",
                pod=str(pod),
                resource=res,
                request=q,
                largest=largest,
                clusters=len(why),
            )
    parts = "; ".join(f"{c}: {r.message}" for c, r in sorted(why.items()))
    return Rejection.of(
        RejectionCode.NEVER_FITS,
        f"no member can ever hold the gang of {npods} pod{'s' if npods != 1 else ''}: {parts}",
        clusters=len(why),
    )


