"""Preemption decisions: which admitted gangs give way, for whom, and why (issue 18).

A waiting job may take quota (priority preemption within its node, reclaim across the
tree) or member capacity (:func:`plan_capacity_preemption`) from running gangs; this
module only *decides*, once and deterministically. The quota workflow carries the plans
out and the simulator replays the same decisions in virtual time, so the rules live in
one pure place: no Temporal, no I/O, no clock (time is an argument), no randomness.

Policy: the tree's ``fleetq.io/preemption``, ``fleetq.io/reclaim`` and
``fleetq.io/fair-share-weight``, the job's ``fleetq.io/preemptible`` and
``preemption-grace-seconds``. Victim order, minimality and fair share follow Kueue's
(docs/preemption.md "What is decided"; property tests in tests/core).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from fleetq import resources as R
from fleetq.admission import Admission, AdmissionRequest, PendingPlan, PlannedVictim
from fleetq.capacity import ClusterSnapshot, NodeCapacity
from fleetq.models import ClusterAffinity, ElasticQuotaTree, Gang, ManifestError, PyTorchJob

if TYPE_CHECKING:  # placement (numpy) only where capacity preemption places a gang, so
    # that reading a manifest's preemption annotations (fleetq validate/apply) loads none
    from fleetq.placement import ClusterChoice, PlacementIndex, TolerationLike

__all__ = [
    "EXACT_POOL",
    "DEFAULT_GRACE_SECONDS",
    "FAIR_SHARE_WEIGHT_ANNOTATION",
    "GRACE_ANNOTATION",
    "PREEMPTIBLE_ANNOTATION",
    "PREEMPTION_ANNOTATION",
    "RECLAIM_ANNOTATION",
    "AdmittedJob",
    "CapacityPlan",
    "HolderInfo",
    "JobPreemptionPolicy",
    "PreemptionMode",
    "PreemptionPlan",
    "PreemptionReason",
    "Preemptor",
    "QuotaNodeLimits",
    "QuotaSnapshot",
    "ReclaimMode",
    "RunningGang",
    "RunningPod",
    "TreePreemptionPolicy",
    "Victim",
    "fair_share_order",
    "fair_sharing_weights",
    "holder_infos",
    "pending_plan",
    "plan_of",
    "plan_preemptions",
    "job_policy",
    "job_policy_from_annotations",
    "plan_capacity_preemption",
    "plan_for_request",
    "plan_quota_preemption",
    "preemptor_from_request",
    "snapshot_after",
    "snapshot_from_admission",
    "tree_policy",
    "weighted_shares",
]

PREEMPTION_ANNOTATION = "fleetq.io/preemption"
RECLAIM_ANNOTATION = "fleetq.io/reclaim"
FAIR_SHARE_WEIGHT_ANNOTATION = "fleetq.io/fair-share-weight"
PREEMPTIBLE_ANNOTATION = "fleetq.io/preemptible"
GRACE_ANNOTATION = "fleetq.io/preemption-grace-seconds"
DEFAULT_GRACE_SECONDS = 30
#: Longest grace period accepted (one day), so a typo cannot park a preemptor for years.
MAX_GRACE_SECONDS = 86_400


# --------------------------------------------------------------------------- policy


class PreemptionMode(StrEnum):
    NEVER = "Never"
    LOWER_PRIORITY = "LowerPriority"


class ReclaimMode(StrEnum):
    NEVER = "Never"
    LOWER_PRIORITY = "LowerPriority"
    ANY = "Any"


class PreemptionReason(StrEnum):
    """Why a victim is preempted (the metric label; :attr:`Victim.message` says more)."""

    PRIORITY = "Priority"  # a higher-priority job of the same quota node
    RECLAIM = "Reclaim"  # a node below its min takes back borrowed quota
    CAPACITY = "Capacity"  # a higher-priority gang needs room on a member cluster


@dataclass(frozen=True)
class TreePreemptionPolicy:
    """The tree's preemption policy; ``weights`` holds the nodes with a weight other
    than the default 1."""

    preemption: PreemptionMode = PreemptionMode.NEVER
    reclaim: ReclaimMode = ReclaimMode.NEVER
    weights: Mapping[str, float] = field(default_factory=dict)

    @property
    def enabled(self) -> bool:
        return self.preemption is not PreemptionMode.NEVER or self.reclaim is not ReclaimMode.NEVER

    def weight(self, node: str) -> float:
        return self.weights.get(node, 1.0)


@dataclass(frozen=True)
class JobPreemptionPolicy:
    """A job's own say: whether it may be a victim and how long it gets to stop."""

    preemptible: bool = True
    grace_seconds: int = DEFAULT_GRACE_SECONDS


def _field(key: str) -> str:
    return f"metadata.annotations.{key}"


def _got(value: str) -> str:
    return repr(value[:32])


def _tree_ref(tree: ElasticQuotaTree) -> str:
    return f"ElasticQuotaTree {tree.metadata.namespace or 'default'}/{tree.metadata.name}"


def _tree_nodes(tree: ElasticQuotaTree) -> list[str]:
    out: list[str] = []
    stack = [tree.spec.root]
    while stack:
        node = stack.pop()
        out.append(node.name)
        stack.extend(reversed(node.children))
    return out


def _parse_weights(ref: str, value: str, nodes: Collection[str]) -> dict[str, float]:
    where = _field(FAIR_SHARE_WEIGHT_ANNOTATION)
    weights: dict[str, float] = {}
    for item in value.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, number = (p.strip() for p in item.partition("="))
        if not sep or not name:
            raise ManifestError(
                ref, where, f"must be node=weight pairs separated by commas, got {_got(item)}"
            )
        if name not in nodes:
            raise ManifestError(ref, where, f"names no node of the tree: {_got(name)}")
        if name in weights:
            raise ManifestError(ref, where, f"gives node {name!r} a weight twice")
        try:
            weight = float(number)
        except ValueError:
            weight = math.nan
        if not (math.isfinite(weight) and weight > 0):
            raise ManifestError(
                ref, where, f"weight of {name!r} must be a positive number, got {_got(number)}"
            )
        weights[name] = weight
    return {k: v for k, v in weights.items() if v != 1.0}


