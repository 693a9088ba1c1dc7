"""``fleetq delete`` and ``fleetq apply`` of a finished job, as a user sees them (issue 24
item 4): apply again runs it anew (a new PyTorchJob on the member, new pods); delete
prints one line, leaves nothing on the members and the job is gone from ``get``, as a
deleted Kubernetes object is; deleting it again is NotFound."""

from __future__ import annotations

import uuid
from pathlib import Path

from tests.cli.conftest import CliFleet
from tests.cli.test_commands import JOB_YAML, POLICY, TREE, wait_state


def member_objects(cli: CliFleet, kind: str, name: str) -> dict[str, str]:
    """``{uid: cluster}`` of the members' ``kind`` objects of job ``name`` (the PyTorchJob
    itself, or its pods by the operator's job-name label)."""
    out = {}
    for cluster in cli.emulated.members:
        for o in cli.emulated.objects(cluster, kind):
            meta = o["metadata"]
            labels = meta.get("labels") or {}
            if meta["name"] == name or labels.get("training.kubeflow.org/job-name") == name:
                out[meta["uid"]] = cluster
    return out


async def test_apply_again_delete_and_delete_again_of_a_finished_job(
        cli_fleet: CliFleet, tmp_path: Path) -> None:
    cli = cli_fleet
    name = f"finished-{uuid.uuid4().hex[:6]}"
    job = tmp_path / "job.yaml"
    job.write_text(JOB_YAML.replace("name: pytorch-test\n  namespace",
                                    f"name: {name}\n  annotations:\n"
                                    f"    fleetq.io/run-seconds: \"1\"\n  namespace"))
    r = await cli.run("apply", "-f", TREE, "-f", POLICY, "-f", str(job))
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[-1] == f"pytorchjob.kubeflow.org/{name} created"
    await wait_state(cli, name, "Succeeded", timeout=60)
    first_job = member_objects(cli, "pytorchjobs", name)
    first_pods = member_objects(cli, "pods", name)
    assert len(first_job) == 1 and len(first_pods) == 3

    # apply again: a new run, on a new copy with new pods, not the finished one adopted
    r = await cli.run("apply", "-f", str(job))
    assert r.stdout.strip() == f"pytorchjob.kubeflow.org/{name} created"
    await wait_state(cli, name, "Succeeded", timeout=60)
    second_job = member_objects(cli, "pytorchjobs", name)
    second_pods = member_objects(cli, "pods", name)
    assert len(second_job) == 1 and second_job.keys().isdisjoint(first_job)
    assert len(second_pods) == 3 and second_pods.keys().isdisjoint(first_pods)

    # delete: one line, nothing left on any member, gone from get
    r = await cli.run("delete", "pytorchjob", name)
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines() == [f'pytorchjob.kubeflow.org "{name}" deleted']
    assert member_objects(cli, "pytorchjobs", name) == {}
    assert member_objects(cli, "pods", name) == {}
    r = await cli.run("get", "pytorchjob", name)
    assert r.exit_code == 1
    assert r.stderr.strip() == \
        f'Error from server (NotFound): pytorchjobs.kubeflow.org "{name}" not found'
    r = await cli.run("get", "pytorchjob")
    assert name not in r.stdout

    r = await cli.run("delete", "pytorchjob", name)
    assert r.exit_code == 1
    assert r.stderr.strip() == \
        f'Error from server (NotFound): pytorchjobs.kubeflow.org "{name}" not found'
