"""What a user sees of an inadmissible job (issue 24): ``fleetq apply`` and ``validate``
warn in one line, ``get pytorchjob -o wide`` and ``describe`` show the state and reason,
``get queue -o wide`` counts it (INADMISSIBLE); none of it refuses the job."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from tests.cli.conftest import EXAMPLES, CliFleet
from tests.cli.test_commands import POLICY, TREE, table, wait_state

REASON = "quota child-2: cpu 12.01 exceeds max 10"
WARNING = (f"warning: pytorchjob default/inadm-cli is inadmissible under the current tree "
           f"({REASON}): it waits until the tree is raised")


def _tree(path: Path) -> str:
    doc = yaml.safe_load(Path(TREE).read_text())
    doc["spec"]["root"]["children"][0]["max"]["cpu"] = 10
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def _big_job(path: Path) -> str:
    doc = yaml.safe_load((EXAMPLES / "pytorch-test.yaml").read_text())
    doc = copy.deepcopy(doc)
    doc["metadata"]["name"] = "inadm-cli"
    worker = doc["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    worker["containers"][0]["resources"] = {"requests": {"cpu": "6"}, "limits": {"cpu": "6"}}
    path.write_text(yaml.safe_dump(doc))
    return str(path)


async def test_an_inadmissible_job_is_warned_of_and_shown(
    cli_fleet: CliFleet, tmp_path: Path
) -> None:
    cli = cli_fleet
    # (the module's fleet is left as found: other CLI tests expect what they created)
    before = await cli.run("get", "elasticquotatree", "-o", "yaml")
    had_policy = (await cli.run("get", "propagationpolicy", "example-policy")).exit_code == 0
    r = await cli.run("apply", "-f", _tree(tmp_path / "tree.yaml"), "-f", POLICY)
    assert r.exit_code == 0, r.output
    job = _big_job(tmp_path / "job.yaml")
    r = await cli.run("validate", "-f", job)
    assert r.exit_code == 0, r.output
    assert WARNING in r.output.splitlines()
    r = await cli.run("apply", "-f", job)
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == "pytorchjob.kubeflow.org/inadm-cli created"
    assert WARNING in r.output.splitlines()

    await wait_state(cli, "inadm-cli", "Inadmissible")
    r = await cli.run("get", "pytorchjob", "inadm-cli", "-o", "wide")
    header, row = table(r.stdout)
    assert row[header.index("STATE")] == "Inadmissible"
    assert row[header.index("REASON")] == REASON
    assert row[header.index("QUEUE")].endswith("(inadmissible)")
    r = await cli.run("describe", "pytorchjob", "inadm-cli")
    lines = r.stdout.splitlines()
    assert any(line.startswith("Inadmissible:") and REASON in line for line in lines), lines
    r = await cli.run("get", "queue", "-o", "wide")
    rows = table(r.stdout)
    child = next(row for row in rows if row[0].startswith("root-child-2-"))
    assert child[rows[0].index("INADMISSIBLE")] == "1"

    r = await cli.run("delete", "pytorchjob", "inadm-cli")
    assert r.exit_code == 0, r.output
    if before.exit_code == 0 and "ElasticQuotaTree" in before.stdout:  # (the walkthrough's)
        r = await cli.run("apply", "-f", TREE)
    else:
        r = await cli.run("delete", "-f", TREE)
    assert r.exit_code == 0, r.output
    if not had_policy:
        r = await cli.run("delete", "-f", POLICY)
        assert r.exit_code == 0, r.output
