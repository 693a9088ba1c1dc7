"""Benchmark: end-to-end job throughput against the engine's own ceiling.

N small PyTorchJobs through the whole pipeline on the embedded stack (apply → queue →
admit → reserve → bind → Succeeded → release), against N plain workflows running as many
no-op activities as one job ran, in the same run. The ratio is jobs/s ÷ baseline
workflows/s (target 0.7); "same mix" and "strict" baselines are printed beside it.
Method: BENCHMARKS.md "Bench methods"; figures: §1.

Run: ``fleetq bench e2e [--jobs 500] [--concurrency 50]``.
Last line: ``RESULT e2e <ratio> (target 0.7)``.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import typer
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner

from bench.baseline import ActivityChain, ActivityMix, bench_noop
from bench.command import bench_app, help_text, run_command
from bench.common import (
    Phase,
    RunStats,
    Stack,
    embedded_stack,
    event_seconds,
    gang_policy,
    one_leaf_quota_tree,
    payload_bytes,
    percentile,
    proc_cpu_seconds,
    quota_messages,
    real_activities,
    result_line,
    run_chain,
    run_main,
    temporal_option,
)
from fleetq.client.apply import apply_objects
from fleetq.client.connection import until_polled
from fleetq.client.jobs import start_job
from fleetq.messages import JobView
from fleetq.models import parse_job, parse_policy, parse_tree
from fleetq.naming import TASK_QUEUE, job_workflow_id, quota_workflow_id
from fleetq.runtime.embedded import TemporalKind
from fleetq.testing.history import grants_in, grants_received, local_activity_type
from worker import build_worker, workflow_runner

#: the baselines' module, passed through the sandbox as the job workflows' package is
BASELINE_MODULE = ActivityChain.__module__

T = TypeVar("T")
TARGET = 0.7
NAMESPACE = "bench"
RESERVATION_CLUSTER = "bench-res"


def topology(nodes: int = 60) -> dict[str, Any]:
    """Three members with room for thousands of small pods; the reservation cluster has
    the smallest nodes, so bin-packing prefers it and jobs take the reserve path."""
    return {"clusters": [
        {"name": "hub", "member": False, "labels": {"role": "hub"}},
        {"name": RESERVATION_CLUSTER, "reservation": True, "labels": {"region": "east"},
         "nodeGroups": [{"count": nodes, "cpu": "16", "memory": "64Gi", "pods": 110}]},
        {"name": "bench-b", "labels": {"region": "west"},
         "nodeGroups": [{"count": nodes // 2, "cpu": "32", "memory": "128Gi", "pods": 110}]},
        {"name": "bench-c", "labels": {"region": "east"},
         "nodeGroups": [{"count": nodes // 2, "cpu": "64", "memory": "256Gi", "pods": 110}]},
    ]}


def quota_tree(max_jobs: int) -> dict[str, Any]:
    return one_leaf_quota_tree("bench", NAMESPACE, {
        "cpu": 100000, "memory": "100000Gi", "nvidia.com/gpu": 10000,
        "kube-queue/max-jobs": max_jobs})


def queued_policy() -> dict[str, Any]:
    return gang_policy("bench-policy", NAMESPACE, queued=True)


def small_job(name: str) -> dict[str, Any]:
    def replica(restart: str) -> dict[str, Any]:
        return {"replicas": 1, "restartPolicy": restart, "template": {"spec": {"containers": [
            {"name": "pytorch", "image": "busybox", "command": ["sleep", "1"],
             "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]}}}

    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"pytorchReplicaSpecs": {"Master": replica("Never"),
                                             "Worker": replica("OnFailure")}}}


# ---------------------------------------------------------------------- phases


async def submit_then_wait(names: Sequence[str], concurrency: int,
                           start: Callable[[str], Awaitable[None]],
                           wait: Callable[[str], Awaitable[T]]) -> list[T]:
    """Start every item with at most ``concurrency`` start calls in flight, each waited
    for as soon as it is started; results in order (the same for jobs and baseline)."""
    sem = asyncio.Semaphore(max(1, concurrency))

    async def one(name: str) -> T:
        async with sem:
            await start(name)
        return await wait(name)

    return list(await asyncio.gather(*(one(n) for n in names)))


async def run_jobs(client: Client, names: Sequence[str], concurrency: int,
                   run_seconds: int) -> tuple[list[JobView], list[float]]:
    """Submit jobs as ``fleetq apply`` does and wait for all; returns the final views and
    each job's submit wall time."""
    submitted: dict[str, float] = {}

    async def start(name: str) -> None:
        manifest = small_job(name)
        submitted[name] = time.time()
        await start_job(client, parse_job(manifest), manifest, run_seconds=run_seconds)

    async def wait(name: str) -> JobView:
        h = client.get_workflow_handle(job_workflow_id(NAMESPACE, name), result_type=JobView)
        view: JobView = await h.result()
        return view

    views = await submit_then_wait(names, concurrency, start, wait)
    return views, [submitted[n] for n in names]


