"""The engine's own ceiling for ``fleetq bench e2e``: a plain workflow running ``n``
sequential no-op activities (``ActivityChain``), or the same mix of local and regular
no-op activities as a job (``ActivityMix``).

It lives in a module of its own, which ``bench e2e`` passes through Temporal's sandbox
as the worker passes fleetq's ``workflows`` package (``SANDBOX_PASSTHROUGH``): the
sandbox would otherwise re-execute this module for every baseline run, a cost a job's
run no longer pays, and the ratio would flatter fleetq.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity, workflow


@activity.defn(name="bench_noop")
def bench_noop(i: int) -> int:
    """A no-op activity, on the same thread pool as the worker's member-cluster calls."""
    return i


@workflow.defn(name="BenchActivityChain")
class ActivityChain:
    """``n`` sequential no-op activities, sandboxed like fleetq's workflows."""

    @workflow.run
    async def run(self, n: int) -> int:
        for i in range(n):
            await workflow.execute_activity(
                bench_noop, i, start_to_close_timeout=timedelta(seconds=60)
            )
        return n


@workflow.defn(name="BenchActivityMix")
class ActivityMix:
    """``counts[0]`` sequential no-op local activities, then ``counts[1]`` regular ones:
    the same kinds of activities as a job, in the cheapest order (the local ones share
    the first workflow task)."""

    @workflow.run
    async def run(self, counts: list[int]) -> int:
        local, regular = counts
        for i in range(local):
            await workflow.execute_local_activity(
                bench_noop, i, start_to_close_timeout=timedelta(seconds=60)
            )
        for i in range(regular):
            await workflow.execute_activity(
                bench_noop, i, start_to_close_timeout=timedelta(seconds=60)
            )
        return local + regular