def tree_policy(tree: ElasticQuotaTree | None) -> TreePreemptionPolicy:
    """The preemption policy written on ``tree`` (``Never``/``Never`` without a tree).
    A bad value raises one :class:`~fleetq.models.ManifestError` naming the tree and the
    annotation, e.g. ``ElasticQuotaTree kube-system/t: metadata.annotations.fleetq.io/
    reclaim must be Never, LowerPriority or Any, got 'always'``."""
    if tree is None:
        return TreePreemptionPolicy()
    ref = _tree_ref(tree)
    notes = tree.metadata.annotations
    raw = notes.get(PREEMPTION_ANNOTATION, PreemptionMode.NEVER.value)
    try:
        preemption = PreemptionMode(raw)
    except ValueError:
        raise ManifestError(
            ref, _field(PREEMPTION_ANNOTATION), f"must be Never or LowerPriority, got {_got(raw)}"
        ) from None
    raw = notes.get(RECLAIM_ANNOTATION, ReclaimMode.NEVER.value)
    try:
        reclaim = ReclaimMode(raw)
    except ValueError:
        raise ManifestError(
            ref,
            _field(RECLAIM_ANNOTATION),
            f"must be Never, LowerPriority or Any, got {_got(raw)}",
        ) from None
    weights: dict[str, float] = {}
    raw_weights = notes.get(FAIR_SHARE_WEIGHT_ANNOTATION)
    if raw_weights is not None:
        weights = _parse_weights(ref, raw_weights, set(_tree_nodes(tree)))
    return TreePreemptionPolicy(preemption, reclaim, weights)


def fair_sharing_weights(tree: ElasticQuotaTree | None) -> dict[str, float] | None:
    """The weights admission shares borrowed quota by (:attr:`fleetq.admission.Admission.
    fair_weights`), or None when fair sharing is off: it is on when the tree turns
    preemption or reclaim on, or names weights (``fleetq.io/fair-share-weight``); a
    node it does not name weighs 1. Off for a tree whose annotations cannot be read
    (a tree is checked when it is applied)."""
    try:
        policy = tree_policy(tree)
    except ManifestError:
        return None
    if tree is None:
        return None
    if not policy.enabled and FAIR_SHARE_WEIGHT_ANNOTATION not in tree.metadata.annotations:
        return None
    return dict(policy.weights)


def job_policy_from_annotations(ref: str, annotations: Mapping[str, str]) -> JobPreemptionPolicy:
    """A job's :class:`JobPreemptionPolicy` from its annotations; ``ref`` names the job
    in the error (``PyTorchJob default/x``)."""
    raw = annotations.get(PREEMPTIBLE_ANNOTATION, "true")
    if raw not in ("true", "false"):
        raise ManifestError(
            ref, _field(PREEMPTIBLE_ANNOTATION), f'must be "true" or "false", got {_got(raw)}'
        )
    raw_grace = annotations.get(GRACE_ANNOTATION)
    grace = DEFAULT_GRACE_SECONDS
    if raw_grace is not None:
        text = raw_grace.strip()
        if not (text.isascii() and text.isdigit() and int(text) <= MAX_GRACE_SECONDS):
            raise ManifestError(
                ref,
                _field(GRACE_ANNOTATION),
                f"must be a whole number of seconds between 0 and {MAX_GRACE_SECONDS}, "
                f"got {_got(raw_grace)}",
            )
        grace = int(text)
    return JobPreemptionPolicy(preemptible=raw == "true", grace_seconds=grace)


def job_policy(job: PyTorchJob) -> JobPreemptionPolicy:
    """:func:`job_policy_from_annotations` of a PyTorchJob."""
    return job_policy_from_annotations(f"PyTorchJob {job.ref}", job.metadata.annotations)


# --------------------------------------------------------------------------- quota model


@dataclass(frozen=True)
class QuotaNodeLimits:
    """One node of the quota tree: where it hangs and its limits (milli-units)."""

    name: str
    parent: str | None
    min: Mapping[str, int] = field(default_factory=dict)
    max: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class AdmittedJob:
    """One admitted job (a whole gang) as a possible victim.

    ``request`` is its quota request (``fleetq.models.quota_request``, with its
    ``kube-queue/max-jobs``); ``node`` the node it is charged to; ``admitted_seq`` orders
    admissions (larger = admitted later)."""

    job_id: str
    node: str
    request: Mapping[str, int]
    priority: int
    admitted_seq: int
    preemptible: bool = True
    grace_seconds: int = DEFAULT_GRACE_SECONDS


@dataclass(frozen=True)
class QuotaSnapshot:
    """The quota tree, its admitted jobs and its policy, as a decision sees them.

    Usage is derived from ``admitted`` (charged to the job's node and every ancestor),
    as :class:`fleetq.quota.QuotaTree` keeps it."""

    nodes: tuple[QuotaNodeLimits, ...]
    admitted: tuple[AdmittedJob, ...]
    policy: TreePreemptionPolicy = TreePreemptionPolicy()


@dataclass(frozen=True)
class Preemptor:
    """The waiting job that may preempt: its quota node, priority and quota request."""

    job_id: str
    node: str
    priority: int
    request: Mapping[str, int]


@dataclass(frozen=True)
class Victim:
    """One gang to preempt, for whom, and why (``message`` is the event text:
    ``priority 1000 > 10``, ``reclaim for child-1 below min``)."""

    job_id: str
    preemptor: str
    reason: PreemptionReason
    message: str
    priority: int
    grace_seconds: int
    node: str = ""  # quota node charged (quota preemption)
    cluster: str = ""  # member cluster (capacity preemption)


