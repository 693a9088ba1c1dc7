"""Never twice: what the member clusters themselves hold while one of them is partitioned
and after it returns, sampled about five times a second beside fleetq's own view.

The sampler reads each member's own objects (the emulator's store: what ``kubectl`` on
that member would list, and still readable while the member refuses our API calls), so
these tests judge the members' truth, not what the workflow believes. The guarantee they
pin (README, Failover):

* a copy left on a member that could not be told to stop is gone within 5 s of the
  member answering again, whatever the current copy is doing, also after a worker
  restart during the partition;
* a healthy job on a member that stays unreachable past its NoExecute toleration moves;
* with ``fleetq.io/fencing: Strict`` no sample ever shows two live copies.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from activities.scheduling import SchedulingActivities
from fleetq.cluster_health import TAINT_UNREACHABLE
from fleetq.emulator.fleet import EmulatedFleet
from fleetq.lifecycle import SA_SETTLE_SECONDS
from fleetq.messages import JobView
from fleetq.naming import job_workflow_id
from fleetq.testing.chaos import job_manifest, policy_manifest
from tests.reliability.conftest import Stack
from worker import build_worker

NS = "twice"
#: how long a job tolerates its member's unreachable:NoExecute taint in these tests
TAINT_TOLERATION = 3
#: the promise: a returning member's stale copy is gone this long after it answers
PURGE_WITHIN = 5.0
LIVE_POD_PHASES = ("Pending", "Running")


def twice_policy(clusters: list[str], *, strict: bool = False) -> dict[str, Any]:
    doc = policy_manifest(NS, toleration=60, clusters=clusters, queued=False)
    doc["spec"]["placement"]["clusterTolerations"] = [{
        "key": TAINT_UNREACHABLE, "operator": "Exists", "effect": "NoExecute",
        "tolerationSeconds": TAINT_TOLERATION}]
    if strict:
        doc["metadata"]["annotations"] = {"fleetq.io/fencing": "Strict"}
    return doc


class MemberSampler:
    """Which members hold a live copy of one job (its PyTorchJob, or a Pending/Running
    pod of it), read from the members' own state every ``interval`` seconds."""

    def __init__(self, emulated: EmulatedFleet, name: str, interval: float = 0.2) -> None:
        self.emulated, self.name, self.interval = emulated, name, interval
        self.samples: list[tuple[float, frozenset[str]]] = []
        self._task: asyncio.Task[None] | None = None

    def holders(self) -> frozenset[str]:
        out = set()
        for c in self.emulated.members:
            jobs = [o for o in self.emulated.objects(c, "pytorchjobs")
                    if o["metadata"]["name"] == self.name
                    and o["metadata"].get("namespace") == NS]
            pods = [p for p in self.emulated.objects(c, "pods")
                    if p["metadata"].get("namespace") == NS
                    and (p["metadata"].get("labels") or {}).get(
                        "training.kubeflow.org/job-name") == self.name
                    and (p.get("status") or {}).get("phase", "Pending") in LIVE_POD_PHASES]
            if jobs or pods:
                out.add(c)
        return frozenset(out)

    async def _run(self) -> None:
        while True:
            held = await asyncio.to_thread(self.holders)
            self.samples.append((time.monotonic(), held))
            await asyncio.sleep(self.interval)

    def start(self) -> MemberSampler:
        self._task = asyncio.create_task(self._run())
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def after(self, t: float) -> list[tuple[float, frozenset[str]]]:
        return [(ts, h) for ts, h in self.samples if ts >= t]

    def doubles(self) -> list[tuple[float, frozenset[str]]]:
        return [(ts, h) for ts, h in self.samples if len(h) > 1]


