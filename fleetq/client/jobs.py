"""PyTorchJobs as the fleet runs them: one ``pytorchjob/<ns>/<name>`` workflow each.

Starting a job starts its workflow (with the Web UI's summary, details and search
attributes); a new submission under the name of a finished job is a new run. Reading one
asks its ``status`` query while it runs and its result once it ended (a cancelled
workflow, or a purge run, is a deleted job: gone); listing reads Temporal visibility and
queries the jobs concurrently, bounded. Deleting a running job cancels its workflow, which
purges every member copy and returns the quota; deleting a finished one starts the purge
run under its workflow id (``workflows/job_purge.py``). Suspend and resume are signals.
Reading and listing load only the view (:mod:`fleetq.job_view`); the models and the
admission core are imported where a job is started or its queue position asked.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from temporalio.client import (
    Client,
    WorkflowExecution,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
)
from temporalio.common import (
    SearchAttributeKey,
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import ApplicationError, TemporalError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from fleetq.client.connection import has_search_attributes
from fleetq.client.errors import ClientError, InvalidInput, NotFound
from fleetq.client.job_reads import (  # noqa: F401 - JOB_RESOURCE: re-exported
    JOB_RESOURCE,
    MAX_CONCURRENT_QUERIES,
    Gone,
    is_waiting,
    latest_runs,
    queue_label,
    read_view,
)
from fleetq.client.registry import QUERY_TIMEOUT, get_registry
from fleetq.job_view import JobView
from fleetq.naming import (
    JOB_PURGE_WORKFLOW,
    JOB_WORKFLOW,
    SA_CLUSTER,
    SA_JOB,
    SA_NAMESPACE,
    SA_PRIORITY,
    SA_STATE,
    TASK_QUEUE,
    job_workflow_id,
    tree_workflow_id,
)
from fleetq.resources import format_resources

if TYPE_CHECKING:  # the models and the admission core: only where a job is started or
    # its queue position asked (fleetq get pytorchjob reads views only)
    from fleetq.admission import WaitInfo
    from fleetq.models import Gang, PyTorchJob


# --------------------------------------------------------------------------- start


def gang_of(job: PyTorchJob, priority_classes: dict[str, int] | None = None) -> Gang:
    """:func:`fleetq.models.gang_of`, imported when a job is started."""
    from fleetq.models import gang_of as of

    return of(job, priority_classes)


def job_summary(job: PyTorchJob, priority_classes: dict[str, int] | None = None) -> str:
    """The workflow's static summary in the Web UI, e.g. ``PyTorchJob default/pytorch-test:
    1 master + 2 workers, cpu 4.01, memory 4Gi``."""
    return gang_of(job, priority_classes).summary_line(job.metadata.namespace, job.metadata.name)


def job_details(job: PyTorchJob, priority_classes: dict[str, int] | None = None) -> str:
    """The workflow's static details in the Web UI (Markdown): the job's priority and
    what gives it, then the gang as a table, one row a role, spaced so the UI's renderer
    draws it legibly (:func:`~fleetq.admission.markdown_row`)."""
    from fleetq.admission import markdown_header, markdown_row

    gang = gang_of(job, priority_classes)
    requests: dict[str, str] = {}
    for pod in gang.pods:
        requests.setdefault(pod.role, format_resources(pod.requests) or "-")
    return "\n".join([
        f"**Priority {gang.priority}** ({priority_source(job, priority_classes)})",
        "",
        *markdown_header(("role", "replicas", "requests per pod"), "lrl"),
        *(markdown_row((role, count, requests.get(role, "-")))
          for role, count in gang.declared_role_counts().items()),
        "",
        f"{gang.minimum_line().capitalize()}: placed on one member cluster or not at all.",
    ])


def _templates(job: PyTorchJob) -> list[dict[str, Any]]:
    return [job.spec.pytorchReplicaSpecs[role].template.spec for role in job.roles()]


def named_priority_classes(job: PyTorchJob) -> list[str]:
    """The PriorityClasses the job names: ``runPolicy.schedulingPolicy.priorityClass``,
    then each pod template's ``priorityClassName`` (Master's first)."""
    sp = job.scheduling_policy
    names = [sp.priorityClass] if sp is not None and sp.priorityClass else []
    for spec in _templates(job):
        pcn = spec.get("priorityClassName")
        if isinstance(pcn, str) and pcn and pcn not in names:
            names.append(pcn)
    return names


def priority_source(job: PyTorchJob, priority_classes: dict[str, int] | None = None) -> str:
    """What gives the job its priority, in the order :func:`~fleetq.models.job_priority`
    takes it: ``PriorityClass high``, ``spec.priority``, or ``no PriorityClass``; a
    named class the fleet does not know is said (it counts as absent)."""
    from fleetq.models import BUILTIN_PRIORITY_CLASSES

    known = {**BUILTIN_PRIORITY_CLASSES, **(priority_classes or {})}
    sp = job.scheduling_policy
    if sp is not None and sp.priorityClass and sp.priorityClass in known:
        return f"PriorityClass {sp.priorityClass}, from runPolicy.schedulingPolicy"
    for name in named_priority_classes(job):
        if name in known:
            return f"PriorityClass {name}"
    unknown = ", ".join(named_priority_classes(job))
    if any(isinstance(spec.get("priority"), int) for spec in _templates(job)):
        source = "spec.priority"
    else:
        source = "no PriorityClass"
    return f"{source}; PriorityClass {unknown} not known" if unknown else source


async def known_priority_classes(
    client: Client, job: PyTorchJob, priority_classes: dict[str, int] | None = None
) -> dict[str, int] | None:
    """The PriorityClasses to resolve the job's priority with: ``priority_classes`` (those
    applied with it), plus the registry's when the job names one that is neither built in
    nor among them -- a class applied earlier, from another file. The workflow resolves
    its priority from the registry; without this the submission's static details and
    FleetqPriority said 0 for a priority-1000 job whose PriorityClass was applied first."""
    from fleetq.models import BUILTIN_PRIORITY_CLASSES

    given = priority_classes or {}
    missing = [n for n in named_priority_classes(job)
               if n not in given and n not in BUILTIN_PRIORITY_CLASSES]
    if not missing:
        return priority_classes
    try:
        reg = await get_registry(client)
    except (RPCError, TemporalError):  # no control worker answered the query in time:
        return priority_classes  # the workflow still resolves it; only the details lag
    if reg is None:
        return priority_classes
    return {**reg.priority_classes, **given}


def start_search_attributes(
    job: PyTorchJob, priority_classes: dict[str, int] | None = None
) -> TypedSearchAttributes:
    """The Web UI's filters as far as they are known at submission: the job, its
    namespace and priority, and state Queued (waiting to be admitted and placed). The
    workflow only upserts what changes after this, so a job that is admitted and starts
    running at once costs no upsert for the states it passes through."""
    ns, name = job.metadata.namespace, job.metadata.name
    return TypedSearchAttributes([
        SearchAttributePair(SearchAttributeKey.for_keyword(SA_JOB), f"{ns}/{name}"),
        SearchAttributePair(SearchAttributeKey.for_keyword(SA_NAMESPACE), ns),
        SearchAttributePair(SearchAttributeKey.for_keyword(SA_STATE), "Queued"),
        SearchAttributePair(SearchAttributeKey.for_int(SA_PRIORITY),
                            gang_of(job, priority_classes).priority),
    ])


_SA_SUPPORT: weakref.WeakKeyDictionary[Client, bool] = weakref.WeakKeyDictionary()


async def _has_search_attributes(client: Client) -> bool:
    """Whether fleetq's search attributes are registered (asked once per client)."""
    if client not in _SA_SUPPORT:
        _SA_SUPPORT[client] = await has_search_attributes(client)
    return _SA_SUPPORT[client]


