"""Manifest models: every rejection names the object and the field; gang extraction
matches what kube-scheduler and the walkthrough show."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetq import models as M
from fleetq import resources as R

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text())
    return doc


def errors_of(doc: Any) -> list[str]:
    with pytest.raises(M.ManifestErrors) as info:
        M.parse_object(doc)
    return [str(e) for e in info.value.errors]


def job() -> dict[str, Any]:
    return example("pytorch-test.yaml")


def policy() -> dict[str, Any]:
    return example("propagationpolicy-gang-queue.yaml")


def tree(root: dict[str, Any], namespace: str = "kube-system") -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.sigs.k8s.io/v1beta1",
        "kind": "ElasticQuotaTree",
        "metadata": {"name": "elasticquotatree", "namespace": namespace},
        "spec": {"root": root},
    }


def pod_spec(doc: dict[str, Any], role: str) -> dict[str, Any]:
    spec: dict[str, Any] = doc["spec"]["pytorchReplicaSpecs"][role]["template"]["spec"]
    return spec


TREE = "ElasticQuotaTree kube-system/elasticquotatree"
JOB = "PyTorchJob default/pytorch-test"
POLICY = "PropagationPolicy default/example-policy"


# --------------------------------------------------------------------------- walkthrough


def test_walkthrough_manifests_parse() -> None:
    t = M.parse_tree(example("elasticquotatree.yaml"))
    assert t.spec.root.children[0].namespaces == ["default"]
    assert t.spec.root.children[0].max_resources()[R.MAX_JOBS] == 1000
    assert M.parse_policy(policy()).queued
    assert not M.parse_policy(example("propagationpolicy-gang.yaml")).queued
    assert M.parse_job(job()).replicas("Worker") == 2


def test_walkthrough_gang_total_and_binding_result() -> None:
    gang = M.gang_of(M.parse_job(job()))
    assert [p.name_suffix for p in gang.pods] == ["master-0", "worker-0", "worker-1"]
    assert R.format_resources(gang.total) == "cpu 4.01, memory 4Gi"
    assert M.binding_result("cluster-a", gang) == "{cluster-a:0,[{master 1} {worker 2}]}"
    assert M.quota_request(gang)[R.MAX_JOBS] == R.MILLI
    assert gang.priority == 0


# --------------------------------------------------------------------------- ElasticQuotaTree


def test_tree_outside_kube_system() -> None:
    doc = example("elasticquotatree.yaml")
    doc["metadata"]["namespace"] = "default"
    assert errors_of(doc) == [
        "ElasticQuotaTree default/elasticquotatree: metadata.namespace must be kube-system "
        "(ElasticQuotaTree is only read there), got 'default'"
    ]


def test_tree_duplicate_node_names() -> None:
    doc = tree(
        {"name": "root", "children": [{"name": "a"}, {"name": "b", "children": [{"name": "a"}]}]}
    )
    assert errors_of(doc) == [
        f"{TREE}: spec.root.children[1].children[0].name 'a' is used twice "
        "(also at spec.root.children[0])"
    ]


def test_tree_namespace_on_two_leaves() -> None:
    doc = tree(
        {
            "name": "root",
            "children": [
                {"name": "a", "namespaces": ["team"]},
                {"name": "b", "namespaces": ["team"]},
            ],
        }
    )
    assert errors_of(doc) == [
        f"{TREE}: spec.root.children[1].namespaces namespace 'team' is already on leaf 'a'"
    ]


def test_tree_namespace_on_non_leaf() -> None:
    doc = tree({"name": "root", "namespaces": ["team"], "children": [{"name": "a"}]})
    assert errors_of(doc) == [
        f"{TREE}: spec.root.namespaces namespaces attach to leaves only; 'root' has children"
    ]


def test_tree_children_min_exceeds_parent_min() -> None:
    doc = tree(
        {
            "name": "root",
            "min": {"cpu": 10},
            "max": {"cpu": 100},
            "children": [{"name": "a", "min": {"cpu": 6}}, {"name": "b", "min": {"cpu": "6000m"}}],
        }
    )
    assert errors_of(doc) == [
        f"{TREE}: spec.root.children the children's min cpu 12 exceeds 'root' min cpu 10"
    ]


def test_child_max_may_exceed_parent_max() -> None:
    doc = tree({"name": "root", "max": {"cpu": 1}, "children": [{"name": "a", "max": {"cpu": 5}}]})
    assert M.parse_tree(doc).spec.root.children[0].max_resources() == {"cpu": 5000}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("-1", "'-1' must not be negative"),
        (-3, "'-3' must not be negative"),
        ("lots", "'lots' is not a quantity"),
        ("1e400", "'1e400' is too large"),
        ([1], "[1] is not a quantity"),
        (True, "True is not a quantity"),
        (10**400, f"'{str(10**400)[:64]}' is too large"),
    ],
)
def test_tree_bad_quantity(value: Any, message: str) -> None:
    doc = tree({"name": "root", "max": {"cpu": value}})
    assert errors_of(doc) == [f"{TREE}: spec.root.max.cpu {message}"]


def test_tree_bad_resource_name_and_map() -> None:
    assert errors_of(tree({"name": "root", "min": {"c p u": 1}})) == [
        f"{TREE}: spec.root.min has an invalid resource name 'c p u'"
    ]
    assert errors_of(tree({"name": "root", "min": "4 cpus"})) == [
        f"{TREE}: spec.root.min must be a mapping of resource name to quantity"
    ]


def test_tree_min_greater_than_max() -> None:
    doc = tree(
        {"name": "root", "children": [{"name": "a", "min": {"cpu": 20}, "max": {"cpu": 10}}]}
    )
    assert errors_of(doc) == [f"{TREE}: spec.root.children[0].min.cpu 20 exceeds max.cpu 10"]


def test_tree_node_names_and_namespaces_are_checked() -> None:
    assert errors_of(tree({"name": "root\n"})) == [
        f"{TREE}: spec.root.name 'root\\n' is not a valid quota node name (letters, digits, "
        "'-', '_', '.'; at most 63 characters)"
    ]
    assert errors_of(tree({"name": "root", "namespaces": ["Team_A"]})) == [
        f"{TREE}: spec.root.namespaces[0] 'Team_A' is not a valid Kubernetes name "
        "(lowercase letters, digits, '-')"
    ]


def test_tree_unknown_field_is_an_error() -> None:
    assert errors_of(tree({"name": "root", "maxx": {"cpu": 1}})) == [
        f"{TREE}: spec.root.maxx is not a known field"
    ]


def test_quota_node_spec_helpers() -> None:
    node = M.QuotaNodeSpec(name="a", min={"cpu": "1500m"}, max={"memory": "1Gi"})
    assert node.min_resources() == {"cpu": 1500}
    assert node.max_resources() == {"memory": (1 << 30) * 1000}
    with pytest.raises(ValueError, match="min.cpu 2 exceeds max.cpu 1"):
        M.QuotaNodeSpec(name="a", min={"cpu": 2}, max={"cpu": 1})


# --------------------------------------------------------------------------- PyTorchJob


def test_job_negative_replicas() -> None:
    doc = job()
    doc["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = -1  # the webhook's rule
    assert errors_of(doc) == [f"{JOB}: spec.pytorchReplicaSpecs.Worker.replicas must be at least 1"]


@pytest.mark.parametrize("value", ["2", 2.0, True, 10**30])
def test_job_replicas_must_be_a_sane_integer(value: Any) -> None:
    doc = job()
    doc["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = value
    expected = "must be <= 10000" if value == 10**30 else "must be an integer"
    assert errors_of(doc) == [f"{JOB}: spec.pytorchReplicaSpecs.Worker.replicas {expected}"]


@pytest.mark.parametrize("missing", ["Master", "Worker"])
def test_job_may_have_master_or_worker_alone(missing: str) -> None:
    # Upstream accepts a Master-only job (a single-node run) and a Worker-only job.
    doc = job()
    del doc["spec"]["pytorchReplicaSpecs"][missing]
    parsed = M.parse_job(doc)
    kept = "Worker" if missing == "Master" else "Master"
    assert parsed.roles() == (kept,)
    assert parsed.replicas(missing) == 0
    gang = M.gang_of(parsed)
    assert list(gang.role_counts()) == [kept.lower()]
    assert M.binding_result("cluster-a", gang) == (
        "{cluster-a:0,[{worker 2}]}" if kept == "Worker" else "{cluster-a:0,[{master 1}]}"
    )


def test_job_unknown_role_and_master_count() -> None:
    doc = job()
    doc["spec"]["pytorchReplicaSpecs"]["Chief"] = {}
    assert errors_of(doc) == [
        f"{JOB}: spec.pytorchReplicaSpecs 'Chief' is not a PyTorchJob replica type (Master, Worker)"
    ]
    doc = job()
    doc["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 2
    assert errors_of(doc) == [f"{JOB}: spec.pytorchReplicaSpecs.Master.replicas must be 1"]


def test_job_bad_container_quantity_names_the_field() -> None:
    doc = job()
    pod_spec(doc, "Worker")["containers"][0]["resources"]["requests"]["memory"] = "2 GB"
    assert errors_of(doc) == [
        f"{JOB}: spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].resources.requests"
        ".memory '2 GB' is not a quantity"
    ]
    doc = job()
    pod_spec(doc, "Worker")["containers"][0]["resources"]["limits"] = ["cpu"]
    assert errors_of(doc) == [
        f"{JOB}: spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].resources.limits "
        "must be a mapping of resource name to quantity"
    ]
    doc = job()
    pod_spec(doc, "Master")["overhead"] = {"cpu": "-5"}
    assert errors_of(doc) == [
        f"{JOB}: spec.pytorchReplicaSpecs.Master.template.spec.overhead.cpu '-5' must not be "
        "negative"
    ]


def test_job_without_containers() -> None:
    doc = job()
    pod_spec(doc, "Master")["containers"] = []
    assert errors_of(doc) == [
        f"{JOB}: spec.pytorchReplicaSpecs.Master.template.spec.containers must list at least "
        "one container"
    ]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("Pytorch-Test", "'Pytorch-Test' is not a DNS-1035 label"),
        ("pytorch.test", "'pytorch.test' is not a DNS-1035 label"),
        ("0-test", "'0-test' is not a DNS-1035 label"),
        ("test-", "'test-' is not a DNS-1035 label"),
        ("jöb", "'jöb' is not a DNS-1035 label"),
        ("x" * 64, f"'{'x' * 64}' is not a DNS-1035 label"),
    ],
)
def test_job_names(name: str, message: str) -> None:
    doc = job()
    doc["metadata"]["name"] = name
    (line,) = errors_of(doc)
    assert line.startswith(f"PyTorchJob default/{name}: metadata.name {message}")


def test_messages_stay_on_one_line() -> None:
    doc = job()
    doc["metadata"]["name"] = "evil\nname"
    (line,) = errors_of(doc)
    assert "\n" not in line
    assert line.startswith("PyTorchJob default/evil\\nname: metadata.name")


def test_pod_template_unknown_fields_are_kept_verbatim() -> None:
    doc = job()
    pod_spec(doc, "Worker")["futureField"] = {"x": [1, {"y": None}]}
    doc["spec"]["runPolicy"] = {"backoffLimit": 3}
    parsed = M.parse_job(copy.deepcopy(doc))
    assert parsed.model_dump(mode="json", exclude_unset=True) == doc


def test_unknown_top_level_field_is_an_error() -> None:
    doc = job()
    doc["spce"] = {}
    assert errors_of(doc) == [f"{JOB}: spce is not a known field"]


def test_unsupported_kind_and_api_version() -> None:
    assert errors_of({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}) == [
        "Pod default/p: kind 'Pod' is not supported (one of ElasticQuotaTree, "
        "PropagationPolicy, ClusterPropagationPolicy, PyTorchJob, PriorityClass)"
    ]
    doc = job()
    doc["apiVersion"] = "kubeflow.org/v2"
    assert errors_of(doc) == [f"{JOB}: apiVersion must be one of 'kubeflow.org/v1'"]


# --------------------------------------------------------------------------- PropagationPolicy


def test_policy_without_resource_selectors() -> None:
    doc = policy()
    del doc["spec"]["resourceSelectors"]
    assert errors_of(doc) == [f"{POLICY}: spec.resourceSelectors is required"]
    doc["spec"]["resourceSelectors"] = []
    assert errors_of(doc) == [f"{POLICY}: spec.resourceSelectors must not be empty"]


def test_policy_negative_toleration_seconds() -> None:
    doc = policy()
    doc["spec"]["failover"]["application"]["decisionConditions"]["tolerationSeconds"] = -1
    assert errors_of(doc) == [
        f"{POLICY}: spec.failover.application.decisionConditions.tolerationSeconds must be >= 0"
    ]


def test_policy_unknown_purge_mode() -> None:
    doc = policy()
    doc["spec"]["failover"]["application"]["purgeMode"] = "Sometimes"
    assert errors_of(doc) == [
        f"{POLICY}: spec.failover.application.purgeMode 'Sometimes' is not a purgeMode "
        "(Immediately|Graciously|Never or Directly|Gracefully|Never)"
    ]


@pytest.mark.parametrize(
    ("written", "mode"),
    [
        ("Immediately", M.PurgeMode.DIRECTLY),
        ("Directly", M.PurgeMode.DIRECTLY),
        ("Graciously", M.PurgeMode.GRACEFULLY),
        ("Gracefully", M.PurgeMode.GRACEFULLY),
        ("Never", M.PurgeMode.NEVER),
    ],
)
def test_policy_purge_mode_spellings(written: str, mode: M.PurgeMode) -> None:
    doc = policy()
    doc["spec"]["failover"]["application"]["purgeMode"] = written
    failover = M.parse_policy(doc).application_failover
    assert failover is not None and failover.purgeMode is mode


@pytest.mark.parametrize(
    "api_version", ["policy.one.alibabacloud.com/v1alpha1", "policy.karmada.io/v1alpha1"]
)
def test_policy_api_versions(api_version: str) -> None:
    doc = policy()
    doc["apiVersion"] = api_version
    parsed = M.parse_policy(doc)
    assert parsed.apiVersion == api_version
    failover = parsed.application_failover
    assert failover is not None
    assert failover.decisionConditions.tolerationSeconds == 30


def test_policy_defaults() -> None:
    doc = policy()
    doc["spec"]["failover"]["application"] = {}
    # the CRD requires decisionConditions (ApplicationFailoverBehavior, +required)
    assert errors_of(doc) == [
        f"{POLICY}: spec.failover.application.decisionConditions is required"
    ]
    doc["spec"]["failover"]["application"] = {"decisionConditions": {}}
    failover = M.parse_policy(doc).application_failover
    assert failover is not None
    assert failover.decisionConditions.tolerationSeconds == 300
    assert failover.purgeMode is M.PurgeMode.GRACEFULLY
    assert failover.grace_seconds == 600


def test_grace_period_only_with_gracefully() -> None:
    doc = policy()
    doc["spec"]["failover"]["application"]["gracePeriodSeconds"] = 60
    assert errors_of(doc) == [
        f"{POLICY}: spec.failover.application.gracePeriodSeconds only applies to purgeMode "
        "Gracefully (Graciously), not Directly"
    ]
    doc["spec"]["failover"]["application"]["purgeMode"] = "Graciously"
    failover = M.parse_policy(doc).application_failover
    assert failover is not None and failover.grace_seconds == 60


def test_policy_unknown_scheduling_field_is_an_error() -> None:
    doc = policy()
    doc["spec"]["placement"]["clusterAfinity"] = {"clusterNames": ["a"]}
    assert errors_of(doc) == [f"{POLICY}: spec.placement.clusterAfinity is not a known field"]


def test_policy_strict_types() -> None:
    doc = policy()
    doc["spec"]["suspension"]["scheduling"] = "yes"
    assert errors_of(doc) == [f"{POLICY}: spec.suspension.scheduling must be true or false"]


def test_cluster_toleration_rules() -> None:
    """Karmada checks only the operator of a cluster toleration
    (pkg/util/validation/validation.go validateClusterTolerations: Lt and Gt refused); the
    core/v1 pod rules (value empty with Exists, key needs Exists) are not applied, and
    matching follows ToleratesTaint."""
    doc = policy()
    doc["spec"]["placement"]["clusterTolerations"] = [
        {"operator": "Equal", "value": "x"},
        {"key": "k", "operator": "Exists", "value": "v"},
        {"key": "k", "operator": "", "effect": "NoSchedule"},
    ]
    assert len(M.parse_policy(doc).spec.placement.clusterTolerations) == 3
    for op in ("Lt", "Gt"):
        doc["spec"]["placement"]["clusterTolerations"] = [{"key": "k", "operator": op}]
        assert errors_of(doc) == [
            f"{POLICY}: spec.placement.clusterTolerations[0].operator '{op}' is not supported "
            'for cluster tolerations ("", Exists or Equal)'
        ]


def test_label_selector_matches() -> None:
    sel = M.LabelSelector.model_validate(
        {
            "matchLabels": {"region": "eu"},
            "matchExpressions": [
                {"key": "gpu", "operator": "In", "values": ["a100", "h100"]},
                {"key": "spot", "operator": "DoesNotExist"},
                {"key": "tier", "operator": "NotIn", "values": ["dev"]},
            ],
        }
    )
    assert sel.matches({"region": "eu", "gpu": "a100"})
    assert sel.matches({"region": "eu", "gpu": "h100", "tier": "prod"})
    assert not sel.matches({"region": "us", "gpu": "a100"})
    assert not sel.matches({"region": "eu", "gpu": "t4"})
    assert not sel.matches({"region": "eu", "gpu": "a100", "spot": "true"})
    assert not sel.matches({"region": "eu", "gpu": "a100", "tier": "dev"})
    assert M.LabelSelector().matches({})


def test_label_selector_values_rules() -> None:
    doc = policy()
    doc["spec"]["placement"]["clusterAffinity"] = {
        "labelSelector": {"matchExpressions": [{"key": "gpu", "operator": "In"}]}
    }
    assert errors_of(doc) == [
        f"{POLICY}: spec.placement.clusterAffinity.labelSelector.matchExpressions[0].values must "
        "not be empty for operator In"
    ]


def test_cluster_affinity_allows() -> None:
    aff = M.ClusterAffinity(
        clusterNames=["a", "b"],
        exclude=["b"],
        labelSelector=M.LabelSelector(matchLabels={"env": "prod"}),
    )
    assert aff.allows("a", {"env": "prod"})
    assert not aff.allows("b", {"env": "prod"})  # excluded
    assert not aff.allows("c", {"env": "prod"})  # not listed
    assert not aff.allows("a", {"env": "dev"})  # labels do not match
    assert M.ClusterAffinity().allows("anything", {})


# --------------------------------------------------------------------------- gang extraction


def _job_with(master: dict[str, Any], workers: int = 1) -> M.PyTorchJob:
    doc = job()
    doc["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"] = master
    doc["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = workers
    return M.parse_job(doc)


def _container(
    name: str,
    requests: dict[str, Any] | None = None,
    limits: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if requests is not None:
        resources["requests"] = requests
    if limits is not None:
        resources["limits"] = limits
    return {"name": name, "image": "x", "resources": resources, **extra}


def test_requests_default_to_limits() -> None:
    spec = {
        "containers": [
            _container("a", limits={"cpu": "2", "nvidia.com/gpu": 1}, requests={"cpu": "500m"})
        ]
    }
    assert M.pod_requests(spec) == {"cpu": 500, "nvidia.com/gpu": 1000}
    only_limits = {"containers": [_container("a", limits={"memory": "1Gi"})]}
    assert M.pod_requests(only_limits) == {"memory": (1 << 30) * 1000}


def test_init_containers_take_the_max() -> None:
    spec = {
        "containers": [
            _container("a", requests={"cpu": "1", "memory": "1Gi"}),
            _container("b", requests={"cpu": "1"}),
        ],
        "initContainers": [
            _container("i1", requests={"cpu": "4", "memory": "100Mi"}),
            _container("i2", requests={"cpu": "3"}),
        ],
    }
    # cpu: max(1+1, 4, 3) = 4; memory: max(1Gi, 100Mi) = 1Gi
    assert R.format_resources(M.pod_requests(spec)) == "cpu 4, memory 1Gi"


def test_sidecar_init_containers_add_up() -> None:
    spec = {
        "containers": [_container("a", requests={"cpu": "1"})],
        "initContainers": [
            _container("sidecar", requests={"cpu": "500m"}, restartPolicy="Always"),
            _container("setup", requests={"cpu": "2"}),
        ],
    }
    # running: 1 + 0.5 sidecar; during setup: 2 + 0.5 sidecar -> 2.5
    assert M.pod_requests(spec) == {"cpu": 2500}


def test_overhead_is_added() -> None:
    spec = {
        "containers": [_container("a", requests={"cpu": "1"})],
        "overhead": {"cpu": "250m", "memory": "120Mi"},
    }
    assert R.format_resources(M.pod_requests(spec)) == "cpu 1.25, memory 120Mi"


def test_gang_counts_every_replica_and_keeps_placement_constraints() -> None:
    spec = {
        "containers": [_container("pytorch", requests={"nvidia.com/gpu": 8})],
        "nodeSelector": {"pool": "a100"},
        "tolerations": [{"key": "gpu", "operator": "Exists"}],
    }
    gang = M.gang_of(_job_with(spec, workers=3))
    assert gang.role_counts() == {"master": 1, "worker": 3}
    master = gang.pods[0]
    assert master.node_selector == {"pool": "a100"}
    assert master.tolerations == ({"key": "gpu", "operator": "Exists"},)
    assert gang.total[R.GPU] == 8000


def test_priority_from_priority_class_else_spec_else_zero() -> None:
    with_class = {"containers": [_container("pytorch")], "priorityClassName": "high", "priority": 5}
    assert M.gang_of(_job_with(with_class), {"high": 1000}).priority == 1000
    # The class is unknown here: the pod's own priority is used.
    assert M.gang_of(_job_with(with_class)).priority == 5
    negative = {"containers": [_container("pytorch")], "priority": -3}
    assert M.gang_of(_job_with(negative)).priority == -3
    assert M.gang_of(_job_with({"containers": [_container("pytorch")]})).priority == 0
    builtin = {"containers": [_container("pytorch")], "priorityClassName": "system-node-critical"}
    assert M.job_priority(_job_with(builtin)) == 2_000_001_000


def test_priority_class_model() -> None:
    pc = M.parse_object(
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": "high"},
            "value": 1000,
        }
    )
    assert isinstance(pc, M.PriorityClass) and pc.value == 1000
    assert errors_of(
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": "x"},
            "value": 2_000_000_000,
        }
    ) == ["PriorityClass x: value must be <= 1000000000"]


# --------------------------------------------------------------------------- robustness

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


def _mutations() -> st.SearchStrategy[dict[str, Any]]:
    """Walkthrough objects with one value somewhere replaced by arbitrary JSON."""

    def mutate(doc: dict[str, Any], path_choice: int, value: Any) -> dict[str, Any]:
        spots: list[tuple[Any, Any]] = []

        def walk(node: Any) -> None:
            if isinstance(node, dict):
                for k in node:
                    spots.append((node, k))
                    walk(node[k])
            elif isinstance(node, list):
                for i in range(len(node)):
                    spots.append((node, i))
                    walk(node[i])

        walk(doc)
        parent, key = spots[path_choice % len(spots)]
        parent[key] = value
        return doc

    docs = st.sampled_from(
        ["elasticquotatree.yaml", "propagationpolicy-gang-queue.yaml", "pytorch-test.yaml"]
    ).map(example)
    return st.builds(mutate, docs, st.integers(min_value=0, max_value=10_000), _json)


@settings(max_examples=200, deadline=None)
@given(_mutations())
def test_any_mutation_is_accepted_or_reported_on_one_line(doc: dict[str, Any]) -> None:
    try:
        obj = M.parse_object(doc)
    except M.ManifestErrors as exc:
        assert exc.errors
        for err in exc.errors:
            line = str(err)
            assert "\n" not in line
            assert line.startswith(err.ref + ": ")
        return
    if isinstance(obj, M.PyTorchJob):
        M.gang_of(obj)  # a valid job always yields a gang
