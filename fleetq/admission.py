"""Pure admission core: which waiting jobs may take quota now, in which order, and why the
others wait.

The quota workflow calls this API on every message, so it is deterministic (time is an
argument; no clock, randomness or salted hashes), cheap (a pass costs what changed, not
the tree; ``incremental = False`` examines every queue, same decisions) and its whole
state fits one :class:`AdmissionState` for continue-as-new. Kube Queue's semantics
(DOMAIN.md); the queue order, inadmissible jobs, pending preemption plans and the
calling pattern are in docs/queues.md "Admission".

Callers: after ``release``, ``cancel`` or ``replace_tree``, call ``schedule(now)`` and
start every returned grant; ``enqueue`` admits at once only when no pass is pending.
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from fleetq import resources as R
from fleetq.models import DEFAULT_STARVATION_SECONDS, ElasticQuotaTree, parse_tree
from fleetq.queue_strategies import QueuePolicy, QueueStrategy, display_job, strategy_for
from fleetq.queues import JobQueue, Key
from fleetq.quota import Inadmissible, QuotaTree

__all__ = ["QueuePolicy", "display_job"]  # (re-exported: where callers import them from)

#: a victim's default grace period (``fleetq.io/preemption-grace-seconds``)
DEFAULT_GRACE_SECONDS = 30
#: how long past its longest victim grace period a preemption plan waits for its victims
#: to release before it is dropped (:meth:`Admission.expire_plans`): a victim stops,
#: purges its member copy (retried with backoff on an unreachable member) and releases
#: within seconds of its grace period when its member answers
PLAN_MARGIN_SECONDS = 120



_K = TypeVar("_K")

class _Numbered(dict[_K, int]):
    """Numbers keys in the order they are first seen (a packed state's shape and
    namespace tables): calling it with a key gives the key's number."""

    def __call__(self, key: _K) -> int:
        return self.setdefault(key, len(self))

class AdmissionRequest(BaseModel):
    """One job asking for quota (travels through workflow history: keep it small)."""

    model_config = ConfigDict(extra="forbid")

    job_id: str = Field(min_length=1)  # the job's workflow id, e.g. "pytorchjob/default/x"
    namespace: str = Field(min_length=1)
    priority: int = 0
    request: dict[str, Annotated[int, Field(ge=0)]]  # milli-units, from quota_request()
    submitted_at: float = Field(allow_inf_nan=False)  # seconds (workflow.now().timestamp())
    #: ``fleetq.io/preemptible`` (False: never a victim) and
    #: ``fleetq.io/preemption-grace-seconds``, kept while the job holds quota
    preemptible: bool = True
    grace_seconds: int = Field(default=DEFAULT_GRACE_SECONDS, ge=0)


class HolderPolicy(BaseModel):
    """What a preemption decision needs to know of an admitted job."""

    priority: int = 0
    preemptible: bool = True
    grace_seconds: int = DEFAULT_GRACE_SECONDS


class PlannedVictim(BaseModel):
    """One admitted job a :class:`PendingPlan` preempts, and why (``reason`` is a
    :class:`fleetq.preemption.PreemptionReason` value, ``message`` the event text)."""

    job_id: str
    reason: str
    message: str
    priority: int = 0
    grace_seconds: int = DEFAULT_GRACE_SECONDS
    node: str = ""


class PendingPlan(BaseModel):
    """A quota preemption being carried out: ``preemptor`` is admitted once every victim
    has released its quota (a :class:`fleetq.preemption.PreemptionPlan`, persisted).

    ``victims`` are the outstanding ones: a victim is dropped from every plan when it
    releases (:meth:`Admission.release`), so one that queues again and is re-admitted
    later is not waited for, nor counted as leaving, a second time. The plan ends when
    none is left."""

    preemptor: str
    node: str
    priority: int = 0
    request: dict[str, int] = Field(default_factory=dict)
    victims: list[PlannedVictim] = Field(default_factory=list)
    #: when the plan is dropped if a victim still holds quota (``add_plan``'s ``now`` +
    #: the longest victim grace + :data:`PLAN_MARGIN_SECONDS`); None: never (plans
    #: decided before plan timeouts, or without a clock)
    expires_at: float | None = None


class ParkedJob(BaseModel):
    """A quota preemption's victim whose copies the quota workflow purged itself
    (:meth:`Admission.park`, docs/decisions/023): it holds no quota, its request is held
    for it in every pass as a pending preemptor's is, and it is granted nothing until
    its own ``requeue`` (or ``release`` / ``cancel``) arrives, so it keeps its place
    (issue 24) and no grant overtakes its ``requeue``."""

    job_id: str
    namespace: str
    priority: int = 0
    submitted_at: float = 0.0
    request: dict[str, int] = Field(default_factory=dict)
    preemptible: bool = True
    grace_seconds: int = DEFAULT_GRACE_SECONDS


class Grant(BaseModel):
    """A job that now holds quota and may be placed."""

    job_id: str
    queue: str
    node: str


class WaitInfo(BaseModel):
    """Where a waiting job stands: 1-based position in its queue and why it waits
    (``victims``: the preempted jobs it waits for, still holding quota). An
    inadmissible job has position 0 (it is in no queue order), its reason's message as
    ``reason`` and the typed reason as ``inadmissible``."""

    job_id: str
    queue: str
    position: int
    reason: str
    victims: list[str] = Field(default_factory=list)
    inadmissible: Inadmissible | None = None


class QueueInfo(BaseModel):
    name: str
    node: str
    policy: str
    length: int  # waiting jobs that may be admitted
    admitted: int  # jobs holding quota charged to this node itself
    usage: dict[str, int]  # this node and its subtree, milli-units
    min: dict[str, int]
    max: dict[str, int]
    #: waiting jobs that can never be admitted under the current tree (not in ``length``)
    inadmissible: int = 0


class AdmissionState(BaseModel):
    """Everything needed to rebuild an :class:`Admission` (continue-as-new payload).

    Request shapes and namespaces are interned and jobs are tuples;
    :func:`fleetq.quota_state.pack_state` packs it for continue-as-new.

    * ``w``: waiting jobs ``(job_id, ns index, priority, submitted_at, shape index,
      skipped_at or None)`` in enqueue order, inadmissible ones too (which they are
      is derived from the tree when restored);
    * ``h``: holders ``(job_id, ns index, shape index)`` in admission order;
    * ``hp``: holders whose :class:`HolderPolicy` is not the default, ``job_id ->
      (priority, preemptible, grace_seconds)``;
    * ``wp``: likewise ``job_id -> (preemptible, grace_seconds)`` of waiting jobs;
    * ``p``: pending preemption plans, in the order they were decided; ``d``: plans
      whose preemptor left the queue while their victims were stopping;
    * ``x``: victims of plans that timed out (:meth:`Admission.expire_plans`) and still
      hold quota, each with the preemptor it failed.
    """

    tree: dict[str, Any] | None = None
    policy: QueuePolicy = QueuePolicy.PRIORITY
    starve: float = DEFAULT_STARVATION_SECONDS
    shapes: list[dict[str, int]] = Field(default_factory=list)
    ns: list[str] = Field(default_factory=list)
    w: list[tuple[str, int, int, float, int, float | None]] = Field(default_factory=list)
    h: list[tuple[str, int, int]] = Field(default_factory=list)
    hp: dict[str, tuple[int, bool, int]] = Field(default_factory=dict)
    wp: dict[str, tuple[bool, int]] = Field(default_factory=dict)
    p: list[PendingPlan] = Field(default_factory=list)
    d: list[PendingPlan] = Field(default_factory=list)
    dirty: bool = False
    #: victims of timed-out plans still holding quota -> the preemptor they failed
    #: (never chosen as victims again until they release)
    x: dict[str, str] = Field(default_factory=dict)
    #: victims parked by :meth:`Admission.park`, in the order they were parked
    k: list[ParkedJob] = Field(default_factory=list)


