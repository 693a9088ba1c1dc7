"""Crash matrix: SIGKILL the fleetq worker at every phase of a job, restart it, and check
that nothing was lost, duplicated or leaked; then restart the Temporal dev server and the
member-cluster emulator mid-run.

The worker runs as ``python -m worker`` and is SIGKILLed, the dev server on a SQLite
file, the emulator with a state file and fixed ports; each kill point has its own
namespace, worker and task queue, so the points run concurrently. Phases are conditions,
not windows of time: emulated jobs run ("held") until the rig completes them after the
restart. ``bench/chaos.py`` runs the matrix; ``ChaosRig(members="real")`` runs the bind's
kill points (:data:`REAL_KILL_POINTS`) on real control planes. Method and results:
docs/reliability.md "Crash matrix".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.service import RPCError

from fleetq.client.connection import connect
from fleetq.emulator.fleet import EmulatedFleet
from fleetq.kube_values import parse_rfc3339
from fleetq.member_contract import OWNER_LABEL
from fleetq.messages import JobView, PreemptSignal
from fleetq.naming import (
    KF_JOB_NAME as JOB_NAME_LABEL,
)
from fleetq.naming import (
    TASK_QUEUE,
    job_workflow_id,
    owner_id,
)
from fleetq.runtime.embedded import dev_server_argv
from fleetq.runtime.supervisor import Child, free_port, spawn_child
from fleetq.testing.history import grants_received
from fleetq.topology import DEFAULT_TOPOLOGY, Topology, parse_topology

if TYPE_CHECKING:
    from fleetq.controlplane.runner import RealFleet
    from fleetq.temporal_cluster.runner import TemporalCluster

ROOT = Path(__file__).resolve().parents[2]
#: the phases of a job at which the worker is killed, in lifecycle order
KILL_POINTS = ("queued", "admitted", "capacity", "reserving", "binding", "created", "running",
               "failing-over", "releasing", "preempting", "preempting-at-once",
               "capacity-preempting")
#: a held job (every job of an emulated point) runs this long unless the rig completes it
HELD_RUN_SECONDS = 3600
#: kill point "preempting": a job of this priority preempts the running victim (priority 0)
#: of its leaf, which gets PREEMPT_GRACE seconds to stop; the worker dies meanwhile
PREEMPTOR_PRIORITY = 1000
PREEMPT_GRACE = 3
#: kill point "preempting-at-once": the same, with a victim of no grace period, which the
#: quota workflow purges and parks itself (docs/decisions/023); the victim's worker dies
#: once it was told to stop
#: kill point "capacity-preempting": a member of its own, which no other point's policy
#: names, with one 2-cpu node that the victim (priority 0, two 1-cpu pods) fills; the
#: preemptor (PREEMPTOR_PRIORITY, the same size) fits on no member, so it preempts the
#: victim for room there (quota has room for both: their leaf admits two jobs)
CAPACITY_MEMBER = "cluster-d"
CAPACITY_CPU = "1"
#: the kill points whose tree needs ``fleetq.io/preemption: LowerPriority``
PREEMPTION_POINTS = ("preempting", "preempting-at-once", "capacity-preempting")
#: whole-component restarts (run after the kill points, one at a time)
RESTARTS = ("temporal-restart", "emulator-restart")
#: on the production-shaped Temporal (``temporal="cluster"``) also: SIGKILL the history
#: process that owns the running job's shard and leave it dead until the job ended (the
#: other history process takes its shards over); ``temporal-restart`` there kills and
#: restarts every Temporal service on the same PostgreSQL
CLUSTER_RESTARTS = (*RESTARTS, "history-kill")
#: members the chaos jobs may use (both support Reservations, so every phase happens)
MEMBERS = ("cluster-a", "cluster-b")
#: every member the rig's emulator runs jobs on (the checks look at all of them)
ALL_MEMBERS = (*MEMBERS, CAPACITY_MEMBER)
TREE_NAME = "chaos-tree"
HOLDING_PHASES = ("Available", "Pending")
#: kill points of the rig on real members (``ChaosRig(members="real")``): the worker
#: killed while its bind writes to a real API server, and killed once the bind completed,
#: before the watch has read anything
REAL_KILL_POINTS = ("binding", "bound")
#: added by the members' fault proxies to every request of fleetq's (the member's own
#: scheduler and lifecycle controller talk to their API server directly): the window in
#: which the bind is caught between its namespace write and its PyTorchJob write
REAL_LATENCY = 0.5
#: two real members the chaos jobs may use; no hub (the chaos policies propagate no deps)
REAL_TOPOLOGY: dict[str, Any] = {"clusters": [
    {"name": c, "nodeGroups": [{"count": 1, "cpu": 4, "memory": "8Gi"}]} for c in MEMBERS]}




def chaos_topology() -> Topology:
    """The emulator's fleet: the shipped default topology plus :data:`CAPACITY_MEMBER`
    (one 2-cpu node, Reservations supported), which only the capacity-preempting point's
    policy names."""
    doc = yaml.safe_load(DEFAULT_TOPOLOGY.read_text())
    doc["clusters"].append({
        "name": CAPACITY_MEMBER, "reservation": True,
        "nodeGroups": [{"count": 1, "cpu": "2", "memory": "8Gi", "pods": 110}]})
    return parse_topology(doc, "chaos topology")


# --------------------------------------------------------------------------- processes


def free_port_range(count: int) -> int:
    """A base port with ``count`` consecutive free loopback ports."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 40000)
        ok = True
        for p in range(base, base + count):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError(f"no {count} consecutive free ports on 127.0.0.1")


class TemporalServer:
    """``temporal server start-dev`` on a SQLite file, loopback only; restartable."""

    def __init__(self, workdir: Path) -> None:
        self.db = workdir / "temporal.db"
        self.port = free_port()
        self.log = workdir / "logs" / "temporal.log"
        self.proc: Child | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        return dev_server_argv("127.0.0.1", self.port, self.db, log_level="error")

    async def start(self, timeout: float = 60.0) -> None:
        self.spawn()
        await self.wait_ready(timeout)

    def spawn(self) -> None:
        """Start the process without waiting for it (see :meth:`wait_ready`)."""
        self.proc = spawn_child("temporal", self.argv(), self.log.parent, log=self.log,
                                cwd=ROOT)

    async def _answers(self) -> bool:
        client = await connect(self.address)
        await client.workflow_service.get_system_info(GetSystemInfoRequest())
        return True

    async def wait_ready(self, timeout: float = 60.0) -> None:
        assert self.proc is not None
        await self.proc.wait_ready_async(self._answers, time.monotonic() + timeout,
                                         what="temporal dev server", error=RuntimeError)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None:
            self.proc.stop(sig=sig)


