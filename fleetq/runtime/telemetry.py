"""The worker's metrics endpoint: Temporal's runtime metrics (``temporal_*`` and the
scheduler's counters and histograms, ``workflows/metrics.py``) plus the quota tree's
gauges, which only the worker running the quota workflow exports.

Temporal's Prometheus exporter binds a loopback port of its own; ``/metrics`` on the
public port is its text followed by the tree's series (``fleetq_queue_length``,
``fleetq_quota_holders``, ``fleetq_pending_jobs``), rendered from the state the quota
workflow recorded in this process and dropped as soon as this worker no longer runs the
workflow's current run on the workflow's current version (:func:`watch_tree_ownership`).
Every series carries ``build_id``; every counter is exported at 0 from the start
(:func:`zero_counters`). OTLP metrics only when ``OTEL_METRICS_EXPORTER=otlp`` says so.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import urllib.request
from collections.abc import Iterable, Mapping

from temporalio.client import Client
from temporalio.runtime import (
    LogForwardingConfig,
    LoggingConfig,
    OpenTelemetryConfig,
    PrometheusConfig,
    Runtime,
    TelemetryConfig,
    TelemetryFilter,
)

from fleetq.client.connection import RateLimitedExportErrors
from fleetq.naming import CONTROL_TASK_QUEUE, TASK_QUEUE
from fleetq.runtime.http_thread import QuietHandler, ServerThread
from workflows import metrics

log = logging.getLogger("fleetq.telemetry")
#: Temporal core's own log lines (its OTLP exporter's among them), forwarded to Python
#: logging instead of printed in colour on stderr, and rate-limited like the exporters'
CORE_LOGGER = "temporalio.core"
#: how often a worker re-checks whether it still runs each quota workflow
OWNERSHIP_SECONDS = 5.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _core_logging() -> LoggingConfig:
    logger = logging.getLogger(CORE_LOGGER)
    if not any(isinstance(f, RateLimitedExportErrors) for f in logger.filters):
        logger.addFilter(RateLimitedExportErrors(prefix="temporal core: ", per_message=True))
    return LoggingConfig(
        filter=TelemetryFilter(core_level="WARN", other_level="ERROR"),
        forwarding=LogForwardingConfig(logger=logger, append_target_to_name=False),
    )


def otlp_metrics_url() -> str | None:
    """The OTLP endpoint for metrics, only when ``OTEL_METRICS_EXPORTER`` names ``otlp``
    (an OTLP endpoint set for traces must not turn metrics on as well)."""
    names = [n.strip() for n in os.environ.get("OTEL_METRICS_EXPORTER", "").split(",")]
    if "otlp" not in names or os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return None
    return (
        os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or "http://localhost:4317"
    )


class MetricsRuntime(Runtime):
    """A Temporal runtime whose metrics ``endpoint`` (if any) serves ``/metrics``."""

    endpoint: MetricsEndpoint | None = None


def metrics_runtime(
    prometheus_port: int | None,
    prometheus_host: str = "127.0.0.1",
    build_id: str | None = None,
) -> MetricsRuntime | None:
    """The runtime of a worker that exports metrics: Prometheus on
    ``prometheus_host:prometheus_port/metrics`` (served by a :class:`MetricsEndpoint`,
    started here), else OTLP when :func:`otlp_metrics_url` says so, else None (the
    default runtime: no metrics). ``build_id`` becomes a label of every series."""
    tags = {"build_id": build_id} if build_id else {}
    if prometheus_port:
        core = f"127.0.0.1:{_free_port()}"
        runtime = MetricsRuntime(telemetry=TelemetryConfig(
            logging=_core_logging(),
            global_tags=tags,
            metrics=PrometheusConfig(
                bind_address=core, histogram_bucket_overrides=metrics.BUCKETS),
        ))
        runtime.endpoint = MetricsEndpoint(
            prometheus_port, prometheus_host, f"http://{core}/metrics", build_id).start()
        return runtime
    url = otlp_metrics_url()
    if url:
        log.info("metrics: OTLP to %s (OTEL_METRICS_EXPORTER=otlp)", url)
        return MetricsRuntime(telemetry=TelemetryConfig(
            logging=_core_logging(), global_tags=tags,
            metrics=OpenTelemetryConfig(url=url)))
    return None


def zero_counters(
    runtime: Runtime, namespace: str, clusters: Iterable[str], *,
    task_queue: str = TASK_QUEUE, control_task_queue: str | None = CONTROL_TASK_QUEUE,
) -> int:
    """Export every scheduler counter at 0 for each label value it can take, with the
    labels the workflow's own meter adds (namespace, task_queue, workflow_type), so
    ``rate()`` and ``increase()`` see a series from the first scrape; returns how many
    series."""
    clusters = sorted(clusters)
    n = 0
    for c in metrics.COUNTERS:
        queue = task_queue if c.workflow_type == "PyTorchJobWorkflow" else control_task_queue
        if queue is None:
            continue
        meter = runtime.metric_meter.with_additional_attributes(
            {"namespace": namespace, "task_queue": queue, "workflow_type": c.workflow_type})
        counter = meter.create_counter(c.name, c.help, "1")
        values = {k: (v if k != "cluster" else tuple(clusters)) for k, v in c.labels.items()}
        for labels in _product(values):
            counter.add(0, labels)
            n += 1
    return n


def _product(values: Mapping[str, tuple[str, ...]]) -> list[dict[str, str]]:
    out: list[dict[str, str]] = [{}]
    for key, options in values.items():
        out = [{**o, key: v} for o in out for v in options]
    return out


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def tree_exposition(
    reports: Mapping[str, metrics.TreeReport], build_id: str | None = None
) -> str:
    """The tree gauges of ``reports`` in Prometheus text format."""
    extra = f',build_id="{_label(build_id)}"' if build_id else ""
    lengths, holders, pending = [], [], []
    for wf_id, r in sorted(reports.items()):
        tree = f'tree="{_label(wf_id)}"'
        holders.append(f"fleetq_quota_holders{{{tree}{extra}}} {r.holders}")
        for queue, n in sorted(r.lengths.items()):
            q = f'{tree},queue="{_label(queue)}"{extra}'
            lengths.append(f"fleetq_queue_length{{{q}}} {n}")
            pre = min(r.preempting.get(queue, 0), n)
            for reason, count in (("Preempting", pre), ("QuotaUnavailable", n - pre)):
                pending.append(f'fleetq_pending_jobs{{{q},reason="{reason}"}} {count}')
    out = []
    for name, help_, rows in (
        ("fleetq_queue_length", "jobs waiting per queue", lengths),
        ("fleetq_quota_holders", "jobs holding quota", holders),
        ("fleetq_pending_jobs", "jobs waiting per queue and pending reason", pending),
    ):
        out += [f"# HELP {name} {help_}", f"# TYPE {name} gauge", *rows]
    return "\n".join(out) + "\n"


class MetricsEndpoint(ServerThread):
    """``/metrics`` on ``host:port``: Temporal core's scrape (``core_url``) and the tree
    gauges of the quota workflows this worker runs (``owned``: their workflow ids; None
    until :func:`watch_tree_ownership` first decided, meaning every tree this process
    recorded)."""

    def __init__(self, port: int, host: str, core_url: str,
                 build_id: str | None = None) -> None:
        self.core_url = core_url
        self.build_id = build_id
        self.owned: set[str] | None = None
        endpoint = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path.partition("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                self.reply(200, endpoint.scrape(), "text/plain; version=0.0.4")

        super().__init__(Handler, port, host, "fleetq-metrics")

    def trees(self) -> dict[str, metrics.TreeReport]:
        reports = metrics.tree_reports()
        owned = self.owned
        return reports if owned is None else {k: v for k, v in reports.items() if k in owned}

    def scrape(self) -> str:
        try:
            with urllib.request.urlopen(self.core_url, timeout=5) as resp:
                core = resp.read().decode()
        except OSError as exc:  # core not listening yet: the tree still answers
            core = f"# temporal core metrics unavailable: {exc}\n"
        return core + tree_exposition(self.trees(), self.build_id)


async def runs_current(client: Client, workflow_id: str, run_id: str,
                       version: tuple[str, str] | None) -> bool:
    """Whether ``run_id`` is the running run of ``workflow_id`` and its last workflow
    task completed on ``version`` (deployment, build id; None: an unversioned worker, so
    the workflow must not be on any version)."""
    from temporalio.api.common.v1 import WorkflowExecution
    from temporalio.api.enums.v1 import WorkflowExecutionStatus
    from temporalio.api.workflowservice.v1 import DescribeWorkflowExecutionRequest

    resp = await client.workflow_service.describe_workflow_execution(
        DescribeWorkflowExecutionRequest(
            namespace=client.namespace, execution=WorkflowExecution(workflow_id=workflow_id)))
    info = resp.workflow_execution_info
    if info.execution.run_id != run_id or (
        info.status != WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_RUNNING
    ):
        return False
    on = info.versioning_info.deployment_version
    where = (on.deployment_name, on.build_id) if on.build_id else None
    return where == version


async def watch_tree_ownership(
    endpoint: MetricsEndpoint, client: Client, version: tuple[str, str] | None,
    every: float = OWNERSHIP_SECONDS,
) -> None:
    """Every ``every`` seconds, set ``endpoint.owned`` to the quota workflows this process
    recorded whose current run it ran on the version the workflow is on now; a tree
    whose run ended, moved on (continue-as-new elsewhere) or upgraded to another version
    is dropped (and forgotten once its run ended)."""
    while True:
        owned: set[str] = set()
        for wf_id, report in metrics.tree_reports().items():
            try:
                if await runs_current(client, wf_id, report.run_id, version):
                    owned.add(wf_id)
            except Exception as exc:  # server briefly unavailable: not claimed meanwhile
                log.debug("tree ownership of %s: %s", wf_id, exc)
        endpoint.owned = owned
        await asyncio.sleep(every)
