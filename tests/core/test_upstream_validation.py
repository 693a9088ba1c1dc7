"""One case per upstream rule, with upstream's verdict: fleetq accepts exactly what the
peers accept (with one warning line per field it does not act on) and refuses what they
refuse, in its one-line form naming the object and the field.

Sources (read at these versions; facts only):

* ``TO``: kubeflow/training-operator release-1.9, ``pkg/webhooks/pytorch/
  pytorchjob_webhook.go`` (``validatePyTorchJob``, ``validateSpec``,
  ``validatePyTorchReplicaSpecs``), ``pkg/common/util/webhooks.go``
  (``ValidateRunPolicy``) and the CRD ``manifests/base/crds/kubeflow.org_pytorchjobs.yaml``.
* ``KV``: karmada-io/karmada release-1.18, ``pkg/util/validation/validation.go``
  (``ValidatePropagationSpec`` and the functions it calls); ``KM``: the mutating webhook
  ``pkg/webhook/propagationpolicy/mutating.go`` with ``pkg/util/helper/policy.go`` (its
  defaults run before validation); ``KC``: the CRD
  ``charts/karmada/_crds/bases/policy/policy.karmada.io_propagationpolicies.yaml`` from
  ``pkg/apis/policy/v1alpha1/propagation_types.go``.
* ``KQ``: koordinator-sh/koord-queue ``pkg/framework/apis/elasticquota/scheduling/
  v1beta1/types.go`` (``ElasticQuotaSpec``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetq import models as M

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
JOB = "PyTorchJob default/pytorch-test"
POLICY = "PropagationPolicy default/example-policy"
TREE = "ElasticQuotaTree kube-system/elasticquotatree"
SPECS = "spec.pytorchReplicaSpecs"
PL = "spec.placement"
APP = "spec.failover.application"
NOT_USED = "accepted, not used by fleetq"
ONE_CLUSTER = f"{NOT_USED} (a gang goes to one cluster)"

Doc = dict[str, Any]


def _load(name: str) -> Doc:
    doc: Doc = yaml.safe_load((EXAMPLES / name).read_text())
    return doc


def _pod(doc: Doc, role: str = "Worker") -> Doc:
    spec: Doc = doc["spec"]["pytorchReplicaSpecs"][role]["template"]["spec"]
    return spec


def _placement(doc: Doc, **fields: Any) -> None:
    doc["spec"]["placement"].update(fields)


def _app(doc: Doc, **fields: Any) -> None:
    doc["spec"]["failover"]["application"].update(fields)


@dataclass(frozen=True)
class Case:
    id: str
    base: str  # "job" | "policy" | "tree"
    mutate: Callable[[Doc], Any]
    verdict: str  # upstream's: "accepted" | "refused"
    #: refused: the one line fleetq prints; accepted: the warning lines, in order
    lines: tuple[str, ...]
    cite: str

    def doc(self) -> Doc:
        doc = copy.deepcopy(BASES[self.base]())
        self.mutate(doc)
        return doc


def _tree() -> Doc:
    return _load("elasticquotatree.yaml")


BASES: dict[str, Callable[[], Doc]] = {
    "job": lambda: _load("pytorch-test.yaml"),
    "policy": lambda: _load("propagationpolicy-gang.yaml"),
    "tree": _tree,
}


def _set(path: str, value: Any) -> Callable[[Doc], None]:
    def go(doc: Doc) -> None:
        *head, last = path.split(".")
        at = doc
        for part in head:
            at = at.setdefault(part, {})
        at[last] = value
    return go


def _worker(**fields: Any) -> Callable[[Doc], None]:
    return lambda d: d["spec"]["pytorchReplicaSpecs"]["Worker"].update(fields)


def _two_pytorch_containers(doc: Doc) -> None:
    containers = _pod(doc)["containers"]
    containers.append({**containers[0], "image": "other:1"})


def _two_env(doc: Doc) -> None:
    _pod(doc)["containers"][0]["env"] = [{"name": "A", "value": "1"}, {"name": "A"}]


def _same_name_in_init(doc: Doc) -> None:
    c = _pod(doc)["containers"][0]
    _pod(doc)["initContainers"] = [{"name": c["name"], "image": "init:1"}]


def _without_pytorch(doc: Doc) -> None:
    _pod(doc)["containers"][0]["name"] = "trainer"


def _elastic_without_worker(doc: Doc) -> None:
    del doc["spec"]["pytorchReplicaSpecs"]["Worker"]
    doc["spec"]["elasticPolicy"] = {"minReplicas": 1}


def _worker_only_elastic(**elastic: Any) -> Callable[[Doc], None]:
    def go(doc: Doc) -> None:
        del doc["spec"]["pytorchReplicaSpecs"]["Master"]
        doc["spec"]["elasticPolicy"] = elastic
    return go


def _group(name: str, **affinity: Any) -> Doc:
    return {"affinityName": name, **affinity}


def _attributes(doc: Doc) -> None:
    doc["spec"]["root"]["children"][0]["attributes"] = {"team": "vision"}


CASES: list[Case] = [
    # ------------------------------------------------------------------ PyTorchJob
    Case("worker replicas 0 beside a Master", "job", _worker(replicas=0), "refused",
         (f"{JOB}: {SPECS}.Worker.replicas must be at least 1",),
         "TO validatePyTorchReplicaSpecs: non-Master replicas < 1 forbidden"),
    Case("worker replicas -1", "job", _worker(replicas=-1), "refused",
         (f"{JOB}: {SPECS}.Worker.replicas must be at least 1",),
         "TO validatePyTorchReplicaSpecs"),
    Case("worker replicas unset (defaults to 1)", "job",
         lambda d: d["spec"]["pytorchReplicaSpecs"]["Worker"].pop("replicas"), "accepted", (),
         "TO validatePyTorchReplicaSpecs: only a written Worker.replicas is checked"),
    Case("master replicas 2", "job",
         lambda d: d["spec"]["pytorchReplicaSpecs"]["Master"].update(replicas=2), "refused",
         (f"{JOB}: {SPECS}.Master.replicas must be 1",), "TO validatePyTorchReplicaSpecs"),
    Case("master replicas unset", "job",
         lambda d: d["spec"]["pytorchReplicaSpecs"]["Master"].pop("replicas"), "refused",
         (f"{JOB}: {SPECS}.Master.replicas must be 1",),
         "TO validatePyTorchReplicaSpecs: Replicas == nil is forbidden for Master"),
    Case("replica type Chief", "job",
         lambda d: d["spec"]["pytorchReplicaSpecs"].update(Chief={}), "refused",
         (f"{JOB}: {SPECS} 'Chief' is not a PyTorchJob replica type (Master, Worker)",),
         "TO validatePyTorchReplicaSpecs: validRoleTypes"),
    Case("container without image", "job",
         lambda d: _pod(d)["containers"][0].pop("image"), "refused",
         (f"{JOB}: {SPECS}.Worker.template.spec.containers[0].image is required",),
         "TO validatePyTorchReplicaSpecs: image must be required"),
    Case("no container named pytorch", "job", _without_pytorch, "refused",
         (f"{JOB}: {SPECS}.Worker.template.spec.containers must have a container named "
          "pytorch",), "TO validatePyTorchReplicaSpecs: defaultContainerPresent"),
    Case("two containers with the same name", "job", _two_pytorch_containers, "refused",
         (f"{JOB}: {SPECS}.Worker.template.spec.containers[1] duplicates containers[0] "
          "(name 'pytorch'); the CRD keys this list by name",),
         "TO CRD: containers x-kubernetes-list-type map, list-map-keys [name]"),
    Case("two env vars with the same name", "job", _two_env, "refused",
         (f"{JOB}: {SPECS}.Worker.template.spec.containers[0].env[1] duplicates "
          "containers[0].env[0] (name 'A'); the CRD keys this list by name",),
         "TO CRD: env x-kubernetes-list-map-keys [name]"),
    Case("an init container named like a container", "job", _same_name_in_init, "accepted",
         (), "TO CRD: each list is keyed on its own (the kubelet's pod rules come later)"),
    Case("name not a DNS-1035 label", "job", _set("metadata.name", "1-job"), "refused",
         ("PyTorchJob default/1-job: metadata.name '1-job' is not a DNS-1035 label "
          "(lowercase letters, digits and '-', starting with a letter, ending with a letter "
          "or digit, at most 63 characters)",),
         "TO validatePyTorchJob: NameIsDNS1035Label"),
    Case("elasticPolicy without Worker", "job", _elastic_without_worker, "refused",
         (f"{JOB}: {SPECS}.Worker is required (must be configured if elasticPolicy is "
          "used)",), "TO validateSpec: Worker must be configured if elastic policy is used"),
    Case("elasticPolicy.nProcPerNode with nprocPerNode", "job",
         lambda d: (_worker_only_elastic(nProcPerNode=2)(d),
                    d["spec"].update(nprocPerNode="2")), "refused",
         (f"{JOB}: spec.elasticPolicy.nProcPerNode must not be used with spec.nprocPerNode",),
         "TO validateSpec: Forbidden must not be used with spec.nprocPerNode"),
    Case("elasticPolicy.nProcPerNode alone (deprecated)", "job",
         _worker_only_elastic(nProcPerNode=2), "accepted",
         (f"{JOB}: spec.elasticPolicy.nProcPerNode is deprecated, use spec.nprocPerNode "
          "instead",), "TO validateSpec: admission warning"),
    Case("runPolicy.managedBy another controller", "job",
         _set("spec.runPolicy.managedBy", "example.com/mine"), "refused",
         (f"{JOB}: spec.runPolicy.managedBy 'example.com/mine' is not supported "
          "(kubeflow.org/training-operator, kueue.x-k8s.io/multikueue)",),
         "TO webhooks.go ValidateRunPolicy: supportedJobControllers"),
    Case("runPolicy.managedBy MultiKueue", "job",
         _set("spec.runPolicy.managedBy", "kueue.x-k8s.io/multikueue"), "accepted", (),
         "TO webhooks.go ValidateRunPolicy"),
    # ------------------------------------------------------------------ failover
    Case("application failover without propagateDeps", "policy",
         lambda d: d["spec"].update(propagateDeps=False), "refused",
         (f"{POLICY}: spec.propagateDeps must be true when {APP} is set",),
         "KV ValidatePropagationSpec: application failover is set, propagateDeps must be "
         "true"),
    Case("Gracefully with gracePeriodSeconds 0", "policy",
         lambda d: _app(d, purgeMode="Gracefully", gracePeriodSeconds=0), "refused",
         (f"{POLICY}: {APP}.gracePeriodSeconds must be greater than 0",),
         "KV ValidateApplicationFailover: must be greater than 0"),
    Case("Graciously with gracePeriodSeconds -5", "policy",
         lambda d: _app(d, purgeMode="Graciously", gracePeriodSeconds=-5), "refused",
         (f"{POLICY}: {APP}.gracePeriodSeconds must be greater than 0",),
         "KV ValidateApplicationFailover"),
    Case("Gracefully without gracePeriodSeconds (defaulted to 600)", "policy",
         lambda d: _app(d, purgeMode="Gracefully"), "accepted", (),
         "KM SetDefaultGracePeriodSeconds fills 600 before KV's 'should not be empty'"),
    Case("Directly with gracePeriodSeconds", "policy",
         lambda d: _app(d, purgeMode="Directly", gracePeriodSeconds=60), "refused",
         (f"{POLICY}: {APP}.gracePeriodSeconds only applies to purgeMode Gracefully "
          "(Graciously), not Directly",),
         "KV ValidateApplicationFailover: only takes effect when purgeMode is gracefully"),
    Case("Never with gracePeriodSeconds", "policy",
         lambda d: _app(d, purgeMode="Never", gracePeriodSeconds=60), "refused",
         (f"{POLICY}: {APP}.gracePeriodSeconds only applies to purgeMode Gracefully "
          "(Graciously), not Never",), "KV ValidateApplicationFailover"),
    Case("negative tolerationSeconds", "policy",
         lambda d: _app(d, decisionConditions={"tolerationSeconds": -1}), "refused",
         (f"{POLICY}: {APP}.decisionConditions.tolerationSeconds must be >= 0",),
         "KV ValidateApplicationFailover: must be greater than or equal to 0"),
    Case("application failover without decisionConditions", "policy",
         lambda d: d["spec"]["failover"]["application"].pop("decisionConditions"), "refused",
         (f"{POLICY}: {APP}.decisionConditions is required",),
         "KC application required [decisionConditions]"),
    Case("application statePreservation", "policy",
         lambda d: _app(d, statePreservation={"rules": [
             {"aliasLabelName": "fleetq.io/checkpoint", "jsonPath": "{.checkpoint}"}]}),
         "accepted", (), "KC statePreservation.rules"),
    Case("statePreservation alias that is not a label name", "policy",
         lambda d: _app(d, statePreservation={"rules": [
             {"aliasLabelName": "bad key!", "jsonPath": "{.x}"}]}), "refused",
         (f"{POLICY}: {APP}.statePreservation.rules[0].aliasLabelName 'bad key!' is not a "
          "qualified name (at most 63 letters, digits, '-', '_' or '.', starting and ending "
          "with a letter or digit)",),
         "KV validateStatePreservationRule: ValidateLabelName"),
    Case("cluster failover with statePreservation", "policy",
         _set("spec.failover.cluster", {"purgeMode": "Directly", "statePreservation": {
             "rules": [{"aliasLabelName": "step", "jsonPath": "{.step}"}]}}), "accepted",
         (), "KC failover.cluster; KV validateClusterFailover"),
    Case("cluster failover purgeMode Never", "policy",
         _set("spec.failover.cluster", {"purgeMode": "Never"}), "refused",
         (f"{POLICY}: spec.failover.cluster.purgeMode must be one of 'Directly' or "
          "'Gracefully'",), "KC cluster.purgeMode enum [Directly, Gracefully]"),
    # ------------------------------------------------------------------ clusterAffinity
    Case("fieldSelector key other than provider/region/zone", "policy",
         _set("spec.placement.clusterAffinity", {"fieldSelector": {"matchExpressions": [
             {"key": "name", "operator": "In", "values": ["a"]}]}}), "refused",
         (f"{POLICY}: {PL}.clusterAffinity.fieldSelector.matchExpressions[0].key unsupported "
          "key 'name', must be provider, region, or zone",),
         "KV ValidatePolicyFieldSelector"),
    Case("fieldSelector operator Exists", "policy",
         _set("spec.placement.clusterAffinity", {"fieldSelector": {"matchExpressions": [
             {"key": "zone", "operator": "Exists"}]}}), "refused",
         (f"{POLICY}: {PL}.clusterAffinity.fieldSelector.matchExpressions[0].operator "
          "unsupported operator 'Exists', must be In or NotIn",),
         "KV ValidatePolicyFieldSelector"),
    Case("fieldSelector region In", "policy",
         _set("spec.placement.clusterAffinity", {"fieldSelector": {"matchExpressions": [
             {"key": "region", "operator": "In", "values": ["eu"]}]}}), "accepted",
         (f"{POLICY}: {PL}.clusterAffinity.fieldSelector {NOT_USED} (member clusters have no "
          "provider, region or zone; use labelSelector)",), "KV ValidatePolicyFieldSelector"),
    Case("two ordered cluster groups", "policy",
         lambda d: _placement(d, clusterAffinities=[
             _group("primary", clusterNames=["cluster-a"]),
             _group("backup", labelSelector={"matchLabels": {"tier": "spot"}})]),
         "accepted", (), "KC clusterAffinities; KV ValidateClusterAffinities"),
    Case("clusterAffinity with clusterAffinities", "policy",
         lambda d: _placement(d, clusterAffinity={"clusterNames": ["a"]},
                              clusterAffinities=[_group("g")]), "refused",
         (f"{POLICY}: {PL}.clusterAffinities cannot co-exist with clusterAffinity",),
         "KV ValidatePlacement"),
    Case("two groups with one affinityName", "policy",
         lambda d: _placement(d, clusterAffinities=[_group("g"), _group("g")]), "refused",
         (f"{POLICY}: {PL}.clusterAffinities[1].affinityName 'g': each affinity term in a "
          "policy must have a unique name",), "KV ValidateClusterAffinities"),
    Case("empty affinityName", "policy",
         lambda d: _placement(d, clusterAffinities=[_group("")]), "refused",
         (f"{POLICY}: {PL}.clusterAffinities[0].affinityName must not be empty",),
         "KC affinityName minLength 1"),
    Case("affinityName of 33 characters", "policy",
         lambda d: _placement(d, clusterAffinities=[_group("g" * 33)]), "refused",
         (f"{POLICY}: {PL}.clusterAffinities[0].affinityName must be at most 32 characters",),
         "KC affinityName maxLength 32"),
    Case("overflowAffinities without aggregated scheduling", "policy",
         lambda d: _placement(d, clusterAffinities=[_group(
             "g", clusterNames=["a"], overflowAffinities=[_group("o", clusterNames=["b"])])]),
         "refused",
         (f"{POLICY}: {PL}.clusterAffinities[0].overflowAffinities can only be used together "
          "with dynamic weight or aggregated scheduling",),
         "KV ValidatePlacement: IsOverflowSchedulingAllowed"),
    Case("overflowAffinities with Divided/Aggregated", "policy",
         lambda d: _placement(d, replicaScheduling={
             "replicaSchedulingType": "Divided", "replicaDivisionPreference": "Aggregated"},
             clusterAffinities=[_group("g", clusterNames=["a"], overflowAffinities=[
                 _group("o", clusterNames=["b"])])]), "accepted",
         (f"{POLICY}: {PL}.replicaScheduling.replicaDivisionPreference {ONE_CLUSTER}",),
         "KV ValidateOverflowAffinities"),
    Case("overflowAffinities with Divided and a dynamic weight (Weighted by default)",
         "policy",
         lambda d: _placement(d, replicaScheduling={
             "replicaSchedulingType": "Divided",
             "weightPreference": {"dynamicWeight": "AvailableReplicas"}},
             clusterAffinities=[_group("g", clusterNames=["a"], overflowAffinities=[
                 _group("o", clusterNames=["b"])])]), "accepted",
         (f"{POLICY}: {PL}.replicaScheduling.weightPreference {ONE_CLUSTER}",),
         "KM SetReplicaDivisionPreferenceWeighted, then KV IsOverflowSchedulingAllowed"),
    Case("overflowAffinities on an empty group", "policy",
         lambda d: _placement(d, replicaScheduling={"replicaDivisionPreference": "Aggregated"},
                              clusterAffinities=[_group("g", overflowAffinities=[])]),
         "refused",
         (f"{POLICY}: {PL}.clusterAffinities[0].overflowAffinities can only be used together "
          "with the inline ClusterAffinity",), "KV ValidateOverflowAffinities"),
    # ------------------------------------------------------------------ spreadConstraints
    Case("spread maxGroups below minGroups", "policy",
         lambda d: _placement(d, spreadConstraints=[
             {"spreadByField": "cluster", "minGroups": 3, "maxGroups": 2}]), "refused",
         (f"{POLICY}: {PL}.spreadConstraints[0].maxGroups lower than minGroups is not "
          "allowed",), "KV ValidateSpreadConstraint"),
    Case("spreadByLabel with spreadByField", "policy",
         lambda d: _placement(d, spreadConstraints=[
             {"spreadByField": "cluster", "spreadByLabel": "team"}]), "refused",
         (f"{POLICY}: {PL}.spreadConstraints[0] spreadByLabel should not co-exist with "
          "spreadByField",), "KV ValidateSpreadConstraint"),
    Case("spreadByField region without a cluster one", "policy",
         lambda d: _placement(d, spreadConstraints=[{"spreadByField": "region"}]), "refused",
         (f"{POLICY}: {PL}.spreadConstraints must include a spreadByField cluster constraint "
          "when any spreadByField is used",), "KV ValidateSpreadConstraint"),
    Case("two cluster spread constraints", "policy",
         lambda d: _placement(d, spreadConstraints=[
             {"spreadByField": "cluster"}, {"spreadByField": "cluster", "maxGroups": 2}]),
         "refused",
         (f"{POLICY}: {PL}.spreadConstraints[1] multiple cluster spread constraints are not "
          "allowed",), "KV ValidateSpreadConstraint"),
    Case("negative minGroups", "policy",
         lambda d: _placement(d, spreadConstraints=[{"minGroups": -1}]), "refused",
         (f"{POLICY}: {PL}.spreadConstraints[0].minGroups lower than 0 is not allowed",),
         "KV ValidateSpreadConstraint"),
    Case("region and cluster spread constraints", "policy",
         lambda d: _placement(d, spreadConstraints=[
             {"spreadByField": "region", "maxGroups": 2}, {"maxGroups": 1}]), "accepted",
         (f"{POLICY}: {PL}.spreadConstraints {ONE_CLUSTER}",),
         "KM SetDefaultSpreadConstraints makes the empty one cluster; KV accepts"),
    # ------------------------------------------------------------------ selectors
    Case("preemption Always with a selector without name", "policy",
         lambda d: d["spec"].update(preemption="Always"), "refused",
         (f"{POLICY}: spec.resourceSelectors[0].name cannot be empty if preemption is Always, "
          "the empty name may cause unexpected resources preemption",),
         "KV validateResourceSelectorsIfPreemptionEnabled"),
    Case("preemption Always with named selectors", "policy",
         lambda d: (d["spec"].update(preemption="Always"),
                    d["spec"]["resourceSelectors"][0].update(name="pytorch-test")),
         "accepted",
         (f"{POLICY}: spec.preemption {NOT_USED} (policies do not take jobs from each other; "
          "job preemption is the tree's fleetq.io/preemption)",),
         "KV validateResourceSelectorsIfPreemptionEnabled"),
    Case("selector naming another namespace", "policy",
         lambda d: d["spec"]["resourceSelectors"][0].update(namespace="team-b"), "refused",
         (f"{POLICY}: spec.resourceSelectors[0].namespace 'team-b': namespace of resource "
          "selector must be the same as the namespace of the policy (default)",),
         "KV validateResourceSelectors"),
    Case("selector naming the policy's namespace", "policy",
         lambda d: d["spec"]["resourceSelectors"][0].update(namespace="default"), "accepted",
         (), "KV validateResourceSelectors; KM fills an empty one with the policy's"),
    # ------------------------------------------------------------------ tolerations
    Case("cluster toleration operator Lt", "policy",
         lambda d: _placement(d, clusterTolerations=[{"key": "gpu", "operator": "Lt",
                                                      "value": "3"}]), "refused",
         (f"{POLICY}: {PL}.clusterTolerations[0].operator 'Lt' is not supported for cluster "
          'tolerations ("", Exists or Equal)',), "KV validateClusterTolerations"),
    Case("Exists toleration with a value", "policy",
         lambda d: _placement(d, clusterTolerations=[{"key": "k", "operator": "Exists",
                                                      "value": "v"}]), "accepted", (),
         "KV validateClusterTolerations checks the operator only"),
    # ------------------------------------------------------------------ other spec fields
    Case("dispatching with dispatchingOnClusters", "policy",
         _set("spec.suspension", {"dispatching": True,
                                  "dispatchingOnClusters": {"clusterNames": ["a"]}}),
         "refused",
         (f"{POLICY}: spec.suspension.dispatching cannot co-exist with "
          "dispatchingOnClusters.clusterNames",), "KV validateSuspension"),
    Case("dispatchingOnClusters alone", "policy",
         _set("spec.suspension", {"dispatchingOnClusters": {"clusterNames": ["a"]}}),
         "accepted", (f"{POLICY}: spec.suspension.dispatchingOnClusters {NOT_USED}",),
         "KC suspension.dispatchingOnClusters"),
    Case("schedulePriority from a PodPriorityClass", "policy",
         _set("spec.schedulePriority", {"priorityClassSource": "PodPriorityClass",
                                        "priorityClassName": "high"}), "refused",
         (f"{POLICY}: spec.schedulePriority.priorityClassSource must be one of "
          "'KubePriorityClass'",),
         "KC schedulePriority.priorityClassSource enum [KubePriorityClass]"),
    Case("schedulePriority from a KubePriorityClass", "policy",
         _set("spec.schedulePriority", {"priorityClassSource": "KubePriorityClass",
                                        "priorityClassName": "high"}), "accepted",
         (f"{POLICY}: spec.schedulePriority {NOT_USED} (a job's queue priority comes from its "
          "own PriorityClass)",), "KC schedulePriority"),
    Case("activationPreference Eager", "policy", _set("spec.activationPreference", "Eager"),
         "refused", (f"{POLICY}: spec.activationPreference must be one of 'Lazy'",),
         "KC activationPreference enum [Lazy]"),
    Case("association, dependentOverrides, activationPreference, preserveResources...",
         "policy",
         lambda d: d["spec"].update(association=True, dependentOverrides=["o"],
                                    activationPreference="Lazy",
                                    preserveResourcesOnDeletion=True),
         "accepted",
         (f"{POLICY}: spec.association {NOT_USED} (deprecated upstream for propagateDeps, "
          "which fleetq honours)",
          f"{POLICY}: spec.dependentOverrides {NOT_USED} (fleetq has no OverridePolicy)",
          f"{POLICY}: spec.activationPreference {NOT_USED}",
          f"{POLICY}: spec.preserveResourcesOnDeletion {NOT_USED} (deleting a job deletes "
          "its member copy)"), "KC spec properties"),
    Case("workloadAffinity with one key for affinity and antiAffinity", "policy",
         lambda d: _placement(d, workloadAffinity={"affinity": {"groupByLabelKey": "g"},
                                                   "antiAffinity": {"groupByLabelKey": "g"}}),
         "refused",
         (f"{POLICY}: {PL}.workloadAffinity affinity and antiAffinity must not use the same "
          "groupByLabelKey",), "KV ValidateWorkloadAffinity"),
    Case("static weight 0", "policy",
         lambda d: _placement(d, replicaScheduling={"weightPreference": {"staticWeightList": [
             {"targetCluster": {"clusterNames": ["a"]}, "weight": 0}]}}), "refused",
         (f"{POLICY}: {PL}.replicaScheduling.weightPreference.staticWeightList[0].weight "
          "must be >= 1",), "KC staticWeightList.weight minimum 1"),
    Case("a field upstream does not define", "policy",
         lambda d: _placement(d, clusterAfinity={"clusterNames": ["a"]}), "refused",
         (f"{POLICY}: {PL}.clusterAfinity is not a known field",),
         "KC has no such property (kubectl's default --validate=strict refuses it)"),
    # ------------------------------------------------------------------ ElasticQuotaTree
    Case("quota node attributes", "tree", _attributes, "accepted",
         (f"{TREE}: spec.root.children[0].attributes {NOT_USED}",),
         "KQ ElasticQuotaSpec.Attributes map[string]string"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_upstream_verdict(case: Case) -> None:
    """fleetq's verdict is upstream's (``case.cite``), in one line per refusal or per
    field accepted without being used."""
    doc = case.doc()
    if case.verdict == "refused":
        with pytest.raises(M.ManifestErrors) as info:
            M.parse_object(doc)
        assert [str(e) for e in info.value.errors] == list(case.lines)
    else:
        obj = M.parse_object(doc)
        assert M.upstream_warnings(obj) == list(case.lines)


def test_the_table_covers_the_issue() -> None:
    """Issue 26 names 40 cases (26 agreements, 14 disagreements); the table holds them and
    the further rules of the same sources, each with both verdicts represented."""
    assert len(CASES) >= 40
    assert len({c.id for c in CASES}) == len(CASES)
    assert {c.verdict for c in CASES} == {"accepted", "refused"}
    assert all(c.cite for c in CASES)


def test_cluster_affinities_are_typed_ordered_groups() -> None:
    """``placement.clusterAffinities`` parses into ordered
    :class:`~fleetq.models.ClusterAffinityTerm` groups a later change can honour (KC:
    ClusterAffinityTerm = affinityName + ClusterAffinity inline)."""
    doc = BASES["policy"]()
    _placement(doc, clusterAffinities=[
        _group("primary", clusterNames=["cluster-a"], exclude=["cluster-c"]),
        _group("backup", labelSelector={"matchLabels": {"tier": "spot"}}),
    ])
    groups = M.parse_policy(doc).spec.placement.cluster_affinities
    assert [g.affinityName for g in groups] == ["primary", "backup"]
    assert isinstance(groups[0], M.ClusterAffinity)
    assert groups[0].allows("cluster-a", {}) and not groups[0].allows("cluster-b", {})
    assert groups[1].allows("cluster-b", {"tier": "spot"})
    assert not groups[1].allows("cluster-b", {"tier": "on-demand"})
    assert M.parse_policy(BASES["policy"]()).spec.placement.cluster_affinities == []


def test_state_preservation_rules_are_typed() -> None:
    """Both statePreservation forms parse into (aliasLabelName, jsonPath) rules (KC)."""
    doc = BASES["policy"]()
    rules = {"rules": [{"aliasLabelName": "fleetq.io/step", "jsonPath": "{.step}"}]}
    _app(doc, statePreservation=rules)
    doc["spec"]["failover"]["cluster"] = {"statePreservation": rules}
    fo = M.parse_policy(doc).spec.failover
    assert fo is not None and fo.application is not None and fo.cluster is not None
    assert fo.application.statePreservation is not None
    rule = fo.application.statePreservation.rules[0]
    assert (rule.aliasLabelName, rule.jsonPath) == ("fleetq.io/step", "{.step}")
    assert fo.cluster.purgeMode == "Gracefully"  # the CRD's default
    assert fo.cluster.statePreservation == fo.application.statePreservation


def test_walkthrough_manifests_give_no_warning() -> None:
    """The walkthrough's own manifests use only fields fleetq honours."""
    for name in ("elasticquotatree.yaml", "propagationpolicy-gang.yaml",
                 "propagationpolicy-gang-queue.yaml", "pytorch-test.yaml"):
        assert M.upstream_warnings(M.parse_object(_load(name))) == [], name
