"""Benchmark: many fleetq worker processes on one fleet (issue 19, item 4).

The embedded stack and ``--workers`` worker processes (each also running the control
plane); small jobs on two members without Reservations, so every bind takes the bind
Lease. Burst: 12 workers, well above the server's 10 updates in flight per workflow;
nothing may be lost. ``--compare 1,2``: a second worker must not make the fleet slower.
Method: BENCHMARKS.md "Bench methods"; figures: "Many workers".

Run: ``fleetq bench workers [--workers 12] [--jobs 2000]``, ``--compare 1,2 --jobs 300``,
or ``--bind-cost 200 --workers 4`` (the bind Lease alone). RESULT lines: ``RESULT
workersburst <jobs succeeded / jobs> (target 1.0)``, ``RESULT workers2v1 <jobs/s with 2 /
jobs/s with 1> (target 1.0)``.
"""

from __future__ import annotations

import asyncio
import functools
import math
import re
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer
from temporalio.client import Client, WorkflowFailureError

from bench.command import bench_app, help_text, run_command
from bench.common import (
    bounded_gather,
    embedded_stack,
    percentile,
    proc_cpu_seconds,
    result_line,
    run_main,
)
from bench.e2e import NAMESPACE, queued_policy, quota_tree, small_job
from fleetq.client.apply import apply_registry_object, apply_tree
from fleetq.client.connection import until_polled
from fleetq.client.jobs import start_job
from fleetq.models import parse_job, parse_tree
from fleetq.naming import job_workflow_id
from fleetq.runtime.supervisor import Child, free_port, spawn_child
from fleetq.testing.history import grants_received

ROOT = Path(__file__).resolve().parents[1]
SUBMIT_CONCURRENCY = 200


def topology() -> dict[str, Any]:
    """A hub and two members without Reservations, room for thousands of small pods."""
    return {"clusters": [
        {"name": "hub", "member": False, "labels": {"role": "hub"}},
        {"name": "many-a", "labels": {"region": "east"},
         "nodeGroups": [{"count": 30, "cpu": "32", "memory": "128Gi", "pods": 110}]},
        {"name": "many-b", "labels": {"region": "west"},
         "nodeGroups": [{"count": 30, "cpu": "32", "memory": "128Gi", "pods": 110}]},
    ]}


# ---------------------------------------------------------------------- worker metrics

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def scrape(port: int) -> list[tuple[str, dict[str, str], float]]:
    """One worker's Prometheus samples: (name, labels, value)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            out.append((m[1], dict(_LABEL.findall(m[2] or "")), float(m[3])))
    return out


@dataclass
class Metrics:
    """Samples summed over every worker."""

    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)

    def total(self, name: str, **labels: str) -> float:
        return sum(v for n, lab, v in self.samples
                   if n == name and all(lab.get(k) == x for k, x in labels.items()))

    def histogram(self, prefix: str) -> tuple[float, float, dict[float, float]]:
        """(sum, count, cumulative count by bucket bound) of a histogram, all workers."""
        total = count = 0.0
        buckets: dict[float, float] = defaultdict(float)
        for n, lab, v in self.samples:
            if not n.startswith(prefix):
                continue
            if n.endswith("_sum"):
                total += v
            elif n.endswith("_count"):
                count += v
            elif n.endswith("_bucket"):
                buckets[math.inf if lab["le"] == "+Inf" else float(lab["le"])] += v
        return total, count, dict(buckets)


async def admission_latency(client: Client, name: str) -> float | None:
    """Seconds from the job workflow's start to its grant (its history: the ``admitted``
    signal, or the enqueue's answer when admitted at once)."""
    handle = client.get_workflow_handle(job_workflow_id(NAMESPACE, name))
    start: float | None = None
    async for ev in handle.fetch_history_events():
        t = ev.event_time.ToDatetime().timestamp()
        if start is None:
            start = t
        if grants_received([ev]):
            return t - start
    return None


# ---------------------------------------------------------------------- one run


