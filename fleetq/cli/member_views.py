"""What the member clusters themselves hold, for ``get pytorchjob -M``, ``get pod -M`` and
``describe pytorchjob``.

The job workflows' ``status`` view says where fleetq *thinks* copies are; an operator
needs what the members *run*: an evicted copy whose pods still run, a copy that already
failed during the toleration window, a member that does not answer. So these views read
every member of the fleet config directly — one LIST of PyTorchJobs and one LIST of pods
per member, filtered by ``fleetq.io/managed-by``, all members in parallel, short timeouts
and no retries (a silent member costs one connect timeout, not a retry ladder) — and
merge that with the workflows' views.

Without a fleet config (the CLI pointed at a remote Temporal without ``FLEETQ_CONFIG``)
the callers fall back to the workflows' view and say so once on stderr.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import typer

from fleetq.cli.context import CliError, fleet_config_path
from fleetq.cli.output import age, parse_time
from fleetq.messages import TERMINAL_STATES, JobView

#: the CLI waits at most this long for a member (connect / read), and never retries
CONNECT_TIMEOUT_S = 2.0
READ_TIMEOUT_S = 5.0
MAX_PARALLEL_READS = 16
JOBS_PATH = "/apis/kubeflow.org/v1"
#: pod phases that still hold a node (``Evicted, still running``)
LIVE_POD_PHASES = ("Running", "Pending", "Unknown")
FALLBACK_NOTE = ("note: no fleet config ({why}); showing fleetq's own view of the jobs, "
                 "not what the member clusters report")


@dataclass
class MemberRead:
    """One member's answer: its fleetq-managed PyTorchJobs and pods, or why it gave none."""

    cluster: str
    jobs: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)
    #: one line when the member did not answer (``cluster-a: unreachable (...)``)
    error: str | None = None
    #: the bracketed part of a ClusterUnreachable (``connection refused``), else the error
    why: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _job_key_of_pod(pod: dict[str, Any]) -> tuple[str, str] | None:
    from fleetq.naming import KF_JOB_NAME

    meta = _meta(pod)
    ns = str(meta.get("namespace") or "")
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("kind") == "PyTorchJob" and ref.get("name"):
            return ns, str(ref["name"])
    name = (meta.get("labels") or {}).get(KF_JOB_NAME)
    return (ns, str(name)) if name else None


@dataclass
class MemberSnapshot:
    """Every member's answer, indexed by job."""

    reads: dict[str, MemberRead]

    def __post_init__(self) -> None:
        self._jobs: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
        self._pods: dict[tuple[str, str], dict[str, list[dict[str, Any]]]] = {}
        for cluster, read in self.reads.items():
            for obj in read.jobs:
                meta = _meta(obj)
                key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
                self._jobs.setdefault(key, {})[cluster] = obj
            for pod in read.pods:
                pkey = _job_key_of_pod(pod)
                if pkey is not None:
                    self._pods.setdefault(pkey, {}).setdefault(cluster, []).append(pod)

    @property
    def clusters(self) -> list[str]:
        return list(self.reads)

    def unreachable(self, cluster: str) -> MemberRead | None:
        read = self.reads.get(cluster)
        return read if read is not None and not read.ok else None

    def copies(self, namespace: str, name: str) -> dict[str, dict[str, Any]]:
        """``{cluster: member PyTorchJob}`` for one job."""
        return self._jobs.get((namespace, name), {})

    def pods(self, namespace: str, name: str, cluster: str) -> list[dict[str, Any]]:
        return sorted(self._pods.get((namespace, name), {}).get(cluster, []),
                      key=lambda p: str(_meta(p).get("name")))

    def job_keys(self) -> set[tuple[str, str]]:
        return set(self._jobs) | set(self._pods)

    def all_pods(self) -> list[tuple[str, dict[str, Any]]]:
        """``(cluster, pod)`` for every fleetq-managed pod, in cluster then pod order."""
        out = []
        for cluster, read in self.reads.items():
            for pod in sorted(read.pods, key=lambda p: (str(_meta(p).get("namespace")),
                                                        str(_meta(p).get("name")))):
                out.append((cluster, pod))
        return out


# --------------------------------------------------------------------------- reading


def cli_member_api(cluster: Any, config: Any) -> Any:
    """A :class:`KubeApi` for one member of ``config``, as the CLI uses it: short
    timeouts and no retries (a silent member is reported, not waited for)."""
    from activities.kube_api import KubeApi, RetryPolicy

    api = KubeApi.from_kubeconfig(
        cluster.name, config.cluster_kubeconfig(cluster), cluster.context_name,
        min(CONNECT_TIMEOUT_S, config.timeouts.connectSeconds),
        min(READ_TIMEOUT_S, config.timeouts.readSeconds), pool_size=2)
    api.retry = RetryPolicy(attempts=1)
    return api


def _read_one(cluster: Any, config: Any, namespace: str | None) -> MemberRead:
    from activities.kube_api import ApiError, ClusterUnreachable
    from fleetq.fleet_config import FleetConfigError
    from fleetq.member_contract import MANAGED_BY

    read = MemberRead(cluster.name)
    try:
        api = cli_member_api(cluster, config)
    except FleetConfigError as exc:
        read.error = read.why = f"{cluster.name}: {exc}"
        return read
    selector = f"{MANAGED_BY}=fleetq"
    jobs = f"{JOBS_PATH}/namespaces/{namespace}/pytorchjobs" if namespace else \
        f"{JOBS_PATH}/pytorchjobs"
    pods = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
    try:
        read.jobs, _ = api.list(jobs, label_selector=selector)
        read.pods, _ = api.list(pods, label_selector=selector)
    except ClusterUnreachable as exc:
        read.jobs, read.pods = [], []
        read.error, read.why = str(exc), f"unreachable: {exc.why}"
    except ApiError as exc:
        read.jobs, read.pods = [], []
        read.error = f"{cluster.name}: {exc}"
        read.why = str(exc)
    except Exception as exc:  # never a traceback for a member that answers nonsense
        read.jobs, read.pods = [], []
        read.error = f"{cluster.name}: {type(exc).__name__}: {exc}"
        read.why = f"{type(exc).__name__}: {exc}"
    finally:
        api.close()
    return read