@dataclass(frozen=True)
class PreemptionPlan:
    """Quota preemption decided for one waiting job: admit it once every victim has
    released its quota."""

    preemptor: str
    node: str
    victims: tuple[Victim, ...]
    priority: int = 0
    request: Mapping[str, int] = field(default_factory=dict)

    @property
    def reasons(self) -> dict[PreemptionReason, int]:
        out: dict[PreemptionReason, int] = {}
        for v in self.victims:
            out[v.reason] = out.get(v.reason, 0) + 1
        return out


class _Tree:
    """Index over a snapshot: nodes, chains (node then ancestors) and usage."""

    def __init__(self, snap: QuotaSnapshot) -> None:
        self.nodes: dict[str, QuotaNodeLimits] = {}
        for n in snap.nodes:
            if n.name in self.nodes:
                raise ValueError(f"quota node {n.name!r} is given twice")
            self.nodes[n.name] = n
        self.chain: dict[str, tuple[str, ...]] = {}
        for name in self.nodes:
            chain = [name]
            while (parent := self.nodes[chain[-1]].parent) is not None:
                if parent not in self.nodes:
                    raise ValueError(f"quota node {chain[-1]!r} has unknown parent {parent!r}")
                if parent in chain:
                    raise ValueError(f"quota node {name!r} is its own ancestor")
                chain.append(parent)
            self.chain[name] = tuple(chain)
        self.usage: dict[str, R.Resources] = {name: {} for name in self.nodes}
        self.jobs: dict[str, AdmittedJob] = {}
        #: the admitted jobs by node (a preemptor's own candidates without a tree walk)
        self.at_node: dict[str, dict[str, AdmittedJob]] = {}
        #: above every admitted job's ``admitted_seq``
        self.next_seq = 0
        for job in snap.admitted:
            if job.job_id in self.jobs:
                raise ValueError(f"admitted job {job.job_id!r} is given twice")
            if job.node not in self.nodes:
                raise ValueError(f"admitted job {job.job_id!r} is charged to unknown {job.node!r}")
            self.add(job)

    def add(self, job: AdmittedJob) -> None:
        """Admit ``job``: listed and charged."""
        self.jobs[job.job_id] = job
        self.at_node.setdefault(job.node, {})[job.job_id] = job
        self.next_seq = max(self.next_seq, job.admitted_seq + 1)
        self.charge(self.usage, job, 1)

    def remove(self, job_id: str) -> None:
        """``job_id`` gone (if admitted): its quota back."""
        job = self.jobs.pop(job_id, None)
        if job is not None:
            del self.at_node[job.node][job_id]
            self.charge(self.usage, job, -1)

    def charge(self, usage: dict[str, R.Resources], job: AdmittedJob, sign: int) -> None:
        for n in self.chain[job.node]:
            R.add_into(usage[n], job.request, sign)

    def fits(self, usage: Mapping[str, R.Resources], node: str, request: Mapping[str, int]) -> bool:
        for n in self.chain[node]:  # noqa: SIM110 - a loop for speed, as QuotaTree.fits
            if not R.within_max(request, usage[n], self.nodes[n].max):
                return False
        return True

    def below_min(self, usage: Mapping[str, R.Resources], node: str) -> bool:
        """As :meth:`fleetq.quota.QuotaNode.below_min`."""
        positive = [(k, v) for k, v in self.nodes[node].min.items() if v > 0]
        return bool(positive) and all(usage[node].get(k, 0) < v for k, v in positive)

    def mentions(self, node: str, k: str) -> bool:
        """Whether ``node``'s quota names resource ``k`` (in ``min`` or ``max``): a
        resource it does not name is neither guaranteed nor limited there."""
        spec = self.nodes[node]
        return k in spec.min or k in spec.max

    def within_min_after(
        self, usage: Mapping[str, R.Resources], node: str, request: Mapping[str, int]
    ) -> bool:
        """Whether ``node`` stays within its ``min`` once ``request`` is charged to it,
        in every requested resource its quota names (a resource only ``max`` names is
        guaranteed 0; ``kube-queue/max-jobs`` counts only where ``min`` names it)."""
        spec, us = self.nodes[node], usage[node]
        for k, v in request.items():
            if v <= 0 or not self.mentions(node, k):
                continue
            if k == R.MAX_JOBS and k not in spec.min:
                continue
            if us.get(k, 0) + v > spec.min.get(k, 0):
                return False
        return True

    def borrows(self, usage: Mapping[str, R.Resources], node: str, asks: Sequence[str]) -> bool:
        """Whether ``node`` uses more than its ``min`` in one of ``asks`` that its quota
        names; a node naming none of them guarantees nothing and counts as borrowing."""
        named = [k for k in asks if self.mentions(node, k)]
        mins, us = self.nodes[node].min, usage[node]
        return not named or any(us.get(k, 0) > mins.get(k, 0) for k in named)

    def drs(self, usage: Mapping[str, R.Resources], node: str) -> float:
        """Dominant resource share of quota borrowed above ``min``, relative to what the
        parent can share (its ``max``, else its ``min``); 0 for the root."""
        spec = self.nodes[node]
        if spec.parent is None:
            return 0.0
        parent = self.nodes[spec.parent]
        best = 0.0
        for k, used in usage[node].items():
            if k == R.MAX_JOBS:
                continue
            borrowed = used - spec.min.get(k, 0)
            pool = parent.max.get(k) or parent.min.get(k) or 0
            if borrowed > 0 and pool > 0:
                best = max(best, borrowed / pool)
        return best

    def weighted(
        self, usage: Mapping[str, R.Resources], node: str, policy: TreePreemptionPolicy
    ) -> float:
        return self.drs(usage, node) / policy.weight(node)


def weighted_shares(snapshot: QuotaSnapshot) -> dict[str, float]:
    """Every node's dominant resource share of borrowed quota divided by its weight
    (0 for a node within its ``min``), in snapshot order."""
    tree = _Tree(snapshot)
    return {n: tree.weighted(tree.usage, n, snapshot.policy) for n in tree.nodes}


