"""Capacity preemption's pure parts (issue 18): what a member copy's pods say of their gang
(written by ``member_manifest``, read back by ``gang_pod``), and the job's one plan at a
time (``fleetq.lifecycle``: waiting, victims left, the time bound, the planned cluster
first, cleared by a bind or a requeue)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from fleetq import lifecycle
from fleetq.lifecycle import Announce, CapacityHold, JobProgress, Reason, Transition
from fleetq.member_contract import (
    PRIORITY_ANNOTATION,
    WORKFLOW_ANNOTATION,
    gang_pod,
    member_manifest,
)
from fleetq.messages import (
    BindRequest,
    Candidate,
    CapacityPlanned,
    CapacityVictim,
    JobRef,
    JobView,
    PlacementVerdict,
    Resolution,
)
from fleetq.resources import CPU

NOW = datetime(2026, 1, 1, tzinfo=UTC)
JOB = JobRef(namespace="ns", name="train", workflow_id="pytorchjob/ns/train")


def job_doc(**annotations: str) -> dict[str, Any]:
    template = {"spec": {"containers": [{"name": "pytorch", "image": "i",
                                         "resources": {"requests": {"cpu": "2"}}}]}}
    return {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": "train", "namespace": "ns", "annotations": annotations},
        "spec": {"pytorchReplicaSpecs": {
            "Master": {"replicas": 1, "template": template},
            "Worker": {"replicas": 1, "template": template}}},
    }


def pod_of(copy: dict[str, Any], role: str = "Master", **status: Any) -> dict[str, Any]:
    """A pod as an operator makes it from the copy's template, bound to node n1."""
    template = copy["spec"]["pytorchReplicaSpecs"][role]["template"]
    return {"metadata": {"name": f"train-{role.lower()}-0", "namespace": "ns",
                         **template["metadata"]},
            "spec": {**template["spec"], "nodeName": "n1"},
            "status": {"phase": "Running", "startTime": "2026-01-01T00:00:10Z", **status}}


def test_the_copys_pods_say_whose_gang_they_are_and_at_what_priority() -> None:
    copy = member_manifest(BindRequest(job=JOB, manifest=job_doc(**{
        "fleetq.io/preemption-grace-seconds": "45"}), priority=250))
    for role in ("Master", "Worker"):
        notes = copy["spec"]["pytorchReplicaSpecs"][role]["template"]["metadata"]["annotations"]
        assert notes[WORKFLOW_ANNOTATION] == JOB.workflow_id
        assert notes[PRIORITY_ANNOTATION] == "250"
        assert notes["fleetq.io/preemption-grace-seconds"] == "45"
    got = gang_pod(pod_of(copy))
    assert got is not None
    assert (got.job_id, got.priority, got.preemptible, got.grace_seconds) == (
        JOB.workflow_id, 250, True, 45)
    assert got.pod.node == "n1" and got.pod.requests == {CPU: 2000}
    assert got.started_at == datetime(2026, 1, 1, 0, 0, 10, tzinfo=UTC).timestamp()


def test_pods_that_are_no_candidates() -> None:
    opted = member_manifest(BindRequest(job=JOB, manifest=job_doc(**{
        "fleetq.io/preemptible": "false"}), priority=1))
    got = gang_pod(pod_of(opted))
    assert got is not None and got.preemptible is False
    # a copy bound without a priority (an older workflow): its pods say nothing
    old = member_manifest(BindRequest(job=JOB, manifest=job_doc()))
    assert "annotations" not in old["spec"]["pytorchReplicaSpecs"]["Master"]["template"][
        "metadata"]
    assert gang_pod(pod_of(old)) is None
    fresh = member_manifest(BindRequest(job=JOB, manifest=job_doc(), priority=1))
    assert gang_pod(pod_of(fresh, phase="Succeeded")) is None
    unbound = pod_of(fresh)
    del unbound["spec"]["nodeName"]
    assert gang_pod(unbound) is None
    bad = pod_of(fresh)
    bad["metadata"]["annotations"] = {**bad["metadata"]["annotations"],
                                      "fleetq.io/preemptible": "maybe"}
    assert gang_pod(bad) is not None and gang_pod(bad).preemptible is False  # type: ignore[union-attr]


def plan(*victims: str, grace: int = 5) -> CapacityPlanned:
    return CapacityPlanned(cluster="cluster-b", victims=[
        CapacityVictim(job_id=v, priority=10, grace_seconds=grace,
                       message="room on cluster-b for priority 1000 > 10") for v in victims])


def progress() -> JobProgress:
    return JobProgress(view=JobView(namespace="hi", name="job", state="Scheduling"),
                       resolution=Resolution())


