"""What a CLI command loads (issue 27 item 6): registering the commands, ``--help`` and a
command that does not talk to Temporal import neither the Temporal client nor the
emulator, the embedded runtime, the kubernetes client, numpy or the core. Asserted on
``sys.modules`` of a fresh interpreter (``fleetq bench cli_latency`` times it)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fleetq.cli import LAZY_GROUPS, app

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


def loaded(argv: list[str] | None) -> tuple[set[str], str]:
    """The modules a fresh interpreter holds after ``fleetq ARGV`` (None: after ``import
    fleetq.cli``), and what it printed."""
    proc = subprocess.run([sys.executable, "-c", RUN, json.dumps(argv)], capture_output=True,
                          text=True, timeout=120, env={"PATH": "/usr/bin:/bin"})
    head, _, tail = proc.stderr.rpartition("\nMODULES ")
    assert tail, proc.stderr
    return set(json.loads(tail)), proc.stdout + head


def heavy(modules: set[str], packages: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in packages))


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
    assert heavy(modules, ("temporalio", "aiohttp", "cryptography", "fleetq.emulator",
                           "fleetq.runtime.embedded", "fleetq.client.connection")) == []


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
