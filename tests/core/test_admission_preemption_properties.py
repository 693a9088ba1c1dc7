"""Property test: random sequences of enqueue / scheduling pass (with preemption planning)
/ release / cancel / continue-as-new under a tree with priority preemption and reclaim
on, against the invariants of carrying preemption out:

* usage never exceeds ``max`` at any node (preemption never over-admits);
* the quota a pending plan's victims will free is held for its preemptor: at every node,
  usage minus what pending victims still hold plus every pending preemptor's request
  stays within ``max`` (so each preemptor fits once its victims are gone, whatever else
  was admitted meanwhile);
* a preemptor is admitted once none of its victims holds quota, or earlier only if it
  fits even with its victims still holding and its own held request still counted (the
  quota freed elsewhere is then enough: its victims' quota is not needed); a job is a
  victim of at most one pending plan, never a pending preemptor, never opted out, and
  (priority preemption) always of lower priority than its preemptor;
* victims that stop queue again with their original submit time and may be re-admitted
  before their preemptor: a plan lists exactly the victims told to stop that have not
  released since (a re-admitted victim is neither waited for nor counted as leaving
  again), so no victim is promised twice; a plan outlives its victims' releases only
  while victims of earlier or draining plans it counted on are still leaving, and once
  no victim is leaving anywhere every preemptor whose victims released is admitted;
* a victim the quota workflow purged itself is parked (docs/decisions/023): it is
  granted nothing until its own ``requeue`` / ``release`` / ``cancel`` arrives, and every
  job a pass admits meanwhile fits with the parked requests still charged;
* a pass plans before it grants (``fleetq.admission_pass.run_pass``, as Kueue's cycle):
  no victim is a job admitted by the pass that plans it, or at once by its message;
* a copy restored from the serialized state carries on identically.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from fleetq.admission import Admission, AdmissionRequest, Grant, PendingPlan
from fleetq.admission_pass import run_pass
from fleetq.models import parse_tree
from tests.tiers import examples

JOBS = "kube-queue/max-jobs"
NAMESPACES = ["a1", "a2", "b1"]
JOB_IDS = [f"pytorchjob/ns/j{i}" for i in range(12)]
SHAPES = [{JOBS: 1000, "cpu": 1000}, {JOBS: 1000, "cpu": 2000}, {JOBS: 1000, "cpu": 4000}]
TREE: dict[str, Any] = {
    "apiVersion": "scheduling.sigs.k8s.io/v1beta1",
    "kind": "ElasticQuotaTree",
    "metadata": {
        "name": "tree",
        "namespace": "kube-system",
        "annotations": {"fleetq.io/preemption": "LowerPriority", "fleetq.io/reclaim": "Any"},
    },
    "spec": {"root": {
        "name": "root", "min": {"cpu": 8, JOBS: 6}, "max": {"cpu": 8, JOBS: 6},
        "children": [
            {"name": "a", "min": {"cpu": 4}, "max": {"cpu": 8, JOBS: 4}, "children": [
                {"name": "a1", "min": {"cpu": 2}, "max": {"cpu": 6, JOBS: 2},
                 "namespaces": ["a1"]},
                {"name": "a2", "min": {"cpu": 2}, "max": {"cpu": 6}, "namespaces": ["a2"]},
            ]},
            {"name": "b1", "min": {"cpu": 4}, "max": {"cpu": 8, JOBS: 3},
             "namespaces": ["b1"]},
        ],
    }},
}


class PreemptionMachine(RuleBasedStateMachine):
    @initialize()
    def start(self) -> None:
        self.a = Admission(parse_tree(TREE))
        self.now = 0.0
        self.requests: dict[str, AdmissionRequest] = {}
        #: victims told to stop that have not released since (the model of the plans)
        self.leaving: set[str] = set()
        #: victims the quota workflow purged itself (parked), not yet heard from
        self.parked: set[str] = set()

    # ------------------------------------------------------------------ rules
    @rule(job=st.sampled_from(JOB_IDS), ns=st.sampled_from(NAMESPACES),
          prio=st.sampled_from([0, 10, 100]), shape=st.sampled_from(SHAPES),
          preemptible=st.booleans())
    def enqueue(self, job: str, ns: str, prio: int, shape: dict[str, int],
                preemptible: bool) -> None:
        if (self.a.is_admitted(job) or self.a.request_of(job) is not None
                or job in self.parked):
            return
        self.now += 1
        # (a grace period no run of this model outlives: plans never expire here; expiry
        # is test_admission_plan_timeout's)
        req = AdmissionRequest(job_id=job, namespace=ns, priority=prio, request=shape,
                               submitted_at=self.now, preemptible=preemptible,
                               grace_seconds=10**9)
        self.requests[job] = req
        before = self._plans()
        result = self.a.enqueue(req, self.now)
        if isinstance(result, Grant):
            self._check_grants([result], before)
            self._pass(granted=[job])  # as the quota workflow runs one after every message
        else:
            self._pass()

    @rule(ns=st.sampled_from(NAMESPACES), n=st.integers(2, 4))
    def burst_of_small_jobs(self, ns: str, n: int) -> None:
        """Several small low-priority jobs: a later large one needs several victims."""
        free = [j for j in JOB_IDS if not self.a.is_admitted(j) and self.a.request_of(j) is None
                and j not in self.parked]
        for job in free[:n]:
            self.enqueue(job, ns, 0, SHAPES[0], True)

    @rule(arrivals=st.lists(st.tuples(st.sampled_from(NAMESPACES), st.sampled_from([0, 10, 100]),
                                      st.sampled_from(SHAPES)), min_size=2, max_size=4))
    def arrive_together(self, arrivals: list[tuple[str, int, dict[str, int]]]) -> None:
        """Jobs in one ``submit`` batch: queued with none admitted at once, then one pass
        orders them all (the quota workflow's ``submit``)."""
        free = [j for j in JOB_IDS if not self.a.is_admitted(j) and self.a.request_of(j) is None
                and j not in self.parked]
        self.now += 1
        for job, (ns, prio, shape) in zip(free, arrivals, strict=False):
            req = AdmissionRequest(job_id=job, namespace=ns, priority=prio, request=shape,
                                   submitted_at=self.now, grace_seconds=10**9)
            self.requests[job] = req
            assert not isinstance(self.a.enqueue(req, self.now, at_once=False), Grant)
        self._pass()

    @rule()
    def scheduling_pass(self) -> None:
        self._pass()

    def _pass(self, granted: Sequence[str] = ()) -> None:
        """The quota workflow's pass (``run_pass``: plans, grants, plans for the
        outranked); ``granted``: the job its message admitted at once."""
        self.now += 1
        before = self._plans()
        holders = self.a.holder_policies()
        out = run_pass(self.a, self.now, preempt=True, granted=granted)
        assert out.plan_error is None and not out.expired  # (victims' grace: never here)
        grants = out.grants
        self._check_grants(grants, before)
        late = {p.preemptor for p in out.plans_after_grants}
        self._check_parked_held([g for g in grants if g.job_id not in before], late)
        holders.update(self.a.holder_policies())
        plans = out.plans
        event("preemption planned" if plans else "no preemption planned")
        if out.plans_before_grants and grants:
            event("planned before a pass that granted")
        if any(len(p.victims) > 1 for p in plans):
            event("several victims")
        # Kueue's cycle: a preemption's targets were admitted before it (run_pass)
        fresh = {*granted, *(g.job_id for g in grants)}
        for plan in plans:
            assert not fresh & {v.job_id for v in plan.victims}, (
                f"{plan.preemptor}: a victim admitted by this very pass")
            preemptor = self.requests[plan.preemptor]
            for v in plan.victims:
                assert v.job_id not in self.leaving, f"{v.job_id} promised twice"
                self.leaving.add(v.job_id)
                assert holders[v.job_id].preemptible, v
                if v.reason == "Priority":
                    assert holders[v.job_id].priority < preemptor.priority, v

    @rule(data=st.data(), victim=st.booleans())
    def release(self, data: st.DataObject, victim: bool) -> None:
        """A victim stops (``victim``), or any holder finishes: its quota comes back."""
        holders = self.a.holders()
        if holders:
            victims = [v.job_id for p in self.a.plans() for v in p.victims
                       if v.job_id in holders]
            job = data.draw(st.sampled_from(victims if victim and victims else holders))
            assert self.a.release(job)
            self.leaving.discard(job)
            self.scheduling_pass()

    @rule(data=st.data(), pass_between=st.booleans())
    def victim_stops_and_queues_again(self, data: st.DataObject, pass_between: bool) -> None:
        """A victim stops, releases and queues again with its original submit time (a
        pass may run in between, as when its re-enqueue arrives later); the next pass may
        re-admit it before its preemptor, into room freed elsewhere."""
        victims = sorted(self.leaving)
        if victims:
            job = data.draw(st.sampled_from(victims))
            assert self.a.release(job)
            self.leaving.discard(job)
            if pass_between:
                self.scheduling_pass()
            self.now += 1
            result = self.a.enqueue(self.requests[job], self.now)
            at_once = isinstance(result, Grant)
            event("victim re-admitted at once" if at_once else "victim queued")
            self._pass(granted=[job] if at_once else [])
            if self.a.is_admitted(job):
                event("victim re-admitted")

    @rule(data=st.data())
    def tree_purges_a_victim(self, data: st.DataObject) -> None:
        """The quota workflow purged a victim's copies itself: it parks the victim (its
        quota back at once, its request held) until the victim's own message."""
        victims = sorted(self.leaving)
        if victims:
            job = data.draw(st.sampled_from(victims))
            assert self.a.park(job)
            assert not self.a.park(job)  # (holds nothing any more)
            self.leaving.discard(job)
            self.parked.add(job)
            self.scheduling_pass()

    @rule(data=st.data(), how=st.sampled_from(["requeue", "release", "cancel"]))
    def parked_victim_is_heard_from(self, data: st.DataObject, how: str) -> None:
        """Its ``requeue`` puts it back in its queue (original submit time); a ``release``
        or ``cancel`` (it was deleted meanwhile) drops it and what was held for it."""
        parked = sorted(self.parked)
        if parked:
            job = data.draw(st.sampled_from(parked))
            self.parked.discard(job)
            self.now += 1
            if how == "requeue":
                assert not isinstance(self.a.requeue(self.requests[job], self.now), Grant)
                assert self.a.request_of(job) == self.requests[job]
            else:
                assert getattr(self.a, how)(job)
                assert self.a.request_of(job) is None and not self.a.is_admitted(job)
            self.scheduling_pass()

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        waiting = self.a.waiting()
        if waiting:
            assert self.a.cancel(data.draw(st.sampled_from(waiting)))
            self.scheduling_pass()

    @rule()
    def continue_as_new(self) -> None:
        state = self.a.to_state()
        self.a = Admission.from_state(state)
        assert self.a.to_state() == state

    # ------------------------------------------------------------------ checks
    def _plans(self) -> dict[str, PendingPlan]:
        return {p.preemptor: p for p in self.a.plans()}

    def _check_grants(self, grants: list[Grant], plans: dict[str, PendingPlan]) -> None:
        granted = {g.job_id for g in grants}

        def leaving(plan: PendingPlan) -> bool:  # (the model, not what the plan says)
            return any(v.job_id in self.leaving for v in plan.victims)

        if not self.leaving:  # nothing held back any more: every released plan is done
            for preemptor in plans:
                assert preemptor in granted, f"{preemptor}: victims released, not admitted"
        else:
            # a plan whose victims all released stays only while earlier or draining
            # plans' victims, which it counted on, are still leaving
            leaving_before = any(map(leaving, self.a.draining()))
            for pending in self.a.plans():
                assert leaving(pending) or leaving_before, f"{pending.preemptor} outlives"
                leaving_before = leaving_before or leaving(pending)
        for g in grants:
            plan = plans.get(g.job_id)
            if plan is not None:
                event("preemptor admitted")
                if leaving(plan):
                    event("preemptor admitted before its victims released")
                    for n in self._chain(plan.node):
                        node = self.a.quota.nodes[n]
                        for k, limit in node.max.items():
                            used = node.usage.get(k, 0) + plan.request.get(k, 0)
                            assert used <= limit, f"{g.job_id} admitted early: {n} {k}"

    def _check_parked_held(self, grants: list[Grant], late: Collection[str]) -> None:
        """Every job a pass admitted (preemptors aside: their victims' quota is theirs)
        fits with the parked victims' and pending preemptors' requests charged (those
        planned after the pass's grants, ``late``, aside)."""
        if not self.parked:
            return
        event("pass with a parked victim")
        charged: dict[str, dict[str, int]] = {n.name: dict(n.usage) for n in self.a.quota}
        holds = [self.requests[j] for j in self.parked] + [
            self.requests[p.preemptor] for p in self.a.plans() if p.preemptor not in late]
        for r in holds:
            for n in self._chain(self.a.quota.leaf_for(r.namespace)):
                for k, q in r.request.items():
                    charged[n][k] = charged[n].get(k, 0) + q
        for g in grants:
            event("admitted beside a parked victim")
            for n in self._chain(g.node):
                node = self.a.quota.nodes[n]
                for k, limit in node.max.items():
                    assert charged[n].get(k, 0) <= limit, (g.job_id, n, k, charged[n])

    def _chain(self, node: str) -> list[str]:
        return [n.name for n in self.a.quota.nodes[node].chain]

    @invariant()
    def usage_within_max(self) -> None:
        for node in self.a.quota:
            for k, limit in node.max.items():
                assert node.usage.get(k, 0) <= limit, (node.name, k, node.usage)

    @invariant()
    def freed_quota_is_held_for_preemptors(self) -> None:
        held: dict[str, dict[str, int]] = {n.name: dict(n.usage) for n in self.a.quota}
        holdings = self.a.quota.holdings
        for plan in self.a.plans() + self.a.draining():
            for v in plan.victims:
                if v.job_id in self.leaving:  # (a re-admitted victim frees nothing again)
                    h = holdings[v.job_id]
                    for n in self._chain(h.node):
                        for k, q in h.request.items():
                            held[n][k] = held[n].get(k, 0) - q
            if plan in self.a.draining():
                continue  # cancelled or admitted: its victims still leave, nothing held
            for n in self._chain(plan.node):
                for k, q in plan.request.items():
                    held[n][k] = held[n].get(k, 0) + q
        for node in self.a.quota:
            for k, limit in node.max.items():
                assert held[node.name].get(k, 0) <= limit, (node.name, k, held[node.name])

    @invariant()
    def plans_list_exactly_the_victims_still_leaving(self) -> None:
        listed = [v.job_id for p in self.a.plans() + self.a.draining() for v in p.victims]
        assert sorted(listed) == sorted(self.leaving), (listed, self.leaving)
        assert all(p.victims for p in self.a.draining()), "a draining plan outlives its victims"
        holders = set(self.a.holders())
        assert self.leaving <= holders

    @invariant()
    def parked_victims_are_granted_nothing(self) -> None:
        assert sorted(self.a.parked()) == sorted(self.parked)
        for job in self.parked:
            assert not self.a.is_admitted(job) and self.a.request_of(job) is None, job

    @invariant()
    def plans_are_consistent(self) -> None:
        seen: set[str] = set()
        preemptors = set(self.a.preemptors())
        for plan in self.a.plans():
            assert self.a.request_of(plan.preemptor) is not None, "a preemptor waits"
        for plan in self.a.plans() + self.a.draining():
            for v in plan.victims:
                assert v.job_id not in seen, f"{v.job_id} is a victim twice"
                assert v.job_id not in preemptors
                seen.add(v.job_id)


PreemptionMachine.TestCase.settings = settings(
    max_examples=examples(300), stateful_step_count=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_preemption_carried_out = PreemptionMachine.TestCase