class StateDelta(BaseModel):
    """What changed in an :class:`Admission` since the state it was restored from
    (:meth:`Admission.to_delta`): positions (in that state's ``w`` / ``h``) of the jobs
    that left, skip times that restored waiting jobs got, and, as ``part`` (no tree),
    the jobs added since and everything that is not per job (plans, settings). A new
    holder that waited in that state is not in ``part.h`` but named by that position in
    ``h_ref`` (one per new holder, in order; -1: the next of ``part.h``)."""

    w_gone: list[int] = Field(default_factory=list)
    h_gone: list[int] = Field(default_factory=list)
    h_ref: list[int] = Field(default_factory=list)
    skips: list[tuple[int, float]] = Field(default_factory=list)
    part: AdmissionState = Field(default_factory=AdmissionState)

    def apply(self, state: AdmissionState) -> AdmissionState:
        """``state`` (the one the delta is relative to) with the delta applied."""
        part = self.part
        ns_ix = {name: i for i, name in enumerate(state.ns)}
        shape_ix = {tuple(sorted(sh.items())): i for i, sh in enumerate(state.shapes)}
        ns, shapes = list(state.ns), list(state.shapes)
        ns_map = []
        for name in part.ns:
            if name not in ns_ix:
                ns_ix[name] = len(ns)
                ns.append(name)
            ns_map.append(ns_ix[name])
        shape_map = []
        for sh in part.shapes:
            key = tuple(sorted(sh.items()))
            if key not in shape_ix:
                shape_ix[key] = len(shapes)
                shapes.append(sh)
            shape_map.append(shape_ix[key])
        h_new = iter(part.h)
        new_holders = [
            (state.w[ref][0], state.w[ref][1], state.w[ref][4]) if ref >= 0 else next(h_new)
            for ref in self.h_ref
        ]
        w = list(state.w)
        for pos, t in self.skips:
            r = w[pos]
            w[pos] = (r[0], r[1], r[2], r[3], r[4], t)
        w_gone = {w[i][0] for i in self.w_gone}
        h_gone = {state.h[i][0] for i in self.h_gone}
        gone_w, gone_h = set(self.w_gone), set(self.h_gone)
        w = [r for i, r in enumerate(w) if i not in gone_w] if gone_w else w
        w.extend((r[0], ns_map[r[1]], r[2], r[3], shape_map[r[4]], r[5]) for r in part.w)
        h = [r for i, r in enumerate(state.h) if i not in gone_h] if gone_h else list(state.h)
        h.extend(
            r if ref >= 0 else (r[0], ns_map[r[1]], shape_map[r[2]])
            for r, ref in zip(new_holders, self.h_ref, strict=True)
        )
        hp = {k: v for k, v in state.hp.items() if k not in h_gone}
        for ref in self.h_ref:
            if ref >= 0:
                job_id, priority = state.w[ref][0], state.w[ref][2]
                policy = (priority, *state.wp.get(job_id, _DEFAULT_HOLDER[1:]))
                if policy != _DEFAULT_HOLDER:
                    hp[job_id] = policy  # type: ignore[assignment]
        hp.update(part.hp)
        wp = {k: v for k, v in state.wp.items() if k not in w_gone}
        wp.update(part.wp)
        return AdmissionState.model_construct(
            tree=state.tree, policy=part.policy, starve=part.starve, shapes=shapes, ns=ns,
            w=w, h=h, hp=hp, wp=wp, p=part.p, d=part.d, dirty=part.dirty, x=part.x,
            k=part.k,
        )


#: (node, resource, quantity): a request is short of that resource at that node, and
#: cannot fit until that quantity of it is free there
_Short = tuple[str, str, int]
#: a candidate's :data:`_Short` and the candidate's key
_Blocker = tuple[_Short, Key]


#: queues blocked at one node for one resource, by how much of it they need free there:
#: each a min-heap of ``(best rank, generation, queue)`` (the best rank of the queue's
#: candidates short of that need there), lazily pruned
#: (``Admission._gen``); the distinct needs are the few distinct request quantities
_Waits = dict[int, list[tuple[Any, int, str]]]


#: the quota id a pass charges a pending preemptor's request under (see ``schedule``)
_HELD = "\x00held-for:"
#: a holder's (priority, preemptible, grace_seconds) when its job says nothing
_DEFAULT_HOLDER = (0, True, DEFAULT_GRACE_SECONDS)


class _Job:
    __slots__ = (
        "job_id",
        "namespace",
        "priority",
        "submitted_at",
        "shape",
        "key",
        "queue",
        "preemptible",
        "grace_seconds",
    )

    def __init__(
        self,
        job_id: str,
        namespace: str,
        priority: int,
        submitted_at: float,
        shape: int,
        preemptible: bool = True,
        grace_seconds: int = DEFAULT_GRACE_SECONDS,
    ) -> None:
        self.job_id = job_id
        self.namespace = namespace
        self.priority = priority
        self.submitted_at = submitted_at
        self.shape = shape
        self.key: Key = (-priority, submitted_at, job_id)
        self.queue = ""  # node name of the queue it waits in
        self.preemptible = preemptible
        self.grace_seconds = grace_seconds

    @property
    def policy(self) -> HolderPolicy:
        return HolderPolicy(
            priority=self.priority,
            preemptible=self.preemptible,
            grace_seconds=self.grace_seconds,
        )


class Journal:
    """What changed in an :class:`Admission` since it was restored from a carried state
    (:meth:`Admission.start_journal`), so that the continue-as-new pack encodes only
    that (:func:`fleetq.quota_state.pack_next`) instead of every waiting job.

    Waiting jobs and holders keep their order in the state (``w`` / ``h``): the jobs of
    the restored state that are still there, in their order, then those added since, in
    the order they were added (a job that left and came back is both gone and added)."""

    __slots__ = ("carried", "manifest", "w_pos", "h_pos", "w_gone", "h_gone", "w_new",
                 "h_new", "w_back", "skipped")

    def __init__(
        self,
        carried: bytes,
        manifest: dict[str, Any] | None,
        waiting: Sequence[str],
        holders: Sequence[str],
    ) -> None:
        #: the packed state this instance was restored from, and the tree manifest in it
        self.carried = carried
        self.manifest = manifest
        #: restored waiting jobs / holders -> their position in the restored state
        self.w_pos = {job_id: i for i, job_id in enumerate(waiting)}
        self.h_pos = {job_id: i for i, job_id in enumerate(holders)}
        #: restored jobs that left -> their position in the restored state
        self.w_gone: dict[str, int] = {}
        self.h_gone: dict[str, int] = {}
        #: jobs added since (and still there), in the order they were added
        self.w_new: dict[str, None] = {}
        self.h_new: dict[str, None] = {}
        #: restored waiting jobs that left and were queued again (maybe with another
        #: request: not named by their restored position when they hold quota)
        self.w_back: dict[str, None] = {}
        #: keys of waiting jobs that got a skip time since (restored ones among them)
        self.skipped: list[Key] = []

    def waiting_added(self, job_id: str) -> None:
        self.w_new[job_id] = None
        if job_id in self.w_gone:
            self.w_back[job_id] = None

    def restored_holder(self, job_id: str) -> int:
        """The restored position of a holder that waited in the restored state with the
        request it holds quota for, else -1."""
        if job_id in self.w_back:
            return -1
        return self.w_gone.get(job_id, -1)

    def waiting_left(self, job_id: str) -> None:
        if self.w_new.pop(job_id, 0) is not None:  # (not added since: a restored job)
            self.w_gone[job_id] = self.w_pos[job_id]

    def holder_added(self, job_id: str) -> None:
        self.h_new[job_id] = None

    def holder_left(self, job_id: str) -> None:
        if self.h_new.pop(job_id, 0) is not None:
            self.h_gone[job_id] = self.h_pos[job_id]

    def changes(self) -> int:
        """Jobs added, gone or newly skipped since the restore (an upper bound on the
        records a delta carries), against :meth:`restored`."""
        return (len(self.w_new) + len(self.h_new) + len(self.w_gone) + len(self.h_gone)
                + len(self.skipped))

    def restored(self) -> int:
        """Waiting jobs and holders of the restored state."""
        return len(self.w_pos) + len(self.h_pos)

    def restored_waiting(self, job_id: str) -> int | None:
        """The restored position of a waiting job that has been waiting since the
        restore (None for one added since)."""
        if job_id in self.w_new or job_id in self.w_gone:
            return None
        return self.w_pos.get(job_id)


