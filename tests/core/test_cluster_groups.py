"""Ordered cluster groups (``placement.clusterAffinities``), pinned to Karmada release-1.18:
pkg/scheduler/scheduler.go ``scheduleResourceBindingWithClusterAffinities`` (try groups from
the observed one on, stop at the first that fits, keep the observed group when none does),
pkg/scheduler/helper.go ``getAffinityIndex`` (observed name -> index, else 0), and
pkg/scheduler/core/spreadconstraint/group_clusters.go ``getClusterOverflowOrder`` (inline
clusters before overflow ones)."""

from __future__ import annotations

from typing import Any

from fleetq import cluster_groups as cg
from fleetq.capacity import ClusterSnapshot, NodeCapacity
from fleetq.models import ClusterAffinity, ClusterAffinityTerm, Gang, GangPod, parse_object
from fleetq.placement import place_gang
from fleetq.rejection import RejectionCode

GI = 1024**3
LABELS: dict[str, dict[str, str]] = {
    "a1": {"tier": "primary"}, "a2": {"tier": "primary"},
    "b1": {"tier": "backup"}, "c1": {},
}


def term(name: str, **kw: Any) -> ClusterAffinityTerm:
    return ClusterAffinityTerm.model_validate({"affinityName": name, **kw})


GROUPS = [
    term("primary", labelSelector={"matchLabels": {"tier": "primary"}}),
    term("backup", clusterNames=["b1"]),
]


def snap(name: str, cpu: float) -> ClusterSnapshot:
    node = NodeCapacity("n0", {"cpu": int(cpu * 1000), "memory": 64 * GI})
    return ClusterSnapshot(name, labels=LABELS[name], nodes=[node])


def gang(cpu: float) -> Gang:
    return Gang((GangPod("master", 0, {"cpu": int(cpu * 1000), "memory": GI}),), priority=0)


def land(free: dict[str, float], need: float, observed: str = "",
         exclude: tuple[str, ...] = ()) -> cg.GroupChoice:
    """One placement round as plan_placement runs it: the eligible clusters, ranked by
    place_gang, then the first group that fits."""
    names = cg.eligible(GROUPS, observed, LABELS, exclude)
    ranked = place_gang(gang(need), [snap(n, free[n]) for n in names if n in free]).ranked
    return cg.choose(GROUPS, observed, ranked, LABELS)


def test_the_first_group_while_the_gang_fits_there() -> None:
    """scheduleResourceBindingWithClusterAffinities breaks at the first group that fits,
    even when a later group has more room."""
    got = land({"a1": 2, "a2": 1, "b1": 64}, need=2)
    assert (got.group, [c.cluster for c in got.ranked]) == ("primary", ["a1"])


def test_the_next_group_only_when_no_cluster_of_the_first_fits() -> None:
    got = land({"a1": 1, "a2": 1, "b1": 64}, need=2)
    assert (got.group, [c.cluster for c in got.ranked]) == ("backup", ["b1"])


def test_no_group_fits_keeps_the_observed_group() -> None:
    """Past the last group, Karmada restores rb.Status.SchedulerObservedAffinityName."""
    assert land({"a1": 1, "b1": 1}, need=2) == cg.GroupChoice("", [])
    assert land({"b1": 1}, need=2, observed="backup") == cg.GroupChoice("backup", [])


def test_failover_tries_the_rest_of_the_current_group_first() -> None:
    """The evicted cluster is excluded; the round starts at the observed group
    (getAffinityIndex), so a2 of the same group comes before backup."""
    got = land({"a1": 8, "a2": 8, "b1": 64}, need=2, observed="primary", exclude=("a1",))
    assert (got.group, [c.cluster for c in got.ranked]) == ("primary", ["a2"])
    got = land({"a1": 8, "a2": 1, "b1": 64}, need=2, observed="primary", exclude=("a1",))
    assert got.group == "backup"


