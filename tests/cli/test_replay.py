"""``fleetq sim replay``: what a user sees for text, JSON, plots and bad traces."""

from __future__ import annotations

import json
import random
import struct
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from fleetq.cli import app
from fleetq.cli.replay import PLOT_TOP_QUEUES, UNPLACED, plot_lines, write_plot
from fleetq.simulator import SimulationResult, StepSeries

TRACES = Path(__file__).resolve().parents[2] / "examples" / "traces"
GANGS = str(TRACES / "gang-starvation.yaml")

runner = CliRunner()


def replay(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["sim", "replay", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    return result.exit_code, result.output


def small_trace(tmp_path: Path, **changes: object) -> str:
    doc: dict[str, object] = {
        "topology": {"clusters": [{"name": "c1", "nodeGroups": [{"count": 1, "cpu": "8",
                                                                  "memory": "32Gi"}]}]},
        "jobs": [{"name": "j", "namespace": "team", "count": 3, "master": 1, "workers": 0,
                  "requests": {"cpu": "8"}, "runSeconds": 10}],
    }
    doc.update(changes)
    path = tmp_path / "trace.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_text_report(tmp_path: Path) -> None:
    code, out = replay("--trace", small_trace(tmp_path))
    assert code == 0
    assert "makespan 30.0s (30s)" in out
    assert "completed 3" in out
    for title in ("Time to admission", "Queues", "Quota utilisation", "Cluster utilisation",
                  "Placement failures by reason"):
        assert title in out
    assert "needs cpu; not enough free in the whole cluster" in out


def test_json_report_and_policy_override() -> None:
    code, out = replay("--trace", GANGS, "-o", "json")
    assert code == 0
    prio = json.loads(out)
    assert prio["policy"] == "Priority"
    assert prio["jobs"]["completed"] == prio["jobs"]["submitted"] == 453
    code, out = replay("--trace", GANGS, "-o", "json", "--policy", "Block")
    assert code == 0
    block = json.loads(out)
    assert block["policy"] == "Block"
    gangs = {s["policy"]: next(g for g in s["groups"] if g["group"] == "gang")
             for s in (prio, block)}
    assert (gangs["Block"]["timeToAdmission"]["mean"]
            < gangs["Priority"]["timeToAdmission"]["mean"])


def test_plot_writes_png(tmp_path: Path) -> None:
    png = tmp_path / "out.png"
    code, out = replay("--trace", small_trace(tmp_path), "--plot", str(png))
    assert code == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot written to {png}" in out.replace("\n", "")


def test_bad_trace_is_one_line_and_exit_1(tmp_path: Path) -> None:
    path = small_trace(tmp_path, jobs=[{"name": "j", "count": -5, "runSeconds": 1}])
    code, out = replay("--trace", path)
    assert code == 1
    assert out.strip().splitlines() == ["error: trace jobs[0].count must be >= 0"]


def test_missing_trace_file(tmp_path: Path) -> None:
    code, out = replay("--trace", str(tmp_path / "nope.yaml"))
    assert code == 1
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: trace ") and "cannot read" in lines[0]


# --------------------------------------------------------------------------- preemption


def preemption_trace(tmp_path: Path) -> str:
    """One 8-cpu node and an 8-cpu quota: ``low`` (priority 1) runs 100 s from t=0,
    ``high`` (priority 100) wants all of it at t=10; the tree says nothing of
    preemption (``Never``)."""
    return small_trace(
        tmp_path,
        quota={
            "apiVersion": "scheduling.sigs.k8s.io/v1beta1",
            "kind": "ElasticQuotaTree",
            "metadata": {"name": "t", "namespace": "kube-system"},
            "spec": {"root": {"name": "root", "max": {"cpu": 8},
                              "children": [{"name": "team", "namespaces": ["team"]}]}},
        },
        jobs=[
            {"name": "low", "namespace": "team", "count": 1, "priority": 1, "jobClass": "low",
             "requests": {"cpu": "8"}, "runSeconds": 100},
            {"name": "high", "namespace": "team", "count": 1, "start": 10, "priority": 100,
             "jobClass": "high", "requests": {"cpu": "8"}, "runSeconds": 50},
        ],
    )


def test_preemption_override_reports_preemptions_and_wasted_work(tmp_path: Path) -> None:
    path = preemption_trace(tmp_path)
    code, out = replay("--trace", path)
    assert code == 0
    assert "Preemption (preemption Never, reclaim Never): no job was preempted" in out
    code, out = replay("--trace", path, "--preemption", "LowerPriority")
    assert code == 0
    text = " ".join(out.split())
    assert ("Preemption (preemption LowerPriority, reclaim Never): 1 preemptor, 1 run "
            "preempted (Priority 1), 0 victims finished during the grace period; wasted "
            "work 320 cpu·s (21.1% of the cpu·s run)") in text
    assert "Groups that lost runs to preemption" in out
    assert "Time to admission and to start by job class" in out
    code, out = replay("--trace", path, "--preemption", "LowerPriority", "--reclaim", "Any",
                       "-o", "json")
    assert code == 0
    summary = json.loads(out)
    p = summary["preemption"]
    assert (p["preemption"], p["reclaim"], p["byReason"]) == (
        "LowerPriority", "Any", {"Priority": 1})
    classes = {c["class"]: c for c in summary["classes"]}
    assert classes["high"]["timeToAdmission"]["mean"] == 30.0
    assert (classes["low"]["preempted"], classes["low"]["wastedCpuSeconds"]) == (1, 320.0)


def test_starvation_override_and_bad_overrides(tmp_path: Path) -> None:
    code, out = replay("--trace", GANGS, "-o", "json", "--starvation-seconds", "60")
    assert code == 0
    assert json.loads(out)["starvationSeconds"] == 60
    code, out = replay("--trace", small_trace(tmp_path), "--reclaim", "Any")
    assert code == 1
    assert out.strip().splitlines() == [
        "error: trace has no quota tree: there is no quota to preempt for"]
    code, out = replay("--trace", GANGS, "--preemption", "Sometimes")
    assert code == 2
    assert "Sometimes" in out


# --------------------------------------------------------------------------- plot at scale


def many_queues(queues: int, clusters: int, seed: int = 3) -> SimulationResult:
    """A replay result with ``queues`` queues (each waiting a different amount) and
    ``clusters`` clusters, built directly: simulating 1,000 queues takes a minute."""
    rng = random.Random(seed)
    qlen: dict[str, StepSeries] = {}
    for i in range(queues):
        s, t, v = StepSeries(0.0), rng.uniform(0, 300), 0
        for _ in range(rng.randrange(0, 40)):
            v = max(0, v + rng.choice((1, 1, -1)))
            s.set(t, v)
            t += rng.uniform(5, 60)
        s.set(t, 0)
        qlen[f"root-team-{i:04d}-x{i % 7}"] = s
    unplaced = StepSeries(0.0)
    unplaced.set(10, 5)
    unplaced.set(900, 0)
    qlen[UNPLACED] = unplaced
    util: dict[str, StepSeries] = {}
    for j in range(clusters):
        for r in ("cpu", "memory", "pods"):
            s = StepSeries(0.0)
            s.set(5, 0.2 + 0.8 * j / max(clusters, 1))
            s.set(1500, 0)
            util[f"cluster-{j:02d}/{r}"] = s
    return SimulationResult({}, {"queueLength": qlen, "quotaUtilisation": {},
                                 "clusterUtilisation": util}, 0.0, 2000.0)


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def test_plot_of_1000_queues_draws_the_top_queues_and_sums_the_rest() -> None:
    result = many_queues(1000, 20)
    lines = plot_lines(result)
    series = {k: v for k, v in result.series["queueLength"].items() if k != UNPLACED}
    waited = sorted(series, key=lambda q: -series[q].integral(result.end))
    waiting = [q for q in series if series[q].integral(result.end) > 0]
    assert len(lines.top) == PLOT_TOP_QUEUES
    assert [label.split(" (avg ")[0] for label, _ in lines.top] == waited[:PLOT_TOP_QUEUES]
    assert lines.queue_count == 1000 and lines.waiting_queue_count == len(waiting)
    assert lines.others is not None
    label, others = lines.others
    assert label == f"others ({len(waiting) - PLOT_TOP_QUEUES} queues, summed)"
    rest = set(waiting) - set(waited[:PLOT_TOP_QUEUES])
    assert lines.total is not None
    for t in (0.0, 123.4, 450.0, 777.7, 1200.0, 1999.0):
        assert others.at(t) == sum(series[q].at(t) for q in rest)
        assert lines.total.at(t) == sum(series[q].at(t) for q in series)
    assert lines.unplaced is result.series["queueLength"][UNPLACED]
    # clusters: the busiest few by name, the others averaged per resource (pods left out)
    shown = sorted({c for c, _, _ in lines.clusters})
    assert shown == ["cluster-16", "cluster-17", "cluster-18", "cluster-19",
                     "others (16 clusters, mean)"]
    (cpu,) = [s for c, r, s in lines.clusters if c.startswith("others") and r == "cpu"]
    assert cpu.at(10) == pytest.approx(sum(0.2 + 0.8 * j / 20 for j in range(16)) / 16)
    assert {r for _, r, _ in lines.clusters} == {"cpu", "memory"}


def test_plot_png_stays_the_same_size_from_5_to_1000_queues(tmp_path: Path) -> None:
    sizes = {}
    for queues, clusters in ((5, 2), (37, 3), (1000, 20)):
        png = tmp_path / f"{queues}.png"
        write_plot(many_queues(queues, clusters), png, f"{queues} queues")
        sizes[queues] = png_size(png)
    # the legend never grows with the queues: at most top-N lines per panel, outside the
    # axes (37 queues used to stack a legend over a third of a 1100x700 figure)
    for width, height in sizes.values():
        assert 1000 <= width <= 1300 and 600 <= height <= 1100, sizes
    assert sizes[37] == sizes[1000], sizes


def test_plot_of_a_few_queues_draws_each_one(tmp_path: Path) -> None:
    lines = plot_lines(many_queues(5, 2))
    assert len(lines.top) == lines.waiting_queue_count <= 5
    assert lines.others is None
    assert {c for c, _, _ in lines.clusters} == {"cluster-00", "cluster-01"}


def test_plot_without_matplotlib_is_one_line_naming_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    png = tmp_path / "out.png"
    code, out = replay("--trace", small_trace(tmp_path), "--plot", str(png), "-o", "json")
    assert code == 1
    assert out.strip().splitlines() == [
        "error: --plot needs matplotlib: pip install 'fleetq[plot]'"]
    assert not png.exists()
