"""Property tests: random sequences of enqueue / schedule / release / cancel /
replace_tree / continue-as-new against invariants and a naive reference model.

Invariants checked after every step:

* usage of every node == sum of the requests of the admitted jobs charged in its subtree
  (namespace -> leaf, else root, recomputed from the tree manifest, not from the code);
* limits, given tree replacement: for every node N and resource r with
  ``usage(N)[r] > max(N)[r]``, no holder in N's subtree that requests r was admitted
  after the last ``replace_tree`` (over-max usage is only ever quota held from before a
  tree change); with no replacement this is simply ``usage <= max`` everywhere, which
  includes ``kube-queue/max-jobs``;
* no job is both waiting and admitted; a grant only goes to a job that was waiting;
* a job whose request exceeds the ``max`` of a node of its chain is inadmissible: in no
  queue order, not counted, never granted, and queued again (original key) by the tree
  change that raises that ``max``;
* each queue's positions are 1..n in (priority desc, submit time asc, job id) order;
* grants, holders, waiting jobs and positions equal those of a naive O(n^2) model of the
  same rules (so the bisect/heap/lower-bound shortcuts change nothing), and a copy
  restored from the serialized state carries on identically.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from fleetq.admission import (
    DEFAULT_GRACE_SECONDS,
    Admission,
    AdmissionRequest,
    AdmissionState,
    Grant,
    PendingPlan,
    PlannedVictim,
    QueuePolicy,
)
from fleetq.models import parse_tree
from fleetq.quota_state import pack_state, unpack_carried, unpack_state
from fleetq.resources import parse_resources
from tests.core.trees import tree_doc
from tests.tiers import examples

GPU = "nvidia.com/gpu"
JOBS = "kube-queue/max-jobs"
NAMESPACES = [f"ns{i}" for i in range(5)]  # ns4 is never attached: it goes to the root
JOB_IDS = [f"pytorchjob/ns/j{i}" for i in range(14)]
SHAPES = [
    {JOBS: 1000, "cpu": 1000},
    {JOBS: 1000, "cpu": 3000},
    {JOBS: 1000, "cpu": 1000, GPU: 1000},
    {JOBS: 1000, GPU: 2000},
    {JOBS: 1000, "cpu": 2000, GPU: 3000},
]


@st.composite
def trees(draw: st.DrawFn) -> dict[str, Any]:
    """Random valid ElasticQuotaTree manifests with tight limits (so that jobs contend):
    up to 3 children with up to 2 grandchildren each; a limit may be absent (unlimited);
    mins only under a root min; namespaces only on leaves."""
    counter = iter(range(100))
    free_ns = list(NAMESPACES[:4])
    guarantee = draw(st.booleans())

    def limits(lo: dict[str, int], hi: dict[str, int]) -> dict[str, int]:
        return {
            res: draw(st.integers(lo.get(res, 0), top))
            for res, top in hi.items()
            if res in lo or draw(st.integers(0, 3))
        }

    def leaf(node: dict[str, Any]) -> dict[str, Any]:
        n = draw(st.integers(0, min(2, len(free_ns))))
        node["namespaces"] = [free_ns.pop(0) for _ in range(n)]
        return node

    small = {"cpu": 6, GPU: 4, JOBS: 5}
    root: dict[str, Any] = {
        "name": "root",
        "max": limits({JOBS: 3, GPU: 2}, {"cpu": 12, GPU: 4, JOBS: 8}),
    }
    if guarantee:
        root["min"] = {"cpu": 6}
        root["max"]["cpu"] = max(6, root["max"].get("cpu", 6))
    children = []
    for _ in range(draw(st.integers(0, 3))):
        child: dict[str, Any] = {"name": f"n{next(counter)}", "max": limits({}, small)}
        grand = draw(st.integers(0, 2))
        if grand:
            child["children"] = [
                leaf({"name": f"n{next(counter)}", "max": limits({}, small)}) for _ in range(grand)
            ]
        else:
            leaf(child)
            if guarantee and draw(st.booleans()):
                child["min"] = {"cpu": 2}
                child["max"]["cpu"] = max(2, child["max"].get("cpu", 2))
        children.append(child)
    root["children"] = children
    if not children:
        leaf(root)
    return tree_doc(root, draw(st.sampled_from(["t1", "t2"])))


# --------------------------------------------------------------------------- reference


@dataclass
class RefNode:
    name: str
    parent: str | None
    min: dict[str, int]
    max: dict[str, int]


@dataclass
class RefTree:
    nodes: dict[str, RefNode] = field(default_factory=dict)
    ns_leaf: dict[str, str] = field(default_factory=dict)
    root: str = "root"

    @classmethod
    def of(cls, doc: dict[str, Any]) -> RefTree:
        t = cls()

        def walk(n: dict[str, Any], parent: str | None) -> None:
            t.nodes[n["name"]] = RefNode(
                n["name"], parent, parse_resources(n.get("min")), parse_resources(n.get("max"))
            )
            for ns in n.get("namespaces", []):
                t.ns_leaf[ns] = n["name"]
            for c in n.get("children", []):
                walk(c, n["name"])

        walk(doc["spec"]["root"], None)
        t.root = doc["spec"]["root"]["name"]
        return t

    def leaf(self, ns: str) -> str:
        return self.ns_leaf.get(ns, self.root)

    def chain(self, node: str) -> list[str]:
        out = [node]
        while (p := self.nodes[out[-1]].parent) is not None:
            out.append(p)
        return out


@dataclass
class RefJob:
    job_id: str
    ns: str
    prio: int
    at: float
    req: dict[str, int]
    skip: float | None = None

    @property
    def key(self) -> tuple[int, float, str]:
        return (-self.prio, self.at, self.job_id)


class Reference:
    """The admission rules written the obvious, slow way."""

    def __init__(self, tree: dict[str, Any], policy: QueuePolicy, starve: float) -> None:
        self.tree = RefTree.of(tree)
        self.policy = policy
        self.starve = starve
        self.waiting: dict[str, RefJob] = {}
        self.holders: dict[str, RefJob] = {}
        self.dirty = False
        self.starving: set[str] = set()

    def usage(self, node: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for j in self.holders.values():
            if node in self.tree.chain(self.tree.leaf(j.ns)):
                for k, v in j.req.items():
                    out[k] = out.get(k, 0) + v
        return {k: v for k, v in out.items() if v}

    def fits(self, node: str, req: dict[str, int]) -> bool:
        for n in self.tree.chain(node):
            use, mx = self.usage(n), self.tree.nodes[n].max
            if any(v > 0 and k in mx and use.get(k, 0) + v > mx[k] for k, v in req.items()):
                return False
        return True

    def never_fits(self, j: RefJob) -> str | None:
        """The lowest node of ``j``'s chain whose ``max`` is below its request."""
        for n in self.tree.chain(self.tree.leaf(j.ns)):
            mx = self.tree.nodes[n].max
            if any(v > 0 and k in mx and v > mx[k] for k, v in j.req.items()):
                return n
        return None

    def inadmissible(self) -> dict[str, str]:
        return {
            j.job_id: n for j in self.waiting.values() if (n := self.never_fits(j)) is not None
        }

    def queue(self, node: str) -> list[RefJob]:
        return sorted(
            (
                j
                for j in self.waiting.values()
                if self.tree.leaf(j.ns) == node and self.never_fits(j) is None
            ),
            key=lambda j: j.key,
        )

    def replace_tree(self, doc: dict[str, Any]) -> None:
        self.tree = RefTree.of(doc)
        self.dirty = True
        for job_id in self.inadmissible():  # never passed over for an admissible job
            self.waiting[job_id].skip = None
            self.starving.discard(job_id)

    def promote(self, node: str, now: float) -> None:
        for j in self.queue(node):
            if j.skip is not None and now - j.skip > self.starve:
                self.starving.add(j.job_id)

    def pick(self, node: str) -> RefJob | None:
        q = self.queue(node)
        if self.policy is QueuePolicy.BLOCK:
            return q[0] if q and self.fits(node, q[0].req) else None
        for j in q:
            if self.fits(node, j.req):
                return j
            if j.job_id in self.starving:
                return None
        return None

    def below_min(self, node: str) -> bool:
        mn = {k: v for k, v in self.tree.nodes[node].min.items() if v > 0}
        use = self.usage(node)
        return bool(mn) and all(use.get(k, 0) < v for k, v in mn.items())

    def admit(self, j: RefJob, now: float) -> str:
        node = self.tree.leaf(j.ns)
        if self.policy is QueuePolicy.PRIORITY:
            for o in self.queue(node):
                if o.key < j.key:
                    event("overtaken")
                if o.key < j.key and o.skip is None:
                    o.skip = now
        if self.below_min(node):
            event("below min")
        if any(o.job_id in self.starving for o in self.queue(node)):
            event("admitted with starving in queue")
        del self.waiting[j.job_id]
        self.starving.discard(j.job_id)
        self.holders[j.job_id] = j
        return j.job_id

    def enqueue(self, j: RefJob, now: float) -> str | None:
        if j.job_id in self.holders:
            return j.job_id
        if j.job_id in self.waiting:
            return None
        self.waiting[j.job_id] = j
        if self.never_fits(j) is not None:
            event("inadmissible at enqueue")
            return None
        node = self.tree.leaf(j.ns)
        self.promote(node, now)
        if not self.dirty and self.pick(node) is j:
            return self.admit(j, now)
        return None

    def schedule(self, now: float) -> list[str]:
        self.dirty = False
        for node in self.tree.nodes:
            self.promote(node, now)
        if self.starving:
            event("starving job present")
        out: list[str] = []
        while True:
            best = None
            for node in self.tree.nodes:
                j = self.pick(node)
                if j is not None:
                    rank = (0 if self.below_min(node) else 1, j.key)
                    if best is None or rank < best[0]:
                        best = (rank, j)
            if best is None:
                return out
            out.append(self.admit(best[1], now))

    def positions(self) -> dict[str, tuple[str, int]]:
        out = {}
        for node in self.tree.nodes:
            for i, j in enumerate(self.queue(node), 1):
                out[j.job_id] = (node, i)
        return out


