"""The capacity ledger of one emulated cluster: each node's allocatable room, what bound
pods and Available reservations hold of it, and which pods wait to be bound.

It is kept incrementally from store changes (never by rescanning pods): benchmarks load
thousands of running pods per cluster and the scheduler asks for free room on every try.
"""

from __future__ import annotations

from fleetq import resources as R
from fleetq.emulator.kube_objects import TERMINAL
from fleetq.emulator.node_fit import NodeState
from fleetq.emulator.store import Key, Obj
from fleetq.models import pod_requests


def reservation_room(res: Obj) -> R.Resources:
    """What a reservation holds: its pod template's requests."""
    spec = ((res.get("spec") or {}).get("template") or {}).get("spec") or {}
    try:
        return pod_requests(spec)
    except R.QuantityError:
        return {}


class CapacityLedger:
    """Room per node, kept from the store's change stream."""

    def __init__(self) -> None:
        self.nodes: dict[str, NodeState] = {}
        self.used: dict[str, R.Resources] = {}
        self.pods_used: dict[str, int] = {}
        self.pod_usage: dict[Key, tuple[str, R.Resources]] = {}
        self.held: dict[str, tuple[str, R.Resources]] = {}  # reservation name -> node, room
        self.pending: dict[Key, None] = {}  # ordered set of unbound pods
        self._requests: dict[tuple[Key, str], R.Resources] = {}

    def clear(self) -> None:
        """Forget every node, pod and reservation (before replaying the store)."""
        self.nodes.clear()
        self.used.clear()
        self.pods_used.clear()
        self.pod_usage.clear()
        self.held.clear()
        self.pending.clear()

    # ------------------------------------------------------------------ store changes

    def pod_changed(self, key: Key, new: Obj | None) -> bool:
        """Account a pod's new version (None: deleted); True when room was freed or a pod
        now waits to be bound (the scheduler should run)."""
        schedule = False
        prev = self.pod_usage.pop(key, None)
        if prev is not None:
            node, req = prev
            R.add_into(self.used.setdefault(node, {}), req, -1)
            self.pods_used[node] = self.pods_used.get(node, 1) - 1
            schedule = True
        self.pending.pop(key, None)
        if new is not None:
            bound = (new.get("spec") or {}).get("nodeName")
            phase = (new.get("status") or {}).get("phase") or "Pending"
            if bound and phase not in TERMINAL:
                req = self.requests_of(key, new)
                self.pod_usage[key] = (bound, req)
                R.add_into(self.used.setdefault(bound, {}), req)
                self.pods_used[bound] = self.pods_used.get(bound, 0) + 1
            elif not bound and phase == "Pending":
                self.pending[key] = None
                schedule = True
        else:
            for k in [k for k in self._requests if k[0] == key]:
                del self._requests[k]
        return schedule

    def node_changed(self, new: Obj | None, old: Obj | None) -> None:
        if new is None:
            assert old is not None
            self.nodes.pop(old["metadata"]["name"], None)
            return
        alloc = R.parse_resources((new.get("status") or {}).get("allocatable"))
        pods = alloc.pop(R.PODS, 110 * R.MILLI) // R.MILLI
        spec = new.get("spec") or {}
        self.nodes[new["metadata"]["name"]] = NodeState(
            new["metadata"]["name"], alloc, pods,
            dict(new["metadata"].get("labels") or {}),
            list(spec.get("taints") or []), bool(spec.get("unschedulable")),
        )

    def reservation_changed(self, name: str, new: Obj | None) -> bool:
        """Hold an Available reservation's room, release it otherwise; True when what is
        held changed."""
        changed = self.held.pop(name, None) is not None
        if new is not None:
            st = new.get("status") or {}
            if st.get("phase") == "Available" and st.get("nodeName"):
                self.held[name] = (st["nodeName"], reservation_room(new))
                changed = True
        return changed

    # ------------------------------------------------------------------ queries

    def requests_of(self, key: Key, pod: Obj) -> R.Resources:
        """A pod's requests, parsed once per pod uid."""
        ck = (key, pod["metadata"].get("uid", ""))
        got = self._requests.get(ck)
        if got is None:
            try:
                got = pod_requests(pod.get("spec") or {})
            except R.QuantityError:
                got = {}
            self._requests[ck] = got
        return got

    def remember_requests(self, key: Key, uid: str, requests: R.Resources) -> None:
        """Record a pod's parsed requests before it is stored (bulk load skips parsing)."""
        self._requests[(key, uid)] = requests

    def free(self, node: str, release: tuple[str, ...] = ()) -> R.Resources:
        """Room left on a node: allocatable − bound pods − Available reservations (except
        the ones named in ``release``, which the pod being placed may consume)."""
        st = self.nodes[node]
        out = R.sub(st.allocatable, self.used.get(node, {}))
        for rname, (rnode, room) in self.held.items():
            if rnode == node and rname not in release:
                R.add_into(out, room, -1)
        return out

    def pods_free(self, node: str) -> int:
        """Pod slots left on a node."""
        return self.nodes[node].pods - self.pods_used.get(node, 0)
