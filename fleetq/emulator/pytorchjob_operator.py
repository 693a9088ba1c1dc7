"""The PyTorchJob operator of one emulated cluster (Kubeflow training-operator
behaviour): a pod per replica, conditions Created → Running → Succeeded/Failed, replica
statuses, cascade delete, ``runPolicy.suspend`` and ``ttlSecondsAfterFinished``.

The pure parts (:func:`replica_slots`, :func:`job_status`, :func:`min_member`) are also
what the real control planes' lifecycle driver runs (``fleetq.controlplane.lifecycle``).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping
from typing import Any

from fleetq.emulator.kube_objects import (
    TERMINAL,
    condition_true,
    finished_pod,
    job_owner,
    key_of,
    owner_uid,
    parse_time,
    record_event,
    ref_of,
)
from fleetq.emulator.store import Key, Obj, Store, now_iso
from fleetq.emulator.timers import Timers
from fleetq.naming import KF_JOB_NAME as JOB_NAME
from fleetq.naming import KF_REPLICA_INDEX as REPLICA_INDEX
from fleetq.naming import KF_REPLICA_TYPE as REPLICA_TYPE

OPERATOR_NAME = "training.kubeflow.org/operator-name"

#: (role, index, pod template, restartPolicy) of one replica
Slot = tuple[str, int, Mapping[str, Any], str | None]


class PyTorchJobOperator:
    """Reconciles the PyTorchJobs of one cluster with the pods they own."""

    def __init__(self, store: Store, timers: Timers) -> None:
        self.store = store
        self.timers = timers
        #: (namespace, PyTorchJob name) -> names of the pods it owns: reconciling one job
        #: must not scan every pod of the namespace (that made the emulator O(n^2))
        self.pods_by_owner: dict[Key, set[str]] = {}
        #: uids of finished jobs whose runPolicy.ttlSecondsAfterFinished deletion is armed
        self.ttl_armed: set[str] = set()

    def pod_changed(self, pod: Obj, new: Obj | None) -> Key | None:
        """Index a pod's owner (``new`` None: the pod is gone); returns the owning job's
        key, which needs a reconcile, or None for an ownerless pod."""
        owner = job_owner(pod)
        if owner is None:
            return None
        okey = (pod["metadata"].get("namespace", ""), owner)
        name = pod["metadata"]["name"]
        if new is not None:
            self.pods_by_owner.setdefault(okey, set()).add(name)
        else:
            names = self.pods_by_owner.get(okey)
            if names is not None:
                names.discard(name)
                if not names:
                    del self.pods_by_owner[okey]
        return okey

    def owned_pods(self, namespace: str, name: str) -> list[Obj]:
        """The pods whose ownerReference is the PyTorchJob ``namespace/name``."""
        out = []
        for pname in sorted(self.pods_by_owner.get((namespace, name), ())):
            pod = self.store.get("pods", namespace, pname)
            if pod is not None:
                out.append(pod)
        return out

    def reconcile(self, key: Key) -> None:
        ns, name = key
        job = self.store.get("pytorchjobs", ns, name)
        owned = self.owned_pods(ns, name)
        if job is None:
            for p in owned:
                if self.store.get("pods", ns, p["metadata"]["name"]) is not None:
                    self.store.delete("pods", ns, p["metadata"]["name"])
            return
        uid = job["metadata"]["uid"]
        stale = [p for p in owned if owner_uid(p) != uid]
        owned = [p for p in owned if owner_uid(p) == uid]
        for p in stale:  # pods of an earlier job with the same name
            self.store.delete("pods", ns, p["metadata"]["name"])
        status = copy.deepcopy(job.get("status") or {})
        finished = condition_true(status, "Succeeded") or condition_true(status, "Failed")
        by_name = {p["metadata"]["name"]: p for p in owned}
        # runPolicy.suspend: the operator creates no pods for a suspended job
        suspended = ((job.get("spec") or {}).get("runPolicy") or {}).get("suspend") is True
        if not finished and not suspended:
            for role, index, tmpl, restart in replica_slots(job):
                pname = f"{name}-{role}-{index}"
                if pname not in by_name:
                    pod = pod_for(job, role, index, tmpl, restart)
                    try:
                        by_name[pname] = self.store.create("pods", pod)
                    except Exception:
                        continue
                    record_event(self.store, ns, ref_of(job), "Normal", "SuccessfulCreatePod",
                                 f"Created pod: {pname}")
        new_status = job_status(job, list(by_name.values()), status)
        if new_status != (job.get("status") or {}):
            new = {**job, "metadata": copy.deepcopy(job["metadata"]), "status": new_status}
            self.store.replace("pytorchjobs", new)
            self._job_events(job, status, new_status)
        self._arm_ttl(job, new_status)

    def fail_pods(self, namespace: str, name: str) -> bool:
        """Fault injection: the job's unfinished pods fail (False: no such job)."""
        if self.store.get("pytorchjobs", namespace, name) is None:
            return False
        for pod in self.owned_pods(namespace, name):
            if (pod.get("status") or {}).get("phase") not in TERMINAL:
                self.store.replace("pods", finished_pod(pod, "Failed", "Error"))
        return True

    def _arm_ttl(self, job: Obj, status: Mapping[str, Any]) -> None:
        """The operator's TTL: a finished job with ``runPolicy.ttlSecondsAfterFinished``
        is deleted (with its pods) that long after its completionTime."""
        ttl = ((job.get("spec") or {}).get("runPolicy") or {}).get("ttlSecondsAfterFinished")
        uid = job["metadata"]["uid"]
        done = condition_true(status, "Succeeded") or condition_true(status, "Failed")
        if not done or not isinstance(ttl, int) or isinstance(ttl, bool) or uid in self.ttl_armed:
            return
        self.ttl_armed.add(uid)
        completion = status.get("completionTime")
        finished = parse_time(str(completion)) if completion else time.time()
        self.timers.later(finished + max(0, ttl) - time.time(), self._ttl_delete, key_of(job),
                          uid)

    def _ttl_delete(self, key: Key, uid: str) -> None:
        self.ttl_armed.discard(uid)
        job = self.store.get("pytorchjobs", *key)
        if job is not None and job["metadata"]["uid"] == uid:
            self.store.delete("pytorchjobs", *key)

    def _job_events(self, job: Obj, old: dict[str, Any], new: dict[str, Any]) -> None:
        for ctype in ("Created", "Running", "Succeeded", "Failed"):
            if condition_true(new, ctype) and not condition_true(old, ctype):
                c = next(c for c in new["conditions"] if c["type"] == ctype)
                kind = "Warning" if ctype == "Failed" else "Normal"
                record_event(self.store, job["metadata"]["namespace"], ref_of(job), kind,
                             c["reason"], c["message"])


