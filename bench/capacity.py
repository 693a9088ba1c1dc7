"""Benchmark: what does the watch-fed capacity cache buy over LISTing every cluster?

An emulated fleet of 20 clusters x 200 nodes x 2,000 pods; a whole-fleet capacity
snapshot timed cold (a fresh LIST of everything), warm rebuilt (every cache marked
changed) and warm unchanged. The ratio is cold / warm-rebuilt, target 10: the cache earns
its threads and memory only if it is an order of magnitude cheaper than LISTing even when
every cluster changed. Method: BENCHMARKS.md "Bench methods"; figures: §3.

Run: ``python -m bench.capacity [--clusters 20] [--nodes 200] [--pods 2000]``.
Last line: ``RESULT capacity <ratio cold/warm> (target 10.0)``.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
import yaml

from activities.fleet import Fleet
from activities.member_cluster import KubernetesMemberCluster
from bench.command import bench_app, run_command

TARGET = 10.0


def topology(clusters: int, nodes: int) -> dict[str, Any]:
    return {
        "clusters": [
            {
                "name": f"bench-{i:02d}",
                "reservation": True,
                "nodeGroups": [{"count": nodes, "cpu": 64, "memory": "256Gi", "pods": 110}],
            }
            for i in range(clusters)
        ]
    }


def timed(fn: Callable[[], Any], repeat: int) -> float:
    """Median wall time of ``repeat`` calls, in seconds."""
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def run(args: Options) -> int:

    from fleetq.emulator.fleet import EmulatedFleet
    from fleetq.topology import parse_topology

    out = Path(tempfile.mkdtemp(prefix="fleetq-bench-capacity-"))
    topo = parse_topology(topology(args.clusters, args.nodes), "bench topology")
    print(f"fleet: {args.clusters} clusters x {args.nodes} nodes x {args.pods} running pods")
    with EmulatedFleet(topo, out_dir=out) as emu:
        t0 = time.perf_counter()
        for name in emu.members:
            emu.add_running_pods(name, args.pods, requests={"cpu": "250m", "memory": "512Mi"})
        print(f"loaded {args.clusters * args.pods} pods in {time.perf_counter() - t0:.1f}s")

        cfg = out / "bench-fleet.yaml"
        cfg.write_text(yaml.safe_dump({
            "kubeconfig": str(emu.kubeconfig_path),
            "clusters": [{"name": n, "context": n, "reservation": True} for n in emu.members],
            "timeouts": {"connectSeconds": 5, "readSeconds": 60},
            "cacheTTLSeconds": 5,
        }))
        t0 = time.perf_counter()
        with Fleet.from_config(cfg) as fleet:
            snaps = fleet.snapshots()
            print(f"caches synced in {time.perf_counter() - t0:.2f}s")
            bad = [s.name for s in snaps if not s.reachable]
            pods = sum(n.pods_used for s in snaps for n in s.nodes)
            if bad or pods != args.clusters * args.pods:
                print(f"error: unreachable {bad}, {pods} pods seen")
                return 1
            members = [m for m in fleet.clusters.values()
                       if isinstance(m, KubernetesMemberCluster)]

            def cold() -> None:
                got = fleet.snapshots_by_list()
                assert all(s.reachable for s in got)

            def rebuilt() -> None:
                for m in members:
                    m.cache.invalidate()
                fleet.snapshots()

            cold_s = timed(cold, args.repeat)
            rebuilt_s = timed(rebuilt, 50)
            unchanged_s = timed(fleet.snapshots, 1000)
            # The two views agree (same nodes, same requested) once the fleet is idle.
            same = all(
                [(n.name, n.requested, n.pods_used) for n in a.nodes]
                == [(n.name, n.requested, n.pods_used) for n in b.nodes]
                for a, b in zip(fleet.snapshots(), fleet.snapshots_by_list(), strict=True)
            )
    ratio = cold_s / rebuilt_s
    print(f"cold LIST snapshot of the fleet:       {cold_s * 1000:9.2f} ms "
          f"(median of {args.repeat})")
    print(f"warm snapshot, every cluster changed:  {rebuilt_s * 1000:9.3f} ms (median of 50)")
    print(f"warm snapshot, nothing changed:        {unchanged_s * 1e6:9.1f} us (median of 1000)")
    print(f"cold/warm-unchanged: {cold_s / unchanged_s:.0f}x; cached == listed: {same}")
    print(f"RESULT capacity {ratio:.2f} (target {TARGET})")
    return 0 if same and ratio >= TARGET else 1


@dataclass(frozen=True)
class Options:
    """``fleetq bench capacity``'s options as parsed (the defaults are the command's)."""

    clusters: int
    nodes: int
    pods: int
    repeat: int


app = bench_app()


@app.command(help=(__doc__ or "").split("\n")[0])
def command(
    clusters: int = typer.Option(20, "--clusters"),
    nodes: int = typer.Option(200, "--nodes", help="nodes per cluster"),
    pods: int = typer.Option(2000, "--pods", help="running pods per cluster"),
    repeat: int = typer.Option(5, "--repeat", help="cold LIST samples (median)"),
) -> None:
    raise typer.Exit(run(Options(clusters, nodes, pods, repeat)))


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(app, argv, "python -m bench.capacity")


if __name__ == "__main__":
    raise SystemExit(main())
