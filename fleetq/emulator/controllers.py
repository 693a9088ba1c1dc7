"""The simulated control plane behind one emulated cluster (what kwok does for nodes).

:class:`ClusterController` composes the controllers and runs them on the API server's
asyncio loop, so every decision is atomic with respect to API requests:
:mod:`~fleetq.emulator.ledger` (capacity kept incrementally from a store hook, never a
rescan of all pods), :mod:`~fleetq.emulator.pytorchjob_operator` (Kubeflow
training-operator behaviour), :mod:`~fleetq.emulator.gang_scheduler` (a job's pending pods
bound all at once or not at all), :mod:`~fleetq.emulator.reservations` (Koordinator-style
Reservations) and :mod:`~fleetq.emulator.pods` (Pending → Running → Succeeded after
``fleetq.io/run-seconds``).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import Mapping
from typing import Any

from fleetq.emulator.gang_scheduler import GangScheduler
from fleetq.emulator.kube_objects import (
    key_of,
    namespace_object,
    node_object,
    record_event,
)
from fleetq.emulator.ledger import CapacityLedger
from fleetq.emulator.node_fit import NodeState
from fleetq.emulator.pods import PodLifecycle, add_running_pods
from fleetq.emulator.pytorchjob_operator import PyTorchJobOperator
from fleetq.emulator.reservations import ReservationController
from fleetq.emulator.store import Key, Obj, Store
from fleetq.emulator.timers import Timers
from fleetq.topology import ClusterSpec, node_names


class ClusterController:
    """Controllers and scheduler of one emulated cluster."""

    def __init__(self, store: Store, spec: ClusterSpec, *, start_delay: float = 0.2) -> None:
        self.store = store
        self.spec = spec
        self.name = spec.name
        self.timers = Timers()
        self.ledger = CapacityLedger()
        self.operator = PyTorchJobOperator(store, self.timers)
        self.pods = PodLifecycle(store, self.timers, start_delay)
        self.reservations = ReservationController(store, self.ledger, self.timers)
        self.scheduler = GangScheduler(store, self.ledger, self.reservations, self.operator,
                                       self.pods)
        self.dirty_jobs: set[Key] = set()
        self.need_schedule = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        store.hooks.append(self._on_change)

    @property
    def nodes(self) -> dict[str, NodeState]:
        return self.ledger.nodes

    # ------------------------------------------------------------------ setup

    def seed(self) -> None:
        """Create nodes and system namespaces for a fresh cluster."""
        for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
            if self.store.get("namespaces", "", ns) is None:
                self.store.create("namespaces", namespace_object(ns))
        for i, (name, group) in enumerate(node_names(self.spec)):
            if self.store.get("nodes", "", name) is None:
                self.store.create("nodes", node_object(name, group, self.name, i))

    def resync(self) -> None:
        """Rebuild bookkeeping and timers from stored objects (after a state reload)."""
        self.ledger.clear()
        self.operator.pods_by_owner.clear()
        for node in self.store.items("nodes"):
            self._on_change("nodes", "ADDED", node, None)
        for res in self.store.items("reservations") if "reservations" in self.store.types else []:
            self._on_change("reservations", "ADDED", res, None)
            self.reservations.arm_expiry(res)
        for pod in self.store.items("pods"):
            self._on_change("pods", "ADDED", pod, None)
            self.pods.arm(pod)
        for job in self.store.items("pytorchjobs"):
            self.dirty_jobs.add(key_of(job))
        self.need_schedule = True
        self._wake.set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        self.timers.cancel_all()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                for _ in range(50):  # settle: job reconciles may create pods and vice versa
                    jobs, self.dirty_jobs = self.dirty_jobs, set()
                    for key in jobs:
                        self.operator.reconcile(key)
                    if self.need_schedule:
                        self.need_schedule = False
                        self.scheduler.schedule()
                    if not self.dirty_jobs and not self.need_schedule:
                        break
            except Exception as exc:  # keep the emulator alive; surface the bug as an event
                self.event("default", {"kind": "Node", "name": self.name}, "Warning",
                           "EmulatorError", f"controller error: {exc!r}")
            await asyncio.sleep(0)

    def wake(self) -> None:
        self._wake.set()

    # ------------------------------------------------------------------ store hook

    def _on_change(self, plural: str, type_: str, new: Obj | None, old: Obj | None) -> None:
        obj = new or old
        assert obj is not None
        if plural == "pods":
            if self.ledger.pod_changed(key_of(obj), new):
                self.need_schedule = True
            owner = self.operator.pod_changed(obj, new)
            if owner is not None:
                self.dirty_jobs.add(owner)
        elif plural == "pytorchjobs":
            self.dirty_jobs.add(key_of(obj))
        elif plural == "nodes":
            self.ledger.node_changed(new, old)
            self.need_schedule = True
        elif plural == "reservations":
            if self.ledger.reservation_changed(obj["metadata"]["name"], new):
                self.need_schedule = True
        else:
            return
        self._wake.set()

    # ------------------------------------------------------------------ API and faults

    def admit_reservation(self, res: Obj) -> None:
        """Decide a new reservation before the API stores it (see
        :meth:`ReservationController.admit`)."""
        self.reservations.admit(res)

    def reservation_created(self, res: Obj) -> None:
        self.reservations.created(res)

    def fail_job(self, namespace: str, name: str) -> bool:
        """Fault injection: the job's pods fail and the job turns Failed."""
        if not self.operator.fail_pods(namespace, name):
            return False
        self.dirty_jobs.add((namespace, name))
        self.operator.reconcile((namespace, name))
        return True

    def complete_job(self, namespace: str, name: str) -> bool:
        """The job's running pods exit 0 now, as if their run-seconds were up, and the
        operator marks it Succeeded (False: no such job, or a pod of it not running).
        What holds a job running until a test lets it finish: run-seconds far ahead."""
        pods = self.operator.owned_pods(namespace, name)
        if not pods or any((p.get("status") or {}).get("phase") != "Running" for p in pods):
            return False
        for pod in pods:
            self.pods.complete(pod)
        self.dirty_jobs.add((namespace, name))
        self.operator.reconcile((namespace, name))
        return True

    def set_cordon(self, node: str, on: bool) -> bool:
        cur = self.store.get("nodes", "", node)
        if cur is None:
            return False
        new = copy.deepcopy(cur)
        if on:
            new.setdefault("spec", {})["unschedulable"] = True
        else:
            new.setdefault("spec", {}).pop("unschedulable", None)
        self.store.replace("nodes", new)
        return True

    def event(self, namespace: str, ref: dict[str, Any], type_: str, reason: str,
              message: str) -> None:
        record_event(self.store, namespace, ref, type_, reason, message)

    def add_running_pods(
        self,
        count: int,
        namespace: str,
        requests: Mapping[str, str],
        prefix: str,
        labels: Mapping[str, str],
    ) -> list[str]:
        """:func:`~fleetq.emulator.pods.add_running_pods` on this cluster's store."""
        return add_running_pods(self.store, self.ledger, self.name, count, namespace,
                                requests, prefix, labels)
