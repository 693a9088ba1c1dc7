# The kubernetes client's models make every field Optional and CustomObjectsApi returns
# `object`; in these tests a None where a value is expected fails the assertion anyway.
# mypy: disable-error-code="union-attr,index,arg-type,return-value,misc,operator,attr-defined"
"""Simulated controllers: PyTorchJob operator, gang scheduler, reservations, faults."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import urllib3
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from fleetq.emulator.fleet import EmulatedFleet
from fleetq.kube_values import parse_rfc3339

from .conftest import api_client, conditions, pytorchjob, wait_for

KF = ("kubeflow.org", "v1")
RES = ("scheduling.koordinator.sh", "v1alpha1", "reservations")
WALKTHROUGH = Path(__file__).resolve().parents[2] / "examples" / "pytorch-test.yaml"


def _job(custom: client.CustomObjectsApi, name: str, ns: str = "default") -> dict[str, Any]:
    return custom.get_namespaced_custom_object(*KF, ns, "pytorchjobs", name)


def _pods(core: client.CoreV1Api, job: str, ns: str = "default") -> list[client.V1Pod]:
    sel = f"training.kubeflow.org/job-name={job}"
    return sorted(core.list_namespaced_pod(ns, label_selector=sel).items,
                  key=lambda p: p.metadata.name)


def _reservation(name: str, cpu: str, owner_job: str, role: str = "worker", index: int = 0,
                 node: str | None = None, ttl: str = "10m", owner: str = "o1") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "reserve",
                                            "resources": {"requests": {"cpu": cpu}}}]}
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Reservation",
        "metadata": {"name": name, "labels": {"fleetq.io/owner": owner}},
        "spec": {
            "template": {"metadata": {"namespace": "default"}, "spec": spec},
            "owners": [{"labelSelector": {"matchLabels": {
                "training.kubeflow.org/job-name": owner_job,
                "training.kubeflow.org/replica-type": role,
                "training.kubeflow.org/replica-index": str(index)}}}],
            "ttl": ttl, "allocateOnce": True,
        },
    }


def counts(job: dict[str, Any]) -> dict[str, dict[str, int]]:
    """replicaStatuses without the operator's per-type ``selector`` (its UpdateJobStatus
    sets it on every sync until the job ends)."""
    return {r: {k: v for k, v in c.items() if k != "selector"}
            for r, c in job["status"]["replicaStatuses"].items()}


def _unschedulable(pod: client.V1Pod) -> bool:
    """The scheduler has looked at the pod and left it unbound (PodScheduled False)."""
    return pod.spec.node_name is None and any(
        c.type == "PodScheduled" and c.status == "False" for c in pod.status.conditions or [])


def test_pytorchjob_runs_and_succeeds(fleet: EmulatedFleet, core: client.CoreV1Api,
                                      custom: client.CustomObjectsApi) -> None:
    # held running (its run-seconds far ahead) until its Running state is checked
    body = pytorchjob("train", 2, annotations={"fleetq.io/run-seconds": "3600"})
    custom.create_namespaced_custom_object(*KF, "default", "pytorchjobs", body)
    pods = wait_for(lambda: (p := _pods(core, "train")) and all(
        x.status.phase == "Running" for x in p) and len(p) == 3 and p)
    assert [p.metadata.name for p in pods] == ["train-master-0", "train-worker-0",
                                               "train-worker-1"]
    master = pods[0]
    assert master.metadata.labels["training.kubeflow.org/replica-type"] == "master"
    assert master.metadata.labels["training.kubeflow.org/replica-index"] == "0"
    assert master.metadata.labels["training.kubeflow.org/operator-name"] == "pytorchjob-controller"
    ref = master.metadata.owner_references[0]
    assert (ref.kind, ref.name, ref.controller) == ("PyTorchJob", "train", True)
    assert master.spec.scheduler_name == "default-scheduler"
    assert master.spec.restart_policy == "Never"
    assert master.status.container_statuses[0].ready and master.status.start_time
    assert conditions(_job(custom, "train")).get("Running") == "True"

    assert fleet.complete_job("alpha", "default", "train")
    job = wait_for(lambda: (j := _job(custom, "train")) and
                   conditions(j).get("Succeeded") == "True" and j, timeout=4)
    assert conditions(job)["Running"] == "False"
    assert counts(job) == {"Master": {"succeeded": 1}, "Worker": {"succeeded": 2}}
    assert job["status"]["completionTime"] and job["status"]["startTime"]
    assert {p.status.phase for p in _pods(core, "train")} == {"Succeeded"}
    reasons = {e.reason for e in core.list_namespaced_event("default").items}
    assert {"Scheduled", "SuccessfulCreatePod", "PyTorchJobSucceeded"} <= reasons


def test_a_job_held_running_succeeds_when_completed(fleet: EmulatedFleet,
                                                    core: client.CoreV1Api,
                                                    custom: client.CustomObjectsApi) -> None:
    """What the crash matrix holds a leaf with: a job whose run-seconds are far ahead
    runs until the test completes it, then succeeds as if its time were up."""
    assert not fleet.complete_job("alpha", "default", "held")  # no such job
    body = pytorchjob("held", 1, annotations={"fleetq.io/run-seconds": "3600"})
    custom.create_namespaced_custom_object(*KF, "default", "pytorchjobs", body)
    wait_for(lambda: (p := _pods(core, "held")) and len(p) == 2
             and all(x.status.phase == "Running" for x in p))
    assert conditions(_job(custom, "held")).get("Running") == "True"
    assert fleet.complete_job("alpha", "default", "held")
    job = wait_for(lambda: (j := _job(custom, "held")) and
                   conditions(j).get("Succeeded") == "True" and j)
    assert counts(job) == {"Master": {"succeeded": 1}, "Worker": {"succeeded": 1}}
    assert {p.status.phase for p in _pods(core, "held")} == {"Succeeded"}
    assert not fleet.complete_job("alpha", "default", "held")  # nothing running now
    custom.delete_namespaced_custom_object(*KF, "default", "pytorchjobs", "held")
    wait_for(lambda: not _pods(core, "held"))


def test_a_job_succeeds_when_its_run_seconds_are_up(core: client.CoreV1Api,
                                                   custom: client.CustomObjectsApi) -> None:
    body = pytorchjob("timed", 1, annotations={"fleetq.io/run-seconds": "2"})
    custom.create_namespaced_custom_object(*KF, "default", "pytorchjobs", body)
    job = wait_for(lambda: (j := _job(custom, "timed")) and
                   conditions(j).get("Succeeded") == "True" and j, timeout=30)
    started = parse_rfc3339(job["status"]["startTime"])
    completed = parse_rfc3339(job["status"]["completionTime"])
    assert started is not None and completed is not None
    assert (completed - started).total_seconds() >= 2  # not before its run-seconds
    assert {p.status.phase for p in _pods(core, "timed")} == {"Succeeded"}
    custom.delete_namespaced_custom_object(*KF, "default", "pytorchjobs", "timed")
    wait_for(lambda: not _pods(core, "timed"))


def test_gang_that_cannot_fit_stays_fully_pending(core: client.CoreV1Api,
                                                  custom: client.CustomObjectsApi) -> None:
    # 3 workers of 3 cpu: two 4-cpu nodes fit two; the gpu node is tainted -> none bind
    custom.create_namespaced_custom_object(*KF, "default", "pytorchjobs",
                                           pytorchjob("huge", 3, worker_cpu="3"))
    pods = wait_for(lambda: (p := _pods(core, "huge")) and len(p) == 4 and all(
        any(c.type == "PodScheduled" and c.status == "False" for c in x.status.conditions or [])
        for x in p) and p)
    assert all(p.spec.node_name is None and p.status.phase == "Pending" for p in pods)
    cond = next(c for c in pods[1].status.conditions if c.type == "PodScheduled")
    assert cond.reason == "Unschedulable" and "Insufficient cpu" in cond.message
    events = [e for e in core.list_namespaced_event("default").items
              if e.reason == "FailedScheduling"]
    assert events and "gang of 4" in events[-1].message
    custom.delete_namespaced_custom_object(*KF, "default", "pytorchjobs", "huge")
    wait_for(lambda: not _pods(core, "huge"))


def test_pending_gang_starts_when_capacity_frees(fleet: EmulatedFleet, core: client.CoreV1Api,
                                                 custom: client.CustomObjectsApi) -> None:
    custom.create_namespaced_custom_object(*KF, "default", "pytorchjobs",
                                           pytorchjob("first", 2, worker_cpu="3"))
    wait_for(lambda: all(p.status.phase == "Running" for p in _pods(core, "first"))
             and len(_pods(core, "first")) == 3)
    custom.create_namespaced_custom_object(*KF, "default", "pytorchjobs",
                                           pytorchjob("second", 1, worker_cpu="3"))
    wait_for(lambda: (p := _pods(core, "second")) and len(p) == 2
             and all(_unschedulable(x) for x in p))
    assert fleet.fail_job("alpha", "default", "first")
    job = _job(custom, "first")
    assert conditions(job)["Failed"] == "True"
    assert {p.status.phase for p in _pods(core, "first")} == {"Failed"}
    wait_for(lambda: all(p.status.phase == "Running" for p in _pods(core, "second")))
    for name in ("first", "second"):
        custom.delete_namespaced_custom_object(*KF, "default", "pytorchjobs", name)
    wait_for(lambda: not _pods(core, "first") and not _pods(core, "second"))


def test_racing_reservations_never_both_available(custom: client.CustomObjectsApi,
                                                  alpha: client.ApiClient) -> None:
    results: list[dict[str, Any]] = []

    def create(i: int) -> None:
        api = client.CustomObjectsApi(alpha)
        results.append(api.create_cluster_custom_object(
            *RES, _reservation(f"race-{i}", "3", "r", node="alpha-g0-1")))

    threads = [threading.Thread(target=create, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    phases = sorted(r["status"]["phase"] for r in results)
    assert phases == ["Available", "Failed", "Failed", "Failed"]
    failed = next(r for r in results if r["status"]["phase"] == "Failed")
    assert "Insufficient cpu" in failed["status"]["message"]
    for r in results:
        custom.delete_cluster_custom_object(*RES, r["metadata"]["name"])


def test_reservation_is_honoured_and_consumed(core: client.CoreV1Api,
                                              custom: client.CustomObjectsApi) -> None:
    res = custom.create_cluster_custom_object(
        *RES, _reservation("held", "3500m", "resjob", node="alpha-g0-0", owner="abc"))
    assert res["status"] == {**res["status"], "phase": "Available", "nodeName": "alpha-g0-0"}
    # the held room is not given to others: a 1-cpu pod pinned to that node waits
    core.create_namespaced_pod("default", client.V1Pod(
        metadata=client.V1ObjectMeta(name="squatter"),
        spec=client.V1PodSpec(
            node_selector={"kubernetes.io/hostname": "alpha-g0-0"},
            containers=[client.V1Container(
                name="c", image="x",
                resources=client.V1ResourceRequirements(requests={"cpu": "1"}))])))
    wait_for(lambda: _unschedulable(core.read_namespaced_pod("squatter", "default")))
    affinity = json.dumps({"reservationSelector": {"fleetq.io/owner": "abc"}})
    body = pytorchjob("resjob", 1, worker_cpu="3",
                      template_annotations={
                          "scheduling.koordinator.sh/reservation-affinity": affinity})
    body["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 1
    # the master has no reservation: give it one on the other node
    custom.create_cluster_custom_object(
        *RES, _reservation("held-m", "100m", "resjob", role="master", node="alpha-g0-1",
                           owner="abc"))
    custom.create_namespaced_custom_object(*KF, "default", "pytorchjobs", body)
    pods = wait_for(lambda: (p := _pods(core, "resjob")) and len(p) == 2 and all(
        x.spec.node_name for x in p) and p)
    assert {p.metadata.name: p.spec.node_name for p in pods} == {
        "resjob-master-0": "alpha-g0-1", "resjob-worker-0": "alpha-g0-0"}
    held = custom.get_cluster_custom_object(*RES, "held")
    assert held["status"]["phase"] == "Succeeded"
    assert held["status"]["currentOwners"][0]["name"] == "resjob-worker-0"
    custom.delete_namespaced_custom_object(*KF, "default", "pytorchjobs", "resjob")
    core.delete_namespaced_pod("squatter", "default")
    for name in ("held", "held-m"):
        custom.delete_cluster_custom_object(*RES, name)


def test_reservation_affinity_without_reservation_waits(core: client.CoreV1Api,
                                                        custom: client.CustomObjectsApi) -> None:
    affinity = json.dumps({"reservationSelector": {"fleetq.io/owner": "nobody"}})
    body = pytorchjob("orphan", 1, template_annotations={
        "scheduling.koordinator.sh/reservation-affinity": affinity})
    custom.create_namespaced_custom_object(*KF, "default", "pytorchjobs", body)
    pods = wait_for(lambda: (p := _pods(core, "orphan")) and all(
        any(c.reason == "Unschedulable" for c in x.status.conditions or []) for x in p) and p)
    assert all(p.spec.node_name is None for p in pods)
    custom.delete_namespaced_custom_object(*KF, "default", "pytorchjobs", "orphan")


def test_reservation_expires_and_frees_its_room(custom: client.CustomObjectsApi) -> None:
    r = custom.create_cluster_custom_object(
        *RES, _reservation("short", "3", "x", node="alpha-g0-1", ttl="1s"))
    assert r["status"]["phase"] == "Available"
    blocked = custom.create_cluster_custom_object(
        *RES, _reservation("blocked", "3", "x", node="alpha-g0-1"))
    assert blocked["status"]["phase"] == "Failed"
    expired = wait_for(lambda: (o := custom.get_cluster_custom_object(*RES, "short"))
                       and o["status"]["phase"] == "Failed" and o, timeout=3)
    assert expired["status"]["reason"] == "Expired"
    again = custom.create_cluster_custom_object(
        *RES, _reservation("after", "3", "x", node="alpha-g0-1"))
    assert again["status"]["phase"] == "Available"
    past = custom.create_cluster_custom_object(*RES, {
        **_reservation("past", "1", "x"),
        "spec": {**_reservation("past", "1", "x")["spec"], "ttl": None,
                 "expires": "2000-01-01T00:00:00Z"}})
    assert past["status"]["phase"] == "Failed"
    for name in ("short", "blocked", "after", "past"):
        custom.delete_cluster_custom_object(*RES, name)


def test_unreachable_cluster_refuses_connections_quickly(fleet: EmulatedFleet) -> None:
    api = api_client(fleet.kubeconfig_path, "beta")
    api.configuration.retries = 0
    core = client.CoreV1Api(api)
    assert core.list_node().items
    fleet.set_reachable("beta", False)
    try:
        with pytest.raises(urllib3.exceptions.HTTPError) as caught:
            client.CoreV1Api(api).list_node(_request_timeout=2)
        # refused (or dropped) at once, never left to the read timeout
        reason = getattr(caught.value, "reason", caught.value)
        assert isinstance(reason, urllib3.exceptions.NewConnectionError
                          | urllib3.exceptions.ProtocolError), caught.value
    finally:
        fleet.set_reachable("beta", True)
    assert client.CoreV1Api(api_client(fleet.kubeconfig_path, "beta")).list_node().items


def test_injected_errors_and_latency(fleet: EmulatedFleet) -> None:
    api = api_client(fleet.kubeconfig_path, "beta")
    core = client.CoreV1Api(api)
    fleet.inject_errors("beta", status=500, rate=1.0)
    with pytest.raises(ApiException) as err:
        core.list_node()
    assert err.value.status == 500
    fleet.inject_errors("beta", status=429, rate=1.0, retry_after=1)
    try:
        # a write: the client retries reads itself when it sees Retry-After
        with pytest.raises(ApiException) as err:
            core.create_namespaced_config_map(
                "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="e")))
        assert err.value.status == 429 and err.value.headers["Retry-After"] == "1"
    finally:
        fleet.clear_faults("beta")
    fleet.set_latency("beta", 0.3)
    t0 = time.monotonic()
    core.list_node()
    assert time.monotonic() - t0 >= 0.3
    fleet.clear_faults("beta")


def test_cordon_marks_the_node_unschedulable(fleet: EmulatedFleet, core: client.CoreV1Api) -> None:
    assert fleet.cordon("alpha", "alpha-gpu-0", True)
    assert core.read_node("alpha-gpu-0").spec.unschedulable is True
    assert fleet.cordon("alpha", "alpha-gpu-0", False)
    assert not core.read_node("alpha-gpu-0").spec.unschedulable
    assert not fleet.cordon("alpha", "no-such-node", True)


def test_walkthrough_job_fits_every_default_member(tmp_path: Path) -> None:
    job = yaml.safe_load(WALKTHROUGH.read_text())
    with EmulatedFleet(out_dir=tmp_path, start_delay=0.01) as f:
        assert f.members == ["cluster-a", "cluster-b", "cluster-c"]
        for name in f.members:
            api = api_client(f.kubeconfig_path, name)
            client.CustomObjectsApi(api).create_namespaced_custom_object(
                *KF, "default", "pytorchjobs", job)
        for name in f.members:
            wait_for(lambda n=name: len(pods := f.objects(n, "pods")) == 3 and all(
                p["status"]["phase"] == "Running" for p in pods))
        assert f.objects("hub", "nodes") == []
        fleet_cfg = yaml.safe_load(f.fleet_config_path.read_text())
        assert fleet_cfg["source"] == {"context": "hub"}
        assert [c["name"] for c in fleet_cfg["clusters"]] == f.members


# --------------------------------------------------------------------------- single-role jobs


def _single_role(name: str, role: str, replicas: int, cpu: str = "100m",
                 run_seconds: str | None = "0.5", **spec: Any) -> dict[str, Any]:
    body = pytorchjob(name, replicas, worker_cpu=cpu, master_cpu=cpu,
                      annotations={"fleetq.io/run-seconds": run_seconds} if run_seconds else None)
    specs = body["spec"]["pytorchReplicaSpecs"]
    keep = specs[role]
    keep["replicas"] = replicas
    body["spec"]["pytorchReplicaSpecs"] = {role: keep}
    body["spec"]["runPolicy"] = {}
    body["spec"].update(spec)
    return body


def _succeed(core: client.CoreV1Api, pod: str) -> None:
    """The pod's container exits 0 (as the kubelet would report it)."""
    core.patch_namespaced_pod_status(pod, "default", {"status": {"phase": "Succeeded"}})


