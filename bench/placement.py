"""Benchmark: how expensive is a node-by-node gang placement over a large fleet?

100 member clusters x 1,000 nodes (cpu nodes and 8-GPU nodes carrying a GPU taint, a few
cordoned, label pools, 20-95% already used) and a gang of 1 master + 63 GPU workers.
We time the full :func:`fleetq.placement.place_gang` decision over all clusters with warm
caches (per-snapshot columnar views and the stacked fleet view, both kept warm by handing
the same snapshot objects to every placement, as the adapter's capacity cache does) and
compare it with one linear numpy pass over the same node arrays (``free = allocatable -
requested``, compared with the worker's request on every node of every cluster) measured
in the same run, best of N for both. Target: the decision costs at most 5x that pass.
The fleet is generated from a fixed seed.

Run: ``python -m bench.placement [--clusters 100] [--nodes 1000] [--workers 63]``.
Last line: ``RESULT placement <ratio> (target 5.0)``.
"""

from __future__ import annotations

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
    columns_of,
    estimate_sum_of_free,
    forget,
    place_gang,
)
from fleetq.resources import CPU, GPU, MEMORY

TARGET = 5.0
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


def run(args: Options) -> int:

    t0 = time.perf_counter()
    fleet = build_fleet(args.clusters, args.nodes)
    gang = build_gang(args.workers)
    print(f"fleet: {args.clusters} clusters x {args.nodes} nodes, gang of {len(gang.pods)} pods")
    print(f"build fleet           {time.perf_counter() - t0:8.3f} s")

    t0 = time.perf_counter()
    cold = place_gang(gang, fleet)
    cold_s = time.perf_counter() - t0
    print(f"place_gang cold       {cold_s * 1e3:8.2f} ms  (includes building columnar views)")

    views = [columns_of(c) for c in fleet]
    worker = gang.pods[-1].requests
    reqs = [np.array([[worker.get(r, 0)] for r in v.resources], dtype=np.int64) for v in views]
    fits_somewhere = linear_pass(views, reqs)

    decision = place_gang(gang, fleet)
    assert decision.ranked == cold.ranked and decision.rejections == cold.rejections
    place_s = best_of(lambda: place_gang(gang, fleet), args.repeat)
    pass_s = best_of(lambda: linear_pass(views, reqs), args.repeat * 3)
    sum_s = best_of(lambda: estimate_sum_of_free(gang, fleet), args.repeat)
    estimate = estimate_sum_of_free(gang, fleet)

    def build_all() -> None:
        for c in fleet:
            forget(c)
            columns_of(c)

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
    print(f"RESULT placement {ratio:.2f} (target {TARGET})")
    return 0


@dataclass(frozen=True)
class Options:
    """``fleetq bench placement``'s options as parsed (the defaults are the command's)."""

    clusters: int
    nodes: int
    workers: int
    repeat: int


app = bench_app()


@app.command(help=help_text(__doc__))
def command(
    clusters: int = typer.Option(100, "--clusters"),
    nodes: int = typer.Option(1000, "--nodes"),
    workers: int = typer.Option(63, "--workers"),
    repeat: int = typer.Option(15, "--repeat"),
) -> None:
    raise typer.Exit(run(Options(clusters, nodes, workers, repeat)))


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(app, argv, "python -m bench.placement")


if __name__ == "__main__":
    raise SystemExit(main())
