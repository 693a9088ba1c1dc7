"""The placement engine: :func:`place` answers a
:class:`~fleetq.placement.decision.SchedulingRequest` exactly as the rule
(:func:`fleetq.placement.rule.schedule`) does, fast.

The candidates' views are stacked into one fleet view (:class:`~fleetq.placement.fleet.Fleet`,
kept warm by the caller's :class:`~fleetq.placement.index.PlacementIndex`) and each pod
group is packed on every cluster at once: one global cumsum with per-cluster bases and one
searchsorted. Clusters it rejects are re-run through the rule's greedy for the precise
reason (a fit found there is used: a disagreement costs speed, never soundness). Figures:
BENCHMARKS.md §3 (``python -m bench.placement``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fleetq.capacity import ClusterSnapshot
from fleetq.placement.columns import _FLOAT_EXACT, _INT_CAP, BoolArray, ClusterColumns, IntArray
from fleetq.placement.decision import ClusterChoice, PlacementDecision, SchedulingRequest
from fleetq.placement.estimate import _sum_shortfall
from fleetq.placement.ever_fits import never_fits
from fleetq.placement.filters import _cluster_reason, _ordered, _rank
from fleetq.placement.fleet import Fleet, _Eligible
from fleetq.placement.index import PlacementIndex
from fleetq.placement.rule import PodGroup, _pack, _score, plan_order, pod_groups
from fleetq.rejection import Rejection


def _copies(el: _Eligible, rq: Sequence[tuple[int, int]], need: int) -> IntArray:
    """Copies of a pod (requests ``rq`` over union rows) each eligible node holds, from
    the untouched free columns, capped at ``need`` (which changes no fill-in-order pick)."""
    if el.ffree is not None and all(q < _FLOAT_EXACT for _r, q in rq):
        # trunc(min(a / q)) == min(a // q) for 0 <= a, q < 2**53: a float64 quotient
        # never rounds up to the next integer there. Float division is much faster.
        x: npt.NDArray[np.float64] | None = None
        for r, q in rq:
            t = el.ffree[r] / q
            x = t if x is None else np.minimum(x, t, out=x)
        if x is None:
            return np.minimum(el.slots, need)
        np.minimum(x, need, out=x)
        k = x.astype(np.int64)
    else:
        ki: IntArray | None = None
        for r, q in rq:
            t = el.free[r] // q
            ki = t if ki is None else np.minimum(ki, t, out=ki)
        if ki is None:
            return np.minimum(el.slots, need)
        k = np.minimum(ki, need, out=ki)
    np.minimum(k, el.slots, out=k)
    return k


def _fits_once(el: _Eligible, rq: Sequence[tuple[int, int]]) -> BoolArray:
    """Eligible nodes (all have a free slot) with room for one more copy of the pod."""
    ok: BoolArray | None = None
    for r, q in rq:
        t = el.free[r] >= q
        ok = t if ok is None else np.logical_and(ok, t, out=ok)
    return np.ones(len(el.idx), dtype=bool) if ok is None else ok


@dataclass
class _Taken:
    """Copies of one group placed on nodes (global indices) by an earlier step."""

    nodes: IntArray
    takes: IntArray
    per_row: dict[int, int]  # union resource row -> request of that group


def _refresh(
    el: _Eligible, rq: Sequence[tuple[int, int]], need: int, taken: Sequence[_Taken]
) -> tuple[IntArray, IntArray] | None:
    """Positions in ``el`` of the nodes earlier groups of the gang already use and how
    many copies of this pod each still holds (at most ``need``)."""
    if not taken or not len(el.idx):
        return None
    tn = np.concatenate([t.nodes for t in taken]) if len(taken) > 1 else taken[0].nodes
    pos = np.searchsorted(el.idx, tn)
    np.minimum(pos, len(el.idx) - 1, out=pos)
    hit = el.idx[pos] == tn
    if not hit.any():
        return None
    where, inv = np.unique(pos[hit], return_inverse=True)
    takes = np.concatenate([t.takes for t in taken])[hit]
    used_slots = np.zeros(len(where), dtype=np.int64)
    np.add.at(used_slots, inv, takes)
    new = np.minimum(el.slots[where] - used_slots, need)
    for r, q in rq:
        per = np.concatenate([t.takes * t.per_row.get(r, 0) for t in taken])[hit]
        used = np.zeros(len(where), dtype=np.int64)
        np.add.at(used, inv, per)
        np.minimum(new, (el.free[r, where] - used) // q, out=new)
    return where, np.maximum(new, 0)


_EMPTY = np.zeros(0, dtype=np.int64)


def _distinct(x: IntArray) -> IntArray:
    """Sorted distinct values of ``x``, a concatenation of a few ascending runs (a
    stable sort merges runs in linear time; np.unique does not)."""
    s = np.sort(x, kind="stable")
    keep = np.empty(len(s), dtype=bool)
    keep[:1] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def _rows(g: PodGroup, fleet: Fleet) -> list[tuple[int, int]] | None:
    """``g``'s requests as ``(union resource row, quantity)``; None when no node anywhere
    has one of them (free is clipped at _INT_CAP)."""
    rq: list[tuple[int, int]] = []
    for name, q in g.requests:
        r = fleet.res_index.get(name)
        if r is None or q > _INT_CAP:
            return None
        rq.append((r, q))
    return rq


def _place_one(
    el: _Eligible,
    rq: Sequence[tuple[int, int]],
    fresh: tuple[IntArray, IntArray] | None,
    alive: BoolArray,
) -> tuple[BoolArray, IntArray, IntArray] | None:
    """A one-pod group: the first node (in fill order) of each alive cluster with room
    for the pod. Returns the clusters still alive (mask and positions) and their nodes."""
    lo = el.bounds[:-1]
    hi = el.bounds[1:]
    ok = _fits_once(el, rq)
    if fresh is not None:
        ok[fresh[0]] = fresh[1] > 0
    nz = np.flatnonzero(ok)
    if not len(nz):
        return None
    at = np.searchsorted(nz, lo)
    first = nz[np.minimum(at, len(nz) - 1)]
    alive = alive & (first >= lo) & (first < hi)
    cl = np.flatnonzero(alive)
    if not len(cl):
        return None
    return alive, cl, el.idx[first[cl]]


def _place_many(
    el: _Eligible,
    rq: Sequence[tuple[int, int]],
    need: int,
    fresh: tuple[IntArray, IntArray] | None,
    alive: BoolArray,
) -> tuple[BoolArray, IntArray, IntArray, IntArray] | None:
    """A group of ``need`` pods, on every alive cluster at once. Returns the clusters
    still alive (mask and positions), the nodes used there and the copies on each."""
    lo = el.bounds[:-1]
    hi = el.bounds[1:]
    k = _copies(el, rq, need)
    if fresh is not None:
        k[fresh[0]] = fresh[1]
    # Per-cluster prefix sums from one global cumsum: fill each cluster's nodes in
    # order (most-allocated first) until `need` copies are placed.
    cs = np.cumsum(k)
    base = np.where(lo > 0, cs[lo - 1], 0)
    pos = np.searchsorted(cs, base + need)
    alive = alive & (pos < hi)
    cl = np.flatnonzero(alive)
    if not len(cl):
        return None
    start = lo[cl]
    stop = pos[cl]
    length = stop - start + 1
    ends = np.cumsum(length)
    span = np.arange(int(ends[-1]), dtype=np.int64)
    span += np.repeat(start - (ends - length), length)
    kk = k[span]
    kk[ends - 1] -= cs[stop] - base[cl] - need
    nz = np.flatnonzero(kk)
    return alive, cl, el.idx[span[nz]], kk[nz]


def _pack_class(
    plan: Sequence[PodGroup], fleet: Fleet, alive: BoolArray
) -> tuple[IntArray, IntArray, IntArray]:
    """The rule's greedy for every cluster where ``alive``, groups in ``plan`` order.
    Returns the clusters where the whole gang fits (ascending), per such cluster the
    global node index of each pod in plan order, and the distinct nodes those clusters
    use."""
    taken: list[_Taken] = []
    picks: list[tuple[IntArray, IntArray]] = []
    none = (_EMPTY, _EMPTY.reshape(0, 0), _EMPTY)
    for g in plan:
        need = len(g.names)
        rq = _rows(g, fleet)
        if rq is None:
            return none
        el = fleet.eligible(g)
        if not len(el.idx):
            return none
        fresh = _refresh(el, rq, need, taken)
        if need == 1:
            one = _place_one(el, rq, fresh, alive)
            if one is None:
                return none
            alive, cl, nodes = one
            takes = np.ones(len(cl), dtype=np.int64)
            picks.append((cl, nodes.reshape(len(cl), 1)))
        else:
            many = _place_many(el, rq, need, fresh, alive)
            if many is None:
                return none
            alive, cl, nodes, takes = many
            picks.append((cl, np.repeat(nodes, takes).reshape(len(cl), need)))
        taken.append(_Taken(nodes, takes, dict(rq)))
    final = np.flatnonzero(alive)
    mats = [m if len(cl) == len(final) else m[np.searchsorted(cl, final)] for cl, m in picks]
    used = _distinct(np.concatenate([t.nodes for t in taken])) if len(taken) > 1 else taken[0].nodes
    if len(picks[0][0]) != len(final):  # drop nodes of clusters a later group ruled out
        used = used[alive[np.searchsorted(fleet.starts, used, side="right") - 1]]
    return final, np.hstack(mats) if len(mats) > 1 else mats[0], used


def _score_rows(
    gang_total: Mapping[str, int],
    npods: int,
    fleet: Fleet,
    clusters: IntArray,
    used: IntArray,
) -> list[float]:
    """_score for each of ``clusters`` (ascending), given the distinct global indices of
    the nodes the gang uses there (ascending)."""
    bounds = np.searchsorted(used, fleet.starts[clusters])
    sums = np.add.reduceat(fleet.fas[:, used], bounds, axis=1).T.tolist()
    nres = fleet.nres
    req = [
        (r, q)
        for name, q in gang_total.items()
        if q > 0 and (r := fleet.res_index.get(name)) is not None
    ]
    out: list[float] = []
    for row in sums:
        total = 0.0
        count = 0
        for r, q in req:
            a = row[nres + r]
            if a > 0:
                total += 1.0 - (row[r] - q) / a
                count += 1
        if count:
            out.append(round(total / count, 9))
        else:
            cap = row[2 * nres]
            out.append(round(npods / cap, 9) if cap else 0.0)
    return out


def _place_fleet(
    groups: list[PodGroup],
    gang_total: Mapping[str, int],
    npods: int,
    fleet: Fleet,
    alive: BoolArray,
    cluster_names: Sequence[str],
) -> dict[int, ClusterChoice]:
    """Choices for the clusters (by position in the fleet) where the gang fits, among
    those where ``alive``."""
    out: dict[int, ClusterChoice] = {}
    orders: dict[tuple[int, ...], list[int]] = {}
    for members in fleet.classes.values():
        order = plan_order(groups, fleet.views[members[0]])
        orders.setdefault(order, []).extend(members)
    names = fleet.names_arr
    for order, members in orders.items():
        mask = alive
        if len(orders) > 1:
            mask = np.zeros(len(alive), dtype=bool)
            mask[members] = True
            mask &= alive
        if not mask.any():
            continue
        plan = [groups[i] for i in order]
        clusters, nodes, used = _pack_class(plan, fleet, mask)
        if not len(clusters):
            continue
        scores = _score_rows(gang_total, npods, fleet, clusters, used)
        pods = [name for g in plan for name in g.names]
        for c, row, score in zip(clusters.tolist(), names[nodes].tolist(), scores, strict=True):
            out[c] = ClusterChoice(cluster_names[c], score, dict(zip(pods, row, strict=True)))
    return out



def _candidates(
    request: SchedulingRequest, snaps: Sequence[ClusterSnapshot], index: PlacementIndex
) -> tuple[list[Rejection | None], list[int], list[ClusterColumns]]:
    """Per cluster (in ``snaps`` order) its cluster-level rejection; the positions of
    those passing the filters and their views."""
    reasons: list[Rejection | None] = []
    cand: list[int] = []
    views: list[ClusterColumns] = []
    for i, snap in enumerate(snaps):
        reason = _cluster_reason(
            snap, request.affinity, request.cluster_tolerations, request.exclude
        )
        reasons.append(reason)
        if reason is None:
            cand.append(i)
            views.append(index.columns_of(snap))
    return reasons, cand, views


def place(request: SchedulingRequest, index: PlacementIndex) -> PlacementDecision:
    """Rank the clusters where the whole gang fits node by node; explain the others
    (what :func:`fleetq.placement.rule.schedule` decides, for the fleet at once)."""
    gang = request.gang
    groups = pod_groups(gang)
    total = gang.total
    npods = len(gang.pods)
    snaps = _ordered(request.clusters)
    reasons, cand, views = _candidates(request, snaps, index)
    choices: dict[int, ClusterChoice] = {}
    alive = np.ones(len(views), dtype=bool)
    for c, cols in enumerate(views):
        quick = _sum_shortfall(total, npods, cols)
        if quick is not None:
            reasons[cand[c]] = quick
            alive[c] = False
    found: dict[int, ClusterChoice] = {}
    if npods and alive.any():
        fleet = index.fleet_of(tuple(views), all(snaps[i].resource_version for i in cand))
        try:
            names = [snaps[i].name for i in cand]
            found = _place_fleet(groups, total, npods, fleet, alive, names)
        finally:
            index.release(fleet)
    for c in np.flatnonzero(alive).tolist():
        i = cand[c]
        got = found.get(c)
        if got is None:  # the exact reason (or, never expected, a fit) from the rule
            cols = views[c]
            packed = _pack(groups, cols, npods)
            if isinstance(packed, Rejection):
                reasons[i] = packed
                continue
            got = ClusterChoice(
                snaps[i].name, _score(total, npods, cols, packed.used), packed.assignment
            )
        choices[i] = got
    rejected = {s.name: r for s, r in zip(snaps, reasons, strict=True) if r is not None}
    ranked = _rank(list(choices.values()))
    never = None
    if not ranked and request.judge_never:
        never = never_fits(gang, snaps, rejected, groups=groups, index=index)
    return PlacementDecision(ranked, rejected, never)
