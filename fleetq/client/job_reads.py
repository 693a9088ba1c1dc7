"""Reading a job's view, once for both transports: the Temporal SDK
(:mod:`fleetq.client.jobs`) and the Web UI server's HTTP API
(:mod:`fleetq.client.http_api`, which ``fleetq get`` uses to skip importing the SDK).

:func:`read_view` decides from a job workflow's latest execution what to read (the
``status`` query, the result, the failure) and what the job is then; a :class:`JobReads`
transport does the reading. The routine is a coroutine; the HTTP transport's reads do not
suspend, so :func:`run_now` runs it without an event loop. Imports nothing heavy: the
HTTP path's import cost is the point of it (BENCHMARKS.md §9).
"""

from __future__ import annotations

from collections.abc import Coroutine, Iterable
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from fleetq.naming import JOB_PURGE_WORKFLOW, parse_job_workflow_id

V = TypeVar("V")
V_co = TypeVar("V_co", covariant=True)
E = TypeVar("E", bound="Execution")

#: failure types that refuse bad input: their message is the whole story (a job workflow
#: failed with one is ``Refused``)
REFUSAL_TYPES = frozenset({"InvalidManifest"})
#: at most this many queries in flight while listing
MAX_CONCURRENT_QUERIES = 16
JOB_RESOURCE = "pytorchjobs.kubeflow.org"


class Execution(Protocol):
    """A job workflow's execution as visibility or describe gives it."""

    @property
    def id(self) -> str: ...

    @property
    def start_time(self) -> datetime | None: ...


class Waiting(Protocol):
    """What of a view tells whether the job waits in a queue."""

    @property
    def state(self) -> str: ...

    @property
    def queued(self) -> bool: ...

    @property
    def admitted(self) -> bool: ...


class Gone(Exception):
    """The job's workflow vanished while it was read: the job does not exist."""


class JobReads(Protocol[V_co]):
    """One transport's reads of a job workflow, and its views (``V``)."""

    async def status(self, ns: str, name: str) -> V_co | None:
        """The running workflow's ``status`` query (None: it answered null)."""
        ...

    async def result(self, ns: str, name: str) -> V_co:
        """The completed workflow's result."""
        ...

    async def failure(self) -> tuple[str, str | None]:
        """The failed workflow's failure: its message and application failure type."""
        ...

    def fallback(self, ns: str, name: str, state: str, reason: str,
                 cluster: str | None = None) -> V_co:
        """A view made from the execution alone."""
        ...


async def read_view(reads: JobReads[V], workflow_id: str, status: str | None,
                    workflow_type: str | None) -> V | None:
    """The job's view for its latest execution (``status``: the execution status's name,
    ``RUNNING``...), or None when it was deleted (cancelled, or its latest run is the
    purge run of a delete) or is not a job's."""
    parsed = parse_job_workflow_id(workflow_id)
    if parsed is None or workflow_type == JOB_PURGE_WORKFLOW or status == "CANCELED":
        return None
    ns, name = parsed
    if status == "RUNNING":
        try:
            view = await reads.status(ns, name)
        except Gone:
            return None
        return view if view is not None else reads.fallback(ns, name, "Validating",
                                                            "starting")
    if status == "COMPLETED":
        return await reads.result(ns, name)
    if status == "FAILED":
        # a job workflow that refused its input (a start by hand with an invalid manifest,
        # a wrong workflow id, not a PyTorchJob) is Refused, with the one-line reason
        message, kind = await reads.failure()
        state = "Refused" if kind in REFUSAL_TYPES else "Failed"
        return reads.fallback(ns, name, state, (message.strip().splitlines() or ["failed"])[0])
    if status == "TERMINATED":
        return reads.fallback(ns, name, "Failed", "workflow terminated")
    if status == "TIMED_OUT":
        return reads.fallback(ns, name, "Failed", "workflow timed out")
    return None


def run_now(coro: Coroutine[Any, Any, V]) -> V:
    """Run a coroutine that never suspends (the HTTP transport's reads block instead)."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("a blocking read suspended")


def latest_runs(executions: Iterable[E], namespace: str | None) -> list[E]:
    """The latest run of each job workflow id (optionally of one namespace)."""
    latest: dict[str, E] = {}
    floor = datetime.min.replace(tzinfo=UTC)
    for ex in executions:
        parsed = parse_job_workflow_id(ex.id)
        if parsed is None or (namespace is not None and parsed[0] != namespace):
            continue
        seen = latest.get(ex.id)
        if seen is None or (ex.start_time or floor) > (seen.start_time or floor):
            latest[ex.id] = ex
    return list(latest.values())


def is_waiting(view: Waiting) -> bool:
    """A job waiting in a queue for admission."""
    return view.state in ("Queued", "Inadmissible") or (
        view.queued and not view.admitted and view.state in ("Validating", "Scheduling"))


def queue_label(queue: Any, position: Any, inadmissible: bool) -> str:
    """``fleetq get -o wide``'s QUEUE of a waiting job: ``root-a (#3)``, or
    ``root-a (inadmissible)``."""
    return f"{queue} (inadmissible)" if inadmissible else f"{queue} (#{position})"
