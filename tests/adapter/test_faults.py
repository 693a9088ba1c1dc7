"""Members that stop answering or fail requests (emulator fault injection only)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from activities.kube_api import ClusterUnreachable
from activities.member_cluster import KubernetesMemberCluster
from fleetq.messages import BindRequest, JobRef, PodReservation, ReserveRequest
from fleetq.resources import CPU

from .conftest import CONNECT_S, READ_S, TTL_S, eventually, manifest


def assert_gave_up_at_once(sent: Counter[str], reason: str) -> None:
    """One read of an unreachable member: the job's GET sent at most twice (a refused
    connection is tried once more; a silent one times out once; the member's cache and
    probe send their own requests meanwhile)."""
    assert 1 <= sent["GET pytorchjobs"] <= 2, (sent, reason)
    assert f"{reason.split(':')[0]}: unreachable (" in reason, reason


def later(seconds: float, fn: Callable[[], Any]) -> threading.Timer:
    t = threading.Timer(seconds, fn)
    t.start()
    return t


def test_unreachable_member_is_unknown_within_the_timeout_and_recovers(
    emulator: Any, faulty: KubernetesMemberCluster, job_factory: Callable[..., JobRef]
) -> None:
    m = faulty
    job = job_factory("dark")
    m.bind(BindRequest(job=job, manifest=manifest(job)))
    assert m.status(job).health == "Healthy"

    emulator.set_reachable(m.name, False)
    before = m.api.sent_snapshot()
    st = m.status(job)
    assert (st.health, st.phase) == ("Unknown", "Unknown")
    assert m.name in st.reason
    # given up at once, no retry ladder: a refused connection is tried once more (an API
    # server restarting), one that does not answer is not (the /version probe aside)
    assert_gave_up_at_once(m.api.sent_snapshot() - before, st.reason)

    snap = eventually(lambda: not (s := m.capacity()).reachable and s,
                      timeout_s=TTL_S + CONNECT_S + READ_S + 3)
    assert snap.nodes == [] and snap.name == m.name

    with pytest.raises(ClusterUnreachable):
        m.purge(job)
    res = m.reserve(ReserveRequest(job=job, pods=[
        PodReservation(role="master", index=0, node="any", requests={CPU: 1})]))
    assert not res.ok and m.name in res.reason

    # wait_for_change answers at once: Unknown is a change from Healthy.
    healthy_token = "Healthy/Running/0/x"
    before = m.api.sent_snapshot()
    changed = m.wait_for_change(job, healthy_token, timeout_s=30)
    assert changed.health == "Unknown"
    assert_gave_up_at_once(m.api.sent_snapshot() - before, changed.reason)

    emulator.set_reachable(m.name, True)
    eventually(lambda: m.capacity().reachable, timeout_s=15)
    eventually(lambda: m.status(job).health == "Healthy", timeout_s=10)


def test_5xx_is_retried_with_backoff_until_it_clears(
    emulator: Any, faulty: KubernetesMemberCluster, job_factory: Callable[..., JobRef]
) -> None:
    m = faulty
    job = job_factory("flaky")
    emulator.inject_errors(m.name, status=500, rate=1.0)
    timer = later(0.4, lambda: emulator.clear_faults(m.name))
    start = time.monotonic()
    result = m.bind(BindRequest(job=job, manifest=manifest(job)))
    timer.join()
    assert result.created
    assert time.monotonic() - start >= 0.3  # it waited for the fault to clear


def test_429_honours_retry_after(
    emulator: Any, faulty: KubernetesMemberCluster, job_factory: Callable[..., JobRef]
) -> None:
    m = faulty
    job = job_factory("busy")
    emulator.inject_errors(m.name, status=429, rate=1.0, retry_after=1)
    timer = later(0.2, lambda: emulator.clear_faults(m.name))
    start = time.monotonic()
    st = m.status(job)
    timer.join()
    assert st.phase == "Missing"  # a real answer, not Unknown
    assert time.monotonic() - start >= 0.95  # slept for Retry-After: 1


def test_persistent_errors_give_up_in_bounded_time(
    emulator: Any, faulty: KubernetesMemberCluster, job_factory: Callable[..., JobRef]
) -> None:
    m = faulty
    job = job_factory("down")
    emulator.inject_errors(m.name, status=503, rate=1.0)
    start = time.monotonic()
    before = m.api.sent_snapshot()
    st = m.status(job)
    elapsed = time.monotonic() - start
    assert (st.health, st.phase) == ("Unknown", "Unknown")
    assert "503" in st.reason
    assert elapsed >= 0.3  # backed off between attempts
    # then gave up: the retry policy's attempts at the job's GET, no more (the member's
    # cache and probe send their own requests meanwhile)
    sent = m.api.sent_snapshot() - before
    assert sent["GET pytorchjobs"] == m.api.retry.attempts, (sent, st.reason)
    with pytest.raises(ClusterUnreachable, match="503"):
        m.release_reservations(job)


def test_a_watch_notices_a_member_whose_watches_stall_while_its_version_answers(
    emulator: Any, faulty: KubernetesMemberCluster, job_factory: Callable[..., JobRef]
) -> None:
    """A watched job's status comes from the capacity cache's watches (decision 021),
    but a member can stop answering its resource API while ``GET /version`` still
    answers (a sick etcd: the API server serves /version without it), so its open watch
    streams just go quiet and the probe stays green. The watch's ``recheck_s`` safety
    net reads the member itself, so the job goes ``Unknown`` within the watch's window,
    not once the stalled stream's read timeout (a minute) ends it."""
    m = faulty
    job = job_factory("stalled")
    m.bind(BindRequest(job=job, manifest=manifest(job), run_seconds=600))
    running = eventually(lambda: (s := m.status(job)).phase == "Running" and s, timeout_s=30)
    eventually(lambda: m.cache.job_copy(job.namespace, job.name), timeout_s=20)
    emulator.set_latency(m.name, 60.0)
    recheck, m.recheck_s = m.recheck_s, 1.0
    try:
        # A real member's training-operator may still have been writing the job's own
        # progress (replica counts, pods starting) when the stall began: such a change,
        # made before it, is reported first; then the stall shows, and nothing after it
        # is Healthy again.
        seen = [m.wait_for_change(job, running.observed, timeout_s=15)]
        while seen[-1].health == "Healthy" and len(seen) < 4:
            seen.append(m.wait_for_change(job, seen[-1].observed, timeout_s=15))
    finally:
        m.recheck_s = recheck
    st = seen[-1]
    assert (st.health, st.phase) == ("Unknown", "Unknown"), seen
