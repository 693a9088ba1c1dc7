"""The quota workflow drops a preemption plan whose victim never stops (issue 18): on the
time-skipping server, a victim that ignores its ``preempt`` signal keeps the preemptor
waiting only until its grace period + the margin; then the preemptor waits like any
other job, ``describe`` says why, and once the victim releases at last the preemptor is
admitted."""

from __future__ import annotations

import asyncio
from typing import Any

from fleetq.admission import DEFAULT_GRACE_SECONDS, PLAN_MARGIN_SECONDS, WaitInfo
from tests.workflows.test_quota_workflow import Env, tsq, wait_for
from workflows.quota_tree import QuotaTreeWorkflow, QuotaView

__all__ = ["tsq"]

TREE: dict[str, Any] = {
    "apiVersion": "scheduling.sigs.k8s.io/v1beta1",
    "kind": "ElasticQuotaTree",
    "metadata": {"name": "stuck", "namespace": "kube-system",
                 "annotations": {"fleetq.io/preemption": "LowerPriority"}},
    "spec": {"root": {"name": "root", "max": {"kube-queue/max-jobs": 1},
                      "namespaces": ["default"]}},
}


async def test_a_plan_whose_victim_never_stops_is_dropped(tsq: Env) -> None:
    qh = await tsq.start_tree(TREE)
    # QuotaHolder ignores ``preempt``: a victim stuck (e.g. purging on a lost member)
    low = await tsq.holder(qh.id, "low", priority=0, hold=True)

    async def holds(n: int) -> bool:
        view: QuotaView = await qh.query(QuotaTreeWorkflow.view)
        return view.holders == n

    await wait_for(lambda: holds(1))
    high = await tsq.holder(qh.id, "high", priority=10, hold=True)

    async def planned() -> bool:
        view: QuotaView = await qh.query(QuotaTreeWorkflow.view)
        return view.preempting == {high.id: [low.id]}

    await wait_for(planned)
    await tsq.env.sleep(DEFAULT_GRACE_SECONDS + PLAN_MARGIN_SECONDS + 5)

    async def dropped() -> bool:
        view: QuotaView = await qh.query(QuotaTreeWorkflow.view)
        return view.preempting == {}

    await wait_for(dropped)
    info: WaitInfo | None = await qh.query(QuotaTreeWorkflow.wait_info, high.id)
    assert info is not None and info.victims == []
    assert "preemption timed out" in info.reason and "did not release quota in time" in (
        info.reason
    )
    assert await _holders_are(qh, [low.id])
    # the stuck victim stops at last: the preemptor gets its quota
    await low.signal("finish")
    await wait_for(lambda: _holders_are(qh, [high.id]))
    await high.signal("finish")
    await asyncio.wait_for(high.result(), 30)


async def _holders_are(qh: Any, ids: list[str]) -> bool:
    return list(await qh.query(QuotaTreeWorkflow.holders)) == ids
