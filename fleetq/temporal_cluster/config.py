"""The generated configuration of a loopback Temporal cluster: one server config YAML per
process and one dynamic-config file.

Every service runs as its own ``temporal-server start --service X`` process on
127.0.0.1. Temporal takes a process's own ports from ``services.<name>.rpc`` of its
config file, and finds the other processes through membership (ringpop, seeded from the
``cluster_membership`` table), so the files differ only where two processes of the same
service must not share ports: the history section, which names each history process's
own gRPC and membership port.
"""

from __future__ import annotations

import random
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

#: the services of a cluster besides history, which may run as several processes
SERVICES = ("frontend", "matching", "worker")
#: the Temporal databases on the PostgreSQL server, and the schema embedded in
#: temporal-sql-tool that each gets
DATABASES = {"temporal": "postgresql/v12/temporal",
             "temporal_visibility": "postgresql/v12/visibility"}
SQL_PLUGIN = "postgres12"
#: every Temporal process's name starts with it (beside fleetq's own ``worker``)
PREFIX = "temporal-"
#: the database role: the superuser ``initdb`` creates (loopback, trust auth)
DB_USER = "temporal"
#: per process; max_connections of the PostgreSQL server is sized from these
MAX_CONNS = 20
MAX_VISIBILITY_CONNS = 4
#: dynamic config the dev server also sets: search attributes registered by ``fleetq``
#: are visible at once (no cache refresh delay); updates (the quota workflow's ``submit``)
DYNAMIC_CONFIG: dict[str, Any] = {
    "system.forceSearchAttributesCacheRefreshOnRead": [{"value": True}],
    "frontend.enableUpdateWorkflowExecution": [{"value": True}],
    "frontend.enableUpdateWorkflowExecutionAsyncAccepted": [{"value": True}],
}


#: Temporal stores a membership port in ``cluster_membership.rpc_port``, a SMALLINT on
#: PostgreSQL: ports from 32768 up (Linux's ephemeral range, where ``free_port`` lands)
#: fail with "value out of range for type smallint", so the cluster's ports come from
#: below it
PORT_RANGE = (20000, 32767)


def low_free_port(rng: random.Random | None = None) -> int:
    """A loopback TCP port in :data:`PORT_RANGE` that nothing listens on right now."""
    rng = rng or random.Random()
    for _ in range(500):
        port = rng.randint(*PORT_RANGE)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise OSError(f"no free loopback port in {PORT_RANGE[0]}-{PORT_RANGE[1]}")


@dataclass(frozen=True)
class Ports:
    """Every loopback port of one cluster: gRPC and membership per process."""

    postgres: int
    frontend: int
    frontend_http: int
    frontend_membership: int
    matching: int
    matching_membership: int
    worker: int
    worker_membership: int
    history: tuple[int, ...]
    history_membership: tuple[int, ...]

    @classmethod
    def pick(cls, histories: int, frontend: int | None = None) -> Ports:
        """Free ports for a cluster of ``histories`` history processes (``frontend``
        fixed when given)."""
        taken: set[int] = set()

        def one() -> int:
            while (port := low_free_port()) in taken:
                pass
            taken.add(port)
            return port

        if frontend is not None:
            taken.add(frontend)
        return cls(
            postgres=one(), frontend=frontend or one(), frontend_http=one(),
            frontend_membership=one(), matching=one(), matching_membership=one(),
            worker=one(), worker_membership=one(),
            history=tuple(one() for _ in range(histories)),
            history_membership=tuple(one() for _ in range(histories)))


def history_process(index: int) -> str:
    """The name of history process ``index``."""
    return f"{PREFIX}history-{index}"


def service_of(process: str) -> str:
    """The Temporal service a process runs (``temporal-history-1`` -> ``history``)."""
    return process.removeprefix(PREFIX).split("-")[0]


