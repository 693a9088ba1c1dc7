"""``fleetq up``: the embedded fleet in the foreground — Temporal dev server (history in
``<state-dir>/temporal.db``, Web UI), member clusters (the emulator, or with ``--members
real`` real control planes) and a worker — until Ctrl-C or SIGTERM, which stop all three
cleanly.
"""

from __future__ import annotations

import os
import shlex
import signal
import threading
import time
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Protocol

import typer

from fleetq.cli.context import CliError, guarded, is_tty
from fleetq.runtime.fleet_info import default_state_dir

if TYPE_CHECKING:
    from fleetq.runtime.embedded import EmbeddedFleet
    from fleetq.runtime.supervisor import Child, RestartBudget

#: the walkthrough's manifests, in the order it applies them (the queued Gang policy:
#: ``examples/propagationpolicy-gang.yaml`` is the same policy without queueing)
WALKTHROUGH = ("elasticquotatree.yaml", "propagationpolicy-gang-queue.yaml", "pytorch-test.yaml")
#: a worker that dies is started again, at most this often (then ``fleetq up`` stops)
WORKER_RESTARTS, WORKER_RESTART_WINDOW = 5, 600.0


def walkthrough_dir() -> Path:
    """The repo's ``examples/`` (editable install), else the copy shipped in the package."""
    package = Path(__file__).resolve().parents[1]
    for candidate in (package.parent / "examples", package / "data" / "walkthrough"):
        if all((candidate / f).is_file() for f in WALKTHROUGH):
            return candidate
    raise CliError("error: the walkthrough manifests are missing (examples/ or "
                   "fleetq/data/walkthrough/)")


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


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when under it, else absolute."""
    cwd = Path.cwd()
    return str(path.relative_to(cwd)) if path.is_relative_to(cwd) else str(path)


def next_steps(state_dir: Path, examples: Path | None) -> list[str]:
    """The commands ``fleetq up`` suggests: the walkthrough's three manifests (not the
    whole ``examples/``, whose two policies share a name), preceded by ``export
    FLEETQ_STATE_DIR=...`` when the other commands would not look in ``state_dir``."""
    lines: list[str] = []
    if state_dir.resolve() != default_state_dir().resolve():
        lines.append(f"export FLEETQ_STATE_DIR={shlex.quote(str(state_dir))}")
    if examples is not None:
        files = " ".join(f"-f {shlex.quote(_shown(examples / f))}" for f in WALKTHROUGH)
        lines.append(f"fleetq apply {files}")
    lines.append("fleetq get pytorchjob -M")
    return lines


def start_and_announce(fleet: EmbeddedFleet, finish: object) -> None:
    """Start the embedded fleet (one clear error line if it cannot), stop the progress
    display, and print the endpoints."""
    from fleetq.runtime.embedded import EmbeddedError

    try:
        fleet.start()
    except EmbeddedError as exc:
        raise CliError(f"error: {exc}") from None
    finally:
        finish()  # type: ignore[operator]
    for line in endpoint_lines(fleet):
        typer.echo(line)


class Supervised(Protocol):
    """What :func:`supervise` needs of the fleet (an :class:`EmbeddedFleet`)."""

    def check(self) -> Child | None: ...

    def restart(self, child: Child, timeout: float = ...) -> Child: ...


def supervise(fleet: Supervised, stop: threading.Event, budget: RestartBudget,
              say: Callable[[str], None], poll: float = 0.5) -> int:
    """Watch the children until ``stop`` is set (exit code 0). A worker that dies is
    started again within ``budget`` (each time one line through ``say``); when the
    budget is spent, or Temporal or the members die, one error line and exit code 1."""
    from fleetq.runtime.embedded import EmbeddedError

    while not stop.wait(poll):
        dead = fleet.check()
        if dead is None:
            continue
        what = (f"{dead.name} (pid {dead.pid}) exited with code {dead.proc.returncode}: "
                f"{dead.tail() or 'no output'} (log: {dead.log})")
        if dead.name != "worker":
            say(f"error: {what}; stopping")
            return 1
        if not budget.take():
            say(f"error: {what}; it exited {budget.limit + 1} times within "
                f"{budget.window / 60:g} minutes, so fleetq up stops (fix the cause in its "
                "log, then start fleetq up again)")
            return 1
        say(f"{what}; restarting it ({budget.used} of at most {budget.limit} restarts in "
            f"{budget.window / 60:g} minutes)")
        try:
            new = fleet.restart(dead)
        except EmbeddedError as exc:
            say(f"the restarted worker did not come up: {exc}")
            continue  # it is dead: the next check counts it against the budget
        say(f"worker restarted (pid {new.pid})")
    return 0


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
        """Start an embedded fleet (Temporal + Web UI, member clusters, worker).

        A worker that dies is started again (at most 5 times in 10 minutes); Ctrl-C or
        SIGTERM stops everything."""
        from fleetq.runtime.embedded import EmbeddedFleet
        from fleetq.runtime.supervisor import RestartBudget

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
            try:
                examples: Path | None = walkthrough_dir()
            except CliError:
                examples = None
            typer.echo(f"fleetq is up (pid {os.getpid()}); Ctrl-C to stop. Try, in another "
                       "shell:")
            for line in next_steps(directory, examples):
                typer.echo(f"  {line}")
            budget = RestartBudget(WORKER_RESTARTS, WORKER_RESTART_WINDOW)
            code = supervise(fleet, stop, budget, lambda m: typer.echo(m, err=True))
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