class ClusterServer:
    """:class:`TemporalServer`'s interface over the production-shaped Temporal
    (:class:`fleetq.temporal_cluster.runner.TemporalCluster`: PostgreSQL, frontend,
    matching, worker and two history processes). A kill stops every Temporal service and
    keeps PostgreSQL, as the dev server's kill keeps its SQLite file; the same ports and
    database serve again after :meth:`start`."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.cluster: TemporalCluster | None = None

    @property
    def address(self) -> str:
        assert self.cluster is not None, "spawn() first"
        return self.cluster.address

    def spawn(self) -> None:
        """Build (or reuse) the binaries; PostgreSQL and the schema the first time; then
        every service, without waiting for them."""
        if self.cluster is None:
            from fleetq.temporal_cluster.build import build
            from fleetq.temporal_cluster.runner import TemporalCluster

            self.cluster = TemporalCluster(build(), self.workdir / "temporal-cluster")
            self.cluster.spawn(time.monotonic() + 120.0)
        else:
            self.cluster.spawn_services()

    async def start(self, timeout: float = 120.0) -> None:
        await asyncio.to_thread(self.spawn)
        await self.wait_ready(timeout)

    async def wait_ready(self, timeout: float = 120.0) -> None:
        assert self.cluster is not None
        await asyncio.to_thread(self.cluster.wait_ready, time.monotonic() + timeout)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """SIGKILL: every Temporal service dies (PostgreSQL stays); SIGTERM: the rig
        closes, everything stops."""
        if self.cluster is None:
            return
        if sig == signal.SIGKILL:
            self.cluster.kill_services(sig)
        else:
            self.cluster.stop()


def worker_proc(workdir: Path, address: str, task_queue: str, fleet_config: Path,
                generation: int) -> Child:
    """Start a worker process for ``task_queue`` (its log: ``logs/worker-<queue>.log``)."""
    return spawn_child(
        f"worker-{task_queue}-{generation}",
        [sys.executable, "-m", "worker", "--address", address, "--task-queue", task_queue,
         "--fleet-config", str(fleet_config),
         # the control plane lives in the control worker alone, so killing a job's worker
         # is a crash of that job's worker and nothing else
         *([] if task_queue == TASK_QUEUE else ["--no-control"])],
        workdir / "logs",
        env={"FLEETQ_LOG_LEVEL": "INFO", "PYTHONUNBUFFERED": "1"},
        log=workdir / "logs" / f"worker-{task_queue}.log", cwd=ROOT,
    )


# --------------------------------------------------------------------------- manifests


def job_manifest(namespace: str, name: str, *, cpu: str = "100m",
                 workers: int = 1) -> dict[str, Any]:
    def template() -> dict[str, Any]:
        return {"spec": {"containers": [{
            "name": "pytorch", "image": "registry.example/pytorch:1.0",
            "resources": {"requests": {"cpu": cpu, "memory": "128Mi"},
                          "limits": {"cpu": cpu, "memory": "128Mi"}}}]}}

    specs: dict[str, Any] = {
        "Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": template()}}
    if workers:  # the training-operator webhook refuses a Worker with replicas below 1
        specs["Worker"] = {"replicas": workers, "restartPolicy": "OnFailure",
                           "template": template()}
    return {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"pytorchReplicaSpecs": specs},
    }


def preemption_job(namespace: str, name: str, priority: int, grace: int,
                   cpu: str = "100m") -> dict[str, Any]:
    """:func:`job_manifest` with a priority and a preemption grace period."""
    doc = job_manifest(namespace, name, cpu=cpu)
    for spec in doc["spec"]["pytorchReplicaSpecs"].values():
        spec["template"]["spec"]["priority"] = priority
    doc["metadata"]["annotations"] = {"fleetq.io/preemption-grace-seconds": str(grace)}
    return doc


def policy_manifest(namespace: str, *, toleration: int = 2, purge: str = "Immediately",
                    clusters: Sequence[str] = MEMBERS, queued: bool = True,
                    propagate_deps: bool = True, name: str = "chaos") -> dict[str, Any]:
    del propagate_deps  # always on now: Karmada refuses application failover without it
    return {
        "apiVersion": "policy.one.alibabacloud.com/v1alpha1", "kind": "PropagationPolicy",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "suspension": {"scheduling": queued},
            # Karmada refuses application failover without propagateDeps; a job that
            # references no ConfigMap or Secret copies nothing either way
            "propagateDeps": True,
            "failover": {"application": {
                "decisionConditions": {"tolerationSeconds": toleration},
                "purgeMode": purge}},
            "placement": {
                "clusterAffinity": {"clusterNames": list(clusters)},
                "replicaScheduling": {"replicaSchedulingType": "Divided",
                                      "customSchedulingType": "Gang"}},
            "resourceSelectors": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob"}],
        },
    }


def tree_manifest(leaves: dict[str, list[str]], *, max_jobs: int = 1,
                  name: str = TREE_NAME, cpu: str = "1000") -> dict[str, Any]:
    """One leaf per entry (leaf name -> namespaces), each with ``max_jobs``."""
    big = {"cpu": cpu, "memory": "100000Gi", "kube-queue/max-jobs": 100000}
    return {
        "apiVersion": "scheduling.sigs.k8s.io/v1beta1", "kind": "ElasticQuotaTree",
        "metadata": {"name": name, "namespace": "kube-system"},
        "spec": {"root": {
            "name": "root", "max": big, "min": big,
            "children": [
                {"name": leaf, "namespaces": nss,
                 "max": {"cpu": "100", "memory": "1000Gi", "kube-queue/max-jobs": max_jobs}}
                for leaf, nss in leaves.items()
            ]}},
    }


# --------------------------------------------------------------------------- observation


async def job_view(handle: WorkflowHandle[Any, Any]) -> JobView | None:
    """The job's view, or None when it cannot be read now. A completed job is read from
    its result, as ``fleetq`` reads it: a query of a closed workflow needs a worker to
    replay its whole history, which a busy worker may not do within the query's time."""
    try:
        return await handle.query("status", result_type=JobView)  # type: ignore[no-any-return]
    except (RPCError, Exception):
        pass
    try:
        if (await handle.describe()).status != WorkflowExecutionStatus.COMPLETED:
            return None
        result = await handle.result(follow_runs=False)
        return result if isinstance(result, JobView) else JobView.model_validate(result)
    except (RPCError, Exception):
        return None


async def history_events(handle: WorkflowHandle[Any, Any]) -> list[Any]:
    try:
        return list((await handle.fetch_history()).events)
    except (RPCError, Exception):
        return []


def activity_scheduled(events: list[Any], name: str, after: int = 0) -> bool:
    return any(
        e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == name
        and e.event_id > after
        for e in events)


def signalled(events: list[Any], name: str) -> bool:
    return any(
        e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
        and e.workflow_execution_signaled_event_attributes.signal_name == name
        for e in events)


def preempt_reasons(events: list[Any]) -> list[str]:
    """The ``reason`` of every ``preempt`` signal in the history (a
    :class:`fleetq.messages.PreemptSignal`: ``Priority``, ``Reclaim`` or ``Capacity``)."""
    out = []
    for e in events:
        attrs = e.workflow_execution_signaled_event_attributes
        if (e.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
                or attrs.signal_name != "preempt"):
            continue
        try:
            out.append(str(PreemptSignal.model_validate_json(
                attrs.input.payloads[0].data).reason))
        except (IndexError, ValueError):
            out.append("?")
    return out


def bind_outcome(events: list[Any]) -> str:
    """How the job's bind ended, from its history: the attempt that completed it and
    whether that attempt created the member copy or found it there (its own, adopted)."""
    done = [e for e in events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED]
    binds = {e.event_id for e in events
             if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
             and e.activity_task_scheduled_event_attributes.activity_type.name == "bind"}
    out = []
    for e in done:
        attrs = e.activity_task_completed_event_attributes
        if attrs.scheduled_event_id not in binds:
            continue
        started = next((x for x in events if x.event_id == attrs.started_event_id), None)
        attempt = started.activity_task_started_event_attributes.attempt if started else 0
        try:
            created = json.loads(attrs.result.payloads[0].data).get("created")
        except (IndexError, ValueError, AttributeError):
            created = None
        out.append(f"bind attempt {attempt} {'created' if created else 'found'} the copy")
    return ", ".join(out) or "no bind completed"


def workflow_task_failures(events: list[Any]) -> int:
    return sum(1 for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED)


#: events that reach a workflow from outside its own tasks
_ARRIVALS = {
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ADMITTED,
    EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED,
    EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED,
    EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT,
    EventType.EVENT_TYPE_TIMER_FIRED,
}


def code_task_failures(events: list[Any]) -> list[str]:
    """WorkflowTaskFailed events that point at our code or worker (nondeterminism, an
    exception, a deadlock), one line each with the events around them.

    Not listed: a closing task the server refused because a new event (a delete, a
    signal) arrived while it ran: cause UnhandledCommand, and the very next event is that
    arrival. That is how Temporal keeps the event from being lost; the SDK runs the task
    again with it at once, so no code of ours failed.
    """
    out: list[str] = []
    for i, e in enumerate(events):
        if e.event_type != EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            continue
        attrs = e.workflow_task_failed_event_attributes
        nxt = events[i + 1].event_type if i + 1 < len(events) else None
        if attrs.cause == WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND \
                and nxt in _ARRIVALS:
            continue
        around = [EventType.Name(x.event_type)[11:] for x in events[max(0, i - 4):i + 3]]
        out.append(f"{WorkflowTaskFailedCause.Name(attrs.cause)[27:]} "
                   f"{attrs.failure.message.splitlines()[0][:200] if attrs.failure.message else ''}"
                   f" (events {around})")
    return out


def task_failure_messages(events: list[Any]) -> list[str]:
    """First lines of the WorkflowTaskFailed failures (non-determinism shows up here)."""
    return [e.workflow_task_failed_event_attributes.failure.message.splitlines()[0][:200]
            for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
            and e.workflow_task_failed_event_attributes.failure.message]


async def poll(check: Callable[[], Awaitable[Any]], timeout: float, step: float = 0.03) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            return value
        await asyncio.sleep(step)


async def complete_if_running(emulator: EmulatedFleet | None, handle: WorkflowHandle[Any, Any],
                              binds: int = 1) -> str:
    """One try at letting a held job (run-seconds :data:`HELD_RUN_SECONDS`) finish: when
    it is Running on a member and has been bound at least ``binds`` times (a preempted
    victim: 2, its second run), its pods there exit 0 and it succeeds. The member, or
    empty when it does not run so yet."""
    view = await job_view(handle)
    if emulator is None or view is None or view.state != "Running" or view.cluster is None:
        return ""
    if sum(e.count for e in view.events if e.reason == "ScheduleBindingSucceed") < binds:
        return ""
    ns, name = handle.id.split("/")[1:]
    return view.cluster if emulator.complete_job(view.cluster, ns, name) else ""


async def complete_held(emulator: EmulatedFleet, handle: WorkflowHandle[Any, Any],
                        binds: int = 1, timeout: float = 120.0) -> str:
    """:func:`complete_if_running` until it completes the job; the member (asserted)."""
    cluster = str(await poll(lambda: complete_if_running(emulator, handle, binds), timeout,
                             0.1))
    assert cluster, (f"{handle.id}: not Running (bound {binds}x) within {timeout:.0f}s, "
                     "or its pods could not be completed")
    return cluster


async def complete_pods(emulator: EmulatedFleet, cluster: str, namespace: str, name: str,
                        timeout: float = 60.0) -> None:
    """Let a held job whose member is known finish: its pods there exit 0 once they all
    run (asserted within ``timeout``)."""

    async def completed() -> bool:
        return emulator.complete_job(cluster, namespace, name)

    assert await poll(completed, timeout, 0.1), (
        f"{namespace}/{name}: its pods on {cluster} never all ran")


def _member_jobs(fleet: EmulatedFleet, cluster: str, namespace: str | None,
                 name: str) -> list[dict[str, Any]]:
    """The PyTorchJobs <ns>/<name> on one member (``namespace`` None: in any)."""
    return [o for o in fleet.objects(cluster, "pytorchjobs")
            if o["metadata"]["name"] == name
            and namespace in (None, o["metadata"].get("namespace"))]


def member_copies(fleet: EmulatedFleet, namespace: str | None, name: str,
                  members: Sequence[str] = MEMBERS) -> dict[str, int]:
    """``{cluster: number of PyTorchJobs <ns>/<name>}`` over the members (0s dropped;
    ``namespace`` None: in any namespace)."""
    out: dict[str, int] = {}
    for c in members:
        n = len(_member_jobs(fleet, c, namespace, name))
        if n:
            out[c] = n
    return out


def member_copy_uids(fleet: EmulatedFleet, namespace: str, name: str,
                     members: Sequence[str] = MEMBERS) -> set[str]:
    """The uids of the PyTorchJobs <ns>/<name> over the members (a copy made again has a
    new one)."""
    return {o["metadata"]["uid"] for c in members
            for o in _member_jobs(fleet, c, namespace, name)}


def job_reservations(fleet: EmulatedFleet, workflow_id: str,
                     members: Sequence[str] = MEMBERS) -> list[tuple[str, str, str]]:
    """``(cluster, name, phase)`` of every Reservation owned by the job."""
    owner = owner_id(workflow_id)
    out = []
    for c in members:
        with contextlib.suppress(KeyError):
            for o in fleet.objects(c, "reservations"):
                if (o["metadata"].get("labels") or {}).get(OWNER_LABEL) == owner:
                    out.append((c, o["metadata"]["name"],
                                str((o.get("status") or {}).get("phase") or "Pending")))
    return out


#: what ``kubectl get`` reads of a job on a real member (the Reservation CRD is installed on
#: every real member, though no Koordinator scheduler runs there)
KUBECTL_KINDS = "pytorchjobs.kubeflow.org,pods,reservations.scheduling.koordinator.sh"