@dataclass(frozen=True)
class Layout:
    """The shape of the cluster: history processes and history shards."""

    histories: int = 2
    shards: int = 4

    def __post_init__(self) -> None:
        if self.histories < 1 or self.shards < 1:
            raise ValueError("a cluster needs at least one history process and one shard")

    @property
    def processes(self) -> tuple[str, ...]:
        """Every Temporal process by name, in start order (history first):
        ``temporal-history-<i>``, ``temporal-matching``, ``temporal-frontend``,
        ``temporal-worker``."""
        return (*(history_process(i) for i in range(self.histories)),
                *(f"{PREFIX}{s}" for s in ("matching", "frontend", "worker")))

    @property
    def postgres_connections(self) -> int:
        """``max_connections`` that every process's pools fit in, with room for tools."""
        return len(self.processes) * (MAX_CONNS + MAX_VISIBILITY_CONNS) + 20


def _datastore(database: str, port: int, conns: int) -> dict[str, Any]:
    return {"sql": {
        "pluginName": SQL_PLUGIN, "databaseName": database,
        "connectAddr": f"127.0.0.1:{port}", "connectProtocol": "tcp",
        "user": DB_USER, "password": "", "maxConns": conns, "maxIdleConns": conns,
        "maxConnLifetime": "1h"}}


def _rpc(grpc: int, membership: int, **extra: int) -> dict[str, Any]:
    return {"rpc": {"grpcPort": grpc, "membershipPort": membership,
                    "bindOnLocalHost": True, **extra}}


def server_config(ports: Ports, layout: Layout, history: int, dynamic_config: Path,
                  log_level: str = "warn") -> dict[str, Any]:
    """The config of one process; ``history`` is the history process whose ports the
    history section names (any for the other services)."""
    return {
        "log": {"stdout": True, "level": log_level},
        "persistence": {
            "defaultStore": "postgres-default", "visibilityStore": "postgres-visibility",
            "numHistoryShards": layout.shards,
            "datastores": {
                "postgres-default": _datastore("temporal", ports.postgres, MAX_CONNS),
                "postgres-visibility": _datastore("temporal_visibility", ports.postgres,
                                                  MAX_VISIBILITY_CONNS),
            },
        },
        "global": {"membership": {"maxJoinDuration": "30s",
                                  "broadcastAddress": "127.0.0.1"}},
        "services": {
            "frontend": _rpc(ports.frontend, ports.frontend_membership,
                             httpPort=ports.frontend_http),
            "matching": _rpc(ports.matching, ports.matching_membership),
            "history": _rpc(ports.history[history], ports.history_membership[history]),
            "worker": _rpc(ports.worker, ports.worker_membership),
        },
        "clusterMetadata": {
            "enableGlobalNamespace": False, "failoverVersionIncrement": 10,
            "masterClusterName": "active", "currentClusterName": "active",
            "clusterInformation": {"active": {
                "enabled": True, "initialFailoverVersion": 1, "rpcName": "frontend",
                "rpcAddress": f"127.0.0.1:{ports.frontend}"}},
        },
        "dcRedirectionPolicy": {"policy": "noop"},
        "dynamicConfigClient": {"filepath": str(dynamic_config), "pollInterval": "10s"},
    }


def write_configs(directory: Path, ports: Ports, layout: Layout,
                  log_level: str = "warn") -> dict[str, Path]:
    """Write the dynamic config and one server config per process into ``directory``;
    returns process name -> its config file."""
    directory.mkdir(parents=True, exist_ok=True)
    dynamic = directory / "dynamicconfig.yaml"
    dynamic.write_text(yaml.safe_dump(DYNAMIC_CONFIG, sort_keys=False))
    out: dict[str, Path] = {}
    for name in layout.processes:
        history = int(name.rsplit("-", 1)[1]) if service_of(name) == "history" else 0
        path = directory / f"{name}.yaml"
        path.write_text(yaml.safe_dump(
            server_config(ports, layout, history, dynamic, log_level), sort_keys=False))
        out[name] = path
    return out
