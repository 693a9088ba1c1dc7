"""``fleetq get`` AGE of policies, the tree and its queues is when the object was first
applied (``metadata.creationTimestamp`` in ``-o yaml``), kept by a re-apply -- not the
start of the registry or quota workflow that stores them (issue 27 item 4). Upstream:
kube-apiserver sets creationTimestamp at create and ``rest.BeforeUpdate`` keeps it; Kube
Queue's Queues are made from the tree when it is applied. The exact apply-versus-start
distinction is pinned on the time-skipping server (tests/workflows/test_registry_ages.py)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import yaml

from fleetq.kube_values import parse_rfc3339
from tests.cli.conftest import EXAMPLES, CliFleet
from tests.cli.test_commands import TREE


def creation(text: str) -> datetime:
    stamp = parse_rfc3339(yaml.safe_load(text)["metadata"]["creationTimestamp"])
    assert stamp is not None, text
    return stamp


async def test_policy_age_is_its_apply_time_and_survives_a_reapply(cli_fleet: CliFleet) -> None:
    first = (EXAMPLES / "propagationpolicy-gang.yaml").read_text().replace(
        "namespace: default", "namespace: ages")
    assert (await cli_fleet.run("apply", "-f", "-", stdin=first)).exit_code == 0  # registry up
    name = f"aged-{uuid.uuid4().hex[:6]}"
    doc = first.replace("name: example-policy", f"name: {name}")
    before = datetime.now(UTC).replace(microsecond=0)
    r = await cli_fleet.run("apply", "-f", "-", stdin=doc)
    after = datetime.now(UTC)
    assert r.stdout.strip().endswith(f"/{name} created")
    r = await cli_fleet.run("get", "pp", name, "-n", "ages", "-o", "yaml")
    applied = creation(r.stdout)
    assert before <= applied <= after
    r = await cli_fleet.run("apply", "-f", "-",
                            stdin=doc.replace("tolerationSeconds: 30", "tolerationSeconds: 45"))
    assert r.stdout.strip().endswith(f"/{name} configured")
    r = await cli_fleet.run("get", "pp", name, "-n", "ages", "-o", "yaml")
    assert creation(r.stdout) == applied
    for n in (name, "example-policy"):
        assert (await cli_fleet.run("delete", "pp", n, "-n", "ages")).exit_code == 0


async def test_queues_age_with_their_tree(cli_fleet: CliFleet) -> None:
    assert (await cli_fleet.run("apply", "-f", TREE)).exit_code == 0
    tree = creation((await cli_fleet.run("get", "eqt", "-n", "kube-system", "-o",
                                         "yaml")).stdout)
    assert tree <= datetime.now(UTC)
    r = await cli_fleet.run("get", "queue", "-n", "kube-queue", "-o", "yaml")
    queues = yaml.safe_load(r.stdout)["items"]
    assert queues and {parse_rfc3339(q["metadata"]["creationTimestamp"])
                       for q in queues} == {tree}
    assert (await cli_fleet.run("apply", "-f", TREE)).exit_code == 0  # re-applied: kept
    assert creation((await cli_fleet.run("get", "eqt", "-n", "kube-system", "-o",
                                         "yaml")).stdout) == tree
