"""``fleetq controlplane``: build real Kubernetes control planes and run them as members.

``fleetq controlplane build`` compiles etcd, kube-apiserver, kube-scheduler and kubectl
from the pinned upstream Go modules into ``~/.cache/fleetq/controlplane/<version>/`` (a
warm cache returns at once); ``fleetq controlplane serve`` starts one control plane per
cluster of a topology in the foreground and writes their kubeconfig and fleet config.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Annotated

import typer

from fleetq.cli.local_servers import Force, build_or_reuse, stop_on_signals
from fleetq.cli.output import fail, say
from fleetq.controlplane.build import BuildError, build, cached
from fleetq.controlplane.runner import ControlPlaneError, RealFleet
from fleetq.emulator.fleet import INFO_FILE as EMULATOR_INFO_FILE
from fleetq.emulator.kubeconfig import write_private
from fleetq.topology import TopologyError, default_topology, load_topology

app = typer.Typer(help="Real control planes (etcd, kube-apiserver, kube-scheduler) built "
                       "from Go modules.", no_args_is_help=True,
                  rich_markup_mode=None)

DEFAULT_DIR = Path("~/.fleetq/controlplane").expanduser()
#: Written into --out-dir once every member is up (kubeconfig, fleet config, URLs).
INFO_FILE = "controlplane.json"


@app.command("build")
def build_cmd(force: Force = False) -> None:
    """Build (or reuse) the control-plane binaries; prints where they are."""
    done, state = build_or_reuse(cached, build, force)
    typer.echo(f"{done.bin} ({state}; Kubernetes {done.version})")


@app.command()
def serve(
    topology: Annotated[Path | None, typer.Option(help="Topology YAML (default: shipped)")] = None,
    out_dir: Annotated[
        Path, typer.Option(help="Where kubeconfig, fleet config and data go")
    ] = DEFAULT_DIR,
) -> None:
    """Run one real control plane per topology cluster in the foreground (Ctrl-C stops);
    ``<out-dir>/controlplane.json`` says where they are once all are up, and ``fleetq sim
    fault`` finds their fault control endpoint in ``<out-dir>/emulator.json``."""
    try:
        topo = load_topology(topology) if topology else default_topology()
        binaries = build(progress=say)
    except (TopologyError, BuildError) as exc:
        raise fail(str(exc)) from None
    stop = stop_on_signals()
    fleet = RealFleet(topo, binaries, out_dir)
    try:
        fleet.start(progress=say)
    except ControlPlaneError as exc:
        raise fail(str(exc)) from None
    info = out_dir / INFO_FILE
    control = out_dir / EMULATOR_INFO_FILE  # where `fleetq sim fault` looks
    doc = json.dumps({
        "pid": os.getpid(), "kubeconfig": str(fleet.kubeconfig_path),
        "fleetConfig": str(fleet.fleet_config_path), "controlUrl": fleet.serve_control(),
        "clusters": {p.name: p.public_url for p in fleet.planes},
        "processes": fleet.processes()}, indent=2)
    write_private(control, doc)
    write_private(info, doc)
    try:
        typer.echo(f"kubeconfig: {fleet.kubeconfig_path}")
        typer.echo(f"fleet config: {fleet.fleet_config_path}")
        typer.echo(f"try: {binaries.binary('kubectl')} --kubeconfig {fleet.kubeconfig_path} "
                   "get nodes")
        while not stop.wait(0.5):
            dead = next((c for p in fleet.planes for c in p.children.values()
                         if not c.alive()), None)
            if dead is not None:
                typer.echo(f"error: {dead.name} exited: {dead.tail(3)} (log: {dead.log})",
                           err=True)
                raise typer.Exit(1)
    finally:
        for path in (info, control):
            with contextlib.suppress(OSError):
                path.unlink()
        fleet.stop()
