"""Smoke test of ``fleetq bench admission`` at a tiny size: it runs to the end through the
CLI and prints its two well-formed ``RESULT`` lines, the per-tree table and a packed
state that round-trips. No timing is asserted (the machines are shared)."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from fleetq.cli import app

RESULT = re.compile(r"^RESULT (?P<name>[a-z0-9]+) (?P<value>\d+\.\d+) \(target (?P<t>[\d.]+)\)$")
TINY = ["--parents", "2", "--leaves", "5", "--waiting-per-leaf", "3", "--repeats", "5",
        "--bytes-jobs", "400"]


def test_admission_at_a_tiny_size_prints_both_results() -> None:
    got = CliRunner().invoke(app, ["bench", "admission", *TINY])
    assert got.exit_code == 0, got.output
    lines = got.output.strip().splitlines()
    task, size = RESULT.match(lines[-2]), RESULT.match(lines[-1])
    assert task and size, lines[-2:]
    assert task["name"] == "admission1000" and float(task["t"]) == 2.0
    assert float(task["value"]) > 0
    assert size["name"] == "admissionbytes"
    assert float(size["t"]) == pytest.approx(512 * 1024 / 400, abs=0.01)
    # a packed job id such as pytorchjob/org-00-team-001/llama-sft-7b-... costs bytes
    assert 1.0 < float(size["value"]) < 200.0
    assert "400 waiting jobs in the 10-leaf tree" in got.output
    assert "state round trip equal: True" in got.output
    rows = dict(re.findall(r"^\| (small|mid|large) \| ([\d,]+) \|", got.output, re.M))
    assert rows == {"small": "6", "mid": "200", "large": "10"}


def test_every_release_checks_each_backlogged_queue() -> None:
    """The count the incremental pass (issue 19) has to bring down: today a release
    checks every non-empty queue of the tree at least once."""
    from bench.admission import queue_checks

    checks, nonempty = queue_checks("t", 2, 5, 3, seed=1, tasks=5)
    assert nonempty == 10
    assert checks >= nonempty
