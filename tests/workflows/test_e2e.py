"""End to end on the real stack: Temporal dev server, the real activities and adapter, and
the member-cluster emulator over HTTP. The walkthrough with both policies, deletion, and a
failover after a job really fails on its member cluster."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import socket
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest_asyncio
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from activities.fleet import Fleet
from activities.scheduling import SchedulingActivities
from fleetq.client.apply import apply_objects
from fleetq.client.connection import temporal_cli_path
from fleetq.client.jobs import start_job
from fleetq.emulator.fleet import EmulatedFleet
from fleetq.messages import JobView
from fleetq.models import parse_object
from fleetq.naming import job_workflow_id
from fleetq.testing.chaos import complete_pods
from tests.conftest import namespace_client
from tests.workflows.fakes import first_events_in_order, load, policy, walkthrough_job
from worker import build_worker, metrics_runtime
from workflows.quota_tree import QuotaTreeWorkflow, QuotaView

HISTORIES = Path(__file__).parent / "histories"


@dataclass
class Stack:
    client: Client
    emulated: EmulatedFleet
    metrics_url: str

    async def apply(self, *manifests: dict[str, Any]) -> list[str]:
        objs = [(parse_object(m), m) for m in manifests]
        results = await apply_objects(self.client, objs)
        assert all(r.ok for r in results), [r.line for r in results]
        return [r.line for r in results]

    async def start(
        self, manifest: dict[str, Any], run_seconds: int | None = None
    ) -> WorkflowHandle[Any, Any]:
        job = parse_object(manifest)
        assert await start_job(self.client, job, manifest, run_seconds=run_seconds) == "created"  # type: ignore[arg-type]
        ns, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        return self.client.get_workflow_handle(job_workflow_id(ns, name))

    def member_copies(self, name: str) -> dict[str, list[str]]:
        """cluster -> names of member PyTorchJobs called ``name``."""
        out = {}
        for c in self.emulated.members:
            jobs = [
                o["metadata"]["name"]
                for o in self.emulated.objects(c, "pytorchjobs")
                if o["metadata"]["name"] == name
            ]
            if jobs:
                out[c] = jobs
        return out

    def pods(self, name: str) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for c in self.emulated.members:
            pods = [
                p
                for p in self.emulated.objects(c, "pods")
                if p["metadata"].get("labels", {}).get("training.kubeflow.org/job-name") == name
            ]
            if pods:
                out[c] = pods
        return out

    def live_reservations(self) -> list[str]:
        """Available reservations on the clusters that support them."""
        out = []
        for c in self.emulated.members:
            try:
                reservations = self.emulated.objects(c, "reservations")
            except KeyError:  # this member has no Reservation API
                continue
            out += [
                f"{c}/{r['metadata']['name']}"
                for r in reservations
                if r.get("status", {}).get("phase") == "Available"
            ]
        return out


@pytest_asyncio.fixture(scope="module")
async def stack(dev_env: WorkflowEnvironment) -> AsyncIterator[Stack]:
    emulated = EmulatedFleet(start_delay=0.05).start()
    fleet = Fleet.from_config(emulated.fleet_config_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    runtime = metrics_runtime(port)
    client = await namespace_client(dev_env, "e2e", runtime=runtime)
    worker = build_worker(client, SchedulingActivities(client, fleet, search_attributes=True))
    try:
        async with worker:
            yield Stack(client, emulated, f"http://127.0.0.1:{port}/metrics")
    finally:
        fleet.close()
        emulated.stop()


async def wait_view(handle: WorkflowHandle[Any, Any], pred: Any, timeout: float = 60) -> JobView:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        view = JobView.model_validate(await handle.query("status"))
        if pred(view):
            return view
        assert asyncio.get_running_loop().time() < deadline, f"stuck: {view.state} {view.reason}"
        await asyncio.sleep(0.2)


async def record(handle: WorkflowHandle[Any, Any], name: str) -> None:
    """FLEETQ_RECORD_HISTORIES=1 refreshes tests/workflows/histories/ for the replay test."""
    if os.environ.get("FLEETQ_RECORD_HISTORIES"):
        hist = await handle.fetch_history()
        HISTORIES.mkdir(exist_ok=True)
        # "<name>@<workflow id with / as ~>.json": the replayer needs the real id
        (HISTORIES / f"{name}@{handle.id.replace('/', '~')}.json").write_text(hist.to_json())


async def test_walkthrough_gang_only(stack: Stack) -> None:
    await stack.apply(policy(queued=False))
    handle = await stack.start(walkthrough_job("gang-only"))
    view = await wait_view(
        handle, lambda v: v.state == "Running" and sum(p["phase"] == "Running" for p in v.pods) == 3
    )
    assert view.cluster is not None
    pods = stack.pods("gang-only")
    assert list(pods) == [view.cluster], "all replicas on one cluster"
    assert sorted(p["metadata"]["name"] for p in pods[view.cluster]) == [
        "gang-only-master-0",
        "gang-only-worker-0",
        "gang-only-worker-1",
    ]
    (bound,) = [e for e in view.events if e.reason == "ScheduleBindingSucceed"]
    assert bound.message == (
        "Binding has been scheduled successfully. Result: "
        f"{{{view.cluster}:0,[{{master 1}} {{worker 2}}]}}"
    )
    await handle.cancel()
    await wait_view(handle, lambda v: v.state == "Deleted")
    await record(handle, "gang-only-deleted")
    assert stack.member_copies("gang-only") == {}
    assert stack.pods("gang-only") == {}
    assert stack.live_reservations() == []


async def test_walkthrough_queued_runs_to_success_and_returns_quota(stack: Stack) -> None:
    await stack.apply(load("elasticquotatree.yaml"), policy(queued=True))
    handles = [await stack.start(walkthrough_job(f"queued-{i}"), run_seconds=2) for i in range(2)]
    views = [JobView.model_validate(await h.result()) for h in handles]
    assert [v.state for v in views] == ["Succeeded", "Succeeded"]
    assert all(v.admitted and v.queue and v.queue.startswith("root-child-2-") for v in views)
    first, second = sorted(views, key=lambda v: v.bound_at)  # type: ignore[arg-type,return-value]
    assert second.bound_at >= first.finished_at  # type: ignore[operator]  # max-jobs 1
    quota = stack.client.get_workflow_handle("quota/kube-system/elasticquotatree")
    view = QuotaView.model_validate(await quota.query(QuotaTreeWorkflow.view))
    assert view.holders == 0 and view.waiting == 0
    await record(handles[0], "queued-succeeded")
    await record(quota, "quota-tree")
    await record(stack.client.get_workflow_handle("fleetq/registry"), "registry")
    assert stack.live_reservations() == []


async def visible(client: Client, query: str, timeout: float = 10.0) -> list[str]:
    """Workflow ids matching a visibility query (eventually consistent: polled)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        found = [wf.id async for wf in client.list_workflows(query)]
        if found or asyncio.get_running_loop().time() > deadline:
            return found
        await asyncio.sleep(0.2)


