"""The layers the README promises, enforced: import-linter's contracts (pyproject.toml,
``[tool.importlinter]``) must hold — bench above the CLI above workflows above
activities, and a pure core with no Temporal, no HTTP server, no adapter and nothing of
the kubernetes package (``fleetq.resources`` parses quantities itself)."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
    "contracts"]
# fleetq's packages that are edges, not core: each has a contract of its own or sits in
# the layers. Everything else under fleetq/ is the pure core.
EDGE_PACKAGES = {"cli", "client", "runtime", "emulator", "controlplane", "temporal_cluster",
                 "testing", "data", "gobuild"}


def test_import_contracts_hold() -> None:
    lint = Path(sys.executable).parent / "lint-imports"
    assert lint.exists(), "import-linter is part of the test extra"
    done = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout and f"{len(CONTRACTS)} kept" in done.stdout, \
        done.stdout[-1500:]


def test_every_core_module_is_under_the_core_contract() -> None:
    """A new module in fleetq/ is core unless it sits in an edge package, so it cannot
    escape the contract by not being listed."""
    core = {
        f"fleetq.{path.stem if path.is_file() else path.name}"
        for path in (ROOT / "fleetq").iterdir()
        if (path.suffix == ".py" and path.stem != "__init__")
        or (path.is_dir() and (path / "__init__.py").exists()
            and path.name not in EDGE_PACKAGES)
    }
    pure = next(c for c in CONTRACTS if c["name"].startswith("The pure core"))
    assert core - set(pure["source_modules"]) == set()
    assert "temporalio" in pure["forbidden_modules"] and "aiohttp" in pure["forbidden_modules"]


def test_the_core_parses_quantities_without_the_kubernetes_package() -> None:
    """fleetq.resources has its own quantity parser (tests/core/test_resources_quantity.py),
    so reading a quantity does not import the kubernetes client."""
    tree = ast.parse((ROOT / "fleetq" / "resources.py").read_text())
    kube = [
        (node.module, [a.name for a in node.names])
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kubernetes")
    ]
    plain = [a.name for node in ast.walk(tree) if isinstance(node, ast.Import)
             for a in node.names if a.name.startswith("kubernetes")]
    assert kube == [] and plain == []
