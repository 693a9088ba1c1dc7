"""The room claims' pure logic (fleetq.room_claims): a claim takes its pods' room on its
own nodes only, expires bound seconds after it is recorded, is dropped on release, never
hides from another job's placement while it is live, and counts the preemptor's room once
however many of its pods have bound."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from fleetq.capacity import ClusterSnapshot, NodeCapacity
from fleetq.messages import GangShape, PodGroupShape
from fleetq.preemption import RunningGang, RunningPod
from fleetq.resources import CPU
from fleetq.room_claims import (
    NodeClaim,
    RoomClaim,
    RoomClaims,
    claim_of,
    unclaimed_part,
    with_claims,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_claims_take_room_on_their_nodes_only() -> None:
    gang = GangShape(groups=[PodGroupShape(role="Worker", count=2, requests={CPU: 500})]
                     ).to_gang()
    claim = RoomClaims().claim(
        claim_of("p", gang, "c", {"Worker-0": "n0", "Worker-1": "n1"}, 60), T0)
    snap = ClusterSnapshot(name="c", nodes=[
        NodeCapacity("n0", {CPU: 1000}, {CPU: 100}, pods_used=1),
        NodeCapacity("n1", {CPU: 1000}),
        NodeCapacity("n2", {CPU: 1000})], resource_version="7")
    other = ClusterSnapshot(name="d", nodes=[NodeCapacity("n0", {CPU: 1000})])
    out = with_claims([snap, other], [claim])
    assert [n.requested for n in out[0].nodes] == [{CPU: 600}, {CPU: 500}, {}]
    assert [n.pods_used for n in out[0].nodes] == [2, 1, 0]
    assert out[0].resource_version != snap.resource_version
    assert out[1] is other
    assert snap.nodes[0].requested == {CPU: 100}  # the cached snapshot is not touched
    assert claim.nodes == {"n0": NodeClaim(requests={CPU: 500}, pods=1),
                           "n1": NodeClaim(requests={CPU: 500}, pods=1)}


def test_a_claim_expires_and_is_released() -> None:
    claims = RoomClaims()
    held = claims.claim(RoomClaim(preemptor="p", cluster="c", bound_seconds=30), T0)
    assert held.expires == T0 + timedelta(seconds=30)
    assert claims.others("q", T0 + timedelta(seconds=29)) == [held]
    assert claims.others("p", T0) == []  # its own room is not taken from the preemptor
    assert claims.others("q", T0 + timedelta(seconds=30)) == []
    assert claims.release("p") and not claims.release("p")


events = st.lists(st.tuples(
    st.sampled_from(["claim", "release"]), st.sampled_from("pqr"),
    st.integers(0, 100), st.integers(1, 100)), max_size=30)


@given(events, st.integers(0, 300))
def test_a_live_claim_is_always_seen_by_other_jobs(ops: list[tuple[str, str, int, int]],
                                                   probe: int) -> None:
    """Whatever happened, another job sees exactly the preemptors whose last claim was
    recorded, not released since, and has not expired; continue-as-new keeps them."""
    claims = RoomClaims()
    expected: dict[str, datetime] = {}
    now = T0
    for op, who, step, bound in ops:
        now += timedelta(seconds=step)
        if op == "claim":
            claims.claim(RoomClaim(preemptor=who, cluster="c", bound_seconds=bound), now)
            expected[who] = now + timedelta(seconds=bound)
        else:
            claims.release(who)
            expected.pop(who, None)
    at = now + timedelta(seconds=probe)
    carried = RoomClaims.model_validate_json(claims.model_dump_json())
    for state in (claims, carried):
        seen = {c.preemptor for c in state.others("x", at)}
        assert seen == {w for w, e in expected.items() if at < e}


def test_the_preemptors_own_pods_are_not_counted_twice() -> None:
    """Between the preemptor's bind and the claim's release its pods appear in the
    snapshots: the claim then holds only what they do not take yet. Pods of other jobs,
    or of the preemptor on another cluster, leave the claim as it is."""
    gang = GangShape(groups=[PodGroupShape(role="Worker", count=2, requests={CPU: 500})]
                     ).to_gang()
    claim = claim_of("p", gang, "c", {"Worker-0": "n0", "Worker-1": "n1"}, 60)
    one = RunningGang("p", "c", 1000, (RunningPod("n0", {CPU: 500}),), started_at=1.0)
    other = RunningGang("q", "c", 10, (RunningPod("n1", {CPU: 500}),), started_at=1.0)
    elsewhere = RunningGang("p", "d", 1000, (RunningPod("n1", {CPU: 500}),), started_at=1.0)
    assert unclaimed_part(claim, [other, elsewhere]) is claim
    assert unclaimed_part(claim, [one, other]).nodes == {"n1": NodeClaim(requests={CPU: 500},
                                                                         pods=1)}
    # the first pod bound on n0: the snapshot holds it, the claim the second one
    snap = ClusterSnapshot(name="c", nodes=[
        NodeCapacity("n0", {CPU: 1000}, {CPU: 500}, pods_used=1),
        NodeCapacity("n1", {CPU: 1000})], resource_version="8")
    (out,) = with_claims([snap], [claim], [one])
    assert [n.requested for n in out.nodes] == [{CPU: 500}, {CPU: 500}]
    assert [n.pods_used for n in out.nodes] == [1, 1]


@given(st.lists(st.booleans(), min_size=1, max_size=6))
def test_the_claimed_room_is_counted_once_however_many_pods_bound(bound: list[bool]) -> None:
    """Whichever of the preemptor's pods have bound (as the claim placed them), the nodes
    show the same taken room: the snapshot's pods plus the claim's remainder."""
    groups = [PodGroupShape(role="Worker", count=len(bound), requests={CPU: 100})]
    gang = GangShape(groups=groups).to_gang()
    assignment = {p.name_suffix: f"n{k % 2}" for k, p in enumerate(gang.pods)}
    claim = claim_of("p", gang, "c", assignment, 60)
    pods = [RunningPod(assignment[p.name_suffix], p.requests)
            for p, on in zip(gang.pods, bound, strict=True) if on]
    nodes = []
    for name in ("n0", "n1"):
        mine = [p for p in pods if p.node == name]
        nodes.append(NodeCapacity(name, {CPU: 10_000}, {CPU: 100 * len(mine)} if mine else {},
                                  pods_used=len(mine)))
    snap = ClusterSnapshot(name="c", nodes=nodes)
    running = [RunningGang("p", "c", 1000, tuple(pods), started_at=1.0)] if pods else []
    (out,) = with_claims([snap], [claim], running)
    want = {name: sum(1 for n in assignment.values() if n == name) for name in ("n0", "n1")}
    assert {n.name: n.pods_used for n in out.nodes} == want
    assert {n.name: n.requested.get(CPU, 0) for n in out.nodes} == {
        k: 100 * v for k, v in want.items()}
