"""What a user sees when fleetq's views read the member clusters themselves: an evicted
copy still running and its pods, a failed copy during the toleration window, a member
that does not answer, the queue a waiting job is in, a refused ``temporal workflow
start``, and ``--state-dir`` finding the fleet (``get`` and ``sim fault`` alike)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from activities.kube_api import KubeApi
from fleetq.client import members
from fleetq.client.connection import temporal_cli_path
from fleetq.emulator.fleet import INFO_FILE as EMULATOR_INFO
from fleetq.member_contract import MANAGED_BY, RESERVATION_AFFINITY
from fleetq.naming import TASK_QUEUE
from fleetq.runtime.fleet_info import FleetInfo, write_info
from fleetq.runtime.supervisor import free_port
from tests.cli.conftest import EXAMPLES, CliFleet

NS = "views"
JOB_YAML = (EXAMPLES / "pytorch-test.yaml").read_text()
POLICY_YAML = (EXAMPLES / "propagationpolicy-gang.yaml").read_text()
QUEUE_POLICY = str(EXAMPLES / "propagationpolicy-gang-queue.yaml")
TREE = str(EXAMPLES / "elasticquotatree.yaml")


def table(output: str) -> list[list[str]]:
    return [re.split(r"\s{2,}", line.strip()) for line in output.strip().splitlines()]


def job_doc(name: str, namespace: str = NS) -> str:
    return JOB_YAML.replace("name: pytorch-test\n  namespace: default",
                            f"name: {name}\n  namespace: {namespace}")


def policy_doc(purge_mode: str = "Never", toleration: int = 300) -> str:
    return (POLICY_YAML.replace("namespace: default", f"namespace: {NS}")
            .replace("name: example-policy", "name: views-policy")
            .replace("tolerationSeconds: 30", f"tolerationSeconds: {toleration}")
            .replace("purgeMode: Immediately", f"purgeMode: {purge_mode}"))


async def poll(what: str, check: Callable[[], Awaitable[Any]], timeout: float = 30) -> Any:
    """Poll ``check`` until it returns something truthy, or fail naming ``what``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


async def apply_job(cli: CliFleet, name: str, namespace: str = NS) -> None:
    r = await cli.run("apply", "-f", "-", stdin=job_doc(name, namespace))
    assert r.exit_code == 0, r.output


async def apply_running(cli: CliFleet, name: str, namespace: str = NS) -> str:
    """Apply the job and wait until it runs; its cluster."""
    await apply_job(cli, name, namespace)
    return await running_on(cli, name, namespace)


async def running_on(cli: CliFleet, name: str, namespace: str = NS) -> str:
    """Wait until the job runs with all 3 pods; its cluster."""

    async def check() -> str | None:
        r = await cli.run("get", "pytorchjob", name, "-n", namespace, "-o", "json")
        if r.exit_code != 0:
            return None
        status = json.loads(r.stdout)["status"]
        pods = [p for p in status["pods"] if p["phase"] == "Running"]
        return status["cluster"] if status["state"] == "Running" and len(pods) == 3 else None

    cluster: str = await poll(f"{namespace}/{name} Running", check)
    return cluster


async def rows_of(cli: CliFleet, *args: str) -> list[list[str]]:
    r = await cli.run(*args)
    assert r.exit_code == 0, r.output
    return table(r.stdout)


def member_api(cli: CliFleet, cluster: str) -> KubeApi:
    return KubeApi.from_kubeconfig(cluster, str(cli.emulated.kubeconfig_path), cluster)


@pytest.fixture
async def views_policy(cli_fleet: CliFleet) -> None:
    r = await cli_fleet.run("apply", "-f", "-", stdin=policy_doc())
    assert r.exit_code == 0, r.output


