"""Which PropagationPolicy governs a resource, by Karmada's precedence rules.

The fleet must pick exactly one of the policies matching a job, the same every time, and
say why (Karmada ``GetHigherPriorityPropagationPolicy`` / ``ResourceMatchSelectorsPriority``):
1. a PropagationPolicy applies in its own namespace, a ClusterPropagationPolicy anywhere;
2. a selector matches on apiVersion and kind, ``namespace`` and ``name`` if set, else the
   labelSelector if set (``name`` set: labelSelector ignored);
3. higher ``spec.priority`` wins, then the more specific best match (name > labelSelector
   > kind only), then the lower policy name;
4. a PropagationPolicy beats every ClusterPropagationPolicy (``propagateResource``:
   ``LookForMatchedPolicy`` before ``LookForMatchedClusterPolicy``); among cluster ones
   rule 3 (``getHighestPriorityClusterPropagationPolicy``). Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import TypedDict, Unpack

from fleetq.models import ClusterPropagationPolicy, PropagationPolicy, ResourceSelector

__all__ = [
    "MatchKind",
    "PolicyMatch",
    "best_match",
    "explain_match",
    "match_policy",
    "selector_match",
]


class MatchKind(IntEnum):
    """How specifically a selector matched (higher wins)."""

    NONE = 0
    KIND = 1  # apiVersion + kind (and namespace) only
    LABEL = 2  # labelSelector matched
    NAME = 3  # name matched

    @property
    def text(self) -> str:
        return {0: "no match", 1: "kind match", 2: "labelSelector match", 3: "name match"}[
            int(self)
        ]


def selector_match(
    selector: ResourceSelector,
    *,
    api_version: str,
    kind: str,
    namespace: str,
    name: str,
    labels: Mapping[str, str],
) -> MatchKind:
    """How ``selector`` matches the resource (``MatchKind.NONE`` when it does not)."""
    if selector.apiVersion != api_version or selector.kind != kind:
        return MatchKind.NONE
    if selector.namespace and selector.namespace != namespace:
        return MatchKind.NONE
    if selector.name:
        return MatchKind.NAME if selector.name == name else MatchKind.NONE
    if selector.labelSelector is not None:
        return MatchKind.LABEL if selector.labelSelector.matches(labels) else MatchKind.NONE
    return MatchKind.KIND


@dataclass(frozen=True)
class PolicyMatch:
    policy: PropagationPolicy
    how: MatchKind
    selector_index: int  # which resourceSelector gave the best match
    candidates: int  # how many policies matched at all

    @property
    def reason(self) -> str:
        p = self.policy
        others = self.candidates - 1
        tail = (
            f"; chosen over {others} other matching polic{'y' if others == 1 else 'ies'}"
            if others
            else ""
        )
        return (
            f"{p.ref} "
            f"(priority {p.spec.priority}, {self.how.text} by "
            f"resourceSelectors[{self.selector_index}]){tail}"
        )


def _best_selector(
    policy: PropagationPolicy,
    api_version: str,
    kind: str,
    namespace: str,
    name: str,
    labels: Mapping[str, str],
) -> tuple[MatchKind, int]:
    best, index = MatchKind.NONE, -1
    for i, sel in enumerate(policy.spec.resourceSelectors):
        how = selector_match(
            sel, api_version=api_version, kind=kind, namespace=namespace, name=name, labels=labels
        )
        if how > best:
            best, index = how, i
    return best, index


class Resource(TypedDict):
    """The resource a policy is matched against (keyword arguments of the matchers)."""

    api_version: str
    kind: str
    namespace: str
    name: str
    labels: Mapping[str, str]


def best_match(policies: Sequence[PropagationPolicy], **resource: Unpack[Resource]
               ) -> PolicyMatch | None:
    """The winning policy with how and why it matched, or None: the resource's
    namespace's PropagationPolicies first, the ClusterPropagationPolicies only when none
    of those matches (rule 4); ``candidates`` counts the matching policies of both."""
    api_version, kind, namespace = resource["api_version"], resource["kind"], resource["namespace"]
    name, labels = resource["name"], resource["labels"]
    tiers: tuple[list[tuple[int, int, str, PropagationPolicy, MatchKind, int]], ...] = ([], [])
    for policy in policies:
        cluster = isinstance(policy, ClusterPropagationPolicy)
        if not cluster and policy.metadata.namespace != namespace:
            continue
        how, index = _best_selector(policy, api_version, kind, namespace, name, labels)
        if how is MatchKind.NONE:
            continue
        tiers[int(cluster)].append(
            (-policy.spec.priority, -int(how), policy.metadata.name, policy, how, index))
    found = tiers[0] or tiers[1]
    if not found:
        return None
    found.sort(key=lambda t: (t[0], t[1], t[2]))
    _p, _h, _n, policy, how, index = found[0]
    return PolicyMatch(policy, how, index, len(tiers[0]) + len(tiers[1]))


def match_policy(policies: Sequence[PropagationPolicy], **resource: Unpack[Resource]
                 ) -> PropagationPolicy | None:
    """The PropagationPolicy that governs the resource, or None when none matches."""
    m = best_match(policies, **resource)
    return m.policy if m else None


def explain_match(policies: Sequence[PropagationPolicy], **resource: Unpack[Resource]) -> str:
    """One line: which policy applies and why, or why none does."""
    m = best_match(policies, **resource)
    if m is not None:
        return m.reason
    kind, namespace, name = resource["kind"], resource["namespace"], resource["name"]
    cluster = sum(1 for p in policies if isinstance(p, ClusterPropagationPolicy))
    in_ns = sum(1 for p in policies if p.metadata.namespace == namespace
                and not isinstance(p, ClusterPropagationPolicy))
    tail = f", {cluster} ClusterPropagationPolic{'y' if cluster == 1 else 'ies'}" if cluster else ""
    return (
        f"no PropagationPolicy in namespace {namespace} selects {kind} {namespace}/{name} "
        f"({in_ns} polic{'y' if in_ns == 1 else 'ies'} in that namespace, "
        f"{len(policies) - in_ns - cluster} elsewhere{tail})"
    )
