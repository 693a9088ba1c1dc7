"""End to end on the real stack (Temporal dev server, real activities, the member-cluster
emulator over HTTP), issue 24: a job whose gang minimum exceeds its leaf's ``max`` is
shown Inadmissible, never blocks the small jobs behind it past its starvation bound, and
runs once the tree is applied again with a larger ``max``. Kueue keeps such workloads out
of the heads (kueue pkg/queue/cluster_queue.go, ``inadmissibleWorkloads``) and queues
them again when the ClusterQueue changes (``QueueInadmissibleWorkloads``)."""

from __future__ import annotations

import copy
from typing import Any

from fleetq.messages import JobView
from tests.workflows.fakes import load, policy, walkthrough_job
from tests.workflows.test_e2e import Stack, stack, visible, wait_view  # noqa: F401
from workflows.quota_tree import QuotaTreeWorkflow, QuotaView


def tree(cpu: int) -> dict[str, Any]:
    """The walkthrough tree, child-2 (namespace default) at 2 jobs and ``cpu`` cpu, and a
    starvation bound of 2 s."""
    doc = copy.deepcopy(load("elasticquotatree.yaml"))
    doc["metadata"]["annotations"] = {"fleetq.io/starvation-seconds": "2"}
    child = doc["spec"]["root"]["children"][0]
    child["max"] = {**child["max"], "kube-queue/max-jobs": 2, "cpu": cpu}
    return doc


def big_job(name: str) -> dict[str, Any]:
    """The walkthrough job with 6-cpu workers: a gang minimum of 12.01 cpu."""
    doc = walkthrough_job(name)
    worker = doc["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    worker["containers"][0]["resources"] = {"requests": {"cpu": "6"}, "limits": {"cpu": "6"}}
    return doc


async def test_an_over_max_job_never_blocks_small_ones_and_runs_once_the_tree_is_raised(
    stack: Stack,  # noqa: F811
) -> None:
    await stack.apply(tree(cpu=10), policy(queued=True))
    big = await stack.start(big_job("inadm-big"), run_seconds=2)
    view = await wait_view(big, lambda v: v.state == "Inadmissible")
    assert view.reason == "quota child-2: cpu 12.01 exceeds max 10"
    assert not view.admitted
    assert any(e.reason == "Inadmissible" and e.type == "Warning" for e in view.events)
    assert await visible(stack.client, 'FleetqState="Inadmissible" AND '
                                       'FleetqJob="default/inadm-big"') == [big.id]

    small = [await stack.start(walkthrough_job(f"inadm-small-{i}"), run_seconds=3)
             for i in range(5)]
    # Each small job's copy is on a member while it runs: three pods of its own.
    for i, h in enumerate(small):
        running = await wait_view(h, lambda v: v.state in ("Running", "Succeeded"))
        if running.state == "Running":
            assert running.cluster is not None
            assert stack.member_copies(f"inadm-small-{i}") == {
                running.cluster: [f"inadm-small-{i}"]
            }
    views = [JobView.model_validate(await h.result()) for h in small]
    assert [v.state for v in views] == ["Succeeded"] * 5
    # max-jobs 2 and 3 s each: the last started well past the 2 s starvation bound
    last = max(v.bound_at for v in views if v.bound_at is not None)
    first = min(v.created_at for v in views if v.created_at is not None)
    assert (last - first).total_seconds() > 2
    assert all(not any("inadm-big" in e.message for e in v.events) for v in views)
    view = JobView.model_validate(await big.query("status"))
    assert view.state == "Inadmissible" and not view.admitted

    quota = stack.client.get_workflow_handle("quota/kube-system/elasticquotatree")
    qview = QuotaView.model_validate(await quota.query(QuotaTreeWorkflow.view))
    assert qview.inadmissible == 1
    assert [q.inadmissible for q in qview.queues if q.node == "child-2"] == [1]

    await stack.apply(tree(cpu=16))
    running = await wait_view(big, lambda v: v.state in ("Running", "Succeeded"))
    assert running.admitted and running.reason != "quota child-2: cpu 12.01 exceeds max 10"
    if running.state == "Running":
        assert running.cluster is not None
        assert stack.member_copies("inadm-big") == {running.cluster: ["inadm-big"]}
    done = JobView.model_validate(await big.result())
    assert done.state == "Succeeded"
    qview = QuotaView.model_validate(await quota.query(QuotaTreeWorkflow.view))
    assert (qview.holders, qview.waiting, qview.inadmissible) == (0, 0, 0)
