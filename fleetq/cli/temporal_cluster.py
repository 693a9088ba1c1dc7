"""``fleetq temporal-cluster``: a production-shaped Temporal built from its Go module.

``fleetq temporal-cluster build`` compiles ``temporal-server``, ``temporal-sql-tool`` and
``tdbg`` from the pinned ``go.temporal.io/server`` into
``~/.cache/fleetq/temporal-cluster/<version>/`` (a warm cache returns at once);
``fleetq temporal-cluster up`` runs PostgreSQL and frontend, matching, worker and history
processes on loopback in the foreground until Ctrl-C, with the ``default`` namespace and
fleetq's search attributes registered. Point fleetq at it with ``TEMPORAL_ADDRESS``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fleetq.cli.local_servers import Force, build_or_reuse, stop_on_signals
from fleetq.cli.output import fail, say
from fleetq.temporal_cluster.build import BuildError, build, cached
from fleetq.temporal_cluster.config import Layout
from fleetq.temporal_cluster.runner import ClusterError, TemporalCluster

app = typer.Typer(help="A production-shaped Temporal (PostgreSQL, one process per "
                       "service) built from go.temporal.io/server.", no_args_is_help=True,
                  rich_markup_mode=None)

DEFAULT_DIR = Path("~/.fleetq/temporal-cluster").expanduser()
#: written into --state-dir once the cluster serves (address, pids, ports, logs)
INFO_FILE = "temporal-cluster.json"


@app.command("build")
def build_cmd(force: Force = False) -> None:
    """Build (or reuse) the Temporal server binaries; prints where they are."""
    done, state = build_or_reuse(cached, build, force)
    typer.echo(f"{done.root / 'bin'} ({state}; Temporal {done.version}; PostgreSQL "
               f"{done.postgres})")


@app.command()
def up(
    state_dir: Annotated[Path, typer.Option(
        help="PostgreSQL data, configs and logs (kept between runs)")] = DEFAULT_DIR,
    port: Annotated[int, typer.Option(help="Frontend gRPC port")] = 7233,
    histories: Annotated[int, typer.Option(min=1, help="History processes")] = 2,
    shards: Annotated[int, typer.Option(
        min=1, help="History shards (fixed when the database is created)")] = 4,
) -> None:
    """Run the cluster in the foreground until Ctrl-C; ``<state-dir>/temporal-cluster.json``
    says where it is once it serves."""
    try:
        binaries = build(progress=say)
    except BuildError as exc:
        raise fail(str(exc)) from None
    stop = stop_on_signals()
    cluster = TemporalCluster(binaries, state_dir, Layout(histories, shards),
                              frontend_port=port, progress=say)
    try:
        cluster.start()
    except ClusterError as exc:
        raise fail(str(exc)) from None
    info = cluster.write_info(state_dir / INFO_FILE)
    typer.echo(f"Temporal gRPC   {cluster.address}   (TEMPORAL_ADDRESS={cluster.address})")
    typer.echo(f"processes       {', '.join(f'{n} {p}' for n, p in cluster.pids.items())}")
    typer.echo(f"state dir       {state_dir}   (logs in {cluster.logs}; {info.name})")
    try:
        while not stop.wait(1.0):
            dead = next((c for c in cluster.children if not c.alive()), None)
            if dead is not None:
                raise fail(f"{dead.name} exited: {dead.tail() or 'no output'} "
                            f"(log: {dead.log})")
    finally:
        cluster.stop()
        info.unlink(missing_ok=True)
