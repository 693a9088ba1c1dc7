"""Benchmark: the real stack against its own ideal schedule on a workload trace (issue 19).

A ``fleetq sim replay`` trace runs, time-scaled, through the real stack (Temporal dev
server, emulator, in-process worker) and through the simulator on the same run times;
time to admission per class, quota usage (as Kueue's performance tests define it),
makespan and the stack's cost are printed side by side. Method: BENCHMARKS.md "Bench
methods"; figures: §8.

Run: ``fleetq bench trace --trace examples/traces/kueue-like-3k.yaml --time-scale 10``.
Last lines: ``RESULT traceusage <real / simulated usage> (target 0.8)``, ``RESULT
tracemakespan <simulated / real makespan> (target 0.67)`` and ``RESULT traceorder <1.00
when the classes' order by mean time to admission is the simulator's> (target 1.0)``.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import math
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from temporalio.client import Client

from bench.command import bench_app, help_text, run_command
from bench.common import (
    Phase,
    bounded_gather,
    embedded_stack,
    event_seconds,
    gang_policy,
    parked_in,
    percentile,
    quota_messages,
    real_activities,
    result_line,
    run_chain,
    run_main,
)
from bench.e2e import timings
from bench.preemption_path import victims_of
from fleetq import resources as R
from fleetq.client.apply import apply_objects
from fleetq.client.connection import until_polled
from fleetq.client.jobs import start_job
from fleetq.member_contract import RUN_SECONDS_ANNOTATION
from fleetq.messages import JobView
from fleetq.models import (
    QUEUE_POLICY_ANNOTATION,
    STARVATION_ANNOTATION,
    PyTorchJob,
    parse_job,
    parse_policy,
    parse_tree,
)
from fleetq.naming import job_workflow_id, quota_workflow_id
from fleetq.preemption import GRACE_ANNOTATION
from fleetq.simulator import Trace, TraceError, load_trace
from fleetq.simulator.engine import Simulation
from fleetq.simulator.series import stats
from fleetq.simulator.trace import JobGroupSpec, RunRange
from fleetq.testing.history import grants_in
from worker import build_worker

TARGET_USAGE = 0.8
#: real makespan at most 1.5x the simulated one: simulated / real >= 1 / 1.5
TARGET_MAKESPAN = round(1 / 1.5, 2)
TARGET_ORDER = 1.0
#: the first job is submitted this long after the stack is ready (its start is timed)
LEAD_SECONDS = 1.0


class TraceBenchError(Exception):
    """A trace this benchmark cannot replay on the real stack (one line)."""


# ---------------------------------------------------------------------- the trace


def scaled(trace: Trace, factor: float) -> Trace:
    """``trace`` with every duration divided by ``factor``: group starts, intervals and
    run seconds, the starvation bound and ``fleetq.io/preemption-grace-seconds`` (an
    integer annotation: rounded, at least 1; written on every job when the tree
    preempts, so the real jobs' grace is the simulated one). Run times drawn from
    ``{min, max}`` are drawn from the scaled range with the same seed, so each job keeps
    its draw / ``factor`` (to the engine's millisecond rounding)."""
    if not (math.isfinite(factor) and factor > 0):
        raise TraceBenchError(f"time scale must be a finite number > 0, got {factor!r}")

    preempting = trace.tree is not None and trace.preemption.enabled
    jobs = [trace.job_policy(gid) for gid in range(len(trace.spec.jobs))]
    if preempting:
        jobs = [dataclasses.replace(p, grace_seconds=max(1, round(p.grace_seconds / factor)))
                for p in jobs]

    def group(gid: int, g: JobGroupSpec) -> JobGroupSpec:
        run = g.runSeconds
        run = (RunRange(min=run.min / factor, max=run.max / factor)
               if isinstance(run, RunRange) else run / factor)
        notes = dict(g.annotations)
        if preempting:  # the real job reads its grace period from here
            notes[GRACE_ANNOTATION] = str(jobs[gid].grace_seconds)
        return g.model_copy(update={"start": g.start / factor, "interval": g.interval / factor,
                                    "runSeconds": run, "annotations": notes})

    spec = trace.spec.model_copy(update={
        "jobs": [group(gid, g) for gid, g in enumerate(trace.spec.jobs)],
        "starvationSeconds": trace.spec.starvationSeconds / factor,
    })
    return dataclasses.replace(trace, spec=spec, jobs=jobs)


@dataclass(frozen=True)
class PlannedJob:
    """One job of the trace as both runs see it: when it is submitted (seconds after the
    first submission) and how long its pods run."""

    gid: int
    namespace: str
    name: str
    job_class: str
    offset: float
    run: float
    cpu: float  # cores of its quota request

    @property
    def workflow_id(self) -> str:
        return job_workflow_id(self.namespace, self.name)


def job_class(g: JobGroupSpec) -> str:
    """The class a group's jobs are reported under: its ``jobClass``, else its name."""
    return g.jobClass or g.name


def planned_jobs(sim: Simulation) -> list[PlannedJob]:
    """Every job the (finished) simulation submitted, in submission order, with the run
    time the simulator drew for it: the real stack runs exactly these."""
    out = []
    for job in sim.all_jobs:
        g = sim.trace.spec.jobs[job.gid]
        _kind, namespace, name = job.id.split("/", 2)
        out.append(PlannedJob(job.gid, namespace, name, job_class(g), job.submitted - sim.t0,
                              job.run, sim.requests[job.gid].get(R.CPU, 0) / R.MILLI))
    return out


def leaf_min_cpu(sim: Simulation) -> float:
    """The sum of the quota tree's leaves' ``min`` cpu (cores): usage's denominator."""
    return sum(n.min.get(R.CPU, 0) for n in sim.admission.quota if not n.children) / R.MILLI


def check_replayable(trace: Trace) -> None:
    """What the real stack cannot take from a trace, refused in one line."""
    if trace.tree is None:
        raise TraceBenchError("the trace has no quota tree: there is no admission to measure")
    for i, g in enumerate(trace.spec.jobs):
        if g.clusterAffinity is not None:
            raise TraceBenchError(
                f"jobs[{i}] ({g.name}) has a clusterAffinity: the real stack takes it from a "
                "PropagationPolicy per namespace, which this benchmark does not write")


# ---------------------------------------------------------------------- manifests


def job_manifest(g: JobGroupSpec, job: PlannedJob) -> dict[str, Any]:
    """The PyTorchJob a trace job stands for (the simulator's gang: ``master`` + ``workers``
    pods of ``requests`` at ``priority``), running ``job.run`` seconds on the emulator."""
    requests = {k: str(v) for k, v in g.requests.items()}
    pod: dict[str, Any] = {
        "containers": [{"name": "pytorch", "image": "busybox",
                        "command": ["sleep", f"{job.run:g}"],
                        "resources": {"requests": requests}}],
        "priority": g.priority,
    }
    if g.nodeSelector:
        pod["nodeSelector"] = dict(g.nodeSelector)
    if g.tolerations:
        pod["tolerations"] = [t.model_dump(exclude_none=True) for t in g.tolerations]
    replicas: dict[str, Any] = {
        "Master": {"replicas": g.master, "restartPolicy": "Never",
                   "template": {"spec": pod}}}
    if g.workers:
        replicas["Worker"] = {"replicas": g.workers, "restartPolicy": "OnFailure",
                              "template": {"spec": copy.deepcopy(pod)}}
    annotations = {**g.annotations, RUN_SECONDS_ANNOTATION: f"{job.run:g}"}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": job.name, "namespace": job.namespace,
                         "annotations": annotations},
            "spec": {"pytorchReplicaSpecs": replicas}}