def upserted_states(events: Any) -> list[str]:
    """FleetqState values the workflow upserted, in order."""
    from temporalio.api.enums.v1 import EventType
    from temporalio.converter import PayloadConverter

    out = []
    for e in events:
        if e.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
            fields = e.upsert_workflow_search_attributes_event_attributes.search_attributes
            if "FleetqState" in fields.indexed_fields:
                out.append(PayloadConverter.default.from_payload(
                    fields.indexed_fields["FleetqState"], str))
    return out


async def test_search_attributes_are_set_at_submission_and_upserted_for_lasting_states(
    stack: Stack,
) -> None:
    """`fleetq apply` submits a job already filterable as Queued (with its job,
    namespace and priority); the workflow then upserts only states that last: a job
    admitted at once and running within seconds costs two upserts, Running and
    Succeeded, not one per state it passes through."""
    await stack.apply(load("elasticquotatree.yaml"), policy(queued=True))
    # sa-0 is held (no run-seconds: it runs until completed below), so sa-1 stays
    # queued behind it for as long as the checks take
    first = await stack.start(walkthrough_job("sa-0"), run_seconds=None)
    running = await wait_view(first, lambda v: v.state == "Running")
    assert running.cluster is not None
    second = await stack.start(walkthrough_job("sa-1"), run_seconds=1)  # max-jobs 1: waits
    assert await visible(stack.client, 'FleetqState="Queued" AND FleetqJob="default/sa-1" '
                                       'AND FleetqNamespace="default"') == [second.id]
    assert (await wait_view(second, lambda v: v.state == "Queued")).state == "Queued"
    await complete_pods(stack.emulated, str(running.cluster), "default", "sa-0")
    views = [JobView.model_validate(await h.result()) for h in (first, second)]
    assert [v.state for v in views] == ["Succeeded", "Succeeded"]
    for h in (first, second):
        events = (await h.fetch_history()).events
        assert upserted_states(events) == ["Running", "Succeeded"], h.id
    assert await visible(stack.client, 'FleetqState="Succeeded" AND FleetqJob="default/sa-1" '
                                       'AND FleetqQueue STARTS_WITH "root-child-2-"') == [second.id]


async def test_failover_after_the_job_fails_on_its_cluster(stack: Stack) -> None:
    doc = copy.deepcopy(policy(queued=False, toleration=2, purge="Immediately"))
    doc["metadata"]["name"] = "fast-failover"
    doc["spec"]["resourceSelectors"][0]["name"] = "flaky"
    await stack.apply(doc)
    handle = await stack.start(walkthrough_job("flaky"))
    first = await wait_view(handle, lambda v: v.state == "Running")
    assert first.cluster is not None
    assert stack.emulated.fail_job(first.cluster, "default", "flaky")
    view = await wait_view(
        handle,
        lambda v: v.state in ("Running", "Created") and v.cluster not in (None, first.cluster),
        timeout=90,
    )
    assert view.evicted == [first.cluster]
    unhealthy, started, _, _ = first_events_in_order(
        view, "Unhealthy", "FailoverStarted", "Evicted", "Rescheduled")
    assert (started.time - unhealthy.time).total_seconds() >= 2
    assert list(stack.member_copies("flaky")) == [view.cluster]  # old copy purged
    await handle.cancel()
    await wait_view(handle, lambda v: v.state == "Deleted")
    await record(handle, "failover-deleted")
    assert stack.member_copies("flaky") == {}


