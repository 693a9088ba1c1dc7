"""The ``fleetq`` command line (also installed as ``kubectl-fleetq``, so ``kubectl fleetq
get pytorchjob`` works wherever kubectl is installed).

Each sub-command lives in its own module; this one only assembles them. Registering a
command costs typer and the standard library only: a command module imports the Temporal
client, the core, the emulator or the runtime inside the command that uses them, and the
``sim``, ``controlplane``, ``temporal-cluster`` and ``webui`` groups are imported when named
(:class:`FleetqGroup`), so ``fleetq get`` and ``fleetq --help`` load what they use
(tests/cli/test_imports.py pins it; ``fleetq bench cli_latency`` times it). Help is
click's plain text (kubectl's layout): option names are never cut.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from typing import Any

import typer
from typer.core import TyperGroup

from fleetq.cli import (
    apply,
    delete,
    demo,
    describe,
    get,
    setup,
    suspend,
    up,
    validate,
    worker,
)
from fleetq.cli import bench as bench_cmd
from fleetq.cli.context import add_state_dir_option, help_settings

#: command groups imported only when named: name -> (module with ``app``, its help line)
LAZY_GROUPS: dict[str, tuple[str, str]] = {
    "sim": ("fleetq.cli.sim", "Member-cluster emulator (loopback Kubernetes API servers)."),
    "controlplane": ("fleetq.cli.controlplane",
                     "Real control planes (etcd, kube-apiserver, kube-scheduler) built from "
                     "Go modules."),
    "temporal-cluster": ("fleetq.cli.temporal_cluster",
                         "A production-shaped Temporal (PostgreSQL, one process per service) "
                         "built from go.temporal.io/server."),
    "webui": ("fleetq.cli.webui",
              "The Temporal Web UI as a browser renders it (headless Chromium)."),
}


class FleetqGroup(TyperGroup):
    """fleetq's root group: the commands registered on :data:`app`, plus
    :data:`LAZY_GROUPS`, each imported the first time it is resolved; ``fleetq --help``
    lists them from their help line without importing them."""

    _listing = False

    def list_commands(self, ctx: Any) -> list[str]:
        names = super().list_commands(ctx)
        return [*names, *(n for n in LAZY_GROUPS if n not in names)]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        cmd = super().get_command(ctx, cmd_name)
        if cmd is not None or cmd_name not in LAZY_GROUPS:
            return cmd
        module, help_line = LAZY_GROUPS[cmd_name]
        if self._listing:
            return TyperGroup(name=cmd_name, help=help_line, rich_markup_mode=None)
        group = typer.main.get_group(importlib.import_module(module).app)
        group.name = cmd_name
        self.commands[cmd_name] = group
        return group

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        self._listing = True
        try:
            super().format_commands(ctx, formatter)
        finally:
            self._listing = False


app = typer.Typer(
    name="fleetq",
    cls=FleetqGroup,
    help="Multi-cluster gang scheduler for PyTorchJobs, on Temporal.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings=help_settings(),
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


def _flush_telemetry() -> None:
    if "opentelemetry" not in sys.modules:  # no command of this process traced anything
        return
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
