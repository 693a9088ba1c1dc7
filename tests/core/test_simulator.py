"""The what-if simulator: hand-computable traces, determinism, validation, speed."""

from __future__ import annotations

import copy
import json
import math
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetq.simulator import TraceError, load_trace, parse_trace, simulate
from fleetq.simulator.engine import Simulation

TRACES = Path(__file__).resolve().parents[2] / "examples" / "traces"

ONE_NODE = {
    "clusters": [{"name": "c1", "nodeGroups": [{"count": 1, "cpu": "8", "memory": "32Gi"}]}]
}
TWO_NODES = {
    "clusters": [{"name": "c1", "nodeGroups": [{"count": 2, "cpu": "8", "memory": "32Gi"}]}]
}


def tree(root_max: dict[str, Any], children: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.sigs.k8s.io/v1beta1",
        "kind": "ElasticQuotaTree",
        "metadata": {"name": "t", "namespace": "kube-system"},
        "spec": {
            "root": {
                "name": "root",
                "max": root_max,
                "children": children or [{"name": "team", "namespaces": ["team"]}],
            }
        },
    }


def group(name: str, **kw: Any) -> dict[str, Any]:
    g: dict[str, Any] = {
        "name": name, "namespace": "team", "count": 1, "start": 0, "interval": 0,
        "master": 1, "workers": 0, "requests": {"cpu": "4"}, "runSeconds": 10,
    }
    g.update(kw)
    return g


def run(doc: dict[str, Any], policy: str | None = None) -> dict[str, Any]:
    return simulate(parse_trace(doc), policy).summary(timeline_points=20)


