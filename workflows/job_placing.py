"""The job workflow placing its gang: placement rounds with backoff, each candidate's
member write (reserve and bind, one activity), capacity preemption of victims when
nothing fits, Unschedulable when no member ever could, and a failover's placement.

Part of ``PyTorchJobWorkflow`` (``workflows/pytorch_job.py``), on ``job_queueing``. A
round's course is ``fleetq.job_machine.round_step``'s; what a bind, a failover and a
passed deadline record is ``fleetq.job_phases``'; this carries their commands out.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

from workflows import activity_calls
from workflows.job_effects import MEMBER_RETRY
from workflows.job_queueing import JobQueueing

with workflow.unsafe.imports_passed_through():
    from fleetq import activity_refs, job_machine, job_phases, lifecycle
    from fleetq.handler_refs import JobHandlers
    from fleetq.job_machine import Gate
    from fleetq.lifecycle import OldCopy, RequeueCause
    from fleetq.messages import Candidate, CapacityPlanned, CapacityVictim, PreemptSignal
    from fleetq.messages import PlacementVerdict as Verdict
    from fleetq.preemption import PreemptionReason
    from workflows import metrics


class JobPlacing(JobQueueing):
    """Placing, binding, making room, failing over."""

    async def _schedule(self) -> bool:
        """Place, reserve and bind; retries with backoff while nothing fits. Returns False
        when the job can never be placed. The phase's course is
        ``job_machine.Placing.step``'s; this carries its commands out."""
        placing = job_machine.Placing()
        event: job_machine.PlacingEvent = job_machine.NextRound()
        while True:
            commands = placing.step(self._p, event, granted=self._grant is not None,
                                    settings=self._requeue_settings, now=workflow.now())
            for command in commands:
                if isinstance(command, job_machine.Show):
                    self._announce(command.notices)
                elif isinstance(command, job_machine.StopPlacing):
                    return await self._stop_placing(command.gate)
                elif isinstance(command, job_machine.Placed):
                    return command.placed
                elif isinstance(command, job_machine.Plan):
                    # capacity preemption is asked for from the round after one that
                    # found no room (job_machine.Placing.round_capacity); the round's
                    # bind follows it, so the worker assumes the gang on its nodes
                    placement = self._placement_input().model_copy(update={"assume": True})
                    verdict = await self._plan_placement(placement, capacity=command.capacity)
                    event = job_machine.Planned(verdict)
                elif isinstance(command, job_machine.PlaceRound):
                    placed = await self._place_round(command.verdict, capacity=command.capacity)
                    event = job_machine.RoundOver(placed)
                else:
                    await self._sleep_or_retry(command.seconds, command.summary)
                    event = job_machine.NextRound()

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

    async def _place_round(self, verdict: Verdict, *, capacity: bool) -> bool | None:
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
                self._announce(command.notices)
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

    async def _unschedulable(self, verdict: Verdict) -> bool:
        """No member could ever hold the gang: give the quota back and say why (True);
        False when some member could (waiting for room helps)."""
        notices = lifecycle.unschedulable(self._p, verdict)
        if not notices:
            return False
        self._announce(notices)
        if self._pol.queued:
            await self._release_quota()
        return True

    async def _no_room(self, current: job_machine.Round, *, capacity: bool) -> None:
        """Nothing fits now: say why (``FailedScheduling``), make room by capacity
        preemption when the tree allows it, and wait Pending."""
        for cluster in current.rejections:
            if cluster in current.codes:  # (histories from before codes: metrics are off)
                metrics.placement_failure(current.codes[cluster])
        self._announce([job_phases.failed_scheduling(current.rejections)])
        plan = job_machine.room_plan(self._p, current, capacity=capacity)
        if plan is not None:
            await self._preempt_for_room(plan)
        self._announce([job_machine.pending(self._p, current, capacity=capacity)])

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
            await workflow.get_external_workflow_handle(victim.job_id).signal(
                JobHandlers.PREEMPT.name, signal)
        except Exception as exc:  # the victim's workflow is gone (its pods go with it)
            workflow.logger.info("capacity preemption of %s not delivered: %s", victim.job_id, exc)
            return False
        metrics.preemption(PreemptionReason.CAPACITY.value)
        return True

    async def _bind(self, cand: Candidate) -> job_machine.RoundEvent:
        """Reserve (where the member reserves) and bind on one candidate, then watch the
        new copy over the settle window: one activity (its answer is the first watch's,
        ``_bind_status``)."""
        bind = job_phases.bind_input(self._p, cand, job=self._ref, inp=self._input,
                                     policy=self._pol, gang=self._gang,
                                     settling=self._sa_enabled)
        watch_seconds = bind.watch.timeout_seconds if bind.watch is not None else 0.0
        self._bind_status = None
        try:
            outcome = await self._copies.write(
                cand.cluster,
                activity_calls.execute(
                    activity_refs.BIND,
                    bind,
                    start_to_close_timeout=timedelta(seconds=60 + watch_seconds),
                    retry_policy=MEMBER_RETRY,
                    summary=f"bind {self._ref.name} on {cand.cluster}",
                ),
            )
        except ActivityError as exc:
            return job_machine.BindFailed(cand.cluster, str(exc.cause or exc), cand.reservation)
        if outcome.reservation_lost:
            return job_machine.ReservationLost(cand.cluster, outcome.reservation_lost)
        self._bind_status = outcome.status
        return job_machine.Bound(cand.cluster)

    def _bound(self, cand: Candidate, rejections: dict[str, str]) -> None:
        """The job is bound on ``cand``: record it, arm its bounds, say so."""
        notices = job_phases.bound(
            self._p, cand, rejections, gang=self._gang, granted=self._grant is not None,
            settings=self._requeue_settings,
            active_deadline_seconds=self._job.active_deadline_seconds, now=workflow.now(),
        )
        metrics.time_to_bind(self._p.view)
        self._announce(notices)

    async def _failover(self, old: str, why: str, *, cluster_failure: bool = False) -> None:
        """Evict the job from ``old`` (``why``: ``unhealthy on cluster-a for 30s``, or a
        NoExecute taint that outlasted its toleration: ``cluster_failure``) and place it
        elsewhere, doing with the old copy what the policy's purgeMode says."""
        plan, notices = job_phases.start_failover(
            self._p, self._pol, old, why, cluster_failure=cluster_failure
        )
        metrics.failover(old, plan.mode_name)
        self._announce(notices)
        after, notices = job_phases.leave(
            self._p, old, plan, cluster_failure=cluster_failure, now=workflow.now()
        )
        self._announce(notices)
        if plan.old_copy == OldCopy.CONFIRM_GONE:
            await self._copies.await_purger(old, confirm=True)
        elif plan.old_copy == OldCopy.PURGE_FIRST:
            await self._copies.purge_or_defer(old)
        self._announce(job_phases.evicted(self._p, old, plan, after))
        if await self._schedule():  # (no Rescheduled when a suspension came first)
            self._announce(job_phases.rescheduled(self._p, old))

    async def _deadline_exceeded(self) -> None:
        """Fail the job with reason DeadlineExceeded: every copy purged; the quota is
        released as the workflow ends."""
        said, failed = job_phases.deadline_exceeded(self._job.active_deadline_seconds)
        self._announce([said])
        await self._purge_all("purge on DeadlineExceeded")
        self._announce([failed])