# --------------------------------------------------------------------------- machine


ONE_GPU_LEAF = tree_doc(
    {
        "name": "root",
        "max": {GPU: 4},
        "children": [{"name": "team", "max": {JOBS: 6}, "namespaces": NAMESPACES[:4]}],
    },
    "gpu",
)


class Machine(RuleBasedStateMachine):
    """Drives an Admission and the Reference side by side; subclasses pick the trees."""

    a: Admission
    ref: Reference
    replace_trees = True

    def start(self, tree: dict[str, Any], policy: QueuePolicy, starve: float) -> None:
        self.a = Admission(parse_tree(tree), policy, starve)
        self.ref = Reference(tree, policy, starve)
        self.now = 0.0
        self.generation = 0
        self.admitted_gen: dict[str, int] = {}

    def _granted(self, grants: list[Grant], expected: list[str]) -> None:
        assert [g.job_id for g in grants] == expected
        if grants:
            event(f"granted {min(len(grants), 3)}")
        for g in grants:
            assert g.job_id not in self.admitted_gen, f"{g.job_id} granted twice"
            assert g.node == self.ref.tree.leaf(self.ref.holders[g.job_id].ns)
            self.admitted_gen[g.job_id] = self.generation

    @rule(
        job=st.sampled_from(JOB_IDS),
        ns=st.sampled_from(NAMESPACES),
        prio=st.integers(0, 2),
        shape=st.sampled_from(SHAPES),
    )
    def enqueue(self, job: str, ns: str, prio: int, shape: dict[str, int]) -> None:
        was_waiting = job in self.ref.waiting
        req = AdmissionRequest(
            job_id=job, namespace=ns, priority=prio, request=shape, submitted_at=self.now
        )
        known = self.ref.holders.get(job) or self.ref.waiting.get(job)
        expected = self.ref.enqueue(RefJob(job, ns, prio, self.now, dict(shape)), self.now)
        out = self.a.enqueue(req, self.now)
        if isinstance(out, Grant):
            assert expected == job
            if known is None:
                self._granted([out], [job])
        else:
            assert expected is None, f"expected {job} admitted, got {out}"
            assert out.job_id == job
            assert was_waiting or known is None

    @rule(
        job=st.sampled_from(JOB_IDS),
        ns=st.sampled_from(NAMESPACES),
        shape=st.sampled_from(SHAPES),
    )
    def enqueue_more(self, job: str, ns: str, shape: dict[str, int]) -> None:
        self.enqueue(job, ns, 0, shape)

    @rule()
    def schedule(self) -> None:
        expected = self.ref.schedule(self.now)
        self._granted(self.a.schedule(self.now), expected)

    @rule(job=st.sampled_from(JOB_IDS))
    def release(self, job: str) -> None:
        held = self.ref.holders.pop(job, None) is not None
        if held:
            self.ref.dirty = True
            del self.admitted_gen[job]
        assert self.a.release(job) is held
        assert self.a.release(job) is False

    @precondition(lambda self: bool(self.ref.holders))
    @rule(i=st.integers(0, 20))
    def release_holder(self, i: int) -> None:
        holders = list(self.ref.holders)
        self.release(holders[i % len(holders)])

    @precondition(lambda self: bool(self.ref.holders))
    @rule(i=st.integers(0, 20))
    def release_and_schedule(self, i: int) -> None:
        self.release_holder(i)
        self.schedule()

    @rule(job=st.sampled_from(JOB_IDS))
    def cancel(self, job: str) -> None:
        inadmissible = job in self.ref.inadmissible()
        waiting = self.ref.waiting.pop(job, None) is not None
        if waiting and not inadmissible:  # (an inadmissible job changes no queue order)
            self.ref.dirty = True
            self.ref.starving.discard(job)
        assert self.a.cancel(job) is waiting

    @precondition(lambda self: self.replace_trees)
    @rule(tree=trees())
    def replace_tree(self, tree: dict[str, Any]) -> None:
        before = set(self.ref.inadmissible())
        self.a.replace_tree(parse_tree(tree))
        self.ref.replace_tree(tree)
        if before - set(self.ref.inadmissible()):
            event("inadmissible queued again")
        self.generation += 1

    @rule(dt=st.sampled_from([0.0, 1.0, 30.0, 700.0]))
    def advance(self, dt: float) -> None:
        self.now += dt

    @rule()
    def continue_as_new(self) -> None:
        # as the quota workflow carries it (pack_state)
        state = self.a.to_state()
        packed = pack_state(state)
        assert unpack_state(packed) == state
        restored = Admission.from_state(unpack_state(packed))
        assert restored.to_state() == state
        self.a = restored

    @precondition(lambda self: hasattr(self, "a"))
    @invariant()
    def matches_reference(self) -> None:
        assert self.a.holders() == list(self.ref.holders)
        never = self.ref.inadmissible()
        assert set(self.a.waiting()) == set(self.ref.waiting) - set(never)
        assert {j: w.node for j, w in self.a.inadmissible().items()} == never
        assert not set(self.a.holders()) & set(self.a.waiting())
        assert self.a.counts() == (len(self.a.holders()), len(self.a.waiting()))
        for job, node in never.items():
            info = self.a.wait_info(job)
            assert info is not None and info.inadmissible is not None
            assert info.position == 0
            assert info.reason == info.inadmissible.message
            assert info.reason.startswith(f"quota {node}: ")
        positions = self.ref.positions()
        for job in self.a.waiting():
            info = self.a.wait_info(job)
            assert info is not None
            assert (info.queue, info.position) == (
                self.a.queue_for(self.ref.waiting[job].ns),
                positions[job][1],
            )
        for q in self.a.queues():
            assert q.length == sum(1 for n, _ in positions.values() if n == q.node)
            assert q.inadmissible == sum(
                1 for j in never if self.ref.tree.leaf(self.ref.waiting[j].ns) == q.node
            )

    @precondition(lambda self: hasattr(self, "a"))
    @invariant()
    def usage_is_sum_of_subtree_holders_and_within_max(self) -> None:
        tree = self.ref.tree
        for name, node in tree.nodes.items():
            use = self.a.usage(name)
            assert use == self.ref.usage(name)
            subtree = [j for j in self.ref.holders.values() if name in tree.chain(tree.leaf(j.ns))]
            assert use.get(JOBS, 0) == 1000 * len(subtree)
            for r, cap in node.max.items():
                if use.get(r, 0) > cap:
                    assert all(
                        self.admitted_gen[j.job_id] < self.generation
                        for j in subtree
                        if j.req.get(r, 0) > 0
                    ), f"{name}: {r} {use[r]} > {cap} with a job admitted under this tree"


