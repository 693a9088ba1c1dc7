"""What kube-controller-manager would do on a real member, as one small process: the
parts fleetq needs and the real training-operator and KWOK leave to it.

* **Garbage collector**: a pod or Service whose controller ownerReference names a
  PyTorchJob that is gone (confirmed by a live GET of the owner, as the real collector
  does before it deletes) is deleted in the background.
* **Namespace controller**: a namespace being deleted is emptied and finalized.

Pods, Services, PyTorchJobs and namespaces are mirrored by LIST+WATCH (re-LIST on ``410
Gone``) in threads; every decision is taken in the main thread. The kubelet's part is
KWOK's and the PyTorchJob operator's part the training-operator's (:mod:`.runner`).
Run it as ``python -m fleetq.controlplane.lifecycle --kubeconfig K --cluster NAME``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import queue
import signal
import threading
from collections.abc import Iterator
from typing import Any

from activities.kube_api import ApiError, ClusterUnreachable, KubeApi, NotFound

log = logging.getLogger("fleetq.lifecycle")
JOBS = "/apis/kubeflow.org/v1/pytorchjobs"
#: dependents the training-operator creates with a controller ownerReference
DEPENDENTS = {"pods": "/api/v1/pods", "services": "/api/v1/services"}
#: What a deleted namespace is emptied of before it goes.
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


def _owner(obj: Obj) -> tuple[str, str] | None:
    """(job name, job uid) of the PyTorchJob that controls ``obj``."""
    for ref in obj["metadata"].get("ownerReferences") or []:
        if ref.get("kind") == "PyTorchJob" and ref.get("controller"):
            return str(ref.get("name")), str(ref.get("uid"))
    return None


class Lifecycle:
    """Mirror dependents and jobs, collect garbage in one thread."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api
        self.dependents: dict[str, dict[Key, Obj]] = {r: {} for r in DEPENDENTS}
        self.jobs: dict[Key, Obj] = {}
        self.jobs_synced = False
        self.events: queue.Queue[tuple[str, str, Any]] = queue.Queue()
        self.stopping = threading.Event()

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

    def run(self) -> None:
        for resource, path in (*DEPENDENTS.items(), ("pytorchjobs", JOBS),
                               ("namespaces", "/api/v1/namespaces")):
            threading.Thread(target=self._informer, args=(resource, path), daemon=True,
                             name=f"informer-{resource}").start()
        while not self.stopping.is_set():
            try:
                resource, type_, obj = self.events.get(timeout=0.5)
            except queue.Empty:
                continue
            try:
                self.handle(resource, type_, obj)
            except (ApiError, ClusterUnreachable) as exc:
                log.warning("%s", exc)

    def handle(self, resource: str, type_: str, obj: Any) -> None:
        if resource == "namespaces":
            self._handle_namespaces(type_, obj)
            return
        cache = self.jobs if resource == "pytorchjobs" else self.dependents[resource]
        _apply_event(cache, type_, obj)
        if resource == "pytorchjobs":
            self.jobs_synced = True
            for res, items in self.dependents.items():
                for key, dep in list(items.items()):
                    self.collect(res, key, dep)
        elif type_ != "DELETED":
            for o in obj if type_ == "SYNC" else [obj]:
                self.collect(resource, _key(o), o)

    def _handle_namespaces(self, type_: str, obj: Any) -> None:
        """Finalize every namespace in the event that is being deleted."""
        for ns in obj if type_ == "SYNC" else [obj] if type_ != "DELETED" else []:
            if ns["metadata"].get("deletionTimestamp"):
                self.finalize_namespace(ns)

    def collect(self, resource: str, key: Key, obj: Obj) -> None:
        """Delete ``obj`` if the PyTorchJob that controls it is gone."""
        owner = _owner(obj)
        if owner is None or not self.jobs_synced or obj["metadata"].get("deletionTimestamp"):
            return
        job = self.jobs.get((key[0], owner[0]))
        if job is not None and job["metadata"]["uid"] == owner[1]:
            return
        code, live = self.api.call("GET", f"/apis/kubeflow.org/v1/namespaces/{key[0]}/"
                                          f"pytorchjobs/{owner[0]}")
        if code == 200 and isinstance(live, dict) and live["metadata"]["uid"] == owner[1]:
            return  # our cache is behind: the owner exists
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background",
                "preconditions": {"uid": obj["metadata"]["uid"]}}
        with contextlib.suppress(NotFound):
            self.api.call("DELETE", f"/api/v1/namespaces/{key[0]}/{resource}/{key[1]}",
                          body=body)
        log.info("garbage-collected %s %s/%s (owner PyTorchJob %s gone)", resource, *key,
                 owner[0])

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


def _apply_event(cache: dict[Key, Obj], type_: str, obj: Any) -> None:
    """Bring an informer's cache up to date with one event: a SYNC replaces it with the
    listed objects, DELETED drops the object, anything else stores it."""
    if type_ == "SYNC":
        cache.clear()
        cache.update({_key(o): o for o in obj})
    elif type_ == "DELETED":
        cache.pop(_key(obj), None)
    else:
        cache[_key(obj)] = obj


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--context")
    parser.add_argument("--cluster", default="member")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    api = KubeApi.from_kubeconfig(args.cluster, args.kubeconfig, args.context,
                                  connect_s=3.0, read_s=30.0)
    lifecycle = Lifecycle(api)
    signal.signal(signal.SIGTERM, lambda *_: lifecycle.stopping.set())
    with contextlib.suppress(KeyboardInterrupt):
        lifecycle.run()


if __name__ == "__main__":
    main()
