"""The ordered queue of waiting jobs of one quota node.

Scheduling runs in a workflow on every message with queues ten thousand jobs deep, so a
queue answers "which is the first job that fits?" without a rescan: jobs are kept by
``(-priority, submitted_at, job_id)``, per interned request shape (the first fitting job
is the first shape head that fits), and under a lower bound of all shapes (nothing fits
when it does not). It also keeps the ``Priority`` policy's skip times (starving is
derived) and, apart, its *inadmissible* jobs, as Kueue keeps ``inadmissibleWorkloads``
beside each ClusterQueue (kueue pkg/queue/cluster_queue.go). Details: docs/queues.md.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Sequence
from typing import TypeVar

from fleetq.quota import Inadmissible
from fleetq.resources import Resources

#: ``(-priority, submitted_at, job_id)``: smaller is earlier in the queue.
Key = tuple[int, float, str]
T = TypeVar("T", Key, tuple[Key, int])


def _discard(items: list[T], key: T) -> bool:
    i = bisect_left(items, key)
    if i < len(items) and items[i] == key:
        del items[i]
        return True
    return False


class JobQueue:
    """Waiting jobs of one quota node, in admission order."""

    def __init__(self, name: str, node: str, shapes: Sequence[Resources]) -> None:
        self.name = name
        self.node = node
        self._shapes = shapes  # shared, append-only table of interned requests
        self.order: list[Key] = []
        self.by_shape: dict[int, list[Key]] = {}
        self.heads: list[tuple[Key, int]] = []
        self.fresh: list[Key] = []  # never skipped
        self.skipped_at: dict[Key, float] = {}
        self._skip_heap: list[tuple[float, Key]] = []  # lazily pruned
        self.starving: list[Key] = []
        # Lower bound: per resource, a lazily pruned min-heap of (quantity, shape) over the
        # shapes present, and how many present shapes name that resource.
        self._res_heaps: dict[str, list[tuple[int, int]]] = {}
        self._res_count: dict[str, int] = {}
        #: jobs that can never be admitted under the current tree, and why
        self.inadmissible: dict[Key, Inadmissible] = {}
        #: where jobs that get a skip time are noted, if anywhere (the admission's
        #: continue-as-new journal)
        self.skip_log: list[Key] | None = None

    def __len__(self) -> int:
        """Waiting jobs that may be admitted (not the inadmissible ones)."""
        return len(self.order)

    def add_inadmissible(self, key: Key, why: Inadmissible) -> None:
        """Keep a job that can never be admitted under the current tree beside the
        queue: not in its order, heads, lower bound or starvation bookkeeping."""
        self.inadmissible[key] = why

    def add(self, key: Key, shape: int, skipped_at: float | None = None) -> None:
        insort(self.order, key)
        lst = self.by_shape.get(shape)
        if lst is None:
            self.by_shape[shape] = [key]
            insort(self.heads, (key, shape))
            for k, v in self._shapes[shape].items():
                heap = self._res_heaps.setdefault(k, [])
                heapq.heappush(heap, (v, shape))
                self._res_count[k] = self._res_count.get(k, 0) + 1
                if len(heap) > 2 * self._res_count[k] + 16:  # drop stale entries
                    heap[:] = [e for e in heap if e[1] in self.by_shape]
                    heapq.heapify(heap)
        else:
            old = lst[0]
            insort(lst, key)
            if lst[0] != old:
                _discard(self.heads, (old, shape))
                insort(self.heads, (key, shape))
        if skipped_at is None:
            insort(self.fresh, key)
        else:
            self.skipped_at[key] = skipped_at
            heapq.heappush(self._skip_heap, (skipped_at, key))

    def remove(self, key: Key, shape: int) -> None:
        """Remove a waiting job, queued or inadmissible."""
        if self.inadmissible.pop(key, None) is not None:
            return
        _discard(self.order, key)
        lst = self.by_shape[shape]
        i = bisect_left(lst, key)
        del lst[i]
        if i == 0:
            _discard(self.heads, (key, shape))
            if lst:
                insort(self.heads, (lst[0], shape))
            else:
                del self.by_shape[shape]
                for k in self._shapes[shape]:
                    self._res_count[k] -= 1
        if self.skipped_at.pop(key, None) is None:
            _discard(self.fresh, key)
        else:
            _discard(self.starving, key)

    def position(self, key: Key) -> int:
        """1-based position of a waiting job."""
        return bisect_left(self.order, key) + 1

    def head(self) -> Key | None:
        return self.order[0] if self.order else None

    def lower_bound(self) -> Resources:
        """Component-wise minimum request of all waiting jobs (absent = 0): if it does not
        fit, no job of this queue fits. O(resources) amortized."""
        shapes = len(self.by_shape)
        out: Resources = {}
        if not shapes:
            return out
        for k, heap in self._res_heaps.items():
            if self._res_count[k] != shapes:
                continue  # some waiting shape does not ask for k at all
            while heap[0][1] not in self.by_shape:
                heapq.heappop(heap)
            out[k] = heap[0][0]
        return out

    # ------------------------------------------------------------------ starvation

    def mark_skipped_before(self, key: Key, now: float) -> None:
        """Every job ahead of ``key`` not skipped before is skipped as of ``now``."""
        i = bisect_left(self.fresh, key)
        if not i:
            return
        for k in self.fresh[:i]:
            self.skipped_at[k] = now
            heapq.heappush(self._skip_heap, (now, k))
        if self.skip_log is not None:
            self.skip_log.extend(self.fresh[:i])
        del self.fresh[:i]

    def promote(self, now: float, bound: float) -> None:
        """Jobs skipped for longer than ``bound`` seconds become starving."""
        heap = self._skip_heap
        while heap and now - heap[0][0] > bound:
            t, key = heapq.heappop(heap)
            if self.skipped_at.get(key) == t:
                i = bisect_left(self.starving, key)
                if i == len(self.starving) or self.starving[i] != key:
                    self.starving.insert(i, key)

    def first_starving(self) -> Key | None:
        return self.starving[0] if self.starving else None

    def starving_before(self, key: Key) -> Key | None:
        """The first starving job ahead of ``key``, if any."""
        s = self.first_starving()
        return s if s is not None and s < key else None
