"""Ordered cluster groups (``placement.clusterAffinities``), Karmada release-1.18's rule.

Karmada's scheduler (pkg/scheduler/scheduler.go ``scheduleResourceBindingWithClusterAffinities``)
tries one group at a time, from the group the binding was last placed in (helper.go
``getAffinityIndex`` on ``status.schedulerObservedAffinityName``: the first group when none
or an unknown one) to the last, and stops at the first group where the workload fits; when
no group fits, the observed group stays as it was. So a gang goes to a later group only when
no cluster of the earlier ones can hold it, and a failover (the old cluster excluded) tries
the rest of its current group, then the next groups, never an earlier one. In a group, a
cluster of the inline affinity comes before one of its ``overflowAffinities``
(spreadconstraint ``getClusterOverflowOrder``). Pure: the caller ranks fits (``place_gang``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from fleetq.models import ClusterAffinity, ClusterAffinityTerm
from fleetq.placement import ClusterChoice
from fleetq.placement.filters import scope_rejection
from fleetq.rejection import Rejection, RejectionCode


@dataclass(frozen=True)
class GroupChoice:
    """Where one placement round lands: the group (``affinityName``; the observed group,
    unchanged, when none fits) and its clusters where the gang fits, best first."""

    group: str
    ranked: list[ClusterChoice]


def start_index(terms: Sequence[ClusterAffinityTerm], observed: str) -> int:
    """Karmada ``getAffinityIndex``: the observed group's index, else 0."""
    for i, term in enumerate(terms):
        if observed and term.affinityName == observed:
            return i
    return 0


def overflow_order(
    term: ClusterAffinityTerm, cluster: str, labels: Mapping[str, str]
) -> int | None:
    """0 for a cluster of the group's inline affinity, ``i + 1`` for one of its i-th
    overflow affinity, None when the group does not hold it (Karmada's ClusterAffinity
    filter plugin and ``getClusterOverflowOrder``)."""
    if term.allows(cluster, labels):
        return 0
    for i, overflow in enumerate(term.overflowAffinities or []):
        if overflow.allows(cluster, labels):
            return i + 1
    return None


def eligible(
    terms: Sequence[ClusterAffinityTerm],
    observed: str,
    labels: Mapping[str, Mapping[str, str]],
    exclude: Collection[str] = (),
) -> list[str]:
    """The clusters (of ``labels``: name -> labels) in a group this round may try, in
    name order: the observed group and the later ones, evicted clusters left out."""
    tried = terms[start_index(terms, observed):]
    return sorted(
        name
        for name, lab in labels.items()
        if name not in exclude and any(overflow_order(t, name, lab) is not None for t in tried)
    )


def outside(terms: Sequence[ClusterAffinityTerm], observed: str) -> Rejection:
    """Why a cluster in none of the groups this round tries is not considered."""
    first = terms[start_index(terms, observed)].affinityName if terms else ""
    if start_index(terms, observed) == 0:
        message = "not in any cluster group of clusterAffinities"
    else:
        message = f"not in cluster group {first} or a later one of clusterAffinities"
    return Rejection.of(RejectionCode.AFFINITY_MISMATCH, message, rule="clusterAffinities")


def choose(
    terms: Sequence[ClusterAffinityTerm],
    observed: str,
    ranked: Sequence[ClusterChoice],
    labels: Mapping[str, Mapping[str, str]],
) -> GroupChoice:
    """The first group, from the observed one on, holding a cluster where the gang fits
    (``ranked``: fits of every cluster, best first); its fits, inline clusters before
    overflow ones, each part in ``ranked`` order. None fits: the observed group, no fits."""
    for term in terms[start_index(terms, observed):]:
        inside = [
            (order, i, c)
            for i, c in enumerate(ranked)
            if (order := overflow_order(term, c.cluster, labels.get(c.cluster, {}))) is not None
        ]
        if inside:
            return GroupChoice(term.affinityName, [c for _, _, c in sorted(inside, key=_key)])
    return GroupChoice(observed, [])


def _key(item: tuple[int, int, ClusterChoice]) -> tuple[int, int]:
    return item[0], item[1]


def in_first(
    terms: Sequence[ClusterAffinityTerm], observed: str, cluster: str, labels: Mapping[str, str]
) -> bool:
    """Whether ``cluster`` is in the group this round starts with (where a capacity
    preemption makes room: the gang would go there first)."""
    return overflow_order(terms[start_index(terms, observed)], cluster, labels) is not None


@dataclass(frozen=True)
class RoundScope:
    """The members one placement round judges (name order), and why each other member is
    not even looked at."""

    judged: list[str]
    ruled_out: dict[str, Rejection]


def round_scope(
    labels: Mapping[str, Mapping[str, str]],
    exclude: Collection[str],
    affinity: ClusterAffinity | None,
    terms: Sequence[ClusterAffinityTerm],
    observed: str,
) -> RoundScope:
    """Which of the members (``labels``: name -> labels) a round judges: with
    clusterAffinities, those of the groups it may try (:func:`eligible`); else those in
    the clusterAffinity. Evicted clusters never (``placement.filters.scope_rejection``
    words every exclusion as the placement rule does)."""
    if terms:
        judged = eligible(terms, observed, labels, exclude)
        inside = set(judged)
        ruled_out = {
            name: (scope_rejection(name, lab, None, exclude) or outside(terms, observed))
            for name, lab in labels.items() if name not in inside
        }
        return RoundScope(judged, ruled_out)
    reasons = {name: scope_rejection(name, lab, affinity, exclude) for name, lab in labels.items()}
    return RoundScope(
        sorted(n for n, why in reasons.items() if why is None),
        {n: why for n, why in reasons.items() if why is not None},
    )
