"""What placement remembers between decisions, held by whoever places: a
:class:`PlacementIndex` (the scheduling activities own one for the fleet's capacity
caches, the simulator its own, a one-off call a fresh one).

It keeps each versioned snapshot's columnar view (:class:`ClusterColumns`), the last view
of every cluster (the base a later snapshot's view is derived from) and the last few
stacked fleet views (:class:`~fleetq.placement.fleet.Fleet`). Callers that place from
several threads pass a lock factory (``PlacementIndex(threading.Lock)``); the core itself
never starts or knows threads."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from fleetq.capacity import ClusterSnapshot
from fleetq.placement.columns import ClusterColumns
from fleetq.placement.fleet import Fleet, union

#: stacked fleet views kept (most recently used last)
_FLEET_LIMIT = 4
#: clusters whose last view is kept as a base (beyond that the memory is cleared)
_LAST_LIMIT = 4096

LockFactory = Callable[[], AbstractContextManager[Any]]


def _fingerprint(snapshot: ClusterSnapshot) -> tuple[Any, ...]:
    return (snapshot.resource_version, id(snapshot.nodes), len(snapshot.nodes))


class PlacementIndex:
    """Views of snapshots and stacked fleet views, kept warm across decisions.

    A view is cached per snapshot object while its ``resource_version`` is non-empty and
    unchanged (and its node list is the same list of the same length); whoever mutates
    a snapshot in place must change its ``resource_version`` or call :meth:`forget`. A
    fleet view is cached per tuple of view objects, so it goes stale exactly when one of
    its snapshots does. ``lock`` makes the locks that guard the fleet views when several
    threads place with one index (the default: no locking, one thread)."""

    def __init__(self, lock: LockFactory = nullcontext) -> None:
        self._new_lock = lock
        self._lock = lock()
        self._views: dict[
            int, tuple[weakref.ref[ClusterSnapshot], tuple[Any, ...], ClusterColumns]
        ] = {}
        #: cluster name -> the snapshot its last view was built for (weakly) and that view
        self._last: dict[str, tuple[weakref.ref[ClusterSnapshot], ClusterColumns]] = {}
        self._fleets: dict[tuple[int, ...], Fleet] = {}

    # -- per-snapshot views --

    def columns_of(self, snapshot: ClusterSnapshot) -> ClusterColumns:
        """The columnar view of ``snapshot`` (cached while it is versioned and unchanged;
        call this when a snapshot is refreshed to pre-warm the index).

        A new snapshot object of a cluster (same name) gets a view derived from the last
        view of that cluster (:meth:`ClusterColumns.updated`): the cost follows the nodes
        that changed. This relies on node objects of versioned snapshots being read-only.
        A snapshot mutated in place (with a new ``resource_version``, or :meth:`forget`
        called) is built in full."""
        if not snapshot.resource_version:
            return ClusterColumns(snapshot)
        key = id(snapshot)
        views = self._views
        entry = views.get(key)
        fp = _fingerprint(snapshot)
        base: ClusterColumns | None = None
        if entry is not None and entry[0]() is snapshot:
            if entry[1] == fp:
                return entry[2]
        else:
            last = self._last.get(snapshot.name)
            if last is not None and last[0]() is not snapshot:
                base = last[1]
        cols = ClusterColumns(snapshot) if base is None else base.updated(snapshot)

        def _drop(_ref: weakref.ref[ClusterSnapshot], k: int = key) -> None:
            views.pop(k, None)

        views[key] = (weakref.ref(snapshot, _drop), fp, cols)
        if len(self._last) >= _LAST_LIMIT and snapshot.name not in self._last:
            self._last.clear()
        self._last[snapshot.name] = (weakref.ref(snapshot), cols)
        return cols

    def forget(self, snapshot: ClusterSnapshot) -> None:
        """Drop the cached view of ``snapshot`` (after mutating it in place), also as the
        base of its cluster's next view."""
        entry = self._views.get(id(snapshot))
        if entry is not None and entry[0]() is snapshot:
            del self._views[id(snapshot)]
        last = self._last.get(snapshot.name)
        if last is not None and last[0]() in (snapshot, None):
            self._last.pop(snapshot.name, None)

    # -- stacked fleet views --

    def fleet_of(self, views: tuple[ClusterColumns, ...], cacheable: bool) -> Fleet:
        """The stacked view of ``views`` for one decision (give it back with
        :meth:`release`), cached (a few, most recent kept) per tuple of view objects.

        A stale one is made from the cached fleet view sharing the most clusters with it
        (at least half): patched in place when no decision is using that one and the
        changed clusters kept their sizes, else built from it, so a decision after one
        cluster changed pays for that cluster (and, when built, a copy of the stacked
        columns) only."""
        if not cacheable:
            return Fleet(views)
        key = tuple(map(id, views))
        res_index = union(views)
        fleets = self._fleets
        with self._lock:
            fleet = fleets.pop(key, None)
            if fleet is not None and all(a is b for a, b in zip(fleet.views, views, strict=True)):
                fleets[key] = fleet  # most recently used last
                fleet.readers += 1
                return fleet
            base, base_key, changed = self._closest(views, res_index)
            own = False
            if base is not None:
                starts = base.starts
                own = (
                    base.readers == 0
                    and not base.lent
                    and all(len(views[c]) == starts[c + 1] - starts[c] for c in changed)
                )
                base.readers += 1
                if own:
                    del fleets[base_key]
                else:
                    base.lent = True
        if own and base is not None:
            base.patch(views, changed)
            fleet = base
        else:
            try:
                fleet = Fleet(views, base, res_index, self._new_lock())
            finally:
                if base is not None:
                    self.release(base)
            fleet.readers = 1
        with self._lock:
            fleets[key] = fleet  # holds the views, so their ids stay unique while cached
            while len(fleets) > _FLEET_LIMIT:
                del fleets[next(iter(fleets))]
        return fleet

    def _closest(
        self, views: tuple[ClusterColumns, ...], res_index: dict[str, int]
    ) -> tuple[Fleet | None, tuple[int, ...], list[int]]:
        """The cached fleet view (most recent first) differing from ``views`` in the
        fewest clusters (fewer than half), its key and those clusters."""
        base: Fleet | None = None
        base_key: tuple[int, ...] = ()
        changed: list[int] = []
        fewest = len(views) // 2 + 1
        for other_key, other in reversed(self._fleets.items()):
            if len(other.views) == len(views) and other.res_index == res_index:
                pairs = enumerate(zip(other.views, views, strict=True))
                diff = [c for c, (a, b) in pairs if a is not b]
                if len(diff) < fewest:
                    base, base_key, changed, fewest = other, other_key, diff, len(diff)
        return base, base_key, changed

    def release(self, fleet: Fleet) -> None:
        """A decision is done with ``fleet`` (from :meth:`fleet_of`)."""
        with self._lock:
            fleet.readers -= 1
