"""The decisions of a job's phases around the watch (``fleetq.job_machine``): checking
its input at start, what it asks its quota workflow for, what admission and the quota
workflow's ``admissibility`` show, a placement round's input and member write, what a
bind, a failover, a suspension and runPolicy.activeDeadlineSeconds record and show.

Each function works on the run's ``JobProgress`` (changed in place, as
``fleetq.lifecycle``'s rules do) and returns the ``Notice`` values to show, in order;
``workflows/pytorch_job.py`` and its ``workflows/job_*.py`` parts carry them out, so
every such decision is tested without Temporal (tests/core/test_job_phases.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fleetq import lifecycle, state_preservation
from fleetq.admission import AdmissionRequest, Grant
from fleetq.fleet_config import RequeueSettings
from fleetq.job_input import InvalidJobInput, JobInput
from fleetq.job_machine import Watching
from fleetq.lifecycle import (
    Announce,
    FailoverPlan,
    JobProgress,
    Notice,
    OldCopy,
    Reason,
    Refresh,
    Transition,
)
from fleetq.messages import (
    BindInput,
    BindRequest,
    Candidate,
    FirstWatch,
    GangShape,
    JobRef,
    JobView,
    PlacementInput,
    PlacementVerdict,
    PodReservation,
    PreemptSignal,
    QuotaSignal,
    ReserveRequest,
    Resolution,
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
    parse_job,
    parse_policy,
    quota_request,
)
from fleetq.naming import job_workflow_id
from fleetq.preemption import (
    GRACE_ANNOTATION,
    PREEMPTIBLE_ANNOTATION,
    JobPreemptionPolicy,
    PreemptionReason,
    job_policy,
)


class Refused(Exception):
    """The job can never run as given; the workflow fails with this one-line message."""


# ---------------------------------------------------------------------- the start


def read_input(decoded: Any, workflow_id: str) -> tuple[JobInput, PyTorchJob]:
    """The workflow's input and its manifest, or ``Refused`` naming what is wrong (its
    id must be the job's, and a new job's preemption annotations must read)."""
    try:
        inp = JobInput.from_arg(decoded)
        job = parse_job(inp.manifest)
    except (InvalidJobInput, ManifestErrors) as exc:
        raise Refused(str(exc)) from None
    ns, name = job.metadata.namespace, job.metadata.name
    expected = job_workflow_id(ns, name)
    if workflow_id != expected:
        raise Refused(
            f"PyTorchJob {ns}/{name}: workflow id must be {expected!r} (got {workflow_id!r})"
        )
    notes = job.metadata.annotations
    if inp.progress is None and (PREEMPTIBLE_ANNOTATION in notes or GRACE_ANNOTATION in notes):
        try:
            job_policy(job)
        except ManifestError as exc:
            raise Refused(str(exc)) from None
    return inp, job


def new_progress(namespace: str, name: str, created_at: datetime) -> JobProgress:
    """A new job's progress: Validating, nothing resolved yet."""
    view = JobView(namespace=namespace, name=name, state="Validating", created_at=created_at)
    return JobProgress(view=view, resolution=Resolution())


def carried_policy(progress: JobProgress) -> PropagationPolicy:
    """The policy a continued run was handed (``Refused`` when it was lost)."""
    doc = progress.resolution.policy
    policy = parse_policy(doc) if doc else None
    if policy is None:
        view = progress.view
        raise Refused(f"PyTorchJob {view.namespace}/{view.name}: lost its policy across "
                      "continue-as-new")
    return policy


def given_policy(doc: Any, job_namespace: str) -> PropagationPolicy:
    """A policy document given with the job or resolved for it (``Refused`` when it does
    not parse, or is a namespaced policy of another namespace)."""
    try:
        policy = parse_policy(doc)
    except ManifestErrors as exc:
        raise Refused(str(exc)) from None
    refusal = lifecycle.policy_refusal(
        policy.metadata.namespace, policy.metadata.name, job_namespace,
        cluster_scoped=isinstance(policy, ClusterPropagationPolicy),
    )
    if refusal is not None:
        raise Refused(refusal)
    return policy


def show_request(progress: JobProgress, gang: Gang, policy: PropagationPolicy) -> list[Notice]:
    """Once resolved, the job shows what it asks for (priority, queueing, its gang)."""
    view = progress.view
    view.priority = gang.priority
    view.queued = policy.queued
    view.summary = gang.summary_line(view.namespace, view.name)
    view.gang = gang.minimum_line()
    return [Refresh()]


