"""Admission rules as a user of the queue sees them: who gets quota, in which order, where
each waiting job stands and why, and what survives a tree change or continue-as-new."""

from __future__ import annotations

import json
import random
import re

import pytest
from pydantic import ValidationError

from fleetq.admission import (
    Admission,
    AdmissionRequest,
    AdmissionState,
    Grant,
    QueuePolicy,
    WaitInfo,
)
from fleetq.messages import QuotaTreeInput
from fleetq.models import parse_tree
from fleetq.quota import SUFFIX_ALPHABET
from fleetq.quota_state import pack_state, unpack_carried, unpack_state
from tests.core.trees import make_tree, walkthrough

GPU = "nvidia.com/gpu"
JOBS = "kube-queue/max-jobs"






def req(
    name: str, ns: str = "default", *, at: float = 0, prio: int = 0, cpu: int = 1, gpu: int = 0
) -> AdmissionRequest:
    request = {JOBS: 1000, "cpu": cpu * 1000}
    if gpu:
        request[GPU] = gpu * 1000
    return AdmissionRequest(
        job_id=f"pytorchjob/{ns}/{name}",
        namespace=ns,
        priority=prio,
        request=request,
        submitted_at=at,
    )


def jid(name: str, ns: str = "default") -> str:
    return f"pytorchjob/{ns}/{name}"


def granted(grants: list[Grant]) -> list[str]:
    return [g.job_id.rsplit("/", 1)[1] for g in grants]


GPU_LEAF = {
    "name": "root",
    "max": {GPU: 16},
    "children": [{"name": "team", "max": {GPU: 16, JOBS: 100}, "namespaces": ["default"]}],
}


# --------------------------------------------------------------------------- walkthrough


def test_walkthrough_one_job_at_a_time_in_child_2() -> None:
    a = Admission(walkthrough())
    first = a.enqueue(req("pytorch-test"), now=0)
    assert isinstance(first, Grant)
    assert first.node == "child-2"
    assert re.fullmatch(f"root-child-2-[{SUFFIX_ALPHABET}]{{5}}", first.queue)

    second = a.enqueue(req("second", at=1), now=1)
    assert second == WaitInfo(
        job_id=jid("second"),
        queue=first.queue,
        position=1,
        reason="quota child-2: kube-queue/max-jobs 1/1 in use",
    )
    assert a.schedule(now=2) == []
    assert a.release(jid("pytorch-test")) is True
    assert a.schedule(now=3) == [Grant(job_id=jid("second"), queue=first.queue, node="child-2")]
    assert a.usage("child-2") == {JOBS: 1000, "cpu": 1000}
    assert a.usage("root") == {JOBS: 1000, "cpu": 1000}


def test_namespace_without_leaf_waits_in_root_queue_checked_against_root_only() -> None:
    a = Admission(walkthrough())
    a.enqueue(req("in-child"), now=0)
    g = a.enqueue(req("x", ns="other"), now=0)  # child-2's max-jobs 1 does not apply
    assert isinstance(g, Grant) and g.node == "root"
    assert re.fullmatch(f"root-[{SUFFIX_ALPHABET}]{{5}}", g.queue)
    assert a.queue_for("other") == g.queue
    assert a.usage("root")[JOBS] == 2000
    assert a.usage("child-2")[JOBS] == 1000


# --------------------------------------------------------------------------- idempotence


def test_enqueue_is_idempotent_for_waiting_and_admitted_jobs() -> None:
    a = Admission(walkthrough())
    g = a.enqueue(req("a"), now=0)
    w = a.enqueue(req("b", at=1), now=1)
    assert a.enqueue(req("a", cpu=99), now=5) == g
    assert a.enqueue(req("b", prio=50), now=5) == w
    assert a.waiting() == [jid("b")]
    assert a.holders() == [jid("a")]
    assert a.usage("child-2")["cpu"] == 1000


def test_release_and_cancel_are_idempotent_and_only_touch_their_own_state() -> None:
    a = Admission(walkthrough())
    a.enqueue(req("a"), now=0)
    a.enqueue(req("b", at=1), now=1)
    assert a.cancel(jid("a")) is False  # admitted, not waiting
    assert a.release(jid("b")) is False  # waiting, holds nothing
    assert a.cancel(jid("b")) is True
    assert a.cancel(jid("b")) is False
    assert a.wait_info(jid("b")) is None
    assert a.release(jid("a")) is True
    assert a.release(jid("a")) is False
    assert a.usage("root") == {}
    assert a.schedule(now=2) == []


