"""Property tests of victim selection, checked against usage and fits recomputed here
from the inputs (not from the code under test):

* quota preemption: victims are distinct admitted jobs (whole gangs), never opted out,
  never of priority >= the preemptor's under a ``LowerPriority`` rule, priority victims
  only from the preemptor's node; once they are gone the preemptor fits and usage stays
  under every ``max``; the set is minimal (dropping any victim makes the preemptor not
  fit); the same input in another order gives the same plan; nothing is decided when the
  job fits already or the policy is off; and when nothing is decided, removing every
  lower-priority preemptible job of the preemptor's node would not have made it fit;
* capacity preemption: at most one cluster, its victims all on it, lower priority and
  preemptible; the gang did not fit anywhere before and fits node by node there once the
  victims' pods are given back; minimal; order-independent.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence

from hypothesis import event, given, settings
from hypothesis import strategies as st

from fleetq.capacity import ClusterSnapshot, NodeCapacity
from fleetq.models import Gang, GangPod
from fleetq.placement import place_gang
from fleetq.preemption import (
    EXACT_POOL,
    AdmittedJob,
    CapacityPlan,
    PreemptionMode,
    PreemptionPlan,
    PreemptionReason,
    Preemptor,
    QuotaNodeLimits,
    QuotaSnapshot,
    ReclaimMode,
    RunningGang,
    RunningPod,
    TreePreemptionPolicy,
    plan_capacity_preemption,
    plan_quota_preemption,
)
from tests.tiers import examples

CPU = "cpu"
JOBS = "kube-queue/max-jobs"
# root -> org-1 -> (team-1, team-2); root -> org-2 -> team-3; root -> team-4
PARENTS: dict[str, str | None] = {
    "root": None,
    "org-1": "root",
    "team-1": "org-1",
    "team-2": "org-1",
    "org-2": "root",
    "team-3": "org-2",
    "team-4": "root",
}
CHARGED = ["team-1", "team-2", "team-3", "team-4", "root"]
SETTINGS = settings(max_examples=300, deadline=None)
QUOTA_SETTINGS = settings(max_examples=examples(400), deadline=None)


def chain(node: str) -> list[str]:
    out = [node]
    while (p := PARENTS[out[-1]]) is not None:
        out.append(p)
    return out


def usage_of(jobs: Sequence[AdmittedJob]) -> dict[str, dict[str, int]]:
    usage: dict[str, dict[str, int]] = {n: {} for n in PARENTS}
    for j in jobs:
        for n in chain(j.node):
            for k, v in j.request.items():
                usage[n][k] = usage[n].get(k, 0) + v
    return usage


def fits(
    limits: Mapping[str, QuotaNodeLimits],
    jobs: Sequence[AdmittedJob],
    node: str,
    req: Mapping[str, int],
) -> bool:
    usage = usage_of(jobs)
    return all(
        usage[n].get(k, 0) + v <= limits[n].max[k]
        for n in chain(node)
        for k, v in req.items()
        if k in limits[n].max
    )


@st.composite
def quota_cases(draw: st.DrawFn) -> tuple[QuotaSnapshot, Preemptor]:
    """Random trees and admitted jobs (only states admission can reach: every job fitted
    when admitted). In about half the cases the preemptor's team is kept empty with its
    whole ``max`` guaranteed while the others fill the tree, so reclaim is exercised; in
    some the preemptor's own node is crowded with preemption on, so priority preemption
    is."""
    at = draw(st.sampled_from(CHARGED[:4]) | st.sampled_from(CHARGED))
    scenario = draw(st.sampled_from(["starve", "both", "crowd", "random"]))
    # "both": the preemptor's team guaranteed, holding some lower-priority jobs of its
    # own, the others borrowing: reclaim and priority preemption in one plan
    starve = scenario in ("starve", "both")
    nodes: list[QuotaNodeLimits] = []
    for name, parent in PARENTS.items():
        mx: dict[str, int] = {}
        mn: dict[str, int] = {}
        cap = draw(st.integers(3, 14) | st.none())
        if scenario == "crowd" and name == at:
            cap = draw(st.integers(2, 8))
        if cap is not None:
            mx[CPU] = cap * 1000
            mn[CPU] = draw(st.sampled_from([0, cap // 2, cap]) | st.integers(0, cap)) * 1000
        else:
            mn[CPU] = draw(st.integers(0, 8)) * 1000
        if starve:  # the preemptor's team guaranteed and idle, the others borrowing
            mn[CPU] = mx.get(CPU, 8000) if name == at else mn[CPU] // 4
        jobs_cap = draw(st.none() | st.integers(1, 4))
        if jobs_cap is not None:
            mx[JOBS] = jobs_cap * 1000
        nodes.append(QuotaNodeLimits(name, parent, mn, mx))
    limits = {n.name: n for n in nodes}
    admitted: list[AdmittedJob] = []
    for i in range(draw(st.integers(0, 40))):
        if scenario == "both" and i < 2:  # a little of its own, below its min
            node = at
        elif starve:
            node = draw(st.sampled_from([n for n in CHARGED if n != at]))
        elif scenario == "crowd":
            node = at
        else:
            node = draw(st.sampled_from(CHARGED))
        req = {CPU: draw(st.integers(1, 4)) * 1000, JOBS: 1000}
        if fits(limits, admitted, node, req):
            admitted.append(
                AdmittedJob(
                    f"j{i}",
                    node,
                    req,
                    draw(st.integers(0, 3)),
                    i,
                    draw(st.integers(0, 4)) > 0,  # mostly preemptible
                    draw(st.integers(0, 60)),
                )
            )
    weights = {
        n: float(draw(st.sampled_from([0.5, 2.0, 3.0])))
        for n in draw(st.lists(st.sampled_from(list(PARENTS)), max_size=3, unique=True))
    }
    preemption = draw(st.sampled_from(PreemptionMode))
    if scenario in ("crowd", "both"):
        preemption = PreemptionMode.LOWER_PRIORITY
    policy = TreePreemptionPolicy(preemption, draw(st.sampled_from(ReclaimMode)), weights)
    request = {CPU: draw(st.integers(1, 6)) * 1000, JOBS: 1000}
    preemptor = Preemptor("p", at, draw(st.just(4) | st.integers(0, 4)), request)
    return QuotaSnapshot(tuple(nodes), tuple(admitted), policy), preemptor


def shuffled(snap: QuotaSnapshot, perm: st.DataObject) -> QuotaSnapshot:
    nodes = perm.draw(st.permutations(snap.nodes))
    jobs = perm.draw(st.permutations(snap.admitted))
    return QuotaSnapshot(tuple(nodes), tuple(jobs), snap.policy)


@QUOTA_SETTINGS
@given(case=quota_cases(), perm=st.data())
def test_quota_victims_are_valid_minimal_and_deterministic(
    case: tuple[QuotaSnapshot, Preemptor], perm: st.DataObject
) -> None:
    snap, p = case
    limits = {n.name: n for n in snap.nodes}
    jobs = {j.job_id: j for j in snap.admitted}
    plan = plan_quota_preemption(snap, p)
    event("no plan" if plan is None else ", ".join(sorted({v.reason for v in plan.victims})))
    assert plan_quota_preemption(shuffled(snap, perm), p) == plan
    fits_now = fits(limits, snap.admitted, p.node, p.request)
    if fits_now or not snap.policy.enabled:
        assert plan is None
        return
    if plan is None:
        if snap.policy.preemption is PreemptionMode.LOWER_PRIORITY:
            rest = [
                j
                for j in snap.admitted
                if not (j.node == p.node and j.preemptible and j.priority < p.priority)
            ]
            assert not fits(limits, rest, p.node, p.request)
        return
    assert isinstance(plan, PreemptionPlan)
    ids = [v.job_id for v in plan.victims]
    assert ids and len(ids) == len(set(ids)) and set(ids) <= set(jobs)
    for v in plan.victims:
        job = jobs[v.job_id]
        assert job.preemptible
        assert (v.node, v.priority, v.grace_seconds) == (job.node, job.priority, job.grace_seconds)
        if v.reason is PreemptionReason.PRIORITY:
            assert snap.policy.preemption is PreemptionMode.LOWER_PRIORITY
            assert job.node == p.node and job.priority < p.priority
            assert v.message == f"priority {p.priority} > {job.priority}"
        else:
            assert v.reason is PreemptionReason.RECLAIM
            assert snap.policy.reclaim is not ReclaimMode.NEVER
            assert job.node not in chain(p.node) and p.node not in chain(job.node)
            if snap.policy.reclaim is ReclaimMode.LOWER_PRIORITY:
                assert job.priority < p.priority
            assert v.message == f"reclaim for {p.node} below min"
    rest = [j for j in snap.admitted if j.job_id not in ids]
    assert fits(limits, rest, p.node, p.request)
    after = usage_of([*rest, AdmittedJob("p", p.node, p.request, p.priority, 99)])
    for n, lim in limits.items():
        for k, m in lim.max.items():
            assert after[n].get(k, 0) <= m, (n, k)
    if any(v.reason is PreemptionReason.RECLAIM for v in plan.victims):
        # a plan that reclaims leaves the preemptor's node within its min, its own
        # victims gone: it never becomes a borrower to reclaim from in turn (Kueue's
        # ReclaimWithoutBorrowing, sigs.k8s.io/kueue v0.17.0 pkg/scheduler/preemption/
        # classical/hierarchical_preemption.go)
        assert after[p.node].get(CPU, 0) <= limits[p.node].min.get(CPU, 0)
    reasons = {v.job_id: v.reason for v in plan.victims}

    def enough(stopped: set[str]) -> bool:
        """The preemptor fits with ``stopped`` gone (within its min if one reclaims)."""
        rest = [j for j in snap.admitted if j.job_id not in stopped]
        if not fits(limits, rest, p.node, p.request):
            return False
        if all(reasons[v] is not PreemptionReason.RECLAIM for v in stopped):
            return True
        then = usage_of([*rest, AdmittedJob("p", p.node, p.request, p.priority, 99)])
        return then[p.node].get(CPU, 0) <= limits[p.node].min.get(CPU, 0)

    for vid in ids:  # minimal: every victim is needed
        assert not enough(set(ids) - {vid})


TEAMS = {"root": None, "team-1": "root", "team-2": "root"}


@st.composite
def reclaim_and_own_cases(draw: st.DrawFn) -> tuple[QuotaSnapshot, Preemptor]:
    """Kueue's baseline shape: two teams sharing a root exactly as big as their mins;
    team-1 below its min with a few lower-priority jobs of its own, team-2 borrowing the
    rest of the root; a higher-priority job of up to team-1's min arrives in team-1."""
    m1, m2 = draw(st.integers(4, 12)), draw(st.integers(0, 6))
    cap = (m1 + m2) * 1000
    nodes = (
        QuotaNodeLimits("root", None, {CPU: cap}, {CPU: cap}),
        QuotaNodeLimits("team-1", "root", {CPU: m1 * 1000}, {CPU: cap}),
        QuotaNodeLimits("team-2", "root", {CPU: m2 * 1000}, {CPU: cap}),
    )
    jobs: list[AdmittedJob] = []
    own = 0
    for i in range(draw(st.integers(0, 3))):
        size = draw(st.integers(1, 3))
        if own + size >= m1:
            break
        own += size
        jobs.append(AdmittedJob(f"own{i}", "team-1", {CPU: size * 1000},
                                draw(st.integers(0, 3)), i))
    left = m1 + m2 - own
    i = 0
    while left > 0:
        size = min(left, draw(st.integers(1, 4)))
        jobs.append(AdmittedJob(f"b{i}", "team-2", {CPU: size * 1000},
                                draw(st.integers(0, 9)), 10 + i))
        left -= size
        i += 1
    policy = TreePreemptionPolicy(PreemptionMode.LOWER_PRIORITY, ReclaimMode.ANY)
    request = {CPU: draw(st.integers(1, m1)) * 1000}
    return QuotaSnapshot(nodes, tuple(jobs), policy), Preemptor("p", "team-1", 5, request)


