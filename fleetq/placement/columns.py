"""A cluster snapshot as numpy columns (:class:`ClusterColumns`): free/allocatable per
resource, pod slots and schedulability per node, nodes in fill order (most-allocated
first), with memoised eligibility masks (nodeSelector x tolerations).

Built once per snapshot (about 1 ms per 1,000 nodes) and read by every placement. A
later snapshot of the same cluster in which only a few node objects are new gets a view
derived from the last one (:meth:`ClusterColumns.updated`, about 0.2 ms for 1,000
nodes), equal to a full build. Node objects of a versioned snapshot are read-only: a
node that changes is a new object."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import attrgetter, eq, is_not
from typing import Any

import numpy as np
import numpy.typing as npt

from fleetq.capacity import ClusterSnapshot, NodeCapacity, Taint
from fleetq.placement.tolerations import HARD_EFFECTS, _tolerates_fields

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

#: Quantities above this are clipped when held in int64 columns (sound: free shrinks).
_INT_CAP = 1 << 62
_FLOAT_EXACT = 1 << 53  # integers below this are exact in float64, and so is floor(a / b)
_MEMO_LIMIT = 512


def _clip(v: int) -> int:
    return v if v < _INT_CAP else _INT_CAP


def _allocated_share(node: NodeCapacity) -> float:
    """Mean requested/allocatable over the resources a node offers (kube-scheduler's
    ``MostAllocated`` idea, unweighted), summed left to right in the node's resource
    order (what :func:`_node_columns` computes with numpy, bit for bit)."""
    total = 0.0
    count = 0
    for k, a in node.allocatable.items():
        if a > 0:
            total += min(1.0, node.requested.get(k, 0) / a)
            count += 1
    return total / count if count else 0.0


class ClusterColumns:
    """A snapshot's nodes as numpy columns, built once and read by every placement.

    Nodes are held most-allocated first (mean requested/allocatable, descending; ties in
    snapshot order), which is the order placement fills them in.

    ``free[r]`` (int64, one row per resource in ``resources``) is
    ``max(0, allocatable - requested)``; ``slots`` the free pod slots; ``schedulable`` is
    False for cordoned nodes. ``total_free``/``total_alloc`` are exact Python-int sums over
    schedulable nodes (for the sum-of-free estimate).

    A view also keeps the node objects it was built from and their values in snapshot
    order, so :meth:`updated` can derive the view of a later snapshot of the cluster in
    which only a few node objects are new, for a cost that depends on those nodes."""

    __slots__ = (
        "_labels",
        "alloc",
        "class_key",
        "free",
        "free_alloc",
        "labels_snap",
        "max_alloc",
        "max_free",
        "memo",
        "names",
        "names_arr",
        "names_snap",
        "nodes",
        "order",
        "raw",
        "requested",
        "res_index",
        "resources",
        "schedulable",
        "slots",
        "taint_code",
        "taint_groups",
        "taint_index",
        "total_alloc",
        "total_free",
        "total_slots",
        "untainted",
    )

    def __init__(self, snapshot: ClusterSnapshot) -> None:
        nodes = tuple(snapshot.nodes)
        parts = (
            _node_columns_exact(nodes) if len(nodes) <= _EXACT_NODES
            else _node_columns(nodes) or _node_columns_exact(nodes)
        )
        codes, index = _taint_codes(nodes)
        names_snap = np.array(list(map(_NAME, nodes)), dtype=object)
        self._fill(nodes, parts, names_snap, list(map(_LABELS, nodes)), codes, index)
        self.memo: dict[Any, Any] = {}

    def _fill(
        self,
        nodes: tuple[NodeCapacity, ...],
        parts: _NodeColumns,
        names_snap: npt.NDArray[Any],
        labels_snap: list[dict[str, str]],
        taint_code: IntArray,
        taint_index: dict[tuple[Taint, ...], int],
    ) -> None:
        """Everything but the memo, from the node columns and the per-node values in
        snapshot order (the full build and :meth:`updated` share this)."""
        n = len(nodes)
        order = parts.perm if parts.perm is not None else np.array(parts.order, dtype=np.int64)
        #: the node objects in snapshot order (what :meth:`updated` compares against)
        self.nodes = nodes
        self.order: IntArray = order  # snapshot position of each node in fill order
        self.raw = parts.raw
        self.names_snap = names_snap
        self.names_arr = names_snap[order]
        self.names: list[str] = self.names_arr.tolist()
        self.resources = tuple(parts.res_index)
        self.res_index = parts.res_index
        self.alloc: IntArray = parts.alloc
        self.requested: IntArray = parts.requested
        self.free: IntArray = np.maximum(self.alloc - self.requested, 0)
        self.free.setflags(write=False)
        self.free_alloc: IntArray = np.vstack((self.free, self.alloc))
        self.alloc.setflags(write=False)
        self.requested.setflags(write=False)
        self.slots: IntArray = parts.slots
        self.slots.setflags(write=False)
        self.schedulable: BoolArray = parts.schedulable
        self.max_alloc = [int(row.max()) if n else 0 for row in self.alloc]
        any_sched = bool(self.schedulable.any())
        self.max_free = [int(row[self.schedulable].max()) if any_sched else 0 for row in self.free]
        #: clusters with equal keys get the same group order for a gang (_plan_order)
        self.class_key = (self.resources, tuple(self.max_alloc))
        self.labels_snap = labels_snap
        self._labels: list[dict[str, str]] | None = None
        # nodes by their NoSchedule/NoExecute taints (-1: none), in fill order
        self.taint_code = taint_code
        self.taint_index = taint_index
        by_code = taint_code[order]
        present = set(np.unique(by_code).tolist())
        self.taint_groups: dict[tuple[Taint, ...], IntArray] = {
            hard: np.flatnonzero(by_code == c) for hard, c in taint_index.items() if c in present
        }
        self.untainted: BoolArray = by_code < 0
        self.total_free = parts.total_free
        self.total_alloc = parts.total_alloc
        self.total_slots = parts.total_slots

    @classmethod
    def from_snapshot(cls, snapshot: ClusterSnapshot) -> ClusterColumns:
        return cls(snapshot)

    @property
    def labels(self) -> list[dict[str, str]]:
        """Each node's labels, in fill order (read when a label mask is first asked for)."""
        got = self._labels
        if got is None:
            got = self._labels = list(map(self.labels_snap.__getitem__, self.order.tolist()))
        return got

    def updated(self, snapshot: ClusterSnapshot) -> ClusterColumns:
        """The view of ``snapshot``, a later snapshot of this view's cluster: derived
        from this view when ``snapshot`` has the same node names at the same positions
        and only a few of its node objects are not the ones this view was built from
        (this view itself when none is), else built in full. Equal to a full build
        either way, provided node objects are never changed in place (a changed node is
        a new :class:`NodeCapacity` object, as the capacity cache hands them over)."""
        got = _derived(self, snapshot.nodes)
        return ClusterColumns(snapshot) if got is None else got

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
            try:  # dict.get reads plain dicts (and subclasses) only
                values = list(map(dict.get, self.labels, repeat(key)))
            except TypeError:
                values = [lab.get(key) for lab in self.labels]
            got = np.array(list(map(eq, values, repeat(value))), dtype=bool)
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

    def usable_mask(
        self,
        selector: tuple[tuple[str, str], ...],
        tolerations: tuple[tuple[str, str, str, str], ...],
    ) -> BoolArray:
        """Nodes a pod with this nodeSelector and these tolerations may use: schedulable,
        labels matched, every NoSchedule/NoExecute taint tolerated (pod slots aside)."""
        return self.schedulable & self.selector_mask(selector) & self.toleration_mask(tolerations)

    def eligible_slots(
        self,
        selector: tuple[tuple[str, str], ...],
        tolerations: tuple[tuple[str, str, str, str], ...],
        key: str | None = None,
    ) -> IntArray:
        """Free pod slots on nodes a pod with this nodeSelector and
        these tolerations may use, 0 elsewhere. ``key`` is a caller-computed memo key
        (a string hashes once) that must identify ``(selector, tolerations)``."""
        mk = key if key is not None else repr((selector, tolerations))
        got = self.memo.get(mk)
        if got is None:
            got = np.where(self.usable_mask(selector, tolerations), self.slots, 0)
            got.setflags(write=False)
            self._remember(mk, got)
        return got  # type: ignore[no-any-return]


