"""What the job workflow shows and its plain effects: the run's state, the notices it
carries out (events, state transitions, the Temporal UI's details, search attributes),
pauses, the policy and placement reads (local activities), purging every copy.

The base of ``PyTorchJobWorkflow`` (``workflows/pytorch_job.py``), below its parts
``job_queueing``, ``job_placing`` and ``job_watching``: it runs inside that workflow,
on its history. Decisions are the pure core's (``fleetq.job_phases``,
``fleetq.job_machine``, ``fleetq.lifecycle``).
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from temporalio import workflow
from temporalio.common import RawValue, RetryPolicy, SearchAttributeKey, SearchAttributeUpdate
from temporalio.workflow import ActivityHandle

from workflows import activity_calls
from workflows.copies import MemberCopies

with workflow.unsafe.imports_passed_through():
    from fleetq import activity_refs, job_phases, lifecycle
    from fleetq.admission import Grant
    from fleetq.fleet_config import RequeueSettings
    from fleetq.handler_refs import JobHandlers
    from fleetq.job_input import JobInput
    from fleetq.lifecycle import Announce, JobProgress, Notice, Reason, Transition
    from fleetq.messages import (
        JobRef,
        JobState,
        JobStatus,
        PlacementInput,
        PlacementVerdict,
        PreemptSignal,
        Resolution,
        ResolveInput,
    )
    from fleetq.models import Gang, PropagationPolicy, PyTorchJob
    from fleetq.naming import SA_CLUSTER, SA_JOB, SA_NAMESPACE, SA_PRIORITY, SA_QUEUE, SA_STATE
    from workflows import metrics
    from workflows.errors import invalid_input

#: A workflow's closing task is refused (UnhandledCommand, a WorkflowTaskFailed in the
#: UI) when an event arrives while it runs. Before closing, a job therefore waits this
#: long at most for its watches still running: one left on the old copy by a failover, or
#: the current one of a deleted job (their copies are purged, so they end within seconds).
SETTLE_SECONDS = 10.0

MEMBER_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=8,
    non_retryable_error_types=["ConflictError", "InvalidRequest", "ApiError"],
)


class JobEffects:
    """The run's state and the effects every phase uses."""

    _job: PyTorchJob
    _input: JobInput
    _ref: JobRef
    _gang: Gang
    _copies: MemberCopies

    def __init__(self) -> None:
        #: the run's state (lifecycle.JobProgress), carried whole across continue-as-new
        self._progress: JobProgress | None = None
        #: the quota workflow's grant, delivered by the ``admitted`` signal
        self._grant: Grant | None = None
        self._retry_now = False
        self._sa_enabled = False
        self._details = ""
        self._sa_last: dict[str, Any] = {}
        self._policy: PropagationPolicy | None = None
        #: watches started and possibly still running (one left behind by a failover,
        #: the current one of a deleted job), waited for before the workflow closes
        self._watches: list[asyncio.Future[Any]] = []
        #: a ``preempt`` signal arrived: recompute the deadline being waited for
        self._preempt_wake = False
        #: the bound copy's watch running now, and whether it is the settle window's
        self._watch: ActivityHandle[JobStatus] | None = None
        self._watch_settling = False
        #: the bind's first watch's answer, taken by the next watch wait (``FirstWatch``)
        self._bind_status: JobStatus | None = None
        #: when the watch running now ends by itself (its window from its start)
        self._watch_ends = datetime.min.replace(tzinfo=UTC)

    # ------------------------------------------------------------------ the run's state
    @property
    def _p(self) -> JobProgress:
        assert self._progress is not None, "the run's progress exists once the run starts"
        return self._progress

    @property
    def _pol(self) -> PropagationPolicy:
        assert self._policy is not None, "policy is resolved before any phase runs"
        return self._policy

    @property
    def _suspension(self) -> lifecycle.Suspension:
        return self._p.suspension

    @property
    def _requeue_settings(self) -> RequeueSettings:
        return self._p.resolution.requeue

    @property
    def _sa_settling(self) -> bool:
        return self._sa_enabled and lifecycle.settling(self._p.view, self._sa_last)

    # ------------------------------------------------------------------ showing
    def _announce(self, notices: list[Notice] | tuple[Notice, ...]) -> None:
        """Carry out what the lifecycle asks to show, in order."""
        for notice in notices:
            if isinstance(notice, Announce):
                self._event(notice.type, notice.reason, notice.message)
            elif isinstance(notice, Transition):
                self._set_state(notice.state, notice.reason)
            else:
                self._publish()

    def _event(self, kind: Literal["Normal", "Warning"], reason: Reason, message: str) -> None:
        lifecycle.record_event(self._p.view, kind, reason, message, workflow.now())
        self._publish()

    def _set_state(self, state: JobState, reason: str) -> None:
        view = self._p.view
        if state != view.state:
            metrics.job_state(state)
        view.state = state
        view.reason = reason
        self._publish()

    def _publish(self, flush: bool = False) -> None:
        """Show the view: the workflow's Markdown details, and the search attributes that
        changed (upserted only when the resolution enables them)."""
        view = self._p.view
        details = lifecycle.details_markdown(view)
        if details != self._details:
            self._details = details
            workflow.set_current_details(details)
        if not self._sa_enabled:
            return
        changed = lifecycle.search_attribute_changes(view, self._sa_last, flush=flush)
        if changed:
            pairs: list[SearchAttributeUpdate[Any]] = []
            for k, v in changed.items():
                key: Any = (
                    SearchAttributeKey.for_int(k)
                    if k == SA_PRIORITY
                    else SearchAttributeKey.for_keyword(k)
                )
                pairs.append(key.value_set(v))
            workflow.upsert_search_attributes(pairs)
            self._sa_last.update(changed)

    def _history_long(self) -> bool:
        """Whether the run should hand its progress to a new run (bounded history)."""
        info = workflow.info()
        return lifecycle.continue_as_new_due(
            info.get_current_history_length(), info.is_continue_as_new_suggested()
        )

    # ------------------------------------------------------------------ pauses and reads
    async def _sleep_or_retry(self, seconds: float, summary: str) -> None:
        """Pause ``seconds`` on a durable timer, cut short by ``retry_placement``."""
        self._retry_now = False
        with contextlib.suppress(TimeoutError):
            await workflow.wait_condition(
                lambda: self._retry_now, timeout=seconds, timeout_summary=summary
            )
        self._retry_now = False

    async def _resolve(self, summary: str) -> Resolution:
        """The job's PropagationPolicy and quota tree (a local activity)."""
        return await activity_calls.execute_local(
            activity_refs.RESOLVE_POLICY,
            ResolveInput(
                namespace=self._job.metadata.namespace,
                name=self._job.metadata.name,
                labels=self._job.metadata.labels,
                submitted_at=(
                    self._p.view.created_at or workflow.info().workflow_start_time
                ).timestamp(),
            ),
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=MEMBER_RETRY,
            summary=summary,
        )

    async def _plan_placement(
        self, placement: PlacementInput, *, capacity: bool
    ) -> PlacementVerdict:
        """One placement round (a local activity); with ``capacity``, also the capacity
        preemption part (``job_phases.capacity_input``)."""
        if capacity:
            placement = job_phases.capacity_input(placement, self._p)
        return await activity_calls.execute_local(
            activity_refs.PLAN_PLACEMENT,
            placement,
            start_to_close_timeout=timedelta(seconds=60),
            retry_policy=MEMBER_RETRY,
            summary="capacity and gang placement",
        )

    def _placement_input(self) -> PlacementInput:
        return job_phases.placement_input(self._p, self._pol, self._gang, self._ref.workflow_id)

    # ------------------------------------------------------------------ copies and watches
    async def _purge_all(self, why: str, *, settle: bool = True, local: bool = False) -> None:
        """Purge every copy the job has (current, left behind, pending), each until done
        (``local``: as local activities, ``MemberCopies.purge``); then (``settle``) let
        the watches of those copies end (the caller does, later, when the quota should go
        back first)."""
        view = self._p.view
        for cluster in lifecycle.copies_to_purge(self._p):
            await self._copies.purge_until_done(cluster, why, local=local)
        view.copies, view.pending_purges = [], []
        self._p.graceful_old, self._p.grace_deadline = None, None
        if settle:
            await self._settle_watches()

    async def _settle_watches(self) -> None:
        """Wait (bounded) for watches still running, so their completion does not arrive
        while the closing workflow task runs."""
        if any(not w.done() for w in self._watches):
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: all(w.done() for w in self._watches),
                    timeout=SETTLE_SECONDS,
                    timeout_summary="let running watches end",
                )
        self._watches = []

    async def _wake_preemptor(self, signal: PreemptSignal | None) -> None:
        """A capacity victim that has stopped wakes its preemptor (``retry_placement``),
        so it places now instead of after a backoff."""
        if signal is None or not job_phases.capacity_preemption(signal):
            return
        with contextlib.suppress(Exception):  # the preemptor is gone: nobody to wake
            await workflow.get_external_workflow_handle(signal.preemptor).signal(
                JobHandlers.RETRY_PLACEMENT.name
            )


def read_input(arg: RawValue) -> tuple[JobInput, PyTorchJob]:
    """The workflow's input and its manifest (``job_phases.read_input``), or the run
    fails with one line naming what is wrong."""
    try:
        decoded = workflow.payload_converter().from_payload(arg.payload)
    except Exception as exc:  # not JSON, nested too deep, ...
        raise invalid_input(
            f"workflow input is not a JSON object ({type(exc).__name__})"
        ) from None
    try:
        return job_phases.read_input(decoded, workflow.info().workflow_id)
    except job_phases.Refused as exc:
        raise invalid_input(str(exc)) from None


def search_attributes_at_start() -> dict[str, Any]:
    """fleetq's search attributes the run started with (set by ``fleetq apply`` at
    submission, or carried over by continue-as-new), so they are not upserted again."""
    out: dict[str, Any] = {}
    for pair in workflow.info().typed_search_attributes:
        if pair.key.name in (SA_STATE, SA_CLUSTER, SA_QUEUE, SA_JOB, SA_NAMESPACE, SA_PRIORITY):
            out[pair.key.name] = pair.value
    return out
