"""One workflow per PyTorchJob (id ``pytorchjob/<namespace>/<name>``): queue, place,
reserve, bind, watch, fail over, finish.

It only orchestrates: every decision is the pure ``fleetq.lifecycle``'s on the run's one
``JobProgress``, and its loops are ``fleetq.job_machine``'s (``next_phase``, ``step``).
Reads before the first write and quota messages are local activities, member writes
regular ones, so a crash after placing never writes to a second cluster
(docs/decisions/008). Failover tolerance is a durable timer, status is change-driven and
the run continues-as-new, so a week-long job keeps a bounded history. Preemption,
capacity preemption, Unschedulable and re-queue with backoff: docs/preemption.md,
docs/requeue.md.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from temporalio import workflow
from temporalio.common import RawValue, RetryPolicy, SearchAttributeKey, SearchAttributeUpdate
from temporalio.exceptions import ActivityError
from temporalio.workflow import ActivityCancellationType, ActivityHandle

from workflows import activity_calls
from workflows.copies import MemberCopies

with workflow.unsafe.imports_passed_through():
    # PLY (under jsonpath-ng, statePreservation's rules) looks its modules up in sys.modules
    import jsonpath_ng._ply_tables.ext_lexer_table  # noqa: F401
    import jsonpath_ng.ext.parser  # noqa: F401
    import jsonpath_ng.lexer  # noqa: F401

    from fleetq import activity_refs, job_machine, lifecycle, state_preservation
    from fleetq.admission import AdmissionRequest, Grant
    from fleetq.fleet_config import RequeueSettings
    from fleetq.job_input import InvalidJobInput, JobInput
    from fleetq.job_machine import Gate, Phase, Supervision
    from fleetq.lifecycle import (
        PLACEMENT_BACKOFF,
        RESOLVE_BACKOFF,
        Announce,
        JobProgress,
        Notice,
        OldCopy,
        Reason,
        RequeueCause,
        Transition,
    )
    from fleetq.messages import (
        AdmissibilitySignal,
        BindInput,
        BindRequest,
        Candidate,
        CapacityPlanned,
        CapacityVictim,
        GangShape,
        JobRef,
        JobState,
        JobStatus,
        JobView,
        PlacementInput,
        PlacementVerdict,
        PodReservation,
        PreemptSignal,
        QuotaSignal,
        ReserveRequest,
        Resolution,
        ResolveInput,
        WatchInput,
    )
    from fleetq.models import (
        ClusterPropagationPolicy,
        Gang,
        ManifestError,
        ManifestErrors,
        PropagationPolicy,
        PurgeMode,
        PyTorchJob,
        binding_result,
        gang_of,
        parse_job,
        parse_policy,
        quota_request,
    )
    from fleetq.naming import (
        SA_CLUSTER,
        SA_JOB,
        SA_NAMESPACE,
        SA_PRIORITY,
        SA_QUEUE,
        SA_STATE,
        job_workflow_id,
    )
    from fleetq.preemption import (
        GRACE_ANNOTATION,
        PREEMPTIBLE_ANNOTATION,
        JobPreemptionPolicy,
        PreemptionReason,
        job_policy,
    )
    from workflows import metrics
    from workflows.errors import cancelled_by_delete, invalid_input

#: continue-as-new once a run's history passes this many events (bench/history.py reads it)
MAX_HISTORY_EVENTS = lifecycle.MAX_HISTORY_EVENTS
WATCH_SECONDS = 300.0
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


@workflow.defn(name="PyTorchJobWorkflow")
class PyTorchJobWorkflow:
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
        #: when the watch running now ends by itself (its window from its start)
        self._watch_ends = datetime.min.replace(tzinfo=UTC)

    # ================================================================== run
    @workflow.run
    async def run(self, arg: RawValue) -> JobView:
        inp, job = _read_input(arg)
        ns, name = job.metadata.namespace, job.metadata.name
        self._job = job
        self._input = inp
        # the submission (survives continue-as-new): its copies carry it, so a later
        # apply of this name never adopts them (fleetq.io/run-id)
        self._ref = JobRef(namespace=ns, name=name, workflow_id=job_workflow_id(ns, name),
                           run_id=workflow.info().first_execution_run_id)
        self._sa_last = _search_attributes_at_start()

        self._begin(inp)
        self._copies = MemberCopies(self._ref, lambda: self._p.view, self._event, self._set_state)
        self._publish()

        try:
            if self._policy is None:
                await self._resolve_job(inp)
            return await self._lifecycle()
        except (asyncio.CancelledError, ActivityError) as exc:
            if isinstance(exc, ActivityError) and not cancelled_by_delete(exc):
                raise
            await self._on_deleted()
            raise asyncio.CancelledError() from None

    # ================================================================== phases
    def _begin(self, inp: JobInput) -> None:
        """The run's progress: carried over by continue-as-new, or a new job's."""
        ns, name = self._ref.namespace, self._ref.name
        job = self._job
        if inp.progress is not None:
            self._progress = inp.progress
            self._grant = inp.progress.grant
            resolution = self._progress.resolution
            self._sa_enabled = resolution.search_attributes
            policy = parse_policy(resolution.policy) if resolution.policy else None
            if policy is None:
                raise invalid_input(
                    f"PyTorchJob {ns}/{name}: lost its policy across continue-as-new"
                )
            self._policy = policy
            self._gang = gang_of(job, resolution.priority_classes)
        else:
            self._progress = JobProgress(
                view=JobView(
                    namespace=ns, name=name, state="Validating",
                    created_at=workflow.info().workflow_start_time,
                ),
                resolution=Resolution(),
            )

    async def _resolve_job(self, inp: JobInput) -> None:
        """Resolve the job's policy and quota tree, and show what it asks for."""
        self._policy = await self._resolve_policy(inp)
        self._gang = gang_of(self._job, self._p.resolution.priority_classes)
        view = self._p.view
        view.priority = self._gang.priority
        view.queued = self._pol.queued
        view.summary = self._summary_line()
        view.gang = self._gang.minimum_line()
        self._publish()

    async def _lifecycle(self) -> JobView:
        """The seed's scheduling flow: queue → admit → place → reserve → bind → watch →
        fail over / purge → finish (and suspend / resume, continue-as-new)."""
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
            self._p,
            queued=self._pol.queued,
            granted=self._grant is not None,
            now=workflow.now(),
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
        workflow.continue_as_new(
            JobInput(
                manifest=self._input.manifest,
                policy=self._input.policy,
                run_seconds=self._input.run_seconds,
                rewatch_seconds=self._input.rewatch_seconds,
                progress=self._p,
            )
        )

    async def _resolve_policy(self, inp: JobInput) -> PropagationPolicy:
        delay = RESOLVE_BACKOFF.initial
        while True:
            self._p.resolution = await self._resolve("resolve PropagationPolicy and quota tree")
            self._sa_enabled = self._p.resolution.search_attributes
            doc = inp.policy or self._p.resolution.policy
            if doc is not None:
                try:
                    policy = parse_policy(doc)
                except ManifestErrors as exc:
                    raise invalid_input(str(exc)) from None
                refusal = lifecycle.policy_refusal(
                    policy.metadata.namespace, policy.metadata.name, self._job.metadata.namespace,
                    cluster_scoped=isinstance(policy, ClusterPropagationPolicy),
                )
                if refusal is not None:
                    raise invalid_input(refusal)
                if inp.policy is not None:
                    self._p.resolution.policy = doc
                self._p.view.policy = policy.registry_key
                return policy
            self._set_state("Pending", self._p.resolution.policy_reason)
            await self._sleep_or_retry(delay, "wait for a matching PropagationPolicy")
            delay = RESOLVE_BACKOFF.after(delay)

    def _admission_request(self) -> AdmissionRequest:
        """The job's request to its quota workflow, with its original submit time."""
        return AdmissionRequest(
            job_id=self._ref.workflow_id,
            namespace=self._job.metadata.namespace,
            priority=self._gang.priority,
            request=quota_request(self._gang),
            submitted_at=(self._p.view.created_at or workflow.now()).timestamp(),
            preemptible=self._preemption_policy.preemptible,
            grace_seconds=self._preemption_policy.grace_seconds,
        )

    async def _wait_for_admission(self) -> None:
        request = self._admission_request()
        if not await self._back_off():
            return  # suspended while backing off
        delay = RESOLVE_BACKOFF.initial
        while self._grant is None:
            if self._suspension.wanted:  # suspended before the quota workflow took it
                return
            tree_id = self._p.resolution.tree_workflow_id
            waiting = await self._enqueue(tree_id, request)
            if waiting is not None:  # no tree, or its workflow is gone: resolve again later
                reason, summary = waiting
                self._set_state("Queued", reason)
                await self._sleep_or_retry(delay, summary)
                delay = RESOLVE_BACKOFF.after(delay)
                self._p.resolution = await self._refresh_resolution()
                continue
            if not await self._await_grant(str(tree_id)):
                return  # suspended while waiting: it left the queue
        self._admit(self._grant)

    async def _enqueue(
        self, tree_id: str | None, request: AdmissionRequest
    ) -> tuple[str, str] | None:
        """Put the job in its quota workflow's queue; else why not (the reason shown,
        the summary of the wait before resolving again)."""
        if tree_id is None:
            return "no ElasticQuotaTree is applied to the fleet", "wait for an ElasticQuotaTree"
        if self._p.requeued_in == tree_id:  # already back in its queue there
            self._p.requeued_in = None
            return None
        try:
            sent = await self._signal_quota(
                QuotaSignal(tree_workflow_id=tree_id, signal="enqueue", request=request),
                f"enqueue in {tree_id}",
            )
        except ActivityError as exc:
            if cancelled_by_delete(exc):
                raise
            sent = False
        if not sent:  # the tree workflow is gone (or unreachable)
            return f"quota workflow {tree_id} is not running", "wait for the quota workflow"
        return None

    async def _await_grant(self, tree_id: str) -> bool:
        """Wait Queued (or Inadmissible) for the grant; False when a suspension came
        first (the job then leaves the queue)."""
        self._set_state("Queued", "waiting for quota")
        self._event("Normal", Reason.QUEUED, f"enqueued in quota tree {tree_id}")
        self._show_admissibility()  # (told while the enqueue was being sent)
        while True:
            await workflow.wait_condition(
                lambda: self._grant is not None
                or self._suspension.wanted
                or self._p.admissibility_news
            )
            self._show_admissibility()
            if self._grant is not None or self._suspension.wanted:
                break
        if self._grant is None:  # suspended while waiting: leave the queue
            await self._release_quota()
            return False
        return True

    def _admit(self, grant: Grant) -> None:
        """The quota workflow admitted the job: Scheduling, and when it was admitted."""
        view = self._p.view
        if view.created_at is not None:
            metrics.admission_latency(
                (workflow.now() - view.created_at).total_seconds(), grant.queue
            )
        view.admitted = True
        view.queue = grant.queue
        lifecycle.admitted_now(self._p, workflow.now())
        # Scheduling first: it is transient, so the new queue is published with the next
        # lasting state instead of costing an upsert of its own
        self._set_state("Scheduling", "admitted")
        self._event(
            "Normal", Reason.ADMITTED, f"admitted by queue {grant.queue} (quota {grant.node})"
        )

    async def _back_off(self) -> bool:
        """Wait out a re-queue backoff (a durable timer) before queueing again; False
        when a suspension came first."""
        left = lifecycle.backoff_left(self._p, workflow.now())
        if left > 0:
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: self._suspension.wanted,
                    timeout=left,
                    timeout_summary=f"re-queue backoff {left:g}s",
                )
            if self._suspension.wanted:
                return False
        if self._p.requeue_at is not None:
            self._announce(lifecycle.backoff_over(self._p))
        return True

    async def _requeue(self, cause: RequeueCause) -> None:
        """A placement or pods-ready timeout: purge every copy, then queue again after a
        backoff or, past requeueLimit, end Failed (``lifecycle.requeue_after_timeout``);
        the quota goes back either way."""
        cluster = self._p.view.cluster
        await self._purge_all(f"purge on {cause.value}")
        self._announce(
            lifecycle.requeue_after_timeout(
                self._p, self._requeue_settings, cause, workflow.now(), cluster=cluster
            )
        )
        await self._release_quota()

    async def _unschedulable(self, verdict: PlacementVerdict) -> bool:
        """No member could ever hold the gang: give the quota back and say why (True);
        False when some member could (waiting for room helps)."""
        notices = lifecycle.unschedulable(self._p, verdict)
        if not notices:
            return False
        self._announce(notices)
        if self._pol.queued:
            await self._release_quota()
        return True

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
            if verdict.candidates or not verdict.never:
                self._announce(lifecycle.unparked(self._p, queued=self._pol.queued))
                return
            info = workflow.info()
            if lifecycle.continue_as_new_due(
                info.get_current_history_length(), info.is_continue_as_new_suggested()
            ):
                await self._continue_as_new()

    def _placement_input(self) -> PlacementInput:
        """One placement round's input: the gang, the policy's cluster filters, the
        members it was evicted from."""
        view = self._p.view
        placement = self._pol.spec.placement
        affinity = (
            placement.clusterAffinity.model_dump(exclude_none=True)
            if placement.clusterAffinity is not None
            else None
        )
        return PlacementInput(
            job_ref=f"{view.namespace}/{view.name}",
            gang=GangShape.from_gang(self._gang),
            affinity=affinity,
            cluster_groups=[t.model_dump(exclude_none=True) for t in placement.cluster_affinities],
            group=view.cluster_group,
            cluster_tolerations=[
                t.model_dump(exclude_none=True) for t in placement.clusterTolerations
            ],
            exclude=list(view.evicted),
            job_id=self._ref.workflow_id,
        )

    @property
    def _requeue_settings(self) -> RequeueSettings:
        return self._p.resolution.requeue

    def _show_admissibility(self) -> None:
        """Inadmissible (never admitted under the current tree, and why) or queued
        again, as the quota workflow's last ``admissibility`` signal says."""
        p = self._p
        news, p.admissibility_news = p.admissibility_news, False
        if not news or p.admissibility is None:
            return
        why = p.admissibility.inadmissible
        if why is not None:
            if self._p.view.reason != why.message:
                self._set_state("Inadmissible", why.message)
                self._event("Warning", Reason.INADMISSIBLE, why.message)
        elif self._p.view.state == "Inadmissible":
            self._set_state("Queued", "waiting for quota")
            self._event("Normal", Reason.QUEUED, "the quota tree changed: queued again")

    async def _refresh_resolution(self) -> Resolution:
        """Look the quota tree up again, keeping the policy already resolved."""
        res = await self._resolve("resolve quota tree")
        res.policy = self._p.resolution.policy
        return res

    async def _resolve(self, summary: str) -> Resolution:
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

    async def _schedule(self) -> bool:
        """Place, reserve and bind; retries with backoff while nothing fits. Returns False
        when the job can never be placed (every cluster excluded)."""
        delay = PLACEMENT_BACKOFF.initial
        #: capacity preemption may be asked for in this placement (the placement activity
        #: reads whether the tree allows it); decided once a round found no room, at the
        #: start of the next one: the patch marker then comes first in its workflow task
        #: (after a local activity's marker in the same task, a query's replay refused it
        #: as nondeterministic)
        capacity: bool | None = None
        no_room = False
        while True:
            gate = job_machine.placement_gate(
                self._p, granted=self._grant is not None, settings=self._requeue_settings,
                now=workflow.now(),
            )
            if gate != Gate.PLACE:
                return await self._stop_placing(gate)
            self._set_state("Scheduling", "evaluating member clusters")
            round_input = self._placement_input()
            if capacity is None and no_room:
                capacity = self._capacity_asked()
            verdict = await self._plan_placement(round_input, capacity=bool(capacity))
            no_room = lifecycle.no_room(verdict)
            placed = await self._place_round(verdict, capacity=bool(capacity))
            if placed is not None:
                return placed
            pause = job_machine.retry_pause(
                self._p, delay, capacity=bool(capacity), granted=self._grant is not None,
                settings=self._requeue_settings, now=workflow.now(),
            )
            await self._sleep_or_retry(pause, f"retry placement in {int(pause)}s")
            if self._suspension.wanted or self._p.preempt is not None:
                return True  # the lifecycle suspends, or is preempted (nothing was bound)
            delay = PLACEMENT_BACKOFF.after(delay)

    async def _stop_placing(self, gate: Gate) -> bool:
        """A placement round that does not run: False when the job failed."""
        if gate == Gate.DEADLINE:
            await self._deadline_exceeded()
            return False
        if gate == Gate.TIMED_OUT:
            await self._requeue(RequeueCause.PLACEMENT_TIMEOUT)
        # queued again after a backoff, or Failed past the limit; or preempted: the
        # lifecycle carries the preemption out (nothing is bound)
        return True

    async def _place_round(self, verdict: PlacementVerdict, *, capacity: bool) -> bool | None:
        """Bind on the first candidate that takes the job (True); False when no member
        ever could; None when the job waits Pending for the next round. The round's
        course is ``job_machine.round_step``'s; this carries its commands out."""
        if capacity:
            self._announce(lifecycle.observe_capacity(self._p, verdict, workflow.now()))
        current = job_machine.start_round(verdict, self._p if capacity else None)
        commands = job_machine.round_step(current)
        while commands:
            command = commands.pop(0)
            if isinstance(command, job_machine.Show):
                self._announce(list(command.notices))
            elif isinstance(command, job_machine.ReleaseReservations):
                await self._copies.purge(command.cluster, "release reservations")
            elif isinstance(command, job_machine.BindOn):
                event = await self._bind(command.candidate)
                if isinstance(event, job_machine.Bound):
                    self._bound(command.candidate, current.rejections)
                commands = job_machine.round_step(current, event)
            elif command == job_machine.RoundEnd.PLACED:
                return True
            else:
                self._p.view.rejections = current.rejections
                if command == job_machine.RoundEnd.NEVER:
                    return False
        if await self._unschedulable(verdict):
            return True  # holds no quota; the lifecycle waits for node changes
        await self._no_room(current, capacity=capacity)
        return None

    async def _no_room(self, current: job_machine.Round, *, capacity: bool) -> None:
        """Nothing fits now: say why (``FailedScheduling``), make room by capacity
        preemption when the tree allows it, and wait Pending."""
        for cluster in current.rejections:
            if cluster in current.codes:  # (histories from before codes: metrics are off)
                metrics.placement_failure(current.codes[cluster])
        # every round, aggregated: "FailedScheduling (x7 over 21m)"
        reason = lifecycle.pending_reason(current.rejections)
        self._event("Warning", Reason.FAILED_SCHEDULING, reason)
        plan = job_machine.room_plan(self._p, current, capacity=capacity)
        if plan is not None:
            await self._preempt_for_room(plan)
        self._announce([job_machine.pending(self._p, current, capacity=capacity)])

    async def _plan_placement(
        self, placement: PlacementInput, *, capacity: bool
    ) -> PlacementVerdict:
        """One placement round (a local activity); with ``capacity``, also the capacity
        preemption part: plan one when none is outstanding, else which victims are left."""
        if capacity:
            placement = placement.model_copy(
                update={
                    "job_id": self._ref.workflow_id,
                    "tree_workflow_id": self._p.resolution.tree_workflow_id,
                    "capacity_preemption": lifecycle.may_plan_capacity(self._p),
                    "planned": lifecycle.planned_capacity(self._p),
                }
            )
        return await activity_calls.execute_local(
            activity_refs.PLAN_PLACEMENT,
            placement,
            start_to_close_timeout=timedelta(seconds=60),
            retry_policy=MEMBER_RETRY,
            summary="capacity and gang placement",
        )

    def _capacity_asked(self) -> bool:
        """Whether this placement may consider capacity preemption: the job holds quota
        from a quota workflow."""
        return self._grant is not None and self._p.resolution.tree_workflow_id is not None

    async def _preempt_for_room(self, plan: CapacityPlanned) -> None:
        """Carry out a capacity preemption: record it, then tell each victim to stop
        (its own ``preempt`` path: grace period, purge, release, queue again)."""
        self._announce(lifecycle.start_capacity_preemption(self._p, plan, workflow.now()))
        sent = await asyncio.gather(*(self._preempt_victim(v) for v in plan.victims))
        lifecycle.victims_gone(
            self._p, [v.job_id for v, ok in zip(plan.victims, sent, strict=True) if not ok]
        )

    async def _preempt_victim(self, victim: CapacityVictim) -> bool:
        """Send one victim ``preempt``; False when its workflow is gone."""
        signal = PreemptSignal(
            preemptor=self._ref.workflow_id,
            reason=PreemptionReason.CAPACITY.value,
            message=victim.message,
            grace_seconds=victim.grace_seconds,
        )
        try:
            await workflow.get_external_workflow_handle(victim.job_id).signal("preempt", signal)
        except Exception as exc:  # the victim's workflow is gone (its pods go with it)
            workflow.logger.info("capacity preemption of %s not delivered: %s", victim.job_id, exc)
            return False
        metrics.preemption(PreemptionReason.CAPACITY.value)
        return True

    async def _wake_preemptor(self, signal: PreemptSignal | None) -> None:
        """A capacity victim that has stopped wakes its preemptor (``retry_placement``),
        so it places now instead of after a backoff."""
        if signal is None or signal.reason != PreemptionReason.CAPACITY.value:
            return
        with contextlib.suppress(Exception):  # the preemptor is gone: nobody to wake
            await workflow.get_external_workflow_handle(signal.preemptor).signal(
                "retry_placement"
            )

    async def _bind(self, cand: Candidate) -> job_machine.RoundEvent:
        """Reserve (where the member reserves) and bind on one candidate, one activity."""
        try:
            outcome = await self._copies.write(
                cand.cluster,
                activity_calls.execute(
                    activity_refs.BIND,
                    BindInput(
                        cluster=cand.cluster,
                        request=BindRequest(
                            job=self._ref,
                            manifest=self._input.manifest,
                            propagate_deps=self._pol.spec.propagateDeps,
                            run_seconds=self._input.run_seconds,
                            priority=self._gang.priority,
                            labels=dict(self._p.preserved_labels),
                        ),
                        reserve=self._reserve_request(cand) if cand.reservation else None,
                    ),
                    start_to_close_timeout=timedelta(seconds=60),
                    retry_policy=MEMBER_RETRY,
                    summary=f"bind {self._ref.name} on {cand.cluster}",
                ),
            )
        except ActivityError as exc:
            return job_machine.BindFailed(cand.cluster, str(exc.cause or exc), cand.reservation)
        if outcome.reservation_lost:
            return job_machine.ReservationLost(cand.cluster, outcome.reservation_lost)
        return job_machine.Bound(cand.cluster)

    def _bound(self, cand: Candidate, rejections: dict[str, str]) -> None:
        """The job is bound on ``cand``: record it, arm its bounds, say so."""
        lifecycle.record_bind(self._p, cand.cluster, rejections, workflow.now(), cand.group)
        metrics.time_to_bind(self._p.view)
        if self._grant is not None:  # the quota it holds comes back if its pods never run
            lifecycle.arm_pods_ready(self._p, self._requeue_settings, workflow.now())
        self._arm_deadline()
        self._event(
            "Normal",
            Reason.BOUND,
            "Binding has been scheduled successfully. Result: "
            + binding_result(cand.cluster, self._gang)
            + lifecycle.group_note(cand.group),
        )
        self._set_state("Created", f"bound to {cand.cluster}")

    def _reserve_request(self, cand: Candidate) -> ReserveRequest:
        """The gang's reservations on ``cand``'s member, each pod on its assigned node."""
        pods = [
            PodReservation(
                role=p.role,
                index=p.index,
                node=cand.assignment.get(p.name_suffix, ""),
                requests=p.requests,
                node_selector=p.node_selector,
                tolerations=list(p.tolerations),
            )
            for p in self._gang.pods
        ]
        return ReserveRequest(job=self._ref, pods=pods)

    async def _supervise(self) -> Supervision:
        """Watch the bound copy until the job ends, fails over, is suspended or preempted,
        or history asks for continue-as-new: wait for the next event, take the step
        (``job_machine.step``), carry its commands out."""
        watching = job_machine.Watching(
            tolerance=self._tolerance,
            failover=self._pol.application_failover is not None,
            pods=len(self._gang.pods),
            active_deadline_seconds=self._job.active_deadline_seconds,
            rewatch_seconds=self._input.rewatch_seconds,
        )
        self._watch = None
        while True:
            event = await self._next_watch_event(watching)
            self._progress, commands = job_machine.step(self._p, event, workflow.now(), watching)
            for command in commands:
                outcome = await self._carry_out(command, watching)
                if outcome is not None:
                    return outcome

    async def _next_watch_event(self, watching: job_machine.Watching) -> job_machine.Event:
        """Wait for what happens next to the bound job: a watch returns, its next deadline
        fires, a signal asks for a suspension or preempts, a deferred purge ends."""
        cluster = self._p.view.cluster
        assert cluster is not None
        deadline = job_machine.next_deadline(self._p, watching, workflow.now())
        # A near deadline is slept out on a timer alone: a watch answering at once
        # would cancel a timer the server is firing (temporalio/sdk-java#2606).
        if deadline is not None and deadline.near:
            if deadline.seconds > 0:  # a timer alone: nothing cancels it as it fires
                await workflow.sleep(deadline.seconds, summary=deadline.summary)
            if self._suspension.wanted:
                return job_machine.Suspend()
            return job_machine.Timer(deadline.due)
        if self._watch is None:  # else a deadline fired mid-window: keep waiting on it
            self._watch_settling = self._sa_settling
            self._watch = self._start_watch(cluster, self._watch_settling)
            window = lifecycle.SA_SETTLE_SECONDS if self._watch_settling else WATCH_SECONDS
            self._watch_ends = workflow.now() + timedelta(seconds=window)
        current = self._watch
        window_left = (self._watch_ends - workflow.now()).total_seconds()
        # a deadline the watch's return comes before needs no timer (job_machine.arms_timer)
        timed = deadline if job_machine.arms_timer(deadline, window_left) else None
        try:
            await workflow.wait_condition(
                lambda: (
                    current.done()
                    or self._copies.purger_finished()
                    or self._suspension.wanted
                    or self._preempt_wake
                ),
                timeout=None if timed is None else timed.timer_seconds,
                timeout_summary=None if timed is None else timed.summary,
            )
        except TimeoutError:
            assert timed is not None
            return job_machine.Timer(timed.due)
        if self._suspension.wanted:
            return job_machine.Suspend()
        if self._preempt_wake:  # preempted: wait for its grace period from now on
            self._preempt_wake = False
            return job_machine.Preempt()
        if not current.done():  # a copy left on a returning member was purged
            return job_machine.PurgerDone()
        self._watch = None
        return job_machine.Status(self._watch_result(current, cluster), self._watch_settling)

    @staticmethod
    def _watch_result(watch: ActivityHandle[JobStatus], cluster: str) -> JobStatus:
        try:
            return watch.result()
        except ActivityError as exc:
            return lifecycle.unknown_status(cluster, str(exc.cause or exc))

    async def _carry_out(
        self, command: job_machine.Command, watching: job_machine.Watching
    ) -> Supervision | None:
        """Carry out one of ``step``'s commands; the watch's outcome when it ends it."""
        if isinstance(command, job_machine.End):
            return command.outcome
        if isinstance(command, job_machine.ContinueIfLong):
            info = workflow.info()
            if lifecycle.continue_as_new_due(
                info.get_current_history_length(), info.is_continue_as_new_suggested()
            ):
                return Supervision.CONTINUE
            return None
        if isinstance(command, job_machine.Show):
            self._announce(list(command.notices))
        elif isinstance(command, job_machine.FlushSettled):
            if self._sa_settling:  # still Created after the settle window
                self._publish(flush=True)
        elif isinstance(command, job_machine.CollectPurgers):
            self._copies.collect_purgers()
        else:
            await self._carry_out_write(command, watching)
        return None

    async def _carry_out_write(
        self, command: job_machine.Command, watching: job_machine.Watching
    ) -> None:
        """The commands that write to members or wait on a timer."""
        if isinstance(command, job_machine.PurgeGracefulOld):
            await self._purge_graceful_old(command.why)
        elif isinstance(command, job_machine.RetryPending):
            if self._copies.pending_unwatched():
                await self._copies.retry_pending()
        elif isinstance(command, job_machine.Failover):
            await self._failover(
                command.cluster, command.why, cluster_failure=command.cluster_failure
            )
        elif isinstance(command, job_machine.DeadlineExceeded):
            await self._deadline_exceeded()
        elif isinstance(command, job_machine.Rewatch):
            # the watch window ended quietly: pause on a durable timer before the next
            # one (bounded by the next failover/grace deadline)
            pause = job_machine.rewatch_pause(self._p, watching, workflow.now())
            await self._sleep_or_retry(pause.seconds, pause.summary)

    @property
    def _tolerance(self) -> int | None:
        fo = self._pol.application_failover
        return fo.decisionConditions.tolerationSeconds if fo else None

    def _start_watch(self, cluster: str, settling: bool) -> ActivityHandle[JobStatus]:
        watch = activity_calls.start(
            activity_refs.WATCH_STATUS,
            WatchInput(
                cluster=cluster,
                job=self._ref,
                since=self._p.since,
                timeout_seconds=lifecycle.SA_SETTLE_SECONDS if settling else WATCH_SECONDS,
                cluster_tolerations=[
                    t.model_dump(exclude_none=True)
                    for t in self._pol.spec.placement.clusterTolerations
                ],
            ),
            start_to_close_timeout=timedelta(seconds=WATCH_SECONDS + 60),
            heartbeat_timeout=timedelta(seconds=30),
            retry_policy=MEMBER_RETRY,
            # A watch is read-only and ends by itself at its window or when its copy goes
            # away: it is never cancelled, only waited for before the workflow closes.
            cancellation_type=ActivityCancellationType.ABANDON,
            summary=f"watch {self._ref.name} on {cluster}",
        )
        self._watches = [w for w in self._watches if not w.done()] + [watch]
        return watch

    # ================================================================== failover
    async def _failover(self, old: str, why: str, *, cluster_failure: bool = False) -> None:
        """Evict the job from ``old`` (``why``: ``unhealthy on cluster-a for 30s``, or a
        NoExecute taint that outlasted its toleration: ``cluster_failure``) and place it
        elsewhere, doing with the old copy what the policy's purgeMode says."""
        view = self._p.view
        plan = lifecycle.failover_plan(
            self._pol.application_failover,
            strict_fencing=self._pol.strict_fencing,
            cluster=self._pol.cluster_failover if cluster_failure else None,
        )
        metrics.failover(old, plan.mode_name)
        self._set_state("FailingOver", why)
        self._event("Warning", Reason.FAILOVER_STARTED, plan.started_message(why))
        self._preserve_state(old, plan.mode, cluster_failure)
        after = lifecycle.evicted_after(self._p, workflow.now(), taint=cluster_failure)
        lifecycle.leave_cluster(self._p, old)
        if plan.old_copy == OldCopy.CONFIRM_GONE:
            self._set_state(
                "FailingOver",
                f"waiting until {old} confirms the old copy is gone (fleetq.io/fencing: Strict)",
            )
            await self._copies.await_purger(old, confirm=True)
        elif plan.old_copy == OldCopy.PURGE_FIRST:
            await self._copies.purge_or_defer(old)
        else:
            lifecycle.keep_old_copy(self._p, old, plan, workflow.now())
        deferred = lifecycle.purge_deferred(view, old)
        if plan.old_copy == OldCopy.PURGE_FIRST and not deferred:
            lifecycle.forget_copy(view, old)  # purged: no copy, no AGE left there
        self._event("Normal", Reason.EVICTED, plan.evicted_message(old, after=after,
                                                                   deferred=deferred))
        placed = await self._schedule()
        if placed and view.cluster is not None:  # (not when a suspension came first)
            self._event("Normal", Reason.RESCHEDULED, f"rescheduled from {old} to {view.cluster}")

    def _preserve_state(self, old: str, purge: PurgeMode, cluster_failure: bool) -> None:
        """statePreservation: the labels the next copy carries, read from the status of
        the copy on ``old`` as last synced (none, with a Warning, when a rule fails)."""
        try:
            labels = state_preservation.labels_at_failover(
                self._pol, purge, self._p.synced_status, cluster_failure=cluster_failure
            )
        except state_preservation.PreservationError as exc:
            self._p.preserved_labels = {}
            self._event("Warning", Reason.STATE_NOT_PRESERVED,
                        f"{exc}; the new copy carries no preserved labels")
            return
        self._p.preserved_labels = labels
        if labels:
            shown = ", ".join(f"{k}={v}" for k, v in sorted(labels.items()))
            self._event("Normal", Reason.STATE_PRESERVED,
                        f"from the copy on {old}, the new copy carries labels {shown}")

    # ================================================================== runPolicy
    def _arm_deadline(self) -> None:
        """Arm runPolicy.activeDeadlineSeconds at a bind (see lifecycle.deadline_to_arm)."""
        view = self._p.view
        seconds = self._job.active_deadline_seconds
        if seconds is not None and lifecycle.deadline_to_arm(view, seconds):
            view.deadline_at = lifecycle.deadline_at(seconds, workflow.now())

    async def _deadline_exceeded(self) -> None:
        """Fail the job with reason DeadlineExceeded: every copy purged; the quota is
        released as the workflow ends."""
        why = lifecycle.deadline_exceeded_reason(self._job.active_deadline_seconds)
        self._event("Warning", Reason.DEADLINE_EXCEEDED, why)
        await self._purge_all("purge on DeadlineExceeded")
        self._set_state("Failed", why)

    async def _purge_all(self, why: str) -> None:
        """Purge every copy the job has (current, left behind, pending), each until done."""
        view = self._p.view
        for cluster in lifecycle.copies_to_purge(self._p):
            await self._copies.purge_until_done(cluster, why)
        view.copies, view.pending_purges = [], []
        self._p.graceful_old, self._p.grace_deadline = None, None
        await self._settle_watches()

    async def _suspend(self) -> None:
        """runPolicy.suspend / the suspend signal: purge every copy, give the quota back,
        wait in Suspended until resumed, then queue again with the original submit time."""
        view = self._p.view
        self._suspension.begin()
        self._p.preempt, self._p.preempt_at = None, None  # the quota goes back anyway
        in_queue = self._grant is not None or view.state in ("Queued", "Inadmissible")
        had_copy = bool(view.cluster or view.copies or view.pending_purges)
        self._event("Normal", Reason.SUSPENDED, lifecycle.suspended_message(had_copy))
        await self._purge_all("purge on suspend")
        lifecycle.forget_placement(self._p)
        if in_queue:
            await self._release_quota()
        view.admitted, view.queue = False, None
        self._set_state(
            "Suspended", "suspended: holds no quota; resume with fleetq resume (signal resume)"
        )
        while not self._suspension.resume_wanted:
            await workflow.wait_condition(
                lambda: self._suspension.resume_wanted or self._grant is not None
            )
            if self._grant is not None:  # a grant that crossed our cancel: give it back
                await self._release_quota()
        self._suspension.end()
        self._event("Normal", Reason.RESUMED, "resumed: placed again from the queue")
        self._set_state("Queued" if self._pol.queued else "Scheduling", "resumed")

    async def _preempted(self) -> None:
        """Carry out a preemption (its grace period is over, or nothing was bound):
        purge every copy, then give the quota back and queue again with the original
        submit time; the preemptor is admitted once the quota workflow has it back."""
        signal = self._p.preempt
        await self._purge_all("purge on preemption")
        await self._wake_preemptor(signal)
        self._announce(lifecycle.requeue_after_preemption(self._p))
        await self._requeue_quota()

    async def _requeue_quota(self) -> None:
        """Give the quota back and queue again with the original submit time in one
        message (``requeue``), so the job is in its queue before the pass that hands out
        what it freed: no later job of its priority takes that room (issue 24). The
        next admission wait then sends no ``enqueue`` (``JobProgress.requeued_in``)."""
        tree_id = self._p.resolution.tree_workflow_id
        if self._policy is None or not self._policy.queued or tree_id is None:
            return
        if self._grant is None:  # nothing held: leave the queue as before
            await self._release_quota()
            return
        self._grant = None  # (a grant of the new wait may arrive while this is sent)
        try:
            sent = await self._signal_quota(
                QuotaSignal(
                    tree_workflow_id=tree_id, signal="requeue", request=self._admission_request()
                ),
                f"requeue in {tree_id}",
            )
        except ActivityError as exc:  # its leak check returns the quota within a minute
            if cancelled_by_delete(exc):
                raise
            workflow.logger.warning("could not requeue in %s: %s", tree_id, exc)
        else:
            if sent:
                self._p.requeued_in = tree_id
            else:
                workflow.logger.info("requeue: quota workflow %s is not running", tree_id)

    async def _purge_graceful_old(self, why: str) -> None:
        old = self._p.graceful_old
        self._p.graceful_old, self._p.grace_deadline = None, None
        if old:
            await self._copies.purge_or_defer(old)
            if not lifecycle.purge_deferred(self._p.view, old):  # (else PurgeDeferred)
                lifecycle.forget_copy(self._p.view, old)
                self._event("Normal", Reason.PURGED, f"old copy on {old} purged: {why}")

    # ================================================================== endings
    async def _finish(self) -> None:
        view = self._p.view
        # Reservations were consumed by the pods; delete leftovers on every copy we hold.
        for cluster in list(view.pending_purges):
            await self._copies.purge_until_done(cluster, "purge copy left while unreachable")
            if cluster in view.pending_purges:  # not purged: PurgeFailed said why
                view.pending_purges.remove(cluster)
            else:  # its purger purged it (and took it off the list)
                self._event("Normal", Reason.PURGED,
                            f"copy on {cluster} purged as soon as it answered again")
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
        view = self._p.view
        self._event("Normal", Reason.DELETED, "job deleted from the fleet; purging member copies")
        in_flight = await self._copies.land_in_flight()  # purged after it lands
        for cluster in in_flight + lifecycle.copies_to_purge(self._p, current=False):
            await self._copies.purge_until_done(cluster, "purge on delete")
        view.copies, view.pending_purges, view.cluster = [], [], None
        await self._settle_watches()
        await self._release_quota()
        view.finished_at = workflow.now()
        self._set_state("Deleted", "deleted")

    async def _release_quota(self) -> None:
        tree_id = self._p.resolution.tree_workflow_id
        if self._policy is None or not self._policy.queued or tree_id is None:
            return
        signal = lifecycle.quota_return(granted=self._grant is not None)
        try:
            sent = await self._signal_quota(
                QuotaSignal(tree_workflow_id=tree_id, signal=signal, job_id=self._ref.workflow_id),
                f"{signal} quota in {tree_id}",
            )
        except ActivityError as exc:  # its leak check returns the quota within a minute
            workflow.logger.warning("could not signal %s to %s: %s", signal, tree_id, exc)
        else:
            if not sent:  # quota workflow gone: nothing is held there
                workflow.logger.info("%s: quota workflow %s is not running", signal, tree_id)
        self._grant = None

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

    async def _signal_quota(self, message: QuotaSignal, summary: str) -> bool:
        """Send one signal to the quota workflow (a local activity using the client: no
        workflow-to-workflow signal events or acknowledgement task); False when the
        quota workflow is not running.

        Retried until delivered (only deleting the job stops it): under overload the
        quota workflow may not answer for minutes (``fleetq bench workers``: 2,000 jobs on
        12 workers sharing 2 cores), and a message given up on is a job that waits for
        nothing or quota held by nobody. Retry policies are not part of a workflow's
        commands, so recorded histories replay unchanged."""
        return await activity_calls.execute_local(
            activity_refs.SIGNAL_QUOTA,
            message,
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(
                initial_interval=timedelta(seconds=1),
                maximum_interval=timedelta(seconds=10),
                maximum_attempts=0,  # unlimited
            ),
            summary=summary,
        )

    # ================================================================== helpers
    async def _sleep_or_retry(self, seconds: float, summary: str) -> None:
        self._retry_now = False
        with contextlib.suppress(TimeoutError):
            await workflow.wait_condition(
                lambda: self._retry_now, timeout=seconds, timeout_summary=summary
            )
        self._retry_now = False

    @property
    def _sa_settling(self) -> bool:
        return self._sa_enabled and lifecycle.settling(self._p.view, self._sa_last)

    @property
    def _suspension(self) -> lifecycle.Suspension:
        return self._p.suspension

    @property
    def _p(self) -> JobProgress:
        assert self._progress is not None, "the run's progress exists once the run starts"
        return self._progress

    @property
    def _preemption_policy(self) -> JobPreemptionPolicy:
        """The job's ``fleetq.io/preemptible`` and grace period (refused at start when
        unreadable; a job started before that check keeps the defaults)."""
        try:
            return job_policy(self._job)
        except ManifestError:
            return JobPreemptionPolicy()

    @property
    def _pol(self) -> PropagationPolicy:
        assert self._policy is not None, "policy is resolved before any phase runs"
        return self._policy

    def _summary_line(self) -> str:
        return self._gang.summary_line(self._job.metadata.namespace, self._job.metadata.name)

    def _announce(self, notices: list[Notice]) -> None:
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
        holding = self._grant is not None
        if (
            not holding
            and signal.reason == PreemptionReason.CAPACITY.value
            and self._progress.view.cluster is not None
        ):
            holding = True  # a bound job of a policy without quota: it still makes room
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


