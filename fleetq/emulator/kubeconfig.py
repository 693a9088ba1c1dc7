"""Files that point clients at an emulated fleet: a kubeconfig (one context per cluster,
context name = cluster name) and the fleet config fleetq reads to know its members."""

from __future__ import annotations

import base64
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from fleetq.emulator.cluster import EmulatedCluster


def kubeconfig_doc(
    clusters: Sequence[EmulatedCluster], ca_pem: str | None = None
) -> dict[str, Any]:
    members = [c for c in clusters if c.spec.member]
    current = (members or list(clusters))[0].name if clusters else ""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": [{"name": c.name, "cluster": _server(c.url, ca_pem)} for c in clusters],
        "users": [{"name": f"{c.name}-admin", "user": {"token": c.token}} for c in clusters],
        "contexts": [
            {"name": c.name,
             "context": {"cluster": c.name, "user": f"{c.name}-admin", "namespace": "default"}}
            for c in clusters
        ],
        "current-context": current,
    }


def _server(url: str, ca_pem: str | None) -> dict[str, str]:
    out = {"server": url}
    if ca_pem and url.startswith("https://"):
        out["certificate-authority-data"] = base64.b64encode(ca_pem.encode()).decode()
    return out


def fleet_config_doc(kubeconfig: Path, clusters: Sequence[EmulatedCluster]) -> dict[str, Any]:
    doc: dict[str, Any] = {"kubeconfig": str(kubeconfig.resolve())}
    hubs = [c for c in clusters if not c.spec.member]
    if hubs:
        doc["source"] = {"context": hubs[0].name}
    doc["clusters"] = [
        {"name": c.name, "context": c.name, "labels": dict(c.spec.labels),
         "reservation": c.spec.reservation}
        for c in clusters if c.spec.member
    ]
    return doc


def write_private(path: Path, text: str) -> None:
    """Write atomically, readable by the owner only (the files carry bearer tokens)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def write_files(
    out_dir: Path, clusters: Sequence[EmulatedCluster], ca_pem: str | None = None
) -> tuple[Path, Path]:
    kubeconfig = out_dir / "kubeconfig"
    fleet = out_dir / "fleet.yaml"
    write_private(kubeconfig, yaml.safe_dump(kubeconfig_doc(clusters, ca_pem), sort_keys=False))
    write_private(fleet, yaml.safe_dump(fleet_config_doc(kubeconfig, clusters), sort_keys=False))
    return kubeconfig.resolve(), fleet.resolve()
