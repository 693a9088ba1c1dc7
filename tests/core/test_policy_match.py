"""Which PropagationPolicy governs a PyTorchJob (Karmada precedence)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetq.models import ManifestErrors, PropagationPolicy, parse_policy
from fleetq.policy_match import (
    MatchKind,
    best_match,
    explain_match,
    match_policy,
    selector_match,
)

API = "kubeflow.org/v1"
KIND = "PyTorchJob"
MANIFESTS = Path(__file__).resolve().parents[2] / "examples"


def policy(
    name: str,
    *selectors: dict[str, Any],
    namespace: str = "default",
    priority: int | None = None,
) -> PropagationPolicy:
    spec: dict[str, Any] = {
        "resourceSelectors": list(selectors) or [{"apiVersion": API, "kind": KIND}]
    }
    if priority is not None:
        spec["priority"] = priority
    return parse_policy(
        {
            "apiVersion": "policy.karmada.io/v1alpha1",
            "kind": "PropagationPolicy",
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec,
        }
    )


def sel(**kw: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": KIND, **kw}


def match(
    policies: list[PropagationPolicy],
    *,
    namespace: str = "default",
    name: str = "job",
    labels: dict[str, str] | None = None,
    kind: str = KIND,
) -> str | None:
    p = match_policy(
        policies, api_version=API, kind=kind, namespace=namespace, name=name, labels=labels or {}
    )
    return p.metadata.name if p else None


def test_walkthrough_policy_selects_the_walkthrough_job() -> None:
    pol = parse_policy(yaml.safe_load((MANIFESTS / "propagationpolicy-gang.yaml").read_text()))
    assert match([pol], name="pytorch-test", labels={"app": "pytorchjob"}) == "example-policy"


def test_policy_only_applies_in_its_own_namespace() -> None:
    other = policy("other-ns", namespace="team-a")
    assert match([other], namespace="default") is None
    assert match([other], namespace="team-a") == "other-ns"


def test_selector_namespace_must_equal_when_set() -> None:
    # Karmada pkg/util/validation/validation.go validateResourceSelectors refuses such a
    # policy outright; selector_match still never matches across namespaces.
    with pytest.raises(ManifestErrors):
        policy("p", sel(namespace="team-b"), namespace="team-a")
    p = policy("p", sel(namespace="team-a"), namespace="team-a")
    selector = p.spec.resourceSelectors[0].model_copy(update={"namespace": "team-b"})
    assert selector_match(selector, api_version=API, kind=KIND, namespace="team-a",
                          name="job", labels={}) is MatchKind.NONE
    assert match([p], namespace="team-a") == "p"


def test_api_version_and_kind_must_match() -> None:
    assert match([policy("p", {"apiVersion": "kubeflow.org/v2", "kind": KIND})]) is None
    assert match([policy("p", {"apiVersion": API, "kind": "TFJob"})]) is None


def test_name_selector_ignores_label_selector() -> None:
    p = policy("p", sel(name="job", labelSelector={"matchLabels": {"team": "x"}}))
    assert match([p], name="job", labels={}) == "p"  # labels would not match; ignored
    assert match([p], name="other", labels={"team": "x"}) is None  # name set and differs


def test_label_selector_must_match_when_no_name() -> None:
    p = policy("p", sel(labelSelector={"matchLabels": {"team": "x"}}))
    assert match([p], labels={"team": "x"}) == "p"
    assert match([p], labels={"team": "y"}) is None


def test_higher_priority_wins_over_more_specific_selector() -> None:
    by_name = policy("a-by-name", sel(name="job"), priority=1)
    generic = policy("z-generic", priority=5)
    assert match([by_name, generic]) == "z-generic"


def test_name_match_beats_label_match_beats_kind_match_at_equal_priority() -> None:
    kind_only = policy("a-kind")
    by_label = policy("b-label", sel(labelSelector={"matchLabels": {"team": "x"}}))
    by_name = policy("c-name", sel(name="job"))
    labels = {"team": "x"}
    assert match([kind_only, by_label, by_name], labels=labels) == "c-name"
    assert match([kind_only, by_label], labels=labels) == "b-label"
    assert match([kind_only], labels=labels) == "a-kind"


def test_best_selector_of_a_policy_counts() -> None:
    # One policy lists a kind-only selector and a name selector: its best match is by name.
    mixed = policy("b-mixed", sel(), sel(name="job"))
    by_label = policy("a-label", sel(labelSelector={"matchLabels": {"team": "x"}}))
    m = best_match(
        [by_label, mixed],
        api_version=API,
        kind=KIND,
        namespace="default",
        name="job",
        labels={"team": "x"},
    )
    assert m is not None and m.policy.metadata.name == "b-mixed"
    assert m.how is MatchKind.NAME and m.selector_index == 1


def test_alphabetically_lower_name_breaks_ties_regardless_of_order() -> None:
    a, b = policy("alpha"), policy("beta")
    assert match([b, a]) == "alpha"
    assert match([a, b]) == "alpha"


def test_explain_names_policy_reason_and_competitors() -> None:
    text = explain_match(
        [policy("alpha"), policy("beta", sel(name="job"))],
        api_version=API,
        kind=KIND,
        namespace="default",
        name="job",
        labels={},
    )
    assert "default/beta" in text and "name match" in text and "1 other" in text


def test_explain_when_nothing_matches() -> None:
    text = explain_match(
        [policy("p", namespace="team-a")],
        api_version=API,
        kind=KIND,
        namespace="default",
        name="job",
        labels={},
    )
    assert text.startswith(
        "no PropagationPolicy in namespace default selects PyTorchJob default/job"
    )
    assert "1 elsewhere" in text
