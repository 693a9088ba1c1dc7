"""End to end on the embedded fleet: ``failover.application.statePreservation`` as
Karmada release-1.18 carries state (pkg/controllers/applicationfailover ``buildTaskOptions``
reads the old copy's collected status with ``BuildPreservedLabelState``; the binding
controller's ``injectReservedLabelState`` labels the new copy after a Directly purge).
The labels are read on the member holding the new copy."""

from __future__ import annotations

import copy
from typing import Any

from fleetq.state_preservation import json_value
from tests.workflows.fakes import policy, walkthrough_job
from tests.workflows.test_e2e import Stack, stack, wait_view

__all__ = ["stack"]  # the module's embedded fleet (a fixture of test_e2e)

REASON = '{.conditions[?(@.type=="Failed")].reason}'
# the operator's ReconcileJobs stops counting replicas once the job is Failed at its
# backoff limit (common/job.go: jobExceedsLimit writes the Failed condition and returns),
# so the old copy keeps the counts of its last sync: one active master
ACTIVE = "{.replicaStatuses.Master.active}"


def member_job(stack: Stack, cluster: str, name: str) -> dict[str, Any]:
    (job,) = [o for o in stack.emulated.objects(cluster, "pytorchjobs")
              if o["metadata"]["name"] == name]
    return job


async def test_a_failover_carries_the_old_copys_status_as_labels(stack: Stack) -> None:
    doc = copy.deepcopy(policy(queued=False, toleration=2, purge="Immediately"))
    doc["metadata"]["name"] = "preserving"
    doc["spec"]["resourceSelectors"][0]["name"] = "resumable"
    doc["spec"]["failover"]["application"]["statePreservation"] = {"rules": [
        {"aliasLabelName": "fleetq.io/failed-reason", "jsonPath": REASON},
        {"aliasLabelName": "masters-active", "jsonPath": ACTIVE},
    ]}
    await stack.apply(doc)
    handle = await stack.start(walkthrough_job("resumable"))
    first = await wait_view(handle, lambda v: v.state == "Running")
    assert first.cluster is not None
    assert stack.emulated.fail_job(first.cluster, "default", "resumable")
    # the old copy's status as the member reports it once failed (tolerationSeconds 2
    # keeps it there until the failover purges it)
    old_status = member_job(stack, first.cluster, "resumable")["status"]
    expected = {"fleetq.io/failed-reason": json_value(old_status, REASON),
                "masters-active": json_value(old_status, ACTIVE)}
    assert expected["masters-active"] == "1" and expected["fleetq.io/failed-reason"]
    assert "fleetq.io/failed-reason" not in member_job(
        stack, first.cluster, "resumable")["metadata"]["labels"]

    view = await wait_view(
        handle,
        lambda v: v.state in ("Running", "Created") and v.cluster not in (None, first.cluster),
        timeout=90,
    )
    assert view.cluster is not None
    labels = member_job(stack, view.cluster, "resumable")["metadata"]["labels"]
    assert {k: labels.get(k) for k in expected} == expected
    (kept,) = [e for e in view.events if e.reason == "StatePreserved"]
    assert kept.message.startswith(f"from the copy on {first.cluster}, the new copy carries")
    await handle.cancel()
    await wait_view(handle, lambda v: v.state == "Deleted")
    assert stack.member_copies("resumable") == {}
