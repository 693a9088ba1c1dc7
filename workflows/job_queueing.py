"""The job workflow and its quota workflow: resolving the policy and quota tree, waiting
Queued (or Inadmissible) for the grant, backing off before queueing again, giving the
quota back (``release`` / ``cancel``) or queueing again with it (``requeue``).

Part of ``PyTorchJobWorkflow`` (``workflows/pytorch_job.py``), on ``job_effects``:
messages to the quota workflow are local activities using the client, retried until
delivered. What is asked for and shown is ``fleetq.job_phases``' and
``fleetq.lifecycle``'s.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

from workflows import activity_calls
from workflows.job_effects import JobEffects

with workflow.unsafe.imports_passed_through():
    from fleetq import activity_refs, job_phases, job_queue, lifecycle
    from fleetq.admission import AdmissionRequest, Grant
    from fleetq.lifecycle import RESOLVE_BACKOFF, RequeueCause
    from fleetq.messages import QuotaAck, QuotaSignal, Resolution
    from fleetq.models import PropagationPolicy
    from workflows import metrics
    from workflows.errors import cancelled_by_delete, invalid_input


class JobQueueing(JobEffects):
    """Resolving, queueing for quota and giving it back."""

    async def _resolve_policy(self) -> PropagationPolicy:
        """The policy given with the job, or the one that matches it (waiting, Pending,
        until one does)."""
        delay = RESOLVE_BACKOFF.initial
        given = self._input.policy
        while True:
            self._p.resolution = await self._resolve("resolve PropagationPolicy and quota tree")
            self._sa_enabled = self._p.resolution.search_attributes
            doc = given or self._p.resolution.policy
            if doc is not None:
                try:
                    policy = job_phases.given_policy(doc, self._job.metadata.namespace)
                except job_phases.Refused as exc:
                    raise invalid_input(str(exc)) from None
                if given is not None:
                    self._p.resolution.policy = doc
                self._p.view.policy = policy.registry_key
                return policy
            self._set_state("Pending", self._p.resolution.policy_reason)
            await self._sleep_or_retry(delay, "wait for a matching PropagationPolicy")
            delay = RESOLVE_BACKOFF.after(delay)

    def _admission_request(self) -> AdmissionRequest:
        return job_phases.admission_request(
            self._p, self._gang, self._ref.workflow_id,
            job_phases.preemption_policy(self._job), workflow.now(),
        )

    async def _wait_for_admission(self) -> None:
        """Wait for the quota workflow's grant: ``job_queue.Queueing.step`` decides, this
        carries its commands out in order (the last of a batch yields the next event)."""
        request = self._admission_request()
        queueing = job_queue.Queueing()
        event: job_queue.Event | None = job_queue.Begin()
        while event is not None:
            commands = queueing.step(self._p, event, grant=self._grant, now=workflow.now())
            event = None
            for command in commands:
                event = await self._carry_out_queueing(command, request)

    async def _carry_out_queueing(
        self, command: job_queue.Command, request: AdmissionRequest
    ) -> job_queue.Event | None:
        """Carry out one of the admission wait's commands; the event it yields, if any."""
        if isinstance(command, job_queue.Show):
            self._announce(command.notices)
        elif isinstance(command, job_queue.WaitBackoff):
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: self._suspension.wanted,
                    timeout=command.seconds,
                    timeout_summary=f"re-queue backoff {command.seconds:g}s",
                )
            return job_queue.BackoffEnded()
        elif isinstance(command, job_queue.Enqueue):
            return job_queue.Sent(command.tree_id, await self._enqueue(command.tree_id, request))
        elif isinstance(command, job_queue.Pause):
            await self._sleep_or_retry(command.seconds, command.summary)
        elif isinstance(command, job_queue.Resolve):
            self._p.resolution = await self._refresh_resolution()
            return job_queue.Resolved()
        elif isinstance(command, job_queue.AwaitChange):
            if not command.at_once:
                await workflow.wait_condition(
                    lambda: self._grant is not None
                    or self._suspension.wanted
                    or self._p.admissibility_news
                )
            return job_queue.Changed()
        elif isinstance(command, job_queue.Leave):
            await self._release_quota()
        elif isinstance(command, job_queue.Admit):
            self._admit(command.grant)
        return None

    async def _enqueue(self, tree_id: str, request: AdmissionRequest) -> bool:
        """Put the job in its quota workflow's queue; False when it is not running (or
        did not answer). Admitted at once, the grant comes with the answer (no
        ``admitted`` signal follows)."""
        try:
            ack = await self._signal_quota(
                QuotaSignal(tree_workflow_id=tree_id, signal="enqueue", request=request),
                f"enqueue in {tree_id}",
            )
        except ActivityError as exc:
            if cancelled_by_delete(exc):
                raise
            return False
        if ack.grant is not None:
            self._grant = ack.grant
        return ack.running

    def _admit(self, grant: Grant) -> None:
        """The quota workflow admitted the job."""
        created = self._p.view.created_at
        if created is not None:
            metrics.admission_latency((workflow.now() - created).total_seconds(), grant.queue)
        self._announce(job_phases.admit(self._p, grant, workflow.now()))

    async def _refresh_resolution(self) -> Resolution:
        """Look the quota tree up again, keeping the policy already resolved."""
        res = await self._resolve("resolve quota tree")
        res.policy = self._p.resolution.policy
        return res

    async def _requeue(self, cause: RequeueCause) -> None:
        """A placement or pods-ready timeout: purge every copy, then queue again after a
        backoff or, past requeueLimit, end Failed (``lifecycle.requeue_after_timeout``);
        the quota goes back either way."""
        cluster = self._p.view.cluster
        await self._purge_all(f"purge on {cause.value}")
        self._announce(lifecycle.requeue_after_timeout(
            self._p, self._requeue_settings, cause, workflow.now(), cluster=cluster
        ))
        await self._release_quota()

    def _give_back(self) -> QuotaSignal | None:
        queued = self._policy is not None and self._policy.queued
        return job_phases.give_back(self._p, queued=queued, granted=self._grant is not None,
                                    job_id=self._ref.workflow_id)

    async def _requeue_quota(self) -> None:
        """Give the quota back and queue again with the original submit time in one
        message (``job_phases.requeue``); the next admission wait then sends no
        ``enqueue`` (``JobProgress.requeued_in``)."""
        give = self._give_back()
        if give is None:
            return
        if self._grant is None:  # nothing held: leave the queue as before
            await self._release_quota()
            return
        self._grant = None  # (a grant of the new wait may arrive while this is sent)
        message = job_phases.requeue(give, self._admission_request())
        tree_id = message.tree_workflow_id
        try:
            ack = await self._signal_quota(message, f"requeue in {tree_id}")
        except ActivityError as exc:  # its leak check returns the quota within a minute
            if cancelled_by_delete(exc):
                raise
            workflow.logger.warning("could not requeue in %s: %s", tree_id, exc)
        else:
            if ack.grant is not None:  # admitted again at once, in the answer
                self._grant = ack.grant
                self._admit(ack.grant)
            elif ack.running:  # back in its queue: the next wait sends no enqueue
                self._p.requeued_in = tree_id
            else:
                workflow.logger.info("requeue: quota workflow %s is not running", tree_id)

    async def _release_quota(self) -> None:
        """Give the quota back (``job_phases.give_back``), delivered or not."""
        message = self._give_back()
        if message is None:
            return
        signal, tree_id = message.signal, message.tree_workflow_id
        try:
            ack = await self._signal_quota(message, f"{signal} quota in {tree_id}")
        except ActivityError as exc:  # its leak check returns the quota within a minute
            workflow.logger.warning("could not signal %s to %s: %s", signal, tree_id, exc)
        else:
            if not ack.running:  # quota workflow gone: nothing is held there
                workflow.logger.info("%s: quota workflow %s is not running", signal, tree_id)
        self._grant = None

    async def _signal_quota(self, message: QuotaSignal, summary: str) -> QuotaAck:
        """Send one message to the quota workflow (a local activity using the client: no
        workflow-to-workflow signal events or acknowledgement task): whether it runs, and
        an enqueue's grant when it admitted the job at once.

        Retried until delivered (only deleting the job stops it): under overload the
        quota workflow may not answer for minutes, and a message given up on is a job
        that waits for nothing or quota held by nobody. Retry policies are not part of a
        workflow's commands, so recorded histories replay unchanged."""
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
