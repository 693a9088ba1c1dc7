"""What the member clusters themselves hold, rendered for ``get pytorchjob -M``, ``get pod
-M`` and ``describe pytorchjob``.

The job workflows' ``status`` view says where fleetq *thinks* copies are; the client
library reads what the members *run* (:mod:`fleetq.client.members`: every member of the
fleet config, directly, short timeouts, no retries). These views merge the two: an
evicted copy whose pods still run, a copy that already failed during the toleration
window, a member that does not answer.

Without a fleet config (the CLI pointed at a remote Temporal without ``FLEETQ_CONFIG``)
the callers fall back to the workflows' view and say so once on stderr.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import typer

from fleetq.cli.context import CliError, fleet_config_path
from fleetq.cli.output import age
from fleetq.client import members
from fleetq.client.members import MemberRead, MemberSnapshot, job_key_of_pod
from fleetq.fleet_config import FleetConfigError
from fleetq.job_view import TERMINAL_STATES, JobView
from fleetq.member_contract import job_phase, meta_of, pod_restarts

__all__ = ["MemberRead", "MemberSnapshot", "read_members"]

#: pod phases that still hold a node (``Evicted, still running``)
LIVE_POD_PHASES = ("Running", "Pending", "Unknown")
FALLBACK_NOTE = ("note: no fleet config ({why}); showing fleetq's own view of the jobs, "
                 "not what the member clusters report")


def read_members(namespace: str | None, config_path: str | None = None,
                 ) -> MemberSnapshot | None:
    """Every member's fleetq-managed jobs and pods (in ``namespace``, or all); None
    (after one note on stderr) when no fleet config is available. ``config_path``
    defaults to ``FLEETQ_CONFIG``, else the running ``fleetq up``'s."""
    try:
        return members.read_members(config_path or fleet_config_path(), namespace)
    except CliError:
        typer.echo(FALLBACK_NOTE.format(why="set FLEETQ_CONFIG, or --state-dir of a "
                                            "running fleetq up"), err=True)
    except FleetConfigError as exc:
        typer.echo(FALLBACK_NOTE.format(why=str(exc)), err=True)
    return None


# --------------------------------------------------------------------------- rendering


