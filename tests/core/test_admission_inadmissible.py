"""Inadmissible jobs (issue 24): a job whose gang minimum exceeds the ``max`` of its leaf
or of an ancestor can never be admitted under the current tree. It is kept beside its
queue with a typed reason, never blocks, starves or counts, and every tree change
re-evaluates it, giving it back its original place.

Upstream: Kueue keeps such workloads apart from the heads of each ClusterQueue
(kueue pkg/queue/cluster_queue.go, ``clusterQueue.inadmissibleWorkloads``, put back by
``QueueInadmissibleWorkloads`` when the ClusterQueue or its cohort changes); Kube Queue's
ElasticQuotaTree admits a job only under ``max`` at its leaf and every ancestor
(koord-queue, ``ElasticQuotaTree``), so a request above a ``max`` never fits.
"""

from __future__ import annotations

from typing import Any

import pytest

from fleetq.admission import (
    Admission,
    AdmissionRequest,
    Grant,
    PendingPlan,
    QueuePolicy,
    WaitInfo,
)
from fleetq.models import ElasticQuotaTree, parse_tree
from fleetq.quota import InadmissibleReason
from fleetq.quota_state import pack_state, unpack_state

GPU = "nvidia.com/gpu"
JOBS = "kube-queue/max-jobs"


def tree(team_max: dict[str, Any], root_max: dict[str, Any] | None = None) -> ElasticQuotaTree:
    return parse_tree({
        "apiVersion": "scheduling.sigs.k8s.io/v1beta1",
        "kind": "ElasticQuotaTree",
        "metadata": {"name": "t", "namespace": "kube-system"},
        "spec": {"root": {
            "name": "root",
            "max": root_max or {"cpu": 128, GPU: 16},
            "children": [
                {"name": "team", "max": team_max, "namespaces": ["vision"]},
                {"name": "other", "max": {"cpu": 8}, "namespaces": ["nlp"]},
            ],
        }},
    })


def req(name: str, *, at: float, cpu: int = 1, gpu: int = 0, ns: str = "vision",
        prio: int = 0) -> AdmissionRequest:
    request = {JOBS: 1000, "cpu": cpu * 1000}
    if gpu:
        request[GPU] = gpu * 1000
    return AdmissionRequest(job_id=f"pytorchjob/{ns}/{name}", namespace=ns, priority=prio,
                            request=request, submitted_at=at)


def jid(name: str, ns: str = "vision") -> str:
    return f"pytorchjob/{ns}/{name}"


def test_over_max_job_is_inadmissible_with_a_reason_naming_node_and_resource() -> None:
    a = Admission(tree({"cpu": 64, GPU: 8}))
    out = a.enqueue(req("v-gpu-1", at=0, gpu=12), now=0)
    assert isinstance(out, WaitInfo)
    assert out.reason == "quota team: nvidia.com/gpu 12 exceeds max 8"
    assert out.position == 0
    why = out.inadmissible
    assert why is not None
    assert (why.reason, why.node, why.resource, why.request, why.max) == (
        InadmissibleReason.EXCEEDS_MAX, "team", GPU, 12000, 8000
    )
    assert a.inadmissible() == {jid("v-gpu-1"): why}
    assert a.admissibility_changes() == {jid("v-gpu-1"): why}
    assert a.admissibility_changes() == {}
    team = next(q for q in a.queues() if q.node == "team")
    assert (team.length, team.inadmissible) == (0, 1)
    assert a.counts() == (0, 0)


def test_an_ancestor_max_and_max_jobs_make_a_job_inadmissible_too() -> None:
    a = Admission(tree({}, root_max={"cpu": 64}))
    out = a.enqueue(req("big", at=0, cpu=80), now=0)
    assert isinstance(out, WaitInfo)
    assert out.reason == "quota root: cpu 80 exceeds max 64"
    b = Admission(tree({JOBS: 0}))
    out = b.enqueue(req("any", at=0), now=0)
    assert isinstance(out, WaitInfo)
    assert out.reason == "quota team: kube-queue/max-jobs 1 exceeds max 0"
    # the lowest node is named first: the leaf before the root
    c = Admission(tree({"cpu": 32}, root_max={"cpu": 64}))
    out = c.enqueue(req("big", at=0, cpu=80), now=0)
    assert isinstance(out, WaitInfo) and out.reason == "quota team: cpu 80 exceeds max 32"