def preemption_policy(job: PyTorchJob) -> JobPreemptionPolicy:
    """The job's ``fleetq.io/preemptible`` and grace period (refused at start when
    unreadable; a job started before that check keeps the defaults)."""
    try:
        return job_policy(job)
    except ManifestError:
        return JobPreemptionPolicy()


# ---------------------------------------------------------------------- queueing


@dataclass(frozen=True)
class QueueWait:
    """The job cannot be put in a quota workflow's queue now: the ``reason`` it waits
    Queued with, and the ``summary`` of the pause before it resolves its tree again."""

    reason: str
    summary: str


NO_TREE = QueueWait("no ElasticQuotaTree is applied to the fleet", "wait for an ElasticQuotaTree")


def tree_gone(tree_id: str) -> QueueWait:
    """The quota workflow did not take the ``enqueue`` (not running, or unreachable)."""
    return QueueWait(f"quota workflow {tree_id} is not running", "wait for the quota workflow")


def admission_request(
    progress: JobProgress, gang: Gang, job_id: str, preemption: JobPreemptionPolicy,
    now: datetime,
) -> AdmissionRequest:
    """The job's request to its quota workflow, with its original submit time."""
    view = progress.view
    return AdmissionRequest(
        job_id=job_id,
        namespace=view.namespace,
        priority=gang.priority,
        request=quota_request(gang),
        submitted_at=(view.created_at or now).timestamp(),
        preemptible=preemption.preemptible,
        grace_seconds=preemption.grace_seconds,
    )


def enqueue_needed(progress: JobProgress, tree_id: str) -> bool:
    """Whether to send ``enqueue`` to ``tree_id``: not when a ``requeue`` just put the
    job back in that queue (``JobProgress.requeued_in``, used up here)."""
    if progress.requeued_in == tree_id:
        progress.requeued_in = None
        return False
    return True


def enqueued(tree_id: str) -> list[Notice]:
    """The job is in its quota workflow's queue: Queued, waiting for quota."""
    return [Transition("Queued", "waiting for quota"),
            Announce("Normal", Reason.QUEUED, f"enqueued in quota tree {tree_id}")]


def admissibility(progress: JobProgress) -> list[Notice]:
    """What the quota workflow's last ``admissibility`` signal shows, once: Inadmissible
    (never admitted under the current tree, and why), or Queued again."""
    news, progress.admissibility_news = progress.admissibility_news, False
    if not news or progress.admissibility is None:
        return []
    view = progress.view
    why = progress.admissibility.inadmissible
    if why is not None:
        if view.reason == why.message:
            return []
        return [Transition("Inadmissible", why.message),
                Announce("Warning", Reason.INADMISSIBLE, why.message)]
    if view.state == "Inadmissible":
        return [Transition("Queued", "waiting for quota"),
                Announce("Normal", Reason.QUEUED, "the quota tree changed: queued again")]
    return []


def admit(progress: JobProgress, grant: Grant, now: datetime) -> list[Notice]:
    """The quota workflow admitted the job: Scheduling (transient, so the new queue is
    published with the next lasting state), and when the admission began."""
    view = progress.view
    view.admitted = True
    view.queue = grant.queue
    lifecycle.admitted_now(progress, now)
    return [Transition("Scheduling", "admitted"),
            Announce("Normal", Reason.ADMITTED,
                     f"admitted by queue {grant.queue} (quota {grant.node})")]


def give_back(progress: JobProgress, *, queued: bool, granted: bool,
              job_id: str) -> QuotaSignal | None:
    """The message that gives the job's quota back to its quota workflow: ``release``
    what was granted, else ``cancel`` (leave the queue); None when the job queues in no
    quota workflow (its policy does not queue, no tree was resolved)."""
    tree_id = progress.resolution.tree_workflow_id
    if not queued or tree_id is None:
        return None
    return QuotaSignal(tree_workflow_id=tree_id, signal=lifecycle.quota_return(granted=granted),
                       job_id=job_id)


def requeue(give: QuotaSignal, request: AdmissionRequest) -> QuotaSignal:
    """Give the granted quota back and queue again in one message (``requeue``), so the
    job is in its queue before the pass that hands out what it freed (issue 24)."""
    return QuotaSignal(tree_workflow_id=give.tree_workflow_id, signal="requeue", request=request)


