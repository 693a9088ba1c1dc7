"""Issue 24 end to end on the embedded fleet (Temporal dev server, the real activities
and adapter, the member-cluster emulator over HTTP), reading the members themselves:

- "never" versus "not now": a 40-cpu job where the largest node anywhere has 32 gives
  its quota back within seconds and says why (``Unschedulable``), while a job that fits
  an empty member but not now keeps its quota, waits ``Pending`` and later runs; when a
  64-cpu node joins a member, the never job is woken, queues again with its original
  submit time and runs there;
- re-queue with backoff: a job whose pods never run (the member starts no pod for an
  hour) is purged from its member and re-queued after ``podsReadyTimeoutSeconds``, with
  a doubling backoff, and ends ``Failed`` after ``requeueLimit`` re-queues.
"""

from __future__ import annotations

import asyncio
import copy
import re
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from activities.fleet import Fleet
from activities.scheduling import SchedulingActivities
from fleetq.client.apply import apply_objects
from fleetq.client.connection import DATA_CONVERTER
from fleetq.client.jobs import start_job
from fleetq.emulator.fleet import EmulatedFleet
from fleetq.fleet_config import RequeueSettings, load_fleet_config
from fleetq.messages import JobEvent, JobView
from fleetq.models import parse_object
from fleetq.naming import job_workflow_id
from fleetq.testing.chaos import HELD_RUN_SECONDS, complete_pods, member_copies
from fleetq.topology import NodeGroup, parse_topology
from tests.conftest import start_dev_server
from tests.workflows.fakes import load_job, policy, view_of
from worker import build_worker
from workflows.quota_tree import QuotaTreeWorkflow, QuotaView

pytestmark = [pytest.mark.timeout(180)]

TOPOLOGY = {
    "clusters": [
        {"name": "hub", "member": False},
        {"name": "cluster-a", "nodeGroups": [{"count": 1, "cpu": "32", "memory": "128Gi"}]},
        {"name": "cluster-b", "nodeGroups": [{"count": 2, "cpu": "16", "memory": "64Gi"}]},
    ]
}
TREE: dict[str, Any] = {
    "apiVersion": "scheduling.sigs.k8s.io/v1beta1",
    "kind": "ElasticQuotaTree",
    "metadata": {"name": "elasticquotatree", "namespace": "kube-system"},
    "spec": {"root": {
        "name": "root",
        "max": {"cpu": 200, "memory": "2000Gi"},
        "min": {"cpu": 200, "memory": "2000Gi"},
        "children": [{"name": "team", "max": {"cpu": 100, "memory": "1000Gi"},
                      "namespaces": ["default"]}],
    }},
}


def job(name: str, cpu: int) -> dict[str, Any]:
    """A master-only PyTorchJob requesting ``cpu`` cores."""
    doc = copy.deepcopy(load_job())
    doc["metadata"]["name"] = name
    specs = doc["spec"]["pytorchReplicaSpecs"]
    specs.pop("Worker", None)
    container = specs["Master"]["template"]["spec"]["containers"][0]
    container["resources"] = {"requests": {"cpu": str(cpu), "memory": "1Gi"},
                              "limits": {"cpu": str(cpu), "memory": "1Gi"}}
    return doc


@dataclass
class Stack:
    client: Client
    emulated: EmulatedFleet

    async def apply(self, *manifests: dict[str, Any]) -> None:
        results = await apply_objects(self.client, [(parse_object(m), m) for m in manifests])
        assert all(r.ok for r in results), [r.line for r in results]

    async def start(self, manifest: dict[str, Any], run_seconds: int | None = None
                    ) -> WorkflowHandle[Any, Any]:
        obj = parse_object(manifest)
        got = await start_job(self.client, obj, manifest, run_seconds=run_seconds)  # type: ignore[arg-type]
        assert got == "created"
        meta = manifest["metadata"]
        return self.client.get_workflow_handle(job_workflow_id(meta["namespace"], meta["name"]))

    def member_jobs(self, name: str) -> dict[str, int]:
        """cluster -> how many PyTorchJobs called ``name`` the member holds."""
        return member_copies(self.emulated, None, name, list(self.emulated.members))

    def member_pods(self, name: str) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for c in self.emulated.members:
            pods = [p["metadata"]["name"] for p in self.emulated.objects(c, "pods")
                    if p["metadata"].get("labels", {}).get("training.kubeflow.org/job-name")
                    == name]
            if pods:
                out[c] = pods
        return out

    def member_events(self, name: str) -> list[tuple[str, str, str]]:
        """(cluster, reason, message) of every Event the members recorded about the
        PyTorchJob ``name`` or its pods."""
        return [(c, e["reason"], e["message"]) for c in self.emulated.members
                for e in self.emulated.objects(c, "events")
                if (about := e["involvedObject"].get("name", "")) == name
                or about.startswith(f"{name}-")]

    async def quota(self) -> QuotaView:
        handle = self.client.get_workflow_handle("quota/kube-system/elasticquotatree")
        return QuotaView.model_validate(await handle.query(QuotaTreeWorkflow.view))


