"""What a CLI command loads (issue 27 item 6): registering the commands, ``--help`` and a
command that does not talk to Temporal import neither the Temporal client nor the
emulator, the embedded runtime, the kubernetes client, numpy or the core; ``fleetq get
pytorchjob`` against a fleet loads the Temporal client and the job view, not the
contracts, the models, yaml or numpy; ``validate`` and ``apply`` of a job load the models
but no numpy and no kubernetes client. Asserted on ``sys.modules`` of a fresh interpreter
(``fleetq bench cli_latency`` times it)."""

from __future__ import annotations

import asyncio
import importlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from fleetq.cli import LAZY_COMMANDS, LAZY_GROUPS, app
from fleetq.runtime.fleet_info import FleetInfo, write_info
from tests.cli.conftest import CliFleet
from tests.cli.test_http_transport import web_fleet  # noqa: F401 - the fixture

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

#: third-party packages that ``fleetq --help`` and ``fleetq get --help`` must not load
#: (typer 0.29 itself coerces a parsed option's value with pydantic, so pydantic is
#: checked only where no option is parsed: the import and ``fleetq --help``)
HEAVY = ("aiohttp", "kubernetes", "cryptography", "numpy", "temporalio", "google",
         "urllib3", "yaml", "rich", "opentelemetry")
#: fleetq's own packages that only a running command (or none of these) needs
HEAVY_OWN = ("fleetq.emulator", "fleetq.runtime.embedded", "fleetq.runtime.supervisor",
             "fleetq.controlplane", "fleetq.temporal_cluster", "fleetq.simulator",
             "fleetq.admission", "fleetq.placement", "fleetq.models", "fleetq.messages",
             "fleetq.client.connection", "fleetq.client.jobs", "activities", "workflows")

RUN = """
import json, os, sys
argv = json.loads(sys.argv[1])
if argv is not None:
    from fleetq.cli import app
    try:
        app(argv, prog_name="fleetq")
    except SystemExit:
        pass
else:
    import fleetq.cli
sys.stdout.flush()
sys.stderr.write("\\nMODULES " + json.dumps(sorted(sys.modules)) + "\\n")
sys.stderr.flush()
os._exit(0)
"""


#: what no everyday command loads (``describe`` aside, which reads the members)
NEVER = ("aiohttp", "cryptography", "rich", "opentelemetry", "fleetq.emulator",
         "fleetq.runtime.embedded", "fleetq.runtime.supervisor", "fleetq.controlplane",
         "fleetq.temporal_cluster", "fleetq.simulator", "workflows")
#: numpy (placement) and the kubernetes client: only a command that places or reads members
NO_NUMPY_NO_KUBE = ("numpy", "kubernetes", "urllib3", "fleetq.placement", "activities")


def loaded(argv: list[str] | None,
           env: dict[str, str] | None = None) -> tuple[set[str], str]:
    """The modules a fresh interpreter holds after ``fleetq ARGV`` (None: after ``import
    fleetq.cli``), and what it printed; ``env`` on top of a bare PATH."""
    proc = subprocess.run([sys.executable, "-c", RUN, json.dumps(argv)], capture_output=True,
                          text=True, timeout=120, env={"PATH": "/usr/bin:/bin", **(env or {})})
    head, _, tail = proc.stderr.rpartition("\nMODULES ")
    assert tail, proc.stderr
    return set(json.loads(tail)), proc.stdout + head


def heavy(modules: set[str], packages: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in packages))


@pytest_asyncio.fixture
async def leaves_no_job(cli_fleet: CliFleet) -> AsyncIterator[CliFleet]:
    """The Temporal server (and so the quota tree) is shared by every module of
    tests/cli: the job these tests apply is deleted after each, so it holds no quota
    another module's jobs wait for."""
    yield cli_fleet
    await cli_fleet.run("delete", "pytorchjob", "pytorch-test")


@pytest.mark.parametrize("argv", [
    None, ["--help"], ["get", "--help"], ["describe", "--help"], ["apply", "--help"],
    ["validate", "--help"], ["delete", "--help"], ["up", "--help"], ["demo", "--help"],
    ["bench"],
], ids=lambda a: "import" if a is None else " ".join(a))
def test_registering_and_help_load_no_heavy_module(argv: list[str] | None) -> None:
    modules, out = loaded(argv)
    if argv is not None:
        assert "Usage: fleetq" in out or "usage: fleetq bench" in out, out
    assert heavy(modules, HEAVY) == []
    assert heavy(modules, HEAVY_OWN) == []
    if argv in (None, ["--help"]):
        assert heavy(modules, ("pydantic",)) == []


