"""Warn before a job waits for ever: ``fleetq apply`` and ``fleetq validate`` ask the
fleet's quota workflow whether each PyTorchJob would be inadmissible under the current
tree (its gang minimum above a ``max`` of its quota chain, issue 24) and print one line.
Nothing is refused: trees change, and the job is queued again when its tree is raised.
"""

from __future__ import annotations

from datetime import UTC, datetime

from temporalio.client import Client

from fleetq.admission import AdmissionRequest
from fleetq.client.registry import get_registry
from fleetq.models import FleetObject, PyTorchJob, gang_of, quota_request
from fleetq.naming import job_workflow_id, tree_workflow_id
from fleetq.quota import Inadmissible


async def inadmissible_warnings(
    client: Client,
    objects: list[FleetObject],
    priority_classes: dict[str, int] | None = None,
) -> list[str]:
    """One ``warning:`` line per PyTorchJob of ``objects`` the fleet's current tree can
    never admit; none without a tree or a running quota workflow."""
    jobs = [o for o in objects if isinstance(o, PyTorchJob)]
    if not jobs:
        return []
    reg = await get_registry(client)
    if reg is None or reg.tree is None:
        return []
    handle = client.get_workflow_handle(tree_workflow_id(reg.tree))
    out: list[str] = []
    for job in jobs:
        ns, name = job.metadata.namespace, job.metadata.name
        request = AdmissionRequest(
            job_id=job_workflow_id(ns, name),
            namespace=ns,
            request=quota_request(gang_of(job, priority_classes)),
            submitted_at=datetime.now(UTC).timestamp(),
        )
        try:
            # QuotaTreeHandlers.NEVER_FITS (fleetq.handler_refs: its contracts load numpy,
            # which applying a job does not)
            why: Inadmissible | None = await handle.query(
                "never_fits", request, result_type=Inadmissible | None  # type: ignore[arg-type]
            )
        except Exception:  # no quota workflow (yet): nothing to warn about
            return out
        if why is not None:
            out.append(
                f"warning: pytorchjob {ns}/{name} is inadmissible under the current tree "
                f"({why.message}): it waits until the tree is raised"
            )
    return out
