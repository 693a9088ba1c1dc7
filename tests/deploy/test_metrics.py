"""The worker's /metrics as a dashboard reads it (issue 27): a real scrape of versioned
workers (``run_worker`` with ``--prometheus-port``) against a dev server of its own and
the member-cluster emulator, parsed with prometheus_client's text parser.

* Before any job: every counter is there at 0 for each label value it can take
  (placement failures by RejectionCode, failovers by member and purgeMode as a policy
  spells it, ``Immediately`` included, preemptions by reason, job states).
* After the walkthrough job was admitted: the admission-latency histogram has the
  0.1 s … 8 h buckets (``workflows.metrics.DURATION_BUCKETS``), every series carries
  the worker's ``build_id``, the quota tree's gauges say 1 holder.
* Every panel of ``deploy/grafana-dashboard.json``: each metric its PromQL names, each
  label it groups by or matches, and each literal label value, exist in that scrape.
* ``fleetq up --prometheus-port`` serves its worker's metrics.
* Rollout: worker B is made current; once the job ended the quota workflow runs on B,
  B reports 0 holders and A, which still runs, stops reporting the tree at all (a
  Temporal gauge would have kept saying 1 for ever).
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families
from temporalio.client import Client
from temporalio.common import WorkerDeploymentVersion
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import WorkerDeploymentConfig
from typer.testing import CliRunner

from fleetq.cli import app
from fleetq.client.connection import (
    ensure_search_attributes,
    set_current_version,
)
from fleetq.emulator.fleet import EmulatedFleet
from fleetq.naming import job_workflow_id
from fleetq.preemption import PreemptionReason
from fleetq.rejection import RejectionCode
from tests.conftest import start_dev_server
from tests.deploy.running_worker import RunningWorker, free_port, get, poll
from workflows.metrics import DURATION_BUCKETS, JOB_STATES, PURGE_MODES

ROOT = Path(__file__).resolve().parents[2]
WALKTHROUGH = ROOT / "fleetq" / "data" / "walkthrough"
DASHBOARD = ROOT / "deploy" / "grafana-dashboard.json"
DEPLOYMENT = "fleetq-metrics"
TREE = "quota/kube-system/elasticquotatree"


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def scrape(url: str) -> list[Sample]:
    """Every sample of the scrape, named as Prometheus stores it (the parser calls a
    counter's samples ``<name>_total`` even where the text says ``<name>``)."""
    code, text = get(url)
    assert code == 200, text
    written = {line.split("{")[0].split(" ")[0] for line in text.splitlines()
               if line and not line.startswith("#")}
    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            name = fam.name if s.name not in written and fam.name in written else s.name
            out.append(Sample(name, dict(s.labels), s.value))
    return out


def series(samples: list[Sample], name: str, **labels: str) -> list[Sample]:
    return [s for s in samples if s.name == name
            and all(s.labels.get(k) == v for k, v in labels.items())]


@dataclass
class Stack:
    env: WorkflowEnvironment
    client: Client
    members: EmulatedFleet
    a: RunningWorker
    after_job: list[Sample]


def worker(env: WorkflowEnvironment, members: EmulatedFleet, build: str) -> RunningWorker:
    return RunningWorker(dict(
        address=env.client.service_client.config.target_host, namespace="default",
        fleet_config=str(members.fleet_config_path),
        deployment=WorkerDeploymentConfig(WorkerDeploymentVersion(DEPLOYMENT, build),
                                          use_worker_versioning=True)))


@pytest_asyncio.fixture(scope="module")
async def stack(members: EmulatedFleet) -> AsyncIterator[Stack]:
    env = await start_dev_server(search_attributes=False, dev_server_log_level="error")
    client = env.client
    await ensure_search_attributes(client)
    a = worker(env, members, "a1").start()
    try:
        await a.ready()
        yield Stack(env, client, members, a, [])
    finally:
        a.stop()
        await env.shutdown()


def zero_counters_present(samples: list[Sample], clusters: list[str]) -> list[str]:
    missing = []
    for code in RejectionCode:
        if not series(samples, "fleetq_placement_failures", reason=code.value):
            missing.append(f"placement_failures{{reason={code.value}}}")
    for cluster in clusters:
        for mode in PURGE_MODES:
            if not series(samples, "fleetq_failovers", cluster=cluster, purge_mode=mode):
                missing.append(f"failovers{{cluster={cluster},purge_mode={mode}}}")
    for reason in PreemptionReason:
        if not series(samples, "fleetq_preemptions", reason=reason.value):
            missing.append(f"preemptions{{reason={reason.value}}}")
    for state in JOB_STATES:
        if not series(samples, "fleetq_job_state_transitions", state=state):
            missing.append(f"job_state_transitions{{state={state}}}")
    return missing


async def test_counters_are_exported_at_zero_before_any_job(stack: Stack) -> None:
    clusters = sorted(stack.members.members)

    def check() -> tuple[bool, str]:
        missing = zero_counters_present(scrape(stack.a.metrics_url), clusters)
        return not missing, f"missing {missing}"

    await poll(check, "every counter at 0", 30)
    samples = scrape(stack.a.metrics_url)
    (immediately,) = series(samples, "fleetq_failovers", cluster=clusters[0],
                            purge_mode="Immediately")
    assert immediately.value == 0 and immediately.labels["build_id"] == "a1"
    assert immediately.labels["workflow_type"] == "PyTorchJobWorkflow"
    assert not series(samples, "fleetq_quota_holders"), "no tree before one is applied"


async def test_after_a_job_buckets_build_id_and_tree_gauges(stack: Stack) -> None:
    r = await asyncio.to_thread(CliRunner().invoke, app, [
        "apply", "-f", str(WALKTHROUGH), "--run-seconds", "600"],
        env={"TEMPORAL_ADDRESS": stack.env.client.service_client.config.target_host,
             "TEMPORAL_NAMESPACE": "default"})
    assert r.exit_code == 0, r.output
    handle = stack.client.get_workflow_handle(job_workflow_id("default", "pytorch-test"))

    def admitted() -> tuple[bool, str]:
        samples = scrape(stack.a.metrics_url)
        held = series(samples, "fleetq_quota_holders", tree=TREE)
        bound = series(samples, "fleetq_time_to_bind_seconds_count")
        return bool(held and held[0].value == 1 and bound), str(held)

    await poll(admitted, "1 holder and a bind on A's scrape", 60)
    samples = scrape(stack.a.metrics_url)
    for hist in ("fleetq_admission_latency_seconds", "fleetq_time_to_bind_seconds"):
        les = sorted({float(s.labels["le"]) for s in samples
                      if s.name == f"{hist}_bucket"})
        assert les == [*sorted(DURATION_BUCKETS), float("inf")], (hist, les)
        counts = series(samples, f"{hist}_count")
        assert len(counts) == 1, counts
        (count,) = counts
        assert count.value == 1 and count.labels["build_id"] == "a1"
    lengths = {s.labels["queue"]: s.value for s in series(samples, "fleetq_queue_length",
                                                           tree=TREE)}
    assert len(lengths) == 2 and set(lengths.values()) == {0}, lengths  # root, child-2
    assert any(q.startswith("root-child-2") for q in lengths), lengths
    assert {s.labels["reason"] for s in series(samples, "fleetq_pending_jobs", tree=TREE)} \
        == {"Preempting", "QuotaUnavailable"}
    assert all(s.labels.get("build_id") == "a1" for s in samples
               if s.name.startswith(("fleetq_", "temporal_"))), "every series: build_id"
    stack.after_job[:] = samples
    assert (await handle.describe()).status is not None


SELECTOR = re.compile(r"\b((?:fleetq|temporal)_[A-Za-z0-9_]+)(\{[^}]*\})?")
MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!=|!~|=)\s*"([^"]*)"')
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