def test_validate_loads_the_manifest_core_but_no_temporal_emulator_or_runtime() -> None:
    """``validate`` checks files offline: the models yes, a Temporal client no."""
    modules, out = loaded(["validate", "-f", str(EXAMPLES / "pytorch-test.yaml")])
    assert "OK PyTorchJob default/pytorch-test" in out
    assert "fleetq.models" in modules
    assert heavy(modules, ("temporalio", "fleetq.client.connection", "fleetq.messages")) == []
    assert heavy(modules, NEVER) == []
    assert heavy(modules, NO_NUMPY_NO_KUBE) == []


async def test_get_pytorchjob_loads_the_temporal_client_and_the_job_view(
        leaves_no_job: CliFleet) -> None:
    cli_fleet = leaves_no_job
    """``fleetq get pytorchjob``: one list and one status query per running job, decoded
    as :class:`fleetq.job_view.JobView`; none of the contracts (fleetq.messages), the
    models, the admission core, yaml or numpy."""
    r = await cli_fleet.run("apply", "-f", str(EXAMPLES / "pytorch-test.yaml"))
    assert r.exit_code == 0, r.output
    modules, out = await asyncio.to_thread(loaded, ["get", "pytorchjob"], cli_fleet.env)
    assert out.startswith("NAME") and "pytorch-test" in out, out
    assert {"temporalio.client", "fleetq.job_view"} <= modules
    assert heavy(modules, NEVER) == []
    assert heavy(modules, NO_NUMPY_NO_KUBE) == []
    assert heavy(modules, ("yaml", "fleetq.messages", "fleetq.models", "fleetq.admission",
                           "fleetq.registry", "fleetq.manifests", "fleetq.fleet_config",
                           "fleetq.client.members", "fleetq.cli.member_views")) == []


async def test_get_pytorchjob_over_http_loads_no_temporal_sdk(
        web_fleet: tuple[CliFleet, str], tmp_path: Path) -> None:  # noqa: F811
    """``fleetq get pytorchjob`` (and ``NAME``, ``-o wide|json``) against a ``fleetq up``
    whose fleetq.json names its Web UI's HTTP API (no TEMPORAL_ADDRESS): the standard
    library's HTTP client (and the job view for ``-o json``), no temporalio at all (nor
    its Rust bridge, protobuf or grpc), and nothing else heavy."""
    cli, ui = web_fleet
    r = await cli.run("apply", "-f", str(EXAMPLES / "pytorch-test.yaml"))
    assert r.exit_code == 0, r.output
    import os

    state = tmp_path / "state"
    state.mkdir()
    write_info(FleetInfo(pid=os.getpid(), address=cli.env["TEMPORAL_ADDRESS"], ui_url=ui,
                         http_api=ui, state_dir=str(state)), state)
    # FLEETQ_DEBUG says why, should a read fall back to the SDK; a generous timeout keeps
    # a loaded worker's late answer from causing one (the fallback is correct, but it is
    # not what this test pins)
    env = {"FLEETQ_STATE_DIR": str(state), "XDG_CONFIG_HOME": str(tmp_path),
           "FLEETQ_DEBUG": "1", "FLEETQ_HTTP_API_TIMEOUT": "60"}
    try:
        for argv, expect in ((["get", "pytorchjob"], "NAME"),
                             (["get", "pytorchjob", "pytorch-test", "-o", "wide"], "NAME"),
                             (["get", "pytorchjob", "-o", "json"], "{")):
            modules, out = await asyncio.to_thread(loaded, argv, env)
            assert out.startswith(expect) and "pytorch-test" in out, out
            assert {"fleetq.client.http_api", "http.client"} <= modules
            # the job view (pydantic) validates whole views for -o json only
            assert ("fleetq.job_view" in modules) == ("json" in argv), (argv, out)
            assert heavy(modules, ("temporalio", "google", "grpc", "fleetq.client.connection",
                                   "fleetq.client.jobs", "fleetq.client.registry")) == []
            assert heavy(modules, NEVER) == []
            assert heavy(modules, NO_NUMPY_NO_KUBE) == []
            assert heavy(modules, ("yaml", "fleetq.messages", "fleetq.models")) == []
            # the command modules other than get, asyncio, and pydantic: typer's own
            # argument coercion (plain_params) and JobView validation (the table reads
            # http_api.JobRow) are what they cost; -o json validates whole views
            others = {f"fleetq.cli.{m.rsplit('.', 1)[1]}"
                      for m, _ in LAZY_COMMANDS.values()} - {"fleetq.cli.get"}
            assert sorted(others & modules) == []
            if "json" not in argv:
                assert heavy(modules, ("asyncio", "pydantic", "concurrent")) == [], argv
        # FLEETQ_HTTP_API=off: the SDK, as before
        modules, out = await asyncio.to_thread(
            loaded, ["get", "pytorchjob"], {**env, "FLEETQ_HTTP_API": "off"})
        assert "pytorch-test" in out and "temporalio.client" in modules, out
    finally:
        await cli.run("delete", "pytorchjob", "pytorch-test")