@dataclass
class Outcome:
    workers: int
    jobs: int
    succeeded: int
    failed: list[str]
    lost: int
    wall_s: float
    worker_cpu_s: float
    temporal_cpu_s: float
    emulator_cpu_s: float
    metrics: Metrics
    admission_s: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.succeeded / self.wall_s if self.wall_s > 0 else math.nan


def start_worker(i: int, address: str, fleet_config: str, port: int, logs: Path) -> Child:
    return spawn_child(
        f"worker-{i}",
        [sys.executable, "-m", "worker", "--address", address, "--fleet-config", fleet_config,
         "--prometheus-port", str(port)],
        logs, env={"PYTHONUNBUFFERED": "1"}, cwd=ROOT,
    )


async def wait_for_metrics(ports: Sequence[int], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    for port in ports:
        while True:
            try:
                await asyncio.to_thread(scrape, port)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"worker on :{port} never served metrics") from None
                await asyncio.sleep(0.5)


async def run_fleet(workers: int, jobs: int, log: Any, timeout_s: float) -> Outcome:
    async with embedded_stack(topology(), progress=log) as stack:
        client: Client = stack.client
        address = stack.embedded.address
        ports = [free_port() for _ in range(workers)]
        with tempfile.TemporaryDirectory(prefix="fleetq-workers-") as tmp:
            procs = [start_worker(i, address, stack.fleet_config, p, Path(tmp))
                     for i, p in enumerate(ports)]
            try:
                await wait_for_metrics(ports)
                await until_polled(client)  # serving metrics is not polling yet
                tree = quota_tree(max_jobs=100_000)  # the workers run the registry
                await apply_tree(client, parse_tree(tree), tree)
                await apply_registry_object(client, queued_policy())
                log(f"{workers} worker(s) up; submitting {jobs} jobs at once")
                return await _measure(stack, client, procs, ports, jobs, log, timeout_s)
            finally:
                for p in procs:
                    p.stop()


async def _measure(stack: Any, client: Client, procs: list[Child], ports: list[int],
                   jobs: int, log: Any, timeout_s: float) -> Outcome:
    pids = stack.pids
    temporal0 = sum(proc_cpu_seconds(p) for n, p in pids.items() if "temporal" in n)
    emulator0 = sum(proc_cpu_seconds(p) for n, p in pids.items() if "emulator" in n)
    workers0 = sum(proc_cpu_seconds(p.proc.pid) for p in procs)
    names = [f"w-{i:05d}" for i in range(jobs)]
    t0 = time.perf_counter()

    async def submit(name: str) -> None:
        doc = small_job(name)
        await start_job(client, parse_job(doc), doc, run_seconds=1)

    await bounded_gather([functools.partial(submit, n) for n in names], SUBMIT_CONCURRENCY)
    log(f"submitted in {time.perf_counter() - t0:.1f} s; waiting for every job to finish")
    failed: list[str] = []
    lost = 0

    async def finish(name: str) -> bool:
        nonlocal lost
        handle = client.get_workflow_handle(job_workflow_id(NAMESPACE, name))
        try:
            await asyncio.wait_for(handle.result(), max(1.0, t0 + timeout_s - time.perf_counter()))
        except WorkflowFailureError as exc:
            failed.append(f"{name}: {exc.cause or exc}")
            return False
        except TimeoutError:
            lost += 1
            return False
        return True

    done = await bounded_gather([functools.partial(finish, n) for n in names],
                                SUBMIT_CONCURRENCY)
    wall = time.perf_counter() - t0
    metrics = Metrics([s for port in ports for s in await asyncio.to_thread(scrape, port)])
    lat = await bounded_gather([functools.partial(admission_latency, client, n)
                                for n in names], 50)
    return Outcome(
        workers=len(procs), jobs=jobs, succeeded=sum(done), failed=failed, lost=lost,
        wall_s=wall,
        worker_cpu_s=sum(proc_cpu_seconds(p.proc.pid) for p in procs) - workers0,
        temporal_cpu_s=sum(proc_cpu_seconds(p) for n, p in pids.items()
                           if "temporal" in n) - temporal0,
        emulator_cpu_s=sum(proc_cpu_seconds(p) for n, p in pids.items()
                           if "emulator" in n) - emulator0,
        metrics=metrics, admission_s=[x for x in lat if x is not None],
    )


