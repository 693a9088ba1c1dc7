"""Gang placement: which member cluster can run *all* pods of a PyTorchJob, node by node.

The reference fleet estimates capacity by summing free resources over a cluster's nodes,
which is blind to fragmentation: 8 nodes with 1.5 free cpu each "fit" a gang of 4
two-cpu workers although none of them can start. :func:`place_gang` instead assigns every
pod to a concrete node (schedulable, nodeSelector satisfied, NoSchedule/NoExecute taints
tolerated, free resources and a free pod slot left after the gang's earlier pods) and
returns that assignment, so a cluster is only ever offered when the gang really fits.
:func:`estimate_sum_of_free` keeps the reference behaviour for comparison.

Heuristic (sound, not complete). Pods with the same shape (requests, nodeSelector,
tolerations) form a group; groups are placed largest dominant share first (share of the
cluster's largest node). Within a group every node gets ``k`` = how many copies of the
pod it can still hold (min over requested resources of ``free // request``, capped by
free pod slots, 0 when ineligible); nodes are filled in ascending ``k`` (best fit on the
bottleneck resource, like kube-scheduler's ``MostAllocated``: tight fragments first, large
holes kept for later), ties by node order in the snapshot. Whatever is returned was
checked against exact integer free resources; a cluster can be rejected where an exotic
packing would have fitted, never the other way round.

Score (higher is better, in [0, 1]): utilisation of the nodes the gang lands on once it
is there, averaged over the resources the gang requests
(``1 - (free_on_used_nodes - gang_request) / allocatable_on_used_nodes``; pod slots when
the gang requests nothing). It rewards clusters where the gang fills existing fragments
instead of opening fresh nodes. Ties go to the alphabetically lower cluster name.

Speed. A snapshot is turned into a columnar view (:class:`ClusterColumns`: numpy arrays
of free/allocatable per resource, pod slots, schedulability) once; :func:`columns_of`
caches that view per snapshot object while ``snapshot.resource_version`` is non-empty and
unchanged (snapshots with an empty ``resource_version`` are converted on every call).
Whoever mutates a snapshot in place must change its ``resource_version`` or call
:func:`forget`. The adapter's capacity cache keeps views warm simply by handing the same
snapshot objects to every placement (or by calling :func:`columns_of` when it refreshes
a snapshot). Eligibility masks (nodeSelector x tolerations) are memoised on the view.

Pure: no I/O, no clock, no randomness.
"""

from __future__ import annotations

import weakref
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from fleetq.capacity import ClusterSnapshot, Taint
from fleetq.models import ClusterAffinity, Gang, GangPod, Toleration
from fleetq.resources import Resources, format_quantity, format_resources

__all__ = [
    "ClusterChoice",
    "ClusterColumns",
    "PlacementDecision",
    "columns_of",
    "estimate_sum_of_free",
    "fits_node_by_node",
    "forget",
    "place_gang",
    "tolerates",
    "untolerated_taints",
]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

#: Taint effects that keep a pod off a node (PreferNoSchedule is only a preference).
HARD_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
#: Quantities above this are clipped when held in int64 columns (sound: free shrinks).
_INT_CAP = 1 << 62
#: ``k`` (copies of a pod a node can hold) is capped here unless a group is larger; nodes
#: that could hold more than this many copies rank equal.
_K_CAP = 256
_MEMO_LIMIT = 512


# --------------------------------------------------------------------------- tolerations

TolerationLike = Toleration | Mapping[str, Any]


def _tol_fields(t: TolerationLike) -> tuple[str, str, str, str]:
    if isinstance(t, Toleration):
        return (t.key or "", t.operator or "Equal", t.value or "", t.effect or "")
    get = t.get
    return (
        str(get("key") or ""),
        str(get("operator") or "Equal"),
        str(get("value") or ""),
        str(get("effect") or ""),
    )


def _tolerates_fields(tol: tuple[str, str, str, str], taint: Taint) -> bool:
    key, op, value, effect = tol
    if effect and effect != taint.effect:
        return False
    if key and key != taint.key:
        return False
    if op == "Exists":
        return True
    if op == "Equal":
        return value == (taint.value or "")
    return False