def read_members(namespace: str | None, config_path: str | None = None,
                 ) -> MemberSnapshot | None:
    """Every member's fleetq-managed jobs and pods (in ``namespace``, or all), read in
    parallel; None (after one note on stderr) when no fleet config is available.
    ``config_path`` defaults to ``FLEETQ_CONFIG``, else the running ``fleetq up``'s."""
    from fleetq.fleet_config import FleetConfigError, load_fleet_config

    try:
        path = config_path or fleet_config_path()
        config = load_fleet_config(path)
    except CliError:
        typer.echo(FALLBACK_NOTE.format(why="set FLEETQ_CONFIG, or --state-dir of a "
                                            "running fleetq up"), err=True)
        return None
    except FleetConfigError as exc:
        typer.echo(FALLBACK_NOTE.format(why=str(exc)), err=True)
        return None
    clusters = list(config.clusters)
    if not clusters:
        return MemberSnapshot({})
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_READS, len(clusters)),
                            thread_name_prefix="fleetq-member-read") as pool:
        reads = list(pool.map(lambda c: _read_one(c, config, namespace), clusters))
    return MemberSnapshot({r.cluster: r for r in reads})


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
               and not _meta(p).get("deletionTimestamp") for p in pods)


def _pods_running(pods: Iterable[dict[str, Any]]) -> bool:
    return any((p.get("status") or {}).get("phase") == "Running" for p in pods)


def copy_state(view: JobView | None, cluster: str, snap: MemberSnapshot,
               namespace: str, name: str) -> str | None:
    """STATE of one (job, member) row of ``get pytorchjob -M``; None = no row."""
    from fleetq.member_contract import job_phase

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
            if _meta(obj).get("deletionTimestamp"):
                return f"{phase}, being deleted"
            return phase
        if view.state in TERMINAL_STATES:
            return view.state  # its copy is gone, as it should be once the job ended
        if view.state in ("Validating", "Queued", "Scheduling", "Pending"):
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
    obj = snap.copies(namespace, name).get(cluster)
    if obj is not None:
        return age(_meta(obj).get("creationTimestamp"))
    if view is not None:
        return age(view.bound_at or view.created_at)
    return "<unknown>"


def member_copy_rows(views: list[JobView], snap: MemberSnapshot, all_namespaces: bool,
                     orphans: bool = False) -> tuple[list[str], list[list[Any]]]:
    """``get pytorchjob -M`` from the members: one row per (job, member) where the member
    holds a copy or fleetq thinks it does. With ``orphans``, also the fleetq-managed
    copies of jobs fleetq no longer has (deleted while their member was silent):
    ``Orphaned, still running``, ADOPTION ``N``."""
    headers = ["NAME", "CLUSTER", "STATE", "AGE", "ADOPTION"]
    rows: list[list[Any]] = []
    if orphans:
        known = {(v.namespace, v.name) for v in views}
        for ns, name in sorted(snap.job_keys() - known):
            for c in snap.clusters:
                state = copy_state(None, c, snap, ns, name)
                if state is not None:
                    rows.append([ns, name, c, state, copy_age(snap, None, ns, name, c), "N"])
    for v in views:
        clusters = expected_clusters(v)
        if v.cluster and v.cluster not in clusters:
            clusters.insert(0, v.cluster)  # a finished job: its last cluster
        for c in snap.clusters:
            if c not in clusters and (c in snap.copies(v.namespace, v.name)
                                      or snap.pods(v.namespace, v.name, c)):
                clusters.append(c)
        for c in clusters:
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
    if _meta(pod).get("deletionTimestamp"):
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
    from fleetq.member_contract import pod_restarts

    headers = ["NAME", "CLUSTER", "READY", "STATUS", "RESTARTS", "AGE"]
    if wide:
        headers.append("NODE")
    rows: list[tuple[tuple[Any, ...], list[Any]]] = []
    for cluster, pod in snap.all_pods():
        meta = _meta(pod)
        pname = str(meta.get("name") or "?")
        if (name is not None and pname != name) or (job is not None
                                                     and _job_key_of_pod(pod) != job):
            continue
        st = pod.get("status") or {}
        row: list[Any] = [pname, cluster, pod_ready(pod), pod_status(pod), pod_restarts(pod),
                          age(parse_time(st.get("startTime")) or meta.get("creationTimestamp"))]
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
        if name is not None and _meta(pod).get("name") != name:
            continue
        obj = dict(pod)
        meta = dict(_meta(pod))
        meta["annotations"] = {**(meta.get("annotations") or {}),
                               "fleetq.io/member-cluster": cluster}
        obj["metadata"] = meta
        out.append(obj)
    return out


def copies_line(view: JobView, snap: MemberSnapshot) -> str:
    """``describe``'s Copies line from the members: ``cluster-a (Running), ...``."""
    _, rows = member_copy_rows([view], snap, all_namespaces=False)
    return ", ".join(f"{r[1]} ({r[2]})" for r in rows)