def report(o: Outcome) -> None:
    m = o.metrics
    print(f"workers {o.workers}: {o.succeeded}/{o.jobs} jobs succeeded in {o.wall_s:.1f} s "
          f"= {o.rate:.2f} jobs/s; failed {len(o.failed)}, lost (never finished) {o.lost}")
    for line in o.failed[:5]:
        print(f"  failed: {line}")
    la_failed = m.total("temporal_local_activity_execution_failed", activity_type="signal_quota")
    la_total = m.total("temporal_local_activity_total", activity_type="signal_quota")
    print(f"  quota messages: signal_quota local activities {la_total:.0f}, failed attempts "
          f"{la_failed:.0f}; outbox update retries "
          f"{m.total('fleetq_quota_update_retries'):.0f}, failed batches "
          f"{m.total('fleetq_quota_delivery_failures'):.0f}; client request failures "
          f"UpdateWorkflowExecution "
          f"{m.total('temporal_long_request_failure', operation='UpdateWorkflowExecution') + m.total('temporal_request_failure', operation='UpdateWorkflowExecution'):.0f}")  # noqa: E501
    total, count, _ = m.histogram("fleetq_admission_latency")
    lat = o.admission_s
    if lat:
        print(f"  admission latency (workflow start to the quota workflow's grant, "
              f"{len(lat)} jobs): p50 {percentile(lat, 50):.2f} s, p99 "
              f"{percentile(lat, 99):.2f} s, max {max(lat):.2f} s"
              + (f"; workers' histogram mean {total / count:.2f} s" if count else ""))
    binds = m.total("temporal_activity_execution_latency_count", activity_type="bind")
    bind_ms = m.total("temporal_activity_execution_latency_sum", activity_type="bind")
    if binds:
        print(f"  bind activity: {binds:.0f} executions, mean {bind_ms / binds:.0f} ms "
              "(Lease wait and hold, fresh read of the member, create)")
    print(f"  CPU s: workers {o.worker_cpu_s:.1f}, Temporal {o.temporal_cpu_s:.1f}, "
          f"emulator {o.emulator_cpu_s:.1f} over {o.wall_s:.1f} s wall "
          f"({(o.worker_cpu_s + o.temporal_cpu_s + o.emulator_cpu_s) / o.wall_s:.2f} cores)")


# ---------------------------------------------------------------------- bind cost


