"""fleetq on the production-shaped Temporal (the server built from ``go.temporal.io/server``
by ``fleetq temporal-cluster build``, on PostgreSQL, one process per service, two history
processes): a PyTorchJob runs to Succeeded through the embedded fleet, and a history
process SIGKILLed while a job runs costs the job nothing — it succeeds, admitted exactly
once, with exactly one member copy and no quota left behind."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from fleetq.runtime.embedded import EmbeddedFleet
from fleetq.temporal_cluster.build import Build, BuildError, build
from tests.conftest import embedded_fleet

NAMESPACE = "cluster-test"


@pytest.fixture(scope="module")
def binaries() -> Build:
    try:
        return build()
    except BuildError as exc:
        pytest.fail(f"no Temporal cluster build (fleetq temporal-cluster build): {exc}")


@pytest.fixture(scope="module")
def fleet(binaries: Build, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[EmbeddedFleet]:
    with embedded_fleet(tmp_path_factory.mktemp("cluster-fleet"), 180, grace=5.0,
                        temporal="cluster") as fleet:
        yield fleet


def manifests(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A policy (gang, not queued) and a 1 master + 1 worker job in :data:`NAMESPACE`."""
    policy = {
        "apiVersion": "policy.one.alibabacloud.com/v1alpha1", "kind": "PropagationPolicy",
        "metadata": {"name": "cluster-policy", "namespace": NAMESPACE},
        "spec": {"placement": {"replicaScheduling": {"replicaSchedulingType": "Divided",
                                                     "customSchedulingType": "Gang"}},
                 "resourceSelectors": [{"apiVersion": "kubeflow.org/v1",
                                        "kind": "PyTorchJob"}]}}

    def replica(restart: str) -> dict[str, Any]:
        return {"replicas": 1, "restartPolicy": restart, "template": {"spec": {"containers": [
            {"name": "pytorch", "image": "busybox",
             "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]}}}

    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
           "metadata": {"name": name, "namespace": NAMESPACE},
           "spec": {"pytorchReplicaSpecs": {"Master": replica("Never"),
                                            "Worker": replica("OnFailure")}}}
    return policy, job


def test_a_pytorchjob_runs_to_succeeded_on_the_cluster(fleet: EmbeddedFleet) -> None:
    from temporalio.api.workflowservice.v1 import GetSystemInfoRequest

    from fleetq.client.apply import apply_registry_object
    from fleetq.client.connection import connect, has_search_attributes, routing
    from fleetq.client.jobs import start_job
    from fleetq.messages import JobView
    from fleetq.models import parse_job
    from fleetq.naming import CONTROL_TASK_QUEUE, TASK_QUEUE, job_workflow_id

    assert fleet.cluster is not None
    names = [c.name for c in fleet.children]
    assert names[:6] == ["postgres", "temporal-history-0", "temporal-history-1",
                         "temporal-matching", "temporal-frontend", "temporal-worker"]
    assert all(c.alive() for c in fleet.children)

    async def run() -> tuple[JobView, str, list[str]]:
        client = await connect(fleet.address)
        info = await client.workflow_service.get_system_info(GetSystemInfoRequest())
        assert await has_search_attributes(client)
        # started means both of the worker's task queues are polled: an apply at once
        # (the registry's update, on the control queue) is not refused for "no worker"
        for queue in (TASK_QUEUE, CONTROL_TASK_QUEUE):
            assert (await routing(client, queue)).problem() is None, queue
        policy, job = manifests("on-cluster")
        await apply_registry_object(client, policy)
        await start_job(client, parse_job(job), job, run_seconds=2)
        handle = client.get_workflow_handle(job_workflow_id(NAMESPACE, "on-cluster"),
                                            result_type=JobView)
        view: JobView = await asyncio.wait_for(handle.result(), 120)
        # SQL visibility with fleetq's custom search attributes (postgres12's columns)
        found: list[str] = []
        deadline = time.monotonic() + 30
        while not found and time.monotonic() < deadline:
            found = [w.id async for w in client.list_workflows(
                "FleetqState = 'Succeeded' AND FleetqNamespace = 'cluster-test'")]
            await asyncio.sleep(0.5)
        return view, info.server_version, found

    view, version, found = asyncio.run(run())
    assert view.state == "Succeeded", view
    assert view.cluster
    assert f"v{version}" == fleet.cluster.build.version
    assert found == [job_workflow_id(NAMESPACE, "on-cluster")]


@pytest.mark.timeout(360)
def test_a_killed_history_process_costs_the_running_job_nothing(
    binaries: Build, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from fleetq.testing.chaos import run_matrix

    result = asyncio.run(run_matrix((), ("history-kill",), temporal="cluster",
                                    workdir=tmp_path_factory.mktemp("history-kill")))
    point = result.point("history-kill")
    # check_job: Succeeded, the workflow completed, one `admitted` signal, exactly one
    # member copy, no Reservation left; and the leaf's quota is empty
    assert point.survived, result.report()
    assert point.state == "Succeeded", result.report()
    assert "SIGKILL temporal-history-" in point.hit and "owner of the job's shard" in \
        point.hit, point.hit
    assert "still dead" in point.note, point.note
    assert result.quota_problems == [], result.report()