async def start_job(
    client: Client,
    job: PyTorchJob,
    manifest: dict[str, Any],
    *,
    run_seconds: int | None = None,
    priority_classes: dict[str, int] | None = None,
) -> str:
    """Start the job's workflow; ``created`` (a new run, also under the name of a
    finished job: it never adopts what the finished one left), or ``unchanged (already
    exists)`` when a run of it is still going. :class:`ClientError` while a delete of
    the job is still purging its member copies."""
    arg: dict[str, Any] = {"manifest": manifest}
    if run_seconds is not None:
        arg["run_seconds"] = run_seconds
    priority_classes = await known_priority_classes(client, job, priority_classes)
    extra: dict[str, Any] = {}
    if await _has_search_attributes(client):
        extra["search_attributes"] = start_search_attributes(job, priority_classes)
    try:
        await client.start_workflow(
            JOB_WORKFLOW,
            arg,
            id=job_workflow_id(job.metadata.namespace, job.metadata.name),
            task_queue=TASK_QUEUE,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            static_summary=job_summary(job, priority_classes),
            static_details=job_details(job, priority_classes),
            **extra,
        )
    except WorkflowAlreadyStartedError:
        ns, name = job.metadata.namespace, job.metadata.name
        desc = await _describe(client, job_workflow_id(ns, name))
        if desc is not None and desc.workflow_type == JOB_PURGE_WORKFLOW:
            raise ClientError(
                f"error: PyTorchJob {ns}/{name} is being deleted (its member copies are "
                "being purged): apply it again once `fleetq delete` has returned"
            ) from None
        return "unchanged (already exists)"
    return "created"


