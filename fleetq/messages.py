"""Compact payloads exchanged between workflows, activities and the CLI.

Everything here goes through Temporal history, so it stays small: pod *shapes* grouped by
role instead of pod lists, cluster names and one-line reasons instead of node lists, and
never a kubeconfig or Secret data. Every Temporal contract lives here (activity and
workflow inputs and outputs, the member-cluster verdicts included), so workflows import
plain data models and never an adapter module; this module is pure core (no Temporal,
no Kubernetes client).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from fleetq.admission import AdmissionRequest, Grant, QueueInfo, QueuePolicy
from fleetq.capacity import Taint
from fleetq.fleet_config import RequeueSettings
from fleetq.job_view import TERMINAL_STATES as TERMINAL_STATES  # re-exported: the job's view
from fleetq.job_view import JobEvent as JobEvent
from fleetq.job_view import JobState as JobState
from fleetq.job_view import JobView as JobView
from fleetq.models import DEFAULT_STARVATION_SECONDS, Gang, GangPod
from fleetq.naming import owner_id
from fleetq.quota import Inadmissible
from fleetq.rejection import Rejection, RejectionCode

# --------------------------------------------------------------------------- gang shapes


class PodGroupShape(BaseModel):
    """``count`` identical pods of one role."""

    role: str
    count: int
    requests: dict[str, int]
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)


class GangShape(BaseModel):
    groups: list[PodGroupShape]
    priority: int = 0

    @classmethod
    def from_gang(cls, gang: Gang) -> GangShape:
        groups: list[PodGroupShape] = []
        for pod in gang.pods:
            last = groups[-1] if groups else None
            if (
                last is not None
                and last.role == pod.role
                and last.requests == pod.requests
                and last.node_selector == pod.node_selector
                and last.tolerations == list(pod.tolerations)
            ):
                last.count += 1
            else:
                groups.append(
                    PodGroupShape(
                        role=pod.role,
                        count=1,
                        requests=dict(pod.requests),
                        node_selector=dict(pod.node_selector),
                        tolerations=[dict(t) for t in pod.tolerations],
                    )
                )
        return cls(groups=groups, priority=gang.priority)

    def to_gang(self) -> Gang:
        pods: list[GangPod] = []
        index: dict[str, int] = {}
        for g in self.groups:
            for _ in range(g.count):
                i = index.get(g.role, 0)
                index[g.role] = i + 1
                pods.append(
                    GangPod(
                        g.role, i, dict(g.requests), dict(g.node_selector), tuple(g.tolerations)
                    )
                )
        return Gang(tuple(pods), self.priority)


# --------------------------------------------------------------------------- activity IO


class ResolveInput(BaseModel):
    namespace: str
    name: str
    labels: dict[str, str] = Field(default_factory=dict)
    api_version: str = "kubeflow.org/v1"
    kind: str = "PyTorchJob"
    #: when the job was submitted (epoch seconds): the registry is read no earlier, so
    #: every policy applied before the job counts
    submitted_at: float | None = None


class Resolution(BaseModel):
    """What a job needs from the fleet registry: its policy, the quota tree and the
    PriorityClass values, plus whether our search attributes are registered."""

    policy: dict[str, Any] | None = None
    policy_reason: str = ""
    tree_workflow_id: str | None = None
    priority_classes: dict[str, int] = Field(default_factory=dict)
    search_attributes: bool = False
    #: re-queue with backoff: the fleet's ``requeue`` settings with the quota tree's
    #: annotations applied (``fleetq.fleet_config.requeue_settings``)
    requeue: RequeueSettings = Field(default_factory=RequeueSettings)


class PlacementInput(BaseModel):
    job_ref: str  # "<ns>/<name>" for messages
    gang: GangShape
    affinity: dict[str, Any] | None = None
    #: placement.clusterAffinities (ordered groups, ``fleetq.cluster_groups``) and the
    #: group the job was last placed in (where this round starts)
    cluster_groups: list[dict[str, Any]] = Field(default_factory=list)
    group: str = ""
    cluster_tolerations: list[dict[str, Any]] = Field(default_factory=list)
    exclude: list[str] = Field(default_factory=list)
    #: capacity preemption (issue 18; empty in histories recorded before it): the job's
    #: workflow id and its quota workflow (whose tree says whether it may preempt) ...
    job_id: str = ""
    tree_workflow_id: str | None = None
    #: ... whether a capacity preemption may be planned now (no room anywhere) ...
    capacity_preemption: bool = False
    #: ... or the one being carried out (the verdict says which victims are still there)
    planned: CapacityPlanned | None = None
    #: a bind follows this round: the worker holds the first candidate's nodes for it
    #: until the bind (docs/decisions/020)
    assume: bool = False


class CapacityVictim(BaseModel):
    """One gang a capacity preemption evicts: its job workflow, priority, grace period,
    and why (``room on cluster-b for priority 1000 > 10``)."""

    job_id: str
    priority: int = 0
    grace_seconds: int = 30
    message: str = ""


class CapacityPlanned(BaseModel):
    """A capacity preemption (``fleetq.preemption.CapacityPlan``) as it travels: the one
    cluster and the victims there."""

    cluster: str
    victims: list[CapacityVictim] = Field(default_factory=list)


class Candidate(BaseModel):
    cluster: str
    score: float
    reservation: bool = False
    assignment: dict[str, str] = Field(default_factory=dict)  # "worker-1" -> node
    group: str = ""  # its clusterAffinities group ("" without groups)


class PlacementVerdict(BaseModel):
    candidates: list[Candidate] = Field(default_factory=list)
    #: why each cluster that is no candidate was turned down, one entry per cluster
    rejections: list[Rejection] = Field(default_factory=list)
    #: clusters that passed the policy filters (affinity, exclusions); empty means the job
    #: can never be placed, as opposed to "no room right now"
    eligible: list[str] = Field(default_factory=list)
    #: a capacity preemption planned by this round (asked with ``capacity_preemption``)
    capacity_plan: CapacityPlanned | None = None
    #: of the ``planned`` victims, those still running on its cluster
    victims_left: list[str] = Field(default_factory=list)
    #: the clusterAffinities group the candidates are in (the round's first when none fits)
    group: str = ""
    #: "never", not "not now" (a ``NeverFits`` rejection's message): no eligible member
    #: could hold the gang even with its nodes empty; "" when one could or may
    never: str = ""

    @property
    def ever_fits(self) -> bool:
        return not self.never

    def messages(self) -> dict[str, str]:
        """Cluster -> its rejection's message, as users read it."""
        return {r.cluster: r.message for r in self.rejections}

    def codes(self) -> dict[str, RejectionCode]:
        """Cluster -> its rejection's code (metrics count by these)."""
        return {r.cluster: r.code for r in self.rejections}

    def reason(self) -> str:
        if not self.rejections:
            return "no member cluster is eligible"
        return "; ".join(
            f"{c}: {r}" if not r.startswith(f"{c}:") else r
            for c, r in sorted(self.messages().items())
        )