def by_group(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {g["group"]: g for g in summary["groups"]}


# --------------------------------------------------------------------------- semantics


def test_max_jobs_one_serialises_jobs() -> None:
    doc = {
        "topology": TWO_NODES,
        "quota": tree({"kube-queue/max-jobs": 1}),
        "jobs": [group("j", count=3, workers=1, requests={"cpu": "2"})],
    }
    s = run(doc)
    assert s["makespan"] == 30.0
    assert s["jobs"]["completed"] == 3
    adm = by_group(s)["j"]["timeToAdmission"]
    assert (adm["count"], adm["mean"], adm["p50"], adm["max"]) == (3, 10.0, 10.0, 20.0)
    assert by_group(s)["j"]["timeToStart"]["mean"] == 10.0
    team = next(q for q in s["queues"] if q["node"] == "team")
    assert team["maxLength"] == 2
    jobs_quota = next(n for n in s["quota"] if n["node"] == "root")["resources"]
    assert jobs_quota["kube-queue/max-jobs"]["averageUtilisation"] == 1.0


def test_time_weighted_utilisation() -> None:
    # A: 4 cpu for 0..10; B: 8 cpu for 0..20 -> 12 then 8 of 16 cpu: average 10/16.
    doc = {
        "topology": TWO_NODES,
        "quota": tree({"cpu": 20}),
        "jobs": [group("a"), group("b", requests={"cpu": "8"}, runSeconds=20)],
    }
    s = run(doc)
    assert s["makespan"] == 20.0
    cpu = s["clusters"][0]["resources"]["cpu"]
    assert cpu["averageUtilisation"] == pytest.approx(10 / 16)
    assert cpu["peakUtilisation"] == pytest.approx(12 / 16)
    root = next(n for n in s["quota"] if n["node"] == "root")["resources"]["cpu"]
    assert root["averageUsage"] == pytest.approx(10.0)
    assert root["averageUtilisation"] == pytest.approx(10 / 20)


def test_gang_too_big_for_any_node_gives_its_quota_back_and_is_counted() -> None:
    # 2 x 8-cpu nodes: 12 cpu fits in the cluster's sum but on no single node. Issue 24:
    # no member can ever hold it (fleetq.placement.never_fits), so instead of holding the
    # tree's one job slot for ever it gives it back at once and "later" runs.
    doc = {
        "topology": TWO_NODES,
        "quota": tree({"kube-queue/max-jobs": 1}),
        "jobs": [
            group("huge", requests={"cpu": "12"}),
            group("later", start=5),
        ],
    }
    s = run(doc)
    assert s["jobs"] == {
        "submitted": 2, "admitted": 1, "started": 1, "completed": 1,
        "waitingForQuotaAtEnd": 0, "unplacedAtEnd": 0,
    }
    assert s["states"] == {"neverPlaceable": 1}
    assert by_group(s)["later"]["timeToAdmission"]["mean"] == 0.0
    failures = s["placementFailures"]
    assert failures["delayedJobs"] == 1
    assert [(r["code"], r["reason"], r["jobs"], r["clusters"]) for r in failures["reasons"]] == [
        ("InsufficientNodeResource", "needs cpu; no node has enough free", 1, ["c1"])
    ]
    assert "needs cpu 12, largest free node has 8" in failures["reasons"][0]["example"]
    assert by_group(s)["huge"]["timeToStart"]["count"] == 0


def test_unplaced_job_retries_when_capacity_is_freed() -> None:
    # One 8-cpu node; "first" takes 4 cpu for 10 s; "whole" needs all 8 and holds quota
    # meanwhile, then starts when "first" finishes.
    doc = {
        "topology": ONE_NODE,
        "jobs": [group("first"), group("whole", start=1, requests={"cpu": "8"})],
    }
    s = run(doc)
    whole = by_group(s)["whole"]
    assert whole["timeToAdmission"]["mean"] == 0.0
    assert whole["timeToStart"]["mean"] == 9.0
    assert s["makespan"] == 20.0
    reasons = s["placementFailures"]["reasons"]
    assert [r["reason"] for r in reasons] == ["needs cpu; not enough free in the whole cluster"]


def _policy_trace(starvation: float = 600) -> dict[str, Any]:
    return {
        "topology": ONE_NODE,
        "quota": tree({"cpu": 8}),
        "starvationSeconds": starvation,
        "jobs": [
            group("first"),
            group("big", start=1, requests={"cpu": "8"}),
            group("small", count=2, start=2, interval=1),
        ],
    }


def test_priority_lets_small_jobs_overtake_a_big_head() -> None:
    s = run(_policy_trace())
    g = by_group(s)
    assert g["big"]["timeToAdmission"]["mean"] == 19.0  # admitted at 20
    assert g["small"]["timeToAdmission"]["max"] == 7.0  # small-0 at 2, small-1 at 10
    assert g["small"]["timeToAdmission"]["p50"] == 3.5
    assert s["makespan"] == 30.0


def test_block_makes_the_head_block_its_queue() -> None:
    s = run(_policy_trace(), policy="Block")
    assert s["policy"] == "Block"
    g = by_group(s)
    assert g["big"]["timeToAdmission"]["mean"] == 9.0  # admitted at 10
    assert sorted([g["small"]["timeToAdmission"]["p50"], g["small"]["timeToAdmission"]["max"]]) == [
        17.5, 18.0
    ]  # both admitted at 20
    assert s["makespan"] == 30.0


def test_starvation_bound_stops_overtaking() -> None:
    # big is skipped at t=2; at t=10 it has starved for more than 5 s, so small-1 may
    # no longer pass it: big starts at 12 (when small-0 finishes), small-1 at 22.
    s = run(_policy_trace(starvation=5))
    g = by_group(s)
    assert g["big"]["timeToAdmission"]["mean"] == 11.0
    assert g["small"]["timeToAdmission"]["max"] == 19.0
    assert s["makespan"] == 32.0


def test_gpu_job_without_toleration_reports_taints() -> None:
    doc: dict[str, Any] = {
        "topology": "default",
        "jobs": [group("gpu", requests={"cpu": "1", "nvidia.com/gpu": 1},
                       nodeSelector={"pool": "gpu"})],
    }
    s = run(doc)
    reasons = {r["reason"] for r in s["placementFailures"]["reasons"]}
    assert "does not tolerate the taints of any node it could use" in reasons
    assert s["jobs"]["started"] == 0
    doc["jobs"][0]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    s = run(doc)
    assert s["jobs"]["completed"] == 1
    assert s["placementFailures"]["reasons"] == []


def test_cluster_affinity_limits_clusters() -> None:
    doc = {
        "topology": "default",
        "jobs": [group("a", count=4, clusterAffinity={"clusterNames": ["cluster-a"]},
                       requests={"cpu": "8"})],
    }
    s = run(doc)
    # cluster-a has three 8-cpu nodes: three run at once, the fourth waits 10 s.
    assert by_group(s)["a"]["timeToStart"]["max"] == 10.0
    used = {c["cluster"]: c["resources"]["cpu"]["peakAllocated"] for c in s["clusters"]}
    assert used == {"cluster-a": 24.0, "cluster-b": 0.0, "cluster-c": 0.0}


def test_run_seconds_range_is_seeded() -> None:
    doc = {
        "topology": TWO_NODES,
        "seed": 3,
        "jobs": [group("r", count=20, interval=1, runSeconds={"min": 5, "max": 50})],
    }
    a, b = run(doc), run(copy.deepcopy(doc))
    assert json.dumps(a) == json.dumps(b)
    doc["seed"] = 4
    assert run(doc)["makespan"] != a["makespan"]


def test_example_trace_is_deterministic() -> None:
    trace = load_trace(TRACES / "gang-starvation.yaml")
    first = json.dumps(simulate(trace).summary())
    second = json.dumps(simulate(load_trace(TRACES / "gang-starvation.yaml")).summary())
    assert first == second


def test_gang_starvation_example_shows_the_policies() -> None:
    trace = load_trace(TRACES / "gang-starvation.yaml")
    prio = by_group(simulate(trace, "Priority").summary())
    block = by_group(simulate(trace, "Block").summary())
    # Block serves gangs sooner and small jobs later than Priority.
    assert block["gang"]["timeToAdmission"]["mean"] < prio["gang"]["timeToAdmission"]["mean"]
    assert block["small"]["timeToAdmission"]["mean"] > prio["small"]["timeToAdmission"]["mean"]
    # Priority's starvation bound (600 s) caps how long a gang is overtaken.
    assert 600 < prio["gang"]["timeToAdmission"]["max"] < 600 + 400


def test_mixed_teams_2000_jobs() -> None:
    trace = load_trace(TRACES / "mixed-teams.yaml")
    assert trace.job_count == 2000
    t = time.process_time()
    s = simulate(trace).summary()
    assert time.process_time() - t < 15
    assert s["jobs"]["completed"] == 2000
    assert s["makespan"] > 0
    for node in s["quota"]:
        for r in node["resources"].values():
            if r["averageUtilisation"] is not None:
                assert 0 <= r["averageUtilisation"] <= r["peakUtilisation"] <= 1
    for c in s["clusters"]:
        for r in c["resources"].values():
            assert 0 <= r["averageUtilisation"] <= r["peakUtilisation"] <= 1
    # team-b's sweep arrives later and is below its min: it is served before team-a
    # borrows further, so both teams get quota over the run.
    usage = {n["node"]: n["resources"]["cpu"]["averageUsage"] for n in s["quota"]}
    assert usage["team-a"] > 0 and usage["team-b"] > 0
    assert usage["root"] == pytest.approx(usage["team-a"] + usage["team-b"], rel=1e-6)
    assert len(s["timeline"]["t"]) == 200


def test_fast_paths_do_not_change_results(monkeypatch: pytest.MonkeyPatch) -> None:
    # The pre-check that skips clusters which cannot fit must only save time.
    doc = yaml.safe_load((TRACES / "mixed-teams.yaml").read_text())
    for g in doc["jobs"]:
        g["count"] //= 8
    gpu = {"count": 1, "cpu": "32", "memory": "128Gi", "nvidia.com/gpu": 4,
           "labels": {"pool": "gpu"}, "taints": [{"key": "nvidia.com/gpu", "value": "true"}]}
    doc["topology"] = {"clusters": [
        {"name": "x", "nodeGroups": [{"count": 2, "cpu": "16", "memory": "64Gi"}]},
        {"name": "y", "nodeGroups": [{"count": 2, "cpu": "8", "memory": "32Gi"}, gpu]},
    ]}
    trace = parse_trace(doc)
    fast = simulate(trace).summary()
    monkeypatch.setattr(Simulation, "_may_fit", lambda self, gid, ci: True)
    slow = simulate(trace).summary()
    assert fast["placementFailures"]["delayedJobs"] > 0
    assert json.dumps(fast) == json.dumps(slow)


@pytest.mark.full_tier  # ~13 s: the largest simulation; the full suite runs it
def test_15000_jobs_all_complete() -> None:
    """A trace at Kueue's medium scale runs to the end (its speed is a benchmark's
    business: ``fleetq bench``, BENCHMARKS.md)."""
    doc = yaml.safe_load((TRACES / "mixed-teams.yaml").read_text())
    for g in doc["jobs"]:
        g["count"] = int(g["count"] * 7.5)
    trace = parse_trace(doc)
    assert trace.job_count == 15000
    s = simulate(trace).summary()
    assert s["jobs"]["completed"] == 15000


# --------------------------------------------------------------------------- reasons


def test_failure_reasons_group_by_code_across_pods_and_numbers() -> None:
    # Two groups rejected on c1 for cpu with different pods and quantities share a row;
    # a gang whose nodeSelector matches no node gets its own.
    doc = {
        "topology": TWO_NODES,
        "jobs": [
            group("first", requests={"cpu": "6"}, runSeconds=100),
            group("wide", start=1, workers=1, requests={"cpu": "5"}),
            group("tall", start=2, requests={"cpu": "9"}),
            group("picky", start=3, nodeSelector={"pool": "gpu"}),
        ],
    }
    s = run(doc)
    rows = {r["code"]: r for r in s["placementFailures"]["reasons"]}
    assert set(rows) == {"InsufficientNodeResource", "NodeSelectorMismatch"}
    cpu = rows["InsufficientNodeResource"]
    assert (cpu["reason"], cpu["jobs"]) == ("needs cpu; no node has enough free", 2)
    picky = rows["NodeSelectorMismatch"]
    assert (picky["reason"], picky["jobs"]) == ("no node matches nodeSelector pool=gpu", 1)
    assert picky["example"] == "c1: no node matches nodeSelector pool=gpu for master-0"


# --------------------------------------------------------------------------- validation


def _base() -> dict[str, Any]:
    return {"topology": ONE_NODE, "jobs": [group("a"), group("b")]}


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["jobs"][1].update(count=-1), "trace jobs[1].count must be >= 0"),
        (lambda d: d.update(queuePolicy="Fifo"), "trace queuePolicy must be one of"),
        (lambda d: d.update(jobz=[]), "trace jobz is not a known field"),
        (lambda d: d["jobs"][0].update(requests={"cpu": "lots"}),
         "trace jobs[0].requests.cpu 'lots' is not a quantity"),
        (lambda d: d["jobs"][0].update(runSeconds={"min": 9, "max": 3}),
         "trace jobs[0].runSeconds.min 9 exceeds max 3"),
        (lambda d: d["jobs"][0].update(runSeconds=-2),
         "trace jobs[0].runSeconds must be a finite number >= 0"),
        (lambda d: d["jobs"][1].update(name="a"), "trace jobs[1].name 'a' is used twice"),
        (lambda d: d["jobs"][0].update(master=2), "trace jobs[0].master must be <= 1"),
        (lambda d: d.pop("jobs"), "trace jobs is required"),
        (lambda d: d.update(topology={"clusters": [{"name": "Bad_Name"}]}),
         "trace topology.clusters[0].name"),
        (lambda d: d.update(quota={"kind": "ElasticQuotaTree"}), "trace quota: ElasticQuotaTree"),
        (lambda d: d.update(starvationSeconds=-1), "trace starvationSeconds must be >= 0"),
    ],
)
def test_bad_trace_is_one_line_naming_the_field(mutate: Any, message: str) -> None:
    doc = _base()
    mutate(doc)
    with pytest.raises(TraceError) as err:
        parse_trace(doc)
    text = str(err.value)
    assert text.startswith(message), text
    assert "\n" not in text


