"""The pure member contract: what fleetq writes on a member, and how it reads the
member's answers into a phase and a health (no cluster involved)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from fleetq.cluster_health import ClusterCondition, TaintSettings
from fleetq.member_contract import (
    GROUP_NAME_ANNOTATION,
    JOB_LABEL,
    MANAGED_BY,
    MIN_MEMBER_ANNOTATION,
    OWNER_LABEL,
    RESERVATION_AFFINITY,
    RUN_SECONDS_ANNOTATION,
    WORKFLOW_ANNOTATION,
    copy_dep,
    finished_status,
    job_label,
    job_phase,
    job_status,
    kept_for_status,
    member_manifest,
    missing_status,
    observed_changed,
    observed_version,
    of_this_run,
    referenced_deps,
    reservation_seconds_left,
    unknown_status,
)
from fleetq.messages import BindRequest, JobRef
from fleetq.models import gang_of, parse_job

JOB = JobRef(namespace="team-a", name="train", workflow_id="pytorchjob/team-a/train")
NOW = datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)


def _rfc3339(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _template(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": "train"}},
        "spec": {
            "containers": [
                {"name": "pytorch", "image": "img", "resources": {"requests": {"cpu": "1"}}}
            ],
            **spec,
        },
    }


def _manifest(workers: int = 2, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {
            "name": JOB.name,
            "namespace": JOB.namespace,
            "labels": {"team": "a"},
            "annotations": {
                "note": "kept",
                "kubectl.kubernetes.io/last-applied-configuration": "{...}",
            },
        },
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": _template()},
                "Worker": {"replicas": workers, "template": _template()},
            },
            **spec,
        },
    }


# --------------------------------------------------------------------------- member_manifest


def test_member_copy_carries_our_labels_and_annotations_on_the_job_and_every_pod() -> None:
    body = member_manifest(BindRequest(job=JOB, manifest=_manifest()))
    meta = body["metadata"]
    ours = {MANAGED_BY: "fleetq", JOB_LABEL: "team-a.train", OWNER_LABEL: JOB.owner_id}
    assert (meta["name"], meta["namespace"]) == (JOB.name, JOB.namespace)
    assert meta["labels"] == {"team": "a", **ours}
    assert meta["annotations"][WORKFLOW_ANNOTATION] == JOB.workflow_id
    assert meta["annotations"][GROUP_NAME_ANNOTATION] == JOB.name
    assert meta["annotations"]["note"] == "kept"
    assert "kubectl.kubernetes.io/last-applied-configuration" not in meta["annotations"]
    for rs in body["spec"]["pytorchReplicaSpecs"].values():
        assert rs["template"]["metadata"]["labels"] == {"app": "train", **ours}
        # not reserved: no reservation affinity
        assert RESERVATION_AFFINITY not in (rs["template"]["metadata"].get("annotations") or {})


def test_the_user_manifest_is_not_changed() -> None:
    manifest = _manifest(runPolicy={"suspend": True})
    before = json.dumps(manifest, sort_keys=True)
    member_manifest(BindRequest(job=JOB, manifest=manifest, reserved=True, run_seconds=5))
    assert json.dumps(manifest, sort_keys=True) == before


@pytest.mark.parametrize(
    "manifest",
    [
        _manifest(workers=3),
        _manifest(workers=4, runPolicy={"schedulingPolicy": {"minAvailable": 3}}),
        _manifest(workers=4, elasticPolicy={"minReplicas": 2, "maxReplicas": 4}),
    ],
    ids=["every-replica", "minAvailable", "elasticPolicy"],
)
def test_gang_minimum_is_the_gang_placement_used(manifest: dict[str, Any]) -> None:
    gang = len(gang_of(parse_job(manifest)).pods)
    body = member_manifest(BindRequest(job=JOB, manifest=manifest))
    assert body["metadata"]["annotations"][MIN_MEMBER_ANNOTATION] == str(gang)
    assert body["spec"]["runPolicy"]["schedulingPolicy"]["minAvailable"] == gang


def test_an_elastic_gang_minimum_is_smaller_than_the_replicas() -> None:
    """The elastic case above would pass with a replica count only if gang_of counted
    replicas: it does not (the minimum the job may start with)."""
    manifest = _manifest(workers=4, elasticPolicy={"minReplicas": 2, "maxReplicas": 4})
    body = member_manifest(BindRequest(job=JOB, manifest=manifest))
    assert int(body["metadata"]["annotations"][MIN_MEMBER_ANNOTATION]) < 1 + 4


def test_reserved_pods_select_the_jobs_reservations() -> None:
    body = member_manifest(BindRequest(job=JOB, manifest=_manifest(), reserved=True))
    for rs in body["spec"]["pytorchReplicaSpecs"].values():
        affinity = json.loads(rs["template"]["metadata"]["annotations"][RESERVATION_AFFINITY])
        assert affinity == {"reservationSelector": {OWNER_LABEL: JOB.owner_id}}


def test_run_seconds_annotation_is_added_unless_the_user_wrote_one() -> None:
    body = member_manifest(BindRequest(job=JOB, manifest=_manifest(), run_seconds=30))
    assert body["metadata"]["annotations"][RUN_SECONDS_ANNOTATION] == "30"
    mine = _manifest()
    mine["metadata"]["annotations"][RUN_SECONDS_ANNOTATION] = "7"
    body = member_manifest(BindRequest(job=JOB, manifest=mine, run_seconds=30))
    assert body["metadata"]["annotations"][RUN_SECONDS_ANNOTATION] == "7"
    body = member_manifest(BindRequest(job=JOB, manifest=_manifest()))
    assert RUN_SECONDS_ANNOTATION not in body["metadata"]["annotations"]


def test_run_time_becomes_kwoks_pod_complete_delay_on_every_pod_template() -> None:
    """On a real member KWOK completes a pod after its own
    ``pod-complete.stage.kwok.x-k8s.io/delay`` (a Go duration); the operator copies
    template annotations to the pods, so every template carries the job's run time."""
    from fleetq.member_contract import KWOK_DELAY_ANNOTATION

    mine = _manifest()
    mine["metadata"]["annotations"][RUN_SECONDS_ANNOTATION] = "1.5"
    body = member_manifest(BindRequest(job=JOB, manifest=mine, run_seconds=30))
    for rs in body["spec"]["pytorchReplicaSpecs"].values():
        assert rs["template"]["metadata"]["annotations"][KWOK_DELAY_ANNOTATION] == "1500ms"
    body = member_manifest(BindRequest(job=JOB, manifest=_manifest()))
    for rs in body["spec"]["pytorchReplicaSpecs"].values():
        assert KWOK_DELAY_ANNOTATION not in (rs["template"].get("metadata") or {}).get(
            "annotations", {})