def _wait_succeeded(custom: client.CustomObjectsApi, name: str) -> dict[str, Any]:
    job: dict[str, Any] = wait_for(lambda: (j := _job(custom, name)) and
                                   conditions(j).get("Succeeded") == "True" and j, timeout=6)
    return job


def test_master_only_job_runs_one_pod_and_succeeds(fleet: EmulatedFleet,
                                                   core: client.CoreV1Api,
                                                   custom: client.CustomObjectsApi) -> None:
    custom.create_namespaced_custom_object(*KF, "default", "pytorchjobs",
                                           _single_role("solo", "Master", 1, run_seconds=None))
    pods = wait_for(lambda: (p := _pods(core, "solo")) and p[0].status.phase == "Running" and p)
    assert [p.metadata.name for p in pods] == ["solo-master-0"]
    assert pods[0].metadata.labels["training.kubeflow.org/replica-type"] == "master"
    assert conditions(_job(custom, "solo")).get("Running") == "True"
    assert fleet.complete_job("alpha", "default", "solo")
    job = _wait_succeeded(custom, "solo")
    assert counts(job) == {"Master": {"succeeded": 1}}
    assert [p.metadata.name for p in _pods(core, "solo")] == ["solo-master-0"]
    custom.delete_namespaced_custom_object(*KF, "default", "pytorchjobs", "solo")
    wait_for(lambda: not _pods(core, "solo"))


