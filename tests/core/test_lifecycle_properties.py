"""Property tests of the job lifecycle's rules (fleetq.lifecycle) over random histories:
the failover timer, the backoffs, the deadlines, the event log and the purge targets."""

from __future__ import annotations

from datetime import datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from fleetq import lifecycle
from fleetq.lifecycle import Backoff, Due, Reason
from fleetq.messages import JobStatus
from tests.core.job_progress import T0
from tests.core.job_progress import job_progress as progress

HEALTHS = ("Healthy", "Unhealthy", "Unknown")




steps = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=120),  # seconds since the previous status
        st.sampled_from(HEALTHS),
        st.integers(min_value=0, max_value=120),  # when to ask for the deadline after it
    ),
    min_size=1,
    max_size=30,
)


@given(tolerance=st.integers(min_value=0, max_value=300), history=steps)
def test_failover_fires_exactly_after_tolerance_of_continuous_unhealthiness(
    tolerance: int, history: list[tuple[int, str, int]]
) -> None:
    """Unhealthy starts the timer, Healthy resets it, Unknown (unreachable) does neither:
    the failover is due at a time iff the job has been unhealthy since at least
    tolerationSeconds before it, and the deadline names that very instant."""
    p = progress(cluster="a")
    now = T0
    unhealthy_since: datetime | None = None  # the reference model
    for gap, health, probe in history:
        now += timedelta(seconds=gap)
        phase = "Unknown" if health == "Unknown" else "Running"
        lifecycle.observe(p, JobStatus(cluster="a", health=health, phase=phase), now)  # type: ignore[arg-type]
        if health == "Healthy":
            unhealthy_since = None
        elif health == "Unhealthy" and unhealthy_since is None:
            unhealthy_since = now
        asked = now + timedelta(seconds=probe)
        deadline = lifecycle.next_deadline(
            p, tolerance=tolerance, active_deadline_seconds=None, now=asked
        )
        if unhealthy_since is None:
            assert deadline is None
            continue
        assert deadline is not None and deadline.due == Due.FAILOVER
        due_at = unhealthy_since + timedelta(seconds=tolerance)
        assert asked + timedelta(seconds=deadline.seconds) == due_at
        assert (deadline.seconds <= 0) == (asked >= due_at)


@given(
    tolerance=st.integers(min_value=0, max_value=300),
    has_deadline=st.booleans(),
    deadline_s=st.integers(min_value=-100, max_value=400),
    has_evict=st.booleans(),
    evict_s=st.integers(min_value=-100, max_value=400),
    has_grace=st.booleans(),
    grace_s=st.integers(min_value=-100, max_value=400),
    unhealthy=st.booleans(),
)
def test_the_deadline_is_the_nearest_armed_one(
    tolerance: int,
    has_deadline: bool,
    deadline_s: int,
    has_evict: bool,
    evict_s: int,
    has_grace: bool,
    grace_s: int,
    unhealthy: bool,
) -> None:
    p = progress(cluster="a", unhealthy_since=T0 if unhealthy else None)
    armed: dict[Due, float] = {}
    if unhealthy:
        armed[Due.FAILOVER] = float(tolerance)
    if has_deadline:
        p.view.deadline_at = T0 + timedelta(seconds=deadline_s)
        armed[Due.DEADLINE] = float(deadline_s)
    if has_evict:
        p.evict_at, p.evict_reason = T0 + timedelta(seconds=evict_s), "a: unreachable"
        armed[Due.EVICT] = float(evict_s)
    if has_grace:
        p.graceful_old, p.grace_deadline = "b", T0 + timedelta(seconds=grace_s)
        armed[Due.GRACE] = float(grace_s)
    deadline = lifecycle.next_deadline(p, tolerance=tolerance, active_deadline_seconds=1, now=T0)
    if not armed:
        assert deadline is None
        return
    assert deadline is not None
    assert deadline.seconds == min(armed.values())
    assert armed[deadline.due] == deadline.seconds
    assert deadline.timer_seconds >= lifecycle.MIN_TIMER_SECONDS


backoffs = st.tuples(
    st.floats(min_value=0.001, max_value=100), st.floats(min_value=0.001, max_value=1000)
).map(lambda t: Backoff(initial=min(t), cap=max(t)))


