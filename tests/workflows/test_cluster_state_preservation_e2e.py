"""End to end on the embedded fleet: ``failover.cluster.statePreservation`` (Karmada
release-1.18 ``ClusterFailoverBehavior``). The job's member stops answering, the
unreachable NoExecute taint outlasts the policy's clusterToleration, the job fails over
as a cluster failure, and the new copy -- read on the member that holds it -- carries the
value the rule selected from the old copy's last synced status as the label the rule
names.

Upstream: the taint manager evicts on a NoExecute taint and builds the eviction task
with ``PreservedLabelState`` from ``failover.cluster.statePreservation``
(pkg/controllers/cluster/taint_manager.go, pkg/util/helper/failover.go
``BuildPreservedLabelState``); the binding controller's ``injectReservedLabelState``
(pkg/controllers/binding/common.go) labels the new copy only when the purge mode is
Directly. Here the application failover has no rules at all, so the labels can only come
from ``failover.cluster``."""

from __future__ import annotations

import copy
from typing import Any

from fleetq.cluster_health import TAINT_UNREACHABLE
from fleetq.state_preservation import json_value
from tests.workflows.fakes import policy, walkthrough_job
from tests.workflows.test_e2e import Stack, stack, wait_view
from tests.workflows.test_state_preservation_e2e import member_job

__all__ = ["stack"]  # the module's embedded fleet (a fixture of test_e2e)

ACTIVE = "{.replicaStatuses.Master.active}"
LABEL = "fleetq.io/masters-active"
TAINT_TOLERATION = 4


def cluster_preserving_policy(name: str, job: str) -> dict[str, Any]:
    doc = copy.deepcopy(policy(queued=False, toleration=300, purge="Immediately"))
    doc["metadata"]["name"] = name
    doc["spec"]["resourceSelectors"][0]["name"] = job
    doc["spec"]["placement"]["clusterTolerations"] = [{
        "key": TAINT_UNREACHABLE, "operator": "Exists", "effect": "NoExecute",
        "tolerationSeconds": TAINT_TOLERATION}]
    assert "statePreservation" not in doc["spec"]["failover"]["application"]
    doc["spec"]["failover"]["cluster"] = {
        "purgeMode": "Directly",
        "statePreservation": {"rules": [{"aliasLabelName": LABEL, "jsonPath": ACTIVE}]},
    }
    return doc


async def test_a_cluster_failover_carries_the_old_copys_status_as_labels(
    stack: Stack,
) -> None:
    await stack.apply(cluster_preserving_policy("cluster-preserving", "checkpointed"))
    handle = await stack.start(walkthrough_job("checkpointed"))
    first = await wait_view(handle, lambda v: v.state == "Running" and bool(v.copy_created))
    old = first.cluster
    assert old is not None
    old_status = member_job(stack, old, "checkpointed")["status"]
    expected = json_value(old_status, ACTIVE)
    assert expected == "1"  # the running master, as the member reports it
    assert LABEL not in member_job(stack, old, "checkpointed")["metadata"].get("labels", {})

    stack.emulated.set_reachable(old, False)  # the member goes silent: NoExecute taint
    try:
        view = await wait_view(
            handle, lambda v: v.cluster not in (None, old) and v.state in ("Created", "Running"),
            timeout=90)
    finally:
        stack.emulated.set_reachable(old, True)
    new = view.cluster
    assert new is not None
    labels = member_job(stack, new, "checkpointed")["metadata"]["labels"]
    assert labels.get(LABEL) == expected  # read on the member holding the new copy
    reasons = [e.reason for e in view.events]
    assert reasons.index("TaintEviction") < reasons.index("FailoverStarted")
    (kept,) = [e for e in view.events if e.reason == "StatePreserved"]
    assert kept.message == f"from the copy on {old}, the new copy carries labels {LABEL}=1"
    await handle.cancel()
    await wait_view(handle, lambda v: v.state == "Deleted", timeout=60)
    assert stack.member_copies("checkpointed") == {}