async def test_apply_of_a_job_loads_no_numpy_and_no_kubernetes_client(
        leaves_no_job: CliFleet) -> None:
    cli_fleet = leaves_no_job
    """``fleetq apply -f job.yaml`` validates with the models and reads the registry's
    priority classes; the contracts, placement (numpy) and the kubernetes client it
    does not need."""
    job = str(EXAMPLES / "pytorch-test.yaml")
    modules, out = await asyncio.to_thread(loaded, ["apply", "-f", job], cli_fleet.env)
    assert "pytorchjob.kubeflow.org/pytorch-test" in out, out
    assert {"temporalio.client", "fleetq.models", "fleetq.manifests"} <= modules
    assert heavy(modules, NEVER) == []
    assert heavy(modules, NO_NUMPY_NO_KUBE) == []
    assert heavy(modules, ("fleetq.messages",)) == []


async def test_describe_loads_no_emulator_runtime_or_workflows(leaves_no_job: CliFleet) -> None:
    cli_fleet = leaves_no_job
    """``fleetq describe`` reads the job and its member copies (the kubernetes client of
    ``activities.kube_api``, which traces its calls, through the fleet config), nothing
    of the embedded stack."""
    r = await cli_fleet.run("apply", "-f", str(EXAMPLES / "pytorch-test.yaml"))
    assert r.exit_code == 0, r.output
    modules, out = await asyncio.to_thread(
        loaded, ["describe", "pytorchjob", "pytorch-test"], cli_fleet.env)
    assert "Name:         pytorch-test" in out, out
    assert heavy(modules, tuple(m for m in NEVER if m != "opentelemetry")) == []


def test_a_lazy_group_is_imported_when_named_and_lists_its_own_help() -> None:
    """``fleetq --help`` lists sim/controlplane/temporal-cluster from LAZY_GROUPS without
    importing them; each line must be the group's own help, and ``fleetq sim --help``
    (which does import it) shows its commands."""
    for name, (module, help_line) in LAZY_GROUPS.items():
        assert importlib.import_module(module).app.info.help == help_line, name
    modules, out = loaded(["--help"])
    for name in LAZY_GROUPS:
        assert f"  {name} " in out
    assert "fleetq.cli.sim" not in modules
    modules, out = loaded(["sim", "--help"])
    assert "fleetq.cli.sim" in modules
    assert "Usage: fleetq sim" in out and "serve" in out and "replay" in out


def test_every_command_is_imported_when_named_and_listed_with_its_own_help() -> None:
    """``fleetq --help`` lists LAZY_COMMANDS without importing any command module; the
    listing is the one the commands themselves give (each loaded), and ``fleetq get
    --help`` imports the get module only."""
    from typer.testing import CliRunner

    lazy = CliRunner().invoke(app, ["--help"], prog_name="fleetq").output
    import typer

    group = typer.main.get_command(app)
    for name in (*LAZY_COMMANDS, *LAZY_GROUPS):
        assert group.get_command(None, name) is not None, name  # type: ignore[attr-defined]
    assert CliRunner().invoke(app, ["--help"], prog_name="fleetq").output == lazy
    modules, out = loaded(["--help"])
    assert heavy(modules, tuple({m for m, _ in LAZY_COMMANDS.values()})) == []
    modules, out = loaded(["get", "--help"])
    assert "Usage: fleetq get" in out
    assert sorted(m for m in modules if m.startswith("fleetq.cli.")) == [
        "fleetq.cli.context", "fleetq.cli.get", "fleetq.cli.output"]


def test_the_http_rows_know_every_job_state() -> None:
    import typing

    from fleetq.client.http_api import JOB_STATES
    from fleetq.job_view import JobState

    assert frozenset(typing.get_args(JobState)) == JOB_STATES


def test_help_never_cuts_an_option_name() -> None:
    """Off a terminal, rich's 80-column panels cut ``--liveness-stall-seconds`` to
    ``--liveness-stall-seco…``; the plain help prints every option name whole."""
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["worker", "--help"], prog_name="fleetq")
    assert result.exit_code == 0, result.output
    assert result.output.startswith("Usage: fleetq worker [OPTIONS]")
    for option in ("--liveness-stall-seconds", "--versioning / --no-versioning",
                   "--deployment-name", "--control-task-queue", "--prometheus-port"):
        assert option in result.output
    assert "…" not in result.output
    up = CliRunner().invoke(app, ["up", "--help"], prog_name="fleetq")
    assert "--emulator-base-port" in up.output and "…" not in up.output
