"""Benchmark: how expensive is a node-by-node gang placement over a large fleet?

A warm :func:`fleetq.placement.place_gang` decision for 1 master + 63 GPU workers over
100 clusters x 1,000 generated nodes (fixed seed), against one linear numpy pass over the
same nodes in the same run (target: at most 5x), and the decision right after one
cluster's snapshot changed, against a warm one (target: at most 2x). Method:
BENCHMARKS.md "Bench methods"; figures: §3.

Run: ``python -m bench.placement [--clusters 100] [--nodes 1000] [--workers 63]
[--changes 100]``. Last two lines: ``RESULT placementchanged <ratio> (target 2.0)`` and
``RESULT placement <ratio> (target 5.0)``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import typer

from bench.command import bench_app, help_text, run_command
from fleetq.capacity import ClusterSnapshot, NodeCapacity, Taint
from fleetq.models import Gang, GangPod
from fleetq.placement import (
    ClusterColumns,
    PlacementIndex,
    columns_of,
    estimate_sum_of_free,
    forget,
    place_gang,
)
from fleetq.resources import CPU, GPU, MEMORY

TARGET = 5.0
CHANGED_TARGET = 2.0
GI = (1 << 30) * 1000  # one GiB in milli-units
GPU_TAINT = Taint("nvidia.com/gpu", "present", "NoSchedule")


def build_fleet(n_clusters: int, n_nodes: int, seed: int = 7) -> list[ClusterSnapshot]:
    rng = np.random.default_rng(seed)
    cpu_shapes = [(16, 64), (32, 128), (64, 256), (96, 384)]
    clusters: list[ClusterSnapshot] = []
    for c in range(n_clusters):
        gpu_share = 0.2 + 0.4 * rng.random()
        load = 0.35 + 0.5 * rng.random()  # how busy this cluster is on average
        nodes: list[NodeCapacity] = []
        for i in range(n_nodes):
            is_gpu = rng.random() < gpu_share
            if is_gpu:
                cpu, mem, gpus = 96, 768, 8
            else:
                cpu, mem = cpu_shapes[int(rng.integers(len(cpu_shapes)))]
                gpus = 0
            alloc = {CPU: cpu * 1000, MEMORY: mem * GI}
            if gpus:
                alloc[GPU] = gpus * 1000
            u = float(np.clip(rng.normal(load, 0.2), 0.0, 1.0))
            requested = {
                CPU: int(alloc[CPU] * u) // 10 * 10,
                MEMORY: int(mem * u * 1.1 if u < 0.9 else mem) * GI,
            }
            requested[MEMORY] = min(requested[MEMORY], alloc[MEMORY])
            if gpus:
                requested[GPU] = int(rng.integers(0, gpus + 1)) * 1000
            pods_used = int(rng.integers(5, 60))
            nodes.append(
                NodeCapacity(
                    name=f"c{c:03d}-n{i:04d}",
                    allocatable=alloc,
                    requested=requested,
                    labels={
                        "pool": "gpu" if gpus else f"cpu-{cpu}",
                        "topology.kubernetes.io/zone": f"zone-{i % 3}",
                    },
                    taints=(GPU_TAINT,) if gpus else (),
                    unschedulable=rng.random() < 0.01,
                    pods_allocatable=110,
                    pods_used=pods_used,
                )
            )
        clusters.append(
            ClusterSnapshot(
                name=f"cluster-{c:03d}",
                labels={"region": f"region-{c % 4}"},
                nodes=nodes,
                resource_version=f"rv-{c}",
            )
        )
    return clusters


def build_gang(workers: int) -> Gang:
    tol = ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},)
    pods = [GangPod("master", 0, {CPU: 4000, MEMORY: 16 * GI})]
    pods += [
        GangPod("worker", i, {CPU: 8000, MEMORY: 64 * GI, GPU: 1000}, {"pool": "gpu"}, tol)
        for i in range(workers)
    ]
    return Gang(tuple(pods), priority=0)


def best_of(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def linear_pass(views: Sequence[ClusterColumns], reqs: Sequence[np.ndarray]) -> int:
    """One pass over every node of every cluster: free = allocatable - requested, does
    the worker's request fit on the node?"""
    n = 0
    for cols, req in zip(views, reqs, strict=True):
        free = cols.alloc - cols.requested
        n += int((free >= req).all(axis=0).sum())
    return n


