"""The walkthrough end to end on real members: what ``fleetq demo --members real`` does —
Temporal, three real member control planes and a hub, a worker — then kubectl against
the member shows the gang's pods, bound to nodes by the real kube-scheduler, Running."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetq.embedded import EmbeddedFleet, free_port


@pytest.fixture(scope="module")
def real_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedFleet]:
    from fleetq.controlplane.build import BuildError, build

    try:
        build()
    except BuildError as exc:
        pytest.skip(f"no real control plane: {exc}")
    fleet = EmbeddedFleet(tmp_path_factory.mktemp("embedded-real"), port=free_port(),
                          ui_port=free_port(), members="real")
    fleet.start(timeout=120)
    try:
        yield fleet
    finally:
        fleet.stop(grace=2.0)


def test_walkthrough_runs_on_real_members_and_kubectl_sees_it(
    real_fleet: EmbeddedFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    from fleetq.cli.demo import run_demo, walkthrough_dir
    from fleetq.controlplane.build import build

    assert asyncio.run(run_demo(real_fleet, walkthrough_dir(), timeout=90))
    out = capsys.readouterr().out
    assert "ScheduleBindingSucceed" in out and "OK: all 3 pods" in out
    cluster = out.split("OK: all 3 pods of default/pytorch-test are Running on ")[1].split()[0]

    kubectl = str(build().binary("kubectl"))
    base = [kubectl, "--kubeconfig", real_fleet.kubeconfig, "--context", cluster]
    version = subprocess.run([*base, "version", "-o", "json"], capture_output=True, text=True,
                             check=True, timeout=30)
    assert json.loads(version.stdout)["serverVersion"]["gitVersion"] == build().version
    got = subprocess.run([*base, "get", "pods", "-n", "default", "-o", "json"],
                         capture_output=True, text=True, check=True, timeout=30)
    pods = json.loads(got.stdout)["items"]
    assert sorted(p["metadata"]["name"] for p in pods) == [
        "pytorch-test-master-0", "pytorch-test-worker-0", "pytorch-test-worker-1"]
    for p in pods:
        assert p["status"]["phase"] == "Running"
        assert p["spec"]["nodeName"].startswith(f"{cluster}-")
        scheduled = next(c for c in p["status"]["conditions"] if c["type"] == "PodScheduled")
        assert scheduled["status"] == "True"  # set by the real kube-scheduler's binding
    table = subprocess.run([*base, "get", "pods", "-n", "default"], capture_output=True,
                           text=True, check=True, timeout=30).stdout
    assert table.count("Running") == 3
    assert Path(real_fleet.fleet_config).is_file()
