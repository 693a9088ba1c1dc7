"""Gang placement: which member cluster can run *all* pods of a PyTorchJob, node by node.

The reference fleet sums free resources over a cluster's nodes, blind to fragmentation
(8 nodes with 1.5 free cpu each "fit" 4 two-cpu workers); :func:`place_gang` assigns
every pod to a concrete node and offers a cluster only when the gang really fits.
Modules: :mod:`~fleetq.placement.rule` (the specification), :mod:`~fleetq.placement.engine`
(the same decision fleet-wide), :mod:`~fleetq.placement.decision` (``SchedulingRequest`` ->
``PlacementDecision``), :mod:`~fleetq.placement.index` (what the caller's
:class:`PlacementIndex` keeps warm), :mod:`~fleetq.placement.ever_fits` ("not now" versus
"never"). Pure: no I/O, no clock, no randomness, no threads.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from fleetq.capacity import ClusterSnapshot
from fleetq.models import ClusterAffinity, Gang
from fleetq.placement import engine, rule
from fleetq.placement.columns import ClusterColumns
from fleetq.placement.decision import (
    ClusterChoice,
    PlacementDecision,
    SchedulingReply,
    SchedulingRequest,
)
from fleetq.placement.estimate import estimate_sum_of_free
from fleetq.placement.ever_fits import ever_fits_cluster, never_fits
from fleetq.placement.index import PlacementIndex
from fleetq.placement.rule import PodGroup, pod_groups
from fleetq.placement.tolerations import (
    HARD_EFFECTS,
    TolerationLike,
    tolerates,
    untolerated_taints,
)
from fleetq.rejection import Rejection, RejectionCode

__all__ = [
    "HARD_EFFECTS",
    "ClusterChoice",
    "ClusterColumns",
    "PlacementDecision",
    "PlacementIndex",
    "PodGroup",
    "Rejection",
    "RejectionCode",
    "SchedulingReply",
    "SchedulingRequest",
    "TolerationLike",
    "columns_of",
    "estimate_sum_of_free",
    "ever_fits_cluster",
    "fits_node_by_node",
    "forget",
    "never_fits",
    "place_gang",
    "pod_groups",
    "tolerates",
    "untolerated_taints",
]


def place_gang(
    gang: Gang,
    clusters: Sequence[ClusterSnapshot],
    *,
    affinity: ClusterAffinity | None = None,
    cluster_tolerations: Sequence[TolerationLike] = (),
    exclude: Collection[str] = (),
    judge_never: bool = False,
    index: PlacementIndex | None = None,
) -> PlacementDecision:
    """Rank the clusters where the whole gang fits node by node; explain the others.
    With ``judge_never``, when none fits now, also say whether none ever could
    (:attr:`PlacementDecision.never`, :func:`never_fits`; it costs a pass over each
    member's empty nodes, so hot loops that only want a fit leave it off). ``index``
    keeps views warm across calls (see :class:`PlacementIndex`)."""
    request = SchedulingRequest(
        gang, clusters, affinity, cluster_tolerations, exclude, judge_never
    )
    return engine.place(request, index if index is not None else PlacementIndex())


def fits_node_by_node(
    gang: Gang, cluster: ClusterSnapshot, index: PlacementIndex | None = None
) -> dict[str, str] | str:
    """The node-by-node check alone (no cluster-level filters): the assignment
    ``{"worker-1": node}`` or the one-line reason it does not fit (the message of the
    :class:`Rejection` :func:`place_gang` gives that cluster)."""
    cols = columns_of(cluster, index)
    packed = rule._pack(rule.pod_groups(gang), cols, len(gang.pods))
    return packed.message if isinstance(packed, Rejection) else packed.assignment


def columns_of(snapshot: ClusterSnapshot, index: PlacementIndex | None = None) -> ClusterColumns:
    """The columnar view of ``snapshot``, from ``index`` (built afresh without one)."""
    return index.columns_of(snapshot) if index is not None else ClusterColumns(snapshot)


def forget(snapshot: ClusterSnapshot, index: PlacementIndex) -> None:
    """Drop ``index``'s view of ``snapshot`` (after mutating it in place)."""
    index.forget(snapshot)