def test_released_job_can_be_queued_again() -> None:
    a = Admission(walkthrough())
    a.enqueue(req("a"), now=0)
    a.release(jid("a"))
    assert a.schedule(1) == []
    assert isinstance(a.enqueue(req("a", at=2), now=2), Grant)


# --------------------------------------------------------------------------- order


def test_queue_order_priority_then_submit_time_then_job_id() -> None:
    a = Admission(walkthrough())
    a.enqueue(req("running"), now=0)
    a.enqueue(req("low-early", at=1), now=1)
    a.enqueue(req("high-late", at=5, prio=10), now=5)
    a.enqueue(req("low-late-b", at=3), now=3)
    a.enqueue(req("low-late-a", at=3), now=3)
    positions = {j: a.wait_info(j).position for j in a.waiting()}  # type: ignore[union-attr]
    assert positions == {
        jid("high-late"): 1,
        jid("low-early"): 2,
        jid("low-late-a"): 3,
        jid("low-late-b"): 4,
    }
    order = []
    for t in range(6, 10):
        a.release(a.holders()[0])
        order += granted(a.schedule(now=t))
    assert order == ["high-late", "low-early", "low-late-a", "low-late-b"]


def test_priority_policy_lets_smaller_jobs_pass_a_head_that_does_not_fit() -> None:
    a = Admission(make_tree(GPU_LEAF))
    a.enqueue(req("holder", gpu=10), now=0)
    big = a.enqueue(req("big", at=1, prio=5, gpu=8), now=1)
    assert isinstance(big, WaitInfo)
    assert big.reason == "quota team: nvidia.com/gpu needs 8, 6 free of max 16"
    small = a.enqueue(req("small", at=2, gpu=2), now=2)
    assert isinstance(small, Grant)
    info = a.wait_info(jid("big"))
    assert info is not None and info.position == 1
    assert info.reason == "quota team: nvidia.com/gpu needs 8, 4 free of max 16"


def test_block_policy_head_blocks_its_queue() -> None:
    a = Admission(make_tree(GPU_LEAF), QueuePolicy.BLOCK)
    a.enqueue(req("holder", gpu=10), now=0)
    a.enqueue(req("big", at=1, prio=5, gpu=8), now=1)
    small = a.enqueue(req("small", at=2, gpu=2), now=2)
    assert small == WaitInfo(
        job_id=jid("small"),
        queue=a.queue_for("default"),
        position=2,
        reason="behind higher-priority job default/big (Block)",
    )
    a.enqueue(req("same-prio", at=3, prio=5, gpu=1), now=3)
    assert a.wait_info(jid("same-prio")).reason == "behind earlier job default/big (Block)"  # type: ignore[union-attr]
    assert a.schedule(now=4) == []
    a.release(jid("holder"))
    assert granted(a.schedule(now=5)) == ["big", "same-prio", "small"]


def test_block_policy_only_blocks_its_own_queue() -> None:
    tree = make_tree(
        {
            "name": "root",
            "max": {GPU: 16},
            "children": [
                {"name": "a", "max": {GPU: 4}, "namespaces": ["ns-a"]},
                {"name": "b", "namespaces": ["ns-b"]},
            ],
        }
    )
    a = Admission(tree, QueuePolicy.BLOCK)
    assert isinstance(a.enqueue(req("too-big", ns="ns-a", gpu=8), now=0), WaitInfo)
    assert isinstance(a.enqueue(req("other", ns="ns-b", gpu=8, at=1), now=1), Grant)


def test_starving_job_is_not_overtaken_after_the_bound() -> None:
    a = Admission(make_tree(GPU_LEAF), starvation_seconds=60)
    a.enqueue(req("holder", gpu=12), now=0)
    a.enqueue(req("big", at=1, prio=5, gpu=8), now=1)
    assert isinstance(a.enqueue(req("s1", at=2, gpu=4), now=2), Grant)  # big skipped at t=2
    a.enqueue(req("s2", at=3, gpu=4), now=3)
    a.enqueue(req("s3", at=4, gpu=4), now=4)
    # before the bound, smaller jobs still pass
    a.release(jid("s1"))
    assert granted(a.schedule(now=50)) == ["s2"]
    # 60 s after the first skip big starves: room for s3 but it must wait behind big
    a.release(jid("s2"))
    assert a.schedule(now=62.5) == []
    info = a.wait_info(jid("s3"))
    assert info is not None and info.reason == "behind starving job default/big"
    assert a.wait_info(jid("big")).reason == (  # type: ignore[union-attr]
        "quota team: nvidia.com/gpu needs 8, 4 free of max 16"
    )
    # a job ahead of the starving one may still go first
    assert isinstance(a.enqueue(req("urgent", at=70, prio=9, gpu=1), now=70), Grant)
    assert isinstance(a.enqueue(req("s4", at=71, gpu=1), now=71), WaitInfo)
    a.release(jid("holder"))
    assert granted(a.schedule(now=80)) == ["big", "s3", "s4"]


