"""Property test: the incremental scheduling pass (issue 19: only the queues a change can
have unblocked are examined) decides exactly what a full pass over every queue decides.

Two :class:`~fleetq.admission.Admission` instances take the same random sequence of
enqueues, releases, cancels, tree changes, clock steps, continue-as-new, preemption
passes (``plan_preemptions``), plan timeouts, victims stopping or parked, with fair sharing on
or off; one examines only the queues touched or blocked at a node that freed quota, the
other every queue. After every step their grants, plans and whole persisted states are
equal.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from fleetq.admission import Admission, AdmissionRequest, Grant, QueuePolicy
from fleetq.models import parse_tree
from fleetq.preemption import fair_sharing_weights, plan_preemptions
from tests.core.test_admission_properties import JOB_IDS, NAMESPACES, SHAPES, trees
from tests.core.trees import tree_doc
from tests.tiers import examples


def _nodes(doc: dict[str, Any]) -> list[str]:
    out: list[str] = []
    stack = [doc["spec"]["root"]]
    while stack:
        n = stack.pop()
        out.append(n["name"])
        stack.extend(n.get("children", []))
    return out


@st.composite
def annotated_trees(draw: st.DrawFn) -> dict[str, Any]:
    """:func:`trees` with random preemption, reclaim and fair-share weights."""
    doc = draw(trees())
    notes: dict[str, str] = {}
    if draw(st.booleans()):
        notes["fleetq.io/preemption"] = "LowerPriority"
    if draw(st.booleans()):
        notes["fleetq.io/reclaim"] = draw(st.sampled_from(["LowerPriority", "Any"]))
    if draw(st.booleans()):
        weighted = draw(st.lists(st.sampled_from(_nodes(doc)), unique=True, max_size=3))
        notes["fleetq.io/fair-share-weight"] = ",".join(
            f"{n}={draw(st.sampled_from(['0.5', '2', '3']))}" for n in weighted
        )
    doc["metadata"]["annotations"] = notes
    return doc


def _root_bound(mins: bool) -> dict[str, Any]:
    """Leaves limited only by their parents and the root: a release anywhere can let a
    queue of any other leaf in."""
    def leaf(name: str, ns: str) -> dict[str, Any]:
        node: dict[str, Any] = {"name": name, "namespaces": [ns]}
        if mins:
            node["min"] = {"cpu": 1}
        return node

    return tree_doc({
        "name": "root", "min": {"cpu": 4}, "max": {"cpu": 4, "nvidia.com/gpu": 3,
                                                   "kube-queue/max-jobs": 5},
        "children": [
            {"name": "p0", "max": {"cpu": 3}, "min": {"cpu": 2},
             "children": [leaf("l0", "ns0"), leaf("l1", "ns1")]},
            {"name": "p1", "max": {"nvidia.com/gpu": 2}, "min": {"cpu": 2},
             "children": [leaf("l2", "ns2"), leaf("l3", "ns3")]},
        ],
    }, "t1")


@st.composite
def contended_trees(draw: st.DrawFn) -> dict[str, Any]:
    """Random trees, or a root-bound one (what random small trees rarely are)."""
    if draw(st.booleans()):
        return draw(annotated_trees())
    doc = _root_bound(draw(st.booleans()))
    if draw(st.booleans()):
        doc["metadata"]["annotations"] = {"fleetq.io/reclaim": "Any",
                                          "fleetq.io/preemption": "LowerPriority"}
    return doc


class IncrementalMachine(RuleBasedStateMachine):
    inc: Admission
    full: Admission

    def _both(self) -> tuple[Admission, Admission]:
        return self.inc, self.full

    def _set_tree(self, doc: dict[str, Any], fair: bool) -> None:
        weights = fair_sharing_weights(parse_tree(doc)) if fair else None
        for a in self._both():
            a.fair_weights = weights

    @initialize(
        tree=contended_trees(),
        policy=st.sampled_from(list(QueuePolicy)),
        starve=st.sampled_from([0.0, 40.0]),
        fair=st.booleans(),
    )
    def setup(self, tree: dict[str, Any], policy: QueuePolicy, starve: float, fair: bool) -> None:
        self.inc = Admission(parse_tree(tree), policy, starve)
        self.full = Admission(parse_tree(tree), policy, starve)
        self.full.incremental = False
        self.fair = fair
        self._set_tree(tree, fair)
        self.now = 0.0

    @rule(
        job=st.sampled_from(JOB_IDS),
        ns=st.sampled_from(NAMESPACES),
        prio=st.integers(0, 2),
        shape=st.sampled_from(SHAPES),
        grace=st.sampled_from([0, 30]),
    )
    def enqueue(self, job: str, ns: str, prio: int, shape: dict[str, int], grace: int) -> None:
        req = AdmissionRequest(
            job_id=job, namespace=ns, priority=prio, request=shape, submitted_at=self.now,
            grace_seconds=grace,
        )
        a, b = (x.enqueue(req, self.now) for x in self._both())
        assert a == b

    @rule()
    def schedule(self) -> None:
        a, b = (x.schedule(self.now) for x in self._both())
        assert a == b

    @rule()
    def schedule_and_preempt(self) -> None:
        self.schedule()
        a, b = (plan_preemptions(x, self.now) for x in self._both())
        assert a == b

    @rule(i=st.integers(0, 30), then_schedule=st.booleans())
    def release(self, i: int, then_schedule: bool) -> None:
        holders = self.inc.holders()
        if holders:
            job = holders[i % len(holders)]
            assert self.inc.release(job) and self.full.release(job)
        if then_schedule:
            self.schedule()

    @rule(i=st.integers(0, 30))
    def victim_stops_and_queues_again(self, i: int) -> None:
        victims = [v for p in self.inc.plans() for v in p.victims]
        if not victims:
            return
        job = victims[i % len(victims)].job_id
        for a in self._both():
            assert a.release(job)
        self.enqueue(job, "ns0", 0, SHAPES[0], 30)

    @rule(i=st.integers(0, 30))
    def tree_parks_a_victim(self, i: int) -> None:
        """The quota workflow purged a victim itself (docs/decisions/023)."""
        victims = [v for p in self.inc.plans() for v in p.victims]
        if victims:
            job = victims[i % len(victims)].job_id
            assert self.inc.park(job) and self.full.park(job)

    @rule(i=st.integers(0, 30), how=st.sampled_from(["requeue", "release", "cancel"]))
    def parked_victim_is_heard_from(self, i: int, how: str) -> None:
        parked = self.inc.parked()
        if not parked:
            return
        job = parked[i % len(parked)]
        if how == "requeue":
            req = AdmissionRequest(job_id=job, namespace="ns0", request=SHAPES[0],
                                   submitted_at=self.now)
            a, b = (x.requeue(req, self.now) for x in self._both())
        else:
            a, b = (getattr(x, how)(job) for x in self._both())
        assert a == b

    @rule(job=st.sampled_from(JOB_IDS))
    def cancel(self, job: str) -> None:
        a, b = (x.cancel(job) for x in self._both())
        assert a == b

    @rule(tree=contended_trees(), fair=st.booleans())
    def replace_tree(self, tree: dict[str, Any], fair: bool) -> None:
        for a in self._both():
            a.replace_tree(parse_tree(tree))
        self._set_tree(tree, fair)

    @rule(dt=st.sampled_from([0.0, 1.0, 30.0, 200.0]))
    def advance(self, dt: float) -> None:
        self.now += dt
        a, b = (x.expire_plans(self.now) for x in self._both())
        assert a == b

    @rule()
    def continue_as_new(self) -> None:
        weights = self.inc.fair_weights
        self.inc = Admission.from_state(self.inc.to_state())
        self.full = Admission.from_state(self.full.to_state())
        self.full.incremental = False
        for a in self._both():
            a.fair_weights = weights

    @invariant()
    def same_decisions(self) -> None:
        if not hasattr(self, "inc"):
            return
        assert self.inc.to_state() == self.full.to_state()
        assert self.inc.preemptors() == self.full.preemptors()
        for job in self.inc.waiting():
            a, b = self.inc.wait_info(job), self.full.wait_info(job)
            assert a == b, (a, b)


TestIncrementalPassEqualsFullPass = IncrementalMachine.TestCase
TestIncrementalPassEqualsFullPass.settings = settings(
    max_examples=examples(250),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def count_picks(a: Any) -> list[str]:
    """The queue nodes ``a`` examines from now on (its ``_pick`` counted), in order."""
    examined: list[str] = []
    original = a._pick

    def counting(q: Any, *args: Any) -> Any:
        examined.append(q.node)
        return original(q, *args)

    a._pick = counting
    return examined


def test_a_release_examines_the_queues_it_can_unblock_not_the_tree() -> None:
    """100 backlogged leaves under 10 parents: a release in one leaf whose parent is
    full re-checks that parent's leaves (blocked there), not the other 90."""
    children = []
    for p in range(10):
        leaves = [
            {"name": f"p{p}-l{i}", "namespaces": [f"p{p}-l{i}"], "max": {"cpu": 8}}
            for i in range(10)
        ]
        children.append({"name": f"p{p}", "max": {"cpu": 8}, "children": leaves})
    doc = tree_doc({"name": "root", "max": {"cpu": 80}, "children": children}, "t")
    a = Admission(parse_tree(doc), QueuePolicy.PRIORITY, 300)
    n = 0
    for p in range(10):
        for i in range(10):
            for _ in range(2):
                n += 1
                a.enqueue(AdmissionRequest(
                    job_id=f"pytorchjob/p{p}-l{i}/j{n}", namespace=f"p{p}-l{i}",
                    request={"cpu": 4000}, submitted_at=float(n)), float(n))
    a.schedule(1000.0)
    examined = count_picks(a)
    holder = next(h for h in a.holders() if "/p3-" in h)
    a.release(holder)
    grants = a.schedule(1001.0)
    assert len(grants) == 1 and grants[0].node.startswith("p3-")
    assert examined and {n.split("-")[0] for n in examined} == {"p3"}
    assert isinstance(grants[0], Grant)


