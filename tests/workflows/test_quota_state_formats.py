"""What the quota workflow carries across continue-as-new: a run started by older code's
continue-as-new (the state as base64 JSON text beside the tree's manifest) picks up the
same holders and queue, and its own continue-as-new carries them on as one compact
``binary/plain`` payload (``fleetq.admission.pack_state``) with the manifest inside."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from fleetq.admission import Admission, AdmissionRequest, pack_state_json, unpack_carried
from fleetq.models import parse_tree
from tests.workflows.test_quota_workflow import Env, _env, tree, wait_for
from workflows.quota_tree import QuotaTreeInput, QuotaTreeWorkflow, QuotaView

JOBS = "kube-queue/max-jobs"
HISTORIES = Path(__file__).parent / "histories"


@pytest_asyncio.fixture
async def qenv(dev_env: WorkflowEnvironment) -> AsyncIterator[Env]:
    async for e in _env(dev_env, dev_env.client):
        yield e


def old_run_input(doc: dict[str, Any]) -> QuotaTreeInput:
    """What a quota workflow of the previous version hands its next run: two jobs hold the
    leaf's two job slots, a third (priority 5, grace 60 s) waits."""
    a = Admission(parse_tree(doc))
    for i, prio in enumerate([0, 0, 5]):
        a.enqueue(
            AdmissionRequest(
                job_id=f"pytorchjob/default/old-{i}", namespace="default", priority=prio,
                request={JOBS: 1000}, submitted_at=1_795_000_000.5 + i, grace_seconds=60,
            ),
            now=1_795_000_001.0 + i,
        )
    return QuotaTreeInput(
        tree=doc,
        packed_state=pack_state_json(a.to_state()),
        # continue-as-new after a few more tasks; no holder check while the test runs
        max_history_events=12,
        leak_check_seconds=3600,
        generation=4,
    )


async def view(qh: WorkflowHandle[Any, Any]) -> QuotaView:
    return QuotaView.model_validate(await qh.query(QuotaTreeWorkflow.view))


async def test_a_run_continued_by_older_code_carries_on_in_the_compact_format(
    qenv: Env,
) -> None:
    doc = tree([{"name": "team", "max": {JOBS: 2}, "namespaces": ["default"]}])
    wid = "quota/kube-system/state-formats"
    qh = await qenv.env.client.start_workflow(
        QuotaTreeWorkflow.run, old_run_input(doc), id=wid, task_queue=f"{qenv.tq}-control",
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
    assert settings["tree"] is None and settings["packed_state"] is None
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
        runs = {"quota-text-state-in": qh.first_execution_run_id, "quota-compact-state-in": None}
        for name, run_id in runs.items():
            hist = await qenv.env.client.get_workflow_handle(wid, run_id=run_id).fetch_history()
            (HISTORIES / f"{name}@{wid.replace('/', '~')}.json").write_text(hist.to_json())