def fair_share_order(
    snapshot: QuotaSnapshot, wanting: Iterable[tuple[str, Mapping[str, int]]]
) -> list[str]:
    """Nodes wanting the same idle quota, in the order they should get it: lowest
    weighted share first, each counted *as if its request were admitted* (as Kueue's
    fair sharing ranks admissions), then the share without it, then node name.
    ``wanting`` holds ``(node, request)`` pairs, one per node (e.g. each queue's head);
    a node named twice keeps its first request."""
    tree = _Tree(snapshot)
    seen: dict[str, Mapping[str, int]] = {}
    for node, request in wanting:
        if node not in tree.nodes:
            raise KeyError(f"quota tree has no node {node!r}")
        seen.setdefault(node, request)

    def key(item: tuple[str, Mapping[str, int]]) -> tuple[float, float, str]:
        node, request = item
        after = {node: R.add(tree.usage[node], request)}
        share_after = tree.drs(after, node) / snapshot.policy.weight(node)
        return share_after, tree.weighted(tree.usage, node, snapshot.policy), node

    return [node for node, _ in sorted(seen.items(), key=key)]


def _victim_key(job: AdmittedJob) -> tuple[int, int, str]:
    return job.priority, -job.admitted_seq, job.job_id


def _lca_path(tree: _Tree, node: str, other: str) -> tuple[str, ...] | None:
    """``node``'s chain strictly below its lowest common ancestor with ``other``; None
    when ``node`` is ``other``'s ancestor or descendant (or ``other`` itself)."""
    others = set(tree.chain[other])
    path: list[str] = []
    for n in tree.chain[node]:
        if n in others:
            break
        path.append(n)
    if not path or other in tree.chain[node]:
        return None
    return tuple(path)


def plan_quota_preemption(snapshot: QuotaSnapshot, preemptor: Preemptor) -> PreemptionPlan | None:
    """The victims whose quota, once released, lets ``preemptor`` be admitted, or None
    when it fits already, the policy allows no preemption for it, or it would not fit
    even with every candidate gone. See the module docstring for the rules."""
    return _plan_on(_Tree(snapshot), snapshot.policy, preemptor)


def _after_plan(tree: _Tree, plan: PreemptionPlan) -> None:
    """``tree`` as :func:`snapshot_after` would make it with ``plan`` added: its
    victims gone, its (waiting) preemptor admitted, never a victim itself."""
    for v in plan.victims:
        tree.remove(v.job_id)
    tree.add(AdmittedJob(plan.preemptor, plan.node, dict(plan.request), plan.priority,
                         tree.next_seq, False))


class _UsageDraft(dict[str, R.Resources]):
    """A usage map to plan on: a node's usage is copied from ``base`` when first read, so
    a plan costs the nodes it looks at, not the whole tree (a plan per waiting preemptor
    per pass, at 1,000 leaves). Read it by ``draft[node]`` only."""

    def __init__(self, base: Mapping[str, R.Resources]) -> None:
        super().__init__()
        self.base = base

    def __missing__(self, node: str) -> R.Resources:
        got = self[node] = dict(self.base[node])
        return got

    def copy_now(self) -> _UsageDraft:
        """An independent draft equal to this one as it stands."""
        out = _UsageDraft(self.base)
        out.update((n, dict(u)) for n, u in self.items())
        return out


def _plan_on(
    tree: _Tree, policy: TreePreemptionPolicy, preemptor: Preemptor
) -> PreemptionPlan | None:
    """:func:`plan_quota_preemption` on an index already built (not changed)."""
    node = preemptor.node
    if node not in tree.nodes:
        raise KeyError(f"quota tree has no node {node!r}")
    request = preemptor.request
    usage = _UsageDraft(tree.usage)
    if tree.fits(usage, node, request) or not policy.enabled:
        return None
    own = _priority_candidates(tree, policy, preemptor)
    reclaim, paths = _reclaim_candidates(tree, policy, preemptor, usage, own)
    chosen = _take_until_fit(tree, policy, preemptor, usage, own, reclaim, paths)
    if chosen is None:
        return None
    _drop_unneeded(tree, usage, node, request, chosen)
    victims = tuple(
        _victim(preemptor, job, reason)
        for job, reason in sorted(chosen, key=lambda c: _victim_key(c[0]))
    )
    return PreemptionPlan(
        preemptor=preemptor.job_id,
        node=node,
        victims=victims,
        priority=preemptor.priority,
        request=dict(request),
    )


def _priority_candidates(
    tree: _Tree, policy: TreePreemptionPolicy, preemptor: Preemptor
) -> list[AdmittedJob]:
    """Priority preemption: lower-priority jobs of the preemptor's own node."""
    if policy.preemption is not PreemptionMode.LOWER_PRIORITY:
        return []
    return sorted(
        (
            j
            for j in tree.at_node.get(preemptor.node, {}).values()
            if j.preemptible
            and j.priority < preemptor.priority
            and j.job_id != preemptor.job_id
        ),
        key=_victim_key,
    )


def _reclaim_candidates(
    tree: _Tree,
    policy: TreePreemptionPolicy,
    preemptor: Preemptor,
    usage: dict[str, R.Resources],
    own: Sequence[AdmittedJob],
) -> tuple[dict[str, list[AdmittedJob]], dict[str, tuple[str, ...]]]:
    """Reclaim: jobs of borrowers elsewhere in the tree, by node, with each node's path
    up to its common ancestor with the preemptor's node. Only for a node below its
    ``min`` now that is within it once the preemptor is admitted and its ``own`` priority
    candidates are gone (a plan that reclaims takes as many of them as that needs:
    :func:`_fits_plan`), as Kueue's ``ReclaimWithoutBorrowing`` candidates (sigs.k8s.io/kueue
    v0.17.0 pkg/scheduler/preemption/classical/hierarchical_preemption.go: "after all
    preemptions and the admission of the incoming workload")."""
    node, request = preemptor.node, preemptor.request
    reclaim: dict[str, list[AdmittedJob]] = {}
    paths: dict[str, tuple[str, ...]] = {}
    if policy.reclaim is ReclaimMode.NEVER or not tree.below_min(usage, node):
        return reclaim, paths
    bare = {node: dict(usage[node])}
    for j in own:
        R.add_into(bare[node], j.request, -1)
    if not tree.within_min_after(bare, node, request):
        return reclaim, paths
    for j in sorted(tree.jobs.values(), key=_victim_key):
        if not j.preemptible or j.job_id == preemptor.job_id:
            continue
        if policy.reclaim is ReclaimMode.LOWER_PRIORITY and j.priority >= preemptor.priority:
            continue
        if j.node not in paths:
            path = _lca_path(tree, j.node, node)
            if path is None:
                continue
            paths[j.node] = path
        reclaim.setdefault(j.node, []).append(j)
    return reclaim, paths