def tree_manifest(trace: Trace) -> dict[str, Any]:
    """The trace's quota tree as applied, with its queue policy and (scaled) starvation
    bound as the annotations the quota workflow reads."""
    assert trace.spec.quota is not None
    doc = copy.deepcopy(trace.spec.quota)
    meta = doc.setdefault("metadata", {})
    meta.setdefault("annotations", {})
    meta["annotations"][QUEUE_POLICY_ANNOTATION] = trace.policy.value
    meta["annotations"][STARVATION_ANNOTATION] = f"{trace.spec.starvationSeconds:g}"
    return doc


def policy_manifest(namespace: str) -> dict[str, Any]:
    """A PropagationPolicy for the trace's jobs in ``namespace``: queued through the quota
    tree, one gang on one member cluster (as the walkthrough's)."""
    return gang_policy("trace-policy", namespace, queued=True)


# ---------------------------------------------------------------------- figures


def time_averaged(changes: Iterable[tuple[float, float]], start: float, end: float) -> float:
    """The time average over [start, end] of a quantity that changes by ``delta`` at
    ``t`` for each ``(t, delta)`` (zero before the first change; changes before
    ``start`` count from ``start``)."""
    if end <= start:
        return math.nan
    level = area = 0.0
    last = start
    for t, delta in sorted(changes):
        t = min(max(t, start), end)
        area += level * (t - last)
        level += delta
        last = t
    area += level * (end - last)
    return area / (end - start)


