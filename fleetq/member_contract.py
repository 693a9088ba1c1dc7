"""The member-cluster contract as pure functions: what fleetq writes on a member and how
it reads what the member answers (``docs/member-contract.md``).

The adapter (``activities.member_cluster``) fetches and writes objects; everything it
*decides* lives here, on plain JSON dicts, with no Kubernetes client, no HTTP and no
Temporal, so it is unit-tested directly (``tests/core/test_member_contract.py``): the
labels and annotations every object carries, the member copy of a PyTorchJob
(:func:`member_manifest`), its Reservations, the dependencies a job references, a job's
phase from its Kubeflow conditions, its health on the member at a given ``now``, and
what a running pod says of its gang for capacity preemption (:func:`gang_pod`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from fleetq import resources as R
from fleetq.capacity import Taint
from fleetq.cluster_health import ClusterCondition, TaintSettings, cluster_taints
from fleetq.kube_values import format_go_duration, go_duration_or_none, parse_rfc3339
from fleetq.messages import (
    MISSING_PHASE,
    BindRequest,
    Health,
    JobRef,
    JobStatus,
    MemberTaint,
    PodReservation,
    PodStatus,
)
from fleetq.models import ManifestError, gang_of, parse_job, pod_requests
from fleetq.naming import KF_JOB_NAME, KF_REPLICA_INDEX, KF_REPLICA_TYPE
from fleetq.preemption import (
    DEFAULT_GRACE_SECONDS,
    GRACE_ANNOTATION,
    PREEMPTIBLE_ANNOTATION,
    RunningPod,
    job_policy_from_annotations,
)

# --------------------------------------------------------------------------- labels & names

MANAGED_BY = "fleetq.io/managed-by"
JOB_LABEL = "fleetq.io/job"
OWNER_LABEL = "fleetq.io/owner"
#: the submission that created an object (JobRef.run_id, label-safe): a new submission
#: under the same name never adopts an earlier one's copy, it replaces it
RUN_LABEL = "fleetq.io/run-id"
WORKFLOW_ANNOTATION = "fleetq.io/workflow-id"
RUN_SECONDS_ANNOTATION = "fleetq.io/run-seconds"
#: KWOK's own pod-complete delay (real members: KWOK completes the pod that long after
#: it runs); every pod template of a copy with a run time carries it.
KWOK_DELAY_ANNOTATION = "pod-complete.stage.kwok.x-k8s.io/delay"
MIN_MEMBER_ANNOTATION = "fleetq.io/min-member"
#: the job's priority as the fleet resolved it, on the member copy's pod templates (so on
#: its pods): capacity preemption reads running gangs from the pods alone
PRIORITY_ANNOTATION = "fleetq.io/priority"
GROUP_NAME_ANNOTATION = "scheduling.k8s.io/group-name"
RESERVATION_AFFINITY = "scheduling.koordinator.sh/reservation-affinity"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"

PYTORCHJOB_API = "/apis/kubeflow.org/v1"
#: runPolicy.managedBy of a job a MultiKueue manager dispatches: the member's operator
#: leaves such a job alone, so the member copy does not carry it
MULTIKUEUE_MANAGER = "kueue.x-k8s.io/multikueue"
RESERVATION_API = "/apis/scheduling.koordinator.sh/v1alpha1"

#: the kinds a pod template can reference that ``propagateDeps`` copies, and their
#: resource names
DEP_KINDS = {
    "ConfigMap": "configmaps",
    "Secret": "secrets",
    "PersistentVolumeClaim": "persistentvolumeclaims",
    "ServiceAccount": "serviceaccounts",
}


def job_label(namespace: str, name: str) -> str:
    """``fleetq.io/job`` value ``<ns>.<name>``, shortened with a hash to stay a valid
    label value (<= 63 characters)."""
    value = f"{namespace}.{name}"
    if len(value) <= 63:
        return value
    return f"{value[:54]}-{hashlib.sha256(value.encode()).hexdigest()[:8]}"


_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def run_label(run_id: str) -> str:
    """The ``fleetq.io/run-id`` value of a submission: its run id when that is a valid
    label value (Temporal's UUIDs are), else a hash of it; "" for no submission."""
    if not run_id or _LABEL_VALUE.match(run_id):
        return run_id
    return hashlib.sha256(run_id.encode()).hexdigest()[:16]


def job_labels(job: JobRef) -> dict[str, str]:
    """The labels every object fleetq creates for a job carries on the member (the
    submission's ``fleetq.io/run-id`` when the JobRef names one)."""
    labels = {
        MANAGED_BY: "fleetq",
        JOB_LABEL: job_label(job.namespace, job.name),
        OWNER_LABEL: job.owner_id,
    }
    if job.run_id:
        labels[RUN_LABEL] = run_label(job.run_id)
    return labels


def reservation_name(job: JobRef, role: str, index: int) -> str:
    """``<job>-<ns>-<role>-<index>-<owner-id[:8]>`` (deterministic per workflow)."""
    return f"{job.name}-{job.namespace}-{role.lower()}-{index}-{job.owner_id[:8]}"


# --------------------------------------------------------------------------- object access


def meta_of(obj: Mapping[str, Any]) -> dict[str, Any]:
    """An object's ``metadata`` ({} when absent or malformed)."""
    m = obj.get("metadata")
    return m if isinstance(m, dict) else {}


def labels_of(obj: Mapping[str, Any]) -> dict[str, str]:
    """An object's labels ({} when absent or malformed)."""
    labels = meta_of(obj).get("labels")
    return labels if isinstance(labels, dict) else {}


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    """Whether one of the object's ownerReferences is the object with ``uid``."""
    return any(
        isinstance(ref, dict) and ref.get("uid") == uid
        for ref in meta_of(obj).get("ownerReferences") or []
    )


def controlled_by_job(obj: Mapping[str, Any], name: str) -> bool:
    """Whether one of the object's ownerReferences is a PyTorchJob called ``name`` (the
    operator's pods of that job, whichever run of it created them)."""
    return any(
        isinstance(ref, dict) and ref.get("kind") == "PyTorchJob" and ref.get("name") == name
        for ref in meta_of(obj).get("ownerReferences") or []
    )


def pod_templates(manifest: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(role, template)`` for every replica spec of a PyTorchJob manifest."""
    specs = (manifest.get("spec") or {}).get("pytorchReplicaSpecs") or {}
    out = []
    for role, rs in specs.items():
        if isinstance(rs, dict) and isinstance(rs.get("template"), dict):
            out.append((str(role), rs["template"]))
    return out


def _drop_none(value: Any) -> Any:
    """Drop null fields (pydantic dumps unset optionals as None; structural CRD schemas
    would reject or prune them)."""
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


# --------------------------------------------------------------------------- the member copy


def member_manifest(req: BindRequest) -> dict[str, Any]:
    """The PyTorchJob fleetq creates on the member, from the user's manifest: our labels
    on it and on every pod template, the workflow and gang annotations, the gang minimum
    in ``runPolicy.schedulingPolicy.minAvailable`` (a value the user wrote stays), the
    reservation affinity when the pods were reserved, and no ``suspend`` or MultiKueue
    ``managedBy`` (the copy exists to run, on the member's own operator)."""
    job = req.job
    src = _drop_none(json.loads(json.dumps(req.manifest)))  # deep, JSON-clean copy
    meta = src.get("metadata") or {}
    labels = {**(meta.get("labels") or {}), **req.labels, **job_labels(job)}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != LAST_APPLIED}
    spec = src.get("spec") or {}
    # the gang fleetq admitted and placed: every replica, or the minimum the job may
    # start with (minAvailable / elasticPolicy); a minAvailable written stays as is
    minimum = len(gang_of(parse_job(req.manifest)).pods)
    annotations[WORKFLOW_ANNOTATION] = job.workflow_id
    annotations[GROUP_NAME_ANNOTATION] = job.name
    annotations[MIN_MEMBER_ANNOTATION] = str(minimum)
    if req.run_seconds is not None and RUN_SECONDS_ANNOTATION not in annotations:
        annotations[RUN_SECONDS_ANNOTATION] = str(req.run_seconds)
    run_policy = spec.setdefault("runPolicy", {})
    run_policy.setdefault("schedulingPolicy", {}).setdefault("minAvailable", minimum)
    # fleetq carries out runPolicy.suspend itself (no copy while suspended): a copy
    # exists only to run
    run_policy.pop("suspend", None)
    # spec.cleanPodPolicy (the walkthrough writes it there, as PyTorchJobs before
    # runPolicy did) is runPolicy.cleanPodPolicy in kubeflow.org/v1: a real API server
    # would prune it, so the member copy carries it where the operator reads it
    legacy = spec.pop("cleanPodPolicy", None)
    if legacy is not None:
        run_policy.setdefault("cleanPodPolicy", legacy)
    if run_policy.get("managedBy") == MULTIKUEUE_MANAGER:
        # the member's own training-operator must run the copy fleetq placed there
        del run_policy["managedBy"]
    selector = {OWNER_LABEL: job.owner_id}
    if job.run_id:  # only this submission's Reservations
        selector[RUN_LABEL] = run_label(job.run_id)
    affinity = json.dumps({"reservationSelector": selector}, separators=(",", ":"))
    gang_notes = pod_gang_annotations(job, req.priority, annotations)
    with contextlib.suppress(KeyError, ValueError, OverflowError):
        run = max(0.0, float(annotations[RUN_SECONDS_ANNOTATION]))
        gang_notes[KWOK_DELAY_ANNOTATION] = f"{int(run * 1000)}ms"  # a Go duration
    for _role, template in pod_templates(src):
        tmeta = template.setdefault("metadata", {})
        tmeta["labels"] = {**(tmeta.get("labels") or {}), **job_labels(job)}
        notes = {**(tmeta.get("annotations") or {}), **gang_notes}
        if req.reserved:
            notes[RESERVATION_AFFINITY] = affinity
        if notes:
            tmeta["annotations"] = notes
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {
            "name": job.name,
            "namespace": job.namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": spec,
    }


def pod_gang_annotations(
    job: JobRef, priority: int | None, job_annotations: Mapping[str, str]
) -> dict[str, str]:
    """What every pod of a member copy says of its gang, for capacity preemption: the
    workflow that owns it, its priority, and the job's ``fleetq.io/preemptible`` and
    grace period when it sets them. Nothing without a ``priority`` (a copy bound by a
    workflow recorded before capacity preemption: never a capacity victim)."""
    if priority is None:
        return {}
    out = {WORKFLOW_ANNOTATION: job.workflow_id, PRIORITY_ANNOTATION: str(priority)}
    for key in (PREEMPTIBLE_ANNOTATION, GRACE_ANNOTATION):
        if key in job_annotations:
            out[key] = str(job_annotations[key])
    return out


@dataclass(frozen=True)
class GangPod:
    """One running pod of a fleet job, as capacity preemption sees it."""

    job_id: str  # the owning job workflow's id
    pod: RunningPod
    priority: int
    preemptible: bool
    grace_seconds: int
    started_at: float  # epoch seconds (startTime, else creation)


def gang_pod(pod: Mapping[str, Any]) -> GangPod | None:
    """What a member pod says of its gang (:func:`pod_gang_annotations`), or None: not a
    pod of a fleet job's copy with a known priority, not bound to a node, or ended.
    A pod whose preemption annotations cannot be read is never a victim."""
    notes = meta_of(pod).get("annotations")
    if not isinstance(notes, dict):
        return None
    job_id, raw = notes.get(WORKFLOW_ANNOTATION), notes.get(PRIORITY_ANNOTATION)
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    node = spec.get("nodeName") if isinstance(spec, dict) else None
    if not job_id or raw is None or not node:
        return None
    if isinstance(status, dict) and status.get("phase") in ("Succeeded", "Failed"):
        return None
    try:
        priority = int(str(raw))
    except ValueError:
        return None
    try:
        policy = job_policy_from_annotations("pod", {k: str(v) for k, v in notes.items()})
        preemptible, grace = policy.preemptible, policy.grace_seconds
    except ManifestError:
        preemptible, grace = False, DEFAULT_GRACE_SECONDS
    try:
        requests = pod_requests(spec)
    except (R.QuantityError, ValueError):
        requests = {}
    started = parse_rfc3339(status.get("startTime") if isinstance(status, dict) else None)
    if started is None:
        started = parse_rfc3339(meta_of(pod).get("creationTimestamp"))
    return GangPod(
        job_id=str(job_id),
        pod=RunningPod(str(node), requests),
        priority=priority,
        preemptible=preemptible,
        grace_seconds=grace,
        started_at=started.timestamp() if started is not None else 0.0,
    )


# --------------------------------------------------------------------------- dependencies


def referenced_deps(manifest: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(kind, name)`` of every ConfigMap, Secret, PVC and ServiceAccount the pod
    templates reference, sorted. Pod templates can only reference objects in their own
    namespace, so names are namespace-less by construction."""
    found: set[tuple[str, str]] = set()
    for _role, template in pod_templates(manifest):
        for kind, name in _pod_spec_refs(template.get("spec") or {}):
            if isinstance(name, str) and name:
                found.add((kind, name))
    return sorted(found)


#: A reference a pod spec makes: ``(kind, name)``; the name may be missing or not a string.
_Ref = tuple[str, Any]


def _pod_spec_refs(spec: Mapping[str, Any]) -> Iterator[_Ref]:
    for vol in spec.get("volumes") or []:
        if isinstance(vol, dict):
            yield from _volume_refs(vol)
    for key in ("containers", "initContainers", "ephemeralContainers"):
        for c in spec.get(key) or []:
            if isinstance(c, dict):
                yield from _container_refs(c)
    for ips in spec.get("imagePullSecrets") or []:
        if isinstance(ips, dict):
            yield "Secret", ips.get("name")
    sa = spec.get("serviceAccountName") or spec.get("serviceAccount")
    if sa and sa != "default":  # every namespace has its own "default"
        yield "ServiceAccount", sa


def _volume_refs(vol: Mapping[str, Any]) -> Iterator[_Ref]:
    yield "ConfigMap", (vol.get("configMap") or {}).get("name")
    yield "Secret", (vol.get("secret") or {}).get("secretName")
    yield "PersistentVolumeClaim", (vol.get("persistentVolumeClaim") or {}).get("claimName")
    for src in (vol.get("projected") or {}).get("sources") or []:
        if isinstance(src, dict):
            yield "ConfigMap", (src.get("configMap") or {}).get("name")
            yield "Secret", (src.get("secret") or {}).get("name")


def _container_refs(c: Mapping[str, Any]) -> Iterator[_Ref]:
    for ef in c.get("envFrom") or []:
        if isinstance(ef, dict):
            yield "ConfigMap", (ef.get("configMapRef") or {}).get("name")
            yield "Secret", (ef.get("secretRef") or {}).get("name")
    for env in c.get("env") or []:
        vf = env.get("valueFrom") if isinstance(env, dict) else None
        if isinstance(vf, dict):
            yield "ConfigMap", (vf.get("configMapKeyRef") or {}).get("name")
            yield "Secret", (vf.get("secretKeyRef") or {}).get("name")


_DROP_ANNOTATION_PREFIXES = (
    "pv.kubernetes.io/",
    "volume.kubernetes.io/",
    "volume.beta.kubernetes.io/",
    LAST_APPLIED,
)


def copy_dep(kind: str, obj: Mapping[str, Any], job: JobRef) -> dict[str, Any] | None:
    """A clean copy of a dependency for the member (None if it cannot travel)."""
    meta = meta_of(obj)
    annotations = {
        k: v
        for k, v in (meta.get("annotations") or {}).items()
        if not k.startswith(_DROP_ANNOTATION_PREFIXES)
    }
    annotations[WORKFLOW_ANNOTATION] = job.workflow_id
    out: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": kind,
        "metadata": {
            "name": meta.get("name"),
            "namespace": job.namespace,
            "labels": {**(meta.get("labels") or {}), **job_labels(job)},
            "annotations": annotations,
        },
    }
    if kind in ("ConfigMap", "Secret"):
        if kind == "Secret" and obj.get("type") == "kubernetes.io/service-account-token":
            return None  # minted per cluster by the token controller
        for key in ("data", "binaryData", "stringData", "type", "immutable"):
            if key in obj:
                out[key] = obj[key]
    elif kind == "PersistentVolumeClaim":
        spec = dict(obj.get("spec") or {})
        spec.pop("volumeName", None)  # bound to a volume of the source cluster
        out["spec"] = spec
    elif kind == "ServiceAccount":
        for key in ("imagePullSecrets", "automountServiceAccountToken"):
            if key in obj:
                out[key] = obj[key]
    return out


# --------------------------------------------------------------------------- reservations


def reservation_body(job: JobRef, pod: PodReservation, ttl_s: int) -> dict[str, Any]:
    """The Koordinator Reservation holding room for one pod of the gang on the node
    placement chose, claimable only by that pod (role and index), for ``ttl_s``."""
    template_spec: dict[str, Any] = {
        "nodeName": pod.node,
        "containers": [
            {"name": "reserve", "resources": {"requests": R.to_quantity_map(pod.requests)}}
        ],
    }
    if pod.node_selector:
        template_spec["nodeSelector"] = dict(pod.node_selector)
    if pod.tolerations:
        template_spec["tolerations"] = [dict(t) for t in pod.tolerations]
    return {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Reservation",
        "metadata": {
            "name": reservation_name(job, pod.role, pod.index),
            "labels": job_labels(job),
            "annotations": {WORKFLOW_ANNOTATION: job.workflow_id},
        },
        "spec": {
            "template": {"metadata": {"namespace": job.namespace}, "spec": template_spec},
            "owners": [
                {
                    "labelSelector": {
                        "matchLabels": {
                            KF_JOB_NAME: job.name,
                            KF_REPLICA_TYPE: pod.role.lower(),
                            KF_REPLICA_INDEX: str(pod.index),
                        }
                    }
                }
            ],
            "ttl": format_go_duration(ttl_s),
            "allocateOnce": True,
        },
    }


def reservation_node(obj: Mapping[str, Any]) -> str:
    """The node a Reservation holds room on (its status, else its template)."""
    node = (obj.get("status") or {}).get("nodeName")
    if not node:
        node = (((obj.get("spec") or {}).get("template") or {}).get("spec") or {}).get(
            "nodeName"
        )
    return str(node or "")


def reservation_seconds_left(obj: Mapping[str, Any], now: float) -> float | None:
    """Seconds until a Reservation expires at epoch ``now`` (``spec.expires``, else its
    creation plus ``spec.ttl``); None when it does not say."""
    spec = obj.get("spec") or {}
    expires = parse_rfc3339(spec.get("expires"))
    if expires is None:
        created = parse_rfc3339(meta_of(obj).get("creationTimestamp"))
        ttl = go_duration_or_none(spec.get("ttl"))
        if created is None or ttl is None:
            return None
        return created.timestamp() + ttl - now
    return expires.timestamp() - now


def reservation_why(pod: PodReservation, obj: Mapping[str, Any]) -> str:
    """One line on where a pod's Reservation stands and why (its phase and message)."""
    status = obj.get("status") or {}
    phase = status.get("phase") or "Pending"
    msg = status.get("message") or status.get("reason") or ""
    if not msg:
        for cond in status.get("conditions") or []:
            if isinstance(cond, dict) and cond.get("message"):
                msg = cond["message"]
    where = reservation_node(obj) or pod.node
    text = f"reservation {pod.role.lower()}-{pod.index} on node {where}: {phase}"
    return f"{text}: {msg}" if msg else text


# --------------------------------------------------------------------------- pods & phases


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """A pod's Ready condition (else: all its containers ready)."""
    status = pod.get("status") or {}
    for cond in status.get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == "Ready":
            return cond.get("status") == "True"
    cs = status.get("containerStatuses") or []
    return bool(cs) and all(isinstance(c, dict) and c.get("ready") for c in cs)


def pod_restarts(pod: Mapping[str, Any]) -> int:
    """Container restarts of a pod, summed (kubectl's RESTARTS)."""
    total = 0
    for c in (pod.get("status") or {}).get("containerStatuses") or []:
        if isinstance(c, dict):
            with contextlib.suppress(TypeError, ValueError):
                total += int(c.get("restartCount") or 0)
    return total


_PHASE_OF_CONDITION = {
    "Created": "Created",
    "Running": "Running",
    "Restarting": "Running",
    "Succeeded": "Succeeded",
    "Failed": "Failed",
}


def job_phase(job_obj: Mapping[str, Any]) -> tuple[str, str]:
    """``(phase, message)`` from a PyTorchJob's conditions: the last True one wins (the
    training-operator appends each new condition and turns Running False when the job
    ends); a job without conditions yet is ``Created``."""
    phase, message = "Created", ""
    for cond in (job_obj.get("status") or {}).get("conditions") or []:
        if not isinstance(cond, dict) or cond.get("status") != "True":
            continue
        mapped = _PHASE_OF_CONDITION.get(str(cond.get("type")))
        if mapped:
            phase = mapped
            message = str(cond.get("message") or cond.get("reason") or "")
    return phase, message


# --------------------------------------------------------------------------- health


def observed_version(observed: str) -> str:
    """The PyTorchJob's resourceVersion in a full status token (``job_status``'s
    ``health/phase/resourceVersion/pods``); "" for any other token."""
    parts = observed.split("/")
    return parts[2] if len(parts) == 4 else ""


def observed_changed(observed: str, since: str) -> bool:
    """Whether a status token differs from ``since``: a full token from an earlier status
    (any change counts), or ``"health/phase"`` (only a health or phase change counts)."""
    if since.count("/") == 1:
        return "/".join(observed.split("/")[:2]) != since
    return observed != since


def unknown_status(
    cluster: str, reason: str, condition: ClusterCondition, failover: TaintSettings
) -> JobStatus:
    """A member that did not answer: ``Unknown``. While the member's Ready condition
    still vouches for it the failure is a passing one (no taints); otherwise the
    condition's taints and reason come along."""
    if condition.ready == "True":
        taints: tuple[Taint, ...] = ()
    else:
        taints = cluster_taints(condition, failover)
        reason = condition.reason or reason
    return JobStatus(
        cluster=cluster,
        health="Unknown",
        phase="Unknown",
        reason=reason,
        # no "/" in the token: "health/phase" tokens are told apart by one "/"
        observed=f"Unknown#{condition.ready}" if taints else "Unknown",
        taints=[MemberTaint.of(t) for t in taints],
    )


def finished_status(cluster: str, phase: str, message: str) -> JobStatus:
    """A job that finished and whose copy the member has since deleted (its
    ``ttlSecondsAfterFinished``): Healthy if it succeeded."""
    health: Health = "Healthy" if phase == "Succeeded" else "Unhealthy"
    return JobStatus(
        cluster=cluster,
        health=health,
        phase=phase,
        reason=f"{message or phase} (the member has since deleted its copy, "
        "ttlSecondsAfterFinished)",
        observed=f"{health}/{phase}/deleted",
    )


def missing_status(cluster: str, job: JobRef, found: bool, earlier_run: bool = False
                   ) -> JobStatus:
    """No copy of ours on the member: none at all, or (``found``) one of that name that
    belongs to another fleet job, or (``earlier_run``) to an earlier submission of this
    one. Unhealthy, phase ``Missing``."""
    if earlier_run:
        reason = (f"PyTorchJob {job.ref} on {cluster} is the copy of an earlier "
                  "submission of this job, not of this one")
    elif found:
        reason = f"PyTorchJob {job.ref} on {cluster} belongs to another fleet job"
    else:
        reason = f"PyTorchJob {job.ref} not found on {cluster}"
    return JobStatus(
        cluster=cluster, health="Unhealthy", phase=MISSING_PHASE, reason=reason,
        observed=MISSING_PHASE,
    )


def is_ours(obj: Mapping[str, Any] | None, job: JobRef) -> bool:
    """Whether a member object carries this fleet job's owner label (any submission of
    it: what a purge of the job deletes)."""
    return obj is not None and labels_of(obj).get(OWNER_LABEL) == job.owner_id


def of_this_run(obj: Mapping[str, Any] | None, job: JobRef) -> bool:
    """Whether a member object is this submission's: ours, and with its
    ``fleetq.io/run-id`` (a JobRef without a run id takes any copy that is ours). A copy
    of another submission — an earlier apply of the same name, which finished — is not:
    bind replaces it and the watch does not read it as this job's."""
    if not is_ours(obj, job):
        return False
    return not job.run_id or labels_of(obj or {}).get(RUN_LABEL) == run_label(job.run_id)


def copy_key(labels: Mapping[str, Any]) -> str:
    """Who a member copy belongs to, from its labels: ``<owner>`` or
    ``<owner>/<run-id>`` (what a cache of finished copies keys them by)."""
    owner = str(labels.get(OWNER_LABEL) or "")
    run = str(labels.get(RUN_LABEL) or "")
    return f"{owner}/{run}" if run else owner


def job_copy_key(job: JobRef) -> str:
    """:func:`copy_key` of the copies this JobRef's submission creates."""
    return copy_key(job_labels(job))


def _unschedulable_for(pod: Mapping[str, Any], now: float) -> tuple[float, str] | None:
    """How long a Pending pod has been unschedulable at ``now``, and why."""
    st = pod.get("status") or {}
    for cond in st.get("conditions") or []:
        if (
            isinstance(cond, dict)
            and cond.get("type") == "PodScheduled"
            and cond.get("status") == "False"
        ):
            since = parse_rfc3339(cond.get("lastTransitionTime")) or parse_rfc3339(
                meta_of(pod).get("creationTimestamp")
            )
            waited = now - since.timestamp() if since is not None else 0.0
            return waited, str(cond.get("message") or cond.get("reason") or "Unschedulable")
    return None


#: the metadata :func:`job_status` and :func:`of_this_run` read of a watched object
STATUS_METADATA = (
    "name", "namespace", "uid", "resourceVersion", "creationTimestamp",
    "deletionTimestamp", "labels", "ownerReferences",
)


def kept_for_status(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What :func:`job_status` reads of a watched PyTorchJob or pod: its identity,
    labels, owners, node and status, without its spec, annotations or managed fields.
    A watch cache keeps this, as a client-go informer's transform strips what its
    controller never reads (k8s.io/client-go ``tools/cache``, ``SetTransform``: "strip
    unused metadata fields out of objects to save on RAM cost")."""
    meta = meta_of(obj)
    kept: dict[str, Any] = {
        "metadata": {k: meta[k] for k in STATUS_METADATA if k in meta},
        "status": obj.get("status") or {},
    }
    node = (obj.get("spec") or {}).get("nodeName")
    if node:
        kept["spec"] = {"nodeName": node}
    return kept


def job_status(
    cluster: str,
    job_obj: Mapping[str, Any],
    pods: Iterable[Mapping[str, Any]],
    *,
    now: float,
    unschedulable_grace_s: float,
) -> JobStatus:
    """Where a job stands on a member, from its PyTorchJob and the pods listed by its
    job-name label (pods another object owns are ignored), at epoch ``now``.

    The phase comes from the job's conditions (:func:`job_phase`). Health is
    ``Unhealthy`` when the job Failed, or — unless it Succeeded — when a pod Failed or
    has been unschedulable for longer than ``unschedulable_grace_s``; else ``Healthy``.
    ``observed`` changes whenever health, phase, the job or any pod changes."""
    uid = str(meta_of(job_obj).get("uid") or "")
    mine = [p for p in pods if not meta_of(p).get("ownerReferences") or owned_by(p, uid)]
    mine.sort(key=lambda p: str(meta_of(p).get("name")))
    phase, message = job_phase(job_obj)
    health: Health = "Healthy"
    reason = message
    pod_statuses = []
    problems: list[str] = []
    for p in mine:
        st = p.get("status") or {}
        pname = str(meta_of(p).get("name") or "")
        pphase = str(st.get("phase") or "Pending")
        pod_statuses.append(
            PodStatus(
                name=pname,
                node=str((p.get("spec") or {}).get("nodeName") or ""),
                phase=pphase,
                ready=pod_ready(p),
                restarts=pod_restarts(p),
                start_time=st.get("startTime"),
                created_at=meta_of(p).get("creationTimestamp"),
            )
        )
        if pphase == "Failed":
            why = st.get("message") or st.get("reason") or "no reason given"
            problems.append(f"pod {pname} Failed: {why}")
        elif pphase == "Pending":
            stuck = _unschedulable_for(p, now)
            if stuck is not None and stuck[0] > unschedulable_grace_s:
                problems.append(f"pod {pname} cannot be scheduled for {stuck[0]:.0f}s: {stuck[1]}")
    if phase == "Failed":
        health = "Unhealthy"
        reason = message or "PyTorchJob Failed"
    elif phase != "Succeeded" and problems:
        health = "Unhealthy"
        reason = "; ".join(problems)
    replica_statuses: dict[str, dict[str, int]] = {}
    for role, counts in ((job_obj.get("status") or {}).get("replicaStatuses") or {}).items():
        if isinstance(counts, dict):
            replica_statuses[str(role)] = {
                k: int(v)
                for k, v in counts.items()
                if isinstance(v, int) and not isinstance(v, bool)
            }
    digest = hashlib.sha1(
        "|".join(
            f"{meta_of(p).get('name')}@{meta_of(p).get('resourceVersion')}" for p in mine
        ).encode()
    ).hexdigest()[:12]
    observed = f"{health}/{phase}/{meta_of(job_obj).get('resourceVersion', '')}/{digest}"
    return JobStatus(
        cluster=cluster,
        health=health,
        phase=phase,
        reason=reason,
        pods=pod_statuses,
        replica_statuses=replica_statuses,
        observed=observed,
        status=dict(job_obj.get("status") or {}),
        created_at=parse_rfc3339(meta_of(job_obj).get("creationTimestamp")),
    )