def capacity_preemption(signal: PreemptSignal | None) -> bool:
    """A ``preempt`` signal for room on a member (a capacity preemption), not for quota."""
    return signal is not None and signal.reason == PreemptionReason.CAPACITY.value


def holding(progress: JobProgress, signal: PreemptSignal, *, granted: bool) -> bool:
    """Whether a ``preempt`` signal finds the job holding what it is preempted for: its
    grant, or (a capacity preemption) its bound copy under a policy without quota."""
    return granted or (capacity_preemption(signal) and progress.view.cluster is not None)


# ---------------------------------------------------------------------- placing


def may_fit(verdict: PlacementVerdict) -> bool:
    """An Unschedulable job's placement after its members' nodes changed: some member
    may hold the gang now (it queues again)."""
    return bool(verdict.candidates) or not verdict.never


def placement_input(progress: JobProgress, policy: PropagationPolicy, gang: Gang,
                    job_id: str) -> PlacementInput:
    """One placement round's input: the gang, the policy's cluster filters, the members
    it was evicted from."""
    view = progress.view
    placement = policy.spec.placement
    affinity = placement.clusterAffinity
    return PlacementInput(
        job_ref=f"{view.namespace}/{view.name}",
        gang=GangShape.from_gang(gang),
        affinity=affinity.model_dump(exclude_none=True) if affinity is not None else None,
        cluster_groups=[t.model_dump(exclude_none=True) for t in placement.cluster_affinities],
        group=view.cluster_group,
        cluster_tolerations=[t.model_dump(exclude_none=True)
                             for t in placement.clusterTolerations],
        exclude=list(view.evicted),
        job_id=job_id,
    )


def capacity_input(placement: PlacementInput, progress: JobProgress) -> PlacementInput:
    """``placement`` asking also for the capacity preemption part: plan one when none is
    outstanding, else which of the planned victims are left."""
    return placement.model_copy(update={
        "tree_workflow_id": progress.resolution.tree_workflow_id,
        "capacity_preemption": lifecycle.may_plan_capacity(progress),
        "planned": lifecycle.planned_capacity(progress),
    })


def bind_input(progress: JobProgress, cand: Candidate, *, job: JobRef, inp: JobInput,
               policy: PropagationPolicy, gang: Gang, settling: bool = False) -> BindInput:
    """The member write on ``cand``: its reservations first where the member reserves
    (each pod on its assigned node), then the copy (with the preserved labels). When the
    bound job's Created state is ``settling`` (published only once it lasts), the copy's
    first watch, over the settle window, rides in the same activity."""
    reserve = None
    if cand.reservation:
        pods = [
            PodReservation(role=p.role, index=p.index, node=cand.assignment.get(p.name_suffix, ""),
                           requests=p.requests, node_selector=p.node_selector,
                           tolerations=list(p.tolerations))
            for p in gang.pods
        ]
        reserve = ReserveRequest(job=job, pods=pods)
    request = BindRequest(job=job, manifest=inp.manifest, propagate_deps=policy.spec.propagateDeps,
                          run_seconds=inp.run_seconds, priority=gang.priority,
                          labels=dict(progress.preserved_labels))
    watch = None
    if settling:
        watch = FirstWatch(since=lifecycle.FIRST_WATCH_SINCE,
                           timeout_seconds=lifecycle.SA_SETTLE_SECONDS,
                           cluster_tolerations=cluster_tolerations(policy))
    return BindInput(cluster=cand.cluster, request=request, reserve=reserve, watch=watch,
                     release_room=progress.capacity is not None)


def cluster_tolerations(policy: PropagationPolicy) -> list[dict[str, Any]]:
    """The policy's placement.clusterTolerations as a watch takes them."""
    return [t.model_dump(exclude_none=True) for t in policy.spec.placement.clusterTolerations]


def bound(progress: JobProgress, cand: Candidate, rejections: dict[str, str], *, gang: Gang,
          granted: bool, settings: RequeueSettings, active_deadline_seconds: int | None,
          now: datetime) -> list[Notice]:
    """The job is bound on ``cand``: recorded, its pods-ready bound armed when it holds
    quota (given back if its pods never run), runPolicy.activeDeadlineSeconds armed at
    the first bind; then Created."""
    lifecycle.record_bind(progress, cand.cluster, rejections, now, cand.group)
    if granted:
        lifecycle.arm_pods_ready(progress, settings, now)
    view = progress.view
    if lifecycle.deadline_to_arm(view, active_deadline_seconds):
        assert active_deadline_seconds is not None
        view.deadline_at = lifecycle.deadline_at(active_deadline_seconds, now)
    result = binding_result(cand.cluster, gang) + lifecycle.group_note(cand.group)
    return [Announce("Normal", Reason.BOUND,
                     f"Binding has been scheduled successfully. Result: {result}"),
            Transition("Created", f"bound to {cand.cluster}")]


