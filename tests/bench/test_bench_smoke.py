"""Smoke tests of every benchmark at a tiny size: each runs to the end through ``fleetq
bench NAME`` or its ``main(argv)`` and prints a well-formed ``RESULT`` line. No timing is
asserted (the machines are shared); what is asserted is what would break a benchmark
run: a crash, a job that does not succeed, a lost or out-of-order grant, a missing line.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from typer.testing import CliRunner

from fleetq.cli import app
from fleetq.cli.bench import BENCHMARKS, BenchError, resolve

RESULT = re.compile(r"^RESULT (?P<name>[a-z0-9]+) (?P<ratio>\d+\.\d+) \(target (?P<t>[\d.]+)\)$")


def run_main(main: Callable[[Sequence[str]], int], argv: list[str],
             capsys: pytest.CaptureFixture[str]) -> tuple[int, str, re.Match[str]]:
    code = main(argv)
    out = capsys.readouterr().out
    last = out.strip().splitlines()[-1]
    match = RESULT.match(last)
    assert match, f"last line is not a RESULT line: {last!r}"
    return code, out, match


def test_placement_at_a_tiny_size_prints_its_result(capsys: pytest.CaptureFixture[str]) -> None:
    from bench import placement

    code, out, m = run_main(placement.main, ["--clusters", "3", "--nodes", "40",
                                             "--workers", "3", "--repeat", "2",
                                             "--changes", "4"], capsys)
    assert code == 0
    assert m["name"] == "placement" and float(m["t"]) == 5.0
    changed = RESULT.match(out.strip().splitlines()[-2])
    assert changed, out
    assert changed["name"] == "placementchanged" and float(changed["t"]) == 2.0
    assert "1 of 3 clusters changed before each decision (4 times):" in out
    assert "decision after the changes == cold decision: True" in out


def test_capacity_at_a_tiny_size_prints_its_result(capsys: pytest.CaptureFixture[str]) -> None:
    from bench import capacity

    # the exit code encodes the timing target, which a tiny fleet need not meet
    _code, out, m = run_main(capacity.main, ["--clusters", "2", "--nodes", "5",
                                             "--pods", "20", "--repeat", "2"], capsys)
    assert m["name"] == "capacity"
    assert "cached == listed: True" in out


def test_queue_admits_every_holder_once_in_priority_then_fifo_order(
        capsys: pytest.CaptureFixture[str]) -> None:
    from bench import queue

    code, out, m = run_main(queue.main, ["--jobs", "60", "--concurrency", "30"], capsys)
    assert code == 0, out
    assert m["name"] == "queue" and float(m["t"]) == 0.5
    assert "in priority-then-FIFO order: True" in out
    assert "grants sent by the quota workflow (all runs): 160 (= 60 + 100 plugs: True)" in out
    assert "quota workflow tasks failed, by cause: " in out


def _grant(job: str) -> Any:
    """A quota history's ``admitted`` signal to ``job``."""
    from temporalio.api.history.v1 import HistoryEvent

    ev = HistoryEvent()
    s = ev.signal_external_workflow_execution_initiated_event_attributes
    s.signal_name = "admitted"
    s.workflow_execution.workflow_id = job
    return ev


def test_queue_order_check_catches_a_reordered_grant() -> None:
    """The checker the queue benchmark relies on fails on a wrong order, a duplicate and
    a lost grant (built from synthetic history events)."""
    from temporalio.api.common.v1 import Payload, Payloads
    from temporalio.api.history.v1 import HistoryEvent

    from bench.queue import check_order

    def enqueue(job: str, prio: int, at: float) -> HistoryEvent:
        ev = HistoryEvent()
        a = ev.workflow_execution_signaled_event_attributes
        a.signal_name = "enqueue"
        data = (f'{{"job_id":"{job}","namespace":"bench","priority":{prio},'
                f'"request":{{"kube-queue/max-jobs":1000}},"submitted_at":{at}}}')
        a.input.CopyFrom(Payloads(payloads=[Payload(data=data.encode())]))
        return ev

    queued = [enqueue("a", 0, 1.0), enqueue("b", 10, 2.0), enqueue("c", 0, 3.0)]
    ok, order = check_order([*queued, _grant("b"), _grant("a"), _grant("c")], {"a", "b", "c"})
    assert ok == [] and order == ["b", "a", "c"]
    bad, _ = check_order([*queued, _grant("a"), _grant("b"), _grant("c")], {"a", "b", "c"})
    assert len(bad) == 1 and "grant #0 went to a" in bad[0]
    dup, _ = check_order([*queued, _grant("b"), _grant("b"), _grant("a")], {"a", "b", "c"})
    assert any("more than once" in p for p in dup) and any("never granted" in p for p in dup)


