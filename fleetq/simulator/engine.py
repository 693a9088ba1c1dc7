"""The simulation itself: a heap of events in virtual time over the fleet's nodes.

*submit* -> ``Admission.enqueue``; an admitted job is placed with ``place_gang`` and bound
to the best cluster with a *finish* event ``runSeconds`` later, or keeps its quota and is
retried once capacity is freed (docs/decisions/009). *finish* frees nodes, then
``Admission.release`` and the quota workflow's pass (``fleetq.admission_pass.run_pass``).
As in the quota workflow: fair sharing, preemption (victims stop after their grace,
their cpu·s counted as wasted work, and queue again with their original submit time),
capacity preemption, never-placeable gangs (:meth:`Simulation._capacity_preempt`,
:meth:`Simulation._never_placeable`) and the placement timeout with backoff
(:meth:`Simulation._placement_timeout`; pods run at once here, so the pods-ready timeout
never fires). Semantics: docs/preemption.md, docs/requeue.md.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Mapping

import numpy as np

from fleetq import resources as R
from fleetq.admission import Admission, AdmissionRequest, Grant, QueuePolicy
from fleetq.admission_pass import run_pass
from fleetq.capacity import ClusterSnapshot, NodeCapacity, Taint
from fleetq.fleet_config import RequeueSettings, requeue_settings
from fleetq.models import quota_request
from fleetq.placement import (
    ClusterChoice,
    PlacementDecision,
    PlacementIndex,
    PodGroup,
    never_fits,
    place_gang,
    pod_groups,
)
from fleetq.preemption import (
    PreemptionMode,
    PreemptionPlan,
    PreemptionReason,
    RunningGang,
    RunningPod,
    fair_sharing_weights,
    plan_capacity_preemption,
    plan_preemptions,
)
from fleetq.quota import Inadmissible
from fleetq.rejection import Rejection
from fleetq.simulator.report import (
    FailureReasons,
    ReasonKey,
    SimulationResult,
    build_result,
    grouped,
)
from fleetq.simulator.series import StepSeries, resource_order
from fleetq.simulator.trace import RunRange, Trace
from fleetq.topology import Topology, node_names

__all__ = ["Job", "Simulation", "SimulationError", "cluster_snapshots", "simulate"]


class SimulationError(RuntimeError):
    """The replay cannot go on (one line): preemption that makes no progress, i.e. the
    same job preempted twice for the same preemptor at one instant of virtual time."""


def cluster_snapshots(topology: Topology) -> list[ClusterSnapshot]:
    """One empty snapshot per member cluster with nodes, nodes named and labelled like the
    emulator's (``<cluster>-<prefix>-<n>``, ``kubernetes.io/hostname``, group labels)."""
    out: list[ClusterSnapshot] = []
    for spec in topology.members:
        nodes: list[NodeCapacity] = []
        for name, group in node_names(spec):
            cap = R.parse_resources(group.capacity_quantities())
            pods = cap.pop(R.PODS, 110 * R.MILLI) // R.MILLI
            labels = {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "fleetq-emulated",
                "fleetq.io/cluster": spec.name,
                **group.labels,
            }
            taints = tuple(Taint(t.key, t.value, t.effect) for t in group.taints)
            nodes.append(
                NodeCapacity(name, cap, {}, labels, taints, pods_allocatable=int(pods))
            )
        if nodes:
            out.append(
                ClusterSnapshot(
                    spec.name,
                    labels=dict(spec.labels),
                    nodes=nodes,
                    reservation=spec.reservation,
                    resource_version="0",
                )
            )
    return out


# at equal times, finishes and stops (which free capacity) go before submissions
_FINISH = 0
_STOP = 1  # a preempted job's grace period is over
_SUBMIT = 2
_TIMEOUT = 3  # an admitted job's placement timeout (after the placement pass of its instant)
_BACKOFF = 4  # a re-queued job's backoff is over: it queues again


