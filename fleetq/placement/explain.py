"""Why a pod finds no node: the one-line, coded :class:`~fleetq.rejection.Rejection` the
rule's greedy gives a cluster (no node matches the nodeSelector, all cordoned, taints
not tolerated, pod slots full, a resource short on every node, ...), naming the pod
and the numbers a user acts on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from fleetq.placement.columns import ClusterColumns, IntArray
from fleetq.placement.tolerations import _taint_text
from fleetq.rejection import Rejection, RejectionCode
from fleetq.resources import format_quantity, format_resources

if TYPE_CHECKING:
    from fleetq.placement.rule import PodGroup

_NO_NODES = Rejection.of(RejectionCode.NO_NODES, "no nodes")


def _selector_text(selector: tuple[tuple[str, str], ...]) -> str:
    return ",".join(f"{k}={v}" for k, v in selector)

def _explain_ineligible(cols: ClusterColumns, g: PodGroup, pod: str) -> Rejection:
    n = len(cols)
    if n == 0:
        return _NO_NODES
    code = RejectionCode
    sel = cols.selector_mask(g.selector)
    if not sel.any():
        if g.selector:
            text = _selector_text(g.selector)
            return Rejection.of(
                code.NODE_SELECTOR_MISMATCH,
                f"no node matches nodeSelector {text} for {pod}",
                pod=pod,
                selector=text,
            )
        return Rejection.of(code.NO_NODES, f"no node for {pod}", pod=pod)  # n == 0 above
    sched = sel & cols.schedulable
    if not sched.any():
        what = f"matching nodeSelector {_selector_text(g.selector)} " if g.selector else ""
        cordoned = int(sel.sum())
        return Rejection.of(
            code.NODES_CORDONED,
            f"no schedulable node {what}for {pod} ({cordoned} cordoned)",
            pod=pod,
            cordoned=cordoned,
        )
    tolerated = cols.toleration_mask(g.tolerations)
    tol = sched & tolerated
    if not tol.any():
        first = int(np.flatnonzero(sched)[0])
        example = ""
        for taints, idx in cols.taint_groups.items():
            if first in set(idx.tolist()):
                example = ", ".join(_taint_text(t) for t in taints)
                break
        nodes = int(sched.sum())
        return Rejection.of(
            code.UNTOLERATED_NODE_TAINTS,
            f"{pod} does not tolerate the taints of any of the {nodes} nodes "
            f"it could use (e.g. {cols.names[first]}: {example})",
            # certain only when no cordoned node could take it once uncordoned
            unresolvable=not (sel & tolerated).any(),
            pod=pod,
            nodes=nodes,
            node=cols.names[first],
            taints=example,
        )
    nodes = int(tol.sum())
    return Rejection.of(
        code.NODE_POD_SLOTS_FULL,
        f"no free pod slot for {pod} on the {nodes} nodes it could use",
        pod=pod,
        nodes=nodes,
    )


def _larger_than_any_node(cols: ClusterColumns, g: PodGroup, r: int, q: int) -> bool:
    """No node the pod may use (cordoned or not, empty or not) has ``q`` of resource
    row ``r`` allocatable: the pod cannot fit this cluster until its nodes change."""
    mask = cols.selector_mask(g.selector) & cols.toleration_mask(g.tolerations)
    return not mask.any() or int(cols.alloc[r][mask].max()) < q


def _node_shortfall(
    cols: ClusterColumns, g: PodGroup, pod: str, r: int, q: int, best: int, placed: int, total: int
) -> Rejection:
    name = cols.resources[r]
    suffix = f" ({placed} of {total} pods placed)" if placed else ""
    return Rejection.of(
        RejectionCode.INSUFFICIENT_NODE_RESOURCE,
        f"{pod} needs {name} {format_quantity(name, q)}, "
        f"largest free node has {format_quantity(name, max(best, 0))}{suffix}",
        unresolvable=_larger_than_any_node(cols, g, r, q),
        pod=pod,
        resource=name,
        request=q,
        largest_free=max(best, 0),
        placed=placed,
        pods=total,
    )


def _explain_short(
    cols: ClusterColumns,
    g: PodGroup,
    free: IntArray,
    slots: IntArray,
    k: IntArray,
    placed_in_group: int,
    placed_before: int,
    total_pods: int,
    groups: Sequence[PodGroup] = (),
) -> Rejection:
    """Why pod ``placed_in_group`` of ``g`` finds no node once the gang's earlier pods
    (``placed_before`` of other groups, ``k`` copies of this one) are on their nodes.
    A pod (in gang order) that could use no node at all is reported first."""
    for other in groups:
        if not cols.usable_mask(other.selector, other.tolerations).any():
            return _explain_ineligible(cols, other, other.names[0])
    elig = cols.usable_mask(g.selector, g.tolerations)
    if not elig.any():
        return _explain_ineligible(cols, g, g.names[0])
    pod = g.names[placed_in_group]
    placed = placed_before + placed_in_group
    suffix = f" ({placed} of {total_pods} pods placed)" if placed else ""
    ke = k[elig]
    for name, q in g.requests:
        r = cols.res_index[name]
        after = free[r][elig] - ke * q
        best = int(after.max())
        if best < q:
            return _node_shortfall(cols, g, pod, r, q, best, placed, total_pods)
    if int((slots[elig] - ke).max()) <= 0:
        nodes = int(elig.sum())
        return Rejection.of(
            RejectionCode.NODE_POD_SLOTS_EXHAUSTED,
            f"{pod} needs a pod slot, all {nodes} nodes it could use are full{suffix}",
            pod=pod,
            nodes=nodes,
            placed=placed,
            pods=total_pods,
        )
    return Rejection.of(
        RejectionCode.NO_NODE_FITS_ALL,
        f"{pod} needs {format_resources(dict(g.requests))} on one node, "
        f"no node has all of it free{suffix}",
        pod=pod,
        placed=placed,
        pods=total_pods,
    )