async def until(check: Any, timeout: float, what: str, step: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
        await asyncio.sleep(step)


async def sample_past(t: float) -> None:
    """Let the sampler run until monotonic time ``t`` (the end of the promised window)."""
    await asyncio.sleep(max(0.0, t - time.monotonic()))


def events(view: JobView, reason: str) -> list[str]:
    return [e.message for e in view.events if e.reason == reason]


async def start(stack: Stack, prefix: str, *, strict: bool = False,
                task_queue: str | None = None) -> tuple[Any, str]:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    arg = {"manifest": job_manifest(NS, name), "rewatch_seconds": 1.0, "run_seconds": 600,
           "policy": twice_policy(["cluster-a", "cluster-b"], strict=strict)}
    handle = await stack.client.start_workflow(
        "PyTorchJobWorkflow", arg, id=job_workflow_id(NS, name),
        task_queue=task_queue or "fleetq")
    return handle, name


async def running_on(stack: Stack, handle: Any, timeout: float = 30.0) -> JobView:
    async def check() -> JobView | None:
        v = await stack.view(handle)
        return v if v.state == "Running" and v.cluster else None

    view: JobView = await until(check, timeout, f"{handle.id} Running")
    return view


async def moved(stack: Stack, handle: Any, old: str, timeout: float) -> JobView:
    async def check() -> JobView | None:
        v = await stack.view(handle)
        return v if v.cluster not in (None, old) and v.state == "Running" else None

    view: JobView = await until(check, timeout, f"{handle.id} moved off {old}")
    return view


async def finish(stack: Stack, handle: Any) -> None:
    await handle.cancel()
    await stack.wait_end(handle, timeout=60)


async def partition_move_and_return(stack: Stack, handle: Any, name: str,
                                    sampler: MemberSampler,
                                    during: Any = None) -> tuple[str, str, float]:
    """Cut the job's member off until the job moved (plus ``during``), then let it
    answer again; returns (old member, new member, when it answered)."""
    first = (await running_on(stack, handle)).cluster
    assert first is not None
    other = "cluster-b" if first == "cluster-a" else "cluster-a"
    stack.emulated.set_reachable(first, False)
    cut = time.monotonic()
    try:
        view = await moved(stack, handle, first, timeout=TAINT_TOLERATION + 30)
        # Evicted for the taint, not before its toleration ran out.
        (started,) = events(view, "FailoverStarted")
        assert "cluster.karmada.io/unreachable:NoExecute outlasted tolerationSeconds 3" in started
        assert time.monotonic() - cut >= TAINT_TOLERATION
        assert events(view, "PurgeDeferred"), "the partitioned copy was not left for later"
        assert view.pending_purges == [first]
        # The partitioned member still runs its copy: the one window two copies exist.
        assert first in sampler.holders()
        if during is not None:
            await during()
    finally:
        stack.emulated.set_reachable(first, True)
    back = time.monotonic()
    return first, other, back


async def test_a_copy_on_a_returning_member_is_gone_within_seconds(stack: Stack) -> None:
    handle, name = await start(stack, "back")
    sampler = MemberSampler(stack.emulated, name).start()
    try:
        # The partition outlasts the new copy's settling: nothing about the current copy
        # changes when the old member returns (what once left it running for minutes).
        first, other, back = await partition_move_and_return(
            stack, handle, name, sampler, during=lambda: asyncio.sleep(SA_SETTLE_SECONDS + 2))
        await until(lambda: asyncio.to_thread(lambda: first not in sampler.holders()),
                    PURGE_WITHIN + 10, "old copy purged")
        await sample_past(back + PURGE_WITHIN + 1.0)
    finally:
        await sampler.stop()
    late = [(round(ts - back, 2), sorted(h)) for ts, h in sampler.after(back + PURGE_WITHIN)
            if first in h]
    assert late == [], f"{first} still held the copy after it answered again: {late}"
    assert sampler.after(back + PURGE_WITHIN), "no sample after the bound"
    gone_at = min(ts for ts, h in sampler.after(back) if first not in h)
    print(f"partitioned copy gone {gone_at - back:.2f}s after {first} answered again")
    view = await until(lambda: _purged_view(stack, handle, first), 15, "Purged event")
    assert view.cluster == other and view.state == "Running"
    assert view.unreachable == {} and view.pending_purges == []
    await finish(stack, handle)


async def _purged_view(stack: Stack, handle: Any, cluster: str) -> JobView | None:
    v = await stack.view(handle)
    return v if any(cluster in m for m in events(v, "Purged")) else None


@asynccontextmanager
async def own_worker(stack: Stack, task_queue: str) -> AsyncIterator[None]:
    worker = build_worker(stack.client, SchedulingActivities(stack.client, stack.fleet),
                          task_queue=task_queue, control_task_queue=None)
    async with worker:
        yield


async def test_a_worker_restart_during_the_partition_changes_nothing(stack: Stack) -> None:
    tq = f"twice-{uuid.uuid4().hex[:6]}"
    handle, name = await start(stack, "restart", task_queue=tq)
    sampler = MemberSampler(stack.emulated, name).start()
    restarted: list[float] = []
    try:
        async with own_worker(stack, tq):
            first = (await running_on(stack, handle)).cluster
            assert first is not None
            stack.emulated.set_reachable(first, False)
            try:
                await moved(stack, handle, first, timeout=TAINT_TOLERATION + 30)
            except BaseException:
                stack.emulated.set_reachable(first, True)
                raise
        # The worker that was waiting to purge the partitioned copy is gone; a new one
        # takes over while the member is still away.
        restarted.append(time.monotonic())
        try:
            async with own_worker(stack, tq):
                await asyncio.sleep(2.0)  # the partition outlasts the restart
                stack.emulated.set_reachable(first, True)
                back = time.monotonic()
                await until(lambda: asyncio.to_thread(lambda: first not in sampler.holders()),
                            PURGE_WITHIN + 10, "old copy purged after the restart")
                await sample_past(back + PURGE_WITHIN + 1.0)
                late = [round(ts - back, 2) for ts, h in sampler.after(back + PURGE_WITHIN)
                        if first in h]
                assert late == [], f"{first} held the copy after it answered: {late}"
                assert sampler.after(back + PURGE_WITHIN), "no sample after the bound"
                await finish(stack, handle)
        finally:
            stack.emulated.set_reachable(first, True)
    finally:
        await sampler.stop()
    assert restarted


async def test_strict_fencing_never_shows_two_copies(stack: Stack) -> None:
    handle, name = await start(stack, "strict", strict=True)
    sampler = MemberSampler(stack.emulated, name).start()
    try:
        first = (await running_on(stack, handle)).cluster
        assert first is not None
        stack.emulated.set_reachable(first, False)
        try:
            async def fencing() -> JobView | None:
                v = await stack.view(handle)
                return v if v.state == "FailingOver" and "Strict" in v.reason else None

            view = await until(fencing, TAINT_TOLERATION + 30, "waiting on strict fencing")
            assert view.cluster is None
            # Well past the toleration, the job still waits for the partitioned copy: the
            # wait is the behaviour under test (nothing may move while it lasts).
            await asyncio.sleep(3.0)
            view = await stack.view(handle)
            assert view.state == "FailingOver" and view.cluster is None
        finally:
            stack.emulated.set_reachable(first, True)
        view = await moved(stack, handle, first, timeout=30)
        assert any("confirmed gone" in m for m in events(view, "Evicted"))
        # The sampler has looked at the members after the move (what "never two" is
        # judged on), rather than a pause for it to do so.
        moved_at = time.monotonic()

        async def sampled_since() -> bool:
            return len(sampler.after(moved_at)) >= 3

        await until(sampled_since, 15, "samples after the move")
    finally:
        await sampler.stop()
    assert sampler.samples and not sampler.doubles(), sampler.doubles()[:5]
    assert {h for _, h in sampler.samples} >= {frozenset({first})}
    await finish(stack, handle)


async def test_new_jobs_avoid_an_unreachable_member_at_once(stack: Stack) -> None:
    stack.emulated.set_reachable("cluster-a", False)
    try:
        member = stack.fleet.get("cluster-a")

        def tainted() -> bool:
            snap = member.capacity()
            return any(t.key == TAINT_UNREACHABLE and t.effect == "NoSchedule"
                       for t in snap.taints)

        await until(lambda: asyncio.to_thread(tainted), 15, "cluster-a tainted")
        handle, name = await start(stack, "avoid")
        view = await running_on(stack, handle)
        assert view.cluster == "cluster-b"
        assert view.rejections["cluster-a"].endswith(
            "cluster taint cluster.karmada.io/unreachable:NoSchedule not tolerated by "
            "clusterTolerations"), view.rejections
    finally:
        stack.emulated.set_reachable("cluster-a", True)
    await finish(stack, handle)
