"""End to end on the embedded fleet (Temporal dev server, real activities, the emulator):
``placement.clusterAffinities`` as Karmada release-1.18's scheduler reads it
(pkg/scheduler/scheduler.go ``scheduleResourceBindingWithClusterAffinities``): a job lands
in its first group while it fits there, spills to the second when it does not, and a
failover tries the rest of its current group first. Read on the member clusters."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fleetq.cli.describe import describe_lines
from tests.workflows.fakes import policy, walkthrough_job
from tests.workflows.test_e2e import Stack, stack, wait_view

__all__ = ["stack"]  # the module's embedded fleet (a fixture of test_e2e)


def grouped_policy(name: str, job_prefix: str, *groups: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(policy(queued=False, toleration=2, purge="Immediately"))
    doc["metadata"]["name"] = name
    doc["spec"]["resourceSelectors"][0]["name"] = job_prefix
    doc["spec"]["placement"]["clusterAffinities"] = list(groups)
    return doc


@contextmanager
def cordoned(stack: Stack, cluster: str) -> Iterator[None]:
    """Every node of ``cluster`` unschedulable: no gang fits there."""
    nodes = [n["metadata"]["name"] for n in stack.emulated.objects(cluster, "nodes")]
    for n in nodes:
        assert stack.emulated.cordon(cluster, n)
    try:
        yield
    finally:
        for n in nodes:
            stack.emulated.cordon(cluster, n, on=False)


def bound_message(view: Any) -> str:
    (bound,) = [e for e in view.events if e.reason == "ScheduleBindingSucceed"]
    return str(bound.message)


async def test_first_group_while_it_fits_then_the_second(stack: Stack) -> None:
    """The primary group is cluster-c (size large); cluster-a of the backup group scores
    better for this gang (the tighter fit) but is tried only once cluster-c cannot hold it."""
    primary = {"affinityName": "primary", "labelSelector": {"matchLabels": {"size": "large"}}}
    backup = {"affinityName": "backup", "clusterNames": ["cluster-a"]}
    await stack.apply(grouped_policy("groups-0", "grouped-0", primary, backup),
                      grouped_policy("groups-1", "grouped-1", primary, backup))
    first = await stack.start(walkthrough_job("grouped-0"))
    view = await wait_view(first, lambda v: v.state == "Running")
    assert (view.cluster, view.cluster_group) == ("cluster-c", "primary")
    assert list(stack.member_copies("grouped-0")) == ["cluster-c"]
    assert bound_message(view).endswith("(clusterAffinities group primary)")
    assert f"{'Cluster:':<14}cluster-c (group primary)" in describe_lines(view)

    with cordoned(stack, "cluster-c"):
        second = await stack.start(walkthrough_job("grouped-1"))
        spilled = await wait_view(second, lambda v: v.state == "Running")
    assert (spilled.cluster, spilled.cluster_group) == ("cluster-a", "backup")
    assert list(stack.member_copies("grouped-1")) == ["cluster-a"]
    assert bound_message(spilled).endswith("(clusterAffinities group backup)")
    for h in (first, second):
        await h.cancel()
        await wait_view(h, lambda v: v.state == "Deleted")
    assert stack.member_copies("grouped-0") == {} and stack.member_copies("grouped-1") == {}


async def test_failover_tries_the_rest_of_the_current_group_first(stack: Stack) -> None:
    """The evicted cluster leaves; the next placement starts at the observed group
    (helper.go ``getAffinityIndex``), so the other primary cluster wins over cluster-a of
    the backup group, the tighter fit."""
    await stack.apply(
        grouped_policy("groups-fo", "grouped-fo",
                       {"affinityName": "primary", "clusterNames": ["cluster-b", "cluster-c"]},
                       {"affinityName": "backup", "clusterNames": ["cluster-a"]}),
    )
    handle = await stack.start(walkthrough_job("grouped-fo"))
    first = await wait_view(handle, lambda v: v.state == "Running")
    assert first.cluster in ("cluster-b", "cluster-c") and first.cluster_group == "primary"
    other = {"cluster-b": "cluster-c", "cluster-c": "cluster-b"}[first.cluster]
    assert stack.emulated.fail_job(first.cluster, "default", "grouped-fo")
    view = await wait_view(
        handle,
        lambda v: v.state in ("Running", "Created") and v.cluster not in (None, first.cluster),
        timeout=90,
    )
    assert (view.cluster, view.cluster_group) == (other, "primary")
    assert list(stack.member_copies("grouped-fo")) == [other]
    await handle.cancel()
    await wait_view(handle, lambda v: v.state == "Deleted")
    assert stack.member_copies("grouped-fo") == {}
