"""Benchmark: Kueue beside fleetq on this machine, on the same workloads (issue 28 item 1).

Kueue's own scheduler performance harness (sigs.k8s.io/kueue ``test/performance/scheduler``,
built by ``fleetq controlplane build``) runs a generator config as
``make run-performance-scheduler`` does; the same config, converted to a trace
(:func:`fleetq.simulator.kueue.trace_from_generator`), runs through fleetq's real stack.
Both are measured as Kueue's harness defines it (time to admission per class, usage,
admissions/s), scaled to fit this machine. Method: BENCHMARKS.md "Bench methods";
figures: §10.

Run: ``fleetq bench kueue``. Last line: ``RESULT kueueusage <fleetq usage / kueue usage>
(target 0.9)``.
"""

from __future__ import annotations

import asyncio
import copy
import csv
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import typer
import yaml
from google.protobuf.json_format import MessageToDict

from bench.command import bench_app, help_text, run_command
from bench.common import result_line, run_main
from bench.preemption_path import PATH_STEPS, enqueue_tasks, preemption_path
from bench.sim_scale import KUEUE_TOPOLOGY
from bench.trace import (
    Options,
    PlannedJob,
    RealRun,
    TraceBenchError,
    check_replayable,
    leaf_min_cpu,
    planned_jobs,
    quota_holdings,
    real_figures,
    run_real,
    simulate,
)
from fleetq.preemption import GRACE_ANNOTATION
from fleetq.simulator.kueue import trace_from_generator
from fleetq.simulator.series import stats
from fleetq.simulator.trace import TraceError, parse_trace

TARGET_USAGE = 0.9


class KueueBenchError(Exception):
    """This benchmark cannot run (one line)."""


# ---------------------------------------------------------------------- the config


@dataclass(frozen=True)
class Scale:
    """How Kueue's config is cut down to this machine (``None``: keep the config's)."""

    cohorts: int | None = 1
    queues: int | None = None
    workloads: float = 0.2
    stretch: float = 20.0

    def describe(self) -> str:
        keep = [f"cohorts per set {self.cohorts}" if self.cohorts else "all cohorts",
                f"ClusterQueues per set {self.queues}" if self.queues else "all queues",
                f"workload sets x {self.workloads:g}",
                f"creation intervals and run times x {self.stretch:g}"]
        return ", ".join(keep)


def scaled_config(config: dict[str, Any], scale: Scale) -> dict[str, Any]:
    """Kueue's generator ``config`` cut down by ``scale``: counts (at least 1 where the
    config had any), intervals and run times as whole milliseconds (the generator's
    ``uint``). Fields this does not know are kept as they are."""
    if not (math.isfinite(scale.workloads) and scale.workloads > 0):
        raise KueueBenchError(f"--workloads must be > 0, got {scale.workloads!r}")
    if not (math.isfinite(scale.stretch) and scale.stretch > 0):
        raise KueueBenchError(f"--stretch must be > 0, got {scale.stretch!r}")
    cfg = copy.deepcopy(config)
    cohorts = cfg.get("cohorts")
    if not isinstance(cohorts, list) or not cohorts:
        raise KueueBenchError("generator config: cohorts must be a non-empty list")

    def cut(n: Any, keep: int | None, where: str) -> int:
        if not isinstance(n, int) or n < 0:
            raise KueueBenchError(f"generator config: {where}.count must be a whole number")
        return n if keep is None else min(n, keep)

    for ci, cset in enumerate(cohorts):
        cset["count"] = cut(cset.get("count"), scale.cohorts, f"cohorts[{ci}]")
        for qi, qset in enumerate(cset.get("queuesSets") or []):
            qset["count"] = cut(qset.get("count"), scale.queues,
                                f"cohorts[{ci}].queuesSets[{qi}]")
            for wi, wset in enumerate(qset.get("workloadsSets") or []):
                n = cut(wset.get("count"), None,
                        f"cohorts[{ci}].queuesSets[{qi}].workloadsSets[{wi}]")
                wset["count"] = max(1, round(n * scale.workloads)) if n else 0
                wset["creationIntervalMs"] = round(
                    float(wset.get("creationIntervalMs", 0)) * scale.stretch)
                for w in wset.get("workloads") or []:
                    w["runtimeMs"] = round(float(w.get("runtimeMs", 0)) * scale.stretch)
    return cfg


