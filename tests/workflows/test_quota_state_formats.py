"""What the quota workflow carries across continue-as-new: its next run picks up the same
holders and queue from one compact ``binary/plain`` payload
(``fleetq.quota_state.pack_state``) with the tree's manifest inside, and still admits."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from fleetq.admission import Admission, AdmissionRequest
from fleetq.models import parse_tree
from fleetq.quota_state import pack_state, unpack_carried
from tests.workflows.test_quota_workflow import Env, _env, tree, wait_for
from workflows.quota_tree import QuotaTreeInput, QuotaTreeWorkflow, QuotaView

JOBS = "kube-queue/max-jobs"
HISTORIES = Path(__file__).parent / "histories"


@pytest_asyncio.fixture
async def qenv(dev_env: WorkflowEnvironment) -> AsyncIterator[Env]:
    async for e in _env(dev_env, dev_env.client):
        yield e


def carried_state(doc: dict[str, Any]) -> bytes:
    """What a run hands its successor: two jobs hold the leaf's two job slots, a third
    (priority 5, grace 60 s) waits."""
    a = Admission(parse_tree(doc))
    for i, prio in enumerate([0, 0, 5]):
        a.enqueue(
            AdmissionRequest(
                job_id=f"pytorchjob/default/old-{i}", namespace="default", priority=prio,
                request={JOBS: 1000}, submitted_at=1_795_000_000.5 + i, grace_seconds=60,
            ),
            now=1_795_000_001.0 + i,
        )
    return pack_state(a.to_state(), doc)


async def view(qh: WorkflowHandle[Any, Any]) -> QuotaView:
    return QuotaView.model_validate(await qh.query(QuotaTreeWorkflow.view))


async def test_continue_as_new_carries_holders_and_queue_in_the_compact_format(
    qenv: Env,
) -> None:
    """A run started from a carried state (as continue-as-new starts one) continues as new
    after a few tasks, and its successor has the same holders and queue."""
    doc = tree([{"name": "team", "max": {JOBS: 2}, "namespaces": ["default"]}])
    wid = "quota/kube-system/state-formats"
    qh = await qenv.env.client.start_workflow(
        "QuotaTreeWorkflow",
        args=[
            # continue-as-new after a few more tasks; no holder check while the test runs
            QuotaTreeInput(max_history_events=12, leak_check_seconds=3600, generation=4),
            carried_state(doc),
        ],
        id=wid, task_queue=f"{qenv.tq}-control",
    )
    before = await view(qh)
    assert (before.holders, before.waiting, before.generation) == (2, 1, 4)
    assert await qh.query(QuotaTreeWorkflow.holders) == [
        "pytorchjob/default/old-0", "pytorchjob/default/old-1"
    ]

    async def continued() -> bool:
        # the same tree again: each adds a scheduling pass to the history
        assert await qh.execute_update(QuotaTreeWorkflow.apply_tree, doc) == "unchanged"
        return (await view(qh)).generation >= 5

    await wait_for(continued)
    after = await view(qh)
    assert (after.tree, after.holders, after.waiting) == (before.tree, 2, 1)
    info = await qh.query(QuotaTreeWorkflow.wait_info, "pytorchjob/default/old-2")
    assert info is not None and info.position == 1

    # the new run's input: the settings as JSON without the tree, then the state and the
    # tree as one binary payload
    latest = qenv.env.client.get_workflow_handle(wid)
    history = await latest.fetch_history()
    started = history.events[0].workflow_execution_started_event_attributes
    settings_payload, carried = started.input.payloads
    assert carried.metadata["encoding"] == b"binary/plain"
    settings = json.loads(settings_payload.data)
    assert settings["tree"] is None
    state, manifest = unpack_carried(carried.data)
    assert manifest == doc
    assert [w[0] for w in state.w] == ["pytorchjob/default/old-2"]
    assert state.wp == {"pytorchjob/default/old-2": (True, 60)}

    # and it still admits: a holder's release lets the waiting job in (whose workflow
    # does not exist here: its grant cannot be delivered and its quota comes back)
    await qh.signal(QuotaTreeWorkflow.release, "pytorchjob/default/old-0")

    async def admitted() -> bool:
        return await qh.query(QuotaTreeWorkflow.wait_info, "pytorchjob/default/old-2") is None

    await wait_for(admitted)
    await qh.signal(QuotaTreeWorkflow.stop)
    await qh.result()
    if os.environ.get("FLEETQ_RECORD_HISTORIES"):  # for tests/workflows/test_replay.py
        hist = await qenv.env.client.get_workflow_handle(wid).fetch_history()
        (HISTORIES / f"quota-compact-state-in@{wid.replace('/', '~')}.json").write_text(
            hist.to_json()
        )