def class_order(means: dict[str, float]) -> list[str]:
    """Classes by mean time to admission, shortest first (ties by name)."""
    return sorted(means, key=lambda c: (means[c], c))


@dataclass
class RunFigures:
    """What one run (simulated or real) measured, in wall (scaled) seconds."""

    admission: dict[str, list[float]]  # class -> each job's time to admission
    usage: float  # time-averaged admitted cpu / sum of leaf min cpu
    makespan: float
    jobs: int
    stages: dict[str, list[float]] = dataclasses.field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.jobs / self.makespan if self.makespan > 0 else math.nan

    def means(self) -> dict[str, float]:
        return {c: float(stats(v)["mean"] or math.nan) for c, v in self.admission.items()}


def simulated_figures(sim: Simulation, summary: dict[str, Any], plan: Sequence[PlannedJob],
                      min_cpu: float) -> RunFigures:
    """The simulator's figures: its jobs' last-run times to admission, and usage from
    each job's [admitted, finished] (quota is held from the grant to the release)."""
    admission: dict[str, list[float]] = {}
    changes: list[tuple[float, float]] = []
    for job, p in zip(sim.all_jobs, plan, strict=True):
        if job.admitted is not None:
            admission.setdefault(p.job_class, []).append(job.admitted - job.submitted)
            if job.started is not None:
                changes += [(job.admitted, p.cpu), (job.started + job.run, -p.cpu)]
    end = sim.t0 + summary["makespan"]
    usage = time_averaged(changes, sim.t0, end) / min_cpu
    return RunFigures(admission, usage, summary["makespan"], len(plan))


def simulate(trace: Trace) -> tuple[Simulation, dict[str, Any]]:
    """Run the simulator on ``trace``; the engine (for its jobs) and its summary."""
    sim = Simulation(trace, None)
    return sim, sim.run().summary_data


def admitted_at(view: JobView) -> float | None:
    """When the job's workflow took its (last) grant: its ``Admitted`` event."""
    times = [e.time.timestamp() for e in view.events if e.reason == "Admitted"]
    return max(times) if times else None


def admission_time(view: JobView, granted: Sequence[float] | None) -> float | None:
    """When the job took its (last) grant: its ``Admitted`` event, or, when that event
    is older, when the quota workflow wrote the grant down (a job cannot hold a grant
    before it was made; ``real_figures``)."""
    at = admitted_at(view)
    if at is None or not granted:
        return at
    return max(at, max(granted))


@dataclass
class Holdings:
    """What the quota workflow's history says each job held: ``(t, ±cpu)`` changes, and
    when each job's grant was sent and its release taken (a job preempted and admitted
    again has several)."""

    changes: list[tuple[float, float]]
    granted: dict[str, list[float]]
    released: dict[str, list[float]]
    #: when the quota workflow applied each job's first ``enqueue``
    enqueued: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def last_release(self) -> float | None:
        return max((t for ts in self.released.values() for t in ts), default=None)


