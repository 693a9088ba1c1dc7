"""Quota tree accounting: limits at leaf and ancestors, unlimited absent resources,
max-jobs, unattached namespaces, release, tree replacement and queue names."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from fleetq.quota import SUFFIX_ALPHABET, QuotaTree, queue_name
from tests.core.trees import make_tree, walkthrough

GPU = "nvidia.com/gpu"
JOBS = "kube-queue/max-jobs"
SUFFIX = f"[{SUFFIX_ALPHABET}]{{5}}"






def job(cpu: float = 0, gpu: int = 0, **extra: int) -> dict[str, int]:
    out = {JOBS: 1000}
    if cpu:
        out["cpu"] = int(cpu * 1000)
    if gpu:
        out[GPU] = gpu * 1000
    out.update({k.replace("_", "/"): v for k, v in extra.items()})
    return out


TWO_TEAMS = {
    "name": "root",
    "max": {"cpu": 8, JOBS: 3},
    "min": {"cpu": 8},
    "children": [
        {"name": "a", "max": {"cpu": 10, JOBS: 2}, "min": {"cpu": 4}, "namespaces": ["ns-a"]},
        {"name": "b", "max": {JOBS: 2}, "namespaces": ["ns-b"]},
    ],
}


def test_walkthrough_queue_names_follow_kube_queue_pattern() -> None:
    q = QuotaTree(walkthrough())
    names = {n.name: n.queue for n in q}
    assert re.fullmatch(f"root-{SUFFIX}", names["root"])
    assert re.fullmatch(f"root-child-2-{SUFFIX}", names["child-2"])


def test_queue_suffix_is_stable_across_processes_and_depends_on_tree_and_path() -> None:
    here = queue_name("elasticquotatree", ["root", "child-2"])
    code = (
        "from fleetq.quota import queue_name;"
        "print(queue_name('elasticquotatree', ['root', 'child-2']))"
    )
    other = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345"},
    ).stdout.strip()
    assert other == here
    assert queue_name("other-tree", ["root", "child-2"]) != here
    assert queue_name("elasticquotatree", ["root", "child-3"])[:-6] == "root-child-3"


def test_queue_name_lowercases_and_replaces_slash_and_underscore() -> None:
    assert re.fullmatch(f"root-team-a-gpu-{SUFFIX}", queue_name("t", ["Root", "Team_A", "GPU"]))
    assert re.fullmatch(f"root-x-y-{SUFFIX}", queue_name("t", ["root", "x/y"]))


def test_admission_must_fit_leaf_and_every_ancestor() -> None:
    q = QuotaTree(make_tree(TWO_TEAMS))
    # leaf a allows 10 cpu but root only 8
    assert q.can_admit("a", job(cpu=9)) == "quota root: cpu needs 9, 8 free of max 8"
    assert q.fits("a", job(cpu=8))
    q.admit("j1", "ns-a", job(cpu=6))
    assert q.can_admit("b", job(cpu=3)) == "quota root: cpu needs 3, 2 free of max 8"
    assert q.fits("b", job(cpu=2))


def test_resource_absent_from_max_is_unlimited() -> None:
    q = QuotaTree(make_tree(TWO_TEAMS))
    huge = job(gpu=100_000, example_com_fpga=10**9)
    assert q.can_admit("b", huge) is None
    q.admit("j", "ns-b", huge)
    assert q.usage("root")[GPU] == 100_000_000


def test_max_jobs_counts_per_node_and_on_ancestors() -> None:
    q = QuotaTree(make_tree(TWO_TEAMS))
    q.admit("a1", "ns-a", job())
    q.admit("a2", "ns-a", job())
    assert q.can_admit("a", job()) == "quota a: kube-queue/max-jobs 2/2 in use"
    q.admit("b1", "ns-b", job())
    # b has room (1/2) but the root's 3 jobs are all taken
    assert q.can_admit("b", job()) == "quota root: kube-queue/max-jobs 3/3 in use"
    assert q.usage("root")[JOBS] == 3000
    assert q.nodes["a"].admitted == 2 and q.nodes["root"].admitted == 0


def test_unattached_namespace_charges_root_only() -> None:
    tree = make_tree(
        {
            "name": "root",
            "max": {"cpu": 100},
            "children": [{"name": "a", "max": {"cpu": 1}, "namespaces": ["ns-a"]}],
        }
    )
    q = QuotaTree(tree)
    assert q.leaf_for("elsewhere") == "root"
    assert q.fits("root", job(cpu=50))
    assert q.admit("j", "elsewhere", job(cpu=50)) == "root"
    assert q.usage("root")["cpu"] == 50_000
    assert q.usage("a") == {}


def test_release_gives_quota_back_and_is_idempotent() -> None:
    q = QuotaTree(walkthrough())
    q.admit("j", "default", job(cpu=2))
    assert q.can_admit("child-2", job()) is not None
    assert q.release("j") is True
    assert q.release("j") is False
    assert q.usage("child-2") == {} and q.usage("root") == {}
    assert q.can_admit("child-2", job()) is None


def test_admit_twice_is_refused() -> None:
    q = QuotaTree(walkthrough())
    q.admit("j", "default", job())
    with pytest.raises(ValueError, match="already holds quota"):
        q.admit("j", "default", job())


def test_several_shortfalls_at_one_node_are_all_named() -> None:
    q = QuotaTree(make_tree({"name": "root", "max": {"cpu": 2, GPU: 16, JOBS: 5}}))
    q.admit("j", "x", job(cpu=2, gpu=14))
    assert q.can_admit("root", job(cpu=1, gpu=8)) == (
        "quota root: cpu needs 1, 0 free of max 2; nvidia.com/gpu needs 8, 2 free of max 16"
    )


def test_replacing_tree_keeps_held_quota_even_over_new_max() -> None:
    q = QuotaTree(make_tree(TWO_TEAMS))
    q.admit("a1", "ns-a", job(cpu=3))
    q.admit("a2", "ns-a", job(cpu=3))
    smaller = make_tree(
        {
            "name": "root",
            "max": {"cpu": 4},
            "children": [{"name": "a", "max": {JOBS: 1}, "namespaces": ["ns-a"]}],
        }
    )
    q.replace(smaller)
    assert q.usage("a") == {"cpu": 6000, JOBS: 2000}
    assert q.usage("root") == {"cpu": 6000, JOBS: 2000}
    assert q.can_admit("a", job()) == "quota a: kube-queue/max-jobs 2/1 in use"
    assert q.release("a1")
    assert q.usage("a") == {"cpu": 3000, JOBS: 1000}


def test_replacing_tree_recharges_holders_where_their_namespace_maps_now() -> None:
    q = QuotaTree(make_tree(TWO_TEAMS))
    q.admit("b1", "ns-b", job(cpu=1))
    moved = make_tree(
        {
            "name": "root",
            "children": [{"name": "c", "namespaces": ["ns-a"]}],
        }
    )
    q.replace(moved)
    assert q.holdings["b1"].node == "root"
    assert q.usage("root") == {"cpu": 1000, JOBS: 1000}
    assert "b" not in q.nodes
    with pytest.raises(KeyError, match="no node 'b'"):
        q.usage("b")


def test_below_min_needs_every_guaranteed_resource_below_min() -> None:
    q = QuotaTree(make_tree(TWO_TEAMS))
    assert q.nodes["a"].below_min()
    assert not q.nodes["b"].below_min()  # no min at all: always a borrower
    q.admit("a1", "ns-a", job(cpu=4))
    assert not q.nodes["a"].below_min()


def test_no_tree_means_one_unlimited_root() -> None:
    q = QuotaTree(None)
    assert [n.name for n in q] == ["root"]
    assert re.fullmatch(f"root-{SUFFIX}", q.nodes["root"].queue)
    assert q.can_admit(q.leaf_for("anything"), job(cpu=10**6, gpu=10**6)) is None