def failed_scheduling(rejections: dict[str, str]) -> Announce:
    """Nothing fits now: why (every round aggregated: ``FailedScheduling (x7 over 21m)``)."""
    return Announce("Warning", Reason.FAILED_SCHEDULING, lifecycle.pending_reason(rejections))


def deadline_exceeded(active_deadline_seconds: int | None) -> tuple[Announce, Transition]:
    """runPolicy.activeDeadlineSeconds passed: said first, Failed once every copy is
    purged."""
    why = lifecycle.deadline_exceeded_reason(active_deadline_seconds)
    return Announce("Warning", Reason.DEADLINE_EXCEEDED, why), Transition("Failed", why)


# ---------------------------------------------------------------------- watching


def tolerance(policy: PropagationPolicy) -> int | None:
    """applicationFailover tolerationSeconds (None: no tolerance, or no failover)."""
    fo = policy.application_failover
    return fo.decisionConditions.tolerationSeconds if fo else None


def watching(policy: PropagationPolicy, gang: Gang, job: PyTorchJob,
             rewatch_seconds: float) -> Watching:
    """What the bound job is watched under (``job_machine.step``'s ``Watching``)."""
    return Watching(tolerance=tolerance(policy), failover=policy.application_failover is not None,
                    pods=len(gang.pods), active_deadline_seconds=job.active_deadline_seconds,
                    rewatch_seconds=rewatch_seconds)


def take_graceful_old(progress: JobProgress) -> str | None:
    """purgeMode Gracefully: the old copy to purge now (the new copy is healthy, or the
    grace period ended); none waits any more."""
    old = progress.graceful_old
    progress.graceful_old, progress.grace_deadline = None, None
    return old


def old_copy_purged(progress: JobProgress, old: str, why: str) -> list[Notice]:
    """After purging the graceful old copy on ``old``: ``Purged`` and it is forgotten,
    unless its purge was deferred (``PurgeDeferred`` said so)."""
    if lifecycle.purge_deferred(progress.view, old):
        return []
    lifecycle.forget_copy(progress.view, old)
    return [Announce("Normal", Reason.PURGED, f"old copy on {old} purged: {why}")]


# ---------------------------------------------------------------------- failover


def start_failover(progress: JobProgress, policy: PropagationPolicy, old: str, why: str, *,
                   cluster_failure: bool) -> tuple[FailoverPlan, list[Notice]]:
    """A failover from ``old`` starts: what its purgeMode does with the old copy (the
    policy's ``failover.cluster`` when a NoExecute taint evicted it), FailingOver, and
    the labels statePreservation carries to the next copy."""
    plan = lifecycle.failover_plan(
        policy.application_failover, strict_fencing=policy.strict_fencing,
        cluster=policy.cluster_failover if cluster_failure else None,
    )
    notices: list[Notice] = [
        Transition("FailingOver", why),
        Announce("Warning", Reason.FAILOVER_STARTED, plan.started_message(why)),
    ]
    return plan, notices + preserve_state(progress, policy, old, plan.mode, cluster_failure)


def preserve_state(progress: JobProgress, policy: PropagationPolicy, old: str,
                   purge: PurgeMode, cluster_failure: bool) -> list[Notice]:
    """statePreservation: the labels the next copy carries, read from the status of the
    copy on ``old`` as last synced (none, with a Warning, when a rule fails)."""
    try:
        labels = state_preservation.labels_at_failover(
            policy, purge, progress.synced_status, cluster_failure=cluster_failure
        )
    except state_preservation.PreservationError as exc:
        progress.preserved_labels = {}
        return [Announce("Warning", Reason.STATE_NOT_PRESERVED,
                         f"{exc}; the new copy carries no preserved labels")]
    progress.preserved_labels = labels
    if not labels:
        return []
    shown = ", ".join(f"{k}={v}" for k, v in sorted(labels.items()))
    return [Announce("Normal", Reason.STATE_PRESERVED,
                     f"from the copy on {old}, the new copy carries labels {shown}")]


