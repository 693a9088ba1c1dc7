"""``fleetq bench trace``: a tiny trace through the real stack beside the simulator, and
the figures it compares computed from what each run did.

The end-to-end test runs 7 jobs (a few seconds of scaled trace) on a real Temporal dev
server, the in-process worker and the emulator. No timing is asserted (the machine is
shared); what is asserted is what a broken benchmark would get wrong: a missing line, a
usage figure copied from the simulator instead of read from the quota workflow's
history, a class order not taken from the run, a ratio that is not the printed figures'.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.trace import (
    RunFigures,
    class_order,
    compare,
    main,
    planned_jobs,
    scaled,
    simulate,
    time_averaged,
)
from fleetq.simulator import load_trace
from tests.bench.history_events import answered, purged, sent, signalled, task_completed

RESULT = re.compile(r"^RESULT (?P<name>[a-z]+) (?P<ratio>\d+\.\d+) \(target (?P<t>[\d.]+)\)$")

#: One 4-cpu leaf. Two 2-cpu "low" jobs fill it at 0 s; four more wait from 1 s and a
#: 4-cpu "high" job from 2 s. Priority lets the low ones that fit overtake the high one,
#: so the high job waits for the whole leaf to drain: low < high by mean wait. The quota
#: is full from the first submission to the last finish, so the simulated usage is 1.
TINY: dict[str, Any] = {
    "topology": {"clusters": [{"name": "east", "nodeGroups": [
        {"count": 1, "cpu": "16", "memory": "64Gi", "pods": 110}]}]},
    "seed": 1,
    "queuePolicy": "Priority",
    "starvationSeconds": 600,
    "quota": {
        "apiVersion": "scheduling.sigs.k8s.io/v1beta1", "kind": "ElasticQuotaTree",
        "metadata": {"name": "tiny", "namespace": "kube-system"},
        "spec": {"root": {"name": "root", "min": {"cpu": 4}, "max": {"cpu": 4}, "children": [
            {"name": "team-a", "namespaces": ["team-a"], "min": {"cpu": 4},
             "max": {"cpu": 4}}]}},
    },
    "jobs": [
        {"name": "first", "namespace": "team-a", "jobClass": "low", "priority": 1,
         "count": 2, "requests": {"cpu": "2", "memory": "1Gi"}, "runSeconds": 20},
        {"name": "later", "namespace": "team-a", "jobClass": "low", "priority": 1,
         "count": 4, "start": 1, "requests": {"cpu": "2", "memory": "1Gi"}, "runSeconds": 20},
        {"name": "big", "namespace": "team-a", "jobClass": "high", "priority": 100,
         "count": 1, "start": 2, "requests": {"cpu": "4", "memory": "1Gi"}, "runSeconds": 20},
    ],
}


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    return path


def _figure(pattern: str, out: str) -> re.Match[str]:
    match = re.search(pattern, out, re.M)
    assert match, f"no line matching {pattern!r} in:\n{out}"
    return match


def test_a_tiny_trace_runs_through_the_real_stack_beside_the_simulator(
    tiny: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["--trace", str(tiny), "--time-scale", "10"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "job states: {'Succeeded': 7}" in out
    lines = out.strip().splitlines()
    results = {m["name"]: m for m in map(RESULT.match, lines[-3:]) if m}
    assert list(results) == ["traceusage", "tracemakespan", "traceorder"], lines[-3:]
    # each class's row has both runs' mean and p99, all measured
    for cls, jobs in (("low", 6), ("high", 1)):
        row = _figure(rf"^{cls} +{jobs} +(\d+\.\d+) +(\d+\.\d+) +(\d+\.\d+) +(\d+\.\d+)$", out)
        assert all(float(x) >= 0 for x in row.groups())
    usage = _figure(r"simulated (\d\.\d{3}), real (\d\.\d{3})$", out)
    sim_usage, real_usage = float(usage[1]), float(usage[2])
    assert sim_usage == pytest.approx(1.0)  # the leaf is full from first submit to last finish
    # read from the quota workflow's grants and releases: a real run has gaps between a
    # release and the next grant, so it is below the simulator's full leaf, and the bench
    # did run jobs (an empty or copied figure fails here)
    assert 0.3 < real_usage < 1.0
    assert float(results["traceusage"]["ratio"]) == pytest.approx(real_usage / sim_usage,
                                                                   abs=0.006)
    makespan = _figure(r"makespan: simulated (\d+\.\d) s, real (\d+\.\d) s", out)
    sim_makespan, real_makespan = float(makespan[1]), float(makespan[2])
    assert sim_makespan == pytest.approx(8.0)
    assert real_makespan > 0
    assert float(results["tracemakespan"]["ratio"]) == pytest.approx(
        sim_makespan / real_makespan, abs=0.01)
    # where the real jobs' time went, every stage measured for every job
    stage_line = _figure(r"^real job stages, s \(mean/p50/p99/max\): (.*)$", out)[1]
    for stage in ("trace time -> grant sent", "grant sent -> Admitted", "Admitted -> bound",
                  "bound -> finished, less run time", "finished -> release taken"):
        assert stage in stage_line
    order = _figure(r"simulated (\S+ < \S+); real (\S+ < \S+); preserved: (yes|no)$", out)
    assert order[1] == "low < high"
    assert (order[3] == "yes") == (order[1] == order[2])
    assert results["traceorder"]["ratio"] == ("1.00" if order[3] == "yes" else "0.00")


def test_a_trace_without_a_quota_tree_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = {k: v for k, v in TINY.items() if k != "quota"}
    path = tmp_path / "free.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["--trace", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: the trace has no quota tree: there is no admission to measure"]


def test_scaling_divides_every_time_of_the_trace_and_keeps_each_jobs_draw(tiny: Path) -> None:
    doc = {**TINY, "jobs": [{**TINY["jobs"][0], "runSeconds": {"min": 100, "max": 900}},
                            *TINY["jobs"][1:]]}
    tiny.write_text(yaml.safe_dump(doc))
    trace = load_trace(tiny)
    base_sim, base = simulate(trace)
    fast_sim, fast = simulate(scaled(trace, 10))
    assert fast["makespan"] == pytest.approx(base["makespan"] / 10, abs=0.01)
    assert fast["starvationSeconds"] == pytest.approx(60)
    slow_plan, fast_plan = planned_jobs(base_sim), planned_jobs(fast_sim)
    assert [j.workflow_id for j in slow_plan] == [j.workflow_id for j in fast_plan]
    for a, b in zip(slow_plan, fast_plan, strict=True):
        assert b.offset == pytest.approx(a.offset / 10)
        assert b.run == pytest.approx(a.run / 10, abs=0.001)
    assert len({j.run for j in slow_plan if j.name.startswith("first")}) == 2  # drawn


def test_usage_is_the_time_average_of_what_is_held() -> None:
    # 4 cpu held over [0, 5), 2 over [5, 10): 3 on average over [0, 10]
    changes = [(0.0, 2.0), (0.0, 2.0), (5.0, -2.0), (10.0, -2.0)]
    assert time_averaged(changes, 0.0, 10.0) == pytest.approx(3.0)
    # the window counts idle time before the first grant
    assert time_averaged([(5.0, 4.0), (10.0, -4.0)], 0.0, 10.0) == pytest.approx(2.0)


def test_a_swapped_class_order_is_not_preserved() -> None:
    sim = RunFigures({"small": [10.0, 30.0], "large": [1.0]}, usage=0.8, makespan=100, jobs=3)
    same = RunFigures({"small": [12.0, 40.0], "large": [2.0]}, usage=0.7, makespan=120, jobs=3)
    swapped = RunFigures({"small": [1.0, 2.0], "large": [9.0]}, usage=0.7, makespan=120,
                         jobs=3)
    assert class_order(sim.means()) == ["large", "small"]
    verdict = compare(sim, same)
    assert verdict.order_preserved
    assert verdict.usage == pytest.approx(0.875)
    assert verdict.makespan == pytest.approx(100 / 120)
    assert not compare(sim, swapped).order_preserved


def test_a_requeued_victim_holds_nothing_until_it_is_granted_again() -> None:
    """A preempted job's ``requeue`` gives its quota back (fleetq.admission's
    Admission.requeue: release + enqueue in one step); the holdings the usage figure is
    read from must drop then, or a victim counts as holding while it waits again."""
    from bench.trace import quota_holdings

    request = {"job_id": "j", "namespace": "default", "request": {"cpu": 4000},
               "submitted_at": 0.0}
    events = [sent(0.0, "admitted", "j"), signalled(2.0, "requeue", request),
              sent(5.0, "admitted", "j"), signalled(6.0, "release", "j")]
    held = quota_holdings(events, {"j": 4.0})
    assert held.changes == [(0.0, 4.0), (2.0, -4.0), (5.0, 4.0), (6.0, -4.0)]
    assert time_averaged(held.changes, 0.0, 10.0) == pytest.approx((2 + 1) * 4 / 10)


def test_a_grant_in_a_submit_reply_holds_quota_as_a_signalled_one() -> None:
    """Jobs admitted at once learn their grant from the ``submit`` update's reply, with
    no ``admitted`` signal: the usage reader must count those grants too."""
    from bench.trace import quota_holdings

    events = [answered(1.0, ["a", "b"]), sent(3.0, "admitted", "c"),
              signalled(4.0, "release", "a")]
    held = quota_holdings(events, {"a": 1.0, "b": 2.0, "c": 4.0})
    assert held.changes == [(1.0, 1.0), (1.0, 2.0), (3.0, 4.0), (4.0, -1.0)]
    assert held.granted == {"a": [1.0], "b": [1.0], "c": [3.0]}


def test_a_victim_the_quota_workflow_purged_itself_holds_nothing_from_its_park() -> None:
    """A grace-0 victim's quota goes back when the quota workflow's own purge completes
    (its ``purge_for_preemption`` marker, docs/decisions/023), not at the victim's later
    ``requeue``: read from the recorded history of such a preemption, the victim stops
    holding at the marker, before its preemptor's grant, so usage never counts both."""
    from temporalio.client import WorkflowHistory

    from bench.common import event_seconds, parked_in
    from bench.trace import quota_holdings
    from fleetq.naming import job_workflow_id

    path = next((Path(__file__).parents[1] / "workflows" / "histories").glob(
        "quota-preemption-at-once@*.json"))
    events = WorkflowHistory.from_json("quota", path.read_text()).events
    low, high = job_workflow_id("default", "nograce"), job_workflow_id("default", "nograce-high")
    parks = [(event_seconds(e), parked_in(e)) for e in events if parked_in(e)]
    assert [ids for _t, ids in parks] == [[low]]
    held = quota_holdings(events, {low: 1.0, high: 2.0})
    assert held.released[low][0] == parks[0][0] < held.granted[high][0]
    level = peak = 0.0
    for _t, delta in sorted(held.changes):
        level += delta
        peak = max(peak, level)
    assert peak == 2.0  # never both