def _take_until_fit(
    tree: _Tree,
    policy: TreePreemptionPolicy,
    preemptor: Preemptor,
    usage: _UsageDraft,
    own: list[AdmittedJob],
    reclaim: dict[str, list[AdmittedJob]],
    paths: dict[str, tuple[str, ...]],
) -> list[tuple[AdmittedJob, PreemptionReason]] | None:
    """Take reclaim candidates (from the most over-share borrower still borrowing), then
    priority candidates, until the preemptor fits (:func:`_fits_plan`); None if it never
    does. Where its node would pass its ``min`` with its own jobs kept, a plan that
    reclaims must stop some of them anyway, so reclaim stops once the preemptor would fit
    with all of them gone, and they make the rest of the room. ``usage`` is left without
    the chosen jobs."""
    node, request = preemptor.node, preemptor.request
    asks = [k for k, v in request.items() if v > 0 and k != R.MAX_JOBS]
    chosen: list[tuple[AdmittedJob, PreemptionReason]] = []
    # (reclaim victims are never on the preemptor's own path: its node's usage is only
    # changed by its own jobs)
    own_needed = bool(reclaim) and not tree.within_min_after(usage, node, request)
    bare = usage
    if own_needed:
        bare = usage.copy_now()
        for job in own:
            tree.charge(bare, job, -1)

    def still_borrowing(n: str) -> bool:  # every node on its way up borrows
        return all(tree.borrows(usage, p, asks) for p in paths[n])

    # taking a job changes usage on its chain only: what depends on other nodes is kept
    borrowing = {n: still_borrowing(n) for n in reclaim}
    weight = {n: tree.weighted(usage, n, policy) for n in reclaim}
    fitted = False
    while reclaim and not fitted:
        open_nodes = [n for n in reclaim if borrowing[n]]
        if not open_nodes:
            break
        target = min(open_nodes, key=lambda n: (-weight[n], n))
        job = reclaim[target].pop(0)
        if not reclaim[target]:
            del reclaim[target]
        chosen.append((job, PreemptionReason.RECLAIM))
        tree.charge(usage, job, -1)
        touched = set(tree.chain[job.node])
        for n in reclaim:
            if not touched.isdisjoint(paths[n]):
                borrowing[n] = still_borrowing(n)
            if n in touched:
                weight[n] = tree.weighted(usage, n, policy)
        if own_needed:
            tree.charge(bare, job, -1)
        fitted = _fits_plan(tree, bare, node, request, reclaims=True)
    reclaims = bool(chosen)
    fitted = _fits_plan(tree, usage, node, request, reclaims=reclaims)
    for job in own:
        if fitted:
            break
        chosen.append((job, PreemptionReason.PRIORITY))
        tree.charge(usage, job, -1)
        fitted = _fits_plan(tree, usage, node, request, reclaims=reclaims)
    return chosen if fitted else None


def _fits_plan(
    tree: _Tree,
    usage: Mapping[str, R.Resources],
    node: str,
    request: Mapping[str, int],
    *,
    reclaims: bool,
) -> bool:
    """The preemptor fits under every ``max`` in ``usage``; and, when its plan reclaims
    from another node, its own node stays within its ``min`` (it never becomes a borrower
    that could be reclaimed from in turn: Kueue's ``ReclaimWithoutBorrowing``)."""
    if not tree.fits(usage, node, request):
        return False
    return not reclaims or tree.within_min_after(usage, node, request)


def _drop_unneeded(
    tree: _Tree,
    usage: dict[str, R.Resources],
    node: str,
    request: Mapping[str, int],
    chosen: list[tuple[AdmittedJob, PreemptionReason]],
) -> None:
    # Minimal: drop every victim the preemptor can do without (latest first). Fit only
    # gets harder as victims are dropped, except that dropping the last reclaim victim
    # lifts the within-min condition (_fits_plan): then one more pass.
    reclaims = sum(1 for _, reason in chosen if reason is PreemptionReason.RECLAIM)
    while True:
        had_reclaims = reclaims > 0
        for i in range(len(chosen) - 1, -1, -1):
            job, reason = chosen[i]
            tree.charge(usage, job, 1)
            left = reclaims - (reason is PreemptionReason.RECLAIM)
            if _fits_plan(tree, usage, node, request, reclaims=left > 0):
                del chosen[i]
                reclaims = left
            else:
                tree.charge(usage, job, -1)
        if not had_reclaims or reclaims:
            return


def _victim(preemptor: Preemptor, job: AdmittedJob, reason: PreemptionReason) -> Victim:
    return Victim(
        job_id=job.job_id,
        preemptor=preemptor.job_id,
        reason=reason,
        message=(
            f"priority {preemptor.priority} > {job.priority}"
            if reason is PreemptionReason.PRIORITY
            else f"reclaim for {preemptor.node} below min"
        ),
        priority=job.priority,
        grace_seconds=job.grace_seconds,
        node=job.node,
    )


