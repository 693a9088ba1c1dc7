"""The submission id on member objects (``fleetq.io/run-id``), as pure functions: which
copy is this submission's, and what is written.

Label values follow Kubernetes' ``IsValidLabelValue`` (k8s.io/apimachinery
pkg/util/validation/validation.go: at most 63 characters, alphanumerics with ``-_.``
inside): a Temporal run id (a UUID) is one as is; anything else is hashed.
"""

from __future__ import annotations

import json
import re

from fleetq.member_contract import (
    OWNER_LABEL,
    RESERVATION_AFFINITY,
    RUN_LABEL,
    copy_key,
    job_copy_key,
    job_labels,
    member_manifest,
    missing_status,
    of_this_run,
    reservation_body,
    run_label,
)
from fleetq.messages import BindRequest, JobRef, PodReservation

LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
RUN = "01a233da-6ffb-747b-beba-998acca22d3a"
JOB = JobRef(namespace="ns", name="train", workflow_id="pytorchjob/ns/train", run_id=RUN)


def manifest() -> dict[str, object]:
    pod = {"spec": {"containers": [{"name": "pytorch", "image": "x",
                                    "resources": {"requests": {"cpu": "1"}}}]}}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": "train", "namespace": "ns"},
            "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": pod}}}}


def test_run_label_is_the_run_id_or_a_valid_hash_of_it() -> None:
    assert run_label(RUN) == RUN
    assert run_label("") == ""
    for odd in ("run/with/slashes", "x" * 80, "-leading", "trailing."):
        value = run_label(odd)
        assert value != odd and len(value) <= 63 and LABEL_VALUE.match(value)
        assert run_label(odd) == value  # stable


def test_every_object_of_a_submission_carries_its_run_id() -> None:
    assert job_labels(JOB)[RUN_LABEL] == RUN
    body = member_manifest(BindRequest(job=JOB, manifest=manifest(), reserved=True))
    assert body["metadata"]["labels"][RUN_LABEL] == RUN
    template = body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["metadata"]
    assert template["labels"][RUN_LABEL] == RUN
    affinity = json.loads(template["annotations"][RESERVATION_AFFINITY])
    assert affinity == {"reservationSelector": {OWNER_LABEL: JOB.owner_id, RUN_LABEL: RUN}}
    pod = PodReservation(role="master", index=0, node="n1", requests={"cpu": 1000})
    assert reservation_body(JOB, pod, 600)["metadata"]["labels"][RUN_LABEL] == RUN


def test_a_jobref_without_a_run_writes_no_run_label() -> None:
    legacy = JOB.model_copy(update={"run_id": ""})
    assert RUN_LABEL not in job_labels(legacy)


def test_only_this_submissions_copy_is_of_this_run() -> None:
    mine = {"metadata": {"labels": job_labels(JOB)}}
    earlier = {"metadata": {"labels": {**job_labels(JOB), RUN_LABEL: "another-run"}}}
    unlabelled = {"metadata": {"labels": {OWNER_LABEL: JOB.owner_id}}}
    theirs = {"metadata": {"labels": {OWNER_LABEL: "someone-else", RUN_LABEL: RUN}}}
    assert of_this_run(mine, JOB)
    assert not of_this_run(earlier, JOB) and not of_this_run(unlabelled, JOB)
    assert not of_this_run(theirs, JOB) and not of_this_run(None, JOB)
    legacy = JOB.model_copy(update={"run_id": ""})  # names no submission: any copy of ours
    assert of_this_run(earlier, legacy) and not of_this_run(theirs, legacy)


def test_finished_copies_are_keyed_by_owner_and_run() -> None:
    assert job_copy_key(JOB) == f"{JOB.owner_id}/{RUN}"
    assert copy_key({**job_labels(JOB), RUN_LABEL: "another"}) != job_copy_key(JOB)
    assert copy_key({OWNER_LABEL: JOB.owner_id}) == JOB.owner_id


def test_an_earlier_submissions_copy_is_missing_with_its_reason() -> None:
    st = missing_status("cluster-a", JOB, found=True, earlier_run=True)
    assert (st.phase, st.health) == ("Missing", "Unhealthy")
    assert st.reason == ("PyTorchJob ns/train on cluster-a is the copy of an earlier "
                         "submission of this job, not of this one")