def _since(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def unknown_state(view: JobView | None, cluster: str, read: MemberRead) -> str:
    """``Unknown (unreachable since <time>)`` when fleetq knows since when the member is
    silent, else ``Unknown (<why>)``."""
    since = view.unreachable.get(cluster) if view is not None else None
    if since is not None:
        return f"Unknown (unreachable since {_since(since)})"
    return f"Unknown ({read.why or read.error})"


def expected_clusters(view: JobView) -> list[str]:
    """Members where fleetq thinks the job has (or had, not yet purged) a copy."""
    out: list[str] = []
    if view.cluster and view.state not in TERMINAL_STATES:
        out.append(view.cluster)
    for c in [*view.copies, *view.pending_purges, *view.unreachable]:
        if c not in out:
            out.append(c)
    return out


def _pods_live(pods: Iterable[dict[str, Any]]) -> bool:
    return any(str((p.get("status") or {}).get("phase") or "Pending") in LIVE_POD_PHASES
               and not meta_of(p).get("deletionTimestamp") for p in pods)


def _pods_running(pods: Iterable[dict[str, Any]]) -> bool:
    return any((p.get("status") or {}).get("phase") == "Running" for p in pods)


def copy_state(view: JobView | None, cluster: str, snap: MemberSnapshot,
               namespace: str, name: str) -> str | None:
    """STATE of one (job, member) row of ``get pytorchjob -M``; None = no row."""

    read = snap.unreachable(cluster)
    expected = view is not None and cluster in expected_clusters(view)
    if read is not None:
        return unknown_state(view, cluster, read) if expected else None
    obj = snap.copies(namespace, name).get(cluster)
    pods = snap.pods(namespace, name, cluster)
    current = view is not None and cluster == view.cluster
    if current:
        assert view is not None
        if obj is not None:
            phase, _ = job_phase(obj)
            if meta_of(obj).get("deletionTimestamp"):
                return f"{phase}, being deleted"
            return phase
        if view.state in TERMINAL_STATES:
            return view.state  # its copy is gone, as it should be once the job ended
        if view.state in ("Validating", "Queued", "Inadmissible", "Scheduling", "Pending"):
            return None  # not created on the member yet
        return "Missing (no copy on the member)"
    # A copy on a member that is not the job's current cluster: evicted (or stray).
    label = "Evicted" if view is not None else "Orphaned"
    if _pods_running(pods):
        return f"{label}, still running"
    if _pods_live(pods):
        return f"{label}, pods still present"
    if obj is not None:
        phase, _ = job_phase(obj)
        pending = view is not None and cluster in view.pending_purges
        return f"{label} ({phase}{', purge pending' if pending else ''})"
    return None  # nothing left


def copy_age(snap: MemberSnapshot, view: JobView | None, namespace: str, name: str,
             cluster: str) -> str:
    """AGE of one copy, from the object itself: its ``metadata.creationTimestamp`` as
    the member reports it, or, while the member does not answer, as fleetq last read it
    (``JobView.copy_created``); ``<unknown>`` when never read (never when fleetq last
    saw the member, nor when the job was bound)."""
    obj = snap.copies(namespace, name).get(cluster)
    if obj is not None:
        return age(meta_of(obj).get("creationTimestamp"))
    if view is not None:
        return age(view.copy_created.get(cluster))
    return "<unknown>"


def member_copy_rows(views: list[JobView], snap: MemberSnapshot, all_namespaces: bool,
                     orphans: bool = False) -> tuple[list[str], list[list[Any]]]:
    """``get pytorchjob -M`` from the members: one row per (job, member) where the member
    holds a copy or fleetq thinks it does. With ``orphans``, also the fleetq-managed
    copies of jobs fleetq no longer has (deleted while their member was silent):
    ``Orphaned, still running``, ADOPTION ``N``."""
    headers = ["NAME", "CLUSTER", "STATE", "AGE", "ADOPTION"]
    rows: list[list[Any]] = _orphan_rows(views, snap) if orphans else []
    for v in views:
        for c in _copy_clusters(v, snap):
            state = copy_state(v, c, snap, v.namespace, v.name)
            if state is None:
                continue
            rows.append([v.namespace, v.name, c, state,
                         copy_age(snap, v, v.namespace, v.name, c), "Y"])
    rows.sort(key=lambda r: (r[0], r[1]))  # stable: a job's current copy stays first
    if all_namespaces:
        headers.insert(0, "NAMESPACE")
        return headers, rows
    return headers, [r[1:] for r in rows]


def _orphan_rows(views: list[JobView], snap: MemberSnapshot) -> list[list[Any]]:
    """The rows of fleetq-managed copies of jobs fleetq no longer has (ADOPTION ``N``)."""
    rows: list[list[Any]] = []
    known = {(v.namespace, v.name) for v in views}
    for ns, name in sorted(snap.job_keys() - known):
        for c in snap.clusters:
            state = copy_state(None, c, snap, ns, name)
            if state is not None:
                rows.append([ns, name, c, state, copy_age(snap, None, ns, name, c), "N"])
    return rows


def _copy_clusters(v: JobView, snap: MemberSnapshot) -> list[str]:
    """The members to show a row of ``v`` for: where fleetq expects a copy (a finished
    job: its last cluster first), then every other member holding a copy or pods."""
    clusters = expected_clusters(v)
    if v.cluster and v.cluster not in clusters:
        clusters.insert(0, v.cluster)  # a finished job: its last cluster
    for c in snap.clusters:
        if c not in clusters and (c in snap.copies(v.namespace, v.name)
                                  or snap.pods(v.namespace, v.name, c)):
            clusters.append(c)
    return clusters


def pod_ready(pod: dict[str, Any]) -> str:
    status = pod.get("status") or {}
    containers = (pod.get("spec") or {}).get("containers") or []
    statuses = [c for c in status.get("containerStatuses") or [] if isinstance(c, dict)]
    total = max(len(containers), len(statuses))
    ready = sum(1 for c in statuses if c.get("ready"))
    if not statuses:
        for cond in status.get("conditions") or []:
            if isinstance(cond, dict) and cond.get("type") == "Ready" \
                    and cond.get("status") == "True":
                ready = total
    return f"{ready}/{total or 1}"


def pod_status(pod: dict[str, Any]) -> str:
    if meta_of(pod).get("deletionTimestamp"):
        return "Terminating"
    status = pod.get("status") or {}
    for c in status.get("containerStatuses") or []:
        waiting = (c.get("state") or {}).get("waiting") if isinstance(c, dict) else None
        if isinstance(waiting, dict) and waiting.get("reason"):
            return str(waiting["reason"])
    return str(status.get("reason") or status.get("phase") or "Unknown")


def member_pod_rows(views: list[JobView], snap: MemberSnapshot, all_namespaces: bool,
                    wide: bool = False, name: str | None = None,
                    job: tuple[str, str] | None = None,
                    ) -> tuple[list[str], list[list[Any]]]:
    """``get pod -M`` from the members: every fleetq-managed pod as its member reports
    it (pods of evicted copies included), plus one ``-`` row per unreachable member that
    should hold pods."""

    headers = ["NAME", "CLUSTER", "READY", "STATUS", "RESTARTS", "AGE"]
    if wide:
        headers.append("NODE")
    rows: list[tuple[tuple[Any, ...], list[Any]]] = []
    for cluster, pod in snap.all_pods():
        meta = meta_of(pod)
        pname = str(meta.get("name") or "?")
        if (name is not None and pname != name) or (job is not None
                                                     and job_key_of_pod(pod) != job):
            continue
        row: list[Any] = [pname, cluster, pod_ready(pod), pod_status(pod), pod_restarts(pod),
                          # kubectl's printPod: translateTimestampSince(pod.CreationTimestamp)
                          age(meta.get("creationTimestamp"))]
        if wide:
            row.append((pod.get("spec") or {}).get("nodeName") or "<none>")
        ns = str(meta.get("namespace") or "")
        if all_namespaces:
            row.insert(0, ns)
        rows.append(((ns, pname, cluster), row))
    if name is None:
        rows.extend(unreachable_pod_rows(views, snap, all_namespaces, wide))
    if all_namespaces:
        headers.insert(0, "NAMESPACE")
    return headers, [r for _, r in sorted(rows, key=lambda r: r[0])]


def unreachable_pod_rows(views: list[JobView], snap: MemberSnapshot, all_namespaces: bool,
                         wide: bool) -> list[tuple[tuple[Any, ...], list[Any]]]:
    """One ``-`` row per silent member (per namespace with ``-A``) that should hold pods."""
    firsts: dict[tuple[str, str], JobView] = {}
    for v in views:
        for c in expected_clusters(v):
            if snap.unreachable(c) is None:
                continue
            key = (v.namespace if all_namespaces else "", c)
            seen = firsts.get(key)
            since = v.unreachable.get(c)
            if seen is None or (since is not None and (
                    seen.unreachable.get(c) is None or since < seen.unreachable[c])):
                firsts[key] = v
    out: list[tuple[tuple[Any, ...], list[Any]]] = []
    for (ns, c), v in firsts.items():
        read = snap.unreachable(c)
        assert read is not None
        row: list[Any] = ["-", c, "-", unknown_state(v, c, read), "-", "-"]
        if wide:
            row.append("-")
        if all_namespaces:
            row.insert(0, ns)
        out.append(((ns, "~", c), row))
    return out


def member_pod_objects(snap: MemberSnapshot, name: str | None) -> list[dict[str, Any]]:
    """The member pods for ``get pod -o yaml|json``, each annotated with its cluster."""
    out = []
    for cluster, pod in snap.all_pods():
        if name is not None and meta_of(pod).get("name") != name:
            continue
        obj = dict(pod)
        meta = dict(meta_of(pod))
        meta["annotations"] = {**(meta.get("annotations") or {}),
                               "fleetq.io/member-cluster": cluster}
        obj["metadata"] = meta
        out.append(obj)
    return out


def copies_line(view: JobView, snap: MemberSnapshot) -> str:
    """``describe``'s Copies line from the members: ``cluster-a (Running), ...``."""
    _, rows = member_copy_rows([view], snap, all_namespaces=False)
    return ", ".join(f"{r[1]} ({r[2]})" for r in rows)