def quota_holdings(events: Sequence[Any], cpu: dict[str, float]) -> Holdings:
    """From the quota workflow's history: each grant it sent (``+cpu``; by signal or in a
    ``submit`` update's reply) and each release or requeue it took, or victim it purged
    and parked itself (``-cpu``; one of a job that holds nothing changes nothing)."""
    out = Holdings([], {}, {})
    held: set[str] = set()
    #: jobs parked in the current workflow task before the reader saw their grant: one
    #: granted in the ``submit`` pass and chosen as a victim in that pass, whose grant
    #: the update's completion, written after the purge's marker, lists
    parked_first: set[str] = set()
    for ev in events:
        t = event_seconds(ev)
        if ev.HasField("workflow_task_completed_event_attributes"):
            parked_first.clear()
        for job in grants_in(ev):
            if job in cpu and job not in held:
                out.granted.setdefault(job, []).append(t)
                if job in parked_first:  # granted, then parked, in one task
                    parked_first.discard(job)
                    out.released.setdefault(job, []).append(t)
                    continue
                held.add(job)
                out.changes.append((t, cpu[job]))
        for job in parked_in(ev):  # purged and parked by the quota workflow itself
            if job in held:
                held.discard(job)
                out.changes.append((t, -cpu[job]))
                out.released.setdefault(job, []).append(t)
            else:
                parked_first.add(job)
        for _ev, m in quota_messages([ev]):
            # a preempted job's requeue gives its quota back as a release does (and it
            # is granted again later): without it a victim counted as holding from its
            # first grant to its last release, and usage came out above 1
            job = m.subject()
            if m.signal == "enqueue":
                out.enqueued.setdefault(job, t)
            if m.signal in ("release", "requeue") and job in held:
                held.discard(job)
                out.changes.append((t, -cpu[job]))
                out.released.setdefault(job, []).append(t)
    return out


def stages(views: dict[str, JobView], plan: Sequence[PlannedJob], wall0: float,
           holdings: Holdings) -> dict[str, list[float]]:
    """Where each job's time went between its trace time and its quota's release, from
    the quota workflow's history and the job's own record (jobs run once: a preempted
    job's later runs are not split out)."""
    out: dict[str, list[float]] = {}

    def add(key: str, start: float | None, end: float | None, less: float = 0.0) -> None:
        if start is not None and end is not None:
            out.setdefault(key, []).append(end - start - less)

    for job in plan:
        view = views[job.workflow_id]
        granted = holdings.granted.get(job.workflow_id, [None])[-1]
        released = holdings.released.get(job.workflow_id, [None])[-1]
        admitted = admitted_at(view)
        bound = view.bound_at.timestamp() if view.bound_at else None
        finished = view.finished_at.timestamp() if view.finished_at else None
        add("trace time -> grant sent", wall0 + job.offset, granted)
        add("grant sent -> Admitted", granted, admitted)
        add("Admitted -> bound", admitted, bound)
        add("bound -> finished, less run time", bound, finished, job.run)
        add("finished -> release taken", finished, released)
    return out


# ---------------------------------------------------------------------- the real run


@dataclass
class RealRun:
    views: dict[str, JobView]
    submitted: dict[str, float]  # actual start_job call, wall time
    wall0: float  # wall time of trace offset 0
    phase: Phase
    quota_events: list[Any]
    quota_runs: list[int]
    #: each member adapter's bind counters as the worker kept them (``bind_stats``:
    #: guarded binds, lease waits, time), by cluster; empty if the adapter keeps none
    binds: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    #: the preempted jobs' histories (current run), when asked for
    victim_events: dict[str, list[Any]] = dataclasses.field(default_factory=dict)
    #: the worker's fleet registry reads: queries, and describes that found it unchanged
    registry_reads: tuple[int, int] = (0, 0)
    #: the worker's purges and quota messages, one line each (``worker_lines``)
    worker: list[str] = dataclasses.field(default_factory=list)


def bind_counters(fleet: Any) -> dict[str, dict[str, Any]]:
    """The in-process worker's per-member bind counters (read, never required: the
    adapter's counters are its own business and may change)."""
    out: dict[str, dict[str, Any]] = {}
    for member in getattr(fleet, "_members", []):
        stats = getattr(member, "bind_stats", None)
        if stats is not None:
            out[str(getattr(member, "name", "?"))] = dict(vars(stats))
    return out


async def submit_on_time(client: Client, plan: Sequence[PlannedJob],
                         prepared: dict[str, tuple[PyTorchJob, dict[str, Any]]],
                         wall0: float, concurrency: int) -> dict[str, float]:
    """Start each job at ``wall0 + offset`` (at most ``concurrency`` start calls in
    flight); the wall time each start call was made."""
    sem = asyncio.Semaphore(max(1, concurrency))
    submitted: dict[str, float] = {}

    async def start(job: PlannedJob) -> None:
        try:
            model, manifest = prepared[job.workflow_id]
            submitted[job.workflow_id] = time.time()
            await start_job(client, model, manifest)
        finally:
            sem.release()

    tasks = []
    for job in sorted(plan, key=lambda j: j.offset):
        delay = wall0 + job.offset - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        await sem.acquire()
        tasks.append(asyncio.create_task(start(job)))
    await asyncio.gather(*tasks)
    return submitted


