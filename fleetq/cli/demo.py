"""``fleetq demo``: the walkthrough end to end on a fresh embedded fleet.

It starts its own Temporal dev server, emulator and worker (a temporary state dir and
free ports, so it never collides with a running ``fleetq up``), applies the
ElasticQuotaTree, the queued Gang PropagationPolicy and the PyTorchJob, shows what the
walkthrough shows (queues, job state, the ``ScheduleBindingSucceed`` event, the member
copy and its pods), and exits 0 only when all pods run on one member cluster.
"""

from __future__ import annotations

import shutil
import signal
import tempfile
import time
import urllib.parse
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import typer

from fleetq.cli.context import guarded, is_tty
from fleetq.cli.describe import describe_job
from fleetq.cli.get import show_get
from fleetq.cli.up import (  # noqa: F401 - WALKTHROUGH, walkthrough_dir: also from here
    WALKTHROUGH,
    Members,
    progress_printer,
    start_and_announce,
    walkthrough_dir,
)

if TYPE_CHECKING:
    from temporalio.client import Client

    from fleetq.job_view import JobView
    from fleetq.runtime.embedded import EmbeddedFleet

JOB_NS, JOB_NAME = "default", "pytorch-test"


def job_ready(view: JobView | None) -> bool:
    """All pods of the job Running on the one cluster it is bound to."""
    if view is None or view.state != "Running" or not view.cluster:
        return False
    if len(view.copies) > 1 or len(view.pods) < 3:
        return False
    return all(p.get("phase") == "Running" for p in view.pods)


def _say(command: str) -> None:
    typer.echo("")
    if is_tty():
        typer.secho(f"$ {command}", bold=True)
    else:
        typer.echo(f"$ {command}")


async def _wait_running(client: Client, timeout: float) -> JobView | None:
    import asyncio

    from fleetq.client.jobs import get_job

    deadline = time.monotonic() + timeout
    last = ""
    view: JobView | None = None
    spinner = None
    if is_tty():
        from rich.console import Console

        spinner = Console(stderr=True).status("waiting for pytorch-test")
        spinner.start()
    try:
        while time.monotonic() < deadline:
            view = await get_job(client, JOB_NS, JOB_NAME)
            if view is not None:
                running = sum(1 for p in view.pods if p.get("phase") == "Running")
                line = (f"pytorch-test: {view.state}"
                        f"{' on ' + view.cluster if view.cluster else ''}"
                        f" — {view.reason or '-'} ({running}/3 pods running)")
                if line != last:
                    if spinner is not None:
                        spinner.update(line)
                    else:
                        typer.echo(f"  ... {line}", err=True)
                    last = line
                if job_ready(view):
                    return view
                if view.state in ("Failed", "Deleted", "Succeeded"):
                    return view
            await asyncio.sleep(0.3)
    finally:
        if spinner is not None:
            spinner.stop()
    return view


