"""Queue policies as strategies (issue 25 item 3): each policy's rules in its own class,
and a new policy is one class, with no edit to :class:`fleetq.admission.Admission`.

Upstream (kueue apis/kueue/v1beta2/clusterqueue_types.go, ``QueueingStrategy``):
``StrictFIFO``: "Older workloads that can't be admitted will block admitting newer
workloads even if they fit available quota" (our ``Block``); ``BestEffortFIFO``: "older
workloads that can't be admitted will not block admitting newer workloads that fit
existing quota" (our ``Priority``, plus its starvation bound). Kueue kept one type per
strategy behind a registry (v0.6.3 pkg/queue/cluster_queue_interface.go), as here.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from typing import Any

import pytest

from fleetq import queue_strategies
from fleetq.admission import Admission, AdmissionRequest, Grant, QueuePolicy, WaitInfo
from fleetq.models import ElasticQuotaTree, parse_tree
from fleetq.queue_strategies import (
    FITS,
    BlockStrategy,
    PriorityStrategy,
    register,
    strategy_for,
)
from fleetq.queues import JobQueue, Key

GPU = "nvidia.com/gpu"
#: interned shapes of the JobQueue unit tests: 8, 2 and 6 GPUs
SHAPES = [{GPU: 8000}, {GPU: 2000}, {GPU: 6000}]
BIG, SMALL, MID = 0, 1, 2


def key(name: str, at: float, prio: int = 0) -> Key:
    return (-prio, at, f"pytorchjob/default/{name}")


def queue(*jobs: tuple[Key, int]) -> JobQueue:
    q = JobQueue("team-q", "team", SHAPES)
    for k, shape in jobs:
        q.add(k, shape)
    return q


def no_quota_reason() -> str | None:
    return None


def quota_full() -> str:
    return "quota team: nvidia.com/gpu needs 8, 4 free of max 16"


# --------------------------------------------------------------------------- registry


def test_every_policy_users_can_write_has_its_strategy() -> None:
    assert isinstance(strategy_for(QueuePolicy.PRIORITY), PriorityStrategy)
    assert isinstance(strategy_for("Block"), BlockStrategy)  # (the annotation's text)
    for policy in QueuePolicy:
        assert strategy_for(policy).policy == policy


def test_an_unknown_policy_is_one_clear_error_naming_it() -> None:
    with pytest.raises(ValueError, match=r"unknown queue policy 'Fifo': one of Priority, Block"):
        strategy_for("Fifo")
    with pytest.raises(ValueError, match="'Fifo'"):
        Admission(None, "Fifo")


# --------------------------------------------------------------------------- Priority


def test_priority_offers_each_shapes_first_job_so_a_job_that_fits_may_overtake() -> None:
    big, small, small2, mid = key("big", 1), key("small", 2), key("small2", 3), key("mid", 4)
    q = queue((big, BIG), (small, SMALL), (small2, SMALL), (mid, MID))
    # (small2 cannot fit where small does not: same request)
    assert list(PriorityStrategy().candidates(q)) == [(big, BIG), (small, SMALL), (mid, MID)]


def test_priority_offers_nothing_behind_a_starving_job() -> None:
    urgent, big, small = key("urgent", 0, prio=9), key("big", 1, prio=5), key("small", 2)
    q = queue((urgent, MID), (small, SMALL))
    q.add(big, BIG, skipped_at=0)
    q.promote(now=61, bound=60)  # skipped for longer than the bound: starving
    # a job ahead of the starving one may still go first; none behind it
    assert list(PriorityStrategy().candidates(q)) == [(urgent, MID), (big, BIG)]


def test_priority_marks_the_jobs_an_admission_overtook_as_skipped() -> None:
    big, small, late = key("big", 1), key("small", 2), key("late", 3)
    q = queue((big, BIG), (small, SMALL), (late, SMALL))
    PriorityStrategy().admitted(q, small, now=7)
    assert q.skipped_at == {big: 7}  # (not the job admitted, nor those behind it)


def test_priority_plans_a_preemption_for_the_first_job_without_a_plan() -> None:
    big, small = key("big", 1), key("small", 2)
    q = queue((big, BIG), (small, SMALL))
    s = PriorityStrategy()
    assert s.preemptor(q, set()) == big
    assert s.preemptor(q, {big[2]}) == small
    assert s.preemptor(q, {big[2], small[2]}) is None


def test_priority_reasons_quota_first_then_a_starving_job_ahead() -> None:
    big, small = key("big", 1, prio=5), key("small", 2)
    q = queue((small, SMALL))
    q.add(big, BIG, skipped_at=0)
    s = PriorityStrategy()
    assert s.reason(q, small, quota_full) == quota_full()
    assert s.reason(q, small, no_quota_reason) == FITS  # (not starving yet)
    q.promote(now=61, bound=60)
    assert s.reason(q, small, no_quota_reason) == "behind starving job default/big"
    assert s.reason(q, big, no_quota_reason) == FITS


# --------------------------------------------------------------------------- Block


def test_block_offers_the_head_only() -> None:
    big, small = key("big", 1, prio=5), key("small", 2)
    q = queue((small, SMALL), (big, BIG))
    assert list(BlockStrategy().candidates(q)) == [(big, BIG)]
    assert list(BlockStrategy().candidates(queue())) == []


def test_block_never_records_skip_times() -> None:
    big, small = key("big", 1), key("small", 2)
    q = queue((big, BIG), (small, SMALL))
    BlockStrategy().admitted(q, small, now=7)  # (a preemptor may leave from behind)
    assert q.skipped_at == {}


def test_block_plans_a_preemption_for_the_head_only() -> None:
    big, small = key("big", 1), key("small", 2)
    q = queue((big, BIG), (small, SMALL))
    s = BlockStrategy()
    assert s.preemptor(q, set()) == big
    assert s.preemptor(q, {big[2]}) is None  # (the head has one: nobody else)
    assert s.preemptor(queue(), set()) is None


def test_block_reasons_the_head_ahead_before_quota() -> None:
    big, same, low = key("big", 1, prio=5), key("same", 2, prio=5), key("low", 3)
    q = queue((big, BIG), (same, SMALL), (low, SMALL))
    s = BlockStrategy()
    assert s.reason(q, low, no_quota_reason) == "behind higher-priority job default/big (Block)"
    assert s.reason(q, same, quota_full) == "behind earlier job default/big (Block)"
    assert s.reason(q, big, quota_full) == quota_full()
    assert s.reason(q, big, no_quota_reason) == FITS


# --------------------------------------------------------------------------- a new policy


class LookaheadStrategy:
    """A toy third policy: a head that does not fit may be overtaken by the next job in
    line only (neither Priority, which lets any job that fits go, nor Block)."""

    policy = "Lookahead"

    def candidates(self, q: JobQueue) -> Sequence[tuple[Key, int]]:
        if len(q.order) < 2:
            return q.heads
        second = q.order[1]
        return [head for head in q.heads if head[0] <= second]

    def admitted(self, q: JobQueue, key: Key, now: float) -> None:
        pass

    def preemptor(self, q: JobQueue, planned: Container[str]) -> Key | None:
        head = q.head()
        return head if head is not None and head[2] not in planned else None

    def reason(self, q: JobQueue, key: Key, quota: Callable[[], str | None]) -> str:
        if q.position(key) > 2:
            return "behind the first two jobs (Lookahead)"
        return quota() or FITS


def gpu_tree() -> ElasticQuotaTree:
    return parse_tree(
        {
            "apiVersion": "scheduling.sigs.k8s.io/v1beta1",
            "kind": "ElasticQuotaTree",
            "metadata": {"name": "tree", "namespace": "kube-system"},
            "spec": {"root": {"name": "root", "max": {GPU: 16}, "children": [
                {"name": "team", "max": {GPU: 16}, "namespaces": ["default"]}]}},
        }
    )


def gpus(name: str, n: int, at: float) -> AdmissionRequest:
    return AdmissionRequest(job_id=f"pytorchjob/default/{name}", namespace="default",
                            request={GPU: n * 1000}, submitted_at=at)


def drive(policy: str) -> tuple[Admission, list[Any]]:
    """4 GPUs free; big (8) then mid (6) do not fit, small (2) would."""
    a = Admission(gpu_tree(), policy)
    assert isinstance(a.enqueue(gpus("holder", 12, 0), now=0), Grant)
    return a, [a.enqueue(gpus(n, g, t), now=t) for n, g, t in
               (("big", 8, 1), ("mid", 6, 2), ("small", 2, 3))]


def test_a_new_policy_is_one_registered_class_and_admission_runs_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(queue_strategies, "_STRATEGIES", dict(queue_strategies._STRATEGIES))
    register(LookaheadStrategy)

    a, (big, mid, small) = drive("Lookahead")
    assert isinstance(small, WaitInfo)  # third in line: not looked at
    assert small.reason == "behind the first two jobs (Lookahead)"
    assert isinstance(mid, WaitInfo) and mid.reason.startswith("quota team: nvidia.com/gpu")
    assert a.queues()[1].policy == "Lookahead"  # (what the quota view shows)
    a.release("pytorchjob/default/holder")
    assert [g.job_id for g in a.schedule(now=4)] == [
        "pytorchjob/default/big", "pytorchjob/default/mid", "pytorchjob/default/small"]

    # the same arrivals under the built-in policies, for contrast
    _, (_, _, small) = drive(QueuePolicy.PRIORITY)
    assert isinstance(small, Grant)  # fits: overtakes big and mid
    _, (_, _, small) = drive(QueuePolicy.BLOCK)
    assert isinstance(small, WaitInfo) and small.reason.endswith("(Block)")


def test_changing_the_policy_switches_the_rules_of_every_queue() -> None:
    """What ``apply_tree`` does when the tree's ``fleetq.io/queue-policy`` changes."""
    a, (_, _, small) = drive(QueuePolicy.BLOCK)
    assert isinstance(small, WaitInfo)
    a.replace_tree(gpu_tree())
    a.policy = QueuePolicy.PRIORITY
    assert a.policy == "Priority" and a.queues()[1].policy == "Priority"
    assert [g.job_id for g in a.schedule(now=4)] == ["pytorchjob/default/small"]