def test_load_trace_file_errors(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read"):
        load_trace(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("jobs: [\n")
    with pytest.raises(TraceError, match="not valid YAML"):
        load_trace(bad)
    topo = tmp_path / "topo.yaml"
    topo.write_text(yaml.safe_dump(ONE_NODE))
    trace = tmp_path / "t.yaml"
    trace.write_text(yaml.safe_dump({"topology": "topo.yaml", "jobs": [group("a")]}))
    assert simulate(load_trace(trace)).summary()["jobs"]["completed"] == 1


def test_a_group_name_must_make_valid_pytorchjob_names() -> None:
    """Job names are made from the group name, and a PyTorchJob name is a DNS-1035 label
    (a letter first), so a trace with a group starting with a digit is refused up front."""
    from pydantic import ValidationError

    from fleetq.simulator import JobGroupSpec

    with pytest.raises(ValidationError, match="DNS-1035 label: a letter first"):
        JobGroupSpec.model_validate({"name": "7b-train", "count": 1, "tasks": []})


# --------------------------------------------------------------------------- preemption


def preempt_tree(
    root_max: dict[str, Any],
    annotations: dict[str, str],
    children: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    doc = tree(root_max, children)
    doc["metadata"]["annotations"] = annotations
    return doc


def _low_then_high(**tree_notes: str) -> dict[str, Any]:
    """One 8-cpu node: ``low`` (priority 1) takes it for 100 s from t=0; ``high``
    (priority 100) wants all of it from t=10 for 50 s."""
    return {
        "topology": ONE_NODE,
        "quota": preempt_tree({"cpu": 8}, tree_notes),
        "jobs": [
            group("low", priority=1, requests={"cpu": "8"}, runSeconds=100),
            group("high", start=10, priority=100, requests={"cpu": "8"}, runSeconds=50),
        ],
    }


def test_priority_preemption_evicts_the_low_job_and_admits_the_high_one() -> None:
    # high arrives at 10: low is told to stop and gets its 30 s grace; at 40 low's run
    # (8 cpu x 40 s) is lost, low releases and waits again from its submit time 0; high
    # is admitted at 40 and runs to 90; low runs again from 90 to 190.
    s = run(_low_then_high(**{"fleetq.io/preemption": "LowerPriority"}))
    g = by_group(s)
    assert g["high"]["timeToAdmission"]["mean"] == 30.0
    assert g["low"]["timeToAdmission"]["mean"] == 90.0  # from its original submit time
    assert (g["low"]["preempted"], g["low"]["wastedCpuSeconds"]) == (1, 320.0)
    assert (g["high"]["preempted"], g["high"]["wastedCpuSeconds"]) == (0, 0.0)
    assert s["makespan"] == 190.0
    assert s["jobs"]["completed"] == 2
    p = s["preemption"]
    assert (p["preemption"], p["reclaim"]) == ("LowerPriority", "Never")
    assert (p["preemptors"], p["preempted"], p["byReason"]) == (1, 1, {"Priority": 1})
    assert p["wastedCpuSeconds"] == 320.0
    assert p["completedCpuSeconds"] == 8 * 100 + 8 * 50
    assert p["wastedShare"] == pytest.approx(320 / 1520, abs=1e-6)
    # quota never went over max while low was stopping and high waiting
    root = next(n for n in s["quota"] if n["node"] == "root")["resources"]["cpu"]
    assert root["peakUtilisation"] == 1.0


def test_never_reproduces_todays_results_and_plans_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fleetq.simulator import engine

    def no_plans(*_: Any) -> Any:
        raise AssertionError("a Never/Never tree must not plan preemptions")

    monkeypatch.setattr(engine, "plan_preemptions", no_plans)
    plain = run(_low_then_high())
    never = run(_low_then_high(**{"fleetq.io/preemption": "Never", "fleetq.io/reclaim": "Never"}))
    assert json.dumps(plain) == json.dumps(never)
    g = by_group(never)
    # today's behaviour: high waits for low to finish
    assert g["high"]["timeToAdmission"]["mean"] == 90.0
    assert g["low"]["timeToAdmission"]["mean"] == 0.0
    assert never["makespan"] == 150.0
    assert never["preemption"]["preempted"] == 0
    assert never["preemption"]["wastedCpuSeconds"] == 0.0
    # and a larger trace gives the same report with the annotations as without
    doc = yaml.safe_load((TRACES / "mixed-teams.yaml").read_text())
    for g2 in doc["jobs"]:
        g2["count"] //= 8
    base = run(doc)
    doc["quota"]["metadata"]["annotations"] = {"fleetq.io/preemption": "Never"}
    assert json.dumps(run(doc)) == json.dumps(base)


def test_grace_period_and_opt_out_come_from_the_jobs_annotations() -> None:
    doc = _low_then_high(**{"fleetq.io/preemption": "LowerPriority"})
    doc["jobs"][0]["annotations"] = {"fleetq.io/preemption-grace-seconds": "5"}
    g = by_group(run(doc))
    assert g["high"]["timeToAdmission"]["mean"] == 5.0  # low stopped at 15
    assert g["low"]["wastedCpuSeconds"] == 8 * 15
    doc["jobs"][0]["annotations"] = {"fleetq.io/preemptible": "false"}
    s = run(doc)
    g = by_group(s)
    assert g["high"]["timeToAdmission"]["mean"] == 90.0  # waits for low to finish
    assert g["low"]["preempted"] == 0
    assert s["preemption"]["preemptors"] == 0


def test_a_victim_that_finishes_during_its_grace_period_loses_nothing() -> None:
    doc = _low_then_high(**{"fleetq.io/preemption": "LowerPriority"})
    doc["jobs"][1]["start"] = 80  # low finishes at 100, before its grace ends at 110
    s = run(doc)
    g = by_group(s)
    assert g["high"]["timeToAdmission"]["mean"] == 20.0
    assert (g["low"]["preempted"], g["low"]["wastedCpuSeconds"]) == (0, 0.0)
    p = s["preemption"]
    assert (p["preemptors"], p["preempted"], p["finishedDuringGrace"]) == (1, 0, 1)
    assert s["makespan"] == 150.0


def test_reclaim_takes_back_a_borrowers_job_for_a_team_below_min() -> None:
    # root 8 cpu; team-a and team-b are each guaranteed 4. team-a borrows all 8 from
    # t=0; team-b's job arrives at 10: the most recently admitted of team-a's jobs is
    # reclaimed (any priority), team-b gets it at 40.
    children: list[dict[str, Any]] = [
        {"name": "team-a", "namespaces": ["team-a"], "min": {"cpu": 4}, "max": {"cpu": 8}},
        {"name": "team-b", "namespaces": ["team-b"], "min": {"cpu": 4}, "max": {"cpu": 8}},
    ]
    doc: dict[str, Any] = {
        "topology": ONE_NODE,
        "quota": preempt_tree({"cpu": 8}, {"fleetq.io/reclaim": "Any"}, children),
        "jobs": [
            group("borrow", namespace="team-a", count=2, interval=1, priority=1000,
                  runSeconds=100),
            group("owner", namespace="team-b", start=10, runSeconds=20),
        ],
    }
    doc["quota"]["spec"]["root"]["min"] = {"cpu": 8}
    s = run(doc)
    g = by_group(s)
    assert g["owner"]["timeToAdmission"]["mean"] == 30.0
    assert g["borrow"]["preempted"] == 1
    assert g["borrow"]["wastedCpuSeconds"] == 4 * 39  # borrow-1 ran from 1 to 40
    assert s["preemption"]["byReason"] == {"Reclaim": 1}
    # without reclaim team-b waits for a borrower to finish on its own
    doc["quota"]["metadata"]["annotations"] = {}
    assert by_group(run(doc))["owner"]["timeToAdmission"]["mean"] == 90.0


def test_a_job_no_node_can_ever_hold_is_no_victim_it_gave_its_quota_back() -> None:
    # "huge" would hold the leaf's only job slot but fits no node, ever: it gives the
    # slot back at once (issue 24), so "high" is admitted without preempting anybody.
    doc = {
        "topology": TWO_NODES,
        "quota": preempt_tree({"kube-queue/max-jobs": 1},
                              {"fleetq.io/preemption": "LowerPriority"}),
        "jobs": [
            group("huge", requests={"cpu": "12"}),
            group("high", start=5, priority=100),
        ],
    }
    s = run(doc)
    g = by_group(s)
    assert g["high"]["timeToAdmission"]["mean"] == 0.0
    assert g["high"]["completed"] == 1
    assert (g["huge"]["preempted"], g["huge"]["wastedCpuSeconds"]) == (0, 0.0)
    assert s["preemption"]["preempted"] == 0 and s["states"] == {"neverPlaceable": 1}
    assert s["jobs"]["unplacedAtEnd"] == 0 and s["jobs"]["waitingForQuotaAtEnd"] == 0
    assert s["placementFailures"]["delayedJobs"] == 1  # huge, counted once


def test_overrides_set_the_trees_annotations() -> None:
    from fleetq.simulator import with_overrides

    plain = parse_trace(_low_then_high())
    assert not plain.preemption.enabled
    on = with_overrides(plain, preemption="LowerPriority", starvation_seconds=30)
    assert on.tree is not None
    assert on.tree.metadata.annotations["fleetq.io/preemption"] == "LowerPriority"
    assert plain.tree is not None and not plain.tree.metadata.annotations  # a copy
    s = simulate(on).summary(timeline_points=2)
    annotated = run(_low_then_high(**{"fleetq.io/preemption": "LowerPriority"}))
    assert s["starvationSeconds"] == 30
    assert s["groups"] == annotated["groups"]
    with pytest.raises(TraceError, match="no quota tree"):
        with_overrides(parse_trace(_base()), reclaim="Any")


@pytest.mark.parametrize(
    ("where", "notes", "message"),
    [
        ("tree", {"fleetq.io/reclaim": "always"},
         "trace quota: ElasticQuotaTree kube-system/t: metadata.annotations.fleetq.io/reclaim "
         "must be Never, LowerPriority or Any, got 'always'"),
        ("job", {"fleetq.io/preemptible": "no"},
         "trace jobs[0]: PyTorchJob team/low: metadata.annotations.fleetq.io/preemptible "
         "must be \"true\" or \"false\", got 'no'"),
        ("job", {"fleetq.io/preemption-grace-seconds": "-1"},
         "trace jobs[0]: PyTorchJob team/low: metadata.annotations."
         "fleetq.io/preemption-grace-seconds must be a whole number"),
    ],
)
def test_bad_preemption_annotations_are_one_line(
    where: str, notes: dict[str, str], message: str
) -> None:
    doc = _low_then_high()
    if where == "tree":
        doc["quota"]["metadata"]["annotations"] = notes
    else:
        doc["jobs"][0]["annotations"] = notes
    with pytest.raises(TraceError) as err:
        parse_trace(doc)
    assert str(err.value).startswith(message), str(err.value)
    assert "\n" not in str(err.value)


def test_preemption_without_progress_is_an_error_not_a_hang(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A planner that keeps choosing the same victim for a job that can never fit: the
    # victim (never placed) stops at once, is admitted again by the same pass, and is
    # chosen again at the same instant. The replay ends with one line naming it.
    from fleetq import admission_pass
    from fleetq.preemption import PreemptionPlan, PreemptionReason, Victim
    from fleetq.simulator import SimulationError, engine

    huge, high = "pytorchjob/team/huge-0", "pytorchjob/team/high-0"

    def planner(admission: Any, now: float | None = None, **_: Any) -> list[PreemptionPlan]:
        if not admission.is_admitted(huge) or high not in admission.waiting():
            return []
        victim = Victim(huge, high, PreemptionReason.PRIORITY, "priority 100 > 0", 0, 30)
        return [PreemptionPlan(high, "team", (victim,), 100, {"cpu": 16000})]

    # (it spares nobody: the jobs a pass grants are no victims of a real plan)
    monkeypatch.setattr(engine, "plan_preemptions", planner)
    monkeypatch.setattr(admission_pass, "plan_preemptions", planner)
    # (huge must stay admitted and unplaced, as a gang that fits only "not now" would:
    # the never-placeable rule, which would give its quota back, is not under test)
    monkeypatch.setattr(engine, "never_fits", lambda *a, **k: None)
    doc = {
        "topology": TWO_NODES,
        # ("high" fits under max: one over it would be inadmissible, never a candidate;
        # "other" keeps it from fitting even once "huge" released)
        "quota": preempt_tree({"cpu": 16}, {"fleetq.io/preemption": "LowerPriority"}),
        "jobs": [
            group("other", requests={"cpu": "4"}, runSeconds=100),
            group("huge", requests={"cpu": "12"}),
            group("high", start=5, priority=100, requests={"cpu": "16"}),
        ],
    }
    with pytest.raises(SimulationError) as err:
        run(doc)
    assert str(err.value) == (
        "preemption makes no progress at t=5s: pytorchjob/team/huge-0 was preempted twice "
        "at the same instant for pytorchjob/team/high-0 (admitted again, then chosen again)"
    )


def test_kueue_like_trace_with_preemption_runs_to_the_end() -> None:
    """The shipped Kueue-like trace, its first 80 minutes of submissions: without
    preemption the classes are served in the inverse order of their priority; with
    LowerPriority + Any every job completes, both reasons preempt, the large jobs (the
    highest priority) are never victims, usage stays within a few points, and the
    classes are served in priority order (the issue's target: mean time to admission
    large < medium < small)."""
    from fleetq.simulator import with_overrides

    doc = yaml.safe_load((TRACES / "kueue-like.yaml").read_text())
    for g in doc["jobs"]:
        g["count"] = math.ceil(g["count"] / 3)
    trace = parse_trace(doc)
    never = simulate(trace).summary(timeline_points=2)
    on = simulate(with_overrides(trace, preemption="LowerPriority", reclaim="Any")).summary(
        timeline_points=2
    )

    def means(s: dict[str, Any]) -> dict[str, float]:
        return {c["class"]: c["timeToAdmission"]["mean"] for c in s["classes"]}

    def usage(s: dict[str, Any]) -> float:
        root = next(n for n in s["quota"] if n["node"] == "root")
        return float(root["resources"]["cpu"]["averageUtilisation"])

    before = means(never)
    assert before["large"] > before["medium"] > before["small"]  # today: the inverse
    after = means(on)
    assert after["large"] < after["medium"] < after["small"]
    assert on["jobs"]["completed"] == never["jobs"]["completed"] == trace.job_count
    p = on["preemption"]
    assert set(p["byReason"]) == {"Priority", "Reclaim"}
    assert p["wastedCpuSeconds"] > 0
    assert p["wastedCpuSeconds"] == pytest.approx(
        sum(c["wastedCpuSeconds"] for c in on["classes"]), abs=0.01
    )
    large = next(c for c in on["classes"] if c["class"] == "large")
    assert (large["preempted"], large["wastedCpuSeconds"]) == (0, 0.0)
    assert usage(on) == pytest.approx(usage(never), abs=0.03)


# --------------------------------------------------------------------------- issue 24


def _capacity_trace(**tree_notes: str) -> dict[str, Any]:
    """One 8-cpu node; two leaves with room for both jobs (quota admits both): ``low``
    (priority 1) fills the node from t=0 for 100 s, ``high`` (priority 100, its own
    leaf) wants all of it from t=10 for 50 s. Only capacity stands in high's way."""
    leaves = [{"name": "team", "namespaces": ["team"]}, {"name": "top", "namespaces": ["top"]}]
    return {
        "topology": ONE_NODE,
        "quota": preempt_tree({"cpu": 100}, tree_notes, leaves),
        "jobs": [
            group("low", priority=1, requests={"cpu": "8"}, runSeconds=100,
                  annotations={"fleetq.io/preemption-grace-seconds": "5"}),
            group("high", namespace="top", start=10, priority=100, requests={"cpu": "8"},
                  runSeconds=50),
        ],
    }


def test_capacity_preemption_is_simulated() -> None:
    """Issue 24: quota admits high at 10 but the node is full; like the placement
    activity (``fleetq.preemption.plan_capacity_preemption``) the engine evicts low on
    that cluster: low stops at 15 (its 5 s grace; 8 cpu x 15 s lost), requeues with its
    original submit time, high binds at 15 and runs to 65, low runs again 65-165."""
    s = run(_capacity_trace(**{"fleetq.io/preemption": "LowerPriority"}))
    g = by_group(s)
    assert g["high"]["timeToStart"]["mean"] == 5.0
    assert (g["low"]["preempted"], g["low"]["wastedCpuSeconds"]) == (1, 120.0)
    p = s["preemption"]
    assert (p["capacityPlans"], p["byReason"]) == (1, {"Capacity": 1})
    assert s["makespan"] == 165.0 and s["jobs"]["completed"] == 2
    # under Never nothing is evicted: high waits for low to finish
    never = run(_capacity_trace())
    assert by_group(never)["high"]["timeToStart"]["mean"] == 90.0
    assert never["preemption"]["capacityPlans"] == 0


def test_a_victim_that_finishes_in_its_grace_period_does_not_extend_the_run() -> None:
    """Its stop timer is cancelled (as the workflow's): the run ends at the last finish,
    and usage is averaged over the run, not over grace periods nobody waited for."""
    doc = _low_then_high(**{"fleetq.io/preemption": "LowerPriority"})
    doc["jobs"][0]["runSeconds"] = 15  # low ends at 15, inside its 30 s grace (10-40)
    s = run(doc)
    assert s["preemption"]["finishedDuringGrace"] == 1
    assert s["makespan"] == 65.0 and s["end"] == 65.0  # high: 15-65


def test_a_kueue_generator_config_becomes_a_trace() -> None:
    """Kueue's test/performance/scheduler/configs/baseline/generator.yaml shape (values
    as published): 5 cohorts x 6 ClusterQueues (nominal 20, borrowing limit 100), 350
    small + 100 medium + 50 large workloads per queue = 15,000 jobs."""
    from fleetq.simulator.kueue import trace_from_generator

    doc = trace_from_generator(yaml.safe_load((TRACES / "kueue-baseline-generator.yaml")
                                              .read_text()), ONE_NODE)
    trace = parse_trace(doc)
    assert trace.job_count == 15_000
    assert trace.preemption.preemption.value == "LowerPriority"
    assert trace.preemption.reclaim.value == "Any"
    root = doc["quota"]["spec"]["root"]
    assert root["max"] == {"cpu": 600.0} and len(root["children"]) == 5
    cq = root["children"][0]["children"][0]
    assert (cq["min"], cq["max"]) == ({"cpu": 20.0}, {"cpu": 120.0})
    small = next(g for g in doc["jobs"] if g["jobClass"] == "small")
    assert (small["count"], small["start"], small["interval"], small["runSeconds"]) == (
        350, 0.1, 0.1, 0.2)
    off = trace_from_generator(yaml.safe_load((TRACES / "kueue-baseline-generator.yaml")
                                              .read_text()), ONE_NODE, preemption=False)
    assert "annotations" not in off["quota"]["metadata"]