async def run_demo(fleet: EmbeddedFleet, examples: Path, timeout: float) -> bool:
    from fleetq.client.apply import apply_objects, load_for_apply
    from fleetq.client.connection import connect

    client = await connect(fleet.address)
    shown = examples.relative_to(Path.cwd()) if examples.is_relative_to(Path.cwd()) else examples
    for file in WALKTHROUGH:
        objects, classes, _ = load_for_apply([str(examples / file)])
        _say(f"fleetq apply -f {shown / file}")
        for r in await apply_objects(client, objects, priority_classes=classes):
            typer.echo(r.line, err=not r.ok)
            if not r.ok:
                return False
    _say("fleetq get queue -n kube-queue")
    await show_get(client, "queue", None, namespace="kube-queue", all_namespaces=False,
                   output=None, all_clusters=False)
    typer.echo("")
    view = await _wait_running(client, timeout)
    _say("fleetq get pytorchjob")
    await show_get(client, "pytorchjob", None, namespace=None, all_namespaces=False,
                   output=None, all_clusters=False)
    _say(f"fleetq describe pytorchjob {JOB_NAME}")
    # the members of this fleet, read directly (its state dir is not the default one)
    members = fleet.fleet_config or None
    for line in await describe_job(client, JOB_NS, JOB_NAME, fleet_config=members):
        typer.echo(line)
    _say("fleetq get pytorchjob -M")
    await show_get(client, "pytorchjob", None, namespace=None, all_namespaces=False,
                   output=None, all_clusters=True, fleet_config=members)
    _say("fleetq get pod -M")
    await show_get(client, "pod", None, namespace=None, all_namespaces=False,
                   output=None, all_clusters=True, fleet_config=members)
    info = fleet.state_dir / "controlplane" / "controlplane.json"
    if info.is_file():  # real members: show who did the work
        import json

        from fleetq.controlplane.runner import process_report

        _say("ps  # the real members' upstream processes, and their logs naming the job")
        for line in process_report(json.loads(info.read_text()), job=JOB_NAME):
            typer.echo(line)
    typer.echo("")
    if job_ready(view):
        assert view is not None
        typer.echo(f"OK: all {len(view.pods)} pods of {JOB_NS}/{JOB_NAME} are Running on "
                   f"{view.cluster} (gang-scheduled on one member cluster)")
        return True
    state = f"{view.state}: {view.reason}" if view else "not found"
    typer.echo(f"error: {JOB_NS}/{JOB_NAME} did not get all pods Running on one cluster "
               f"within {timeout:g}s ({state})", err=True)
    return False


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def job_url(ui_url: str) -> str:
    wid = urllib.parse.quote(f"pytorchjob/{JOB_NS}/{JOB_NAME}", safe="")
    return f"{ui_url}/namespaces/default/workflows/{wid}"


def register(app: typer.Typer) -> None:
    @app.command()
    @guarded
    def demo(
        state_dir: Path | None = typer.Option(
            None, "--state-dir", help="Keep the demo's state here (default: a temp dir, "
                                      "removed afterwards)"),
        timeout: float = typer.Option(60.0, "--timeout",
                                      help="Seconds to wait for the pods to run"),
        keep: bool = typer.Option(False, "--keep",
                                  help="Keep the fleet running after the demo (Ctrl-C stops)"),
        members: Members = typer.Option(
            Members.emulated, "--members",
            help="emulated (the default) or real: member clusters are real control planes "
                 "built from Go modules, pods bound by the real kube-scheduler"),
    ) -> None:
        """Run the walkthrough end to end on a fresh embedded fleet (exit 0 = it works)."""
        import asyncio

        from fleetq.runtime.embedded import EmbeddedFleet
        from fleetq.runtime.supervisor import free_port

        examples = walkthrough_dir()
        # Ctrl-C and SIGTERM both end the demo through the cleanup below (even when the
        # shell started us with SIGINT ignored, as background jobs are).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, _interrupt)
        temp = state_dir is None
        directory = Path(tempfile.mkdtemp(prefix="fleetq-demo-")) if temp else state_dir
        assert directory is not None
        update, finish = progress_printer()
        fleet = EmbeddedFleet(directory.resolve(), port=free_port(), ui_port=free_port(),
                              progress=update, members=members.value)  # type: ignore[arg-type]
        ok = False
        try:
            start_and_announce(fleet, finish)
            ok = asyncio.run(run_demo(fleet, examples, timeout))
            if keep:  # a link only to a fleet that is still there
                typer.echo(f"Web UI of the job: {job_url(fleet.ui_url)}")
                typer.echo(f"fleet kept running (TEMPORAL_ADDRESS={fleet.address}); "
                           "Ctrl-C to stop")
                try:
                    while fleet.check() is None:
                        time.sleep(0.5)
                except KeyboardInterrupt:
                    pass
            else:
                typer.echo("stopping the demo's fleet (fleetq demo --keep keeps it running, "
                           "with its Web UI)", err=True)
        finally:
            # The demo's history is thrown away: no need to wait for the worker's graceful
            # drain of in-flight watch activities.
            fleet.stop(grace=2.0)
            if temp:
                shutil.rmtree(directory, ignore_errors=True)
        if not ok:
            raise typer.Exit(1)