@QUOTA_SETTINGS
@given(case=reclaim_and_own_cases())
def test_a_team_below_min_is_served_by_reclaim_and_its_own_lower_priority_jobs(
    case: tuple[QuotaSnapshot, Preemptor],
) -> None:
    """A job that fits within its team's min once the team's own lower-priority jobs are
    gone always gets a plan when the root is full: reclaim from the borrower plus as many
    of its own as that needs, as Kueue (sigs.k8s.io/kueue v0.17.0 pkg/scheduler/
    preemption/preemption.go ``classicalPreemptions``: other-queue and same-queue
    candidates removed until the workload fits without borrowing). After the plan the
    team is within its min and the root within its max, and no victim is spare."""
    snap, p = case
    limits = {n.name: n for n in snap.nodes}
    usage = {n: sum(j.request[CPU] for j in snap.admitted if j.node == n) for n in TEAMS}
    assert usage["team-1"] < limits["team-1"].min[CPU]  # below its min: reclaim may serve it
    plan = plan_quota_preemption(snap, p)
    if sum(usage.values()) + p.request[CPU] <= limits["root"].max[CPU]:
        assert plan is None  # it fits now
        return
    assert plan is not None
    event(", ".join(sorted({v.reason for v in plan.victims})))
    reasons = {v.job_id: v.reason for v in plan.victims}
    jobs = {j.job_id: j for j in snap.admitted}

    def after(stopped: set[str]) -> dict[str, int]:
        out = {n: 0 for n in TEAMS}
        for j in snap.admitted:
            if j.job_id not in stopped:
                out[j.node] += j.request[CPU]
        out["team-1"] += p.request[CPU]
        return out

    def enough(stopped: set[str]) -> bool:
        then = after(stopped)
        if then["team-1"] + then["team-2"] > limits["root"].max[CPU]:
            return False
        reclaims = any(reasons[v] is PreemptionReason.RECLAIM for v in stopped)
        return not reclaims or then["team-1"] <= limits["team-1"].min[CPU]

    ids = set(reasons)
    assert enough(ids)
    for vid, why in reasons.items():
        assert (jobs[vid].node == "team-1") == (why is PreemptionReason.PRIORITY)
        assert not enough(ids - {vid})  # minimal


