"""fleetq's Temporal workflows: the quota semaphore, the per-job lifecycle, the registry.

The package imports nothing eagerly: Temporal's sandbox re-imports a workflow's module
(and its package) for every workflow run, so ``import workflows.pytorch_job`` must not
drag the other workflows' modules along. The names below resolve on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_MODULES = {
    "QuotaTreeWorkflow": "workflows.quota_tree",
    "PyTorchJobWorkflow": "workflows.pytorch_job",
    "PyTorchJobPurgeWorkflow": "workflows.job_purge",
    "FleetRegistryWorkflow": "workflows.fleet_registry",
}

__all__ = ["ALL_WORKFLOWS", *_MODULES]


def __getattr__(name: str) -> Any:
    if name == "ALL_WORKFLOWS":
        return [__getattr__(n) for n in _MODULES]
    if name in _MODULES:
        return getattr(importlib.import_module(_MODULES[name]), name)
    raise AttributeError(f"module 'workflows' has no attribute {name!r}")