class Admission:
    """Quota tree + one queue per node + the admission rules. See the module docstring."""

    def __init__(
        self,
        tree: ElasticQuotaTree | None,
        policy: QueuePolicy | str = QueuePolicy.PRIORITY,
        starvation_seconds: float = DEFAULT_STARVATION_SECONDS,
    ) -> None:
        if not (isinstance(starvation_seconds, int | float) and math.isfinite(starvation_seconds)):
            raise ValueError(
                f"starvation_seconds must be a finite number, got {starvation_seconds!r}"
            )
        if starvation_seconds < 0:
            raise ValueError(f"starvation_seconds must be >= 0, got {starvation_seconds!r}")
        self._strategy: QueueStrategy = strategy_for(policy)
        self.starvation_seconds = float(starvation_seconds)
        self.quota = QuotaTree(tree)
        self._shapes: list[R.Resources] = []
        self._shape_ids: dict[tuple[tuple[str, int], ...], int] = {}
        self._waiting: dict[str, _Job] = {}
        self._admitted: dict[str, _Job] = {}
        self._queues: dict[str, JobQueue] = {}
        self._dirty = False
        #: pending preemption plans by preemptor, in the order they were decided
        self._plans: dict[str, PendingPlan] = {}
        #: plans whose preemptor left the queue (cancelled, or admitted before its
        #: victims released): their victims, told to stop already, are still leaving
        self._draining: list[PendingPlan] = []
        #: victims of timed-out plans, still holding quota -> the preemptor they failed
        self._stuck: dict[str, str] = {}
        #: victims parked by :meth:`park`: no quota held, their request held in passes
        self._parked: dict[str, _Job] = {}
        #: fair sharing (issue 18): None is off; else per-node weights (default 1), and
        #: a pass ranks borrowers by weighted dominant resource share (see ``_rank``)
        self.fair_weights: Mapping[str, float] | None = None
        #: False: every pass examines every queue (the reference the incremental pass is
        #: tested against); True: only the queues that can have changed (see ``_pass``)
        self.incremental = True
        # What changed since the last pass: queues touched (jobs added or removed,
        # rebuilt) and nodes whose usage went down. ``_waits`` indexes each non-empty
        # queue without a pick under (node, resource) its candidates are short of, with
        # how much of it each needs free there and the best rank it could have
        # (:data:`_Waits`; ``_gen`` holds each blocked queue's current generation,
        # older entries are stale), so a pass looks only at the queues a change can
        # have unblocked, best first, and stops once what was freed is taken.
        self._touched: dict[str, None] = {}
        self._freed: dict[str, None] = {}
        self._recheck: dict[str, None] = {}  # blocked for no known reason (defensive)
        #: the last pass's time: a queue it did not examine is brought up to it (its
        #: starving jobs) before :meth:`wait_info` explains a wait, as if it had been
        self._last_pass: float | None = None
        self._waits: dict[str, dict[str, _Waits]] = {}
        #: while a pass runs: queues to block once it is over (a queue blocked during a
        #: pass must not be taken up again by the same pass)
        self._deferred: list[tuple[str, list[_Blocker]]] | None = None
        self._gen: dict[str, int] = {}
        self._gens = 0
        self._entries = 0  # heap entries, stale ones included
        #: nodes whose row of :meth:`queues` changed since :meth:`changed_queues` (None:
        #: every node)
        self._rows: dict[str, None] | None = None
        #: waiting jobs that can never be admitted under the current tree, and why
        self._inadmissible: dict[str, Inadmissible] = {}
        #: (node, shape) -> why that request never fits there (None: it can), per tree
        self._never: dict[tuple[str, int], Inadmissible | None] = {}
        #: jobs that became inadmissible (their reason) or admissible again (None) since
        #: :meth:`admissibility_changes`, so a caller can tell each job
        self._admissibility: dict[str, Inadmissible | None] = {}
        #: changes since the carried state this instance was restored from (None: none
        #: carried, or the queues were rebuilt since: the next pack is a whole one)
        self.journal: Journal | None = None
        self._rebuild_queues({})

    @property
    def policy(self) -> str:
        """The queue policy's name (a :class:`QueuePolicy` value); setting it switches
        every queue to that policy's strategy (:func:`fleetq.queue_strategies.strategy_for`)."""
        return self._strategy.policy

    @policy.setter
    def policy(self, policy: str) -> None:
        self._strategy = strategy_for(policy)

    # ------------------------------------------------------------------ internals

    def _intern(self, request: dict[str, int]) -> int:
        key = tuple(sorted((k, int(v)) for k, v in request.items() if v))
        sid = self._shape_ids.get(key)
        if sid is None:
            sid = self._shape_ids[key] = len(self._shapes)
            self._shapes.append(dict(key))
        return sid

    def _rebuild_queues(self, skipped: dict[str, float]) -> None:
        self.journal = None  # (skip times and inadmissible jobs may all change)
        self._queues = {n.name: JobQueue(n.queue, n.name, self._shapes) for n in self.quota}
        before = self._inadmissible
        self._inadmissible = {}
        self._never = {}
        for job in self._waiting.values():
            self._place(job, skipped.get(job.job_id))
        changes = self._admissibility
        for job_id, why in self._inadmissible.items():
            if before.get(job_id) != why:
                changes[job_id] = why
        for job_id in before:
            if job_id not in self._inadmissible:
                changes[job_id] = None
        self._touched = dict.fromkeys(self._queues)
        self._freed = {}
        self._waits = {}
        self._gen = {}
        self._entries = 0
        self._rows = None

    def _place(self, job: _Job, skipped_at: float | None) -> JobQueue:
        """Put a waiting job in its namespace's queue, or beside it if it can never be
        admitted under this tree (then it keeps no skip time: it was never passed over
        for a job that could be admitted instead of it)."""
        job.queue = self.quota.leaf_for(job.namespace)
        q = self._queues[job.queue]
        at = (job.queue, job.shape)
        if at in self._never:
            why = self._never[at]
        else:
            why = self._never[at] = self.quota.never_fits(job.queue, self._shapes[job.shape])
        if why is not None:
            q.add_inadmissible(job.key, why)
            self._inadmissible[job.job_id] = why
        else:
            q.add(job.key, job.shape, skipped_at)
            self._touched[job.queue] = None
        self._row(job.queue)
        return q

    def _row(self, node: str) -> None:
        if self._rows is not None:
            self._rows[node] = None

    def _usage_changed(self, node: str, freed: bool) -> None:
        """Usage changed at ``node`` and its ancestors (went down if ``freed``); nothing
        for a node the tree no longer has (a plan's, after ``replace_tree``, which
        re-examines everything anyway)."""
        at = self.quota.nodes.get(node)
        if at is None:
            return
        for n in at.chain:
            if freed:
                self._freed[n.name] = None
            if self._rows is not None:
                self._rows[n.name] = None

    def _block(self, node: str, blockers: list[_Blocker]) -> None:
        """Index the queue of ``node``, which has no pick, under each (node, resource,
        need) one of its candidates is short of (re-examined at the next pass if none
        is known), with the best rank of the candidates short of it: when that need is
        free, what the queue can pick ranks no better (admissions only raise usage, a
        job joining or leaving touches the queue). Not the queue's first job's rank: a
        queue whose high-priority head waits for its own leaf would otherwise rank, for
        the small job waiting for the root, ahead of every queue whose pick it is, and
        a pass would examine each of those before admitting one (``bench.sim_scale``:
        18 queue checks per pass, most of them blocked again)."""
        if self._deferred is not None:
            self._deferred.append((node, blockers))
            return
        if not blockers:
            self._recheck[node] = None
            return
        q = self._queues[node]
        if not q.order:
            return
        self._gens += 1
        gen = self._gen[node] = self._gens
        best: dict[_Short, Key] = {}
        for short, key in blockers:
            known = best.get(short)
            if known is None or key < known:
                best[short] = key
        first = self._rank(q, q.order[0])
        for (at, res, need), key in best.items():
            entry = (first if key == q.order[0] else (*first[:-1], key), gen, node)
            by_need = self._waits.setdefault(at, {}).setdefault(res, {})
            bucket = by_need.get(need)
            if bucket is None:
                by_need[need] = [entry]
            else:
                heapq.heappush(bucket, entry)
        self._entries += len(best)
        if self._entries > 4 * len(self._gen) + 1024:
            self._compact()

    def _unblock(self, node: str) -> None:
        self._gen.pop(node, None)

    def _compact(self) -> None:
        """Drop the stale entries of every heap."""
        gen = self._gen
        self._entries = 0
        for by_res in self._waits.values():
            for by_need in by_res.values():
                for need, bucket in list(by_need.items()):
                    live = [e for e in bucket if gen.get(e[2]) == e[1]]
                    if live:
                        heapq.heapify(live)
                        by_need[need] = live
                        self._entries += len(live)
                    else:
                        del by_need[need]

    def _free(self, node: str, res: str) -> int | None:
        n = self.quota.nodes[node]
        cap = n.max.get(res)
        return None if cap is None else cap - n.usage.get(res, 0)

    def _woken(self, node: str, found: dict[str, None]) -> None:
        """Add to ``found`` every queue blocked at ``node`` whose need there is free now
        (with fair sharing on, where the best rank a blocked queue could have changes
        as its ancestors' shares go down)."""
        gen = self._gen
        for res, by_need in self._waits.get(node, {}).items():
            free = self._free(node, res)
            if free is None:
                continue
            for need in [n for n in by_need if n <= free]:
                for _, g, queue in by_need.pop(need):
                    if gen.get(queue) == g:
                        del gen[queue]
                        found[queue] = None

    def _sources(self, heap: list[Any], node: str) -> None:
        """Put in the pass heap, for every (resource, need) of the queues blocked at
        ``node`` whose need is free now, the best-ranked of them."""
        for res, by_need in self._waits.get(node, {}).items():
            free = self._free(node, res)
            if free is None:
                continue
            for need in [n for n in by_need if n <= free]:
                self._source(heap, node, res, need)

    def _source(self, heap: list[Any], node: str, res: str, need: int) -> None:
        by_need = self._waits[node][res]
        bucket = by_need.get(need)
        gen = self._gen
        while bucket and gen.get(bucket[0][2]) != bucket[0][1]:
            heapq.heappop(bucket)
            self._entries -= 1
        if not bucket:
            by_need.pop(need, None)
            return
        heapq.heappush(heap, (bucket[0][0], 1, node, res, need))

    def _skip_times(self) -> dict[str, float]:
        return {k[2]: t for q in self._queues.values() for k, t in q.skipped_at.items()}

    def _short(self, node: str, request: Mapping[str, int]) -> _Short | None:
        short = self.quota.short_of(node, request)
        if short is None:
            return None
        return short[0].name, short[1], request[short[1]]

    def _pick(
        self,
        q: JobQueue,
        nofit: dict[tuple[str, int], _Short],
        blockers: list[_Blocker] | None = None,
    ) -> tuple[Key, int] | None:
        """The job this queue would admit next, given current usage, or None; then
        ``blockers`` gets, for its candidates, a (node, resource, need) each is short of
        with the candidate's key (``nofit`` remembers them for one pass per (queue,
        shape): usage only rises in a pass)."""
        if not q.order:
            return None
        short = self._short(q.node, q.lower_bound())
        if short is not None:  # nothing of this queue fits until that is free
            if blockers is not None:
                # every candidate is short there of that resource, each by its own
                # request: indexed by it, a small job ranks as itself, not as the head
                at, res, _ = short
                shapes = self._shapes
                blockers.extend(
                    ((at, res, shapes[shape][res]), key)
                    for key, shape in self._strategy.candidates(q)
                )
            return None
        for key, shape in self._strategy.candidates(q):
            short = nofit.get((q.node, shape))
            if short is None:
                short = self._short(q.node, self._shapes[shape])
                if short is None:
                    return key, shape
                nofit[(q.node, shape)] = short
            if blockers is not None:
                blockers.append((short, key))
        return None

    def _rank(self, q: JobQueue, key: Key) -> tuple[Any, ...]:
        """Admission order across queues: nodes below their ``min`` first; with fair
        sharing on, then the lowest weighted dominant resource share of borrowed quota,
        compared level by level from the top of the tree (the node's ancestors below the
        root, then the node itself: Kueue's hierarchical tournament); then the job's key.
        Admissions in a pass only raise these, as the lazy heap in ``_pass`` needs."""
        node = self.quota.nodes[q.node]
        below = 0 if node.below_min() else 1
        weights = self.fair_weights
        if weights is None:
            return (below, key)
        shares = tuple(
            n.borrowed_share() / weights.get(n.name, 1.0) for n in reversed(node.chain[:-1])
        )
        return (below, shares, key)

    def _admit(self, q: JobQueue, key: Key, shape: int, now: float) -> Grant:
        job = self._waiting.pop(key[2])
        self._drain(job.job_id)
        self._strategy.admitted(q, key, now)
        q.remove(key, shape)
        self._touched[q.node] = None  # (e.g. its starving job left: others may go)
        node = self.quota.admit(job.job_id, job.namespace, self._shapes[shape])
        self._usage_changed(node, False)
        self._admitted[job.job_id] = job
        if self.journal is not None:
            self.journal.waiting_left(job.job_id)
            self.journal.holder_added(job.job_id)
        return Grant(job_id=job.job_id, queue=q.name, node=node)

    def _admit_preemptors(self, now: float) -> list[Grant]:
        """Admit every preemptor whose victims have all released (in plan order), and
        forget its plan. "Released" is what the plan recorded (its outstanding victims),
        not whether the victim holds quota now: a victim may have queued again and been
        re-admitted since.

        A plan whose victims released but whose preemptor does not fit yet was decided
        counting on the victims of plans before it (or draining) as leaving too: it
        stays (its request held) while any of those is still outstanding, else it can
        no longer be carried out (e.g. under a new tree) and is forgotten: the caller
        plans again."""
        grants: list[Grant] = []
        earlier = bool(self._draining)  # (draining plans keep only outstanding victims)
        for plan in list(self._plans.values()):
            if plan.victims:
                earlier = True
                continue
            job = self._waiting[plan.preemptor]
            if self.quota.fits(job.queue, self._shapes[job.shape]):
                del self._plans[plan.preemptor]
                grants.append(self._admit(self._queues[job.queue], job.key, job.shape, now))
            elif not earlier:
                del self._plans[plan.preemptor]
                self._usage_changed(plan.node, True)  # nothing held for it any more
        return grants

    def _drain(self, preemptor: str) -> None:
        """``preemptor`` leaves the queue: nothing is held for it any more, but its
        victims, told to stop already, still count as leaving until they have."""
        plan = self._plans.pop(preemptor, None)
        if plan is not None:
            if plan.victims:  # (all released already: nothing is leaving)
                self._draining.append(plan)
            self._usage_changed(plan.node, True)  # nothing held for it any more

    def _hold_for_preemptors(self) -> list[str]:
        """Charge every pending preemptor's request, and every parked victim's, so a pass
        admits nobody into the quota promised to them; the quota ids charged (released
        after the pass)."""
        held: list[str] = []
        for plan in self._plans.values():
            job = self._waiting[plan.preemptor]
            self.quota.admit(_HELD + plan.preemptor, job.namespace, self._shapes[job.shape])
            held.append(_HELD + plan.preemptor)
        for job in self._parked.values():
            self.quota.admit(_HELD + job.job_id, job.namespace, self._shapes[job.shape])
            held.append(_HELD + job.job_id)
        return held

    def _grant_of(self, job_id: str) -> Grant:
        node = self.quota.holdings[job_id].node
        return Grant(job_id=job_id, queue=self.quota.nodes[node].queue, node=node)

    # ------------------------------------------------------------------ API

    def replace_tree(self, tree: ElasticQuotaTree) -> None:
        """New limits for new admissions; held quota stays (re-charged where each
        holder's namespace maps now); waiting jobs move to their namespace's queue."""
        skipped = self._skip_times()
        self.quota.replace(tree)
        self._rebuild_queues(skipped)
        for preemptor, plan in list(self._plans.items()):
            if (
                self._waiting[preemptor].queue != plan.node  # its namespace maps elsewhere
                or preemptor in self._inadmissible
            ):
                self._drain(preemptor)
        self._dirty = True

    def enqueue(
        self, req: AdmissionRequest, now: float, *, at_once: bool = True
    ) -> WaitInfo | Grant:
        """Queue a job. Idempotent on ``job_id``: a waiting job gets its WaitInfo, an
        admitted one its Grant (the request is not updated). Returns a Grant when the job
        is admitted at once (see the module docstring), which ``at_once`` off rules out (a
        caller with more jobs arriving at the same moment: a pass orders them all)."""
        if req.job_id in self._admitted:
            return self._grant_of(req.job_id)
        self._unpark(req.job_id)
        if req.job_id in self._waiting:
            if req.job_id in self._inadmissible:  # (tell it again: it asked again)
                self._admissibility[req.job_id] = self._inadmissible[req.job_id]
            info = self.wait_info(req.job_id)
            assert info is not None
            return info
        job = _Job(
            req.job_id,
            req.namespace,
            req.priority,
            req.submitted_at,
            self._intern(req.request),
            req.preemptible,
            req.grace_seconds,
        )
        self._waiting[job.job_id] = job
        if self.journal is not None:
            self.journal.waiting_added(job.job_id)
        q = self._place(job, None)
        why = self._inadmissible.get(job.job_id)
        if why is not None:  # nothing changes for the queue
            self._admissibility[job.job_id] = why
            return self._inadmissible_info(q, job, why)
        q.promote(now, self.starvation_seconds)
        # (quota held for preemptors or parked victims: a pass)
        if at_once and not self._dirty and not self._plans and not self._parked:
            pick = self._pick(q, {})
            if pick is not None and pick[0] == job.key:
                return self._admit(q, job.key, job.shape, now)
        info = self.wait_info(job.job_id)
        assert info is not None
        return info

    def cancel(self, job_id: str) -> bool:
        """Remove a waiting (or parked) job; ``False`` if it is neither."""
        if self._unpark(job_id):
            return True
        job = self._waiting.pop(job_id, None)
        if job is None:
            return False
        if self.journal is not None:
            self.journal.waiting_left(job_id)
        self._queues[job.queue].remove(job.key, job.shape)
        self._admissibility.pop(job_id, None)
        if self._inadmissible.pop(job_id, None) is not None:
            self._row(job.queue)  # no queue order changed: no pass needed
            return True
        self._touched[job.queue] = None
        self._row(job.queue)
        self._drain(job_id)
        self._dirty = True
        return True

    def release(self, job_id: str) -> bool:
        """Give an admitted job's quota back; idempotent (``False`` if it held none).
        A victim that releases is no longer outstanding in any plan (see
        :class:`PendingPlan`); a draining plan with no victim left ends. A parked job
        (:meth:`park`) is unparked: nothing is held for it any more (``True``)."""
        if self._unpark(job_id):
            return True
        if self._admitted.pop(job_id, None) is None:
            return False
        if self.journal is not None:
            self.journal.holder_left(job_id)
        node = self.quota.holdings[job_id].node
        self.quota.release(job_id)
        self._usage_changed(node, True)
        self._victim_released(job_id)
        self._stuck.pop(job_id, None)
        self._dirty = True
        return True

    def requeue(self, req: AdmissionRequest, now: float) -> WaitInfo | Grant:
        """A preempted job gives its quota back and queues again with ``req`` (its
        original ``submitted_at``) in one step: it is back in its queue before the pass
        that hands out the quota it freed, so no later job of its priority takes that
        room first (issue 24). As :meth:`release` then :meth:`enqueue`; never admits at
        once (a pass decides, the job in its queue); a waiting job only gets its
        WaitInfo. (A duplicate that arrives after the job was admitted again requeues it
        again, as a duplicate ``release`` would free its new grant.)"""
        self.release(req.job_id)
        self._dirty = True
        return self.enqueue(req, now)

    def park(self, job_id: str) -> bool:
        """A quota preemption's victim whose copies the quota workflow purged itself
        (docs/decisions/023): its quota goes back now, so a preemptor waiting for it is
        admitted in the next pass, but its request is held for it in every pass and it
        is granted nothing until its own ``requeue`` (which puts it back in its queue
        with its original submit time, :meth:`requeue`), ``release`` or ``cancel``
        arrives. ``False`` if it holds no quota (it gave it back already)."""
        job = self._admitted.get(job_id)
        if job is None:
            return False
        self.release(job_id)  # (redraws its node's row: usage went down there)
        self._parked[job_id] = job
        return True

    def _unpark(self, job_id: str) -> bool:
        job = self._parked.pop(job_id, None)
        if job is None:
            return False
        self._usage_changed(self.quota.leaf_for(job.namespace), True)  # its hold is gone
        self._dirty = True
        return True

    def parked(self) -> list[str]:
        """Parked victims (:meth:`park`), in the order they were parked."""
        return list(self._parked)

    def _victim_released(self, job_id: str) -> None:
        for plan in (*self._plans.values(), *self._draining):
            if any(v.job_id == job_id for v in plan.victims):
                plan.victims = [v for v in plan.victims if v.job_id != job_id]
        self._draining = [p for p in self._draining if p.victims]

    def schedule(self, now: float) -> list[Grant]:
        """Admit every waiting job that fits now, in admission order; deterministic.
        Preemptors whose victims have all released come first; the quota of those still
        waiting for victims is held for them."""
        self._dirty = False
        self._last_pass = now
        grants = self._admit_preemptors(now)
        if not self._waiting:
            self._touched.clear()
            self._freed.clear()
            return grants
        held = self._hold_for_preemptors()
        try:
            grants += self._pass(now)
        finally:
            for quota_id in held:
                self.quota.release(quota_id)
        return grants

    def _candidates(self) -> tuple[list[str], list[str]]:
        """The queues a pass must examine first, and the nodes whose blocked queues it
        takes up best first (``_pass``). After a pass no waiting job fits (with the
        preemptors' quota held), and a queue without a pick can only get one when a job
        joins or leaves it, or when usage goes down at a node its candidates are short
        at: the queues touched since (and those of the nodes that freed quota, whose
        ``min`` may now be unmet), then, in rank order, those blocked at a node that
        freed what they need. Not the whole tree (issue 19)."""
        if not self.incremental:
            out = list(self._queues)
            freed: list[str] = []
        else:
            found = self._touched
            found.update(self._recheck)
            found.update(self._freed)
            freed = list(self._freed)
            if self.fair_weights is not None:
                for node in freed:
                    self._woken(node, found)
                freed = []
            out = list(found)
        self._touched = {}
        self._freed = {}
        self._recheck = {}
        return out, freed

    def _pass(self, now: float) -> list[Grant]:
        nofit: dict[tuple[str, int], _Short] = {}
        # entries: (rank, 0, queue node, "", 0) a queue with a pick; (best rank, 1, node,
        # resource, need) the best-ranked queue blocked there needing that much free
        heap: list[tuple[Any, int, str, str, int]] = []
        examine, freed = self._candidates()
        deferred: list[tuple[str, list[_Blocker]]] = []
        self._deferred = deferred
        grants: list[Grant] = []
        try:
            for node in examine:
                self._examine(node, now, nofit, heap)
            for node in freed:
                self._sources(heap, node)
            # Admissions only raise usage, so a queue's pick and rank only get worse
            # during a pass, and a blocked queue's rank is at least its best: a popped
            # entry whose recomputed rank is unchanged is the true minimum.
            while heap:
                rank, kind, node, res, need = heapq.heappop(heap)
                if kind == 1:
                    self._take_freed(rank, node, res, need, now, nofit, heap)
                else:
                    self._take_queue(rank, node, now, nofit, heap, grants)
        finally:
            self._deferred = None
            for node, blockers in deferred:
                self._block(node, blockers)
            self._touched = {}  # (the queues admitted from were examined after)
        return grants

    def _take_freed(
        self, rank: Any, node: str, res: str, need: int, now: float,
        nofit: dict[tuple[str, int], _Short], heap: list[Any],
    ) -> None:
        """A blocked-queue entry of :meth:`_pass`: if ``node`` still has ``need`` of
        ``res`` free, examine the best-ranked queue waiting for it again."""
        free = self._free(node, res)
        if free is None or need > free:
            return  # what was freed there is taken
        bucket = self._waits[node][res].get(need)
        if bucket and bucket[0][0] == rank:
            _, g, queue = heapq.heappop(bucket)
            self._entries -= 1
            if self._gen.get(queue) == g:
                self._examine(queue, now, nofit, heap)
        self._source(heap, node, res, need)

    def _take_queue(
        self, rank: Any, node: str, now: float, nofit: dict[tuple[str, int], _Short],
        heap: list[Any], grants: list[Grant],
    ) -> None:
        """A queue entry of :meth:`_pass`: admit the queue's pick if its rank is still
        ``rank`` (else push it again with its current rank), then queue its next pick."""
        q = self._queues[node]
        blockers: list[_Blocker] = []
        pick = self._pick(q, nofit, blockers)
        if pick is None:
            self._block(node, blockers)
            return
        current = self._rank(q, pick[0])
        if current != rank:
            heapq.heappush(heap, (current, 0, node, "", 0))
            return
        grants.append(self._admit(q, pick[0], pick[1], now))
        blockers = []
        pick = self._pick(q, nofit, blockers)
        if pick is not None:
            heapq.heappush(heap, (self._rank(q, pick[0]), 0, node, "", 0))
        else:
            self._block(node, blockers)

    def _examine(
        self, node: str, now: float, nofit: dict[tuple[str, int], _Short], heap: list[Any]
    ) -> None:
        """Take the queue of ``node`` up in this pass: into the heap with its pick, or
        blocked again."""
        q = self._queues.get(node)
        if q is None:
            return
        self._unblock(node)
        if not q.order:
            return
        q.promote(now, self.starvation_seconds)
        blockers: list[_Blocker] = []
        pick = self._pick(q, nofit, blockers)
        if pick is not None:
            heapq.heappush(heap, (self._rank(q, pick[0]), 0, node, "", 0))
        else:
            self._block(node, blockers)

    def is_admitted(self, job_id: str) -> bool:
        return job_id in self._admitted

    # ------------------------------------------------------------------ preemption

    def holder_policy(self, job_id: str) -> HolderPolicy | None:
        """An admitted job's priority and preemption policy; None if it holds nothing."""
        job = self._admitted.get(job_id)
        return self._policy_of(job) if job is not None else None

    def holder_policies(self) -> dict[str, HolderPolicy]:
        """Every admitted job's :class:`HolderPolicy`, in admission order."""
        return {job_id: self._policy_of(job) for job_id, job in self._admitted.items()}

    def _policy_of(self, job: _Job) -> HolderPolicy:
        """A holder's policy; a victim of a timed-out plan is not preemptible again
        until it releases (it did not stop when told)."""
        policy = job.policy
        if job.job_id in self._stuck:
            policy.preemptible = False
        return policy

    def request_of(self, job_id: str) -> AdmissionRequest | None:
        """A waiting job's request as it was enqueued; None if it is not waiting."""
        job = self._waiting.get(job_id)
        if job is None:
            return None
        return AdmissionRequest(
            job_id=job.job_id,
            namespace=job.namespace,
            priority=job.priority,
            request=dict(self._shapes[job.shape]),
            submitted_at=job.submitted_at,
            preemptible=job.preemptible,
            grace_seconds=job.grace_seconds,
        )

    def preemption_candidates(self) -> list[AdmissionRequest]:
        """The waiting jobs a preemption may be planned for, one per queue (tree
        pre-order): the one its policy names (:meth:`~fleetq.queue_strategies.QueueStrategy.
        preemptor`: the first in queue order without a plan yet; under ``Block``, the head
        only), if it does not fit now."""
        out: list[AdmissionRequest] = []
        for q in self._queues.values():
            key = self._strategy.preemptor(q, self._plans)
            if key is None:
                continue
            job = self._waiting[key[2]]
            if not self.quota.fits(q.node, self._shapes[job.shape]):
                request = self.request_of(key[2])
                assert request is not None
                out.append(request)
        return out

    def add_plan(self, plan: PendingPlan, now: float | None = None) -> None:
        """Carry out ``plan``: its preemptor (waiting, in the plan's node) is admitted once
        every victim has released. A preemptor has one plan at a time. With ``now``, the
        plan expires (:meth:`expire_plans`) at ``now`` + its longest victim grace period
        + :data:`PLAN_MARGIN_SECONDS` unless it says otherwise already."""
        job = self._waiting.get(plan.preemptor)
        if job is None:
            raise ValueError(f"preemptor {plan.preemptor!r} is not waiting")
        if job.queue != plan.node:
            raise ValueError(
                f"preemptor {plan.preemptor!r} waits in {job.queue!r}, not {plan.node!r}"
            )
        if plan.preemptor in self._inadmissible:
            raise ValueError(f"preemptor {plan.preemptor!r} is inadmissible")
        if plan.preemptor in self._plans:
            raise ValueError(f"preemptor {plan.preemptor!r} has a plan already")
        for v in plan.victims:
            if v.job_id not in self._admitted:
                raise ValueError(f"victim {v.job_id!r} holds no quota")
        if now is not None and plan.expires_at is None:
            grace = max((v.grace_seconds for v in plan.victims), default=0)
            plan.expires_at = now + grace + PLAN_MARGIN_SECONDS
        self._plans[plan.preemptor] = plan

    def expire_plans(self, now: float) -> list[PendingPlan]:
        """Drop every plan (pending or draining) whose ``expires_at`` has passed: its
        preemptor waits like any other job again (nothing is held for it), and the
        victims that still hold quota did not stop when told (e.g. stuck purging on an
        unreachable member): none is chosen as a victim again until it releases, and
        :meth:`wait_info` of the preemptor says so. Returns the dropped plans, pending
        ones first (copies, with their outstanding victims)."""
        dropped: list[PendingPlan] = []
        for plan in list(self._plans.values()):
            if plan.expires_at is not None and plan.expires_at <= now:
                del self._plans[plan.preemptor]
                self._usage_changed(plan.node, True)  # nothing held for it any more
                self._touched[plan.node] = None
                dropped.append(plan)
        kept: list[PendingPlan] = []
        for plan in self._draining:
            if plan.expires_at is not None and plan.expires_at <= now:
                dropped.append(plan)
            else:
                kept.append(plan)
        self._draining = kept
        for plan in dropped:
            for v in plan.victims:
                self._stuck[v.job_id] = plan.preemptor
        if dropped:
            self._dirty = True
        return [plan.model_copy(deep=True) for plan in dropped]

    def next_plan_deadline(self) -> float | None:
        """The earliest ``expires_at`` of the pending and draining plans (None without
        one): when :meth:`expire_plans` has something to do next."""
        return min(
            (
                p.expires_at
                for p in (*self._plans.values(), *self._draining)
                if p.expires_at is not None
            ),
            default=None,
        )

    def timed_out_victims(self, preemptor: str) -> list[str]:
        """Victims of ``preemptor``'s timed-out plan that still hold quota."""
        return [v for v, p in self._stuck.items() if p == preemptor]

    def plans(self) -> list[PendingPlan]:
        """Pending preemption plans, in the order they were decided (copies)."""
        return [plan.model_copy(deep=True) for plan in self._plans.values()]

    def draining(self) -> list[PendingPlan]:
        """Plans whose preemptor left the queue while their victims still hold quota
        (copies): those victims are leaving, and no later plan may count on them."""
        return [plan.model_copy(deep=True) for plan in self._draining]

    def waiting_for(self, preemptor: str) -> list[str]:
        """The victims of waiting ``preemptor``'s plan that have not released yet (empty
        without one)."""
        plan = self._plans.get(preemptor)
        if plan is None:
            return []
        return [v.job_id for v in plan.victims]

    def preemptors(self) -> dict[str, list[str]]:
        """Waiting preemptors and the victims each still waits for, in plan order."""
        return {p: self.waiting_for(p) for p in self._plans}

    def holders(self) -> list[str]:
        """Admitted jobs, in admission order."""
        return list(self._admitted)

    def counts(self) -> tuple[int, int]:
        """``(admitted, waiting)`` job counts, in constant time (the quota workflow shows
        them after every workflow task; ``holders()``/``waiting()`` build lists);
        inadmissible jobs are not counted as waiting (:meth:`inadmissible`)."""
        return len(self._admitted), len(self._waiting) - len(self._inadmissible)

    def waiting(self) -> list[str]:
        """Waiting jobs, queue by queue (tree pre-order), each queue in its order
        (not the inadmissible ones)."""
        return [k[2] for q in self._queues.values() for k in q.order]

    def inadmissible(self) -> dict[str, Inadmissible]:
        """Waiting jobs that can never be admitted under the current tree, and why,
        queue by queue (tree pre-order), each in queue order."""
        return {
            k[2]: why
            for q in self._queues.values()
            for k, why in sorted(q.inadmissible.items())
        }

    def never_fits(self, namespace: str, request: Mapping[str, int]) -> Inadmissible | None:
        """Why a job of ``namespace`` asking ``request`` would be inadmissible under the
        current tree (None: it would queue), without enqueuing it: what ``fleetq apply``
        and ``validate`` warn with."""
        return self.quota.never_fits(self.quota.leaf_for(namespace), request)

    def admissibility_changes(self) -> dict[str, Inadmissible | None]:
        """The waiting jobs that became inadmissible (with why) or were queued again
        (None) since the last call, or asked again while inadmissible; then forgets
        them. What the quota workflow tells each job."""
        changes = self._admissibility
        self._admissibility = {}
        return changes

    def queue_for(self, namespace: str) -> str:
        """Name of the queue a job of ``namespace`` waits in."""
        return self.quota.nodes[self.quota.leaf_for(namespace)].queue

    def wait_info(self, job_id: str) -> WaitInfo | None:
        """Position and reason of a waiting job; ``None`` if it is not waiting."""
        job = self._waiting.get(job_id)
        if job is None:
            return None
        q = self._queues[job.queue]
        why = self._inadmissible.get(job_id)
        if why is not None:
            return self._inadmissible_info(q, job, why)
        if self._last_pass is not None:
            q.promote(self._last_pass, self.starvation_seconds)
        victims = self.waiting_for(job_id)
        return WaitInfo(
            job_id=job_id,
            queue=q.name,
            position=q.position(job.key),
            reason=self._reason(q, job),
            victims=victims,
        )

    @staticmethod
    def _inadmissible_info(q: JobQueue, job: _Job, why: Inadmissible) -> WaitInfo:
        return WaitInfo(
            job_id=job.job_id, queue=q.name, position=0, reason=why.message, inadmissible=why
        )

    def _reason(self, q: JobQueue, job: _Job) -> str:
        victims = self.waiting_for(job.job_id)
        if victims:
            names = ", ".join(display_job(v) for v in victims)
            n = len(victims)
            return (
                f"waiting for {n} preempted job{'s' if n != 1 else ''} to release "
                f"quota: {names}"
            )
        if job.job_id in self._plans:
            if not self.quota.fits(q.node, self._shapes[job.shape]):
                return "its preempted jobs released; waiting for other preempted jobs to stop"
            return "preempted jobs released their quota; admitted at the next scheduling pass"
        stuck = self.timed_out_victims(job.job_id)
        shape = self._shapes[job.shape]
        reason = self._strategy.reason(q, job.key, lambda: self.quota.can_admit(q.node, shape))
        if stuck:
            names = ", ".join(display_job(v) for v in stuck)
            return f"{reason}; preemption timed out: {names} did not release quota in time"
        return reason

    def queues(self) -> list[QueueInfo]:
        """Every queue, tree pre-order."""
        return [self.queue_info(n.name) for n in self.quota]

    def changed_queues(self) -> list[str] | None:
        """The nodes whose :meth:`queues` row (length, admitted, usage) may have changed
        since the last call, or None when every row may have (a new tree, a rebuilt
        state); then forgets them. What lets a caller redraw only those rows."""
        rows = self._rows
        self._rows = {}
        return list(rows) if rows is not None else None

    def queue_info(self, node_name: str) -> QueueInfo:
        """One row of :meth:`queues`."""
        n = self.quota.nodes[node_name]
        return QueueInfo(
            name=n.queue,
            node=n.name,
            policy=str(self.policy),
            length=len(self._queues[n.name]),
            admitted=n.admitted,
            usage=dict(n.usage),
            min=dict(n.min),
            max=dict(n.max),
            inadmissible=len(self._queues[n.name].inadmissible),
        )

    def usage(self, node_name: str) -> dict[str, int]:
        """Usage of a node and its subtree (milli-units); KeyError names an unknown node."""
        return self.quota.usage(node_name)

    # ------------------------------------------------------------------ persistence

    def to_state(self) -> AdmissionState:
        s: _Numbered[int] = _Numbered()  # shape ids, as packed
        n: _Numbered[str] = _Numbered()  # namespaces, as packed

        skipped = self._skip_times()
        w = [
            (
                j.job_id,
                n(j.namespace),
                j.priority,
                j.submitted_at,
                s(j.shape),
                skipped.get(j.job_id),
            )
            for j in self._waiting.values()
        ]
        h = [(j.job_id, n(j.namespace), s(j.shape)) for j in self._admitted.values()]
        hp = {
            j.job_id: (j.priority, j.preemptible, j.grace_seconds)
            for j in self._admitted.values()
            if (j.priority, j.preemptible, j.grace_seconds) != _DEFAULT_HOLDER
        }
        wp = {
            j.job_id: (j.preemptible, j.grace_seconds)
            for j in self._waiting.values()
            if (j.preemptible, j.grace_seconds) != _DEFAULT_HOLDER[1:]
        }
        tree = self.quota.tree
        # (built from this instance's own, already valid, fields: validating every job's
        # tuple again was a third of this method at 21,209 waiting jobs)
        return AdmissionState.model_construct(
            tree=tree.model_dump(mode="json", exclude_none=True) if tree is not None else None,
            policy=QueuePolicy(self.policy),
            starve=self.starvation_seconds,
            shapes=[self._shapes[i] for i in s],
            ns=list(n),
            w=w,
            h=h,
            hp=hp,
            wp=wp,
            p=[plan.model_copy(deep=True) for plan in self._plans.values()],
            d=[plan.model_copy(deep=True) for plan in self._draining],
            dirty=self._dirty,
            x={v: p for v, p in self._stuck.items() if v in self._admitted},
            k=self._parked_state(),
        )

    def start_journal(self, carried: bytes, manifest: dict[str, Any] | None = None) -> None:
        """Record from now on what changes, relative to the state this instance was just
        restored from (``carried``, as packed, with the tree's ``manifest``), for
        :meth:`to_delta`."""
        self.journal = Journal(carried, manifest, list(self._waiting), list(self._admitted))
        for q in self._queues.values():
            q.skip_log = self.journal.skipped

    def to_delta(self) -> StateDelta | None:
        """What changed since :meth:`start_journal` (None: no journal, a whole state is
        needed): the restored state with it applied (:meth:`StateDelta.apply`) is
        :meth:`to_state`, up to how shapes and namespaces are numbered. Costs what
        changed, not the state."""
        j = self.journal
        if j is None:
            return None
        s: _Numbered[int] = _Numbered()  # shape ids, as packed
        n: _Numbered[str] = _Numbered()  # namespaces, as packed

        waiting = [self._waiting[job_id] for job_id in j.w_new]
        holders = [self._admitted[job_id] for job_id in j.h_new]
        w = [
            (jb.job_id, n(jb.namespace), jb.priority, jb.submitted_at, s(jb.shape),
             self._queues[jb.queue].skipped_at.get(jb.key))
            for jb in waiting
        ]
        # a holder that waited in the restored state is named by its position there
        h_ref = [j.restored_holder(jb.job_id) for jb in holders]
        h = [
            (jb.job_id, n(jb.namespace), s(jb.shape))
            for jb, ref in zip(holders, h_ref, strict=True)
            if ref < 0
        ]
        skips: dict[int, float] = {}
        for key in j.skipped:
            pos = j.restored_waiting(key[2])
            if pos is not None:
                job = self._waiting[key[2]]
                skips[pos] = self._queues[job.queue].skipped_at[job.key]
        part = AdmissionState.model_construct(
            tree=None,
            policy=QueuePolicy(self.policy),
            starve=self.starvation_seconds,
            shapes=[self._shapes[i] for i in s],
            ns=list(n),
            w=w,
            h=h,
            hp={  # (a holder named by its restored position: as it waited there)
                jb.job_id: (jb.priority, jb.preemptible, jb.grace_seconds)
                for jb, ref in zip(holders, h_ref, strict=True)
                if ref < 0 and (jb.priority, jb.preemptible, jb.grace_seconds) != _DEFAULT_HOLDER
            },
            wp={
                jb.job_id: (jb.preemptible, jb.grace_seconds)
                for jb in waiting
                if (jb.preemptible, jb.grace_seconds) != _DEFAULT_HOLDER[1:]
            },
            p=[plan.model_copy(deep=True) for plan in self._plans.values()],
            d=[plan.model_copy(deep=True) for plan in self._draining],
            dirty=self._dirty,
            x={v: p for v, p in self._stuck.items() if v in self._admitted},
            k=self._parked_state(),
        )
        return StateDelta(
            w_gone=sorted(j.w_gone.values()),
            h_gone=sorted(j.h_gone.values()),
            h_ref=h_ref,
            skips=sorted(skips.items()),
            part=part,
        )

    def _parked_state(self) -> list[ParkedJob]:
        return [
            ParkedJob(
                job_id=j.job_id, namespace=j.namespace, priority=j.priority,
                submitted_at=j.submitted_at, request=dict(self._shapes[j.shape]),
                preemptible=j.preemptible, grace_seconds=j.grace_seconds,
            )
            for j in self._parked.values()
        ]

    def _outstanding(self, plan: PendingPlan) -> PendingPlan:
        """A copy of a restored ``plan`` without the victims that hold no quota: a state
        packed before victims were dropped as they released still lists them."""
        copy = plan.model_copy(deep=True)
        copy.victims = [v for v in copy.victims if v.job_id in self._admitted]
        return copy

    @classmethod
    def from_state(cls, s: AdmissionState) -> Admission:
        tree = parse_tree(s.tree) if s.tree is not None else None
        a = cls(tree, s.policy, s.starve)
        sids = [a._intern(shape) for shape in s.shapes]
        for job_id, ns, shape in s.h:
            prio, preemptible, grace = s.hp.get(job_id, _DEFAULT_HOLDER)
            job = _Job(job_id, s.ns[ns], prio, 0.0, sids[shape], preemptible, grace)
            a.quota.admit(job_id, job.namespace, a._shapes[job.shape])
            a._admitted[job_id] = job
        skipped: dict[str, float] = {}
        for job_id, ns, prio, submitted, shape, skip in s.w:
            preemptible, grace = s.wp.get(job_id, _DEFAULT_HOLDER[1:])
            a._waiting[job_id] = _Job(
                job_id, s.ns[ns], prio, submitted, sids[shape], preemptible, grace
            )
            if skip is not None:
                skipped[job_id] = skip
        a._rebuild_queues(skipped)
        a._admissibility = {}  # (the run that packed the state told those jobs)
        for plan in s.p:
            a._plans[plan.preemptor] = a._outstanding(plan)
        a._draining = [p for p in map(a._outstanding, s.d) if p.victims]
        a._stuck = {v: p for v, p in s.x.items() if v in a._admitted}
        for k in s.k:
            a._parked[k.job_id] = _Job(
                k.job_id, k.namespace, k.priority, k.submitted_at, a._intern(k.request),
                k.preemptible, k.grace_seconds,
            )
        a._dirty = s.dirty
        return a


