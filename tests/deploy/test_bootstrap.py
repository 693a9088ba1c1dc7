"""The first versioned deploy, as an operator does it on an empty namespace (issue 27):
no manual step between starting ``fleetq worker --versioning`` and ``fleetq apply``, and
no silent hang when nothing can take the work.

* With no worker at all, ``fleetq apply`` of the walkthrough fails with one line saying
  what to run, and leaves nothing behind to be applied later (the registry stays empty
  once a worker comes).
* A versioned worker started with ``--no-set-current-if-none`` is not ready while its
  deployment has no current version, and ``fleetq apply`` fails with the line naming
  the deployment and ``fleetq setup --set-current``; ``fleetq setup --set-current``
  then makes it ready.
* A versioned worker on an empty namespace makes its own build current, becomes ready,
  and the walkthrough (fleetq/data/walkthrough) applies and its job runs to Succeeded.

One dev server, one namespace per test (each test starts from an empty one).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from temporalio.client import Client
from temporalio.common import WorkerDeploymentVersion
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import WorkerDeploymentConfig
from typer.testing import CliRunner

from fleetq.cli import app
from fleetq.client.connection import (
    DATA_CONVERTER,
    current_build,
    describe_deployment,
    ensure_search_attributes,
)
from fleetq.emulator.fleet import EmulatedFleet
from fleetq.naming import REGISTRY_WORKFLOW_ID, job_workflow_id
from tests.conftest import start_dev_server
from tests.deploy.running_worker import RunningWorker, get, poll

ROOT = Path(__file__).resolve().parents[2]
WALKTHROUGH = ROOT / "fleetq" / "data" / "walkthrough"
NAMESPACES = ("boot-none", "boot-unset", "boot-first")


@pytest_asyncio.fixture(scope="module")
async def server() -> AsyncIterator[WorkflowEnvironment]:
    env = await start_dev_server(*NAMESPACES, search_attributes=False,
                                 dev_server_log_level="error")
    try:
        yield env
    finally:
        await env.shutdown()


async def namespace(server: WorkflowEnvironment, ns: str,
                    monkeypatch: pytest.MonkeyPatch) -> Client:
    """A client of the empty namespace ``ns`` (search attributes registered, as
    ``fleetq setup`` does), which the CLI under test uses too."""
    address = server.client.service_client.config.target_host
    client = await Client.connect(address, namespace=ns, data_converter=DATA_CONVERTER)
    await ensure_search_attributes(client)
    monkeypatch.setenv("TEMPORAL_ADDRESS", address)
    monkeypatch.setenv("TEMPORAL_NAMESPACE", ns)
    return client


async def fleetq(*args: str) -> Any:
    return await asyncio.to_thread(CliRunner().invoke, app, list(args))


def versioned(deployment: str, build: str) -> WorkerDeploymentConfig:
    return WorkerDeploymentConfig(WorkerDeploymentVersion(deployment, build),
                                  use_worker_versioning=True)


async def registry_state(client: Client) -> dict[str, Any]:
    state: dict[str, Any] = await client.get_workflow_handle(REGISTRY_WORKFLOW_ID).query(
        "state")
    return state



def start_worker(server: WorkflowEnvironment, members: EmulatedFleet, namespace: str,
                 **options: Any) -> RunningWorker:
    """A worker process on ``server``'s ``namespace`` over ``members``, started."""
    return RunningWorker(dict(address=server.client.service_client.config.target_host,
                              namespace=namespace, fleet_config=str(members.fleet_config_path),
                              **options)).start()

async def test_apply_without_any_worker_fails_with_one_line_and_applies_nothing(
        server: WorkflowEnvironment, members: EmulatedFleet,
        monkeypatch: pytest.MonkeyPatch) -> None:
    client = await namespace(server, "boot-none", monkeypatch)
    r = await fleetq("apply", "-f", str(WALKTHROUGH))
    assert r.exit_code == 1, r.output
    assert r.stderr.splitlines() == [
        "no worker polls task queue fleetq-control (namespace boot-none): run fleetq worker "
        "(fleetq worker --versioning for a versioned deployment), or fleetq up"], r.output
    # nothing half-done: once a worker runs, the refused objects are not there
    worker = start_worker(server, members, "boot-none")
    try:
        await worker.ready()
        state = await registry_state(client)
        assert state.get("policies", {}) == {} and state.get("tree") is None, state
    finally:
        worker.stop()


async def test_versioned_worker_without_a_current_version_is_unready_and_apply_says_what_to_run(
        server: WorkflowEnvironment, members: EmulatedFleet,
        monkeypatch: pytest.MonkeyPatch) -> None:
    client = await namespace(server, "boot-unset", monkeypatch)
    monkeypatch.setenv("FLEETQ_DEPLOYMENT_NAME", "fleetq-unset")
    worker = start_worker(server, members, "boot-unset",
                          deployment=versioned("fleetq-unset", "u1"), set_current=False)
    try:
        url = worker.health_url + "/readyz"

        def unready_for_the_deployment() -> tuple[bool, str]:
            code, body = get(url)
            return code == 503 and "deployment fleetq-unset has no current version" in body, body

        body = await poll(unready_for_the_deployment, "503 naming the deployment", 60)
        assert "fleetq setup --set-current u1" in body, body
        r = await fleetq("apply", "-f", str(WALKTHROUGH))
        assert r.exit_code == 1, r.output
        assert r.stderr.splitlines() == [
            "no worker polls the current version of deployment fleetq-unset: it has none "
            "(builds u1 poll and receive nothing): run fleetq setup --set-current u1, or "
            "fleetq worker --versioning (its first build becomes current)"], r.output
        r = await fleetq("setup", "--set-current", "u1")
        assert r.exit_code == 0, r.output
        assert "current version: fleetq-unset.u1" in r.output
        await worker.ready()
        desc = await describe_deployment(client, "fleetq-unset")
        assert desc is not None and current_build(desc) == "u1"
    finally:
        worker.stop()


async def test_first_versioned_worker_becomes_current_and_the_walkthrough_runs(
        server: WorkflowEnvironment, members: EmulatedFleet,
        monkeypatch: pytest.MonkeyPatch) -> None:
    client = await namespace(server, "boot-first", monkeypatch)
    assert await describe_deployment(client, "fleetq-first") is None  # an empty namespace
    worker = start_worker(server, members, "boot-first",
                          deployment=versioned("fleetq-first", "f1"))
    try:
        await worker.ready()
        desc = await describe_deployment(client, "fleetq-first")
        assert desc is not None and current_build(desc) == "f1"
        r = await fleetq("apply", "-f", str(WALKTHROUGH), "--run-seconds", "2")
        assert r.exit_code == 0, r.output
        assert "pytorchjob.kubeflow.org/pytorch-test created" in r.output, r.output
        handle = client.get_workflow_handle(job_workflow_id("default", "pytorch-test"))
        view = await handle.result()
        assert view["state"] == "Succeeded", view
        desc_wf = await handle.describe()
        assert desc_wf.raw_description.workflow_execution_info.versioning_info \
            .deployment_version.build_id == "f1"
    finally:
        worker.stop()