def _read_input(arg: RawValue) -> tuple[JobInput, PyTorchJob]:
    """The workflow's input and its manifest, or one line naming what is wrong."""
    try:
        decoded = workflow.payload_converter().from_payload(arg.payload)
    except Exception as exc:  # not JSON, nested too deep, ...
        raise invalid_input(
            f"workflow input is not a JSON object ({type(exc).__name__})"
        ) from None
    try:
        inp = JobInput.from_arg(decoded)
    except InvalidJobInput as exc:
        raise invalid_input(str(exc)) from None
    try:
        job = parse_job(inp.manifest)
    except ManifestErrors as exc:
        raise invalid_input(str(exc)) from None
    ns, name = job.metadata.namespace, job.metadata.name
    expected = job_workflow_id(ns, name)
    if workflow.info().workflow_id != expected:
        raise invalid_input(
            f"PyTorchJob {ns}/{name}: workflow id must be {expected!r} "
            f"(got {workflow.info().workflow_id!r})"
        )
    notes = job.metadata.annotations
    if inp.progress is None and (PREEMPTIBLE_ANNOTATION in notes or GRACE_ANNOTATION in notes):
        try:
            job_policy(job)
        except ManifestError as exc:
            raise invalid_input(str(exc)) from None
    return inp, job


def _search_attributes_at_start() -> dict[str, Any]:
    """fleetq's search attributes the run started with (set by ``fleetq apply`` at
    submission, or carried over by continue-as-new), so they are not upserted again."""
    out: dict[str, Any] = {}
    for pair in workflow.info().typed_search_attributes:
        if pair.key.name in (SA_STATE, SA_CLUSTER, SA_QUEUE, SA_JOB, SA_NAMESPACE, SA_PRIORITY):
            out[pair.key.name] = pair.value
    return out