async def wait_all(client: Client, plan: Sequence[PlannedJob], timeout: float
                   ) -> dict[str, JobView]:
    """Every job's final view (its workflow's result), waiting at most ``timeout``."""

    def waiter(wid: str) -> Callable[[], Any]:
        async def one() -> tuple[str, JobView]:
            handle = client.get_workflow_handle(wid, result_type=JobView)
            return wid, await handle.result()
        return one

    got = await asyncio.wait_for(
        bounded_gather([waiter(j.workflow_id) for j in plan], 64), timeout)
    return dict(got)


async def run_real(trace: Trace, plan: Sequence[PlannedJob], args: Options,
                   say: Callable[[str], None], *, victim_histories: bool = False) -> RealRun:
    """Replay ``plan`` through the real stack; with ``victim_histories``, keep the
    history of every job the quota workflow preempted (``bench.preemption_path``)."""
    topology = trace.topology.model_dump(mode="json", exclude_none=True)
    tree = tree_manifest(trace)
    namespaces = sorted({j.namespace for j in plan})
    groups = trace.spec.jobs
    prepared = {}
    for job in plan:
        manifest = job_manifest(groups[job.gid], job)
        prepared[job.workflow_id] = (parse_job(manifest), manifest)
    last_offset = max((j.offset for j in plan), default=0.0)
    async with embedded_stack(topology, progress=say) as stack:
        client = stack.client
        acts = real_activities(client, stack.fleet_config)
        worker = build_worker(client, acts,
                              max_concurrent_activities=args.activity_slots)
        try:
            async with worker:
                await until_polled(client)  # the in-process worker polls both queues
                objects: list[tuple[Any, dict[str, Any]]] = [(parse_tree(tree), tree)]
                for ns in namespaces:
                    pol = policy_manifest(ns)
                    objects.append((parse_policy(pol), pol))
                for applied in await apply_objects(client, objects):
                    if not applied.ok:
                        raise TraceBenchError(f"apply refused: {applied.line}")
                say(f"applied {tree['metadata']['name']} and {len(namespaces)} "
                    f"PropagationPolicies; replaying {len(plan)} jobs over "
                    f"{last_offset:.0f} s")
                phase = Phase("replay", others=stack.pids).start()
                wall0 = time.time() + LEAD_SECONDS
                submitted = await submit_on_time(client, plan, prepared, wall0,
                                                 args.concurrency)
                say(f"all {len(plan)} jobs submitted; waiting for them to finish")
                views = await wait_all(client, plan, args.timeout)
                phase.stop(len(plan))
                qid = quota_workflow_id(tree["metadata"].get("namespace", "kube-system"),
                                        tree["metadata"]["name"])
                desc = await client.get_workflow_handle(qid).describe()
                first = desc.raw_description.workflow_execution_info.first_run_id or None
                runs, events = await run_chain(client, qid, first, keep_events=True)
                binds = bind_counters(acts._fleet)
                victims = (await fetch_histories(client, sorted(victims_of(events)))
                           if victim_histories else {})
        finally:
            if acts._fleet is not None:
                acts._fleet.close()
    return RealRun(views, submitted, wall0, phase, events, [r.events for r in runs], binds,
                   victims, (acts.registry_queries, acts.registry_checks),
                   worker_lines(acts))


def worker_lines(acts: Any) -> list[str]:
    """What the in-process worker's purges and quota messages took: purges and their
    mean wall time over every member; quota updates, the messages they carried, the
    mean wait of a message for an update in flight and an update's mean answer time.
    (Read, never required: the adapters' and outbox's counters are their own.)"""
    out: list[str] = []
    stats = [getattr(m, "purge_stats", None) for m in getattr(acts._fleet, "_members", [])]
    purges = sum(s.purges for s in stats if s is not None)
    if purges:
        seconds = sum(s.seconds for s in stats if s is not None)
        out.append(f"purges {purges}, mean {seconds / purges * 1000:.0f} ms")
    box = getattr(acts, "_outbox", None)
    if box is not None and box.updates_sent and box.messages_sent:
        waited = box.waited / box.messages_sent * 1000
        answered = box.answering / box.updates_sent * 1000
        out.append(f"quota updates {box.updates_sent} carrying {box.messages_sent} messages; "
                   f"a message waited for an update in flight {waited:.0f} ms, an update "
                   f"was answered in {answered:.0f} ms (means)")
    return out