class HolderCheck(BaseModel):
    workflow_ids: list[str]


class HolderVerdict(BaseModel):
    gone: list[str] = Field(default_factory=list)


# --------------------------------------------------------------------------- member clusters


class JobRef(BaseModel):
    """A fleet job as a member cluster knows it: its name and the workflow that owns
    its copies (``owner_id`` is the ``fleetq.io/owner`` label value), and the submission
    (``run_id``: the first run id of the workflow's continue-as-new chain, the
    ``fleetq.io/run-id`` label): a copy of another submission is never adopted. ""
    (a JobRef that names no submission): any copy of the owner is this job's."""

    namespace: str
    name: str
    workflow_id: str
    run_id: str = ""

    @property
    def owner_id(self) -> str:
        return owner_id(self.workflow_id)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


class PodReservation(BaseModel):
    role: str  # "master" | "worker"
    index: int
    node: str  # chosen by the fleet's placement
    requests: dict[str, int]  # milli-units
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)


class ReserveRequest(BaseModel):
    job: JobRef
    pods: list[PodReservation]
    ttl_seconds: int = 600


class ReserveResult(BaseModel):
    ok: bool
    reservations: list[str] = Field(default_factory=list)
    reason: str = ""


class BindRequest(BaseModel):
    job: JobRef
    manifest: dict[str, Any]  # the user's PyTorchJob manifest, as validated
    reserved: bool = False
    propagate_deps: bool = False
    run_seconds: int | None = None
    #: the job's priority as the fleet resolved it, written on the member copy's pods
    #: (``fleetq.io/priority``) so capacity preemption can read running gangs; None in
    #: histories recorded before it (such copies are never capacity victims)
    priority: int | None = None
    #: statePreservation: labels carried from the old copy's status after a failover
    labels: dict[str, str] = Field(default_factory=dict)


class BindResult(BaseModel):
    """The ``bind`` activity's answer: the copy bound, or (``reservation_lost``: why)
    its reservations could not be held and nothing was bound."""

    created: bool = False  # False: it already existed and is ours
    uid: str = ""
    deps: list[str] = Field(default_factory=list)  # "Secret default/x"
    reservation_lost: str = ""
    #: the copy's first watch, when the input asked for one (``BindInput.watch``) and it
    #: ran to its end; None: not watched, or cut short (the job's own watch reads again)
    status: JobStatus | None = None