async def test_plain_temporal_cli_starts_a_job_and_queries_readable_json(stack: Stack) -> None:
    """`temporal workflow start --input-file examples/pytorch-test.json`: the policy comes
    from the fleet, and `temporal workflow query --name status` prints readable JSON."""
    await stack.apply(policy(queued=False))
    doc = json.loads(
        (Path(__file__).resolve().parents[2] / "examples" / "pytorch-test.json").read_text()
    )
    doc["metadata"]["name"] = "from-temporal-cli"
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"fleetq-e2e-{os.getpid()}.json"
    tmp.write_text(json.dumps(doc))
    address = stack.client.service_client.config.target_host
    wid = "pytorchjob/default/from-temporal-cli"
    base = [str(temporal_cli_path()), "workflow"]
    common = ["--address", address, "--namespace", "e2e"]
    start = await asyncio.create_subprocess_exec(
        *base,
        "start",
        *common,
        "--task-queue",
        "fleetq",
        "--type",
        "PyTorchJobWorkflow",
        "--workflow-id",
        wid,
        "--input-file",
        str(tmp),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await start.communicate()
    assert start.returncode == 0, out.decode()
    handle = stack.client.get_workflow_handle(wid)
    await wait_view(handle, lambda v: v.state == "Running")
    query = await asyncio.create_subprocess_exec(
        *base,
        "query",
        *common,
        "--workflow-id",
        wid,
        "--name",
        "status",
        "--output",
        "json",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await query.communicate()
    assert query.returncode == 0, out.decode()
    result = json.loads(out)
    view = result["queryResult"][0] if "queryResult" in result else result
    assert view["state"] == "Running" and view["name"] == "from-temporal-cli"
    assert view["policy"] == "default/example-policy"
    await handle.cancel()
    await wait_view(handle, lambda v: v.state == "Deleted")
    tmp.unlink()


async def test_scheduler_metrics_are_exported(stack: Stack) -> None:
    """Jobs by state, queue lengths, admission latency and failovers reach the worker's
    Prometheus endpoint (runs after the tests above in this module)."""
    text = await asyncio.to_thread(
        lambda: urllib.request.urlopen(stack.metrics_url, timeout=5).read().decode()
    )
    assert "fleetq_job_state_transitions{" in text and 'state="Running"' in text
    assert "fleetq_queue_length{" in text and 'queue="root-child-2-' in text
    assert "fleetq_admission_latency_seconds" in text
    assert "fleetq_failovers{" in text and 'purge_mode="Immediately"' in text  # as written


async def test_web_ui_metadata_is_readable_through_the_temporal_api(stack: Stack) -> None:
    """What the Web UI shows: search-attribute filters, static summary/details, current
    details, and activity/timer summaries — read back through Temporal's API."""
    from temporalio.api.enums.v1 import EventType
    from temporalio.api.sdk.v1 import WorkflowMetadata
    from temporalio.converter import PayloadConverter

    await stack.apply(policy(queued=False))
    handle = await stack.start(walkthrough_job("ui-visible"))
    view = await wait_view(handle, lambda v: v.state == "Running")
    query = (
        'FleetqState="Running" AND FleetqJob="default/ui-visible" '
        f'AND FleetqCluster="{view.cluster}"'
    )
    found: list[str] = []
    for _ in range(50):  # visibility is eventually consistent
        found = [wf.id async for wf in stack.client.list_workflows(query)]
        if found:
            break
        await asyncio.sleep(0.2)
    assert found == [handle.id]
    desc = await handle.describe()
    assert await desc.static_summary() == (
        "PyTorchJob default/ui-visible: 1 master + 2 workers, cpu 4.01, memory 4Gi"
    )
    assert "worker" in (await desc.static_details() or "")
    meta = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    assert meta.current_details.startswith("**Running**")
    assert f"cluster: `{view.cluster}`" in meta.current_details
    hist = await handle.fetch_history()
    conv = PayloadConverter.default
    summaries = [
        conv.from_payload(e.user_metadata.summary, str)
        for e in hist.events
        if e.event_type
        in (
            EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
            EventType.EVENT_TYPE_MARKER_RECORDED,  # local activities
            EventType.EVENT_TYPE_TIMER_STARTED,
        )
        and e.user_metadata.HasField("summary")
    ]
    assert f"bind ui-visible on {view.cluster}" in summaries
    assert "capacity and gang placement" in summaries
    await handle.cancel()
    await wait_view(handle, lambda v: v.state == "Deleted")
