"""Benchmark: a deep queue behind one quota leaf (``kube-queue/max-jobs: 100``).

The real ``QuotaTreeWorkflow`` against light holder workflows messaging as jobs do: a
burst of N holders waits behind 100 plugs, then drains; the grant order, read back from
the quota workflow's history, must be priority-then-FIFO with one grant each, and no run
may exceed 10,240 events. The ratio is admissions/s over the rate of plain signals into
one workflow in the same run (target 0.5). Method: BENCHMARKS.md "Bench methods";
figures: §2.

Run: ``fleetq bench queue [--jobs 10000] [--concurrency 200]``.
Last line: ``RESULT queue <ratio> (target 0.5)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from temporalio import workflow
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from bench.command import bench_app, help_text, run_command
from bench.common import (
    HISTORY_WARN_EVENTS,
    Phase,
    one_leaf_quota_tree,
    peak_rss_mb,
    quota_messages,
    real_activities,
    result_line,
    run_chain,
    run_main,
    temporal_option,
)
from fleetq.client.connection import temporal_cli_path
from fleetq.runtime.embedded import TemporalKind
from fleetq.testing.chaos import code_task_failures
from fleetq.testing.history import grants_sent
from fleetq.testing.holder import HolderInput, QuotaHolder
from worker import build_worker
from workflows.quota_tree import QuotaTreeInput, QuotaTreeWorkflow, QuotaView

TARGET = 0.5
NAMESPACE = "bench"
MAX_JOBS = 100
PRIORITIES = (0, 10, 100)
#: status queries to the quota workflow that timed out during the run
QUERY_TIMEOUTS: list[str] = []


@workflow.defn(name="BenchSignalCounter", sandboxed=False)
class SignalCounter:
    """The baseline's target: counts ``hit`` signals until it has ``n``."""

    def __init__(self) -> None:
        self.count = 0

    @workflow.run
    async def run(self, n: int) -> int:
        await workflow.wait_condition(lambda: self.count >= n)
        return self.count

    @workflow.signal
    def hit(self) -> None:
        self.count += 1


@workflow.defn(name="BenchSignaller", sandboxed=False)
class Signaller:
    """The baseline's sender: one plain signal into the counter."""

    @workflow.run
    async def run(self, counter_id: str) -> None:
        await workflow.get_external_workflow_handle(counter_id).signal("hit")


def quota_tree() -> dict[str, Any]:
    return one_leaf_quota_tree(
        "deep", NAMESPACE, {"cpu": 100000, "memory": "100000Gi", "kube-queue/max-jobs": 10_000_000},
        leaf_room={"cpu": 100000, "memory": "100000Gi", "kube-queue/max-jobs": MAX_JOBS})


async def start_all(client: Client, workflow_ids: Sequence[str], concurrency: int,
                    start: Any) -> None:
    sem = asyncio.Semaphore(max(1, concurrency))

    async def one(wid: str) -> None:
        async with sem:
            await start(wid)

    await asyncio.gather(*(one(w) for w in workflow_ids))


async def view(handle: WorkflowHandle[Any, Any]) -> QuotaView:
    got: QuotaView = await handle.query(QuotaTreeWorkflow.view)
    return got


async def wait_view(handle: WorkflowHandle[Any, Any], pred: Any, what: str,
                    timeout: float) -> QuotaView:
    deadline = time.monotonic() + timeout
    v: QuotaView | None = None
    while True:
        try:
            v = await view(handle)
        except RPCError as exc:
            # A query waits behind the burst's workflow tasks and may time out: count it
            # (it is a finding) and poll again.
            QUERY_TIMEOUTS.append(str(exc))
        else:
            if pred(v):
                return v
        if time.monotonic() > deadline:
            seen = f"holders {v.holders}, waiting {v.waiting}" if v else "no answer"
            raise TimeoutError(f"quota workflow: {what} not reached in {timeout:.0f} s "
                               f"({seen})")
        await asyncio.sleep(0.5)


def granted(events: Sequence[Any]) -> list[str]:
    """Job ids the quota workflow granted, in order, from its history (every run): by
    ``admitted`` signal or in a ``submit`` update's reply."""
    return [job for _ev, job in grants_sent(events)]


