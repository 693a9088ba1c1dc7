"""The ``fleetq`` command line (also installed as ``kubectl-fleetq``, so ``kubectl fleetq
get pytorchjob`` works wherever kubectl is installed).

Each sub-command lives in its own module; this one only assembles them.
"""

from __future__ import annotations

import contextlib
import os
import sys

import typer

from fleetq.cli import (
    apply,
    delete,
    demo,
    describe,
    get,
    setup,
    sim,
    suspend,
    up,
    validate,
    worker,
)
from fleetq.cli import bench as bench_cmd
from fleetq.cli import controlplane as controlplane_cmd
from fleetq.cli import temporal_cluster as temporal_cluster_cmd
from fleetq.cli.context import add_state_dir_option

app = typer.Typer(
    name="fleetq",
    help="Multi-cluster gang scheduler for PyTorchJobs, on Temporal.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
demo.register(app)
up.register(app)
apply.register(app)
get.register(app)
describe.register(app)
delete.register(app)
suspend.register(app)
validate.register(app)
worker.register(app)
bench_cmd.register(app)
setup.register(app)
add_state_dir_option(app)  # every command above: --state-dir / FLEETQ_STATE_DIR
app.add_typer(sim.app, name="sim")
app.add_typer(controlplane_cmd.app, name="controlplane")
app.add_typer(temporal_cluster_cmd.app, name="temporal-cluster")


def _flush_telemetry() -> None:
    from fleetq.client.connection import tracing_enabled

    if not tracing_enabled():
        return
    try:
        from opentelemetry import trace

        provider = trace.get_tracer_provider()
        shutdown = getattr(provider, "shutdown", None)
        if callable(shutdown):
            shutdown()
    except Exception:
        pass


def main() -> None:
    """Console-script entry point.

    Ends with ``os._exit`` after flushing output and telemetry: the Temporal client's Rust
    threads can abort CPython's finalization ("PyGILState_Release: thread state must be
    current", temporalio/sdk-python#300), which would turn a successful command into
    exit code 134."""
    code: int = 0
    try:
        app(standalone_mode=True)
    except SystemExit as exc:
        if isinstance(exc.code, int):
            code = exc.code
        elif exc.code is not None:
            print(exc.code, file=sys.stderr)
            code = 1
    _flush_telemetry()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
