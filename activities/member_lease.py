"""A lock per member cluster, held on that member as a ``coordination.k8s.io/v1`` Lease.

Why: workers place gangs from their own caches, and on a member without Reservations
nothing holds the chosen room until the member's scheduler binds, so two workers could
bind onto the same capacity; the bind re-checks the fit while holding this Lease. A Lease
because workers share nothing but Temporal and the members, and it is the member's own
primitive for this (kube-scheduler's leader election). Every update names the
``resourceVersion`` it read, so of two racers one gets 409 Conflict; a dead holder is
replaced after ``leaseDurationSeconds`` without change on the waiter's monotonic clock, as
client-go's leader election does. Threads of one process queue on a local lock first.
Contract: docs/member-contract.md "The bind Lease".
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from activities.kube_api import ApiError, ClusterUnreachable, Conflict, KubeApi

__all__ = ["LEASE_NAME", "LEASE_NAMESPACE", "LeaseBusy", "LeaseHold", "MemberLease"]

log = logging.getLogger(__name__)

LEASE_API = "/apis/coordination.k8s.io/v1"
#: where the bind Lease lives on every member (exists on every cluster, as the
#: control-plane components' own Leases do)
LEASE_NAMESPACE = "kube-system"
LEASE_NAME = "fleetq-bind"
#: a holder that stops renewing is replaced after this long
LEASE_SECONDS = 15
#: how long a bind waits for the Lease before it fails (retryably): far below the bind
#: activity's 60 s start-to-close timeout
WAIT_SECONDS = 20.0


class LeaseBusy(Exception):
    """The Lease stayed held by someone else for the whole wait."""


def micro_time(epoch_s: float) -> str:
    """``metav1.MicroTime`` as the API server parses it (six fractional digits)."""
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class LeaseHold:
    """The Lease as this holder last wrote it."""

    holder: str
    obj: dict[str, Any]
    acquired_at: float  # monotonic
    #: times the holder found the Lease taken and waited, and 409s lost to other writers
    waits: int = 0
    conflicts: int = 0

    @property
    def resource_version(self) -> str:
        return str((self.obj.get("metadata") or {}).get("resourceVersion") or "")


class MemberLease:
    """The bind Lease of one member (``LEASE_NAMESPACE/LEASE_NAME``)."""

    def __init__(
        self,
        api: KubeApi,
        *,
        duration_s: int = LEASE_SECONDS,
        wait_s: float = WAIT_SECONDS,
        namespace: str = LEASE_NAMESPACE,
        name: str = LEASE_NAME,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.duration_s = duration_s
        self.wait_s = wait_s
        self.namespace = namespace
        self.name = name
        self._monotonic = monotonic
        self._local = threading.Lock()
        #: (resourceVersion, when this process first saw it): a Lease unchanged for its
        #: duration is expired, whatever the holder's clock says
        self._observed: tuple[str, float] | None = None

    @property
    def collection(self) -> str:
        return f"{LEASE_API}/namespaces/{quote(self.namespace, safe='')}/leases"

    @property
    def path(self) -> str:
        return f"{self.collection}/{quote(self.name, safe='')}"

    def _body(self, holder: str, rv: str, transitions: int, acquired: str) -> dict[str, Any]:
        now = micro_time(time.time())
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if rv:
            meta["resourceVersion"] = rv
        return {
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": self.duration_s,
                     "acquireTime": acquired or now, "renewTime": now,
                     "leaseTransitions": transitions},
        }

    def _expired(self, rv: str) -> bool:
        now = self._monotonic()
        if self._observed is None or self._observed[0] != rv:
            self._observed = (rv, now)
            return False
        return now - self._observed[1] > self.duration_s

    @contextmanager
    def held(self, holder: str) -> Iterator[LeaseHold]:
        """Hold the Lease as ``holder`` for the ``with`` block; :class:`LeaseBusy` when it
        stays taken for ``wait_s``. ``holder`` should name the job, so a retried attempt
        of the same bind takes back a Lease its crashed attempt left."""
        deadline = self._monotonic() + self.wait_s
        if not self._local.acquire(timeout=self.wait_s):
            raise LeaseBusy(f"lease {self.namespace}/{self.name}: this worker's other binds "
                            f"held it for {self.wait_s:g}s")
        try:
            hold = self._acquire(holder, deadline)
            try:
                yield hold
            finally:
                self._release(hold)
        finally:
            self._local.release()

    def _acquire(self, holder: str, deadline: float) -> LeaseHold:
        waits = conflicts = 0
        delay = 0.005
        while True:
            obj = self.api.get(self.path)
            if obj is None:
                created = self.api.create(self.collection, self._body(holder, "", 0, ""))
                if created is not None:
                    return LeaseHold(holder, created, self._monotonic(), waits, conflicts)
                conflicts += 1
                continue  # created by another worker meanwhile: read it
            spec = obj.get("spec") or {}
            rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
            current = str(spec.get("holderIdentity") or "")
            if current and current != holder and not self._expired(rv):
                if self._monotonic() >= deadline:
                    raise LeaseBusy(f"lease {self.namespace}/{self.name} held by {current} "
                                    f"for {self.wait_s:g}s")
                waits += 1
                time.sleep(delay * (0.5 + random.random()))  # noqa: S311 - jitter only
                delay = min(delay * 2, 0.1)
                continue
            transitions = int(spec.get("leaseTransitions") or 0) + (current != holder)
            acquired = str(spec.get("acquireTime") or "") if current == holder else ""
            try:
                stored = self.api.replace(self.path, self._body(holder, rv, transitions, acquired))
            except Conflict:
                conflicts += 1
                continue  # another writer won this round: read it again
            return LeaseHold(holder, stored, self._monotonic(), waits, conflicts)

    def renew(self, hold: LeaseHold) -> None:
        """Renew the Lease (before work that may outlast half its duration); raises
        :class:`LeaseBusy` if it was lost (expired and taken by another holder)."""
        spec = hold.obj.get("spec") or {}
        body = self._body(hold.holder, hold.resource_version,
                          int(spec.get("leaseTransitions") or 0), str(spec.get("acquireTime")))
        try:
            hold.obj = self.api.replace(self.path, body)
        except Conflict:
            raise LeaseBusy(f"lease {self.namespace}/{self.name} lost by {hold.holder}") from None
        hold.acquired_at = self._monotonic()

    def renew_if_old(self, hold: LeaseHold) -> None:
        if self._monotonic() - hold.acquired_at > self.duration_s / 2:
            self.renew(hold)

    def _release(self, hold: LeaseHold) -> None:
        """Give the Lease up at once (holder cleared, as client-go's ReleaseOnCancel);
        a Lease that changed meanwhile is someone else's and stays as it is."""
        spec = hold.obj.get("spec") or {}
        body = self._body("", hold.resource_version, int(spec.get("leaseTransitions") or 0),
                          str(spec.get("acquireTime")))
        body["spec"]["leaseDurationSeconds"] = 1
        try:
            self.api.replace(self.path, body)
        except Conflict:
            log.warning("lease %s/%s changed while %s held it", self.namespace, self.name,
                        hold.holder)
        except (ClusterUnreachable, ApiError) as exc:
            # It expires after its duration; the next binder waits that long at most.
            log.warning("could not release lease %s/%s: %s", self.namespace, self.name, exc)
