"""A fleet for CLI tests: the session's Temporal dev server, an emulated fleet and an
in-process worker on the ``fleetq`` task queue; commands run through typer's CliRunner
(in a thread, because each command runs its own event loop)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
from temporalio.testing import WorkflowEnvironment
from typer.testing import CliRunner, Result

from activities.fleet import Fleet
from activities.scheduling import SchedulingActivities
from fleetq.cli import app
from fleetq.client.connection import until_polled
from fleetq.emulator.fleet import EmulatedFleet
from tests.conftest import namespace_client
from worker import build_worker

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@dataclass
class CliFleet:
    emulated: EmulatedFleet
    env: dict[str, str]
    runner: CliRunner

    async def run(self, *args: str, stdin: str | None = None,
                  env: dict[str, str | None] | None = None) -> Result:
        """``fleetq ARGS`` as a user runs it; never a traceback."""
        result = await asyncio.to_thread(
            self.runner.invoke, app, list(args), input=stdin, env={**self.env, **(env or {})})
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            result.exception, result.output)
        assert "Traceback" not in result.output
        return result


@pytest_asyncio.fixture(scope="module")
async def cli_fleet(dev_env: WorkflowEnvironment,
                    tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[CliFleet]:
    state_dir = tmp_path_factory.mktemp("state")
    emulated = EmulatedFleet(start_delay=0.05).start()
    fleet = Fleet.from_config(emulated.fleet_config_path)
    client = await namespace_client(dev_env, "cli")
    worker = build_worker(client, SchedulingActivities(client, fleet, search_attributes=True))
    env = {
        "TEMPORAL_ADDRESS": client.service_client.config.target_host,
        "TEMPORAL_NAMESPACE": "cli",
        "FLEETQ_CONFIG": str(emulated.fleet_config_path),
        "FLEETQ_STATE_DIR": str(state_dir),
    }
    try:
        async with worker:
            await until_polled(client)  # both task queues, the control one from its thread
            yield CliFleet(emulated, env, CliRunner())
    finally:
        fleet.close()
        emulated.stop()