def snapshot_after(snapshot: QuotaSnapshot, plans: Iterable[PreemptionPlan]) -> QuotaSnapshot:
    """The quota as it will be once ``plans`` are carried out: their victims gone, their
    preemptors admitted (after everybody else, and never victims themselves until they
    are really admitted). Plan the next waiting job on this, not on the current
    snapshot, while earlier plans' victims are still releasing: a victim is never chosen
    twice and freed quota is never promised twice.

    Only a plan's *outstanding* victims are gone (a :class:`~fleetq.admission.PendingPlan`
    drops a victim when it releases): a victim that released, queued again and was
    re-admitted holds quota again like any other job."""
    held = {j.job_id for j in snapshot.admitted}
    plans = [p for p in plans if p.preemptor not in held]  # admitted for real already
    gone = {v.job_id for p in plans for v in p.victims}
    kept = [j for j in snapshot.admitted if j.job_id not in gone]
    seq = max((j.admitted_seq for j in snapshot.admitted), default=-1)
    for i, p in enumerate(plans, start=seq + 1):
        kept.append(AdmittedJob(p.preemptor, p.node, dict(p.request), p.priority, i, False))
    return dataclasses.replace(snapshot, admitted=tuple(kept))


# --------------------------------------------------------------------------- adapter


@dataclass(frozen=True)
class HolderInfo:
    """What :class:`fleetq.admission.Admission` does not keep about an admitted job."""

    priority: int
    policy: JobPreemptionPolicy = JobPreemptionPolicy()


def snapshot_from_admission(
    admission: Admission, holders: Mapping[str, HolderInfo]
) -> QuotaSnapshot:
    """The :class:`QuotaSnapshot` of an :class:`~fleetq.admission.Admission`: its tree,
    usage, admitted jobs (admission order gives ``admitted_seq``) and the tree's policy.

    ``Admission`` keeps no priority or annotations for admitted jobs (its persisted
    state drops them), so the caller supplies them in ``holders``; an admitted job
    missing there counts for usage but is never a victim."""
    quota = admission.quota
    nodes = tuple(QuotaNodeLimits(n.name, n.parent, dict(n.min), dict(n.max)) for n in quota)
    admitted: list[AdmittedJob] = []
    for seq, job_id in enumerate(admission.holders()):
        holding = quota.holdings[job_id]
        info = holders.get(job_id)
        admitted.append(
            AdmittedJob(
                job_id=job_id,
                node=holding.node,
                request=dict(holding.request),
                priority=info.priority if info is not None else 0,
                admitted_seq=seq,
                preemptible=info is not None and info.policy.preemptible,
                grace_seconds=(
                    info.policy.grace_seconds if info is not None else DEFAULT_GRACE_SECONDS
                ),
            )
        )
    return QuotaSnapshot(nodes, tuple(admitted), tree_policy(quota.tree))


def preemptor_from_request(admission: Admission, request: AdmissionRequest) -> Preemptor:
    """The :class:`Preemptor` for a waiting job's admission request."""
    return Preemptor(
        job_id=request.job_id,
        node=admission.quota.leaf_for(request.namespace),
        priority=request.priority,
        request=dict(request.request),
    )


def plan_for_request(
    admission: Admission,
    holders: Mapping[str, HolderInfo],
    request: AdmissionRequest,
    pending: Iterable[PreemptionPlan] = (),
) -> PreemptionPlan | None:
    """The quota workflow's one call: :func:`plan_quota_preemption` for the waiting job
    ``request`` on ``admission``'s quota, given the plans still being carried out."""
    snapshot = snapshot_after(snapshot_from_admission(admission, holders), pending)
    return plan_quota_preemption(snapshot, preemptor_from_request(admission, request))


def holder_infos(admission: Admission) -> dict[str, HolderInfo]:
    """The :class:`HolderInfo` of every admitted job, as ``admission`` keeps it."""
    return {
        job_id: HolderInfo(p.priority, JobPreemptionPolicy(p.preemptible, p.grace_seconds))
        for job_id, p in admission.holder_policies().items()
    }


def pending_plan(plan: PreemptionPlan) -> PendingPlan:
    """``plan`` as :class:`fleetq.admission.Admission` keeps it while it is carried out."""
    return PendingPlan(
        preemptor=plan.preemptor,
        node=plan.node,
        priority=plan.priority,
        request=dict(plan.request),
        victims=[
            PlannedVictim(
                job_id=v.job_id,
                reason=v.reason.value,
                message=v.message,
                priority=v.priority,
                grace_seconds=v.grace_seconds,
                node=v.node,
            )
            for v in plan.victims
        ],
    )


def plan_of(pending: PendingPlan) -> PreemptionPlan:
    """The inverse of :func:`pending_plan`."""
    return PreemptionPlan(
        preemptor=pending.preemptor,
        node=pending.node,
        victims=tuple(
            Victim(
                job_id=v.job_id,
                preemptor=pending.preemptor,
                reason=PreemptionReason(v.reason),
                message=v.message,
                priority=v.priority,
                grace_seconds=v.grace_seconds,
                node=v.node,
            )
            for v in pending.victims
        ),
        priority=pending.priority,
        request=dict(pending.request),
    )


def plan_preemptions(
    admission: Admission, now: float | None = None, *, spare: Collection[str] = ()
) -> list[PreemptionPlan]:
    """The preemption half of a scheduling pass (:func:`fleetq.admission_pass.run_pass`
    says when it runs): for each of
    :meth:`~fleetq.admission.Admission.preemption_candidates`, the plan that would admit
    it given the plans being carried out, recorded with
    :meth:`~fleetq.admission.Admission.add_plan`. Returns the new plans, whose victims
    the caller tells to stop. Nothing under a tree whose policy is ``Never`` (or
    unreadable: a tree is checked when it is applied). With ``now``, each plan expires
    (:meth:`~fleetq.admission.Admission.expire_plans`) if its victims have not all
    released by its longest grace period + ``PLAN_MARGIN_SECONDS``. The admitted jobs
    named in ``spare`` (granted in the same pass) count for usage but are no victims."""
    try:
        if not tree_policy(admission.quota.tree).enabled:
            return []
    except ManifestError:
        return []
    candidates = admission.preemption_candidates()
    if not candidates:
        return []
    holders = holder_infos(admission)
    # a plan whose preemptor left the queue: its victims are still leaving, and nothing is
    # held for it (a preemptor of no request that snapshot_after cannot mistake for an
    # admitted job). Plans list only their outstanding victims (not released yet).
    # (a draining plan's node may be gone with a tree change: it holds nothing anyway)
    nodes = admission.quota.nodes
    pending = [plan_of(p) for p in admission.plans()] + [
        dataclasses.replace(
            plan_of(p),
            preemptor=f"{p.preemptor} (gone {i})",
            request={},
            node=p.node if p.node in nodes else admission.quota.root,
        )
        for i, p in enumerate(admission.draining())
    ]
    leaving = {v.job_id for p in pending for v in p.victims}
    for job_id in spare:
        if job_id not in leaving:  # (a victim already: e.g. a holder's re-sent enqueue)
            holders.pop(job_id, None)
    # nothing changes in ``admission`` until every plan is decided: one snapshot of it,
    # indexed once and brought up to date as each new plan is added (as snapshot_after)
    base = snapshot_from_admission(admission, holders)
    tree = _Tree(snapshot_after(base, pending))
    out: list[PreemptionPlan] = []
    for request in candidates:
        plan = _plan_on(tree, base.policy, preemptor_from_request(admission, request))
        if plan is None or not plan.victims:
            continue
        pending.append(plan)
        out.append(plan)
        _after_plan(tree, plan)
    for plan in out:  # all decided before any is recorded: an error records none
        admission.add_plan(pending_plan(plan), now)
    return out


