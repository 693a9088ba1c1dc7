"""End to end on the embedded fleet (issue 27 item 4): a job whose copy failed on its
member shows ``Unhealthy`` for the whole toleration window — the member still holds the
failed copy meanwhile — then fails over, with events in the order they happened and the
``FleetqState`` search attribute telling the same story; the copy's AGE is the member
object's own ``metadata.creationTimestamp``.

Upstream: Karmada's application failover controller evicts a workload only once it has
been unhealthy for ``tolerationSeconds`` (pkg/controllers/applicationfailover
rb_application_failover_controller.go ``detectFailure``) and records the eviction once
done ("Evict from cluster %s succeed.", pkg/util/helper
``EmitClusterEvictionEventForResourceBinding``)."""

from __future__ import annotations

import copy
from datetime import UTC, timedelta

from fleetq.cluster_health import TAINT_UNREACHABLE
from fleetq.kube_values import parse_rfc3339
from fleetq.member_contract import job_phase
from tests.workflows.fakes import first_events_in_order, policy, walkthrough_job
from tests.workflows.test_e2e import Stack, stack, upserted_states, wait_view
from tests.workflows.test_state_preservation_e2e import member_job

__all__ = ["stack"]  # the module's embedded fleet (a fixture of test_e2e)

TOLERATION = 8


async def test_a_failed_copy_shows_unhealthy_until_it_fails_over(stack: Stack) -> None:
    doc = copy.deepcopy(policy(queued=False, toleration=TOLERATION, purge="Immediately"))
    doc["metadata"]["name"] = "truthful"
    doc["spec"]["resourceSelectors"][0]["name"] = "honest"
    await stack.apply(doc)
    handle = await stack.start(walkthrough_job("honest"))
    first = await wait_view(handle, lambda v: v.state == "Running")
    old = first.cluster
    assert old is not None
    # the copy's AGE: its own creationTimestamp, as the member reports it
    created = parse_rfc3339(member_job(stack, old, "honest")["metadata"]["creationTimestamp"])
    assert first.copy_created == {old: created}

    assert stack.emulated.fail_job(old, "default", "honest")
    during = await wait_view(handle, lambda v: v.state != "Running")
    assert during.state == "Unhealthy", (during.state, during.reason)
    assert during.cluster == old and during.unhealthy_since is not None
    since = during.unhealthy_since.astimezone(UTC)
    at = since + timedelta(seconds=TOLERATION)
    assert during.reason.startswith(f"unhealthy on {old} since {since:%Y-%m-%dT%H:%M:%SZ}: ")
    assert during.reason.endswith(f"fails over at {at:%Y-%m-%dT%H:%M:%SZ} unless it recovers")
    # what the member holds meanwhile: the failed copy, not yet purged
    phase, _ = job_phase(member_job(stack, old, "honest"))
    assert phase == "Failed"
    assert "FailoverStarted" not in [e.reason for e in during.events]

    view = await wait_view(  # placed again, and the new copy read once (its AGE)
        handle,
        lambda v: v.state in ("Running", "Created") and v.cluster not in (None, old)
        and v.cluster in v.copy_created,
        timeout=90,
    )
    new = view.cluster
    assert new is not None and view.evicted == [old]
    unhealthy, started, evicted, _ = first_events_in_order(
        view, "Unhealthy", "FailoverStarted", "Evicted", "Rescheduled")
    assert (started.time - unhealthy.time).total_seconds() >= TOLERATION
    waited = int(evicted.message.split(" after ")[1].split("s;")[0])
    assert waited >= TOLERATION
    assert evicted.message == f"evicted from {old} after {waited}s; old copy purged first"
    assert all(e.reason != "PurgeDeferred" for e in view.events)
    assert list(stack.member_copies("honest")) == [new]  # purged first, as it says
    new_created = parse_rfc3339(member_job(stack, new, "honest")["metadata"]["creationTimestamp"])
    assert view.copy_created == {new: new_created}  # the purged copy's is gone with it

    states = upserted_states((await handle.fetch_history()).events)
    assert states[:3] == ["Running", "Unhealthy", "FailingOver"], states
    await handle.cancel()
    await wait_view(handle, lambda v: v.state == "Deleted")
    assert stack.member_copies("honest") == {}


TAINT_TOLERATION = 4


async def test_a_taint_eviction_is_announced_when_scheduled_and_recorded_when_done(
    stack: Stack,
) -> None:
    """The job's member stops answering: ``TaintEviction`` says when it will evict
    (while the job is still there), the eviction comes after the taint's
    tolerationSeconds, ``Evicted`` says after how long and that the old copy is not purged
    yet (the member is silent: ``PurgeDeferred``), and ``Purged`` comes only once the
    member answered and the copy is gone. The silent copy's AGE stays its own."""
    doc = copy.deepcopy(policy(queued=False, toleration=60, purge="Immediately"))
    doc["metadata"]["name"] = "taint-truthful"
    doc["spec"]["resourceSelectors"][0]["name"] = "tainted"
    doc["spec"]["placement"]["clusterTolerations"] = [{
        "key": TAINT_UNREACHABLE, "operator": "Exists", "effect": "NoExecute",
        "tolerationSeconds": TAINT_TOLERATION}]
    await stack.apply(doc)
    handle = await stack.start(walkthrough_job("tainted"))
    first = await wait_view(handle, lambda v: v.state == "Running" and bool(v.copy_created))
    old = first.cluster
    assert old is not None
    created = first.copy_created[old]
    stack.emulated.set_reachable(old, False)
    try:
        scheduled = await wait_view(
            handle, lambda v: any(e.reason == "TaintEviction" for e in v.events), timeout=60)
        (notice,) = [e for e in scheduled.events if e.reason == "TaintEviction"]
        assert notice.message.startswith(
            f"{old}: taint {TAINT_UNREACHABLE}:NoExecute tolerated for {TAINT_TOLERATION}s: "
            "will evict at ")
        assert notice.message.endswith(" unless it recovers")
        if scheduled.cluster == old:  # announced before it is done, not after
            assert "Evicted" not in [e.reason for e in scheduled.events]
        view = await wait_view(
            handle, lambda v: v.cluster not in (None, old) and v.state == "Running", timeout=90)
        assert view.copy_created[old] == created  # the silent copy's own AGE
        evicted = next(e for e in view.events if e.reason == "Evicted")
        assert evicted.message.startswith(f"evicted from {old} after ")
        waited = int(evicted.message.split(" after ")[1].split("s;")[0])
        assert waited >= TAINT_TOLERATION
        assert "purged first" not in evicted.message
        assert "old copy not purged yet" in evicted.message
        assert old in stack.member_copies("tainted")  # the member still holds it
    finally:
        stack.emulated.set_reachable(old, True)
    done = await wait_view(handle, lambda v: any(e.reason == "Purged" for e in v.events),
                           timeout=60)
    first_events_in_order(done, "TaintEviction", "FailoverStarted", "PurgeDeferred", "Evicted",
                          "Rescheduled", "Purged")
    assert old not in stack.member_copies("tainted")  # purged, as it now says
    assert old not in done.copy_created
    await handle.cancel()
    await wait_view(handle, lambda v: v.state == "Deleted")
    assert stack.member_copies("tainted") == {}
