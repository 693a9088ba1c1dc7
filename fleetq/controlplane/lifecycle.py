"""The pod and PyTorchJob lifecycle of a real member: what kubelet and the
training-operator would do, as one small process against the real API server.

* **PyTorchJob operator**: one pod per replica (``<job>-<role>-<index>``, the operator's
  labels, a controller ownerReference), status conditions Created → Running →
  Succeeded/Failed and replica statuses written through the ``/status`` subresource
  (the same status function as the emulator), and — there is no kube-controller-manager,
  so no garbage collector — the pods of a deleted job are deleted.
* **Kubelet**: a pod the real kube-scheduler bound to a node goes Running (status
  subresource), then Succeeded after ``fleetq.io/run-seconds`` (pod or job annotation);
  a bound pod being deleted gracefully is removed with grace period 0, as kubelet would
  confirm it.
* **Namespace controller**: a namespace being deleted is emptied and finalized.

Pods, jobs and namespaces are mirrored by LIST+WATCH (re-LIST on ``410 Gone``) in two threads; every
decision is taken in the main thread, so the cache and the timers need no locks.
Run it as ``python -m fleetq.controlplane.lifecycle --kubeconfig K --cluster NAME``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import heapq
import logging
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from activities.kube_api import ApiError, ClusterUnreachable, Conflict, KubeApi, NotFound
from fleetq.emulator.kube_objects import TERMINAL, finished_pod, iso, parse_time
from fleetq.emulator.pytorchjob_operator import job_status, pod_for, replica_slots
from fleetq.member_contract import RUN_SECONDS_ANNOTATION

log = logging.getLogger("fleetq.lifecycle")
PODS = "/api/v1/pods"
JOBS = "/apis/kubeflow.org/v1/pytorchjobs"
MERGE = "application/merge-patch+json"
#: What a deleted namespace is emptied of before it goes (there is no namespace
#: controller on these members).
NAMESPACED = (
    "/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs",
    "/api/v1/namespaces/{ns}/pods",
    "/api/v1/namespaces/{ns}/configmaps",
    "/api/v1/namespaces/{ns}/secrets",
    "/api/v1/namespaces/{ns}/persistentvolumeclaims",
    "/api/v1/namespaces/{ns}/serviceaccounts",
    "/api/v1/namespaces/{ns}/services",
    "/api/v1/namespaces/{ns}/events",
)
Key = tuple[str, str]
Obj = dict[str, Any]


def _key(obj: Obj) -> Key:
    meta = obj["metadata"]
    return (str(meta.get("namespace") or ""), str(meta["name"]))


def _owner(pod: Obj) -> tuple[str, str] | None:
    """(job name, job uid) of the PyTorchJob that controls ``pod``."""
    for ref in pod["metadata"].get("ownerReferences") or []:
        if ref.get("kind") == "PyTorchJob":
            return str(ref.get("name")), str(ref.get("uid"))
    return None


def running_status(pod: Obj, node_ip: str) -> dict[str, Any]:
    now = iso(time.time())
    uid = pod["metadata"]["uid"]
    conds = [{"type": t, "status": "True", "lastTransitionTime": now}
             for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady")]
    old = [c for c in (pod.get("status") or {}).get("conditions") or []
           if c.get("type") == "PodScheduled"]
    return {
        "phase": "Running", "startTime": now, "hostIP": node_ip, "podIP": node_ip,
        "conditions": old + conds,
        "containerStatuses": [{
            "name": c.get("name", "main"), "image": c.get("image", ""), "imageID": "",
            "containerID": f"fleetq://{uid[:8]}-{i}", "ready": True, "started": True,
            "restartCount": 0, "state": {"running": {"startedAt": now}},
        } for i, c in enumerate((pod.get("spec") or {}).get("containers") or [])],
    }


class Lifecycle:
    """Mirror pods and jobs, act on them in one thread (see the module docstring)."""

    def __init__(self, api: KubeApi, start_delay: float = 0.2) -> None:
        self.api = api
        self.start_delay = start_delay
        self.pods: dict[Key, Obj] = {}
        self.jobs: dict[Key, Obj] = {}
        self.node_ips: dict[str, str] = {}
        self.events: queue.Queue[tuple[str, str, Any]] = queue.Queue()
        self.timers: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0
        self.stopping = threading.Event()

    # -- informers (threads)

    def _informer(self, resource: str, path: str) -> None:
        while not self.stopping.is_set():
            try:
                items, rv = self.api.list(path)
                self.events.put((resource, "SYNC", items))
                for event in self._watch(path, rv):
                    self.events.put((resource, event["type"], event["object"]))
            except (ApiError, ClusterUnreachable) as exc:
                log.info("%s: %s; listing again", resource, exc)
                self.stopping.wait(0.5)

    def _watch(self, path: str, rv: str) -> Iterator[Obj]:
        while not self.stopping.is_set():
            stream = self.api.watch(path, rv, timeout_s=60)
            try:
                for event in stream:
                    if event.get("type") == "ERROR":  # a Status: 410 Gone when rv is too old
                        raise self.api.watch_error(path, event["object"])
                    rv = event["object"]["metadata"].get("resourceVersion") or rv
                    if event.get("type") != "BOOKMARK":
                        yield event
            finally:
                stream.close()

    # -- main loop

    def run(self) -> None:
        for resource, path in (("pods", PODS), ("pytorchjobs", JOBS),
                               ("namespaces", "/api/v1/namespaces")):
            threading.Thread(target=self._informer, args=(resource, path), daemon=True,
                             name=f"informer-{resource}").start()
        nodes, _ = self.api.list("/api/v1/nodes")
        for n in nodes:
            for a in (n.get("status") or {}).get("addresses") or []:
                if a.get("type") == "InternalIP":
                    self.node_ips[n["metadata"]["name"]] = str(a.get("address"))
        while not self.stopping.is_set():
            timeout = 0.5
            if self.timers:
                timeout = max(0.0, min(timeout, self.timers[0][0] - time.monotonic()))
            try:
                resource, type_, obj = self.events.get(timeout=timeout)
            except queue.Empty:
                pass
            else:
                self._guard(functools.partial(self.handle, resource, type_, obj))
            now = time.monotonic()
            while self.timers and self.timers[0][0] <= now:
                _, _, fn = heapq.heappop(self.timers)
                self._guard(fn)

    def _guard(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except (ApiError, ClusterUnreachable) as exc:
            log.warning("%s", exc)

    def later(self, delay: float, fn: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self.timers, (time.monotonic() + max(0.0, delay), self._seq, fn))

    def handle(self, resource: str, type_: str, obj: Any) -> None:
        if resource == "namespaces":
            for ns in obj if type_ == "SYNC" else [obj] if type_ != "DELETED" else []:
                if ns["metadata"].get("deletionTimestamp"):
                    self.finalize_namespace(ns)
            return
        cache = self.pods if resource == "pods" else self.jobs
        changed: list[tuple[Key, Obj | None, Obj | None]] = []
        if type_ == "SYNC":
            fresh = {_key(o): o for o in obj}
            changed = [(k, None, o) for k, o in cache.items() if k not in fresh]
            changed += [(k, o, cache.get(k)) for k, o in fresh.items()]
            cache.clear()
            cache.update(fresh)
        elif type_ == "DELETED":
            changed = [(_key(obj), None, cache.pop(_key(obj), obj))]
        else:
            changed = [(_key(obj), obj, cache.get(_key(obj)))]
            cache[_key(obj)] = obj
        for key, new, old in changed:
            if resource == "pods":
                self.pod_changed(key, new, old)
            else:
                self.reconcile_job(key)

    # -- kubelet

    def pod_changed(self, key: Key, pod: Obj | None, old: Obj | None) -> None:
        owner = _owner(pod or old or {"metadata": {}})
        if owner:
            self.reconcile_job((key[0], owner[0]))
        if pod is None:
            return
        meta = pod["metadata"]
        spec = pod.get("spec") or {}
        phase = (pod.get("status") or {}).get("phase") or "Pending"
        if meta.get("deletionTimestamp"):
            if spec.get("nodeName"):
                self._force_delete(key)
            return
        uid = meta["uid"]
        if spec.get("nodeName") and phase == "Pending":
            self.later(self.start_delay, lambda: self._start(key, uid))
        elif phase == "Running":
            run = self.run_seconds(pod)
            started = (pod.get("status") or {}).get("startTime")
            if run is not None:
                at = (parse_time(started) if started else time.time()) + run
                self.later(at - time.time(), lambda: self._finish(key, uid, "Succeeded"))

    def run_seconds(self, pod: Obj) -> float | None:
        value = (pod["metadata"].get("annotations") or {}).get(RUN_SECONDS_ANNOTATION)
        owner = _owner(pod)
        if value is None and owner:
            job = self.jobs.get((pod["metadata"]["namespace"], owner[0]))
            value = ((job or {}).get("metadata", {}).get("annotations") or {}).get(
                RUN_SECONDS_ANNOTATION)
        try:
            return max(0.0, float(value)) if value is not None else None
        except ValueError:
            return None

    def _current(self, key: Key, uid: str) -> Obj | None:
        pod = self.pods.get(key)
        return pod if pod is not None and pod["metadata"]["uid"] == uid else None

    def _patch_status(self, key: Key, status: dict[str, Any], rv: str) -> None:
        path = f"/api/v1/namespaces/{key[0]}/pods/{key[1]}/status"
        body = {"metadata": {"resourceVersion": rv}, "status": status}
        # a 409: changed meanwhile, its watch event brings us back here; a 404: gone
        with contextlib.suppress(Conflict, NotFound):
            self.api.request("PATCH", path, body=body, content_type=MERGE)

    def _start(self, key: Key, uid: str) -> None:
        pod = self._current(key, uid)
        if pod is None or (pod.get("status") or {}).get("phase", "Pending") != "Pending":
            return
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        self._patch_status(key, running_status(pod, self.node_ips.get(node, "")),
                           pod["metadata"]["resourceVersion"])

    def _finish(self, key: Key, uid: str, phase: str) -> None:
        pod = self._current(key, uid)
        if pod is None or (pod.get("status") or {}).get("phase") in TERMINAL:
            return
        status = finished_pod(pod, phase, "Completed" if phase == "Succeeded" else "Error")
        self._patch_status(key, status["status"], pod["metadata"]["resourceVersion"])

    def _force_delete(self, key: Key) -> None:
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0}
        self.api.call("DELETE", f"/api/v1/namespaces/{key[0]}/pods/{key[1]}", body=body)

    # -- the namespace controller's part

    def finalize_namespace(self, ns: Obj) -> None:
        """Empty a namespace being deleted (the resources fleetq and its tests use), then
        drop its ``kubernetes`` finalizer so the API server removes it."""
        name = ns["metadata"]["name"]
        if "kubernetes" not in ((ns.get("spec") or {}).get("finalizers") or []):
            return
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0}
        for base in NAMESPACED:
            path = base.format(ns=name)
            code, listed = self.api.call("GET", path)
            if code != 200 or not isinstance(listed, dict):
                continue  # a resource this member does not serve
            for item in listed.get("items") or []:
                self.api.call("DELETE", f"{path}/{item['metadata']['name']}", body=body)
        done = {**ns, "spec": {**(ns.get("spec") or {}), "finalizers": []}}
        self.api.call("PUT", f"/api/v1/namespaces/{name}/finalize", body=done)

    # -- PyTorchJob operator

    def reconcile_job(self, key: Key) -> None:
        ns, name = key
        job = self.jobs.get(key)
        owned = [p for (pns, _), p in self.pods.items()
                 if pns == ns and (_owner(p) or ("", ""))[0] == name]
        uid = job["metadata"]["uid"] if job else None
        for p in owned:  # the garbage collector's part: pods of a gone job
            if _owner(p) != (name, uid) and not p["metadata"].get("deletionTimestamp"):
                self._force_delete(_key(p))
        if job is None or job["metadata"].get("deletionTimestamp"):
            return
        mine = {p["metadata"]["name"]: p for p in owned if _owner(p) == (name, uid)}
        status = job.get("status") or {}
        done = any(c.get("type") in TERMINAL and c.get("status") == "True"
                   for c in status.get("conditions") or [])
        if not done:
            for role, index, template, restart in replica_slots(job):
                pname = f"{name}-{role}-{index}"
                if pname not in mine:
                    created = self.api.create(f"/api/v1/namespaces/{ns}/pods",
                                              pod_for(job, role, index, template, restart))
                    if created is not None:
                        mine[pname] = created
        new_status = job_status(job, list(mine.values()), copy.deepcopy(status))
        if new_status != status:
            path = f"{JOBS.replace('/pytorchjobs', '')}/namespaces/{ns}/pytorchjobs/{name}/status"
            body = {"metadata": {"resourceVersion": job["metadata"]["resourceVersion"]},
                    "status": new_status}
            with contextlib.suppress(Conflict, NotFound):  # changed meanwhile, or gone
                self.api.request("PATCH", path, body=body, content_type=MERGE)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--context")
    parser.add_argument("--cluster", default="member")
    parser.add_argument("--start-delay", type=float, default=0.2)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    api = KubeApi.from_kubeconfig(args.cluster, args.kubeconfig, args.context,
                                  connect_s=3.0, read_s=30.0)
    lifecycle = Lifecycle(api, args.start_delay)
    signal.signal(signal.SIGTERM, lambda *_: lifecycle.stopping.set())
    with contextlib.suppress(KeyboardInterrupt):
        lifecycle.run()


if __name__ == "__main__":
    main()