def test_starvation_bound_defaults_to_five_minutes() -> None:
    """300 s since issue 18's measurements (it was 600): a tree without the annotation,
    a fresh quota workflow's input and a trace without starvationSeconds all get it."""
    assert Admission(make_tree(GPU_LEAF)).starvation_seconds == 300
    assert QuotaTreeInput().starvation_seconds == 300
    assert make_tree(GPU_LEAF).starvation_seconds == 300
    a = Admission(make_tree(GPU_LEAF))
    a.enqueue(req("holder", gpu=12), now=0)
    a.enqueue(req("big", at=1, gpu=8), now=1)
    a.enqueue(req("s1", at=2, gpu=4), now=2)  # admitted; big skipped at t=2
    a.enqueue(req("s2", at=3, gpu=4), now=3)
    a.release(jid("s1"))
    assert granted(a.schedule(now=302)) == ["s2"]  # skipped for exactly 300 s: not yet
    a.release(jid("s2"))
    assert isinstance(a.enqueue(req("s3", at=4, gpu=4), now=302.5), WaitInfo)
    assert a.wait_info(jid("s3")).reason == "behind starving job default/big"  # type: ignore[union-attr]


def test_node_below_min_is_served_before_borrowers() -> None:
    tree = make_tree(
        {
            "name": "root",
            "max": {JOBS: 2},
            "min": {"cpu": 8},
            "children": [
                {"name": "guaranteed", "min": {"cpu": 4}, "namespaces": ["ns-g"]},
                {"name": "borrower", "namespaces": ["ns-b"]},
            ],
        }
    )
    a = Admission(tree)
    a.enqueue(req("r1", ns="ns-b"), now=0)
    a.enqueue(req("r2", ns="ns-b"), now=0)
    # both wait for a root max-jobs slot; the borrower's job is older and higher priority
    a.enqueue(req("b-high", ns="ns-b", at=1, prio=100), now=1)
    a.enqueue(req("g-low", ns="ns-g", at=2, cpu=4), now=2)
    a.enqueue(req("g-second", ns="ns-g", at=3), now=3)
    a.release(jid("r1", "ns-b"))
    assert granted(a.schedule(now=4)) == ["g-low"]
    # now guaranteed uses its whole min (4 cpu): it borrows like the others, priority decides
    a.release(jid("r2", "ns-b"))
    assert granted(a.schedule(now=5)) == ["b-high"]


def test_schedule_admits_everything_that_fits_in_one_pass() -> None:
    a = Admission(make_tree(GPU_LEAF))
    a.enqueue(req("holder", gpu=16), now=0)
    for i in range(5):
        a.enqueue(req(f"j{i}", at=i + 1, gpu=4), now=i + 1)
    a.release(jid("holder"))
    assert granted(a.schedule(now=10)) == ["j0", "j1", "j2", "j3"]
    assert a.wait_info(jid("j4")).reason == "quota team: nvidia.com/gpu needs 4, 0 free of max 16"  # type: ignore[union-attr]


def test_enqueue_while_a_pass_is_pending_does_not_overtake() -> None:
    a = Admission(walkthrough())
    a.enqueue(req("running"), now=0)
    a.enqueue(req("waiting", at=1, prio=5), now=1)
    a.release(jid("running"))  # the caller has not run schedule() yet
    late = a.enqueue(req("late", at=2), now=2)
    assert isinstance(late, WaitInfo) and late.position == 2
    assert a.wait_info(jid("waiting")).reason == "fits; admitted at the next scheduling pass"  # type: ignore[union-attr]
    assert granted(a.schedule(now=3)) == ["waiting"]


# --------------------------------------------------------------------------- tree change


