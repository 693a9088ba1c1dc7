"""The per-node queue: total order, positions, per-shape heads, lower bound and the
starvation bookkeeping (skipped → starving)."""

from __future__ import annotations

from fleetq.queues import JobQueue, Key
from fleetq.resources import Resources

SHAPES: list[Resources] = [
    {"cpu": 8000, "kube-queue/max-jobs": 1000},
    {"cpu": 1000, "kube-queue/max-jobs": 1000},
    {"nvidia.com/gpu": 1000, "kube-queue/max-jobs": 1000},
]


def key(job: str, priority: int = 0, at: float = 0.0) -> Key:
    return (-priority, at, job)


def test_order_is_priority_desc_then_submit_time_then_job_id() -> None:
    q = JobQueue("q", "n", SHAPES)
    keys = [key("late", 0, 5), key("b", 0, 1), key("a", 0, 1), key("urgent", 9, 100)]
    for k in keys:
        q.add(k, 0)
    assert [k[2] for k in q.order] == ["urgent", "a", "b", "late"]
    assert q.position(key("late", 0, 5)) == 4
    assert q.head() == key("urgent", 9, 100)
    q.remove(key("urgent", 9, 100), 0)
    assert q.position(key("late", 0, 5)) == 3
    assert q.head() == key("a", 0, 1)


def test_heads_track_first_job_of_each_shape() -> None:
    q = JobQueue("q", "n", SHAPES)
    q.add(key("big", 0, 1), 0)
    q.add(key("small-2", 0, 3), 1)
    q.add(key("small-1", 0, 2), 1)
    assert q.heads == [(key("big", 0, 1), 0), (key("small-1", 0, 2), 1)]
    q.remove(key("small-1", 0, 2), 1)
    assert q.heads == [(key("big", 0, 1), 0), (key("small-2", 0, 3), 1)]
    q.remove(key("big", 0, 1), 0)
    assert q.heads == [(key("small-2", 0, 3), 1)]
    assert q.by_shape == {1: [key("small-2", 0, 3)]}


def test_lower_bound_is_componentwise_minimum_and_follows_removals() -> None:
    q = JobQueue("q", "n", SHAPES)
    q.add(key("big"), 0)
    q.add(key("small"), 1)
    assert q.lower_bound() == {"cpu": 1000, "kube-queue/max-jobs": 1000}
    q.add(key("gpu"), 2)
    assert q.lower_bound() == {"kube-queue/max-jobs": 1000}
    q.remove(key("gpu"), 2)
    q.remove(key("small"), 1)
    assert q.lower_bound() == SHAPES[0]


def test_skipped_jobs_become_starving_only_after_the_bound() -> None:
    q = JobQueue("q", "n", SHAPES)
    for i, name in enumerate(["x", "y", "z"]):
        q.add(key(name, 0, i), 0)
    q.mark_skipped_before(key("z", 0, 2), now=100)  # x and y were passed over at t=100
    q.mark_skipped_before(key("z", 0, 2), now=150)  # already skipped: keeps t=100
    assert q.skipped_at == {key("x", 0, 0): 100, key("y", 0, 1): 100}
    q.promote(now=700, bound=600)
    assert q.first_starving() is None  # exactly 600 s is not longer than the bound
    q.promote(now=700.5, bound=600)
    assert q.starving == [key("x", 0, 0), key("y", 0, 1)]
    assert q.starving_before(key("z", 0, 2)) == key("x", 0, 0)
    assert q.starving_before(key("x", 0, 0)) is None
    q.remove(key("x", 0, 0), 0)
    assert q.first_starving() == key("y", 0, 1)
    assert q.fresh == [key("z", 0, 2)]


def test_restored_skip_time_counts_from_the_original_skip() -> None:
    q = JobQueue("q", "n", SHAPES)
    q.add(key("old"), 0, skipped_at=10.0)
    q.add(key("new", 0, 1), 0)
    assert q.fresh == [key("new", 0, 1)]
    q.promote(now=611, bound=600)
    assert q.starving == [key("old")]


def test_lower_bound_survives_shapes_coming_and_going() -> None:
    shapes: list[Resources] = [{"cpu": 1000 + i, "kube-queue/max-jobs": 1000} for i in range(50)]
    q = JobQueue("q", "n", shapes)
    for round_ in range(5):
        for i in range(50):
            q.add(key(f"r{round_}-{i}", 0, i), i)
        for i in range(49):
            q.remove(key(f"r{round_}-{i}", 0, i), i)
        assert q.lower_bound() == shapes[49]
        q.remove(key(f"r{round_}-49", 0, 49), 49)
        assert q.lower_bound() == {}
    assert all(len(h) <= 2 * 50 + 16 for h in q._res_heaps.values())