def activity_counts(n: int, mean: float) -> list[int]:
    """``n`` whole activity counts whose mean is ``mean`` to within 1/n (floor and ceiling
    interleaved): rounding the mean instead would move the baseline by up to half an
    activity per workflow, ~6 % of its time, in either direction."""
    total = max(n, round(mean * n))
    return [(i + 1) * total // n - i * total // n for i in range(n)]


async def run_baseline(client: Client, n: int, activities: float, concurrency: int,
                       prefix: str = "bench-chain", local: float | None = None) -> None:
    """``n`` workflows of ``activities`` regular no-op activities each (exact mean), or,
    with ``local``, of ``local`` local and ``activities`` regular ones."""
    ids = [f"{prefix}-{i:05d}" for i in range(n)]
    counts = dict(zip(ids, activity_counts(n, activities), strict=True))
    locals_ = dict(zip(ids, activity_counts(n, local), strict=True)) if local else {}

    async def start(wid: str) -> None:
        if local is None:
            await client.start_workflow(ActivityChain.run, counts[wid], id=wid,
                                        task_queue=TASK_QUEUE)
        else:
            await client.start_workflow(ActivityMix.run, [locals_.get(wid, 0), counts[wid]],
                                        id=wid, task_queue=TASK_QUEUE)

    async def wait(wid: str) -> int:
        got: int = await client.get_workflow_handle(wid, result_type=int).result()
        return got

    await submit_then_wait(list(counts), concurrency, start, wait)


def payload_stats(msg: Any) -> tuple[int, int]:
    """Every ``Payload`` anywhere in a history event (inputs, results, marker details,
    search attributes, memo, headers, summaries): how many and their bytes (data plus
    metadata), i.e. what the worker's payload converter encoded or decoded for it."""
    count = size = 0
    if msg.DESCRIPTOR.full_name == "temporal.api.common.v1.Payload":
        return 1, len(msg.data) + sum(len(k) + len(v) for k, v in msg.metadata.items())
    for field, value in msg.ListFields():
        if field.message_type is None:
            continue
        if field.message_type.GetOptions().map_entry:
            values = list(value.values())
            if not values or not hasattr(values[0], "DESCRIPTOR"):
                continue
        elif field.is_repeated:
            values = list(value)
        else:
            values = [value]
        for v in values:
            c, b = payload_stats(v)
            count, size = count + c, size + b
    return count, size


def timings(events: Sequence[Any]) -> dict[str, list[float]]:
    """Where one job's time goes, from its history: per activity type the queueing
    (scheduled → started) and running (started → completed) time, workflow tasks the
    same way, and the wait for the quota grant (start of the task that sent the enqueue →
    admitted received)."""
    clock = _HistoryClock()
    for ev in events:
        on_event = _CLOCK_EVENTS.get(ev.WhichOneof("attributes") or "")
        if on_event is not None:
            on_event(clock, ev)
    return clock.out


class _HistoryClock:
    """The state :func:`timings` keeps while reading a history: the durations so far,
    when each activity or workflow task was scheduled and started, and when the
    enqueue was sent."""

    def __init__(self) -> None:
        self.out: dict[str, list[float]] = {}
        self.scheduled: dict[int, tuple[str, float]] = {}
        self.started: dict[int, float] = {}
        self.enqueued: float | None = None
        self.last_task_started = 0.0

    def add(self, key: str, value: float) -> None:
        self.out.setdefault(key, []).append(value)

    def activity_scheduled(self, ev: Any) -> None:
        name = ev.activity_task_scheduled_event_attributes.activity_type.name
        self.scheduled[ev.event_id] = (name, event_seconds(ev))

    def activity_started(self, ev: Any) -> None:
        sid = ev.activity_task_started_event_attributes.scheduled_event_id
        name, t0 = self.scheduled[sid]
        self.started[sid] = event_seconds(ev)
        self.add(f"{name} queued", event_seconds(ev) - t0)

    def activity_completed(self, ev: Any) -> None:
        sid = ev.activity_task_completed_event_attributes.scheduled_event_id
        name, t0 = self.scheduled[sid]
        self.add(f"{name} ran", event_seconds(ev) - self.started.get(sid, t0))

    def workflow_task_scheduled(self, ev: Any) -> None:
        self.scheduled[ev.event_id] = ("workflow task", event_seconds(ev))

    def workflow_task_started(self, ev: Any) -> None:
        sid = ev.workflow_task_started_event_attributes.scheduled_event_id
        self.started[sid] = self.last_task_started = event_seconds(ev)
        self.add("workflow task queued", event_seconds(ev) - self.scheduled[sid][1])

    def workflow_task_completed(self, ev: Any) -> None:
        sid = ev.workflow_task_completed_event_attributes.scheduled_event_id
        self.add("workflow task ran", event_seconds(ev) - self.started[sid])

    def signal_sent(self, ev: Any) -> None:
        sent = ev.signal_external_workflow_execution_initiated_event_attributes
        if sent.signal_name == "enqueue":
            self.enqueued = event_seconds(ev)

    def marker_recorded(self, ev: Any) -> None:
        # the enqueue is the job's first signal_quota local activity; its marker is
        # recorded when the task completes, which can be after the grant arrived (the
        # activity waits for the quota workflow to take the message), so the wait
        # is counted from the start of the task that sent it
        if self.enqueued is None and local_activity_type(ev) == "signal_quota":
            self.enqueued = self.last_task_started
        if self.enqueued is not None and grants_received([ev]):
            # admitted at once: the grant came in the enqueue's answer
            self.add("enqueue -> admitted", event_seconds(ev) - self.enqueued)

    def signaled(self, ev: Any) -> None:
        got = ev.workflow_execution_signaled_event_attributes
        if got.signal_name == "admitted" and self.enqueued is not None:
            self.add("enqueue -> admitted", event_seconds(ev) - self.enqueued)


#: per history event attribute kind, what :func:`timings` does with it
_CLOCK_EVENTS: dict[str, Callable[[_HistoryClock, Any], None]] = {
    "activity_task_scheduled_event_attributes": _HistoryClock.activity_scheduled,
    "activity_task_started_event_attributes": _HistoryClock.activity_started,
    "activity_task_completed_event_attributes": _HistoryClock.activity_completed,
    "workflow_task_scheduled_event_attributes": _HistoryClock.workflow_task_scheduled,
    "workflow_task_started_event_attributes": _HistoryClock.workflow_task_started,
    "workflow_task_completed_event_attributes": _HistoryClock.workflow_task_completed,
    "signal_external_workflow_execution_initiated_event_attributes":
        _HistoryClock.signal_sent,
    "marker_recorded_event_attributes": _HistoryClock.marker_recorded,
    "workflow_execution_signaled_event_attributes": _HistoryClock.signaled,
}


async def job_profile(client: Client, names: Sequence[str]) -> dict[str, Any]:
    """Per-job history facts, averaged over ``names``: events, activities by type,
    signals, timers, payload sizes, and where the time went."""
    activities: Counter[str] = Counter()
    regular = 0
    kinds: Counter[str] = Counter()
    times: dict[str, list[float]] = {}
    runs = events = 0
    largest = 0
    total_payload = 0
    payloads = payloads_bytes = 0
    for name in names:
        chain, evs = await run_chain(client, job_workflow_id(NAMESPACE, name), None,
                                     keep_events=True)
        runs += len(chain)
        events += sum(r.events for r in chain)
        largest = max(largest, max(r.largest_payload for r in chain))
        for ev in evs:
            kind = ev.WhichOneof("attributes") or ""
            kinds[kind.removesuffix("_event_attributes")] += 1
            if ev.HasField("activity_task_scheduled_event_attributes"):
                activities[ev.activity_task_scheduled_event_attributes.activity_type.name] += 1
                regular += 1
            elif (local := local_activity_type(ev)) is not None:
                activities[f"{local} (local)"] += 1
            total_payload += payload_bytes(ev)
            c, b = payload_stats(ev)
            payloads, payloads_bytes = payloads + c, payloads_bytes + b
        for k, v in timings(evs).items():
            times.setdefault(k, []).extend(v)
    n = max(1, len(names))
    return {
        "jobs": len(names),
        "runs": runs / n,
        "events": events / n,
        "activities": sum(activities.values()) / n,
        "regular_activities": regular / n,
        "by_activity": {k: v / n for k, v in sorted(activities.items())},
        "by_event": {k: v / n for k, v in kinds.most_common()},
        "largest_payload": largest,
        "payload_bytes": total_payload / n,
        "payloads": payloads / n,
        "all_payload_bytes": payloads_bytes / n,
        "times": {k: (sum(v) / len(v), max(v)) for k, v in sorted(times.items())},
    }


async def quota_profile(client: Client) -> tuple[list[RunStats], dict[str, list[float]]]:
    """The quota workflow's runs and workflow-task timings over the whole benchmark."""
    wid = quota_workflow_id("kube-system", "elasticquotatree")
    desc = await client.get_workflow_handle(wid).describe()
    first = desc.raw_description.workflow_execution_info.first_run_id or None
    runs, events = await run_chain(client, wid, first, keep_events=True)
    out = timings(events)
    # inside the semaphore: enqueue received (update or signal) -> its grant sent (a
    # signal initiated by the workflow task that decided it, or the update's reply)
    received: dict[str, float] = {}
    enqueued_by: dict[int, list[str]] = {}
    for ev, m in quota_messages(events):
        if m.request is not None:
            enqueued_by.setdefault(id(ev), []).append(m.request.job_id)
    for ev in events:
        if id(ev) in enqueued_by:
            for job in enqueued_by[id(ev)]:
                received.setdefault(job, event_seconds(ev))
        for job in grants_in(ev):
            if job in received:
                out.setdefault("enqueue received -> grant sent", []).append(
                    event_seconds(ev) - received.pop(job))
    return runs, out


def print_profile(p: dict[str, Any]) -> None:
    print(f"per job (mean of {p['jobs']} histories): {p['events']:.1f} events in "
          f"{p['runs']:.1f} run(s), {p['activities']:.2f} activities, "
          f"{p['payload_bytes'] / 1024:.1f} KiB of payloads, largest "
          f"{p['largest_payload'] / 1024:.1f} KiB")
    print(f"  payloads:   {p['payloads']:.1f} per job, {p['all_payload_bytes'] / 1024:.1f} KiB "
          "(every Payload in the history: inputs, results, markers, search attributes, "
          "summaries)")
    print("  activities: " + ", ".join(f"{k} {v:.2f}" for k, v in p["by_activity"].items()))
    print("  events:     " + ", ".join(f"{k} {v:.1f}" for k, v in p["by_event"].items()))
    print("  time (mean/max s): " + ", ".join(
        f"{k} {m:.2f}/{x:.2f}" for k, (m, x) in p["times"].items()))


def temporal_cpu(phase: Phase) -> float:
    """CPU seconds of the Temporal server in a phase: the dev server's process, or every
    process of the cluster (``--temporal cluster``: its services and PostgreSQL)."""
    parts = [c for n, c in phase.other_cpu.items()
             if n == "temporal" or n.startswith("temporal-") or n == "postgres"]
    return sum(parts) if parts else math.nan


def server_cpu(stack: Stack) -> dict[str, float]:
    """CPU seconds so far of the Temporal server: the dev server's process, or each
    process of the cluster with PostgreSQL's backends counted (the per-phase lines count
    the postmaster only)."""
    cluster = stack.embedded.cluster
    if cluster is not None:
        return dict(cluster.cpu_seconds())
    return {"temporal": proc_cpu_seconds(stack.pids["temporal"])}


def per_item_ms(seconds: float, count: int) -> float:
    return seconds / count * 1000 if count else math.nan


async def run(args: Options) -> int:
    def say(msg: str) -> None:
        print(msg, flush=True)

    rounds: list[Round] = []
    async with embedded_stack(topology(), progress=say, temporal=args.temporal) as stack:
        client = stack.client
        acts = real_activities(client, stack.fleet_config)
        # the baselines' module is passed through the sandbox as the job workflows' package
        # is (SANDBOX_PASSTHROUGH), or each baseline run would pay the re-execution of its
        # module that a job's run no longer pays, and the ratio would flatter fleetq
        extra: dict[str, Any] = {"workflow_runner": workflow_runner([BASELINE_MODULE])}
        if args.unsandboxed:  # experiment: what the workflow sandbox costs
            extra["workflow_runner"] = UnsandboxedWorkflowRunner()
        worker = build_worker(client, acts, extra_workflows=[ActivityChain, ActivityMix],
                               extra_activities=[bench_noop], **extra)
        try:
            async with worker:
                await until_polled(client)  # the in-process worker polls both queues
                tree, pol = quota_tree(args.jobs * args.rounds * 10 + 1000), queued_policy()
                for line in await apply_objects(
                        client, [(parse_tree(tree), tree), (parse_policy(pol), pol)]):
                    say(line.line)
                # warm-up: caches, sandbox, connections (and warm baseline workflows)
                warm = [f"warm-{i:03d}" for i in range(args.warmup)]
                await run_jobs(client, warm, args.concurrency, args.run_seconds)
                await run_baseline(client, args.warmup, 3, args.concurrency, "warm-chain")
                await run_baseline(client, args.warmup, 3, args.concurrency, "warm-mix",
                                   local=4)

                cpu0 = server_cpu(stack)
                sent0 = acts.fleet.requests_sent()
                reads0 = (acts.registry_queries, acts.registry_checks)
                for r in range(args.rounds):
                    rounds.append(await run_round(client, stack.pids, args, r, say))
                server = {k: v - cpu0.get(k, 0.0) for k, v in server_cpu(stack).items()}
                sent = acts.fleet.requests_sent() - sent0
                reads = (acts.registry_queries - reads0[0], acts.registry_checks - reads0[1])
                quota = await quota_profile(client)
        finally:
            if acts._fleet is not None:
                acts._fleet.close()

    _print_report(args, rounds, quota, server, sent, reads)
    failed = [rd for rd in rounds if rd.states.get("Succeeded", 0) != args.jobs]
    for rd in failed:
        print(f"error: round {rd.index + 1}: only {rd.states.get('Succeeded', 0)} of "
              f"{args.jobs} jobs succeeded", file=sys.stderr)
    return 1 if failed else 0


def member_requests_line(sent: Counter[str], jobs: int) -> str:
    """The requests the measured rounds sent to the members, per job, by kind (the
    capacity caches' watches and probes included; the baselines send none)."""
    total = sum(sent.values())
    kinds = ", ".join(f"{k} {n / jobs:.2f}" for k, n in sent.most_common())
    return f"requests to members per job: {total / jobs:.2f} ({kinds})"


def _print_report(args: Options, rounds: list[Round],
                  quota: tuple[list[RunStats], dict[str, list[float]]],
                  server: dict[str, float], sent: Counter[str],
                  reads: tuple[int, int]) -> None:
    """The bench's report: each round's phases, latency, CPU and ratios, round 1's
    profile, the quota workflow's, the Temporal server's CPU, the requests to members,
    and the result line."""
    print()
    print(f"jobs: {args.jobs} per round, {args.rounds} round(s), concurrency "
          f"{args.concurrency}, run_seconds {args.run_seconds}, Temporal {args.temporal}")
    for rd in rounds:
        print(f"-- round {rd.index + 1}")
        print(rd.base.line("workflows"))
        print(rd.mix.line("workflows"))
        print(rd.strict.line("workflows"))
        print(rd.jobs.line("jobs"))
        print(f"states: {dict(rd.states)}; clusters: {dict(rd.clusters)}")
        print(f"submit-to-bound latency: p50 {percentile(rd.latency, 50):.2f} s, "
              f"p99 {percentile(rd.latency, 99):.2f} s, "
              f"max {max(rd.latency, default=float('nan')):.2f} s")
        print(f"CPU per job / CPU per baseline workflow: "
              f"{(rd.jobs.cpu / rd.jobs.count) / (rd.base.cpu / rd.base.count):.2f}")
        print("CPU ms per job or workflow (worker process / Temporal server): " + "; ".join(
            f"{ph.name} {per_item_ms(ph.cpu, ph.count):.1f} / "
            f"{per_item_ms(temporal_cpu(ph), ph.count):.1f}"
            for ph in (rd.jobs, rd.mix, rd.base, rd.strict)))
        print(f"same-mix CPU ratio (baseline CPU per workflow / CPU per job, worker + "
              f"Temporal) {rd.mix_cpu_ratio:.2f}")
        print(f"ratio {rd.ratio:.2f} (baseline with {rd.k:.2f} activities); "
              f"same-mix ratio (baseline with {rd.k - rd.k_reg:.2f} local + "
              f"{rd.k_reg:.2f} regular) {rd.mix_ratio:.2f}; "
              f"strict ratio (baseline with {rd.k_reg:.2f} "
              f"activities, local ones not counted) {rd.strict_ratio:.2f}")
    print("-- profile of round 1")
    print_profile(rounds[0].profile)
    print(f"quota workflow: {len(quota[0])} run(s), events per run "
          f"{[r.events for r in quota[0]]}")
    print("  time (mean/max s): " + ", ".join(
        f"{k} {sum(v) / len(v):.2f}/{max(v):.2f} (x{len(v)})" for k, v in quota[1].items()
        if v))
    print(f"Temporal server CPU over the measured rounds ({args.temporal}): "
          f"{sum(server.values()):.1f} s (" + ", ".join(
              f"{k} {v:.1f}" for k, v in server.items()) + ")")
    ratios = [rd.ratio for rd in rounds]
    mixes = [rd.mix_ratio for rd in rounds]
    stricts = [rd.strict_ratio for rd in rounds]
    print(f"ratios by round: {', '.join(f'{x:.2f}' for x in ratios)} (median "
          f"{statistics.median(ratios):.2f}); same mix: "
          f"{', '.join(f'{x:.2f}' for x in mixes)} (median {statistics.median(mixes):.2f}); "
          f"strict: "
          f"{', '.join(f'{x:.2f}' for x in stricts)} (median {statistics.median(stricts):.2f})")
    jobs = args.jobs * args.rounds
    print(member_requests_line(sent, jobs))
    print(f"fleet registry reads per job: queries {reads[0] / jobs:.2f}, "
          f"describes that found it unchanged {reads[1] / jobs:.2f}")
    cpu_ratios = [rd.mix_cpu_ratio for rd in rounds]
    print(f"same-mix CPU ratio by round: {', '.join(f'{x:.2f}' for x in cpu_ratios)} "
          f"(median {statistics.median(cpu_ratios):.2f})")
    print(result_line("e2e", statistics.median(ratios), TARGET))


@dataclass
class Round:
    """One measured round: the jobs, then both baselines sized from those jobs."""

    index: int
    jobs: Phase
    base: Phase
    mix: Phase
    strict: Phase
    k: float
    k_reg: float
    profile: dict[str, Any]
    states: Counter[str]
    clusters: Counter[str]
    latency: list[float]

    @property
    def ratio(self) -> float:
        return self.jobs.rate / self.base.rate

    @property
    def mix_ratio(self) -> float:
        return self.jobs.rate / self.mix.rate

    @property
    def strict_ratio(self) -> float:
        return self.jobs.rate / self.strict.rate

    @property
    def mix_cpu_ratio(self) -> float:
        """Same-mix baseline CPU per workflow ÷ CPU per job, worker process and Temporal
        server together: what a job costs the machine, which moves far less with other
        load than the wall-clock ratios do."""
        def per_item(ph: Phase) -> float:
            return (ph.cpu + temporal_cpu(ph)) / ph.count if ph.count else math.nan

        return per_item(self.mix) / per_item(self.jobs)


async def run_round(client: Client, pids: dict[str, int], args: Options,
                    index: int, say: Callable[[str], None]) -> Round:
    names = [f"job-{index}-{i:05d}" for i in range(args.jobs)]
    jobs = Phase("jobs", others=pids).start()
    views, submitted = await run_jobs(client, names, args.concurrency, args.run_seconds)
    jobs.stop(args.jobs)
    sample = names[:: max(1, len(names) // 50)]
    profile = await job_profile(client, sample)
    # the baselines run the activities the measured jobs ran, as an exact mean: every
    # activity (regular and local: the definition) and, stricter, regular
    # activities only
    k, k_reg = profile["activities"], profile["regular_activities"]
    say(f"round {index + 1}: {args.jobs} jobs done; baseline: {args.jobs} workflows x "
        f"{k:.2f} no-op activities (mean)")
    base = Phase("baseline", others=pids).start()
    await run_baseline(client, args.jobs, k, args.concurrency, f"bench-chain-{index}")
    base.stop(args.jobs)
    say(f"round {index + 1}: same-mix baseline: {args.jobs} workflows x "
        f"{k - k_reg:.2f} local + {k_reg:.2f} regular")
    mix = Phase("same-mix baseline", others=pids).start()
    await run_baseline(client, args.jobs, k_reg, args.concurrency, f"bench-mix-{index}",
                       local=k - k_reg)
    mix.stop(args.jobs)
    say(f"round {index + 1}: strict baseline: {args.jobs} workflows x {k_reg:.2f}")
    strict = Phase("strict baseline", others=pids).start()
    await run_baseline(client, args.jobs, k_reg, args.concurrency, f"bench-strict-{index}")
    strict.stop(args.jobs)
    latency = [v.bound_at.timestamp() - t for v, t in zip(views, submitted, strict=True)
               if v.bound_at is not None]
    return Round(index, jobs, base, mix, strict, k, k_reg, profile,
                 Counter(v.state for v in views), Counter(v.cluster or "-" for v in views),
                 latency)


@dataclass(frozen=True)
class Options:
    """``fleetq bench e2e``'s options as parsed (the defaults are the command's)."""

    jobs: int
    concurrency: int
    warmup: int
    run_seconds: int
    rounds: int
    unsandboxed: bool
    temporal: str = "dev"


app = bench_app()


@app.command(help=help_text(__doc__))
def command(
    jobs: int = typer.Option(500, "--jobs", min=1, help="jobs (and baseline workflows)"),
    concurrency: int = typer.Option(
        50, "--concurrency", min=1,
        help="start requests in flight at once (jobs and baseline alike)"),
    warmup: int = typer.Option(5, "--warmup", min=1, help="warm-up jobs (not measured)"),
    run_seconds: int = typer.Option(1, "--run-seconds", help="how long each job's pods run"),
    rounds: int = typer.Option(
        3, "--rounds", min=1,
        help="rounds of jobs-then-baselines; RESULT is the median round ratio"),
    unsandboxed: bool = typer.Option(
        False, "--unsandboxed",
        help="experiment: run every workflow (jobs and baseline) without the Python SDK's "
             "sandbox"),
    temporal: TemporalKind = temporal_option(),
) -> None:
    raise typer.Exit(run_main(run(Options(jobs, concurrency, warmup, run_seconds, rounds,
                                          unsandboxed, temporal.value))))


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(app, argv, "fleetq bench e2e")


if __name__ == "__main__":
    raise SystemExit(main())
