"""The PyTorchJob operator of one emulated cluster, ported from Kubeflow training-operator
v1.9.4 (``pkg/controller.v1/common/job.go`` ReconcileJobs, ``common/pod.go`` ReconcilePods,
``pytorch/pytorchjob_controller.go`` UpdateJobStatus, ``pytorch/envvar.go``,
``pkg/util/status.go`` setCondition): a pod and a headless Service per replica with the
operator's labels and env, conditions Created/Running/Restarting/Succeeded/Failed/
Suspended, replica statuses, failed pods restarted unless ``restartPolicy: Never``,
``runPolicy`` (cleanPodPolicy, ttlSecondsAfterFinished, activeDeadlineSeconds, suspend).
``tests/controlplane/test_operator_contract.py`` runs the same jobs on the real operator.
"""

from __future__ import annotations

import contextlib
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
JOB_ROLE = "training.kubeflow.org/job-role"
CONTROLLER = "pytorchjob-controller"
DEFAULT_CONTAINER = "pytorch"  # kubeflowv1.PyTorchJobDefaultContainerName
DEFAULT_PORT_NAME = "pytorchjob-port"
DEFAULT_PORT = 23456
#: pkg/util/train IsRetryableExitCode: only these exit codes restart under ExitCode
RETRYABLE_EXIT_CODES = (130, 137, 143)
REPLICA_TYPES = ("Master", "Worker")
INIT_MAX_TRIES = 100  # config.PyTorchInitContainerMaxTriesDefault

#: (role, index, pod template, restartPolicy) of one replica
Slot = tuple[str, int, Mapping[str, Any], str | None]


