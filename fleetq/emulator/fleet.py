"""Running a whole emulated fleet: :class:`Emulator` (asyncio, for ``fleetq sim serve``)
and :class:`EmulatedFleet` (a handle that runs it on a background thread with its own
event loop, for tests, benchmarks and ``fleetq up``).

Besides the cluster API ports it serves one control endpoint (faults, inspection), writes
the kubeconfig, the fleet config and ``emulator.json`` (how ``fleetq sim fault
--state-dir`` finds the control URL), and optionally persists every object to a state
file so a restarted emulator comes back with the same objects and tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from fleetq.emulator import tls
from fleetq.emulator.cluster import EmulatedCluster
from fleetq.emulator.faults import control_app
from fleetq.emulator.kube_objects import node_object
from fleetq.emulator.kubeconfig import write_files, write_private
from fleetq.emulator.store import Obj
from fleetq.topology import NodeGroup, Topology, default_topology

T = TypeVar("T")
STATE_VERSION = 1
PERSIST_EVERY = 2.0
#: the state file costs at most 1/PERSIST_BUDGET of the emulator's time
PERSIST_BUDGET = 20
INFO_FILE = "emulator.json"


class EmulatorError(RuntimeError):
    """The emulator could not start (port in use, unreadable state file, ...)."""


def _kind_to_plural(cluster: EmulatedCluster, kind: str) -> str:
    k = kind.lower()
    for rt in cluster.store.types.values():
        if k in (rt.plural, rt.singular, rt.kind.lower(), *rt.short_names):
            return rt.plural
    raise KeyError(f"cluster {cluster.name} has no resource {kind!r}")


class Emulator:
    """All clusters of a topology in one asyncio loop."""

    def __init__(
        self,
        topology: Topology,
        out_dir: Path,
        *,
        state_file: Path | None = None,
        host: str = "127.0.0.1",
        base_port: int | None = None,
        start_delay: float = 0.2,
        use_tls: bool | None = None,
    ) -> None:
        self.topology = topology
        self.use_tls = tls.available() if use_tls is None else use_tls
        self.tls: tls.TlsMaterial | None = None
        self.out_dir = Path(out_dir)
        self.state_file = Path(state_file) if state_file else None
        self.host = host
        self.base_port = base_port
        self.start_delay = start_delay
        self.clusters: dict[str, EmulatedCluster] = {}
        self.kubeconfig_path: Path | None = None
        self.fleet_config_path: Path | None = None
        self.control_url = ""
        self._control: web.AppRunner | None = None
        self._persist_task: asyncio.Task[None] | None = None
        self._started = False

    # ------------------------------------------------------------------ lifecycle

    def _load_state(self) -> dict[str, Any]:
        if self.state_file is None or not self.state_file.exists():
            return {}
        try:
            data = json.loads(self.state_file.read_text())
        except (OSError, ValueError) as exc:
            raise EmulatorError(f"{self.state_file}: cannot load emulator state ({exc})") from None
        if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
            raise EmulatorError(f"{self.state_file}: not an emulator state file (version 1)")
        return data

    async def start(self) -> None:
        loaded = self._load_state()
        state = loaded.get("clusters") or {}
        ctx = None
        if self.use_tls:
            if loaded.get("tls"):
                self.tls = tls.TlsMaterial.from_dict(loaded["tls"])
            else:
                self.tls = tls.make_material([self.host])
            ctx = tls.server_context(self.tls, self.out_dir)
        for spec in self.topology.clusters:
            saved = state.get(spec.name) or {}
            c = EmulatedCluster(spec, token=saved.get("token"), start_delay=self.start_delay)
            if saved.get("store"):
                c.store.load(saved["store"])
            self.clusters[spec.name] = c
        try:
            for i, c in enumerate(self.clusters.values()):
                if c.store.rv <= 1:
                    c.controller.seed()
                c.controller.resync()
                c.controller.start()
                port = self.base_port + i if self.base_port else 0
                await c.start(self.host, port, ctx)
            self._control = web.AppRunner(control_app(self), access_log=None,
                                          shutdown_timeout=0.2, handle_signals=False)
            await self._control.setup()
            cport = self.base_port + len(self.clusters) if self.base_port else 0
            site = web.TCPSite(self._control, "127.0.0.1", cport, reuse_address=True)
            await site.start()
            addr = next(a for a in self._control.addresses if isinstance(a, tuple))
            self.control_url = f"http://127.0.0.1:{addr[1]}"
        except OSError as exc:
            await self.stop()
            raise EmulatorError(f"cannot listen: {exc.strerror or exc}") from None
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.kubeconfig_path, self.fleet_config_path = write_files(
            self.out_dir, list(self.clusters.values()), self.tls.ca_pem if self.tls else None
        )
        info = {
            "pid": os.getpid(),
            "controlUrl": self.control_url,
            "kubeconfig": str(self.kubeconfig_path),
            "fleetConfig": str(self.fleet_config_path),
            "clusters": {n: c.url for n, c in self.clusters.items()},
        }
        write_private(self.out_dir / INFO_FILE, json.dumps(info, indent=2))
        if self.state_file is not None:
            self._persist_task = asyncio.get_running_loop().create_task(self._persist_loop())
        self._started = True

    async def stop(self) -> None:
        if self._persist_task is not None:
            self._persist_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._persist_task
            self._persist_task = None
        if self._started:
            await self.persist()
        for c in self.clusters.values():
            await c.stop()
        if self._control is not None:
            await self._control.cleanup()
            self._control = None
        with contextlib.suppress(OSError):
            (self.out_dir / INFO_FILE).unlink()
        self._started = False

    async def run_forever(self, stop: asyncio.Event) -> None:
        await stop.wait()

    # ------------------------------------------------------------------ persistence

    def snapshot(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "tls": self.tls.to_dict() if self.tls else None,
            "clusters": {
                n: {"token": c.token, "port": c.port, "store": c.store.dump()}
                for n, c in self.clusters.items()
            },
        }

    async def persist(self) -> None:
        if self.state_file is None:
            return
        snap = self.snapshot()
        for c in self.clusters.values():
            c.store.dirty = False
        path = self.state_file

        def write() -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_private(path, json.dumps(snap, separators=(",", ":")))

        await asyncio.to_thread(write)

    async def _persist_loop(self) -> None:
        """Write the state file when something changed, at most every PERSIST_EVERY
        seconds, and never spending more than 1/PERSIST_BUDGET of the time on it: a
        dump is of the whole state, so a big fleet persists less often."""
        pause = PERSIST_EVERY
        while True:
            await asyncio.sleep(pause)
            if any(c.store.dirty for c in self.clusters.values()):
                started = time.monotonic()
                await self.persist()
                pause = max(PERSIST_EVERY, (time.monotonic() - started) * PERSIST_BUDGET)

    # ------------------------------------------------------------------ faults & peeks

    def cluster(self, name: str) -> EmulatedCluster:
        try:
            return self.clusters[name]
        except KeyError:
            raise KeyError(f"unknown cluster {name!r}") from None

    async def set_reachable(self, name: str, reachable: bool) -> None:
        await self.cluster(name).set_reachable(reachable)

    def inject_errors(self, name: str, status: int, rate: float, retry_after: float | None) -> None:
        f = self.cluster(name).faults
        f.error_status = status
        f.error_rate = rate
        f.retry_after = retry_after

    async def clear_faults(self, name: str) -> None:
        c = self.cluster(name)
        c.faults.clear()
        await c.set_reachable(True)

    def objects(self, name: str, kind: str) -> list[Obj]:
        c = self.cluster(name)
        plural = _kind_to_plural(c, kind)
        return [json.loads(c.store.cached_json(o)) for o in c.store.items(plural)]


class EmulatedFleet:
    """An :class:`Emulator` on a background thread; use as a context manager.

    ``topology`` defaults to the shipped default topology, ``out_dir`` to a fresh
    temporary directory."""

    def __init__(
        self,
        topology: Topology | None = None,
        out_dir: Path | str | None = None,
        state_file: Path | str | None = None,
        host: str = "127.0.0.1",
        base_port: int | None = None,
        *,
        start_delay: float = 0.2,
        use_tls: bool | None = None,
    ) -> None:
        self.topology = topology or default_topology()
        self.out_dir = Path(out_dir) if out_dir else Path(tempfile.mkdtemp(prefix="fleetq-sim-"))
        self.emulator = Emulator(
            self.topology, self.out_dir,
            state_file=Path(state_file) if state_file else None,
            host=host, base_port=base_port, start_delay=start_delay,
            use_tls=use_tls,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> EmulatedFleet:
        self._thread = threading.Thread(target=self._main, name="fleetq-emulator", daemon=True)
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise self._error
        if not self._ready.is_set():
            raise EmulatorError("the emulator did not start within 30 s")
        return self

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)

        async def body() -> None:
            self._stop = asyncio.Event()
            try:
                await self.emulator.start()
            except BaseException as exc:  # surfaced to start()
                self._error = exc
                self._ready.set()
                return
            self._ready.set()
            try:
                await self.emulator.run_forever(self._stop)
            finally:
                await self.emulator.stop()

        try:
            loop.run_until_complete(body())
        finally:
            loop.close()

    def stop(self) -> None:
        if self._loop is None or self._thread is None or self._stop is None:
            return
        if self._thread.is_alive():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(30)
        self._thread = None

    def __enter__(self) -> EmulatedFleet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _call(self, fn: Callable[[], T], timeout: float = 30) -> T:
        """Run ``fn`` on the emulator's loop (all state lives there) and return its result."""

        async def run() -> T:
            return fn()

        return self._run(run, timeout)

    def _run(self, coro_fn: Callable[[], Awaitable[T]], timeout: float = 30) -> T:
        assert self._loop is not None

        async def run() -> T:
            return await coro_fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    # ------------------------------------------------------------------ facts

    @property
    def kubeconfig_path(self) -> Path:
        assert self.emulator.kubeconfig_path is not None
        return self.emulator.kubeconfig_path

    @property
    def fleet_config_path(self) -> Path:
        assert self.emulator.fleet_config_path is not None
        return self.emulator.fleet_config_path

    @property
    def control_url(self) -> str:
        return self.emulator.control_url

    @property
    def clusters(self) -> list[str]:
        return list(self.emulator.clusters)

    @property
    def members(self) -> list[str]:
        return [n for n, c in self.emulator.clusters.items() if c.spec.member]

    def endpoint(self, cluster: str) -> str:
        return self.emulator.cluster(cluster).url

    def token(self, cluster: str) -> str:
        return self.emulator.cluster(cluster).token

    def api_client(self, cluster: str) -> Any:
        """A ``kubernetes.client.ApiClient`` for one cluster (via the kubeconfig)."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig_path),
                                             context=cluster)

    # ------------------------------------------------------------------ faults

    def set_reachable(self, cluster: str, reachable: bool) -> None:
        self._run(lambda: self.emulator.set_reachable(cluster, reachable))

    def fail_job(self, cluster: str, namespace: str, name: str) -> bool:
        return self._call(
            lambda: self.emulator.cluster(cluster).controller.fail_job(namespace, name)
        )

    def complete_job(self, cluster: str, namespace: str, name: str) -> bool:
        return self._call(
            lambda: self.emulator.cluster(cluster).controller.complete_job(namespace, name)
        )

    def cordon(self, cluster: str, node: str, on: bool = True) -> bool:
        return self._call(lambda: self.emulator.cluster(cluster).controller.set_cordon(node, on))

    def add_node(self, cluster: str, name: str, group: NodeGroup) -> None:
        """Join a node shaped like ``group`` (its count aside) to ``cluster``, as a
        cluster autoscaler would: watches see it ADDED."""

        def create() -> None:
            c = self.emulator.cluster(cluster)
            c.store.create("nodes", node_object(name, group, cluster, len(c.controller.nodes)))

        self._call(create)

    def inject_errors(
        self, cluster: str, status: int = 500, rate: float = 1.0, retry_after: float | None = None
    ) -> None:
        self._call(lambda: self.emulator.inject_errors(cluster, status, rate, retry_after))

    def set_latency(self, cluster: str, seconds: float) -> None:
        def apply() -> None:
            self.emulator.cluster(cluster).faults.latency = seconds

        self._call(apply)

    def clear_faults(self, cluster: str) -> None:
        self._run(lambda: self.emulator.clear_faults(cluster))

    # ------------------------------------------------------------------ peeks and load

    def objects(self, cluster: str, kind: str) -> list[Obj]:
        """Copies of every object of ``kind`` (plural, singular or Kind) in a cluster."""
        return self._call(lambda: self.emulator.objects(cluster, kind))

    def add_running_pods(
        self,
        cluster: str,
        count: int,
        *,
        namespace: str = "load",
        requests: Mapping[str, str] | None = None,
        prefix: str = "load",
        labels: Mapping[str, str] | None = None,
    ) -> list[str]:
        """Bulk-load ``count`` running, ownerless pods spread over the cluster's nodes
        (background load for benchmarks; raises ValueError when they do not fit)."""
        req = dict(requests or {"cpu": "100m", "memory": "128Mi"})
        lab = dict(labels or {"app": "background-load"})
        return self._call(
            lambda: self.emulator.cluster(cluster).controller.add_running_pods(
                count, namespace, req, prefix, lab
            ),
            timeout=300,
        )

    def persist(self) -> None:
        """Write the state file now (no-op without one)."""
        self._run(self.emulator.persist)
