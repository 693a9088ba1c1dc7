"""The build cache and the runner's own behaviour (one real control plane, no member)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fleetq.controlplane.build import (
    BINARIES,
    KUBERNETES_VERSION,
    OPERATOR_BINARIES,
    Build,
    cached,
)
from fleetq.controlplane.runner import ControlPlane
from fleetq.emulator.tls import make_material
from fleetq.topology import parse_topology
from tests.conftest import real_control_plane


@pytest.fixture(scope="module")
def binaries() -> Build:
    return real_control_plane()


def test_a_warm_build_is_a_stamp_read(binaries: Build) -> None:
    outputs = [binaries.binary(name) for name in (*BINARIES, *OPERATOR_BINARIES)]
    before = [p.stat().st_mtime_ns for p in outputs]
    again = cached()
    assert again == binaries
    assert binaries.version == KUBERNETES_VERSION
    for name in (*BINARIES, *OPERATOR_BINARIES):
        assert binaries.binary(name).stat().st_size > 10_000_000
    assert [p.name for p in binaries.crds] == [
        "kubeflow.org_pytorchjobs.yaml", "scheduling.koordinator.sh_reservations.yaml"]
    # the PyTorchJob CRD is the training-operator v1.9.4 module's, from its own part
    assert binaries.crds[0].parent == binaries.operators / "crds"
    assert [p.name for p in binaries.kwok_stages] == [
        "node-heartbeat.yaml", "node-initialize.yaml", "pod-complete.yaml", "pod-delete.yaml",
        "pod-ready.yaml"]
    assert "validate-kubeflow-org-v1-pytorchjob" in binaries.webhook_manifest.read_text()
    from fleetq.cli import app

    result = CliRunner().invoke(app, ["controlplane", "build"])
    assert result.exit_code == 0 and "cached" in result.output
    # nothing was compiled or written again: the binaries are the very same files
    assert [p.stat().st_mtime_ns for p in outputs] == before


def test_a_port_taken_before_the_api_server_binds_costs_a_retry(
    binaries: Build, tmp_path: Path
) -> None:
    spec = parse_topology({"clusters": [{"name": "x", "member": False}]}).clusters[0]
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        plane = ControlPlane(spec, binaries, tmp_path, make_material(["127.0.0.1"]),
                             api_port=port)
        plane.start()
        try:
            assert plane.api_port != port
            assert plane.request("GET", "/readyz")[0] == 200
            assert (tmp_path / "logs" / "kube-apiserver.log.0").is_file()
        finally:
            plane.stop()
