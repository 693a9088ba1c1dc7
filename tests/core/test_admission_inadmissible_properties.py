"""Property test (issue 24): no job that fits its quota ever waits behind one that does
not.

Two :class:`~fleetq.admission.Admission` instances take the same random stream of
enqueues, releases, cancels, tree changes (raising and lowering limits), clock steps and
continue-as-new, under either queue policy: the *real* one gets every job; the *oracle*
is only ever told of the jobs whose request fits under the ``max`` of every node of
their chain in the current tree (checked here from the manifest, as Kube Queue's
ElasticQuotaTree does, koord-queue ``ElasticQuotaTree`` max at leaf and ancestors): a
job that stops fitting is cancelled from it, a job that fits again is enqueued again with
its original submit time. After every step both grant the same jobs in the same order,
hold the same jobs, and every waiting job that fits has the same position and the same
reason in both: the impossible jobs change nothing for anybody (they are not heads, not
starving, not counted, never overtaken-blocked). The member-capacity half ("and some
member empty") is not stated here: ``placement.ever_fits`` is not on main yet.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from fleetq.admission import (
    Admission,
    AdmissionRequest,
    Grant,
    QueuePolicy,
    WaitInfo,
    display_job,
)
from fleetq.models import parse_tree
from fleetq.quota_state import pack_state, unpack_state
from tests.core.test_admission_properties import (
    GPU,
    JOB_IDS,
    JOBS,
    NAMESPACES,
    SHAPES,
    Reference,
    RefJob,
    trees,
)
from tests.tiers import examples

#: SHAPES plus requests too big for most random trees (what users get wrong)
BIG_SHAPES = [*SHAPES, {JOBS: 1000, "cpu": 20000}, {JOBS: 1000, GPU: 12000}]


def _fits(ref: Reference, r: AdmissionRequest) -> bool:
    job = RefJob(r.job_id, r.namespace, r.priority, r.submitted_at, dict(r.request))
    return ref.never_fits(job) is None


class OracleMachine(RuleBasedStateMachine):
    real: Admission
    oracle: Admission

    @initialize(
        tree=trees(),
        policy=st.sampled_from(list(QueuePolicy)),
        starve=st.sampled_from([0.0, 40.0]),
        incremental=st.booleans(),
    )
    def setup(
        self, tree: dict[str, Any], policy: QueuePolicy, starve: float, incremental: bool
    ) -> None:
        self.real = Admission(parse_tree(tree), policy, starve)
        self.oracle = Admission(parse_tree(tree), policy, starve)
        self.real.incremental = incremental
        self.ref = Reference(tree, policy, starve)  # the manifest's limits, for _fits
        self.now = 0.0
        #: jobs waiting in the real instance (as first enqueued) and holders
        self.waiting: dict[str, AdmissionRequest] = {}
        self.held: set[str] = set()

    def _compare(self, a: WaitInfo | Grant, b: WaitInfo | Grant) -> None:
        assert type(a) is type(b), (a, b)
        assert a.model_dump() == b.model_dump()

    @rule(
        job=st.sampled_from(JOB_IDS),
        ns=st.sampled_from(NAMESPACES),
        prio=st.integers(0, 2),
        shape=st.sampled_from(BIG_SHAPES),
    )
    def enqueue(self, job: str, ns: str, prio: int, shape: dict[str, int]) -> None:
        r = self.waiting.get(job) or AdmissionRequest(
            job_id=job, namespace=ns, priority=prio, request=shape, submitted_at=self.now
        )
        out = self.real.enqueue(r, self.now)
        if job in self.held:
            assert isinstance(out, Grant)
            self._compare(out, self.oracle.enqueue(r, self.now))
            return
        self.waiting[job] = r
        if not _fits(self.ref, r):
            event("enqueued an inadmissible job")
            assert isinstance(out, WaitInfo) and out.inadmissible is not None
            return
        self._compare(out, self.oracle.enqueue(r, self.now))
        if isinstance(out, Grant):
            self.held.add(job)
            del self.waiting[job]

    @rule()
    def schedule(self) -> None:
        grants = self.real.schedule(self.now)
        assert grants == self.oracle.schedule(self.now)
        for g in grants:
            self.held.add(g.job_id)
            del self.waiting[g.job_id]

    @rule(i=st.integers(0, 20))
    def release(self, i: int) -> None:
        if not self.held:
            return
        job = sorted(self.held)[i % len(self.held)]
        self.held.discard(job)
        assert self.real.release(job) and self.oracle.release(job)

    @rule(job=st.sampled_from(JOB_IDS))
    def cancel(self, job: str) -> None:
        r = self.waiting.pop(job, None)
        assert self.real.cancel(job) is (r is not None)
        if r is not None and _fits(self.ref, r):
            assert self.oracle.cancel(job)

    @rule(tree=trees())
    def replace_tree(self, tree: dict[str, Any]) -> None:
        old = {j for j, r in self.waiting.items() if _fits(self.ref, r)}
        self.ref = Reference(tree, self.ref.policy, self.ref.starve)
        new = {j for j, r in self.waiting.items() if _fits(self.ref, r)}
        for job in sorted(old - new):
            event("a tree change made a waiting job inadmissible")
            assert self.oracle.cancel(job)
        self.real.replace_tree(parse_tree(tree))
        self.oracle.replace_tree(parse_tree(tree))
        for job in sorted(new - old):
            event("a tree change queued an inadmissible job again")
            out = self.oracle.enqueue(self.waiting[job], self.now)
            assert isinstance(out, WaitInfo)  # (a pass is due: nobody is admitted at once)

    @rule(dt=st.sampled_from([0.0, 1.0, 30.0, 700.0]))
    def advance(self, dt: float) -> None:
        self.now += dt

    @rule()
    def continue_as_new(self) -> None:
        # both (a restored state forgets the last pass's time, for either)
        incremental = self.real.incremental
        self.real = Admission.from_state(unpack_state(pack_state(self.real.to_state())))
        self.real.incremental = incremental
        self.oracle = Admission.from_state(unpack_state(pack_state(self.oracle.to_state())))

    @invariant()
    def impossible_jobs_change_nothing_for_the_others(self) -> None:
        if not hasattr(self, "real"):
            return
        never = {j for j, r in self.waiting.items() if not _fits(self.ref, r)}
        assert set(self.real.inadmissible()) == never
        assert self.real.holders() == self.oracle.holders()
        assert self.real.waiting() == self.oracle.waiting()
        for job in self.real.waiting():
            info = self.real.wait_info(job)
            assert info == self.oracle.wait_info(job)
            assert info is not None
            assert not {display_job(n) for n in never} & set(info.reason.split())
        for a, b in zip(self.real.queues(), self.oracle.queues(), strict=True):
            assert a.model_copy(update={"inadmissible": 0}) == b
        if never:
            event("inadmissible jobs present")


OracleMachine.TestCase.settings = settings(
    max_examples=examples(150),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestInadmissibleNeverBlocks = OracleMachine.TestCase