def test_copy_runs_on_the_members_operator() -> None:
    """No suspend (fleetq suspends by not having a copy), no MultiKueue managedBy, and a
    spec.cleanPodPolicy carried where kubeflow.org/v1 reads it."""
    manifest = _manifest(
        cleanPodPolicy="None",
        runPolicy={"suspend": False, "managedBy": "kueue.x-k8s.io/multikueue"},
    )
    spec = member_manifest(BindRequest(job=JOB, manifest=manifest))["spec"]
    assert "cleanPodPolicy" not in spec
    assert spec["runPolicy"]["cleanPodPolicy"] == "None"
    assert "suspend" not in spec["runPolicy"]
    assert "managedBy" not in spec["runPolicy"]


def test_long_job_label_values_stay_valid_and_distinct() -> None:
    a = job_label("ns", "x" * 80)
    b = job_label("ns", "x" * 79 + "y")
    assert len(a) <= 63 and len(b) <= 63 and a != b
    assert job_label("ns", "short") == "ns.short"


# --------------------------------------------------------------------------- job_phase


def _cond(kind: str, status: str = "True", message: str = "", reason: str = "") -> dict[str, str]:
    return {"type": kind, "status": status, "message": message, "reason": reason}


def _job(*conditions: dict[str, str], **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": JOB.name, "uid": "uid-1", "resourceVersion": "7"},
        "status": {"conditions": list(conditions), **status},
    }


