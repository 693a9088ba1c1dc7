"""The job workflow watching its bound copy: wait for the next event (a watch returns,
a deadline's timer fires, a signal suspends or preempts, a deferred purge ends), take
``fleetq.job_machine.step`` and carry its commands out.

Part of ``PyTorchJobWorkflow`` (``workflows/pytorch_job.py``), on ``job_placing`` (a
failover places again). Status is change-driven: a watch returns when the copy's
status changes or its window ends; a deadline beyond the window needs no timer.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError
from temporalio.workflow import ActivityCancellationType, ActivityHandle

from workflows import activity_calls
from workflows.job_effects import MEMBER_RETRY
from workflows.job_placing import JobPlacing

with workflow.unsafe.imports_passed_through():
    from fleetq import activity_refs, job_machine, job_phases, lifecycle
    from fleetq.job_machine import Supervision
    from fleetq.messages import JobStatus, WatchInput

WATCH_SECONDS = 300.0


class JobWatching(JobPlacing):
    """Supervising the bound copy through ``job_machine.step``."""

    async def _supervise(self) -> Supervision:
        """Watch the bound copy until the job ends, fails over, is suspended or preempted,
        or history asks for continue-as-new: wait for the next event, take the step
        (``job_machine.step``), carry its commands out."""
        watching = job_phases.watching(self._pol, self._gang, self._job,
                                       self._input.rewatch_seconds)
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
        first, self._bind_status = self._bind_status, None
        if first is not None and not (self._suspension.wanted or self._preempt_wake):
            # the bind's own first watch (``FirstWatch``) answered: the settle window is over
            return job_machine.Status(first, self._sa_settling)
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
        return job_machine.Status(_watch_result(current, cluster), self._watch_settling)

    async def _carry_out(
        self, command: job_machine.Command, watching: job_machine.Watching
    ) -> Supervision | None:
        """Carry out one of ``step``'s commands; the watch's outcome when it ends it."""
        if isinstance(command, job_machine.End):
            return command.outcome
        if isinstance(command, job_machine.ContinueIfLong):
            return Supervision.CONTINUE if self._history_long() else None
        if isinstance(command, job_machine.Show):
            self._announce(command.notices)
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

    async def _purge_graceful_old(self, why: str) -> None:
        """purgeMode Gracefully: the old copy goes now (``why``), or is deferred."""
        old = job_phases.take_graceful_old(self._p)
        if old:
            await self._copies.purge_or_defer(old)
            self._announce(job_phases.old_copy_purged(self._p, old, why))

    def _start_watch(self, cluster: str, settling: bool) -> ActivityHandle[JobStatus]:
        watch = activity_calls.start(
            activity_refs.WATCH_STATUS,
            WatchInput(
                cluster=cluster,
                job=self._ref,
                since=self._p.since,
                timeout_seconds=lifecycle.SA_SETTLE_SECONDS if settling else WATCH_SECONDS,
                cluster_tolerations=job_phases.cluster_tolerations(self._pol),
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


def _watch_result(watch: ActivityHandle[JobStatus], cluster: str) -> JobStatus:
    try:
        return watch.result()
    except ActivityError as exc:
        return lifecycle.unknown_status(cluster, str(exc.cause or exc))
