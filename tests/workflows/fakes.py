"""The workflow tests' manifests and harness: example jobs and policies, a worker running
the real workflows with a fake fleet (:mod:`fleetq.testing.fake_fleet`, the scripted
activities), a registry workflow of its own, stand-in capacity caches, a client that keeps
its metrics, and a job's view read by its ``status`` query."""

from __future__ import annotations

import copy
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml
from temporalio.client import Client, WorkflowHandle
from temporalio.runtime import MetricBuffer, Runtime, TelemetryConfig
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from fleetq.messages import JobEvent, JobView
from fleetq.preemption import RunningGang
from fleetq.registry import RegistryState
from fleetq.testing.fake_fleet import FakeFleet
from workflows.fleet_registry import FleetRegistryWorkflow

MANIFESTS = Path(__file__).resolve().parents[2] / "examples"
SHARED = Path(__file__).resolve().parents[3] / "shared" / "reference" / "manifests"


def load(name: str) -> dict[str, Any]:
    for base in (MANIFESTS, SHARED):
        path = base / name
        if path.exists():
            return dict(yaml.safe_load(path.read_text()))
    raise FileNotFoundError(name)


def walkthrough_job(
    name: str = "pytorch-test", namespace: str = "default", **spec: Any
) -> dict[str, Any]:
    doc = copy.deepcopy(load_job())
    doc["metadata"]["name"] = name
    doc["metadata"]["namespace"] = namespace
    for role, tmpl in spec.items():
        doc["spec"]["pytorchReplicaSpecs"][role]["template"]["spec"].update(tmpl)
    return doc


def load_job() -> dict[str, Any]:
    return (
        load("pytorchjob.yaml")
        if (SHARED / "pytorchjob.yaml").exists()
        else load("pytorch-test.yaml")
    )


def policy(
    queued: bool = False,
    toleration: int = 30,
    purge: str = "Immediately",
    grace: int | None = None,
    **placement: Any,
) -> dict[str, Any]:
    doc = copy.deepcopy(
        load("propagationpolicy-gang-queue.yaml" if queued else "propagationpolicy-gang.yaml")
    )
    app = doc["spec"]["failover"]["application"]
    app["decisionConditions"]["tolerationSeconds"] = toleration
    app["purgeMode"] = purge
    if grace is not None:
        app["gracePeriodSeconds"] = grace
    if placement:
        doc["spec"]["placement"].update(placement)
    return doc


class Harness:
    """Starts jobs on a worker that runs the real workflows with a :class:`FakeFleet`."""

    def __init__(self, env: WorkflowEnvironment, fleet: FakeFleet, task_queue: str) -> None:
        self.env, self.fleet, self.task_queue = env, fleet, task_queue

    async def start(self, manifest: dict[str, Any], **extra: Any) -> WorkflowHandle[Any, Any]:
        from fleetq.naming import job_workflow_id

        ns, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        arg = {"manifest": manifest, **extra} if extra else manifest
        return await self.env.client.start_workflow(
            "PyTorchJobWorkflow",
            arg,
            id=job_workflow_id(ns, name),
            task_queue=self.task_queue,
            execution_timeout=timedelta(days=30),
        )

    async def run(self, manifest: dict[str, Any], **extra: Any) -> JobView:
        handle = await self.start(manifest, **extra)
        return JobView.model_validate(await handle.result())


@asynccontextmanager
async def running_harness(env: WorkflowEnvironment, fleet: FakeFleet) -> AsyncIterator[Harness]:
    """A worker with every workflow and ``fleet``'s activities on a task queue of its own."""
    from workflows import ALL_WORKFLOWS

    tq = f"tq-{uuid.uuid4().hex[:8]}"
    async with Worker(
        env.client, task_queue=tq, workflows=ALL_WORKFLOWS, activities=fleet.activities()
    ):
        yield Harness(env, fleet, tq)


@asynccontextmanager
async def registry_running(
    env: WorkflowEnvironment, state: RegistryState, workflow_id: str | None = None
) -> AsyncIterator[WorkflowHandle[FleetRegistryWorkflow, None]]:
    """A fleet registry workflow from ``state`` on a task queue of its own (terminated
    after)."""
    tq = f"tq-{uuid.uuid4().hex[:8]}"
    async with Worker(env.client, task_queue=tq, workflows=[FleetRegistryWorkflow]):
        handle = await env.client.start_workflow(
            FleetRegistryWorkflow.run, state,
            id=workflow_id or f"registry-{uuid.uuid4().hex[:8]}", task_queue=tq)
        try:
            yield handle
        finally:
            await handle.terminate()


@dataclass
class StubCache:
    """A member's capacity cache as the placement activity reads it: the gangs running."""

    gangs: list[RunningGang] = field(default_factory=list)

    def running_gangs(self) -> list[RunningGang]:
        return list(self.gangs)


@dataclass
class StubMember:
    cache: StubCache
    labels: dict[str, str] = field(default_factory=dict)
    reservation: bool = False


async def metered_client(env: WorkflowEnvironment) -> tuple[Client, MetricBuffer]:
    """A client on ``env``'s server whose runtime keeps its metrics in the buffer."""
    buffer = MetricBuffer(10_000)
    base = env.client
    client = await Client.connect(
        base.service_client.config.target_host,
        namespace=base.namespace,
        data_converter=base.data_converter,
        runtime=Runtime(telemetry=TelemetryConfig(metrics=buffer)),
    )
    return client, buffer


def counted(metrics: MetricBuffer, name: str, label: str) -> dict[str, int]:
    """Every update of counter ``name`` in ``metrics`` so far, summed by ``label``'s value."""
    out: dict[str, int] = {}
    for u in metrics.retrieve_updates():
        if u.metric.name == name:
            key = str(u.attributes.get(label))
            out[key] = out.get(key, 0) + int(u.value)
    return out


async def view_of(handle: WorkflowHandle[Any, Any]) -> JobView:
    """A job's view, from its workflow's ``status`` query."""
    return JobView.model_validate(await handle.query("status"))


def first_events_in_order(view: JobView, *reasons: str) -> list[JobEvent]:
    """The first event of each of ``reasons`` in ``view``, asserting they came in that
    order."""
    seen = [e.reason for e in view.events]
    assert all(r in seen for r in reasons), (reasons, seen)
    at = [seen.index(r) for r in reasons]
    assert at == sorted(at), (reasons, seen)
    return [view.events[i] for i in at]