async def _describe(client: Client, workflow_id: str) -> Any:
    """The latest run's description, or None when the id was never used."""
    try:
        return await client.get_workflow_handle(workflow_id).describe(rpc_timeout=QUERY_TIMEOUT)
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return None
        raise


# --------------------------------------------------------------------------- read


def _sa(execution: Any, key: str) -> str | None:
    attrs = getattr(execution, "search_attributes", None) or {}
    value = attrs.get(key)
    if isinstance(value, list):
        value = value[0] if value else None
    return str(value) if value else None


class _SdkReads:
    """:class:`~fleetq.client.job_reads.JobReads` of one execution through the SDK: an
    unanswered read is a view saying why (the HTTP transport hands such reads here)."""

    def __init__(self, client: Client, workflow_id: str, started: datetime | None,
                 execution: Any) -> None:
        self.client, self.workflow_id = client, workflow_id
        self.started, self.execution = started, execution

    def fallback(self, ns: str, name: str, state: str, reason: str,
                 cluster: str | None = None) -> JobView:
        return JobView(namespace=ns, name=name, state=state,  # type: ignore[arg-type]
                       reason=reason, created_at=self.started, cluster=cluster or None)

    async def status(self, ns: str, name: str) -> JobView | None:
        handle = self.client.get_workflow_handle(self.workflow_id)
        try:
            view: JobView | None = await handle.query("status", result_type=JobView,
                                                      rpc_timeout=QUERY_TIMEOUT)
            return view
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                raise Gone(self.workflow_id) from None
            state = _sa(self.execution, SA_STATE) or "Validating"
            return self.fallback(ns, name, state, f"status unavailable (is a worker running?): "
                                 f"{exc.message}", _sa(self.execution, SA_CLUSTER))
        except Exception as exc:  # query failed inside the worker
            return self.fallback(ns, name, "Validating", f"status query failed: {exc}")

    async def result(self, ns: str, name: str) -> JobView:
        try:
            typed = self.client.get_workflow_handle(self.workflow_id, result_type=JobView)
            result: JobView = await typed.result(follow_runs=False, rpc_timeout=QUERY_TIMEOUT)
            return result
        except Exception as exc:
            return self.fallback(ns, name, "Failed", f"result unreadable: {exc}")

    async def failure(self) -> tuple[str, str | None]:
        try:
            await self.client.get_workflow_handle(self.workflow_id).result(
                follow_runs=False, rpc_timeout=QUERY_TIMEOUT)
        except WorkflowFailureError as exc:
            cause = exc.cause
            kind = cause.type if isinstance(cause, ApplicationError) else None
            return getattr(cause, "message", None) or str(cause or exc), kind
        except Exception as exc:
            return str(exc), None
        return "failed", None


