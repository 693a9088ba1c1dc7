"""One workflow per PyTorchJob (id ``pytorchjob/<namespace>/<name>``): queue, place,
reserve, bind, watch, fail over, finish.

It only orchestrates: its life is a short loop over ``fleetq.job_machine.next_phase``;
every decision is the pure core's (``job_machine``, ``job_queue``, ``job_phases``,
``lifecycle``) on the run's one ``JobProgress``, carried out by the parts it is built
on (``job_effects`` < ``job_queueing`` < ``job_placing`` < ``job_watching``).
Reads before the first write and quota messages are local activities, member writes
regular ones (docs/decisions/008). Status is change-driven and the run continues-as-new,
so a week-long job keeps a bounded history. Preemption, capacity preemption,
Unschedulable and re-queue with backoff: docs/preemption.md, docs/requeue.md.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import ActivityError

from workflows.copies import MemberCopies
from workflows.job_effects import read_input, search_attributes_at_start
from workflows.job_watching import JobWatching

with workflow.unsafe.imports_passed_through():
    from fleetq import job_machine, job_phases, lifecycle
    from fleetq.admission import Grant
    from fleetq.job_input import JobInput
    from fleetq.job_machine import Phase, Supervision
    from fleetq.lifecycle import RequeueCause
    from fleetq.messages import AdmissibilitySignal, JobRef, JobView, PreemptSignal
    from fleetq.models import Gang, gang_of
    from fleetq.naming import job_workflow_id
    from workflows.errors import cancelled_by_delete, invalid_input

#: continue-as-new once a run's history passes this many events (bench/history.py reads it)
MAX_HISTORY_EVENTS = lifecycle.MAX_HISTORY_EVENTS


@workflow.defn(name="PyTorchJobWorkflow")
class PyTorchJobWorkflow(JobWatching):
    # ================================================================== run
    @workflow.run
    async def run(self, arg: RawValue) -> JobView:
        inp, job = read_input(arg)
        ns, name = job.metadata.namespace, job.metadata.name
        self._job = job
        self._input = inp
        # the submission (survives continue-as-new): its copies carry it, so a later
        # apply of this name never adopts them (fleetq.io/run-id)
        self._ref = JobRef(namespace=ns, name=name, workflow_id=job_workflow_id(ns, name),
                           run_id=workflow.info().first_execution_run_id)
        self._sa_last = search_attributes_at_start()

        self._begin(inp)
        self._copies = MemberCopies(self._ref, lambda: self._p.view, self._event, self._set_state)
        self._publish()

        try:
            if self._policy is None:
                await self._resolve_job()
            return await self._lifecycle()
        except (asyncio.CancelledError, ActivityError) as exc:
            if isinstance(exc, ActivityError) and not cancelled_by_delete(exc):
                raise
            await self._on_deleted()
            raise asyncio.CancelledError() from None

    # ================================================================== phases
    def _begin(self, inp: JobInput) -> None:
        """The run's progress: carried over by continue-as-new, or a new job's."""
        if inp.progress is None:
            self._progress = job_phases.new_progress(
                self._ref.namespace, self._ref.name, workflow.info().workflow_start_time
            )
            return
        self._progress = inp.progress
        self._grant = inp.progress.grant
        self._sa_enabled = self._p.resolution.search_attributes
        try:
            self._policy = job_phases.carried_policy(self._p)
        except job_phases.Refused as exc:
            raise invalid_input(str(exc)) from None
        self._gang = gang_of(self._job, self._p.resolution.priority_classes)

    async def _resolve_job(self) -> None:
        """Resolve the job's policy and quota tree, and show what it asks for."""
        self._policy = await self._resolve_policy()
        self._gang = gang_of(self._job, self._p.resolution.priority_classes)
        self._announce(job_phases.show_request(self._p, self._gang, self._policy))

    async def _lifecycle(self) -> JobView:
        """queue → admit → place → reserve → bind → watch → fail over / purge → finish
        (and suspend / resume, preempted, Unschedulable, continue-as-new)."""
        for cluster in self._p.view.pending_purges:  # carried over by continue-as-new
            self._copies.start_purger(cluster)
        if self._input.progress is None and self._job.suspend:
            self._suspension.wanted = True
        while (phase := self._next_phase()) != Phase.FINISH:
            await self._phases[phase]()
        await self._finish()
        return self._p.view

    def _next_phase(self) -> Phase:
        return job_machine.next_phase(
            self._p, queued=self._pol.queued, granted=self._grant is not None, now=workflow.now()
        )

    @property
    def _phases(self) -> dict[Phase, Callable[[], Awaitable[Any]]]:
        return {
            Phase.SUSPEND: self._suspend,
            Phase.PREEMPTED: self._preempted,
            Phase.UNSCHEDULABLE: self._wait_unschedulable,
            Phase.ADMIT: self._wait_for_admission,
            Phase.PLACE: self._schedule,
            Phase.WATCH: self._watch_phase,
        }

    async def _watch_phase(self) -> None:
        """Watch the bound job; a pods-ready timeout re-queues it, a long history
        continues as new (else the next phase follows from its progress)."""
        outcome = await self._supervise()
        if outcome == Supervision.REQUEUE:
            await self._requeue(RequeueCause.PODS_READY_TIMEOUT)
        elif outcome == Supervision.CONTINUE:
            await self._continue_as_new()

    async def _continue_as_new(self) -> None:
        """Hand the run's progress to a new run (bounded history)."""
        await self._settle_watches()
        self._copies.stop_purgers()  # the next run starts them again
        await workflow.wait_condition(workflow.all_handlers_finished)
        self._p.grant = self._grant
        workflow.continue_as_new(self._input.model_copy(update={"progress": self._p}))

    async def _wait_unschedulable(self) -> None:
        """Wait ``Unschedulable`` until a member's nodes change (``retry_placement``, from
        the worker's capacity caches) or the backstop timer ends, then place again: still
        never, wait on; else queue again (keeping the submit time). History stays
        bounded: a wake costs a few events and the run continues-as-new when long."""
        while True:
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: self._retry_now or self._suspension.wanted,
                    timeout=lifecycle.UNSCHEDULABLE_BACKSTOP_SECONDS,
                    timeout_summary="wait for a member's nodes to change",
                )
            self._retry_now = False
            if self._suspension.wanted:
                return
            verdict = await self._plan_placement(self._placement_input(), capacity=False)
            if job_phases.may_fit(verdict):
                self._announce(lifecycle.unparked(self._p, queued=self._pol.queued))
                return
            if self._history_long():
                await self._continue_as_new()

    async def _suspend(self) -> None:
        """runPolicy.suspend / the suspend signal: purge every copy, give the quota back,
        wait in Suspended until resumed, then queue again with the original submit time."""
        in_queue, notices = job_phases.suspend(self._p, granted=self._grant is not None)
        self._announce(notices)
        await self._purge_all("purge on suspend")
        if in_queue:
            await self._release_quota()
        self._announce(job_phases.suspended(self._p))
        while not self._suspension.resume_wanted:
            await workflow.wait_condition(
                lambda: self._suspension.resume_wanted or self._grant is not None
            )
            if self._grant is not None:  # a grant that crossed our cancel: give it back
                await self._release_quota()
        self._announce(job_phases.resumed(self._p, queued=self._pol.queued))

    async def _preempted(self) -> None:
        """Carry out a preemption (its grace period is over, or nothing was bound):
        purge every copy, then give the quota back and queue again with the original
        submit time; the preemptor is admitted once the quota workflow has it back."""
        signal = self._p.preempt
        # the quota goes back as soon as the copies are gone: in this workflow task, the
        # purge a local activity (docs/decisions/019); the watch of a purged copy ends by
        # itself (it sees the copy go) and is let end after, not waited for first (an
        # activity completion and a workflow task more on the preemptor's path)
        await self._purge_all("purge on preemption", settle=False, local=True)
        # a capacity preemptor is woken in the same task (not waited for first)
        woken = asyncio.create_task(self._wake_preemptor(signal))
        self._announce(lifecycle.requeue_after_preemption(self._p))
        await self._requeue_quota()
        await woken
        await self._settle_watches()

    # ================================================================== endings
    async def _finish(self) -> None:
        view = self._p.view
        # Reservations were consumed by the pods; delete leftovers on every copy we hold.
        for cluster in list(view.pending_purges):
            await self._copies.purge_until_done(cluster, "purge copy left while unreachable")
            self._announce(job_phases.left_copy_purged(view, cluster))
        if self._p.graceful_old:
            await self._copies.purge_until_done(self._p.graceful_old, "purge old copy")
            self._p.graceful_old = None
        await self._settle_watches()
        if self._p.preempt is not None:  # it ended during its grace period: room made
            await self._wake_preemptor(self._p.preempt)
        await self._release_quota()
        view.finished_at = workflow.now()
        self._publish()

    async def _on_deleted(self) -> None:
        """Deleted from the fleet: purge every copy (and a write in flight once it lands),
        give the quota back."""
        left, notices = job_phases.deleted(self._p)
        self._announce(notices)
        in_flight = await self._copies.land_in_flight()  # purged after it lands
        for cluster in in_flight + left:
            await self._copies.purge_until_done(cluster, "purge on delete")
        job_phases.all_purged(self._p)
        await self._settle_watches()
        await self._release_quota()
        self._announce(job_phases.gone(self._p, workflow.now()))

    # ================================================================== handlers
    @workflow.signal
    def admitted(self, grant: Grant) -> None:
        self._grant = grant

    @workflow.signal
    def admissibility(self, signal: AdmissibilitySignal) -> None:
        """The quota workflow: the job can never be admitted under the current tree
        (with why), or it is queued again."""
        if self._progress is not None:
            self._progress.admissibility = signal
            self._progress.admissibility_news = True

    @workflow.signal
    def suspend(self) -> None:
        """Suspend the job (as ``runPolicy.suspend: true``): its copies are purged and its
        quota released until ``resume``."""
        if self._progress is not None:
            self._suspension.ask_suspend(self._progress.view.state)

    @workflow.signal
    def resume(self) -> None:
        """Resume a suspended job: it queues again (keeping its submit time)."""
        if self._progress is not None:
            self._progress.suspension.ask_resume()

    @workflow.signal
    def preempt(self, signal: PreemptSignal) -> None:
        """The quota workflow preempts the job: it stops within the grace period (it may
        finish meanwhile), its copies are purged, its quota released, and it queues
        again keeping its submit time."""
        if self._progress is None:
            return
        holding = job_phases.holding(self._progress, signal, granted=self._grant is not None)
        notices = lifecycle.take_preemption(
            self._progress, signal, holding=holding, now=workflow.now()
        )
        if notices:
            self._announce(notices)
            self._preempt_wake = True
            self._retry_now = True  # a placement pause ends now

    @workflow.signal
    def retry_placement(self) -> None:
        """Capacity changed somewhere: retry a pending placement now."""
        self._retry_now = True

    @workflow.query
    def status(self) -> JobView | None:
        return self._progress.view if self._progress is not None else None

    @property
    def gang(self) -> Gang:
        return self._gang