class PyTorchJobOperator:
    """Reconciles the PyTorchJobs of one cluster with the pods and Services they own."""

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

    def _delete(self, plural: str, ns: str, name: str) -> None:
        if self.store.get(plural, ns, name) is not None:
            self.store.delete(plural, ns, name)

    def reconcile(self, key: Key) -> None:
        ns, name = key
        job = self.store.get("pytorchjobs", ns, name)
        owned = self.owned_pods(ns, name)
        if job is None:  # the garbage collector's part
            for p in owned:
                self._delete("pods", ns, p["metadata"]["name"])
                self._delete("services", ns, p["metadata"]["name"])
            return
        uid = job["metadata"]["uid"]
        for p in owned:  # pods of an earlier job with the same name
            if owner_uid(p) != uid:
                self._delete("pods", ns, p["metadata"]["name"])
        pods = [p for p in owned if owner_uid(p) == uid]
        old = job.get("status") or {}
        status = reconcile_status(job, copy.deepcopy(old), pods, self)
        if status != old:
            new = {**job, "metadata": copy.deepcopy(job["metadata"]), "status": status}
            self.store.replace("pytorchjobs", new)
            self._job_events(job, old, status)
        # activeDeadlineSeconds arms no timer: upstream's UpdateJobStatus "enqueues" the
        # deadline re-check on a FakeWorkQueue (pytorchjob_controller.go NewReconciler),
        # so the deadline is only noticed when something else makes the job sync
        self._arm_ttl(job, status)

    # -- what reconcile_status asks of the cluster

    def create_replica(self, job: Obj, role: str, index: int, tmpl: Mapping[str, Any],
                       restart: str | None) -> Obj | None:
        """Create the pod (and its Service) of one replica; None if it could not be."""
        ns = job["metadata"]["namespace"]
        pod = pod_for(job, role, index, tmpl, restart)
        try:
            created = self.store.create("pods", pod)
        except Exception:
            return None
        record_event(self.store, ns, ref_of(job), "Normal", "SuccessfulCreatePod",
                     f"Created pod: {pod['metadata']['name']}")
        if self.store.get("services", ns, pod["metadata"]["name"]) is None:
            with contextlib.suppress(Exception):
                self.store.create("services", service_for(job, role, index))
        return created

    def delete_replica(self, pod: Obj) -> None:
        ns, pname = key_of(pod)
        self._delete("pods", ns, pname)
        self._delete("services", ns, pname)

    def fail_pods(self, namespace: str, name: str) -> bool:
        """Fault injection: the job runs out of restarts (its Failed condition, as the
        operator writes it when the backoff limit is reached), then its unfinished pods
        fail as kubelet reports it (False: no such job)."""
        job = self.store.get("pytorchjobs", namespace, name)
        if job is None:
            return False
        status = failed_by_fault(job)
        if status != (job.get("status") or {}):
            self.store.replace("pytorchjobs", {**job, "metadata": copy.deepcopy(job["metadata"]),
                                               "status": status})
        for pod in self.owned_pods(namespace, name):
            if (pod.get("status") or {}).get("phase") not in TERMINAL:
                self.store.replace("pods", finished_pod(pod, "Failed", "Error"))
        return True

    def _arm_ttl(self, job: Obj, status: Mapping[str, Any]) -> None:
        """common/job.go CleanupJob: a finished job with ``ttlSecondsAfterFinished`` is
        deleted that long after its completionTime (its pods go with it)."""
        run_policy = (job.get("spec") or {}).get("runPolicy") or {}
        ttl = run_policy.get("ttlSecondsAfterFinished")
        uid = job["metadata"]["uid"]
        if (not is_finished(status) or not isinstance(ttl, int) or isinstance(ttl, bool)
                or uid in self.ttl_armed or run_policy.get("suspend") is True):
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

    def _job_events(self, job: Obj, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        for ctype in ("Created", "Running", "Restarting", "Succeeded", "Failed", "Suspended"):
            if condition_true(new, ctype) and not condition_true(old, ctype):
                c = next(c for c in new["conditions"] if c["type"] == ctype)
                kind = "Normal" if ctype in ("Created", "Running", "Succeeded", "Suspended") \
                    else "Warning"
                record_event(self.store, job["metadata"]["namespace"], ref_of(job), kind,
                             c["reason"], c["message"])


# ---------------------------------------------------------------- the operator's rules


def is_finished(status: Mapping[str, Any]) -> bool:
    return condition_true(status, "Succeeded") or condition_true(status, "Failed")


def failed_by_fault(job: Obj) -> dict[str, Any]:
    """The status of ``job`` once its restarts ran out (ReconcileJobs, backoff limit):
    the ``fail-job`` fault, on emulated and real members alike."""
    status = copy.deepcopy(job.get("status") or {})
    status.setdefault("completionTime", now_iso())
    name = job["metadata"]["name"]
    set_job_condition(status, "Failed", "True", "PyTorchJobFailed",
                      f"Job {name} has failed because it has reached the specified backoff "
                      "limit")
    return status


def replica_specs(job: Obj) -> dict[str, dict[str, Any]]:
    """The replica specs with the operator's defaults (pytorch_defaults.go
    SetDefaults_PyTorchJob): replicas 1, restartPolicy OnFailure."""
    specs = (job.get("spec") or {}).get("pytorchReplicaSpecs") or {}
    out: dict[str, dict[str, Any]] = {}
    for rtype in REPLICA_TYPES:
        rs = specs.get(rtype)
        if isinstance(rs, Mapping):
            n = rs.get("replicas", 1)
            out[rtype] = {**rs, "replicas": n if isinstance(n, int) and n >= 0 else 1,
                          "restartPolicy": rs.get("restartPolicy") or "OnFailure"}
    return out


def set_job_condition(status: dict[str, Any], ctype: str, cstatus: str, reason: str,
                      message: str) -> None:
    """pkg/util/status.go setCondition + filterOutCondition: nothing once Failed; an
    unchanged (status, reason) is kept; Running and Restarting replace each other;
    Failed/Succeeded turn Running False; the changed condition goes last."""
    conds: list[dict[str, Any]] = status.get("conditions") or []
    if any(c.get("type") == "Failed" and c.get("status") == "True" for c in conds):
        return
    now = now_iso()
    current = next((c for c in conds if c.get("type") == ctype), None)
    if current is not None and current.get("status") == cstatus \
            and current.get("reason") == reason:
        return
    transition = now
    if current is not None and current.get("status") == cstatus:
        transition = current.get("lastTransitionTime") or now
    kept = []
    for c in conds:
        if ctype == "Restarting" and c.get("type") == "Running":
            continue
        if ctype == "Running" and c.get("type") == "Restarting":
            continue
        if c.get("type") == ctype:
            continue
        if ctype in ("Failed", "Succeeded") and c.get("type") == "Running":
            c = {**c, "status": "False"}
        kept.append(c)
    kept.append({"type": ctype, "status": cstatus, "reason": reason, "message": message,
                 "lastUpdateTime": now, "lastTransitionTime": transition})
    status["conditions"] = kept


def reconcile_status(job: Obj, status: dict[str, Any], pods: list[Obj],
                     cluster: PyTorchJobOperator) -> dict[str, Any]:
    """common/job.go ReconcileJobs for one job: returns the new status, creating and
    deleting pods through ``cluster``."""
    name = job["metadata"]["name"]
    run_policy = (job.get("spec") or {}).get("runPolicy") or {}
    clean = run_policy.get("cleanPodPolicy") or "None"
    replicas = replica_specs(job)
    # onOwnerCreateFunc: the Created condition
    if not any(c.get("type") == "Created" for c in status.get("conditions") or []):
        set_job_condition(status, "Created", "True", "PyTorchJobCreated",
                          f"PyTorchJob {name} is created.")
    if is_finished(status):
        _reconcile_finished(cluster, status, pods, clean)
        return status
    if run_policy.get("suspend") is True:
        _reconcile_suspended(cluster, name, status, pods, clean)
        return status
    if condition_true(status, "Suspended"):
        set_job_condition(status, "Suspended", "False", "PyTorchJobResumed",
                          f"PyTorchJob {name} is resumed.")
        status["startTime"] = now_iso()
    if _past_active_deadline(run_policy, status):
        status.setdefault("completionTime", now_iso())
        set_job_condition(status, "Failed", "True", "PyTorchJobFailed",
                          f"Job {name} has failed because it was active longer than "
                          "specified deadline")
        _delete_pods_and_services(cluster, status, pods, clean)
        return status
    status["replicaStatuses"] = {
        rtype: _reconcile_replicas(job, rtype, rs, pods, status, cluster)
        for rtype, rs in replicas.items()
    }
    _update_job_status(job, replicas, status)
    return status


def _reconcile_finished(cluster: PyTorchJobOperator, status: dict[str, Any],
                        pods: list[Obj], clean: str) -> None:
    """A finished job: its pods go per cleanPodPolicy; a succeeded one counts its
    still-active replicas as succeeded."""
    _delete_pods_and_services(cluster, status, pods, clean)
    if condition_true(status, "Succeeded"):
        for rs in (status.get("replicaStatuses") or {}).values():
            if rs.get("active"):
                rs["succeeded"] = rs.get("succeeded", 0) + rs.pop("active")


def _reconcile_suspended(cluster: PyTorchJobOperator, name: str, status: dict[str, Any],
                         pods: list[Obj], clean: str) -> None:
    """A suspended job: every pod deleted, nothing active, Running false and
    Suspended true."""
    _delete_pods_and_services(cluster, status, pods, clean)
    for rs in (status.get("replicaStatuses") or {}).values():
        rs.pop("active", None)
    msg = f"PyTorchJob {name} is suspended."
    if condition_true(status, "Running"):
        set_job_condition(status, "Running", "False", "PyTorchJobSuspended", msg)
    if not condition_true(status, "Suspended"):
        set_job_condition(status, "Suspended", "True", "PyTorchJobSuspended", msg)


def _past_active_deadline(run_policy: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    """Whether the job has been active (since its startTime) for at least
    ``runPolicy.activeDeadlineSeconds``."""
    ads = run_policy.get("activeDeadlineSeconds")
    start = status.get("startTime")
    return bool(isinstance(ads, int) and not isinstance(ads, bool) and start
                and time.time() - parse_time(str(start)) >= ads)


def _reconcile_replicas(job: Obj, rtype: str, rs: Mapping[str, Any], pods: list[Obj],
                        status: dict[str, Any], cluster: PyTorchJobOperator) -> dict[str, Any]:
    """common/pod.go ReconcilePods for one replica type: create the missing indices,
    restart or fail on failed pods per restartPolicy, delete pods beyond the replica
    count; returns the type's replica counts."""
    counts: dict[str, Any] = {}
    role = rtype.lower()
    mine = {int((p["metadata"].get("labels") or {}).get(REPLICA_INDEX, -1)): p
            for p in pods
            if (p["metadata"].get("labels") or {}).get(REPLICA_TYPE) == role}
    restart = rs["restartPolicy"]
    for index in range(rs["replicas"]):
        pod = mine.get(index)
        if pod is None:
            cluster.create_replica(job, role, index, rs.get("template") or {}, restart)
            continue
        if (pod.get("status") or {}).get("phase") == "Failed":
            _on_failed_replica(job["metadata"]["name"], rtype, restart, pod, status, cluster)
        _count(counts, pod)
    for index, pod in mine.items():  # pods beyond the replica count: deleted
        if index < 0 or index >= rs["replicas"]:
            cluster.delete_replica(pod)
    return counts


def _on_failed_replica(name: str, rtype: str, restart: str, pod: Obj,
                       status: dict[str, Any], cluster: PyTorchJobOperator) -> None:
    """A failed pod is deleted (to be recreated) and the job Restarting when its
    restartPolicy retries it (ExitCode: only retryable exit codes); under ExitCode
    otherwise the job is Failed."""
    code = _exit_code(pod)
    if (restart == "ExitCode" and code in RETRYABLE_EXIT_CODES) or restart in (
            "OnFailure", "Always"):
        cluster.delete_replica(pod)
        set_job_condition(status, "Restarting", "True", "PyTorchJobRestarting",
                          f"job {name} is restarting because {rtype} "
                          "replica(s) failed.")
    elif restart == "ExitCode":
        set_job_condition(status, "Failed", "True", "PyTorchJobFailed",
                          f'job "{name}" is failing because "{rtype}" '
                          "replica(s) failed.")


def _exit_code(pod: Obj) -> int:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if cs.get("name") == DEFAULT_CONTAINER and term:
            return int(term.get("exitCode") or 0)
    return 0xBEEF  # the operator's "no exit code" magic number


def _count(counts: dict[str, Any], pod: Obj) -> None:
    """core/status.go UpdateJobReplicaStatuses (Pending pods are not counted)."""
    phase = (pod.get("status") or {}).get("phase")
    key = {"Running": "active", "Succeeded": "succeeded", "Failed": "failed"}.get(str(phase))
    if phase == "Running" and pod["metadata"].get("deletionTimestamp"):
        key = "failed"
    if key:
        counts[key] = counts.get(key, 0) + 1


def _delete_pods_and_services(cluster: PyTorchJobOperator, status: Mapping[str, Any],
                              pods: list[Obj], clean: str) -> None:
    """common/job.go DeletePodsAndServices: a finished job keeps its pods under
    cleanPodPolicy None, loses its Running and Pending ones under Running, all under
    All; a suspended one loses every pod."""
    finished = is_finished(status)
    if finished and clean == "None":
        return
    for pod in pods:
        phase = (pod.get("status") or {}).get("phase") or "Pending"
        if finished and clean == "Running" and phase not in ("Running", "Pending"):
            continue
        cluster.delete_replica(pod)


def _update_job_status(job: Obj, replicas: Mapping[str, Mapping[str, Any]],
                       status: dict[str, Any]) -> None:
    """pytorch/pytorchjob_controller.go UpdateJobStatus."""
    meta = job["metadata"]
    name, ns = meta["name"], meta["namespace"]
    if not status.get("startTime"):
        status["startTime"] = now_iso()
    has_master = "Master" in replicas
    elastic = (job.get("spec") or {}).get("elasticPolicy") is not None
    for rtype, rs in replicas.items():
        counts = status["replicaStatuses"].setdefault(rtype, {})
        counts["selector"] = label_selector(name, rtype.lower())
        succeeded = counts.get("succeeded", 0)
        running = counts.get("active", 0)
        failed = counts.get("failed", 0)
        expected = rs["replicas"] - succeeded
        if has_master:
            if rtype == "Master" and _master_conditions(status, name, running, expected):
                return
        elif rtype == "Worker":
            if expected == 0 or (elastic and succeeded > 0):
                status.setdefault("completionTime", now_iso())
                set_job_condition(status, "Succeeded", "True", "PyTorchJobSucceeded",
                                  f"PyTorchJob {ns}/{name} successfully completed.")
            elif running > 0:
                set_job_condition(status, "Running", "True", "PyTorchJobRunning",
                                  f"PyTorchJob {ns}/{name} is running.")
        if failed > 0 and rs["replicas"] > succeeded + running:
            _on_failed_replicas(status, name, rtype, rs["restartPolicy"], failed)


def _master_conditions(status: dict[str, Any], name: str, running: int, expected: int) -> bool:
    """A job with a Master runs while the Master does and succeeds when it has; returns
    whether it succeeded."""
    if running > 0:
        set_job_condition(status, "Running", "True", "PyTorchJobRunning",
                          f"PyTorchJob {name} is running.")
    if expected == 0:
        status.setdefault("completionTime", now_iso())
        set_job_condition(status, "Succeeded", "True", "PyTorchJobSucceeded",
                          f"PyTorchJob {name} is successfully completed.")
        return True
    return False


def _on_failed_replicas(status: dict[str, Any], name: str, rtype: str, restart: str,
                        failed: int) -> None:
    """Failed replicas not all replaced: the job is Restarting unless its
    restartPolicy is Never, then it is Failed."""
    if restart != "Never":
        set_job_condition(status, "Restarting", "True", "PyTorchJobRestarting",
                          f"PyTorchJob {name} is restarting because {failed} "
                          f"{rtype} replica(s) failed.")
    else:
        status.setdefault("completionTime", now_iso())
        set_job_condition(status, "Failed", "True", "PyTorchJobFailed",
                          f"PyTorchJob {name} is failed because {failed} {rtype} "
                          "replica(s) failed.")


def label_selector(job_name: str, role: str) -> str:
    """metav1.FormatLabelSelector(GenLabelSelector(job, rtype)): keys sorted."""
    labels = {JOB_NAME: job_name, OPERATOR_NAME: CONTROLLER, REPLICA_TYPE: role}
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _port(job: Obj, rtype: str) -> int:
    """getPortFromPyTorchJob (the defaulter adds pytorchjob-port 23456 when missing)."""
    rs = ((job.get("spec") or {}).get("pytorchReplicaSpecs") or {}).get(rtype) or {}
    for c in ((rs.get("template") or {}).get("spec") or {}).get("containers") or []:
        if c.get("name") == DEFAULT_CONTAINER:
            for port in c.get("ports") or []:
                if port.get("name") == DEFAULT_PORT_NAME:
                    return int(port.get("containerPort") or DEFAULT_PORT)
    return DEFAULT_PORT


def pod_env(job: Obj, role: str, index: int) -> list[dict[str, str]]:
    """pytorch/envvar.go setPodEnv, without elasticPolicy: PYTHONUNBUFFERED, the master's
    address and port (MASTER_* and PET_MASTER_*), WORLD_SIZE, RANK, PET_NODE_RANK,
    PET_NPROC_PER_NODE and PET_NNODES."""
    spec = job.get("spec") or {}
    replicas = replica_specs(job)
    total = sum(rs["replicas"] for rs in replicas.values())
    nproc = spec.get("nprocPerNode") or "auto"
    try:
        per_node = int(nproc)
    except ValueError:
        per_node = 1
    env = [{"name": "PYTHONUNBUFFERED", "value": "1"}]
    if "Master" in replicas:
        addr = f"{job['metadata']['name']}-master-0"
        port = str(_port(job, "Master"))
        rank = index + 1 if role == "worker" else index
        env += [{"name": "MASTER_PORT", "value": port},
                {"name": "PET_MASTER_PORT", "value": port},
                {"name": "MASTER_ADDR", "value": addr},
                {"name": "PET_MASTER_ADDR", "value": addr},
                {"name": "WORLD_SIZE", "value": str(total * per_node)},
                {"name": "RANK", "value": str(rank)},
                {"name": "PET_NODE_RANK", "value": str(rank)}]
    env.append({"name": "PET_NPROC_PER_NODE", "value": str(nproc)})
    env.append({"name": "PET_NNODES", "value": str(total)})
    return env


def init_container(master: str, tries: int = INIT_MAX_TRIES) -> dict[str, Any]:
    """pytorch/initcontainer.go: a worker of a job with a Master first waits for the
    master's Service name to resolve (the operator's default template and image)."""
    return {"name": "init-pytorch", "image": "alpine:3.10", "imagePullPolicy": "IfNotPresent",
            "resources": {"limits": {"cpu": "100m", "memory": "20Mi"},
                          "requests": {"cpu": "50m", "memory": "10Mi"}},
            "command": ["sh", "-c", f"err=1;for i in $(seq {tries}); do if nslookup {master}; "
                        "then err=0 && break; fi;echo waiting for master; sleep 2; done; "
                        "exit $err"]}


def service_for(job: Obj, role: str, index: int) -> Obj:
    """common/service.go CreateNewService: headless, selecting the replica's pod."""
    jmeta = job["metadata"]
    labels = {JOB_NAME: jmeta["name"], OPERATOR_NAME: CONTROLLER, REPLICA_TYPE: role,
              REPLICA_INDEX: str(index)}
    rtype = role.capitalize()
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": f"{jmeta['name']}-{role}-{index}", "namespace": jmeta["namespace"],
                     "labels": dict(labels), "ownerReferences": [_owner_ref(job)]},
        "spec": {"clusterIP": "None", "selector": labels,
                 "ports": [{"name": DEFAULT_PORT_NAME, "port": _port(job, rtype),
                            "protocol": "TCP", "targetPort": _port(job, rtype)}]},
    }