def leave(progress: JobProgress, old: str, plan: FailoverPlan, *, cluster_failure: bool,
          now: datetime) -> tuple[float | None, list[Notice]]:
    """The job leaves ``old``: how long it had been on notice, and (fencing Strict)
    that it waits until ``old`` confirms the old copy is gone. Purgemodes that do not
    purge first keep their bookkeeping of the old copy."""
    after = lifecycle.evicted_after(progress, now, taint=cluster_failure)
    lifecycle.leave_cluster(progress, old)
    if plan.old_copy == OldCopy.CONFIRM_GONE:
        return after, [Transition("FailingOver", f"waiting until {old} confirms the old copy "
                                                 "is gone (fleetq.io/fencing: Strict)")]
    if plan.old_copy != OldCopy.PURGE_FIRST:
        lifecycle.keep_old_copy(progress, old, plan, now)
    return after, []


def evicted(progress: JobProgress, old: str, plan: FailoverPlan,
            after: float | None) -> list[Notice]:
    """The old copy was dealt with: ``Evicted``, saying what became of it (a purge that
    was deferred is pending, never done; a purged one leaves no copy behind)."""
    view = progress.view
    deferred = lifecycle.purge_deferred(view, old)
    if plan.old_copy == OldCopy.PURGE_FIRST and not deferred:
        lifecycle.forget_copy(view, old)
    return [Announce("Normal", Reason.EVICTED,
                     plan.evicted_message(old, after=after, deferred=deferred))]


def rescheduled(progress: JobProgress, old: str) -> list[Notice]:
    """After the failover's placement: ``Rescheduled`` when it bound (not when a
    suspension or a preemption came first)."""
    cluster = progress.view.cluster
    if cluster is None:
        return []
    return [Announce("Normal", Reason.RESCHEDULED, f"rescheduled from {old} to {cluster}")]


# ---------------------------------------------------------------------- suspension


def suspend(progress: JobProgress, *, granted: bool) -> tuple[bool, list[Notice]]:
    """A suspension is carried out: whether the job is in (or admitted by) its quota
    workflow's queue (it leaves it), and what is said. A preemption under way is
    dropped: the quota goes back anyway."""
    view = progress.view
    progress.suspension.begin()
    progress.preempt, progress.preempt_at = None, None
    in_queue = granted or view.state in ("Queued", "Inadmissible")
    had_copy = bool(view.cluster or view.copies or view.pending_purges)
    return in_queue, [Announce("Normal", Reason.SUSPENDED, lifecycle.suspended_message(had_copy))]


def suspended(progress: JobProgress) -> list[Notice]:
    """Every copy purged and the quota given back: Suspended until resumed."""
    lifecycle.forget_placement(progress)
    view = progress.view
    view.admitted, view.queue = False, None
    return [Transition("Suspended",
                       "suspended: holds no quota; resume with fleetq resume (signal resume)")]


def resumed(progress: JobProgress, *, queued: bool) -> list[Notice]:
    """Resumed: placed again from the queue (keeping its submit time)."""
    progress.suspension.end()
    return [Announce("Normal", Reason.RESUMED, "resumed: placed again from the queue"),
            Transition("Queued" if queued else "Scheduling", "resumed")]


# ---------------------------------------------------------------------- endings


def left_copy_purged(view: JobView, cluster: str) -> list[Notice]:
    """At the end, after purging the copy left on ``cluster`` while it did not answer:
    ``Purged`` when its purger purged it (and took it off the list); else (PurgeFailed
    said why) it is no longer waited for."""
    if cluster in view.pending_purges:
        view.pending_purges.remove(cluster)
        return []
    return [Announce("Normal", Reason.PURGED,
                     f"copy on {cluster} purged as soon as it answered again")]


def deleted(progress: JobProgress) -> tuple[list[str], list[Notice]]:
    """The job was deleted from the fleet: the members to purge (besides a write in
    flight), and what is said first."""
    return lifecycle.copies_to_purge(progress, current=False), [
        Announce("Normal", Reason.DELETED, "job deleted from the fleet; purging member copies")
    ]


def all_purged(progress: JobProgress) -> None:
    """Every copy of the deleted job is purged: none is left, it is bound nowhere."""
    view = progress.view
    view.copies, view.pending_purges, view.cluster = [], [], None


def gone(progress: JobProgress, now: datetime) -> list[Notice]:
    """The deleted job's copies are purged and its quota given back: Deleted."""
    progress.view.finished_at = now
    return [Transition("Deleted", "deleted")]