def check_order(events: Sequence[Any], burst: set[str]) -> tuple[list[str], list[str]]:
    """Read the quota workflow's history (every run): returns (problems, the order in
    which the burst's holders were granted)."""
    keys: dict[str, tuple[int, float, str]] = {}
    for _ev, message in quota_messages(events):
        if message.request is not None:
            req = message.request
            keys.setdefault(req.job_id, (-req.priority, req.submitted_at, req.job_id))
    grants = granted(events)
    problems: list[str] = []
    counts = Counter(grants)
    dup = [j for j, c in counts.items() if c > 1]
    if dup:
        problems.append(f"{len(dup)} holders granted more than once, e.g. {dup[0]}")
    lost = burst - set(counts)
    if lost:
        problems.append(f"{len(lost)} holders never granted, e.g. {sorted(lost)[0]}")
    order = [j for j in grants if j in burst]
    expected = sorted(order, key=lambda j: keys[j])
    if order != expected:
        first = next(i for i, (a, b) in enumerate(zip(order, expected, strict=True)) if a != b)
        problems.append(f"grant #{first} went to {order[first]} {keys[order[first]]}, "
                        f"expected {expected[first]} {keys[expected[first]]}")
    return problems, order


@contextlib.asynccontextmanager
async def temporal_client(kind: str) -> AsyncIterator[Client]:
    """A client of a fresh Temporal: the dev server (``dev``) or the production-shaped
    cluster built from its Go module (``cluster``: PostgreSQL on tmpfs, one process per
    service, two history processes); stopped afterwards."""
    if kind == TemporalKind.dev:
        env = await WorkflowEnvironment.start_local(
            dev_server_existing_path=str(temporal_cli_path()),
            data_converter=pydantic_data_converter, ui=False)
        try:
            yield env.client
        finally:
            await env.shutdown()
        return
    from fleetq.temporal_cluster.build import build
    from fleetq.temporal_cluster.runner import TemporalCluster

    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="fleetq-bench-cluster-", dir=shm) as tmp:
        binaries = await asyncio.to_thread(build, False, print)
        cluster = TemporalCluster(binaries, Path(tmp), progress=print)
        await asyncio.to_thread(cluster.start)
        try:
            yield await Client.connect(cluster.address, data_converter=pydantic_data_converter)
        finally:
            await asyncio.to_thread(cluster.stop)