def test_queue_order_check_reads_batched_submit_updates() -> None:
    """Jobs' enqueues arrive in ``submit`` update batches: the checker reads the requests
    from the update's accepted event, in batch order, beside single signals."""
    import json

    from temporalio.api.common.v1 import Payload, Payloads
    from temporalio.api.history.v1 import HistoryEvent

    from bench.common import quota_messages
    from bench.queue import check_order

    def request(job: str, prio: int, at: float) -> dict[str, object]:
        return {"job_id": job, "namespace": "bench", "priority": prio,
                "request": {"kube-queue/max-jobs": 1000}, "submitted_at": at}

    batch = HistoryEvent()
    req = batch.workflow_execution_update_accepted_event_attributes.accepted_request
    req.input.name = "submit"
    body = {"messages": [{"signal": "enqueue", "request": request("a", 0, 1.0)},
                         {"signal": "release", "job_id": "plug"},
                         {"signal": "enqueue", "request": request("b", 10, 2.0)}]}
    req.input.args.CopyFrom(Payloads(payloads=[Payload(data=json.dumps(body).encode())]))
    single = HistoryEvent()
    sig = single.workflow_execution_signaled_event_attributes
    sig.signal_name = "enqueue"
    sig.input.CopyFrom(Payloads(payloads=[Payload(data=json.dumps(request("c", 0, 3.0))
                                                  .encode())]))

    got = [(m.signal, m.subject()) for _, m in quota_messages([batch, single])]
    assert got == [("enqueue", "a"), ("release", "plug"), ("enqueue", "b"), ("enqueue", "c")]

    ok, order = check_order([batch, single, _grant("b"), _grant("a"), _grant("c")],
                            {"a", "b", "c"})
    assert ok == [] and order == ["b", "a", "c"]
    bad, _ = check_order([batch, single, _grant("a"), _grant("b"), _grant("c")], {"a", "b", "c"})
    assert len(bad) == 1 and "grant #0 went to a" in bad[0]


def test_e2e_runs_tiny_jobs_through_the_whole_pipeline(capsys: pytest.CaptureFixture[str]) -> None:
    from bench import e2e

    code, out, m = run_main(e2e.main, ["--jobs", "4", "--warmup", "1",
                                       "--concurrency", "4", "--rounds", "2"], capsys)
    assert code == 0, out
    assert m["name"] == "e2e" and float(m["t"]) == 0.7
    assert out.count("states: {'Succeeded': 4}") == 2  # both rounds, every job
    assert "bind 1.00" in out  # every job made one member write (reserve + bind, one activity)
    # what the members were asked, per job: one PyTorchJob created each, and no GET of the
    # namespace, which the warm-up's binds already saw
    asked = re.search(r"^requests to members per job: [\d.]+ \((.*)\)$", out, re.M)
    assert asked, out
    assert "POST pytorchjobs 1.00" in asked[1].split(", ")
    assert "GET namespaces" not in asked[1]
    # the registry did not change after the warm-up: its jobs' policies were resolved
    # from the warm-up's read, checked by describes, with no query (a worker task) more
    reads = re.search(r"^fleet registry reads per job: queries ([\d.]+), describes that "
                      r"found it unchanged ([\d.]+)$", out, re.M)
    assert reads, out
    assert float(reads[1]) == 0.0 and float(reads[2]) > 0.0
    ratios = re.search(r"ratios by round: ([\d.]+), ([\d.]+) \(median ([\d.]+)\)", out)
    assert ratios, out
    low, high = sorted(float(x) for x in ratios.groups()[:2])
    assert float(ratios[3]) == pytest.approx((low + high) / 2, abs=0.011)
    assert float(m["ratio"]) == float(ratios[3])
    # the same-mix baseline ran a job's local and regular activities, both rounds
    assert len(re.findall(r"same-mix ratio \(baseline with [\d.]+ local \+ [\d.]+ regular\) "
                          r"[\d.]+", out)) == 2, out


def test_e2e_baselines_are_passed_through_the_sandbox_as_the_job_workflows_are() -> None:
    """A baseline run must not pay the sandbox's re-execution of its module that a job's
    run does not pay (the worker passes ``workflows`` through): that would flatter the
    ratio. The bench's worker passes the baselines' module through too."""
    from bench import e2e
    from bench.baseline import ActivityChain, ActivityMix
    from worker import SANDBOX_PASSTHROUGH, workflow_runner

    passed = workflow_runner([e2e.BASELINE_MODULE]).restrictions.passthrough_modules
    assert {ActivityChain.__module__, ActivityMix.__module__, *SANDBOX_PASSTHROUGH} <= passed
    assert ActivityChain.__module__ not in workflow_runner().restrictions.passthrough_modules


@pytest.mark.parametrize("n,mean", [(500, 7.28), (500, 7.8), (3, 7.0), (7, 2.5), (50, 4.02)])
def test_e2e_baseline_runs_the_jobs_mean_activity_count(n: int, mean: float) -> None:
    from bench.e2e import activity_counts

    counts = activity_counts(n, mean)
    assert len(counts) == n
    assert abs(sum(counts) / n - mean) <= 0.5 / n + 1e-9
    assert max(counts) - min(counts) <= 1


