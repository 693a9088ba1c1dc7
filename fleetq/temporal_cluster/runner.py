"""A production-shaped Temporal on loopback: PostgreSQL, then frontend, matching, worker
and one or more history processes of the server built from its Go module, each its own
process with its own log.

:class:`TemporalCluster` creates the database (``initdb``; as Debian's ``postgres`` user
when root, since PostgreSQL refuses root), loads the schema with ``temporal-sql-tool``,
writes one config per process (:mod:`fleetq.temporal_cluster.config`), starts the services
and registers the ``default`` namespace and fleetq's search attributes, as ``fleetq up``
gets from the dev server. It can kill a history process (:meth:`kill_history`), find a
shard's owner (:meth:`history_owner`, via ``tdbg``) and restart every service on the same
database; ``db_latency_ms`` puts PostgreSQL behind :mod:`fleetq.temporal_cluster.latency_proxy`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path

from fleetq.client.connection import connect, ensure_search_attributes
from fleetq.runtime.supervisor import Child, port_in_use, spawn_child
from fleetq.temporal_cluster.build import Build
from fleetq.temporal_cluster.config import (
    DATABASES,
    DB_USER,
    PREFIX,
    SQL_PLUGIN,
    Layout,
    Ports,
    history_process,
    low_free_port,
    service_of,
    write_configs,
)

Progress = Callable[[str], None]
NAMESPACE = "default"
#: retention of the ``default`` namespace the cluster registers
RETENTION = timedelta(days=3)
#: PostgreSQL refuses to run as root; as root the server runs as this user
POSTGRES_USER = "postgres"


class ClusterError(RuntimeError):
    """The cluster could not start; the message is one line for the user."""


def _as_postgres_user(argv: list[str]) -> list[str]:
    """``argv`` run as :data:`POSTGRES_USER` when we are root (``setpriv`` execs, so the
    pid we hold is PostgreSQL's own)."""
    if os.geteuid() != 0:
        return argv
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise ClusterError("running as root needs setpriv (util-linux) to start PostgreSQL "
                           f"as {POSTGRES_USER}")
    return [setpriv, f"--reuid={POSTGRES_USER}", f"--regid={POSTGRES_USER}",
            "--init-groups", "--", *argv]


def _postgres_owns(path: Path) -> None:
    """As root: hand ``path`` to :data:`POSTGRES_USER` and let it reach it."""
    if os.geteuid() != 0:
        return
    try:
        user = pwd.getpwnam(POSTGRES_USER)
    except KeyError:
        raise ClusterError(f"running as root needs a {POSTGRES_USER!r} user for PostgreSQL "
                           "(Debian's postgresql-common creates it)") from None
    os.chown(path, user.pw_uid, user.pw_gid)
    for parent in path.parents:  # traverse only (x): our state dir is 0700
        mode = parent.stat().st_mode
        if mode & 0o001 == 0:
            os.chmod(parent, mode | 0o001)
        if parent == Path(parent.anchor):
            break


def _stat_cpu(pid: int, children: bool) -> float:
    """utime + stime of ``pid`` (and, with ``children``, of its waited-for children)
    from /proc, in seconds; 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid``, its exited children and its live children (PostgreSQL's
    backends are children of the postmaster)."""
    total = _stat_cpu(pid, children=True)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(stat[1]) == pid:
            total += _stat_cpu(int(entry.name), children=True)
    return total


@dataclass
class TemporalCluster:
    """Start with :meth:`start`, stop with :meth:`stop` (or use as a context manager)."""

    build: Build
    state_dir: Path
    layout: Layout = field(default_factory=Layout)
    frontend_port: int | None = None
    log_level: str = "warn"
    progress: Progress = field(default=lambda _msg: None)
    #: reach PostgreSQL through the latency proxy with this delay each way (ms); None:
    #: directly
    db_latency_ms: float | None = None
    ports: Ports = field(init=False)
    postgres: Child | None = field(default=None, init=False)
    db_proxy: Child | None = field(default=None, init=False)
    db_proxy_port: int | None = field(default=None, init=False)
    services: dict[str, Child] = field(default_factory=dict, init=False)
    configs: dict[str, Path] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.ports = Ports.pick(self.layout.histories, self.frontend_port)

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def address(self) -> str:
        """The frontend's gRPC address: what clients and workers connect to."""
        return f"{self.host}:{self.ports.frontend}"

    @property
    def logs(self) -> Path:
        return self.state_dir / "logs"

    @property
    def children(self) -> list[Child]:
        """Every running process, PostgreSQL first (stop them in reverse)."""
        return [c for c in (self.postgres, self.db_proxy, *self.services.values())
                if c is not None]

    @property
    def pids(self) -> dict[str, int]:
        """Process name -> pid, for CPU accounting (``postgres``,
        ``temporal-history-0``, ...)."""
        return {c.name: c.pid for c in self.children}

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 180.0) -> TemporalCluster:
        """PostgreSQL, the schema, every service; returns once the frontend serves the
        ``default`` namespace with fleetq's search attributes."""
        deadline = time.monotonic() + timeout
        try:
            self.spawn(deadline)
            self.wait_ready(deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def spawn(self, deadline: float) -> None:
        """PostgreSQL (waited for), the schema, the configs, and every service process
        started without waiting for it (:meth:`wait_ready` does)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        self.start_postgres(deadline)
        self.setup_schema(deadline)
        ports = self.ports
        if self.db_latency_ms is not None:
            ports = replace(ports, postgres=self.start_db_proxy(deadline))
        self.configs = write_configs(self.state_dir / "config", ports, self.layout,
                                     self.log_level)
        self.spawn_services()

    def stop(self, grace: float = 10.0) -> None:
        """Every service, then PostgreSQL (a fast shutdown)."""
        self.kill_services(signal.SIGTERM, grace)
        if self.db_proxy is not None:
            self.db_proxy.stop(grace)
            self.db_proxy = None
        if self.postgres is not None:
            self.postgres.stop(grace, sig=signal.SIGINT)
            self.postgres = None

    def __enter__(self) -> TemporalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ postgres

    def start_postgres(self, deadline: float) -> None:
        data = self.state_dir / "postgres"
        if not (data / "PG_VERSION").exists():
            self.progress("initdb: a PostgreSQL data directory")
            data.mkdir(parents=True, exist_ok=True)
            _postgres_owns(data)
            done = subprocess.run(
                _as_postgres_user([str(self.build.pg("initdb")), "-D", str(data), "-U",
                                   DB_USER, "--auth=trust", "-E", "UTF8", "--locale=C",
                                   "--no-sync"]),
                capture_output=True, text=True, check=False, timeout=120)
            if done.returncode != 0:
                raise ClusterError(f"initdb failed: {done.stderr.strip()[-400:]}")
        self.progress(f"starting PostgreSQL on {self.host}:{self.ports.postgres}")
        self.postgres = spawn_child("postgres", _as_postgres_user([
            str(self.build.pg("postgres")), "-D", str(data), "-p", str(self.ports.postgres),
            "-c", f"listen_addresses={self.host}", "-c", "unix_socket_directories=",
            "-c", f"max_connections={self.layout.postgres_connections}"]),
            self.logs, death_signal=signal.SIGINT)
        self.postgres.wait_ready(lambda: port_in_use(self.host, self.ports.postgres),
                                 deadline, what="PostgreSQL", error=ClusterError)

    @property
    def db_proxy_stats(self) -> Path:
        """Where the latency proxy writes its counters (JSON, every second)."""
        return self.state_dir / "db-proxy-stats.json"

    def start_db_proxy(self, deadline: float) -> int:
        """The latency proxy in front of PostgreSQL (:attr:`db_latency_ms` each way);
        returns the port the services are to use instead of PostgreSQL's."""
        port = low_free_port()
        self.progress(f"PostgreSQL behind the latency proxy on {self.host}:{port}, "
                      f"{self.db_latency_ms:g} ms each way")
        self.db_proxy = spawn_child("db-proxy", [
            sys.executable, "-m", "fleetq.temporal_cluster.latency_proxy",
            "--listen", str(port), "--target", f"{self.host}:{self.ports.postgres}",
            "--delay-ms", str(self.db_latency_ms), "--stats", str(self.db_proxy_stats)],
            self.logs)
        self.db_proxy.wait_ready(lambda: port_in_use(self.host, port), deadline,
                                 what="the database latency proxy", error=ClusterError)
        self.db_proxy_port = port
        return port

    def sql_tool(self, database: str, *args: str, deadline: float) -> None:
        """``temporal-sql-tool`` against ``database``; retried while PostgreSQL is still
        coming up (it accepts connections before it accepts logins)."""
        argv = [str(self.build.sql_tool), "--plugin", SQL_PLUGIN, "--ep", self.host,
                "-p", str(self.ports.postgres), "-u", DB_USER, "--db", database, *args]
        while True:
            done = subprocess.run(argv, capture_output=True, text=True, check=False,
                                  timeout=120)
            if done.returncode == 0:
                return
            if time.monotonic() > deadline:
                tail = (done.stderr or done.stdout).strip().splitlines()[-2:]
                raise ClusterError(f"temporal-sql-tool {' '.join(args)} on {database} "
                                   f"failed: {' | '.join(tail)}")
            time.sleep(0.5)

    def setup_schema(self, deadline: float) -> None:
        """Both databases at the schema embedded in ``temporal-sql-tool`` (idempotent:
        update-schema on an up-to-date database does nothing)."""
        self.progress("loading the Temporal schema (temporal-sql-tool, postgres12)")
        for database, schema in DATABASES.items():
            self.sql_tool(database, "create-database", deadline=deadline)
            self.sql_tool(database, "setup-schema", "-v", "0.0", deadline=deadline)
            self.sql_tool(database, "update-schema", "--schema-name", schema,
                          deadline=deadline)

    # ------------------------------------------------------------------ services

    def spawn_service(self, name: str) -> Child:
        """Start one Temporal process (:attr:`Layout.processes`) without waiting for it."""
        service = service_of(name)
        child = spawn_child(name, [
            str(self.build.server), "--config-file", str(self.configs[name]),
            "--allow-no-auth", "start", "--service", service], self.logs)
        self.services[name] = child
        return child

    def spawn_services(self, timeout: float = 120.0) -> None:
        """Every service process; only the first is waited for, until it serves gRPC.

        One first, on its own: each process saves the cluster's metadata on a fresh
        database when it starts, and two doing it at once make the loser exit
        ("duplicate key value violates unique constraint cluster_metadata_info_pkey").
        A process listens on its gRPC port only after that step."""
        self.progress(f"starting Temporal {self.build.version}: "
                      f"{', '.join(self.layout.processes)} "
                      f"({self.layout.shards} history shards)")
        first, *rest = self.layout.processes
        self.spawn_service(first).wait_ready(
            lambda: port_in_use(self.host, self.ports.history[0]),
            time.monotonic() + timeout, what=first, error=ClusterError, poll=0.2)
        for name in rest:
            self.spawn_service(name)

    def start_services(self, timeout: float = 180.0) -> None:
        """Every service process again (after :meth:`kill_services`; same database),
        then wait until the cluster serves fleetq."""
        self.spawn_services()
        self.wait_ready(time.monotonic() + timeout)

    def wait_ready(self, deadline: float) -> None:
        """Until every service is alive and the frontend serves the namespace."""
        frontend = self.services[f"{PREFIX}frontend"]

        def ready() -> bool:
            for child in self.services.values():
                if not child.alive():
                    raise ClusterError(f"{child.name} exited with code "
                                       f"{child.proc.returncode}: {child.tail() or 'no output'}"
                                       f" (log: {child.log})")
            try:
                return asyncio.run(self._serves_fleetq())
            except ClusterError:
                raise
            except Exception:
                return False

        frontend.wait_ready(ready, deadline, what="Temporal frontend", error=ClusterError,
                            poll=0.5)

    async def _serves_fleetq(self) -> bool:
        """The namespace exists (registered here if not), fleetq's search attributes are
        registered, and a workflow can be started (history) and a task queue described
        (matching)."""
        from temporalio.api.enums.v1 import TaskQueueType
        from temporalio.api.taskqueue.v1 import TaskQueue
        from temporalio.api.workflowservice.v1 import (
            DescribeNamespaceRequest,
            DescribeTaskQueueRequest,
            RegisterNamespaceRequest,
        )
        from temporalio.service import RPCError, RPCStatusCode

        client = await connect(self.address, NAMESPACE)
        try:
            await client.workflow_service.describe_namespace(
                DescribeNamespaceRequest(namespace=NAMESPACE))
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise
            request = RegisterNamespaceRequest(namespace=NAMESPACE)
            request.workflow_execution_retention_period.FromTimedelta(RETENTION)
            with contextlib.suppress(RPCError):  # already there: someone else registered
                await client.workflow_service.register_namespace(request)
            return False
        await ensure_search_attributes(client)
        probe = f"fleetq-cluster-probe-{uuid.uuid4().hex[:8]}"
        handle = await client.start_workflow("FleetqClusterProbe", id=probe,
                                             task_queue="fleetq-cluster-probe")
        await handle.terminate("readiness probe")
        await client.workflow_service.describe_task_queue(DescribeTaskQueueRequest(
            namespace=NAMESPACE, task_queue=TaskQueue(name="fleetq-cluster-probe"),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW))
        return True

    def kill_services(self, sig: int = signal.SIGKILL, grace: float = 10.0) -> None:
        """Stop every Temporal process (PostgreSQL keeps running): frontend first."""
        for name in reversed(list(self.services)):
            self.services[name].stop(grace, sig=sig)
        self.services.clear()

    def kill_history(self, index: int, sig: int = signal.SIGKILL) -> Child:
        """Kill history process ``index`` (SIGKILL: no handover, as a crashed host);
        its shards move to the other history processes once membership notices."""
        child = self.services[history_process(index)]
        child.stop(sig=sig)
        return child

    def start_history(self, index: int) -> Child:
        """Start history process ``index`` again (it rejoins and takes shards back)."""
        return self.spawn_service(history_process(index))

    def history_owner(self, workflow_id: str, namespace: str = NAMESPACE) -> int | None:
        """The history process that owns ``workflow_id``'s shard now, by its gRPC port in
        ``tdbg workflow describe`` (the admin API); None when tdbg cannot tell."""
        tdbg = self.build.root / "bin" / "tdbg"
        if not os.access(tdbg, os.X_OK):
            return None
        done = subprocess.run(
            [str(tdbg), "--address", self.address, "--namespace", namespace,
             "workflow", "describe", "--workflow-id", workflow_id],
            capture_output=True, text=True, check=False, timeout=30)
        found = re.search(r"History service address:\s*\S*:(\d+)", done.stdout)
        if done.returncode != 0 or found is None:
            return None
        port = int(found.group(1))
        return self.ports.history.index(port) if port in self.ports.history else None

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds (user + system) so far of each process; ``postgres`` counts the
        postmaster and every backend it forked (one per pooled connection), live or
        exited."""
        return {c.name: tree_cpu_seconds(c.pid) if c is self.postgres else
                _stat_cpu(c.pid, children=False) for c in self.children}

    def info(self) -> dict[str, object]:
        """What ``fleetq temporal-cluster up`` publishes: address, processes, ports."""
        return {"address": self.address, "version": self.build.version,
                "shards": self.layout.shards, "pids": self.pids,
                "postgres": f"{self.host}:{self.ports.postgres}",
                **({"db_proxy": f"{self.host}:{self.db_proxy_port}",
                    "db_latency_ms": self.db_latency_ms} if self.db_proxy_port else {}),
                "history": [f"{self.host}:{p}" for p in self.ports.history],
                "logs": str(self.logs)}

    def write_info(self, path: Path) -> Path:
        path.write_text(json.dumps(self.info(), indent=2))
        return path