def expressions(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"]))
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            out.append((f"variable {var['name']}", query))
    return out


def expression_problems(expr: str, samples: list[Sample]) -> list[str]:
    """What ``expr`` refers to that the scrape does not have: a metric, a label it
    matches or groups by, a literal label value it matches (``$variables`` aside)."""
    problems = []
    groups = [g.strip() for m in GROUPING.finditer(expr) for g in m.group(1).split(",")]
    names = []
    for m in SELECTOR.finditer(expr):
        name, matchers = m.group(1), m.group(2) or ""
        names.append(name)
        found = [s for s in samples if s.name == name]
        if not found:
            problems.append(f"no series {name}")
            continue
        for label, op, value in MATCHER.findall(matchers):
            if not any(label in s.labels for s in found):
                problems.append(f"{name} has no label {label}")
            elif op == "=" and "$" not in value and not any(
                    s.labels.get(label) == value for s in found):
                problems.append(f"{name} has no {label}={value!r}")
    for label in filter(None, groups):
        if not any(label in s.labels for s in samples if s.name in names):
            problems.append(f"grouping by {label}: not a label of {names}")
    lv = re.search(r"label_values\(\s*([A-Za-z0-9_]+)\s*,\s*([A-Za-z0-9_]+)\s*\)", expr)
    if lv and not any(lv.group(2) in s.labels for s in samples if s.name == lv.group(1)):
        problems.append(f"label_values: {lv.group(1)} has no label {lv.group(2)}")
    if not names and not lv:
        problems.append("names no fleetq_ or temporal_ metric")
    return problems


async def test_every_dashboard_panel_queries_what_the_scrape_has(stack: Stack) -> None:
    if not stack.after_job:  # run alone: the job first
        await test_after_a_job_buckets_build_id_and_tree_gauges(stack)
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = expressions(dashboard)
    assert len([e for e in exprs if not e[0].startswith("variable")]) >= 10, exprs
    problems = {f"{title}: {expr}": p for title, expr in exprs
                if (p := expression_problems(expr, stack.after_job))}
    assert problems == {}


def test_the_checker_finds_what_a_scrape_lacks() -> None:
    samples = [Sample("fleetq_failovers", {"cluster": "a", "purge_mode": "Immediately"}, 0)]
    assert expression_problems(
        'sum by (cluster) (rate(fleetq_failovers{purge_mode="Immediately"}[5m]))',
        samples) == []
    assert expression_problems('fleetq_failovers{purge_mode="Directly"}', samples) == [
        "fleetq_failovers has no purge_mode='Directly'"]
    assert expression_problems("sum by (queue) (fleetq_failovers)", samples) == [
        "grouping by queue: not a label of ['fleetq_failovers']"]
    assert expression_problems("rate(fleetq_nothing[5m])", samples) == [
        "no series fleetq_nothing"]


async def test_a_rolled_out_worker_stops_reporting_the_tree(stack: Stack) -> None:
    if not stack.after_job:
        await test_after_a_job_buckets_build_id_and_tree_gauges(stack)
    b = worker(stack.env, stack.members, "b1").start()
    try:
        await b.ready()  # its pollers are listed on both queues: it may become current
        assert await set_current_version(stack.client, DEPLOYMENT, "b1") == "b1"
        handle = stack.client.get_workflow_handle(job_workflow_id("default", "pytorch-test"))
        await handle.cancel()  # pinned to A, it ends there and gives its quota back
        for _ in range(300):
            view = await handle.query("status")
            if view["state"] == "Deleted":
                break
            await asyncio.sleep(0.2)
        assert view["state"] == "Deleted", view

        def b_says_zero() -> tuple[bool, str]:
            held = series(scrape(b.metrics_url), "fleetq_quota_holders", tree=TREE)
            return bool(held) and held[0].value == 0 and held[0].labels["build_id"] == "b1", \
                str(held)

        await poll(b_says_zero, "B reports 0 holders", 60)

        def a_silent() -> tuple[bool, str]:
            samples = scrape(stack.a.metrics_url)
            tree = [s for s in samples if s.name in (
                "fleetq_quota_holders", "fleetq_queue_length", "fleetq_pending_jobs")]
            return not tree and bool(series(samples, "fleetq_failovers")), str(tree)

        await poll(a_silent, "A, still running, no longer reports the tree", 60)
    finally:
        b.stop()


async def test_fleetq_up_exposes_its_workers_metrics(tmp_path: Path) -> None:
    """``fleetq up --prometheus-port`` passes the port to the worker it starts."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", "from fleetq.cli import main; main()", "up",
         "--state-dir", str(tmp_path / "state"), "--port", str(free_port()),
         "--ui-port", str(free_port()), "--prometheus-port", str(port)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        def counters() -> tuple[bool, str]:
            if proc.poll() is not None:  # `fleetq up` gave up: say why, not a timeout
                raise AssertionError(f"fleetq up exited {proc.returncode}: "
                                     f"{proc.stderr.read() if proc.stderr else ''}")
            code, text = get(f"http://127.0.0.1:{port}/metrics")
            return code == 200 and 'fleetq_failovers{' in text and "build_id=" in text, \
                text[-300:]

        await poll(counters, "the embedded worker's metrics", 120)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.to_thread(proc.communicate, timeout=120)
    assert proc.returncode == 0, err
