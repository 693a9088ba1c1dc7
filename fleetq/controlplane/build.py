"""The build of the control-plane binaries: one cached directory per pinned version.

``build()`` runs ``go build`` on our wrapper modules under ``controlplane/`` (one module
each, so etcd's, Kubernetes', the training-operator's and KWOK's pinned dependencies never
meet), with ``-trimpath``, ``-p 2`` and the ldflags that make ``kubectl version`` report
the real release, and copies CRDs, the operator's webhook manifest and KWOK's stages from
the Go module cache. Control plane and operators each get a stamp (versions + a digest of
the wrapper sources) under ``~/.cache/fleetq/controlplane/`` (``FLEETQ_CONTROLPLANE_CACHE``),
so a warm cache is a stat; Kueue's harness is :mod:`fleetq.controlplane.kueue`. A flock
keeps concurrent builds from racing. Cost: docs/controlplane.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetq import gobuild
from fleetq.gobuild import BuildError, Progress

KUBERNETES_VERSION = "v1.37.2"
ETCD_VERSION = "v3.7.3"
TRAINING_OPERATOR_MODULE = ("github.com/kubeflow/training-operator", "v1.9.4")
KWOK_MODULE = ("sigs.k8s.io/kwok", "v0.8.0")
TRAINING_OPERATOR = (*TRAINING_OPERATOR_MODULE, "manifests/base/crds/kubeflow.org_pytorchjobs.yaml")
#: The CRD the control-plane part has copied since before the operator was built; kept
#: so its stamp (shared by every checkout on a machine) stays valid. The runner installs
#: the operator part's v1.9.4 CRD instead (:attr:`Build.crds`).
LEGACY_PYTORCHJOB_CRD = ("github.com/kubeflow/training-operator", "v1.8.1",
                         "manifests/base/crds/kubeflow.org_pytorchjobs.yaml")
#: The operator's webhook manifest (its ValidatingWebhookConfiguration) and KWOK's
#: default stages (what ``kwokctl`` gives a cluster: node-fast, heartbeat, pod-fast).
OPERATOR_FILES = (
    (*TRAINING_OPERATOR_MODULE, "manifests/base/webhook/manifests.yaml", "webhook"),
    (*KWOK_MODULE, "kustomize/stage/node/fast/node-initialize.yaml", "stages"),
    (*KWOK_MODULE, "kustomize/stage/node/heartbeat/node-heartbeat.yaml", "stages"),
    (*KWOK_MODULE, "kustomize/stage/pod/fast/pod-ready.yaml", "stages"),
    (*KWOK_MODULE, "kustomize/stage/pod/fast/pod-complete.yaml", "stages"),
    (*KWOK_MODULE, "kustomize/stage/pod/fast/pod-delete.yaml", "stages"),
)
#: binary name -> (wrapper module dir under controlplane/, upstream main package)
OPERATOR_BINARIES = {
    "training-operator": ("training-operator",
                          f"{TRAINING_OPERATOR_MODULE[0]}/cmd/training-operator.v1"),
    "kwok": ("kwok", f"{KWOK_MODULE[0]}/cmd/kwok"),
}
KOORDINATOR = ("github.com/koordinator-sh/koordinator", "v1.7.0",
               "config/crd/bases/scheduling.koordinator.sh_reservations.yaml")
#: Release date of KUBERNETES_VERSION (the module's .info time): a fixed buildDate keeps
#: the link reproducible, so Go's build cache serves a rebuild.
BUILD_DATE = "2026-10-27T12:01:04Z"
CACHE_ENV = "FLEETQ_CONTROLPLANE_CACHE"
SOURCE_ENV = "FLEETQ_CONTROLPLANE_SRC"
BINARIES = ("etcd", "kube-apiserver", "kube-scheduler", "kubectl")
CONTROL_PLANE_DIRS = ("etcd", "kubernetes")
STAMP = "build.json"
OPERATORS = "operators"

@dataclass(frozen=True)
class Build:
    """A finished build: where its binaries and CRDs are."""

    root: Path
    version: str

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def operators(self) -> Path:
        """The training-operator and KWOK part (its own stamp)."""
        return self.root / OPERATORS

    def binary(self, name: str) -> Path:
        if name in OPERATOR_BINARIES:
            return self.operators / "bin" / name
        return self.bin / name

    @property
    def crds(self) -> list[Path]:
        """The CRDs to install, one per file name: the operator part's over the
        control-plane part's (v1.9.4's PyTorchJob CRD, not v1.8.1's)."""
        found = {p.name: p for p in (self.root / "crds").glob("*.yaml")}
        found.update({p.name: p for p in (self.operators / "crds").glob("*.yaml")})
        return [found[name] for name in sorted(found)]

    @property
    def webhook_manifest(self) -> Path:
        """The training-operator's own ValidatingWebhookConfiguration manifest."""
        return self.operators / "webhook" / "manifests.yaml"

    @property
    def kwok_stages(self) -> list[Path]:
        """KWOK's default stages, as its module ships them."""
        return sorted((self.operators / "stages").glob("*.yaml"))