async def fetch_histories(client: Client, workflow_ids: Sequence[str],
                          concurrency: int = 16) -> dict[str, list[Any]]:
    """The current run's history events of each workflow, ``concurrency`` reads at once."""
    gate = asyncio.Semaphore(concurrency)

    async def one(wid: str) -> tuple[str, list[Any]]:
        async with gate:
            return wid, list((await client.get_workflow_handle(wid).fetch_history()).events)

    return dict(await asyncio.gather(*(one(w) for w in workflow_ids)))


def real_figures(real: RealRun, plan: Sequence[PlannedJob], min_cpu: float,
                 holdings: Holdings | None = None) -> RunFigures:
    """The real run's figures: time to admission from each job's ``Admitted`` event,
    usage from the quota workflow's grants and releases, makespan to the last release.

    A job that learns its grant from its enqueue's reply records ``Admitted`` at its
    workflow task's start (workflow time stands still while a local activity runs), before
    the quota workflow's task that granted it was even complete: its admission is then
    taken when that grant was written down (``admission_time``), never earlier.
    ``holdings``: the quota history's, when the caller read them already."""
    if holdings is None:
        holdings = quota_holdings(real.quota_events, {j.workflow_id: j.cpu for j in plan})
    admission: dict[str, list[float]] = {}
    for job in plan:
        at = admission_time(real.views[job.workflow_id], holdings.granted.get(job.workflow_id))
        if at is not None:
            admission.setdefault(job.job_class, []).append(at - (real.wall0 + job.offset))
    last = holdings.last_release
    end = last if last is not None else real.wall0
    makespan = end - real.wall0
    usage = time_averaged(holdings.changes, real.wall0, end) / min_cpu
    return RunFigures(admission, usage, makespan, len(plan),
                      stages(real.views, plan, real.wall0, holdings))


# ---------------------------------------------------------------------- report


@dataclass(frozen=True)
class Comparison:
    """The three verdicts: real / simulated usage, simulated / real makespan, and the
    classes' order by mean time to admission in each run."""

    usage: float
    makespan: float
    sim_order: list[str]
    real_order: list[str]

    @property
    def order_preserved(self) -> bool:
        return self.sim_order == self.real_order


def compare(sim: RunFigures, real: RunFigures) -> Comparison:
    return Comparison(
        real.usage / sim.usage if sim.usage else math.nan,
        sim.makespan / real.makespan if real.makespan > 0 else math.nan,
        class_order(sim.means()),
        class_order(real.means()),
    )


