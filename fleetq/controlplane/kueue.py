"""The build of Kueue's scheduler performance harness, the third part of the control plane.

``fleetq bench kueue`` runs Kueue beside fleetq on this machine with Kueue's own harness
(``test/performance/scheduler`` of the Go module ``sigs.k8s.io/kueue``): ``minimalkueue``
(Kueue's core controllers and scheduler, nothing else) and the ``runner`` (its envtest
control plane, the workload generator, the recorder that mimics execution and writes
``summary.yaml`` / ``wlStates.csv``). Both are ``tool`` directives of our wrapper module
``controlplane/kueue`` (Kueue's tag's pinned dependency versions), built as the other
parts are, into ``<control-plane cache>/kueue/`` with its own stamp; the CRDs and the
baseline generator config are copied out of the module. envtest runs our own etcd and
kube-apiserver (``KUBEBUILDER_ASSETS`` is the control-plane part's ``bin/``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from fleetq import gobuild
from fleetq.controlplane import build as B

KUEUE_MODULE = ("sigs.k8s.io/kueue", "v0.17.0")
HARNESS = "test/performance/scheduler"
#: binary name -> main package (tools of controlplane/kueue/go.mod)
KUEUE_BINARIES = {
    "minimalkueue": f"{KUEUE_MODULE[0]}/{HARNESS}/minimalkueue",
    "runner": f"{KUEUE_MODULE[0]}/{HARNESS}/runner",
}
#: what is copied out of the module: (path in the module, sub-directory of the part)
KUEUE_FILES = (
    ("config/components/crd/bases", "crds"),
    (f"{HARNESS}/configs/baseline/generator.yaml", "configs"),
    (f"{HARNESS}/configs/baseline/rangespec.yaml", "configs"),
)
KUEUE_DIR = "kueue"  # the wrapper module under controlplane/ and the part under the cache


@dataclass(frozen=True)
class KueueBuild:
    """The built harness: where its binaries, CRDs and baseline config are."""

    root: Path
    #: the control-plane part's bin/ (etcd, kube-apiserver): envtest's KUBEBUILDER_ASSETS
    assets: Path

    def binary(self, name: str) -> Path:
        return self.root / "bin" / name

    @property
    def crds(self) -> Path:
        return self.root / "crds"

    def runner_env(self) -> dict[str, str]:
        """The runner's environment: envtest's binaries are ours; ``PROJECT_DIR`` as
        Kueue's Makefile sets it (the test utilities the runner imports fail at init
        without it, or a Makefile above the working directory)."""
        return {**os.environ, "KUBEBUILDER_ASSETS": str(self.assets),
                "PROJECT_DIR": str(self.root / "Makefile")}

    @property
    def baseline_config(self) -> Path:
        """Kueue's own ``configs/baseline/generator.yaml``, as its module ships it."""
        return self.root / "configs" / "generator.yaml"


def kueue_digest(src: Path) -> str:
    """Digest of the wrapper module and of what is taken from Kueue's."""
    h = hashlib.sha256()
    B._digest_files(h, src, (KUEUE_DIR,))
    h.update("@".join(KUEUE_MODULE).encode())
    for rel, sub in KUEUE_FILES:
        h.update(f"{rel}>{sub}".encode())
    return h.hexdigest()[:16]


def part_root(control_plane_root: Path | None = None) -> Path:
    return (control_plane_root or B.cache_root() / B.KUBERNETES_VERSION) / KUEUE_DIR


def _complete(root: Path) -> bool:
    return (all(os.access(root / "bin" / b, os.X_OK) for b in KUEUE_BINARIES)
            and any((root / "crds").glob("*.yaml"))
            and (root / "configs" / "generator.yaml").is_file())


def kueue_cached(control_plane_root: Path | None = None) -> KueueBuild | None:
    """The warm harness build, if its stamp matches our wrapper and every file is there."""
    cp = control_plane_root or B.cache_root() / B.KUBERNETES_VERSION
    root = part_root(cp)
    if not (B._stamp_matches(root, kueue_digest) and _complete(root)):
        return None
    return KueueBuild(root, cp / "bin")


def build_kueue(control_plane_root: Path | None = None, force: bool = False,
                progress: B.Progress | None = None) -> KueueBuild:
    """Build (or reuse) minimalkueue and the runner; copy the CRDs and the baseline."""
    say = progress or (lambda _msg: None)
    cp = control_plane_root or B.cache_root() / B.KUBERNETES_VERSION
    root = part_root(cp)
    if not force and (done := kueue_cached(cp)) is not None:
        return done
    src = B.source_dir()
    if not (src / KUEUE_DIR / "go.mod").is_file():
        raise B.BuildError(f"Kueue harness sources not found at {src / KUEUE_DIR}")
    go = B.go_binary()
    with gobuild.locked(root):
        if not force and B._stamp_matches(root, kueue_digest) and _complete(root):
            return KueueBuild(root, cp / "bin")
        log = root / "build.log"
        log.write_text("")
        staging = root / "staging"
        shutil.rmtree(staging, ignore_errors=True)
        for sub in ("bin", "crds", "configs"):
            (staging / sub).mkdir(parents=True)
        start = time.monotonic()
        say(f"building Kueue's scheduler performance harness {KUEUE_MODULE[1]} "
            f"(minimalkueue, runner; log: {log})")
        work = src / KUEUE_DIR
        gobuild.go_build(go, str(staging / "bin") + "/", list(KUEUE_BINARIES.values()), work,
                         log)
        module = gobuild.module_dir(go, *KUEUE_MODULE, work, log)
        for rel, sub in KUEUE_FILES:
            found = module / rel
            if found.is_dir():
                for crd in sorted(found.glob("*.yaml")):
                    shutil.copyfile(crd, staging / sub / crd.name)
            elif found.is_file():
                shutil.copyfile(found, staging / sub / found.name)
            else:
                raise B.BuildError(f"{rel} not found in {'@'.join(KUEUE_MODULE)}")
        B._install(staging, root, ("bin", "crds", "configs"))
        seconds = time.monotonic() - start
        stamp = {
            "kueue": KUEUE_MODULE[1], "digest": kueue_digest(src),
            "seconds": round(seconds, 1),
            "sizes": {b: (root / "bin" / b).stat().st_size for b in KUEUE_BINARIES},
        }
        (root / B.STAMP).write_text(json.dumps(stamp, indent=2))
        say(f"built the Kueue harness in {seconds:.0f}s into {root}")
    return KueueBuild(root, cp / "bin")
