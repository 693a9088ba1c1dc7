"""``fleetq sim replay``: what a user sees for text, JSON, plots and bad traces."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from fleetq.cli import app

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