async def until(what: Callable[[], Any], ok: Callable[[Any], bool], timeout: float = 60) -> Any:
    """Poll ``what()`` (sync or async) until ``ok`` holds of it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        got = what()
        if asyncio.iscoroutine(got):
            got = await got
        if ok(got):
            return got
        assert loop.time() < deadline, f"not reached: {got!r}"[:2000]
        await asyncio.sleep(0.2)


def events(view: JobView, reason: str) -> list[JobEvent]:
    return [e for e in view.events if e.reason == reason]


def on_cluster(text: str) -> str:
    """The member a PodsReadyTimeout message names ("... running on <cluster> within")."""
    found = re.search(r" on (\S+) within podsReadyTimeoutSeconds", text)
    assert found, text
    return found.group(1)


@pytest_asyncio.fixture(scope="module")
async def server() -> AsyncIterator[WorkflowEnvironment]:
    env = await start_dev_server("unsched-never", "unsched-ready", "unsched-apply")
    try:
        yield env
    finally:
        await env.shutdown()


@pytest_asyncio.fixture
async def make_stack(server: WorkflowEnvironment) -> AsyncIterator[Any]:
    """``await make_stack(start_delay, requeue)``: an emulated fleet of TOPOLOGY, a worker
    with the real activities over it, in a namespace of its own."""
    opened: list[tuple[Any, Fleet, EmulatedFleet]] = []

    async def make(start_delay: float, requeue: RequeueSettings, namespace: str) -> Stack:
        client = await Client.connect(server.client.service_client.config.target_host,
                                      namespace=namespace, data_converter=DATA_CONVERTER)
        emulated = EmulatedFleet(parse_topology(TOPOLOGY), start_delay=start_delay).start()
        cfg = load_fleet_config(emulated.fleet_config_path)
        cfg.requeue = requeue
        fleet = Fleet(cfg)
        worker = build_worker(client, SchedulingActivities(client, fleet))
        await worker.__aenter__()
        opened.append((worker, fleet, emulated))
        stack = Stack(client, emulated)
        await stack.apply(TREE, policy(queued=True))
        return stack

    try:
        yield make
    finally:
        for worker, fleet, emulated in opened:
            await worker.__aexit__(None, None, None)
            fleet.close()
            emulated.stop()


async def test_never_frees_its_quota_at_once_not_now_waits_and_a_bigger_node_wakes_it(
    make_stack: Any,
) -> None:
    stack: Stack = await make_stack(0.05, RequeueSettings(), "unsched-never")
    # held running (its run-seconds far ahead) until notnow has been seen waiting for it
    filler = await stack.start(job("filler", 30), run_seconds=HELD_RUN_SECONDS)
    filling = await until(lambda: view_of(filler), lambda v: v.state == "Running")
    assert filling.cluster == "cluster-a"  # the only member with a 30-cpu node

    big = await stack.start(job("big", 40))
    never = await until(lambda: view_of(big), lambda v: v.state == "Unschedulable", 30)
    assert never.reason.startswith(
        "no member can ever hold master-0 (cpu 40): the largest eligible node has 32"
    )
    (why,) = events(never, "Unschedulable")
    assert why.type == "Warning"
    assert not never.admitted and never.queue is None
    assert stack.member_jobs("big") == {}  # never written anywhere

    notnow = await stack.start(job("notnow", 30), run_seconds=1)
    waiting = await until(lambda: view_of(notnow), lambda v: v.state == "Pending")
    assert waiting.admitted  # keeps its quota: it fits an empty cluster-a
    assert "largest free node has 2" in waiting.reason or "2 free" in waiting.reason
    quota = await stack.quota()
    (team,) = [q for q in quota.queues if q.node == "team"]
    assert team.usage.get("cpu") == 60_000  # filler + notnow; big holds nothing
    assert (await view_of(big)).state == "Unschedulable"
    await complete_pods(stack.emulated, "cluster-a", "default", "filler")  # notnow's room

    done = JobView.model_validate(await notnow.result())
    assert done.state == "Succeeded" and done.cluster == "cluster-a"
    assert events(done, "Unschedulable") == []

    created = never.created_at
    stack.emulated.add_node("cluster-b", "cluster-b-big-0",
                            NodeGroup(cpu="64", memory="256Gi"))
    running = await until(lambda: view_of(big), lambda v: v.state == "Running", 60)
    assert running.cluster == "cluster-b"
    assert running.created_at == created  # queued again with its original submit time
    assert any("a member's nodes changed" in e.message for e in events(running, "Requeued"))
    assert stack.member_jobs("big") == {"cluster-b": 1}
    assert list(stack.member_pods("big")) == ["cluster-b"]
    await big.terminate()
    await filler.result()


async def test_pods_that_never_run_are_requeued_with_backoff_then_fail(
    make_stack: Any,
) -> None:
    settings = RequeueSettings(podsReadyTimeoutSeconds=2, backoffBaseSeconds=1,
                               backoffMaxSeconds=2, requeueLimit=2)
    stack: Stack = await make_stack(3600, settings, "unsched-ready")  # pods start in 1 h
    stuck = await stack.start(job("stuck", 1))
    # Each bind is "Created" for only podsReadyTimeoutSeconds: what the members did is
    # read afterwards from their Events, which outlive the purged copies.
    final = JobView.model_validate(await stuck.result())
    assert final.state == "Failed"
    assert final.reason.startswith("PodsReadyTimeout: pods not all running on cluster-")
    assert final.reason.endswith(
        "within podsReadyTimeoutSeconds 2; re-queued 2 times already (requeueLimit 2)"
    )
    timeouts = events(final, "PodsReadyTimeout")
    assert [e.message.split(": quota given back; ")[1] for e in timeouts] == [
        "queued again in 1s (re-queue 1 of 2, original submit time)",
        "queued again in 2s (re-queue 2 of 2, original submit time)",
    ]
    (bound_ev,) = events(final, "ScheduleBindingSucceed")
    assert bound_ev.count == 3  # bound three times, one aggregated event
    admitted = events(final, "Admitted")
    assert sum(e.count for e in admitted) == 3
    (requeued,) = events(final, "Requeued")
    assert requeued.count == 2  # "backoff over: queued again", after each backoff
    # the member each timeout names had created the pod and placed it on a node (its
    # Events outlive the purged copy), and it never ran there
    told = Counter([on_cluster(e.message) for e in timeouts] + [on_cluster(final.reason)])
    seen = stack.member_events("stuck")
    created = [c for c, reason, msg in seen
               if (reason, msg) == ("SuccessfulCreatePod", "Created pod: stuck-master-0")]
    placed = [c for c, reason, msg in seen if reason == "Scheduled"
              and msg.startswith("Successfully assigned default/stuck-master-0 to ")]
    assert Counter(created) == told and Counter(placed) == told, seen
    assert [r for _, r, _ in seen if r == "PyTorchJobRunning"] == []
    assert stack.member_jobs("stuck") == {}  # purged from the member each time
    assert stack.member_pods("stuck") == {}
    quota = await stack.quota()
    assert quota.holders == 0


async def test_a_bad_requeue_annotation_is_refused_in_one_line(make_stack: Any) -> None:
    stack: Stack = await make_stack(0.05, RequeueSettings(), "unsched-apply")
    bad = copy.deepcopy(TREE)
    bad["metadata"]["annotations"] = {"fleetq.io/requeue-limit": "twice"}
    (result,) = await apply_objects(stack.client, [(parse_object(bad), bad)])
    assert not result.ok
    assert "ElasticQuotaTree kube-system/elasticquotatree: metadata.annotations." \
        "fleetq.io/requeue-limit must be a whole number or off, got 'twice'" in result.line
    assert "\n" not in result.line
