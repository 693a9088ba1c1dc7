"""``fleetq get cluster``: each member's Ready condition and the Karmada health taints it
puts on the member, read from the members themselves."""

from __future__ import annotations

import json

from tests.cli.conftest import CliFleet


async def test_members_are_ready_and_untainted(cli_fleet: CliFleet) -> None:
    result = await cli_fleet.run("get", "cluster")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["NAME", "VERSION", "READY", "TAINTS"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert set(rows) == set(cli_fleet.emulated.members)
    assert all(r[2] == "True" and r[3] == "<none>" for r in rows.values()), rows


async def test_an_unreachable_member_shows_unknown_with_its_taints(cli_fleet: CliFleet) -> None:
    cli_fleet.emulated.set_reachable("cluster-c", False)
    try:
        result = await cli_fleet.run("get", "cluster", "cluster-c", "-o", "wide")
        as_json = await cli_fleet.run("get", "cluster", "cluster-c", "-o", "json")
    finally:
        cli_fleet.emulated.set_reachable("cluster-c", True)
    assert result.exit_code == 0, result.output
    (row,) = result.output.splitlines()[1:]
    assert row.split()[:4] == [
        "cluster-c", "<unknown>", "Unknown",
        "cluster.karmada.io/unreachable:NoSchedule,cluster.karmada.io/unreachable:NoExecute"]
    assert "cluster-c: unreachable (connection refused)" in row
    obj = json.loads(as_json.output)
    assert obj["status"]["conditions"][0]["status"] == "Unknown"
    assert {"key": "cluster.karmada.io/unreachable", "effect": "NoExecute"} in obj["spec"]["taints"]


async def test_an_unknown_cluster_is_one_line(cli_fleet: CliFleet) -> None:
    result = await cli_fleet.run("get", "cluster", "nope")
    assert result.exit_code == 1
    assert result.output.strip() == (
        'Error from server (NotFound): clusters.cluster.karmada.io "nope" not found')