class AdmissionMachine(Machine):
    """Random trees, both policies, tree replacement."""

    @initialize(
        tree=trees(),
        policy=st.sampled_from(list(QueuePolicy)),
        starve=st.sampled_from([0.0, 40.0]),
    )
    def setup(self, tree: dict[str, Any], policy: QueuePolicy, starve: float) -> None:
        self.start(tree, policy, starve)


GUARANTEED_AND_BORROWER = tree_doc(
    {
        "name": "root",
        "min": {"cpu": 4},
        "max": {"cpu": 8, JOBS: 3},
        "children": [
            {"name": "g", "min": {"cpu": 3}, "namespaces": NAMESPACES[:2]},
            {"name": "b", "namespaces": NAMESPACES[2:4]},
        ],
    },
    "min",
)


class FixedTreeMachine(Machine):
    """Hand-made contended trees: a GPU-bound leaf where big jobs are overtaken and then
    starve, and a guaranteed leaf next to a borrower sharing a scarce root."""

    replace_trees = False

    @initialize(
        tree=st.sampled_from([ONE_GPU_LEAF, GUARANTEED_AND_BORROWER]),
        policy=st.sampled_from(list(QueuePolicy)),
        starve=st.sampled_from([0.0, 40.0]),
    )
    def setup(self, tree: dict[str, Any], policy: QueuePolicy, starve: float) -> None:
        self.start(tree, policy, starve)