# --------------------------------------------------------------------------- capacity


def given_back(snap: ClusterSnapshot, gangs: Sequence[RunningGang]) -> ClusterSnapshot:
    nodes = {n.name: dataclasses.replace(n, requested=dict(n.requested)) for n in snap.nodes}
    for g in gangs:
        for pod in g.pods:
            n = nodes[pod.node]
            n.requested[CPU] -= pod.requests[CPU]
            n.pods_used -= 1
    return ClusterSnapshot(snap.name, nodes=list(nodes.values()))


@st.composite
def capacity_cases(draw: st.DrawFn) -> tuple[Gang, list[ClusterSnapshot], list[RunningGang]]:
    clusters: list[ClusterSnapshot] = []
    running: list[RunningGang] = []
    for c in range(draw(st.integers(1, 3))):
        name = f"cluster-{'abc'[c]}"
        nodes = [
            NodeCapacity(f"{name}-n{i}", {CPU: draw(st.integers(2, 8)) * 1000}, {CPU: 0})
            for i in range(draw(st.integers(1, 3)))
        ]
        for g in range(draw(st.integers(0, 8))):
            pods: list[RunningPod] = []
            want = [draw(st.integers(1, 4)) * 1000 for _ in range(draw(st.integers(1, 2)))]
            taken: dict[str, int] = {}
            for q in want:  # first fit; a gang that does not fit is not running
                for n in nodes:
                    free = n.allocatable[CPU] - n.requested[CPU] - taken.get(n.name, 0)
                    if free >= q:
                        taken[n.name] = taken.get(n.name, 0) + q
                        pods.append(RunningPod(n.name, {CPU: q}))
                        break
            if len(pods) < len(want):
                continue
            for pod in pods:
                node = next(n for n in nodes if n.name == pod.node)
                node.requested[CPU] += pod.requests[CPU]
                node.pods_used += 1
            running.append(
                RunningGang(
                    f"{name}-g{g}",
                    name,
                    draw(st.integers(0, 3)),
                    tuple(pods),
                    float(draw(st.integers(0, 100))),
                    draw(st.integers(0, 4)) > 0,  # mostly preemptible
                )
            )
        clusters.append(ClusterSnapshot(name, nodes=nodes))
    gang = Gang(
        tuple(
            GangPod("worker", i, {CPU: draw(st.integers(2, 7)) * 1000})
            for i in range(draw(st.integers(1, 3)))
        ),
        draw(st.just(4) | st.integers(1, 4)),
    )
    return gang, clusters, running


