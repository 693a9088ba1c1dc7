"""Room a capacity preemption made for its preemptor, held for it fleet-wide (pure).

A plan evicts lower-priority gangs from one cluster; until the preemptor's copy is bound
(or its claim expires: longest victim grace + margin), every placement of another job
sees the pods the preemptor will take there as taken, so a victim queued again is not put
back into the room it was evicted from. Pods of the preemptor already on the claimed
nodes are not counted twice: the claim holds only what they do not take yet. The claims
are durable state of the fleet registry workflow (``RegistryState.room_claims``), read by
every worker's placement activity; this module is their logic: making a claim, expiry,
and applying claims to snapshots.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from pydantic import BaseModel, Field

from fleetq import resources as R
from fleetq.capacity import ClusterSnapshot
from fleetq.models import Gang
from fleetq.preemption import RunningGang

__all__ = ["NodeClaim", "RoomClaim", "RoomClaims", "claim_of", "unclaimed_part", "with_claims"]


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


def unclaimed_part(claim: RoomClaim, running: Iterable[RunningGang]) -> RoomClaim:
    """``claim`` less what its preemptor's pods already running on the claimed nodes
    take (floored at nothing): their room is in the snapshot already."""
    taken: dict[str, NodeClaim] = {}
    for gang in running:
        if gang.job_id != claim.preemptor or gang.cluster != claim.cluster:
            continue
        for pod in gang.pods:
            if pod.node in claim.nodes:
                held = taken.get(pod.node) or NodeClaim()
                taken[pod.node] = NodeClaim(requests=R.add(held.requests, pod.requests),
                                            pods=held.pods + 1)
    if not taken:
        return claim
    nodes = {}
    for node, held in claim.nodes.items():
        own = taken.get(node) or NodeClaim()
        left = {k: v for k, v in R.sub(held.requests, own.requests).items() if v > 0}
        pods = max(0, held.pods - own.pods)
        if left or pods:
            nodes[node] = NodeClaim(requests=left, pods=pods)
    return claim.model_copy(update={"nodes": nodes})


def with_claims(snapshots: Sequence[ClusterSnapshot], claims: Iterable[RoomClaim],
                running: Sequence[RunningGang] = ()) -> list[ClusterSnapshot]:
    """``snapshots`` with the claimed room taken (fresh snapshot objects, with their own
    ``resource_version``, only for the clusters a claim is on); ``running``: the fleet's
    gangs on those clusters, so a preemptor's pods already there count once."""
    by_cluster: dict[str, list[RoomClaim]] = {}
    for c in claims:
        by_cluster.setdefault(c.cluster, []).append(unclaimed_part(c, running))
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