@pytest.mark.parametrize(
    ("conditions", "phase"),
    [
        ([], "Created"),
        ([_cond("Created")], "Created"),
        ([_cond("Created"), _cond("Running")], "Running"),
        ([_cond("Created"), _cond("Restarting")], "Running"),
        ([_cond("Created"), _cond("Running", "False"), _cond("Succeeded")], "Succeeded"),
        ([_cond("Created"), _cond("Running", "False"), _cond("Failed")], "Failed"),
        # the training-operator appends conditions: the latest True one wins
        ([_cond("Created"), _cond("Failed"), _cond("Running")], "Running"),
        ([_cond("Created"), _cond("Running"), _cond("Succeeded", "False")], "Running"),
        # a condition type fleetq does not map (Suspended) leaves the phase as it was
        ([_cond("Created"), _cond("Running"), _cond("Suspended")], "Running"),
    ],
)
def test_job_phase_follows_the_latest_true_kubeflow_condition(
    conditions: list[dict[str, str]], phase: str
) -> None:
    assert job_phase(_job(*conditions))[0] == phase


def test_job_phase_message_is_the_winning_conditions_message_or_reason() -> None:
    job = _job(_cond("Running", message="running"), _cond("Failed", reason="BackoffLimit"))
    assert job_phase(job) == ("Failed", "BackoffLimit")
    assert job_phase({"metadata": {}}) == ("Created", "")


# --------------------------------------------------------------------------- observed tokens


def test_observed_changed_by_full_token_or_by_health_and_phase() -> None:
    token = "Healthy/Running/12/abc"
    assert not observed_changed(token, token)
    assert observed_changed("Healthy/Running/13/abc", token)  # any change counts
    assert not observed_changed("Healthy/Running/13/def", "Healthy/Running")
    assert observed_changed("Unhealthy/Running/13/def", "Healthy/Running")
    assert observed_changed("Healthy/Succeeded/14/def", "Healthy/Running")
    assert observed_changed("Unknown", "Healthy/Running")
    assert not observed_changed("Unknown", "Unknown")
    assert observed_changed("Healthy/Running/1/a", "")  # "" is never a status


def test_a_full_token_names_the_jobs_version_and_no_other_token_does() -> None:
    """The version a status read from the member reported, which the watches must have
    shown before the next read is served from them."""
    job = {"metadata": {"name": "j", "namespace": "ns", "uid": "u1", "resourceVersion": "42"},
           "status": {"conditions": [{"type": "Running", "status": "True"}]}}
    token = job_status("m", job, [], now=0.0, unschedulable_grace_s=60).observed
    assert observed_version(token) == "42"
    for other in ("Healthy/Created", "Unknown", "Unknown#False", "", "Missing",
                  "Healthy/Succeeded/deleted"):
        assert observed_version(other) == ""


# --------------------------------------------------------------------------- health


def _pod(name: str, phase: str = "Running", *, uid: str = "uid-1", rv: str = "1",
         **status: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "resourceVersion": rv,
            "creationTimestamp": _rfc3339(NOW - timedelta(seconds=300)),
            "ownerReferences": [{"kind": "PyTorchJob", "name": JOB.name, "uid": uid}],
        },
        "spec": {"nodeName": "node-1" if phase != "Pending" else ""},
        "status": {"phase": phase, **status},
    }