#: what separates two columns of a Markdown table in the Temporal Web UI. Its renderer
#: (ui-server's ``/render``: gomarkdown, tables on) draws GFM tables, but the page's
#: stylesheet zeroes every element's padding and border, and its Content-Security-Policy
#: (``style-src 'nonce-...'``) ignores ``style`` attributes and it renders no HTML
#: entity (``&emsp;`` comes out as text): cells touch (``master1cpu 10m``). An EM SPACE
#: (U+2003) closing each cell but the last is text the cell keeps (gomarkdown trims ASCII
#: blanks only, and CSS collapses no U+2003): 1 em between columns. Checked in headless
#: Chromium on the dev server's UI 2.54.1 (tests/webui).
UI_CELL_GAP = "\u2003"
#: a slash between digits, which the UI's renderer (gomarkdown's Smartypants fractions,
#: on in ui-server) draws as a fraction: ``1/10`` becomes ``1⁄10``, ``1/2`` becomes ``½``
_FRACTION = re.compile(r"(?<=\d)/(?=\d)")


def ui_text(text: str) -> str:
    """Free text (a reason, an event message, a usage) as the Web UI should show it:
    ``kube-queue/max-jobs 1 / 1 in use``, never a fraction."""
    return _FRACTION.sub(" / ", text)


def markdown_row(cells: Sequence[object]) -> str:
    """One row of a Markdown table for the Temporal Web UI: every cell but the last ends
    with :data:`UI_CELL_GAP`; ``|`` in a cell is escaped, digits around ``/`` spaced
    (:func:`ui_text`)."""
    text = [ui_text(str(c)).replace("|", "\\|") for c in cells]
    return "| " + " | ".join([*(t + UI_CELL_GAP for t in text[:-1]), *text[-1:]]) + " |"


def markdown_header(cells: Sequence[str], align: str) -> tuple[str, str]:
    """A table's header row and its delimiter row; ``align`` has one letter a column:
    ``l`` (text) or ``r`` (numbers)."""
    delimiter = "|" + "|".join(":--" if a == "l" else "--:" for a in align) + "|"
    return markdown_row(cells), delimiter