# --------------------------------------------------------------------------- capacity


@dataclass(frozen=True)
class RunningPod:
    node: str
    requests: Mapping[str, int]


@dataclass(frozen=True)
class RunningGang:
    """An admitted job running on a member cluster, with its pods' nodes."""

    job_id: str
    cluster: str
    priority: int
    pods: tuple[RunningPod, ...]
    started_at: float  # epoch seconds the run started (work lost counts from here)
    preemptible: bool = True
    grace_seconds: int = DEFAULT_GRACE_SECONDS

    def work(self, now: float) -> float:
        """cpu·seconds this run has done by ``now`` (what preempting it wastes)."""
        cpu = sum(p.requests.get(R.CPU, 0) for p in self.pods) / R.MILLI
        return cpu * max(0.0, now - self.started_at)


@dataclass(frozen=True)
class CapacityPlan:
    """Capacity preemption on exactly one cluster: evict ``victims``, then place the
    gang as ``choice`` (computed on the snapshot with the victims' pods given back)."""

    cluster: str
    victims: tuple[Victim, ...]
    choice: ClusterChoice
    work_lost: float  # cpu·s of the victims' runs

    @property
    def cost(self) -> tuple[int, float, int, str]:
        """Lower is cheaper: highest victim priority, work lost, victim count, name."""
        top = max(v.priority for v in self.victims)
        return top, round(self.work_lost, 6), len(self.victims), self.cluster


def _without(snap: ClusterSnapshot, gangs: Iterable[RunningGang]) -> ClusterSnapshot:
    """``snap`` with the pods of ``gangs`` given back to their nodes (a fresh snapshot
    with an empty ``resource_version``, so no placement cache mistakes it for ``snap``)."""
    freed: dict[str, tuple[R.Resources, int]] = {}
    for g in gangs:
        for p in g.pods:
            res, count = freed.get(p.node, ({}, 0))
            freed[p.node] = (R.add(res, p.requests), count + 1)
    nodes: list[NodeCapacity] = []
    for n in snap.nodes:
        got = freed.get(n.name)
        if got is None:
            nodes.append(n)
            continue
        res, count = got
        requested = {k: max(0, v - res.get(k, 0)) for k, v in n.requested.items()}
        nodes.append(
            dataclasses.replace(
                n,
                requested={k: v for k, v in requested.items() if v},
                pods_used=max(0, n.pods_used - count),
            )
        )
    return dataclasses.replace(snap, nodes=nodes, resource_version="")


def plan_capacity_preemption(
    preemptor: str,
    gang: Gang,
    clusters: Sequence[ClusterSnapshot],
    running: Iterable[RunningGang],
    now: float,
    *,
    affinity: ClusterAffinity | None = None,
    cluster_tolerations: Sequence[TolerationLike] = (),
    exclude: Collection[str] = (),
    index: PlacementIndex | None = None,
) -> CapacityPlan | None:
    """Exactly one cluster where evicting lower-priority, preemptible gangs lets
    ``gang`` (the job ``preemptor``) fit node by node, with those victims; or None when
    the gang fits somewhere without preemption (place it normally) or nowhere even with
    every candidate gone.
    ``index`` (the caller's :class:`~fleetq.placement.PlacementIndex`) keeps the
    snapshots' views warm across the placements this search makes.

    On each cluster the placement filters apply as in :func:`~fleetq.placement.
    place_gang` (same ``affinity``, ``cluster_tolerations``, ``exclude``). Candidates are
    the preemptible gangs of priority < ``gang.priority``. On each cluster: the lowest
    priority level ``t`` such that evicting every candidate of priority <= ``t`` makes
    room; among the candidates of priority <= ``t``, the cheapest set that lets the gang
    fit (:func:`_cheapest`): lowest highest-victim priority, then least **work lost**
    (cpu·s since each victim started), then fewest victims; node order (the nodes the
    evictions open up most first) only breaks ties. Among clusters the cheapest wins by
    the same order: highest victim priority, work lost, victim count, cluster name.

    Cost: O(log(levels)) placements of one cluster, then at most ``2 **`` :data:`EXACT_POOL`
    for a small pool, else O(log(candidates) + victims) per greedy order, on every
    cluster where evicting all candidates would make room."""

    from fleetq.placement import place_gang

    def place(snaps: Sequence[ClusterSnapshot]) -> ClusterChoice | None:
        return place_gang(
            gang,
            snaps,
            affinity=affinity,
            cluster_tolerations=cluster_tolerations,
            exclude=exclude,
            index=index,
        ).best

    if place(clusters) is not None:
        return None
    by_cluster: dict[str, list[RunningGang]] = {}
    for g in running:
        if g.preemptible and g.priority < gang.priority and g.job_id != preemptor:
            by_cluster.setdefault(g.cluster, []).append(g)
    best: CapacityPlan | None = None
    for snap in sorted(clusters, key=lambda c: c.name):
        cands = by_cluster.get(snap.name)
        if not cands:
            continue

        def fits(gangs: Sequence[RunningGang], snap: ClusterSnapshot = snap) -> bool:
            return place([_without(snap, gangs)]) is not None

        chosen = _cheapest(gang, snap, cands, now, fits)
        if chosen is None:
            continue
        choice = place([_without(snap, chosen)])
        assert choice is not None
        victims = tuple(
            Victim(
                job_id=g.job_id,
                preemptor=preemptor,
                reason=PreemptionReason.CAPACITY,
                message=f"room on {snap.name} for priority {gang.priority} > {g.priority}",
                priority=g.priority,
                grace_seconds=g.grace_seconds,
                cluster=snap.name,
            )
            for g in sorted(chosen, key=lambda g: (g.priority, g.work(now), g.job_id))
        )
        plan = CapacityPlan(snap.name, victims, choice, sum(g.work(now) for g in chosen))
        if best is None or plan.cost < best.cost:
            best = plan
    return best


