"""Benchmark: one quota tree under sustained load on production persistence (issue 28).

At each rate of a ladder, jobs ask one real ``QuotaTreeWorkflow`` on the
production-shaped Temporal (PostgreSQL at each added latency, ``--shards`` history
shards) for quota, in one of two feeds:

* ``--feed jobs``: job-shaped holder workflows, each messaging as a job does (the
  ``signal_quota`` local activity, the worker's batched ``submit`` updates): the whole
  per-job path, so the Temporal cluster's writes for every job's start and tasks count;
* ``--feed tree``: the tree alone, as ``--outboxes`` workers' ``QuotaOutbox`` instances
  deliver jobs' enqueue and release (the worker's own batching code, in this process),
  with no job workflow behind them: the semaphore's own ceiling.

Measured: admissions/s, request → grant p50/p99 per window, continue-as-new runs per
second and events per run. A point is *bounded* when every job was granted once, 90 % of
the rate was reached and the p99 did not grow. Method: BENCHMARKS.md "Bench methods";
figures: §11.

Run: ``fleetq bench sustained [--feed tree] [--latencies 0,5,20]
[--rates 10,20,40,80,160] [--seconds 600]``. Last line:
``RESULT sustained <admissions/s> (target 100)``.
"""

from __future__ import annotations

import asyncio
import math
import os
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from activities.quota_outbox import QuotaOutbox, QuotaRefused
from bench.command import bench_app, help_text, run_command
from bench.common import (
    HISTORY_WARN_EVENTS,
    cpu_seconds,
    event_seconds,
    one_leaf_quota_tree,
    percentile,
    quota_messages,
    real_activities,
    result_line,
    run_chain,
    run_main,
)
from fleetq.admission import AdmissionRequest
from fleetq.messages import QuotaAck, QuotaSignal
from fleetq.temporal_cluster.config import Layout
from fleetq.temporal_cluster.latency_proxy import read_stats
from fleetq.testing.history import RunStats, grants_sent
from fleetq.testing.holder import ONE_JOB, HolderInput, QuotaHolder
from worker import build_worker
from workflows.quota_tree import QuotaTreeInput, QuotaTreeWorkflow

#: admissions/s per tree at the reference latency (issue 28)
TARGET = 100.0
REFERENCE_LATENCY_MS = 5.0
#: and never more than one new run of the quota workflow per second
MAX_RUNS_PER_SECOND = 1.0
NAMESPACE = "bench"
#: a bounded point reaches this share of the offered rate
RATE_SHARE = 0.9
#: ... and its p99 in the last third of the run is at most this times the first third's,
#: or under this many seconds
P99_GROWTH = 2.0
P99_FLOOR_SECONDS = 1.0

#: the two feeds (module docstring)
FEEDS = ("jobs", "tree")
#: a tree-feed message whose update failed is sent again as ``signal_quota``'s local
#: activity retries it: after 1 s, doubling, at most 10 s apart
RESEND_INITIAL_SECONDS = 1.0
RESEND_MAX_SECONDS = 10.0

COLUMNS = ("feed", "shards", "db ms", "offered/s", "jobs", "admitted", "admissions/s",
           "p50 s", "p99 s", "p99 first→last", "enqueue→grant p99 s", "grant signal p99 s",
           "runs/s", "events/run", "max events", "bounded")


def quota_tree() -> dict[str, Any]:
    """One leaf with room for every holder: the delay measured is the workflow's own."""
    return one_leaf_quota_tree("sustained", NAMESPACE, {
        "cpu": 100000, "memory": "100000Gi", "kube-queue/max-jobs": 100_000_000})


def grant_times(events: Sequence[HistoryEvent]) -> dict[str, list[float]]:
    """Job id -> when the quota workflow granted it (every run): its ``admitted`` signal
    initiated, or the ``submit`` update that answered the grant completed."""
    out: dict[str, list[float]] = {}
    for ev, job in grants_sent(events):
        out.setdefault(job, []).append(event_seconds(ev))
    return out