class Job:
    """One job of the trace, from submission to its finish. A preempted job's
    ``admitted``/``started`` are cleared: they are those of the run that finished."""

    __slots__ = ("admitted", "binding", "cluster", "gid", "grants", "id", "idx", "key",
                 "preempted", "request", "requeues", "run", "seq", "started", "stopping",
                 "submitted", "wasted")

    def __init__(self, gid: int, job_id: str, submitted: float, run: float) -> None:
        self.gid = gid
        self.id = job_id
        self.submitted = submitted
        self.run = run
        self.admitted: float | None = None
        self.started: float | None = None
        self.seq = 0  # admission order
        self.cluster = ""
        self.binding: list[tuple[NodeCapacity, R.Resources]] = []
        self.idx = 0  # index in Simulation.all_jobs
        self.key = -1  # key of the running run in Simulation.running
        self.request: AdmissionRequest | None = None
        self.stopping: PreemptionReason | None = None  # told to stop, why
        self.preempted = 0  # runs lost to preemption
        self.wasted = 0.0  # cpu·s of those runs
        self.grants = 0  # admissions so far (a placement timeout names the one it bounds)
        self.requeues = 0  # placement timeouts so far


class Simulation:
    """One run: the event loop, the fleet's node state and the series and counters the
    report (:func:`~fleetq.simulator.report.build_result`) reads."""

    def __init__(self, trace: Trace, policy: QueuePolicy | None) -> None:
        spec = trace.spec
        self.trace = trace
        self.policy = QueuePolicy(policy or spec.queuePolicy)
        self.admission = Admission(trace.tree, self.policy, spec.starvationSeconds)
        # fair sharing of borrowed quota, as the quota workflow turns it on
        self.admission.fair_weights = fair_sharing_weights(trace.tree)
        self.snapshots = cluster_snapshots(trace.topology)
        self.by_cluster = {s.name: s for s in self.snapshots}
        self.nodes = {s.name: {n.name: n for n in s.nodes} for s in self.snapshots}
        self.version = 0
        groups = spec.jobs
        self.gangs = trace.gangs
        self.pods = [[(p.name_suffix, dict(p.requests)) for p in g.pods] for g in self.gangs]
        self.totals = [g.total for g in self.gangs]
        self.requests = [quota_request(g) for g in self.gangs]
        self.widths = [len(str(max(g.count - 1, 0))) for g in groups]
        self.rngs = [random.Random(spec.seed * 1_000_003 + i) for i in range(len(groups))]
        self.allowed = [
            [g.clusterAffinity is None or g.clusterAffinity.allows(s.name, s.labels)
             for s in self.snapshots]
            for g in groups
        ]
        #: placement's views of the snapshots, kept warm across decisions
        self.placement_index = PlacementIndex()
        self.shapes = [
            [_shapes(pod_groups(gang), snap, self.placement_index) for snap in self.snapshots]
            for gang in self.gangs
        ]
        starts = [g.start for g in groups if g.count > 0]
        self.t0 = min(starts) if starts else 0.0
        self._init_state(len(groups))
        self._init_preemption(trace)
        self._init_outcomes()
        self._init_metrics()

    def _init_state(self, n_groups: int) -> None:
        """The event loop's queues and the jobs it has made."""
        self.heap: list[tuple[float, int, int, int]] = []
        self.waiting: dict[str, Job] = {}
        #: jobs that can never be admitted under the trace's tree, and why (issue 24)
        self.inadmissible: dict[str, Inadmissible] = {}
        self.running: dict[int, Job] = {}
        self.unplaced: dict[int, deque[Job]] = {}
        self.failed: set[int] = set()  # groups that fit nowhere until capacity is freed
        self.reason_cache: dict[tuple[int, str], tuple[str, Rejection]] = {}  # (version, why)
        self.fresh: list[Job] = []
        self.freed = False
        self.quota_changed = False
        self.changed_clusters: set[str] = set()
        self.adm_seq = 0
        self.bind_seq = 0
        self.jobs: list[list[Job]] = [[] for _ in range(n_groups)]
        self.all_jobs: list[Job] = []
        self.by_id: dict[str, Job] = {}

    def _init_preemption(self, trace: Trace) -> None:
        """Re-queue settings and the preemption state (issues 18 and 24)."""
        n_groups = len(trace.spec.jobs)
        # preemption (issue 18): plans come from fleetq.preemption.plan_preemptions
        self.preemption = trace.preemption
        #: re-queue with backoff: the fleet's defaults with the tree's annotations
        self.requeue: RequeueSettings = RequeueSettings()
        if trace.tree is not None:
            try:
                self.requeue = requeue_settings(
                    self.requeue, trace.tree.metadata.annotations or {}, "quota"
                )
            except ValueError as exc:
                raise SimulationError(str(exc)) from None
        self.preempting = trace.tree is not None and trace.preemption.enabled
        self.job_policies = [trace.job_policy(gid) for gid in range(n_groups)]
        self.cpu = [self.totals[gid].get(R.CPU, 0) / R.MILLI for gid in range(n_groups)]
        self.preemptions: dict[PreemptionReason, int] = {}
        self.preemptors = 0  # plans decided
        self.finished_in_grace = 0
        self.wasted = 0.0
        #: (instant, (victim, preemptor) pairs stopped at that instant)
        self.stopped_at: tuple[float, set[tuple[int, str]]] = (-1.0, set())
        #: jobs admitted at once by the event being handled (no victims of its planning)
        self.at_once: set[str] = set()
        #: whether the event being handled ran a pass (which planned already)
        self.passed = False
        self.stopping_for: dict[int, str] = {}  # victim told to stop -> its preemptor
        # capacity preemption (issue 24): a job quota admitted that no cluster can hold
        # evicts lower-priority gangs on one cluster (fleetq.preemption.
        # plan_capacity_preemption, as the placement activity), under LowerPriority
        self.capacity = (
            trace.tree is not None and trace.preemption.preemption is PreemptionMode.LOWER_PRIORITY
        )
        self.capacity_plans: dict[int, set[int]] = {}  # preemptor -> victims still running
        self.capacity_planned = 0  # plans made

    def _init_outcomes(self) -> None:
        """What became of the jobs: the counters the report reads."""
        #: the states other parts of the lifecycle add, counted per job as they happen
        #: (issue 24: inadmissible, never placeable, re-queued with backoff); the
        #: engine's hooks for them: :meth:`count_state`
        self.states: dict[str, int] = {}
        #: per trace group: whether no cluster could ever hold its gang (judged once on
        #: empty nodes: the simulated fleet's nodes never change), by
        #: :func:`fleetq.placement.never_fits` as the placement activity judges it
        self.never: dict[int, bool] = {}
        self.never_jobs: list[Job] = []  # admitted, never placeable: quota goes back
        self.reasons = FailureReasons()
        self.failed_attempts = 0
        self.delayed = 0
        self.late: set[int] = set()  # jobs counted in delayed
        self.completed = 0
        self.last_finish: float | None = None

    def _init_metrics(self) -> None:
        """The step series the report plots: queue lengths, quota usage, cluster use."""
        t0 = self.t0
        self.queue_of_node = {q.node: q.name for q in self.admission.queues()}
        self.qlen: dict[str, int] = dict.fromkeys(self.queue_of_node.values(), 0)
        self.qlen_series = {q: StepSeries(t0) for q in self.qlen}
        self.qlen_series["admitted, unplaced"] = StepSeries(t0)
        self.unplaced_count = 0
        requested: set[str] = set()
        for req in self.requests:
            requested.update(k for k, v in req.items() if v)
        self.quota_res: dict[str, list[str]] = {}
        for node in self.admission.quota:
            names = sorted(set(node.max) | requested, key=resource_order)
            self.quota_res[node.name] = names
        self.quota_series = {
            f"{n}/{r}": StepSeries(t0) for n, rs in self.quota_res.items() for r in rs
        }
        self.alloc_total: dict[str, R.Resources] = {}
        self.alloc_now: dict[str, R.Resources] = {}
        for s in self.snapshots:
            tot: R.Resources = {}
            for n in s.nodes:
                if not n.unschedulable:
                    R.add_into(tot, n.allocatable)
                    tot[R.PODS] = tot.get(R.PODS, 0) + n.pods_allocatable * R.MILLI
            self.alloc_total[s.name] = {k: v for k, v in tot.items() if v > 0}
            self.alloc_now[s.name] = {}
        self.cluster_series = {
            f"{c}/{r}": StepSeries(t0)
            for c, tot in self.alloc_total.items()
            for r in sorted(tot, key=resource_order)
        }

    # ------------------------------------------------------------------ events

    def _push_submit(self, gid: int, idx: int) -> None:
        g = self.trace.spec.jobs[gid]
        if idx < g.count:
            heapq.heappush(self.heap, (g.start + idx * g.interval, _SUBMIT, gid, idx))

    def _run_seconds(self, gid: int) -> float:
        run = self.trace.spec.jobs[gid].runSeconds
        if isinstance(run, RunRange):
            return round(self.rngs[gid].uniform(run.min, run.max), 3)
        return run

    def _submit(self, t: float, gid: int, idx: int) -> None:
        self._push_submit(gid, idx + 1)
        g = self.trace.spec.jobs[gid]
        job_id = f"pytorchjob/{g.namespace}/{g.name}-{idx:0{self.widths[gid]}d}"
        job = Job(gid, job_id, t, self._run_seconds(gid))
        self.jobs[gid].append(job)
        job.idx = len(self.all_jobs)
        self.all_jobs.append(job)
        self.by_id[job_id] = job
        policy = self.job_policies[gid]
        job.request = AdmissionRequest(
            job_id=job_id,
            namespace=g.namespace,
            priority=self.gangs[gid].priority,
            request=self.requests[gid],
            submitted_at=t,
            preemptible=policy.preemptible,
            grace_seconds=policy.grace_seconds,
        )
        self._enqueue(job, t)

    def _enqueue(self, job: Job, t: float) -> None:
        assert job.request is not None
        res = self.admission.enqueue(job.request, t)
        if isinstance(res, Grant):
            self._granted(job, t)
            self.at_once.add(job.id)  # spared by this instant's preemption planning
        elif res.inadmissible is not None:  # never admitted: not in any queue length
            self.inadmissible[job.id] = res.inadmissible
        else:
            self.waiting[job.id] = job
            self.qlen[res.queue] += 1
            self.qlen_series[res.queue].set(t, self.qlen[res.queue])

    def _requeue(self, job: Job, t: float) -> None:
        """A stopped victim gives its quota back and queues again with its original
        submit time in one step (:meth:`fleetq.admission.Admission.requeue`)."""
        assert job.request is not None
        res = self.admission.requeue(job.request, t)
        if isinstance(res, Grant):  # (requeue never admits at once; defensive)
            self._granted(job, t)
        else:
            self.waiting[job.id] = job
            self.qlen[res.queue] += 1
            self.qlen_series[res.queue].set(t, self.qlen[res.queue])

    def _preempt(self, t: float) -> None:
        """The quota workflow's planning after a message that ran no pass (the jobs
        admitted at once by it spared, as a pass spares its own grants; the run loop
        forgets them after the event)."""
        self._tell_victims(plan_preemptions(self.admission, t, spare=self.at_once), t)

    def _tell_victims(self, plans: list[PreemptionPlan], t: float) -> None:
        """Tell each new victim to stop (at once, or after its grace period if placed)."""
        for plan in plans:
            self.preemptors += 1
            for v in plan.victims:
                job = self.by_id[v.job_id]
                if job.stopping is not None:
                    continue  # told to stop already (for a plan dropped since)
                job.stopping = v.reason
                self.stopping_for[job.idx] = plan.preemptor
                delay = float(v.grace_seconds) if job.binding else 0.0
                heapq.heappush(self.heap, (t + delay, _STOP, job.idx, 0))

    def count_state(self, state: str) -> None:
        """Count one job entering ``state`` (reported under ``states``)."""
        self.states[state] = self.states.get(state, 0) + 1

    def _capacity_preempt(self, job: Job, t: float) -> bool:
        """The placement activity's capacity preemption for ``job`` (admitted, fits no
        cluster): evict the cheapest lower-priority gangs on one cluster. True when a
        plan was made (its victims stop after their grace period, then requeue)."""
        if job.idx in self.capacity_plans:
            return False  # one plan at a time; it waits for its victims
        running = [
            RunningGang(
                r.id, r.cluster, self.gangs[r.gid].priority,
                tuple(RunningPod(node.name, req) for node, req in r.binding),
                r.started if r.started is not None else t,
                self.job_policies[r.gid].preemptible,
                self.job_policies[r.gid].grace_seconds,
            )
            for r in self.running.values()
            if r.stopping is None
        ]
        snaps = [s for ci, s in enumerate(self.snapshots) if self.allowed[job.gid][ci]]
        plan = plan_capacity_preemption(
            job.id, self.gangs[job.gid], snaps, running, t,
            affinity=self.trace.spec.jobs[job.gid].clusterAffinity,
            index=self.placement_index,
        )
        if plan is None:
            return False
        self.capacity_planned += 1
        victims: set[int] = set()
        for v in plan.victims:
            victim = self.by_id[v.job_id]
            victim.stopping = PreemptionReason.CAPACITY
            self.stopping_for[victim.idx] = job.id
            victims.add(victim.idx)
            heapq.heappush(self.heap, (t + float(v.grace_seconds), _STOP, victim.idx, 0))
        self.capacity_plans[job.idx] = victims
        return True

    def _victim_gone(self, idx: int) -> None:
        """A capacity victim stopped or finished: its preemptor waits for one fewer."""
        for preemptor, victims in list(self.capacity_plans.items()):
            victims.discard(idx)
            if not victims:
                del self.capacity_plans[preemptor]

    def _granted(self, job: Job, t: float) -> None:
        job.admitted = t
        job.grants += 1
        timeout = self.requeue.placementTimeoutSeconds
        if timeout is not None:
            heapq.heappush(self.heap, (t + timeout, _TIMEOUT, job.idx, job.grants))
        job.seq = self.adm_seq
        self.adm_seq += 1
        self.unplaced.setdefault(job.gid, deque()).append(job)
        self.unplaced_count += 1
        self.fresh.append(job)
        self.quota_changed = True

    def _unbind(self, job: Job) -> None:
        """Give the nodes of a running job back."""
        for node, req in job.binding:
            R.add_into(node.requested, req, -1)
            node.pods_used -= 1
        job.binding = []
        self._touch(job.cluster)
        alloc = self.alloc_now[job.cluster]
        R.add_into(alloc, self.totals[job.gid], -1)
        alloc[R.PODS] = alloc.get(R.PODS, 0) - len(self.pods[job.gid]) * R.MILLI
        self.freed = True

    def _finish(self, t: float, key: int) -> bool:
        job = self.running.pop(key, None)
        if job is None:
            return False  # preempted before it could finish: no event of the run
        self._unbind(job)
        if job.stopping is not None:
            self.finished_in_grace += 1
            job.stopping = None
            self.stopping_for.pop(job.idx, None)
            self._victim_gone(job.idx)
        self.completed += 1
        self.last_finish = t
        self.admission.release(job.id)
        self._schedule(t)
        return True

    def _stop(self, t: float, idx: int) -> bool:
        """A victim's grace period is over: its run is lost, it releases its quota and
        waits again with its original submit time. False when there was nothing to do
        (it finished during its grace period: the workflow's grace timer is cancelled
        then, so this instant is no event of the run and does not extend it)."""
        job = self.all_jobs[idx]
        reason = job.stopping
        if reason is None:
            return False
        # A victim stopped at once (never placed) may be re-admitted by the same pass and
        # then taken by another preemptor: bounded. The same victim for the same
        # preemptor twice at one instant is a loop that makes no progress.
        instant, stopped = self.stopped_at
        if instant != t:
            self.stopped_at = instant, stopped = t, set()
        pair = (idx, self.stopping_for.pop(idx, ""))
        if pair in stopped:
            raise SimulationError(
                f"preemption makes no progress at t={t:g}s: {job.id} was preempted twice "
                f"at the same instant for {pair[1]} (admitted again, then chosen again)"
            )
        stopped.add(pair)
        job.stopping = None
        self._victim_gone(idx)
        if job.binding:
            self.running.pop(job.key)
            assert job.started is not None
            lost = self.cpu[job.gid] * (t - job.started)
            job.wasted += lost
            self.wasted += lost
            self._unbind(job)
        else:  # admitted, never placed
            queue = self.unplaced[job.gid]
            queue.remove(job)
            if not queue:
                del self.unplaced[job.gid]
            self.unplaced_count -= 1
        job.preempted += 1
        self.preemptions[reason] = self.preemptions.get(reason, 0) + 1
        job.admitted = job.started = None
        job.cluster = ""
        self._requeue(job, t)
        self._schedule(t)
        return True

    def _placement_timeout(self, t: float, idx: int, grant: int) -> bool:
        """An admitted job's placement timeout (``lifecycle.requeue_after_timeout``): not
        placed yet, it gives its quota back and queues again after the backoff, or past
        ``requeueLimit`` ends failed. False when it was placed, stopped or admitted again
        since (the workflow's timer was cancelled: no event of the run)."""
        job = self.all_jobs[idx]
        if job.grants != grant or job.admitted is None or job.started is not None \
                or job.stopping:
            return False
        queue = self.unplaced[job.gid]
        queue.remove(job)
        if not queue:
            del self.unplaced[job.gid]
        self.unplaced_count -= 1
        self.capacity_plans.pop(job.idx, None)
        job.admitted = None
        job.requeues += 1
        self.admission.release(job.id)
        limit = self.requeue.requeueLimit
        if limit is not None and job.requeues > limit:
            self.count_state("failedRequeueLimit")
        else:
            self.count_state("requeuedPlacementTimeout")
            delay = self.requeue.backoff_seconds(job.requeues)
            heapq.heappush(self.heap, (t + delay, _BACKOFF, idx, 0))
        self._schedule(t)
        return True

    def _schedule(self, t: float) -> None:
        """The quota workflow's pass after quota was released
        (:func:`fleetq.admission_pass.run_pass`: plans, then grants); start every grant
        and tell every new victim to stop. (Plans never expire here: victims always stop
        within their grace period.)"""
        self.quota_changed = True
        granted, self.at_once = self.at_once, set()
        outcome = run_pass(self.admission, t, preempt=self.preempting, granted=granted)
        if outcome.plan_error is not None:
            raise SimulationError(outcome.plan_error)
        for grant in outcome.grants:
            waiting = self.waiting.pop(grant.job_id)
            self.qlen[grant.queue] -= 1
            self.qlen_series[grant.queue].set(t, self.qlen[grant.queue])
            self._granted(waiting, t)
        self._tell_victims(outcome.plans, t)
        self.passed = True

    def _touch(self, cluster: str) -> None:
        self.version += 1
        self.by_cluster[cluster].resource_version = str(self.version)
        self.changed_clusters.add(cluster)

    # ------------------------------------------------------------------ placement

    def _may_fit(self, gid: int, ci: int) -> bool:
        """Necessary condition for the gang to fit cluster ``ci`` (exact when all its pods
        share one shape): for each group of identical pods, the eligible nodes can hold
        enough copies. Much cheaper than :func:`place_gang`, which decides."""
        for reqs, count, nodes in self.shapes[gid][ci]:
            room = 0
            for node in nodes:
                copies = node.pods_allocatable - node.pods_used
                if copies <= 0:
                    continue
                alloc = node.allocatable
                used = node.requested
                for r, q in reqs:
                    c = (alloc.get(r, 0) - used.get(r, 0)) // q
                    if c < copies:
                        copies = c
                        if c <= 0:
                            break
                if copies > 0:
                    room += copies
                    if room >= count:
                        break
            if room < count:
                return False
        return True

    def _try_place(self, gid: int) -> ClusterChoice | None:
        """``place_gang`` over the clusters that pass :meth:`_may_fit` (the others cannot
        fit, so the best choice is the same as over all clusters)."""
        candidates = [
            snap for ci, snap in enumerate(self.snapshots)
            if self.allowed[gid][ci] and self._may_fit(gid, ci)
        ]
        if not candidates:
            return None
        decision = place_gang(
            self.gangs[gid],
            candidates,
            affinity=self.trace.spec.jobs[gid].clusterAffinity,
            index=self.placement_index,
        )
        if decision.best is None:
            self._remember(gid, decision)
        return decision.best

    def _remember(self, gid: int, decision: PlacementDecision) -> None:
        for cluster, reason in decision.reasons.items():
            version = self.by_cluster[cluster].resource_version
            self.reason_cache[(gid, cluster)] = (version, reason)

    def _reasons(self, gid: int) -> list[tuple[str, Rejection]]:
        """Why the gang fits no cluster now: ``place_gang``'s rejections, evaluated only
        for clusters that changed since they last rejected this gang."""
        stale = [
            snap for snap in self.snapshots
            if self.reason_cache.get((gid, snap.name), ("",))[0] != snap.resource_version
        ]
        if stale:
            decision = place_gang(
                self.gangs[gid],
                stale,
                affinity=self.trace.spec.jobs[gid].clusterAffinity,
                index=self.placement_index,
            )
            self._remember(gid, decision)
        return [
            (snap.name, self.reason_cache[(gid, snap.name)][1])
            for snap in self.snapshots
            if (gid, snap.name) in self.reason_cache
        ]

    def _bind(self, job: Job, cluster: str, assignment: Mapping[str, str], t: float) -> None:
        nodes = self.nodes[cluster]
        binding = []
        for suffix, req in self.pods[job.gid]:
            node = nodes[assignment[suffix]]
            R.add_into(node.requested, req)
            node.pods_used += 1
            binding.append((node, req))
        job.binding = binding
        job.cluster = cluster
        job.started = t
        self._touch(cluster)
        alloc = self.alloc_now[cluster]
        R.add_into(alloc, self.totals[job.gid])
        alloc[R.PODS] = alloc.get(R.PODS, 0) + len(self.pods[job.gid]) * R.MILLI
        key = self.bind_seq
        self.bind_seq += 1
        self.running[key] = job
        job.key = key
        heapq.heappush(self.heap, (t + job.run, _FINISH, key, 0))

    def _placement_pass(self, t: float) -> None:
        """Place admitted-but-unplaced jobs in admission order. A gang shape (trace group)
        that does not fit is not tried again until capacity is freed."""
        if self.freed:
            self.failed.clear()
            self.freed = False
        self._place_in_order(t)
        self._count_delayed()
        if self.never_jobs:
            self._give_back_never_placeable(t)

    def _place_in_order(self, t: float) -> None:
        # a shape judged never placeable is taken up again even when it failed in this
        # instant: a job of it admitted since (with the quota another one gave back) must
        # give its quota back too, or it holds it for ever (the no-stall property test)
        heap = [(q[0].seq, gid) for gid, q in self.unplaced.items()
                if q and (gid not in self.failed or self.never.get(gid))]
        heapq.heapify(heap)
        while heap:
            _, gid = heapq.heappop(heap)
            queue = self.unplaced[gid]
            best = None if self.never.get(gid) else self._try_place(gid)
            if best is None:
                self._place_failed(gid, queue, t)
                continue
            job = queue.popleft()
            self.capacity_plans.pop(job.idx, None)  # placed (its victims still stop)
            if not queue:
                del self.unplaced[gid]
            self.unplaced_count -= 1
            self._bind(job, best.cluster, best.assignment, t)
            if queue:
                heapq.heappush(heap, (queue[0].seq, gid))

    def _place_failed(self, gid: int, queue: deque[Job], t: float) -> None:
        """The head of ``gid``'s queue fits no cluster: its shape waits for freed capacity,
        gives up when it can never fit, or preempts for room."""
        self.failed.add(gid)
        self.failed_attempts += 1
        if self._never_placeable(gid):
            self.never_jobs.extend(queue)
            del self.unplaced[gid]
            self.unplaced_count -= len(queue)
            return
        if self.capacity:
            self._capacity_preempt(queue[0], t)

    def _count_delayed(self) -> None:
        counted: dict[int, dict[ReasonKey, tuple[list[str], str]]] = {}
        for job in self.fresh:
            # once per job: not if preempted since, nor again after a preemption
            if job.started is None and job.admitted is not None and job.idx not in self.late:
                self.late.add(job.idx)
                self.delayed += 1
                reasons = counted.get(job.gid)
                if reasons is None:
                    reasons = counted[job.gid] = grouped(self._reasons(job.gid))
                self.reasons.count(reasons)
        self.fresh = []

    def _give_back_never_placeable(self, t: float) -> None:
        # "never", not "not now" (issue 24): each gives its quota back at once and
        # stays Unschedulable; what it freed may admit others, placed at once
        for job in self.never_jobs:
            self.count_state("neverPlaceable")
            job.admitted = None
            self.admission.release(job.id)
        self.never_jobs = []
        self._schedule(t)
        if self.fresh:
            self._placement_pass(t)

    def _never_placeable(self, gid: int) -> bool:
        got = self.never.get(gid)
        if got is None:
            snaps = [s for ci, s in enumerate(self.snapshots) if self.allowed[gid][ci]]
            got = self.never[gid] = bool(snaps) and (
                never_fits(self.gangs[gid], snaps, index=self.placement_index) is not None
            )
        return got

    # ------------------------------------------------------------------ recording

    def _record(self, t: float) -> None:
        self.qlen_series["admitted, unplaced"].set(t, self.unplaced_count)
        if self.quota_changed:
            self.quota_changed = False
            # only the nodes whose usage may have changed since the last record (the
            # others' series would not change): not the whole tree at every event
            changed = self.admission.changed_queues()
            nodes = self.admission.quota.nodes
            for name in self.quota_res if changed is None else changed:
                res = self.quota_res.get(name)
                if res is None:
                    continue
                usage = nodes[name].usage
                for r in res:
                    self.quota_series[f"{name}/{r}"].set(t, usage.get(r, 0))
        for c in self.changed_clusters:
            alloc = self.alloc_now[c]
            for r in self.alloc_total[c]:
                self.cluster_series[f"{c}/{r}"].set(t, alloc.get(r, 0))
        self.changed_clusters.clear()

    # ------------------------------------------------------------------ run

    def run(self) -> SimulationResult:
        for gid in range(len(self.trace.spec.jobs)):
            self._push_submit(gid, 0)
        heap = self.heap
        t = end = self.t0
        while heap:
            t, kind, a, b = heapq.heappop(heap)
            self.passed = False
            if not self._handle(t, kind, a, b):
                continue
            if self.preempting and self.waiting and not self.passed:
                self._preempt(t)
            self.at_once.clear()
            if self.fresh or (self.freed and self.unplaced_count):
                self._placement_pass(t)
            self._record(t)
            end = t
        return build_result(self, end)

    def _handle(self, t: float, kind: int, a: int, b: int) -> bool:
        """Apply one event; False when it no longer applies (nothing changed)."""
        if kind == _FINISH:
            return self._finish(t, a)
        if kind == _STOP:
            return self._stop(t, a)
        if kind == _SUBMIT:
            self._submit(t, a, b)
            return True
        if kind == _TIMEOUT:
            return self._placement_timeout(t, a, b)
        # _BACKOFF: queue again with the original submit time
        self._enqueue(self.all_jobs[a], t)
        return True


_Shape = tuple[tuple[tuple[str, int], ...], int, list[NodeCapacity]]


def _shapes(
    groups: list[PodGroup], snap: ClusterSnapshot, index: PlacementIndex
) -> list[_Shape]:
    """Per pod group of a gang (placement's grouping): its positive requests, its pod
    count and the nodes of ``snap`` it may use (schedulable, nodeSelector matched, hard
    taints tolerated), for :meth:`Simulation._may_fit`."""
    cols = index.columns_of(snap)
    by_name = {n.name: n for n in snap.nodes}
    out: list[_Shape] = []
    for g in groups:
        usable = np.flatnonzero(cols.usable_mask(g.selector, g.tolerations)).tolist()
        out.append((g.requests, len(g.pods), [by_name[cols.names[i]] for i in usable]))
    return out


def simulate(trace: Trace, policy: QueuePolicy | str | None = None) -> SimulationResult:
    """Replay ``trace`` (``policy`` overrides the trace's ``queuePolicy``)."""
    return Simulation(trace, QueuePolicy(policy) if policy is not None else None).run()
