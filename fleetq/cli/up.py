"""``fleetq up``: the embedded fleet in the foreground — Temporal dev server (history in
``<state-dir>/temporal.db``, Web UI), member clusters (the emulator, or with ``--members
real`` real control planes) and a worker — until Ctrl-C or SIGTERM, which stop all three
cleanly.
"""

from __future__ import annotations

import signal
import threading
import time
from enum import StrEnum
from pathlib import Path
from types import FrameType

import typer

from fleetq.cli.context import CliError, default_state_dir, guarded, is_tty
from fleetq.runtime.embedded import EmbeddedError, EmbeddedFleet


class Members(StrEnum):
    """The kinds of member clusters ``fleetq up`` and ``fleetq demo`` can start."""

    emulated = "emulated"
    real = "real"


def progress_printer(quiet: bool = False) -> tuple[object, object]:
    """``(callback, finisher)``: a rich status spinner on a terminal, plain lines otherwise."""
    if quiet:
        return (lambda _m: None), (lambda: None)
    if is_tty():
        from rich.console import Console

        console = Console(stderr=True)
        status = console.status("starting")
        status.start()

        def update(msg: str) -> None:
            status.update(msg + " ...")
            console.log(msg)

        return update, status.stop
    return (lambda m: typer.echo(f"{m} ...", err=True)), (lambda: None)


def endpoint_lines(fleet: EmbeddedFleet) -> list[str]:
    lines = [
        f"Temporal gRPC   {fleet.address}",
        f"Web UI          {fleet.ui_url}",
        f"kubeconfig      {fleet.kubeconfig}   (members of the {fleet.members} fleet)",
        f"fleet config    {fleet.fleet_config}",
        f"state dir       {fleet.state_dir}   (logs in {fleet.logs})",
    ]
    if not fleet.worker:
        lines.append("worker          not started (--no-worker): run `fleetq worker` with "
                     f"TEMPORAL_ADDRESS={fleet.address} FLEETQ_CONFIG={fleet.fleet_config}")
    return lines


def start_and_announce(fleet: EmbeddedFleet, finish: object) -> None:
    """Start the embedded fleet (one clear error line if it cannot), stop the progress
    display, and print the endpoints."""
    try:
        fleet.start()
    except EmbeddedError as exc:
        raise CliError(f"error: {exc}") from None
    finally:
        finish()  # type: ignore[operator]
    for line in endpoint_lines(fleet):
        typer.echo(line)


def register(app: typer.Typer) -> None:
    @app.command()
    @guarded
    def up(
        topology: Path | None = typer.Option(None, "--topology",
                                             help="Emulator topology YAML (default: shipped)"),
        state_dir: Path = typer.Option(None, "--state-dir",
                                       help="Where history, emulator state and logs live "
                                            "(default: $FLEETQ_STATE_DIR, else ~/.fleetq)"),
        no_worker: bool = typer.Option(False, "--no-worker",
                                       help="Do not start a worker (run `fleetq worker`)"),
        port: int = typer.Option(7233, "--port", help="Temporal gRPC port"),
        ui_port: int = typer.Option(8233, "--ui-port", help="Temporal Web UI port"),
        emulator_base_port: int | None = typer.Option(
            None, "--emulator-base-port",
            help="Emulated cluster i listens on BASE+i (default: free ports)"),
        host: str = typer.Option("127.0.0.1", "--host", help="Address everything binds to"),
        members: Members = typer.Option(
            Members.emulated, "--members",
            help="emulated (fast, the default) or real: etcd + kube-apiserver + "
                 "kube-scheduler per member, built from Go modules (`fleetq controlplane "
                 "build`)"),
        prometheus_port: int | None = typer.Option(
            None, "--prometheus-port",
            help="the worker serves its metrics on HOST:PORT/metrics"),
    ) -> None:
        """Start an embedded fleet (Temporal + Web UI, member clusters, worker)."""
        directory = (state_dir or default_state_dir()).expanduser().resolve()
        stop = threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            stop.set()

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        update, finish = progress_printer()
        fleet = EmbeddedFleet(directory, topology=topology, host=host, port=port,
                              ui_port=ui_port, emulator_base_port=emulator_base_port,
                              worker=not no_worker, progress=update,  # type: ignore[arg-type]
                              members=members.value, prometheus_port=prometheus_port)
        try:
            start_and_announce(fleet, finish)
            typer.echo(f"fleetq is up (pid {__import__('os').getpid()}); try: fleetq apply -f "
                       "examples/ && fleetq get pytorchjob -M.  Ctrl-C to stop.")
            code = 0
            while not stop.wait(0.5):
                dead = fleet.check()
                if dead is not None:
                    typer.echo(f"error: {dead.name} exited with code {dead.proc.returncode}: "
                               f"{dead.tail()} (log: {dead.log}); stopping", err=True)
                    code = 1
                    break
            typer.echo("stopping worker, members and Temporal ...", err=True)
            t0 = time.monotonic()
            fleet.stop()
            typer.echo(f"stopped in {time.monotonic() - t0:.1f}s", err=True)
            if code:
                raise typer.Exit(code)
        finally:
            fleet.stop()
            for s, h in previous.items():
                signal.signal(s, h)