def enqueue_times(events: Sequence[HistoryEvent]) -> dict[str, float]:
    """Job id -> when the job asked to be enqueued (its request's ``submitted_at``: the
    job workflow's clock in the task that sent the enqueue)."""
    out: dict[str, float] = {}
    for _ev, message in quota_messages(events):
        if message.signal == "enqueue" and message.request is not None:
            out.setdefault(message.request.job_id, message.request.submitted_at)
    return out


@dataclass
class TaskTimes:
    """The quota workflow's workflow tasks and grant signals, from its history."""

    tasks: int = 0
    schedule_to_start: list[float] = field(default_factory=list)
    start_to_close: list[float] = field(default_factory=list)
    #: a grant's signal initiated -> its ``ExternalWorkflowExecutionSignaled`` recorded
    signal_round_trip: list[float] = field(default_factory=list)
    updates: int = 0
    messages: int = 0

    def summary(self) -> str:
        def ms(v: list[float]) -> str:
            return (f"p50 {percentile(v, 50) * 1000:.0f} / p99 {percentile(v, 99) * 1000:.0f} ms"
                    if v else "n/a")

        per = self.messages / self.updates if self.updates else math.nan
        return (f"{self.tasks} quota workflow tasks, schedule→start {ms(self.schedule_to_start)}, "
                f"start→complete {ms(self.start_to_close)}; grant signal round trip "
                f"{ms(self.signal_round_trip)}; {self.updates} submit updates, "
                f"{per:.1f} messages each")


def task_times(events: Sequence[HistoryEvent]) -> TaskTimes:
    out = TaskTimes()
    scheduled: dict[int, float] = {}
    started: dict[int, float] = {}
    initiated: dict[int, float] = {}
    out.messages, out.updates = _message_counts(events)
    for ev in events:
        t = event_seconds(ev)
        if ev.HasField("workflow_task_scheduled_event_attributes"):
            scheduled[ev.event_id] = t
        elif ev.HasField("workflow_task_started_event_attributes"):
            a = ev.workflow_task_started_event_attributes
            started[ev.event_id] = t
            if a.scheduled_event_id in scheduled:
                out.schedule_to_start.append(t - scheduled[a.scheduled_event_id])
        elif ev.HasField("workflow_task_completed_event_attributes"):
            a2 = ev.workflow_task_completed_event_attributes
            out.tasks += 1
            if a2.started_event_id in started:
                out.start_to_close.append(t - started[a2.started_event_id])
        elif ev.HasField("signal_external_workflow_execution_initiated_event_attributes"):
            initiated[ev.event_id] = t
        elif ev.HasField("external_workflow_execution_signaled_event_attributes"):
            a3 = ev.external_workflow_execution_signaled_event_attributes
            if a3.initiated_event_id in initiated:
                out.signal_round_trip.append(t - initiated.pop(a3.initiated_event_id))
    return out


def _message_counts(events: Sequence[HistoryEvent]) -> tuple[int, int]:
    """How many quota messages the history carries, and in how many submit updates."""
    messages = 0
    seen_updates: set[int] = set()
    for ev, _m in quota_messages(events):
        messages += 1
        seen_updates.add(id(ev))
    return messages, len(seen_updates)