def tolerates(toleration: TolerationLike, taint: Taint) -> bool:
    """Kubernetes ``Toleration.ToleratesTaint``: effects must match unless the toleration
    has none; keys must match unless the toleration's key is empty (with ``Exists`` that
    tolerates every taint); ``Exists`` ignores the value, ``Equal`` compares it."""
    return _tolerates_fields(_tol_fields(toleration), taint)


def untolerated_taints(
    taints: Sequence[Taint], tolerations: Sequence[TolerationLike]
) -> list[Taint]:
    """The NoSchedule/NoExecute taints none of ``tolerations`` tolerates."""
    fields = [_tol_fields(t) for t in tolerations]
    return [
        taint
        for taint in taints
        if taint.effect in HARD_EFFECTS and not any(_tolerates_fields(f, taint) for f in fields)
    ]


def _taint_text(t: Taint) -> str:
    return f"{t.key}={t.value}:{t.effect}" if t.value else f"{t.key}:{t.effect}"


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class ClusterChoice:
    cluster: str
    score: float
    assignment: dict[str, str]  # "worker-1" -> node name ({} for sum-of-free estimates)


@dataclass(frozen=True)
class PlacementDecision:
    ranked: list[ClusterChoice]  # feasible clusters, best first
    rejections: dict[str, str]  # cluster -> one-line reason (without the cluster name)

    @property
    def best(self) -> ClusterChoice | None:
        return self.ranked[0] if self.ranked else None

    def rejection_lines(self) -> list[str]:
        """``cluster-b: worker-1 needs cpu 2, largest free node has 1.5``, one per cluster."""
        return [f"{c}: {r}" for c, r in self.rejections.items()]

    def summary(self, max_items: int = 5) -> str:
        """Compact text for events and the UI:
        ``cluster-a (score 0.83); also fits: cluster-d (0.71); rejected: cluster-b: ...``."""
        parts: list[str] = []
        if self.best is None:
            parts.append("no cluster fits")
        else:
            parts.append(f"{self.best.cluster} (score {self.best.score:.2f})")
            others = self.ranked[1 : 1 + max_items]
            if others:
                more = len(self.ranked) - 1 - len(others)
                text = ", ".join(f"{c.cluster} ({c.score:.2f})" for c in others)
                parts.append("also fits: " + text + (f" (+{more} more)" if more else ""))
        lines = self.rejection_lines()
        if lines:
            more = len(lines) - max_items
            text = "; ".join(lines[:max_items])
            parts.append("rejected: " + text + (f" (+{more} more)" if more > 0 else ""))
        return "; ".join(parts)


# --------------------------------------------------------------------------- columnar view


def _clip(v: int) -> int:
    return v if v < _INT_CAP else _INT_CAP


