"""``fleetq get pytorchjob`` over Temporal's HTTP API (the Web UI server's ``/api/v1``,
:mod:`fleetq.client.http_api`) prints the same bytes as over the SDK, for every state a
job can be listed in: running, waiting in a queue (``-o wide`` asks the quota workflow),
succeeded, refused, terminated, deleted (absent), and NotFound. One fleet, both
transports, the clock frozen so AGE is the same.

The frontend's own HTTP port cannot serve these reads: its grpc-gateway routes in
``UnescapingModeLegacy`` (go.temporal.io/server service/frontend/http_api_server.go), so
``pytorchjob/<ns>/<name>`` (a ``/`` in the id, even as ``%2F``) matches no route; the
last test pins that, so the day a server routes them this module says so.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import pytest_asyncio
from typer.testing import CliRunner

from activities.fleet import Fleet
from activities.scheduling import SchedulingActivities
from fleetq.cli import get as get_module
from fleetq.cli import output
from fleetq.client import http_api, jobs
from fleetq.client.connection import (
    REFUSAL_TYPES,
    connect,
    temporal_cli_path,
)
from fleetq.emulator.fleet import EmulatedFleet
from fleetq.naming import TASK_QUEUE
from fleetq.runtime.supervisor import free_port
from tests.cli.conftest import CliFleet
from tests.cli.test_commands import JOB_YAML, POLICY, TREE, wait_state
from tests.conftest import start_dev_server
from worker import build_worker

NS = "default"
#: AGE printed by both transports is computed against this instant
FROZEN = datetime(2030, 1, 1, tzinfo=UTC)


async def http_api_answers(ui: str, timeout: float = 60.0) -> None:
    """Wait until the Web UI server's HTTP API answers a list. The UI server dials the
    frontend when both start; a dial that lost that race leaves its gRPC connection in
    backoff, and until it reconnects every call answers "connection refused" (which the
    CLI rightly reads as "use the SDK")."""
    from fleetq.client.http_api import Unsupported, WebApi

    api = WebApi(ui, NS)
    deadline = asyncio.get_running_loop().time() + timeout
    last = ""
    try:
        while True:
            try:
                await asyncio.to_thread(api.list_workflows, "")
                return
            except (Unsupported, OSError) as exc:
                last = str(exc)
            assert asyncio.get_running_loop().time() < deadline, f"HTTP API at {ui}: {last}"
            await asyncio.sleep(0.2)
    finally:
        api.close()


@pytest_asyncio.fixture(scope="module")
async def web_fleet(tmp_path_factory: pytest.TempPathFactory
                    ) -> AsyncIterator[tuple[CliFleet, str]]:
    """A dev server with its Web UI (whose server answers the HTTP API), an emulated
    fleet and a worker; the CLI's env, and the UI's URL."""
    ui_port = free_port()
    env = await start_dev_server(ui=True, ui_port=ui_port)
    emulated = EmulatedFleet(start_delay=0.05).start()
    fleet = Fleet.from_config(emulated.fleet_config_path)
    client = await connect(env.client.service_client.config.target_host)
    worker = build_worker(client, SchedulingActivities(client, fleet, search_attributes=True))
    cli_env = {
        "TEMPORAL_ADDRESS": client.service_client.config.target_host,
        "TEMPORAL_NAMESPACE": NS,
        "FLEETQ_CONFIG": str(emulated.fleet_config_path),
        "FLEETQ_STATE_DIR": str(tmp_path_factory.mktemp("state")),
        "FLEETQ_HTTP_API": "off",
    }
    ui = f"http://127.0.0.1:{ui_port}"
    try:
        async with worker:
            await http_api_answers(ui)
            yield CliFleet(emulated, cli_env, CliRunner()), ui
    finally:
        fleet.close()
        emulated.stop()
        await env.shutdown()


async def both(cli: CliFleet, ui: str, *args: str) -> tuple[tuple[int, str], tuple[int, str]]:
    """``fleetq ARGS`` over the SDK, then over HTTP; (exit code, stdout + stderr) each.
    The HTTP run's TEMPORAL_ADDRESS is a dead port: had it fallen back to the SDK it
    would say no fleetq is found, so its answer is the HTTP path's own."""
    sdk = await cli.run(*args)
    # a generous HTTP timeout: a query a loaded worker answers late must not send the
    # HTTP run to its SDK fallback (a fallback is correct, but not what is compared)
    http = await cli.run(*args, env={"FLEETQ_HTTP_API": ui, "FLEETQ_DEBUG": "1",
                                     "FLEETQ_HTTP_API_TIMEOUT": "60",
                                     "TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}"})
    return (sdk.exit_code, sdk.output), (http.exit_code, http.output)


