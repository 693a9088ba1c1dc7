"""The fleetq worker: job workflows and every activity on the ``fleetq`` task queue, and
the control plane (quota semaphore, fleet registry) on ``fleetq-control``.

``python worker.py`` (or ``fleetq worker``) connects with Temporal's standard client
configuration, reads member clusters from ``FLEETQ_CONFIG`` and shuts down gracefully on
SIGTERM/SIGINT; any number of workers can share the queues. The control plane has its own
task queue and thread so the serial quota workflow never queues behind job tasks
(docs/decisions/007; figures: BENCHMARKS.md). With ``--versioning`` both poll as one
version of the Worker Deployment ``fleetq``, job workflows Pinned and control workflows
Auto-Upgrade as each worker's default behaviour (docs/deploy.md "Versioned workers",
"First deploy").
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import py_compile
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import typer
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client
from temporalio.common import VersioningBehavior, WorkerDeploymentVersion
from temporalio.worker import (
    PollerBehaviorAutoscaling,
    Worker,
    WorkerDeploymentConfig,
)
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from activities.fleet import Fleet
from activities.scheduling import SchedulingActivities
from fleetq.client.connection import (
    connect,
    current_build,
    describe_deployment,
    has_search_attributes,
    set_current_version,
)
from fleetq.naming import CONTROL_TASK_QUEUE, TASK_QUEUE

try:  # (SDK-private names: without them, the SDK's own runner; see fleetq.runtime.sandbox)
    from fleetq.runtime.sandbox import FleetqSandboxRunner
except ImportError:  # pragma: no cover - another SDK version
    FleetqSandboxRunner = None  # type: ignore[assignment,misc]
from fleetq.runtime.telemetry import (
    MetricsRuntime,
    metrics_runtime,
    watch_tree_ownership,
    zero_counters,
)
from fleetq.runtime.worker_health import DEFAULT_STALL_SECONDS, HealthServer, WorkerHealth
from workflows import ALL_WORKFLOWS

log = logging.getLogger("fleetq.worker")

#: Worker Deployment name of every fleetq worker unless --deployment-name / env says
DEFAULT_DEPLOYMENT_NAME = "fleetq"
#: seconds a worker lets in-flight tasks finish on SIGTERM; the Kubernetes
#: terminationGracePeriodSeconds in deploy/ must exceed it (tests/deploy checks)
GRACEFUL_SHUTDOWN_SECONDS = 10.0
#: the longest a SIGTERM'd worker takes to exit: the job worker's graceful shutdown, then
#: the control plane's, then closing the member caches (a few seconds)
SHUTDOWN_BUDGET_SECONDS = 2 * GRACEFUL_SHUTDOWN_SECONDS + 5
_TRUE = {"1", "true", "yes", "on"}
_PROJECT_DIR = Path(__file__).resolve().parent


def deployment_name(flag: str | None = None) -> str:
    """The Worker Deployment name: ``flag``, else FLEETQ_DEPLOYMENT_NAME, else
    TEMPORAL_DEPLOYMENT_NAME (set by the Temporal Worker Controller), else ``fleetq``.
    Temporal joins it to the build id with a dot, so it may not contain one."""
    name = (
        flag
        or os.environ.get("FLEETQ_DEPLOYMENT_NAME")
        or os.environ.get("TEMPORAL_DEPLOYMENT_NAME")
        or DEFAULT_DEPLOYMENT_NAME
    )
    if "." in name:
        raise ValueError(f"deployment name {name!r} must not contain '.'")
    return name


def versioning_enabled(flag: bool | None = None) -> bool:
    """``--versioning``, else FLEETQ_WORKER_VERSIONING=1; off by default."""
    if flag is not None:
        return flag
    return os.environ.get("FLEETQ_WORKER_VERSIONING", "").strip().lower() in _TRUE


def package_version() -> str:
    try:
        return importlib.metadata.version("fleetq")
    except importlib.metadata.PackageNotFoundError:
        return "0.0.0"


def source_revision(root: Path = _PROJECT_DIR) -> str:
    """``git describe --always --dirty`` of the checkout the worker runs from, else
    ``src`` plus a hash of the workflow sources (an installed package, an image)."""
    if (root / ".git").exists():
        try:
            out = subprocess.run(
                ["git", "-C", str(root), "describe", "--always", "--dirty", "--abbrev=12"],
                capture_output=True, text=True, timeout=5, check=True,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out = ""
        if out:
            return out
    return "src" + workflow_sources_hash(root)[:12]


def workflow_sources_hash(root: Path = _PROJECT_DIR) -> str:
    """sha256 over the workflow code and the pure core it runs (``workflows/``,
    ``fleetq/*.py``): what must not change under a running Pinned workflow."""
    digest = hashlib.sha256()
    files = sorted([*(root / "workflows").glob("*.py"), *(root / "fleetq").glob("*.py")])
    for f in files:
        digest.update(f.relative_to(root).as_posix().encode() + b"\0")
        digest.update(f.read_bytes())
    return digest.hexdigest()


def build_id(override: str | None = None) -> str:
    """``override``, else FLEETQ_BUILD_ID, else TEMPORAL_WORKER_BUILD_ID (set by the
    Temporal Worker Controller), else ``<package version>-<source revision>`` kept to what
    a Kubernetes label value allows (the Deployment carries it as one)."""
    raw = (
        override
        or os.environ.get("FLEETQ_BUILD_ID")
        or os.environ.get("TEMPORAL_WORKER_BUILD_ID")
    )
    if raw:
        return raw
    bid = re.sub(r"[^A-Za-z0-9_.-]", "-", f"{package_version()}-{source_revision()}")
    return bid[:63].strip("-_.")


def with_behavior(
    config: WorkerDeploymentConfig | None, behavior: VersioningBehavior
) -> WorkerDeploymentConfig | None:
    """``config`` with ``behavior`` as the default of the workflows its worker runs."""
    if config is None:
        return None
    return dataclasses.replace(config, default_versioning_behavior=behavior)


#: the job worker's workflows end on the version that started them (PyTorchJobWorkflow)
JOB_BEHAVIOR = VersioningBehavior.PINNED
#: the control plane's follow the current version (QuotaTreeWorkflow, FleetRegistryWorkflow)
CONTROL_BEHAVIOR = VersioningBehavior.AUTO_UPGRADE


def deployment_config(
    *, enabled: bool | None = None, name: str | None = None, build: str | None = None
) -> WorkerDeploymentConfig | None:
    """The WorkerDeploymentConfig of a versioned worker, or None when versioning is off."""
    if not versioning_enabled(enabled):
        return None
    return WorkerDeploymentConfig(
        version=WorkerDeploymentVersion(deployment_name(name), build_id(build)),
        use_worker_versioning=True,
    )


#: what the sandbox takes from the worker instead of executing again for every workflow
#: run: the whole ``workflows`` package. Its modules keep no state of their own (class
#: definitions, constants; ``workflows.metrics``' registry is the host's on purpose), so
#: re-executing them per run isolated nothing, and it was most of what creating a job's
#: sandbox cost (``workflow_runner``; docs/decisions/018). And ``jsonpath_ng``, whose PLY
#: lexer looks its own modules up in ``sys.modules`` (statePreservation's rules): the
#: sandbox's ``sys.modules`` answers for a passed-through package's modules on demand.
SANDBOX_PASSTHROUGH = ("workflows", "jsonpath_ng")


def workflow_runner(extra_passthrough: Sequence[str] = ()) -> SandboxedWorkflowRunner:
    """Temporal's sandbox with its default restrictions, plus SANDBOX_PASSTHROUGH (and
    ``extra_passthrough``: the benchmarks' baseline workflows, so they pay what a job
    pays), its snippets compiled once (FleetqSandboxRunner).

    The SDK's sandbox re-executes a workflow's module, and every module it imports that
    is not passed through, for each workflow run: for a job, ~1,300 lines of class
    definitions and their ``@workflow.defn`` inspection, 6.7 ms of CPU per run against
    0.2 ms passed through. Still checked: the sandbox's runtime restrictions; and every
    recorded history also replays on the SDK's strict sandbox, which executes the
    workflow modules again under its import restrictions, beside a static check of the
    workflow modules' calls (tests/workflows/test_worker_sandbox.py)."""
    restrictions = SandboxRestrictions.default.with_passthrough_modules(
        *SANDBOX_PASSTHROUGH, *extra_passthrough)
    if FleetqSandboxRunner is None:
        return SandboxedWorkflowRunner(restrictions=restrictions)
    return FleetqSandboxRunner(restrictions=restrictions)


def warm_workflow_bytecode(workflows: Iterable[type]) -> list[str]:
    """Write the bytecode cache of every loaded module of the packages that define
    ``workflows`` (the modules themselves, their parent packages and their sibling
    modules) when it is missing or stale; returns the files written.

    Temporal's sandbox re-imports a workflow's module, and the siblings it imports that
    are not passed through, for every workflow run: since SANDBOX_PASSTHROUGH covers
    ``workflows``, that is the extra workflows a worker is built with (the benchmarks'
    baselines). With a fresh bytecode cache that is
    an unmarshal; without one (PYTHONDONTWRITEBYTECODE, an editable install) it is a
    compile of the whole module each time, which measured as the largest single cost of
    a job in ``fleetq bench e2e`` (and, for ``workflows/copies.py``, which this function
    did not cover at first, 40 % of creating a job's sandbox). Best effort: a read-only
    install simply keeps compiling.
    """
    written = []
    names: set[str] = set()
    packages: set[str] = set()
    for wf in workflows:
        parts = wf.__module__.split(".")
        names.update(".".join(parts[: i + 1]) for i in range(len(parts)))
        if len(parts) > 1:
            packages.add(".".join(parts[:-1]))
    names.update(
        name
        for name in list(sys.modules)
        if name.rpartition(".")[0] in packages
    )
    for name in sorted(names):
        source = getattr(sys.modules.get(name), "__file__", None)
        if not source or not source.endswith(".py"):
            continue
        cached = importlib.util.cache_from_source(source)
        try:
            if _bytecode_fresh(source, cached):
                continue
            py_compile.compile(source, cfile=cached, doraise=True)
        except (OSError, py_compile.PyCompileError) as exc:
            log.debug("bytecode cache for %s not written: %s", source, exc)
            continue
        written.append(cached)
    return written


def _bytecode_fresh(source: str, cached: str) -> bool:
    """Whether ``cached`` is what the import system would accept for ``source``: this
    interpreter's magic number and the source's mtime and size (PEP 552 timestamp pyc)."""
    try:
        with open(cached, "rb") as f:
            head = f.read(16)
    except OSError:
        return False
    st = os.stat(source)
    return (
        head[:4] == importlib.util.MAGIC_NUMBER
        and int.from_bytes(head[4:8], "little") == 0
        and int.from_bytes(head[8:12], "little") == int(st.st_mtime) & 0xFFFFFFFF
        and int.from_bytes(head[12:16], "little") == st.st_size & 0xFFFFFFFF
    )


class ControlPlane:
    """A worker for the quota and registry workflows on ``task_queue``, in a thread of
    its own with its own event loop and its own connection (same server, namespace,
    credentials and data converter as ``client``)."""

    def __init__(
        self,
        client: Client,
        task_queue: str = CONTROL_TASK_QUEUE,
        extra_workflows: Sequence[type] = (),
        deployment: WorkerDeploymentConfig | None = None,
        health: WorkerHealth | None = None,
        purge_for_preemption: Callable[..., Any] | None = None,
    ) -> None:
        self._client = client
        #: the job worker's ``purge_for_preemption`` (its fleet), the quota workflow's
        #: local activity (docs/decisions/023); None: a victim is left to purge itself
        self._purge_for_preemption = purge_for_preemption
        self.task_queue = task_queue
        self._extra_workflows = list(extra_workflows)
        self._deployment = deployment
        self._health = health
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    async def _main(self) -> None:
        from temporalio.service import ServiceClient

        from workflows.fleet_registry import FleetRegistryWorkflow
        from workflows.quota_tree import QuotaTreeWorkflow

        config = self._client.config()
        service = await ServiceClient.connect(self._client.service_client.config)
        client = Client(
            service,
            namespace=self._client.namespace,
            data_converter=self._client.data_converter,
            interceptors=config["interceptors"],
        )
        # the holder check only needs a client; it never touches member clusters
        checks = SchedulingActivities(client, _no_fleet)
        worker = Worker(
            client,
            task_queue=self.task_queue,
            workflows=[QuotaTreeWorkflow, FleetRegistryWorkflow, *self._extra_workflows],
            activities=[checks.check_holders, *(
                [self._purge_for_preemption] if self._purge_for_preemption else [])],
            activity_executor=concurrent.futures.ThreadPoolExecutor(
                max_workers=4, thread_name_prefix="fleetq-control-activity"),
            graceful_shutdown_timeout=timedelta(seconds=GRACEFUL_SHUTDOWN_SECONDS),
            deployment_config=with_behavior(self._deployment, CONTROL_BEHAVIOR),
            workflow_runner=workflow_runner(),
        )
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with worker:
            beat = (
                asyncio.create_task(self._health.heartbeat("control"))
                if self._health is not None
                else None
            )
            self._ready.set()
            await self._stop.wait()
            if beat is not None:
                beat.cancel()
                self._health.forget("control")  # type: ignore[union-attr]

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # surfaced by start() or logged at stop()
            self._error = exc
        finally:
            self._ready.set()

    def start(self, timeout: float = 60.0) -> None:
        self._thread = threading.Thread(target=self._run, name="fleetq-control", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"control-plane worker on {self.task_queue} did not start")
        if self._error is not None:
            raise RuntimeError(f"control-plane worker failed: {self._error}") from self._error

    def stop(self, timeout: float = 30.0) -> None:
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # loop already gone
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout)
        if self._error is not None:
            log.error("control-plane worker ended with an error: %s", self._error)


def _no_fleet() -> Fleet:
    raise RuntimeError("the control-plane worker does not talk to member clusters")


class FleetqWorker:
    """The job worker plus the control plane; ``async with`` runs both."""

    def __init__(self, jobs: Worker, control: ControlPlane | None) -> None:
        self.jobs = jobs
        self.control = control

    async def __aenter__(self) -> FleetqWorker:
        if self.control is not None:
            await asyncio.to_thread(self.control.start)
        try:
            await self.jobs.__aenter__()
        except BaseException:
            if self.control is not None:
                await asyncio.to_thread(self.control.stop)
            raise
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self.jobs.__aexit__(*exc)
        finally:
            if self.control is not None:
                await asyncio.to_thread(self.control.stop)


def build_worker(
    client: Client,
    activities: SchedulingActivities,
    *,
    task_queue: str = TASK_QUEUE,
    control_task_queue: str | None = CONTROL_TASK_QUEUE,
    max_concurrent_activities: int = 200,
    executor: concurrent.futures.Executor | None = None,
    extra_workflows: Sequence[type] = (),
    extra_activities: Sequence[Any] = (),
    extra_control_workflows: Sequence[type] = (),
    workflows_override: Sequence[type] | None = None,
    deployment: WorkerDeploymentConfig | None = None,
    health: WorkerHealth | None = None,
    **kwargs: Any,
) -> FleetqWorker:
    """The job worker on ``task_queue`` (every workflow type is registered there too, so
    a quota or registry workflow started there still runs) and, unless
    ``control_task_queue`` is None, the control plane. ``deployment`` makes both poll as
    one Worker Deployment Version; ``workflows_override`` replaces the job worker's
    workflow list (the rollout test's deliberately incompatible version)."""
    executor = executor or concurrent.futures.ThreadPoolExecutor(
        max_workers=max_concurrent_activities, thread_name_prefix="fleetq-activity"
    )
    base = list(ALL_WORKFLOWS) if workflows_override is None else list(workflows_override)
    workflows = [*base, *extra_workflows]
    warm_workflow_bytecode(workflows)
    kwargs.setdefault("workflow_runner", workflow_runner())
    # Pollers that scale with the load: each poll of a task costs the server a database
    # transaction before it answers, so a fixed 5 pollers cap the tasks a worker takes at
    # ~5 / transaction time (at 5 ms database latency, 6 jobs/s against 9.9 with these;
    # BENCHMARKS §11, third pass).
    for tasks in ("workflow", "activity"):
        if f"max_concurrent_{tasks}_task_polls" not in kwargs:
            kwargs.setdefault(f"{tasks}_task_poller_behavior", PollerBehaviorAutoscaling())
    jobs = Worker(
        client,
        task_queue=task_queue,
        workflows=workflows,
        activities=[*activities.all(), *extra_activities],
        activity_executor=executor,
        max_concurrent_activities=max_concurrent_activities,
        graceful_shutdown_timeout=timedelta(seconds=GRACEFUL_SHUTDOWN_SECONDS),
        deployment_config=with_behavior(deployment, JOB_BEHAVIOR),
        **kwargs,
    )
    control = (
        ControlPlane(client, control_task_queue, extra_control_workflows, deployment, health,
                     purge_for_preemption=activities.purge_for_preemption)
        if control_task_queue
        else None
    )
    return FleetqWorker(jobs, control)


async def polls(client: Client, task_queue: str, identity: str) -> bool:
    """Whether the server lists a workflow poller of ``identity`` on ``task_queue``."""
    resp = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=task_queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        )
    )
    return any(p.identity == identity for p in resp.pollers)


def members_warm(fleet: Fleet) -> tuple[bool, str]:
    """Whether every member's capacity cache finished its first LIST+WATCH sync."""
    cold = sorted(
        name
        for name, member in fleet.clusters.items()
        if not getattr(getattr(member, "cache", None), "synced", True)
    )
    if cold:
        return False, "capacity cache not synced: " + ", ".join(cold)
    return True, f"{len(fleet.clusters)} member caches synced"


async def watch_readiness(
    health: WorkerHealth,
    client: Client,
    activities: SchedulingActivities,
    task_queues: Sequence[str],
    *,
    identity: str | None = None,
    every: float = 0.5,
    on_fleet: Callable[[Fleet], None] | None = None,
) -> None:
    """Set the readiness checks ``task-queue:<name>`` (the server lists this worker's
    poller) and ``members`` (all capacity caches synced) as they become true; returns
    when all are. The fleet is opened here, at start, so its caches warm before the
    first job (``on_fleet`` is called with it once open)."""
    who = identity or client.identity
    pending = {f"task-queue:{q}": q for q in task_queues}
    health.require(*pending, "members")
    fleet: Fleet | None = None
    members_ok = False
    while pending or not members_ok:
        for check, queue in list(pending.items()):
            try:
                if await polls(client, queue, who):
                    health.set(check, True, f"polled by {who}")
                    del pending[check]
                else:
                    health.set(check, False, f"no poller {who} on {queue} yet")
            except Exception as exc:  # the server may be briefly unavailable
                health.set(check, False, f"describe task queue: {exc}")
        if not members_ok:
            try:
                if fleet is None:
                    fleet = await asyncio.to_thread(lambda: activities.fleet)
                    if on_fleet is not None:
                        on_fleet(fleet)
                members_ok, detail = members_warm(fleet)
            except Exception as exc:  # a broken fleet config stays unready, and says why
                members_ok, detail = False, f"fleet: {exc}"
            health.set("members", members_ok, detail)
        if pending or not members_ok:
            await asyncio.sleep(every)


def set_current_default(flag: bool | None = None) -> bool:
    """``--set-current-if-none``, else FLEETQ_SET_CURRENT_IF_NONE, else on — except
    under the Temporal Worker Controller (TEMPORAL_WORKER_BUILD_ID set), which manages
    the deployment's versions itself."""
    if flag is not None:
        return flag
    env = os.environ.get("FLEETQ_SET_CURRENT_IF_NONE")
    if env is not None:
        return env.strip().lower() in _TRUE
    return not os.environ.get("TEMPORAL_WORKER_BUILD_ID")


async def version_has_queues(client: Client, name: str, build: str,
                             task_queues: Sequence[str]) -> bool:
    """Whether the server lists every one of ``task_queues`` in version ``name.build``
    (a version made current before its second queue registered would route that
    queue's tasks nowhere until it does)."""
    from temporalio.api.deployment.v1 import WorkerDeploymentVersion as VersionProto
    from temporalio.api.workflowservice.v1 import DescribeWorkerDeploymentVersionRequest

    resp = await client.workflow_service.describe_worker_deployment_version(
        DescribeWorkerDeploymentVersionRequest(
            namespace=client.namespace,
            deployment_version=VersionProto(deployment_name=name, build_id=build)))
    have = {q.name for q in resp.worker_deployment_version_info.task_queue_infos}
    return all(q in have for q in task_queues)


async def watch_deployment(
    health: WorkerHealth,
    client: Client,
    deployment: WorkerDeploymentConfig,
    task_queues: Sequence[str],
    *,
    set_current: bool = True,
    every: float = 1.0,
) -> None:
    """The readiness check ``deployment``: failing while the Worker Deployment has no
    current version (a versioned worker then receives nothing, and every client call
    that waits on a worker would hang). With ``set_current``, a worker that finds its
    deployment without a current version makes its own build current, once the server
    lists both its task queues in the version (compare-and-set with the deployment's
    conflict token: of several first builds starting at once, one wins; never when a
    manager such as the Temporal Worker Controller owns the deployment, never while some
    version is current: a rollout stays the runbook's). Returns once it is ready."""
    name = deployment.version.deployment_name
    build = deployment.version.build_id
    health.require("deployment")
    while True:
        try:
            desc = await describe_deployment(client, name)
            current = current_build(desc) if desc is not None else None
            why = "no versioned worker registered yet"
            if desc is not None and current is None:
                manager = desc.worker_deployment_info.manager_identity
                why = (f"deployment {name} has no current version: run fleetq setup "
                       f"--set-current {build}")
                if not set_current:
                    pass
                elif manager and manager != client.identity:
                    why += f" (or let its manager {manager} do it)"
                elif await version_has_queues(client, name, build, task_queues):
                    current = await set_current_version(client, name, build,
                                                        only_if_none=True)
                    if current == build:
                        log.info("deployment %s had no current version: made this worker's "
                                 "build %s current", name, build)
                else:
                    why = f"waiting for version {name}.{build} to list {', '.join(task_queues)}"
            if current is not None:
                health.set("deployment", True, f"current version {name}.{current}")
                return
            health.set("deployment", False, why)
        except Exception as exc:  # the server may be briefly unavailable
            health.set("deployment", False, f"describe deployment {name}: {exc}")
        await asyncio.sleep(every)


async def run_worker(
    *,
    address: str | None = None,
    namespace: str | None = None,
    task_queue: str = TASK_QUEUE,
    control_task_queue: str | None = CONTROL_TASK_QUEUE,
    fleet_config: str | None = None,
    prometheus_port: int | None = None,
    ready: asyncio.Event | None = None,
    deployment: WorkerDeploymentConfig | None = None,
    prometheus_host: str = "127.0.0.1",
    health_port: int | None = None,
    health_host: str = "127.0.0.1",
    health: WorkerHealth | None = None,
    stop: asyncio.Event | None = None,
    set_current: bool | None = None,
) -> None:
    """Run the worker until SIGTERM/SIGINT (or ``stop``). With ``health_port``, serve
    /readyz and /livez there (``health`` is the state behind them; one is made if
    not given). A versioned worker (``deployment``) is ready only once its deployment
    has a current version, and makes its own build current when there is none
    (``set_current``, default :func:`set_current_default`; :func:`watch_deployment`)."""
    kwargs: dict[str, Any] = {}
    build = deployment.version.build_id if deployment is not None else build_id()
    runtime = metrics_runtime(prometheus_port, prometheus_host, build_id=build)
    if runtime is not None:
        kwargs["runtime"] = runtime
    client = await connect(address, namespace, bounded_waits=False, **kwargs)
    path = fleet_config or os.environ.get("FLEETQ_CONFIG")
    fleet_source = (lambda: Fleet.from_config(path)) if path else Fleet.from_env
    activities = SchedulingActivities(
        client, fleet_source, search_attributes=await has_search_attributes(client)
    )
    health = health or WorkerHealth()
    worker = build_worker(
        client,
        activities,
        task_queue=task_queue,
        control_task_queue=control_task_queue,
        deployment=deployment,
        health=health,
    )
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread
            loop.add_signal_handler(sig, stop.set)
    log.info(
        "fleetq worker polling %s%s on %s (namespace %s), %s",
        task_queue,
        f" and {control_task_queue}" if control_task_queue else "",
        client.service_client.config.target_host,
        client.namespace,
        f"version {deployment.version.to_canonical_string()}"
        if deployment is not None
        else "unversioned",
    )
    queues = [task_queue, *([control_task_queue] if control_task_queue else [])]
    # every check is registered before /readyz answers (each watcher sets its own)
    health.require(*(f"task-queue:{q}" for q in queues), "members",
                   *(["deployment"] if deployment is not None else []))
    server = HealthServer(health, health_port, health_host).start() if health_port else None

    def zero(fleet: Fleet) -> None:
        if runtime is not None:
            zero_counters(runtime, client.namespace, fleet.clusters, task_queue=task_queue,
                          control_task_queue=control_task_queue)

    tasks: list[asyncio.Task[Any]] = []
    try:
        async with worker:
            if ready is not None:
                ready.set()
            tasks.append(asyncio.create_task(health.heartbeat("main")))
            tasks.extend(_start_watchers(health, client, activities, queues, zero,
                                         deployment, runtime, set_current))
            await stop.wait()
            health.stopping()
            for t in tasks[1:]:
                t.cancel()
            log.info("shutting down: finishing in-flight tasks")
        tasks[0].cancel()
    finally:
        _release(tasks, server, runtime, activities)


def _start_watchers(
    health: WorkerHealth,
    client: Client,
    activities: SchedulingActivities,
    queues: list[str],
    on_fleet: Callable[[Fleet], None],
    deployment: WorkerDeploymentConfig | None,
    runtime: MetricsRuntime | None,
    set_current: bool | None,
) -> list[asyncio.Task[Any]]:
    """Start the background checks a running worker keeps: readiness (task queues and
    members), its deployment's current version when versioned, and metrics-tree
    ownership when it serves Prometheus metrics."""
    tasks = [asyncio.create_task(
        watch_readiness(health, client, activities, queues, on_fleet=on_fleet)
    )]
    if deployment is not None:
        tasks.append(asyncio.create_task(watch_deployment(
            health, client, deployment, queues,
            set_current=set_current_default(set_current))))
    if isinstance(runtime, MetricsRuntime) and runtime.endpoint is not None:
        version = (
            (deployment.version.deployment_name, deployment.version.build_id)
            if deployment is not None else None
        )
        tasks.append(asyncio.create_task(
            watch_tree_ownership(runtime.endpoint, client, version)))
    return tasks


def _release(
    tasks: list[asyncio.Task[Any]],
    server: HealthServer | None,
    runtime: MetricsRuntime | None,
    activities: SchedulingActivities,
) -> None:
    """Stop what a worker started: its background tasks, health server, metrics
    endpoint and the fleet's member connections."""
    for t in tasks:
        t.cancel()
    if server is not None:
        server.stop()
    if isinstance(runtime, MetricsRuntime) and runtime.endpoint is not None:
        runtime.endpoint.stop()
    if activities._fleet is not None:
        activities._fleet.close()


@dataclasses.dataclass(frozen=True)
class WorkerArgs:
    """The worker's command line, parsed (deploy/ manifests are checked against it; the
    defaults are the command's, below)."""

    address: str | None
    namespace: str | None
    task_queue: str
    control_task_queue: str
    no_control: bool
    fleet_config: str | None
    prometheus_port: int | None
    prometheus_host: str
    health_port: int | None
    health_host: str
    liveness_stall_seconds: float
    versioning: bool | None
    deployment_name: str | None
    build_id: str | None
    set_current_if_none: bool | None = None


_cli = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)


@_cli.command(help="The fleetq worker: job workflows and activities on the fleetq task "
                   "queue, the quota and registry workflows on fleetq-control.")
def _options(
    ctx: typer.Context,
    address: str | None = typer.Option(
        None, "--address", help="Temporal frontend (default: TEMPORAL_ADDRESS)"),
    namespace: str | None = typer.Option(
        None, "--namespace", help="Temporal namespace (default: TEMPORAL_NAMESPACE)"),
    task_queue: str = typer.Option(TASK_QUEUE, "--task-queue"),
    control_task_queue: str = typer.Option(
        CONTROL_TASK_QUEUE, "--control-task-queue",
        help="task queue of the quota and registry workflows"),
    no_control: bool = typer.Option(
        False, "--no-control", help="do not serve the control task queue (another worker does)"),
    fleet_config: str | None = typer.Option(
        None, "--fleet-config", help="fleet config file (default: FLEETQ_CONFIG)"),
    prometheus_port: int | None = typer.Option(
        None, "--prometheus-port",
        help="serve Temporal's and fleetq's metrics on HOST:PORT/metrics"),
    prometheus_host: str = typer.Option(
        "127.0.0.1", "--prometheus-host",
        help="address of the metrics endpoint (0.0.0.0 in a pod)"),
    health_port: int | None = typer.Option(
        None, "--health-port", help="serve /readyz and /livez on HOST:PORT"),
    health_host: str = typer.Option(
        "127.0.0.1", "--health-host", help="address of the health endpoints (0.0.0.0 in a pod)"),
    liveness_stall_seconds: float = typer.Option(
        DEFAULT_STALL_SECONDS, "--liveness-stall-seconds",
        help="/livez fails once an event loop has been stuck this long"),
    versioning: bool | None = typer.Option(
        None, "--versioning/--no-versioning",
        help="poll as a Worker Deployment Version (default: FLEETQ_WORKER_VERSIONING=1, "
             "else off)"),
    deployment_name: str | None = typer.Option(
        None, "--deployment-name",
        help=f"Worker Deployment name (default: FLEETQ_DEPLOYMENT_NAME, else "
             f"{DEFAULT_DEPLOYMENT_NAME})"),
    build_id: str | None = typer.Option(
        None, "--build-id",
        help="build id (default: FLEETQ_BUILD_ID, else <version>-<git describe or source "
             "hash>)"),
    set_current_if_none: bool | None = typer.Option(
        None, "--set-current-if-none/--no-set-current-if-none",
        help="with --versioning: make this build current when the deployment has no "
             "current version (default: FLEETQ_SET_CURRENT_IF_NONE, else on unless the "
             "Temporal Worker Controller runs it)"),
) -> None:
    ctx.obj.append(WorkerArgs(
        address=address, namespace=namespace, task_queue=task_queue,
        control_task_queue=control_task_queue, no_control=no_control,
        fleet_config=fleet_config, prometheus_port=prometheus_port,
        prometheus_host=prometheus_host, health_port=health_port, health_host=health_host,
        liveness_stall_seconds=liveness_stall_seconds, versioning=versioning,
        deployment_name=deployment_name, build_id=build_id,
        set_current_if_none=set_current_if_none))


def parse_args(argv: Sequence[str] | None = None, prog_name: str | None = None) -> WorkerArgs:
    """The worker's options from ``argv`` (default: the process's arguments). Like any
    command line it exits after ``--help`` (0) and on a bad option (2, with the usage,
    which names ``prog_name``: default the program's file name)."""
    parsed: list[WorkerArgs] = []
    try:
        _cli(args=None if argv is None else list(argv), obj=parsed, prog_name=prog_name)
    except SystemExit:
        if not parsed:
            raise
    if not parsed:  # pragma: no cover - the command line always exits
        raise SystemExit(2)
    return parsed[0]


def main(argv: Sequence[str] | None = None, prog_name: str | None = None) -> int:
    args = parse_args(argv, prog_name)
    logging.basicConfig(
        level=os.environ.get("FLEETQ_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # the Temporal Worker Controller passes the frontend as TEMPORAL_HOST_PORT
    address = args.address or (
        None if os.environ.get("TEMPORAL_ADDRESS") else os.environ.get("TEMPORAL_HOST_PORT")
    )
    asyncio.run(
        run_worker(
            address=address,
            namespace=args.namespace,
            task_queue=args.task_queue,
            control_task_queue=None if args.no_control else args.control_task_queue,
            fleet_config=args.fleet_config,
            prometheus_port=args.prometheus_port,
            prometheus_host=args.prometheus_host,
            health_port=args.health_port,
            health_host=args.health_host,
            health=WorkerHealth(stall_seconds=args.liveness_stall_seconds),
            deployment=deployment_config(
                enabled=args.versioning, name=args.deployment_name, build=args.build_id
            ),
            set_current=args.set_current_if_none,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
