"""A PyTorchJob is valid for fleetq exactly when the Kubeflow training-operator v1 (its
validating webhook and CRD types) accepts it, and fleetq reads ``runPolicy`` and
``elasticPolicy`` the way the operator does.

Upstream sources the rules come from (kubeflow/training-operator):
``pkg/webhooks/pytorch/pytorchjob_webhook.go`` (name, replica types, containers, image,
``pytorch`` container, Master replicas, nProcPerNode, elasticPolicy needs Worker),
``pkg/common/util/webhooks.go`` (``runPolicy.managedBy``),
``pkg/apis/kubeflow.org/v1/{pytorch,common}_types.go`` (field names and int32/int64 types,
no minimums), ``pytorch_defaults.go`` (elastic min/max defaulting) and
``pkg/controller.v1/common/job.go`` (PodGroup ``minMember`` = ``minAvailable`` else every
replica; ``calcPGMinResources`` takes the first ``minMember`` pods by PriorityClass).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetq import manifests as MF
from fleetq import models as M
from fleetq import resources as R

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
JOB = "PyTorchJob default/pytorch-test"
SPECS = "spec.pytorchReplicaSpecs"


def job() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / "pytorch-test.yaml").read_text())
    return doc


def errors_of(doc: Any) -> list[str]:
    with pytest.raises(M.ManifestErrors) as info:
        M.parse_object(doc)
    return [str(e) for e in info.value.errors]


def containers(doc: dict[str, Any], role: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = doc["spec"]["pytorchReplicaSpecs"][role]["template"]["spec"][
        "containers"
    ]
    return out


def worker_only(workers: int = 4, **spec: Any) -> dict[str, Any]:
    doc = job()
    del doc["spec"]["pytorchReplicaSpecs"]["Master"]
    doc["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = workers
    doc["spec"].update(spec)
    return doc


# --------------------------------------------------------------------------- replica specs


def test_master_only_and_worker_only_jobs_are_accepted() -> None:
    master_only = job()
    del master_only["spec"]["pytorchReplicaSpecs"]["Worker"]
    assert M.parse_job(master_only).roles() == ("Master",)
    assert M.parse_job(worker_only()).roles() == ("Worker",)


def test_pytorch_replica_specs_is_required() -> None:
    doc = job()
    del doc["spec"]["pytorchReplicaSpecs"]
    assert errors_of(doc) == [f"{JOB}: {SPECS} is required"]
    doc["spec"]["pytorchReplicaSpecs"] = None
    assert errors_of(doc) == [f"{JOB}: {SPECS} must be a mapping"]


def test_empty_replica_specs_are_refused() -> None:
    # Upstream's webhook lets `{}` through (it only checks for nil) and the operator then
    # runs nothing; a job without pods cannot be queued or placed, so we refuse it.
    doc = job()
    doc["spec"]["pytorchReplicaSpecs"] = {}
    assert errors_of(doc) == [f"{JOB}: {SPECS} must have Master, Worker or both"]
    doc = worker_only(workers=0)  # the webhook: every non-Master type at least 1
    assert errors_of(doc) == [f"{JOB}: {SPECS}.Worker.replicas must be at least 1"]


@pytest.mark.parametrize("role", ["Chief", "PS", "master", "Evaluator"])
def test_only_master_and_worker_are_replica_types(role: str) -> None:
    doc = job()
    doc["spec"]["pytorchReplicaSpecs"][role] = doc["spec"]["pytorchReplicaSpecs"]["Worker"]
    assert errors_of(doc) == [
        f"{JOB}: {SPECS} {role!r} is not a PyTorchJob replica type (Master, Worker)"
    ]


@pytest.mark.parametrize("replicas", [None, 0, 2, 3])
def test_master_replicas_must_be_written_and_one(replicas: int | None) -> None:
    doc = job()
    if replicas is None:
        del doc["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"]
    else:
        doc["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = replicas
    assert errors_of(doc) == [f"{JOB}: {SPECS}.Master.replicas must be 1"]


def test_worker_replicas_default_to_one() -> None:
    doc = job()
    del doc["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"]
    parsed = M.parse_job(doc)
    assert parsed.replicas("Worker") == 1
    assert M.gang_of(parsed).role_counts() == {"master": 1, "worker": 1}
    # ... and the manifest keeps it unwritten
    assert "replicas" not in parsed.model_dump(exclude_unset=True)["spec"][
        "pytorchReplicaSpecs"]["Worker"]


def test_every_template_needs_a_container() -> None:
    doc = job()
    containers(doc, "Worker").clear()
    assert errors_of(doc) == [
        f"{JOB}: {SPECS}.Worker.template.spec.containers must list at least one container"
    ]


@pytest.mark.parametrize("image", [None, ""])
def test_every_container_needs_an_image(image: str | None) -> None:
    doc = job()
    sidecar = {"name": "sidecar", "image": image}
    if image is None:
        del sidecar["image"]
    containers(doc, "Worker").append(sidecar)
    assert errors_of(doc) == [
        f"{JOB}: {SPECS}.Worker.template.spec.containers[1].image is required"
    ]


def test_one_container_must_be_named_pytorch() -> None:
    doc = job()
    containers(doc, "Master")[0]["name"] = "trainer"
    assert errors_of(doc) == [
        f"{JOB}: {SPECS}.Master.template.spec.containers must have a container named pytorch"
    ]
    # any position will do
    doc = job()
    containers(doc, "Master").insert(0, {"name": "sidecar", "image": "busybox"})
    assert M.parse_job(doc).roles() == ("Master", "Worker")


def test_pytorch_container_may_not_hide_in_init_containers() -> None:
    doc = job()
    spec = doc["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    spec["initContainers"] = [dict(spec["containers"][0])]
    spec["containers"][0]["name"] = "main"
    assert errors_of(doc) == [
        f"{JOB}: {SPECS}.Worker.template.spec.containers must have a container named pytorch"
    ]


# --------------------------------------------------------------------------- metadata.name


@pytest.mark.parametrize("name", ["a", "pytorch-test", "a1", "x" * 63, "a-b-c-0"])
def test_dns_1035_names_are_accepted(name: str) -> None:
    doc = job()
    doc["metadata"]["name"] = name
    assert M.parse_job(doc).metadata.name == name


@pytest.mark.parametrize("name", ["0-test", "1abc", "-test", "test-", "a.b", "A", "x" * 64])
def test_names_that_are_not_dns_1035_labels(name: str) -> None:
    doc = job()
    doc["metadata"]["name"] = name
    assert errors_of(doc) == [
        f"PyTorchJob default/{name}: metadata.name {name!r} is not a DNS-1035 label (lowercase "
        "letters, digits and '-', starting with a letter, ending with a letter or digit, at "
        "most 63 characters)"
    ]


# --------------------------------------------------------------------------- elasticPolicy


def test_elastic_policy_with_every_upstream_field_is_accepted() -> None:
    elastic = {
        "minReplicas": 1,
        "maxReplicas": 4,
        "rdzvBackend": "c10d",
        "rdzvPort": 29400,
        "rdzvHost": "rdzv.default.svc",
        "rdzvId": "job-1",
        "rdzvConf": [{"key": "timeout", "value": "900"}],
        "standalone": False,
        "nProcPerNode": 8,
        "maxRestarts": 3,
        "metrics": [{"type": "Resource", "resource": {"name": "cpu"}}],
    }
    doc = worker_only(elasticPolicy=elastic)
    parsed = M.parse_job(copy.deepcopy(doc))
    assert parsed.spec.elasticPolicy is not None
    assert parsed.spec.elasticPolicy.rdzvBackend == "c10d"
    assert parsed.model_dump(mode="json", exclude_unset=True) == doc


def test_nproc_per_node_is_a_string() -> None:
    assert M.parse_job(worker_only(nprocPerNode="auto")).spec.nprocPerNode == "auto"
    assert errors_of(worker_only(nprocPerNode=8)) == [f"{JOB}: spec.nprocPerNode must be a string"]


def test_elastic_nproc_per_node_with_nproc_per_node_is_refused() -> None:
    ok = worker_only(elasticPolicy={"nProcPerNode": 2})
    assert M.parse_job(ok).spec.elasticPolicy is not None  # deprecated, a warning upstream
    doc = worker_only(elasticPolicy={"nProcPerNode": 2}, nprocPerNode="2")
    assert errors_of(doc) == [
        f"{JOB}: spec.elasticPolicy.nProcPerNode must not be used with spec.nprocPerNode"
    ]


def test_elastic_policy_needs_workers() -> None:
    doc = job()
    del doc["spec"]["pytorchReplicaSpecs"]["Worker"]
    doc["spec"]["elasticPolicy"] = {"minReplicas": 1}
    assert errors_of(doc) == [
        f"{JOB}: {SPECS}.Worker is required (must be configured if elasticPolicy is used)"
    ]
    doc = job()
    doc["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = 0
    doc["spec"]["elasticPolicy"] = {"minReplicas": 1}
    assert errors_of(doc) == [f"{JOB}: {SPECS}.Worker.replicas must be at least 1"]


def test_elastic_policy_fields_are_typed_and_known() -> None:
    assert errors_of(worker_only(elasticPolicy={"minReplicas": "1"})) == [
        f"{JOB}: spec.elasticPolicy.minReplicas must be an integer"
    ]
    assert errors_of(worker_only(elasticPolicy={"minReplica": 1})) == [
        f"{JOB}: spec.elasticPolicy.minReplica is not a known field"
    ]
    assert errors_of(worker_only(elasticPolicy={"maxReplicas": 2**31})) == [
        f"{JOB}: spec.elasticPolicy.maxReplicas must be <= 2147483647"
    ]


# --------------------------------------------------------------------------- runPolicy


def test_run_policy_with_every_upstream_field_is_accepted_and_kept() -> None:
    run_policy = {
        "cleanPodPolicy": "Running",
        "ttlSecondsAfterFinished": 600,
        "activeDeadlineSeconds": 3600,
        "backoffLimit": 3,
        "suspend": True,
        "managedBy": "kubeflow.org/training-operator",
        "schedulingPolicy": {
            "minAvailable": 2,
            "queue": "research",
            "minResources": {"cpu": "4", "nvidia.com/gpu": 1},
            "priorityClass": "high",
            "scheduleTimeoutSeconds": 60,
        },
    }
    doc = job()
    doc["spec"]["runPolicy"] = run_policy
    parsed = M.parse_job(copy.deepcopy(doc))
    assert parsed.model_dump(mode="json", exclude_unset=True) == doc
    assert parsed.active_deadline_seconds == 3600
    assert parsed.ttl_seconds_after_finished == 600
    assert parsed.suspend is True
    assert parsed.clean_pod_policy is M.CleanPodPolicy.RUNNING
    assert parsed.run_policy.backoffLimit == 3


def test_run_policy_accessors_default_like_upstream() -> None:
    parsed = M.parse_job(job())
    assert parsed.active_deadline_seconds is None
    assert parsed.ttl_seconds_after_finished is None
    assert parsed.suspend is False
    assert parsed.clean_pod_policy is M.CleanPodPolicy.NONE  # the operator's default
    assert parsed.scheduling_policy is None


@pytest.mark.parametrize("policy", ["None", "Running", "All"])
def test_clean_pod_policy_values(policy: str) -> None:
    doc = job()
    doc["spec"]["runPolicy"] = {"cleanPodPolicy": policy}
    assert M.parse_job(doc).clean_pod_policy == policy


@pytest.mark.parametrize("policy", ["Always", "none", ""])
def test_clean_pod_policy_is_any_string_as_in_the_crd(policy: str) -> None:
    """Upstream's CRD types cleanPodPolicy as a plain string (no enum) and its webhook does
    not check it: accepted, kept as written, and read as the default None."""
    doc = job()
    doc["spec"]["runPolicy"] = {"cleanPodPolicy": policy}
    parsed = M.parse_job(doc)
    assert parsed.run_policy.cleanPodPolicy == policy
    assert parsed.clean_pod_policy == "None"


def test_clean_pod_policy_must_be_a_string() -> None:
    doc = job()
    doc["spec"]["runPolicy"] = {"cleanPodPolicy": 1}
    assert errors_of(doc) == [f"{JOB}: spec.runPolicy.cleanPodPolicy must be a string"]


@pytest.mark.parametrize("value", ["kubeflow.org/training-operator", "kueue.x-k8s.io/multikueue"])
def test_managed_by_supported_values(value: str) -> None:
    doc = job()
    doc["spec"]["runPolicy"] = {"managedBy": value}
    assert M.parse_job(doc).run_policy.managedBy == value


@pytest.mark.parametrize("value", ["", "fleetq.io/scheduler", "kubeflow.org"])
def test_managed_by_other_values_are_refused(value: str) -> None:
    doc = job()
    doc["spec"]["runPolicy"] = {"managedBy": value}
    assert errors_of(doc) == [
        f"{JOB}: spec.runPolicy.managedBy {value!r} is not supported "
        "(kubeflow.org/training-operator, kueue.x-k8s.io/multikueue)"
    ]


@pytest.mark.parametrize(
    ("field", "value"),
    [("ttlSecondsAfterFinished", 0), ("ttlSecondsAfterFinished", -1),
     ("activeDeadlineSeconds", 0), ("activeDeadlineSeconds", -5), ("backoffLimit", -1),
     ("activeDeadlineSeconds", 2**40)],
)
def test_run_policy_has_no_minimums_upstream(field: str, value: int) -> None:
    # The v1 CRD types these fields (int32, activeDeadlineSeconds int64) and neither it nor
    # the webhook sets a minimum: we accept what the operator accepts.
    doc = job()
    doc["spec"]["runPolicy"] = {field: value}
    assert getattr(M.parse_job(doc).run_policy, field) == value


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("ttlSecondsAfterFinished", 2**31, "must be <= 2147483647"),
        ("backoffLimit", -(2**31) - 1, "must be >= -2147483648"),
        ("activeDeadlineSeconds", 2**63, "must be <= 9223372036854775807"),
        ("activeDeadlineSeconds", "60", "must be an integer"),
        ("activeDeadlineSeconds", 1.5, "must be an integer"),
        ("suspend", "true", "must be true or false"),
        ("suspend", 1, "must be true or false"),
        ("schedulingPolicy", [], "must be a mapping"),
        ("managedBy", 5, "must be a string"),
        ("activeDeadline", 5, "is not a known field"),
    ],
)
def test_run_policy_types(field: str, value: Any, message: str) -> None:
    doc = job()
    doc["spec"]["runPolicy"] = {field: value}
    assert errors_of(doc) == [f"{JOB}: spec.runPolicy.{field} {message}"]


def test_scheduling_policy_fields() -> None:
    doc = job()
    doc["spec"]["runPolicy"] = {"schedulingPolicy": {"minResources": {"cpu": "two"}}}
    assert errors_of(doc) == [
        f"{JOB}: spec.runPolicy.schedulingPolicy.minResources.cpu 'two' is not a quantity"
    ]
    doc["spec"]["runPolicy"] = {"schedulingPolicy": {"minAvailable": "2"}}
    assert errors_of(doc) == [
        f"{JOB}: spec.runPolicy.schedulingPolicy.minAvailable must be an integer"
    ]
    doc["spec"]["runPolicy"] = {"schedulingPolicy": {"priorityClassName": "high"}}
    assert errors_of(doc) == [
        f"{JOB}: spec.runPolicy.schedulingPolicy.priorityClassName is not a known field"
    ]


def test_legacy_spec_level_fields_are_still_kept_verbatim() -> None:
    # The walkthrough writes `spec.cleanPodPolicy` (RunPolicy was inlined in old v1
    # releases): kept and forwarded, not acted on.
    parsed = M.parse_job(job())
    assert parsed.model_dump(exclude_unset=True)["spec"]["cleanPodPolicy"] == "None"
    assert parsed.spec.runPolicy is None


# --------------------------------------------------------------------------- priority


def _with_priority_class_name(doc: dict[str, Any], name: str) -> dict[str, Any]:
    for spec in doc["spec"]["pytorchReplicaSpecs"].values():
        spec["template"]["spec"]["priorityClassName"] = name
    return doc


def test_scheduling_policy_priority_class_comes_first() -> None:
    doc = _with_priority_class_name(job(), "low")
    doc["spec"]["runPolicy"] = {"schedulingPolicy": {"priorityClass": "high"}}
    classes = {"high": 1000, "low": 10}
    assert M.job_priority(M.parse_job(doc), classes) == 1000
    assert M.gang_of(M.parse_job(doc), classes).priority == 1000
    # an unknown class is skipped, as for priorityClassName
    assert M.job_priority(M.parse_job(doc), {"low": 10}) == 10
    assert M.job_priority(M.parse_job(doc)) == 0


def test_priority_of_a_worker_only_job() -> None:
    doc = _with_priority_class_name(worker_only(), "low")
    assert M.job_priority(M.parse_job(doc), {"low": 7}) == 7


# --------------------------------------------------------------------------- gang minimum


def test_elastic_gang_minimum_is_master_plus_min_replicas() -> None:
    doc = job()
    doc["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = 4
    doc["spec"]["elasticPolicy"] = {"minReplicas": 2, "maxReplicas": 4, "rdzvBackend": "c10d"}
    parsed = M.parse_job(copy.deepcopy(doc))
    gang = M.gang_of(parsed)
    assert [p.name_suffix for p in gang.pods] == ["master-0", "worker-0", "worker-1"]
    assert gang.declared_role_counts() == {"master": 1, "worker": 4}
    assert gang.minimum_line() == "gang minimum 3 of 5 pods (elasticPolicy.minReplicas)"
    assert gang.is_minimum
    # quota holds the minimum: master cpu 10m + 2 workers x 2 cpu
    assert R.format_resources(M.quota_request(gang)) == (
        "cpu 4.01, memory 4Gi, kube-queue/max-jobs 1"
    )
    # the binding names what the member runs: the manifest as written
    assert M.binding_result("cluster-a", gang) == "{cluster-a:0,[{master 1} {worker 4}]}"
    # and the manifest is not rewritten
    assert parsed.model_dump(mode="json", exclude_unset=True) == doc


def test_min_available_is_the_pod_group_min_member() -> None:
    doc = job()
    doc["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = 4
    doc["spec"]["elasticPolicy"] = {"minReplicas": 3}
    doc["spec"]["runPolicy"] = {"schedulingPolicy": {"minAvailable": 2}}
    gang = M.gang_of(M.parse_job(doc))
    # minAvailable wins over elasticPolicy, as it does for the operator's PodGroup
    assert [p.name_suffix for p in gang.pods] == ["master-0", "worker-0"]
    assert gang.minimum_line() == "gang minimum 2 of 5 pods (schedulingPolicy.minAvailable)"


def test_min_available_takes_pods_by_priority_class_like_calc_pg_min_resources() -> None:
    doc = job()
    spec = doc["spec"]["pytorchReplicaSpecs"]
    spec["Worker"]["replicas"] = 3
    spec["Worker"]["template"]["spec"]["priorityClassName"] = "high"
    doc["spec"]["runPolicy"] = {"schedulingPolicy": {"minAvailable": 2}}
    gang = M.gang_of(M.parse_job(doc), {"high": 100})
    assert [p.name_suffix for p in gang.pods] == ["worker-0", "worker-1"]
    # without the class known, Master comes first
    gang = M.gang_of(M.parse_job(doc))
    assert [p.name_suffix for p in gang.pods] == ["master-0", "worker-0"]


def test_full_gang_has_no_minimum_source() -> None:
    gang = M.gang_of(M.parse_job(job()))
    assert not gang.is_minimum
    assert gang.minimum_line() == "gang of 3 pods (every replica)"
    # a minimum that is not smaller than the job is no minimum
    specs: list[dict[str, Any]] = [
        {"elasticPolicy": {}}, {"runPolicy": {"schedulingPolicy": {"minAvailable": 9}}}
    ]
    for spec in specs:
        doc = job()
        doc["spec"].update(spec)
        gang = M.gang_of(M.parse_job(doc))
        assert (gang.minimum_source, len(gang.pods)) == ("", 3)
        assert gang.minimum_line() == "gang of 3 pods (every replica)"
    master_only = job()
    del master_only["spec"]["pytorchReplicaSpecs"]["Worker"]
    assert M.gang_of(M.parse_job(master_only)).minimum_line() == "gang of 1 pod (every replica)"


def test_gang_built_without_a_manifest_counts_its_own_pods() -> None:
    pods = tuple(M.GangPod("worker", i, {"cpu": 1000}) for i in range(2))
    gang = M.Gang(pods, 0)
    assert gang.declared_role_counts() == {"worker": 2}
    assert M.binding_result("c", gang) == "{c:0,[{worker 2}]}"
    assert gang.minimum_line() == "gang of 2 pods (every replica)"


_declared = st.tuples(
    st.sampled_from([(("Master", 1), ("Worker", None)), (("Master", 1),), (("Worker", None),)]),
    st.integers(min_value=0, max_value=50),
).map(lambda t: [(r, t[1] if n is None else n) for r, n in t[0]])
_opt_int = st.none() | st.integers(min_value=-(2**31), max_value=2**31 - 1)
_small = st.none() | st.integers(min_value=-3, max_value=60)


@settings(max_examples=400, deadline=None)
@given(
    declared=_declared,
    min_available=_small | _opt_int,
    min_replicas=_small | _opt_int,
    max_replicas=_small,
    elastic=st.booleans(),
    worker_priority=st.integers(min_value=-5, max_value=5),
)
def test_gang_minimum_arithmetic(
    declared: list[tuple[str, int]],
    min_available: int | None,
    min_replicas: int | None,
    max_replicas: int | None,
    elastic: bool,
    worker_priority: int,
) -> None:
    got = M.gang_minimum(
        declared, min_available, min_replicas, max_replicas, elastic,
        {"Worker": worker_priority},
    )
    counts = dict(got.counts)
    have = dict(declared)
    total = sum(have.values())
    # never more pods of a role than declared, never a role the job lacks, never empty
    assert all(0 < counts[r] <= have.get(r, 0) for r in counts)
    assert [r for r, _ in got.counts] == [r for r, n in declared if r in counts]
    if total == 0:
        assert got.pods == 0
        return
    assert 1 <= got.pods <= total
    if min_available is not None:
        assert got.source == "schedulingPolicy.minAvailable"
        assert got.pods == min(max(min_available, 1), total)
        # pods come from the higher-priority role first (Master first on a tie)
        first = "Worker" if worker_priority > 0 and "Worker" in have else declared[0][0]
        assert counts.get(first, 0) == min(have[first], got.pods)
    elif elastic and have.get("Worker", 0) > 0:
        wanted = next((v for v in (min_replicas, max_replicas) if v is not None), have["Worker"])
        assert counts["Worker"] == min(max(wanted, 1), have["Worker"])
        assert counts.get("Master", 0) == have.get("Master", 0)
        assert got.source.startswith("elasticPolicy")
    else:
        assert counts == {r: n for r, n in have.items() if n}
        assert got.source == ""


@settings(max_examples=100, deadline=None)
@given(
    workers=st.integers(min_value=1, max_value=12),
    min_replicas=st.none() | st.integers(min_value=-2, max_value=15),
    min_available=st.none() | st.integers(min_value=-2, max_value=15),
    master=st.booleans(),
)
def test_gang_of_matches_gang_minimum_and_keeps_the_manifest(
    workers: int, min_replicas: int | None, min_available: int | None, master: bool
) -> None:
    doc = job() if master else worker_only()
    doc["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = workers
    doc["spec"]["elasticPolicy"] = {} if min_replicas is None else {"minReplicas": min_replicas}
    if min_available is not None:
        doc["spec"]["runPolicy"] = {"schedulingPolicy": {"minAvailable": min_available}}
    parsed = M.parse_job(copy.deepcopy(doc))
    gang = M.gang_of(parsed)
    expected = M.job_gang_minimum(parsed)
    assert tuple((r.capitalize(), n) for r, n in gang.role_counts().items()) == expected.counts
    assert gang.declared_pods == workers + (1 if master else 0)
    # pods are named by index from 0 within each role, as on the member
    for role, n in gang.role_counts().items():
        assert [p.index for p in gang.pods if p.role == role] == list(range(n))
    assert parsed.model_dump(mode="json", exclude_unset=True) == doc
    assert parsed.replicas("Worker") == workers


# --------------------------------------------------------------------------- YAML depth


def test_pyyaml_nesting_errors_become_our_line_whatever_their_wording() -> None:
    text = "a: " + "[" * 2000 + "]" * 2000 + "\n"
    mark = yaml.Mark("<unicode string>", 1003, 0, 1003, text, 1003)
    reworded = yaml.scanner.ScannerError("while scanning", mark, "too many levels", mark)
    assert MF._is_nesting_error(reworded, text)
    libyaml = yaml.scanner.ScannerError(
        "while increasing flow level", mark, "exceeded maximum nesting depth", mark
    )
    assert MF._is_nesting_error(libyaml, text)
    shallow = "a: [[1, 2]\n"
    other = yaml.parser.ParserError(
        "while parsing a flow sequence", yaml.Mark("m", 9, 0, 9, shallow, 9),
        "expected ',' or ']'", yaml.Mark("m", 10, 1, 0, shallow, 10),
    )
    assert not MF._is_nesting_error(other, shallow)
    assert MF.parse_manifest_text(shallow, "m.yaml").errors[0].endswith("(not valid YAML)")


@pytest.mark.parametrize("opener", ["[", "{a: "])
def test_deep_flow_nesting_gives_our_line_with_the_installed_pyyaml(opener: str) -> None:
    closer = "]" if opener == "[" else "}"
    text = "a: " + opener * 3000 + "1" + closer * 3000 + "\n"
    assert MF.parse_manifest_text(text, "m.yaml").errors == [
        "m.yaml: document 1: line 1: nested deeper than 64 levels"
    ]


# --------------------------------------------------------------------------- placement


def test_placement_copes_with_one_role_gangs_and_the_minimum() -> None:
    from fleetq.capacity import ClusterSnapshot, NodeCapacity
    from fleetq.placement import fits_node_by_node, place_gang

    gi = (1 << 30) * 1000
    small = ClusterSnapshot(
        "small", nodes=[NodeCapacity(f"n{i}", {"cpu": 4000, "memory": 8 * gi}) for i in range(2)]
    )
    master_only = job()
    del master_only["spec"]["pytorchReplicaSpecs"]["Worker"]
    assert fits_node_by_node(M.gang_of(M.parse_job(master_only)), small) == {"master-0": "n0"}
    # 4 workers of 2 cpu + 2Gi fill both nodes; 5 do not fit, but a minimum of 3 does
    elastic = worker_only(workers=5, elasticPolicy={"minReplicas": 3})
    full = worker_only(workers=5)
    assert isinstance(fits_node_by_node(M.gang_of(M.parse_job(full)), small), str)
    decision = place_gang(M.gang_of(M.parse_job(elastic)), [small])
    assert decision.best is not None
    assert sorted(decision.best.assignment) == ["worker-0", "worker-1", "worker-2"]


@pytest.mark.parametrize("loader", ["libyaml", "pure-python"])
def test_deep_nesting_line_with_either_pyyaml_loader(
    loader: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # PyYAML without libyaml has no nesting limit of its own: our walk stops at 64 levels.
    if loader == "pure-python":
        monkeypatch.setattr(MF, "_ManifestLoader", yaml.SafeLoader)
    elif not hasattr(yaml, "CSafeLoader"):
        pytest.skip("this PyYAML has no libyaml")
    text = "a: " + "[" * 10_000 + "]" * 10_000 + "\n"
    assert MF.parse_manifest_text(text, "m.yaml").errors == [
        "m.yaml: document 1: line 1: nested deeper than 64 levels"
    ]
