"""A placement round runs through ``fleetq.job_machine.round_step`` alone: the candidates
are tried best first, a failed bind (with its Warning) or a lost reservation falls
through to the next one, and the round ends placed, never placeable (Failed), or with no
candidate taking the job; a Hypothesis property for any run of write outcomes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fleetq import job_machine
from fleetq.job_machine import (
    BindFailed,
    BindOn,
    Bound,
    ReleaseReservations,
    ReservationLost,
    RoundCommand,
    RoundEnd,
    RoundEvent,
    Show,
)
from fleetq.lifecycle import Announce, JobProgress, Reason, Transition
from fleetq.messages import (
    Candidate,
    CapacityPlanned,
    CapacityVictim,
    JobView,
    PlacementVerdict,
    Resolution,
)
from fleetq.rejection import Rejection, RejectionCode


def rejected(code: RejectionCode, **messages: str) -> list[Rejection]:
    return [Rejection.of(code, m).at(c) for c, m in messages.items()]


def verdict(*clusters: str, reservation: bool = False) -> PlacementVerdict:
    return PlacementVerdict(
        candidates=[Candidate(cluster=c, score=1.0 - i / 10, reservation=reservation)
                    for i, c in enumerate(clusters)],
        rejections=rejected(
            RejectionCode.INSUFFICIENT_NODE_RESOURCE, full="full: worker-1 needs cpu 2"
        ),
        eligible=[*clusters, "full"],
    )


def binds(commands: list[RoundCommand]) -> list[str]:
    return [c.candidate.cluster for c in commands if isinstance(c, BindOn)]


def test_the_first_candidate_that_binds_places_the_job() -> None:
    current = job_machine.start_round(verdict("a", "b"))
    assert binds(job_machine.round_step(current)) == ["a"]
    assert job_machine.round_step(current, Bound("a")) == [RoundEnd.PLACED]


def test_a_failed_bind_warns_releases_its_reservations_and_tries_the_next() -> None:
    current = job_machine.start_round(verdict("a", "b", reservation=True))
    job_machine.round_step(current)
    commands = job_machine.round_step(current, BindFailed("a", "403 forbidden", reserved=True))
    assert commands == [
        Show((Announce("Warning", Reason.BINDING_FAILED, "Binding on a failed: 403 forbidden"),)),
        ReleaseReservations("a"),
        BindOn(current.candidates[1]),
    ]
    assert current.rejections["a"] == "binding failed: 403 forbidden"
    assert current.codes["a"] == RejectionCode.BINDING_FAILED


def test_a_lost_reservation_falls_through_silently_to_the_next() -> None:
    current = job_machine.start_round(verdict("a", "b", reservation=True))
    job_machine.round_step(current)
    commands = job_machine.round_step(current, ReservationLost("a", "insufficient cpu"))
    assert binds(commands) == ["b"] and not [c for c in commands if isinstance(c, Show)]
    assert current.rejections["a"] == "reservation lost: insufficient cpu"
    assert current.codes["a"] == RejectionCode.RESERVATION_LOST


def test_nothing_taking_the_job_ends_the_round_with_every_reason_kept() -> None:
    current = job_machine.start_round(verdict("a"))
    job_machine.round_step(current)
    assert job_machine.round_step(current, ReservationLost("a", "gone")) == [
        RoundEnd.NO_CANDIDATE
    ]
    assert set(current.rejections) == {"a", "full"}


def test_no_eligible_member_fails_the_job() -> None:
    never = PlacementVerdict(
        candidates=[], rejections=rejected(RejectionCode.EVICTED, a="a: excluded"), eligible=[]
    )
    commands = job_machine.round_step(job_machine.start_round(never))
    assert commands[-1] == RoundEnd.NEVER
    (show,) = [c for c in commands if isinstance(c, Show)]
    assert isinstance(show.notices[-1], Transition) and show.notices[-1].state == "Failed"


OUTCOMES = st.sampled_from(["bound", "failed", "failed-reserved", "lost"])


@given(st.lists(st.sampled_from("abcdef"), min_size=0, max_size=6, unique=True),
       st.lists(OUTCOMES, min_size=6, max_size=6))
def test_a_round_tries_each_candidate_once_in_order_and_ends_once(
    clusters: list[str], outcomes: list[str]
) -> None:
    current = job_machine.start_round(verdict(*clusters))
    commands = job_machine.round_step(current)
    tried: list[str] = []
    ends: list[RoundEnd] = []
    for outcome in outcomes + ["bound"] * 10:
        ends += [c for c in commands if isinstance(c, RoundEnd)]
        next_binds = binds(commands)
        if not next_binds:
            break
        (cluster,) = next_binds
        tried.append(cluster)
        event: RoundEvent = (
            Bound(cluster) if outcome == "bound"
            else ReservationLost(cluster, "x") if outcome == "lost"
            else BindFailed(cluster, "x", reserved=outcome == "failed-reserved")
        )
        commands = job_machine.round_step(current, event)
    assert len(ends) == 1
    assert tried == [c.cluster for c in current.candidates][: len(tried)]
    failed = tried if ends[0] != RoundEnd.PLACED else tried[:-1]
    assert all(c in current.rejections for c in failed)
    assert (ends[0] == RoundEnd.PLACED) == (bool(tried) and tried[-1] not in current.rejections)


def _progress() -> JobProgress:
    view = JobView(namespace="default", name="train", state="Scheduling")
    return JobProgress(view=view, resolution=Resolution())


def test_no_room_waits_pending_with_every_rejection_and_plans_room_only_when_asked() -> None:
    plan = CapacityPlanned(cluster="a", victims=[CapacityVictim(job_id="pytorchjob/x/low")])
    full = PlacementVerdict(
        candidates=[],
        rejections=rejected(RejectionCode.INSUFFICIENT_CLUSTER_RESOURCE, a="a: full", b="b: full"),
        eligible=["a", "b"],
        capacity_plan=plan,
    )
    current = job_machine.start_round(full)
    assert job_machine.round_step(current) == [RoundEnd.NO_CANDIDATE]
    p = _progress()
    assert job_machine.pending(p, current, capacity=False) == Transition(
        "Pending", "a: a: full; b: b: full")
    assert job_machine.room_plan(p, current, capacity=False) is None
    assert job_machine.room_plan(p, current, capacity=True) == plan
