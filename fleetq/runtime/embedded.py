"""The embedded fleet behind ``fleetq up`` and ``fleetq demo``: a Temporal dev server,
the member-cluster emulator and a worker, as child processes this process owns.

Why a supervisor of processes rather than threads: each piece is the same program a user
would run by hand (``temporal server start-dev``, ``fleetq sim serve``, ``fleetq
worker``), logs to its own file under the state dir, and is stopped in order (worker,
emulator, Temporal) with SIGTERM and a deadline, then SIGKILL. Children die with us even
on SIGKILL (Linux parent-death signal). A flock on ``<state>/fleetq.lock`` makes a second
``fleetq up`` on the same state dir refuse instead of fighting over ports, and a port
probe catches anything else already listening.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from fleetq.client.connection import (
    connect,
    ensure_search_attributes,
    temporal_cli_path,
    unpolled,
)
from fleetq.client.registry import registry
from fleetq.naming import INT_ATTRIBUTES, KEYWORD_ATTRIBUTES
from fleetq.runtime.fleet_info import INFO_FILE, LOCK_FILE, FleetInfo, read_info, write_info
from fleetq.runtime.supervisor import Child, port_in_use, spawn_child

Progress = Callable[[str], None]
FLEETQ_CLI = "from fleetq.cli import main; main()"


def dev_server_argv(host: str, port: int, db: Path, *, ui_port: int | None = None,
                    log_level: str = "warn") -> list[str]:
    """``temporal server start-dev`` on the SQLite file ``db`` with fleetq's search
    attributes registered; ``--headless`` (no Web UI) without ``ui_port``."""
    argv = [str(temporal_cli_path()), "server", "start-dev", "--ip", host, "--port", str(port)]
    argv += ["--ui-port", str(ui_port)] if ui_port is not None else ["--headless"]
    argv += ["--db-filename", str(db), "--log-level", log_level]
    for key in KEYWORD_ATTRIBUTES:
        argv += ["--search-attribute", f"{key}=Keyword"]
    for key in INT_ATTRIBUTES:
        argv += ["--search-attribute", f"{key}=Int"]
    return argv


class TemporalKind(StrEnum):
    """Which Temporal the embedded fleet runs (``EmbeddedFleet.temporal``)."""

    #: ``temporal server start-dev``: one process, SQLite
    dev = "dev"
    #: the server built from its Go module: PostgreSQL, one process per service
    cluster = "cluster"


class EmbeddedError(RuntimeError):
    """The embedded fleet could not start; the message is one line for the user."""


class AlreadyRunning(EmbeddedError):
    def __init__(self, info: FleetInfo | None, state_dir: Path) -> None:
        self.info = info
        if info is not None:
            msg = (f"fleetq is already running (pid {info.pid}) — gRPC {info.address}, "
                   f"Web UI {info.ui_url}; stop it with Ctrl-C in its terminal or "
                   f"`kill {info.pid}`")
        else:
            msg = (f"fleetq is already running with state dir {state_dir} (lock held); "
                   "use another --state-dir")
        super().__init__(msg)


@dataclass
class EmbeddedFleet:
    """Start with :meth:`start`, stop with :meth:`stop` (or use as a context manager)."""

    state_dir: Path
    topology: Path | None = None
    host: str = "127.0.0.1"
    port: int = 7233
    ui_port: int = 8233
    emulator_base_port: int | None = None
    members: str = "emulated"  # or "real": control planes built from Go modules
    worker: bool = True
    #: the worker's ``--prometheus-port`` (on ``host``), None: no metrics endpoint
    prometheus_port: int | None = None
    #: "dev": ``temporal server start-dev``; "cluster": the production-shaped Temporal
    #: built from its Go module (:mod:`fleetq.temporal_cluster`: PostgreSQL, one process
    #: per service, two history processes)
    temporal: str = "dev"
    progress: Progress = field(default=lambda _msg: None)
    children: list[Child] = field(default_factory=list)
    kubeconfig: str = ""
    fleet_config: str = ""
    _lock_fd: int | None = None
    #: the running cluster when ``temporal == "cluster"``
    cluster: Any = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def ui_url(self) -> str:
        return f"http://{self.host}:{self.ui_port}"

    @property
    def logs(self) -> Path:
        return self.state_dir / "logs"

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 60.0) -> FleetInfo:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        self._lock()
        try:
            for port, what in ((self.port, "--port"), (self.ui_port, "--ui-port")):
                if port_in_use(self.host, port):
                    raise EmbeddedError(
                        f"port {self.host}:{port} is already in use (another Temporal or "
                        f"fleetq up?); choose another with {what}")
            if self.members == "real":
                self._build_control_plane()
            # real members start one after another (etcd, API server, KWOK, the
            # training-operator, scheduler each): give them three times as long
            deadline = time.monotonic() + (timeout * 3 if self.members == "real" else timeout)
            # Temporal and the members do not depend on each other: start both at once.
            temporal = self._spawn_temporal()
            emulator, info_file = (self._spawn_real_members() if self.members == "real"
                                   else self._spawn_emulator())
            self._wait_temporal(temporal, deadline)
            self._wait_emulator(emulator, info_file, deadline)
            if self.worker:
                self._start_worker(deadline)
            return self._publish()
        except BaseException:
            self.stop()
            raise

    def _publish(self) -> FleetInfo:
        """Write ``fleetq.json``: where the fleet is, and the pid of each child."""
        info = FleetInfo(
            pid=os.getpid(), address=self.address, ui_url=self.ui_url,
            kubeconfig=self.kubeconfig, fleet_config=self.fleet_config,
            state_dir=str(self.state_dir),
            # the dev server's Web UI serves Temporal's HTTP API for every workflow id
            # (the production-shaped cluster runs no UI: its readers use the SDK)
            http_api=self.ui_url if self.cluster is None else "",
            children={c.name: c.proc.pid for c in self.children},
        )
        write_info(info, self.state_dir)
        return info

    def restart(self, child: Child, timeout: float = 60.0) -> Child:
        """Start the worker ``child`` (which died) again and wait until it polls; a note
        goes to the end of its log. Only the worker restarts: Temporal and the members
        hold the fleet's state, so their death stops the fleet. EmbeddedError when the
        new worker dies or does not poll within ``timeout``."""
        if child.name != "worker":
            raise EmbeddedError(f"{child.name} cannot be restarted")
        with contextlib.suppress(ValueError):
            self.children.remove(child)
        with contextlib.suppress(OSError), open(child.log, "a") as fh:
            fh.write(f"--- fleetq up: the worker (pid {child.pid}) exited with code "
                     f"{child.proc.returncode}; starting it again ---\n")
        self._start_worker(time.monotonic() + timeout)
        self._publish()
        return self.children[-1]

    def _lock(self) -> None:
        path = self.state_dir / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise AlreadyRunning(read_info(self.state_dir), self.state_dir) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Child:
        child = spawn_child(name, argv, self.logs, env)
        self.children.append(child)
        return child

    @staticmethod
    def _wait(child: Child, what: str, ready: Callable[[], bool], deadline: float) -> None:
        child.wait_ready(ready, deadline, what=what, error=EmbeddedError)

    def _spawn_temporal(self) -> Child:
        if self.temporal == "cluster":
            return self._spawn_cluster()
        self.progress(f"starting Temporal dev server on {self.address}")
        argv = dev_server_argv(self.host, self.port, self.state_dir / "temporal.db",
                               ui_port=self.ui_port)
        return self._spawn("temporal", argv)

    def _spawn_cluster(self) -> Child:
        """PostgreSQL and every Temporal service (built first if needed); returns the
        frontend. Its processes join :attr:`children`, PostgreSQL first."""
        from fleetq.temporal_cluster.build import BuildError, build
        from fleetq.temporal_cluster.runner import ClusterError, TemporalCluster

        try:
            binaries = build(progress=self.progress)
            self.cluster = TemporalCluster(binaries, self.state_dir / "temporal-cluster",
                                           frontend_port=self.port, progress=self.progress)
            self.cluster.spawn(time.monotonic() + 120.0)
        except (BuildError, ClusterError) as exc:
            if self.cluster is not None:
                self.cluster.stop()
            raise EmbeddedError(str(exc)) from None
        finally:
            if self.cluster is not None:
                self.children.extend(self.cluster.children)
        frontend: Child = self.cluster.services["temporal-frontend"]
        return frontend

    def _wait_temporal(self, child: Child, deadline: float) -> None:
        if self.cluster is not None:
            from fleetq.temporal_cluster.runner import ClusterError

            try:
                self.cluster.wait_ready(deadline)
            except ClusterError as exc:
                raise EmbeddedError(str(exc)) from None
            return
        self._wait(child, "Temporal dev server", _answers(self._temporal_ready), deadline)
        self._wait(child, "Temporal Web UI", lambda: port_in_use(self.host, self.ui_port),
                   deadline)

    async def _temporal_ready(self) -> bool:
        client = await connect(self.address)
        await ensure_search_attributes(client)
        return True

    def _spawn_emulator(self) -> tuple[Child, Path]:
        self.progress("starting the member-cluster emulator")
        out_dir = self.state_dir / "sim"
        info_file = out_dir / "emulator.json"
        with contextlib.suppress(OSError):
            info_file.unlink()
        argv = [sys.executable, "-c", FLEETQ_CLI, "sim", "serve",
                "--state", str(self.state_dir / "emulator.json"), "--out-dir", str(out_dir),
                "--host", self.host]
        if self.topology is not None:
            argv += ["--topology", str(self.topology)]
        if self.emulator_base_port is not None:
            argv += ["--base-port", str(self.emulator_base_port)]
        return self._spawn("emulator", argv), info_file

    def _build_control_plane(self) -> None:
        from fleetq.controlplane.build import BuildError, build, cached

        if cached() is None:
            self.progress("building the control plane from Go modules (cold: ~7 min on 2 "
                          "cores; then cached)")
        try:
            build()
        except BuildError as exc:
            raise EmbeddedError(str(exc)) from None

    def _spawn_real_members(self) -> tuple[Child, Path]:
        self.progress("starting real member control planes (etcd, kube-apiserver, KWOK, "
                      "training-operator, kube-scheduler)")
        out_dir = self.state_dir / "controlplane"
        info_file = out_dir / "controlplane.json"
        with contextlib.suppress(OSError):
            info_file.unlink()
        argv = [sys.executable, "-c", FLEETQ_CLI, "controlplane", "serve",
                "--out-dir", str(out_dir)]
        if self.topology is not None:
            argv += ["--topology", str(self.topology)]
        return self._spawn("members", argv), info_file

    def _wait_emulator(self, child: Child, info_file: Path, deadline: float) -> None:
        out_dir = info_file.parent
        what = "real member control planes" if self.members == "real" else \
            "member-cluster emulator"
        self._wait(child, what, info_file.exists, deadline)
        data: dict[str, Any] = {}
        for _ in range(20):
            try:
                data = json.loads(info_file.read_text())
                break
            except (OSError, ValueError):
                time.sleep(0.05)
        self.kubeconfig = str(data.get("kubeconfig") or out_dir / "kubeconfig")
        self.fleet_config = str(data.get("fleetConfig") or out_dir / "fleet.yaml")

    def _start_worker(self, deadline: float) -> None:
        self.progress("starting the fleetq worker")
        child = self._spawn(
            "worker", [sys.executable, "-c", FLEETQ_CLI, "worker", *(
                ["--prometheus-port", str(self.prometheus_port), "--prometheus-host",
                 self.host] if self.prometheus_port else [])],
            env={"TEMPORAL_ADDRESS": self.address, "FLEETQ_CONFIG": self.fleet_config},
        )
        self._wait(child, "fleetq worker", _answers(self._worker_polling), deadline)

    async def _worker_polling(self) -> bool:
        client = await connect(self.address)
        if await unpolled(client) is not None:  # both task queues, jobs' and control
            await asyncio.sleep(0.2)
            return False
        await registry(client)  # the registry workflow, started if absent
        return True

    def check(self) -> Child | None:
        """The first child that died on its own, if any."""
        for c in self.children:
            if not c.alive():
                return c
        return None

    def stop(self, grace: float = 10.0) -> None:
        """Stop the worker, then the emulator, then Temporal; remove fleetq.json."""
        for child in reversed(self.children):
            child.stop(grace)
        self.children.clear()
        if self.cluster is not None:  # processes restarted since start (a history)
            self.cluster.stop(grace)
            self.cluster = None
        if self._lock_fd is not None:
            info = self.state_dir / INFO_FILE
            with contextlib.suppress(OSError):
                if read_info(self.state_dir) is None or _info_pid(info) == os.getpid():
                    info.unlink()
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> EmbeddedFleet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _answers(check: Callable[[], Coroutine[Any, Any, bool]]) -> Callable[[], bool]:
    """A readiness check for :meth:`Child.wait_ready` that runs the coroutine ``check``
    once per call; any failure counts as not ready yet."""

    def ready() -> bool:
        try:
            return asyncio.run(check())
        except Exception:
            return False

    return ready


def _info_pid(path: Path) -> int | None:
    try:
        return int(json.loads(path.read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