async def view_of(client: Client, workflow_id: str, status: WorkflowExecutionStatus | None,
                  started: datetime | None, execution: Any = None) -> JobView | None:
    """The job's view for one execution, or None when it was deleted (cancelled, or its
    latest run is the purge run of a delete)."""
    return await read_view(_SdkReads(client, workflow_id, started, execution), workflow_id,
                           status.name if status is not None else None,
                           getattr(execution, "workflow_type", None))


async def existing_job(client: Client, namespace: str, name: str
                       ) -> tuple[WorkflowHandle[Any, Any], WorkflowExecutionStatus | None]:
    """The job's workflow handle (its latest run's) and status; :class:`NotFound` when
    it was never applied or was deleted (its workflow cancelled, or a purge run)."""
    wid = job_workflow_id(namespace, name)
    desc = await _describe(client, wid)
    if (desc is None or desc.status == WorkflowExecutionStatus.CANCELED
            or desc.workflow_type == JOB_PURGE_WORKFLOW):
        raise NotFound(JOB_RESOURCE, name)
    return client.get_workflow_handle(wid, run_id=desc.run_id), desc.status


async def get_job(client: Client, namespace: str, name: str) -> JobView | None:
    """One job's view; None when it does not exist (never applied, or deleted)."""
    handle = client.get_workflow_handle(job_workflow_id(namespace, name))
    try:
        desc = await handle.describe(rpc_timeout=QUERY_TIMEOUT)
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    return await view_of(client, desc.id, desc.status, desc.start_time, desc)


async def require_job(client: Client, namespace: str, name: str) -> JobView:
    """One job's view; :class:`NotFound` when it does not exist."""
    view = await get_job(client, namespace, name)
    if view is None:
        raise NotFound(JOB_RESOURCE, name)
    return view


async def list_jobs(client: Client, namespace: str | None) -> list[JobView]:
    """Every existing job (latest run per id), optionally in one namespace, sorted by
    namespace and name."""
    query = f'WorkflowType = "{JOB_WORKFLOW}" OR WorkflowType = "{JOB_PURGE_WORKFLOW}"'
    latest = latest_runs([ex async for ex in client.list_workflows(query)], namespace)
    gate = asyncio.Semaphore(MAX_CONCURRENT_QUERIES)

    async def one(ex: WorkflowExecution) -> JobView | None:
        async with gate:
            return await view_of(client, ex.id, ex.status, ex.start_time, ex)

    views = await asyncio.gather(*(one(ex) for ex in latest))
    return sorted((v for v in views if v is not None), key=lambda v: (v.namespace, v.name))


# --------------------------------------------------------------------------- queue position


async def wait_info(client: Client, view: JobView, tree: str | None = None) -> WaitInfo | None:
    """The quota workflow's ``wait_info`` for a queued job (queue, position, reason)."""
    from fleetq.admission import WaitInfo

    if tree is None:
        reg = await get_registry(client)
        if reg is None or reg.tree is None:
            return None
        tree = reg.tree
    handle = client.get_workflow_handle(tree_workflow_id(tree))
    try:
        info: WaitInfo | None = await handle.query(
            "wait_info", job_workflow_id(view.namespace, view.name), result_type=WaitInfo,
            rpc_timeout=QUERY_TIMEOUT)
        return info
    except Exception:
        return None