def test_worker_only_job_succeeds_when_every_worker_has(fleet: EmulatedFleet,
                                                        core: client.CoreV1Api,
                                                        custom: client.CustomObjectsApi) -> None:
    custom.create_namespaced_custom_object(*KF, "default", "pytorchjobs",
                                           _single_role("workers", "Worker", 3, run_seconds=None))
    pods = wait_for(lambda: (p := _pods(core, "workers")) and len(p) == 3 and all(
        x.status.phase == "Running" for x in p) and p)
    assert [p.metadata.name for p in pods] == ["workers-worker-0", "workers-worker-1",
                                               "workers-worker-2"]
    assert conditions(_job(custom, "workers")).get("Running") == "True"
    assert fleet.complete_job("alpha", "default", "workers")
    job = _wait_succeeded(custom, "workers")
    assert counts(job) == {"Worker": {"succeeded": 3}}
    custom.delete_namespaced_custom_object(*KF, "default", "pytorchjobs", "workers")
    wait_for(lambda: not _pods(core, "workers"))


def test_worker_only_job_is_not_done_while_a_worker_runs(core: client.CoreV1Api,
                                                         custom: client.CustomObjectsApi) -> None:
    # Without Master and without elasticPolicy, one finished worker does not finish the job.
    custom.create_namespaced_custom_object(*KF, "default", "pytorchjobs",
                                           _single_role("slow", "Worker", 2, run_seconds=None))
    pods = wait_for(lambda: (p := _pods(core, "slow")) and len(p) == 2 and all(
        x.status.phase == "Running" for x in p) and p)
    _succeed(core, pods[0].metadata.name)
    # the reconcile that counted the finished worker is the one that would have finished
    # the job: no Succeeded with it
    wait_for(lambda: counts(_job(custom, "slow")) == {"Worker": {"active": 1, "succeeded": 1}})
    assert conditions(_job(custom, "slow")).get("Succeeded") is None
    custom.delete_namespaced_custom_object(*KF, "default", "pytorchjobs", "slow")
    wait_for(lambda: not _pods(core, "slow"))