class PodStatus(BaseModel):
    name: str
    node: str = ""
    phase: str
    ready: bool
    restarts: int
    start_time: str | None = None
    #: the pod's ``metadata.creationTimestamp`` (its AGE)
    created_at: str | None = None


Health = Literal["Healthy", "Unhealthy", "Unknown"]
#: the phase of a job that has no copy on the member
MISSING_PHASE = "Missing"


class MemberTaint(BaseModel):
    """A taint on fleetq's view of a member (``cluster.karmada.io/unreachable``...)."""

    key: str
    value: str = ""
    effect: str
    time_added: datetime | None = None

    @classmethod
    def of(cls, taint: Taint) -> MemberTaint:
        added = taint.time_added
        return cls(
            key=taint.key,
            value=taint.value,
            effect=taint.effect,
            time_added=None if added is None else datetime.fromtimestamp(added, UTC),
        )

    def to_taint(self) -> Taint:
        added = None if self.time_added is None else self.time_added.timestamp()
        return Taint(self.key, self.value, self.effect, added)


class JobStatus(BaseModel):
    cluster: str
    health: Health
    phase: str  # Created|Running|Succeeded|Failed|Missing|Unknown
    reason: str = ""
    pods: list[PodStatus] = Field(default_factory=list)
    replica_statuses: dict[str, dict[str, int]] = Field(default_factory=dict)
    observed: str = ""  # change token: differs whenever health, phase, job or pods change
    #: the member's health taints while it is unreachable / not ready
    taints: list[MemberTaint] = Field(default_factory=list)
    #: when a NoExecute taint evicts the job (its policy's tolerations considered;
    #: set by the watch activity), and why
    evict_at: datetime | None = None
    evict_reason: str = ""
    #: the taint that evicts (``key:Effect``) and the tolerationSeconds that tolerate it
    #: until ``evict_at`` (None: not tolerated at all), for the event that schedules it
    evict_taint: str = ""
    evict_tolerated: int | None = None
    #: the member copy's ``status`` as read (statePreservation's rules read it)
    status: dict[str, Any] = Field(default_factory=dict)
    #: the member copy's ``metadata.creationTimestamp`` (its AGE), when read
    created_at: datetime | None = None


class PurgeResult(BaseModel):
    deleted: list[str] = Field(default_factory=list)


class ReserveInput(BaseModel):
    cluster: str
    request: ReserveRequest


class FirstWatch(BaseModel):
    """The new copy's first watch, run by the ``bind`` activity once the copy is made:
    the bind and the settle window after it are one activity, not two with a workflow
    task between them (issue 28 item 3: 6 history events per bind)."""

    since: str
    timeout_seconds: float
    cluster_tolerations: list[dict[str, Any]] = Field(default_factory=list)


class BindInput(BaseModel):
    cluster: str
    request: BindRequest
    #: reserve this first (the member reserves): one member write, one activity
    reserve: ReserveRequest | None = None
    #: then watch the copy (None: return once bound)
    watch: FirstWatch | None = None
    #: the job carried out a capacity preemption: once bound, release the room claimed
    #: for it (``fleetq.room_claims``)
    release_room: bool = False


class WatchInput(BaseModel):
    cluster: str
    job: JobRef
    #: "" (return at once), an earlier status's ``observed`` token (return on any
    #: change), or "health/phase" (return when either changes)
    since: str = ""
    timeout_seconds: float = 300.0
    #: the policy's placement.clusterTolerations: with them the watch says when a
    #: NoExecute health taint on the member evicts the job (``JobStatus.evict_at``)
    cluster_tolerations: list[dict[str, Any]] = Field(default_factory=list)


class PurgeInput(BaseModel):
    cluster: str
    job: JobRef
    #: purge_when_reachable only: return only once the job and its pods are gone from
    #: the member (strict fencing), not once the deletes were accepted
    confirm: bool = False


class VictimsPurge(BaseModel):
    """The quota workflow's purge of one scheduling pass's grace-0 victims on every
    member (``purge_for_preemption``, docs/decisions/023)."""

    jobs: list[JobRef]


# --------------------------------------------------------------------------- job view
# (fleetq.job_view: JobState, TERMINAL_STATES, JobEvent, JobView)


# ---------------------------------------------------------------- quota workflow


class QuotaTreeInput(BaseModel):
    """The quota workflow's input: its settings, and the tree to start with (after a
    continue-as-new the run's second argument carries the admission state and the tree,
    packed by ``fleetq.quota_state.pack_state``)."""

    tree: dict[str, Any] | None = None
    policy: QueuePolicy = QueuePolicy.PRIORITY
    starvation_seconds: float = DEFAULT_STARVATION_SECONDS
    #: continue-as-new once history passes this many events (Temporal warns at 10,240)
    max_history_events: int = 2500
    leak_check_seconds: float = 60
    generation: int = 0
    #: external signals (grants, preemptions, admissibility notices) in flight at once;
    #: the rest wait in order. Temporal fails every workflow task that would leave more
    #: than ``limit.numPendingSignals.error`` (2,000 by default) pending, which would
    #: stop the tree for good
    max_signals_in_flight: int = Field(default=1000, ge=1)


