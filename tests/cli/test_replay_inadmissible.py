"""``fleetq sim replay`` names the jobs a tree would never admit (issue 24)."""

from __future__ import annotations

from pathlib import Path

import yaml
from typer.testing import CliRunner

from fleetq.cli import app
from tests.core.test_simulator import ONE_NODE, group, tree


def test_replay_prints_one_line_per_inadmissible_reason(tmp_path: Path) -> None:
    doc = {
        "topology": ONE_NODE,
        "quota": tree({"cpu": 4}),
        "jobs": [group("huge", count=2, requests={"cpu": "6"}), group("ok", start=1)],
    }
    trace = tmp_path / "t.yaml"
    trace.write_text(yaml.safe_dump(doc))
    out = CliRunner().invoke(app, ["sim", "replay", "--trace", str(trace)])
    assert out.exit_code == 0, out.output
    assert "inadmissible 2: quota root: cpu 6 exceeds max 4" in out.output
    assert "completed 1" in out.output