def workload_count(config: dict[str, Any]) -> int:
    """How many Workloads the generator creates for ``config``."""
    return sum(c["count"] * q["count"] * w["count"] * len(w.get("workloads") or [])
               for c in config["cohorts"] for q in c.get("queuesSets") or []
               for w in q.get("workloadsSets") or [])


# ---------------------------------------------------------------------- figures


@dataclass
class Side:
    """One side's figures, as Kueue's harness defines them (seconds)."""

    name: str
    workloads: int
    admitted: int
    admission: dict[str, list[float]]  # class -> each workload's time to admission
    usage: float
    span: float  # first event to last
    evictions: int = 0  # preemptions of admitted workloads
    #: the most cpu held at once over the nominal quota (fleetq: from the quota
    #: workflow's grants and releases; Kueue's recorder keeps it per ClusterQueue only)
    peak: float | None = None
    #: fleetq: class -> each job's time to the quota workflow's (last) grant, the
    #: admission written down, as Kueue's recorder times the Workload's ``Admitted``
    #: condition (``admission`` is when the job's own workflow took the grant)
    granted: dict[str, list[float]] = field(default_factory=dict)
    #: fleetq: class -> step -> each job's seconds on that step of its way to the grant
    #: (``grant_path``)
    grant_path: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    #: fleetq: hop -> seconds, the preemptions by ``PATH_CLASS`` jobs (``preemption_path``)
    preemption_path: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)  # process -> CPU seconds
    notes: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.admitted / self.span if self.span > 0 else math.nan


_FRACTION = re.compile(r"\.(\d{6})\d*")


def _time(value: Any) -> datetime:
    """An RFC 3339 time of Kueue's summary (nanoseconds cut to what Python reads)."""
    if isinstance(value, datetime):
        return value
    return datetime.fromisoformat(_FRACTION.sub(r".\1", str(value)).replace("Z", "+00:00"))


def kueue_figures(out: Path, expected: int) -> Side:
    """Kueue's side from the runner's ``summary.yaml`` (the ClusterQueue classes' cpu
    used and nominal quota over their event span: the checker's usage) and
    ``wlStates.csv`` (each Workload's ms to admitted; a Workload counts as admitted when
    it finished, which the runner does only to an admitted one)."""
    try:
        summary = yaml.safe_load((out / "summary.yaml").read_text())
        with open(out / "wlStates.csv", newline="") as fh:
            rows = list(csv.DictReader(fh))
    except (OSError, yaml.YAMLError) as exc:
        raise KueueBenchError(f"Kueue's runner left no readable results in {out}: {exc}"
                              ) from None
    classes = (summary or {}).get("clusterQueueClasses") or {}
    if not classes:
        raise KueueBenchError(f"{out / 'summary.yaml'}: no clusterQueueClasses")
    used = sum(int(c["cpuUsed"]) for c in classes.values())  # mCPU * ms
    nominal = sum(int(c["nominalQuota"]) for c in classes.values())  # mCPU
    first = min(_time(c["firstEventTime"]) for c in classes.values())
    last = max(_time(c["lastEventTime"]) for c in classes.values())
    span_ms = (last - first).total_seconds() * 1000
    usage = used / (nominal * span_ms) if nominal and span_ms > 0 else math.nan
    admission: dict[str, list[float]] = {}
    admitted = evictions = 0
    for row in rows:
        evictions += int(row["num evictions"])
        if int(row["ms to finish"]) > 0:
            admitted += 1
            admission.setdefault(row["class name"], []).append(int(row["ms to admitted"]) / 1000)
    side = Side("kueue", expected, admitted, admission, usage, span_ms / 1000, evictions)
    dropped = int((summary or {}).get("droppedWorkloadEvents") or 0)
    if dropped:
        side.notes.append(f"the recorder dropped {dropped} workload events")
    if len(rows) != expected:
        side.notes.append(f"the recorder saw {len(rows)} of {expected} workloads")
    stats_file = out / "minimalkueue.stats.yaml"
    if stats_file.is_file():
        cs = yaml.safe_load(stats_file.read_text()) or {}
        side.cpu["minimalkueue"] = (cs.get("userMs", 0) + cs.get("sysMs", 0)) / 1000
    return side


