"""Columnar views of several clusters stacked into one (:class:`Fleet`), so the engine
packs a pod group on every candidate cluster at once: cluster-major, every cluster a
contiguous segment of node indices, over the union of their resources. Eligible node
sets per pod shape are memoised, and a stale fleet view is patched for the clusters that
changed, not rebuilt (:meth:`fleetq.placement.index.PlacementIndex.fleet_of`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from fleetq.placement.columns import _FLOAT_EXACT, _MEMO_LIMIT, ClusterColumns, IntArray

if TYPE_CHECKING:
    from fleetq.placement.rule import PodGroup


@dataclass(frozen=True)
class _Eligible:
    """The fleet's nodes a pod shape (nodeSelector x tolerations) may use, with a free
    pod slot, and their free resources (gathered once, read-only)."""

    idx: IntArray  # global node indices, ascending (hence cluster-major)
    bounds: IntArray  # len(clusters) + 1 positions in idx where each cluster starts
    free: IntArray  # (resources, len(idx)) free per union resource
    slots: IntArray  # free pod slots
    ffree: npt.NDArray[np.float64] | None  # float64 copy of free when exact (< 2**53)
    fslots: npt.NDArray[np.float64]


class Fleet:
    """Columnar views of several clusters stacked into one, over the union of their
    resources (a resource a cluster does not offer is 0 on its nodes).

    When some clusters' views change, a fleet view is not rebuilt from scratch
    (``PlacementIndex.fleet_of``): if nobody is using the cached fleet view that shares the most
    clusters with the new one, :meth:`patch` overwrites the changed clusters' segments
    in place and marks the eligible node sets it holds stale for those clusters, and
    :meth:`eligible` rewrites just those segments when a set is next asked for;
    otherwise the new view is built from that one (``base``), copying its columns and
    splicing its eligible sets when first asked for. Either way the arrays equal those
    of a build from scratch, for a cost that depends on what changed."""

    __slots__ = (
        "classes",
        "fas",
        "inherited",
        "lent",
        "lock",
        "memo",
        "names_arr",
        "nres",
        "readers",
        "res_index",
        "stale",
        "starts",
        "views",
    )
    fas: IntArray
    names_arr: npt.NDArray[Any]

    def __init__(
        self,
        views: tuple[ClusterColumns, ...],
        base: Fleet | None = None,
        res_index: dict[str, int] | None = None,
        lock: AbstractContextManager[Any] | None = None,
    ) -> None:
        self.views = views
        sizes = [len(v) for v in views]
        starts = np.zeros(len(views) + 1, dtype=np.int64)
        np.cumsum(sizes, out=starts[1:])
        self.starts = starts
        res_index = union(views) if res_index is None else res_index
        self.res_index = res_index
        nres = len(res_index)
        self.nres = nres
        self.readers = 0  # decisions using this view now (guarded by the index's lock)
        self.lent = False  # a view built from this one reads its eligible sets
        #: guards memo refreshes
        self.lock: AbstractContextManager[Any] = nullcontext() if lock is None else lock
        self.stale: dict[str, set[int]] = {}  # memo key -> clusters changed since
        self.memo: dict[str, _Eligible] = {}
        self.inherited: _Inherited | None = None
        changed: list[int] | None = None
        if base is not None and len(base.views) == len(views) and base.res_index == res_index:
            pairs = zip(base.views, views, strict=True)
            changed = [c for c, (a, b) in enumerate(pairs) if a is not b]
        # rows: free per resource, allocatable per resource, free pod slots
        if changed is None or base is None:
            fas = _stack([_block(v, res_index) for v in views], 2 * nres + 1, np.int64)
            names_arr = _stack([v.names_arr for v in views], None, object)
        else:
            old = base.starts.tolist()
            fas = _splice(base.fas, old, changed, lambda c: _block(views[c], res_index))
            names_arr = _splice(base.names_arr, old, changed, lambda c: views[c].names_arr)
            with base.lock:  # the eligible sets base holds for its current views
                memo = {k: v for k, v in base.memo.items() if k not in base.stale}
            self.inherited = _Inherited(memo, old, starts.tolist(), changed)
        fas.setflags(write=False)
        self.fas = fas
        self.names_arr = names_arr
        self.classes = _classes(views)

    def patch(self, views: tuple[ClusterColumns, ...], changed: Sequence[int]) -> None:
        """Take ``views`` (as many clusters, the same resource union and, at ``changed``,
        clusters of the same sizes) in place. Only for a fleet view nobody else uses."""
        starts = self.starts.tolist()
        self.fas.setflags(write=True)
        for c in changed:
            s, e = starts[c], starts[c + 1]
            self.fas[:, s:e] = _block(views[c], self.res_index)
            self.names_arr[s:e] = views[c].names_arr
        self.fas.setflags(write=False)
        self.views = views
        self.classes = _classes(views)
        for key in self.memo:
            self.stale.setdefault(key, set()).update(changed)
        inherited = self.inherited
        if inherited is not None:
            wider = sorted({*inherited.changed, *changed})
            self.inherited = _Inherited(inherited.memo, inherited.old_starts, starts, wider)

    def eligible(self, g: PodGroup) -> _Eligible:
        with self.lock:
            got = self.memo.get(g.key)
            if got is not None:
                stale = self.stale.pop(g.key, None)
                if stale:
                    got = self._refresh(g, got, sorted(stale))
                    self.memo[g.key] = got
                return got
            inherited = self.inherited
            old = inherited.memo.pop(g.key, None) if inherited is not None else None
            if inherited is not None and old is not None:
                idx, slots = self._splice_eligible(g, old, inherited)
            else:
                if self.views:
                    caps = np.concatenate(
                        [v.eligible_slots(g.selector, g.tolerations, g.key) for v in self.views]
                    )
                else:
                    caps = np.zeros(0, dtype=np.int64)
                idx = np.flatnonzero(caps > 0)
                slots = caps[idx]
            got = self._eligible_of(idx, slots)
            if len(self.memo) >= _MEMO_LIMIT:
                self.memo.clear()
                self.stale.clear()
            self.memo[g.key] = got
            return got

    def _eligible_of(self, idx: IntArray, slots: IntArray) -> _Eligible:
        free = self.fas[: self.nres, idx]
        free.setflags(write=False)
        exact = not free.size or int(free.max()) < _FLOAT_EXACT
        return _Eligible(
            idx=idx,
            bounds=np.searchsorted(idx, self.starts),
            free=free,
            slots=slots,
            ffree=free.astype(np.float64) if exact else None,
            fslots=slots.astype(np.float64),
        )

    def _refresh(self, g: PodGroup, el: _Eligible, changed: list[int]) -> _Eligible:
        """``el`` (this fleet's, computed before :meth:`patch` changed the clusters at
        ``changed``) made current: segments rewritten in place where a changed cluster
        has as many eligible nodes as before, else spliced into new arrays."""
        starts = self.starts.tolist()
        bounds = el.bounds.tolist()
        fresh: list[tuple[int, IntArray, IntArray]] = []
        for c in changed:
            caps = self.views[c].eligible_slots(g.selector, g.tolerations, g.key)
            at = np.flatnonzero(caps > 0)
            fresh.append((c, at, caps[at]))
        same = all(len(at) == bounds[c + 1] - bounds[c] for c, at, _s in fresh)
        frees = [self.fas[: self.nres, at + starts[c]] for c, at, _s in fresh]
        if (
            not same
            or el.ffree is None
            or any(f.size and int(f.max()) >= _FLOAT_EXACT for f in frees)
        ):
            given = {c: (at, s) for c, at, s in fresh}
            moved = _Inherited({}, starts, starts, changed)
            return self._eligible_of(*self._splice_eligible(g, el, moved, given))
        arrays = (el.idx, el.free, el.slots, el.ffree, el.fslots)
        for a in arrays:
            a.setflags(write=True)
        try:
            for (c, at, slots), free in zip(fresh, frees, strict=True):
                lo, hi = bounds[c], bounds[c + 1]
                el.idx[lo:hi] = at + starts[c]
                el.free[:, lo:hi] = free
                el.slots[lo:hi] = slots
                el.ffree[:, lo:hi] = free
                el.fslots[lo:hi] = slots
        finally:
            for a in arrays:
                a.setflags(write=False)
        return el

    def _splice_eligible(
        self,
        g: PodGroup,
        old: _Eligible,
        inherited: _Inherited,
        fresh: Mapping[int, tuple[IntArray, IntArray]] | None = None,
    ) -> tuple[IntArray, IntArray]:
        """``old``'s eligible nodes and their slots, re-based to this fleet's node
        positions, with those of the changed clusters computed afresh (or taken from
        ``fresh``: cluster -> eligible local positions, their slots)."""
        bounds = old.bounds.tolist()
        starts = inherited.new_starts
        idx: list[IntArray] = []
        slots: list[IntArray] = []
        prev = 0  # first cluster of the run of unchanged clusters before `c`
        for c in [*inherited.changed, len(self.views)]:
            if c > prev:
                lo, hi = bounds[prev], bounds[c]
                shift = starts[prev] - inherited.old_starts[prev]
                idx.append(old.idx[lo:hi] + shift if shift else old.idx[lo:hi])
                slots.append(old.slots[lo:hi])
            if c < len(self.views):
                got = fresh.get(c) if fresh is not None else None
                if got is None:
                    caps = self.views[c].eligible_slots(g.selector, g.tolerations, g.key)
                    at = np.flatnonzero(caps > 0)
                    got = (at, caps[at])
                idx.append(got[0] + starts[c])
                slots.append(got[1])
            prev = c + 1
        return np.concatenate(idx), np.concatenate(slots)


@dataclass(frozen=True)
class _Inherited:
    """What a fleet view built from a base keeps of it: base's eligible sets (consumed
    as they are spliced), both fleets' cluster start positions, the changed clusters."""

    memo: dict[str, _Eligible]
    old_starts: list[int]
    new_starts: list[int]
    changed: list[int]