@dataclass
class Point:
    """One (latency, rate) point of the ladder."""

    latency_ms: float
    rate: float
    seconds: float
    feed: str = "jobs"
    shards: int = 64
    jobs: int = 0
    admitted: int = 0
    duplicates: int = 0
    #: holders granted again because their enqueue was sent again (a timed-out update)
    regranted: int = 0
    #: tree feed: messages sent again after their update failed (as a job's local
    #: activity retries)
    resent: int = 0
    #: tree feed: enqueues not admitted in the reply (their grant went by signal)
    granted_by_signal: int = 0
    #: jobs feed: where a sample of holders spent their time, stage -> seconds (p50, p99)
    stages: dict[str, tuple[float, float]] = field(default_factory=dict)
    admissions_per_s: float = math.nan
    p50: float = math.nan
    p99: float = math.nan
    p99_first: float = math.nan
    p99_last: float = math.nan
    in_tree_p99: float = math.nan
    tasks: TaskTimes = field(default_factory=TaskTimes)
    windows: list[tuple[float, float, int]] = field(default_factory=list)  # p50, p99, n
    backlog: list[int] = field(default_factory=list)  # running holders, each window
    runs: int = 0
    runs_per_s: float = math.nan
    events_per_run: float = math.nan
    max_events: int = 0
    feed_lag: float = 0.0  # how far the last start request fell behind its schedule, s
    drained: bool = True
    cpu: dict[str, float] = field(default_factory=dict)  # process group -> CPU seconds
    proxy_chunks: int = 0
    proxy_min_held_ms: float | None = None
    proxy_mean_held_ms: float | None = None
    load: tuple[float, float, float] = (0.0, 0.0, 0.0)
    problems: list[str] = field(default_factory=list)

    @property
    def bounded(self) -> bool:
        return (not self.problems and self.drained and self.admitted == self.jobs
                and self.admissions_per_s >= RATE_SHARE * self.rate
                and (self.p99_last <= P99_GROWTH * self.p99_first
                     or self.p99_last <= P99_FLOOR_SECONDS))

    def row(self) -> list[str]:
        return [self.feed, str(self.shards), f"{self.latency_ms:g}", f"{self.rate:g}",
                str(self.jobs), str(self.admitted),
                f"{self.admissions_per_s:.1f}", f"{self.p50:.2f}", f"{self.p99:.2f}",
                f"{self.p99_first:.2f}→{self.p99_last:.2f}", f"{self.in_tree_p99:.2f}",
                f"{percentile(self.tasks.signal_round_trip, 99):.2f}",
                f"{self.runs_per_s:.3f}", f"{self.events_per_run:.0f}", str(self.max_events),
                "yes" if self.bounded else "no"]