# ---------------------------------------------------------------------- Kueue's side


def run_kueue(config: dict[str, Any], out: Path, timeout: float,
              say: Any) -> tuple[Side, float]:
    """Kueue's runner with minimalkueue on envtest; its figures and its runner's CPU."""
    from fleetq.controlplane.kueue import kueue_cached

    built = kueue_cached()
    if built is None:
        raise KueueBenchError("Kueue's harness is not built: run `fleetq controlplane build`")
    out.mkdir(parents=True, exist_ok=True)
    cfg_path = out / "generator.yaml"
    cfg_path.write_text(yaml.safe_dump(config, sort_keys=False))
    argv = [str(built.binary("runner")), "-o", str(out), "-crds", str(built.crds),
            "-generatorConfig", str(cfg_path), "-minimalKueue",
            str(built.binary("minimalkueue")), "-timeout", f"{int(timeout)}s",
            "-zap-log-level=info"]
    env = built.runner_env()
    log = out / "runner.log"
    say(f"kueue: runner + minimalkueue on envtest ({built.assets}); log {log}")
    t0 = os.times()
    with open(log, "wb") as fh:
        proc = subprocess.run(argv, cwd=out, env=env, stdout=fh, stderr=subprocess.STDOUT,
                              check=False, timeout=timeout + 300)
    t1 = os.times()
    runner_cpu = (t1.children_user - t0.children_user) + (t1.children_system - t0.children_system)
    if proc.returncode != 0:
        tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-2:])
        raise KueueBenchError(f"Kueue's runner exited {proc.returncode}: {tail[-400:]} "
                              f"(log: {log})")
    side = kueue_figures(out, workload_count(config))
    return side, runner_cpu


# ---------------------------------------------------------------------- fleetq's side


def fleetq_trace_doc(config: dict[str, Any]) -> dict[str, Any]:
    """The (scaled) generator config as a trace: every job with no preemption grace."""
    return trace_from_generator(config, KUEUE_TOPOLOGY, preemption=True,
                                annotations={GRACE_ANNOTATION: "0"})


async def run_fleetq(config: dict[str, Any], timeout: float, say: Any,
                     keep: Path | None = None) -> Side:
    """fleetq's side; with ``keep``, the quota workflow's history (every run) and the
    preempted jobs' are written there as JSON lines of events, for a closer look."""
    try:
        trace = parse_trace(fleetq_trace_doc(config), "kueue-generator")
        check_replayable(trace)
    except (TraceError, TraceBenchError) as exc:
        raise KueueBenchError(str(exc)) from None
    sim, _summary = simulate(trace)
    plan = planned_jobs(sim)
    min_cpu = leaf_min_cpu(sim)
    say(f"fleetq: {len(plan)} jobs through the real stack (Temporal dev server, emulator, "
        "in-process worker)")
    real = await run_real(trace, plan, Options("kueue-generator", 1.0, 32, 200, timeout), say,
                          victim_histories=True)
    if keep is not None:
        keep_histories(keep, real)
    holdings = quota_holdings(real.quota_events, {j.workflow_id: j.cpu for j in plan})
    fig = real_figures(real, plan, min_cpu, holdings)
    states: dict[str, int] = {}
    for v in real.views.values():
        states[v.state] = states.get(v.state, 0) + 1
    admitted = sum(len(v) for v in fig.admission.values())
    preempted = sum(1 for v in real.views.values() for e in v.events if e.reason == "Preempted")
    side = Side("fleetq", len(plan), admitted, fig.admission, fig.usage, fig.makespan,
                preempted, peak_held(holdings.changes) / min_cpu)
    for job in plan:
        if grants := holdings.granted.get(job.workflow_id):
            side.granted.setdefault(job.job_class, []).append(
                max(grants) - (real.wall0 + job.offset))
    side.grant_path = grant_path(plan, holdings.enqueued, real.submitted, real.wall0,
                                 holdings.granted, enqueue_tasks(real.quota_events))
    side.preemption_path = preemption_path(
        real.quota_events, real.victim_events,
        {j.workflow_id for j in plan if j.job_class == PATH_CLASS})
    side.cpu["worker (this process)"] = real.phase.cpu
    side.cpu.update(real.phase.other_cpu)
    side.notes.append(f"fleet registry reads: {real.registry_reads[0]} queries, "
                      f"{real.registry_reads[1]} describes that found it unchanged")
    side.notes.extend(f"worker: {line}" for line in real.worker)
    if states.get("Succeeded", 0) != len(plan):
        side.notes.append(f"job states {states}")
    return side