def test_history_counts_the_walkthrough_and_a_long_job(capsys: pytest.CaptureFixture[str]) -> None:
    from bench import history

    code, out, m = run_main(history.main, ["--days", "1", "--run-seconds", "1"], capsys)
    assert code == 0, out
    assert m["name"] == "history" and float(m["ratio"]) > 1.0
    assert "walkthrough job pytorchjob/default/pytorch-test: Succeeded" in out


def test_cli_latency_times_every_command_against_one_server(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Each timed run must have printed what the command shows (the job for ``fleetq
    get`` and ``temporal workflow list``), so a figure never times an error."""
    from bench import cli_latency

    # the exit code encodes the timing target, which a loaded machine need not meet
    _code, out, m = run_main(cli_latency.main, ["--repeat", "1"], capsys)
    assert m["name"] == "clilatency" and float(m["t"]) == 3.0
    for label in ("fleetq get pytorchjob (HTTP)", "fleetq get pytorchjob (SDK)",
                  "temporal workflow list (same query)",
                  "fleetq --help", "python -c pass (interpreter start)"):
        line = rf"^  {re.escape(label)} +median +\d+\.\d+ s .*cpu median +\d+\.\d+ s +\(n=1\)$"
        assert re.search(line, out, re.M), (label, out)
    assert "fleetq get pytorchjob ÷ temporal workflow list: " in out


def test_cli_lists_benchmarks_and_dispatches_by_name() -> None:
    runner = CliRunner()
    listed = runner.invoke(app, ["bench", "--help"])
    assert listed.exit_code == 0
    for name in BENCHMARKS:
        assert name in listed.output
    got = runner.invoke(app, ["bench", "placement", "--clusters", "2", "--nodes", "20",
                              "--workers", "2", "--repeat", "1"])
    assert got.exit_code == 0, got.output
    assert RESULT.match(got.output.strip().splitlines()[-1])


def test_cli_rejects_an_unknown_benchmark_in_one_line() -> None:
    got = CliRunner().invoke(app, ["bench", "nope"])
    assert got.exit_code == 2
    assert "unknown benchmark 'nope'; choose one of: e2e, queue" in got.output
    assert "Traceback" not in got.output


def test_a_missing_benchmark_module_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "bench.chaos" else real(name, *a))
    with pytest.raises(BenchError, match=r"benchmark 'chaos' is not available .*bench/chaos.py"):
        resolve("chaos")


#: every benchmark's flags, as they were under argparse (BENCHMARKS.md's commands use them)
BENCH_FLAGS = {
    "e2e": ("--jobs", "--concurrency", "--warmup", "--run-seconds", "--rounds",
            "--unsandboxed"),
    "queue": ("--jobs", "--concurrency"),
    "placement": ("--clusters", "--nodes", "--workers", "--repeat", "--changes"),
    "capacity": ("--clusters", "--nodes", "--pods", "--repeat"),
    "history": ("--days", "--rewatch-seconds", "--run-seconds"),
    "chaos": ("--points", "--restarts", "--members", "--workdir", "--json"),
    "admission": ("--parents", "--leaves", "--waiting-per-leaf", "--repeats", "--bytes-jobs",
                  "--seed"),
    "trace": ("--trace", "--time-scale", "--concurrency", "--activity-slots", "--timeout"),
    "workers": ("--workers", "--jobs", "--compare", "--timeout", "--bind-cost"),
    "cli_latency": ("--repeat", "--fleetq"),
    "kueue": ("--generator", "--cohorts", "--queues", "--workloads", "--stretch", "--out",
              "--timeout"),
    "sustained": ("--latencies", "--rates", "--seconds", "--window", "--drain", "--feed",
                  "--outboxes", "--shards"),
}


@pytest.mark.parametrize("name", sorted(BENCH_FLAGS))
def test_every_benchmark_lists_its_flags_and_refuses_an_unknown_one(
        name: str, capsys: pytest.CaptureFixture[str]) -> None:
    import importlib

    assert set(BENCH_FLAGS) == set(BENCHMARKS)
    module = importlib.import_module(f"bench.{name}")
    assert module.main(["--help"]) == 0
    out = capsys.readouterr().out
    for flag in BENCH_FLAGS[name]:
        assert flag in out, (flag, out)
    assert module.main(["--no-such-flag"]) == 2
    err = capsys.readouterr().err
    assert "No such option: --no-such-flag" in err and "Traceback" not in err


@pytest.mark.parametrize(("name", "argv"), [
    ("e2e", ["--jobs", "0"]), ("queue", ["--concurrency", "0"]),
    ("history", ["--days", "0"]), ("history", ["--run-seconds", "-1"]),
    ("chaos", ["--members", "cloud"]), ("sustained", ["--seconds", "0"]),
])
def test_a_benchmark_refuses_an_out_of_range_value_before_it_starts(
        name: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    import importlib

    assert importlib.import_module(f"bench.{name}").main(argv) == 2
    err = capsys.readouterr().err
    assert f"Invalid value for '{argv[0]}'" in err and "Traceback" not in err
