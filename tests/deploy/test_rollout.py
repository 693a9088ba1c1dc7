"""A versioned rollout, done with the commands of docs/deploy.md against a dev server of
its own, with jobs in flight.

Version A (the real workflows) runs with a job holding quota, one queued behind it and
one that fails over after the switch. Version B registers a job workflow of the same
name that is deliberately incompatible with A's histories (tests/deploy/incompatible_job.py). B is
ramped, then made current with ``temporal worker deployment set-current-version``, and
the test shows: new jobs run on B; A's jobs stay pinned to A and finish there with no
WorkflowTaskFailed in any history (a replay of one on B fails, so that is versioning at
work, not luck); the quota workflow (Auto-Upgrade) moves to B and every message
still arrives (all jobs admitted and released, nothing held or waiting at the end); A
drains. Then the rollback: A current again, B's job finishes on B, B drains and is
retired (its worker stopped, the version deleted).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.common import WorkerDeploymentVersion
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, WorkerDeploymentConfig

from activities.fleet import Fleet
from activities.scheduling import SchedulingActivities
from fleetq.client.apply import apply_tree
from fleetq.client.connection import temporal_cli_path
from fleetq.client.jobs import delete_job
from fleetq.emulator.fleet import EmulatedFleet
from fleetq.messages import JobView, QuotaView
from fleetq.models import parse_tree
from fleetq.naming import TASK_QUEUE, job_workflow_id, tree_workflow_id
from fleetq.testing.chaos import (
    complete_pods,
    job_manifest,
    job_view,
    member_copies,
    policy_manifest,
    tree_manifest,
)
from tests.conftest import quick_fleet_config, start_dev_server
from tests.deploy.incompatible_job import MEMO_KEY, IncompatibleJobWorkflow
from worker import FleetqWorker, build_worker
from workflows.fleet_registry import FleetRegistryWorkflow
from workflows.quota_tree import QuotaTreeWorkflow

DEPLOYMENT = "fleetq-rollout"
A, B = "a-0.1.0", "b-0.1.1"
TREE = "rollout-tree"
HOLD_NS, FREE_NS = "roll-hold", "roll-free"
#: the server re-checks a draining version this often (default: minutes), and
DRAIN_FLAGS = [
    "--dynamic-config-value", 'matching.wv.VersionDrainageStatusRefreshInterval="1s"',
    "--dynamic-config-value", 'matching.wv.VersionDrainageStatusVisibilityGracePeriod="1s"',
    # a stopped worker's pollers are forgotten after this (default 5m), then its version
    # may be deleted
    "--dynamic-config-value", 'matching.PollerHistoryTTL="2s"',
]


async def eventually(check: Callable[[], Awaitable[bool]], what: str,
                     timeout: float = 30.0, every: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        await asyncio.sleep(every)


@dataclass
class Rollout:
    env: WorkflowEnvironment
    emulated: EmulatedFleet
    fleet: Fleet

    @property
    def client(self) -> Client:
        return self.env.client

    async def cli(self, *args: str, ok: bool = True) -> tuple[int, str]:
        """``temporal worker deployment ARGS`` against this test's server."""
        proc = await asyncio.create_subprocess_exec(
            str(temporal_cli_path()), "worker", "deployment", *args,
            "--address", self.client.service_client.config.target_host,
            "--namespace", self.client.namespace,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out, _ = await proc.communicate()
        text = out.decode()
        assert proc.returncode is not None
        if ok and proc.returncode != 0:
            raise AssertionError(f"temporal worker deployment {' '.join(args)}: {text}")
        return proc.returncode, text

    async def until_cli(self, *args: str, timeout: float = 30.0, yes: bool = True) -> str:
        """Run a routing command until the server takes it (a version is only known once
        its pollers reached both task queues)."""
        last = ""

        async def done() -> bool:
            nonlocal last
            rc, last = await self.cli(*args, *(["--yes"] if yes else []), ok=False)
            return rc == 0

        try:
            await eventually(done, f"{args}", timeout, every=0.3)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {last}") from None
        return last

    async def describe_version(self, build: str) -> dict[str, Any]:
        _, text = await self.cli("describe-version", "--deployment-name", DEPLOYMENT,
                                 "--build-id", build, "-o", "json")
        return json.loads(text)  # type: ignore[no-any-return]

    def worker(self, build: str, *, incompatible: bool = False) -> FleetqWorker:
        config = WorkerDeploymentConfig(
            version=WorkerDeploymentVersion(DEPLOYMENT, build), use_worker_versioning=True)
        override = ([IncompatibleJobWorkflow, QuotaTreeWorkflow, FleetRegistryWorkflow]
                    if incompatible else None)
        return build_worker(
            self.client, SchedulingActivities(self.client, self.fleet, search_attributes=True),
            workflows_override=override, deployment=config, max_concurrent_activities=50)

    async def job(self, namespace: str, prefix: str, *, run_seconds: int | None,
                  toleration: int = 1) -> WorkflowHandle[Any, Any]:
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        arg = {"manifest": job_manifest(namespace, name), "rewatch_seconds": 1.0,
               "run_seconds": run_seconds,
               "policy": policy_manifest(namespace, toleration=toleration)}
        return await self.client.start_workflow(
            "PyTorchJobWorkflow", arg, id=job_workflow_id(namespace, name),
            task_queue=TASK_QUEUE)


async def view(handle: WorkflowHandle[Any, Any]) -> JobView | None:
    return await job_view(handle)


async def wait_state(handle: WorkflowHandle[Any, Any], *states: str,
                     timeout: float = 30.0) -> JobView:
    seen: list[JobView] = []

    async def reached() -> bool:
        v = await view(handle)
        if v is not None:
            seen.append(v)
        return v is not None and v.state in states

    await eventually(reached, f"{handle.id} in {states} (last: "
                     f"{seen[-1].state if seen else '?'})", timeout, every=0.1)
    return seen[-1]


async def wait_end(handle: WorkflowHandle[Any, Any], timeout: float = 60.0) -> JobView:
    async def ended() -> bool:
        return (await handle.describe()).status != WorkflowExecutionStatus.RUNNING

    await eventually(ended, f"{handle.id} ended", timeout)
    v = await view(handle)
    if v is None:
        desc = await handle.describe()
        try:
            await handle.result()
        except Exception as exc:
            raise AssertionError(
                f"{handle.id}: {desc.status!r}: {exc!r} {exc.__cause__!r}") from exc
        try:
            await handle.query("status")
        except Exception as exc:
            raise AssertionError(
                f"{handle.id}: {desc.status!r}, status query failed: {exc!r}") from exc
        raise AssertionError(f"{handle.id}: {desc.status!r}, its view could not be read")
    return v


async def version_of(handle: WorkflowHandle[Any, Any]) -> str:
    """The build id the execution runs on (what the Web UI shows as its version)."""
    info = (await handle.describe()).raw_description.workflow_execution_info
    return info.versioning_info.deployment_version.build_id


async def behavior_of(handle: WorkflowHandle[Any, Any]) -> str:
    from temporalio.api.enums.v1 import VersioningBehavior

    info = (await handle.describe()).raw_description.workflow_execution_info
    return VersioningBehavior.Name(info.versioning_info.behavior)


async def ran_on_b(handle: WorkflowHandle[Any, Any]) -> bool:
    return MEMO_KEY in await (await handle.describe()).memo()


async def failed_tasks(handle: WorkflowHandle[Any, Any]) -> list[str]:
    """WorkflowTaskFailed events (a nondeterminism error would be one) of every run."""
    out = []
    async for e in handle.fetch_history_events():
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            out.append(e.workflow_task_failed_event_attributes.failure.message)
    return out


@pytest_asyncio.fixture(scope="module")
async def rollout(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Rollout]:
    env = await start_dev_server(data_converter=pydantic_data_converter,
                                 dev_server_log_level="error", dev_server_extra_args=DRAIN_FLAGS)
    out = tmp_path_factory.mktemp("rollout-emulator")
    emulated = EmulatedFleet(out_dir=out, start_delay=0.2).start()
    cfg = quick_fleet_config(emulated.fleet_config_path, out / "fleet-rollout.yaml",
                             1.0, 2.0)
    fleet = Fleet.from_config(cfg)
    try:
        yield Rollout(env, emulated, fleet)
    finally:
        fleet.close()
        emulated.stop()
        await env.shutdown()


async def test_rollout_ramp_drain_and_rollback(rollout: Rollout) -> None:
    r = rollout
    started = time.monotonic()
    phases: list[tuple[str, float]] = []

    def phase(name: str) -> None:
        phases.append((name, round(time.monotonic() - started, 1)))
    quota = r.client.get_workflow_handle(tree_workflow_id(f"kube-system/{TREE}"))

    # ---- version A is current, with jobs in every phase
    worker_a = r.worker(A)
    await worker_a.__aenter__()
    worker_b: FleetqWorker | None = None
    try:
        await r.until_cli("set-current-version", "--deployment-name", DEPLOYMENT,
                          "--build-id", A)
        tree = tree_manifest({"hold": [HOLD_NS], "free": [FREE_NS]}, max_jobs=1, name=TREE)
        # "hold" admits one job at a time, "free" any number
        tree["spec"]["root"]["children"][1]["max"]["kube-queue/max-jobs"] = 100
        await apply_tree(r.client, parse_tree(tree), tree)

        # The holder and the job that will fail over run until the test acts on them
        # (no run-seconds): what happens to them after the switch is the test's doing,
        # not a race between the ramp and a timer.
        holder = await r.job(HOLD_NS, "hold", run_seconds=None)
        holding = await wait_state(holder, "Running")
        queued = await r.job(HOLD_NS, "queued", run_seconds=1)
        await wait_state(queued, "Queued")
        failing = await r.job(FREE_NS, "fo", run_seconds=None)
        running = await wait_state(failing, "Running")
        assert running.cluster is not None
        in_flight_a = [holder, queued, failing]
        for h in in_flight_a:
            assert await version_of(h) == A and await behavior_of(h) == "VERSIONING_BEHAVIOR_PINNED"
        assert await version_of(quota) == A
        assert await behavior_of(quota) == "VERSIONING_BEHAVIOR_AUTO_UPGRADE"

        phase("A jobs in flight")
        # ---- version B starts and takes a ramp of new jobs
        worker_b = r.worker(B, incompatible=True)
        await worker_b.__aenter__()
        await r.until_cli("set-ramping-version", "--deployment-name", DEPLOYMENT,
                          "--build-id", B, "--percentage", "50")
        # new jobs split between the versions (by workflow id); start them until both
        # got some (a 50 % ramp: 20 jobs all on one side would be a 2^-19 fluke)
        ramped: list[WorkflowHandle[Any, Any]] = []
        ramp_versions: dict[str, str] = {}
        while set(ramp_versions.values()) != {A, B}:
            assert len(ramped) < 20, ramp_versions
            h = await r.job(FREE_NS, f"ramp{len(ramped)}", run_seconds=1)
            ramped.append(h)
            ramp_versions[h.id] = await _first_version(h)
        for h in ramped:
            assert await ran_on_b(h) == (ramp_versions[h.id] == B)

        phase("ramp")
        # ---- B becomes current: new jobs on B, A's jobs stay on A
        await r.until_cli("set-current-version", "--deployment-name", DEPLOYMENT,
                          "--build-id", B)
        queued_at_switch = await view(queued)
        assert queued_at_switch is not None and queued_at_switch.state == "Queued"
        # A's job fails over after the switch, and its failover runs on A
        r.emulated.fail_job(running.cluster, FREE_NS, running.name)

        async def failed_over() -> bool:
            v = await view(failing)
            return (v is not None and v.evicted == [running.cluster]
                    and v.state == "Running" and v.cluster not in (None, running.cluster))

        await eventually(failed_over, "the failed job moved to another cluster", 30)
        # the holder leaves (deleted: its copy purged, its quota returned) and the job
        # queued behind it on A is admitted under B's quota workflow, still on A
        await delete_job(r.client, HOLD_NS, holding.name, wait=True, timeout=30)
        await delete_job(r.client, FREE_NS, running.name, wait=True, timeout=30)
        on_b = await r.job(HOLD_NS, "new", run_seconds=1)
        assert await _first_version(on_b) == B and await ran_on_b(on_b)
        for h in in_flight_a:
            assert await version_of(h) == A, h.id

        # the quota workflow follows the current version on its next task
        await eventually(lambda: _is(version_of(quota), B), "quota workflow on B", 20)

        for h in [queued, *ramped, on_b]:
            v = await wait_end(h, 60)
            assert v.state == "Succeeded", (h.id, v.state, v.reason)
        for h in (holder, failing):
            assert (await h.describe()).status == WorkflowExecutionStatus.CANCELED, h.id
        for ns, name in ((HOLD_NS, holding.name), (FREE_NS, running.name)):
            assert member_copies(r.emulated, ns, name, r.emulated.clusters) == {}, name
        for h in in_flight_a:
            assert await version_of(h) == A and not await ran_on_b(h), h.id
        for h in [*in_flight_a, *ramped, on_b, quota]:
            assert await failed_tasks(h) == [], h.id

        phase("A jobs ended")
        # A's histories really are incompatible with B: replaying one on B fails
        history = await holder.fetch_history()
        replay = await Replayer(workflows=[IncompatibleJobWorkflow],
                                data_converter=pydantic_data_converter
                                ).replay_workflow(history, raise_on_replay_failure=False)
        assert replay.replay_failure is not None and "ondeterminism" in str(
            replay.replay_failure), replay.replay_failure

        # no message lost: everyone was admitted and released, nothing held or waiting
        await eventually(lambda: _quota_empty(quota), "quota workflow empty", 15)

        phase("quota empty")
        # ---- A drains (no open workflow pinned to it) and may be retired
        await eventually(lambda: _drainage(r, A, "drained"), "version A drained", 30, 0.5)

        phase("A drained")
        # ---- rollback: A current again; a job started on B finishes on B
        # long_b is held (no run-seconds) so that B is still draining, not drained, when
        # it is looked at; it is completed once that was seen
        long_b = await r.job(FREE_NS, "long-b", run_seconds=None)
        long_b_running = await wait_state(long_b, "Running")
        assert long_b_running.cluster is not None
        await r.until_cli("set-current-version", "--deployment-name", DEPLOYMENT,
                          "--build-id", A)
        back_on_a = await r.job(FREE_NS, "back", run_seconds=1)
        assert await _first_version(back_on_a) == A and not await ran_on_b(back_on_a)
        await eventually(lambda: _is(version_of(quota), A), "quota workflow back on A", 20)
        await eventually(lambda: _drainage(r, B, "draining"), "version B draining", 15, 0.5)
        await complete_pods(r.emulated, long_b_running.cluster, FREE_NS, long_b_running.name)
        for h in (long_b, back_on_a):
            v = await wait_end(h, 60)
            assert v.state == "Succeeded", (h.id, v.state, v.reason)
            assert await failed_tasks(h) == []
        assert await version_of(long_b) == B and await ran_on_b(long_b)
        await eventually(lambda: _quota_empty(quota), "quota workflow empty", 15)
        assert await failed_tasks(quota) == []
        await eventually(lambda: _drainage(r, B, "drained"), "version B drained", 30, 0.5)

        phase("B drained")
        # ---- retire B: stop its worker, delete the version
        await worker_b.__aexit__(None, None, None)
        worker_b = None
        await r.until_cli("delete-version", "--deployment-name", DEPLOYMENT,
                          "--build-id", B, timeout=30, yes=False)
        rc, text = await r.cli("describe-version", "--deployment-name", DEPLOYMENT,
                               "--build-id", B, ok=False)
        assert rc != 0, text
    finally:
        if worker_b is not None:
            await worker_b.__aexit__(None, None, None)
        await worker_a.__aexit__(None, None, None)
    phase("end")
    print("rollout phases (s since start):", phases)


async def _is(value: Awaitable[str], expected: str) -> bool:
    return await value == expected


async def _first_version(handle: WorkflowHandle[Any, Any]) -> str:
    """The version of a new execution once its first workflow task completed."""
    result = ""

    async def assigned() -> bool:
        nonlocal result
        result = await version_of(handle)
        return bool(result)

    await eventually(assigned, f"{handle.id} has a version", 15, 0.1)
    return result


async def _quota_empty(quota: WorkflowHandle[Any, Any]) -> bool:
    v = await quota.query("view", result_type=QuotaView)
    return v.holders == 0 and v.waiting == 0


async def _drainage(r: Rollout, build: str, status: str) -> bool:
    info = (await r.describe_version(build)).get("drainageInfo") or {}
    return str(info.get("drainageStatus", "")).lower() == status


def test_workflows_declare_no_versioning_behavior_the_workers_set_it() -> None:
    """A behaviour on @workflow.defn fails every workflow task on an unversioned worker
    (fleetq up, the test suite): "versioning behavior cannot be specified without
    deployment options being set with versioned mode". The behaviours are the workers'
    defaults instead (worker.JOB_BEHAVIOR, worker.CONTROL_BEHAVIOR)."""
    from temporalio.common import VersioningBehavior
    from temporalio.workflow import _Definition

    import worker
    from workflows import ALL_WORKFLOWS

    for wf in ALL_WORKFLOWS:
        defn = _Definition.must_from_class(wf)
        assert defn.versioning_behavior == VersioningBehavior.UNSPECIFIED, defn.name
    assert worker.JOB_BEHAVIOR == VersioningBehavior.PINNED
    assert worker.CONTROL_BEHAVIOR == VersioningBehavior.AUTO_UPGRADE
    config = worker.deployment_config(enabled=True, name="fleetq", build="x")
    assert config is not None
    pinned = worker.with_behavior(config, worker.JOB_BEHAVIOR)
    assert pinned is not None
    assert pinned.default_versioning_behavior == VersioningBehavior.PINNED
    assert worker.deployment_config(enabled=False) is None