def test_from_a_later_group_no_way_back_to_an_earlier_one() -> None:
    """getAffinityIndex starts at the observed group: the earlier groups are not tried
    (only a rescheduleTriggeredAt resets the index, which fleetq does not model)."""
    assert cg.eligible(GROUPS, "backup", LABELS) == ["b1"]
    got = land({"a1": 64, "b1": 1}, need=2, observed="backup")
    assert got == cg.GroupChoice("backup", [])
    why = cg.outside(GROUPS, "backup")
    assert why.code == RejectionCode.AFFINITY_MISMATCH
    assert why.message == "not in cluster group backup or a later one of clusterAffinities"


def test_an_unknown_observed_group_starts_at_the_first() -> None:
    """getAffinityIndex returns 0 for a name no term has (the policy was edited)."""
    assert cg.start_index(GROUPS, "gone") == 0
    assert cg.start_index(GROUPS, "") == 0
    assert cg.start_index(GROUPS, "backup") == 1


def test_clusters_in_no_group_are_never_eligible() -> None:
    assert cg.eligible(GROUPS, "", LABELS) == ["a1", "a2", "b1"]
    assert cg.outside(GROUPS, "").message == "not in any cluster group of clusterAffinities"


def test_inline_clusters_before_overflow_ones_in_a_group() -> None:
    """getClusterOverflowOrder: 0 for the inline affinity, i+1 for overflowAffinities[i];
    the ClusterAffinity filter plugin admits both. A better score does not jump the order."""
    group = term("g", clusterNames=["a1"],
                 overflowAffinities=[{"affinityName": "o", "clusterNames": ["c1"]}])
    assert cg.overflow_order(group, "a1", {}) == 0
    assert cg.overflow_order(group, "c1", {}) == 1
    assert cg.overflow_order(group, "b1", {}) is None
    ranked = place_gang(gang(1), [snap("a1", 64), snap("c1", 2)]).ranked
    assert [c.cluster for c in ranked] == ["c1", "a1"]  # c1 scores better (tighter) ...
    got = cg.choose([group], "", ranked, LABELS)
    assert [c.cluster for c in got.ranked] == ["a1", "c1"]  # ... a1 still comes first


def test_a_policy_with_groups_gives_no_not_used_warning() -> None:
    """The groups are honoured: the loader's "accepted, not yet used" line is gone."""
    from fleetq.models import upstream_warnings

    policy = parse_object({
        "apiVersion": "policy.karmada.io/v1alpha1", "kind": "PropagationPolicy",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"resourceSelectors": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob"}],
                 "placement": {"clusterAffinities": [
                     {"affinityName": "primary", "clusterNames": ["a1"]},
                     {"affinityName": "backup", "clusterNames": ["b1"]}]}},
    })
    assert upstream_warnings(policy) == []


def test_a_round_scope_rules_out_as_the_placement_rule_does() -> None:
    """One scope filter: a member the round does not look at is ruled out with the very
    rejection place_gang gives the same member when it is handed every snapshot."""
    affinity = ClusterAffinity(clusterNames=["a1", "a2", "b1"], exclude=["b1"])
    scope = cg.round_scope(LABELS, ["a2"], affinity, [], "")
    assert scope.judged == ["a1"]
    everything = place_gang(gang(1), [snap(n, 8) for n in LABELS], affinity=affinity,
                            exclude={"a2"})
    assert scope.ruled_out == everything.reasons
    assert {n: r.code for n, r in scope.ruled_out.items()} == {
        "a2": RejectionCode.EVICTED, "b1": RejectionCode.AFFINITY_MISMATCH,
        "c1": RejectionCode.AFFINITY_MISMATCH}


def test_a_round_scope_with_groups_tries_the_observed_group_and_later_ones() -> None:
    scope = cg.round_scope(LABELS, ["a1"], None, GROUPS, "backup")
    assert scope.judged == ["b1"]
    assert scope.ruled_out["a1"].code is RejectionCode.EVICTED
    assert scope.ruled_out["a2"] == cg.outside(GROUPS, "backup")
    assert scope.ruled_out["c1"] == cg.outside(GROUPS, "backup")
