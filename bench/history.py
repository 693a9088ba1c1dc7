"""Benchmark: how much workflow history one job costs.

The walkthrough job's history events on the real stack, by type; then a job running 7
simulated days on Temporal's time-skipping test server, continuing as new so every run
stays below a constant. The ratio is Temporal's history warning (10,240 events) ÷ the
7-day job's longest run (target 1.0). Method: BENCHMARKS.md "Bench methods"; figures: §4.

Run: ``fleetq bench history [--days 7] [--run-seconds 3]``.
Last line: ``RESULT history <ratio> (target 1.0)``.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import typer
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from bench.command import bench_app, help_text, run_command
from bench.common import (
    HISTORY_WARN_EVENTS,
    RunStats,
    embedded_stack,
    gang_policy,
    real_activities,
    result_line,
    run_chain,
    run_main,
)
from fleetq.client.apply import apply_objects, load_for_apply
from fleetq.client.connection import test_server_path, until_polled
from fleetq.messages import (
    JobView,
)
from fleetq.naming import job_workflow_id
from fleetq.testing.fake_fleet import ClusterScript, FakeFleet
from worker import build_worker
from workflows import ALL_WORKFLOWS
from workflows.pytorch_job import MAX_HISTORY_EVENTS

TARGET = 1.0
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
WALKTHROUGH = ("elasticquotatree.yaml", "propagationpolicy-gang-queue.yaml", "pytorch-test.yaml")
RUNNING_AFTER = 5.0


def print_runs(title: str, runs: Sequence[RunStats]) -> None:
    total = sum(r.events for r in runs)
    print(f"{title}: {total} events in {len(runs)} run(s); per run {[r.events for r in runs]}")


def by_type(runs: Sequence[RunStats]) -> str:
    counts: dict[str, int] = {}
    for r in runs:
        for k, v in r.event_counts.items():
            counts[k] = counts.get(k, 0) + v
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))


# ---------------------------------------------------------------------- 1. real stack


async def walkthrough(run_seconds: int) -> list[RunStats]:
    objects, classes, _notes = load_for_apply([str(EXAMPLES / f) for f in WALKTHROUGH])
    async with embedded_stack() as stack:
        client = stack.client
        acts = real_activities(client, stack.fleet_config)
        try:
            async with build_worker(client, acts):
                await until_polled(client)  # the in-process worker polls both queues
                for line in await apply_objects(client, objects, run_seconds=run_seconds,
                                                priority_classes=classes):
                    print(line.line)
                job = next(o for o, _m in objects if o.kind == "PyTorchJob")
                wid = job_workflow_id(job.metadata.namespace, job.metadata.name)
                handle = client.get_workflow_handle(wid, result_type=JobView)
                desc = await handle.describe()
                view: JobView = await handle.result()
                runs, _ = await run_chain(client, wid, desc.run_id)
        finally:
            if acts._fleet is not None:
                acts._fleet.close()
    print(f"walkthrough job {wid}: {view.state} on {view.cluster} "
          f"(pods ran {run_seconds} s)")
    return runs


# ---------------------------------------------------------------------- 2. a week


def scripted_fleet(run_for: timedelta) -> FakeFleet:
    """One member cluster ``sim-a`` on which a bound job is Created, then Running after
    5 s, then Succeeded after ``run_for`` (virtual time of the time-skipping server)."""
    succeeded = run_for.total_seconds()
    return FakeFleet(
        {"sim-a": ClusterScript(timeline=[(RUNNING_AFTER, "Healthy", "Running", ""),
                                          (succeeded, "Healthy", "Succeeded", "")])},
        policy_doc=gang_policy("week-policy", "default"))


async def long_job(days: float, rewatch_seconds: float) -> tuple[JobView, list[RunStats]]:
    manifest, _classes, _notes = load_for_apply([str(EXAMPLES / "pytorch-test.yaml")])
    doc = manifest[0][1]
    doc["metadata"]["name"] = "week"
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=str(test_server_path()),
        data_converter=pydantic_data_converter)
    try:
        tq = f"bench-history-{uuid.uuid4().hex[:6]}"
        fleet = scripted_fleet(timedelta(days=days))
        fleet.client = env.client
        async with Worker(env.client, task_queue=tq, workflows=ALL_WORKFLOWS,
                          activities=fleet.activities()):
            wid = job_workflow_id("default", "week")
            handle = await env.client.start_workflow(
                "PyTorchJobWorkflow",
                {"manifest": doc, "rewatch_seconds": rewatch_seconds},
                id=wid, task_queue=tq, execution_timeout=timedelta(days=days + 30),
                result_type=JobView)
            view: JobView = await handle.result()
            runs, _ = await run_chain(env.client, wid, handle.first_execution_run_id)
    finally:
        await env.shutdown()
    return view, runs


async def run(args: Options) -> int:
    problems: list[str] = []
    walk = await walkthrough(args.run_seconds)
    print_runs("walkthrough job history", walk)
    print(f"  by type: {by_type(walk)}")

    view, runs = await long_job(args.days, args.rewatch_seconds)
    longest = max(r.events for r in runs)
    print(f"{args.days:g}-day job (time-skipping, rewatch every {args.rewatch_seconds:g} s): "
          f"{view.state}")
    print_runs(f"{args.days:g}-day job history", runs)
    print(f"  longest run {longest} events; continue-as-new threshold "
          f"{MAX_HISTORY_EVENTS}; Temporal's warning {HISTORY_WARN_EVENTS}")
    print(f"  largest continue-as-new input "
          f"{max(r.continue_as_new_input for r in runs) / 1024:.1f} KiB")
    if view.state != "Succeeded":
        problems.append(f"the {args.days:g}-day job ended {view.state}")
    if walk and walk[-1].event_counts.get("workflow_execution_completed", 0) != 1:
        problems.append("the walkthrough job did not complete")
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    print(result_line("history", HISTORY_WARN_EVENTS / longest, TARGET))
    return 0 if not problems and longest < HISTORY_WARN_EVENTS else 1


@dataclass(frozen=True)
class Options:
    """``fleetq bench history``'s options as parsed (the defaults are the command's)."""

    days: float
    rewatch_seconds: float
    run_seconds: int


app = bench_app()


def _positive(value: float) -> float:
    if value <= 0:
        raise typer.BadParameter("must be positive")
    return value


@app.command(help=help_text(__doc__))
def command(
    days: float = typer.Option(7.0, "--days", callback=_positive,
                               help="simulated run time of the long job"),
    rewatch_seconds: float = typer.Option(
        600.0, "--rewatch-seconds", callback=_positive,
        help="the long job's pause between quiet watch windows"),
    run_seconds: int = typer.Option(
        3, "--run-seconds", min=0,
        help="how long the walkthrough job's pods run on the emulator"),
) -> None:
    raise typer.Exit(run_main(run(Options(days, rewatch_seconds, run_seconds))))


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(app, argv, "fleetq bench history")


if __name__ == "__main__":
    raise SystemExit(main())
