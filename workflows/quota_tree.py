"""The quota semaphore: one long-lived workflow per ElasticQuotaTree.

It holds the tree, the usage and one queue per node (the pure
``fleetq.admission.Admission``), takes jobs' ``enqueue``/``release``/``cancel`` in
batches through its ``submit`` update (docs/decisions/005; the single signals are still
taken) and grants by signal, one pass per task, sent without waiting (docs/decisions/006).
History stays bounded by continuing-as-new with the whole admission state. A periodic
check against Temporal's view of the holders returns quota of jobs that no longer run.
Preemption and reclaim (issue 18, off unless the tree turns them on): each pass plans
before it grants (``fleetq.admission_pass.run_pass``), plans live in the admission state, victims
get a ``preempt`` signal, and a preemptor is admitted once its last victim released or,
with no grace period, was purged here and parked (docs/preemption.md, decision 023).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections import deque
from collections.abc import Callable, Collection, Coroutine
from datetime import datetime, timedelta
from typing import Any, NoReturn

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

from workflows import activity_calls

with workflow.unsafe.imports_passed_through():
    from fleetq import activity_refs
    from fleetq.admission import (
        Admission,
        AdmissionRequest,
        Grant,
        QueueInfo,
        QueuePolicy,
        WaitInfo,
    )
    from fleetq.admission_pass import run_pass
    from fleetq.handler_refs import JobHandlers
    from fleetq.messages import (
        AdmissibilitySignal,
        HolderCheck,
        JobRef,
        PreemptSignal,
        QuotaBatch,
        QuotaMessage,
        QuotaReceipt,
        QuotaTreeInput,
        QuotaView,
        VictimsPurge,
    )
    from fleetq.models import (
        QUEUE_POLICY_ANNOTATION,
        STARVATION_ANNOTATION,
        ElasticQuotaTree,
        ManifestError,
        ManifestErrors,
        parse_tree,
    )
    from fleetq.naming import parse_job_workflow_id
    from fleetq.preemption import Victim, fair_sharing_weights, tree_policy
    from fleetq.queue_views import QueueTable
    from fleetq.quota import Inadmissible
    from fleetq.quota_state import pack_next, restore
    from workflows import metrics

__all__ = ["QuotaTreeInput", "QuotaTreeWorkflow", "QuotaView"]

#: while a run settles its deliveries before continuing as new, an enqueue admitted at
#: once is still answered in its reply, until the run has passed its
#: ``max_history_events`` by this share of it (1,250 events by default; Temporal warns at
#: 10,240); then it admits nothing more, so its deliveries settle and it continues as
#: new. Without it, every enqueue of the settle waited for the next run and a grant
#: signal each: one write on this execution per grant, thousands at 400 enqueues/s with
#: the database at 5 ms
SETTLE_SHARE = 0.5
#: ... and while its history is below this size (Temporal suggests continuing as new at
#: 4 MiB and warns at 10 MiB; at 800 enqueues/s an update event is ~10 KiB)
SETTLE_MAX_BYTES = 8 * 1024 * 1024
#: how long the quota workflow's task waits, at most, for its purge of a grace-0 victim
#: (one attempt; a member that does not answer leaves the quota to the victim's requeue)
PURGE_FOR_PREEMPTION_SECONDS = 3.0


@workflow.defn(name="QuotaTreeWorkflow")
class QuotaTreeWorkflow:
    @workflow.init
    def __init__(
        self, inp: QuotaTreeInput | dict[str, Any], carried: bytes | None = None
    ) -> None:
        # The SDK decodes the input with these type hints only when the run has as many
        # arguments as the hints (both after a compact continue-as-new); a run started
        # with the input alone gets it as a plain dict.
        inp = QuotaTreeInput.model_validate(inp)
        self._input = inp
        self._tree_doc: dict[str, Any] | None = inp.tree
        if carried is not None:  # continued as new: the state and the tree's manifest
            self._admission, self._tree_doc = restore(carried)
        else:
            tree = parse_tree(inp.tree) if inp.tree else None
            policy, starve = self._queue_settings(tree, inp)
            self._admission = Admission(tree, policy, starve)
        self._dirty = True
        self._immediate: list[Grant] = []
        #: a pass ran in an update handler (the main loop then only redraws and re-arms)
        self._passed = False
        self._grants_sent = 0
        self._inflight: set[asyncio.Future[None]] = set()
        #: signals waiting for room in the window of ``max_signals_in_flight``
        self._unsent: deque[Callable[[], Coroutine[Any, Any, None]]] = deque()
        self._leaks: list[str] = []
        self._details = ""
        self._stop = False
        self._preemptions_sent = 0
        self._preemption_on = _preemption_on(self._admission.quota.tree)
        self._fair_weights = fair_sharing_weights(self._admission.quota.tree)
        self._table = QueueTable()
        self._plans_expired = 0
        #: the main loop's wake timer (``_arm_wake``)
        self._wake: _Wake | None = None
        #: grace-0 victims whose copies this workflow is purging (docs/decisions/023);
        #: a message from the victim meanwhile takes it out (its own word wins)
        self._purging: set[str] = set()
        self._purges: set[asyncio.Future[None]] = set()

    @staticmethod
    def _queue_settings(tree: Any, inp: QuotaTreeInput) -> tuple[QueuePolicy, float]:
        """The tree's ``fleetq.io/queue-policy`` / ``fleetq.io/starvation-seconds``
        annotations win over the workflow input's defaults."""
        if tree is None:
            return inp.policy, inp.starvation_seconds
        notes = tree.metadata.annotations
        policy = QueuePolicy(notes[QUEUE_POLICY_ANNOTATION]) if (
            QUEUE_POLICY_ANNOTATION in notes) else inp.policy
        starve = tree.starvation_seconds if STARVATION_ANNOTATION in notes else (
            inp.starvation_seconds)
        return policy, starve

    # ------------------------------------------------------------------ main loop
    @workflow.run
    async def run(
        self, inp: QuotaTreeInput | dict[str, Any], carried: bytes | None = None
    ) -> None:
        del inp, carried  # as read by __init__
        inp = self._input
        last_leak_check = workflow.now()
        while True:
            self._arm_wake(inp, last_leak_check)
            await workflow.wait_condition(
                lambda: self._dirty or self._stop or self._passed or self._wake_due()
            )
            if self._wake is not None and self._wake_due():
                plan_due, self._wake = self._wake.plan, None
                if plan_due:
                    self._dirty = True  # the next pass drops the expired plans
                else:
                    await self._recover_leaks()
                    last_leak_check = workflow.now()
            if self._stop:
                return
            self._passed = False
            while self._dirty and not self._should_continue(inp):
                self._dirty = False
                self._grant()
            self._publish_details()
            if self._should_continue(inp):
                await self._settle_before_continue()
                if self._immediate:
                    continue
                self._continue_as_new(inp)

    def _arm_wake(self, inp: QuotaTreeInput, last_leak_check: datetime) -> None:
        """Keep one timer for the main loop's next wake: the next leak check (while
        anyone holds quota) or, when earlier, the next preemption plan's expiry. The
        timer runs on across passes while that moment stands (a pass records no timer
        events), and is replaced only when it moves."""
        due = _next_wake(
            inp.leak_check_seconds, last_leak_check.timestamp(),
            holding=self._admission.counts()[0] > 0,
            plan_deadline=self._admission.next_plan_deadline(),
        )
        current = self._wake
        if _keeps_wake(current, due):
            return
        if current is not None:
            current.task.cancel()
        self._wake = None
        if due is None:
            return
        at, plan = due
        summary = ("drop preemption plans whose victims did not stop" if plan
                   else "check that quota holders still run")
        seconds = max(1.0, at - workflow.now().timestamp())
        self._wake = _Wake(asyncio.ensure_future(workflow.sleep(seconds, summary=summary)),
                           at, plan)

    def _wake_due(self) -> bool:
        return self._wake is not None and self._wake.task.done()

    async def _settle_before_continue(self) -> None:
        # Grants decided but not yet sent go out, and every delivery settles,
        # before this run ends; a pending scheduling pass is not lost: the next
        # run starts with one.
        self._dispatch(self._immediate)
        self._immediate = []
        self._tell_admissibility()  # (the next run does not tell them again)
        await workflow.wait_condition(
            lambda: not self._inflight and not self._unsent and not self._purges
            and workflow.all_handlers_finished()
        )

    def _continue_as_new(self, inp: QuotaTreeInput) -> NoReturn:
        workflow.continue_as_new(args=[
            QuotaTreeInput(
                policy=inp.policy,
                starvation_seconds=inp.starvation_seconds,
                max_history_events=inp.max_history_events,
                leak_check_seconds=inp.leak_check_seconds,
                generation=inp.generation + 1,
                max_signals_in_flight=inp.max_signals_in_flight,
            ),
            pack_next(self._admission, self._tree_doc),
        ])

    def _answers_in_reply(self) -> bool:
        """Whether an update may run a scheduling pass and answer its enqueues' grants:
        always, and while the run settles before continuing as new (its main loop then
        admits nothing), up to ``SETTLE_SHARE`` past the run's threshold and
        ``SETTLE_MAX_BYTES`` of history."""
        info = workflow.info()
        return (info.get_current_history_length()
                <= self._input.max_history_events * (1 + SETTLE_SHARE)
                and info.get_current_history_size() <= SETTLE_MAX_BYTES)

    @staticmethod
    def _should_continue(inp: QuotaTreeInput) -> bool:
        info = workflow.info()
        return (
            info.is_continue_as_new_suggested()
            or info.get_current_history_length() > inp.max_history_events
        )

    def _grant(self, reply_to: Collection[str] = ()) -> dict[str, Grant]:
        """One scheduling pass (``fleetq.admission_pass.run_pass``: plans, then grants):
        grants are signalled, except those of ``reply_to``'s jobs (returned: the
        ``submit`` update answers them); victims are told to stop."""
        now = workflow.now().timestamp()
        self._admission.fair_weights = self._fair_weights
        granted, self._immediate = self._immediate, []
        outcome = run_pass(self._admission, now, preempt=self._preemption_on,
                           granted={g.job_id for g in granted})
        for dropped in outcome.expired:
            self._plans_expired += 1
            workflow.logger.warning(
                "preemption for %s dropped: %s did not release quota in time",
                dropped.preemptor,
                ", ".join(v.job_id for v in dropped.victims) or "nobody",
            )
        if outcome.plan_error is not None:
            workflow.logger.error("%s", outcome.plan_error)
        grants = granted + outcome.grants
        replies = {g.job_id: g for g in grants if g.job_id in reply_to}
        self._grants_sent += len(replies)
        self._dispatch([g for g in grants if g.job_id not in replies])
        self._tell_admissibility()
        purge: list[JobRef] = []
        for plan in outcome.plans:
            for victim in plan.victims:
                self._signal(functools.partial(self._preempt, victim))
                parsed = parse_job_workflow_id(victim.job_id)
                if victim.grace_seconds == 0 and parsed is not None:
                    purge.append(JobRef(namespace=parsed[0], name=parsed[1],
                                        workflow_id=victim.job_id))
        if purge:
            self._purging.update(job.workflow_id for job in purge)
            task = asyncio.ensure_future(self._purge_then_park(purge))
            self._purges.add(task)
            task.add_done_callback(self._purges.discard)
        return replies

    async def _purge_then_park(self, jobs: list[JobRef]) -> None:
        """Purge a pass's grace-0 victims on every member (one local activity, in this
        task), then park each (``Admission.park``): its quota admits the preemptor in
        the next pass, without waiting for the victim's signal, task and ``requeue``
        (docs/decisions/023). Nothing changes for a victim a member did not answer for,
        or that spoke meanwhile: its own ``requeue`` gives the quota back, as always."""
        try:
            gone = await activity_calls.execute_local(
                activity_refs.PURGE_FOR_PREEMPTION,
                VictimsPurge(jobs=jobs),
                start_to_close_timeout=timedelta(seconds=PURGE_FOR_PREEMPTION_SECONDS),
                retry_policy=RetryPolicy(maximum_attempts=1),
                summary=f"purge {len(jobs)} preempted job(s)",
            )
        except ActivityError as exc:
            workflow.logger.info("purge of %d preempted job(s) left to them: %s",
                                 len(jobs), exc)
            gone = []
        for job_id in gone:
            if job_id in self._purging and self._admission.park(job_id):
                self._dirty = True
        self._purging.difference_update(job.workflow_id for job in jobs)

    def _signal(self, send: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Start one external signal now, or in order once fewer than
        ``max_signals_in_flight`` are in flight (a delivery finishing makes room)."""
        if len(self._inflight) >= self._input.max_signals_in_flight:
            self._unsent.append(send)
            return
        task = asyncio.ensure_future(send())
        self._inflight.add(task)
        task.add_done_callback(self._signalled)

    def _signalled(self, task: asyncio.Future[None]) -> None:
        self._inflight.discard(task)
        while self._unsent and len(self._inflight) < self._input.max_signals_in_flight:
            self._signal(self._unsent.popleft())

    async def _preempt(self, victim: Victim) -> None:
        signal = PreemptSignal(
            preemptor=victim.preemptor,
            reason=victim.reason.value,
            message=victim.message,
            grace_seconds=victim.grace_seconds,
        )
        try:
            await workflow.get_external_workflow_handle(victim.job_id).signal(
                JobHandlers.PREEMPT.name, signal)
        except Exception as exc:
            # The victim's workflow is gone: its quota comes back at once.
            workflow.logger.info("preemption of %s not delivered: %s", victim.job_id, exc)
            if self._admission.release(victim.job_id):
                self._leaks.append(victim.job_id)
            self._dirty = True
        else:
            self._preemptions_sent += 1
            metrics.preemption(victim.reason.value)

    def _dispatch(self, grants: list[Grant]) -> None:
        """Send grants without waiting for their delivery, so the next scheduling pass
        runs in the very next workflow task instead of one signal round trip later."""
        for grant in grants:
            self._signal(functools.partial(self._deliver, grant))

    def _tell_admissibility(self) -> None:
        """Tell every waiting job that became inadmissible, or was queued again, since
        the last time (a signal each, sent like grants); a job that is gone is not
        waited for: its cancel follows."""
        for job_id, why in self._admission.admissibility_changes().items():
            notice = AdmissibilitySignal(inadmissible=why)
            self._signal(functools.partial(self._tell, job_id, notice))

    async def _tell(self, job_id: str, signal: AdmissibilitySignal) -> None:
        try:
            await workflow.get_external_workflow_handle(job_id).signal(
                JobHandlers.ADMISSIBILITY.name, signal)
        except Exception as exc:
            workflow.logger.info("admissibility of %s not delivered: %s", job_id, exc)

    async def _deliver(self, grant: Grant) -> None:
        try:
            await workflow.get_external_workflow_handle(grant.job_id).signal(
                JobHandlers.ADMITTED.name, grant)
        except Exception as exc:
            # The job workflow is gone: its quota comes back at once.
            workflow.logger.info("grant to %s not delivered: %s", grant.job_id, exc)
            self._admission.release(grant.job_id)
            self._leaks.append(grant.job_id)
            self._dirty = True
        else:
            self._grants_sent += 1

    async def _recover_leaks(self) -> None:
        # (a parked victim, docs/decisions/023, has quota held for it: checked too)
        holders = self._admission.holders() + self._admission.parked()
        if not holders:
            return
        try:
            verdict = await activity_calls.execute(
                activity_refs.CHECK_HOLDERS,
                HolderCheck(workflow_ids=holders),
                start_to_close_timeout=timedelta(seconds=60),
                retry_policy=RetryPolicy(
                    maximum_interval=timedelta(seconds=10), maximum_attempts=3
                ),
                summary=f"check {len(holders)} quota holders still run",
            )
        except ActivityError as exc:  # never let a failed check take the semaphore down
            workflow.logger.warning("holder check failed, retrying next period: %s", exc)
            return
        for job_id in verdict.gone:
            if self._admission.release(job_id):
                workflow.logger.warning("released quota leaked by %s", job_id)
                self._leaks.append(job_id)
                self._dirty = True
        del self._leaks[:-20]

    def _publish_details(self) -> None:
        # Runs after every workflow task, and again for each of them on a replay: keep it
        # independent of the number of waiting jobs.
        # (only the rows of the nodes that changed are redrawn: QueueTable)
        admitted, waiting = self._admission.counts()
        lengths = self._table.update(self._admission)
        lines = [
            f"**ElasticQuotaTree** `{self._tree_name() or '(none)'}` — policy "
            f"{self._admission.policy}, {admitted} admitted, {waiting} waiting",
            "",
            *self._table.lines(),
        ]
        preemptors = self._admission.preemptors()
        if preemptors:
            lines += ["", f"{len(preemptors)} preemptor(s) waiting for their victims to stop"]
        if self._plans_expired:
            lines += [
                "",
                f"{self._plans_expired} preemption plan(s) dropped: their victims did not "
                "release quota in time",
            ]
        details = "\n".join(lines)
        metrics.tree_state(self._admission, lengths)
        if details != self._details:
            self._details = details
            workflow.set_current_details(details)

    def _tree_name(self) -> str | None:
        if not self._tree_doc:
            return None
        meta = self._tree_doc.get("metadata") or {}
        return f"{meta.get('namespace')}/{meta.get('name')}"

    # ------------------------------------------------------------------ handlers
    @workflow.update
    def apply_tree(self, manifest: dict[str, Any]) -> str:
        tree = parse_tree(manifest)
        unchanged = manifest == self._tree_doc
        self._admission.replace_tree(tree)
        policy, starve = self._queue_settings(tree, self._input)
        self._admission.policy, self._admission.starvation_seconds = policy, starve
        self._preemption_on = _preemption_on(tree)
        self._fair_weights = fair_sharing_weights(tree)
        self._tree_doc = manifest
        self._dirty = True
        return "unchanged" if unchanged else "configured"

    @apply_tree.validator
    def _validate_tree(self, manifest: dict[str, Any]) -> None:
        try:
            tree = parse_tree(manifest)
            tree_policy(tree)  # fleetq.io/preemption, reclaim and fair-share-weight
        except (ManifestErrors, ManifestError) as exc:
            raise ValueError(str(exc)) from None
        current = self._tree_name()
        name = f"{tree.metadata.namespace}/{tree.metadata.name}"
        if current is not None and current != name:
            raise ValueError(
                f"ElasticQuotaTree {name}: only one ElasticQuotaTree is supported "
                f"and {current} exists"
            )

    @workflow.update
    async def submit(self, batch: QuotaBatch) -> QuotaReceipt:
        """Jobs' messages, batched by each worker's ``QuotaOutbox``: the way jobs talk to
        this workflow. Unlike a signal, an update that arrives while this workflow
        continues-as-new does not make Temporal refuse the continue-as-new: the server
        hands it to the next run (the client retries it there).

        A job admitted at once learns its grant from the reply. So does a preemptor whose
        victims this pass purges itself (docs/decisions/023): the reply waits for that
        purge, which holds this workflow task anyway, and answers with the grant of the
        pass after it, instead of an ``admitted`` signal sent behind the victims'
        ``preempt`` signals and a workflow task more on the job's side."""
        receipt = QuotaReceipt()
        queued: set[str] = set()
        # jobs arriving together are ordered by one pass (priority first), as Kueue's
        # cycle orders its heads: admitting the first at once could make it the victim
        # of a later one in the same task
        at_once = sum(m.signal == "enqueue" for m in batch.messages) < 2
        for message in batch.messages:
            refused = self._apply(message, at_once=at_once)
            if refused is not None:
                receipt.refused[message.subject()] = refused
            elif message.signal in ("enqueue", "requeue"):
                queued.add(message.subject())
            receipt.applied += 1
        if queued and self._dirty and self._answers_in_reply():
            # the scheduling pass runs now, so a job admitted at once learns it from
            # this reply: no grant signal (a write on this execution) and no signal
            # event and workflow task on the job's side
            purging = set(self._purges)
            receipt.grants = self._pass_in_reply(queued)
            if started := self._purges - purging:
                # resumed before the main loop looks at ``_dirty`` again (a finished
                # task wakes its waiters before the workflow's conditions are checked)
                await asyncio.wait(started)
                if self._dirty and self._answers_in_reply():
                    receipt.grants.update(self._pass_in_reply(queued - receipt.grants.keys()))
        return receipt

    def _pass_in_reply(self, reply_to: Collection[str]) -> dict[str, Grant]:
        """A scheduling pass run by a ``submit`` handler: the grants it answers."""
        self._dirty = False
        self._passed = True  # the main loop redraws the details and re-arms its timers
        return self._grant(reply_to=reply_to)

    # The single-message signals: what ``temporal workflow signal`` and jobs started by
    # earlier versions send. Same effect as a batch of one.
    @workflow.signal
    def enqueue(self, req: AdmissionRequest) -> None:
        self._apply(QuotaMessage(signal="enqueue", request=req))

    @workflow.signal
    def requeue(self, req: AdmissionRequest) -> None:
        self._apply(QuotaMessage(signal="requeue", request=req))

    @workflow.signal
    def release(self, job_id: str) -> None:
        self._apply(QuotaMessage(signal="release", job_id=job_id))

    @workflow.signal
    def cancel(self, job_id: str) -> None:
        self._apply(QuotaMessage(signal="cancel", job_id=job_id))

    def _apply(self, message: QuotaMessage, *, at_once: bool = True) -> str | None:
        """Apply one message; the reason when an enqueue is refused (an enqueue may be
        admitted at once unless ``at_once`` is off)."""
        self._purging.discard(message.subject())
        if message.signal in ("enqueue", "requeue"):
            return self._queue(message, at_once)
        if message.signal == "release":
            if self._admission.release(message.job_id):
                self._dirty = True
        elif self._admission.cancel(message.job_id) or self._admission.release(message.job_id):
            self._dirty = True
        return None

    def _queue(self, message: QuotaMessage, at_once: bool) -> str | None:
        """An enqueue, or a requeue (a preempted job: release + enqueue, one step); the
        reason when it is refused."""
        verb = message.signal
        if message.request is None:
            return f"{verb} without a request"
        now = workflow.now().timestamp()
        try:
            if verb == "enqueue":
                result = self._admission.enqueue(message.request, now, at_once=at_once)
            else:
                result = self._admission.requeue(message.request, now)
        except ValueError as exc:  # e.g. a request the tree can never admit
            workflow.logger.warning("%s of %s refused: %s", verb, message.subject(), exc)
            return str(exc)
        if isinstance(result, Grant):  # admitted at once, or a re-enqueue of a holder
            self._immediate.append(result)
        self._dirty = True
        return None

    @workflow.signal
    def stop(self) -> None:
        self._stop = True

    @workflow.query
    def queues(self) -> list[QueueInfo]:
        return self._admission.queues()

    @workflow.query
    def wait_info(self, job_id: str) -> WaitInfo | None:
        return self._admission.wait_info(job_id)

    @workflow.query
    def never_fits(self, request: AdmissionRequest) -> Inadmissible | None:
        """Whether (and why) a job asking ``request`` would be inadmissible now."""
        return self._admission.never_fits(request.namespace, request.request)

    @workflow.query
    def holders(self) -> list[str]:
        return self._admission.holders()

    @workflow.query
    def usage(self, node: str) -> dict[str, int]:
        return self._admission.usage(node)

    @workflow.query
    def view(self) -> QuotaView:
        return QuotaView(
            tree=self._tree_name(),
            policy=str(self._admission.policy),
            holders=len(self._admission.holders()),
            waiting=len(self._admission.waiting()),
            inadmissible=len(self._admission.inadmissible()),
            queues=self._admission.queues(),
            generation=self._input.generation,
            grants_sent=self._grants_sent,
            leaks_recovered=list(self._leaks),
            preempting=self._admission.preemptors(),
            preemptions_sent=self._preemptions_sent,
            preemption=_preemption_mode(self._admission.quota.tree),
        )


@dataclasses.dataclass(frozen=True)
class _Wake:
    """The main loop's timer: when it ends (epoch seconds), and whether for a
    preemption plan's expiry (else the leak check)."""

    task: asyncio.Future[None]
    at: float
    plan: bool


def _keeps_wake(current: _Wake | None, due: tuple[float, bool] | None) -> bool:
    """Whether the main loop keeps its timer as it is: it fired and the loop has not
    handled it yet (it fired while the run settled before continuing as new, and grants
    decided meanwhile sent the loop round again: handled now, not re-armed a second
    later), or it runs on to the moment still due."""
    if current is None:
        return False
    if current.task.done():
        return True
    return due is not None and (current.at, current.plan) == due


def _next_wake(leak_check_seconds: float, last_leak_check: float, *, holding: bool,
               plan_deadline: float | None) -> tuple[float, bool] | None:
    """When the main loop must wake next (epoch seconds) and whether for a plan's
    expiry: the leak check ``leak_check_seconds`` after the last one while anyone holds
    quota, or a plan's deadline when it comes first; None: nothing to wake for."""
    leak = last_leak_check + leak_check_seconds if holding else None
    if plan_deadline is not None and (leak is None or plan_deadline < leak):
        return plan_deadline, True
    return (leak, False) if leak is not None else None


def _preemption_mode(tree: ElasticQuotaTree | None) -> str:
    """The tree's ``fleetq.io/preemption`` (``Never`` when unreadable): whether its jobs
    may also preempt for room on a member (read by the ``tree_preemption`` activity)."""
    try:
        return tree_policy(tree).preemption.value
    except ManifestError:
        return "Never"


def _preemption_on(tree: ElasticQuotaTree | None) -> bool:
    """Whether ``tree``'s annotations turn preemption or reclaim on (a tree whose
    annotations cannot be read, e.g. given at start and never applied, leaves it off)."""
    try:
        return tree_policy(tree).enabled
    except ManifestError:
        return False