def _owner_ref(job: Obj) -> dict[str, Any]:
    jmeta = job["metadata"]
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": jmeta["name"],
            "uid": jmeta["uid"], "controller": True, "blockOwnerDeletion": True}


def pod_for(job: Obj, role: str, index: int, tmpl: Mapping[str, Any],
            restart: str | None) -> Obj:
    """common/pod.go createNewPod: the template with the operator's labels (job-role
    on the master), restartPolicy from the replica spec (ExitCode: Never), the
    controller ownerReference and the env of :func:`pod_env` in every container."""
    jmeta = job["metadata"]
    tmeta = copy.deepcopy(dict(tmpl.get("metadata") or {}))
    spec = copy.deepcopy(dict(tmpl.get("spec") or {}))
    spec["restartPolicy"] = "Never" if restart == "ExitCode" else (restart or "OnFailure")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.pop("nodeName", None)
    if role == "worker" and "Master" in replica_specs(job):
        spec["initContainers"] = [*(spec.get("initContainers") or []),
                                  init_container(f"{jmeta['name']}-master-0")]
    env = pod_env(job, role, index)
    for c in spec.get("containers") or []:
        c["env"] = [*(c.get("env") or []), *copy.deepcopy(env)]
        if c.get("name") == DEFAULT_CONTAINER and not any(
                p.get("name") == DEFAULT_PORT_NAME for p in c.get("ports") or []):
            c["ports"] = [*(c.get("ports") or []), {"name": DEFAULT_PORT_NAME,
                                                   "containerPort": DEFAULT_PORT,
                                                   "protocol": "TCP"}]
    labels = dict(tmeta.get("labels") or {})
    labels.update({JOB_NAME: jmeta["name"], OPERATOR_NAME: CONTROLLER,
                   REPLICA_TYPE: role, REPLICA_INDEX: str(index)})
    if role == "master":
        labels[JOB_ROLE] = "master"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{jmeta['name']}-{role}-{index}",
            "namespace": jmeta["namespace"],
            "labels": labels,
            "annotations": dict(tmeta.get("annotations") or {}),
            "ownerReferences": [_owner_ref(job)],
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