async def test_evicted_copy_still_running_shows_with_its_pods(cli_fleet: CliFleet,
                                                              views_policy: None) -> None:
    cli = cli_fleet
    current = await apply_running(cli, "twice")
    other = next(c for c in cli.emulated.members if c != current)
    # A copy of the job left running on another member — what a purge that never
    # reached a partitioned member leaves behind: fleetq's own object, labels included.
    (copy,) = [o for o in cli.emulated.objects(current, "pytorchjobs")
               if o["metadata"]["name"] == "twice" and o["metadata"]["namespace"] == NS]
    assert copy["metadata"]["labels"][MANAGED_BY] == "fleetq"
    meta = copy["metadata"]
    for spec in copy["spec"]["pytorchReplicaSpecs"].values():
        # its pods ran without reservations (a member that has none)
        spec["template"]["metadata"].get("annotations", {}).pop(RESERVATION_AFFINITY, None)
    stale = {"apiVersion": copy["apiVersion"], "kind": copy["kind"], "spec": copy["spec"],
             "metadata": {k: meta[k] for k in ("name", "namespace", "labels", "annotations")
                          if k in meta}}
    api = member_api(cli, other)
    try:
        api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                          "metadata": {"name": NS}})
        api.create(f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs", stale)

        async def stale_pods_run() -> bool:
            pods = [p for p in cli.emulated.objects(other, "pods")
                    if p["metadata"]["name"].startswith("twice-")]
            return len(pods) == 3 and all(p["status"]["phase"] == "Running" for p in pods)

        await poll(f"the stale copy's pods running on {other}", stale_pods_run)

        rows = await rows_of(cli, "get", "pytorchjob", "-M", "-n", NS)
        assert rows[0] == ["NAME", "CLUSTER", "STATE", "AGE", "ADOPTION"]
        mine = {row[1]: row for row in rows[1:] if row[0] == "twice"}
        assert mine[current][2] == "Running"
        assert mine[other][2] == "Evicted, still running"

        rows = await rows_of(cli, "get", "pod", "-M", "-n", NS, "-o", "wide")
        assert rows[0] == ["NAME", "CLUSTER", "READY", "STATUS", "RESTARTS", "AGE", "NODE"]
        pods = {(row[0], row[1]): row for row in rows[1:]}
        for cluster in (current, other):
            for pod in ("master-0", "worker-0", "worker-1"):
                row = pods[(f"twice-{pod}", cluster)]
                assert row[2:5] == ["1/1", "Running", "0"], row
                assert row[6] != "<none>"

        r = await cli.run("get", "pod", "-n", NS, "-o", "json")
        items = json.loads(r.stdout)["items"]
        where = sorted((p["metadata"]["annotations"]["fleetq.io/member-cluster"],
                        p["metadata"]["name"]) for p in items
                       if p["metadata"]["name"].startswith("twice-"))
        assert where == sorted((c, f"twice-{p}") for c in (current, other)
                               for p in ("master-0", "worker-0", "worker-1"))

        r = await cli.run("describe", "pytorchjob", "twice", "-n", NS)
        assert r.exit_code == 0, r.output
        copies = next(line for line in r.stdout.splitlines() if line.startswith("Copies:"))
        assert f"{current} (Running)" in copies
        assert f"{other} (Evicted, still running)" in copies
        pods_section = r.stdout[r.stdout.index("Pods:"):r.stdout.index("Events:")]
        assert pods_section.count(f" {other} ") == 3
        assert pods_section.count(f" {current} ") == 3

        # deleted from the fleet, the copy fleetq did not know of is still there: orphaned
        r = await cli.run("delete", "pytorchjob", "twice", "-n", NS)
        assert r.exit_code == 0, r.output
        rows = await rows_of(cli, "get", "pytorchjob", "-M", "-n", NS)
        assert [[row[i] for i in (0, 1, 2, 4)] for row in rows[1:] if row[0] == "twice"] == [
            ["twice", other, "Orphaned, still running", "N"]]
    finally:
        api.delete(f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs/twice",
                   propagation="Background")
        api.close()
        await cli.run("delete", "pytorchjob", "twice", "-n", NS)

    # Once the stale copy and its pods are gone, nothing of it is listed.
    async def gone() -> bool:
        r = await cli.run("get", "pod", "-M", "-n", NS)
        return "twice-" not in r.stdout

    await poll("the stale pods gone from get pod -M", gone)


async def test_failed_copy_never_shows_running(cli_fleet: CliFleet,
                                               views_policy: None) -> None:
    cli = cli_fleet
    cluster = await apply_running(cli, "breaks")
    r = await cli.run("sim", "fault", cluster, "fail-job", f"{NS}/breaks")
    assert r.exit_code == 0, r.output

    async def failed_row() -> list[str] | None:
        rows = await rows_of(cli, "get", "pytorchjob", "-M", "-n", NS)
        row = next((row for row in rows[1:] if row[:2] == ["breaks", cluster]), None)
        return row if row and row[2] == "Failed" else None

    await poll("the failed copy shown as Failed", failed_row)
    # inside the 300 s toleration window: the copy stays, failed, and never shows Running
    for _ in range(3):
        rows = await rows_of(cli, "get", "pytorchjob", "-M", "-n", NS)
        assert [row[2] for row in rows[1:] if row[:2] == ["breaks", cluster]] == ["Failed"]
    r = await cli.run("describe", "pytorchjob", "breaks", "-n", NS)
    copies = next(line for line in r.stdout.splitlines() if line.startswith("Copies:"))
    assert copies.split(None, 1)[1] == f"{cluster} (Failed)"
    r = await cli.run("delete", "pytorchjob", "breaks", "-n", NS)
    assert r.exit_code == 0, r.output


async def test_unreachable_member_shows_unknown(cli_fleet: CliFleet,
                                                views_policy: None) -> None:
    cli = cli_fleet
    cluster = await apply_running(cli, "silent")
    r = await cli.run("sim", "fault", cluster, "unreachable")
    assert r.exit_code == 0, r.output
    try:
        # no retry ladder for a silent member: the CLI's member client tries once, with
        # short timeouts (fleetq/client/members.py)
        api = members.member_api(*members.member_of(str(cli.emulated.fleet_config_path),
                                                    cluster))
        assert api.retry.attempts == 1
        api.close()
        assert api.connect_s <= members.CONNECT_TIMEOUT_S
        assert api.read_s <= members.READ_TIMEOUT_S
        rows = await rows_of(cli, "get", "pytorchjob", "-M", "-n", NS)
        (row,) = [row for row in rows[1:] if row[:2] == ["silent", cluster]]
        assert re.fullmatch(r"Unknown \(unreachable( since \d{4}-\d\d-\d\dT[\d:]+Z|: .+)\)",
                            row[2]), row

        rows = await rows_of(cli, "get", "pod", "-M", "-n", NS)
        assert not [row for row in rows[1:] if row[0].startswith("silent-")]
        (row,) = [row for row in rows[1:] if row[1] == cluster]
        assert row[0] == "-"
        assert row[3].startswith("Unknown (unreachable"), row

        # once the job has noticed, fleetq says since when
        async def since() -> str | None:
            rows = await rows_of(cli, "get", "pytorchjob", "-M", "-n", NS)
            state = next(row[2] for row in rows[1:] if row[:2] == ["silent", cluster])
            return state if "unreachable since" in state else None

        state = await poll("Unknown (unreachable since ...)", since)
        assert re.fullmatch(r"Unknown \(unreachable since \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\)",
                            state)
        r = await cli.run("describe", "pytorchjob", "silent", "-n", NS)
        assert f"{cluster} (Unknown (unreachable since" in r.stdout
    finally:
        r = await cli.run("sim", "fault", cluster, "reachable")
        assert r.exit_code == 0, r.output
    await running_on(cli, "silent")
    rows = await rows_of(cli, "get", "pytorchjob", "-M", "-n", NS)
    assert [row[2] for row in rows[1:] if row[0] == "silent"] == ["Running"]
    r = await cli.run("delete", "pytorchjob", "silent", "-n", NS)
    assert r.exit_code == 0, r.output


async def test_queue_column_names_the_queue_and_position(cli_fleet: CliFleet,
                                                         tmp_path: Path) -> None:
    cli = cli_fleet
    r = await cli.run("apply", "-f", TREE, "-f", QUEUE_POLICY)
    assert r.exit_code == 0, r.output
    await apply_running(cli, "q-first", "default")
    for name in ("q-second", "q-third"):
        await apply_job(cli, name, "default")

    async def queued() -> dict[str, list[str]] | None:
        rows = await rows_of(cli, "get", "pytorchjob", "-o", "wide")
        by_name = {row[0]: row for row in rows[1:]}
        ok = all(by_name.get(n, ["", ""])[1] == "Queued" for n in ("q-second", "q-third"))
        return by_name if ok else None

    try:
        by_name = await poll("two queued jobs", queued)
        rows = await rows_of(cli, "get", "pytorchjob", "-o", "wide")
        assert rows[0] == ["NAME", "STATE", "AGE", "CLUSTER", "QUEUE", "PRIORITY", "REASON"]
        by_name = {row[0]: row for row in rows[1:]}
        assert re.fullmatch(r"root-child-2-[a-z0-9]{5}", by_name["q-first"][4])
        assert by_name["q-second"][4] == f"{by_name['q-first'][4]} (#1)"
        assert by_name["q-third"][4] == f"{by_name['q-first'][4]} (#2)"
    finally:
        for name in ("q-third", "q-second", "q-first"):
            r = await cli.run("delete", "pytorchjob", name)
            assert r.exit_code == 0, r.output

        # leave the fleet as we found it (the namespace is shared with test_commands)
        async def tree_deleted() -> bool:
            r = await cli.run("delete", "-f", TREE)
            return r.exit_code == 0

        await poll("the tree deleted once the jobs released their quota", tree_deleted)
        r = await cli.run("delete", "-f", QUEUE_POLICY)
        assert r.exit_code == 0, r.output


async def test_refused_temporal_start_shows_refused(cli_fleet: CliFleet,
                                                    tmp_path: Path) -> None:
    cli = cli_fleet
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "notajob", "namespace": NS},
           "spec": {"containers": [{"name": "pytorch", "image": "busybox"}]}}
    inp = tmp_path / "pod.json"
    inp.write_text(json.dumps(pod))
    proc = await asyncio.to_thread(
        subprocess.run,
        [str(temporal_cli_path()), "workflow", "start",
         "--address", cli.env["TEMPORAL_ADDRESS"], "--namespace", cli.env["TEMPORAL_NAMESPACE"],
         "--task-queue", TASK_QUEUE, "--type", "PyTorchJobWorkflow",
         "--workflow-id", f"pytorchjob/{NS}/notajob", "--input-file", str(inp)],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr

    async def refused() -> list[str] | None:
        rows = await rows_of(cli, "get", "pytorchjob", "-A", "-o", "wide")
        row = next((row for row in rows[1:] if row[:2] == [NS, "notajob"]), None)
        return row if row and row[2] == "Refused" else None

    row = await poll("notajob shown as Refused", refused)
    reason = row[-1]
    assert reason != "-" and "\n" not in reason and "Traceback" not in reason
    assert "PyTorchJob" in reason or "Pod" in reason, reason
    r = await cli.run("get", "pytorchjob", "notajob", "-n", NS, "-o", "json")
    status = json.loads(r.stdout)["status"]
    assert status["state"] == "Refused"
    assert status["reason"] == reason


def fleet_state_dir(cli: CliFleet, directory: Path) -> Path:
    """A state dir as a running ``fleetq up`` leaves it: ``fleetq.json`` naming Temporal
    and the fleet config, the emulator's ``emulator.json`` under ``sim/``."""
    directory.mkdir(parents=True, exist_ok=True)
    write_info(FleetInfo(pid=os.getpid(), address=cli.env["TEMPORAL_ADDRESS"],
                         fleet_config=cli.env["FLEETQ_CONFIG"],
                         state_dir=str(directory)), directory)
    (directory / "sim").mkdir(exist_ok=True)
    shutil.copy(cli.emulated.out_dir / EMULATOR_INFO, directory / "sim" / EMULATOR_INFO)
    return directory


# what a shell without fleetq's environment has: the fleet is found through the state dir
NO_ENV: dict[str, Any] = {"TEMPORAL_ADDRESS": None, "FLEETQ_CONFIG": None,
                          "FLEETQ_STATE_DIR": None, "FLEETQ_SIM_DIR": None}


async def test_state_dir_finds_the_fleet_for_get_and_sim_fault(cli_fleet: CliFleet,
                                                                 tmp_path: Path) -> None:
    cli = cli_fleet
    state = fleet_state_dir(cli, tmp_path / "state")
    member = cli.emulated.members[0]

    r = await cli.run("get", "pytorchjob", "-A", "-M", "--state-dir", str(state), env=NO_ENV)
    assert r.exit_code == 0, r.output
    assert "note:" not in r.stderr  # the members were read
    r = await cli.run("get", "queue", "--state-dir", str(state), env=NO_ENV)
    assert r.exit_code == 0, r.output

    r = await cli.run("sim", "fault", member, "latency", "--seconds", "0",
                      "--state-dir", str(state), env=NO_ENV)
    assert r.exit_code == 0, r.output
    r = await cli.run("sim", "fault", member, "latency", "--seconds", "0",
                      env={**NO_ENV, "FLEETQ_STATE_DIR": str(state)})
    assert r.exit_code == 0, r.output
    r = await cli.run("get", "pod", "-A", env={**NO_ENV, "FLEETQ_STATE_DIR": str(state)})
    assert r.exit_code == 0, r.output
    assert "note:" not in r.stderr

    empty = tmp_path / "empty"
    empty.mkdir()
    r = await cli.run("sim", "fault", member, "latency", "--state-dir", str(empty), env=NO_ENV)
    assert r.exit_code == 2
    assert len(r.output.splitlines()) == 1
    assert r.output.startswith("error: no running emulator found")
    # the state dir decides which Temporal the commands talk to
    dead = tmp_path / "dead"
    dead.mkdir()
    port = free_port()
    write_info(FleetInfo(pid=os.getpid(), address=f"127.0.0.1:{port}"), dead)
    r = await cli.run("get", "pytorchjob", "--state-dir", str(dead), env=NO_ENV)
    assert r.exit_code == 1
    assert r.output.splitlines() == [
        f"error: no fleetq found at 127.0.0.1:{port} (start one with: fleetq up)"]


async def test_without_fleet_config_falls_back_to_the_workflows_view(
        cli_fleet: CliFleet, tmp_path: Path) -> None:
    cli = cli_fleet
    env = {"FLEETQ_CONFIG": None, "FLEETQ_STATE_DIR": str(tmp_path)}
    for args in (("get", "pytorchjob", "-A", "-M"), ("get", "pod", "-A")):
        r = await cli.run(*args, env=env)
        notes = [line for line in r.stderr.splitlines() if line.startswith("note:")]
        assert notes == ["note: no fleet config (set FLEETQ_CONFIG, or --state-dir of a running "
                         "fleetq up); showing fleetq's own view of the jobs, not what the "
                         "member clusters report"], (args, r.output)


def test_every_fleet_command_takes_state_dir() -> None:
    from typer.testing import CliRunner

    from fleetq.cli import app

    runner = CliRunner()
    for args in (["get"], ["describe"], ["delete"], ["apply"], ["validate"], ["setup"],
                 ["up"], ["demo"], ["sim", "fault"]):
        r = runner.invoke(app, [*args, "--help"], env={"COLUMNS": "200"})
        assert r.exit_code == 0, (args, r.output)
        assert "--state-dir" in r.output, args
    r = runner.invoke(app, ["get", "--help"], env={"COLUMNS": "200"})
    assert "$FLEETQ_STATE_DIR" in r.output


def test_worker_joins_the_fleet_of_its_state_dir(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from fleetq.cli.context import join_running_fleet_env, use_state_dir

    for var in ("TEMPORAL_ADDRESS", "FLEETQ_CONFIG", "FLEETQ_STATE_DIR"):
        monkeypatch.setenv(var, "")  # restored after the test, even where it was unset
        monkeypatch.delenv(var)
    write_info(FleetInfo(pid=os.getpid(), address="127.0.0.1:7999",
                         fleet_config=str(tmp_path / "fleet.yaml")), tmp_path)
    use_state_dir(tmp_path)
    join_running_fleet_env()
    assert os.environ["FLEETQ_STATE_DIR"] == str(tmp_path)
    assert os.environ["TEMPORAL_ADDRESS"] == "127.0.0.1:7999"
    assert os.environ["FLEETQ_CONFIG"] == str(tmp_path / "fleet.yaml")
    # what the user set wins
    monkeypatch.setenv("FLEETQ_CONFIG", "/etc/fleetq/fleet.yaml")
    join_running_fleet_env()
    assert os.environ["FLEETQ_CONFIG"] == "/etc/fleetq/fleet.yaml"
