"""What the member clusters themselves hold, read directly from them.

The job workflows' ``status`` view says where fleetq *thinks* copies are; an operator
needs what the members *run*: an evicted copy whose pods still run, a copy that already
failed during the toleration window, a member that does not answer. So these reads go to
every member of the fleet config directly — one LIST of PyTorchJobs and one LIST of pods
per member, filtered by ``fleetq.io/managed-by``, all members in parallel, short timeouts
and no retries (a silent member costs one connect timeout, not a retry ladder).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from activities.kube_api import ApiError, ClusterUnreachable, KubeApi, RetryPolicy
from fleetq.client.errors import ClientError, NotFound
from fleetq.fleet_config import ClusterConfig, FleetConfig, FleetConfigError, load_fleet_config
from fleetq.member_contract import MANAGED_BY, PYTORCHJOB_API, meta_of
from fleetq.naming import KF_JOB_NAME

#: the client waits at most this long for a member (connect / read), and never retries
CONNECT_TIMEOUT_S = 2.0
READ_TIMEOUT_S = 5.0
MAX_PARALLEL_READS = 16
JOB_RESOURCE = "pytorchjobs.kubeflow.org"


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


def job_key_of_pod(pod: dict[str, Any]) -> tuple[str, str] | None:
    """``(namespace, job name)`` of the PyTorchJob a pod belongs to, if any."""
    meta = meta_of(pod)
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
                meta = meta_of(obj)
                key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
                self._jobs.setdefault(key, {})[cluster] = obj
            for pod in read.pods:
                pkey = job_key_of_pod(pod)
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
                      key=lambda p: str(meta_of(p).get("name")))

    def job_keys(self) -> set[tuple[str, str]]:
        return set(self._jobs) | set(self._pods)

    def all_pods(self) -> list[tuple[str, dict[str, Any]]]:
        """``(cluster, pod)`` for every fleetq-managed pod, in cluster then pod order."""
        out = []
        for cluster, read in self.reads.items():
            for pod in sorted(read.pods, key=lambda p: (str(meta_of(p).get("namespace")),
                                                        str(meta_of(p).get("name")))):
                out.append((cluster, pod))
        return out


# --------------------------------------------------------------------------- reading


def member_api(cluster: ClusterConfig, config: FleetConfig) -> KubeApi:
    """A :class:`KubeApi` for one member of ``config``, as the client uses it: short
    timeouts and no retries (a silent member is reported, not waited for)."""
    api = KubeApi.from_kubeconfig(
        cluster.name, config.cluster_kubeconfig(cluster), cluster.context_name,
        min(CONNECT_TIMEOUT_S, config.timeouts.connectSeconds),
        min(READ_TIMEOUT_S, config.timeouts.readSeconds), pool_size=2)
    api.retry = RetryPolicy(attempts=1)
    return api


def _jobs_path(namespace: str | None) -> str:
    """The PyTorchJob collection of ``namespace``, or of every namespace."""
    base = f"{PYTORCHJOB_API}/namespaces/{namespace}" if namespace else PYTORCHJOB_API
    return f"{base}/pytorchjobs"


def _read_one(cluster: ClusterConfig, config: FleetConfig, namespace: str | None) -> MemberRead:
    read = MemberRead(cluster.name)
    try:
        api = member_api(cluster, config)
    except FleetConfigError as exc:
        read.error = read.why = f"{cluster.name}: {exc}"
        return read
    selector = f"{MANAGED_BY}=fleetq"
    jobs = _jobs_path(namespace)
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


def read_members(config_path: str, namespace: str | None) -> MemberSnapshot:
    """Every member's fleetq-managed jobs and pods (in ``namespace``, or all), read in
    parallel. :class:`FleetConfigError` when the fleet config cannot be loaded."""
    config = load_fleet_config(config_path)
    clusters = list(config.clusters)
    if not clusters:
        return MemberSnapshot({})
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_READS, len(clusters)),
                            thread_name_prefix="fleetq-member-read") as pool:
        reads = list(pool.map(lambda c: _read_one(c, config, namespace), clusters))
    return MemberSnapshot({r.cluster: r for r in reads})


def member_of(config_path: str, cluster: str) -> tuple[ClusterConfig, FleetConfig]:
    """One member of the fleet config; :class:`ClientError` when the config cannot be
    loaded or has no such member."""
    try:
        config = load_fleet_config(config_path)
    except FleetConfigError as exc:
        raise ClientError(f"error: {exc}") from None
    for c in config.clusters:
        if c.name == cluster:
            return c, config
    known = ", ".join(c.name for c in config.clusters) or "none"
    raise ClientError(f"error: member cluster {cluster!r} is not in the fleet "
                      f"(clusters: {known})")


def member_jobs(config_path: str, cluster: str, namespace: str | None,
                name: str | None) -> list[dict[str, Any]]:
    """The PyTorchJobs one member holds (``name``: that one, else all in ``namespace``,
    else all), as the member returns them. :class:`NotFound` for a missing ``name``."""
    member, config = member_of(config_path, cluster)
    try:
        api = member_api(member, config)
    except FleetConfigError as exc:
        raise ClientError(f"error: {exc}") from None
    try:
        if name is not None:
            obj = api.get(f"{_jobs_path(namespace or 'default')}/{name}")
            if obj is None:
                raise NotFound(JOB_RESOURCE, name)
            return [obj]
        items, _ = api.list(_jobs_path(namespace))
        return items
    except (ApiError, ClusterUnreachable) as exc:
        raise ClientError(f"error: {exc}") from None
    finally:
        api.close()


@dataclass(frozen=True)
class MemberProbe:
    """A member's Ready condition as one direct probe sees it: ``True``, ``False`` (its
    API answers with errors) or ``Unknown`` (it does not answer), why, and its version."""

    ready: str = "Unknown"
    reason: str = ""
    version: str = ""


def probe_member(cluster: ClusterConfig, config: FleetConfig) -> MemberProbe:
    """Ask one member once (short timeouts, no retries) whether it is ready."""
    try:
        api = member_api(cluster, config)
    except FleetConfigError as exc:
        return MemberProbe(reason=str(exc))
    try:
        ready, reason = api.probe_ready()
        version = ""
        if ready == "True":
            status, body = api.call("GET", "/version", retry=False)
            if status == 200 and isinstance(body, dict):
                version = str(body.get("gitVersion") or "")
        return MemberProbe(ready, reason, version)
    except ClusterUnreachable as exc:
        return MemberProbe(reason=str(exc))
    finally:
        api.close()
