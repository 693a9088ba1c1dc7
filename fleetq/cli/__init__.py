"""The ``fleetq`` command line (also installed as ``kubectl-fleetq``, so ``kubectl fleetq
get pytorchjob`` works wherever kubectl is installed).

Each sub-command lives in its own module; this one only names them. Every command and
group is imported when it is named (:class:`FleetqGroup`, from :data:`LAZY_COMMANDS` and
:data:`LAZY_GROUPS`), so ``fleetq get`` imports the ``get`` module only, and ``fleetq
--help`` lists every command from its help line without importing any
(tests/cli/test_imports.py pins both, and that each line is the command's own; ``fleetq
bench cli_latency`` times it). A command module imports the Temporal client, the core,
the emulator or the runtime inside the command that uses them. Help is click's plain
text (kubectl's layout): option names are never cut.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

from fleetq.cli.context import add_state_dir_option, help_settings, plain_params

#: commands imported only when named, in ``fleetq --help``'s order: name -> (module whose
#: ``register(app)`` adds it, its help line). Several names can share a module.
LAZY_COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("fleetq.cli.demo",
             "Run the walkthrough end to end on a fresh embedded fleet (exit 0 = it works)."),
    "up": ("fleetq.cli.up",
           "Start an embedded fleet (Temporal + Web UI, member clusters, worker)."),
    "apply": ("fleetq.cli.apply",
              "Apply ElasticQuotaTrees, PriorityClasses, PropagationPolicies and PyTorchJobs."),
    "get": ("fleetq.cli.get",
            "Display fleet objects (PyTorchJobs, their pods and copies, queues, policies)."),
    "describe": ("fleetq.cli.describe",
                 "Show a PyTorchJob's state, placement, queue position and events."),
    "delete": ("fleetq.cli.delete",
               "Delete PyTorchJobs (purging member copies), policies, classes or the tree."),
    "suspend": ("fleetq.cli.suspend",
                "Suspend a job: purge its member copies, release its quota."),
    "resume": ("fleetq.cli.suspend",
               "Resume a suspended job: it queues again with its submit time."),
    "validate": ("fleetq.cli.validate",
                 "Validate manifests (ElasticQuotaTree, PropagationPolicy, PyTorchJob, "
                 "PriorityClass) without contacting any cluster; warn of jobs the running "
                 "fleet's quota tree would never admit."),
    "worker": ("fleetq.cli.worker",
               "Run a fleetq worker (python worker.py); --help lists its options."),
    "bench": ("fleetq.cli.bench",
              "Run a benchmark: fleetq bench NAME [options]; fleetq bench NAME --help."),
    "setup": ("fleetq.cli.setup",
              "Register fleetq's search attributes, start the registry workflow and, with "
              "--set-current, route new workflows to a build."),
}
#: the commands that also take Temporal's address and the fleet config from --state-dir
JOIN_ENV = ("worker",)

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


def load_commands(module: str) -> dict[str, Any]:
    """The click commands a command module's ``register(app)`` adds, each with
    ``--state-dir`` (:func:`~fleetq.cli.context.add_state_dir_option`)."""
    sub = typer.Typer(add_completion=False, pretty_exceptions_enable=False,
                      rich_markup_mode=None)
    importlib.import_module(module).register(sub)
    add_state_dir_option(sub, JOIN_ENV)
    commands: dict[str, Any] = dict(typer.main.get_group(sub).commands)
    for command in commands.values():
        plain_params(command)
    return commands


class _Params:
    """Something with ``params``, for :func:`~fleetq.cli.context.plain_params`."""

    def __init__(self, params: list[Any]) -> None:
        self.params = params


class FleetqGroup(TyperGroup):
    """fleetq's root group: :data:`LAZY_COMMANDS` and :data:`LAZY_GROUPS`, each imported
    the first time it is resolved; ``fleetq --help`` lists them from their help line
    without importing them."""

    _listing = False

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)
        if option is not None:
            plain_params(_Params([option]))
        return option

    def list_commands(self, ctx: Any) -> list[str]:
        names = super().list_commands(ctx)
        return [*names, *(n for n in (*LAZY_COMMANDS, *LAZY_GROUPS) if n not in names)]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        cmd = super().get_command(ctx, cmd_name)
        if cmd is not None:
            return cmd
        if cmd_name in LAZY_COMMANDS:
            module, help_line = LAZY_COMMANDS[cmd_name]
            if self._listing:
                return TyperCommand(name=cmd_name, help=help_line, rich_markup_mode=None)
            self.commands.update(load_commands(module))
            return self.commands.get(cmd_name)
        if cmd_name not in LAZY_GROUPS:
            return None
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


@app.callback()
def _root() -> None:
    # a group with no command registered up front (they are all lazy) needs a callback
    pass


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