def test_replace_tree_keeps_held_quota_and_applies_new_limits_to_new_jobs() -> None:
    a = Admission(make_tree(GPU_LEAF))
    a.enqueue(req("a", gpu=8), now=0)
    a.enqueue(req("b", at=1, gpu=6), now=1)
    a.enqueue(req("c", at=2, gpu=1), now=2)
    a.enqueue(req("d", at=3, gpu=4), now=3)
    assert a.waiting() == [jid("d")]
    smaller = {
        "name": "root",
        "max": {GPU: 12},
        "children": [{"name": "team", "max": {GPU: 12, JOBS: 100}, "namespaces": ["default"]}],
    }
    a.replace_tree(make_tree(smaller))
    assert a.holders() == [jid("a"), jid("b"), jid("c")]
    assert a.usage("root")[GPU] == 15000  # over the new max of 12: nobody is evicted
    assert a.schedule(now=4) == []
    assert a.wait_info(jid("d")).reason == (  # type: ignore[union-attr]
        "quota team: nvidia.com/gpu needs 4, 0 free of max 12"
    )
    a.release(jid("a"))  # 7 in use: 4 more fit under 12
    assert granted(a.schedule(now=5)) == ["d"]


def test_replace_tree_moves_jobs_of_removed_nodes_to_their_new_queue() -> None:
    a = Admission(walkthrough())
    a.enqueue(req("running"), now=0)
    a.enqueue(req("w1", at=1), now=1)
    a.enqueue(req("w2", at=2), now=2)
    old_queue = a.queue_for("default")
    renamed = make_tree(
        {
            "name": "root",
            "children": [
                {"name": "other", "max": {JOBS: 1}, "namespaces": ["x"]},
                {"name": "team", "max": {JOBS: 2}, "namespaces": ["default"]},
            ],
        },
        name="elasticquotatree",
    )
    a.replace_tree(renamed)
    assert a.queue_for("default") != old_queue
    assert [q.node for q in a.queues()] == ["root", "other", "team"]
    assert a.usage("team") == {JOBS: 1000, "cpu": 1000}  # holder re-charged to the new leaf
    info = a.wait_info(jid("w1"))
    assert info is not None and info.queue == a.queue_for("default") and info.position == 1
    assert granted(a.schedule(now=3)) == ["w1"]
    # a tree where default is attached nowhere: waiting jobs go to the root queue
    a.replace_tree(make_tree({"name": "root", "max": {JOBS: 5}}))
    info = a.wait_info(jid("w2"))
    assert info is not None and info.queue == a.queue_for("default") == a.queues()[0].name
    assert granted(a.schedule(now=4)) == ["w2"]


# --------------------------------------------------------------------------- introspection


def test_queues_report_lengths_usage_and_limits() -> None:
    a = Admission(walkthrough(), QueuePolicy.BLOCK)
    a.enqueue(req("a"), now=0)
    a.enqueue(req("b", at=1), now=1)
    root, child = a.queues()
    assert (root.node, root.length, root.admitted, root.policy) == ("root", 0, 0, "Block")
    assert (child.node, child.length, child.admitted) == ("child-2", 1, 1)
    assert child.usage == {JOBS: 1000, "cpu": 1000}
    assert child.max[JOBS] == 1000 and child.min == {}
    assert root.usage == child.usage


def test_usage_of_unknown_node_names_it() -> None:
    with pytest.raises(KeyError, match="no node 'nope'"):
        Admission(walkthrough()).usage("nope")


def test_without_tree_everything_is_admitted() -> None:
    a = Admission(None)
    assert isinstance(a.enqueue(req("x", gpu=10**6), now=0), Grant)


def test_bad_input_is_rejected_with_a_clear_error() -> None:
    with pytest.raises(ValidationError, match="request.cpu"):
        AdmissionRequest(job_id="j", namespace="default", request={"cpu": -1}, submitted_at=0)
    with pytest.raises(ValueError, match="starvation_seconds must be >= 0"):
        Admission(None, starvation_seconds=-1)
    with pytest.raises(ValueError, match="not a valid QueuePolicy|Fifo"):
        Admission(None, "Fifo")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- state


def _busy() -> Admission:
    a = Admission(make_tree(GPU_LEAF), starvation_seconds=60)
    a.enqueue(req("holder", gpu=10), now=0)
    a.enqueue(req("big", at=1, prio=5, gpu=8), now=1)
    a.enqueue(req("small", at=2, gpu=2), now=2)
    a.enqueue(req("s2", at=3, gpu=5), now=3)
    a.enqueue(req("other", ns="elsewhere", at=4, gpu=1), now=4)
    return a