def _unschedulable(name: str, since_s: float | None) -> dict[str, Any]:
    cond: dict[str, Any] = {"type": "PodScheduled", "status": "False",
                            "reason": "Unschedulable", "message": "0/3 nodes are available"}
    if since_s is not None:
        cond["lastTransitionTime"] = _rfc3339(NOW - timedelta(seconds=since_s))
    return _pod(name, "Pending", conditions=[cond])


def _status(job: dict[str, Any], pods: list[dict[str, Any]], grace_s: float = 60.0) -> Any:
    return job_status("member-a", job, pods, now=NOW.timestamp(), unschedulable_grace_s=grace_s)


def test_a_running_job_with_running_pods_is_healthy() -> None:
    pods = [_pod("train-worker-0", containerStatuses=[{"ready": True, "restartCount": 2}]),
            _pod("train-master-0", startTime="2026-05-01T11:00:00Z")]
    st = _status(_job(_cond("Running", message="job is running"),
                      replicaStatuses={"Worker": {"active": 1, "selector": "x"}}), pods)
    assert (st.cluster, st.health, st.phase, st.reason) == (
        "member-a", "Healthy", "Running", "job is running")
    assert [p.name for p in st.pods] == ["train-master-0", "train-worker-0"]  # sorted
    worker = st.pods[1]
    assert (worker.node, worker.ready, worker.restarts) == ("node-1", True, 2)
    assert st.pods[0].start_time == "2026-05-01T11:00:00Z"
    assert st.replica_statuses == {"Worker": {"active": 1}}
    assert st.observed.startswith("Healthy/Running/7/")


def test_unschedulable_pod_is_unhealthy_only_after_the_grace_at_the_given_time() -> None:
    job = _job(_cond("Created"))
    assert _status(job, [_unschedulable("train-worker-0", since_s=59)]).health == "Healthy"
    st = _status(job, [_unschedulable("train-worker-0", since_s=61)])
    assert st.health == "Unhealthy"
    assert st.reason == "pod train-worker-0 cannot be scheduled for 61s: 0/3 nodes are available"
    # the same pod, judged at an earlier now, is still within the grace
    early = job_status("member-a", job, [_unschedulable("train-worker-0", since_s=61)],
                       now=NOW.timestamp() - 10, unschedulable_grace_s=60.0)
    assert early.health == "Healthy"


def test_unschedulable_since_falls_back_to_the_pods_creation() -> None:
    """No lastTransitionTime: counted from creationTimestamp (300 s before now)."""
    st = _status(_job(_cond("Created")), [_unschedulable("train-worker-0", since_s=None)])
    assert st.health == "Unhealthy" and "for 300s" in st.reason


def test_failed_pod_or_job_is_unhealthy_but_a_succeeded_job_is_not() -> None:
    failed_pod = _pod("train-worker-0", "Failed", message="OOMKilled")
    st = _status(_job(_cond("Running")), [failed_pod])
    assert (st.health, st.reason) == ("Unhealthy", "pod train-worker-0 Failed: OOMKilled")
    st = _status(_job(_cond("Failed", message="job failed")), [])
    assert (st.health, st.phase, st.reason) == ("Unhealthy", "Failed", "job failed")
    assert _status(_job(_cond("Failed")), []).reason == "PyTorchJob Failed"
    st = _status(_job(_cond("Succeeded", message="done")), [failed_pod])
    assert (st.health, st.phase, st.reason) == ("Healthy", "Succeeded", "done")


def test_pods_of_another_owner_are_ignored() -> None:
    other = _pod("train-worker-0", "Failed", uid="uid-of-an-older-copy")
    st = _status(_job(_cond("Running")), [other])
    assert st.health == "Healthy" and st.pods == []


def test_observed_token_changes_with_any_pod_but_not_without() -> None:
    job = _job(_cond("Running"))
    a = _status(job, [_pod("train-worker-0", rv="1")]).observed
    assert _status(job, [_pod("train-worker-0", rv="1")]).observed == a
    assert _status(job, [_pod("train-worker-0", rv="2")]).observed != a


