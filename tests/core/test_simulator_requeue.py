"""The simulator's re-queue with backoff (issue 24 item 6): an admitted job not placed
within the tree's ``fleetq.io/placement-timeout-seconds`` gives its quota back and queues
again with its original submit time after ``backoffBase * 2^(n-1)``, failing past
``requeueLimit``, as the job workflow does (``fleetq.lifecycle.requeue_after_timeout``;
Kueue's waitForPodsReady ``requeuingStrategy``, apis/config/v1beta1 configuration_types.go:
``backoffBaseSeconds`` doubling per re-queue, ``backoffLimitCount`` then deactivated)."""

from __future__ import annotations

from typing import Any

import pytest

from fleetq.simulator import parse_trace, simulate
from fleetq.simulator.engine import SimulationError

#: c1 holds one 8-cpu gang, c2 only a 4-cpu one
FLEET = {"clusters": [
    {"name": "c1", "nodeGroups": [{"count": 1, "cpu": "8", "memory": "32Gi"}]},
    {"name": "c2", "nodeGroups": [{"count": 1, "cpu": "4", "memory": "32Gi"}]},
]}


def trace(notes: dict[str, str]) -> dict[str, Any]:
    """``first`` fills c1 for 100 s; ``whole`` (8 cpu) is admitted at 1 s but fits only
    c1; ``small`` (4 cpu, fits c2) waits for the tree's second job slot."""
    return {
        "topology": FLEET,
        "quota": {
            "apiVersion": "scheduling.sigs.k8s.io/v1beta1", "kind": "ElasticQuotaTree",
            "metadata": {"name": "t", "namespace": "kube-system", "annotations": notes},
            "spec": {"root": {"name": "root", "max": {"cpu": 64, "kube-queue/max-jobs": 2},
                              "children": [{"name": "team", "namespaces": ["team"]}]}},
        },
        "jobs": [
            {"name": "first", "namespace": "team", "count": 1, "start": 0,
             "requests": {"cpu": "8"}, "runSeconds": 100},
            {"name": "whole", "namespace": "team", "count": 1, "start": 1,
             "requests": {"cpu": "8"}, "runSeconds": 10},
            {"name": "small", "namespace": "team", "count": 1, "start": 2,
             "requests": {"cpu": "4"}, "runSeconds": 10},
        ],
    }


def run(notes: dict[str, str]) -> dict[str, Any]:
    return simulate(parse_trace(trace(notes))).summary(timeline_points=2)


def mean(summary: dict[str, Any], group: str, what: str) -> float | None:
    (g,) = [g for g in summary["groups"] if g["group"] == group]
    return g[what]["mean"]


def test_without_a_placement_timeout_the_unplaced_job_holds_its_slot() -> None:
    s = run({})  # the default: placement timeout off
    assert s["states"] == {}
    assert mean(s, "small", "timeToAdmission") == 98.0  # until first finishes
    assert mean(s, "whole", "timeToStart") == 99.0
    assert s["jobs"]["completed"] == 3


def test_a_placement_timeout_gives_the_slot_back_and_requeues_with_backoff() -> None:
    s = run({"fleetq.io/placement-timeout-seconds": "30",
             "fleetq.io/requeue-backoff-base-seconds": "10"})
    # whole: admitted 1, times out 31 (back at 41 after 10 s), admitted 41 (small
    # finished then), times out 71 (back at 91 after 20 s), admitted 91, placed at 100
    assert s["states"] == {"requeuedPlacementTimeout": 2}
    assert mean(s, "small", "timeToAdmission") == 29.0  # the slot whole gave back at 31
    assert mean(s, "whole", "timeToStart") == 99.0
    assert mean(s, "whole", "timeToAdmission") == 90.0  # its last admission, at 91
    assert s["jobs"]["completed"] == 3


def test_past_the_requeue_limit_the_job_fails() -> None:
    s = run({"fleetq.io/placement-timeout-seconds": "30",
             "fleetq.io/requeue-backoff-base-seconds": "10",
             "fleetq.io/requeue-limit": "1"})
    assert s["states"] == {"requeuedPlacementTimeout": 1, "failedRequeueLimit": 1}
    assert s["jobs"]["completed"] == 2
    assert mean(s, "whole", "timeToStart") is None


def test_a_bad_requeue_annotation_is_one_line() -> None:
    with pytest.raises(SimulationError) as err:
        run({"fleetq.io/placement-timeout-seconds": "soon"})
    assert str(err.value) == ("quota: metadata.annotations.fleetq.io/placement-timeout-"
                              "seconds must be a number of seconds or off, got 'soon'")
