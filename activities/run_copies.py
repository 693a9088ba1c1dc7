"""A new run leaves no copy of an earlier run behind, on any member (issue 24 item 4).

Bind replaces an earlier run's copy on its own member; a new run placed on *another*
member must not leave the old copy (PyTorchJob, pods, Reservations) there until the job
is deleted. Once a bind succeeds, :func:`purge_earlier_runs` asks every other member at
once, best-effort, to delete what earlier runs left (same ``fleetq.io/owner``, another
``fleetq.io/run-id``): one GET each with no retries and a short timeout, the whole pass
bounded by ``bound_s``, so an unreachable member never holds the bind (``fleetq delete``
still purges by owner). A member whose capacity cache vouches that it holds no
PyTorchJob of that name (the common case: a first submission) is not asked at all.
Deletes are idempotent, so a retried activity is harmless.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor, wait

from activities.kube_api import ApiError, ClusterUnreachable
from activities.member_cluster import KubernetesMemberCluster, MemberCluster
from fleetq.messages import JobRef

log = logging.getLogger(__name__)

#: how long a bind waits, at most, for the other members' purge of earlier runs
PURGE_EARLIER_RUNS_S = 5.0
#: the read timeout of the first request to each member (one GET, no retries: a member
#: that does not answer it is left alone)
PROBE_READ_S = 1.0


def _purge_one(member: KubernetesMemberCluster, job: JobRef) -> list[str]:
    try:
        deleted = member.purge_earlier_runs(job, read_s=PROBE_READ_S)
    except (ClusterUnreachable, ApiError) as exc:
        log.info("cluster %s: earlier runs of %s not purged now: %s", member.name, job.ref, exc)
        return []
    if deleted:
        log.info("cluster %s: purged what earlier runs of %s left: %s",
                 member.name, job.ref, ", ".join(deleted))
    return deleted


def purge_earlier_runs(
    members: Mapping[str, MemberCluster],
    bound_on: str,
    job: JobRef,
    bound_s: float = PURGE_EARLIER_RUNS_S,
) -> dict[str, list[str]]:
    """Purge earlier runs' copies of ``job`` from every member but ``bound_on`` (whose
    bind replaced its own); what each member that answered in time deleted. Never
    raises for a member: one that is slow or unreachable is left for ``fleetq delete``."""
    if not job.run_id:
        return {}
    others = {
        name: m for name, m in members.items()
        if name != bound_on and isinstance(m, KubernetesMemberCluster)
        and not m.cache.holds_no_job(job.namespace, job.name)
    }
    if not others:
        return {}
    pool = ThreadPoolExecutor(max_workers=min(16, len(others)),
                              thread_name_prefix="fleetq-run-copies")
    try:
        futures = {name: pool.submit(_purge_one, m, job) for name, m in others.items()}
        done, _ = wait(futures.values(), timeout=bound_s)
    finally:
        pool.shutdown(wait=False)  # a straggler finishes on its own request timeouts
    out: dict[str, list[str]] = {}
    for name, fut in futures.items():
        if fut in done and fut.exception() is None and fut.result():
            out[name] = fut.result()
    return out