def table(points: Sequence[Point]) -> str:
    rows = [list(COLUMNS), *(p.row() for p in points)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"
             for r in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def thirds(values: Sequence[float]) -> tuple[float, float]:
    """The largest value of the first and of the last third of ``values``."""
    k = max(1, len(values) // 3)
    return max(values[:k], default=math.nan), max(values[-k:], default=math.nan)


async def running_holders(client: Client, task_queue: str) -> int:
    got = await client.count_workflows(
        f'TaskQueue = "{task_queue}" AND ExecutionStatus = "Running"')
    return got.count


async def ended_holders(client: Client, task_queue: str) -> int:
    """Holders of ``task_queue`` that have ended (visibility: late, but never lower)."""
    got = await client.count_workflows(
        f'TaskQueue = "{task_queue}" AND ExecutionStatus != "Running"')
    return got.count


async def run_point(client: Client, cluster: Any, task_queue: str, control_queue: str,
                    latency_ms: float, rate: float, opts: Options) -> Point:
    point = Point(latency_ms, rate, opts.seconds, feed=opts.feed, shards=opts.shards)
    tag = f"{opts.feed}-{latency_ms:g}ms-{rate:g}-{uuid.uuid4().hex[:6]}"
    qh = await client.start_workflow(
        QuotaTreeWorkflow.run, QuotaTreeInput(tree=quota_tree()),
        id=f"quota/sustained-{tag}", task_queue=control_queue)
    first_run = qh.result_run_id
    n = max(1, round(rate * opts.seconds))
    point.jobs = n
    asked: dict[str, float] = {}
    errors: list[str] = []
    cpu0, own0 = cluster.cpu_seconds(), cpu_seconds()
    proxy0 = read_stats(cluster.db_proxy_stats) or {}
    if opts.feed == "tree":
        wall0 = await _feed_tree(client, qh.id, tag, n, point, asked, errors, opts)
    else:
        wall0 = await _feed_jobs(client, qh.id, task_queue, tag, n, point, asked, errors, opts)
    cpu1, own1 = cluster.cpu_seconds(), cpu_seconds()
    proxy1 = read_stats(cluster.db_proxy_stats) or {}
    point.load = os.getloadavg()
    await qh.signal(QuotaTreeWorkflow.stop)
    await qh.result()
    runs, events = await run_chain(client, qh.id, first_run, keep_events=True)

    grants = grant_times(events)
    point.tasks = task_times(events)
    _count_grants(point, asked, grants, events, errors)
    _grant_delays(point, asked, grants, enqueue_times(events), runs, wall0, opts.window)
    _quota_runs(point, runs)
    point.cpu = _cpu_groups(cpu0, cpu1, own1 - own0)
    _proxy_holds(point, proxy0, proxy1)
    return point


async def _paced(n: int, rate: float, point: Point, launch: Any, sample: Any,
                 window: float) -> tuple[float, list[asyncio.Task[None]]]:
    """Call ``launch(i)`` for i in 0..n-1 at ``rate`` per second (each a task of its own)
    and ``sample()`` every ``window`` seconds; returns the wall clock at the start and the
    tasks."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    wall0 = time.time()
    next_sample = window
    tasks: list[asyncio.Task[None]] = []
    for i in range(n):
        due = t0 + i / rate
        wait = due - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
        point.feed_lag = max(point.feed_lag, loop.time() - due)
        tasks.append(asyncio.ensure_future(launch(i)))
        if loop.time() - t0 >= next_sample:
            next_sample += window
            sample()
    return wall0, tasks


async def _feed_jobs(client: Client, tree_id: str, task_queue: str, tag: str, n: int,
                     point: Point, asked: dict[str, float], errors: list[str],
                     opts: Options) -> float:
    """Start ``n`` holder workflows at the point's rate and wait until they have ended;
    returns the wall clock at the start."""
    ended0 = await ended_holders(client, task_queue)

    async def start(i: int) -> None:
        job_id = f"sus-{tag}-{i:06d}"
        asked[job_id] = time.time()
        try:
            await client.start_workflow(
                QuotaHolder.run, HolderInput(tree_id=tree_id, namespace=NAMESPACE),
                id=job_id, task_queue=task_queue)
        except Exception as exc:  # noqa: BLE001 - counted, reported
            errors.append(f"start {job_id}: {exc}")

    def sample() -> None:
        # the backlog (holders started and not yet released), off the feed
        got = asyncio.ensure_future(running_holders(client, task_queue))
        got.add_done_callback(
            lambda f: point.backlog.append(f.result()) if not f.exception() else None)

    wall0, starts = await _paced(n, point.rate, point, start, sample, opts.window)
    await asyncio.gather(*starts)
    await _drain(client, task_queue, ended0 + n - len(errors), point, opts)  # started ones
    point.stages = await holder_stages(client, asked, HOLDER_SAMPLE)
    return wall0


#: holders whose histories the jobs feed reads for :func:`holder_stages`
HOLDER_SAMPLE = 60


async def holder_stages(client: Client, asked: dict[str, float],
                        sample: int) -> dict[str, tuple[float, float]]:
    """Where holders spent their time before their grant, from every ``len // sample``-th
    holder's history: ``start`` (asked → WorkflowExecutionStarted), ``dispatch`` (→ its
    first workflow task started) and ``task`` (→ that task completed: the enqueue's local
    activity and reply). Each is (p50, p99) seconds."""
    ids = sorted(asked)[:: max(1, len(asked) // sample)]
    stages: dict[str, list[float]] = {"start": [], "dispatch": [], "task": []}
    for job_id in ids:
        try:
            events = (await client.get_workflow_handle(job_id).fetch_history()).events
        except Exception:  # noqa: BLE001 - a sample, not a measurement of its own
            continue
        started = next((e for e in events
                        if e.HasField("workflow_execution_started_event_attributes")), None)
        task_started = next((e for e in events
                             if e.HasField("workflow_task_started_event_attributes")), None)
        task_done = next((e for e in events
                          if e.HasField("workflow_task_completed_event_attributes")), None)
        if started is None or task_started is None or task_done is None:
            continue
        stages["start"].append(event_seconds(started) - asked[job_id])
        stages["dispatch"].append(event_seconds(task_started) - event_seconds(started))
        stages["task"].append(event_seconds(task_done) - event_seconds(task_started))
    return {k: (percentile(v, 50), percentile(v, 99)) for k, v in stages.items() if v}


async def _feed_tree(client: Client, tree_id: str, tag: str, n: int, point: Point,
                     asked: dict[str, float], errors: list[str], opts: Options) -> float:
    """``n`` jobs' enqueue and release at the point's rate through ``opts.outboxes``
    outboxes (job i through outbox i mod k, as k workers would); waits until every job
    has released, at most ``opts.drain_seconds`` after the feed; returns the wall clock
    at the start."""
    outboxes = [QuotaOutbox(client) for _ in range(opts.outboxes)]
    open_jobs: set[str] = set()

    async def job(i: int) -> None:
        job_id = f"sus-{tag}-{i:06d}"
        box = outboxes[i % len(outboxes)]
        asked[job_id] = time.time()
        open_jobs.add(job_id)
        request = AdmissionRequest(job_id=job_id, namespace=NAMESPACE,
                                   request=dict(ONE_JOB), submitted_at=asked[job_id])
        try:
            ack = await _send(box, QuotaSignal(tree_workflow_id=tree_id, signal="enqueue",
                                               request=request), point)
            if ack.grant is None:
                # Queued (e.g. the run was continuing as new): its grant goes by signal,
                # to no workflow here, and the tree takes the quota back when that
                # signal fails. The grant is in the history all the same.
                point.granted_by_signal += 1
                return
            await _send(box, QuotaSignal(tree_workflow_id=tree_id, signal="release",
                                         job_id=job_id), point)
        except Exception as exc:  # noqa: BLE001 - counted, reported
            errors.append(f"{job_id}: {exc}")
        finally:
            open_jobs.discard(job_id)

    wall0, tasks = await _paced(n, point.rate, point, job,
                                lambda: point.backlog.append(len(open_jobs)), opts.window)
    _done, late = await asyncio.wait(tasks, timeout=opts.drain_seconds)
    if late:
        point.drained = False
        point.problems.append(f"{len(late)} jobs not released {opts.drain_seconds:g} s "
                              "after the feed ended")
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
    return wall0


async def _send(box: QuotaOutbox, message: QuotaSignal, point: Point) -> QuotaAck:
    """Deliver ``message`` through ``box``, sending it again after a failed update as
    ``signal_quota``'s local activity would be retried; a refusal is final."""
    delay = RESEND_INITIAL_SECONDS
    while True:
        try:
            ack = await box.send(message)
        except QuotaRefused:
            raise
        except Exception:  # noqa: BLE001 - a failed delivery: sent again, counted
            point.resent += 1
            await asyncio.sleep(delay)
            delay = min(2 * delay, RESEND_MAX_SECONDS)
            continue
        if not ack.running:
            raise RuntimeError(f"quota workflow {message.tree_workflow_id} is not running")
        return ack


async def _drain(client: Client, task_queue: str, ended: int, point: Point,
                 opts: Options) -> None:
    """Wait until every holder of the point has ended (``ended`` holders of the task
    queue have, counting earlier points'): granted and released. Counting the ended, not
    the running, is safe while visibility lags: a holder just started and not yet listed
    as running would otherwise let the point end, and its tree stop, under it. Past
    ``opts.drain_seconds`` the point is marked not drained, saying how many still run."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + opts.drain_seconds
    while True:
        left = ended - await ended_holders(client, task_queue)
        if left <= 0:
            return
        if loop.time() > deadline:
            point.drained = False
            point.problems.append(f"{left} holders still running {opts.drain_seconds:g} s "
                                  "after the feed ended")
            return
        await asyncio.sleep(1.0)


def _count_grants(point: Point, asked: dict[str, float], grants: dict[str, list[float]],
                  events: Sequence[HistoryEvent], errors: list[str]) -> None:
    """Holders admitted, granted again (after a re-sent enqueue) and granted twice in
    error; the first start errors become problems."""
    point.admitted = sum(1 for j in asked if j in grants)
    # A holder whose enqueue went out again (its update got no answer in time, so its
    # local activity retried) is granted again by design: the quota workflow answers a
    # holder's re-enqueue with its grant. Any other second grant is an error.
    sends = Counter(m.request.job_id for _ev, m in quota_messages(events)
                    if m.signal == "enqueue" and m.request is not None)
    again = [j for j in asked if len(grants.get(j, [])) > 1]
    point.regranted = sum(1 for j in again if len(grants[j]) <= sends[j])
    point.duplicates = len(again) - point.regranted
    if point.duplicates:
        point.problems.append(f"{point.duplicates} holders granted more often than they "
                              "asked")
    point.problems += errors[:3]


def _grant_delays(point: Point, asked: dict[str, float], grants: dict[str, list[float]],
                  enqueued: dict[str, float], runs: Sequence[RunStats], wall0: float,
                  window: float) -> None:
    """Ask-to-grant latency (overall, from the enqueue, per window of ``window`` s),
    admissions and quota runs per second; nothing when no holder was granted."""
    delays = {j: grants[j][0] - asked[j] for j in asked if j in grants}
    in_tree = [grants[j][0] - enqueued[j] for j in delays if j in enqueued]
    if not delays:
        return
    firsts = sorted(grants[j][0] for j in delays)
    last_grant = firsts[-1]
    # the rate grants went out at, first to last: a point's fixed lead-in (its first
    # grant's delay) does not count against a short point
    point.admissions_per_s = ((len(firsts) - 1) / (last_grant - firsts[0])
                              if last_grant > firsts[0] else math.nan)
    values = list(delays.values())
    point.p50, point.p99 = percentile(values, 50), percentile(values, 99)
    point.in_tree_p99 = percentile(in_tree, 99)
    by_window: dict[int, list[float]] = {}
    for j, d in delays.items():
        by_window.setdefault(int((asked[j] - wall0) // window), []).append(d)
    point.windows = [(percentile(v, 50), percentile(v, 99), len(v))
                     for _k, v in sorted(by_window.items())]
    point.p99_first, point.p99_last = thirds([w[1] for w in point.windows])
    elapsed = last_grant - wall0
    point.runs = len(runs)
    point.runs_per_s = (len(runs) - 1) / elapsed if elapsed > 0 else math.nan


def _quota_runs(point: Point, runs: Sequence[RunStats]) -> None:
    """Events per quota run (the last, partial run left out when there are others) and
    the problems of a too long history or too many runs per second."""
    full = [r.events for r in runs[:-1]] or [r.events for r in runs]
    point.events_per_run = sum(full) / len(full)
    point.max_events = max(r.events for r in runs)
    if point.max_events > HISTORY_WARN_EVENTS:
        point.problems.append(f"a quota run has {point.max_events} events "
                              f"(> {HISTORY_WARN_EVENTS})")
    if point.runs_per_s > MAX_RUNS_PER_SECOND:
        point.problems.append(f"{point.runs_per_s:.2f} quota runs per second "
                              f"(> {MAX_RUNS_PER_SECOND:g})")


def _cpu_groups(cpu0: dict[str, float], cpu1: dict[str, float],
                own: float) -> dict[str, float]:
    """CPU seconds spent during the point, per group: postgres, db-proxy, the Temporal
    services, and this process (worker + bench, ``own``)."""
    groups: dict[str, float] = {}
    for name, secs in cpu1.items():
        group = ("postgres" if name == "postgres" else "db-proxy" if name == "db-proxy"
                 else "temporal")
        groups[group] = groups.get(group, 0.0) + secs - cpu0.get(name, 0.0)
    groups["worker+bench"] = own
    return groups


def _proxy_holds(point: Point, proxy0: dict[str, Any], proxy1: dict[str, Any]) -> None:
    """The latency proxy's chunks during the point and how long it held them (the
    shortest hold, and the mean)."""
    point.proxy_chunks = sum(int(proxy1.get(d, {}).get("chunks", 0))
                             - int(proxy0.get(d, {}).get("chunks", 0))
                             for d in ("upstream", "downstream"))
    held = [proxy1.get(d, {}).get("min_held") for d in ("upstream", "downstream")]
    known = [float(h) for h in held if h is not None]
    point.proxy_min_held_ms = min(known) * 1000 if known else None
    held_s = sum(float(proxy1.get(d, {}).get("total_held", 0.0))
                 - float(proxy0.get(d, {}).get("total_held", 0.0))
                 for d in ("upstream", "downstream"))
    point.proxy_mean_held_ms = held_s / point.proxy_chunks * 1000 if point.proxy_chunks else None


def describe(p: Point) -> str:
    wins = ", ".join(f"{w[1]:.2f}" for w in p.windows)
    cpu = ", ".join(f"{k} {v:.0f} s" for k, v in sorted(p.cpu.items()))
    held = (f">= {p.proxy_min_held_ms:.1f} ms, mean {p.proxy_mean_held_ms or 0:.1f} ms"
            if p.proxy_min_held_ms is not None else "n/a")
    return (f"  {p.feed} feed, {p.shards} shards, db {p.latency_ms:g} ms, offered "
            f"{p.rate:g}/s for {p.seconds:g} s: {p.admitted}/{p.jobs} admitted "
            f"({p.regranted} granted again after a re-sent enqueue; {p.resent} messages "
            f"sent again; {p.granted_by_signal} granted by signal), "
            f"{p.admissions_per_s:.1f}/s, p50 {p.p50:.2f} s, "
            f"p99 {p.p99:.2f} s (from the job's enqueue {p.in_tree_p99:.2f} s); p99 per "
            f"{len(p.windows)} windows: [{wins}]; running holders per window: {p.backlog}; "
            f"feed fell behind by {p.feed_lag:.2f} s at most; quota runs {p.runs} "
            f"({p.runs_per_s:.3f}/s), {p.events_per_run:.0f} events per full run, max "
            f"{p.max_events}; {p.tasks.summary()}; "
            + "".join(f"holders' {k} p50 {a:.2f} / p99 {b:.2f} s; "
                      for k, (a, b) in p.stages.items())
            + f"CPU {cpu}; db proxy {p.proxy_chunks} "
            f"chunks, each held {held}; load {p.load[0]:.1f}/{p.load[1]:.1f}/{p.load[2]:.1f}; "
            f"bounded: {'yes' if p.bounded else 'no'}"
            + "".join(f"\n    problem: {x}" for x in p.problems))


async def run_latency(binaries: Any, latency_ms: float, opts: Options) -> list[Point]:
    from fleetq.temporal_cluster.runner import TemporalCluster

    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    points: list[Point] = []
    with tempfile.TemporaryDirectory(prefix="fleetq-bench-sustained-", dir=shm) as tmp:
        cluster = TemporalCluster(binaries, Path(tmp), Layout(shards=opts.shards),
                                  db_latency_ms=latency_ms, progress=print)
        await asyncio.to_thread(cluster.start, 300.0)
        try:
            client = await Client.connect(cluster.address,
                                          data_converter=pydantic_data_converter)
            tq = f"bench-sustained-{uuid.uuid4().hex[:6]}"
            ctq = f"{tq}-control"
            worker = build_worker(client, real_activities(client, None), task_queue=tq,
                                  control_task_queue=ctq, extra_workflows=[QuotaHolder])
            async with worker:
                for rate in opts.rates:
                    point = await run_point(client, cluster, tq, ctq, latency_ms, rate, opts)
                    points.append(point)
                    print(describe(point), flush=True)
                    if not point.bounded:
                        break
        finally:
            await asyncio.to_thread(cluster.stop)
    return points


def best(points: Sequence[Point], latency_ms: float) -> float:
    """The highest admissions/s among the bounded points at ``latency_ms`` (0: none)."""
    rates = [p.admissions_per_s for p in points if p.latency_ms == latency_ms and p.bounded]
    return max(rates, default=0.0)


async def run(opts: Options) -> int:
    from fleetq.temporal_cluster.build import build

    binaries = await asyncio.to_thread(build, False, print)
    points: list[Point] = []
    for latency in opts.latencies:
        points += await run_latency(binaries, latency, opts)
    ref = REFERENCE_LATENCY_MS if REFERENCE_LATENCY_MS in opts.latencies else opts.latencies[0]
    print()
    fed = ("holder workflows started" if opts.feed == "jobs"
           else f"enqueues and releases from {opts.outboxes} outboxes")
    print(f"one tree, {fed} at a steady rate for {opts.seconds:g} s per point "
          f"(windows of {opts.window:g} s), production-shaped Temporal with "
          f"{opts.shards} history shards, PostgreSQL behind the latency proxy (added each "
          "way)")
    print(table(points))
    for latency in opts.latencies:
        print(f"highest bounded rate at db {latency:g} ms: {best(points, latency):.1f} "
              "admissions/s")
    problems = [x for p in points for x in p.problems if p.drained and p.admitted == p.jobs]
    for x in problems:
        print(f"error: {x}", file=sys.stderr)
    print(result_line("sustained", best(points, ref), TARGET))
    return 0 if best(points, ref) >= TARGET else 1


@dataclass(frozen=True)
class Options:
    """``fleetq bench sustained``'s options as parsed (the defaults are the command's)."""

    latencies: list[float]
    rates: list[float]
    seconds: float = 600.0
    window: float = 10.0
    drain_seconds: float = 120.0
    feed: str = "jobs"
    outboxes: int = 8
    shards: int = 64


def parse_list(value: str, what: str) -> list[float]:
    try:
        got = [float(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"{what}: a comma-separated list of numbers, "
                                 f"got {value!r}") from None
    if not got or any(x < 0 for x in got):
        raise typer.BadParameter(f"{what}: at least one number, none negative; got {value!r}")
    return got


app = bench_app()


@app.command(help=help_text(__doc__))
def command(
    latencies: str = typer.Option("0,5,20", "--latencies",
                                  help="database latencies, ms added each way"),
    rates: str = typer.Option("10,20,40,80,160", "--rates",
                              help="offered rates, holders started per second"),
    seconds: float = typer.Option(600.0, "--seconds", min=1.0, help="feed time per point"),
    window: float = typer.Option(10.0, "--window", min=0.5,
                                 help="seconds per delay window (p99 over time)"),
    drain: float = typer.Option(120.0, "--drain", min=1.0,
                                help="seconds after the feed for every job to finish"),
    feed: str = typer.Option("jobs", "--feed",
                             help="jobs: holder workflows; tree: outboxes, no job workflows"),
    outboxes: int = typer.Option(8, "--outboxes", min=1, max=10,
                                 help="tree feed: workers' outboxes (one update in flight "
                                      "each; the server allows 10)"),
    shards: int = typer.Option(
        64, "--shards", min=1,
        help="history shards (at most one database write at a time each; "
             "`fleetq temporal-cluster up` makes 4)"),
) -> None:
    rate_list = parse_list(rates, "--rates")
    if any(r <= 0 for r in rate_list):
        raise typer.BadParameter(f"--rates: every rate must be positive; got {rates!r}")
    if feed not in FEEDS:
        raise typer.BadParameter(f"--feed: one of {', '.join(FEEDS)}; got {feed!r}")
    raise typer.Exit(run_main(run(Options(parse_list(latencies, "--latencies"), rate_list,
                                          seconds, window, drain, feed, outboxes,
                                          shards))))


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(app, argv, "fleetq bench sustained")


if __name__ == "__main__":
    raise SystemExit(main())
