"""Tracing, as an operator turns it on (OTEL_* environment): one job makes one connected
trace from ``fleetq apply`` through the job workflow and its activities down to the
requests that write to the member cluster; a job started with the plain ``temporal``
CLI gets a trace of its own rooted at its RunWorkflow span; an OTLP endpoint without the
OTLP exporter installed stops the process with one line instead of printing spans to the
console; a collector that is down is one rate-limited line; OpenTelemetry's own
OTEL_SERVICE_NAME / OTEL_TRACES_SAMPLER are honoured; an OTLP endpoint for traces does
not turn on OTLP metrics.

The spans go to an in-memory exporter on the process's tracer provider (``setup_tracing``
keeps a provider that is already installed). The member writes are the adapter's own
spans (``KubeApi.call``: one ``member POST`` / ``DELETE``... per write request).
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
import yaml
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.testing import WorkflowEnvironment
from typer.testing import CliRunner

from activities.fleet import Fleet
from activities.scheduling import SchedulingActivities
from fleetq.cli import app
from fleetq.client.connection import (
    connect,
    setup_tracing,
    temporal_cli_path,
    until_polled,
)
from fleetq.emulator.fleet import EmulatedFleet
from fleetq.naming import job_workflow_id
from fleetq.runtime.telemetry import metrics_runtime, otlp_metrics_url
from fleetq.testing.chaos import job_manifest, policy_manifest, tree_manifest
from tests.conftest import start_dev_server
from worker import build_worker

NS = "traced"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    assert isinstance(trace.get_tracer_provider(), TracerProvider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.shutdown()  # the provider outlives the module; later spans are dropped


@pytest.fixture(scope="module")
def traced_env() -> Iterator[None]:
    mp = pytest.MonkeyPatch()
    mp.setenv("OTEL_TRACES_EXPORTER", "otlp")  # never used: a provider is installed
    yield
    mp.undo()


@pytest_asyncio.fixture(scope="module")
async def traced_fleet(spans: InMemorySpanExporter, traced_env: None
                       ) -> AsyncIterator[tuple[WorkflowEnvironment, EmulatedFleet]]:
    env = await start_dev_server(dev_server_log_level="error")
    emulated = EmulatedFleet(start_delay=0.05).start()
    fleet = Fleet.from_config(emulated.fleet_config_path)
    address = env.client.service_client.config.target_host
    client = await connect(address)  # the worker's own way: tracing interceptors included
    assert client.config()["interceptors"], "tracing is on: the client must be intercepted"
    worker = build_worker(client, SchedulingActivities(client, fleet, search_attributes=True))
    try:
        async with worker:
            await until_polled(client)  # both task queues, the control one from its thread
            yield env, emulated
    finally:
        fleet.close()
        emulated.stop()
        await env.shutdown()


async def test_one_job_is_one_connected_trace_from_apply_to_the_member_writes(
        traced_fleet: tuple[WorkflowEnvironment, EmulatedFleet],
        spans: InMemorySpanExporter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env, _ = traced_fleet
    name = f"traced-{uuid.uuid4().hex[:6]}"
    manifests = tmp_path / "job.yaml"
    manifests.write_text(yaml.safe_dump_all([
        tree_manifest({"t": [NS]}, max_jobs=10, name="traced-tree"),
        policy_manifest(NS, queued=True),
        job_manifest(NS, name),
    ]))
    monkeypatch.setenv("TEMPORAL_ADDRESS", env.client.service_client.config.target_host)
    monkeypatch.setenv("TEMPORAL_NAMESPACE", env.client.namespace)
    result = await asyncio.to_thread(CliRunner().invoke, app,
                                     ["apply", "-f", str(manifests), "--run-seconds", "30"])
    assert result.exit_code == 0, result.output
    handle = env.client.get_workflow_handle(job_workflow_id(NS, name))

    deadline = time.monotonic() + 30
    while True:
        view = await handle.query("status")
        if view.get("state") == "Running":
            break
        assert time.monotonic() < deadline, view.get("state")
        await asyncio.sleep(0.1)

    def job_trace() -> tuple[ReadableSpan, list[ReadableSpan]]:
        finished = list(spans.get_finished_spans())
        (start,) = [s for s in finished if s.name == "StartWorkflow:PyTorchJobWorkflow"
                    and dict(s.attributes or {}).get("temporalWorkflowID") == handle.id]
        assert start.context is not None
        tid = start.context.trace_id
        return start, [s for s in finished if s.context is not None
                       and s.context.trace_id == tid]

    names: set[str] = set()
    deadline = time.monotonic() + 15
    while True:  # the bind activity's span ends when the activity returns
        start, in_trace = job_trace()
        names = {s.name for s in in_trace}
        if "RunActivity:bind" in names:
            break
        assert time.monotonic() < deadline, sorted(names)
        await asyncio.sleep(0.1)

    # the root is the CLI's start of the workflow; everything else hangs below it
    assert start.parent is None, "fleetq apply started the trace"
    ids = {s.context.span_id for s in in_trace if s.context is not None}
    for s in in_trace:
        assert s is start or (s.parent is not None and s.parent.span_id in ids), s.name
    for want in ("RunWorkflow:PyTorchJobWorkflow", "StartActivity:bind", "RunActivity:bind"):
        assert want in names, (want, sorted(names))
    writes = [s for s in in_trace if s.name.startswith("member ")]
    bind = next(s for s in in_trace if s.name == "RunActivity:bind")
    assert bind.context is not None
    under_bind = [s for s in writes if s.parent is not None
                  and s.parent.span_id == bind.context.span_id]
    assert any(s.name == "member POST" and "pytorchjobs" in str(
        dict(s.attributes or {}).get("http.target")) for s in under_bind), [
        (s.name, dict(s.attributes or {})) for s in writes]
    await handle.terminate("test done")


def test_otlp_endpoint_without_the_exporter_fails_in_one_line() -> None:
    # a fresh interpreter (no tracer provider yet), the exporter made unimportable
    code = (
        "import sys; sys.modules['opentelemetry.exporter.otlp.proto.grpc.trace_exporter']"
        " = None\n"
        "from fleetq.client.connection import setup_tracing\n"
        "setup_tracing()\n"
        "print('fell back silently')\n"
    )
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector.example:4317",
           "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "fell back" not in out.stdout
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "http://collector.example:4317" in lines[0] and "fleetq[otlp]" in lines[0]
    # the worker's own entry point says the same and exits non-zero
    worker_code = code.split("from fleetq")[0] + (
        "import runpy; runpy.run_path('worker.py', run_name='__main__')\n")
    out = subprocess.run([sys.executable, "-c", worker_code], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and out.stderr.strip().splitlines() == lines, out.stderr


async def test_a_job_started_with_the_temporal_cli_gets_a_root_span(
        traced_fleet: tuple[WorkflowEnvironment, EmulatedFleet],
        spans: InMemorySpanExporter, tmp_path: Path) -> None:
    """No client span exists for ``temporal workflow start`` (README's example): the
    worker makes the root (``PyTorchJobWorkflow <workflow id>``), and RunWorkflow and the
    job's activities hang below it."""
    env, _ = traced_fleet
    name = f"cli-{uuid.uuid4().hex[:6]}"
    wf_id = job_workflow_id(NS, name)
    arg = tmp_path / "job.json"
    arg.write_text(json.dumps({"manifest": job_manifest(NS, name),
                               "policy": policy_manifest(NS), "run_seconds": 30}))
    out = subprocess.run(
        [str(temporal_cli_path()), "workflow", "start", "--task-queue", "fleetq",
         "--type", "PyTorchJobWorkflow", "--workflow-id", wf_id, "--input-file", str(arg),
         "--address", env.client.service_client.config.target_host,
         "--namespace", env.client.namespace],
        capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr

    def runs() -> list[ReadableSpan]:
        return [s for s in spans.get_finished_spans()
                if s.name == "RunWorkflow:PyTorchJobWorkflow"
                and dict(s.attributes or {}).get("temporalWorkflowID") == wf_id]

    deadline = time.monotonic() + 30
    while True:
        roots = runs()
        in_trace: list[ReadableSpan] = []
        if roots and roots[0].context is not None:
            tid = roots[0].context.trace_id
            in_trace = [s for s in spans.get_finished_spans()
                        if s.context is not None and s.context.trace_id == tid]
        if any(s.name == "RunActivity:bind" for s in in_trace):
            break
        assert time.monotonic() < deadline, sorted({s.name for s in in_trace})
        await asyncio.sleep(0.1)
    (root,) = [s for s in in_trace if s.parent is None]
    assert root.name == f"PyTorchJobWorkflow {wf_id}", root.name
    assert root.context is not None and roots[0].parent is not None
    assert roots[0].parent.span_id == root.context.span_id
    ids = {s.context.span_id for s in in_trace if s.context is not None}
    assert all(s is root or (s.parent is not None and s.parent.span_id in ids)
               for s in in_trace), "one connected trace"
    await env.client.get_workflow_handle(wf_id).terminate("test done")


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter (no tracer provider yet) with only ``env``."""
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={"PATH": "/usr/bin:/bin", **env})


def test_service_name_and_sampler_come_from_the_otel_variables() -> None:
    code = (
        "from opentelemetry import trace\n"
        "from fleetq.client.connection import setup_tracing\n"
        "assert setup_tracing()\n"
        "p = trace.get_tracer_provider()\n"
        "print(p.resource.attributes['service.name'], p.sampler.get_description())\n"
    )
    out = _python(code, OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="fleetq-eu1",
                  OTEL_TRACES_SAMPLER="traceidratio", OTEL_TRACES_SAMPLER_ARG="0.25")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["fleetq-eu1", "TraceIdRatioBased{0.25}"], out.stdout
    # without a service name: fleetq, and the SDK's default sampler
    out = _python(code, OTEL_TRACES_EXPORTER="console")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "fleetq", out.stdout
    out = _python(code, OTEL_TRACES_EXPORTER="console",
                  OTEL_RESOURCE_ATTRIBUTES="service.name=from-attrs")
    assert out.stdout.split()[0] == "from-attrs", out.stdout


def test_a_collector_that_is_down_is_one_line_not_one_per_export() -> None:
    """Five exports to a port nobody listens on: the gRPC exporter's retry warnings and
    failures become one uncoloured line naming the endpoint (the next in 5 minutes)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nobody listens
    code = (
        "import logging\n"
        "logging.basicConfig(format='%(levelname)s %(name)s: %(message)s')\n"
        "from opentelemetry import trace\n"
        "from fleetq.client.connection import setup_tracing\n"
        "assert setup_tracing()\n"
        "p = trace.get_tracer_provider()\n"
        "for i in range(5):\n"
        "    with trace.get_tracer('t').start_as_current_span(f's{i}'):\n"
        "        pass\n"
        "    p.force_flush()\n"
        "print('flushed 5')\n"
    )
    out = _python(code, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
                  OTEL_EXPORTER_OTLP_TIMEOUT="1")
    assert out.returncode == 0 and "flushed 5" in out.stdout, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("WARNING") and "traces not exported" in lines[0], lines
    assert f"127.0.0.1:{port}" in lines[0] and "\x1b[" not in lines[0], lines


def test_an_otlp_endpoint_for_traces_does_not_turn_on_otlp_metrics(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_METRICS_EXPORTER", raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector.example:4317")
    assert otlp_metrics_url() is None and metrics_runtime(None) is None
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp")
    assert otlp_metrics_url() == "http://collector.example:4317"


def test_no_tracing_configured_means_no_interceptor(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    assert setup_tracing() == []
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    assert setup_tracing() == []