def pod_for(job: Obj, role: str, index: int, tmpl: Mapping[str, Any],
            restart: str | None) -> Obj:
    """The pod the operator creates for one replica."""
    jmeta = job["metadata"]
    tmeta = copy.deepcopy(dict(tmpl.get("metadata") or {}))
    spec = copy.deepcopy(dict(tmpl.get("spec") or {}))
    if restart and restart != "ExitCode":
        spec["restartPolicy"] = restart
    spec.setdefault("schedulerName", "default-scheduler")
    spec.pop("nodeName", None)
    labels = dict(tmeta.get("labels") or {})
    labels.update({
        JOB_NAME: jmeta["name"],
        REPLICA_TYPE: role,
        REPLICA_INDEX: str(index),
        OPERATOR_NAME: "pytorchjob-controller",
    })
    if role == "master":
        labels["training.kubeflow.org/job-role"] = "master"
    annotations = dict(tmeta.get("annotations") or {})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{jmeta['name']}-{role}-{index}",
            "namespace": jmeta["namespace"],
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [{
                "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                "name": jmeta["name"], "uid": jmeta["uid"],
                "controller": True, "blockOwnerDeletion": True,
            }],
        },
        "spec": spec,
        "status": {"phase": "Pending", "qosClass": "Burstable"},
    }


def min_member(job: Obj) -> int | None:
    """``runPolicy.schedulingPolicy.minAvailable`` of a PyTorchJob (what the operator makes
    its PodGroup's minMember), at least 1; None when not set."""
    run_policy = (job.get("spec") or {}).get("runPolicy") or {}
    value = (run_policy.get("schedulingPolicy") or {}).get("minAvailable")
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return max(1, value)


def replica_slots(job: Obj) -> list[Slot]:
    specs = (job.get("spec") or {}).get("pytorchReplicaSpecs") or {}
    out: list[Slot] = []
    for role in ("Master", "Worker"):
        rs = specs.get(role)
        if not isinstance(rs, Mapping):
            continue
        n = rs.get("replicas", 1)
        n = n if isinstance(n, int) and n >= 0 else 1
        tmpl = rs.get("template") or {}
        for i in range(n):
            out.append((role.lower(), i, tmpl, rs.get("restartPolicy")))
    return out


