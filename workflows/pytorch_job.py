"""One workflow per PyTorchJob (id ``pytorchjob/<namespace>/<name>``): queue, place,
reserve, bind, watch, fail over, finish.

The workflow only orchestrates. Placement runs in the pure core behind the
``plan_placement`` activity (node lists never enter history), member-cluster writes are
idempotent activities, and failover tolerance is a durable Temporal timer, so a worker
restart neither loses nor resets it. The two reads before the first write (policy
resolution and placement, both from this worker's caches) are *local* activities: they
run inside the workflow task that asked for them, one marker event each instead of a
task round trip through the server. So do the job's messages to its quota workflow
(enqueue, release): a client signal from a local activity, where a workflow-to-workflow
signal would add two events and an acknowledgement workflow task each. Member-cluster
writes stay regular activities, so the placement decision is durable (recorded with the
scheduling of the reserve/bind) before anything is written: a worker that crashes after
placing re-places from scratch with nothing written, never writes to a second cluster.
Status is change-driven (a heartbeating watch activity returns only when something
changed) and the workflow continues-as-new with its progress, so a job that runs for a
week keeps a bounded history.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime, timedelta
from typing import Any, Literal

from temporalio import workflow
from temporalio.common import RawValue, RetryPolicy, SearchAttributeKey, SearchAttributeUpdate
from temporalio.exceptions import ActivityError
from temporalio.workflow import ActivityCancellationType, ActivityHandle

with workflow.unsafe.imports_passed_through():
    from fleetq.admission import AdmissionRequest, Grant
    from fleetq.job_input import InvalidJobInput, JobInput, JobProgress
    from fleetq.messages import (
        TERMINAL_STATES,
        BindInput,
        BindRequest,
        BindResult,
        GangShape,
        JobEvent,
        JobRef,
        JobState,
        JobStatus,
        JobView,
        PlacementInput,
        PlacementVerdict,
        PodReservation,
        PurgeInput,
        PurgeResult,
        QuotaSignal,
        ReserveInput,
        ReserveRequest,
        ReserveResult,
        Resolution,
        ResolveInput,
        WatchInput,
    )
    from fleetq.models import (
        Gang,
        ManifestErrors,
        PropagationPolicy,
        PurgeMode,
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
    from workflows import metrics
    from workflows.errors import cancelled_by_delete, invalid_input

MAX_EVENTS = 30
#: states too short-lived to be worth a search-attribute upsert (a history event each)
TRANSIENT_STATES = ("Validating", "Scheduling")
#: states published to search attributes only once they last: a job normally leaves
#: Created for Running within seconds, so Created is upserted only if the first watch
#: window (SA_SETTLE_SECONDS) ends with the job still there
SETTLING_STATES = ("Created",)
SA_SETTLE_SECONDS = 10.0
#: copies left on a member that did not answer are purged by a heartbeating activity that
#: asks the member every second (``purge_when_reachable``), so they go within seconds of
#: its return; workflows started before it existed keep purging on timers
PATCH_PURGE_WHEN_REACHABLE = "purge-when-reachable"
PURGER_HEARTBEAT = timedelta(seconds=15)
#: after a purge_when_reachable that failed for good (not for an unreachable member)
PURGE_RETRY_SECONDS = 30.0
#: runPolicy honoured by the workflow (suspend, activeDeadlineSeconds): new behaviour for
#: jobs whose manifest asks for it, so workflows started before it replay unchanged
PATCH_RUN_POLICY = "run-policy"
#: A deadline (failover tolerance, taint eviction, activeDeadlineSeconds, grace period)
#: less than DEADLINE_NEAR_SECONDS away is slept out on a timer of its own and then acted
#: on, instead of starting a watch with a near-zero timer beside it: a watch that answers
#: at once made the next task cancel a timer the server was firing at that instant, which
#: Temporal's time-skipping test server refuses and never retries (the workflow hangs;
#: temporalio/sdk-java#2606), more often the more loaded the machine.
PATCH_DEADLINE_ALONE = "deadline-alone"
DEADLINE_NEAR_SECONDS = 1.0
#: continue-as-new once a run's history passes this many events
MAX_HISTORY_EVENTS = 1000
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
        self._view: JobView | None = None
        self._grant: Grant | None = None
        self._retry_now = False
        self._sa_enabled = False
        self._details = ""
        self._sa_last: dict[str, Any] = {}
        self._policy: PropagationPolicy | None = None
        self._in_flight: tuple[str, asyncio.Future[Any]] | None = None
        #: watches started and possibly still running (one left behind by a failover,
        #: the current one of a deleted job), waited for before the workflow closes
        self._watches: list[asyncio.Future[Any]] = []
        #: cluster -> running purge_when_reachable activity for a copy left there
        self._purgers: dict[str, ActivityHandle[PurgeResult]] = {}
        self._evict_at: datetime | None = None
        self._evict_reason = ""
        #: a suspension asked for (runPolicy.suspend at start, or the suspend signal) and
        #: not yet carried out; a resume asked for while suspended
        self._suspend_wanted = False
        self._suspending = False
        self._resume_wanted = False

    # ================================================================== run
    @workflow.run
    async def run(self, arg: RawValue) -> JobView:
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
        self._job = job
        self._input = inp
        self._ref = JobRef(namespace=ns, name=name, workflow_id=expected)
        self._sa_last = _search_attributes_at_start()

        if inp.progress is not None:
            p = inp.progress
            self._view, self._resolution, self._grant = p.view, p.resolution, p.grant
            self._since, self._graceful_old, self._grace_deadline = (
                p.since,
                p.graceful_old,
                p.grace_deadline,
            )
            self._evict_at, self._evict_reason = p.evict_at, p.evict_reason
            self._sa_enabled = self._resolution.search_attributes
            policy = parse_policy(self._resolution.policy) if self._resolution.policy else None
            if policy is None:
                raise invalid_input(
                    f"PyTorchJob {ns}/{name}: lost its policy across continue-as-new"
                )
            self._policy = policy
            self._gang = gang_of(job, self._resolution.priority_classes)
        else:
            self._view = JobView(
                namespace=ns, name=name, state="Validating", created_at=workflow.now()
            )
            self._since, self._graceful_old, self._grace_deadline = "", None, None
            self._resolution = Resolution()
        self._publish()

        try:
            if self._policy is None:
                self._policy = await self._resolve_policy(inp)
                self._gang = gang_of(job, self._resolution.priority_classes)
                self._view.priority = self._gang.priority
                self._view.queued = self._pol.queued
                self._view.summary = self._summary_line()
                self._view.gang = self._gang.minimum_line()
                self._publish()
            return await self._lifecycle()
        except (asyncio.CancelledError, ActivityError) as exc:
            if isinstance(exc, ActivityError) and not cancelled_by_delete(exc):
                raise
            await self._on_deleted()
            raise asyncio.CancelledError() from None

    # ================================================================== phases
    async def _lifecycle(self) -> JobView:
        view = self._require_view()
        for cluster in view.pending_purges:  # carried over by continue-as-new
            self._start_purger(cluster)
        if (
            self._input.progress is None
            and self._job.suspend
            and workflow.patched(PATCH_RUN_POLICY)
        ):
            self._suspend_wanted = True
        while view.state not in TERMINAL_STATES:
            if self._suspend_wanted:
                await self._suspend()
                continue
            if self._pol.queued and self._grant is None:
                await self._wait_for_admission()
                if self._grant is None:  # a suspension came first
                    continue
            if view.cluster is None:
                placed = await self._schedule()
                if not placed:
                    break
                if self._suspend_wanted:
                    continue
            outcome = await self._supervise()
            if outcome == "suspend":
                continue
            if outcome == "continue":
                await self._settle_watches()
                self._stop_purgers()  # the next run starts them again
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(
                    JobInput(
                        manifest=self._input.manifest,
                        policy=self._input.policy,
                        run_seconds=self._input.run_seconds,
                        rewatch_seconds=self._input.rewatch_seconds,
                        progress=JobProgress(
                            view=view,
                            resolution=self._resolution,
                            grant=self._grant,
                            since=self._since,
                            graceful_old=self._graceful_old,
                            grace_deadline=self._grace_deadline,
                            evict_at=self._evict_at,
                            evict_reason=self._evict_reason,
                        ),
                    )
                )
        await self._finish()
        return view

    async def _resolve_policy(self, inp: JobInput) -> PropagationPolicy:
        delay = 5.0
        while True:
            self._resolution = await self._resolve("resolve PropagationPolicy and quota tree")
            self._sa_enabled = self._resolution.search_attributes
            doc = inp.policy or self._resolution.policy
            if doc is not None:
                try:
                    policy = parse_policy(doc)
                except ManifestErrors as exc:
                    raise invalid_input(str(exc)) from None
                if policy.metadata.namespace != self._job.metadata.namespace:
                    raise invalid_input(
                        f"PropagationPolicy {policy.metadata.namespace}/{policy.metadata.name}: "
                        f"metadata.namespace must be the job's namespace "
                        f"{self._job.metadata.namespace}"
                    )
                if inp.policy is not None:
                    self._resolution.policy = doc
                self._require_view().policy = f"{policy.metadata.namespace}/{policy.metadata.name}"
                return policy
            self._set_state("Pending", self._resolution.policy_reason)
            await self._sleep_or_retry(delay, "wait for a matching PropagationPolicy")
            delay = min(delay * 2, 120.0)

    async def _wait_for_admission(self) -> None:
        view = self._require_view()
        request = AdmissionRequest(
            job_id=self._ref.workflow_id,
            namespace=self._job.metadata.namespace,
            priority=self._gang.priority,
            request=quota_request(self._gang),
            submitted_at=(view.created_at or workflow.now()).timestamp(),
        )
        delay = 5.0
        while self._grant is None:
            if self._suspend_wanted:  # suspended before the quota workflow took it
                return
            tree_id = self._resolution.tree_workflow_id
            if tree_id is None:
                self._set_state("Queued", "no ElasticQuotaTree is applied to the fleet")
                await self._sleep_or_retry(delay, "wait for an ElasticQuotaTree")
                delay = min(delay * 2, 120.0)
                self._resolution = await self._refresh_resolution()
                continue
            try:
                sent = await self._signal_quota(
                    QuotaSignal(tree_workflow_id=tree_id, signal="enqueue", request=request),
                    f"enqueue in {tree_id}",
                )
            except ActivityError as exc:
                if cancelled_by_delete(exc):
                    raise
                sent = False
            if not sent:  # the tree workflow is gone (or unreachable); resolve again later
                self._set_state("Queued", f"quota workflow {tree_id} is not running")
                await self._sleep_or_retry(delay, "wait for the quota workflow")
                delay = min(delay * 2, 120.0)
                self._resolution = await self._refresh_resolution()
                continue
            self._set_state("Queued", "waiting for quota")
            self._event("Normal", "Queued", f"enqueued in quota tree {tree_id}")
            await workflow.wait_condition(
                lambda: self._grant is not None or self._suspend_wanted
            )
            if self._grant is None:  # suspended while waiting: leave the queue
                await self._release_quota()
                return
        grant = self._grant
        if view.created_at is not None:
            metrics.admission_latency(
                (workflow.now() - view.created_at).total_seconds(), grant.queue
            )
        view.admitted = True
        view.queue = grant.queue
        # Scheduling first: it is transient, so the new queue is published with the next
        # lasting state instead of costing an upsert of its own
        self._set_state("Scheduling", "admitted")
        self._event("Normal", "Admitted", f"admitted by queue {grant.queue} (quota {grant.node})")

    async def _refresh_resolution(self) -> Resolution:
        """Look the quota tree up again, keeping the policy already resolved."""
        res = await self._resolve("resolve quota tree")
        res.policy = self._resolution.policy
        return res

    async def _resolve(self, summary: str) -> Resolution:
        return await workflow.execute_local_activity(
            "resolve_policy",
            ResolveInput(
                namespace=self._job.metadata.namespace,
                name=self._job.metadata.name,
                labels=self._job.metadata.labels,
            ),
            result_type=Resolution,
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=MEMBER_RETRY,
            summary=summary,
        )

    async def _schedule(self) -> bool:
        """Place, reserve and bind; retries with backoff while nothing fits. Returns False
        when the job can never be placed (every cluster excluded)."""
        view = self._require_view()
        affinity = None
        tolerations: list[dict[str, Any]] = []
        placement = self._pol.spec.placement
        if placement.clusterAffinity is not None:
            affinity = placement.clusterAffinity.model_dump(exclude_none=True)
        tolerations = [t.model_dump(exclude_none=True) for t in placement.clusterTolerations]
        delay = 2.0
        last_reason = ""
        while True:
            if self._deadline_passed():
                await self._deadline_exceeded()
                return False
            self._set_state("Scheduling", "evaluating member clusters")
            verdict: PlacementVerdict = await workflow.execute_local_activity(
                "plan_placement",
                PlacementInput(
                    job_ref=f"{view.namespace}/{view.name}",
                    gang=GangShape.from_gang(self._gang),
                    affinity=affinity,
                    cluster_tolerations=tolerations,
                    exclude=list(view.evicted),
                ),
                result_type=PlacementVerdict,
                start_to_close_timeout=timedelta(seconds=60),
                retry_policy=MEMBER_RETRY,
                summary="capacity and gang placement",
            )
            rejections = dict(verdict.rejections)
            for cand in verdict.candidates[:3]:
                reserved = False
                if cand.reservation:
                    rr = await self._reserve(cand.cluster, cand.assignment)
                    if not rr.ok:
                        rejections[cand.cluster] = f"reservation lost: {rr.reason}"
                        continue
                    reserved = True
                try:
                    await self._write(
                        cand.cluster,
                        "bind",
                        BindInput(
                            cluster=cand.cluster,
                            request=BindRequest(
                                job=self._ref,
                                manifest=self._input.manifest,
                                reserved=reserved,
                                propagate_deps=self._pol.spec.propagateDeps,
                                run_seconds=self._input.run_seconds,
                            ),
                        ),
                        BindResult,
                        f"bind {view.name} on {cand.cluster}",
                    )
                except ActivityError as exc:
                    msg = str(exc.cause or exc)
                    self._event(
                        "Warning",
                        "ScheduleBindingFailed",
                        f"Binding on {cand.cluster} failed: {msg}",
                    )
                    rejections[cand.cluster] = f"binding failed: {msg}"
                    if reserved:
                        await self._purge(cand.cluster, "release reservations")
                    continue
                view.cluster = cand.cluster
                if cand.cluster not in view.copies:
                    view.copies.append(cand.cluster)
                view.bound_at = workflow.now()
                view.rejections = rejections
                self._arm_deadline()
                # "health/phase": the first watch wakes on a phase or health change only,
                # not on every pod the member creates on the way to Running
                self._since = "Healthy/Created"
                self._event(
                    "Normal",
                    "ScheduleBindingSucceed",
                    "Binding has been scheduled successfully. Result: "
                    + binding_result(cand.cluster, self._gang),
                )
                self._set_state("Created", f"bound to {cand.cluster}")
                return True
            view.rejections = rejections
            if not verdict.candidates and not verdict.eligible:
                reason = "no member cluster is eligible: " + verdict.reason()
                self._event("Warning", "ScheduleBindingFailed", reason)
                self._set_state("Failed", reason)
                return False
            reason = "; ".join(f"{c}: {r}" for c, r in sorted(rejections.items())) or (
                "no member cluster has room"
            )
            for r in rejections.values():
                metrics.placement_failure(metrics.reason_kind(r))
            if reason != last_reason:
                self._event("Warning", "FailedScheduling", reason)
                last_reason = reason
            self._set_state("Pending", reason)
            pause = delay
            if view.deadline_at is not None:
                left = (view.deadline_at - workflow.now()).total_seconds()
                pause = max(0.001, min(pause, left))
            await self._sleep_or_retry(pause, f"retry placement in {int(pause)}s")
            if self._suspend_wanted:
                return True  # the lifecycle suspends (nothing was bound)
            delay = min(delay * 2, 60.0)

    async def _write(
        self, cluster: str, activity: str, arg: Any, result_type: type, summary: str
    ) -> Any:
        """Run one member-cluster write. A delete arriving meanwhile interrupts the
        workflow at once (``asyncio.shield``) but not the write: cleanup awaits the
        in-flight write first, then purges that cluster, so nothing it made survives."""
        task = asyncio.ensure_future(
            workflow.execute_activity(
                activity,
                arg,
                result_type=result_type,
                start_to_close_timeout=timedelta(seconds=60),
                retry_policy=MEMBER_RETRY,
                summary=summary,
            )
        )
        self._in_flight = (cluster, task)
        try:
            return await asyncio.shield(task)
        finally:
            if task.done():
                self._in_flight = None

    async def _reserve(self, cluster: str, assignment: dict[str, str]) -> ReserveResult:
        pods = [
            PodReservation(
                role=p.role,
                index=p.index,
                node=assignment.get(p.name_suffix, ""),
                requests=p.requests,
                node_selector=p.node_selector,
                tolerations=list(p.tolerations),
            )
            for p in self._gang.pods
        ]
        result: ReserveResult = await self._write(
            cluster,
            "reserve",
            ReserveInput(cluster=cluster, request=ReserveRequest(job=self._ref, pods=pods)),
            ReserveResult,
            f"reserve on {cluster}",
        )
        return result

    async def _supervise(self) -> str:
        """Watch the bound copy until the job ends, fails over or history asks for
        continue-as-new. Returns "done" | "failover" | "continue"."""
        view = self._require_view()
        fo = self._pol.application_failover
        tolerance = fo.decisionConditions.tolerationSeconds if fo else None
        iterations = 0
        watch: ActivityHandle[JobStatus] | None = None
        settling = False
        while True:
            cluster = view.cluster
            assert cluster is not None
            timeout, summary, due = self._next_deadline(tolerance)
            if (
                timeout is not None
                and timeout < DEADLINE_NEAR_SECONDS
                and workflow.patched(PATCH_DEADLINE_ALONE)
            ):
                if timeout > 0:  # a timer alone: nothing cancels it as it fires
                    await workflow.sleep(timeout, summary=summary)
                if self._suspend_wanted:
                    return "suspend"
                outcome = await self._on_deadline(due, cluster, tolerance)
                if outcome:
                    return outcome
                continue
            if watch is None:  # else a deadline fired mid-window: keep waiting on it
                settling = self._sa_settling
                watch = self._start_watch(cluster, settling)
            current = watch
            try:
                await workflow.wait_condition(
                    lambda w=current: (  # type: ignore[misc]
                        w.done() or self._purger_finished() or self._suspend_wanted
                    ),
                    timeout=None if timeout is None else max(timeout, 0.001),
                    timeout_summary=summary,
                )
            except TimeoutError:
                outcome = await self._on_deadline(due, cluster, tolerance)
                if outcome:
                    return outcome
                continue
            if self._suspend_wanted:
                return "suspend"
            if not current.done():  # a copy left on a returning member was purged
                self._collect_purgers()
                continue
            finished, watch = watch, None
            try:
                status = finished.result()
            except ActivityError as exc:
                status = JobStatus(
                    cluster=cluster,
                    health="Unknown",
                    phase="Unknown",
                    reason=f"watch failed: {exc.cause or exc}",
                    observed="watch-failed",
                )
            changed = status.observed != self._since or not status.observed
            self._apply_status(status, tolerance)
            if settling and self._sa_settling:  # still Created after the settle window
                self._publish(flush=True)
            if status.phase == "Succeeded":
                self._set_state("Succeeded", f"completed on {cluster}")
                return "done"
            if status.phase == "Failed" and fo is None:
                self._set_state("Failed", status.reason or f"failed on {cluster}")
                return "done"
            if (
                self._graceful_old
                and status.health == "Healthy"
                and status.phase in ("Running", "Succeeded")
            ):
                await self._purge_graceful_old(f"new copy on {cluster} is healthy")
            if any(c not in self._purgers for c in view.pending_purges):
                await self._retry_pending_purges()
            if tolerance == 0 and view.unhealthy_since is not None:
                await self._failover(cluster, f"unhealthy on {cluster} for 0s")
                return "failover"
            if not changed:
                # The watch window ended quietly: pause on a durable timer before the next
                # one (bounded by the next failover/grace deadline).
                timeout, summary, _ = self._next_deadline(tolerance)
                pause = self._input.rewatch_seconds
                idle = pause if timeout is None else min(pause, max(timeout, 0.001))
                await self._sleep_or_retry(idle, summary or f"re-watch {view.name} on {cluster}")
            iterations += 1
            info = workflow.info()
            if (
                info.get_current_history_length() > MAX_HISTORY_EVENTS
                or info.is_continue_as_new_suggested()
            ):
                return "continue"

    async def _on_deadline(self, due: str, cluster: str, tolerance: int | None) -> str | None:
        """Act on the deadline ``due`` (from ``_next_deadline``): "failover" or "done" when
        the job leaves ``cluster``, else None. At a failover the old copy's watch is left
        running: the failover purges that copy (now or once the new one is healthy) and
        the watch ends then."""
        if due == "failover":
            await self._failover(cluster, f"unhealthy on {cluster} for {tolerance or 0}s")
            return "failover"
        if due == "evict":
            await self._failover(cluster, f"on {self._evict_reason}")
            return "failover"
        if due == "deadline":
            await self._deadline_exceeded()
            return "done"
        if due == "grace":
            await self._purge_graceful_old("grace period ended")
        return None

    def _start_watch(self, cluster: str, settling: bool) -> ActivityHandle[JobStatus]:
        view = self._require_view()
        watch = workflow.start_activity(
            "watch_status",
            WatchInput(
                cluster=cluster,
                job=self._ref,
                since=self._since,
                timeout_seconds=SA_SETTLE_SECONDS if settling else WATCH_SECONDS,
                cluster_tolerations=[
                    t.model_dump(exclude_none=True)
                    for t in self._pol.spec.placement.clusterTolerations
                ],
            ),
            result_type=JobStatus,
            start_to_close_timeout=timedelta(seconds=WATCH_SECONDS + 60),
            heartbeat_timeout=timedelta(seconds=30),
            retry_policy=MEMBER_RETRY,
            # A watch is read-only and ends by itself at its window or when its copy goes
            # away: it is never cancelled, only waited for before the workflow closes.
            cancellation_type=ActivityCancellationType.ABANDON,
            summary=f"watch {view.name} on {cluster}",
        )
        self._watches = [w for w in self._watches if not w.done()] + [watch]
        return watch

    def _next_deadline(self, tolerance: int | None) -> tuple[float | None, str | None, str]:
        """``(seconds to the nearest deadline, its summary, which)``; the seconds are
        <= 0 once it is due (clamped where a timer is armed)."""
        view = self._require_view()
        now = workflow.now()
        best: tuple[float | None, str | None, str] = (None, None, "")
        if tolerance is not None and view.unhealthy_since is not None:
            remaining = (view.unhealthy_since + timedelta(seconds=tolerance) - now).total_seconds()
            best = (
                remaining,
                f"failover tolerance {tolerance}s on {view.cluster}",
                "failover",
            )
        if view.deadline_at is not None:
            remaining = (view.deadline_at - now).total_seconds()
            if best[0] is None or remaining < best[0]:
                seconds = self._job.active_deadline_seconds
                best = (
                    remaining,
                    f"runPolicy.activeDeadlineSeconds {seconds}",
                    "deadline",
                )
        if self._evict_at is not None:
            remaining = (self._evict_at - now).total_seconds()
            if best[0] is None or remaining < best[0]:
                best = (remaining, f"evict: {self._evict_reason}", "evict")
        if self._graceful_old and self._grace_deadline is not None:
            remaining = (self._grace_deadline - now).total_seconds()
            if best[0] is None or remaining < best[0]:
                best = (
                    remaining,
                    f"grace period before purging {self._graceful_old}",
                    "grace",
                )
        return best

    def _apply_status(self, status: JobStatus, tolerance: int | None) -> None:
        view = self._require_view()
        self._since = status.observed
        view.pods = [p.model_dump() for p in status.pods]
        if status.health == "Unknown":
            added = [t.time_added for t in status.taints if t.time_added is not None]
            view.unreachable.setdefault(status.cluster, min(added) if added else workflow.now())
        else:
            view.unreachable.pop(status.cluster, None)
        if status.health != "Unknown" or status.taints:  # the member's taints are known
            if status.evict_at is not None and self._evict_at is None:
                self._event(
                    "Warning",
                    "TaintEviction",
                    f"{status.evict_reason or status.cluster}: evicting at "
                    f"{status.evict_at.isoformat(timespec='seconds')}",
                )
            self._evict_at, self._evict_reason = status.evict_at, status.evict_reason
        if status.health == "Unhealthy":
            if view.unhealthy_since is None:
                view.unhealthy_since = workflow.now()
                self._event(
                    "Warning",
                    "Unhealthy",
                    f"job unhealthy on {status.cluster}: {status.reason or status.phase}",
                )
        elif status.health == "Healthy":
            if view.unhealthy_since is not None:
                self._event("Normal", "Recovered", f"job healthy again on {status.cluster}")
            view.unhealthy_since = None
        # Unknown (cluster unreachable) neither starts nor resets the failover timer.
        if status.phase in ("Running", "Created") and status.health != "Unknown":
            state: JobState = "Running" if status.phase == "Running" else "Created"
            reason = status.reason or f"{status.phase.lower()} on {status.cluster}"
            if status.health == "Unhealthy":
                reason = f"unhealthy on {status.cluster}: {status.reason}"
            self._set_state(state, reason)
        elif status.health == "Unknown":
            self._set_state(view.state, status.reason or f"{status.cluster}: unreachable")
        elif status.phase == "Failed":
            self._set_state(
                view.state if view.state != "Created" else "Running",
                f"failed on {status.cluster}: {status.reason}",
            )
        else:
            self._publish()

    # ================================================================== failover
    async def _failover(self, old: str, why: str) -> None:
        """Evict the job from ``old`` (``why``: ``unhealthy on cluster-a for 30s``, or a
        NoExecute taint that outlasted its toleration) and place it elsewhere."""
        view = self._require_view()
        fo = self._pol.application_failover
        mode = fo.purgeMode if fo else PurgeMode.DIRECTLY
        mode_name = fo.purge_mode_name if fo else "Immediately"
        metrics.failover(old, mode.value)
        self._set_state("FailingOver", why)
        self._event("Warning", "FailoverStarted", f"job {why}; purgeMode {mode_name}")
        view.evicted.append(old)
        view.cluster = None
        view.unhealthy_since = None
        self._evict_at, self._evict_reason = None, ""
        self._since = ""
        if mode == PurgeMode.DIRECTLY and self._pol.strict_fencing:
            self._set_state(
                "FailingOver",
                f"waiting until {old} confirms the old copy is gone (fleetq.io/fencing: Strict)",
            )
            await self._await_purger(old, confirm=True)
            self._event(
                "Normal",
                "Evicted",
                f"evicted from {old}; old copy confirmed gone before rescheduling "
                "(fleetq.io/fencing: Strict)",
            )
        elif mode == PurgeMode.DIRECTLY:
            await self._purge_or_defer(old)
            self._event("Normal", "Evicted", f"evicted from {old}; old copy purged first")
        elif mode == PurgeMode.GRACEFULLY:
            grace = fo.grace_seconds if fo else 600
            self._graceful_old = old
            self._grace_deadline = workflow.now() + timedelta(seconds=grace)
            self._event(
                "Normal",
                "Evicted",
                f"evicted from {old}; old copy purged once the new one is healthy "
                f"or after {grace}s",
            )
        else:
            if old in view.copies:
                view.copies.remove(old)
            self._event(
                "Normal", "Evicted", f"evicted from {old}; old copy kept (purgeMode {mode_name})"
            )
        placed = await self._schedule()
        if placed and view.cluster is not None:  # (not when a suspension came first)
            self._event("Normal", "Rescheduled", f"rescheduled from {old} to {view.cluster}")

    # ================================================================== runPolicy
    def _arm_deadline(self) -> None:
        """runPolicy.activeDeadlineSeconds counts from the first bind (again from the
        first bind after a suspension, as the operator resets startTime on resume)."""
        view = self._require_view()
        seconds = self._job.active_deadline_seconds
        if (
            seconds is not None
            and view.deadline_at is None
            and workflow.patched(PATCH_RUN_POLICY)
        ):
            view.deadline_at = workflow.now() + timedelta(seconds=max(0, seconds))

    def _deadline_passed(self) -> bool:
        view = self._require_view()
        return view.deadline_at is not None and workflow.now() >= view.deadline_at

    async def _deadline_exceeded(self) -> None:
        """Fail the job with reason DeadlineExceeded: every copy purged; the quota is
        released as the workflow ends."""
        seconds = self._job.active_deadline_seconds
        why = f"DeadlineExceeded: active longer than runPolicy.activeDeadlineSeconds {seconds}"
        self._event("Warning", "DeadlineExceeded", why)
        await self._purge_all("purge on DeadlineExceeded")
        self._set_state("Failed", why)

    async def _purge_all(self, why: str) -> None:
        """Purge every copy the job has (current, left behind, pending), each until done."""
        view = self._require_view()
        clusters = list(
            dict.fromkeys(
                ([view.cluster] if view.cluster else [])
                + view.copies
                + view.pending_purges
                + ([self._graceful_old] if self._graceful_old else [])
            )
        )
        for cluster in clusters:
            await self._purge_until_done(cluster, why)
        view.copies, view.pending_purges = [], []
        self._graceful_old, self._grace_deadline = None, None
        await self._settle_watches()

    async def _suspend(self) -> None:
        """runPolicy.suspend / the suspend signal: purge every copy, give the quota back,
        wait in Suspended until resumed, then queue again with the original submit time."""
        view = self._require_view()
        self._suspend_wanted, self._suspending = False, True
        in_queue = self._grant is not None or view.state == "Queued"
        had_copy = bool(view.cluster or view.copies or view.pending_purges)
        self._event(
            "Normal",
            "Suspended",
            "suspended: copies purged, quota released" if had_copy else "suspended",
        )
        await self._purge_all("purge on suspend")
        view.cluster, view.pods, view.unhealthy_since = None, [], None
        view.deadline_at = None
        self._evict_at, self._evict_reason, self._since = None, "", ""
        if in_queue:
            await self._release_quota()
        view.admitted, view.queue = False, None
        self._set_state(
            "Suspended", "suspended: holds no quota; resume with fleetq resume (signal resume)"
        )
        while not self._resume_wanted:
            await workflow.wait_condition(
                lambda: self._resume_wanted or self._grant is not None
            )
            if self._grant is not None:  # a grant that crossed our cancel: give it back
                await self._release_quota()
        self._resume_wanted, self._suspending = False, False
        self._event("Normal", "Resumed", "resumed: placed again from the queue")
        self._set_state("Queued" if self._pol.queued else "Scheduling", "resumed")

    async def _purge_graceful_old(self, why: str) -> None:
        old = self._graceful_old
        self._graceful_old, self._grace_deadline = None, None
        if old:
            await self._purge_or_defer(old)
            self._event("Normal", "Purged", f"old copy on {old} purged: {why}")

    async def _purge_or_defer(self, cluster: str) -> None:
        view = self._require_view()
        try:
            await self._purge(cluster, "purge old copy", attempts=2)
        except ActivityError as exc:
            if cluster not in view.pending_purges:
                view.pending_purges.append(cluster)
            self._event(
                "Warning",
                "PurgeDeferred",
                f"could not purge {cluster} now ({exc.cause or exc}); "
                "will purge when it is reachable",
            )
            self._start_purger(cluster)
            return
        if cluster in view.copies:
            view.copies.remove(cluster)

    async def _retry_pending_purges(self) -> None:
        view = self._require_view()
        for cluster in list(view.pending_purges):
            try:
                await self._purge(cluster, "purge copy left while unreachable", attempts=1)
            except ActivityError:
                continue
            view.pending_purges.remove(cluster)
            if cluster in view.copies:
                view.copies.remove(cluster)
            self._event("Normal", "Purged", f"copy on {cluster} purged after it became reachable")

    async def _purge(self, cluster: str, why: str, attempts: int = 3) -> PurgeResult:
        task = asyncio.ensure_future(
            workflow.execute_activity(
                "purge",
                PurgeInput(cluster=cluster, job=self._ref),
                result_type=PurgeResult,
                start_to_close_timeout=timedelta(seconds=60),
                retry_policy=RetryPolicy(
                    initial_interval=timedelta(seconds=1),
                    maximum_interval=timedelta(seconds=10),
                    maximum_attempts=attempts,
                ),
                summary=f"{why} on {cluster}",
            )
        )
        self._in_flight = (cluster, task)
        try:
            result: PurgeResult = await asyncio.shield(task)
            return result
        finally:
            if task.done():
                self._in_flight = None

    # ================================================================== endings
    async def _finish(self) -> None:
        view = self._require_view()
        # Reservations were consumed by the pods; delete leftovers on every copy we hold.
        for cluster in list(view.pending_purges):
            await self._purge_until_done(cluster, "purge copy left while unreachable")
            if cluster in view.pending_purges:  # _await_purger removes it itself
                view.pending_purges.remove(cluster)
        if self._graceful_old:
            await self._purge_until_done(self._graceful_old, "purge old copy")
            self._graceful_old = None
        await self._settle_watches()
        await self._release_quota()
        view.finished_at = workflow.now()
        self._publish()

    async def _on_deleted(self) -> None:
        view = self._require_view()
        self._event("Normal", "Deleted", "job deleted from the fleet; purging member copies")
        in_flight: list[str] = []
        if self._in_flight is not None:
            cluster, task = self._in_flight
            in_flight.append(cluster)
            with contextlib.suppress(Exception):
                await task  # let the interrupted write land before purging after it
            self._in_flight = None
        clusters = in_flight + list(
            dict.fromkeys(
                view.copies
                + view.pending_purges
                + ([self._graceful_old] if self._graceful_old else [])
            )
        )
        for cluster in clusters:
            await self._purge_until_done(cluster, "purge on delete")
        view.copies, view.pending_purges, view.cluster = [], [], None
        await self._settle_watches()
        await self._release_quota()
        view.finished_at = workflow.now()
        self._set_state("Deleted", "deleted")

    async def _purge_until_done(self, cluster: str, why: str) -> None:
        """Purge now; a member that does not answer is handed to a purge_when_reachable
        activity, which purges the moment it answers again (a handful of events however
        long the outage, visible in the UI as a running activity)."""
        if not workflow.patched(PATCH_PURGE_WHEN_REACHABLE):
            await self._purge_until_done_on_timers(cluster, why)
            return
        view = self._require_view()
        if cluster not in view.pending_purges:  # it answered a moment ago: purge now
            try:
                await self._purge(cluster, why, attempts=2)
                return
            except ActivityError as exc:
                if cancelled_by_delete(exc):
                    raise
                self._set_state(
                    view.state, f"waiting to purge copy on {cluster}: {exc.cause or exc}"
                )
        await self._await_purger(cluster)

    def _start_purger(
        self, cluster: str, confirm: bool = False
    ) -> ActivityHandle[PurgeResult] | None:
        """Start (once) the activity that purges ``cluster``'s copy as soon as it answers;
        None for a workflow started before it existed (it purges on timers instead)."""
        running = self._purgers.get(cluster)
        if running is not None and not running.done():
            return running
        if not workflow.patched(PATCH_PURGE_WHEN_REACHABLE):
            return None
        handle = workflow.start_activity(
            "purge_when_reachable",
            PurgeInput(cluster=cluster, job=self._ref, confirm=confirm),
            result_type=PurgeResult,
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

    async def _await_purger(self, cluster: str, confirm: bool = False) -> None:
        """Purge ``cluster``'s copy and wait until that is done, however long the member
        stays away (with ``confirm``: until the copy is confirmed gone)."""
        view = self._require_view()
        running = self._purgers.get(cluster)
        if confirm and running is not None and not running.done():
            running.cancel()  # restart it so that it confirms
            self._purgers.pop(cluster)
        while True:
            handle = self._start_purger(cluster, confirm=confirm)
            if handle is None:
                await self._purge_until_done_on_timers(cluster, "purge copy")
                break
            try:
                await handle
                break
            except ActivityError as exc:
                if cancelled_by_delete(exc):
                    raise
                # e.g. the member left the fleet config: say so; strict fencing still
                # never lets a new copy start before the old one is confirmed gone
                self._event(
                    "Warning", "PurgeFailed", f"could not purge {cluster}: {exc.cause or exc}"
                )
                if not confirm:
                    return
                await workflow.sleep(
                    PURGE_RETRY_SECONDS, summary=f"retry confirming the copy on {cluster} is gone"
                )
            finally:
                self._purgers.pop(cluster, None)
        if cluster in view.pending_purges:
            view.pending_purges.remove(cluster)
        if cluster in view.copies:
            view.copies.remove(cluster)
        view.unreachable.pop(cluster, None)

    def _purger_finished(self) -> bool:
        return any(h.done() for h in self._purgers.values())

    def _collect_purgers(self) -> None:
        """Record the copies that purge_when_reachable activities have purged."""
        view = self._require_view()
        for cluster, handle in list(self._purgers.items()):
            if not handle.done():
                continue
            del self._purgers[cluster]
            try:
                handle.result()
            except ActivityError as exc:  # left pending: purged on the job's ending
                self._event(
                    "Warning", "PurgeFailed", f"could not purge {cluster}: {exc.cause or exc}"
                )
                continue
            if cluster in view.pending_purges:
                view.pending_purges.remove(cluster)
            if cluster in view.copies:
                view.copies.remove(cluster)
            view.unreachable.pop(cluster, None)
            self._event(
                "Normal", "Purged", f"copy on {cluster} purged as soon as it answered again"
            )

    def _stop_purgers(self) -> None:
        for handle in self._purgers.values():
            if not handle.done():
                handle.cancel()
        self._purgers.clear()

    async def _purge_until_done_on_timers(self, cluster: str, why: str) -> None:
        """Purge, retrying on durable timers (not activity retries): how workflows started
        before purge_when_reachable existed keep purging."""
        delay = 5.0
        while True:
            try:
                await self._purge(cluster, why, attempts=2)
                return
            except ActivityError as exc:
                self._set_state(
                    self._require_view().state,
                    f"waiting to purge copy on {cluster}: {exc.cause or exc}",
                )
            await workflow.sleep(delay, summary=f"retry purge on {cluster} in {int(delay)}s")
            delay = min(delay * 2, 300.0)

    async def _release_quota(self) -> None:
        tree_id = self._resolution.tree_workflow_id
        if self._policy is None or not self._policy.queued or tree_id is None:
            return
        signal: Literal["release", "cancel"] = "release" if self._grant is not None else "cancel"
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
        quota workflow is not running."""
        sent: bool = await workflow.execute_local_activity(
            "signal_quota",
            message,
            result_type=bool,
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(
                initial_interval=timedelta(seconds=1),
                maximum_interval=timedelta(seconds=10),
                maximum_attempts=5,
            ),
            summary=summary,
        )
        return sent

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
        """The job is in a state that is published only once it lasts, and has not been
        published yet."""
        view = self._require_view()
        return (
            self._sa_enabled
            and view.state in SETTLING_STATES
            and self._sa_last.get(SA_STATE) != view.state
        )

    @property
    def _pol(self) -> PropagationPolicy:
        assert self._policy is not None, "policy is resolved before any phase runs"
        return self._policy

    def _require_view(self) -> JobView:
        assert self._view is not None
        return self._view

    def _summary_line(self) -> str:
        return self._gang.summary_line(self._job.metadata.namespace, self._job.metadata.name)

    def _event(self, kind: Literal["Normal", "Warning"], reason: str, message: str) -> None:
        view = self._require_view()
        if view.events and view.events[-1].reason == reason and view.events[-1].message == message:
            view.events[-1].count += 1
            view.events[-1].time = workflow.now()
        else:
            view.events.append(
                JobEvent(
                    type=kind,
                    reason=reason,
                    message=message,
                    time=workflow.now(),
                )
            )
        del view.events[:-MAX_EVENTS]
        self._publish()

    def _set_state(self, state: JobState, reason: str) -> None:
        view = self._require_view()
        if state != view.state:
            metrics.job_state(state)
        view.state = state
        view.reason = reason
        self._publish()

    def _publish(self, flush: bool = False) -> None:
        view = self._require_view()
        last = view.events[-1] if view.events else None
        lines = [
            f"**{view.state}** — {view.reason}" if view.reason else f"**{view.state}**",
            "",
            f"- cluster: `{view.cluster or '-'}`",
            f"- queue: `{view.queue or ('waiting' if view.queued and not view.admitted else '-')}`",
            f"- priority: {view.priority}",
        ]
        if view.evicted:
            lines.append(f"- evicted from: {', '.join(view.evicted)}")
        if view.pending_purges:
            lines.append(f"- purge pending on: {', '.join(view.pending_purges)}")
        if last is not None:
            lines.append(f"- last event: {last.reason}: {last.message}")
        details = "\n".join(lines)
        if details != self._details:
            self._details = details
            workflow.set_current_details(details)
        waits = view.state in SETTLING_STATES and not flush  # published once it lasts
        if self._sa_enabled and view.state not in TRANSIENT_STATES and not waits:
            wanted: dict[str, Any] = {
                SA_STATE: view.state,
                SA_CLUSTER: view.cluster or "",
                SA_QUEUE: view.queue or "",
                SA_JOB: f"{view.namespace}/{view.name}",
                SA_NAMESPACE: view.namespace,
                SA_PRIORITY: view.priority,
            }
            # an empty keyword never set is the same as unset: no upsert for it
            changed = {
                k: v
                for k, v in wanted.items()
                if self._sa_last.get(k) != v and not (v == "" and k not in self._sa_last)
            }
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
    def suspend(self) -> None:
        """Suspend the job (as ``runPolicy.suspend: true``): its copies are purged and its
        quota released until ``resume``."""
        view = self._view
        if view is not None and view.state not in TERMINAL_STATES and view.state != "Suspended":
            self._suspend_wanted = True
            self._resume_wanted = False

    @workflow.signal
    def resume(self) -> None:
        """Resume a suspended job: it queues again (keeping its submit time)."""
        if self._suspend_wanted:  # not carried out yet: forget it
            self._suspend_wanted = False
        elif self._suspending:
            self._resume_wanted = True

    @workflow.signal
    def retry_placement(self) -> None:
        """Capacity changed somewhere: retry a pending placement now."""
        self._retry_now = True

    @workflow.query
    def status(self) -> JobView | None:
        return self._view

    @property
    def gang(self) -> Gang:
        return self._gang


def _search_attributes_at_start() -> dict[str, Any]:
    """fleetq's search attributes the run started with (set by ``fleetq apply`` at
    submission, or carried over by continue-as-new), so they are not upserted again."""
    out: dict[str, Any] = {}
    for pair in workflow.info().typed_search_attributes:
        if pair.key.name in (SA_STATE, SA_CLUSTER, SA_QUEUE, SA_JOB, SA_NAMESPACE, SA_PRIORITY):
            out[pair.key.name] = pair.value
    return out