#: the class whose preemptions ``preemption_path`` splits: Kueue's baseline's large
#: workloads are the ones that preempt
PATH_CLASS = "large"

#: the steps of a job's way to its first grant, in order (``grant_path``)
GRANT_STEPS = ("trace time -> start call", "start call -> enqueue applied",
               "enqueue applied -> grant")
#: "start call -> enqueue applied" cut where the quota workflow's task applying the
#: enqueue was scheduled: the job's side (start, resolution, the outbox) and the quota
#: workflow's (its task's queueing and run, a preemptor's planning included)
ENQUEUE_SPLIT = ("start call -> enqueue's quota task scheduled",
                 "enqueue's quota task scheduled -> applied")


def keep_histories(where: Path, real: RealRun) -> None:
    """``quota.jsonl`` (the quota workflow's events, every run) and ``victims.jsonl``
    (each preempted job's current run, ``{"workflow_id": ..., "event": ...}``)."""
    where.mkdir(parents=True, exist_ok=True)
    with (where / "quota.jsonl").open("w") as f:
        for ev in real.quota_events:
            f.write(json.dumps(MessageToDict(ev)) + "\n")
    with (where / "victims.jsonl").open("w") as f:
        for wid, events in sorted(real.victim_events.items()):
            for ev in events:
                f.write(json.dumps({"workflow_id": wid, "event": MessageToDict(ev)}) + "\n")


def grant_path(plan: Sequence[PlannedJob], enqueued: dict[str, float],
               submitted: dict[str, float], wall0: float,
               granted: dict[str, list[float]], reached: dict[str, float] | None = None,
               ) -> dict[str, dict[str, list[float]]]:
    """Where each job's time to its first grant went, by class: the bench's own lag
    (its trace time to the start call), the job's start until the quota workflow applied
    its first enqueue (workflow start, policy resolution, the enqueue through the
    outbox), and the quota workflow's side (that enqueue to the first grant: waiting for
    quota and, for a preemptor, its victims' round trip; 0 for a job admitted in its
    enqueue's reply). All times but the start call's are the quota workflow's history's
    (a job's own ``Queued`` event is aggregated: a later requeue moves its time). With
    ``reached`` (when the task applying each job's first enqueue was scheduled), the
    middle step is also given cut there (``ENQUEUE_SPLIT``). Jobs without a start call,
    an enqueue or a grant are left out of the steps they lack."""
    out: dict[str, dict[str, list[float]]] = {}
    for job in plan:
        steps = out.setdefault(job.job_class, {})
        start = submitted.get(job.workflow_id)
        queued = enqueued.get(job.workflow_id)
        grant = min(granted.get(job.workflow_id) or [math.nan])
        for step, a, b in zip(GRANT_STEPS, (wall0 + job.offset, start, queued),
                              (start, queued, grant), strict=True):
            if a is not None and b is not None and not math.isnan(b):
                steps.setdefault(step, []).append(b - a)
        task = (reached or {}).get(job.workflow_id)
        if start is not None and queued is not None and task is not None:
            steps.setdefault(ENQUEUE_SPLIT[0], []).append(task - start)
            steps.setdefault(ENQUEUE_SPLIT[1], []).append(queued - task)
    return out


