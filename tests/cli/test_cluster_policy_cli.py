"""``fleetq apply|get|delete`` of a ClusterPropagationPolicy (``cpp``), kubectl's way.

Upstream: the CRD (karmada-io/karmada charts/_crds/bases/policy/
policy.karmada.io_clusterpropagationpolicies.yaml) is cluster-scoped with short name
``cpp``; kube-apiserver clears a namespace written on a cluster-scoped object
(``rest.BeforeCreate`` -> ``EnsureObjectNamespaceMatchesRequestNamespace``), so
``get -o yaml`` shows none and ``get`` has no NAMESPACE column."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.cli.conftest import CliFleet
from tests.cli.test_commands import table

LINE = "clusterpropagationpolicy.policy.one.alibabacloud.com"


def cpp_yaml(name: str, toleration: int = 30) -> str:
    return json.dumps({
        "apiVersion": "policy.karmada.io/v1alpha1", "kind": "ClusterPropagationPolicy",
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": {
            "resourceSelectors": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                                   "namespace": "team-b"}],
            "placement": {"replicaScheduling": {"replicaSchedulingType": "Divided",
                                                "customSchedulingType": "Gang"}},
            "propagateDeps": True,
            "failover": {"application": {"decisionConditions": {
                "tolerationSeconds": toleration}, "purgeMode": "Immediately"}},
        },
    })


async def test_validate_names_it_without_a_namespace(cli_fleet: CliFleet) -> None:
    bad = json.loads(cpp_yaml("bad"))
    bad["spec"]["preemption"] = "Always"  # validateResourceSelectorsIfPreemptionEnabled
    r = await cli_fleet.run("validate", "-f", "-",
                            stdin=cpp_yaml("fleet-gang") + "\n---\n" + json.dumps(bad))
    assert r.exit_code == 1
    assert "OK ClusterPropagationPolicy fleet-gang" in r.stdout.splitlines()
    assert ("ClusterPropagationPolicy bad: spec.resourceSelectors[0].name cannot be empty if "
            "preemption is Always, the empty name may cause unexpected resources preemption"
            ) in r.output


async def test_cluster_policy_apply_get_delete(cli_fleet: CliFleet, tmp_path: Path) -> None:
    r = await cli_fleet.run("apply", "-f", "-", stdin=cpp_yaml("fleet-gang"))
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == f"{LINE}/fleet-gang created"
    assert r.stderr.strip() == (
        "warning: ClusterPropagationPolicy fleet-gang: metadata.namespace 'team-a' ignored: "
        "ClusterPropagationPolicy is cluster-scoped (the API server clears it)")
    r = await cli_fleet.run("apply", "-f", "-", stdin=cpp_yaml("fleet-gang"))
    assert r.stdout.strip() == f"{LINE}/fleet-gang unchanged"
    r = await cli_fleet.run("apply", "-f", "-", stdin=cpp_yaml("fleet-gang", toleration=60))
    assert r.stdout.strip() == f"{LINE}/fleet-gang configured"

    for alias in ("clusterpropagationpolicy", "clusterpropagationpolicies", "cpp"):
        r = await cli_fleet.run("get", alias, "-A")
        rows = table(r.stdout)
        assert rows[0] == ["NAME", "SCHEDULING", "QUEUED", "AGE"], r.output
        assert [row[:3] for row in rows[1:]] == [["fleet-gang", "Gang", "false"]]
    # it is no PropagationPolicy: not listed with them
    r = await cli_fleet.run("get", "propagationpolicy", "-A")
    assert "fleet-gang" not in r.stdout
    r = await cli_fleet.run("get", "cpp", "fleet-gang", "-o", "yaml")
    got = yaml.safe_load(r.stdout)
    assert got["kind"] == "ClusterPropagationPolicy"
    assert "namespace" not in got["metadata"]
    assert got["spec"]["failover"]["application"]["decisionConditions"] == {
        "tolerationSeconds": 60}

    path = tmp_path / "cpp.yaml"
    path.write_text(cpp_yaml("fleet-gang"))
    r = await cli_fleet.run("delete", "-f", str(path))
    assert r.stdout.strip() == f'{LINE} "fleet-gang" deleted'
    r = await cli_fleet.run("get", "cpp", "fleet-gang")
    assert (r.exit_code, r.stderr.strip()) == (1, (
        'Error from server (NotFound): clusterpropagationpolicies.policy.one.alibabacloud.com '
        '"fleet-gang" not found'))
    r = await cli_fleet.run("apply", "-f", "-", stdin=cpp_yaml("by-name"))
    r = await cli_fleet.run("delete", "cpp", "by-name")
    assert r.stdout.strip() == f'{LINE} "by-name" deleted'
    r = await cli_fleet.run("get", "cpp")
    assert r.stderr.strip() == "No resources found."