def test_state_round_trip_is_equal_and_behaves_the_same() -> None:
    a = _busy()
    state = a.to_state()
    wire = state.model_dump_json()
    b = Admission.from_state(AdmissionState.model_validate_json(wire))
    assert b.to_state() == state
    assert b.holders() == a.holders() and b.waiting() == a.waiting()
    assert [b.wait_info(j) for j in b.waiting()] == [a.wait_info(j) for j in a.waiting()]
    assert b.queues() == a.queues()
    # skip times survive: big starves 60 s after its skip at t=2 in both copies
    for x in (a, b):
        x.release(jid("small"))
        assert x.schedule(now=70) == []
        x.release(jid("holder"))
        assert granted(x.schedule(now=71)) == ["big", "s2"]


def test_state_for_ten_thousand_waiting_jobs_is_compact() -> None:
    a = Admission(walkthrough())
    shapes = [{JOBS: 1000, "cpu": 4000 * (1 + i % 3), GPU: 1000 * (i % 4)} for i in range(4)]
    for i in range(10_000):
        a.enqueue(
            AdmissionRequest(
                job_id=f"pytorchjob/default/job-{i:05d}",
                namespace="default",
                priority=i % 3,
                request=shapes[i % 4],
                submitted_at=1.7e9 + i * 0.37,
            ),
            now=1.7e9 + i,
        )
    size = len(a.to_state().model_dump_json())
    assert len(a.waiting()) == 9_999
    assert size < 1_000_000, size
    assert len(json.loads(a.to_state().model_dump_json())["shapes"]) == 4
    # what continue-as-new carries: packed, far under Temporal's 512 KiB payload warning
    # (these ids and times are regular: realistic ones cost ~11 B a job, see
    # test_continue_as_new_input_with_realistic_ids_is_compact), and lossless
    packed = pack_state(a.to_state())
    assert len(packed) < 20_000, len(packed)
    assert len(packed) * 4 < len(a.to_state().model_dump_json())
    b = Admission.from_state(unpack_state(packed))
    assert b.to_state() == a.to_state()
    assert [b.wait_info(j) for j in b.waiting()[:50]] == [
        a.wait_info(j) for j in a.waiting()[:50]
    ]


def test_continue_as_new_input_with_realistic_ids_is_compact() -> None:
    """20,000 waiting jobs named as ML teams name them, in 100 namespaces, submitted at
    random microseconds: the packed state (with the tree's manifest) costs at most 14 B a
    waiting job, so 100,000 stay under half of Temporal's 2 MiB blob limit (the format
    JSON of the state costs ~33 B a job zlib-compressed, and passes the limit at ~58,000)."""
    rng = random.Random(7)
    teams = [f"org-{i // 10:02d}-team-{i:03d}" for i in range(100)]
    doc = {
        "apiVersion": "scheduling.sigs.k8s.io/v1beta1",
        "kind": "ElasticQuotaTree",
        "metadata": {"name": "fleet", "namespace": "kube-system"},
        "spec": {"root": {"name": "root", "max": {"cpu": "64"}, "children": [
            {"name": t, "namespaces": [t], "max": {"cpu": "64"}} for t in teams
        ]}},
    }
    a = Admission(parse_tree(doc))
    now = 1_795_000_000.0
    for _ in range(20_000):
        now += rng.randrange(1, 3_000_000) / 1e6
        team = rng.choice(teams)
        name = "-".join([
            rng.choice(["llama", "qwen2", "gemma", "t5", "bert"]),
            rng.choice(["finetune", "eval", "sft", "dpo"]),
            rng.choice(["7b", "13b", "70b"]),
            f"lr{rng.choice(['1e-4', '3e-4', '2e-5'])}",
            f"202611{rng.randrange(1, 31):02d}",
            "".join(rng.choices("bcdfghjklmnpqrstvwxz2456789", k=5)),
        ])
        a.enqueue(AdmissionRequest(
            job_id=f"pytorchjob/{team}/{name}", namespace=team,
            priority=rng.choice([0, 0, 10, 100]), request={"cpu": 64_000},
            submitted_at=now,
        ), now)
    state = a.to_state()
    assert len(state.w) == 19_999  # one holds the root's whole cpu
    packed = pack_state(state, doc)
    empty = pack_state(state.model_copy(update={"w": [], "wp": {}}), doc)
    per_job = (len(packed) - len(empty)) / len(state.w)
    assert per_job < 14, per_job
    assert len(empty) < 8_000, len(empty)
    assert unpack_carried(packed) == (state, doc)


def test_packed_state_is_not_mistaken_for_another_format() -> None:
    with pytest.raises(ValueError, match="not a packed admission state"):
        unpack_carried(b"not a state")
