"""The room claims' pure logic (fleetq.room_claims): a claim takes its pods' room on its
own nodes only, expires bound seconds after it is recorded, is dropped on release, and
never hides from another job's placement while it is live."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from fleetq.capacity import ClusterSnapshot, NodeCapacity
from fleetq.messages import GangShape, PodGroupShape
from fleetq.resources import CPU
from fleetq.room_claims import NodeClaim, RoomClaim, RoomClaims, claim_of, with_claims

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
