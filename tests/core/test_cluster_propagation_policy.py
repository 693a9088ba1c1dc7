"""ClusterPropagationPolicy: Karmada's cluster-scoped policy, with upstream's verdicts.

Upstream (karmada-io/karmada, pkg/apis/policy/v1alpha1/propagation_types.go): a
``ClusterPropagationPolicy`` has ``+kubebuilder:resource:scope="Cluster"`` and the same
``Spec PropagationSpec``. Its validating webhook (pkg/webhook/clusterpropagationpolicy/
validating.go) runs ``validation.ValidatePropagationSpec(policy.Spec, req.Namespace)``
with the empty namespace of a cluster-scoped request, so ``validateResourceSelectors``
returns early: its selectors may name any namespace. Matching (pkg/detector/policy.go
``propagateResource``): the resource's namespace's PropagationPolicies first, the
ClusterPropagationPolicies only when none matched; among those
(pkg/detector/compare.go ``getHighestPriorityClusterPropagationPolicy``) the higher
``spec.priority``, then name > labelSelector > kind match (pkg/util/selector.go
``ResourceSelectorPriority``), then the alphabetically lower name.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from fleetq.manifests import parse_manifest_text
from fleetq.messages import ResolveInput
from fleetq.models import (
    ClusterPropagationPolicy,
    ManifestErrors,
    PropagationPolicy,
    parse_object,
    parse_policy,
    upstream_warnings,
)
from fleetq.policy_match import MatchKind, best_match, explain_match
from fleetq.registry import RegistryState, resolve_from_state

API = "kubeflow.org/v1"
KIND = "PyTorchJob"


def sel(**kw: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": KIND, **kw}


def cpp_doc(name: str, *selectors: dict[str, Any], priority: int | None = None,
            group: str = "policy.karmada.io", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"resourceSelectors": list(selectors) or [sel()], **spec}
    if priority is not None:
        body["priority"] = priority
    return {"apiVersion": f"{group}/v1alpha1", "kind": "ClusterPropagationPolicy",
            "metadata": {"name": name}, "spec": body}


def pp_doc(name: str, *selectors: dict[str, Any], namespace: str = "default",
           priority: int | None = None) -> dict[str, Any]:
    doc = cpp_doc(name, *selectors, priority=priority)
    doc["kind"] = "PropagationPolicy"
    doc["metadata"]["namespace"] = namespace
    return doc


def cpp(name: str, *selectors: dict[str, Any], priority: int | None = None
        ) -> PropagationPolicy:
    return parse_policy(cpp_doc(name, *selectors, priority=priority))


def pp(name: str, *selectors: dict[str, Any], namespace: str = "default",
       priority: int | None = None) -> PropagationPolicy:
    return parse_policy(pp_doc(name, *selectors, namespace=namespace, priority=priority))


def winner(policies: list[PropagationPolicy], *, namespace: str = "default",
           name: str = "job", labels: dict[str, str] | None = None) -> str | None:
    m = best_match(policies, api_version=API, kind=KIND, namespace=namespace, name=name,
                   labels=labels or {})
    return m.policy.ref if m else None


def errors(doc: dict[str, Any]) -> list[str]:
    with pytest.raises(ManifestErrors) as info:
        parse_object(doc)
    return [str(e) for e in info.value.errors]


# --------------------------------------------------------------------------- the model


@pytest.mark.parametrize("group", ["policy.karmada.io", "policy.one.alibabacloud.com"])
def test_both_policy_groups_accept_it_with_the_propagation_spec(group: str) -> None:
    doc = cpp_doc("gang-everywhere", group=group, propagateDeps=True,
                  placement={"replicaScheduling": {"replicaSchedulingType": "Divided"}},
                  failover={"cluster": {"purgeMode": "Directly"}})
    obj = parse_object(doc)
    assert isinstance(obj, ClusterPropagationPolicy)
    assert obj.ref == "ClusterPropagationPolicy gang-everywhere"
    assert obj.metadata.namespace == ""  # cluster-scoped
    assert obj.registry_key == "gang-everywhere"


def test_its_selectors_may_name_any_namespace() -> None:
    # ValidatePropagationSpec(spec, "") -> validateResourceSelectors returns nil
    obj = parse_policy(cpp_doc("c", sel(namespace="team-a"), sel(namespace="team-b")))
    assert [s.namespace for s in obj.spec.resourceSelectors] == ["team-a", "team-b"]
    # while a PropagationPolicy's may not (the same function with its namespace)
    assert errors(pp_doc("p", sel(namespace="team-a"))) == [
        "PropagationPolicy default/p: spec.resourceSelectors[0].namespace 'team-a': namespace "
        "of resource selector must be the same as the namespace of the policy (default)"]


def test_a_written_namespace_is_cleared_as_the_api_server_clears_it() -> None:
    # kube-apiserver rest.BeforeCreate -> EnsureObjectNamespaceMatchesRequestNamespace:
    # "case requestNamespace == metav1.NamespaceNone: // cluster-scoped, clear namespace"
    # (accepted, not refused); fleetq says so in one warning line
    doc = cpp_doc("c")
    doc["metadata"]["namespace"] = "team-a"
    obj = parse_object(doc)
    assert obj.metadata.namespace == ""
    assert upstream_warnings(obj) == [
        "ClusterPropagationPolicy c: metadata.namespace 'team-a' ignored: "
        "ClusterPropagationPolicy is cluster-scoped (the API server clears it)"]
    assert upstream_warnings(parse_object(cpp_doc("c"))) == []


def test_the_spec_rules_are_the_propagation_policys() -> None:
    # ValidatePropagationSpec: application failover needs propagateDeps
    doc = cpp_doc("c", failover={"application": {"decisionConditions": {}}})
    assert errors(doc) == ["ClusterPropagationPolicy c: spec.propagateDeps must be true when "
                           "spec.failover.application is set"]
    # validateResourceSelectorsIfPreemptionEnabled
    assert errors(cpp_doc("c", preemption="Always")) == [
        "ClusterPropagationPolicy c: spec.resourceSelectors[0].name cannot be empty if "
        "preemption is Always, the empty name may cause unexpected resources preemption"]
    # the CRD: resourceSelectors is required (minItems 1); unknown fields are pruned
    assert errors({**cpp_doc("c"), "spec": {"resourceSelectors": []}})[0].startswith(
        "ClusterPropagationPolicy c: spec.resourceSelectors")
    assert errors({**cpp_doc("c"), "spec": {"resourceSelectors": [sel()], "bogus": 1}}) == [
        "ClusterPropagationPolicy c: spec.bogus is not a known field"]
    # metadata.name is a DNS subdomain, as for every object
    assert errors({**cpp_doc("c"), "metadata": {"name": "Not_A_Name"}})[0].startswith(
        "ClusterPropagationPolicy Not_A_Name: metadata.name")


def test_the_loader_keys_it_without_a_namespace() -> None:
    text = "\n---\n".join(
        json.dumps(d) for d in (cpp_doc("same"), pp_doc("same")))
    result = parse_manifest_text(text, "policies.yaml")
    assert result.errors == []
    assert sorted(o.kind for _, o in result.objects) == [
        "ClusterPropagationPolicy", "PropagationPolicy"]
    twice = parse_manifest_text(
        "\n---\n".join(json.dumps(cpp_doc("same")) for _ in range(2)), "p.yaml")
    assert twice.errors == [
        "ClusterPropagationPolicy same: is defined twice in p.yaml (documents 1 and 2)"]


# --------------------------------------------------------------------------- matching


def test_it_matches_jobs_in_every_namespace_unless_its_selector_names_one() -> None:
    anywhere, team_a = cpp("anywhere"), cpp("team-a-only", sel(namespace="team-a"))
    assert winner([anywhere], namespace="team-z") == "ClusterPropagationPolicy anywhere"
    assert winner([team_a], namespace="team-a") == "ClusterPropagationPolicy team-a-only"
    assert winner([team_a], namespace="team-b") is None


def test_a_namespaced_policy_beats_any_cluster_policy() -> None:
    # propagateResource: LookForMatchedPolicy first; LookForMatchedClusterPolicy only
    # when it found none -- priority and specificity do not cross the two kinds
    strong = cpp("by-name", sel(name="job"), priority=1000)
    weak = pp("generic", priority=-5)
    assert winner([strong, weak]) == "PropagationPolicy default/generic"
    # a namespaced policy of another namespace does not count
    assert winner([strong, pp("generic", namespace="team-a")]) == (
        "ClusterPropagationPolicy by-name")
    m = best_match([strong, weak], api_version=API, kind=KIND, namespace="default",
                   name="job", labels={})
    assert m is not None and m.candidates == 2 and "1 other matching policy" in m.reason


def test_among_cluster_policies_priority_then_specificity_then_name() -> None:
    # getHighestPriorityClusterPropagationPolicy
    assert winner([cpp("a-by-name", sel(name="job"), priority=1),
                   cpp("z-generic", priority=5)]) == "ClusterPropagationPolicy z-generic"
    labels = {"team": "x"}
    kind_only = cpp("a-kind")
    by_label = cpp("b-label", sel(labelSelector={"matchLabels": labels}))
    by_name = cpp("c-name", sel(name="job"))
    assert winner([kind_only, by_label, by_name], labels=labels) == (
        "ClusterPropagationPolicy c-name")
    assert winner([kind_only, by_label], labels=labels) == "ClusterPropagationPolicy b-label"
    assert winner([cpp("beta"), cpp("alpha")]) == "ClusterPropagationPolicy alpha"
    m = best_match([by_name], api_version=API, kind=KIND, namespace="default", name="job",
                   labels={})
    assert m is not None and m.how is MatchKind.NAME
    assert m.reason == ("ClusterPropagationPolicy c-name (priority 0, name match by "
                        "resourceSelectors[0])")


def test_explain_counts_the_cluster_policies_when_nothing_matches() -> None:
    text = explain_match([pp("p", namespace="team-a"), cpp("c", sel(namespace="team-a"))],
                         api_version=API, kind=KIND, namespace="default", name="job",
                         labels={})
    assert text == ("no PropagationPolicy in namespace default selects PyTorchJob default/job "
                    "(0 policies in that namespace, 1 elsewhere, 1 ClusterPropagationPolicy)")


def test_the_registry_resolves_a_job_to_a_cluster_policy() -> None:
    doc = cpp_doc("fleet-wide")
    state = RegistryState(policies={"fleet-wide": doc, "team-a/p": pp_doc(
        "p", namespace="team-a")})
    policies = [parse_policy(d) for d in state.policies.values()]
    inp = ResolveInput(api_version=API, kind=KIND, namespace="default", name="job", labels={})
    res = resolve_from_state(state, policies, inp)
    assert res.policy == doc and res.policy_reason == "ClusterPropagationPolicy fleet-wide"
    in_team_a = resolve_from_state(state, policies, inp.model_copy(update={"namespace": "team-a"}))
    assert in_team_a.policy_reason == "PropagationPolicy team-a/p"
    none = resolve_from_state(RegistryState(), [], inp)
    assert none.policy is None and none.policy_reason == (
        "no PropagationPolicy in namespace default (nor any ClusterPropagationPolicy) selects "
        "PyTorchJob default/job")