# --------------------------------------------------------------------------- node columns

_NAME = attrgetter("name")
_LABELS = attrgetter("labels")
_TAINTS = attrgetter("taints")
_ALLOCATABLE = attrgetter("allocatable")
_REQUESTED = attrgetter("requested")
_PODS_ALLOCATABLE = attrgetter("pods_allocatable")
_PODS_USED = attrgetter("pods_used")


@dataclass(frozen=True)
class _Raw:
    """The vectorised build's values per node, in snapshot order: what a view derived
    after a few nodes changed starts from (:func:`_derived`)."""

    alloc: IntArray  # (resources, nodes) allocatable as given
    requested: IntArray  # (resources, nodes) as given, 0 where the node does not offer it
    pods: IntArray  # (2, nodes) pods_allocatable, pods_used
    share: npt.NDArray[np.float64]  # allocated share (descending: fill order)
    schedulable: BoolArray


@dataclass(frozen=True)
class _NodeColumns:
    """What :class:`ClusterColumns` reads off a snapshot's nodes, nodes in fill order."""

    order: list[int]  # snapshot positions, most-allocated first (ties in snapshot order)
    res_index: dict[str, int]  # resources offered by some node, first seen first
    alloc: IntArray  # (resources, nodes) max(0, allocatable), clipped to _INT_CAP
    requested: IntArray  # (resources, nodes) max(0, requested) of offered resources, clipped
    slots: IntArray  # free pod slots, clipped
    schedulable: BoolArray
    total_free: list[int]  # exact sums over schedulable nodes
    total_alloc: list[int]
    total_slots: int
    perm: IntArray | None = None  # ``order`` as an array (vectorised build)
    raw: _Raw | None = None  # the vectorised build's inputs (None: built node by node)