def job_status(job: Obj, pods: list[Obj], old: dict[str, Any]) -> dict[str, Any]:
    """Kubeflow-style status from the job's pods (idempotent: unchanged in → unchanged out)."""
    status = copy.deepcopy(old)
    name = job["metadata"]["name"]
    ns = job["metadata"]["namespace"]
    counts: dict[str, dict[str, int]] = {}
    phases: dict[str, list[str]] = {}
    for p in pods:
        role = (p["metadata"].get("labels") or {}).get(REPLICA_TYPE, "worker")
        rtype = role.capitalize()
        phase = (p.get("status") or {}).get("phase") or "Pending"
        c = counts.setdefault(rtype, {"active": 0, "succeeded": 0, "failed": 0})
        if phase == "Succeeded":
            c["succeeded"] += 1
        elif phase == "Failed":
            c["failed"] += 1
        else:
            c["active"] += 1
        phases.setdefault(rtype, []).append(phase)
    expected = len(replica_slots(job))
    status["replicaStatuses"] = {
        rtype: {k: v for k, v in c.items() if v} for rtype, c in sorted(counts.items())
    }
    if not status.get("startTime"):
        status["startTime"] = now_iso()
    _ensure(status, "Created", "PyTorchJobCreated", f"PyTorchJob {name} is created.")
    done = condition_true(status, "Succeeded") or condition_true(status, "Failed")
    if done:
        return status
    failed = {r: c["failed"] for r, c in counts.items() if c["failed"]}
    all_phases = [ph for lst in phases.values() for ph in lst]
    if failed:
        role, n = next(iter(sorted(failed.items())))
        _ensure(status, "Failed", "PyTorchJobFailed",
                f"PyTorchJob {ns}/{name} has failed because {n} {role} replica(s) failed.")
        _unset(status, "Running", "PyTorchJobFailed")
        status["completionTime"] = now_iso()
    elif _succeeded(job, counts):
        _ensure(status, "Succeeded", "PyTorchJobSucceeded",
                f"PyTorchJob {ns}/{name} successfully completed.")
        _unset(status, "Running", "PyTorchJobSucceeded")
        status["completionTime"] = now_iso()
    else:
        # Every pod runs; or, for a PodGroup smaller than the job (minAvailable), at least
        # minMember pods run (the others wait for room, as they do under a gang scheduler).
        minimum = min_member(job)
        need = expected if minimum is None else min(minimum, expected)
        running = sum(1 for ph in all_phases if ph == "Running")
        if expected and running >= need and all(
            ph in ("Running", "Pending") for ph in all_phases
        ) and (need < expected or len(all_phases) >= expected):
            _ensure(status, "Running", "PyTorchJobRunning",
                    f"PyTorchJob {ns}/{name} is running.")
    return status


def _succeeded(job: Obj, counts: Mapping[str, Mapping[str, int]]) -> bool:
    """The operator's rule: a job with a Master succeeds when the Master has; a job
    without one when every Worker has, or, with an elasticPolicy, when any Worker has."""
    specs = (job.get("spec") or {}).get("pytorchReplicaSpecs") or {}
    if "Master" in specs:
        return counts.get("Master", {}).get("succeeded", 0) > 0
    workers = sum(1 for role, *_ in replica_slots(job) if role == "worker")
    done = counts.get("Worker", {}).get("succeeded", 0)
    elastic = (job.get("spec") or {}).get("elasticPolicy") is not None
    return workers > 0 and (done >= workers or (elastic and done > 0))


def _ensure(status: dict[str, Any], ctype: str, reason: str, message: str) -> None:
    conds = status.setdefault("conditions", [])
    for c in conds:
        if c.get("type") == ctype:
            if c.get("status") != "True":
                now = now_iso()
                c.update(status="True", reason=reason, message=message,
                         lastUpdateTime=now, lastTransitionTime=now)
            return
    now = now_iso()
    conds.append({"type": ctype, "status": "True", "reason": reason, "message": message,
                  "lastUpdateTime": now, "lastTransitionTime": now})


def _unset(status: dict[str, Any], ctype: str, reason: str) -> None:
    for c in status.get("conditions") or []:
        if c.get("type") == ctype and c.get("status") == "True":
            now = now_iso()
            c.update(status="False", reason=reason, lastUpdateTime=now, lastTransitionTime=now)