def after_a_pod_changed(
    snap: ClusterSnapshot, rng: np.random.Generator, version: int
) -> ClusterSnapshot:
    """``snap`` as the capacity cache hands it over after a pod started or finished on one
    of its nodes: a new snapshot object and node list, in which the changed node is a new
    object (its dicts copied, as ``_State.build`` makes one: cpu request and pod count
    moved) and every other node is the very object of ``snap`` (``_State.build`` reuses
    the objects of nodes whose aggregates did not change)."""
    nodes = list(snap.nodes)
    if nodes:
        at = int(rng.integers(len(nodes)))
        n = nodes[at]
        started = n.pods_used == 0 or bool(rng.integers(2))
        cpu = n.requested.get(CPU, 0)
        requested = dict(n.requested)
        requested[CPU] = min(n.allocatable[CPU], cpu + 1000) if started else cpu // 2
        nodes[at] = NodeCapacity(
            name=n.name,
            allocatable=dict(n.allocatable),
            requested=requested,
            labels=dict(n.labels),
            taints=n.taints,
            unschedulable=n.unschedulable,
            pods_allocatable=n.pods_allocatable,
            pods_used=n.pods_used + (1 if started else -1),
        )
    return ClusterSnapshot(
        name=snap.name,
        labels=snap.labels,
        taints=snap.taints,
        nodes=nodes,
        reservation=snap.reservation,
        reachable=snap.reachable,
        resource_version=f"{snap.resource_version}+{version}",
    )


@dataclass(frozen=True)
class ChangedCase:
    """Medians of the decision after one cluster changed and of the warm one after it."""

    changed_s: float
    warm_s: float
    columns_s: float  # the changed cluster's view derived from its last one (in changed_s)
    full_columns_s: float  # the same view built from scratch, for comparison
    changed_cpu_s: float
    warm_cpu_s: float
    same_as_cold: bool


def one_cluster_changed(fleet: list[ClusterSnapshot], gang: Gang, changes: int) -> ChangedCase:
    """Before each of ``changes`` decisions replace one random cluster's snapshot; time
    that decision and a warm one right after it (wall clock and this thread's CPU)."""
    rng = np.random.default_rng(11)
    index = PlacementIndex()
    place_gang(gang, fleet, index=index)  # warm the index for the fleet as it is
    changed: list[float] = []
    warm: list[float] = []
    columns: list[float] = []
    full_columns: list[float] = []
    changed_cpu: list[float] = []
    warm_cpu: list[float] = []
    for version in range(1, changes + 1):
        k = int(rng.integers(len(fleet)))
        previous = columns_of(fleet[k], index)
        fleet[k] = after_a_pod_changed(fleet[k], rng, version)
        c0, t0 = time.thread_time(), time.perf_counter()
        place_gang(gang, fleet, index=index)
        changed.append(time.perf_counter() - t0)
        changed_cpu.append(time.thread_time() - c0)
        c0, t0 = time.thread_time(), time.perf_counter()
        place_gang(gang, fleet, index=index)
        warm.append(time.perf_counter() - t0)
        warm_cpu.append(time.thread_time() - c0)
        t0 = time.perf_counter()
        previous.updated(fleet[k])
        columns.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        ClusterColumns(fleet[k])
        full_columns.append(time.perf_counter() - t0)
    cold = [
        ClusterSnapshot(c.name, c.labels, c.taints, c.nodes, c.reservation, c.reachable, "")
        for c in fleet
    ]
    return ChangedCase(
        changed_s=statistics.median(changed),
        warm_s=statistics.median(warm),
        columns_s=statistics.median(columns),
        full_columns_s=statistics.median(full_columns),
        changed_cpu_s=statistics.median(changed_cpu),
        warm_cpu_s=statistics.median(warm_cpu),
        same_as_cold=place_gang(gang, fleet, index=index) == place_gang(gang, cold),
    )


