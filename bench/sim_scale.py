"""Benchmark: the simulator on Kueue's large-scale shape (issue 19, item 3): 10 parent
quota nodes x 100 leaves, 50,000 jobs, and how much of its CPU the scheduling passes
take, incremental pass against a full pass over every queue, in the same run.

The trace is generated (``--write`` saves it for ``fleetq sim replay``) in Kueue's three
classes over 4 hours; ``--kueue-generator FILE`` replays a Kueue generator config instead
(issue 24), without and with preemption. Method: BENCHMARKS.md "Bench methods"; figures:
§6 and "Kueue baseline".

Run: ``python -m bench.sim_scale [--parents 10] [--leaves 100] [--jobs 50000]
[--full-jobs 10000] [--write FILE]``. Last line: ``RESULT simlarge <process CPU seconds of
the incremental replay> (target 30)``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer
import yaml

from bench.command import bench_app, help_text, run_command
from fleetq.simulator import engine
from fleetq.simulator.trace import parse_trace

TARGET = 30.0
HOURS = 4 * 3600.0
CLASSES = [  # name, share of jobs, workers, cpu per pod, run min/max, priority
    ("small", 0.80, 0, "2", 300, 900, 10),
    ("medium", 0.16, 1, "4", 1200, 2400, 100),
    ("large", 0.04, 3, "4", 1800, 3600, 1000),
]
#: how much of an average leaf's demand each leaf submits, by leaf index modulo 6
LOAD = [2.4, 1.6, 1.0, 0.7, 0.5, 0.3]


def trace_doc(parents: int, leaves: int, jobs: int, preemption: bool = False) -> dict[str, Any]:
    """The large-scale trace as ``fleetq sim replay`` reads it."""
    orgs = []
    groups: list[dict[str, Any]] = []
    per_leaf = jobs / (parents * leaves)
    mean_load = sum(LOAD) / len(LOAD)
    for p in range(parents):
        teams = []
        for i in range(leaves):
            name = f"team-{p:02d}-{i:03d}"
            teams.append({"name": name, "namespaces": [name], "min": {"cpu": 12},
                          "max": {"cpu": 48}})
            load = LOAD[i % len(LOAD)] / mean_load
            for cls, share, workers, cpu, lo, hi, prio in CLASSES:
                count = max(1, round(per_leaf * share * load))
                interval = HOURS / count
                groups.append({
                    "name": f"{cls}-{p:02d}-{i:03d}", "namespace": name, "jobClass": cls,
                    "priority": prio, "count": count,
                    "start": round((p * leaves + i) % 600 + interval * 0.3, 1),
                    "interval": round(interval, 1), "workers": workers,
                    "requests": {"cpu": cpu, "memory": "8Gi"},
                    "runSeconds": {"min": lo, "max": hi},
                })
        orgs.append({"name": f"org-{p:02d}", "min": {"cpu": 12 * leaves},
                     "max": {"cpu": 18 * leaves}, "children": teams})
    total = 12 * leaves * parents
    notes = {"fleetq.io/preemption": "LowerPriority", "fleetq.io/reclaim": "Any"}
    return {
        "topology": {"clusters": [
            {"name": f"c{c}", "nodeGroups": [
                {"count": 16, "cpu": "256", "memory": "2048Gi", "pods": 1000}]}
            for c in range(4)
        ]},
        "seed": 19,
        "queuePolicy": "Priority",
        "quota": {
            "apiVersion": "scheduling.sigs.k8s.io/v1beta1",
            "kind": "ElasticQuotaTree",
            "metadata": {"name": "kueue-large", "namespace": "kube-system",
                         **({"annotations": notes} if preemption else {})},
            "spec": {"root": {"name": "root", "min": {"cpu": total}, "max": {"cpu": total},
                              "children": orgs}},
        },
        "jobs": groups,
    }


def outline(summary: dict[str, Any]) -> str:
    """The summary's top-level figures (not the per-group tables)."""
    keep = {k: v for k, v in summary.items() if isinstance(v, int | float | str)}
    return ", ".join(f"{k} {v}" for k, v in keep.items())


def replay(doc: dict[str, Any], incremental: bool) -> tuple[float, Any, int]:
    """Process CPU seconds of one replay, its result and the job count."""
    trace = parse_trace(doc, "kueue-large")
    sim = engine.Simulation(trace, None)
    sim.admission.incremental = incremental
    t0 = time.process_time()
    result = sim.run()
    return time.process_time() - t0, result, trace.job_count


