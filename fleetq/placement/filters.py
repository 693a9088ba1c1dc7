"""Cluster-level filters, applied before any node is looked at: an evicted cluster, one
outside the gang's clusterAffinity, one with a taint its clusterTolerations do not
tolerate, an unreachable one. Also the order clusters are looked at in (by name) and
the order choices are ranked in (score, then name)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from fleetq.capacity import ClusterSnapshot
from fleetq.models import ClusterAffinity
from fleetq.placement.decision import ClusterChoice
from fleetq.placement.tolerations import TolerationLike, _taint_text, untolerated_taints
from fleetq.rejection import Rejection, RejectionCode


def scope_rejection(
    name: str,
    labels: Mapping[str, str],
    affinity: ClusterAffinity | None,
    exclude: Collection[str],
) -> Rejection | None:
    """Why a round does not consider cluster ``name`` at all (evicted from it earlier, or
    outside the gang's clusterAffinity), else None: the one scope filter, applied by the
    placement activity before it reads a member and by the rule itself."""
    if name in exclude:
        return _EVICTED
    if affinity is not None and not affinity.allows(name, labels):
        if name in affinity.exclude:
            return _AFFINITY["exclude"]
        if affinity.clusterNames and name not in affinity.clusterNames:
            return _AFFINITY["clusterNames"]
        return _AFFINITY["labelSelector"]
    return None


def _cluster_reason(
    snap: ClusterSnapshot,
    affinity: ClusterAffinity | None,
    tolerations: Sequence[TolerationLike],
    exclude: Collection[str],
) -> Rejection | None:
    code = RejectionCode
    out_of_scope = scope_rejection(snap.name, snap.labels, affinity, exclude)
    if out_of_scope is not None:
        return out_of_scope
    bad = untolerated_taints(snap.taints, tolerations) if snap.taints else None
    if bad:
        taint = _taint_text(bad[0])
        return Rejection.of(
            code.UNTOLERATED_CLUSTER_TAINT,
            f"cluster taint {taint} not tolerated by clusterTolerations",
            taint=taint,
        )
    if not snap.reachable:
        return _UNREACHABLE
    return None


_EVICTED = Rejection.of(RejectionCode.EVICTED, "excluded (evicted)")
_UNREACHABLE = Rejection.of(RejectionCode.CLUSTER_UNREACHABLE, "unreachable")
_AFFINITY = {
    rule: Rejection.of(RejectionCode.AFFINITY_MISMATCH, message, rule=rule)
    for rule, message in (
        ("exclude", "excluded by clusterAffinity.exclude"),
        ("clusterNames", "not in clusterAffinity.clusterNames"),
        ("labelSelector", "labels do not match clusterAffinity.labelSelector"),
    )
}


def _ordered(clusters: Sequence[ClusterSnapshot]) -> list[ClusterSnapshot]:
    seen: set[str] = set()
    for c in clusters:
        if c.name in seen:
            raise ValueError(f"ClusterSnapshot {c.name!r}: name is given twice")
        seen.add(c.name)
    return sorted(clusters, key=lambda c: c.name)


def _rank(choices: list[ClusterChoice]) -> list[ClusterChoice]:
    return sorted(choices, key=lambda c: (-c.score, c.cluster))

