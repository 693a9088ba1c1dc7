"""A whole fleet for the reliability tests: a Temporal dev server of their own (so the
registry and quota tree of other test packages do not leak in), the member-cluster
emulator in-process (fault injection, object peeks) and an in-process worker on the
``fleetq`` task queue with short member timeouts.

The worker's HTTP requests to members are counted per cluster (to prove backoff, not
tight loops), and every log record of the process is kept (to prove no credential is
ever logged)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from activities.fleet import Fleet
from activities.kube_api import KubeApi
from activities.scheduling import SchedulingActivities
from fleetq.client.apply import apply_registry_object, apply_tree
from fleetq.emulator.fleet import EmulatedFleet
from fleetq.messages import JobView
from fleetq.models import parse_tree
from fleetq.naming import TASK_QUEUE, job_workflow_id
from fleetq.testing.chaos import job_manifest, job_view, tree_manifest
from tests.conftest import quick_fleet_config, start_dev_server
from worker import build_worker

#: quota leaves (and their namespaces) every reliability test may use
LEAVES: dict[str, list[str]] = {
    "faults": ["faults"],
    "soak-a": ["soak-a"],
    "soak-b": ["soak-b"],
    "soak-c": ["soak-c"],
    "sec": ["sec"],
    "iso-a": ["iso-a"],
    "iso-b": ["iso-b"],
    "bad": ["bad"],
}
REL_TREE = "rel-tree"
CONNECT_S = 1.0
READ_S = 2.0


class RequestLog:
    """Timestamps of every HTTP request the worker's adapter sends, per cluster."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.times: dict[str, list[float]] = {}

    def add(self, cluster: str) -> None:
        with self._lock:
            self.times.setdefault(cluster, []).append(time.monotonic())

    def between(self, cluster: str, start: float, end: float) -> list[float]:
        with self._lock:
            return [t for t in self.times.get(cluster, []) if start <= t <= end]

    def max_per_second(self, cluster: str, start: float, end: float) -> int:
        ts = self.between(cluster, start, end)
        best, j = 0, 0
        for i, t in enumerate(ts):
            while ts[j] < t - 1.0:
                j += 1
            best = max(best, i - j + 1)
        return best


class LogCapture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(self.format(record))
        except Exception:  # pragma: no cover - a broken record must not break the worker
            self.lines.append(str(record.msg))


@dataclass
class Stack:
    env: WorkflowEnvironment
    emulated: EmulatedFleet
    fleet: Fleet
    fleet_config: Path
    requests: RequestLog
    logs: LogCapture
    tree: dict[str, Any] = field(default_factory=dict)

    @property
    def client(self) -> Client:
        return self.env.client

    @property
    def address(self) -> str:
        return self.client.service_client.config.target_host

    async def apply(self, manifest: dict[str, Any]) -> str:
        return await apply_registry_object(self.client, manifest)

    async def apply_tree(self, manifest: dict[str, Any]) -> str:
        self.tree = manifest
        return await apply_tree(self.client, parse_tree(manifest), manifest)

    async def start_job(self, manifest: dict[str, Any], *, run_seconds: int | None = 3,
                        policy: dict[str, Any] | None = None) -> WorkflowHandle[Any, Any]:
        ns, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        arg: dict[str, Any] = {"manifest": manifest, "rewatch_seconds": 1.0}
        if run_seconds is not None:
            arg["run_seconds"] = run_seconds
        if policy is not None:
            arg["policy"] = policy
        return await self.client.start_workflow(
            "PyTorchJobWorkflow", arg, id=job_workflow_id(ns, name), task_queue=TASK_QUEUE)

    async def job(self, namespace: str, prefix: str = "job", **kw: Any
                  ) -> WorkflowHandle[Any, Any]:
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        return await self.start_job(job_manifest(namespace, name), **kw)

    async def view(self, handle: WorkflowHandle[Any, Any]) -> JobView:
        v = await job_view(handle)
        assert v is not None, f"{handle.id}: status query failed"
        return v

    async def wait_state(self, handle: WorkflowHandle[Any, Any], *states: str,
                         timeout: float = 30.0) -> JobView:
        deadline = time.monotonic() + timeout
        last: JobView | None = None
        while time.monotonic() < deadline:
            last = await job_view(handle)
            if last is not None and last.state in states:
                return last
            await asyncio.sleep(0.1)
        raise AssertionError(f"{handle.id}: not {states} within {timeout}s "
                             f"(last {last.state if last else '?'}: {last.reason if last else ''})")

    async def wait_end(self, handle: WorkflowHandle[Any, Any], timeout: float = 60.0
                       ) -> JobView:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                desc = await handle.describe()
            except RPCError:
                desc = None
            if desc is not None and desc.status != WorkflowExecutionStatus.RUNNING:
                return await self.view(handle)
            await asyncio.sleep(0.2)
        v = await job_view(handle)
        raise AssertionError(f"{handle.id}: still running after {timeout}s "
                             f"({v.state if v else '?'}: {v.reason if v else ''})")


@pytest.fixture(scope="session")
def request_log() -> Iterator[RequestLog]:
    """Count every request ``KubeApi`` sends (all instances of this process)."""
    log = RequestLog()
    original = KubeApi._send

    def counted(self: KubeApi, *args: Any, **kwargs: Any) -> Any:
        log.add(self.name)
        return original(self, *args, **kwargs)

    KubeApi._send = counted  # type: ignore[method-assign]
    try:
        yield log
    finally:
        KubeApi._send = original  # type: ignore[method-assign]


@pytest_asyncio.fixture(scope="session")
async def stack(tmp_path_factory: pytest.TempPathFactory,
                request_log: RequestLog) -> AsyncIterator[Stack]:
    env = await start_dev_server(data_converter=pydantic_data_converter,
                                 dev_server_log_level="error")
    out = tmp_path_factory.mktemp("rel-emulator")
    emulated = EmulatedFleet(out_dir=out, start_delay=0.2).start()
    cfg = quick_fleet_config(emulated.fleet_config_path, out / "fleet-rel.yaml",
                             CONNECT_S, READ_S)
    fleet = Fleet.from_config(cfg)
    logs = LogCapture()
    logs.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(logs)
    root.setLevel(logging.DEBUG)
    for noisy in ("asyncio", "urllib3", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.INFO)
    worker = build_worker(env.client, SchedulingActivities(env.client, fleet,
                                                           search_attributes=True))
    st = Stack(env, emulated, fleet, cfg, request_log, logs)
    try:
        async with worker:
            await st.apply_tree(tree_manifest(LEAVES, max_jobs=100, name=REL_TREE))
            yield st
    finally:
        root.removeHandler(logs)
        root.setLevel(old_level)
        fleet.close()
        emulated.stop()
        await env.shutdown()