SETTINGS = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
AdmissionMachine.TestCase.settings = SETTINGS
FixedTreeMachine.TestCase.settings = SETTINGS
TestAdmissionProperties = AdmissionMachine.TestCase
TestFixedTreeProperties = FixedTreeMachine.TestCase


# ------------------------------------------------------------------ packed state formats

#: job ids as ``pytorchjob/<namespace>/<name>``, and anything else a workflow id may be
_IDS = st.one_of(
    st.builds(
        lambda ns, name: f"pytorchjob/{ns}/{name}",
        st.sampled_from(NAMESPACES),
        st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True),
    ),
    st.text(min_size=1, max_size=12),
)
_TIMES = st.one_of(
    st.integers(1_700_000_000_000_000, 1_900_000_000_000_000).map(lambda us: us / 1e6),
    st.floats(allow_nan=False, allow_infinity=False),
)
_POLICY = st.tuples(st.booleans(), st.integers(0, 10_000))
_PRIORITY = st.one_of(st.integers(-1000, 1000), st.integers())


@st.composite
def admission_states(draw: st.DrawFn) -> AdmissionState:
    """Random states as ``to_state`` writes them (unique ids, indices in range), with
    preemption fields, priorities beyond 64 bits and times that are not whole
    microseconds; plus policies of jobs neither waiting nor holding, which ``to_state``
    never writes but a state may carry."""
    ns = draw(st.lists(st.sampled_from(NAMESPACES), min_size=1, max_size=5, unique=True))
    shapes = draw(st.lists(st.sampled_from(SHAPES), min_size=1, max_size=5))
    ids = draw(st.lists(_IDS, max_size=30, unique=True))
    cut = draw(st.integers(0, len(ids)))
    waiting_ids, holder_ids = ids[:cut], ids[cut:]
    index = st.integers(0, len(ns) - 1)
    shape = st.integers(0, len(shapes) - 1)
    w = [
        (j, draw(index), draw(_PRIORITY), draw(_TIMES), draw(shape),
         draw(st.none() | _TIMES))
        for j in waiting_ids
    ]
    h = [(j, draw(index), draw(shape)) for j in holder_ids]
    victim = st.builds(
        PlannedVictim, job_id=_IDS, reason=st.sampled_from(["priority", "reclaim"]),
        message=st.text(max_size=20), priority=_PRIORITY, grace_seconds=st.integers(0, 99),
        node=st.sampled_from(["", "n0", "root"]),
    )
    plan = st.builds(
        PendingPlan, preemptor=_IDS, node=st.sampled_from(["n0", "root"]),
        priority=_PRIORITY, request=st.sampled_from(SHAPES), victims=st.lists(victim, max_size=3),
    )
    return AdmissionState(
        tree=draw(st.none() | trees()),
        policy=draw(st.sampled_from(list(QueuePolicy))),
        starve=draw(st.floats(0, 1e6)),
        shapes=shapes,
        ns=ns,
        w=w,
        h=h,
        hp={
            j: (draw(_PRIORITY), *draw(_POLICY))
            for j in draw(st.lists(st.sampled_from(holder_ids) | _IDS, max_size=8))
        } if holder_ids else {},
        wp={
            j: draw(_POLICY)
            for j in draw(st.lists(st.sampled_from(waiting_ids) | _IDS, max_size=8))
        } if waiting_ids else {},
        p=draw(st.lists(plan, max_size=2)),
        d=draw(st.lists(plan, max_size=2)),
        dirty=draw(st.booleans()),
    )


def without_default_policies(state: AdmissionState) -> AdmissionState:
    """``state`` with no policy entry for a waiting or holding job whose policy is the
    default: the packed state carries those as no entry, which every reader takes as the
    default (``Admission``: ``wp.get(job, ...)``, ``hp.get(job, ...)``)."""
    w_ids, h_ids = {w[0] for w in state.w}, {h[0] for h in state.h}
    return state.model_copy(update={
        "wp": {k: v for k, v in state.wp.items()
               if not (k in w_ids and tuple(v) == (True, DEFAULT_GRACE_SECONDS))},
        "hp": {k: v for k, v in state.hp.items()
               if not (k in h_ids and tuple(v) == (0, True, DEFAULT_GRACE_SECONDS))},
    })


@settings(max_examples=examples(300), deadline=None)
@given(state=admission_states(), manifest=st.none() | trees())
def test_packed_state_unpacks_to_exactly_what_was_packed(
    state: AdmissionState, manifest: dict[str, Any] | None
) -> None:
    expected = without_default_policies(state)
    assert unpack_carried(pack_state(state, manifest)) == (expected, manifest)
    assert unpack_state(pack_state(state)) == expected