def run(args: Options) -> int:

    t0 = time.perf_counter()
    fleet = build_fleet(args.clusters, args.nodes)
    gang = build_gang(args.workers)
    print(f"fleet: {args.clusters} clusters x {args.nodes} nodes, gang of {len(gang.pods)} pods")
    print(f"build fleet           {time.perf_counter() - t0:8.3f} s")

    index = PlacementIndex()  # what the scheduling activities keep warm
    t0 = time.perf_counter()
    cold = place_gang(gang, fleet, index=index)
    cold_s = time.perf_counter() - t0
    print(f"place_gang cold       {cold_s * 1e3:8.2f} ms  (includes building columnar views)")

    views = [columns_of(c, index) for c in fleet]
    worker = gang.pods[-1].requests
    reqs = [np.array([[worker.get(r, 0)] for r in v.resources], dtype=np.int64) for v in views]
    fits_somewhere = linear_pass(views, reqs)

    decision = place_gang(gang, fleet, index=index)
    assert decision.ranked == cold.ranked and decision.rejections == cold.rejections
    place_s = best_of(lambda: place_gang(gang, fleet, index=index), args.repeat)
    pass_s = best_of(lambda: linear_pass(views, reqs), args.repeat * 3)
    sum_s = best_of(lambda: estimate_sum_of_free(gang, fleet, index=index), args.repeat)
    estimate = estimate_sum_of_free(gang, fleet, index=index)

    def build_all() -> None:
        for c in fleet:
            forget(c, index)
            columns_of(c, index)

    build_s = best_of(build_all, 2)
    ratio = place_s / pass_s

    print(f"linear numpy pass     {pass_s * 1e3:8.2f} ms  ({fits_somewhere} nodes fit one worker)")
    print(f"place_gang warm       {place_s * 1e3:8.2f} ms  (best of {args.repeat})")
    print(f"sum-of-free estimate  {sum_s * 1e3:8.2f} ms")
    print(f"columnar views build  {build_s * 1e3:8.2f} ms  (all clusters, once per snapshot)")
    print(
        f"feasible: node-by-node {len(decision.ranked)}, sum-of-free {len(estimate.ranked)} "
        f"of {args.clusters}"
    )
    best = decision.best
    if best is not None:
        print(f"best: {best.cluster} score {best.score:.3f}")
    print(f"summary: {decision.summary(max_items=2)[:300]}")

    case = one_cluster_changed(fleet, gang, args.changes)
    changed_ratio = case.changed_s / case.warm_s
    print(f"1 of {args.clusters} clusters changed before each decision ({args.changes} times):")
    print(f"place_gang warm       {case.warm_s * 1e3:8.2f} ms  (median, right after)")
    print(f"place_gang changed    {case.changed_s * 1e3:8.2f} ms  (median)")
    print(f"  of which its view   {case.columns_s * 1e3:8.2f} ms  (median, derived from its last)")
    print(f"its view built afresh {case.full_columns_s * 1e3:8.2f} ms  (median, for comparison)")
    print(
        f"thread CPU: changed {case.changed_cpu_s * 1e3:.2f} ms, warm {case.warm_cpu_s * 1e3:.2f} "
        f"ms, ratio {case.changed_cpu_s / case.warm_cpu_s:.2f}"
    )
    print(f"decision after the changes == cold decision: {case.same_as_cold}")
    print(f"RESULT placementchanged {changed_ratio:.2f} (target {CHANGED_TARGET})")
    print(f"RESULT placement {ratio:.2f} (target {TARGET})")
    return 0


@dataclass(frozen=True)
class Options:
    """``fleetq bench placement``'s options as parsed (the defaults are the command's)."""

    clusters: int
    nodes: int
    workers: int
    repeat: int
    changes: int


app = bench_app()


@app.command(help=help_text(__doc__))
def command(
    clusters: int = typer.Option(100, "--clusters"),
    nodes: int = typer.Option(1000, "--nodes"),
    workers: int = typer.Option(63, "--workers"),
    repeat: int = typer.Option(15, "--repeat"),
    changes: int = typer.Option(
        100, "--changes", min=1, help="decisions after one cluster changed (median of)"
    ),
) -> None:
    raise typer.Exit(run(Options(clusters, nodes, workers, repeat, changes)))


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(app, argv, "python -m bench.placement")


if __name__ == "__main__":
    raise SystemExit(main())