def bind_cost(binds: int, adapters: int) -> None:
    """The bind Lease's price on one emulated member without Reservations (100 nodes):
    ``binds`` guarded binds (Lease, fresh read, create) against as many plain ones
    (``bind_guard=False``: the create alone), one at a time and from ``adapters``
    independent adapters (as many workers) with 8 binds at once each."""
    from concurrent.futures import ThreadPoolExecutor

    from activities.kube_api import KubeApi
    from activities.member_cluster import KubernetesMemberCluster
    from fleetq.emulator.fleet import EmulatedFleet
    from fleetq.messages import BindRequest, JobRef
    from fleetq.topology import parse_topology

    topo = parse_topology({"clusters": [{"name": "cost", "nodeGroups": [
        {"count": 100, "cpu": "64", "memory": "256Gi", "pods": 110}]}]}, "bind cost")
    with tempfile.TemporaryDirectory(prefix="fleetq-bindcost-") as out, \
            EmulatedFleet(topo, out_dir=Path(out)) as fleet:
        def adapter(guard: bool) -> KubernetesMemberCluster:
            return KubernetesMemberCluster(
                "cost", KubeApi.from_kubeconfig("cost", str(fleet.kubeconfig_path), "cost"),
                start_cache=False, bind_guard=guard)

        members = {kind: [adapter(kind == "guarded") for _ in range(adapters)]
                   for kind in ("plain", "guarded")}

        def one(kind: str, i: int, label: str = "") -> float:
            m = members[kind][i % adapters]
            job = JobRef(namespace=f"cost-{kind}", name=f"{kind}{label}-{i:05d}",
                         workflow_id=f"bench-{kind}{label}-{i}")
            doc = small_job(job.name)
            doc["metadata"]["namespace"] = job.namespace
            t = time.perf_counter()
            m.bind(BindRequest(job=job, manifest=doc, run_seconds=3600))
            return time.perf_counter() - t

        rows = []
        for kind in ("plain", "guarded"):
            seq = [one(kind, i * adapters) for i in range(binds)]
            t = time.perf_counter()
            with ThreadPoolExecutor(adapters * 8) as pool:  # 8 binds at once per worker
                list(pool.map(lambda i, k=kind: one(k, i, "-c"), range(binds)))
            rows.append((kind, seq, binds / (time.perf_counter() - t)))
        stats = members["guarded"][0].bind_stats
        for kind, seq, rate in rows:
            print(f"bind {kind:<8} one at a time: p50 {percentile(seq, 50) * 1000:6.1f} ms, "
                  f"p99 {percentile(seq, 99) * 1000:6.1f} ms, mean "
                  f"{sum(seq) / len(seq) * 1000:6.1f} ms; from {adapters} adapters at once: "
                  f"{rate:6.1f} binds/s")
        (_, plain, plain_rate), (_, guarded, guarded_rate) = rows
        print(f"bind guard cost: {sum(guarded) / sum(plain):.2f}x the plain bind's mean "
              f"latency one at a time; {guarded_rate / plain_rate:.2f}x its throughput from "
              f"{adapters} adapters (the Lease serialises binds per member); the member ends "
              f"with {4 * binds} PyTorchJobs; adapter 0 served {stats.guarded} binds in "
              f"{stats.batches} Lease holds, waited for the Lease {stats.lease_waits} "
              f"times, lost {stats.lease_conflicts} races")
        for ms in members.values():
            for m in ms:
                m.api.close()


async def bench(workers: int, jobs: int, compare: str, timeout_s: float) -> int:
    def log(msg: str) -> None:
        print(f"[workers] {msg}", file=sys.stderr, flush=True)

    if compare:
        counts = [int(x) for x in compare.split(",") if x.strip()]
        outcomes = [await run_fleet(n, jobs, log, timeout_s) for n in counts]
        for o in outcomes:
            report(o)
        ok = all(o.succeeded == o.jobs for o in outcomes)
        if len(outcomes) >= 2:
            print(result_line(f"workers{counts[-1]}v{counts[0]}",
                              outcomes[-1].rate / outcomes[0].rate, 1.0))
        return 0 if ok else 1
    o = await run_fleet(workers, jobs, log, timeout_s)
    report(o)
    print(result_line("workersburst", o.succeeded / o.jobs, 1.0))
    return 0 if o.succeeded == o.jobs else 1


app = bench_app()


@app.command(help=help_text(__doc__))
def command(
    workers: int = typer.Option(12, "--workers", min=1, help="worker processes"),
    jobs: int = typer.Option(2000, "--jobs", min=1, help="jobs submitted at once"),
    compare: str = typer.Option(
        "", "--compare", help="worker counts to compare, e.g. 1,2 (a fresh stack each)"),
    timeout: float = typer.Option(900.0, "--timeout", help="seconds for all jobs to finish"),
    bind_cost_binds: int = typer.Option(
        0, "--bind-cost", min=0,
        help="instead: time this many guarded vs plain binds on one emulated member"),
) -> None:
    if bind_cost_binds:
        bind_cost(bind_cost_binds, workers)
        raise typer.Exit(0)
    raise typer.Exit(run_main(bench(workers, jobs, compare, timeout)))


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(app, argv, "fleetq bench workers")


if __name__ == "__main__":
    sys.exit(main())