@SETTINGS
@given(case=capacity_cases(), perm=st.data())
def test_capacity_preemption_uses_one_cluster_where_the_gang_then_fits(
    case: tuple[Gang, list[ClusterSnapshot], list[RunningGang]], perm: st.DataObject
) -> None:
    gang, clusters, running = case
    plan = plan_capacity_preemption("p", gang, clusters, running, now=200.0)
    event("no plan" if plan is None else f"{len(plan.victims)} victim(s)")
    again = plan_capacity_preemption(
        "p",
        gang,
        perm.draw(st.permutations(clusters)),
        perm.draw(st.permutations(running)),
        now=200.0,
    )
    assert again == plan
    if plan is None:
        return
    assert isinstance(plan, CapacityPlan)
    assert place_gang(gang, clusters).best is None  # only when no cluster had room
    on = {g.job_id: g for g in running if g.cluster == plan.cluster}
    ids = [v.job_id for v in plan.victims]
    assert ids and len(ids) == len(set(ids)) and set(ids) <= set(on)
    for v in plan.victims:
        assert v.cluster == plan.cluster and v.reason is PreemptionReason.CAPACITY
        assert on[v.job_id].preemptible and on[v.job_id].priority < gang.priority
    snap = next(c for c in clusters if c.name == plan.cluster)
    freed = given_back(snap, [on[i] for i in ids])
    got = place_gang(gang, [freed]).best
    assert got is not None and got.assignment == plan.choice.assignment
    for vid in ids:
        assert place_gang(gang, [given_back(snap, [on[i] for i in ids if i != vid])]).best is None


