"""Wake every ``Unschedulable`` job when a worker starts (issue 24 item 2, made durable).

A job that no member could ever hold waits ``Unschedulable`` for a member's nodes to
change. Whom to wake lives in the memory of the worker that judged it (its capacity caches'
node listeners, ``SchedulingActivities._park``), so a worker restart forgets it: a bigger
node that joins while no live worker remembers the job would wake it only at the job's
long backstop timer. So a worker, as it starts, finds the ``Unschedulable`` jobs through
the visibility store (the ``FleetqState`` search attribute, which the job keeps current)
and sends each ``retry_placement``: the job places again on the members as they are now
(it runs if a node that joined meanwhile holds it) or waits on, judged by a live worker
that then listens for it. Without search attributes the backstop timer remains the wake.
"""

from __future__ import annotations

import logging

from temporalio.client import Client
from temporalio.service import RPCError

from fleetq.handler_refs import JobHandlers
from fleetq.naming import SA_STATE

log = logging.getLogger(__name__)

#: the visibility query of jobs waiting for a member's nodes to change
UNSCHEDULABLE_QUERY = f"{SA_STATE} = 'Unschedulable' AND ExecutionStatus = 'Running'"


async def wake_unschedulable(client: Client) -> list[str]:
    """Send ``retry_placement`` to every running ``Unschedulable`` job; the workflow
    ids woken. A failed query or signal is logged, never raised (the jobs' backstop
    timer still wakes them)."""
    woken: list[str] = []
    try:
        async for wf in client.list_workflows(UNSCHEDULABLE_QUERY):
            try:
                await client.get_workflow_handle(wf.id).signal(JobHandlers.RETRY_PLACEMENT.name)
            except RPCError as exc:  # gone meanwhile: nothing to wake
                log.info("could not wake %s at worker start: %s", wf.id, exc)
                continue
            woken.append(wf.id)
    except RPCError as exc:
        log.warning("could not list Unschedulable jobs at worker start: %s", exc)
    if woken:
        log.info("worker start: woke %d Unschedulable job(s) to place again", len(woken))
    return woken
