"""The fleet registry and the quota tree, read and changed through their workflows.

The registry workflow (``fleetq/registry``) holds the PropagationPolicies, the
PriorityClasses and the name of the one ElasticQuotaTree; the tree's own quota workflow
holds its queues and who holds or waits for quota. The registry's state and
:mod:`fleetq.messages` are imported where they are read, so importing this module (as
:mod:`fleetq.client.jobs` does for ``fleetq get pytorchjob``) builds no Temporal contract.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode

from fleetq.client.errors import InvalidInput, NotFound
from fleetq.naming import (
    CONTROL_TASK_QUEUE,
    REGISTRY_WORKFLOW_ID,
    quota_workflow_id,
    tree_workflow_id,
)

if TYPE_CHECKING:  # fleetq.messages (every Temporal contract) only where it is used
    from fleetq.messages import QuotaView

QUERY_TIMEOUT = timedelta(seconds=15)
T = TypeVar("T")

#: kubectl's resource names of the registry's kinds (as in NotFound lines)
PLURALS = {
    "PropagationPolicy": "propagationpolicies.policy.one.alibabacloud.com",
    "ClusterPropagationPolicy": "clusterpropagationpolicies.policy.one.alibabacloud.com",
    "PriorityClass": "priorityclasses.scheduling.k8s.io",
    "ElasticQuotaTree": "elasticquotatrees.scheduling.sigs.k8s.io",
}


@dataclass
class Registry:
    """What the registry workflow holds."""

    policies: dict[str, dict[str, Any]]
    priority_classes: dict[str, int]
    tree: str | None
    started: datetime | None
    #: when each object was first applied (``fleetq.registry.created_key`` -> time)
    created: dict[str, datetime] = field(default_factory=dict)

    def created_at(self, kind: str, key: str) -> datetime | None:
        """When the object (its key in its own map) was first applied, or None."""
        from fleetq.registry import created_key

        return self.created.get(created_key(kind, key))


@dataclass
class QuotaTreeView:
    """The fleet's quota tree (``ns/name``), its quota workflow's view and start time,
    and when the tree was first applied (its queues' AGE too)."""

    tree: str
    view: QuotaView
    started: datetime | None
    created: datetime | None = None


async def registry(client: Client) -> WorkflowHandle[Any, Any]:
    """The fleet registry workflow, started if absent."""
    from fleetq.registry import RegistryState

    return await client.start_workflow(
        "FleetRegistryWorkflow",
        RegistryState(),
        id=REGISTRY_WORKFLOW_ID,
        task_queue=CONTROL_TASK_QUEUE,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        static_summary="fleetq registry: PropagationPolicies, PriorityClasses, quota tree",
    )


async def _query_running(client: Client, workflow_id: str, query: str,
                         result_type: type[T]) -> tuple[T, datetime | None] | None:
    """``(answer to query, start time)`` of a running workflow; None when it is not
    running or does not exist."""
    handle = client.get_workflow_handle(workflow_id)
    try:
        desc = await handle.describe(rpc_timeout=QUERY_TIMEOUT)
        if desc.status != WorkflowExecutionStatus.RUNNING:
            return None
        answer: T = await handle.query(query, result_type=result_type,
                                       rpc_timeout=QUERY_TIMEOUT)
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    return answer, desc.start_time


async def get_registry(client: Client) -> Registry | None:
    """The registry's state; None when no registry workflow runs."""
    from fleetq.registry import RegistryState

    # the names of RegistryHandlers.STATE and QuotaTreeHandlers.VIEW (fleetq.handler_refs,
    # not imported here: `fleetq get` must not load the core's contracts)
    found = await _query_running(client, REGISTRY_WORKFLOW_ID, "state", RegistryState)
    if found is None:
        return None
    state, started = found
    return Registry(dict(state.policies), dict(state.priority_classes), state.tree, started,
                    dict(state.created))


async def quota_view(client: Client) -> QuotaTreeView | None:
    """The fleet's quota tree as its quota workflow sees it, or None (no tree, or its
    workflow is not running)."""
    from fleetq.messages import QuotaView

    reg = await get_registry(client)
    if reg is None or reg.tree is None:
        return None
    found = await _query_running(client, tree_workflow_id(reg.tree), "view", QuotaView)
    if found is None:
        return None
    view, started = found
    return QuotaTreeView(reg.tree, view, started, reg.created_at("ElasticQuotaTree", reg.tree))


async def delete_registry_object(client: Client, kind: str, namespace: str,
                                 name: str) -> None:
    """Remove a (Cluster)PropagationPolicy, PriorityClass or the ElasticQuotaTree from the
    registry; the tree is refused while any job holds or waits for its quota, and its
    quota workflow is stopped once it is gone. :class:`NotFound` when it is not there."""
    from fleetq.handler_refs import QuotaTreeHandlers, RegistryHandlers
    from fleetq.messages import DeleteRequest

    if kind == "ElasticQuotaTree":
        found = await quota_view(client)
        if found is not None and found.tree == f"{namespace}/{name}":
            view = found.view
            if view.holders or view.waiting:
                raise InvalidInput(
                    f"error: ElasticQuotaTree {namespace}/{name}: {view.holders} job(s) hold "
                    f"quota and {view.waiting} wait in its queues; delete those PyTorchJobs "
                    "first")
    handle = await registry(client)
    removed: bool = await handle.execute_update(
        RegistryHandlers.DELETE.name, DeleteRequest(kind=kind, namespace=namespace, name=name),
        result_type=bool)
    if not removed:
        raise NotFound(PLURALS[kind], name)
    if kind == "ElasticQuotaTree":
        quota = client.get_workflow_handle(quota_workflow_id(namespace, name))
        try:
            await quota.signal(QuotaTreeHandlers.STOP.name)
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise
