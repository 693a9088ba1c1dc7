"""Shared plumbing of the Temporal benchmarks (``bench.e2e``, ``bench.queue``,
``bench.history``): the embedded stack with an in-process worker, history walking,
process CPU and memory, percentiles and the ``RESULT`` line.

Why in-process: every figure is a ratio against a baseline measured on the *same* server
and the *same* worker, so the baseline's workflows and activities are registered on the
fleetq worker itself, and the worker's CPU is this process's CPU (Temporal and the
member-cluster emulator run as child processes and are not counted).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import resource
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer
import yaml
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy

from activities.fleet import Fleet
from activities.scheduling import SchedulingActivities
from fleetq.client.connection import connect
from fleetq.messages import QuotaBatch, QuotaMessage
from fleetq.naming import CONTROL_TASK_QUEUE, REGISTRY_WORKFLOW_ID
from fleetq.runtime.embedded import EmbeddedFleet, TemporalKind
from fleetq.runtime.supervisor import free_port
from fleetq.testing.history import RunStats as RunStats
from fleetq.testing.history import event_type_name as event_type_name
from fleetq.testing.history import payload_bytes as payload_bytes
from fleetq.testing.history import run_chain as run_chain
from workflows.fleet_registry import RegistryState

#: Temporal's history-length warning; a run above it is a failed benchmark.
HISTORY_WARN_EVENTS = 10_240


def run_main(coro: Coroutine[Any, Any, int]) -> int:
    """``asyncio.run`` for a benchmark: a failure of the stack it drives (Temporal, the
    emulator, a workflow) ends in one ``error:`` line and exit code 1, not a traceback."""
    from temporalio.client import WorkflowFailureError
    from temporalio.service import RPCError

    from fleetq.runtime.embedded import EmbeddedError

    try:
        return asyncio.run(coro)
    except (TimeoutError, RPCError, WorkflowFailureError, EmbeddedError) as exc:
        cause = getattr(exc, "cause", None)
        detail = f" ({cause})" if cause else ""
        print(f"error: {type(exc).__name__}: {exc}{detail}".splitlines()[0], file=sys.stderr)
        return 1


def result_line(name: str, ratio: float, target: float) -> str:
    """The last line every benchmark prints: ``RESULT <name> <ratio> (target <t>)``."""
    return f"RESULT {name} {ratio:.2f} (target {target})"


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (``p`` in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def cpu_seconds() -> float:
    """User + system CPU time of this process (all threads: Python, Rust core, pool)."""
    t = os.times()
    return t.user + t.system


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU time of another process (Linux /proc), 0 when unreadable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb() -> float:
    """This process's peak resident memory so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@dataclass
class Phase:
    """Wall time and process CPU of one measured phase."""

    name: str
    count: int = 0
    wall: float = 0.0
    cpu: float = 0.0
    #: other processes to account (e.g. the Temporal server): name -> pid
    others: dict[str, int] = field(default_factory=dict)
    other_cpu: dict[str, float] = field(default_factory=dict)
    _t0: float = 0.0
    _c0: float = 0.0

    def start(self) -> Phase:
        self._t0, self._c0 = time.perf_counter(), cpu_seconds()
        self.other_cpu = {n: proc_cpu_seconds(p) for n, p in self.others.items()}
        return self

    def stop(self, count: int) -> Phase:
        self.wall = time.perf_counter() - self._t0
        self.cpu = cpu_seconds() - self._c0
        self.other_cpu = {n: proc_cpu_seconds(p) - self.other_cpu.get(n, 0.0)
                          for n, p in self.others.items()}
        self.count = count
        return self

    @property
    def rate(self) -> float:
        return self.count / self.wall if self.wall > 0 else math.nan

    def line(self, unit: str) -> str:
        per = self.cpu / self.count * 1000 if self.count else math.nan
        return (f"{self.name:<10} {self.count:6d} {unit} in {self.wall:7.2f} s = "
                f"{self.rate:8.1f} {unit}/s; process CPU {self.cpu:6.1f} s "
                f"({self.cpu / self.wall * 100 if self.wall else 0:4.0f}% of one core, "
                f"{per:.1f} ms per {unit.rstrip('s')})"
                + "".join(f"; {n} CPU {c:.1f} s" for n, c in self.other_cpu.items()))


async def bounded_gather(
    factories: Iterable[Callable[[], Awaitable[Any]]], concurrency: int
) -> list[Any]:
    """Run coroutine factories with at most ``concurrency`` in flight; results in order."""
    sem = asyncio.Semaphore(max(1, concurrency))

    async def one(f: Callable[[], Awaitable[Any]]) -> Any:
        async with sem:
            return await f()

    return await asyncio.gather(*(one(f) for f in factories))


# ---------------------------------------------------------------------- history


def event_seconds(ev: HistoryEvent) -> float:
    """A history event's time, in seconds since the epoch."""
    return ev.event_time.seconds + ev.event_time.nanos / 1e9


def decode_json_payloads(payloads: Any) -> list[Any]:
    """Decode JSON payloads (the pydantic converter's encoding) without a type."""
    return [json.loads(p.data) if p.data else None for p in payloads.payloads]


def parked_in(ev: HistoryEvent) -> list[str]:
    """The victims a quota workflow's own purge (its ``purge_for_preemption`` local
    activity's marker, docs/decisions/023) took the quota of: their quota goes back
    there, not at their ``requeue``."""
    if not ev.HasField("marker_recorded_event_attributes"):
        return []
    details = ev.marker_recorded_event_attributes.details
    if "data" not in details or "result" not in details:
        return []
    data = decode_json_payloads(details["data"])
    if not data or not isinstance(data[0], dict) or (
            data[0].get("activity_type") != "purge_for_preemption"):
        return []
    result = decode_json_payloads(details["result"])
    return [j for j in result[0] if isinstance(j, str)] if result and isinstance(
        result[0], list) else []


def quota_messages(events: Iterable[HistoryEvent]) -> Iterable[tuple[HistoryEvent, QuotaMessage]]:
    """Every message a quota workflow took, in order, read from its history: the batches
    of its ``submit`` updates (each message with the update's accepted event) and the
    single ``enqueue``/``requeue``/``release``/``cancel`` signals."""
    for ev in events:
        if ev.HasField("workflow_execution_update_accepted_event_attributes"):
            req = ev.workflow_execution_update_accepted_event_attributes.accepted_request
            if req.input.name == "submit" and req.input.args.payloads:
                batch = QuotaBatch.model_validate(decode_json_payloads(req.input.args)[0])
                for message in batch.messages:
                    yield ev, message
        elif ev.HasField("workflow_execution_signaled_event_attributes"):
            sig = ev.workflow_execution_signaled_event_attributes
            if sig.signal_name in ("enqueue", "requeue", "release", "cancel") \
                    and sig.input.payloads:
                arg = decode_json_payloads(sig.input)[0]
                if sig.signal_name in ("enqueue", "requeue"):
                    yield ev, QuotaMessage.model_validate(
                        {"signal": sig.signal_name, "request": arg})
                else:
                    yield ev, QuotaMessage.model_validate(
                        {"signal": sig.signal_name, "job_id": arg})


# ---------------------------------------------------------------------- options

BUILT_TEMPORAL = ("the production-shaped Temporal built from its Go module (fleetq "
                  "temporal-cluster build)")


def temporal_option(cluster: str = BUILT_TEMPORAL) -> Any:
    """A bench command's ``--temporal``: dev (the default) or cluster (``cluster`` says
    what that is)."""
    return typer.Option(TemporalKind.dev, "--temporal",
                        help=f"dev: temporal server start-dev (SQLite); cluster: {cluster}")


# ---------------------------------------------------------------------- manifests


def gang_policy(name: str, namespace: str, queued: bool = False) -> dict[str, Any]:
    """The walkthrough's PropagationPolicy for PyTorchJobs in ``namespace``: one gang on
    one member cluster, failover after 30 s; ``queued`` holds jobs in their quota queue."""
    spec: dict[str, Any] = {"suspension": {"scheduling": True}} if queued else {}
    spec.update({
        "propagateDeps": True,  # Karmada: application failover needs it
        "failover": {"application": {"decisionConditions": {"tolerationSeconds": 30},
                                     "purgeMode": "Immediately"}},
        "placement": {"replicaScheduling": {"replicaSchedulingType": "Divided",
                                            "customSchedulingType": "Gang"}},
        "resourceSelectors": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob"}],
    })
    return {"apiVersion": "policy.one.alibabacloud.com/v1alpha1", "kind": "PropagationPolicy",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def one_leaf_quota_tree(leaf: str, namespace: str, room: dict[str, Any],
                        leaf_room: dict[str, Any] | None = None) -> dict[str, Any]:
    """An ElasticQuotaTree whose root (max = min = ``room``) has one leaf ``leaf`` for
    ``namespace``, whose max is ``leaf_room`` (``room`` when not given)."""
    return {
        "apiVersion": "scheduling.sigs.k8s.io/v1beta1", "kind": "ElasticQuotaTree",
        "metadata": {"name": "elasticquotatree", "namespace": "kube-system"},
        "spec": {"root": {"name": "root", "max": room, "min": room, "children": [
            {"name": leaf, "max": leaf_room or room, "namespaces": [namespace]}]}},
    }


# ---------------------------------------------------------------------- the stack


def write_topology(doc: dict[str, Any], directory: Path) -> Path:
    path = directory / "topology.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@dataclass
class Stack:
    """A running embedded stack: Temporal dev server + emulator (child processes) and a
    client of this process."""

    embedded: EmbeddedFleet
    client: Client
    fleet_config: str

    @property
    def pids(self) -> dict[str, int]:
        """The child processes (temporal, emulator) by name."""
        return {c.name: c.proc.pid for c in self.embedded.children}


@contextlib.asynccontextmanager
async def embedded_stack(topology: dict[str, Any] | None = None,
                         progress: Callable[[str], None] | None = None,
                         temporal: str = "dev") -> AsyncIterator[Stack]:
    """Start a Temporal dev server and the member-cluster emulator on free ports in a
    temporary state dir (``fleetq up`` without its worker); stop both afterwards.
    ``temporal="cluster"``: the production-shaped Temporal instead of the dev server
    (:mod:`fleetq.temporal_cluster`)."""
    # tmpfs when there is one: the dev server's SQLite file should not wait on fsync of
    # a shared disk (that would measure the disk, not Temporal or fleetq)
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="fleetq-bench-", dir=shm) as tmp:
        state = Path(tmp)
        topo = write_topology(topology, state) if topology is not None else None
        emb = EmbeddedFleet(state_dir=state, topology=topo, port=free_port(),
                            ui_port=free_port(), worker=False, temporal=temporal,
                            progress=progress or (lambda _m: None))
        await asyncio.to_thread(emb.start, 120.0)
        try:
            client = await connect(emb.address)
            await client.start_workflow(
                "FleetRegistryWorkflow", RegistryState(), id=REGISTRY_WORKFLOW_ID,
                task_queue=CONTROL_TASK_QUEUE,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING)
            yield Stack(emb, client, emb.fleet_config)
        finally:
            await asyncio.to_thread(emb.stop)


def real_activities(client: Client, fleet_config: str | None) -> SchedulingActivities:
    """The worker's real activities; without a fleet config, only the ones that need no
    member cluster (``check_holders``, ``resolve_policy``) can run."""
    if fleet_config:
        return SchedulingActivities(client, Fleet.from_config(fleet_config),
                                    search_attributes=True)

    def no_fleet() -> Fleet:
        raise RuntimeError("this benchmark runs without member clusters")

    return SchedulingActivities(client, no_fleet)