class RealMembers:
    """Real member control planes for the rig (:class:`fleetq.controlplane.runner.
    RealFleet`: etcd, kube-apiserver, kube-scheduler and the lifecycle controller per
    member, binaries built from the Go modules or reused). fleetq reaches each member
    through its fault proxy, which adds ``latency`` to every request; what lies on the
    members is read straight from their API servers, with the build's kubectl."""

    def __init__(self, workdir: Path, latency: float) -> None:
        self.workdir = workdir
        self.latency = latency
        self.fleet: RealFleet | None = None
        self.kubectl = ""
        #: one context per member, straight to its API server (not through its proxy)
        self.kubeconfig = workdir / "members-direct.kubeconfig"

    def start(self, fleet_config: Path) -> None:
        """Build (or reuse) the binaries and start the members; blocking, and from the
        calling thread on purpose: the members' processes die with the thread that
        started them. Raises :class:`fleetq.controlplane.build.BuildError` when the
        control plane cannot be built."""
        from fleetq.controlplane.build import build
        from fleetq.controlplane.runner import RealFleet, kubeconfig_doc
        from fleetq.emulator.kubeconfig import write_private
        from fleetq.topology import parse_topology

        binaries = build()
        self.kubectl = str(binaries.binary("kubectl"))
        fleet = RealFleet(parse_topology(REAL_TOPOLOGY, "chaos topology"), binaries,
                          self.workdir / "controlplane")
        self.fleet = fleet.start()
        for c in MEMBERS:
            fleet.set_latency(c, self.latency)
        write_private(self.kubeconfig, yaml.safe_dump(kubeconfig_doc(fleet.planes),
                                                      sort_keys=False))
        doc = fleet.fleet_config_doc()
        doc["timeouts"] = {"connectSeconds": 1.0, "readSeconds": 3.0}
        doc["cacheTTLSeconds"] = 0.5
        fleet_config.write_text(yaml.safe_dump(doc))

    def stop(self) -> None:
        if self.fleet is not None:
            self.fleet.stop()
            self.fleet = None

    async def bind_writing(self, namespace: str, name: str) -> str:
        """Which member a bind is half-way through, read from the API servers directly:
        the job's namespace is there (the bind's first write) and its PyTorchJob is not
        yet. "missed ..." when the PyTorchJob is already there too; empty when neither."""
        assert self.fleet is not None
        for plane in self.fleet.planes:
            ns, _ = await asyncio.to_thread(plane.request, "GET",
                                            f"/api/v1/namespaces/{namespace}", None, 2.0)
            if ns != 200:
                continue
            job, _ = await asyncio.to_thread(
                plane.request, "GET",
                f"/apis/kubeflow.org/v1/namespaces/{namespace}/pytorchjobs/{name}", None, 2.0)
            if job == 404:
                return f"bind writing on {plane.name} (ns, no job)"
            return f"missed: PyTorchJob already on {plane.name} (HTTP {job})"
        return ""

    async def objects(self, cluster: str, namespace: str) -> list[dict[str, Any]]:
        """The PyTorchJobs, pods and Reservations in ``namespace`` of ``cluster``
        (Reservations are cluster-scoped: all of them), by ``kubectl get -o json``."""
        proc = await asyncio.create_subprocess_exec(
            self.kubectl, "--kubeconfig", str(self.kubeconfig), "--context", cluster,
            "get", KUBECTL_KINDS, "-n", namespace, "-o", "json",
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        if proc.returncode != 0:
            raise RuntimeError(f"kubectl get on {cluster}: {err.decode().strip()[:300]}")
        items: list[dict[str, Any]] = json.loads(out)["items"]
        return items

    async def job_problems(self, workflow_id: str, view: JobView | None,
                           expect: str) -> tuple[list[str], dict[str, Any]]:
        """What is wrong on the members with the job of ``workflow_id`` once it ended
        ``expect``, and its member copy (``{}`` when none).

        Succeeded: exactly one PyTorchJob on exactly one member, the one the job reports,
        carrying the job's owner label and itself Succeeded; its pods exactly the gang's
        (one per replica, every one controlled by that copy, Succeeded) and no pod of
        the job on any other member. Deleted: nothing of the job anywhere. Either way no
        Reservation of the job on any member."""
        ns, name = workflow_id.split("/")[1:]
        owner = owner_id(workflow_id)
        problems: list[str] = []
        jobs: dict[str, list[dict[str, Any]]] = {}
        pods: dict[str, list[dict[str, Any]]] = {}
        for c in MEMBERS:
            items = await self.objects(c, ns)

            def labels(o: dict[str, Any]) -> dict[str, str]:
                return dict(o["metadata"].get("labels") or {})

            jobs[c] = [o for o in items
                       if o.get("kind") == "PyTorchJob" and o["metadata"]["name"] == name]
            pods[c] = [o for o in items
                       if o.get("kind") == "Pod" and labels(o).get(JOB_NAME_LABEL) == name]
            problems += [f"{workflow_id}: Reservation {o['metadata']['name']} on {c} "
                         f"({(o.get('status') or {}).get('phase') or 'Pending'})"
                         for o in items if o.get("kind") == "Reservation"
                         and labels(o).get(OWNER_LABEL) == owner]
        copies = {c: len(js) for c, js in jobs.items() if js}
        if expect == "Deleted":
            left = {c: len(ps) for c, ps in pods.items() if ps}
            if copies or left:
                problems.append(f"{workflow_id}: deleted but PyTorchJobs {copies} and pods "
                                f"{left} remain on the members")
            return problems, {}
        if sorted(copies.values()) != [1]:
            problems.append(f"{workflow_id}: member PyTorchJobs {copies}, expected exactly "
                            "one on exactly one member")
            return problems, {}
        (cluster,) = copies
        copy = jobs[cluster][0]
        if view is not None and view.cluster != cluster:
            problems.append(f"{workflow_id}: the copy is on {cluster} but the job says "
                            f"{view.cluster}")
        if (theirs := dict(copy["metadata"].get("labels") or {}).get(OWNER_LABEL)) != owner:
            problems.append(f"{workflow_id}: the copy on {cluster} has owner {theirs}, "
                            f"expected {owner}")
        conditions = (copy.get("status") or {}).get("conditions") or []
        if expect == "Succeeded" and not any(
                c.get("type") == "Succeeded" and c.get("status") == "True" for c in conditions):
            problems.append(f"{workflow_id}: the copy on {cluster} is not Succeeded: "
                            f"{[c.get('type') for c in conditions]}")
        problems += _gang_pod_problems(workflow_id, name, cluster, copy, pods[cluster], expect)
        problems += [f"{workflow_id}: pods {[p['metadata']['name'] for p in ps]} left on "
                     f"{c}, which has no copy" for c, ps in pods.items() if ps and c != cluster]
        return problems, copy


def _gang_pod_problems(workflow_id: str, name: str, cluster: str, copy: dict[str, Any],
                       pods: list[dict[str, Any]], expect: str) -> list[str]:
    """What is wrong with the job's pods on the member holding its copy: they must be
    exactly the gang (one master, one worker), each controlled by the copy and, when
    the job is expected Succeeded, Succeeded."""
    problems: list[str] = []
    want = {f"{name}-master-0", f"{name}-worker-0"}
    got = {p["metadata"]["name"] for p in pods}
    if got != want or len(pods) != len(want):
        problems.append(f"{workflow_id}: pods {sorted(got)} on {cluster}, expected "
                        f"{sorted(want)}")
    uid = copy["metadata"]["uid"]
    for p in pods:
        refs = [r.get("uid") for r in p["metadata"].get("ownerReferences") or []]
        phase = (p.get("status") or {}).get("phase")
        if refs != [uid] or (expect == "Succeeded" and phase != "Succeeded"):
            problems.append(f"{workflow_id}: pod {p['metadata']['name']} on {cluster} "
                            f"owned by {refs} ({phase}), expected the copy {uid} "
                            "(Succeeded)")
    return problems


async def quota_leaks(client: Client, tree: str = TREE_NAME) -> list[str]:
    """Problems with the quota workflow once every job has ended: usage must be exactly
    zero on every node, nobody holds or waits."""
    from workflows.quota_tree import QuotaView

    handle = client.get_workflow_handle(f"quota/kube-system/{tree}")
    view: QuotaView = await handle.query("view", result_type=QuotaView)
    problems = []
    if view.holders or view.waiting:
        problems.append(f"quota: {view.holders} holders and {view.waiting} waiting after all "
                        "jobs ended")
    for q in view.queues:
        used = {k: v for k, v in q.usage.items() if v}
        if used:
            problems.append(f"quota node {q.node}: usage {used} after all jobs ended")
    return problems


async def leaf_quota_problems(client: Client, leaf: str, job_ids: Sequence[str],
                              tree: str = TREE_NAME) -> list[str]:
    """One kill point's own quota, read from the quota workflow once its jobs ended: its
    leaf (``max-jobs: 1``) holds nothing and has nobody waiting, none of its jobs is a
    holder, and none had its quota returned by the leak check (every job released its
    quota itself)."""
    from workflows.quota_tree import QuotaView

    handle = client.get_workflow_handle(f"quota/kube-system/{tree}")
    view: QuotaView = await handle.query("view", result_type=QuotaView)
    holders: list[str] = await handle.query("holders", result_type=list[str])
    problems = []
    queue = next((q for q in view.queues if q.node == leaf), None)
    if queue is None:
        return [f"quota: no queue for leaf {leaf}"]
    used = {k: v for k, v in queue.usage.items() if v}
    if used or queue.admitted or queue.length:
        problems.append(f"quota leaf {leaf}: usage {used}, {queue.admitted} admitted, "
                        f"{queue.length} waiting after its jobs ended")
    problems += [f"quota: {j} still holds quota after it ended" for j in job_ids
                 if j in holders]
    problems += [f"quota: {j} ended without releasing its quota (the leak check returned "
                 "it)" for j in job_ids if j in view.leaks_recovered]
    return problems


# --------------------------------------------------------------------------- the rig


class _JobProbe:
    """What a kill point waits for in one job: its state, or events in its history
    (each check answers what it saw, empty while not there yet)."""

    def __init__(self, handle: WorkflowHandle[Any, Any]) -> None:
        self.handle = handle

    async def state_is(self, *states: str) -> str:
        v = await job_view(self.handle)
        return f"state {v.state}" if v is not None and v.state in states else ""

    async def scheduled(self, activity: str, after_cancel: bool = False) -> str:
        events = await history_events(self.handle)
        start = 0
        if after_cancel:
            marks = [e.event_id for e in events if e.event_type
                     == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED]
            if not marks:
                return ""
            start = marks[0]
        return f"{activity} scheduled" if activity_scheduled(events, activity, start) else ""

    async def admitted(self) -> str:
        events = await history_events(self.handle)
        return "admitted (grant received)" if grants_received(events) else ""

    async def placing(self) -> str:
        """A workflow task after the grant's event is running (the grant by signal: the
        task that runs capacity and placement; in the enqueue's answer, placement ran in
        the task that got it, and this is the task after)."""
        events = await history_events(self.handle)
        grants = [e.event_id for e in grants_received(events)]
        return "placement task started" if grants and any(
            e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED
            and e.event_id > grants[0] for e in events) else ""

    async def copy_made(self, emulator: EmulatedFleet | None) -> str:
        """The bind has made the copy on a member and watches it (its first watch, over
        the settle window: docs/decisions/016): the copy is there, its pods not running
        yet as far as the job knows, and the bind's completion not in the history."""
        if emulator is None:
            return ""
        events = await history_events(self.handle)
        if not activity_scheduled(events, "bind", 0) or _bind_completions(events):
            return ""
        ns, name = self.handle.id.split("/")[1:]
        copies = member_copies(emulator, ns, name)
        return f"copy made on {', '.join(copies)}, bind watching it" if copies else ""

    async def bind_completed(self) -> str:
        """The bind's completion is in the history; whether the workflow has asked
        for the watch yet (with the proxy's latency, it has read nothing either way)."""
        events = await history_events(self.handle)
        done = _bind_completions(events)
        if not done:
            return ""
        watch = activity_scheduled(events, "watch_status", done[0])
        return f"bind completed, watch {'scheduled' if watch else 'not asked'}"


def _bind_completions(events: list[Any]) -> list[int]:
    """The event ids of the ``bind`` activities' completions in a job's history."""
    binds = {e.event_id for e in events
             if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
             and e.activity_task_scheduled_event_attributes.activity_type.name == "bind"}
    return [e.event_id for e in events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
            and e.activity_task_completed_event_attributes.scheduled_event_id in binds]


def _end_problems(wid: str, view: JobView | None, status: WorkflowExecutionStatus | None,
                  expect: str) -> list[str]:
    """The ended job's state must be ``expect``, and its workflow Completed (Canceled
    when the job was deleted)."""
    problems: list[str] = []
    if view is None:
        problems.append(f"{wid}: status query failed after it ended")
    elif view.state != expect:
        problems.append(f"{wid}: ended {view.state} ({view.reason}), expected {expect}")
    want_status = (WorkflowExecutionStatus.CANCELED if expect == "Deleted"
                   else WorkflowExecutionStatus.COMPLETED)
    if status != want_status:
        problems.append(f"{wid}: workflow {status.name if status else '?'}, "
                        f"expected {want_status.name}")
    return problems


def _admission_problems(wid: str, view: JobView | None, events: list[Any],
                        preempted: bool) -> list[str]:
    """Admitted exactly once (twice, and told Preempted once, when ``preempted``)."""
    problems: list[str] = []
    # one leaf, max-jobs 1, one grant: a second `admitted` would be a double admission
    # (the quota workflow granting a re-sent enqueue again after the crash)
    if (admissions := len(grants_received(events))) != 1 + preempted:
        problems.append(f"{wid}: admitted {admissions} times, expected "
                        + ("twice (preempted once)" if preempted else "exactly once"))
    if preempted and (told := sum(e.count for e in (view.events if view else [])
                                  if e.reason == "Preempted")) != 1:
        problems.append(f"{wid}: {told} Preempted events, expected exactly one")
    return problems


def _emulated_member_problems(emulator: EmulatedFleet, wid: str, view: JobView | None,
                              expect: str, failed_over: bool) -> list[str]:
    """On emulated members: exactly one copy, on the member the job reports (none once
    deleted), evicted once when it ``failed_over``, and no Reservation still holding
    (none at all once deleted)."""
    problems: list[str] = []
    ns, name = wid.split("/")[1:]
    copies = member_copies(emulator, ns, name, ALL_MEMBERS)
    if expect == "Deleted":
        if copies:
            problems.append(f"{wid}: deleted but copies remain on {copies}")
    else:
        if sorted(copies.values()) != [1]:
            problems.append(f"{wid}: member copies {copies}, expected exactly one copy on "
                            "exactly one member")
        elif view is not None and list(copies) != [view.cluster]:
            problems.append(f"{wid}: copy on {list(copies)} but the job says "
                            f"{view.cluster}")
        if failed_over and view is not None and not view.evicted:
            problems.append(f"{wid}: never failed over")
    for cluster, rname, phase in job_reservations(emulator, wid, ALL_MEMBERS):
        if phase in HOLDING_PHASES or expect == "Deleted":
            problems.append(f"{wid}: Reservation {rname} left on {cluster} ({phase})")
    return problems


@dataclass
class PointResult:
    point: str
    survived: bool
    hit: str
    problems: list[str]
    seconds: float
    state: str = ""
    note: str = ""  # what happened around the kill, where the rig can tell (real members)

    def line(self) -> str:
        verdict = "survived" if self.survived else "FAILED"
        text = (f"{self.point:<19} {verdict:<9} killed at: {self.hit:<34} "
                f"final: {self.state or '-':<10} {self.seconds:5.1f}s")
        if self.note:
            text += f"\n    ({self.note})"
        return text + "".join(f"\n    - {p}" for p in self.problems)


class ChaosRig:
    """Temporal dev server (process, SQLite) + emulator (this process, state file, fixed
    ports) + a control worker (process) for the registry and quota workflows.

    With ``members="real"`` the members are real control planes instead of the emulator
    (:class:`RealMembers`, ``latency`` added by their fault proxies, default
    :data:`REAL_LATENCY`); the kill points are then :data:`REAL_KILL_POINTS`, no restarts,
    and every job is checked on the members with kubectl."""

    def __init__(self, workdir: Path, *, latency: float | None = None, run_seconds: int = 4,
                 log: Callable[[str], None] = lambda _m: None,
                 members: str = "emulated", temporal: str = "dev") -> None:
        if members not in ("emulated", "real"):
            raise ValueError(f"members must be 'emulated' or 'real', not {members!r}")
        if temporal not in ("dev", "cluster"):
            raise ValueError(f"temporal must be 'dev' or 'cluster', not {temporal!r}")
        self.workdir = workdir
        self.members = members
        self.latency = latency if latency is not None else (
            REAL_LATENCY if members == "real" else 0.15)
        self.real = RealMembers(workdir, self.latency) if members == "real" else None
        self.kill_times: dict[str, float] = {}
        self._notes: dict[str, str] = {}
        self.run_seconds = run_seconds
        self.log = log
        self.temporal: TemporalServer | ClusterServer = (
            ClusterServer(workdir) if temporal == "cluster" else TemporalServer(workdir))
        #: the history process killed by the ``history-kill`` restart, and when
        self.history_killed: tuple[int, float] | None = None
        self.state_file = workdir / "emulator-state.json"
        self.emu_dir = workdir / "sim"
        self.topology = chaos_topology()
        # one port per cluster and one for the emulator's control endpoint
        self.base_port = free_port_range(len(self.topology.clusters) + 1)
        self.emulator: EmulatedFleet | None = None
        self.fleet_config = workdir / "fleet.yaml"
        self.control: Child | None = None
        self.workers: dict[str, Child] = {}
        self._generation = 0
        self.client: Client | None = None

    @property
    def temporal_name(self) -> str:
        return ("Temporal cluster (PostgreSQL, one process per service)"
                if isinstance(self.temporal, ClusterServer) else "Temporal dev server (SQLite)")

    # ---------------------------------------------------------------- lifecycle
    async def start(self, points: Sequence[str]) -> None:
        if self.real is not None:
            self.log(f"starting {self.temporal_name} and real member control planes")
            self.temporal.spawn()  # it comes up while the members start
            self.real.start(self.fleet_config)
            await self.temporal.wait_ready()
        else:
            self.log(f"starting {self.temporal_name} and the emulator")
            self.start_emulator()
            await self.temporal.start()
        # the harness kills and restarts its workers on purpose: its updates wait for the
        # next worker instead of failing fast as a user's CLI does (BoundedWaits)
        self.client = await connect(self.temporal.address, bounded_waits=False)
        self.control = worker_proc(self.workdir, self.temporal.address, TASK_QUEUE,
                                   self.fleet_config, 0)
        await self.apply_fleet(points)

    def start_emulator(self) -> None:
        self.emulator = EmulatedFleet(self.topology, out_dir=self.emu_dir,
                                      state_file=self.state_file,
                                      base_port=self.base_port, start_delay=1.0).start()
        for c in ALL_MEMBERS:
            self.emulator.set_latency(c, self.latency)
        doc = yaml.safe_load(self.emulator.fleet_config_path.read_text())
        doc["timeouts"] = {"connectSeconds": 1.0, "readSeconds": 3.0}
        doc["cacheTTLSeconds"] = 0.5
        self.fleet_config.write_text(yaml.safe_dump(doc))

    def stop_emulator(self) -> None:
        if self.emulator is not None:
            self.emulator.stop()
            self.emulator = None

    async def apply_fleet(self, points: Sequence[str]) -> None:
        from fleetq.client.apply import apply_registry_object, apply_tree
        from fleetq.models import parse_tree

        assert self.client is not None
        leaves = {f"leaf-{p}": [f"chaos-{p}"] for p in points}
        tree = tree_manifest(leaves)
        if any(p in PREEMPTION_POINTS for p in points):
            # the other points' jobs all have priority 0: none preempts, and none is a
            # capacity victim (they run on MEMBERS, where nobody lacks room)
            tree["metadata"]["annotations"] = {"fleetq.io/preemption": "LowerPriority"}
        for child in tree["spec"]["root"]["children"]:
            if child["name"] == "leaf-capacity-preempting":  # victim and preemptor both
                child["max"]["kube-queue/max-jobs"] = 2
        await asyncio.wait_for(apply_tree(self.client, parse_tree(tree), tree), 60)
        for p in points:
            clusters = (CAPACITY_MEMBER,) if p == "capacity-preempting" else MEMBERS
            await apply_registry_object(self.client,
                                        policy_manifest(f"chaos-{p}", clusters=clusters))

    async def close(self) -> None:
        for w in self.workers.values():
            w.stop()
        if self.control is not None:
            self.control.stop()
        self.temporal.kill(signal.SIGTERM)
        self.stop_emulator()
        if self.real is not None:
            self.real.stop()

    # ---------------------------------------------------------------- workers
    def start_worker(self, task_queue: str) -> Child:
        self._generation += 1
        w = worker_proc(self.workdir, self.temporal.address, task_queue, self.fleet_config,
                        self._generation)
        self.workers[task_queue] = w
        return w

    def kill_worker(self, task_queue: str) -> None:
        self.workers[task_queue].stop(sig=signal.SIGKILL)

    async def start_job(self, namespace: str, name: str, task_queue: str,
                        run_seconds: int | None = None,
                        manifest: dict[str, Any] | None = None,
                        held: bool = False) -> WorkflowHandle[Any, Any]:
        """``held``: the job runs until :meth:`let_finish` completes it."""
        assert self.client is not None
        seconds = HELD_RUN_SECONDS if held else run_seconds or self.run_seconds
        return await self.client.start_workflow(
            "PyTorchJobWorkflow",
            {"manifest": manifest or job_manifest(namespace, name),
             "run_seconds": seconds, "rewatch_seconds": 1.0},
            id=job_workflow_id(namespace, name), task_queue=task_queue)

    # ---------------------------------------------------------------- one kill point
    async def _trigger(self, point: str, handle: WorkflowHandle[Any, Any]) -> str:
        """Drive the job to ``point`` (injecting what that needs) and say what was seen
        when it got there; empty when it never did."""
        probe = _JobProbe(handle)
        t = 60.0
        # capacity and placement is a local activity: no history event marks its start,
        # so that point is the workflow task that handles the grant (it runs placement)
        watched: dict[str, tuple[Callable[[], Awaitable[str]], float]] = {
            "queued": (lambda: probe.state_is("Queued"), 0.03),
            "admitted": (probe.admitted, 0.01),
            "capacity": (probe.placing, 0.01),
            "reserving": (lambda: probe.scheduled("bind"), 0.01),  # (it reserves first)
            "bound": (probe.bind_completed, 0.01),
            "created": (lambda: probe.copy_made(self.emulator), 0.01),
            "running": (lambda: probe.state_is("Running"), 0.03),
        }
        if point in watched:
            check, step = watched[point]
            return str(await poll(check, t, step))
        driven: dict[str, Callable[[_JobProbe, float], Awaitable[str]]] = {
            "binding": self._trigger_binding,
            "failing-over": self._trigger_failing_over,
            "releasing": self._trigger_releasing,
            "preempting": self._trigger_preempting,
            "preempting-at-once": self._trigger_preempted_at_once,
            "capacity-preempting": self._trigger_capacity_preempting,
        }
        if point in driven:
            return await driven[point](probe, t)
        raise ValueError(f"unknown kill point {point!r}")

    async def _trigger_binding(self, probe: _JobProbe, t: float) -> str:
        """On real members: the bind activity has started writing (its namespace is on
        the member and its PyTorchJob not yet; the proxy's latency holds each write that
        long). Emulated: the bind is scheduled."""
        if self.real is None:
            return str(await poll(lambda: probe.scheduled("bind"), t, 0.01))
        if not await poll(lambda: probe.scheduled("bind"), t, 0.01):
            return ""
        ns, name = probe.handle.id.split("/")[1:]
        real = self.real
        return str(await poll(lambda: real.bind_writing(ns, name), t, 0.01))

    async def _trigger_failing_over(self, probe: _JobProbe, t: float) -> str:
        """Once the job runs, its member copy is failed: the job is FailingOver."""
        if not await poll(lambda: probe.state_is("Running"), t):
            return ""
        view = await job_view(probe.handle)
        assert view is not None and view.cluster is not None and self.emulator is not None
        self.emulator.fail_job(view.cluster, view.namespace, view.name)
        return str(await poll(lambda: probe.state_is("FailingOver"), t, 0.01))

    async def _trigger_releasing(self, probe: _JobProbe, t: float) -> str:
        """Once the job runs it is cancelled: the purge after the cancel is scheduled."""
        if not await poll(lambda: probe.state_is("Running"), t):
            return ""
        await probe.handle.cancel()
        return str(await poll(lambda: probe.scheduled("purge", after_cancel=True), t, 0.01))

    async def _trigger_preempting(self, probe: _JobProbe, t: float) -> str:
        """The victim was told to stop and is in its grace period."""
        assert self.client is not None
        victim = self.client.get_workflow_handle(
            job_workflow_id(probe.handle.id.split("/")[1], "victim"))

        async def preempted() -> str:
            v = await job_view(victim)
            told = signalled(await history_events(victim), "preempt")
            return ("victim in its grace period" if told and v is not None
                    and v.cluster is not None else "")

        return str(await poll(preempted, t, 0.01))

    async def _trigger_preempted_at_once(self, probe: _JobProbe, t: float) -> str:
        """The victim (no grace period) was told to stop: the quota workflow purges it
        and grants the preemptor meanwhile; the victim's worker dies before or while it
        purges (finding nothing) and sends its own ``requeue``."""
        assert self.client is not None
        victim = self.client.get_workflow_handle(
            job_workflow_id(probe.handle.id.split("/")[1], "victim"))

        async def told() -> str:
            return ("victim told to stop (no grace period)"
                    if signalled(await history_events(victim), "preempt") else "")

        return str(await poll(told, t, 0.01))

    async def _trigger_capacity_preempting(self, probe: _JobProbe, t: float) -> str:
        """The victim recorded its Preempted event (told by the preemptor's workflow, for
        room on CAPACITY_MEMBER) and its copy is still there: it is in its grace period."""
        assert self.client is not None and self.emulator is not None
        ns = probe.handle.id.split("/")[1]
        victim = self.client.get_workflow_handle(job_workflow_id(ns, "victim"))
        emulator = self.emulator

        async def capacity_preempted() -> str:
            v = await job_view(victim)
            if v is None or not any(e.reason == "Preempted" for e in v.events):
                return ""
            reasons = preempt_reasons(await history_events(victim))
            there = member_copies(emulator, ns, "victim", (CAPACITY_MEMBER,))
            return ("victim in its grace period (Capacity)"
                    if reasons == ["Capacity"] and there else "")

        return str(await poll(capacity_preempted, t, 0.01))

    async def run_point(self, point: str, timeout: float = 240.0) -> PointResult:
        assert self.client is not None
        started = time.monotonic()
        ns, tq = f"chaos-{point}", f"chaos-{point}"
        self.start_worker(tq)
        handles = []
        held = self.emulator is not None
        if point == "queued":  # hold the leaf (max-jobs 1) so the job waits in its queue,
            # however long it takes to be seen Queued (the blocker runs before the job
            # starts, so that the kill finds no bind of its in flight)
            blocker = await self.start_job(ns, "blocker", tq, held=True)
            handles.append(blocker)
            await poll(lambda: _state(blocker, "Running"), 60)
        # "preempting": a low-priority job runs in the leaf (max-jobs 1); "capacity-
        # preempting": a low-priority job fills CAPACITY_MEMBER, the only member its policy
        # names (its leaf admits two jobs: quota has room, the member has none)
        cpu = CAPACITY_CPU if point == "capacity-preempting" else "100m"
        if point in PREEMPTION_POINTS:  # (held: it ends by being preempted, however late
            # the preemptor comes; the rig completes its second run)
            victim = await self.start_job(
                ns, "victim", tq, manifest=preemption_job(
                    ns, "victim", 0, 0 if point == "preempting-at-once" else PREEMPT_GRACE,
                    cpu=cpu), held=held)
            handles.append(victim)
            await poll(lambda: _state(victim, "Running"), 60)
        handle = await self.start_job(
            ns, "job", tq,
            manifest=preemption_job(ns, "job", PREEMPTOR_PRIORITY, PREEMPT_GRACE, cpu=cpu)
            if point in PREEMPTION_POINTS else None, held=held)
        handles.append(handle)
        hit = await self._trigger(point, handle)
        self.kill_worker(tq)
        self.kill_times[point] = time.time()
        if self.real is None:
            await asyncio.sleep(0.5)
        self.start_worker(tq)
        problems: list[str] = []
        if held:  # a preempted victim is completed in its second run (bound twice)
            problems += await self.let_finish(handles, binds={
                h.id: 2 for h in handles if point in PREEMPTION_POINTS and h is not handle})
        if not hit or hit.startswith("missed"):
            problems.append(f"the job never reached phase {point!r}"
                            + (f" ({hit})" if hit else ""))
        expect = "Deleted" if point == "releasing" else "Succeeded"
        state = ""
        for h in handles:
            st, probs = await self.check_job(h, expect, timeout,
                                             failed_over=(point == "failing-over"
                                                          and h is handle),
                                             preempted=(point in PREEMPTION_POINTS
                                                        and h is not handle))
            problems += probs
            if h is handle:
                state = st
        if point == "capacity-preempting":
            problems += await capacity_preemption_problems(handles[0], handle)
        assert self.client is not None
        problems += await leaf_quota_problems(self.client, f"leaf-{point}",
                                              [h.id for h in handles])
        return PointResult(point, not problems, hit or "(phase not reached)", problems,
                           time.monotonic() - started, state,
                           self._notes.pop(handle.id, ""))

    async def let_finish(self, handles: Sequence[WorkflowHandle[Any, Any]],
                         binds: dict[str, int] | None = None,
                         timeout: float = 240.0) -> list[str]:
        """Complete each held job's pods on its member once it runs there (its job then
        succeeds); a job that closes first (a cancelled one) needs nothing. Each job is
        completed once: after the restart it runs once more, wherever it was placed
        (``binds``: by workflow id, the bind count it must have reached first; 1 when
        not given)."""
        assert self.emulator is not None
        need = binds or {}

        async def finish(handle: WorkflowHandle[Any, Any]) -> list[str]:
            done = await poll(lambda: self._complete_once_running(
                handle, need.get(handle.id, 1)), timeout, 0.2)
            return [] if done else [f"{handle.id}: never ran after the restart, or its "
                                    f"pods could not be completed ({timeout:.0f}s)"]

        found = await asyncio.gather(*(finish(h) for h in handles))
        return [p for probs in found for p in probs]

    async def _complete_once_running(self, handle: WorkflowHandle[Any, Any],
                                     binds: int = 1) -> str:
        """``completed on <member>`` / ``closed``, or empty while it does not run (or
        has been bound fewer than ``binds`` times)."""
        try:
            if (await handle.describe()).status != WorkflowExecutionStatus.RUNNING:
                return "closed"
        except RPCError:
            return ""
        cluster = await complete_if_running(self.emulator, handle, binds)
        return f"completed on {cluster}" if cluster else ""

    async def check_job(self, handle: WorkflowHandle[Any, Any], expect: str, timeout: float,
                        failed_over: bool = False, preempted: bool = False
                        ) -> tuple[str, list[str]]:
        """Wait for the job to end and check it against what it should have reached
        (``preempted``: it was preempted once, so admitted twice)."""
        assert self.client is not None
        assert self.emulator is not None or self.real is not None
        problems: list[str] = []
        wid = handle.id

        async def closed() -> bool:
            try:
                d = await handle.describe()
            except RPCError:
                return False
            return d.status != WorkflowExecutionStatus.RUNNING

        if not await poll(closed, timeout, 0.3):
            v = await job_view(handle)
            why = task_failure_messages(await history_events(handle))
            return (v.state if v else "?"), [
                f"{wid}: still running after {timeout:.0f}s "
                f"({v.state if v else '?'}: {v.reason if v else ''})"
                + (f"; workflow task failing: {why[0]}" if why else "")]
        desc = await handle.describe()
        view = await job_view(handle)
        state = view.state if view is not None else "?"
        problems += _end_problems(wid, view, desc.status, expect)
        events = await history_events(handle)
        problems += _admission_problems(wid, view, events, preempted)
        if self.real is not None:
            # on real members: none caused by our code or worker (a closing task refused
            # because an event arrived meanwhile is Temporal's design, see
            # code_task_failures), and the members themselves checked with kubectl
            problems += [f"{wid}: WorkflowTaskFailed: {f}" for f in code_task_failures(events)]
            probs, copy = await self.real.job_problems(wid, view, expect)
            self._note_copy(wid, copy, events)
            return state, problems + probs
        if n := workflow_task_failures(events):
            why = task_failure_messages(events)
            problems.append(f"{wid}: {n} WorkflowTaskFailed events"
                            + (f": {why[0]}" if why else ""))
        assert self.emulator is not None
        problems += _emulated_member_problems(self.emulator, wid, view, expect, failed_over)
        return state, problems

    def _note_copy(self, wid: str, copy: dict[str, Any], events: list[Any]) -> None:
        """For the mid-bind kill, say who wrote the member copy: the killed worker (its
        request, held by the proxy, still reached the API server after the kill; the
        retried bind then adopted it) or the worker that took over (the bind retried
        after its start-to-close timeout). At the kill the copy was not there yet (the
        trigger checked)."""
        point = wid.split("/")[1].removeprefix("chaos-")
        killed = self.kill_times.get(point)
        created = parse_rfc3339((copy.get("metadata") or {}).get("creationTimestamp"))
        if point != "binding" or killed is None or created is None:
            return
        at = created.timestamp()
        # creationTimestamp has whole seconds; the retry comes a minute later
        who = ("written by the killed worker's request, after the kill" if at < killed + 5
               else "written by the new worker's retried bind")
        self._notes[wid] = f"member copy {who}; {bind_outcome(events)}"

    # ---------------------------------------------------------------- restarts
    async def run_restart(self, what: str, timeout: float = 180.0) -> PointResult:
        started = time.monotonic()
        ns, tq = f"chaos-{what}", f"chaos-{what}"
        self.start_worker(tq)
        handle = await self.start_job(ns, "job", tq, held=True)  # (restarts: emulated)
        hit = str(await poll(lambda: _state(handle, "Running"), 60))
        if what == "history-kill":
            hit = await self.kill_history(handle) if hit else ""
        elif what == "temporal-restart":
            self.temporal.kill(signal.SIGKILL)
            await asyncio.sleep(1.0)
            await self.temporal.start()
        else:
            self.stop_emulator()
            await asyncio.sleep(1.0)
            self.start_emulator()
        problems = [] if hit else [f"the job never reached Running before the {what}"]
        problems += await self.let_finish([handle])
        state, probs = await self.check_job(handle, "Succeeded", timeout)
        problems += probs
        assert self.client is not None
        problems += await leaf_quota_problems(self.client, f"leaf-{what}", [handle.id])
        note = ""
        if what == "history-kill" and self.history_killed is not None:
            index, at = self.history_killed
            note = (f"the job ended {time.time() - at:.1f}s after the kill with "
                    f"temporal-history-{index} still dead; restarted it afterwards")
            assert isinstance(self.temporal, ClusterServer) and self.temporal.cluster
            self.temporal.cluster.start_history(index)
        return PointResult(what, not problems, hit or "(not reached)", problems,
                           time.monotonic() - started, state, note)

    async def kill_history(self, handle: WorkflowHandle[Any, Any]) -> str:
        """SIGKILL the history process that owns the job's shard (``tdbg`` tells; the
        first one if it cannot) while the job runs; returns what was hit."""
        if not isinstance(self.temporal, ClusterServer) or self.temporal.cluster is None:
            raise ValueError("history-kill needs the production-shaped Temporal "
                             "(--temporal cluster)")
        cluster = self.temporal.cluster
        owner = await asyncio.to_thread(cluster.history_owner, handle.id)
        index = owner if owner is not None else 0
        cluster.kill_history(index)
        self.history_killed = (index, time.time())
        why = "owner of the job's shard" if owner is not None else "owner unknown"
        return f"Running; SIGKILL temporal-history-{index} ({why})"


async def capacity_preemption_problems(victim: WorkflowHandle[Any, Any],
                                       preemptor: WorkflowHandle[Any, Any]) -> list[str]:
    """What the capacity-preempting point checks beyond :meth:`ChaosRig.check_job`
    (which counted the admissions, the ``Preempted`` events and the copies): the
    victim was told to stop once, for capacity, and bound twice in all; the preemptor
    planned once, on :data:`CAPACITY_MEMBER`, and was bound once, there."""
    problems: list[str] = []
    v, p = await job_view(victim), await job_view(preemptor)
    if v is None or p is None:
        return [f"{victim.id} or {preemptor.id}: status query failed after they ended"]
    if (reasons := preempt_reasons(await history_events(victim))) != ["Capacity"]:
        problems.append(f"{victim.id}: preempt signals {reasons}, expected one, Capacity")
    # (a repeated event is kept once with its count: fleetq.lifecycle's aggregation)
    if (binds := sum(e.count for e in v.events if e.reason == "ScheduleBindingSucceed")) != 2:
        problems.append(f"{victim.id}: bound {binds} times, expected twice (preempted "
                        "once)")
    plans = [e.message for e in p.events if e.reason == "Preempting"]
    if len(plans) != 1 or f" on {CAPACITY_MEMBER} (" not in plans[0]:
        problems.append(f"{preemptor.id}: Preempting events {plans}, expected one plan "
                        f"on {CAPACITY_MEMBER}")
    if (binds := sum(e.count for e in p.events if e.reason == "ScheduleBindingSucceed")) != 1:
        problems.append(f"{preemptor.id}: bound {binds} times, expected exactly once")
    if p.cluster != CAPACITY_MEMBER:
        problems.append(f"{preemptor.id}: ran on {p.cluster}, not on the planned "
                        f"{CAPACITY_MEMBER}")
    return problems


async def _state(handle: WorkflowHandle[Any, Any], state: str) -> str:
    v = await job_view(handle)
    return f"state {v.state}" if v is not None and v.state == state else ""


@dataclass
class MatrixResult:
    results: list[PointResult]
    quota_problems: list[str]
    #: start to teardown of the whole run, as the caller measured it
    seconds: float = 0.0

    def point(self, name: str) -> PointResult:
        """The result of kill point (or restart) ``name``, which ran exactly once."""
        (found,) = [r for r in self.results if r.point == name]
        return found

    def report(self) -> str:
        """One line per point, then any quota problem."""
        return "\n".join([r.line() for r in self.results] + self.quota_problems)

    @property
    def tried(self) -> int:
        return len(self.results)

    @property
    def survived(self) -> int:
        return sum(1 for r in self.results if r.survived)

    @property
    def ok(self) -> bool:
        return self.tried > 0 and self.survived == self.tried and not self.quota_problems


async def run_matrix(points: Sequence[str] = KILL_POINTS, restarts: Sequence[str] = RESTARTS,
                     *, workdir: Path | None = None,
                     log: Callable[[str], None] = lambda _m: None,
                     members: str = "emulated", temporal: str = "dev") -> MatrixResult:
    """Run the kill points concurrently, then the restarts one at a time; finally check
    that the quota tree holds nothing. ``members="real"``: real control planes instead of
    the emulator, for :data:`REAL_KILL_POINTS` (no restarts). ``temporal="cluster"``: the
    production-shaped Temporal instead of the dev server, with the ``history-kill``
    restart (:data:`CLUSTER_RESTARTS`)."""
    if temporal != "cluster" and "history-kill" in restarts:
        raise ValueError("history-kill needs temporal='cluster' (the dev server has no "
                         "history process of its own)")
    if members == "real":
        unsupported = [p for p in points if p not in REAL_KILL_POINTS] + list(restarts)
        if unsupported:
            raise ValueError(f"on real members the rig runs {', '.join(REAL_KILL_POINTS)} "
                             f"only, not {', '.join(unsupported)}")
    own = workdir is None
    wd = Path(tempfile.mkdtemp(prefix="fleetq-chaos-")) if workdir is None else workdir
    rig = ChaosRig(wd, log=log, members=members, temporal=temporal)
    try:
        await rig.start([*points, *restarts])
        results: list[PointResult] = []
        if points:
            log(f"killing the worker at {len(points)} phases: {', '.join(points)}")
            results += await asyncio.gather(*(rig.run_point(p) for p in points))
        for what in restarts:
            log(f"{what}: restarting mid-run")
            results.append(await rig.run_restart(what))
        assert rig.client is not None
        quota = await quota_leaks(rig.client)
        return MatrixResult(results, quota)
    finally:
        await rig.close()
        if own and not os.environ.get("FLEETQ_CHAOS_KEEP"):
            import shutil

            shutil.rmtree(wd, ignore_errors=True)
