"""The fleet registry records when each object was first applied (issue 27 item 4: "ages
come from the objects themselves ... policy applied time"), on the time-skipping server
so that the registry's own start, the apply and a re-apply are hours apart.

Upstream: kube-apiserver sets ``metadata.creationTimestamp`` once, at create
(``rest.FillObjectMetaSystemFields`` in ``BeforeCreate``), and an update keeps it
(``rest.BeforeUpdate``: "objectMeta.SetCreationTimestamp(oldMeta.GetCreationTimestamp())");
a deleted and re-created object gets a new one. kubectl's AGE column is
``translateTimestampSince(obj.CreationTimestamp)``."""

from __future__ import annotations

import copy
from datetime import timedelta
from typing import Any

from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from fleetq.messages import DeleteRequest
from fleetq.registry import RegistryState
from tests.workflows.fakes import load, policy, registry_running
from workflows.fleet_registry import FleetRegistryWorkflow

HOUR = timedelta(hours=1)


async def created(handle: WorkflowHandle[Any, Any]) -> dict[str, Any]:
    state: RegistryState = await handle.query(FleetRegistryWorkflow.state)
    return dict(state.created)


async def test_objects_age_from_their_first_apply_not_the_registrys_start(
    ts_env: WorkflowEnvironment,
) -> None:
    async with registry_running(ts_env, RegistryState()) as handle:
        started = (await handle.describe()).start_time
        await ts_env.sleep(HOUR.total_seconds())

        pp = policy()
        cpp = copy.deepcopy(pp)
        cpp["kind"] = "ClusterPropagationPolicy"
        cpp["metadata"] = {"name": "fleet-wide"}
        pc = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
              "metadata": {"name": "high"}, "value": 1000}
        tree = load("elasticquotatree.yaml")
        for doc in (pp, cpp, pc, tree):
            assert await handle.execute_update(FleetRegistryWorkflow.apply, doc) == "created"
        first = await created(handle)
        keys = {"PropagationPolicy/default/example-policy", "ClusterPropagationPolicy/fleet-wide",
                "PriorityClass/high", "ElasticQuotaTree/kube-system/elasticquotatree"}
        assert set(first) == keys
        for key in keys:  # the apply's time, an hour after the registry started
            assert first[key] - started >= HOUR, key

        await ts_env.sleep(HOUR.total_seconds())
        changed = copy.deepcopy(pp)
        changed["spec"]["failover"]["application"]["decisionConditions"][
            "tolerationSeconds"] = 99
        assert await handle.execute_update(FleetRegistryWorkflow.apply, changed) == "configured"
        assert await handle.execute_update(FleetRegistryWorkflow.apply, dict(pc, value=5)) == (
            "configured")
        assert await handle.execute_update(FleetRegistryWorkflow.apply, tree) == "unchanged"
        assert await created(handle) == first  # a re-apply keeps it, as creationTimestamp

        # deleted and applied again: a new object, a new time
        assert await handle.execute_update(FleetRegistryWorkflow.delete, DeleteRequest(
            kind="ClusterPropagationPolicy", name="fleet-wide"))
        assert "ClusterPropagationPolicy/fleet-wide" not in await created(handle)
        assert await handle.execute_update(FleetRegistryWorkflow.apply, cpp) == "created"
        again = await created(handle)
        assert again["ClusterPropagationPolicy/fleet-wide"] - first[
            "ClusterPropagationPolicy/fleet-wide"] >= HOUR
