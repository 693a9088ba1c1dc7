"""statePreservation pinned to Karmada release-1.18: pkg/util/helper/failover_test.go
(``Test_BuildPreservedLabelState``, ``Test_parseJSONValue``: kubectl JSONPath, missing keys
an error, scalars printed as Go prints them, objects as JSON) and
pkg/controllers/binding/common.go ``injectReservedLabelState`` (labels only after a
Directly purge; the rules of the failover that happened)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fleetq.member_contract import member_manifest
from fleetq.messages import BindRequest, JobRef
from fleetq.models import PropagationPolicy, PurgeMode, StatePreservation, parse_object
from fleetq.state_preservation import (
    PreservationError,
    failover_labels,
    json_value,
    labels_at_failover,
    preserved_labels,
)
from tests.workflows.fakes import walkthrough_job

STATUS = {"replicas": 2, "health": True}


def rules(*pairs: tuple[str, str]) -> StatePreservation:
    return StatePreservation.model_validate(
        {"rules": [{"aliasLabelName": a, "jsonPath": p} for a, p in pairs]})


def test_karmada_successful_case() -> None:
    """Test_BuildPreservedLabelState "successful case": 2 and true, as Go prints them."""
    got = preserved_labels(rules(("key-a", "{ .replicas }"), ("key-b", "{ .health }")).rules,
                           STATUS)
    assert got == {"key-a": "2", "key-b": "true"}


@pytest.mark.parametrize("path", ["{ .notfound }", "{ %health }", "{.replicas"])
def test_one_rule_failing_fails_them_all(path: str) -> None:
    """Test_BuildPreservedLabelState: a field not found, or an invalid jsonPath, gives an
    error and no labels at all."""
    with pytest.raises(PreservationError) as err:
        preserved_labels(rules(("key-a", "{ .replicas }"), ("key-b", path)).rules, STATUS)
    assert err.value.label == "key-b"
    assert str(err.value).startswith("statePreservation rule key-b: jsonPath")


def test_the_jsonpath_dialect_is_kubectls() -> None:
    """Test_parseJSONValue: ``{ @ }`` the whole object as JSON, ``{ ['kind'] }`` the child
    operator; client-go jsonpath's filters and wildcards (several results, one space)."""
    doc: dict[str, Any] = {"kind": "List", "items": [{"n": 1}, {"n": 2}],
                           "conditions": [{"type": "Running", "status": "True"}]}
    assert json.loads(json_value(doc, "{ @ }")) == doc
    assert json_value(doc, "{ ['kind'] }") == "List"
    assert json_value(doc, "{.items[*].n}") == "1 2"
    assert json_value(doc, '{.conditions[?(@.type=="Running")].status}') == "True"
    assert json_value(doc, "step-{.items[1].n}") == "step-2"
    assert json_value({"f": 3.0}, "{.f}") == "3"  # float64 from JSON, printed %v


def test_nothing_synced_yet_is_an_error() -> None:
    """buildTaskOptions: "the application status has not yet been collected"."""
    with pytest.raises(PreservationError, match="has not been synced yet"):
        preserved_labels(rules(("k", "{.x}")).rules, {})


def test_a_value_that_cannot_be_a_label_is_refused() -> None:
    with pytest.raises(PreservationError, match="not a valid label value"):
        preserved_labels(rules(("k", "{.x}")).rules, {"x": "a b"})


def test_labels_only_after_a_directly_purge() -> None:
    """injectReservedLabelState: "performed only when PurgeMode is set to Directly"."""
    sp = rules(("step", "{.replicas}"))
    assert failover_labels(sp, True, STATUS) == {"step": "2"}
    assert failover_labels(sp, False, STATUS) == {}
    assert failover_labels(None, True, STATUS) == {}


def _policy(failover: dict[str, Any]) -> PropagationPolicy:
    obj = parse_object({
        "apiVersion": "policy.karmada.io/v1alpha1", "kind": "PropagationPolicy",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"resourceSelectors": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob"}],
                 "propagateDeps": True, "failover": failover},
    })
    assert isinstance(obj, PropagationPolicy)
    return obj


def test_the_rules_of_the_failover_that_happened() -> None:
    """Application failover (pkg/controllers/applicationfailover) reads
    failover.application's rules; a cluster failure (the taint manager) failover.cluster's."""
    pol = _policy({
        "application": {"decisionConditions": {"tolerationSeconds": 5},
                        "purgeMode": "Immediately",
                        "statePreservation": {"rules": [
                            {"aliasLabelName": "app", "jsonPath": "{.replicas}"}]}},
        "cluster": {"statePreservation": {"rules": [
            {"aliasLabelName": "cl", "jsonPath": "{.health}"}]}},
    })
    direct = PurgeMode.DIRECTLY
    assert labels_at_failover(pol, direct, STATUS, cluster_failure=False) == {"app": "2"}
    assert labels_at_failover(pol, direct, STATUS, cluster_failure=True) == {"cl": "true"}
    assert labels_at_failover(pol, PurgeMode.GRACEFULLY, STATUS, cluster_failure=False) == {}


def test_the_new_copy_carries_the_labels() -> None:
    """util.MergeLabel on the workload: the member PyTorchJob's own labels."""
    job = walkthrough_job("ckpt")
    ref = JobRef(namespace="default", name="ckpt", workflow_id="job/default/ckpt")
    body = member_manifest(BindRequest(job=ref, manifest=job, labels={"step": "1200"}))
    assert body["metadata"]["labels"]["step"] == "1200"