class ClusterColumns:
    """A snapshot's nodes as numpy columns, built once and read by every placement.

    ``free[r]`` (int64, one row per resource in ``resources``) is
    ``max(0, allocatable - requested)``; ``slots`` the free pod slots; ``schedulable`` is
    False for cordoned nodes. ``total_free``/``total_alloc`` are exact Python-int sums over
    schedulable nodes (for the sum-of-free estimate)."""

    __slots__ = (
        "alloc",
        "free",
        "labels",
        "max_alloc",
        "memo",
        "names",
        "names_arr",
        "requested",
        "res_index",
        "resources",
        "schedulable",
        "slots",
        "taint_groups",
        "total_alloc",
        "total_free",
        "total_slots",
        "untainted",
    )

    def __init__(self, snapshot: ClusterSnapshot) -> None:
        nodes = snapshot.nodes
        n = len(nodes)
        names: list[str] = []
        res_index: dict[str, int] = {}
        for node in nodes:
            for k in node.allocatable:
                if k not in res_index:
                    res_index[k] = len(res_index)
        nres = len(res_index)
        alloc_rows: list[list[int]] = [[0] * n for _ in range(nres)]
        req_rows: list[list[int]] = [[0] * n for _ in range(nres)]
        total_free = [0] * nres
        total_alloc = [0] * nres
        slots: list[int] = []
        sched: list[bool] = []
        labels: list[dict[str, str]] = []
        taint_groups: dict[tuple[Taint, ...], list[int]] = {}
        total_slots = 0
        for i, node in enumerate(nodes):
            names.append(node.name)
            labels.append(node.labels)
            ok = not node.unschedulable
            sched.append(ok)
            free_slots = max(0, node.pods_allocatable - node.pods_used)
            slots.append(min(free_slots, _INT_CAP))
            requested = node.requested
            for k, a in node.allocatable.items():
                r = res_index[k]
                used = requested.get(k, 0)
                alloc_rows[r][i] = _clip(max(0, a))
                req_rows[r][i] = _clip(max(0, used))
                if ok:
                    total_free[r] += max(0, a - used)
                    total_alloc[r] += max(0, a)
            if ok:
                total_slots += free_slots
            hard = tuple(t for t in node.taints if t.effect in HARD_EFFECTS)
            if hard:
                taint_groups.setdefault(hard, []).append(i)
        self.names = names
        self.names_arr = np.array(names, dtype=object)
        self.resources = tuple(res_index)
        self.res_index = res_index
        self.alloc: IntArray = np.array(alloc_rows, dtype=np.int64).reshape(nres, n)
        self.requested: IntArray = np.array(req_rows, dtype=np.int64).reshape(nres, n)
        self.free: IntArray = np.maximum(self.alloc - self.requested, 0)
        self.free.setflags(write=False)
        self.alloc.setflags(write=False)
        self.requested.setflags(write=False)
        self.slots: IntArray = np.array(slots, dtype=np.int64)
        self.slots.setflags(write=False)
        self.schedulable: BoolArray = np.array(sched, dtype=bool)
        self.max_alloc = [int(row.max()) if n else 0 for row in self.alloc]
        self.labels = labels
        self.taint_groups = {k: np.array(v, dtype=np.int64) for k, v in taint_groups.items()}
        untainted = np.ones(n, dtype=bool)
        for idx in self.taint_groups.values():
            untainted[idx] = False
        self.untainted: BoolArray = untainted
        self.total_free = total_free
        self.total_alloc = total_alloc
        self.total_slots = total_slots
        self.memo: dict[Any, Any] = {}

    @classmethod
    def from_snapshot(cls, snapshot: ClusterSnapshot) -> ClusterColumns:
        return cls(snapshot)

    def __len__(self) -> int:
        return len(self.names)

    # -- memoised masks (pure functions of the snapshot) --

    def _remember(self, key: Any, value: Any) -> Any:
        if len(self.memo) >= _MEMO_LIMIT:
            self.memo.clear()
        self.memo[key] = value
        return value

    def label_mask(self, key: str, value: str) -> BoolArray:
        mk = ("label", key, value)
        got = self.memo.get(mk)
        if got is None:
            got = np.fromiter(
                (lab.get(key) == value for lab in self.labels), dtype=bool, count=len(self.labels)
            )
            self._remember(mk, got)
        return got  # type: ignore[no-any-return]

    def selector_mask(self, selector: tuple[tuple[str, str], ...]) -> BoolArray:
        mk = ("selector", selector)
        got = self.memo.get(mk)
        if got is None:
            got = np.ones(len(self.names), dtype=bool)
            for k, v in selector:
                got &= self.label_mask(k, v)
            self._remember(mk, got)
        return got  # type: ignore[no-any-return]

    def toleration_mask(self, tolerations: tuple[tuple[str, str, str, str], ...]) -> BoolArray:
        mk = ("tolerations", tolerations)
        got = self.memo.get(mk)
        if got is None:
            got = self.untainted.copy()
            for taints, idx in self.taint_groups.items():
                if all(any(_tolerates_fields(t, taint) for t in tolerations) for taint in taints):
                    got[idx] = True
            self._remember(mk, got)
        return got  # type: ignore[no-any-return]

    def eligible_slots(
        self,
        selector: tuple[tuple[str, str], ...],
        tolerations: tuple[tuple[str, str, str, str], ...],
        key: str | None = None,
    ) -> IntArray:
        """Free pod slots (capped at ``_K_CAP``) on nodes a pod with this nodeSelector and
        these tolerations may use, 0 elsewhere. ``key`` is a caller-computed memo key
        (a string hashes once) that must identify ``(selector, tolerations)``."""
        mk = key if key is not None else repr((selector, tolerations))
        got = self.memo.get(mk)
        if got is None:
            mask = self.schedulable & self.selector_mask(selector)
            mask &= self.toleration_mask(tolerations)
            got = np.where(mask, np.minimum(self.slots, _K_CAP), 0)
            got.setflags(write=False)
            self._remember(mk, got)
        return got  # type: ignore[no-any-return]