def test_one_plan_at_a_time_shown_while_its_victims_stop() -> None:
    p = progress()
    assert lifecycle.may_plan_capacity(p) and lifecycle.planned_capacity(p) is None
    notices = lifecycle.start_capacity_preemption(
        p, plan("pytorchjob/lo/a", "pytorchjob/lo/b", grace=30), NOW)
    assert notices == [
        Announce("Normal", Reason.PREEMPTING,
                 "no member has room: preempting 2 lower-priority jobs on cluster-b (room on "
                 "cluster-b for priority 1000 > 10): lo/a, lo/b; dropped after 90s"),
        Transition("Pending", "waiting for 2 preempted jobs to leave cluster-b: lo/a, lo/b"),
    ]
    assert not lifecycle.may_plan_capacity(p)
    assert lifecycle.planned_capacity(p) == plan("pytorchjob/lo/a", "pytorchjob/lo/b", grace=30)
    # a victim whose workflow is gone is not waited for; one that left is not either
    lifecycle.victims_gone(p, ["pytorchjob/lo/a"])
    assert p.capacity is not None and p.capacity.left == ["pytorchjob/lo/b"]
    assert lifecycle.observe_capacity(p, PlacementVerdict(victims_left=[]), NOW) == []
    assert lifecycle.capacity_waiting_reason(p.capacity) == (
        "preempted jobs left cluster-b; placing there as soon as it has room")
    # it survives continue-as-new
    assert JobProgress.model_validate_json(p.model_dump_json()).capacity == p.capacity


def test_the_planned_cluster_first_and_the_pause_cut_at_the_bound() -> None:
    p = progress()
    verdict = PlacementVerdict(candidates=[
        Candidate(cluster=c, score=s) for c, s in (("cluster-a", 9), ("cluster-c", 8),
                                                    ("cluster-d", 7), ("cluster-b", 1))])
    assert [c.cluster for c in lifecycle.candidates(verdict, p)] == [
        "cluster-a", "cluster-c", "cluster-d"]
    lifecycle.start_capacity_preemption(p, plan("pytorchjob/lo/a"), NOW)
    assert [c.cluster for c in lifecycle.candidates(verdict, p)] == [
        "cluster-b", "cluster-a", "cluster-c"]
    assert lifecycle.capacity_pause(60.0, p, NOW + timedelta(seconds=50)) == 15.0
    assert lifecycle.capacity_pause(4.0, p, NOW) == 4.0


def test_a_plan_past_its_bound_is_dropped_once_and_none_is_made_again() -> None:
    p = progress()
    lifecycle.start_capacity_preemption(p, plan("pytorchjob/lo/a"), NOW)
    still = PlacementVerdict(victims_left=["pytorchjob/lo/a"])
    assert lifecycle.observe_capacity(p, still, NOW + timedelta(seconds=64)) == []
    # room on the planned cluster at the bound: not dropped (it is being placed there)
    room = PlacementVerdict(candidates=[Candidate(cluster="cluster-b", score=1)],
                            victims_left=["pytorchjob/lo/a"])
    assert lifecycle.observe_capacity(p, room, NOW + timedelta(seconds=70)) == []
    dropped = lifecycle.observe_capacity(p, still, NOW + timedelta(seconds=65))
    assert dropped == [Announce(
        "Warning", Reason.PREEMPTION_DROPPED,
        "capacity preemption on cluster-b dropped: 1 preempted job(s) still there after 65s; "
        "placing as usual")]
    assert isinstance(p.capacity, CapacityHold) and p.capacity.dropped
    assert lifecycle.observe_capacity(p, still, NOW + timedelta(seconds=99)) == []
    assert not lifecycle.may_plan_capacity(p) and lifecycle.planned_capacity(p) is None
    verdict = PlacementVerdict(candidates=[Candidate(cluster="cluster-a", score=1),
                                           Candidate(cluster="cluster-b", score=0)])
    assert [c.cluster for c in lifecycle.candidates(verdict, p)] == ["cluster-a", "cluster-b"]
    # bound somewhere, or queued again: a later placement may plan again
    lifecycle.record_bind(p, "cluster-a", {}, NOW)
    assert lifecycle.may_plan_capacity(p)
    lifecycle.start_capacity_preemption(p, plan("pytorchjob/lo/a"), NOW)
    lifecycle.forget_placement(p)
    assert lifecycle.may_plan_capacity(p)


def test_no_room_is_not_never_placeable() -> None:
    assert lifecycle.no_room(PlacementVerdict(eligible=["cluster-a"]))
    assert not lifecycle.no_room(PlacementVerdict())
    assert not lifecycle.no_room(PlacementVerdict(
        eligible=["cluster-a"], candidates=[Candidate(cluster="cluster-a", score=1)]))
