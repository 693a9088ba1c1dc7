"""Deleting a job while it writes to a member: whatever the workflow was doing when the
delete (workflow cancellation) arrived, nothing of it may stay on the member — no
Reservation holding room until its TTL, no PyTorchJob running after its deletion.

The soak found the first one by chance; these tests hit both windows on purpose by
slowing the member's API down (emulator latency) and cancelling once the activity is
scheduled. (A cancelled activity raises ``ActivityError`` whose cause is
``CancelledError``; the workflow must treat it as the deletion it is.)
"""

from __future__ import annotations

import asyncio
import time

from fleetq.testing.chaos import (
    activity_scheduled,
    history_events,
    job_reservations,
    member_copies,
    policy_manifest,
)
from tests.reliability.conftest import Stack

NS = "faults"
CLUSTER = "cluster-a"


async def delete_during(stack: Stack, activity: str, name: str) -> tuple[str, str]:
    policy = policy_manifest(NS, clusters=[CLUSTER], queued=False)
    stack.emulated.set_latency(CLUSTER, 0.4)
    try:
        handle = await stack.job(NS, name, policy=policy, run_seconds=30)
        deadline = time.monotonic() + 30
        while not activity_scheduled(await history_events(handle), activity):
            assert time.monotonic() < deadline, f"{activity} never scheduled"
            await asyncio.sleep(0.02)
        await handle.cancel()
        view = await stack.wait_end(handle, timeout=60)
        # An abandoned in-flight activity (cancel abandons it) may still write: give it the
        # time its remaining requests take at the injected 0.4 s latency, so a late
        # reservation or copy shows below. Nothing of the worker tells the test when an
        # abandoned activity returns, so this window stays (a pause, not a condition).
        await asyncio.sleep(2.0)
    finally:
        stack.emulated.clear_faults(CLUSTER)
    desc = await handle.describe()
    assert view.state == "Deleted", (desc.status, view.state, view.reason,
                                     [(e.reason, e.message) for e in view.events][-4:])
    return handle.id, view.name


async def test_delete_while_reserving_leaves_no_reservation(stack: Stack) -> None:
    # one activity reserves, then binds: the injected latency holds it in the reserving
    wid, _ = await delete_during(stack, "bind", "del-reserve")
    assert job_reservations(stack.emulated, wid, [CLUSTER]) == []


async def test_delete_while_binding_leaves_no_member_copy(stack: Stack) -> None:
    wid, name = await delete_during(stack, "bind", "del-bind")
    assert member_copies(stack.emulated, NS, name, [CLUSTER]) == {}
    assert job_reservations(stack.emulated, wid, [CLUSTER]) == []