_CACHE: dict[int, tuple[weakref.ref[ClusterSnapshot], tuple[Any, ...], ClusterColumns]] = {}


def _fingerprint(snapshot: ClusterSnapshot) -> tuple[Any, ...]:
    return (snapshot.resource_version, id(snapshot.nodes), len(snapshot.nodes))


def columns_of(snapshot: ClusterSnapshot) -> ClusterColumns:
    """The columnar view of ``snapshot``, cached per snapshot object while its
    ``resource_version`` is non-empty and unchanged (and its node list is the same list
    of the same length). Call this when a snapshot is refreshed to pre-warm the cache."""
    if not snapshot.resource_version:
        return ClusterColumns(snapshot)
    key = id(snapshot)
    entry = _CACHE.get(key)
    fp = _fingerprint(snapshot)
    if entry is not None and entry[0]() is snapshot and entry[1] == fp:
        return entry[2]
    cols = ClusterColumns(snapshot)

    def _drop(_ref: weakref.ref[ClusterSnapshot], k: int = key) -> None:
        _CACHE.pop(k, None)

    ref = weakref.ref(snapshot, _drop)
    _CACHE[key] = (ref, fp, cols)
    return cols


def forget(snapshot: ClusterSnapshot) -> None:
    """Drop the cached view of ``snapshot`` (after mutating it in place)."""
    entry = _CACHE.get(id(snapshot))
    if entry is not None and entry[0]() is snapshot:
        del _CACHE[id(snapshot)]


# --------------------------------------------------------------------------- gang shapes


@dataclass
class _Group:
    """Pods of one gang with identical requests, nodeSelector and tolerations."""

    pods: list[GangPod]
    requests: tuple[tuple[str, int], ...]  # only positive requests, sorted by name
    selector: tuple[tuple[str, str], ...]
    tolerations: tuple[tuple[str, str, str, str], ...]
    order: int  # position of its first pod in the gang
    names: list[str] = field(default_factory=list)
    key: str = ""  # memo key of (selector, tolerations) for ClusterColumns.eligible_slots


def _groups(gang: Gang) -> list[_Group]:
    out: dict[Any, _Group] = {}
    for pos, pod in enumerate(gang.pods):
        req = tuple(sorted((k, int(v)) for k, v in pod.requests.items() if v > 0))
        sel = tuple(sorted((str(k), str(v)) for k, v in pod.node_selector.items()))
        tols = tuple(_tol_fields(t) for t in pod.tolerations)
        key = (req, sel, tols)
        g = out.get(key)
        if g is None:
            g = out[key] = _Group([], req, sel, tols, pos, key=repr((sel, tols)))
        g.pods.append(pod)
        g.names.append(pod.name_suffix)
    return list(out.values())


def _selector_text(selector: tuple[tuple[str, str], ...]) -> str:
    return ",".join(f"{k}={v}" for k, v in selector)


# --------------------------------------------------------------------------- packing


@dataclass
class _Packed:
    assignment: dict[str, str]
    used: list[int]  # distinct node indices the gang lands on