def _s(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"


def print_report(path: str, args: Options, trace: Trace, sim: RunFigures,
                 real: RunFigures, run: RealRun, plan: Sequence[PlannedJob],
                 min_cpu: float) -> list[str]:
    """Print the comparison; returns the errors (jobs that did not succeed)."""
    print()
    print(f"trace {path}: {len(plan)} jobs in {len(trace.spec.jobs)} groups, time scale "
          f"{args.time_scale:g} (all times below in scaled seconds: x {args.time_scale:g} "
          f"for trace time)")
    print(run.phase.line("jobs"))
    lag = [run.submitted[j.workflow_id] - (run.wall0 + j.offset) for j in plan]
    print(f"submit lag (start call - trace time): p50 {percentile(lag, 50):.2f} s, "
          f"p99 {percentile(lag, 99):.2f} s, max {max(lag, default=math.nan):.2f} s")
    print(f"{'class':<12} {'jobs':>6} {'sim mean':>9} {'sim p99':>9} {'real mean':>10} "
          f"{'real p99':>9}   (time to admission, s)")
    for c in sorted(set(sim.admission) | set(real.admission)):
        s, r = stats(sim.admission.get(c, [])), stats(real.admission.get(c, []))
        print(f"{c:<12} {len([j for j in plan if j.job_class == c]):>6} {_s(s['mean']):>9} "
              f"{_s(s['p99']):>9} {_s(r['mean']):>10} {_s(r['p99']):>9}")
    print(f"quota usage (time-averaged admitted cpu / sum of leaf min {min_cpu:g} cpu): "
          f"simulated {sim.usage:.3f}, real {real.usage:.3f}")
    print(f"makespan: simulated {sim.makespan:.1f} s, real {real.makespan:.1f} s; jobs/s: "
          f"simulated {sim.rate:.2f}, real {real.rate:.2f}")
    print("real job stages, s (mean/p50/p99/max): " + "; ".join(
        f"{k} {sum(v) / len(v):.2f}/{percentile(v, 50):.2f}/{percentile(v, 99):.2f}/"
        f"{max(v):.2f}" for k, v in real.stages.items() if v))
    timing = timings(run.quota_events)
    parts = [f"{k} {sum(v) / len(v) * 1000:.0f}/{percentile(v, 99) * 1000:.0f}/"
             f"{max(v) * 1000:.0f} ms" for k, v in timing.items()
             if k.startswith("workflow task") and v]
    print(f"quota workflow: {len(run.quota_runs)} run(s), events {run.quota_runs}; "
          f"mean/p99/max: {', '.join(parts)}")
    for cluster, counters in sorted(run.binds.items()):
        print(f"binds on {cluster}: " + ", ".join(
            f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
            for k, v in counters.items()))
    states: dict[str, int] = {}
    for v in run.views.values():
        states[v.state] = states.get(v.state, 0) + 1
    print(f"job states: {states}")
    verdict = compare(sim, real)
    print(f"class order by mean time to admission: simulated {' < '.join(verdict.sim_order)}"
          f"; real {' < '.join(verdict.real_order)}; preserved: "
          f"{'yes' if verdict.order_preserved else 'no'}")
    print(result_line("traceusage", verdict.usage, TARGET_USAGE))
    print(result_line("tracemakespan", verdict.makespan, TARGET_MAKESPAN))
    print(result_line("traceorder", 1.0 if verdict.order_preserved else 0.0, TARGET_ORDER))
    ok = states.get("Succeeded", 0)
    return [] if ok == len(plan) else [f"only {ok} of {len(plan)} jobs succeeded"]


async def run(args: Options) -> int:
    def say(msg: str) -> None:
        print(msg, flush=True)

    try:
        original = load_trace(args.trace)
        check_replayable(original)
        trace = scaled(original, args.time_scale)
    except (TraceError, TraceBenchError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sim_engine, summary = simulate(trace)
    plan = planned_jobs(sim_engine)
    min_cpu = leaf_min_cpu(sim_engine)
    if min_cpu <= 0:
        print("error: the quota tree's leaves have no min cpu: usage is undefined",
              file=sys.stderr)
        return 2
    sim = simulated_figures(sim_engine, summary, plan, min_cpu)
    say(f"simulated {len(plan)} jobs: makespan {sim.makespan:.1f} s (scaled), usage "
        f"{sim.usage:.3f}")
    try:
        real_run = await run_real(trace, plan, args, say)
    except TraceBenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    real = real_figures(real_run, plan, min_cpu)
    errors = print_report(args.trace, args, trace, sim, real, real_run, plan, min_cpu)
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    return 1 if errors else 0


@dataclass(frozen=True)
class Options:
    """``fleetq bench trace``'s options as parsed."""

    trace: str
    time_scale: float
    concurrency: int
    activity_slots: int
    timeout: float


app = bench_app()


@app.command(help=help_text(__doc__))
def command(
    trace: Path = typer.Option(..., "--trace", help="a trace file, as fleetq sim replay's"),
    time_scale: float = typer.Option(
        10.0, "--time-scale", min=0.001,
        help="divide every time of the trace by this (both runs)"),
    concurrency: int = typer.Option(
        32, "--concurrency", min=1, help="job start calls in flight at once, at most"),
    activity_slots: int = typer.Option(
        200, "--activity-slots", min=1,
        help="the worker's activity slots (and threads); 200 is worker.py's"),
    timeout: float = typer.Option(
        3600.0, "--timeout", min=1.0,
        help="seconds to wait for the jobs after the last one was submitted"),
) -> None:
    raise typer.Exit(run_main(run(Options(str(trace), time_scale, concurrency,
                                          activity_slots, timeout))))


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(app, argv, "fleetq bench trace")


if __name__ == "__main__":
    raise SystemExit(main())
