"""Issue 24's lifecycle decisions: "never" (Unschedulable, quota given back) versus
"not now", re-queue with backoff after a placement or pods-ready timeout (Kueue's
``waitForPodsReady.requeuingStrategy``, apis/config/v1beta1 configuration_types.go:
``backoffBaseSeconds`` 60, ``backoffMaxSeconds`` 3600, delay ``base * 2^(n-1)``;
after ``backoffLimitCount`` re-queues the workload is deactivated, here Failed), and
events aggregated as client-go does (tools/record/events_cache.go)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetq import lifecycle
from fleetq.fleet_config import (
    PODS_READY_TIMEOUT_ANNOTATION,
    REQUEUE_LIMIT_ANNOTATION,
    FleetConfigError,
    RequeueSettings,
    parse_fleet_config,
    requeue_settings,
)
from fleetq.lifecycle import Announce, Due, JobProgress, Reason, RequeueCause, Transition
from fleetq.messages import JobStatus, PlacementVerdict, PodStatus
from fleetq.rejection import Rejection, RejectionCode
from tests.core.job_progress import at, job_progress


def progress(**view: Any) -> JobProgress:
    return job_progress(**{"name": "big", "state": "Scheduling", **view})


NEVER = "no member can ever hold master-0 (cpu 40): the largest eligible node has 32"


# ---------------------------------------------------------------------- never / not now


def test_a_job_no_member_can_ever_hold_is_unschedulable_and_holds_no_quota() -> None:
    p = progress(admitted=True, queue="team")
    verdict = PlacementVerdict(rejections=[Rejection.of(
        RejectionCode.INSUFFICIENT_NODE_RESOURCE, "master-0 needs cpu 40").at("a")], eligible=["a"],
                               never=NEVER)
    notices = lifecycle.unschedulable(p, verdict)
    assert notices == [
        Announce("Warning", Reason.UNSCHEDULABLE, NEVER),
        Transition(
            "Unschedulable",
            f"{NEVER}; holds no quota, placed again when a member's nodes change",
        ),
    ]
    assert (p.view.admitted, p.view.queue) == (False, None)


def test_a_job_that_fits_an_empty_member_keeps_waiting() -> None:
    p = progress(admitted=True, queue="team")
    verdict = PlacementVerdict(rejections=[Rejection.of(
        RejectionCode.INSUFFICIENT_NODE_RESOURCE, "largest free node has 2").at("a")],
        eligible=["a"])
    assert verdict.ever_fits
    assert lifecycle.unschedulable(p, verdict) == []
    assert p.view.admitted


def test_an_unschedulable_job_queues_again_when_nodes_change() -> None:
    p = progress(state="Unschedulable")
    notices = lifecycle.unparked(p, queued=True)
    assert notices[-1] == Transition("Queued", "a member's nodes changed")
    assert lifecycle.unparked(p, queued=False)[-1].state == "Scheduling"  # type: ignore[union-attr]


# ---------------------------------------------------------------------- settings


def test_requeue_defaults_follow_kueue_where_documented() -> None:
    s = RequeueSettings()
    assert (s.backoffBaseSeconds, s.backoffMaxSeconds) == (60, 3600)
    assert s.placementTimeoutSeconds is None  # "not now" waits, as before
    assert s.podsReadyTimeoutSeconds == 600
    assert s.requeueLimit == 5


def test_backoff_doubles_from_the_base_and_stops_at_the_cap() -> None:
    s = RequeueSettings(backoffBaseSeconds=60, backoffMaxSeconds=3600)
    assert [s.backoff_seconds(n) for n in range(1, 9)] == [
        60, 120, 240, 480, 960, 1920, 3600, 3600
    ]
    assert s.backoff_seconds(10**6) == 3600


@given(base=st.floats(0, 1e4), cap=st.floats(0, 1e5), n=st.integers(1, 10_000))
def test_backoff_is_bounded_and_monotone(base: float, cap: float, n: int) -> None:
    s = RequeueSettings(backoffBaseSeconds=base, backoffMaxSeconds=cap)
    assert 0 <= s.backoff_seconds(n) <= max(cap, 0)
    assert s.backoff_seconds(n) <= s.backoff_seconds(n + 1)


def test_tree_annotations_override_the_fleet_settings() -> None:
    fleet = RequeueSettings(podsReadyTimeoutSeconds=300)
    got = requeue_settings(fleet, {PODS_READY_TIMEOUT_ANNOTATION: "30",
                                   REQUEUE_LIMIT_ANNOTATION: "off"})
    assert (got.podsReadyTimeoutSeconds, got.requeueLimit) == (30, None)
    assert requeue_settings(fleet, {}) is fleet


@pytest.mark.parametrize(("value", "message"), [
    ("soon", "fleetq.io/pods-ready-timeout-seconds must be a number of seconds or off, "
             "got 'soon'"),
    ("-1", "fleetq.io/pods-ready-timeout-seconds input should be greater than 0"),
])
def test_a_bad_tree_annotation_is_one_line_naming_it(value: str, message: str) -> None:
    with pytest.raises(ValueError) as err:
        requeue_settings(RequeueSettings(), {PODS_READY_TIMEOUT_ANNOTATION: value},
                         "ElasticQuotaTree kube-system/tree")
    assert str(err.value) == f"ElasticQuotaTree kube-system/tree: metadata.annotations.{message}"


def test_fleet_yaml_requeue_block_is_validated(tmp_path: Any) -> None:
    (tmp_path / "kc").write_text("{}")
    doc = {"kubeconfig": "kc", "clusters": [{"name": "a"}],
           "requeue": {"podsReadyTimeoutSeconds": 30, "requeueLimit": 2}}
    cfg = parse_fleet_config(doc, tmp_path)
    assert (cfg.requeue.podsReadyTimeoutSeconds, cfg.requeue.requeueLimit) == (30, 2)
    doc["requeue"] = {"backoffBase": 1}
    with pytest.raises(FleetConfigError, match=r"requeue.backoffBase is not a known field"):
        parse_fleet_config(doc, tmp_path)


# ---------------------------------------------------------------------- timeouts


def test_the_placement_timeout_counts_from_admission_and_stops_at_a_bind() -> None:
    s = RequeueSettings(placementTimeoutSeconds=120)
    p = progress()
    lifecycle.admitted_now(p, at(0))
    assert lifecycle.placement_timeout_at(p, s) == at(120)
    assert not lifecycle.placement_timed_out(p, s, at(119))
    assert lifecycle.placement_timed_out(p, s, at(120))
    assert lifecycle.placement_timeout_at(p, RequeueSettings()) is None  # off by default
    lifecycle.arm_pods_ready(p, s, at(10))
    p.view.cluster = "a"
    assert lifecycle.placement_timeout_at(p, s) is None


def test_the_pods_ready_deadline_is_armed_at_bind_and_met_once_the_gang_runs() -> None:
    s = RequeueSettings(podsReadyTimeoutSeconds=30)
    p = progress(cluster="a", state="Created")
    lifecycle.arm_pods_ready(p, s, at(0))
    d = lifecycle.next_deadline(p, tolerance=None, active_deadline_seconds=None, now=at(10))
    assert d is not None and (d.due, d.seconds) == (Due.PODS_READY, 20)
    pods = [PodStatus(name="big-master-0", phase="Running", ready=True, restarts=0),
            PodStatus(name="big-worker-0", phase="Pending", ready=False, restarts=0)]
    lifecycle.pods_ready_seen(p, JobStatus(cluster="a", health="Healthy", phase="Running",
                                           pods=pods), expected=2)
    assert p.ready_by is not None  # one of two pods runs: not ready
    pods[1] = pods[0].model_copy(update={"name": "big-worker-0"})
    lifecycle.pods_ready_seen(p, JobStatus(cluster="a", health="Healthy", phase="Running",
                                           pods=pods), expected=2)
    assert p.ready_by is None
    assert lifecycle.pods_ready(JobStatus(cluster="a", health="Healthy", phase="Running"), 2)
    assert not lifecycle.pods_ready(JobStatus(cluster="a", health="Healthy", phase="Created"), 2)
    assert lifecycle.next_deadline(p, tolerance=None, active_deadline_seconds=None,
                                   now=at(10)) is None


def test_a_timeout_requeues_with_backoff_then_fails_after_the_limit() -> None:
    s = RequeueSettings(podsReadyTimeoutSeconds=30, backoffBaseSeconds=10,
                        backoffMaxSeconds=15, requeueLimit=2)
    p = progress(cluster="a", state="Created", admitted=True, queue="team")
    lifecycle.arm_pods_ready(p, s, at(0))
    first = lifecycle.requeue_after_timeout(p, s, RequeueCause.PODS_READY_TIMEOUT, at(30),
                                            cluster="a")
    assert first[0] == Announce(
        "Warning", Reason.PODS_READY_TIMEOUT,
        "pods not all running on a within podsReadyTimeoutSeconds 30: quota given back; "
        "queued again in 10s (re-queue 1 of 2, original submit time)",
    )
    assert first[1].state == "Queued"  # type: ignore[union-attr]
    assert (p.view.cluster, p.view.admitted, p.view.queue, p.ready_by) == (None, False, None, None)
    assert p.requeue_at == at(40) and lifecycle.backoff_left(p, at(35)) == 5
    lifecycle.backoff_over(p)
    assert p.requeue_at is None and lifecycle.backoff_left(p, at(35)) == 0
    second = lifecycle.requeue_after_timeout(p, s, RequeueCause.PLACEMENT_TIMEOUT, at(100))
    assert "queued again in 15s (re-queue 2 of 2" in second[0].message  # type: ignore[union-attr]
    third = lifecycle.requeue_after_timeout(p, s, RequeueCause.PODS_READY_TIMEOUT, at(200),
                                            cluster="a")
    assert third[-1] == Transition(
        "Failed",
        "PodsReadyTimeout: pods not all running on a within podsReadyTimeoutSeconds 30; "
        "re-queued 2 times already (requeueLimit 2)",
    )
    assert third[0].reason == Reason.REQUEUE_LIMIT_EXCEEDED  # type: ignore[union-attr]


def test_without_a_limit_a_job_requeues_for_ever_at_the_cap() -> None:
    s = RequeueSettings(requeueLimit=None, backoffBaseSeconds=1, backoffMaxSeconds=4)
    p = progress()
    for n in range(50):
        notices = lifecycle.requeue_after_timeout(p, s, RequeueCause.PLACEMENT_TIMEOUT, at(n))
        assert notices[-1].state == "Queued"  # type: ignore[union-attr]
    assert p.requeue_at == at(49 + 4)


# ---------------------------------------------------------------------- events


def test_repeats_aggregate_even_when_other_events_come_between() -> None:
    """client-go's EventCorrelator keys events by (source, object, type, reason,
    message) in an LRU cache, not by "the last one" (events_cache.go getEventKey):
    a FailedScheduling repeated around other events is one event counted seven times,
    shown by kubectl describe as ``(x7 over 21m)``."""
    view = progress().view
    for i in range(7):
        lifecycle.record_event(view, "Warning", Reason.FAILED_SCHEDULING, "no room", at(i * 210))
        lifecycle.record_event(view, "Normal", Reason.QUEUED, f"note {i % 2}", at(i * 210 + 1))
    failed = [e for e in view.events if e.reason == "FailedScheduling"]
    assert len(failed) == 1
    assert (failed[0].count, failed[0].first_time, failed[0].time) == (7, at(0), at(1260))
    assert len(view.events) == 3
    assert view.events[-1].message == "note 0"
    lifecycle.record_event(view, "Normal", Reason.FAILED_SCHEDULING, "no room", at(2000))
    assert len(view.events) == 4  # another type is another event