def _smallest(n: int, ok: Callable[[int], bool]) -> int:
    """The smallest ``i`` in ``[0, n)`` with ``ok(i)``, given ``ok(n - 1)`` (binary
    search; with a non-monotone ``ok`` still one where it holds)."""
    lo, hi = -1, n - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


#: a cluster's candidate pool up to this size is searched exhaustively for the cheapest
#: set (at most 2 ** 10 cheap cost comparisons, placements only for improvements)
EXACT_POOL = 10


def _set_cost(
    gangs: Sequence[RunningGang], now: float, node_key: Callable[[RunningGang], tuple[int, str]]
) -> tuple[int, float, int, tuple[tuple[int, str], ...]]:
    """Lower is cheaper: the highest victim priority, then work lost (cpu·s), then the
    number of victims, then node order (the victims' node ranks, ascending)."""
    return (
        max(g.priority for g in gangs),
        round(sum(g.work(now) for g in gangs), 6),
        len(gangs),
        tuple(sorted(node_key(g) for g in gangs)),
    )


def _cheapest(
    gang: Gang,
    snap: ClusterSnapshot,
    cands: Sequence[RunningGang],
    now: float,
    fits: Callable[[Sequence[RunningGang]], bool],
) -> list[RunningGang] | None:
    """The cheapest set of ``cands`` whose eviction lets the gang fit on ``snap``, or
    None. Cheapest by :func:`_set_cost`: lowest highest priority, then least work lost,
    then fewest victims; node order (nodes these evictions open up most first) only
    breaks ties (issue 24). Exact for a pool of at most :data:`EXACT_POOL` gangs;
    beyond, the cheaper of two greedy sets (by priority then work lost; by node then
    priority then work lost), each made minimal."""
    if not fits(cands):
        return None
    levels = sorted({g.priority for g in cands})
    top = levels[
        _smallest(len(levels), lambda i: fits([g for g in cands if g.priority <= levels[i]]))
    ]
    pool = [g for g in cands if g.priority <= top]
    rank = _node_ranks(gang, snap, pool)
    worst = len(rank)

    def node_key(g: RunningGang) -> tuple[int, str]:
        return min((rank.get(p.node, worst) for p in g.pods), default=worst), g.job_id

    def cost(gangs: Sequence[RunningGang]) -> tuple[int, float, int, tuple[tuple[int, str], ...]]:
        return _set_cost(gangs, now, node_key)

    if len(pool) <= EXACT_POOL:
        options = [
            combo
            for size in range(1, len(pool) + 1)
            for combo in itertools.combinations(pool, size)
        ]
        options.sort(key=cost)
        return next(list(c) for c in options if fits(c))  # the whole pool fits
    best: list[RunningGang] | None = None
    for key in (
        lambda g: (g.priority, g.work(now), node_key(g)),
        lambda g: (node_key(g)[0], g.priority, g.work(now), g.job_id),
    ):
        chosen = _greedy_minimal(sorted(pool, key=key), now, fits)
        if fits(chosen) and (best is None or cost(chosen) < cost(best)):
            best = chosen
    return best


def _node_ranks(
    gang: Gang, snap: ClusterSnapshot, pool: Sequence[RunningGang]
) -> dict[str, int]:
    """Node order: copies of the gang's largest pod that fit a node once every pool gang
    on it is gone, most first, then fewer gangs to evict there, then name."""
    largest = R.maximum(p.requests for p in gang.pods)
    freed: dict[str, R.Resources] = {}
    count: dict[str, int] = {}
    for g in pool:
        for p in g.pods:
            R.add_into(freed.setdefault(p.node, {}), p.requests)
            count[p.node] = count.get(p.node, 0) + 1
    room: dict[str, int] = {}
    for n in snap.nodes:
        if n.name not in freed:
            continue
        free = R.add(n.free(), freed[n.name])
        copies = [free.get(k, 0) // v for k, v in largest.items() if v > 0]
        room[n.name] = min(copies) if copies else n.pods_allocatable
    return {name: i for i, name in enumerate(sorted(room, key=lambda n: (-room[n], count[n], n)))}


def _greedy_minimal(
    ordered: list[RunningGang], now: float, fits: Callable[[Sequence[RunningGang]], bool]
) -> list[RunningGang]:
    """The shortest prefix of ``ordered`` that fits, made minimal."""
    chosen = ordered[
        : _smallest(len(ordered), lambda i, o=ordered: fits(o[: i + 1])) + 1  # type: ignore[misc]
    ]
    # Minimal: try dropping the dearest first; repeat while anything was dropped
    # (node-by-node placement is a heuristic, so fitting is not strictly monotone).
    changed = True
    while changed:
        changed = False
        for g in sorted(chosen, key=lambda g: (-g.priority, -g.work(now), g.job_id)):
            rest = [x for x in chosen if x is not g]
            if rest and fits(rest):
                chosen = rest
                changed = True
    return chosen