def test_a_small_job_waiting_for_the_root_ranks_as_itself_not_as_its_head() -> None:
    """20 leaves under a full root, each with a high-priority 4-cpu head and a 1-cpu job
    behind it: a 1-cpu release admits the earliest small job (as a full pass does) and
    checks a couple of queues, not every queue whose head outranks it (each head
    indexed the queue's wait for 1 cpu at the root under its own rank: ``bench.sim_scale``
    checked 18 queues a pass that way)."""
    leaves = [{"name": f"l{i}", "namespaces": [f"l{i}"]} for i in range(20)]
    doc = tree_doc({"name": "root", "max": {"cpu": 20}, "children": leaves}, "t")
    inc = Admission(parse_tree(doc), QueuePolicy.PRIORITY, 300)
    full = Admission(parse_tree(doc), QueuePolicy.PRIORITY, 300)
    full.incremental = False
    n = 0
    for prio, cpu in ((0, 1000), (10, 4000), (0, 1000)):  # holders, heads, small jobs
        for i in range(20):
            n += 1
            req = AdmissionRequest(job_id=f"pytorchjob/l{i}/j{n}", namespace=f"l{i}",
                                   priority=prio, request={"cpu": cpu}, submitted_at=float(n))
            assert inc.enqueue(req, float(n)) == full.enqueue(req, float(n))
    assert inc.schedule(100.0) == full.schedule(100.0) == []
    examined = count_picks(inc)
    for a in (inc, full):
        assert a.release("pytorchjob/l7/j8")
    grants = inc.schedule(101.0)
    assert grants == full.schedule(101.0)
    assert [g.job_id for g in grants] == ["pytorchjob/l0/j41"]  # the earliest small job
    assert set(examined) == {"l0", "l7"}, examined  # the freed leaf, the winner
    assert inc.to_state() == full.to_state()


