"""The Go build steps the control-plane and Temporal-cluster builds share.

Both compile pinned Go modules into a cache directory: they find the toolchain, hold a
flock while building, run ``go`` with a logged, capped environment (``GOMAXPROCS=2``,
``-buildvcs=false``) and read files from the Go module cache. One home for those steps
keeps the two builds' behaviour (locking, logging, error lines) the same.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

GO_ENV = "FLEETQ_GO"

Progress = Callable[[str], None]


class BuildError(RuntimeError):
    """A build could not be done; the message is one line for the user."""


def go_binary(minimum: str) -> str:
    """The ``go`` binary: ``$FLEETQ_GO``, then the PATH, then ``/usr/local/go/bin/go``."""
    for candidate in (os.environ.get(GO_ENV), shutil.which("go"), "/usr/local/go/bin/go"):
        if candidate and Path(candidate).is_file():
            return candidate
    raise BuildError(f"no Go toolchain: install Go >= {minimum} "
                     f"(or set {GO_ENV} to the go binary)")


@contextlib.contextmanager
def locked(root: Path) -> Iterator[None]:
    """Hold ``root/.lock`` exclusively (concurrent builds wait, never race)."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def go_env() -> dict[str, str]:
    """This process's environment, capped for 2 cores and without VCS stamping."""
    env = dict(os.environ)
    env.setdefault("GOMAXPROCS", "2")  # 2 cores: keep compile memory and load in check
    env["GOFLAGS"] = " ".join(f for f in (env.get("GOFLAGS", ""), "-buildvcs=false") if f)
    return env


def run(argv: list[str], cwd: Path, log: Path) -> str:
    """Run ``argv`` in ``cwd``, its stderr appended to ``log``; returns its stdout, or
    raises :class:`BuildError` with the log's last lines."""
    with open(log, "ab") as fh:
        fh.write(("$ " + " ".join(argv) + "\n").encode())
        fh.flush()
        proc = subprocess.run(argv, cwd=cwd, env=go_env(), stdout=subprocess.PIPE,
                              stderr=fh, check=False)
        fh.write(proc.stdout)
    if proc.returncode != 0:
        tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
        raise BuildError(f"{Path(argv[0]).name} {argv[1]} failed in {cwd.name}: {tail} "
                         f"(log: {log})")
    return proc.stdout.decode()


def module_dir(go: str, module: str, version: str, work: Path, log: Path) -> Path:
    """Where ``module@version`` is in the Go module cache (downloaded if needed)."""
    info = json.loads(run([go, "mod", "download", "-json", f"{module}@{version}"], work, log))
    if info.get("Error"):
        raise BuildError(f"{module}@{version}: {info['Error']}")
    return Path(info["Dir"])


def go_build(go: str, out: str, packages: list[str], cwd: Path, log: Path,
             ldflags: str = "-s -w") -> None:
    """``go build`` of ``packages`` in ``cwd`` into ``out`` (a directory when it ends in
    ``/``), reproducibly (``-trimpath``) and two packages at a time (``-p 2``)."""
    run([go, "build", "-p", "2", "-trimpath", "-ldflags", ldflags, "-o", out, *packages],
        cwd, log)
