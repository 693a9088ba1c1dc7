"""A job's copies on its member clusters, as the job workflow writes and purges them.

Part of ``PyTorchJobWorkflow`` (it runs inside that workflow, on its history), kept apart
so the workflow reads as the job's flow. Writes are tracked while they run: a delete
that interrupts the workflow awaits the write in flight and purges after it, so nothing
it made survives. A copy on a member that does not answer is handed to a heartbeating
``purge_when_reachable`` activity, which purges the moment the member answers again (a
handful of events however long the outage).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, Literal, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError
from temporalio.workflow import ActivityCancellationType, ActivityHandle

from workflows import activity_calls

with workflow.unsafe.imports_passed_through():
    from fleetq import activity_refs, lifecycle
    from fleetq.lifecycle import Reason
    from fleetq.messages import JobRef, JobState, JobView, PurgeInput, PurgeResult
    from workflows.errors import cancelled_by_delete

PURGER_HEARTBEAT = timedelta(seconds=15)
#: after a purge_when_reachable that failed for good (not for an unreachable member)
PURGE_RETRY_SECONDS = 30.0

T = TypeVar("T")
EventSink = Callable[[Literal["Normal", "Warning"], Reason, str], None]
StateSink = Callable[[JobState, str], None]


class MemberCopies:
    """Writes to and purges of one job's copies; ``view`` gives the job's current view
    (its ``copies``, ``pending_purges`` and ``unreachable`` are kept here; the workflow
    replaces its progress at each step), ``event`` and ``set_state`` are the workflow's."""

    def __init__(
        self, ref: JobRef, view: Callable[[], JobView], event: EventSink, set_state: StateSink
    ) -> None:
        self._ref = ref
        self._current_view = view
        self._event = event
        self._set_state = set_state
        #: cluster -> running purge_when_reachable activity for a copy left there
        self._purgers: dict[str, ActivityHandle[PurgeResult]] = {}
        #: the member write running now, and its cluster
        self._in_flight: tuple[str, asyncio.Future[Any]] | None = None

    @property
    def _view(self) -> JobView:
        return self._current_view()

    # ------------------------------------------------------------------ writes
    async def write(self, cluster: str, call: Awaitable[T]) -> T:
        """Run one member-cluster write. A delete arriving meanwhile interrupts the
        workflow at once (``asyncio.shield``) but not the write: ``land_in_flight`` lets
        it finish before anything is purged."""
        task = asyncio.ensure_future(call)
        self._in_flight = (cluster, task)
        try:
            return await asyncio.shield(task)
        finally:
            if task.done():
                self._in_flight = None

    async def land_in_flight(self) -> list[str]:
        """Let an interrupted write land; the cluster it wrote to (to purge after it)."""
        if self._in_flight is None:
            return []
        cluster, task = self._in_flight
        with contextlib.suppress(Exception):
            await task
        self._in_flight = None
        return [cluster]

    async def purge(
        self, cluster: str, why: str, attempts: int = 3, *, local: bool = False
    ) -> PurgeResult:
        """Purge the job's copy on ``cluster``; ``local``: as a local activity, in the
        workflow task that asked (a preemption's, docs/decisions/019)."""
        run = activity_calls.execute_local if local else activity_calls.execute
        return await self.write(
            cluster,
            run(
                activity_refs.PURGE,
                PurgeInput(cluster=cluster, job=self._ref),
                start_to_close_timeout=timedelta(seconds=60),
                retry_policy=RetryPolicy(
                    initial_interval=timedelta(seconds=1),
                    maximum_interval=timedelta(seconds=10),
                    maximum_attempts=attempts,
                ),
                summary=f"{why} on {cluster}",
            ),
        )

    # ------------------------------------------------------------------ purges
    async def purge_or_defer(self, cluster: str) -> None:
        """Purge an old copy now, or hand it to a purger if its member does not answer."""
        view = self._view
        try:
            await self.purge(cluster, "purge old copy", attempts=2)
        except ActivityError as exc:
            if cluster not in view.pending_purges:
                view.pending_purges.append(cluster)
            self._event(
                "Warning",
                Reason.PURGE_DEFERRED,
                f"could not purge {cluster} now ({exc.cause or exc}); "
                "will purge when it is reachable",
            )
            self.start_purger(cluster)
            return
        if cluster in view.copies:
            view.copies.remove(cluster)

    def pending_unwatched(self) -> bool:
        """A copy pending a purge that no purger looks after (its purger failed): try it
        at the next status."""
        return any(c not in self._purgers for c in self._view.pending_purges)

    async def retry_pending(self) -> None:
        view = self._view
        for cluster in list(view.pending_purges):
            try:
                await self.purge(cluster, "purge copy left while unreachable", attempts=1)
            except ActivityError:
                continue
            lifecycle.forget_copy(view, cluster)
            self._event(
                "Normal", Reason.PURGED, f"copy on {cluster} purged after it became reachable"
            )

    async def purge_until_done(self, cluster: str, why: str, *, local: bool = False) -> None:
        """Purge now (``local``: see ``purge``); a member that does not answer is handed
        to a purge_when_reachable activity, which purges the moment it answers again (a
        handful of events however long the outage, visible in the UI as a running
        activity)."""
        view = self._view
        if cluster not in view.pending_purges:  # it answered a moment ago: purge now
            try:
                await self.purge(cluster, why, attempts=2, local=local)
                return
            except ActivityError as exc:
                if cancelled_by_delete(exc):
                    raise
                self._set_state(
                    view.state, f"waiting to purge copy on {cluster}: {exc.cause or exc}"
                )
        await self.await_purger(cluster)

    def start_purger(
        self, cluster: str, confirm: bool = False
    ) -> ActivityHandle[PurgeResult]:
        """Start (once) the activity that purges ``cluster``'s copy as soon as it answers."""
        running = self._purgers.get(cluster)
        if running is not None and not running.done():
            return running
        handle = activity_calls.start(
            activity_refs.PURGE_WHEN_REACHABLE,
            PurgeInput(cluster=cluster, job=self._ref, confirm=confirm),
            start_to_close_timeout=timedelta(hours=1),
            heartbeat_timeout=PURGER_HEARTBEAT,
            retry_policy=RetryPolicy(
                initial_interval=timedelta(seconds=1),
                maximum_interval=timedelta(seconds=10),
                non_retryable_error_types=["InvalidRequest"],
            ),
            cancellation_type=ActivityCancellationType.TRY_CANCEL,
            summary=f"purge {self._ref.name} on {cluster} once it answers",
        )
        self._purgers[cluster] = handle
        return handle

    async def await_purger(self, cluster: str, confirm: bool = False) -> None:
        """Purge ``cluster``'s copy and wait until that is done, however long the member
        stays away (with ``confirm``: until the copy is confirmed gone)."""
        view = self._view
        running = self._purgers.get(cluster)
        if confirm and running is not None and not running.done():
            running.cancel()  # restart it so that it confirms
            self._purgers.pop(cluster)
        while True:
            handle = self.start_purger(cluster, confirm=confirm)
            try:
                await handle
                break
            except ActivityError as exc:
                if cancelled_by_delete(exc):
                    raise
                # e.g. the member left the fleet config: say so; strict fencing still
                # never lets a new copy start before the old one is confirmed gone
                self._event(
                    "Warning", Reason.PURGE_FAILED, f"could not purge {cluster}: {exc.cause or exc}"
                )
                if not confirm:
                    return
                await workflow.sleep(
                    PURGE_RETRY_SECONDS, summary=f"retry confirming the copy on {cluster} is gone"
                )
            finally:
                self._purgers.pop(cluster, None)
        lifecycle.forget_copy(view, cluster)
        view.unreachable.pop(cluster, None)

    def purger_finished(self) -> bool:
        return any(h.done() for h in self._purgers.values())

    def collect_purgers(self) -> None:
        """Record the copies that purge_when_reachable activities have purged."""
        view = self._view
        for cluster, handle in list(self._purgers.items()):
            if not handle.done():
                continue
            del self._purgers[cluster]
            try:
                handle.result()
            except ActivityError as exc:  # left pending: purged on the job's ending
                self._event(
                    "Warning", Reason.PURGE_FAILED, f"could not purge {cluster}: {exc.cause or exc}"
                )
                continue
            lifecycle.forget_copy(view, cluster)
            view.unreachable.pop(cluster, None)
            self._event(
                "Normal", Reason.PURGED, f"copy on {cluster} purged as soon as it answered again"
            )

    def stop_purgers(self) -> None:
        for handle in self._purgers.values():
            if not handle.done():
                handle.cancel()
        self._purgers.clear()
