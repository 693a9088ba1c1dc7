"""``fleetq controlplane``: build real Kubernetes control planes and run them as members.

``fleetq controlplane build`` compiles etcd, kube-apiserver, kube-scheduler and kubectl
from the pinned upstream Go modules into ``~/.cache/fleetq/controlplane/<version>/`` (a
warm cache returns at once); ``fleetq controlplane serve`` starts one control plane per
cluster of a topology in the foreground and writes their kubeconfig and fleet config.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Annotated

import typer

from fleetq.controlplane.build import BuildError, build, cached
from fleetq.controlplane.runner import ControlPlaneError, RealFleet
from fleetq.emulator.topology import TopologyError, default_topology, load_topology

app = typer.Typer(help="Real control planes (etcd, kube-apiserver, kube-scheduler) built "
                       "from Go modules.", no_args_is_help=True)

DEFAULT_DIR = Path("~/.fleetq/controlplane").expanduser()


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


@app.command("build")
def build_cmd(
    force: Annotated[bool, typer.Option(help="Rebuild even if the cache is warm")] = False,
) -> None:
    """Build (or reuse) the control-plane binaries; prints where they are."""
    warm = None if force else cached()
    start = time.monotonic()
    try:
        done = warm or build(force=force, progress=lambda msg: typer.echo(msg, err=True))
    except BuildError as exc:
        raise _fail(str(exc)) from None
    state = "cached" if warm else f"built in {time.monotonic() - start:.0f}s"
    typer.echo(f"{done.bin} ({state}; Kubernetes {done.version})")


@app.command()
def serve(
    topology: Annotated[Path | None, typer.Option(help="Topology YAML (default: shipped)")] = None,
    out_dir: Annotated[
        Path, typer.Option(help="Where kubeconfig, fleet config and data go")
    ] = DEFAULT_DIR,
) -> None:
    """Run one real control plane per topology cluster in the foreground (Ctrl-C stops)."""
    try:
        topo = load_topology(topology) if topology else default_topology()
        binaries = build(progress=lambda msg: typer.echo(msg, err=True))
    except (TopologyError, BuildError) as exc:
        raise _fail(str(exc)) from None
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    fleet = RealFleet(topo, binaries, out_dir)
    try:
        fleet.start(progress=lambda msg: typer.echo(msg, err=True))
    except ControlPlaneError as exc:
        raise _fail(str(exc)) from None
    try:
        typer.echo(f"kubeconfig: {fleet.kubeconfig_path}")
        typer.echo(f"fleet config: {fleet.fleet_config_path}")
        typer.echo(f"try: {binaries.binary('kubectl')} --kubeconfig {fleet.kubeconfig_path} "
                   "get nodes")
        stop.wait()
    finally:
        fleet.stop()
