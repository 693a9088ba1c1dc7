"""The fleet as the worker process sees it: one :class:`MemberCluster` per configured
cluster, built once from the fleet config (``FLEETQ_CONFIG``) and shared by every
activity of the process through :func:`get_fleet`.

Building the fleet starts each cluster's capacity cache (background watches), so
``snapshots()`` is a cheap read of prepared structures after the first sync.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType

from activities.kube_api import KubeApi
from activities.member_cluster import KubernetesMemberCluster, MemberCluster
from fleetq.capacity import ClusterSnapshot, Taint
from fleetq.fleet_config import FleetConfig, FleetConfigError, load_fleet_config

ENV_VAR = "FLEETQ_CONFIG"


class Fleet:
    """All member clusters of one fleet config."""

    def __init__(self, config: FleetConfig, *, start_caches: bool = True) -> None:
        self.config = config
        connect = config.timeouts.connectSeconds
        read = config.timeouts.readSeconds
        self.source: KubeApi | None = None
        if config.source is not None:
            kubeconfig = config.source_kubeconfig()
            assert kubeconfig is not None
            self.source = KubeApi.from_kubeconfig(
                "source", kubeconfig, config.source.context, connect, read, field="source"
            )
        self.clusters: dict[str, MemberCluster] = {}
        self._members: list[KubernetesMemberCluster] = []
        try:
            for i, c in enumerate(config.clusters):
                api = KubeApi.from_kubeconfig(
                    c.name, config.cluster_kubeconfig(c), c.context_name, connect, read,
                    field=f"clusters[{i}].context",
                )
                member = KubernetesMemberCluster(
                    c.name,
                    api,
                    labels=c.labels,
                    reservation=c.reservation,
                    taints=tuple(Taint(t.key, t.value, t.effect) for t in c.taints),
                    source=self.source,
                    cache_ttl_s=config.cacheTTLSeconds,
                    unschedulable_grace_s=config.unschedulableGraceSeconds,
                    failover=config.clusterFailover.settings(),
                    start_cache=start_caches,
                )
                self.clusters[c.name] = member
                self._members.append(member)
        except BaseException:
            self.close()
            raise
        self._pool = ThreadPoolExecutor(
            max_workers=max(4, min(64, len(self.clusters))), thread_name_prefix="fleetq-fleet"
        )

    @classmethod
    def from_config(cls, path: str | Path, *, start_caches: bool = True) -> Fleet:
        return cls(load_fleet_config(path), start_caches=start_caches)

    @classmethod
    def from_env(cls, *, start_caches: bool = True) -> Fleet:
        path = os.environ.get(ENV_VAR)
        if not path:
            raise FleetConfigError(f"{ENV_VAR} is not set (path of the fleet config file)")
        return cls.from_config(path, start_caches=start_caches)

    def get(self, name: str) -> MemberCluster:
        try:
            return self.clusters[name]
        except KeyError:
            known = ", ".join(sorted(self.clusters)) or "none"
            raise KeyError(f"unknown cluster {name!r} (fleet has {known})") from None

    def snapshots(self, names: Iterable[str] | None = None) -> list[ClusterSnapshot]:
        """Capacity snapshots (from the caches), in the order asked (config order by
        default). Clusters whose cache is still syncing are waited for in parallel."""
        wanted = list(self.clusters) if names is None else list(names)
        members = [self.get(n) for n in wanted]
        out: list[ClusterSnapshot | None] = []
        pending: list[int] = []
        for i, m in enumerate(members):
            ready = m.cache.snapshot_nowait() if isinstance(m, KubernetesMemberCluster) else None
            out.append(ready)
            if ready is None:
                pending.append(i)
        if pending:
            futures = {i: self._pool.submit(members[i].capacity) for i in pending}
            for i, fut in futures.items():
                out[i] = fut.result()
        return [s for s in out if s is not None]

    def snapshots_by_list(self, names: Iterable[str] | None = None) -> list[ClusterSnapshot]:
        """Cold path: a fresh LIST of every cluster, in parallel."""
        wanted = list(self.clusters) if names is None else list(names)
        members = [self.get(n) for n in wanted]
        futures = [
            self._pool.submit(m.snapshot_by_list)
            for m in members
            if isinstance(m, KubernetesMemberCluster)
        ]
        return [f.result() for f in futures]

    def requests_sent(self) -> Counter[str]:
        """The requests sent to the member clusters so far, by ``request_kind`` (the
        capacity caches' LISTs, WATCHes and probes included)."""
        total: Counter[str] = Counter()
        for m in self._members:
            total.update(m.api.sent_snapshot())
        return total

    def close(self) -> None:
        for m in getattr(self, "_members", []):
            m.close()
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        apis = {id(m.api): m.api for m in getattr(self, "_members", [])}
        if self.source is not None:
            apis[id(self.source)] = self.source
        for api in apis.values():
            api.close()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


_fleet: Fleet | None = None
_fleet_lock = threading.Lock()


def get_fleet() -> Fleet:
    """The process-wide fleet (built from ``FLEETQ_CONFIG`` on first use)."""
    global _fleet
    with _fleet_lock:
        if _fleet is None:
            _fleet = Fleet.from_env()
        return _fleet


def set_fleet(fleet: Fleet | None) -> Fleet | None:
    """Install (or clear, with None) the process-wide fleet; returns the previous one,
    which the caller may close. For tests and for workers that build their own."""
    global _fleet
    with _fleet_lock:
        previous, _fleet = _fleet, fleet
        return previous
