"""The worker's health endpoints and metrics, as the probes and Prometheus of deploy/ see
them: ``run_worker`` (what ``python worker.py --versioning --health-port …
--prometheus-port …`` runs) in a thread with its own event loop, against a dev server of
its own and the member-cluster emulator.

* /readyz stays 503 while a member's capacity cache cannot sync, names the member, and
  turns 200 once it syncs and the server lists the worker's pollers on both queues.
* /livez turns 503 while the worker's event loop is blocked and 200 again after.
* The Prometheus endpoint serves Temporal's worker metrics and the scheduler metrics the
  README names (jobs by state, queue lengths, quota holders, admission latency,
  failovers, placement failures), after one job ran and failed over and one found no
  room on the worker.
* SIGTERM-style shutdown makes /readyz 503 before the worker stops.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest_asyncio
from temporalio.common import WorkerDeploymentVersion
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import WorkerDeploymentConfig

from fleetq.client.apply import apply_tree
from fleetq.client.connection import temporal_cli_path
from fleetq.emulator.fleet import EmulatedFleet
from fleetq.models import parse_tree
from fleetq.naming import TASK_QUEUE, job_workflow_id
from fleetq.runtime.worker_health import LIVE_PATH, READY_PATH, WorkerHealth
from fleetq.testing.chaos import job_manifest, policy_manifest, tree_manifest
from tests.conftest import start_dev_server
from tests.deploy.running_worker import free_port, get, poll
from worker import run_worker

NS = "health"


@dataclass
class Running:
    env: WorkflowEnvironment
    emulated: EmulatedFleet
    health_url: str
    metrics_url: str
    loop: asyncio.AbstractEventLoop
    health: WorkerHealth
    stop: asyncio.Event
    thread: threading.Thread
    early_ready: tuple[int, str]


@pytest_asyncio.fixture(scope="module")
async def running() -> AsyncIterator[Running]:
    env = await start_dev_server(data_converter=pydantic_data_converter,
                                 dev_server_log_level="error")
    emulated = EmulatedFleet(start_delay=0.05).start()
    # a member that does not answer: its cache cannot sync, the worker must not be ready
    emulated.set_reachable("cluster-a", False)
    hport, mport = free_port(), free_port()
    health = WorkerHealth(stall_seconds=1.0, beat_seconds=0.1)
    started = threading.Event()
    box: dict[str, Any] = {}

    def main() -> None:
        async def go() -> None:
            box["loop"] = asyncio.get_running_loop()
            box["stop"] = asyncio.Event()
            started.set()
            await run_worker(
                address=env.client.service_client.config.target_host,
                namespace=env.client.namespace,
                fleet_config=str(emulated.fleet_config_path),
                prometheus_port=mport,
                health_port=hport,
                health=health,
                stop=box["stop"],
                deployment=WorkerDeploymentConfig(
                    WorkerDeploymentVersion("fleetq-health", "h1"), use_worker_versioning=True),
            )

        try:
            asyncio.run(go())
        except BaseException as exc:  # surfaced by the tests
            box["error"] = exc

    thread = threading.Thread(target=main, name="worker-under-test", daemon=True)
    thread.start()
    assert started.wait(10)
    health_url = f"http://127.0.0.1:{hport}"
    await poll(lambda: (get(health_url + READY_PATH)[0] != 0, ""), "health server up", 20)
    early = await asyncio.to_thread(get, health_url + READY_PATH + "?verbose")
    r = Running(env, emulated, health_url, f"http://127.0.0.1:{mport}/metrics", box["loop"],
                health, box["stop"], thread, early)
    try:
        yield r
    finally:
        if thread.is_alive():
            r.loop.call_soon_threadsafe(r.stop.set)
            thread.join(30)
        emulated.stop()
        await env.shutdown()
        assert "error" not in box, box.get("error")


async def test_readyz_waits_for_member_caches_and_both_task_queues(running: Running) -> None:
    code, body = running.early_ready
    assert code == 503, body
    url = running.health_url + READY_PATH + "?verbose"

    async def cold_a() -> None:
        def check() -> tuple[bool, str]:
            c, b = get(url)
            return c == 503 and "cluster-a" in json.loads(b)["checks"]["members"], b

        await poll(check, "503 naming the unsynced member", 20)

    await cold_a()
    # the pollers are seen while the member is still cold: ready waits for both
    def polled() -> tuple[bool, str]:
        _, b = get(url)
        checks = json.loads(b)["checks"]
        return (checks.get(f"task-queue:{TASK_QUEUE}") == "ok"
                and checks.get("task-queue:fleetq-control") == "ok"), b

    await poll(polled, "both task queues polled", 20)
    assert get(url)[0] == 503
    running.emulated.set_reachable("cluster-a", True)
    body = await poll(lambda: (get(url)[0] == 200, get(url)[1]), "ready", 30)
    assert json.loads(body)["ok"] is True
    assert get(running.health_url + READY_PATH) == (200, "ok\n")
    assert get(running.health_url + "/nope")[0] == 404


async def test_livez_fails_while_the_event_loop_is_stuck(running: Running) -> None:
    url = running.health_url + LIVE_PATH
    await poll(lambda: (get(url)[0] == 200, get(url)[1]), "live", 10)
    released = threading.Event()
    # a synchronous wait on the worker's loop: nothing else runs there meanwhile
    running.loop.call_soon_threadsafe(lambda: released.wait(10))
    try:
        body = await poll(lambda: (get(url)[0] == 503, get(url)[1]), "/livez 503", 10)
        assert "loop:main: failing: event loop stuck" in body, body
        assert "loop:control" not in body  # the control plane's loop still beats
    finally:
        released.set()
    await poll(lambda: (get(url)[0] == 200, get(url)[1]), "live again", 10)


async def test_prometheus_endpoint_serves_the_scheduler_metrics(running: Running) -> None:
    running.emulated.set_reachable("cluster-a", True)  # when run without the first test
    ready = running.health_url + READY_PATH
    await poll(lambda: (get(ready)[0] == 200, get(ready)[1]), "ready", 30)
    client = running.env.client
    rc = await _cli(running, "set-current-version", "--deployment-name", "fleetq-health",
                    "--build-id", "h1", "--yes")
    assert rc == 0
    tree = tree_manifest({"h": [NS]}, max_jobs=10, name="health-tree")
    await apply_tree(client, parse_tree(tree), tree)
    name = f"m-{uuid.uuid4().hex[:6]}"
    handle = await client.start_workflow(
        "PyTorchJobWorkflow",
        {"manifest": job_manifest(NS, name), "rewatch_seconds": 1.0, "run_seconds": 30,
         "policy": policy_manifest(NS, toleration=1)},
        id=job_workflow_id(NS, name), task_queue=TASK_QUEUE)

    async def state() -> Any:
        return (await handle.query("status")).get("state")

    async def running_view() -> dict[str, Any]:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            v: dict[str, Any] = await handle.query("status")
            if v.get("state") == "Running" and v.get("cluster"):
                return v
            await asyncio.sleep(0.1)
        raise AssertionError(f"not Running: {await state()}")

    v = await running_view()
    running.emulated.fail_job(v["cluster"], NS, name)
    # a gang no member has room for: placement failures
    big_name = f"big-{uuid.uuid4().hex[:6]}"
    big = await client.start_workflow(
        "PyTorchJobWorkflow",
        {"manifest": job_manifest(NS, big_name, cpu="40"), "rewatch_seconds": 1.0,
         "policy": policy_manifest(NS)},
        id=job_workflow_id(NS, big_name), task_queue=TASK_QUEUE)
    want = ["fleetq_job_state_transitions", "fleetq_queue_length", "fleetq_quota_holders",
            "fleetq_admission_latency_seconds", "fleetq_failovers",
            "fleetq_placement_failures",
            # Temporal's own worker metrics, same endpoint
            "temporal_workflow_task_execution_latency", "temporal_activity_execution_latency",
            "temporal_worker_task_slots_available"]

    def scraped() -> tuple[bool, str]:
        code, text = get(running.metrics_url)
        missing = [m for m in want if m not in text]
        return code == 200 and not missing, f"missing {missing}"

    await poll(scraped, "metrics on the worker's endpoint", 30)
    await handle.terminate("test done")
    await big.terminate("test done")


async def _cli(running: Running, *args: str) -> int:
    proc = await asyncio.create_subprocess_exec(
        str(temporal_cli_path()), "worker", "deployment", *args,
        "--address", running.env.client.service_client.config.target_host,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    return await proc.wait()


async def test_shutdown_turns_readiness_off_first(running: Running) -> None:
    running.emulated.set_reachable("cluster-a", True)  # when run without the first test
    ready = running.health_url + READY_PATH
    await poll(lambda: (get(ready)[0] == 200, get(ready)[1]), "ready", 30)
    running.loop.call_soon_threadsafe(running.stop.set)
    ok, checks = await poll_value(running.health.readiness, lambda r: not r[0], 10)
    assert "shutdown" in checks
    await asyncio.to_thread(running.thread.join, 30)
    assert not running.thread.is_alive()


async def poll_value(fn: Callable[[], Any], pred: Callable[[Any], bool],
                     timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if pred(value):
            return value
        assert time.monotonic() < deadline, value
        await asyncio.sleep(0.05)


def test_health_state_without_a_server() -> None:
    now = [100.0]
    h = WorkerHealth(stall_seconds=5, clock=lambda: now[0])
    assert h.readiness() == (False, {}) and not h.liveness()[0]  # nothing registered yet
    h.require("a", "b")
    h.set("a", True)
    assert not h.readiness()[0]
    h.set("b", True)
    assert h.readiness()[0]
    h.beat("main")
    now[0] += 5
    assert h.liveness()[0]
    now[0] += 0.5
    ok, checks = h.liveness()
    assert not ok and checks["loop:main"].startswith("failing: event loop stuck")
    h.stopping()
    assert not h.readiness()[0]