def test_releases_wake_queues_blocked_at_parents_and_the_root() -> None:
    """Seeded random enqueues, releases and passes on root-bound trees (every leaf
    limited only by its parent and the root, so a release in one leaf lets queues of
    other leaves in): the incremental pass grants exactly what a full pass grants."""
    import random

    shapes = [{"cpu": 1000}, {"cpu": 2000}, {"nvidia.com/gpu": 1000, "cpu": 1000}]
    for seed in range(30):
        rng = random.Random(seed)
        doc = _root_bound(mins=seed % 2 == 0)
        inc = Admission(parse_tree(doc), QueuePolicy.PRIORITY, 50.0)
        full = Admission(parse_tree(doc), QueuePolicy.PRIORITY, 50.0)
        full.incremental = False
        for step in range(200):
            now = float(step)
            op = rng.random()
            if op < 0.5:
                ns = f"ns{rng.randrange(4)}"
                req = AdmissionRequest(
                    job_id=f"pytorchjob/{ns}/j{step}", namespace=ns,
                    priority=rng.randrange(3), request=rng.choice(shapes), submitted_at=now,
                )
                assert inc.enqueue(req, now) == full.enqueue(req, now)
            elif op < 0.85 and inc.holders():
                job = rng.choice(inc.holders())
                assert inc.release(job) and full.release(job)
            assert inc.schedule(now) == full.schedule(now), (seed, step)
        assert inc.to_state() == full.to_state()