@pytest.fixture(autouse=True)
def frozen_age(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(get_module, "age", lambda since, now=None: output.age(since, FROZEN))


def test_the_http_reader_mirrors_the_sdk_reader_constants() -> None:
    assert http_api.REFUSAL_TYPES == REFUSAL_TYPES
    assert http_api.JOB_RESOURCE == jobs.JOB_RESOURCE
    assert http_api.MAX_CONCURRENT_QUERIES == jobs.MAX_CONCURRENT_QUERIES


async def test_every_job_state_prints_the_same_over_http_and_grpc(
        web_fleet: tuple[CliFleet, str], tmp_path: Path) -> None:
    cli, ui = web_fleet
    r = await cli.run("apply", "-f", TREE, "-f", POLICY)
    assert r.exit_code == 0, r.output
    tag = uuid.uuid4().hex[:6]
    done, running, waits, gone = (f"{s}-{tag}" for s in ("done", "run", "wait", "gone"))

    async def apply(name: str, annotations: str = "") -> None:
        path = tmp_path / f"{name}.yaml"
        path.write_text(JOB_YAML.replace("name: pytorch-test\n  namespace",
                                         f"name: {name}\n{annotations}  namespace"))
        r = await cli.run("apply", "-f", str(path))
        assert r.exit_code == 0, r.output

    # the queue admits one job at a time: done runs first, then running; the next two
    # wait behind it, and one of them is deleted while it waits
    await apply(done, '  annotations:\n    fleetq.io/run-seconds: "1"\n')
    await wait_state(cli, done, "Succeeded", timeout=60)
    await apply(running)
    await wait_state(cli, running, "Running", timeout=60)
    await apply(waits)
    await apply(gone)
    r = await cli.run("delete", "pytorchjob", gone)
    assert r.exit_code == 0, r.output

    # refused: a PyTorchJob workflow started by hand with a Pod in it; terminated: one
    # started with a delay and terminated before it ran
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"pod-{tag}", "namespace": NS},
           "spec": {"containers": [{"name": "pytorch", "image": "busybox"}]}}
    inp = tmp_path / "pod.json"
    inp.write_text(json.dumps(pod))
    temporal = [str(temporal_cli_path()), "workflow"]
    where = ["--address", cli.env["TEMPORAL_ADDRESS"], "--namespace", NS]
    for argv in (["start", "--task-queue", TASK_QUEUE, "--type", "PyTorchJobWorkflow",
                  "--workflow-id", f"pytorchjob/{NS}/pod-{tag}", "--input-file", str(inp)],
                 ["start", "--task-queue", TASK_QUEUE, "--type", "PyTorchJobWorkflow",
                  "--workflow-id", f"pytorchjob/{NS}/term-{tag}", "--input-file", str(inp),
                  "--start-delay", "1h"],
                 ["terminate", "--workflow-id", f"pytorchjob/{NS}/term-{tag}",
                  "--reason", "test"]):
        proc = await asyncio.to_thread(subprocess.run, [*temporal, *argv, *where],
                                       capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr

    async def settled() -> dict[str, str]:
        r = await cli.run("get", "pytorchjob", "-o", "json")
        return {i["metadata"]["name"]: i["status"]["state"]
                for i in json.loads(r.stdout)["items"]}

    for _ in range(300):
        states = await settled()
        if (states.get(f"pod-{tag}") == "Refused" and states.get(f"term-{tag}") == "Failed"
                and states.get(waits) == "Queued" and gone not in states):
            break
        await asyncio.sleep(0.1)
    assert states[done] == "Succeeded" and states[f"pod-{tag}"] == "Refused", states
    assert states[waits] == "Queued" and states[running] == "Running", states
    assert gone not in states, states

    for args in (["get", "pytorchjob"], ["get", "pytorchjob", "-o", "wide"],
                 ["get", "pytorchjob", "-o", "json"], ["get", "pytorchjob", "-A"],
                 ["get", "pytorchjob", "-o", "yaml"], ["get", "pytorchjob", done],
                 ["get", "pytorchjob", f"pod-{tag}", "-o", "wide"],
                 ["get", "pytorchjob", waits, "-o", "wide"],
                 ["get", "pytorchjob", gone], ["get", "pytorchjob", "-n", "nothing-here"]):
        sdk, http = await both(cli, ui, *args)
        assert http == sdk, (args, http[1][:300])
    sdk, _ = await both(cli, ui, "get", "pytorchjob", "-o", "wide")
    assert f"term-{tag}" in sdk[1] and "workflow terminated" in sdk[1]
    assert "(#1)" in sdk[1], sdk[1]
    sdk, _ = await both(cli, ui, "get", "pytorchjob", gone)
    assert sdk[0] == 1 and "NotFound" in sdk[1]
    for name in (done, running, waits):
        await cli.run("delete", "pytorchjob", name)


async def test_an_unusable_http_api_falls_back_to_the_sdk(
        web_fleet: tuple[CliFleet, str]) -> None:
    """Nothing listening where the HTTP API should be: the SDK reads, same output."""
    cli, _ = web_fleet
    sdk = await cli.run("get", "pytorchjob", "-o", "json")
    dead = await cli.run("get", "pytorchjob", "-o", "json",
                         env={"FLEETQ_HTTP_API": f"http://127.0.0.1:{free_port()}"})
    assert (dead.exit_code, dead.output) == (sdk.exit_code, sdk.output)


def test_the_frontend_http_port_routes_no_id_with_a_slash(tmp_path: Path) -> None:
    """Why the reads go through the Web UI's server: the dev server's frontend HTTP API
    answers a query for ``a-b`` (NotFound: a workflow lookup) but not for ``a/b``, plain
    or escaped (the gateway's own 404: no route)."""
    import http.client
    import time

    port, http_port = free_port(), free_port()
    proc = subprocess.Popen(
        [str(temporal_cli_path()), "server", "start-dev", "--headless", "--ip", "127.0.0.1",
         "--port", str(port), "--http-port", str(http_port), "--db-filename",
         str(tmp_path / "t.db"), "--log-level", "error"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def post(path: str) -> dict[str, object]:
            for _ in range(300):
                try:
                    conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=5)
                    conn.request("POST", path, body=b"{}")
                    return dict(json.loads(conn.getresponse().read()))
                except (OSError, ValueError):  # not listening yet, or not JSON yet
                    time.sleep(0.1)
            raise AssertionError("the dev server's HTTP API never answered")

        base = "/api/v1/namespaces/default/workflows/"
        for _ in range(300):  # until the frontend looks workflows up (namespace ready)
            answer = post(base + "a-b/query/status")
            if "workflow not found for ID: a-b" in str(answer):
                break
            time.sleep(0.1)
        assert "workflow not found for ID: a-b" in str(answer), answer
        for wid in ("a/b", "a%2Fb"):
            answer = post(base + wid + "/query/status")
            assert answer == {"code": 5, "message": "Not Found"}, answer
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_http_timeout_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """``FLEETQ_HTTP_API_TIMEOUT`` sets the seconds of one HTTP call (a slow link or a
    loaded worker); anything but a positive number keeps the default."""
    from fleetq.client import http_api

    monkeypatch.setenv(http_api.HTTP_API_ENV, "http://127.0.0.1:1")
    for raw, want in (("60", 60.0), ("", http_api.TIMEOUT), ("0", http_api.TIMEOUT),
                      ("soon", http_api.TIMEOUT)):
        monkeypatch.setenv(http_api.TIMEOUT_ENV, raw)
        api = http_api.web_api(None)
        assert api is not None and api.timeout == want, raw