def _node_columns_exact(nodes: Sequence[NodeCapacity]) -> _NodeColumns:
    """The node columns, node by node with Python integers: exact for any quantity."""
    n = len(nodes)
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
    total_slots = 0
    order = sorted(range(n), key=lambda j: _allocated_share(nodes[j]), reverse=True)
    for i, j in enumerate(order):  # sorted() is stable: ties keep snapshot order
        node = nodes[j]
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
    return _NodeColumns(
        order=order,
        res_index=res_index,
        alloc=np.array(alloc_rows, dtype=np.int64).reshape(nres, n),
        requested=np.array(req_rows, dtype=np.int64).reshape(nres, n),
        slots=np.array(slots, dtype=np.int64),
        schedulable=np.array(sched, dtype=bool),
        total_free=total_free,
        total_alloc=total_alloc,
        total_slots=total_slots,
    )


def _node_columns(nodes: Sequence[NodeCapacity]) -> _NodeColumns | None:
    """:func:`_node_columns_exact`, one numpy call per resource instead of Python work
    per node and resource, or None where that would not be exact (a quantity of 2**53 or
    more, where float64 shares and int64 sums could round; something not an integer)."""
    n = len(nodes)
    if not n:
        return None
    allocs = list(map(_ALLOCATABLE, nodes))
    reqs = list(map(_REQUESTED, nodes))
    keys = list(map(tuple, allocs))
    shapes = {kt: s for s, kt in enumerate(dict.fromkeys(keys))}
    res_index: dict[str, int] = {}
    for kt in shapes:
        for k in kt:
            if k not in res_index:
                res_index[k] = len(res_index)
    nres = len(res_index)
    try:  # dict.get reads plain dicts (and subclasses) only
        rows = [list(map(dict.get, allocs, repeat(k), repeat(0))) for k in res_index]
        rows += [list(map(dict.get, reqs, repeat(k), repeat(0))) for k in res_index]
        # requests of a resource count only where the node offers it
        partial = [k for k in res_index if not all(k in kt for kt in shapes)]
        offers = {k: list(map(dict.__contains__, allocs, repeat(k))) for k in partial}
    except TypeError:
        return None
    rows += [list(map(_PODS_ALLOCATABLE, nodes)), list(map(_PODS_USED, nodes))]
    arrays = [np.array(row) for row in rows]  # one row at a time: much faster than a table
    if any(arr.dtype.kind != "i" for arr in arrays):
        return None  # bool, float, beyond int64 or not a number
    table = np.stack(arrays).astype(np.int64, copy=False)
    if max(int(table.max()), -int(table.min())) >= _FLOAT_EXACT:
        return None
    raw_a = table[:nres]
    raw_r = table[nres : 2 * nres]
    if offers:
        raw_r = raw_r.copy()
        for k, offered in offers.items():
            raw_r[res_index[k], ~np.array(offered, dtype=bool)] = 0
    share = _shares(raw_a, raw_r, keys, shapes, res_index)
    sched = np.array([not node.unschedulable for node in nodes], dtype=bool)
    return _columns_from(res_index, _Raw(raw_a, raw_r, table[2 * nres :], share, sched))