#: the fleet a Kueue generator config is replayed on: 3 clusters of 4 x 64 cpu (768 cpu
#: for a 600-cpu tree: quota, as in Kueue's test, is what workloads wait for)
KUEUE_TOPOLOGY = {"clusters": [
    {"name": n, "nodeGroups": [{"count": 4, "cpu": "64", "memory": "256Gi", "pods": 110}]}
    for n in ("east", "west", "north")
]}


def kueue_figures(result: Any) -> str:
    """Root cpu usage, mean time to admission by class, preemptions and wasted cpu·s."""
    s = result.summary_data
    root = next(q for q in s["quota"] if q["node"] == "root")["resources"]["cpu"]
    tta = ", ".join(f"{c['class']} {c['timeToAdmission']['mean']:.2f} s" for c in s["classes"])
    p = s["preemption"]
    return (f"usage {root['averageUtilisation']:.3f}; mean time to admission {tta}; "
            f"preempted {p['preempted']} {p['byReason']}, capacity plans {p['capacityPlans']}, "
            f"finished during grace {p['finishedDuringGrace']}; wasted "
            f"{p['wastedCpuSeconds']:,.1f} cpu·s ({p['wastedShare']:.1%}); "
            f"makespan {s['makespan']} s")


def run_kueue(generator: Path) -> int:
    """Kueue's generator config replayed without and with preemption + reclaim."""
    from fleetq.simulator.kueue import trace_from_generator

    cfg = yaml.safe_load(generator.read_text())
    usages = []
    for preemption in (False, True):
        doc = trace_from_generator(cfg, KUEUE_TOPOLOGY, preemption=preemption)
        cpu, result, n = replay(doc, True)
        root = next(q for q in result.summary_data["quota"] if q["node"] == "root")
        usages.append(root["resources"]["cpu"]["averageUtilisation"])
        label = "LowerPriority + Any" if preemption else "Never"
        print(f"{n:,} jobs, {label}: {kueue_figures(result)} ({cpu:.1f} s CPU)")
    print(f"RESULT kueueusage {usages[1] / usages[0]:.3f} (target 0.9)")
    return 0


def run(parents: int, leaves: int, jobs: int, full_jobs: int, preemption: bool,
        write: Path | None) -> int:
    doc = trace_doc(parents, leaves, jobs, preemption)
    if write is not None:
        write.write_text(yaml.safe_dump(doc, sort_keys=False))
        print(f"wrote {write}")
    cpu, result, n = replay(doc, True)
    print(f"{parents} x {leaves} leaves, {n:,} jobs, preemption "
          f"{'LowerPriority + Any' if preemption else 'off'}: incremental passes "
          f"{cpu:.1f} s process CPU")
    print(outline(result.summary_data))
    if full_jobs:
        small = trace_doc(parents, leaves, full_jobs, preemption)
        inc_cpu, inc_result, m = replay(small, True)
        full_cpu, full_result, _ = replay(small, False)
        same = inc_result.summary_data == full_result.summary_data
        print(f"same shape, {m:,} jobs: incremental {inc_cpu:.1f} s, full pass "
              f"{full_cpu:.1f} s process CPU ({full_cpu / inc_cpu:.1f}x); same result: {same}")
    print(f"RESULT simlarge {cpu:.1f} (target {TARGET})")
    return 0


app = bench_app()


@app.command(help=help_text(__doc__))
def command(
    parents: int = typer.Option(10, "--parents", min=1),
    leaves: int = typer.Option(100, "--leaves", min=1, help="leaves per parent"),
    jobs: int = typer.Option(50_000, "--jobs", min=1),
    full_jobs: int = typer.Option(10_000, "--full-jobs", min=0,
                                  help="jobs of the full-pass reference replay (0: none)"),
    preemption: bool = typer.Option(False, "--preemption",
                                    help="the tree turns LowerPriority + Any on"),
    write: Path | None = typer.Option(None, "--write", help="save the trace as YAML"),
    kueue_generator: Path | None = typer.Option(
        None, "--kueue-generator",
        help="instead: replay a Kueue generator config without and with preemption"),
) -> None:
    if kueue_generator is not None:
        raise typer.Exit(run_kueue(kueue_generator))
    raise typer.Exit(run(parents, leaves, jobs, full_jobs, preemption, write))


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(app, argv, "python -m bench.sim_scale")


if __name__ == "__main__":
    raise SystemExit(main())
