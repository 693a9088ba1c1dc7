"""Stable names shared by the CLI, the workflows and the activities.

Workflow ids are derived from the objects users write, so that re-applying a manifest
finds the same workflow and member-cluster objects can be traced back to their job.
"""

from __future__ import annotations

import hashlib
import os

TASK_QUEUE = os.environ.get("FLEETQ_TASK_QUEUE", "fleetq")
#: the quota semaphore and the fleet registry: a task queue of their own, served by a
#: worker thread of their own, so a backlog of job workflow tasks never delays admission
CONTROL_TASK_QUEUE = os.environ.get("FLEETQ_CONTROL_TASK_QUEUE", f"{TASK_QUEUE}-control")
REGISTRY_WORKFLOW_ID = "fleetq/registry"

# Custom search attributes (registered by `fleetq up` / `fleetq setup`).
SA_STATE = "FleetqState"
SA_CLUSTER = "FleetqCluster"
SA_QUEUE = "FleetqQueue"
SA_JOB = "FleetqJob"
SA_NAMESPACE = "FleetqNamespace"
SA_PRIORITY = "FleetqPriority"
KEYWORD_ATTRIBUTES = (SA_STATE, SA_CLUSTER, SA_QUEUE, SA_JOB, SA_NAMESPACE)
INT_ATTRIBUTES = (SA_PRIORITY,)


#: the workflow type of a job, and of the short run that deletes a finished job: it runs
#: under the job's own workflow id, so the id is taken while it purges what the finished
#: job left on the members, and the job is gone once it has
JOB_WORKFLOW = "PyTorchJobWorkflow"
JOB_PURGE_WORKFLOW = "PyTorchJobPurgeWorkflow"


def job_workflow_id(namespace: str, name: str) -> str:
    return f"pytorchjob/{namespace}/{name}"


def parse_job_workflow_id(workflow_id: str) -> tuple[str, str] | None:
    parts = workflow_id.split("/")
    if len(parts) == 3 and parts[0] == "pytorchjob":
        return parts[1], parts[2]
    return None


def quota_workflow_id(namespace: str, name: str) -> str:
    return f"quota/{namespace}/{name}"


def tree_workflow_id(tree: str) -> str:
    """Workflow id of the quota tree the registry names as ``"<namespace>/<name>"``."""
    ns, name = tree.split("/", 1)
    return quota_workflow_id(ns, name)


def owner_id(workflow_id: str) -> str:
    """Label-safe owner id of a fleet job (see docs/member-contract.md)."""
    return hashlib.sha256(workflow_id.encode()).hexdigest()[:16]


# Kubeflow training-operator's labels on a PyTorchJob's pods (the adapter reads them, the
# emulator and the control-plane lifecycle set them)
KF_JOB_NAME = "training.kubeflow.org/job-name"
KF_REPLICA_TYPE = "training.kubeflow.org/replica-type"
KF_REPLICA_INDEX = "training.kubeflow.org/replica-index"
