"""The quota workflow never has more external signals pending than Temporal allows.

Temporal fails every workflow task that would leave more than
``limit.numPendingSignals.error`` signals to other workflows pending (2,000 by default;
``NumPendingSignalsLimitError`` in ``common/dynamicconfig/constants.go`` of
go.temporal.io/server), and retries it for ever: a tree that granted more queued jobs at
once than that stopped for good (``fleetq bench sustained --feed tree`` at 400/s with the
database at 5 ms: "PendingSignalsLimitExceeded ... 2000"). The tree now sends at most
``max_signals_in_flight`` at once and the rest as deliveries finish.

Here the server's limit is lowered to 20: a tree whose window is 10 grants 40 queued jobs
at once, all of them get their grant exactly once and the tree still answers; the same
grants from a tree whose window is above the limit are refused by the server (so the
limit is real, not assumed).
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
import pytest_asyncio
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHandle
from temporalio.service import RPCError

from fleetq.testing.history import run_chain
from fleetq.testing.holder import QuotaHolder
from tests.conftest import start_dev_server
from tests.workflows.fakes import load
from tests.workflows.test_quota_workflow import Env, _env, _waiting, wait_for
from workflows.quota_tree import QuotaTreeWorkflow, QuotaView

#: the server's limit in this test, and the tree's window below it
SERVER_LIMIT = 20
WINDOW = 10
QUEUED = 40


@pytest_asyncio.fixture
async def limited() -> AsyncIterator[Env]:
    env = await start_dev_server(dev_server_extra_args=[
        "--dynamic-config-value", f"limit.numPendingSignals.error={SERVER_LIMIT}"])
    try:
        async for e in _env(env, env.client):
            yield e
    finally:
        await env.shutdown()


def roomy(doc: dict[str, Any]) -> dict[str, Any]:
    """The walkthrough tree with room for every queued job (max-jobs 1 -> 1000)."""
    out = copy.deepcopy(doc)
    out["spec"]["root"]["children"][0]["max"]["kube-queue/max-jobs"] = 1000
    return out


async def queue_behind_one(env: Env, window: int) -> tuple[WorkflowHandle[Any, Any],
                                                            list[WorkflowHandle[Any, Any]]]:
    """A tree of max-jobs 1 with one holder admitted and ``QUEUED`` waiting behind it."""
    qh = await env.start_tree(load("elasticquotatree.yaml"), max_signals_in_flight=window)
    blocker = await env.holder(qh.id, "blocker", hold=True)
    await wait_for(lambda: blocker.query(QuotaHolder.granted))
    waiting = [await env.holder(qh.id, f"w{i}") for i in range(QUEUED)]
    await wait_for(lambda: _waiting(qh, QUEUED), timeout=60)
    return qh, waiting


def most_pending(events: Sequence[HistoryEvent]) -> int:
    """The most signals to other workflows pending at once in a history."""
    pending = most = 0
    for ev in events:
        if ev.HasField("signal_external_workflow_execution_initiated_event_attributes"):
            pending += 1
            most = max(most, pending)
        elif (ev.HasField("external_workflow_execution_signaled_event_attributes")
              or ev.HasField("signal_external_workflow_execution_failed_event_attributes")):
            pending -= 1
    return most


async def test_a_tree_grants_more_queued_jobs_than_the_server_lets_it_signal_at_once(
    limited: Env,
) -> None:
    qh, waiting = await queue_behind_one(limited, WINDOW)
    # one pass admits all 40 at once: each grant is a signal to the job's workflow
    await qh.execute_update(QuotaTreeWorkflow.apply_tree, roomy(load("elasticquotatree.yaml")))
    assert await asyncio.gather(*(h.result() for h in waiting)) == [1] * QUEUED
    view = QuotaView.model_validate(await qh.query(QuotaTreeWorkflow.view))
    assert (view.holders, view.waiting) == (1, 0)  # the blocker; and the tree answers
    _runs, events = await run_chain(limited.env.client, qh.id, qh.result_run_id,
                                    keep_events=True)
    assert most_pending(events) == WINDOW
    await qh.signal(QuotaTreeWorkflow.stop)


async def test_without_the_window_the_server_refuses_the_same_grants(limited: Env) -> None:
    qh, _queued = await queue_behind_one(limited, SERVER_LIMIT * 10)
    with pytest.raises(RPCError, match="workflow task failure"):
        await qh.execute_update(QuotaTreeWorkflow.apply_tree,
                                roomy(load("elasticquotatree.yaml")))
    await qh.terminate("the server refused its grants, as expected")