async def waiting_queues(client: Client, views: list[JobView]) -> dict[tuple[str, str], str]:
    """``{(ns, name): "root-child-2-jfzsm (#3)"}`` for jobs waiting in a queue, from the
    quota workflow's ``wait_info`` (bounded concurrency)."""
    waiting = [v for v in views if is_waiting(v)]
    if not waiting:
        return {}
    reg = await get_registry(client)
    if reg is None or reg.tree is None:
        return {}
    gate = asyncio.Semaphore(MAX_CONCURRENT_QUERIES)

    async def one(v: JobView) -> tuple[tuple[str, str], str] | None:
        async with gate:
            info = await wait_info(client, v, reg.tree)
        if info is None:
            return None
        return (v.namespace, v.name), queue_label(info.queue, info.position,
                                                  info.inadmissible is not None)

    found = await asyncio.gather(*(one(v) for v in waiting))
    return dict(f for f in found if f is not None)


# --------------------------------------------------------------------------- change


async def delete_job(client: Client, namespace: str, name: str, *, wait: bool,
                     timeout: float) -> None:
    """Delete a job and, with ``wait``, return once every member copy is purged. A
    running job's workflow is cancelled (it purges its copies and returns its quota). A
    finished one (Succeeded, Failed, refused, terminated) cannot run activities any more:
    the purge run (``workflows/job_purge.py``) starts under its workflow id and deletes
    what it left on every member; once it completed the job is gone from every view, as a
    deleted Kubernetes object is. A delete already under way is waited for (idempotent).
    :class:`NotFound` when there is no job; :class:`ClientError` when the purge outlasts
    ``timeout`` (it continues) or fails."""
    from fleetq.messages import JobRef

    wid = job_workflow_id(namespace, name)
    handle: WorkflowHandle[Any, Any] | None = None
    for _ in range(5):  # an apply or another delete may win a race: look again
        desc = await _describe(client, wid)
        purging = desc is not None and desc.workflow_type == JOB_PURGE_WORKFLOW
        running = desc is not None and desc.status == WorkflowExecutionStatus.RUNNING
        if desc is None or desc.status == WorkflowExecutionStatus.CANCELED or (
                purging and not running):
            raise NotFound(JOB_RESOURCE, name)
        if purging:  # a delete of the finished job is under way: wait for it
            handle = client.get_workflow_handle(wid, run_id=desc.run_id)
            break
        if running:
            handle = client.get_workflow_handle(wid, run_id=desc.run_id)
            await handle.cancel()
            break
        try:
            started = await client.start_workflow(
                JOB_PURGE_WORKFLOW,
                JobRef(namespace=namespace, name=name, workflow_id=wid),
                id=wid,
                task_queue=TASK_QUEUE,
                id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
                static_summary=f"delete finished PyTorchJob {namespace}/{name}: purge "
                               "what it left on the members",
            )
        except WorkflowAlreadyStartedError:
            continue
        handle = client.get_workflow_handle(wid, run_id=started.result_run_id)
        break
    if handle is None:
        raise ClientError(f"error: PyTorchJob {namespace}/{name} kept changing while being "
                          "deleted; try again")
    if not wait:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        desc = await handle.describe()
        if desc.status == WorkflowExecutionStatus.RUNNING:
            await asyncio.sleep(0.2)
            continue
        if desc.workflow_type == JOB_PURGE_WORKFLOW and (
                desc.status != WorkflowExecutionStatus.COMPLETED):
            raise ClientError(f"error: PyTorchJob {namespace}/{name}: purging its member "
                              f"copies ended {desc.status.name if desc.status else '?'}")
        return
    raise ClientError(f"error: timed out after {timeout:g}s waiting for PyTorchJob "
                      f"{namespace}/{name} to purge its member copies (it continues "
                      "in the background)")


JobSignal = Literal["suspend", "resume"]


async def signal_job(client: Client, namespace: str, name: str, signal: JobSignal) -> None:
    """Kubeflow's ``runPolicy.suspend`` for a running job: ``suspend`` purges its member
    copies and releases its quota, ``resume`` queues it again with its submit time.
    :class:`InvalidInput` when the job has finished."""
    handle, status = await existing_job(client, namespace, name)
    if status != WorkflowExecutionStatus.RUNNING:
        raise InvalidInput(
            f"error: PyTorchJob {namespace}/{name} has finished; nothing to {signal}")
    await handle.signal(signal)
