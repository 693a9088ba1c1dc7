"""deploy/ as a whole: every manifest parses, and what refers to something refers to
something real — selectors to labels, probe ports and paths to the worker's real
endpoints and flags, volumes to the ConfigMap and Secret, fleet.yaml's kubeconfig paths
to the Secret's keys, env names to variables the code reads, the termination grace to the
worker's shutdown budget. The Containerfile's Python layer is built the way the recipe
builds it (its COPY list, pip wheel, pip install) and imported."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import worker
from fleetq.fleet_config import FleetConfig
from fleetq.runtime.worker_health import LIVE_PATH, READY_PATH

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
NAMESPACE = "fleetq"
#: TEMPORAL_* variables read by Temporal's env config or by worker.py
TEMPORAL_ENV = {"TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE", "TEMPORAL_API_KEY",
                "TEMPORAL_TLS", "TEMPORAL_TLS_CLIENT_CERT_PATH", "TEMPORAL_TLS_CLIENT_KEY_PATH",
                "TEMPORAL_TLS_SERVER_CA_CERT_PATH", "TEMPORAL_HOST_PORT",
                "TEMPORAL_DEPLOYMENT_NAME", "TEMPORAL_WORKER_BUILD_ID"}


def docs() -> list[dict[str, Any]]:
    out = []
    for f in sorted(DEPLOY.glob("*.yaml")):
        for d in yaml.safe_load_all(f.read_text()):
            if d is not None:
                d["__file__"] = f.name
                out.append(d)
    return out


def one(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs() if d["kind"] == kind
             and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, (kind, name, [d["metadata"]["name"] for d in found])
    return found[0]


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def pod_templates() -> Iterator[tuple[str, dict[str, Any]]]:
    yield "Deployment", one("Deployment")["spec"]["template"]
    yield "TemporalWorkerDeployment", one("TemporalWorkerDeployment")["spec"]["template"]


def test_every_manifest_parses_and_kustomization_lists_them() -> None:
    all_docs = docs()
    assert all_docs
    for d in all_docs:
        assert d.get("apiVersion") and d.get("kind"), d["__file__"]
        if d["kind"] in ("Kustomization",):
            continue
        assert d["metadata"].get("name"), d["__file__"]
        if d["kind"] != "Namespace":
            assert d["metadata"].get("namespace") == NAMESPACE, d["__file__"]
    kust = one("Kustomization")
    listed = set(kust["resources"])
    assert all((DEPLOY / r).is_file() for r in listed)
    # everything but the controller example (its CRDs are optional) is applied by -k
    assert listed == {f.name for f in DEPLOY.glob("*.yaml")} - {
        "kustomization.yaml", "temporal-worker-deployment.yaml"}


@pytest.mark.parametrize("kind", ["Deployment", "TemporalWorkerDeployment"])
def test_pod_template_matches_the_worker(kind: str) -> None:
    template = dict(pod_templates())[kind]
    spec = template["spec"]
    (c,) = spec["containers"]
    args = worker.parse_args(c["args"])  # every flag exists
    assert args.versioning is True
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["health"] == args.health_port and args.health_host == "0.0.0.0"
    assert ports["metrics"] == args.prometheus_port and args.prometheus_host == "0.0.0.0"
    for probe, path in (("readinessProbe", READY_PATH), ("livenessProbe", LIVE_PATH),
                        ("startupProbe", LIVE_PATH)):
        get = c[probe]["httpGet"]
        assert get["path"] == path and get["port"] in ports, (probe, get)
    # the liveness probe does not give up before the worker's own stall threshold
    live = c["livenessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] >= args.liveness_stall_seconds
    assert spec["terminationGracePeriodSeconds"] > worker.SHUTDOWN_BUDGET_SECONDS
    assert spec["terminationGracePeriodSeconds"] <= worker.SHUTDOWN_BUDGET_SECONDS + 30
    assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
    ann = template["metadata"]["annotations"]
    assert int(ann["prometheus.io/port"]) == args.prometheus_port
    assert ann["prometheus.io/path"] == "/metrics"
    # references: service account, ConfigMap, Secret
    assert one("ServiceAccount", spec["serviceAccountName"])
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert set(mounts) == set(volumes)
    cm = one("ConfigMap", volumes["fleet"]["configMap"]["name"])
    assert mounts["fleet"]["subPath"] in cm["data"]
    assert mounts["fleet"]["mountPath"] == args.fleet_config
    secret = one("Secret", volumes["kubeconfigs"]["secret"]["secretName"])
    fleet = FleetConfig.model_validate(yaml.safe_load(cm["data"]["fleet.yaml"]))
    for cluster in fleet.clusters:
        assert cluster.kubeconfig is not None
        kc_path = Path(cluster.kubeconfig)
        assert kc_path.parent == Path(mounts["kubeconfigs"]["mountPath"]), kc_path
        kubeconfig = yaml.safe_load(secret["stringData"][kc_path.name])
        contexts = {x["name"] for x in kubeconfig["contexts"]}
        assert (cluster.context or cluster.name) in contexts
    # env: names the code reads; optional secrets or existing ones
    code = "\n".join(p.read_text() for p in [ROOT / "worker.py",
                                             *(ROOT / "fleetq").rglob("*.py")])
    for e in c["env"]:
        name = e["name"]
        if name.startswith("FLEETQ_"):
            assert f'"{name}"' in code, f"{name} is read nowhere"
        else:
            assert name in TEMPORAL_ENV or name.startswith("OTEL_"), name
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        if ref and not ref.get("optional"):
            assert one("Secret", ref["name"])


def test_versioned_deployment_carries_its_build_id_everywhere() -> None:
    dep = one("Deployment")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    build = labels["fleetq.io/build-id"]
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["FLEETQ_BUILD_ID"] == build == labels["app.kubernetes.io/version"]
    assert c["image"].endswith(":" + build)
    assert dep["metadata"]["name"].endswith(build.replace(".", "-"))
    assert re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", build) and len(build) <= 63
    sel = dep["spec"]["selector"]["matchLabels"]
    assert matches(sel, labels) and sel.get("fleetq.io/build-id") == build
    # the worker computes label-safe build ids itself too
    auto = worker.build_id()
    assert re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", auto) and len(auto) <= 63


def test_service_monitor_pdb_and_service_select_the_worker_pods() -> None:
    pods = [t["metadata"]["labels"] for _, t in pod_templates()]
    svc = one("Service")
    pdb = one("PodDisruptionBudget")
    mon = one("ServiceMonitor")
    for labels in pods:
        assert matches(svc["spec"]["selector"], labels)
        assert matches(pdb["spec"]["selector"]["matchLabels"], labels)
    assert matches(mon["spec"]["selector"]["matchLabels"], svc["metadata"]["labels"])
    svc_ports = {p["name"]: p for p in svc["spec"]["ports"]}
    (c,) = one("Deployment")["spec"]["template"]["spec"]["containers"]
    container_ports = {p["name"] for p in c["ports"]}
    for ep in mon["spec"]["endpoints"]:
        assert ep["port"] in svc_ports and ep["path"] == "/metrics"
        assert svc_ports[ep["port"]]["targetPort"] in container_ports


def test_containerfile_python_layer_builds_and_imports(tmp_path: Path) -> None:
    recipe = (DEPLOY / "Containerfile").read_text()
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    copies = re.findall(r"^COPY (?!--from)(.+?) (\S+)$", recipe, re.M)
    assert copies
    for sources, _dest in copies:
        for src in sources.split():
            s = ROOT / src.rstrip("/")
            if s.is_dir():
                shutil.copytree(s, ctx / s.name,
                                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                shutil.copy2(s, ctx / s.name)
    assert re.search(r'pip wheel .*--wheel-dir /wheels "\.\[otlp\]"', recipe)
    wheels, target = tmp_path / "wheels", tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    # the project is built from exactly what the recipe copies, with its build backend
    # (pip's build isolation, as in the image); dependencies come from this environment
    subprocess.run([*pip, "wheel", "--no-deps", "--wheel-dir",
                    str(wheels), str(ctx)], check=True, timeout=120)
    (wheel,) = wheels.glob("fleetq-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", str(target),
                    str(wheel)], check=True, timeout=120)
    check = (
        "import worker, workflows.pytorch_job, workflows.quota_tree, "
        "workflows.fleet_registry, activities.scheduling, fleetq.runtime.worker_health, "
        "fleetq.cli\n"
        f"assert worker.__file__.startswith({str(target)!r}), worker.__file__\n"
        "import os; os.environ.pop('FLEETQ_BUILD_ID', None)\n"
        "print(worker.build_id())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    env.pop("FLEETQ_BUILD_ID", None)
    out = subprocess.run([sys.executable, "-c", check], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    # no .git in an image: the build id names the hash of the installed workflow sources
    assert re.fullmatch(r"[0-9][^-]*-src[0-9a-f]{12}", out.stdout.strip()), out.stdout
    assert (target / "fleetq" / "data").is_dir()