async def run(args: Options) -> int:
    n, conc = args.jobs, args.concurrency
    tq = f"bench-queue-{uuid.uuid4().hex[:6]}"
    # as in production, the quota workflow runs on the control task queue (its own worker
    # thread), not behind the holders' workflow tasks; the baseline's receiving workflow
    # gets the same treatment
    ctq = f"{tq}-control"
    async with temporal_client(args.temporal) as client:
        worker = build_worker(client, real_activities(client, None), task_queue=tq,
                               control_task_queue=ctq,
                               extra_workflows=[QuotaHolder, SignalCounter, Signaller],
                               extra_control_workflows=[SignalCounter])
        async with worker:
            # ---- baseline: N plain signals into one workflow
            counter = await client.start_workflow(SignalCounter.run, n, id="bench-counter",
                                                  task_queue=ctq)
            base = Phase("signals").start()
            await start_all(client, [f"bench-signaller-{i:05d}" for i in range(n)], conc,
                            lambda wid: client.start_workflow(
                                Signaller.run, counter.id, id=wid, task_queue=tq))
            await counter.result()
            base.stop(n)
            print(base.line("signals"), flush=True)

            # ---- the quota workflow, filled by the plugs
            qh = await client.start_workflow(
                QuotaTreeWorkflow.run, QuotaTreeInput(tree=quota_tree()),
                id="quota/kube-system/elasticquotatree", task_queue=ctq)
            first_run = qh.result_run_id
            plugs = [f"bench-plug-{i:03d}" for i in range(MAX_JOBS)]
            await start_all(client, plugs, conc, lambda wid: client.start_workflow(
                QuotaHolder.run,
                HolderInput(tree_id=qh.id, namespace=NAMESPACE, priority=1000, hold=True),
                id=wid, task_queue=tq))
            await wait_view(qh, lambda v: v.holders == MAX_JOBS, "plugs admitted", 120)

            # ---- the burst
            rng = random.Random(42)
            burst = [f"bench-holder-{i:05d}" for i in range(n)]
            prio = {wid: rng.choice(PRIORITIES) for wid in burst}
            total = Phase("admissions").start()
            enq = Phase("enqueued").start()
            await start_all(client, burst, conc, lambda wid: client.start_workflow(
                QuotaHolder.run,
                HolderInput(tree_id=qh.id, namespace=NAMESPACE, priority=prio[wid]),
                id=wid, task_queue=tq))
            await wait_view(qh, lambda v: v.waiting == n, "burst enqueued", 3600)
            enq.stop(n)
            print(enq.line("jobs"), flush=True)
            drain = Phase("drain").start()
            await asyncio.gather(*(client.get_workflow_handle(wid).signal(QuotaHolder.finish)
                                   for wid in plugs))
            await wait_view(qh, lambda v: v.holders == 0 and v.waiting == 0,
                                    "queue drained", 3600)
            drain.stop(n)
            total.stop(n)
            peak = peak_rss_mb()
            await qh.signal(QuotaTreeWorkflow.stop)
            await qh.result()
            runs, events = await run_chain(client, qh.id, first_run, keep_events=True)

    problems, order = check_order(events, set(burst))
    refused = Counter(
        WorkflowTaskFailedCause.Name(e.workflow_task_failed_event_attributes.cause)[27:]
        for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED)
    problems += [f"quota workflow task failed: {f}" for f in code_task_failures(events)]
    longest = max(r.events for r in runs)
    biggest_can = max(r.continue_as_new_input for r in runs)
    biggest = max(r.largest_payload for r in runs)
    if longest > HISTORY_WARN_EVENTS:
        problems.append(f"a quota workflow run has {longest} events (> {HISTORY_WARN_EVENTS})")
    ratio = total.rate / base.rate
    print()
    print(f"jobs: {n} into one leaf with kube-queue/max-jobs {MAX_JOBS}, "
          f"priorities {PRIORITIES}, start concurrency {conc}, Temporal {args.temporal}")
    print(base.line("signals"))
    print(enq.line("jobs") + "  (holders started and queued)")
    print(drain.line("jobs") + "  (admitted after the plugs released)")
    print(total.line("jobs") + "  (burst start to last grant)")
    sent = len(granted(events))
    if sent != n + MAX_JOBS:
        problems.append(f"the quota workflow sent {sent} grants, expected {n + MAX_JOBS}")
    print(f"grants sent by the quota workflow (all runs): {sent} "
          f"(= {n} + {MAX_JOBS} plugs: {sent == n + MAX_JOBS}); burst granted exactly once "
          f"each, in priority-then-FIFO order: {not problems and len(order) == n}")
    print(f"quota workflow: {len(runs)} runs, events per run {[r.events for r in runs]}")
    print(f"  largest run {longest} events (limit {HISTORY_WARN_EVENTS}); largest "
          f"continue-as-new input {biggest_can / 1024:.1f} KiB; largest event payload "
          f"{biggest / 1024:.1f} KiB")
    print(f"quota workflow tasks failed, by cause: {dict(refused) or 'none'} "
          "(UNHANDLED_COMMAND: a continue-as-new the server refused because signals arrived "
          "while it ran, tolerated; any other cause is an error)")
    print(f"worker process peak RSS: {peak:.0f} MiB")
    print(f"status queries to the quota workflow that timed out: {len(QUERY_TIMEOUTS)}")
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    print(result_line("queue", ratio, TARGET))
    return 0 if not problems else 1


@dataclass(frozen=True)
class Options:
    """``fleetq bench queue``'s options as parsed (the defaults are the command's)."""

    jobs: int
    concurrency: int
    temporal: str = "dev"


app = bench_app()


@app.command(help=help_text(__doc__))
def command(
    jobs: int = typer.Option(10_000, "--jobs", min=1, help="holders in the burst"),
    concurrency: int = typer.Option(
        200, "--concurrency", min=1,
        help="start requests in flight at once (holders and baseline alike)"),
    temporal: TemporalKind = temporal_option(),
) -> None:
    raise typer.Exit(run_main(run(Options(jobs, concurrency, temporal.value))))


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(app, argv, "fleetq bench queue")


if __name__ == "__main__":
    raise SystemExit(main())
