"""Determinism guard: recorded histories of real runs must replay on the current workflow
code. A change that breaks replay of running workflows fails here. Refresh the recordings
(when a change is meant to be incompatible and versioned) with
``FLEETQ_RECORD_HISTORIES=1 pytest tests/workflows/test_e2e.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from workflows import ALL_WORKFLOWS

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))


def test_recorded_histories_exist() -> None:
    names = {p.stem.split("@")[0] for p in HISTORIES}
    assert {
        "gang-only-deleted",
        "queued-succeeded",
        "failover-deleted",
        "quota-tree",
        "registry",
        "preemptor",
        "preempted-victim",
        "quota-preemption",
        "quota-preemption-at-once",
        "preempted-victim-at-once",
        "quota-compact-state-in",
        "capacity-preemptor",
        "capacity-victim",
    } <= names


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem.split("@")[0] for p in HISTORIES])
async def test_history_replays_on_current_code(path: Path) -> None:
    workflow_id = path.stem.split("@", 1)[1].replace("~", "/")
    history = WorkflowHistory.from_json(workflow_id, path.read_text())
    replayer = Replayer(workflows=ALL_WORKFLOWS, data_converter=pydantic_data_converter)
    await replayer.replay_workflow(history)  # raises on any nondeterminism