def peak_held(changes: Sequence[tuple[float, float]]) -> float:
    """The most held at once, for ``(t, ±cpu)`` changes (at one instant, releases first)."""
    level = peak = 0.0
    for _t, delta in sorted(changes):
        level += delta
        peak = max(peak, level)
    return peak


# ---------------------------------------------------------------------- report


def _f(x: float | None, fmt: str = ".2f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0 or math.isnan(a) or math.isnan(b):
        return "-"
    return f"{a / b:.2f}"


def report_rows(kueue: Side, fleetq: Side) -> list[tuple[str, str, str, str]]:
    """The table: (figure, kueue, fleetq, fleetq ÷ kueue)."""
    rows = [
        ("workloads admitted", f"{kueue.admitted}/{kueue.workloads}",
         f"{fleetq.admitted}/{fleetq.workloads}", _ratio(fleetq.admitted, kueue.admitted)),
        ("admissions/s", _f(kueue.rate), _f(fleetq.rate), _ratio(fleetq.rate, kueue.rate)),
        ("usage (cpu in use / nominal)", _f(kueue.usage, ".3f"), _f(fleetq.usage, ".3f"),
         _ratio(fleetq.usage, kueue.usage)),
        ("peak cpu held / nominal", _f(kueue.peak, ".3f"), _f(fleetq.peak, ".3f"),
         _ratio(fleetq.peak, kueue.peak)),
        ("evictions (preempted workloads)", str(kueue.evictions), str(fleetq.evictions),
         _ratio(float(fleetq.evictions), float(kueue.evictions))),
        ("span, first to last event, s", _f(kueue.span, ".1f"), _f(fleetq.span, ".1f"),
         _ratio(fleetq.span, kueue.span)),
    ]
    for c in sorted(set(kueue.admission) | set(fleetq.admission)):
        k, f = stats(kueue.admission.get(c, [])), stats(fleetq.admission.get(c, []))
        for what in ("mean", "p99"):
            kv, fv = k[what], f[what]
            rows.append((f"{c}: {what} time to admission, s", _f(kv), _f(fv),
                         _ratio(None if fv is None else float(fv),
                                None if kv is None else float(kv))))
    # the same, fleetq's side taken when the quota workflow granted (the admission written
    # down, as Kueue's recorder times the Admitted condition) rather than when the job's
    # workflow took the grant (one signal and one workflow task later)
    for c in sorted(fleetq.granted):
        k, f = stats(kueue.admission.get(c, [])), stats(fleetq.granted[c])
        for what in ("mean", "p99"):
            kv, fv = k[what], f[what]
            rows.append((f"{c}: {what} time to the quota workflow's grant, s", _f(kv), _f(fv),
                         _ratio(None if fv is None else float(fv),
                                None if kv is None else float(kv))))
    return rows


def print_report(kueue: Side, fleetq: Side, scale: Scale, source: str,
                 loads: list[tuple[float, float, float]]) -> None:
    print()
    print(f"config {source}, scaled: {scale.describe()}; {kueue.workloads} workloads")
    print("machine load (1/5/15 min) at start, between the sides, at end: "
          + "; ".join("/".join(f"{x:.1f}" for x in load) for load in loads))
    rows = [("figure", "kueue", "fleetq", "fleetq ÷ kueue"), *report_rows(kueue, fleetq)]
    width = max(len(r[0]) for r in rows)
    for r in rows:
        print(f"{r[0]:<{width}}  {r[1]:>12}  {r[2]:>12}  {r[3]:>14}")
    if fleetq.grant_path:
        print("fleetq, the way to the first grant (mean / p99 s):")
        for c in sorted(fleetq.grant_path):
            parts = []
            for step in (*GRANT_STEPS, *ENQUEUE_SPLIT):
                st = stats(fleetq.grant_path[c].get(step, []))
                parts.append(f"{step} {_f(st['mean'])} / {_f(st['p99'])}")
            print(f"  {c}: " + "; ".join(parts))
    if fleetq.preemption_path:
        print(f"fleetq, the {PATH_CLASS} class's preemptions hop by hop (n, mean / p99 s):")
        for step in PATH_STEPS:
            st = stats(fleetq.preemption_path.get(step, []))
            print(f"  {step}: {st['count']}, {_f(st['mean'])} / {_f(st['p99'])}")
    for side in (kueue, fleetq):
        if side.cpu:
            print(f"{side.name} CPU: " + ", ".join(f"{k} {v:.1f} s" for k, v in side.cpu.items()))
        for note in side.notes:
            print(f"{side.name}: {note}")
    print("multikueue: no column; Kueue's harness creates bare Workloads, which "
          "MultiKueue rejects (\"No multikueue adapter found\": it dispatches a Workload "
          "through its owner job's adapter)")
    ratio = fleetq.usage / kueue.usage if kueue.usage else math.nan
    print(result_line("kueueusage", ratio, TARGET_USAGE))


async def run(generator: Path | None, scale: Scale, out: Path | None, timeout: float) -> int:
    def say(msg: str) -> None:
        print(msg, flush=True)

    loads = [os.getloadavg()]
    try:
        if generator is None:
            from fleetq.controlplane.kueue import kueue_cached

            built = kueue_cached()
            if built is None:
                raise KueueBenchError(
                    "Kueue's harness is not built: run `fleetq controlplane build`")
            generator = built.baseline_config
        try:
            raw = yaml.safe_load(generator.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise KueueBenchError(f"{generator}: {exc}") from None
        if not isinstance(raw, dict):
            raise KueueBenchError(f"{generator}: not a Kueue generator config")
        config = scaled_config(raw, scale)
        fleetq_trace_doc(config)  # refuse a config fleetq cannot replay before either run
    except (KueueBenchError, TraceError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    work = out or Path(tempfile.mkdtemp(prefix="fleetq-bench-kueue-"))
    try:
        started = time.time()
        kueue, runner_cpu = await asyncio.to_thread(run_kueue, config, work / "kueue",
                                                    timeout, say)
        kueue.cpu["runner (envtest apiserver + etcd, generator, recorder)"] = \
            runner_cpu - kueue.cpu.get("minimalkueue", 0.0)
        say(f"kueue: {kueue.admitted}/{kueue.workloads} admitted in "
            f"{time.time() - started:.0f} s")
        loads.append(os.getloadavg())
        fleetq = await run_fleetq(config, timeout, say, work / "fleetq")
        loads.append(os.getloadavg())
    except KueueBenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print_report(kueue, fleetq, scale, str(generator), loads)
    missing = [s.name for s in (kueue, fleetq) if s.admitted != s.workloads]
    for name in missing:
        print(f"error: {name} did not admit every workload", file=sys.stderr)
    return 1 if missing else 0


app = bench_app()


@app.command(help=help_text(__doc__))
def command(
    generator: Path | None = typer.Option(
        None, "--generator",
        help="a Kueue generator config (default: Kueue's configs/baseline/generator.yaml)"),
    cohorts: int = typer.Option(1, "--cohorts", min=0,
                                help="cohorts per cohort set, at most (0: all)"),
    queues: int = typer.Option(0, "--queues", min=0,
                               help="ClusterQueues per queue set, at most (0: all)"),
    workloads: float = typer.Option(0.2, "--workloads", min=0.0001,
                                    help="share of each workload set kept"),
    stretch: float = typer.Option(20.0, "--stretch", min=0.001,
                                  help="multiply creation intervals and run times"),
    out: Path | None = typer.Option(None, "--out",
                                    help="where Kueue's runner writes (DIR/kueue) and fleetq's "
                                    "quota and victims' histories go (DIR/fleetq; default: "
                                    "a temp dir)"),
    timeout: float = typer.Option(3600.0, "--timeout", min=10.0,
                                  help="seconds each side may take"),
) -> None:
    scale = Scale(cohorts or None, queues or None, workloads, stretch)
    raise typer.Exit(run_main(run(generator, scale, out, timeout)))


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(app, argv, "fleetq bench kueue")


if __name__ == "__main__":
    raise SystemExit(main())
