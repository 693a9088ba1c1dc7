"""The build of the control-plane binaries: one cached directory per pinned version.

``build()`` runs ``go build`` on our two wrapper modules (``controlplane/etcd`` and
``controlplane/kubernetes`` at the repository root; etcd is its own module so its
dependency versions never meet Kubernetes'), with ``-trimpath``, ``-p 2`` and the version
ldflags that make ``kubectl version`` report the real release, and copies the CRDs out of
the training-operator and Koordinator modules in the Go module cache. The result lives in
``~/.cache/fleetq/controlplane/<k8s version>/`` (``FLEETQ_CONTROLPLANE_CACHE`` moves it)
with a stamp naming the versions and a digest of the wrapper sources: a warm cache is a
stat and a JSON read. A flock keeps concurrent builds (two pytest sessions) from racing.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

KUBERNETES_VERSION = "v1.37.2"
ETCD_VERSION = "v3.7.3"
TRAINING_OPERATOR = ("github.com/kubeflow/training-operator", "v1.8.1",
                     "manifests/base/crds/kubeflow.org_pytorchjobs.yaml")
KOORDINATOR = ("github.com/koordinator-sh/koordinator", "v1.7.0",
               "config/crd/bases/scheduling.koordinator.sh_reservations.yaml")
#: Release date of KUBERNETES_VERSION (the module's .info time): a fixed buildDate keeps
#: the link reproducible, so Go's build cache serves a rebuild.
BUILD_DATE = "2026-10-27T12:01:04Z"
CACHE_ENV = "FLEETQ_CONTROLPLANE_CACHE"
SOURCE_ENV = "FLEETQ_CONTROLPLANE_SRC"
GO_ENV = "FLEETQ_GO"
BINARIES = ("etcd", "kube-apiserver", "kube-scheduler", "kubectl")
STAMP = "build.json"

Progress = Callable[[str], None]


class BuildError(RuntimeError):
    """The control plane could not be built; the message is one line for the user."""


@dataclass(frozen=True)
class Build:
    """A finished build: where its binaries and CRDs are."""

    root: Path
    version: str

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    def binary(self, name: str) -> Path:
        return self.bin / name

    @property
    def crds(self) -> list[Path]:
        return sorted((self.root / "crds").glob("*.yaml"))


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
    for candidate in (os.environ.get(GO_ENV), shutil.which("go"), "/usr/local/go/bin/go"):
        if candidate and Path(candidate).is_file():
            return candidate
    raise BuildError("no Go toolchain: install Go >= 1.26 (or set FLEETQ_GO to the go binary)")


def version_ldflags(version: str = KUBERNETES_VERSION) -> str:
    major, minor = version.lstrip("v").split(".")[:2]
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/client-go/pkg/version", "k8s.io/component-base/version"):
        for key, value in (("gitVersion", version), ("gitMajor", major), ("gitMinor", minor),
                           ("gitCommit", "fleetq-module-build"), ("gitTreeState", "clean"),
                           ("buildDate", BUILD_DATE)):
            flags.append(f"-X {pkg}.{key}={value}")
    return " ".join(flags)


def sources_digest(src: Path) -> str:
    """Digest of every wrapper file that changes what is built."""
    h = hashlib.sha256()
    for path in sorted(src.rglob("*")):
        if path.is_file() and (path.suffix == ".go" or path.name in ("go.mod", "go.sum")):
            h.update(str(path.relative_to(src)).encode())
            h.update(path.read_bytes())
    h.update(version_ldflags().encode())
    for module in (TRAINING_OPERATOR, KOORDINATOR):
        h.update("@".join(module).encode())
    return h.hexdigest()[:16]


def cached(root: Path | None = None) -> Build | None:
    """The warm build, if its stamp matches our sources and every binary is there."""
    root = root or cache_root() / KUBERNETES_VERSION
    try:
        stamp = json.loads((root / STAMP).read_text())
        digest = sources_digest(source_dir())
    except (OSError, ValueError, BuildError):
        return None
    if stamp.get("digest") != digest:
        return None
    if not all(os.access(root / "bin" / b, os.X_OK) for b in BINARIES):
        return None
    if len(list((root / "crds").glob("*.yaml"))) < 2:
        return None
    return Build(root, KUBERNETES_VERSION)


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("GOMAXPROCS", "2")  # 2 cores: keep compile memory and load in check
    env.setdefault("GOFLAGS", "")
    env["GOFLAGS"] = " ".join(f for f in (env["GOFLAGS"], "-buildvcs=false") if f)
    return env


def _run(argv: list[str], cwd: Path, log: Path) -> str:
    with open(log, "ab") as fh:
        fh.write(("$ " + " ".join(argv) + "\n").encode())
        fh.flush()
        proc = subprocess.run(argv, cwd=cwd, env=_env(), stdout=subprocess.PIPE,
                              stderr=fh, check=False)
        fh.write(proc.stdout)
    if proc.returncode != 0:
        tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
        raise BuildError(f"{argv[0]} {argv[1]} failed in {cwd.name}: {tail} (log: {log})")
    return proc.stdout.decode()


def module_file(go: str, module: tuple[str, str, str], work: Path, log: Path) -> Path:
    """A file of an upstream module, from the Go module cache (downloaded if needed)."""
    path, version, rel = module
    info = json.loads(_run([go, "mod", "download", "-json", f"{path}@{version}"], work, log))
    found = Path(info["Dir"]) / rel
    if not found.is_file():
        raise BuildError(f"{rel} not found in {path}@{version}")
    return found


def build(force: bool = False, progress: Progress | None = None) -> Build:
    """Build (or reuse) the control plane; returns where it is."""
    say = progress or (lambda _msg: None)
    root = cache_root() / KUBERNETES_VERSION
    if not force and (done := cached(root)) is not None:
        return done
    src = source_dir()
    go = go_binary()
    with _locked(root):
        if not force and (done := cached(root)) is not None:
            return done  # another process built it while we waited
        log = root / "build.log"
        log.write_text("")
        staging = root / "staging"
        shutil.rmtree(staging, ignore_errors=True)
        (staging / "bin").mkdir(parents=True)
        (staging / "crds").mkdir()
        start = time.monotonic()
        ldflags = version_ldflags()
        say(f"building etcd {ETCD_VERSION} (log: {log})")
        _run([go, "build", "-p", "2", "-trimpath", "-ldflags", "-s -w",
              "-o", str(staging / "bin") + "/", "./cmd/etcd"], src / "etcd", log)
        say(f"building kube-apiserver, kube-scheduler, kubectl {KUBERNETES_VERSION} "
            "(cold: tens of minutes on 2 cores)")
        _run([go, "build", "-p", "2", "-trimpath", "-ldflags", ldflags,
              "-o", str(staging / "bin") + "/",
              "./cmd/kube-apiserver", "./cmd/kube-scheduler", "./cmd/kubectl"],
             src / "kubernetes", log)
        for module in (TRAINING_OPERATOR, KOORDINATOR):
            crd = module_file(go, module, src / "kubernetes", log)
            shutil.copyfile(crd, staging / "crds" / crd.name)
        for sub in ("bin", "crds"):
            shutil.rmtree(root / sub, ignore_errors=True)
            (staging / sub).rename(root / sub)
        shutil.rmtree(staging, ignore_errors=True)
        seconds = time.monotonic() - start
        stamp = {
            "kubernetes": KUBERNETES_VERSION, "etcd": ETCD_VERSION,
            "trainingOperator": TRAINING_OPERATOR[1], "koordinator": KOORDINATOR[1],
            "digest": sources_digest(src), "seconds": round(seconds, 1),
            "sizes": {b: (root / "bin" / b).stat().st_size for b in BINARIES},
        }
        (root / STAMP).write_text(json.dumps(stamp, indent=2))
        say(f"built in {seconds:.0f}s into {root}")
    return Build(root, KUBERNETES_VERSION)
