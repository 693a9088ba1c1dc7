"""The placement seam: a :class:`SchedulingRequest` (a gang, the member snapshots and the
cluster-level filters) goes in, a :class:`PlacementDecision` (the ``SchedulingReply``:
clusters where the gang fits node by node, best first, and why the others do not) comes
out. The rule (:mod:`fleetq.placement.rule`) and the engine
(:mod:`fleetq.placement.engine`) both answer it, and answer it equally."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from fleetq.capacity import ClusterSnapshot
from fleetq.models import ClusterAffinity, Gang
from fleetq.placement.tolerations import TolerationLike
from fleetq.rejection import Rejection


@dataclass(frozen=True)
class SchedulingRequest:
    """Where can ``gang`` run? Over ``clusters`` (names unique), after the cluster-level
    filters (``affinity``, ``cluster_tolerations``, ``exclude``). With ``judge_never``,
    when none fits now, also say whether none ever could."""

    gang: Gang
    clusters: Sequence[ClusterSnapshot]
    affinity: ClusterAffinity | None = None
    cluster_tolerations: Sequence[TolerationLike] = ()
    exclude: Collection[str] = ()
    judge_never: bool = False


@dataclass(frozen=True)
class ClusterChoice:
    cluster: str
    score: float
    assignment: dict[str, str]  # "worker-1" -> node name ({} for sum-of-free estimates)


@dataclass(frozen=True)
class PlacementDecision:
    ranked: list[ClusterChoice]  # feasible clusters, best first
    reasons: dict[str, Rejection]  # cluster -> why it was turned down
    #: "never", as opposed to "not now": no candidate cluster could hold the gang even
    #: with all its nodes empty (:func:`never_fits`); None when some could or may
    never: Rejection | None = None

    @property
    def best(self) -> ClusterChoice | None:
        return self.ranked[0] if self.ranked else None

    @property
    def ever_fits(self) -> bool:
        """Some member could hold the gang once room is freed (always so when it fits
        now): waiting can help."""
        return self.never is None

    @property
    def rejections(self) -> dict[str, str]:
        """Cluster -> one-line reason as users read it (without the cluster name)."""
        return {c: r.message for c, r in self.reasons.items()}

    def rejection_lines(self) -> list[str]:
        """``cluster-b: worker-1 needs cpu 2, largest free node has 1.5``, one per cluster."""
        return [f"{c}: {r}" for c, r in self.rejections.items()]

    def summary(self, max_items: int = 5) -> str:
        """Compact text for events and the UI:
        ``cluster-a (score 0.83); also fits: cluster-d (0.71); rejected: cluster-b: ...``."""
        parts: list[str] = []
        if self.best is None:
            parts.append("no cluster fits")
        else:
            parts.append(f"{self.best.cluster} (score {self.best.score:.2f})")
            others = self.ranked[1 : 1 + max_items]
            if others:
                more = len(self.ranked) - 1 - len(others)
                text = ", ".join(f"{c.cluster} ({c.score:.2f})" for c in others)
                parts.append("also fits: " + text + (f" (+{more} more)" if more else ""))
        lines = self.rejection_lines()
        if lines:
            more = len(lines) - max_items
            text = "; ".join(lines[:max_items])
            parts.append("rejected: " + text + (f" (+{more} more)" if more > 0 else ""))
        return "; ".join(parts)



#: the reply to a :class:`SchedulingRequest`
SchedulingReply = PlacementDecision