@given(backoff=backoffs, rounds=st.integers(min_value=1, max_value=40))
def test_backoff_is_monotone_capped_and_reaches_its_cap(backoff: Backoff, rounds: int) -> None:
    delays = [backoff.initial]
    for _ in range(rounds):
        delays.append(backoff.after(delays[-1]))
    assert all(a <= b for a, b in zip(delays, delays[1:], strict=False))
    assert all(d <= backoff.cap for d in delays)
    if rounds >= 20 and backoff.cap <= backoff.initial * 2**19:
        assert delays[-1] == backoff.cap


@given(
    delay=st.floats(min_value=0.001, max_value=60),
    left=st.one_of(st.none(), st.floats(min_value=-100, max_value=100)),
)
def test_placement_pause_never_sleeps_past_the_active_deadline(
    delay: float, left: float | None
) -> None:
    deadline_at = None if left is None else T0 + timedelta(seconds=left)
    pause = lifecycle.placement_pause(delay, deadline_at, T0)
    assert lifecycle.MIN_TIMER_SECONDS <= pause <= max(delay, lifecycle.MIN_TIMER_SECONDS)
    if deadline_at is not None:
        left_s = (deadline_at - T0).total_seconds()  # (at microsecond resolution)
        if left_s >= lifecycle.MIN_TIMER_SECONDS:
            assert pause <= left_s


events = st.lists(
    st.tuples(st.sampled_from([Reason.PURGED, Reason.FAILED_SCHEDULING]), st.sampled_from("ab")),
    max_size=80,
)


@given(history=events)
def test_the_event_log_is_bounded_and_aggregates_repeats(history: list[tuple[Reason, str]]) -> None:
    view = progress().view
    for i, (reason, message) in enumerate(history):
        lifecycle.record_event(view, "Normal", reason, message, T0 + timedelta(seconds=i))
        assert view.events[-1].reason == reason.value and view.events[-1].message == message
        assert view.events[-1].time == T0 + timedelta(seconds=i)
    assert len(view.events) <= lifecycle.MAX_EVENTS
    pairs = [(e.reason, e.message) for e in view.events]
    assert all(a != b for a, b in zip(pairs, pairs[1:], strict=False))
    if len(view.events) < lifecycle.MAX_EVENTS:  # nothing dropped: every event counted
        assert sum(e.count for e in view.events) == len(history)


clusters = st.sampled_from(["a", "b", "c", "d"])


@given(
    current=st.one_of(st.none(), clusters),
    copies=st.lists(clusters, max_size=4),
    pending=st.lists(clusters, max_size=4),
    graceful=st.one_of(st.none(), clusters),
)
def test_every_copy_is_purged_exactly_once(
    current: str | None, copies: list[str], pending: list[str], graceful: str | None
) -> None:
    p = progress(cluster=current, copies=copies, pending_purges=pending)
    p.graceful_old = graceful
    targets = lifecycle.copies_to_purge(p)
    assert len(targets) == len(set(targets))
    expected = set(copies) | set(pending) | {c for c in (current, graceful) if c}
    assert set(targets) == expected
    on_delete = lifecycle.copies_to_purge(p, current=False)
    assert set(on_delete) == set(copies) | set(pending) | ({graceful} if graceful else set())


signals = st.lists(
    st.one_of(
        st.tuples(
            st.just("suspend"), st.sampled_from(["Queued", "Running", "Suspended", "Failed"])
        ),
        st.tuples(st.just("resume"), st.just("")),
        st.tuples(st.just("step"), st.just("")),
    ),
    max_size=40,
)


@given(history=signals)
def test_suspend_and_resume_never_contradict_each_other(history: list[tuple[str, str]]) -> None:
    """Whatever order the signals come in: a resume is pending only for a job that is
    suspending or suspended, never together with a suspension not carried out; the
    workflow's steps (carry out a wanted suspension, end one whose resume came) keep it so."""
    s = lifecycle.Suspension()
    for kind, state in history:
        if kind == "suspend":
            s.ask_suspend(state)  # type: ignore[arg-type]
        elif kind == "resume":
            s.ask_resume()
        elif s.wanted:
            s.begin()
        elif s.resume_wanted:
            s.end()
        assert not (s.wanted and s.resume_wanted)
        assert not s.resume_wanted or s.active