def _shares(
    raw_a: IntArray,
    raw_r: IntArray,
    keys: Sequence[tuple[str, ...]],
    shapes: Mapping[tuple[str, ...], int],
    res_index: Mapping[str, int],
) -> npt.NDArray[np.float64]:
    """Each node's :func:`_allocated_share`, bit for bit: summed left to right in the
    node's own resource order (``keys``, its allocatable's keys; ``shapes`` numbers the
    distinct ones) from the same correctly rounded quotients (both operands are exact in
    float64 below 2**53). Adding 0.0 for a resource a node does not offer changes no
    sum, so nodes whose resource orders all follow ``res_index`` are summed in one pass,
    others by their own order. Depends on each node's values only, so the shares of a
    few nodes are computed exactly as the build of all of them computes them."""
    has = raw_a > 0
    quot = np.minimum(1.0, raw_r / np.where(has, raw_a, 1))
    quot[~has] = 0.0
    count = has.sum(axis=0)
    n = len(keys)
    total = np.zeros(n)
    orders = [[res_index[k] for k in kt] for kt in shapes]
    if all(o == sorted(o) for o in orders):
        for row in quot:  # left to right, in the first-seen order every node follows
            total += row
    else:
        shape_of = np.fromiter(map(shapes.__getitem__, keys), dtype=np.int64, count=n)
        for kt, s in shapes.items():
            at = np.flatnonzero(shape_of == s)
            part = np.zeros(len(at))
            for k in kt:
                part += quot[res_index[k], at]
            total[at] = part
    return np.where(count > 0, total / np.maximum(count, 1), 0.0)


def _columns_from(
    res_index: dict[str, int],
    raw: _Raw,
    totals: tuple[list[int], list[int], int] | None = None,
) -> _NodeColumns:
    """The node columns (fill order) of the nodes whose values ``raw`` holds; ``totals``
    (free, allocatable, slots over schedulable nodes), if known, are not summed again."""
    perm = np.argsort(-raw.share, kind="stable")
    raw_a = raw.alloc
    raw_r = raw.requested
    sched = raw.schedulable
    free_slots = np.maximum(raw.pods[0] - raw.pods[1], 0).astype(np.int64, copy=False)
    alloc = np.maximum(raw_a, 0)
    return _NodeColumns(
        order=perm.tolist(),
        res_index=res_index,
        alloc=np.take(alloc, perm, axis=1),  # C order, as the exact path's (a[:, p] is not)
        requested=np.take(np.maximum(raw_r, 0), perm, axis=1),
        slots=free_slots[perm],
        schedulable=sched[perm],
        total_free=(
            totals[0] if totals else _row_sums(np.maximum(raw_a[:, sched] - raw_r[:, sched], 0))
        ),
        total_alloc=totals[1] if totals else _row_sums(alloc[:, sched]),
        total_slots=totals[2] if totals else _row_sums(free_slots[sched].reshape(1, -1))[0],
        perm=perm,
        raw=raw,
    )


def _row_sums(x: IntArray) -> list[int]:
    """Exact sums of the rows of ``x`` (non-negative, below 2**53), as Python ints."""
    if not x.size:
        return [0] * len(x)
    if int(x.max()) * x.shape[1] < 1 << 63:  # no int64 overflow
        return [int(v) for v in x.sum(axis=1)]
    return [sum(row) for row in x.tolist()]


