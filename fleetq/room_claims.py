"""Room a capacity preemption made for its preemptor, held for it fleet-wide (pure).

A plan evicts lower-priority gangs from one cluster; until the preemptor is placed (or
its claim expires: longest victim grace + margin), every placement of another job sees
the pods the preemptor will take there as taken, so a victim queued again is not put
back into the room it was evicted from. The claims are durable state of the fleet
registry workflow (``RegistryState.room_claims``), read by every worker's placement
activity; this module is their logic: making a claim, expiry, and applying claims to
snapshots.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from pydantic import BaseModel, Field

from fleetq import resources as R
from fleetq.capacity import ClusterSnapshot
from fleetq.models import Gang

__all__ = ["NodeClaim", "RoomClaim", "RoomClaims", "claim_of", "with_claims"]


class NodeClaim(BaseModel):
    """What the preemptor's pods will take on one node."""

    requests: dict[str, int] = Field(default_factory=dict)
    pods: int = 0


class RoomClaim(BaseModel):
    """The room of ``preemptor`` (its job workflow id) on ``cluster``: node -> claim.
    ``bound_seconds`` is how long it is held; ``expires`` is set when it is recorded."""

    preemptor: str
    cluster: str
    nodes: dict[str, NodeClaim] = Field(default_factory=dict)
    bound_seconds: float = 0.0
    expires: datetime | None = None

    def live(self, now: datetime) -> bool:
        return self.expires is not None and now < self.expires


class RoomClaims(BaseModel):
    """Live claims by preemptor (one claim each: a new plan replaces the last)."""

    claims: dict[str, RoomClaim] = Field(default_factory=dict)

    def claim(self, claim: RoomClaim, now: datetime) -> RoomClaim:
        """Record ``claim``, expiring ``bound_seconds`` after ``now``; drop expired ones."""
        self.expire(now)
        held = claim.model_copy(update={"expires": now + timedelta(seconds=claim.bound_seconds)})
        self.claims[claim.preemptor] = held
        return held

    def release(self, preemptor: str) -> bool:
        """The preemptor is placed or gone: its room is anyone's."""
        return self.claims.pop(preemptor, None) is not None

    def expire(self, now: datetime) -> None:
        for key in [k for k, c in self.claims.items() if not c.live(now)]:
            del self.claims[key]

    def others(self, job_id: str, now: datetime) -> list[RoomClaim]:
        """Live claims a placement of ``job_id`` must respect (all but its own)."""
        return [c for k, c in self.claims.items() if k != job_id and c.live(now)]


def claim_of(preemptor: str, gang: Gang, cluster: str, assignment: dict[str, str],
             bound_seconds: float) -> RoomClaim:
    """The claim of ``gang`` placed on ``cluster`` as ``assignment`` (pod -> node)."""
    nodes: dict[str, NodeClaim] = {}
    for pod in gang.pods:
        node = assignment.get(pod.name_suffix)
        if not node:
            continue
        held = nodes.get(node) or NodeClaim()
        nodes[node] = NodeClaim(requests=R.add(held.requests, pod.requests), pods=held.pods + 1)
    return RoomClaim(preemptor=preemptor, cluster=cluster, nodes=nodes,
                     bound_seconds=bound_seconds)


def with_claims(snapshots: Sequence[ClusterSnapshot], claims: Iterable[RoomClaim]
                ) -> list[ClusterSnapshot]:
    """``snapshots`` with the claimed room taken (fresh snapshot objects, with their own
    ``resource_version``, only for the clusters a claim is on)."""
    by_cluster: dict[str, list[RoomClaim]] = {}
    for c in claims:
        by_cluster.setdefault(c.cluster, []).append(c)
    out: list[ClusterSnapshot] = []
    for snap in snapshots:
        mine = by_cluster.get(snap.name)
        if not mine or not snap.reachable:
            out.append(snap)
            continue
        nodes = []
        for n in snap.nodes:
            taken = [c.nodes[n.name] for c in mine if n.name in c.nodes]
            if not taken:
                nodes.append(n)
                continue
            requested = dict(n.requested)
            pods = n.pods_used
            for held in taken:
                R.add_into(requested, held.requests)
                pods += held.pods
            nodes.append(dataclasses.replace(n, requested=requested, pods_used=pods))
        tag = ",".join(sorted(f"{c.preemptor}@{c.expires}" for c in mine))
        out.append(dataclasses.replace(snap, nodes=nodes,
                                       resource_version=f"{snap.resource_version}+{tag}"))
    return out