def _explain_ineligible(cols: ClusterColumns, g: _Group, pod: str) -> str:
    n = len(cols)
    if n == 0:
        return "no nodes"
    sel = cols.selector_mask(g.selector)
    if not sel.any():
        if g.selector:
            return f"no node matches nodeSelector {_selector_text(g.selector)} for {pod}"
        return f"no node for {pod}"
    sched = sel & cols.schedulable
    if not sched.any():
        what = f"matching nodeSelector {_selector_text(g.selector)} " if g.selector else ""
        return f"no schedulable node {what}for {pod} ({int(sel.sum())} cordoned)"
    tol = sched & cols.toleration_mask(g.tolerations)
    if not tol.any():
        first = int(np.flatnonzero(sched)[0])
        example = ""
        for taints, idx in cols.taint_groups.items():
            if first in set(idx.tolist()):
                example = ", ".join(_taint_text(t) for t in taints)
                break
        return (
            f"{pod} does not tolerate the taints of any of the {int(sched.sum())} nodes "
            f"it could use (e.g. {cols.names[first]}: {example})"
        )
    return f"no free pod slot for {pod} on the {int(tol.sum())} nodes it could use"


def _explain_short(
    cols: ClusterColumns,
    g: _Group,
    free: IntArray,
    slots: IntArray,
    k: IntArray,
    placed_in_group: int,
    placed_before: int,
    total_pods: int,
) -> str:
    """Why pod ``placed_in_group`` of ``g`` finds no node once the gang's earlier pods
    (``placed_before`` of other groups, ``k`` copies of this one) are on their nodes."""
    elig = cols.schedulable & cols.selector_mask(g.selector) & cols.toleration_mask(g.tolerations)
    if not elig.any():
        return _explain_ineligible(cols, g, g.names[0])
    pod = g.names[placed_in_group]
    placed = placed_before + placed_in_group
    suffix = f" ({placed} of {total_pods} pods placed)" if placed else ""
    ke = k[elig]
    for name, q in g.requests:
        after = free[cols.res_index[name]][elig] - ke * q
        best = int(after.max())
        if best < q:
            return (
                f"{pod} needs {name} {format_quantity(name, q)}, "
                f"largest free node has {format_quantity(name, max(best, 0))}{suffix}"
            )
    if int((slots[elig] - ke).max()) <= 0:
        return f"{pod} needs a pod slot, all {int(elig.sum())} nodes it could use are full{suffix}"
    return (
        f"{pod} needs {format_resources(dict(g.requests))} on one node, "
        f"no node has all of it free{suffix}"
    )


