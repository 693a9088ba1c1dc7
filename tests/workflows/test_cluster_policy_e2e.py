"""End to end on the embedded fleet: a job that no PropagationPolicy of its namespace
selects runs under a ClusterPropagationPolicy, as Karmada's detector falls back to the
cluster-scoped policies (pkg/detector/policy.go ``propagateResource``: step 3 matches the
namespace's PropagationPolicies, step 4 ``LookForMatchedClusterPolicy`` when none did),
and a PropagationPolicy of the job's namespace, whatever its priority, is the one a job
resolves to once applied (step 3 first)."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from temporalio.client import WorkflowExecutionStatus, WorkflowHandle

from fleetq.client.registry import get_registry
from fleetq.job_view import JobView
from tests.workflows.fakes import policy, walkthrough_job
from tests.workflows.test_e2e import Stack, stack, wait_view

__all__ = ["stack"]  # the module's embedded fleet (a fixture of test_e2e)

NS = "team-cpp"


def cluster_policy(name: str) -> dict[str, Any]:
    doc = copy.deepcopy(policy(queued=False))
    doc["kind"] = "ClusterPropagationPolicy"
    doc["metadata"] = {"name": name, "namespace": "ignored"}  # the API server clears it
    doc["spec"]["resourceSelectors"] = [
        {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "namespace": NS}]
    return doc


async def running_or_closed(handle: WorkflowHandle[Any, Any]) -> JobView:
    """The job's view once it runs, or once its workflow closed (a refusal)."""
    while True:
        desc = await handle.describe()
        if desc.status != WorkflowExecutionStatus.RUNNING:
            return JobView.model_validate(await handle.query("status"))
        view = JobView.model_validate(await handle.query("status"))
        if view.state == "Running":
            return view
        await asyncio.sleep(0.2)


async def test_a_job_no_namespaced_policy_selects_runs_under_a_cluster_policy(
    stack: Stack,
) -> None:
    lines = await stack.apply(cluster_policy("fleet-wide"))
    assert lines == ["clusterpropagationpolicy.policy.one.alibabacloud.com/fleet-wide created"]
    reg = await get_registry(stack.client)
    assert reg is not None and "namespace" not in reg.policies["fleet-wide"]["metadata"]

    handle = await stack.start(walkthrough_job("under-cpp", namespace=NS))
    view = await asyncio.wait_for(running_or_closed(handle), 60)
    assert view.state == "Running", view.reason
    assert view.cluster is not None
    await handle.cancel()
    await wait_view(handle, lambda v: v.state == "Deleted", timeout=60)


async def test_a_namespaced_policy_wins_over_the_cluster_policy(stack: Stack) -> None:
    await stack.apply(cluster_policy("fleet-wide-2"))
    namespaced = copy.deepcopy(policy(queued=False))
    namespaced["metadata"] = {"name": "local", "namespace": NS}
    namespaced["spec"]["resourceSelectors"] = [
        {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob"}]
    namespaced["spec"]["priority"] = -10  # lower than the cluster policy's 0: still wins
    await stack.apply(namespaced)
    handle = await stack.start(walkthrough_job("under-pp", namespace=NS))
    view = await asyncio.wait_for(running_or_closed(handle), 60)
    assert view.state == "Running", view.reason
    assert view.policy == f"{NS}/local"
    await handle.cancel()
    await wait_view(handle, lambda v: v.state == "Deleted", timeout=60)