def test_elastic_worker_only_job_succeeds_when_any_worker_has(
        core: client.CoreV1Api, custom: client.CustomObjectsApi) -> None:
    body = _single_role("elastic", "Worker", 2, run_seconds=None,
                        elasticPolicy={"minReplicas": 1, "maxReplicas": 2})
    custom.create_namespaced_custom_object(*KF, "default", "pytorchjobs", body)
    pods = wait_for(lambda: (p := _pods(core, "elastic")) and len(p) == 2 and all(
        x.status.phase == "Running" for x in p) and p)
    _succeed(core, pods[1].metadata.name)
    _wait_succeeded(custom, "elastic")
    custom.delete_namespaced_custom_object(*KF, "default", "pytorchjobs", "elastic")
    wait_for(lambda: not _pods(core, "elastic"))


def test_min_available_binds_the_pod_group_minimum_first(core: client.CoreV1Api,
                                                         custom: client.CustomObjectsApi) -> None:
    # 6 workers of 3 cpu: the two 4-cpu nodes hold two, the tainted gpu node none. The whole
    # gang never fits; with minAvailable 2 two run (the job is Running) and four wait.
    body = _single_role("partial", "Worker", 6, cpu="3", run_seconds=None,
                        runPolicy={"schedulingPolicy": {"minAvailable": 2}})
    custom.create_namespaced_custom_object(*KF, "default", "pytorchjobs", body)
    pods = wait_for(lambda: (p := _pods(core, "partial")) and len(p) == 6 and sum(
        x.status.phase == "Running" for x in p) == 2 and p)
    waiting = [p for p in pods if p.spec.node_name is None]
    assert len(waiting) == 4
    wait_for(lambda: all(any(c.type == "PodScheduled" and c.reason == "Unschedulable"
                             for c in core.read_namespaced_pod(p.metadata.name, "default")
                             .status.conditions or []) for p in waiting))
    assert conditions(_job(custom, "partial")).get("Running") == "True"
    custom.delete_namespaced_custom_object(*KF, "default", "pytorchjobs", "partial")
    wait_for(lambda: not _pods(core, "partial"))