def _pack(groups: list[_Group], cols: ClusterColumns, total_pods: int) -> _Packed | str:
    """Assign every pod of ``groups`` to a node of ``cols`` or explain the first pod that
    does not fit. Hot path: a handful of numpy calls per group over the node columns."""
    if total_pods == 0:
        return _Packed({}, [])
    if len(cols) == 0:
        return "no nodes"
    res_index = cols.res_index
    max_alloc = cols.max_alloc
    plans: list[tuple[_Group, list[tuple[int, int]]]] = []
    for g in groups:
        rq: list[tuple[int, int]] = []
        for name, q in g.requests:
            r = res_index.get(name)
            if r is None or max_alloc[r] == 0:
                pod = g.names[0]
                return f"{pod} needs {name} {format_quantity(name, q)}, no node has any"
            if q > max_alloc[r]:
                pod = g.names[0]
                return (
                    f"{pod} needs {name} {format_quantity(name, q)}, "
                    f"largest node offers {format_quantity(name, max_alloc[r])}"
                )
            rq.append((r, q))
        plans.append((g, rq))
    if len(plans) > 1:
        # Largest dominant share (relative to the cluster's largest node) first.
        plans.sort(
            key=lambda p: (-max((q / max_alloc[r] for r, q in p[1]), default=0.0), p[0].order)
        )
    free = cols.free
    slots = cols.slots
    writable = False
    assignment: dict[str, str] = {}
    used: list[int] = []
    placed_before = 0
    names = cols.names
    names_arr = cols.names_arr
    last = len(plans) - 1
    for gi, (g, rq) in enumerate(plans):
        need = len(g.names)
        eslots = cols.eligible_slots(g.selector, g.tolerations, g.key)
        if need > _K_CAP:  # eslots are capped at _K_CAP; larger groups need the real slots
            cap = np.where(eslots > 0, np.minimum(slots, need), 0)
            key_type: type[np.unsignedinteger[Any]] = np.uint32
        else:
            cap = np.minimum(eslots, slots) if writable else eslots
            key_type = np.uint16
        k: IntArray | None = None
        for r, q in rq:
            if k is None:
                k = free[r] // q
            else:
                np.minimum(k, free[r] // q, out=k)
        if k is None:
            k = np.array(cap)
        else:
            np.minimum(k, cap, out=k)
        # Best fit: nodes that can hold the fewest copies first (0 wraps to the end).
        key = np.subtract(k, 1, dtype=key_type, casting="unsafe")
        if need == 1:
            i = int(key.argmin())
            if k[i] <= 0:
                return _explain_short(cols, g, free, slots, k, 0, placed_before, total_pods)
            assignment[g.names[0]] = names[i]
            nodes: IntArray | list[int] = [i]
            takes: IntArray | list[int] = [1]
            used.append(i)
        else:
            order = np.argsort(key, kind="stable")
            ks = k[order]
            cs = np.cumsum(ks)
            if int(cs[-1]) < need:
                return _explain_short(
                    cols, g, free, slots, k, int(cs[-1]), placed_before, total_pods
                )
            pos = int(np.searchsorted(cs, need))
            nodes = order[: pos + 1]
            takes = ks[: pos + 1]  # a copy (fancy-indexed above)
            takes[-1] -= int(cs[pos]) - need
            assignment.update(
                zip(g.names, names_arr[np.repeat(nodes, takes)].tolist(), strict=True)
            )
            used.extend(nodes.tolist())
        placed_before += need
        if gi < last:
            if not writable:
                free = free.copy()
                slots = slots.copy()
                writable = True
            t = np.asarray(takes)
            for r, q in rq:
                free[r, nodes] -= t * q
            slots[nodes] -= t
    return _Packed(assignment, sorted(set(used)) if last else used)


def _score(
    gang_total: Mapping[str, int], npods: int, cols: ClusterColumns, used: list[int]
) -> float:
    """Mean utilisation, over the resources the gang requests, of the nodes it lands on
    after it is there (pod slots when it requests nothing)."""
    if not used:
        return 0.0
    free_used = cols.free[:, used].sum(axis=1).tolist()
    alloc_used = cols.alloc[:, used].sum(axis=1).tolist()
    total = 0.0
    count = 0
    for name, q in gang_total.items():
        r = cols.res_index.get(name)
        if q <= 0 or r is None or alloc_used[r] <= 0:
            continue
        total += 1.0 - (free_used[r] - q) / alloc_used[r]
        count += 1
    if not count:
        cap = int(cols.slots[used].sum())
        return round(npods / cap, 9) if cap else 0.0
    return round(total / count, 9)


# --------------------------------------------------------------------------- cluster filters


def _cluster_reason(
    snap: ClusterSnapshot,
    affinity: ClusterAffinity | None,
    tolerations: Sequence[TolerationLike],
    exclude: Collection[str],
) -> str | None:
    name = snap.name
    if name in exclude:
        return "excluded (evicted)"
    if affinity is not None and not affinity.allows(name, snap.labels):
        if name in affinity.exclude:
            return "excluded by clusterAffinity.exclude"
        if affinity.clusterNames and name not in affinity.clusterNames:
            return "not in clusterAffinity.clusterNames"
        return "labels do not match clusterAffinity.labelSelector"
    bad = untolerated_taints(snap.taints, tolerations)
    if bad:
        return f"cluster taint {_taint_text(bad[0])} not tolerated by clusterTolerations"
    if not snap.reachable:
        return "unreachable"
    return None


def _ordered(clusters: Sequence[ClusterSnapshot]) -> list[ClusterSnapshot]:
    seen: set[str] = set()
    for c in clusters:
        if c.name in seen:
            raise ValueError(f"ClusterSnapshot {c.name!r}: name is given twice")
        seen.add(c.name)
    return sorted(clusters, key=lambda c: c.name)


def _rank(choices: list[ClusterChoice]) -> list[ClusterChoice]:
    return sorted(choices, key=lambda c: (-c.score, c.cluster))


def place_gang(
    gang: Gang,
    clusters: Sequence[ClusterSnapshot],
    *,
    affinity: ClusterAffinity | None = None,
    cluster_tolerations: Sequence[TolerationLike] = (),
    exclude: Collection[str] = (),
) -> PlacementDecision:
    """Rank the clusters where the whole gang fits node by node; explain the others."""
    groups = _groups(gang)
    total = gang.total
    npods = len(gang.pods)
    ranked: list[ClusterChoice] = []
    rejections: dict[str, str] = {}
    for snap in _ordered(clusters):
        reason = _cluster_reason(snap, affinity, cluster_tolerations, exclude)
        if reason is not None:
            rejections[snap.name] = reason
            continue
        cols = columns_of(snap)
        quick = _sum_shortfall(total, npods, cols)
        if quick is not None:
            rejections[snap.name] = quick
            continue
        packed = _pack(groups, cols, npods)
        if isinstance(packed, str):
            rejections[snap.name] = packed
            continue
        score = _score(total, npods, cols, packed.used)
        ranked.append(ClusterChoice(snap.name, score, packed.assignment))
    return PlacementDecision(_rank(ranked), rejections)


def fits_node_by_node(gang: Gang, cluster: ClusterSnapshot) -> dict[str, str] | str:
    """The node-by-node check alone (no cluster-level filters): the assignment
    ``{"worker-1": node}`` or the one-line reason it does not fit."""
    packed = _pack(_groups(gang), columns_of(cluster), len(gang.pods))
    return packed if isinstance(packed, str) else packed.assignment


# --------------------------------------------------------------------------- reference estimate


def _sum_shortfall(total: Resources, npods: int, cols: ClusterColumns) -> str | None:
    """Why the summed free resources of the schedulable nodes cannot hold the gang."""
    n = int(cols.schedulable.sum())
    for name, q in total.items():
        if q <= 0:
            continue
        r = cols.res_index.get(name)
        have = cols.total_free[r] if r is not None else 0
        if q > have:
            return (
                f"needs {name} {format_quantity(name, q)} in total, "
                f"{format_quantity(name, have)} free summed over {n} schedulable nodes"
            )
    if npods > cols.total_slots:
        return f"needs {npods} pod slots, {cols.total_slots} free over {n} schedulable nodes"
    return None


def estimate_sum_of_free(
    gang: Gang,
    clusters: Sequence[ClusterSnapshot],
    *,
    affinity: ClusterAffinity | None = None,
    cluster_tolerations: Sequence[TolerationLike] = (),
    exclude: Collection[str] = (),
) -> PlacementDecision:
    """The reference fleet's estimate: a cluster fits when the gang's total request is at
    most the free resources (and pod slots) summed over its schedulable nodes, ignoring
    fragmentation, nodeSelector and node taints. Choices carry no assignment; the score is
    the cluster-wide utilisation after placement, averaged over requested resources."""
    total = gang.total
    npods = len(gang.pods)
    ranked: list[ClusterChoice] = []
    rejections: dict[str, str] = {}
    for snap in _ordered(clusters):
        reason = _cluster_reason(snap, affinity, cluster_tolerations, exclude)
        cols = columns_of(snap) if reason is None else None
        if cols is not None:
            reason = _sum_shortfall(total, npods, cols)
        if reason is not None or cols is None:
            rejections[snap.name] = reason or "unknown"
            continue
        utils = []
        for name, q in total.items():
            r = cols.res_index.get(name)
            if q > 0 and r is not None and cols.total_alloc[r] > 0:
                utils.append(1.0 - (cols.total_free[r] - q) / cols.total_alloc[r])
        score = round(sum(utils) / len(utils), 9) if utils else 0.0
        ranked.append(ClusterChoice(snap.name, score, {}))
    return PlacementDecision(_rank(ranked), rejections)