class QuotaView(BaseModel):
    """The quota workflow's ``view`` query: what ``fleetq get queue`` shows."""

    tree: str | None
    policy: str
    holders: int
    waiting: int
    queues: list[QueueInfo]
    #: waiting jobs that can never be admitted under the current tree (not in waiting)
    inadmissible: int = 0
    generation: int
    grants_sent: int = 0
    leaks_recovered: list[str] = Field(default_factory=list)
    #: preemptors waiting for their victims: preemptor -> victims still holding quota
    preempting: dict[str, list[str]] = Field(default_factory=dict)
    #: ``preempt`` signals delivered to victims by this run
    preemptions_sent: int = 0
    #: the tree's ``fleetq.io/preemption`` (``Never`` or ``LowerPriority``): whether its
    #: jobs may also preempt lower-priority gangs for room on a member cluster
    preemption: str = "Never"


class AdmissibilitySignal(BaseModel):
    """The quota workflow's ``admissibility`` signal to a waiting job: it can never be
    admitted under the current tree (``inadmissible``, its reason), or, None, it is
    queued again (a tree change raised the limit it exceeded)."""

    inadmissible: Inadmissible | None = None


class PreemptSignal(BaseModel):
    """The quota workflow's ``preempt`` signal to a victim job: stop within
    ``grace_seconds``, give the quota back and queue again (keeping the submit time).
    ``reason`` is a ``fleetq.preemption.PreemptionReason`` value, ``message`` says why
    (``priority 1000 > 10``, ``reclaim for child-1 below min``)."""

    preemptor: str  # the preemptor's workflow id
    reason: str
    message: str
    grace_seconds: int = Field(default=30, ge=0)


class DeleteRequest(BaseModel):
    """The fleet registry's ``delete`` update: which object to forget."""

    kind: str
    namespace: str = "default"
    name: str


class QuotaMessage(BaseModel):
    """One message of a job to its quota workflow: ``enqueue`` or ``requeue`` (with
    ``request``), or ``release`` / ``cancel`` (with ``job_id``). ``requeue`` is a
    preempted job giving its quota back and queueing again with its original submit
    time in one step (``fleetq.admission.Admission.requeue``). The quota workflow
    treats them idempotently, so a re-run after a crash, or a resend after an unknown
    outcome, is safe."""

    signal: Literal["enqueue", "requeue", "release", "cancel"]
    request: AdmissionRequest | None = None
    job_id: str = ""

    def subject(self) -> str:
        """The job the message is about."""
        return self.request.job_id if self.request is not None else self.job_id

    def signal_arg(self) -> AdmissionRequest | str | None:
        """The argument of the single signal of the same name: the request for
        ``enqueue`` / ``requeue``, the job id for ``release`` / ``cancel``."""
        return self.request if self.signal in ("enqueue", "requeue") else self.job_id


class QuotaSignal(QuotaMessage):
    """A job's message addressed to its quota workflow: the input of the ``signal_quota``
    local activity, which hands it to the worker's ``QuotaOutbox``
    (``activities/quota_outbox.py``). Going through the client costs the job no history
    events of its own and no workflow task for a delivery acknowledgement, unlike a
    workflow-to-workflow signal."""

    tree_workflow_id: str


class QuotaBatch(BaseModel):
    """The quota workflow's ``submit`` update: messages of many jobs, applied in order in
    one workflow task (two history events for the whole batch)."""

    messages: list[QuotaMessage]


class QuotaReceipt(BaseModel):
    """What ``submit`` returns: how many messages it applied, the enqueues it refused
    (job id -> reason, e.g. a request that no quota node can ever admit), and the grants
    of the batch's enqueues it admitted at once (job id -> grant: no ``admitted`` signal
    follows for those)."""

    applied: int = 0
    refused: dict[str, str] = Field(default_factory=dict)
    grants: dict[str, Grant] = Field(default_factory=dict)


class QuotaAck(BaseModel):
    """``signal_quota``'s answer: whether the quota workflow runs (and applied the
    message), and an enqueue's grant when it was admitted at once (in the reply)."""

    running: bool = True
    grant: Grant | None = None


# models that name a model defined below them: completed here, at import, not on first
# use (a lazy rebuild resolves names through the caller's frames, which inside a workflow
# are the sandbox's)
PlacementInput.model_rebuild()
BindResult.model_rebuild()