def source_dir() -> Path:
    """Our wrapper modules (``controlplane/`` beside the ``fleetq`` package)."""
    env = os.environ.get(SOURCE_ENV)
    path = Path(env) if env else Path(__file__).resolve().parents[2] / "controlplane"
    if not (path / "kubernetes" / "go.mod").is_file():
        raise BuildError(f"control-plane sources not found at {path} (a source checkout "
                         f"is needed; set {SOURCE_ENV} to its controlplane/ directory)")
    return path


def cache_root() -> Path:
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path("~/.cache/fleetq/controlplane").expanduser()


def go_binary() -> str:
    return gobuild.go_binary("1.26")


def version_ldflags(version: str = KUBERNETES_VERSION) -> str:
    major, minor = version.lstrip("v").split(".")[:2]
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/client-go/pkg/version", "k8s.io/component-base/version"):
        for key, value in (("gitVersion", version), ("gitMajor", major), ("gitMinor", minor),
                           ("gitCommit", "fleetq-module-build"), ("gitTreeState", "clean"),
                           ("buildDate", BUILD_DATE)):
            flags.append(f"-X {pkg}.{key}={value}")
    return " ".join(flags)


def _digest_files(h: Any, src: Path, dirs: tuple[str, ...]) -> None:
    for path in sorted(p for d in dirs for p in (src / d).rglob("*")):
        if path.is_file() and (path.suffix == ".go" or path.name in ("go.mod", "go.sum")):
            h.update(str(path.relative_to(src)).encode())
            h.update(path.read_bytes())


def sources_digest(src: Path) -> str:
    """Digest of every control-plane wrapper file that changes what is built."""
    h = hashlib.sha256()
    _digest_files(h, src, CONTROL_PLANE_DIRS)
    h.update(version_ldflags().encode())
    for module in (LEGACY_PYTORCHJOB_CRD, KOORDINATOR):
        h.update("@".join(module).encode())
    return h.hexdigest()[:16]


def operators_digest(src: Path) -> str:
    """Digest of the training-operator and KWOK wrappers and the files taken from them."""
    h = hashlib.sha256()
    _digest_files(h, src, tuple(d for d, _ in OPERATOR_BINARIES.values()))
    for module in (TRAINING_OPERATOR, *OPERATOR_FILES):
        h.update("@".join(module).encode())
    return h.hexdigest()[:16]


def _stamp_matches(root: Path, digest: Callable[[Path], str]) -> bool:
    try:
        stamp = json.loads((root / STAMP).read_text())
        return bool(stamp.get("digest") == digest(source_dir()))
    except (OSError, ValueError, BuildError):
        return False


def cached(root: Path | None = None) -> Build | None:
    """The warm build, if both stamps match our sources and every binary is there."""
    root = root or cache_root() / KUBERNETES_VERSION
    found = Build(root, KUBERNETES_VERSION)
    if not (_stamp_matches(root, sources_digest)
            and _stamp_matches(found.operators, operators_digest)):
        return None
    if not all(os.access(found.binary(b), os.X_OK) for b in (*BINARIES, *OPERATOR_BINARIES)):
        return None
    if len(found.crds) < 2 or not found.webhook_manifest.is_file() or not found.kwok_stages:
        return None
    from fleetq.controlplane.kueue import kueue_cached  # the third part (its own stamp)

    if kueue_cached(root) is None:
        return None
    return found


def module_file(go: str, module: tuple[str, str, str], work: Path, log: Path) -> Path:
    """A file of an upstream module, from the Go module cache (downloaded if needed)."""
    path, version, rel = module
    found = gobuild.module_dir(go, path, version, work, log) / rel
    if not found.is_file():
        raise BuildError(f"{rel} not found in {path}@{version}")
    return found


def build(force: bool = False, progress: Progress | None = None) -> Build:
    """Build (or reuse) the control plane and the operators; returns where they are."""
    say = progress or (lambda _msg: None)
    root = cache_root() / KUBERNETES_VERSION
    if not force and (done := cached(root)) is not None:
        return done
    src = source_dir()
    go = go_binary()
    _build_control_plane(root, src, go, force, say)
    _build_operators(Build(root, KUBERNETES_VERSION).operators, src, go, force, say)
    from fleetq.controlplane.kueue import build_kueue

    build_kueue(root, force, say)
    return Build(root, KUBERNETES_VERSION)


