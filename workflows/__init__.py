"""fleetq's Temporal workflows: the quota semaphore, the per-job lifecycle, the registry."""

from workflows.fleet_registry import FleetRegistryWorkflow
from workflows.pytorch_job import PyTorchJobWorkflow
from workflows.quota_tree import QuotaTreeWorkflow

ALL_WORKFLOWS = [QuotaTreeWorkflow, PyTorchJobWorkflow, FleetRegistryWorkflow]

__all__ = ["ALL_WORKFLOWS", "FleetRegistryWorkflow", "PyTorchJobWorkflow", "QuotaTreeWorkflow"]