def union(views: Sequence[ClusterColumns]) -> dict[str, int]:
    res_index: dict[str, int] = {}
    for v in views:
        for name in v.resources:
            res_index.setdefault(name, len(res_index))
    return res_index


def _classes(views: Sequence[ClusterColumns]) -> dict[tuple[Any, ...], list[int]]:
    """Clusters with the same largest node per resource: they share the gang's group
    order."""
    classes: dict[tuple[Any, ...], list[int]] = {}
    for c, v in enumerate(views):
        classes.setdefault(v.class_key, []).append(c)
    return classes


def _block(v: ClusterColumns, res_index: Mapping[str, int]) -> IntArray:
    """One cluster's segment of the fleet's stacked columns: free per union resource,
    allocatable per union resource, free pod slots."""
    nres = len(res_index)
    out = np.zeros((2 * nres + 1, len(v)), dtype=np.int64)
    for name, r in v.res_index.items():
        u = res_index[name]
        out[u] = v.free[r]
        out[nres + u] = v.alloc[r]
    out[2 * nres] = v.slots
    return out


def _stack(parts: Sequence[npt.NDArray[Any]], rows: int | None, dtype: Any) -> npt.NDArray[Any]:
    if parts:
        return np.concatenate(parts, axis=-1)
    return np.zeros((0,) if rows is None else (rows, 0), dtype=dtype)


def _splice(
    old: npt.NDArray[Any],
    starts: Sequence[int],
    changed: Sequence[int],
    piece: Callable[[int], npt.NDArray[Any]],
) -> npt.NDArray[Any]:
    """``old``'s columns (cluster ``c`` at ``starts[c]:starts[c + 1]``) with those of the
    ``changed`` clusters (ascending) replaced by ``piece(c)``."""
    parts: list[npt.NDArray[Any]] = []
    prev = 0
    for c in changed:
        if c > prev:
            parts.append(old[..., starts[prev] : starts[c]])
        parts.append(piece(c))
        prev = c + 1
    if prev < len(starts) - 1:
        parts.append(old[..., starts[prev] : starts[-1]])
    return _stack(parts, None if old.ndim == 1 else old.shape[0], old.dtype)