def _install(staging: Path, root: Path, subs: tuple[str, ...]) -> None:
    for sub in subs:
        shutil.rmtree(root / sub, ignore_errors=True)
        (staging / sub).rename(root / sub)
    shutil.rmtree(staging, ignore_errors=True)


def _build_control_plane(root: Path, src: Path, go: str, force: bool, say: Progress) -> None:
    with gobuild.locked(root):
        if not force and _stamp_matches(root, sources_digest) and all(
                os.access(root / "bin" / b, os.X_OK) for b in BINARIES):
            return  # warm, or another process built it while we waited
        log = root / "build.log"
        log.write_text("")
        staging = root / "staging"
        shutil.rmtree(staging, ignore_errors=True)
        (staging / "bin").mkdir(parents=True)
        (staging / "crds").mkdir()
        start = time.monotonic()
        ldflags = version_ldflags()
        say(f"building etcd {ETCD_VERSION} (log: {log})")
        gobuild.go_build(go, str(staging / "bin") + "/", ["./cmd/etcd"], src / "etcd", log)
        say(f"building kube-apiserver, kube-scheduler, kubectl {KUBERNETES_VERSION} "
            "(cold: tens of minutes on 2 cores)")
        gobuild.go_build(go, str(staging / "bin") + "/",
                         ["./cmd/kube-apiserver", "./cmd/kube-scheduler", "./cmd/kubectl"],
                         src / "kubernetes", log, ldflags=ldflags)
        for module in (LEGACY_PYTORCHJOB_CRD, KOORDINATOR):
            crd = module_file(go, module, src / "kubernetes", log)
            shutil.copyfile(crd, staging / "crds" / crd.name)
        _install(staging, root, ("bin", "crds"))
        seconds = time.monotonic() - start
        stamp = {
            "kubernetes": KUBERNETES_VERSION, "etcd": ETCD_VERSION,
            "trainingOperator": LEGACY_PYTORCHJOB_CRD[1], "koordinator": KOORDINATOR[1],
            "digest": sources_digest(src), "seconds": round(seconds, 1),
            "sizes": {b: (root / "bin" / b).stat().st_size for b in BINARIES},
        }
        (root / STAMP).write_text(json.dumps(stamp, indent=2))
        say(f"built in {seconds:.0f}s into {root}")


def _build_operators(root: Path, src: Path, go: str, force: bool, say: Progress) -> None:
    """The training-operator's and KWOK's own main packages (``tool`` directives of our
    wrapper modules), and the files the runner reads from their modules."""
    with gobuild.locked(root):
        if not force and _stamp_matches(root, operators_digest) and all(
                os.access(root / "bin" / b, os.X_OK) for b in OPERATOR_BINARIES):
            return
        log = root / "build.log"
        log.write_text("")
        staging = root / "staging"
        shutil.rmtree(staging, ignore_errors=True)
        for sub in ("bin", "crds", "webhook", "stages"):
            (staging / sub).mkdir(parents=True)
        start = time.monotonic()
        seconds: dict[str, float] = {}
        for name, (module_dir, package) in OPERATOR_BINARIES.items():
            version = (TRAINING_OPERATOR_MODULE if name == "training-operator"
                       else KWOK_MODULE)[1]
            say(f"building {name} {version} (log: {log})")
            t0 = time.monotonic()
            gobuild.go_build(go, str(staging / "bin" / name), [package], src / module_dir,
                             log)
            seconds[name] = round(time.monotonic() - t0, 1)
        work = src / "training-operator"
        crd = module_file(go, TRAINING_OPERATOR, work, log)
        shutil.copyfile(crd, staging / "crds" / crd.name)
        for path, version, rel, sub in OPERATOR_FILES:
            found = module_file(go, (path, version, rel), work, log)
            shutil.copyfile(found, staging / sub / found.name)
        _install(staging, root, ("bin", "crds", "webhook", "stages"))
        total = time.monotonic() - start
        stamp = {
            "trainingOperator": TRAINING_OPERATOR_MODULE[1], "kwok": KWOK_MODULE[1],
            "digest": operators_digest(src), "seconds": round(total, 1),
            "secondsPerBinary": seconds,
            "sizes": {b: (root / "bin" / b).stat().st_size for b in OPERATOR_BINARIES},
        }
        (root / STAMP).write_text(json.dumps(stamp, indent=2))
        say(f"built the operators in {total:.0f}s into {root}")