def _hard_taints(taints: Sequence[Taint]) -> tuple[Taint, ...]:
    return tuple(t for t in taints if t.effect in HARD_EFFECTS)


def _taint_codes(
    nodes: Sequence[NodeCapacity],
) -> tuple[IntArray, dict[tuple[Taint, ...], int]]:
    """Per node (snapshot order) the number of its NoSchedule/NoExecute taints in the
    returned index (-1: none). Taint tuples are read once per object."""
    codes = np.full(len(nodes), -1, dtype=np.int64)
    index: dict[tuple[Taint, ...], int] = {}
    by_object: dict[int, int] = {}
    for j, taints in enumerate(map(_TAINTS, nodes)):
        if taints:
            key = id(taints[0]) if len(taints) == 1 else id(taints)
            code = by_object.get(key)
            if code is None:
                hard = _hard_taints(taints)
                code = by_object[key] = index.setdefault(hard, len(index)) if hard else -1
            codes[j] = code
    return codes, index


#: clusters of at most this many nodes are built node by node (no derived views for
#: them): below that, numpy's per-call overhead makes the vectorised build slower
#: (16 nodes: 57 against 82 us; 32 nodes: 104 against 93 us)
_EXACT_NODES = 16
#: a view is derived from the previous one while at most this many nodes changed (or
#: a sixteenth of them, if more): beyond that a full build is about as fast
_PATCH_MIN = 8


def _plain_int(v: object) -> bool:
    return type(v) is int and -_FLOAT_EXACT < v < _FLOAT_EXACT