@pytest.mark.parametrize("policy", list(QueuePolicy))
def test_it_never_blocks_or_starves_the_small_jobs_behind_it(policy: QueuePolicy) -> None:
    """The issue's report: five small jobs sat behind a starving impossible job."""
    a = Admission(tree({"cpu": 64, GPU: 8}), policy, starvation_seconds=5)
    a.enqueue(req("v-gpu-1", at=0, gpu=12), now=0)
    a.enqueue(req("hog", at=1, cpu=64), now=1)  # fills the team
    small = [req(f"small-{i}", at=2 + i, cpu=8) for i in range(5)]
    for r in small:
        assert isinstance(a.enqueue(r, now=2), WaitInfo)
    waits = [a.wait_info(r.job_id) for r in small]
    assert [w.position for w in waits if w] == [1, 2, 3, 4, 5]
    assert all(w and "v-gpu-1" not in w.reason for w in waits)
    assert a.release(jid("hog"))
    grants = a.schedule(now=600)  # long past starvation_seconds
    assert [g.job_id for g in grants] == [r.job_id for r in small]
    info = a.wait_info(jid("v-gpu-1"))
    assert info is not None and info.inadmissible is not None


def test_raising_the_max_queues_it_again_with_its_original_submit_time() -> None:
    a = Admission(tree({"cpu": 64, GPU: 8}), starvation_seconds=5)
    a.enqueue(req("v-gpu-1", at=0, gpu=12, cpu=4), now=0)
    a.enqueue(req("hog", at=1, cpu=64), now=1)
    a.enqueue(req("later", at=5, cpu=4), now=5)
    a.admissibility_changes()
    a.replace_tree(tree({"cpu": 64, GPU: 16}))
    assert a.admissibility_changes() == {jid("v-gpu-1"): None}
    assert a.inadmissible() == {}
    first = a.wait_info(jid("v-gpu-1"))
    assert first is not None and first.position == 1 and first.inadmissible is None
    assert first.reason.startswith("quota team: cpu needs 4")
    later = a.wait_info(jid("later"))
    assert later is not None and later.position == 2
    a.release(jid("hog"))
    assert [g.job_id for g in a.schedule(now=10)] == [jid("v-gpu-1"), jid("later")]


def test_lowering_the_max_moves_waiting_jobs_that_no_longer_fit_out_of_the_queue() -> None:
    a = Admission(tree({"cpu": 8, GPU: 8}), starvation_seconds=0)
    assert isinstance(a.enqueue(req("hog", at=0, cpu=6), now=0), Grant)
    a.enqueue(req("big", at=1, cpu=4, gpu=8), now=1)
    assert isinstance(a.enqueue(req("small", at=2, cpu=1), now=2), Grant)  # skips big
    blocked = a.enqueue(req("small-2", at=3, cpu=1), now=3)
    assert isinstance(blocked, WaitInfo)
    assert blocked.reason == "behind starving job vision/big"
    a.admissibility_changes()
    a.replace_tree(tree({"cpu": 8, GPU: 4}))
    changes = a.admissibility_changes()
    assert list(changes) == [jid("big")]
    why = changes[jid("big")]
    assert why is not None and why.message == "quota team: nvidia.com/gpu 8 exceeds max 4"
    # starving no more: it stands in nobody's way
    assert [g.job_id for g in a.schedule(now=4)] == [jid("small-2")]


def test_it_survives_continue_as_new_and_cancel_removes_it() -> None:
    a = Admission(tree({"cpu": 64, GPU: 8}))
    a.enqueue(req("v-gpu-1", at=0, gpu=12), now=0)
    a.enqueue(req("ok", at=1, cpu=70, ns="vision"), now=1)
    restored = Admission.from_state(unpack_state(pack_state(a.to_state())))
    assert restored.inadmissible() == a.inadmissible()
    assert set(restored.inadmissible()) == {jid("v-gpu-1"), jid("ok")}
    assert restored.admissibility_changes() == {}  # the packing run told them
    assert restored.cancel(jid("v-gpu-1"))
    assert not restored.cancel(jid("v-gpu-1"))
    assert set(restored.inadmissible()) == {jid("ok")}
    again = restored.enqueue(req("ok", at=1, cpu=70), now=2)  # asked again: told again
    assert isinstance(again, WaitInfo) and again.inadmissible is not None
    assert list(restored.admissibility_changes()) == [jid("ok")]


def test_an_inadmissible_job_is_never_a_preemptor() -> None:
    a = Admission(tree({"cpu": 64, GPU: 8}))
    a.enqueue(req("v-gpu-1", at=0, gpu=12), now=0)
    assert a.preemption_candidates() == []
    with pytest.raises(ValueError, match="inadmissible"):
        a.add_plan(PendingPlan(preemptor=jid("v-gpu-1"), node="team"))


def test_a_plan_whose_preemptor_becomes_inadmissible_is_dropped() -> None:
    a = Admission(tree({"cpu": 8}))
    assert isinstance(a.enqueue(req("victim", at=0, cpu=8), now=0), Grant)
    a.enqueue(req("p", at=1, cpu=8, prio=5), now=1)
    a.add_plan(PendingPlan(preemptor=jid("p"), node="team", priority=5,
                           request={"cpu": 8000, JOBS: 1000}))
    a.replace_tree(tree({"cpu": 4}))
    assert a.plans() == []
    assert set(a.inadmissible()) == {jid("p")}
