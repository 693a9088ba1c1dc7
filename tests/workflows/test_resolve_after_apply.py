"""A policy applied before a job is submitted is the one the job resolves, however fresh
the worker's cached registry snapshot is (CI caught a job resolving the walkthrough's
catch-all policy 0.3 s after a more specific one was applied: it ran with the default
300 s taint toleration instead of its own).

Upstream: among the policies matching a resource Karmada picks the most specific best
match, a selector naming the resource before one naming only its kind
(``GetHigherPriorityPropagationPolicy`` / ``ResourceMatchSelectorsPriority``, as
``fleetq.policy_match`` implements them)."""

from __future__ import annotations

import copy
import time
from types import SimpleNamespace
from typing import Any

from temporalio.testing import WorkflowEnvironment

from activities.scheduling import SchedulingActivities
from fleetq.messages import Resolution, ResolveInput
from fleetq.naming import REGISTRY_WORKFLOW_ID
from fleetq.registry import RegistryState
from tests.workflows.fakes import policy, registry_running


def catch_all() -> dict[str, Any]:
    return policy(queued=False)  # the walkthrough's: every PyTorchJob of its namespace


def naming(job: str) -> dict[str, Any]:
    doc = copy.deepcopy(policy(queued=False, toleration=4))
    doc["metadata"]["name"] = f"only-{job}"
    doc["spec"]["resourceSelectors"][0]["name"] = job
    return doc


def resolved_name(res: Resolution) -> str:
    doc = res.policy
    assert doc is not None
    return str(doc["metadata"]["name"])


async def test_a_policy_applied_before_the_job_is_resolved_even_from_a_fresh_snapshot(
    ts_env: WorkflowEnvironment,
) -> None:
    state = RegistryState(tree="kube-system/t")
    async with registry_running(ts_env, state, REGISTRY_WORKFLOW_ID) as registry:
        await registry.execute_update("apply", catch_all())
        acts = SchedulingActivities(ts_env.client, lambda: SimpleNamespace())  # type: ignore[arg-type,return-value]
        acts.registry_max_age = 3600.0  # the snapshot is never too old to be served

        earlier = time.time()
        first = await acts.resolve_policy(
            ResolveInput(namespace="default", name="first", submitted_at=earlier))
        assert resolved_name(first) == "example-policy"

        await registry.execute_update("apply", naming("second"))
        second = await acts.resolve_policy(
            ResolveInput(namespace="default", name="second", submitted_at=time.time()))
        assert resolved_name(second) == "only-second"
        assert second.policy is not None
        tolerations = second.policy["spec"]["failover"]["application"]
        assert tolerations["decisionConditions"]["tolerationSeconds"] == 4


async def test_jobs_submitted_before_a_read_share_it(ts_env: WorkflowEnvironment) -> None:
    """One registry read serves every job submitted before it was sent (a burst costs
    one query, not one each): a job submitted before the newer policy was applied
    resolves from the snapshot that was current when it was submitted."""
    state = RegistryState(tree="kube-system/t")
    async with registry_running(ts_env, state, REGISTRY_WORKFLOW_ID) as registry:
        await registry.execute_update("apply", catch_all())
        acts = SchedulingActivities(ts_env.client, lambda: SimpleNamespace())  # type: ignore[arg-type,return-value]
        acts.registry_max_age = 3600.0
        submitted = time.time()
        await acts.resolve_policy(
            ResolveInput(namespace="default", name="a", submitted_at=submitted))
        await registry.execute_update("apply", naming("b"))
        late_read = await acts.resolve_policy(
            ResolveInput(namespace="default", name="b", submitted_at=submitted))
        assert resolved_name(late_read) == "example-policy"


async def test_a_registry_that_has_not_changed_is_not_queried_again(
    ts_env: WorkflowEnvironment,
) -> None:
    """Each job must see the registry as it was when it was submitted; while the
    registry workflow's history has not grown since the last query, a describe proves
    that state current and no query (a task on a worker) is sent. An apply grows it:
    the next job queries and resolves the new policy."""
    state = RegistryState(tree="kube-system/t")
    async with registry_running(ts_env, state, REGISTRY_WORKFLOW_ID) as registry:
        await registry.execute_update("apply", catch_all())
        acts = SchedulingActivities(ts_env.client, lambda: SimpleNamespace())  # type: ignore[arg-type,return-value]
        acts.registry_max_age = 0.0  # every job reads the registry again
        for job in ("a", "b", "c"):
            res = await acts.resolve_policy(
                ResolveInput(namespace="default", name=job, submitted_at=time.time()))
            assert resolved_name(res) == "example-policy"
        assert (acts.registry_queries, acts.registry_checks) == (1, 2)

        await registry.execute_update("apply", naming("d"))
        res = await acts.resolve_policy(
            ResolveInput(namespace="default", name="d", submitted_at=time.time()))
        assert resolved_name(res) == "only-d"
        assert (acts.registry_queries, acts.registry_checks) == (2, 2)