def _derived(prev: ClusterColumns, nodes: Sequence[NodeCapacity]) -> ClusterColumns | None:
    """The view of ``nodes`` derived from ``prev``: ``prev`` itself when ``nodes`` are
    its node objects, else its values patched for the new objects, the fill order and
    everything read in it re-derived (with the same code as a full build, so equal to
    one). None -- build in full -- unless the node names are the same at the same
    positions, each new object offers the same resources in the same order as the one
    it replaces, every new quantity is a plain integer below 2**53, ``prev`` was built
    by the vectorised path and only a few objects are new."""
    old = prev.nodes
    n = len(nodes)
    if len(old) != n:
        return None
    diff = list(compress(range(n), map(is_not, old, nodes)))
    if not diff:
        return prev
    raw = prev.raw
    if raw is None:
        return None
    if len(diff) > max(_PATCH_MIN, n // 16):
        return None
    new = [nodes[j] for j in diff]
    values = _new_values(prev, diff, new)
    if values is None:
        return None
    cols_a, cols_r, keys, pods = values
    res_index = prev.res_index
    at = np.array(diff, dtype=np.int64)
    nres = len(res_index)
    raw_a = raw.alloc.copy()
    raw_r = raw.requested.copy()
    raw_p = raw.pods.copy()
    share = raw.share.copy()
    sched = raw.schedulable.copy()
    raw_a[:, at] = np.array(cols_a, dtype=np.int64).reshape(len(diff), nres).T
    raw_r[:, at] = np.array(cols_r, dtype=np.int64).reshape(len(diff), nres).T
    raw_p[:, at] = np.array(pods, dtype=np.int64).T
    shapes = {kt: s for s, kt in enumerate(dict.fromkeys(keys))}
    share[at] = _shares(raw_a[:, at], raw_r[:, at], keys, shapes, res_index)
    sched[at] = [not node.unschedulable for node in new]
    patched = _Raw(raw_a, raw_r, raw_p, share, sched)
    parts = _columns_from(res_index, patched, _adjusted_totals(prev, raw, patched, at))
    codes, index = _patched_taints(prev, diff, new)
    labels = list(prev.labels_snap)
    for j, node in zip(diff, new, strict=True):
        labels[j] = node.labels
    out = object.__new__(ClusterColumns)
    out._fill(tuple(nodes), parts, prev.names_snap, labels, codes, index)
    out.memo = _carried_masks(prev, out, diff)
    return out


def _new_values(
    prev: ClusterColumns, diff: Sequence[int], new: Sequence[NodeCapacity]
) -> tuple[list[list[int]], list[list[int]], list[tuple[str, ...]], list[tuple[int, int]]] | None:
    """The new node objects' allocatable and requested per resource of ``prev`` (requests
    only where offered), resource orders and pod counts; None unless each has the name
    and the resource order of the object it replaces and only plain integers below
    2**53."""
    old = prev.nodes
    names = list(prev.res_index)
    cols_a: list[list[int]] = []
    cols_r: list[list[int]] = []
    keys: list[tuple[str, ...]] = []
    for j, node in zip(diff, new, strict=True):
        alloc = node.allocatable
        req = node.requested
        if not (isinstance(alloc, dict) and isinstance(req, dict)) or node.name != old[j].name:
            return None
        kt = tuple(alloc)
        if kt != tuple(old[j].allocatable):
            return None
        a = [dict.get(alloc, k, 0) for k in names]
        r = [dict.get(req, k, 0) for k in names]
        if not all(map(_plain_int, a)) or not all(map(_plain_int, r)):
            return None
        cols_a.append(a)
        offered = map(dict.__contains__, repeat(alloc), names)
        cols_r.append([v if o else 0 for o, v in zip(offered, r, strict=True)])
        keys.append(kt)
    pods = [(node.pods_allocatable, node.pods_used) for node in new]
    if not all(_plain_int(a) and _plain_int(u) for a, u in pods):
        return None
    return cols_a, cols_r, keys, pods


def _adjusted_totals(
    prev: ClusterColumns, raw: _Raw, patched: _Raw, at: IntArray
) -> tuple[list[int], list[int], int]:
    """``prev``'s exact sums over schedulable nodes with the nodes at ``at`` taken out as
    ``raw`` had them and put in as ``patched`` has them."""
    total_free = list(prev.total_free)
    total_alloc = list(prev.total_alloc)
    total_slots = prev.total_slots
    for sign, values in ((-1, raw), (1, patched)):
        on = at[values.schedulable[at]]
        if not len(on):
            continue
        a_on = values.alloc[:, on]
        free_sums = _row_sums(np.maximum(a_on - values.requested[:, on], 0))
        total_free = [t + sign * v for t, v in zip(total_free, free_sums, strict=True)]
        alloc_sums = _row_sums(np.maximum(a_on, 0))
        total_alloc = [t + sign * v for t, v in zip(total_alloc, alloc_sums, strict=True)]
        p_ = values.pods
        total_slots += sign * _row_sums(np.maximum(p_[0:1, on] - p_[1:2, on], 0))[0]
    return total_free, total_alloc, total_slots


def _patched_taints(
    prev: ClusterColumns, diff: Sequence[int], new: Sequence[NodeCapacity]
) -> tuple[IntArray, dict[tuple[Taint, ...], int]]:
    """``prev``'s taint codes with the new objects' (the index extended, as a copy, by
    taint sets it did not have)."""
    codes = prev.taint_code.copy()
    index = prev.taint_index
    for j, node in zip(diff, new, strict=True):
        hard = _hard_taints(node.taints)
        code = index.get(hard, -1) if hard else -1
        if hard and code < 0:
            if index is prev.taint_index:
                index = dict(index)
            code = index[hard] = len(index)
        codes[j] = code
    return codes, index


def _carried_masks(prev: ClusterColumns, new: ClusterColumns, diff: list[int]) -> dict[Any, Any]:
    """``prev``'s memoised label masks for ``new``: moved to its fill order, the changed
    nodes (snapshot positions ``diff``) evaluated afresh. Other masks are cheap to
    compute again."""
    memo: dict[Any, Any] = {}
    for key, mask in prev.memo.copy().items():
        if not (isinstance(key, tuple) and key[0] == "label"):
            continue
        _tag, name, value = key
        at_pos = np.empty(len(mask), dtype=bool)
        at_pos[prev.order] = mask
        for j in diff:
            labels = new.labels_snap[j]
            try:
                got = dict.get(labels, name)
            except TypeError:
                got = labels.get(name)
            at_pos[j] = bool(eq(got, value))
        memo[key] = at_pos[new.order]
    return memo