@SETTINGS
@given(case=capacity_cases())
def test_capacity_victims_are_the_set_losing_least_work(
    case: tuple[Gang, list[ClusterSnapshot], list[RunningGang]],
) -> None:
    """Issue 24: on the chosen cluster, no set of candidates (preemptible, of lower
    priority, none above the plan's highest victim priority) that lets the gang fit
    loses less work, or as little with fewer victims; brute force over every subset
    (the generated pools are within ``EXACT_POOL``)."""
    gang, clusters, running = case
    now = 200.0
    plan = plan_capacity_preemption("p", gang, clusters, running, now=now)
    if plan is None:
        return
    snap = next(c for c in clusters if c.name == plan.cluster)
    top = max(v.priority for v in plan.victims)
    pool = [g for g in running if g.cluster == plan.cluster and g.preemptible
            and g.priority < gang.priority and g.priority <= top]
    assert len(pool) <= EXACT_POOL
    on = {g.job_id: g for g in pool}
    chosen = [on[v.job_id] for v in plan.victims]

    def cost(gs: Sequence[RunningGang]) -> tuple[float, int]:
        return round(sum(g.work(now) for g in gs), 6), len(gs)

    best = min(
        (cost(combo) for n in range(1, len(pool) + 1)
         for combo in itertools.combinations(pool, n)
         if place_gang(gang, [given_back(snap, combo)]).best is not None),
    )
    event(f"{len(chosen)} victim(s) of {len(pool)}")
    assert cost(chosen) == best