def _as_served(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` as an API server serves it: a spec, annotations and managed fields beside
    what status reads."""
    served = json.loads(json.dumps(obj))
    meta = served["metadata"]
    meta["namespace"] = JOB.namespace
    meta["labels"] = {OWNER_LABEL: JOB.owner_id, "training.kubeflow.org/job-name": JOB.name}
    meta["annotations"] = {"kubectl.kubernetes.io/last-applied-configuration": "{...}"}
    meta["managedFields"] = [{"manager": "kubelet", "operation": "Update",
                              "fieldsV1": {"f:status": {"f:phase": {}}}}]
    served.setdefault("spec", {})["containers"] = [{"name": "pytorch", "image": "busybox"}]
    return served


@pytest.mark.parametrize("case", ["running", "unschedulable", "failed pod", "other owner",
                                  "succeeded", "pending"])
def test_what_a_watch_cache_keeps_of_a_job_and_its_pods_gives_the_same_status(
    case: str,
) -> None:
    """The capacity cache keeps ``kept_for_status`` of each watched PyTorchJob and pod
    (docs/decisions/021); reading the status from that must equal reading it from the
    objects as served, down to the ``observed`` token."""
    job, pods = {
        "running": (_job(_cond("Running"), replicaStatuses={"Master": {"active": 1}}),
                    [_pod("train-master-0", containerStatuses=[{"ready": True,
                                                                "restartCount": 1}])]),
        "unschedulable": (_job(_cond("Created")), [_unschedulable("train-worker-0", 61)]),
        "failed pod": (_job(_cond("Running")), [_pod("train-worker-0", "Failed",
                                                     message="OOMKilled")]),
        "other owner": (_job(_cond("Running")), [_pod("train-worker-0", uid="uid-old")]),
        "succeeded": (_job(_cond("Succeeded", message="done")),
                      [_pod("train-master-0", "Succeeded", startTime="2026-05-01T11:00:00Z")]),
        "pending": (_job(), [_pod("train-master-0", "Pending")]),
    }[case]
    job["metadata"]["creationTimestamp"] = _rfc3339(NOW - timedelta(seconds=400))
    served_job, served_pods = _as_served(job), [_as_served(p) for p in pods]
    kept_job, kept_pods = kept_for_status(served_job), [kept_for_status(p) for p in served_pods]
    assert _status(kept_job, kept_pods) == _status(served_job, served_pods)
    for kept in (kept_job, *kept_pods):
        assert "managedFields" not in kept["metadata"]
        assert "annotations" not in kept["metadata"]
        assert "containers" not in kept.get("spec", {})
    assert of_this_run(kept_job, JOB) and of_this_run(served_job, JOB)


def test_unknown_finished_and_missing_statuses() -> None:
    passing = unknown_status("member-a", "timed out", ClusterCondition("True", 0.0),
                             TaintSettings())
    assert (passing.health, passing.phase, passing.taints, passing.observed) == (
        "Unknown", "Unknown", [], "Unknown")
    assert passing.reason == "timed out"
    down = unknown_status("member-a", "timed out",
                          ClusterCondition("Unknown", NOW.timestamp(), "member-a: unreachable"),
                          TaintSettings())
    assert down.reason == "member-a: unreachable"
    assert down.observed == "Unknown#Unknown" and "/" not in down.observed
    assert down.taints and {t.key for t in down.taints} == {"cluster.karmada.io/unreachable"}
    assert all(t.time_added == NOW for t in down.taints)

    done = finished_status("member-a", "Succeeded", "")
    assert (done.health, done.phase, done.observed) == ("Healthy", "Succeeded",
                                                        "Healthy/Succeeded/deleted")
    assert finished_status("member-a", "Failed", "boom").health == "Unhealthy"

    gone = missing_status("member-a", JOB, found=False)
    assert (gone.health, gone.phase, gone.observed) == ("Unhealthy", "Missing", "Missing")
    assert "not found on member-a" in gone.reason
    assert "another fleet job" in missing_status("member-a", JOB, found=True).reason


# --------------------------------------------------------------------------- dependencies


def test_referenced_deps_finds_every_reference_once_sorted() -> None:
    spec = {
        "volumes": [
            {"name": "a", "configMap": {"name": "cm-vol"}},
            {"name": "b", "secret": {"secretName": "sec-vol"}},
            {"name": "c", "persistentVolumeClaim": {"claimName": "data"}},
            {"name": "d", "projected": {"sources": [{"configMap": {"name": "cm-proj"}},
                                                    {"secret": {"name": "sec-proj"}}]}},
        ],
        "containers": [{
            "name": "c",
            "envFrom": [{"configMapRef": {"name": "cm-env"}}, {"secretRef": {"name": "sec-env"}}],
            "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "sec-vol"}}},
                    {"name": "Y", "valueFrom": {"configMapKeyRef": {"name": "cm-key"}}},
                    {"name": "Z", "value": "plain"}],
        }],
        "initContainers": [{"name": "i", "envFrom": [{"secretRef": {"name": "sec-init"}}]}],
        "imagePullSecrets": [{"name": "pull"}],
        "serviceAccountName": "trainer",
    }
    manifest = _manifest()
    manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"] = spec
    assert referenced_deps(manifest) == [
        ("ConfigMap", "cm-env"), ("ConfigMap", "cm-key"), ("ConfigMap", "cm-proj"),
        ("ConfigMap", "cm-vol"), ("PersistentVolumeClaim", "data"),
        ("Secret", "pull"), ("Secret", "sec-env"), ("Secret", "sec-init"),
        ("Secret", "sec-proj"), ("Secret", "sec-vol"), ("ServiceAccount", "trainer"),
    ]


def test_the_default_service_account_is_not_a_dependency() -> None:
    manifest = _manifest()
    manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"][
        "serviceAccountName"] = "default"
    assert referenced_deps(manifest) == []


def test_copied_deps_are_clean_and_ours() -> None:
    secret = {"kind": "Secret", "type": "Opaque", "data": {"k": "dg=="},
              "metadata": {"name": "s", "namespace": "elsewhere", "uid": "u", "labels": {"a": "b"},
                           "annotations": {"kubectl.kubernetes.io/last-applied-configuration":
                                           "{}", "keep": "me"}}}
    copy = copy_dep("Secret", secret, JOB)
    assert copy is not None
    assert copy["metadata"] == {
        "name": "s", "namespace": JOB.namespace,
        "labels": {"a": "b", MANAGED_BY: "fleetq", JOB_LABEL: "team-a.train",
                   OWNER_LABEL: JOB.owner_id},
        "annotations": {"keep": "me", WORKFLOW_ANNOTATION: JOB.workflow_id},
    }
    assert (copy["type"], copy["data"]) == ("Opaque", {"k": "dg=="})
    token = {**secret, "type": "kubernetes.io/service-account-token"}
    assert copy_dep("Secret", token, JOB) is None
    pvc = {"metadata": {"name": "data"}, "spec": {"volumeName": "pv-1", "resources": {}}}
    pvc_copy = copy_dep("PersistentVolumeClaim", pvc, JOB)
    assert pvc_copy is not None and pvc_copy["spec"] == {"resources": {}}


def test_reservation_time_left_at_the_given_now() -> None:
    expires = {"spec": {"expires": _rfc3339(NOW + timedelta(seconds=90))}}
    assert reservation_seconds_left(expires, NOW.timestamp()) == pytest.approx(90)
    by_ttl = {"metadata": {"creationTimestamp": _rfc3339(NOW - timedelta(seconds=100))},
              "spec": {"ttl": "10m"}}
    assert reservation_seconds_left(by_ttl, NOW.timestamp()) == pytest.approx(500)
    assert reservation_seconds_left({"spec": {}}, NOW.timestamp()) is None
