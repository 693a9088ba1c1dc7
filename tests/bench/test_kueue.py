"""``fleetq bench kueue``: Kueue's own scheduler performance harness beside fleetq.

The build test pins that ``fleetq controlplane build`` (which CI runs first) leaves
Kueue's harness built from its module: minimalkueue and the runner with the flags Kueue's
Makefile passes, its CRDs and its baseline generator config. The end-to-end test runs 40
workloads through both sides (Kueue's runner on envtest with our etcd and
kube-apiserver; fleetq's real stack) and asserts what a broken benchmark would get
wrong: a side that did not admit every workload, a missing column or class, a ratio that
is not the printed figures'. No timing is asserted (the machine is shared).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.kueue import Scale, kueue_figures, main, scaled_config, workload_count
from fleetq.controlplane.build import BuildError, build
from fleetq.controlplane.kueue import KUEUE_BINARIES, KueueBuild, kueue_cached

CLASSES = ("large", "medium", "small")


@pytest.fixture(scope="module")
def harness() -> KueueBuild:
    try:
        build()
    except BuildError as exc:
        pytest.fail(f"no Kueue harness (fleetq controlplane build, needs Go >= 1.26): {exc}")
    built = kueue_cached()
    assert built is not None, "build() returned but the Kueue part is not cached"
    return built


def test_the_build_script_builds_kueues_harness_from_its_module(harness: KueueBuild) -> None:
    for name in KUEUE_BINARIES:
        assert harness.binary(name).stat().st_size > 10_000_000
    # the flags Kueue's Makefile (run-performance-scheduler) and its runner pass
    usage = {name: subprocess.run([str(harness.binary(name)), "-h"], capture_output=True,
                                  text=True, timeout=60, env=harness.runner_env()).stderr
             for name in KUEUE_BINARIES}
    for flag in ("-kubeconfig", "-enableTAS", "-cpuprofile"):
        assert flag in usage["minimalkueue"]
    for flag in ("-generatorConfig", "-minimalKueue", "-crds", "-o", "-timeout"):
        assert flag in usage["runner"]
    crds = {p.name for p in harness.crds.glob("*.yaml")}
    assert {"kueue.x-k8s.io_workloads.yaml", "kueue.x-k8s.io_clusterqueues.yaml",
            "kueue.x-k8s.io_localqueues.yaml", "kueue.x-k8s.io_resourceflavors.yaml"} <= crds
    # Kueue's own baseline: 5 cohorts x 6 ClusterQueues x (350 + 100 + 50) workloads
    baseline = yaml.safe_load(harness.baseline_config.read_text())
    assert workload_count(baseline) == 15_000
    # envtest runs our own control plane's binaries
    assert (harness.assets / "kube-apiserver").is_file() and (harness.assets / "etcd").is_file()


BASELINE: dict[str, Any] = {"cohorts": [{
    "className": "cohort", "count": 5, "queuesSets": [{
        "className": "cq", "count": 6, "nominalQuota": 20, "borrowingLimit": 100,
        "reclaimWithinCohort": "Any", "withinClusterQueue": "LowerPriority",
        "workloadsSets": [
            {"count": 350, "creationIntervalMs": 100, "workloads": [
                {"className": "small", "runtimeMs": 200, "priority": 50, "request": 1}]},
            {"count": 50, "creationIntervalMs": 1200, "workloads": [
                {"className": "large", "runtimeMs": 1000, "priority": 200, "request": 20}]},
        ]}]}]}


def test_scaling_cuts_counts_and_stretches_every_interval_and_run_time() -> None:
    cfg = scaled_config(BASELINE, Scale(cohorts=1, queues=2, workloads=0.01, stretch=10))
    cset = cfg["cohorts"][0]
    assert cset["count"] == 1 and cset["queuesSets"][0]["count"] == 2
    small, large = cset["queuesSets"][0]["workloadsSets"]
    assert (small["count"], small["creationIntervalMs"]) == (4, 1000)  # round(3.5)
    assert (large["count"], large["creationIntervalMs"]) == (1, 12000)  # at least one
    assert small["workloads"][0]["runtimeMs"] == 2000
    assert large["workloads"][0]["runtimeMs"] == 10000
    assert workload_count(cfg) == 2 * (4 + 1)
    assert BASELINE["cohorts"][0]["count"] == 5  # the original is not touched
    unscaled = scaled_config(BASELINE, Scale(None, None, 1.0, 1.0))
    assert unscaled == BASELINE


def test_kueues_figures_are_its_checkers(tmp_path: Path) -> None:
    # two ClusterQueues of 20 cpu over 10 s; 100 cpu*s used: usage 100 / (40 * 10)
    (tmp_path / "summary.yaml").write_text(yaml.safe_dump({
        "clusterQueueClasses": {"cq": {
            "cpuUsed": 100_000 * 1000, "cpuAverageUsage": 0, "nominalQuota": 40_000,
            "firstEventTime": "2026-12-02T08:00:00.123456789Z",
            "lastEventTime": "2026-12-02T08:00:10.123456789Z"}},
        "workloadClasses": {}, "droppedWorkloadEvents": 0}))
    (tmp_path / "wlStates.csv").write_text(
        "id,class name,namespace,name,ms to admitted,ms to finish,num evictions\n"
        "0,small,ns,a,1500,2000,0\n"
        "1,small,ns,b,500,900,1\n"
        "2,large,ns,c,0,0,0\n")  # never admitted: the runner finishes only admitted ones
    side = kueue_figures(tmp_path, expected=3)
    assert side.usage == pytest.approx(0.25)
    assert side.span == pytest.approx(10.0)
    assert side.admitted == 2 and side.rate == pytest.approx(0.2)
    assert side.admission == {"small": [1.5, 0.5]}


def test_a_config_without_cohorts_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text(yaml.safe_dump({"cohorts": []}))
    assert main(["--generator", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: generator config: cohorts must be a non-empty list"]


NUMBER = r"(\d+\.\d+)"


def test_a_few_dozen_workloads_through_kueue_and_fleetq_side_by_side(
    harness: KueueBuild, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Kueue's baseline, 1 cohort of 2 ClusterQueues, 4% of each set: 14 small, 4 medium,
    # 2 large per queue, every interval and run time x 10
    code = main(["--queues", "2", "--workloads", "0.04", "--stretch", "10",
                 "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert re.search(r"^figure +kueue +fleetq +fleetq ÷ kueue$", out, re.M), out
    assert re.search(r"^workloads admitted +40/40 +40/40 +1\.00$", out, re.M), out
    rows: dict[str, tuple[float, float, float]] = {}
    printed: dict[str, tuple[str, str, str]] = {}
    for line in out.splitlines():
        m = re.match(rf"^(.+?) +{NUMBER} +{NUMBER} +{NUMBER}$", line)
        if m:
            rows[m[1]] = (float(m[2]), float(m[3]), float(m[4]))
            printed[m[1]] = (m[2], m[3], m[4])
    wanted = ["admissions/s", "usage (cpu in use / nominal)", "span, first to last event, s",
              *(f"{c}: {w} time to admission, s" for c in CLASSES for w in ("mean", "p99")),
              *(f"{c}: {w} time to the quota workflow's grant, s"
                for c in CLASSES for w in ("mean", "p99"))]
    assert [w for w in wanted if w not in rows] == [], out
    def half(text: str) -> float:
        """Half a unit of the last decimal printed: the figure is within ±this of it."""
        decimals = len(text.split(".")[1]) if "." in text else 0
        return 0.5 * 10.0 ** -decimals

    for name in wanted:
        kueue, fleetq, ratio = rows[name]
        hk, hf, hr = (half(t) for t in printed[name])
        if kueue > hk:  # the ratio printed is the unrounded figures', within rounding
            low = max(fleetq - hf, 0.0) / (kueue + hk) - hr
            high = (fleetq + hf) / (kueue - hk) + hr
            assert low <= ratio <= high, (name, printed[name])
    for name in ("admissions/s", "usage (cpu in use / nominal)"):
        assert all(x > 0 for x in rows[name][:2]), name  # both sides measured a run
    for c in CLASSES:  # Kueue's side is the same figure; fleetq's read from the tree
        granted = rows[f"{c}: mean time to the quota workflow's grant, s"]
        took = rows[f"{c}: mean time to admission, s"]
        assert granted[0] == took[0] and granted[1] >= 0, (c, granted, took)
    assert 0 < rows["usage (cpu in use / nominal)"][0] <= 1.5
    # the worker's side of the way: its quota messages (every job's enqueue and release
    # at least), and the start call's way to the quota workflow cut at its task
    sent = re.search(r"^fleetq: worker: quota updates (\d+) carrying (\d+) messages", out, re.M)
    assert sent and 1 <= int(sent[1]) <= int(sent[2]) and int(sent[2]) >= 80, out
    assert "start call -> enqueue's quota task scheduled" in out, out
    # Kueue's runner wrote its own results where it was told to
    assert (tmp_path / "kueue" / "summary.yaml").is_file()
    assert (tmp_path / "kueue" / "generator.yaml").is_file()
    # and fleetq's quota workflow history beside them, one event a line
    quota_lines = (tmp_path / "fleetq" / "quota.jsonl").read_text().splitlines()
    assert quota_lines and all("eventId" in json.loads(line) for line in quota_lines)
    last = out.strip().splitlines()[-1]
    assert re.match(r"^RESULT kueueusage \d+\.\d\d \(target 0\.9\)$", last), last


def test_the_way_to_a_grant_is_split_into_the_bench_the_job_and_the_quota_workflow() -> None:
    """Each job's time to its first grant is cut at its start call and at the quota
    workflow's applying its first enqueue (and that step again at the scheduling of the
    task that applied it); a job granted in its enqueue's reply has a last step of 0; a
    job the quota workflow never granted has no last step."""
    from bench.kueue import ENQUEUE_SPLIT, GRANT_STEPS, grant_path
    from bench.trace import PlannedJob

    plan = [PlannedJob(0, "ns", "big", "large", 2.0, 20.0, 20.0),
            PlannedJob(1, "ns", "tiny", "small", 3.0, 4.0, 1.0),
            PlannedJob(2, "ns", "mid", "medium", 1.0, 10.0, 4.0)]
    enqueued = {plan[0].workflow_id: 1002.5, plan[1].workflow_id: 1003.4,
                plan[2].workflow_id: 1001.2}
    submitted = {plan[0].workflow_id: 1002.25, plan[1].workflow_id: 1003.0,
                 plan[2].workflow_id: 1001.0}
    granted = {plan[0].workflow_id: [1011.0, 1003.5],  # preempted once, granted again
               plan[2].workflow_id: [1001.2, 1060.0]}  # granted in its enqueue's reply
    reached = {plan[0].workflow_id: 1002.4}  # the task applying big's enqueue scheduled
    path = grant_path(plan, enqueued, submitted, 1000.0, granted, reached)
    first, start, quota = GRANT_STEPS
    job_side, quota_task = ENQUEUE_SPLIT
    assert path["large"][job_side] == pytest.approx([0.15])
    assert path["large"][quota_task] == pytest.approx([0.1])
    assert job_side not in path["small"]  # no task time known: no split
    assert path["large"][first] == pytest.approx([0.25])
    assert path["large"][start] == pytest.approx([0.25])
    assert path["large"][quota] == pytest.approx([1.0])  # enqueue to the first grant
    assert path["small"][first] == pytest.approx([0.0])
    assert path["small"][start] == pytest.approx([0.4])
    assert quota not in path["small"]
    assert path["medium"][start] == pytest.approx([0.2])
    assert path["medium"][quota] == pytest.approx([0.0])


def test_a_jobs_first_enqueue_is_read_from_the_quota_workflows_history() -> None:
    """The enqueue the split starts the quota workflow's side at is the first one it
    applied; a requeue after a preemption does not move it (a job's own ``Queued`` event
    is aggregated and would)."""
    from bench.trace import quota_holdings
    from tests.bench.history_events import submit

    held = quota_holdings([submit(5.0, ("enqueue", "j")), submit(9.0, ("requeue", "j"))],
                          {"j": 1.0})
    assert held.enqueued == {"j": 5.0}


def test_a_jobs_first_enqueue_task_is_when_the_task_that_applied_it_was_scheduled() -> None:
    """The split of the way to the quota workflow takes the scheduling of the task whose
    ``submit`` update carried the job's first enqueue; a later requeue's task does not
    move it."""
    from bench.preemption_path import enqueue_tasks
    from tests.bench.history_events import submit, task_scheduled, task_started

    events = [task_scheduled(4.0), task_started(4.5), submit(5.0, ("enqueue", "j")),
              task_scheduled(8.0), task_started(8.2), submit(9.0, ("requeue", "j"),
                                                             ("enqueue", "k"))]
    assert enqueue_tasks(events) == {"j": 4.0, "k": 8.0}
