"""deploy/ against a real kube-apiserver (the project's own control-plane build,
``fleetq controlplane build``): ``kubectl apply -k deploy/ --dry-run=server`` and the
Temporal Worker Controller example, each object admitted by the server's validation
(schema, defaulting, field names), nothing stored.

The namespace is created for real first (a server-side dry run of a namespace does not
make it exist for the objects inside it). The ServiceMonitor and the Temporal Worker
Controller kinds come from CRDs that are not part of Kubernetes; this test registers
them with permissive schemas (group, version, kind and scope as the operators define
them), so for those three kinds it checks the identity and the metadata, not every field.

No skip: without a control plane build the test fails and says how to get one.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetq.topology import parse_topology

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
MGMT = "mgmt"


def permissive_crd(group: str, version: str, kind: str, plural: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group, "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower(),
                      "listKind": f"{kind}List"},
            "versions": [{"name": version, "served": True, "storage": True,
                          "schema": {"openAPIV3Schema": {
                              "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}],
        },
    }


EXTRA_CRDS = [
    permissive_crd("monitoring.coreos.com", "v1", "ServiceMonitor", "servicemonitors"),
    permissive_crd("temporal.io", "v1alpha1", "TemporalWorkerDeployment",
                   "temporalworkerdeployments"),
    permissive_crd("temporal.io", "v1alpha1", "TemporalConnection", "temporalconnections"),
]


@pytest.fixture(scope="module")
def management_cluster() -> Iterator[tuple[Path, Path]]:
    """(kubectl, kubeconfig) of a real API server with no member components."""
    from fleetq.controlplane.build import BuildError, build
    from fleetq.controlplane.runner import RealFleet

    try:
        binaries = build()
    except BuildError as exc:
        pytest.fail(f"deploy/ dry run needs a real kube-apiserver and none can be built "
                    f"here ({exc}); run 'fleetq controlplane build'", pytrace=False)
    hub = parse_topology({"clusters": [{"name": MGMT, "member": False}]})
    with tempfile.TemporaryDirectory(prefix="fleetq-deploy-") as out, \
            RealFleet(hub, binaries, Path(out)) as fleet:
        yield binaries.binary("kubectl"), Path(fleet.kubeconfig_path)


def kubectl(cluster: tuple[Path, Path], *args: str, stdin: str | None = None
            ) -> subprocess.CompletedProcess[str]:
    binary, kubeconfig = cluster
    return subprocess.run([str(binary), "--kubeconfig", str(kubeconfig), "--context", MGMT,
                           *args], input=stdin, capture_output=True, text=True, timeout=60)


def test_deploy_applies_with_server_side_dry_run(management_cluster: tuple[Path, Path]
                                                 ) -> None:
    crds = kubectl(management_cluster, "apply", "-f", "-",
                   stdin=yaml.safe_dump_all(EXTRA_CRDS))
    assert crds.returncode == 0, crds.stderr
    for crd in EXTRA_CRDS:
        ok = kubectl(management_cluster, "wait", "--for=condition=Established",
                     "--timeout=30s", f"crd/{crd['metadata']['name']}")
        assert ok.returncode == 0, ok.stderr
    ns = kubectl(management_cluster, "apply", "-f", str(DEPLOY / "namespace.yaml"))
    assert ns.returncode == 0, ns.stderr

    kustomized = kubectl(management_cluster, "apply", "-k", str(DEPLOY),
                         "--dry-run=server", "-o", "name")
    assert kustomized.returncode == 0, kustomized.stderr
    applied = set(kustomized.stdout.split())
    for want in ("serviceaccount/fleetq-worker", "configmap/fleetq-fleet",
                 "secret/fleetq-member-kubeconfigs", "service/fleetq-worker-metrics",
                 "poddisruptionbudget.policy/fleetq-worker",
                 "servicemonitor.monitoring.coreos.com/fleetq-worker"):
        assert want in applied, (want, applied)
    assert any(n.startswith("deployment.apps/fleetq-worker-") for n in applied), applied

    controller = kubectl(management_cluster, "apply", "--dry-run=server", "-o", "name", "-f",
                         str(DEPLOY / "temporal-worker-deployment.yaml"))
    assert controller.returncode == 0, controller.stderr
    assert "temporalworkerdeployment.temporal.io/fleetq-worker" in controller.stdout

    # a dry run stores nothing
    listed = kubectl(management_cluster, "get", "deployments,configmaps", "-n", "fleetq",
                     "-o", "name")
    assert listed.returncode == 0, listed.stderr
    assert "fleetq-worker" not in listed.stdout and "fleetq-fleet" not in listed.stdout
