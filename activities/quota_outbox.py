"""Jobs' messages to their quota workflow, coalesced per worker into workflow updates.

One ``submit`` update in flight per quota workflow per worker; messages arriving
meanwhile go out together in the next batch (group commit), so a burst of 10,000
enqueues costs a few hundred updates. Updates, not signals, because Temporal refuses a
continue-as-new while signals arrive during its task; the server holds an update and
hands it to the next run. A ``RESOURCE_EXHAUSTED`` refusal (``history.maxInFlightUpdates``
across workers) is a delay with jittered backoff, never a lost message; every message is
idempotent, so a resend is harmless. A quota workflow with no ``submit`` update gets the
old single signals. Why and figures: docs/decisions/005, BENCHMARKS.md §2 (deep queue).
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Any

from temporalio.client import (
    Client,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.common import MetricMeter
from temporalio.exceptions import ApplicationError
from temporalio.runtime import Runtime
from temporalio.service import RPCError, RPCStatusCode

from fleetq.handler_refs import QuotaTreeHandlers
from fleetq.messages import QuotaAck, QuotaBatch, QuotaMessage, QuotaReceipt, QuotaSignal

#: messages per update: a batch of enqueues is ~250 bytes a message, so this keeps an
#: update's payload far below Temporal's 2 MB limit
MAX_BATCH = 256

#: the quota workflow's update that takes a batch
SUBMIT_UPDATE = QuotaTreeHandlers.SUBMIT.name

#: how long one batch may wait for the quota workflow to take it (e.g. while no control
#: worker runs); its senders then fail and retry, well within their 30 s local activity
UPDATE_TIMEOUT_SECONDS = 20.0

#: backoff after the server refused an update for the in-flight cap (RESOURCE_EXHAUSTED)
RETRY_INITIAL_SECONDS = 0.05
RETRY_MAX_SECONDS = 1.0


class QuotaRefused(Exception):
    """The quota workflow refused an enqueue (the reason is the message)."""


@dataclass
class _Mailbox:
    """Messages waiting for one quota workflow, and the task sending them."""

    #: (message, its sender's future, when it arrived: loop time)
    pending: list[tuple[QuotaMessage, asyncio.Future[QuotaAck], float]] = field(
        default_factory=list)
    sender: asyncio.Task[None] | None = None


class QuotaOutbox:
    """One per worker process (it must live on the worker's event loop)."""

    def __init__(
        self,
        client: Client,
        *,
        max_batch: int = MAX_BATCH,
        timeout_seconds: float = UPDATE_TIMEOUT_SECONDS,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self._client = client
        self._max_batch = max_batch
        self._timeout = timeout_seconds
        self._boxes: dict[str, _Mailbox] = {}
        #: updates sent and messages they carried, for benchmarks and tests
        self.updates_sent = 0
        self.messages_sent = 0
        #: updates refused for the in-flight cap and sent again; batches that failed
        self.retries = 0
        self.failures = 0
        #: seconds messages waited for an update in flight before theirs was sent, and
        #: seconds updates took to be answered (summed; for benchmarks)
        self.waited = 0.0
        self.answering = 0.0
        runtime = client.service_client.config.runtime or Runtime.default()
        meter: MetricMeter = runtime.metric_meter
        self._retry_counter = meter.create_counter(
            "fleetq_quota_update_retries",
            "quota updates refused by the server's in-flight cap and sent again", "1")
        self._failure_counter = meter.create_counter(
            "fleetq_quota_delivery_failures",
            "quota update batches that failed (their senders retry)", "1")

    async def send(self, inp: QuotaSignal) -> QuotaAck:
        """Deliver one message to the current run of ``inp.tree_workflow_id``: applied
        (with the grant of an enqueue admitted at once), or not running. Raises
        ``QuotaRefused`` when the quota workflow refused an enqueue, and any delivery
        error as is."""
        if inp.signal in ("enqueue", "requeue") and inp.request is None:
            raise ApplicationError(
                f"signal_quota: {inp.signal} needs a request",
                type="InvalidRequest",
                non_retryable=True,
            )
        message = QuotaMessage(signal=inp.signal, request=inp.request, job_id=inp.job_id)
        done: asyncio.Future[QuotaAck] = asyncio.get_running_loop().create_future()
        box = self._boxes.setdefault(inp.tree_workflow_id, _Mailbox())
        box.pending.append((message, done, asyncio.get_running_loop().time()))
        if box.sender is None or box.sender.done():
            box.sender = asyncio.create_task(self._drain(inp.tree_workflow_id, box))
        return await done

    async def _drain(self, tree_id: str, box: _Mailbox) -> None:
        handle = self._client.get_workflow_handle(tree_id)
        while box.pending:
            batch = self._take(box, self._max_batch)
            if not batch:  # every sender gave up (its local activity timed out)
                continue
            outcome = await self._deliver(handle, box, batch)
            if isinstance(outcome, BaseException):
                self.failures += 1
                self._failure_counter.add(1)
            for message, future in batch:
                if future.done():
                    continue
                if isinstance(outcome, BaseException):
                    future.set_exception(
                        ApplicationError(f"quota workflow {tree_id}: {outcome}", type="Delivery")
                    )
                elif isinstance(outcome, QuotaReceipt):
                    reason = outcome.refused.get(message.subject())
                    if reason is None:
                        future.set_result(QuotaAck(grant=outcome.grants.get(message.subject())))
                    else:
                        future.set_exception(QuotaRefused(reason))
                else:
                    future.set_result(QuotaAck(running=bool(outcome)))

    def _take(
        self, box: _Mailbox, n: int
    ) -> list[tuple[QuotaMessage, asyncio.Future[QuotaAck]]]:
        """The first ``n`` pending messages, out of the mailbox, whose senders still
        wait; their waits counted in ``waited``."""
        taken, box.pending[:n] = box.pending[:n], []
        now = asyncio.get_running_loop().time()
        self.waited += sum(now - arrived for _m, _f, arrived in taken)
        return [(m, f) for m, f, _arrived in taken if not f.done()]

    async def _deliver(
        self, handle: Any, box: _Mailbox, batch: list[tuple[QuotaMessage, asyncio.Future[QuotaAck]]]
    ) -> Any:
        """Send ``batch`` as one update: the receipt, False (no such workflow) or the
        error. Refused for the server's in-flight cap, it waits and sends again, taking
        along what arrived meanwhile (``batch`` grows in place), until the timeout."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self._timeout
        delay = RETRY_INITIAL_SECONDS
        while True:
            messages = [m for m, _ in batch]
            sent = loop.time()
            try:
                receipt = await asyncio.wait_for(
                    handle.execute_update(
                        SUBMIT_UPDATE, QuotaBatch(messages=messages), result_type=QuotaReceipt
                    ),
                    max(0.1, give_up - loop.time()),
                )
            except WorkflowUpdateFailedError:
                # No ``submit`` on that run (an earlier fleetq): one signal a message.
                return await self._signal_each(handle, messages)
            except RPCError as exc:
                if exc.status == RPCStatusCode.NOT_FOUND:
                    return False
                if exc.status != RPCStatusCode.RESOURCE_EXHAUSTED or loop.time() >= give_up:
                    return exc
            except (TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError):
                return TimeoutError(f"no answer to the {SUBMIT_UPDATE} update in "
                                    f"{self._timeout:g} s")
            except Exception as exc:  # noqa: BLE001 - handed to every sender, who retries
                return exc
            else:
                self.updates_sent += 1
                self.messages_sent += len(messages)
                self.answering += loop.time() - sent
                return receipt
            self.retries += 1
            self._retry_counter.add(1)
            await asyncio.sleep(min(delay, max(0.0, give_up - loop.time()))
                                * (0.5 + random.random()))  # noqa: S311 - jitter only
            delay = min(delay * 2, RETRY_MAX_SECONDS)
            room = self._max_batch - len(batch)
            if room > 0 and box.pending:  # group commit: take along what arrived meanwhile
                batch.extend(self._take(box, room))

    @staticmethod
    async def _signal_each(handle: Any, messages: list[QuotaMessage]) -> bool | Exception:
        try:
            for m in messages:
                await handle.signal(m.signal, m.signal_arg())
        except RPCError as exc:
            return False if exc.status == RPCStatusCode.NOT_FOUND else exc
        return True
