"""The pod lifecycle on one emulated cluster (what a kubelet would report): a bound pod
starts after ``start_delay``, runs, and succeeds after ``fleetq.io/run-seconds`` (on the
pod or its PyTorchJob) or when a test completes it; faults fail it. Also the benchmark's
bulk load of running pods."""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Mapping

from fleetq import resources as R
from fleetq.emulator.kube_objects import (
    TERMINAL,
    cond,
    finished_pod,
    job_owner,
    key_of,
    namespace_object,
    node_ip,
    parse_time,
    set_condition,
)
from fleetq.emulator.ledger import CapacityLedger
from fleetq.emulator.store import Key, Obj, Store, now_iso
from fleetq.emulator.timers import Timers
from fleetq.kube_values import go_duration_or_none
from fleetq.member_contract import KWOK_DELAY_ANNOTATION, RUN_SECONDS_ANNOTATION


class PodLifecycle:
    """Starts, runs and finishes the bound pods of one cluster."""

    def __init__(self, store: Store, timers: Timers, start_delay: float) -> None:
        self.store = store
        self.timers = timers
        self.start_delay = start_delay

    def arm(self, pod: Obj, started: float | None = None) -> None:
        """Timers for a bound pod: start it, then finish it after run-seconds."""
        spec = pod.get("spec") or {}
        status = pod.get("status") or {}
        if not spec.get("nodeName"):
            return
        key = key_of(pod)
        uid = pod["metadata"]["uid"]
        phase = status.get("phase") or "Pending"
        if phase == "Pending":
            self.timers.later(self.start_delay, self._start, key, uid)
        elif phase == "Running":
            run = self.run_seconds(pod)
            if run is not None:
                if started is None:
                    ts = status.get("startTime")
                    started = parse_time(ts) if ts else time.time()
                self.timers.later(started + run - time.time(), self._finish, key, uid,
                                  "Succeeded")

    def run_seconds(self, pod: Obj) -> float | None:
        """How long the pod runs: KWOK's pod-complete delay annotation (what completes it
        on a real member), else its run-seconds annotation, else its job's; None: forever."""
        ann = pod["metadata"].get("annotations") or {}
        delay = go_duration_or_none(ann.get(KWOK_DELAY_ANNOTATION))
        if delay is not None and job_owner(pod):
            return max(0.0, delay)
        value = ann.get(RUN_SECONDS_ANNOTATION)
        if value is None:
            owner = job_owner(pod)
            if owner:
                job = self.store.get("pytorchjobs", pod["metadata"]["namespace"], owner)
                if job is not None:
                    value = (job["metadata"].get("annotations") or {}).get(RUN_SECONDS_ANNOTATION)
        if value is None:
            return None
        try:
            return max(0.0, float(value))
        except ValueError:
            return None

    def _start(self, key: Key, uid: str) -> None:
        pod = self.store.get("pods", *key)
        if pod is None or pod["metadata"]["uid"] != uid:
            return
        if (pod.get("status") or {}).get("phase", "Pending") != "Pending":
            return
        new = copy.deepcopy(pod)
        now = now_iso()
        st = new.setdefault("status", {})
        st["phase"] = "Running"
        st["startTime"] = st.get("startTime") or now
        st["podIP"] = f"10.244.{len(key[1]) % 250}.{abs(hash(uid)) % 250 + 2}"
        for ctype in ("Initialized", "Ready", "ContainersReady"):
            set_condition(st, cond(ctype, "True", "", ""))
        st["containerStatuses"] = [
            {
                "name": c.get("name", "main"),
                "image": c.get("image", ""),
                "imageID": "",
                "containerID": f"emulated://{uid[:8]}-{i}",
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": now}},
            }
            for i, c in enumerate(new.get("spec", {}).get("containers") or [{}])
        ]
        stored = self.store.replace("pods", new)
        self.arm(stored, time.time())

    def _finish(self, key: Key, uid: str, phase: str, reason: str = "Completed") -> None:
        pod = self.store.get("pods", *key)
        if pod is None or pod["metadata"]["uid"] != uid:
            return
        if (pod.get("status") or {}).get("phase") in TERMINAL:
            return
        self.store.replace("pods", finished_pod(pod, phase, reason))

    def complete(self, pod: Obj) -> None:
        """The pod's containers exit 0 now, as if its run-seconds were up."""
        self._finish(key_of(pod), pod["metadata"]["uid"], "Succeeded")


def add_running_pods(
    store: Store,
    ledger: CapacityLedger,
    cluster: str,
    count: int,
    namespace: str,
    requests: Mapping[str, str],
    prefix: str,
    labels: Mapping[str, str],
) -> list[str]:
    """Create ``count`` already-running, ownerless pods spread over schedulable nodes
    (benchmark background load; no controller churn)."""
    req = R.parse_resources(requests)
    names: list[str] = []
    nodes = sorted(ledger.nodes)
    if not nodes:
        raise ValueError(f"cluster {cluster} has no nodes")
    if store.get("namespaces", "", namespace) is None:
        store.create("namespaces", namespace_object(namespace))
    now = now_iso()
    start = len(store.objects["pods"])
    i = 0
    misses = 0
    while len(names) < count:
        node = nodes[i % len(nodes)]
        i += 1
        st = ledger.nodes[node]
        if (st.unschedulable or ledger.pods_used.get(node, 0) >= st.pods
                or not R.fits(req, ledger.free(node))):
            misses += 1
            if misses > len(nodes):
                raise ValueError(f"cluster {cluster}: no room for {count - len(names)} more pods")
            continue
        misses = 0
        name = f"{prefix}-{start + len(names)}"
        uid = str(uuid.uuid4())
        ledger.remember_requests((namespace, name), uid, req)  # skip re-parsing quantities
        pod = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels),
                         "uid": uid},
            "spec": {
                "nodeName": node, "schedulerName": "default-scheduler",
                "containers": [{"name": "load", "image": "pause",
                                "resources": {"requests": dict(requests)}}],
            },
            "status": {
                "phase": "Running", "startTime": now, "hostIP": node_ip(store, node),
                "conditions": [cond(t, "True", "", "") for t in
                               ("PodScheduled", "Initialized", "Ready", "ContainersReady")],
                "containerStatuses": [{
                    "name": "load", "image": "pause", "imageID": "", "ready": True,
                    "started": True, "restartCount": 0,
                    "state": {"running": {"startedAt": now}},
                }],
            },
        }
        store.create("pods", pod)
        names.append(name)
    return names