def test_a_job_admitted_in_a_reply_is_admitted_when_the_quota_workflow_granted_it() -> None:
    """A job that learns its grant from its enqueue's reply records ``Admitted`` at the
    start of its workflow task (workflow time stands still while a local activity runs),
    before the quota workflow's task granting it had completed: time to admission is
    then read at the grant, never earlier. A grant by signal is taken later, at the job's
    own ``Admitted``; a job never admitted has no admission time."""
    from datetime import UTC, datetime

    from bench.trace import admission_time
    from fleetq.job_view import JobEvent, JobView

    def view(*admitted: float) -> JobView:
        return JobView(namespace="ns", name="j", state="Running", events=[
            JobEvent(reason="Admitted", message="", time=datetime.fromtimestamp(t, UTC))
            for t in admitted])

    assert admission_time(view(10.0), [10.4]) == pytest.approx(10.4)  # in the reply
    assert admission_time(view(10.6), [10.4]) == pytest.approx(10.6)  # by signal
    assert admission_time(view(10.0, 20.6), [10.4, 20.2]) == pytest.approx(20.6)
    assert admission_time(view(10.0), None) == pytest.approx(10.0)
    assert admission_time(view(), [10.4]) is None


def test_a_job_granted_and_parked_in_one_task_holds_nothing_after_it() -> None:
    """A ``submit`` pass may grant a job of its batch at once and then pick it as a victim
    of a preemption planned in the same pass: the quota workflow parks it after its purge,
    but the update's completion listing its grant is written after the purge's marker.
    Read in history order, the job would hold from that completion to its later
    ``requeue`` and usage would pass the tree's max; it holds nothing."""
    from bench.trace import quota_holdings

    events = [sent(0.0, "admitted", "low"), task_completed(1.0, 7),
              purged(1.0, ["low", "fresh"]), answered(1.0, ["fresh", "high"]),
              task_completed(2.0, 12), signalled(2.0, "requeue", admission_request_of("fresh"))]
    held = quota_holdings(events, {"low": 1.0, "fresh": 1.0, "high": 2.0})
    level = peak = 0.0
    for _t, delta in sorted(held.changes):
        level += delta
        peak = max(peak, level)
    assert peak == 2.0 and level == 2.0  # high alone, never low or fresh beside it
    assert held.granted["fresh"] == [1.0] and held.released["fresh"] == [1.0]
    assert held.released["low"] == [1.0]


def admission_request_of(job: str) -> dict[str, Any]:
    return {"job_id": job, "namespace": "q", "request": {"cpu": 1000}, "submitted_at": 0.0}
