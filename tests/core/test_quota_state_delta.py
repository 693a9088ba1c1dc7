"""The quota workflow's continue-as-new carries the state it was restored from plus a
delta of what changed in the run (``fleetq.quota_state.pack_next`` / ``restore``): a run
restored from that chain holds exactly the state a whole pack would have given it.

The random machine of ``test_admission_incremental`` (enqueues, releases, cancels, tree
changes, preemption, plan timeouts, victims queueing again) continues one instance as new
through the chain, the other through a whole pack, and compares whole persisted states,
decisions and wait reasons after every step; the chain itself is checked against
``to_state`` at every continue-as-new.
"""

from __future__ import annotations

import random
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, rule

from fleetq.admission import Admission, AdmissionRequest, AdmissionState, QueuePolicy
from fleetq.models import parse_tree
from fleetq.quota_state import _frames, pack_next, pack_state, restore, unpack_carried
from tests.core.test_admission_incremental import IncrementalMachine, contended_trees
from tests.tiers import examples


def _normal(state: AdmissionState) -> AdmissionState:
    """``state`` as :meth:`Admission.to_state` numbers shapes and namespaces."""
    return Admission.from_state(state).to_state()


class CarriedMachine(IncrementalMachine):
    """``inc`` continues as new as the quota workflow does (restored state + deltas,
    a whole pack when the deltas pass ``share``); ``full`` from a whole pack."""

    @initialize(
        tree=contended_trees(),
        policy=st.sampled_from(list(QueuePolicy)),
        starve=st.sampled_from([0.0, 40.0]),
        fair=st.booleans(),
        share=st.sampled_from([0.0, 1.0, float("inf")]),
    )
    def setup_carried(
        self, tree: dict[str, Any], policy: QueuePolicy, starve: float, fair: bool,
        share: float,
    ) -> None:
        self.setup(tree, policy, starve, fair)
        self.doc = tree
        self.share = share
        self.chain = 1
        self.inc, _ = restore(pack_state(self.inc.to_state(), tree))
        self.inc.fair_weights = self.full.fair_weights

    @rule(tree=contended_trees(), fair=st.booleans())
    def replace_tree(self, tree: dict[str, Any], fair: bool) -> None:
        super().replace_tree(tree, fair)
        self.doc = tree

    @rule()
    def continue_as_new(self) -> None:
        weights = self.inc.fair_weights
        expected = self.inc.to_state()
        carried = pack_next(self.inc, self.doc, self.share)
        state, manifest = unpack_carried(carried)
        assert manifest == self.doc
        assert _normal(state) == expected
        frames = len(_frames(carried))
        assert frames in (1, self.chain + 1)  # a whole pack, or one more delta
        if self.share == float("inf") and self.inc.journal is not None:
            assert frames == self.chain + 1
        self.chain = frames
        self.inc, doc = restore(carried)
        assert doc == self.doc
        self.full = Admission.from_state(unpack_carried(pack_state(self.full.to_state()))[0])
        self.full.incremental = False
        for a in self._both():
            a.fair_weights = weights


TestCarriedChainEqualsWholePack = CarriedMachine.TestCase
TestCarriedChainEqualsWholePack.settings = settings(
    max_examples=examples(200),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def _backlog(jobs: int) -> tuple[Admission, dict[str, Any]]:
    """Two leaves under a full root, ``jobs`` waiting in each (ids with random parts,
    as real ones have)."""
    doc = {
        "apiVersion": "scheduling.sigs.k8s.io/v1beta1",
        "kind": "ElasticQuotaTree",
        "metadata": {"name": "t", "namespace": "kube-system"},
        "spec": {"root": {"name": "root", "max": {"cpu": 8}, "children": [
            {"name": f"team{i}", "namespaces": [f"ns{i}"], "max": {"cpu": 8}}
            for i in range(2)
        ]}},
    }
    a = Admission(parse_tree(doc), QueuePolicy.PRIORITY, 60)
    rng = random.Random(jobs)
    for n in range(jobs):
        for i in range(2):
            a.enqueue(AdmissionRequest(
                job_id=f"pytorchjob/ns{i}/train-{n}-{rng.getrandbits(32):08x}", namespace=f"ns{i}",
                priority=n % 3, request={"cpu": 1000 * (1 + n % 2)}, submitted_at=n + 0.25,
            ), float(n))
    return a, doc


def test_a_run_carries_what_changed_not_the_whole_backlog_again() -> None:
    """2,000 waiting jobs, a run that admits and queues a few: the next run's input is
    the previous one with a delta a small fraction of the whole state, and restores to
    the same state (holders named by where they waited, skip times, new jobs)."""
    a, doc = _backlog(1000)
    carried = pack_state(a.to_state(), doc)
    b, manifest = restore(carried)
    assert manifest == doc
    b.release(b.holders()[0])  # 1 cpu free: a 1-cpu job goes past the 2-cpu head
    grants = [g.job_id for g in b.schedule(100.0)]
    assert grants
    delta = b.to_delta()
    assert delta is not None and delta.skips  # a restored job got a skip time
    b.release(grants[0])
    b.cancel(b.waiting()[500])
    b.enqueue(AdmissionRequest(
        job_id="pytorchjob/ns0/late", namespace="ns0", priority=5, request={"cpu": 1000},
        submitted_at=200.0,
    ), 200.0)
    b.schedule(201.0)
    nxt = pack_next(b, manifest)
    assert nxt.startswith(carried)
    whole, frame = _frames(nxt)
    assert len(frame) * 10 < len(whole)
    assert _normal(unpack_carried(nxt)[0]) == b.to_state()
    c, _ = restore(nxt)
    assert c.to_state() == b.to_state()
    assert c.schedule(300.0) == b.schedule(300.0)


def test_a_new_tree_or_a_long_chain_packs_the_whole_state_again() -> None:
    a, doc = _backlog(50)
    b, manifest = restore(pack_state(a.to_state(), doc))
    b.schedule(100.0)
    assert len(_frames(pack_next(b, manifest))) == 2
    assert len(_frames(pack_next(b, manifest, share=0.0))) == 1  # deltas past the share
    other = {**doc, "metadata": {"name": "t2", "namespace": "kube-system"}}
    assert len(_frames(pack_next(b, other))) == 1  # not the manifest carried
    b.replace_tree(parse_tree(doc))
    assert b.journal is None
    whole = pack_next(b, manifest)
    assert len(_frames(whole)) == 1
    assert _normal(unpack_carried(whole)[0]) == b.to_state()
