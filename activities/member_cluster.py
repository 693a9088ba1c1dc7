"""The Kubernetes member-cluster adapter: everything fleetq does to one member cluster.

Activities (``activities/scheduling.py``) call a :class:`MemberCluster` from a thread
pool; this module is plain synchronous code on the official ``kubernetes`` client and is
safe to call from many threads at once. It speaks only the standard Kubernetes REST API
plus PyTorchJob and Reservation custom resources (``docs/member-contract.md``), so the
same code drives real clusters and the emulator.

What travels back to workflows is deliberately small (the models of ``fleetq.messages``): names,
phases and counts — never node lists, secret data or kubeconfigs.

Robustness rules every call follows:

* every request has ``(connect, read)`` timeouts from the fleet config;
* 429/5xx and dropped connections are retried with jittered exponential backoff
  (honouring ``Retry-After``), bounded in attempts and total time; after that the call
  raises :class:`ClusterUnreachable` (retryable), as does a timeout;
* writes are idempotent: names derive from the job and its workflow id, ``AlreadyExists``
  is answered by reading the object back, and an object with our name but another
  ``fleetq.io/owner`` raises :class:`ConflictError` (non-retryable);
* ``status`` and ``capacity`` never raise for an unreachable cluster: they answer
  ``Unknown`` / ``reachable=False``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import random
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable
from urllib.parse import quote, urlencode

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.watch.watch import iter_resp_lines
from opentelemetry import trace

from fleetq import resources as R
from fleetq.capacity import ClusterSnapshot, Taint
from fleetq.cluster_health import ReadyStatus, TaintSettings, cluster_taints
from fleetq.fleet_config import FleetConfigError
from fleetq.kube_values import format_go_duration, go_duration_or_none, parse_rfc3339
from fleetq.messages import (
    MISSING_PHASE,
    BindRequest,
    BindResult,
    Health,
    JobRef,
    JobStatus,
    MemberTaint,
    PodReservation,
    PodStatus,
    PurgeResult,
    ReserveRequest,
    ReserveResult,
)
from fleetq.models import gang_of, parse_job
from fleetq.naming import KF_JOB_NAME, KF_REPLICA_INDEX, KF_REPLICA_TYPE

if TYPE_CHECKING:
    from activities.capacity_cache import CapacityCache

__all__ = [
    "ApiError",
    "ClusterUnreachable",
    "ConflictError",
    "FleetConfigError",
    "KubeApi",
    "KubernetesMemberCluster",
    "MemberCluster",
    "RetryPolicy",
]

log = logging.getLogger(__name__)
_TRACER = trace.get_tracer("fleetq.member")

# --------------------------------------------------------------------------- errors


class ConflictError(Exception):
    """An object with our name exists on the member and belongs to another fleet job.
    Non-retryable: retrying cannot make it ours."""


class ClusterUnreachable(Exception):
    """The member did not answer in time (or kept failing with 429/5xx): try later.

    ``str()`` is one human line, ``cluster-a: unreachable (connection refused)``;
    ``why`` is the part in brackets and ``request`` the call that failed (for logs)."""

    def __init__(
        self, cluster: str, why: str, request: str = "", *, status: int | None = None
    ) -> None:
        self.cluster = cluster
        self.why = why
        self.request = request
        #: the HTTP status that kept failing (429/5xx), None for a transport failure
        self.status = status
        super().__init__(f"{cluster}: unreachable ({why})")


def unreachable_why(exc: BaseException) -> str:
    """A transport failure in a few words (``connection refused``), not urllib3's text."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cur, ConnectionResetError | BrokenPipeError):
            return "connection reset"
        if isinstance(cur, urllib3.exceptions.SSLError):
            return "TLS handshake failed"
        if isinstance(cur, socket.gaierror):
            return "host name does not resolve"
        if isinstance(cur, urllib3.exceptions.MaxRetryError) and cur.reason is not None:
            cur = cur.reason
            continue
        cur = cur.__cause__ or cur.__context__
    text = str(exc).lower()
    for needle, why in (
        ("refused", "connection refused"),
        ("reset", "connection reset"),
        ("aborted", "connection reset"),
        ("timed out", "connection timed out"),
        ("name or service not known", "host name does not resolve"),
        ("ssl", "TLS handshake failed"),
        ("eof", "connection closed"),
    ):
        if needle in text:
            return why
    return type(exc).__name__


class ApiError(Exception):
    """A definite, non-retryable answer from the API server (4xx other than 429)."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(message)


# --------------------------------------------------------------------------- labels & names

MANAGED_BY = "fleetq.io/managed-by"
JOB_LABEL = "fleetq.io/job"
OWNER_LABEL = "fleetq.io/owner"
WORKFLOW_ANNOTATION = "fleetq.io/workflow-id"
RUN_SECONDS_ANNOTATION = "fleetq.io/run-seconds"
MIN_MEMBER_ANNOTATION = "fleetq.io/min-member"
GROUP_NAME_ANNOTATION = "scheduling.k8s.io/group-name"
RESERVATION_AFFINITY = "scheduling.koordinator.sh/reservation-affinity"

PYTORCHJOB_API = "/apis/kubeflow.org/v1"
#: runPolicy.managedBy of a job a MultiKueue manager dispatches: the member's operator
#: leaves such a job alone, so the member copy does not carry it
MULTIKUEUE_MANAGER = "kueue.x-k8s.io/multikueue"
RESERVATION_API = "/apis/scheduling.koordinator.sh/v1alpha1"


def job_label(namespace: str, name: str) -> str:
    """``fleetq.io/job`` value ``<ns>.<name>``, shortened with a hash to stay a valid
    label value (<= 63 characters)."""
    value = f"{namespace}.{name}"
    if len(value) <= 63:
        return value
    return f"{value[:54]}-{hashlib.sha256(value.encode()).hexdigest()[:8]}"


def reservation_name(job: JobRef, role: str, index: int) -> str:
    """``<job>-<ns>-<role>-<index>-<owner-id[:8]>`` (deterministic per workflow)."""
    return f"{job.name}-{job.namespace}-{role.lower()}-{index}-{job.owner_id[:8]}"


def job_labels(job: JobRef) -> dict[str, str]:
    """The labels every object fleetq creates for a job carries on the member."""
    return {
        MANAGED_BY: "fleetq",
        JOB_LABEL: job_label(job.namespace, job.name),
        OWNER_LABEL: job.owner_id,
    }


@runtime_checkable
class MemberCluster(Protocol):
    name: str
    labels: dict[str, str]
    reservation: bool

    def capacity(self) -> ClusterSnapshot: ...
    def reserve(self, req: ReserveRequest) -> ReserveResult: ...
    def release_reservations(self, job: JobRef) -> list[str]: ...
    def bind(self, req: BindRequest) -> BindResult: ...
    def status(self, job: JobRef) -> JobStatus: ...
    def wait_for_change(
        self,
        job: JobRef,
        since: str,
        timeout_s: float,
        heartbeat: Callable[[], None] | None = None,
    ) -> JobStatus: ...
    def purge(self, job: JobRef) -> PurgeResult: ...
    def leftovers(self, job: JobRef) -> list[str]: ...
    def probe_ready(self, read_s: float | None = None) -> tuple[ReadyStatus, str]: ...


def observed_changed(observed: str, since: str) -> bool:
    """Whether a status token differs from ``since``: a full token from an earlier status
    (any change counts), or ``"health/phase"`` (only a health or phase change counts)."""
    if since.count("/") == 1:
        return "/".join(observed.split("/")[:2]) != since
    return observed != since


# --------------------------------------------------------------------------- transport

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries for 429/5xx and dropped connections (not for timeouts: a member
    that does not answer within the read timeout is reported unreachable at once)."""

    attempts: int = 5
    base_s: float = 0.1
    cap_s: float = 2.0
    retry_after_cap_s: float = 10.0
    budget_s: float = 20.0

    def delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.retry_after_cap_s)
        backoff = min(self.cap_s, self.base_s * (2 ** (attempt - 1)))
        return backoff * random.uniform(0.5, 1.0)


def _retry_after(headers: Mapping[str, str] | None) -> float | None:
    if not headers:
        return None
    value = headers.get("Retry-After") or headers.get("retry-after")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return None


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text[:160]}" if text else type(exc).__name__


class WatchStream:
    """One open watch response; iterate for decoded events, ``close()`` from any thread."""

    def __init__(self, resp: Any) -> None:
        self._resp = resp
        self._closed = False

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for line in iter_resp_lines(self._resp):
            yield json.loads(line)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # shutdown() wakes a thread blocked in recv(); close() alone may not.
        conn = getattr(self._resp, "connection", None)
        sock = getattr(conn, "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(Exception):
            self._resp.close()


class KubeApi:
    """Raw JSON access to one API server with timeouts and bounded retries.

    Uses ``kubernetes.client.ApiClient`` for configuration, authentication (tokens, exec
    plugins, client certificates) and connection pooling, but keeps objects as plain
    dicts: decoding thousands of pods into generated model classes is slow, and we only
    need a few fields."""

    def __init__(
        self,
        name: str,
        api_client: k8s_client.ApiClient,
        connect_s: float = 3.0,
        read_s: float = 10.0,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.name = name
        self._client = api_client
        self.connect_s = connect_s
        self.read_s = read_s
        self.retry = retry or RetryPolicy()

    @classmethod
    def from_kubeconfig(
        cls,
        name: str,
        kubeconfig: str,
        context: str | None,
        connect_s: float = 3.0,
        read_s: float = 10.0,
        field: str = "kubeconfig",
        pool_size: int = 32,
    ) -> KubeApi:
        cfg = k8s_client.Configuration()
        try:
            k8s_config.load_kube_config(
                config_file=kubeconfig,
                context=context,
                client_configuration=cfg,
                persist_config=False,
            )
        except Exception as exc:  # ConfigException, yaml errors, missing files...
            raise FleetConfigError(
                f"{field}: cannot use context {context!r} of {kubeconfig}: {_short(exc)}"
            ) from None
        cfg.retries = False  # we retry ourselves, with our own bounds
        cfg.connection_pool_maxsize = pool_size
        cfg.keep_alive = True  # TCP keepalive: a dead peer does not hang a watch forever
        return cls(name, k8s_client.ApiClient(cfg), connect_s, read_s)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._client.close()

    # -- low level

    def _send(
        self,
        method: str,
        path: str,
        body: Any,
        content_type: str,
        timeout: tuple[float, float],
    ) -> Any:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        m, url, hdrs, b, post = self._client.param_serialize(
            method=method,
            resource_path=path,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        return self._client.call_api(m, url, hdrs, b, post, _request_timeout=timeout)

    def call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = "application/json",
        timeout: tuple[float, float] | None = None,
        retry: bool = True,
    ) -> tuple[int, Any]:
        """One request with retries; returns ``(status, decoded JSON or None)`` for any
        definite answer; raises :class:`ClusterUnreachable` otherwise. A write is one
        OpenTelemetry span (``member POST``...), a child of the activity's span when
        tracing is on (a no-op otherwise)."""
        if method == "GET":
            return self._call(method, path, body, content_type, timeout, retry)
        with _TRACER.start_as_current_span(
            f"member {method}",
            attributes={"fleetq.member": self.name, "http.target": path.split("?", 1)[0]},
        ):
            return self._call(method, path, body, content_type, timeout, retry)

    def _call(
        self,
        method: str,
        path: str,
        body: Any,
        content_type: str,
        timeout: tuple[float, float] | None,
        retry: bool,
    ) -> tuple[int, Any]:
        tmo = timeout or (self.connect_s, self.read_s)
        policy = self.retry
        start = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            retry_after: float | None = None
            try:
                resp = self._send(method, path, body, content_type, tmo)
                data = resp.read()
                status = int(resp.status)
                headers = resp.headers
                with contextlib.suppress(Exception):
                    resp.response.release_conn()
            except urllib3.exceptions.NewConnectionError as exc:
                # Refused: one quick retry (an API server restarting), then give up.
                failure = ClusterUnreachable(self.name, unreachable_why(exc), f"{method} {path}")
                if attempt >= 2:
                    raise failure from None
            except urllib3.exceptions.TimeoutError:
                raise ClusterUnreachable(
                    self.name, f"no answer within {tmo[0]:g}s/{tmo[1]:g}s", f"{method} {path}"
                ) from None
            except (urllib3.exceptions.HTTPError, OSError, k8s_client.ApiException) as exc:
                failure = ClusterUnreachable(self.name, unreachable_why(exc), f"{method} {path}")
            else:
                if status not in RETRY_STATUSES:
                    try:
                        decoded = json.loads(data) if data else None
                    except ValueError:
                        decoded = {"message": data[:200].decode("utf-8", "replace")}
                    return status, decoded
                retry_after = _retry_after(headers)
                failure = ClusterUnreachable(
                    self.name,
                    f"HTTP {status} after {attempt} attempt{'s' if attempt > 1 else ''}",
                    f"{method} {path}",
                    status=status,
                )
            if not retry or attempt >= policy.attempts:
                raise failure
            delay = policy.delay(attempt, retry_after)
            if time.monotonic() - start + delay > policy.budget_s:
                raise failure
            time.sleep(delay)

    def _fail(self, method: str, path: str, status: int, obj: Any) -> ApiError:
        msg = obj.get("message", "") if isinstance(obj, dict) else ""
        return ApiError(status, f"cluster {self.name}: {method} {path}: HTTP {status}: {msg}")

    # -- verbs

    def get(self, path: str) -> dict[str, Any] | None:
        status, obj = self.call("GET", path)
        if status == 404:
            return None
        if status >= 300:
            raise self._fail("GET", path, status, obj)
        return obj  # type: ignore[no-any-return]

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """POST; the created object, or None if it already exists (409 AlreadyExists)."""
        status, obj = self.call("POST", path, body=body)
        if status == 409 and isinstance(obj, dict) and obj.get("reason") in ("AlreadyExists", None):
            return None
        if status >= 300:
            raise self._fail("POST", path, status, obj)
        return obj  # type: ignore[no-any-return]

    def delete(self, path: str, propagation: str | None = None, retry: bool = True) -> bool:
        """DELETE; False if it was already gone."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if propagation:
            body["propagationPolicy"] = propagation
        status, obj = self.call("DELETE", path, body=body, retry=retry)
        if status == 404:
            return False
        if status >= 300:
            raise self._fail("DELETE", path, status, obj)
        return True

    def list(
        self,
        path: str,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
    ) -> tuple[list[dict[str, Any]], str]:
        """Paginated LIST; returns ``(items, resourceVersion)``."""
        items: list[dict[str, Any]] = []
        cont = ""
        rv = ""
        while True:
            query: dict[str, str] = {"limit": str(page_size)}
            if label_selector:
                query["labelSelector"] = label_selector
            if field_selector:
                query["fieldSelector"] = field_selector
            if cont:
                query["continue"] = cont
            full = f"{path}?{urlencode(query)}"
            status, obj = self.call("GET", full)
            if status >= 300 or not isinstance(obj, dict):
                raise self._fail("GET", path, status, obj)
            items.extend(obj.get("items") or [])
            meta = obj.get("metadata") or {}
            rv = str(meta.get("resourceVersion") or rv)
            cont = str(meta.get("continue") or "")
            if not cont:
                return items, rv

    def watch(self, path: str, resource_version: str, timeout_s: int) -> WatchStream:
        """Open a watch from ``resource_version``; ApiError(410) when it is too old."""
        query = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_s),
        }
        full = f"{path}?{urlencode(query)}"
        tmo = (self.connect_s, timeout_s + self.read_s)
        try:
            resp = self._send("GET", full, None, "application/json", tmo)
        except (urllib3.exceptions.HTTPError, OSError, k8s_client.ApiException) as exc:
            raise ClusterUnreachable(self.name, unreachable_why(exc), f"watch {path}") from None
        status = int(resp.status)
        if status != 200:
            try:
                obj = json.loads(resp.read() or b"null")
            except ValueError:
                obj = None
            if status in RETRY_STATUSES:
                raise ClusterUnreachable(
                    self.name, f"HTTP {status}", f"watch {path}", status=status
                )
            raise self._fail("WATCH", path, status, obj)
        return WatchStream(resp.response)

    def probe(self) -> bool:
        """Does the API server answer at all (any non-5xx status counts)?"""
        return self.probe_ready()[0] == "True"

    def probe_ready(self, read_s: float | None = None) -> tuple[ReadyStatus, str]:
        """The member's Ready condition from one ``GET /version`` (read timeout
        ``read_s``, default the configured one): ``True`` (it answers), ``False`` (it
        answers with 5xx/429: up but not serving) or ``Unknown`` (no answer), with a
        one-line reason."""
        timeout = None if read_s is None else (self.connect_s, min(self.read_s, read_s))
        try:
            status, _ = self.call("GET", "/version", retry=False, timeout=timeout)
        except ClusterUnreachable as exc:
            if exc.status is not None:
                return "False", f"{self.name}: not ready (HTTP {exc.status})"
            return "Unknown", str(exc)
        if status >= 500:
            return "False", f"{self.name}: not ready (HTTP {status})"
        return "True", ""


# --------------------------------------------------------------------------- helpers


def _meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    m = obj.get("metadata")
    return m if isinstance(m, dict) else {}


def _labels(obj: Mapping[str, Any]) -> dict[str, str]:
    labels = _meta(obj).get("labels")
    return labels if isinstance(labels, dict) else {}


def _q(name: str) -> str:
    return quote(name, safe="")


def _templates(manifest: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(role, template)`` for every replica spec of a PyTorchJob manifest."""
    specs = (manifest.get("spec") or {}).get("pytorchReplicaSpecs") or {}
    out = []
    for role, rs in specs.items():
        if isinstance(rs, dict) and isinstance(rs.get("template"), dict):
            out.append((str(role), rs["template"]))
    return out


DEP_KINDS = {
    "ConfigMap": "configmaps",
    "Secret": "secrets",
    "PersistentVolumeClaim": "persistentvolumeclaims",
    "ServiceAccount": "serviceaccounts",
}


def referenced_deps(manifest: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(kind, name)`` of every ConfigMap, Secret, PVC and ServiceAccount the pod
    templates reference, sorted. Pod templates can only reference objects in their own
    namespace, so names are namespace-less by construction."""
    found: set[tuple[str, str]] = set()

    def add(kind: str, name: Any) -> None:
        if isinstance(name, str) and name:
            found.add((kind, name))

    for _role, template in _templates(manifest):
        spec = template.get("spec") or {}
        for vol in spec.get("volumes") or []:
            if not isinstance(vol, dict):
                continue
            add("ConfigMap", (vol.get("configMap") or {}).get("name"))
            add("Secret", (vol.get("secret") or {}).get("secretName"))
            add("PersistentVolumeClaim", (vol.get("persistentVolumeClaim") or {}).get("claimName"))
            for src in (vol.get("projected") or {}).get("sources") or []:
                if isinstance(src, dict):
                    add("ConfigMap", (src.get("configMap") or {}).get("name"))
                    add("Secret", (src.get("secret") or {}).get("name"))
        for key in ("containers", "initContainers", "ephemeralContainers"):
            for c in spec.get(key) or []:
                if not isinstance(c, dict):
                    continue
                for ef in c.get("envFrom") or []:
                    if isinstance(ef, dict):
                        add("ConfigMap", (ef.get("configMapRef") or {}).get("name"))
                        add("Secret", (ef.get("secretRef") or {}).get("name"))
                for env in c.get("env") or []:
                    vf = env.get("valueFrom") if isinstance(env, dict) else None
                    if isinstance(vf, dict):
                        add("ConfigMap", (vf.get("configMapKeyRef") or {}).get("name"))
                        add("Secret", (vf.get("secretKeyRef") or {}).get("name"))
        for ips in spec.get("imagePullSecrets") or []:
            if isinstance(ips, dict):
                add("Secret", ips.get("name"))
        sa = spec.get("serviceAccountName") or spec.get("serviceAccount")
        if sa and sa != "default":  # every namespace has its own "default"
            add("ServiceAccount", sa)
    return sorted(found)


_DROP_ANNOTATION_PREFIXES = (
    "pv.kubernetes.io/",
    "volume.kubernetes.io/",
    "volume.beta.kubernetes.io/",
    "kubectl.kubernetes.io/last-applied-configuration",
)


def _copy_dep(kind: str, obj: Mapping[str, Any], job: JobRef) -> dict[str, Any] | None:
    """A clean copy of a dependency for the member (None if it cannot travel)."""
    meta = _meta(obj)
    annotations = {
        k: v
        for k, v in (meta.get("annotations") or {}).items()
        if not k.startswith(_DROP_ANNOTATION_PREFIXES)
    }
    annotations[WORKFLOW_ANNOTATION] = job.workflow_id
    out: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": kind,
        "metadata": {
            "name": meta.get("name"),
            "namespace": job.namespace,
            "labels": {**(meta.get("labels") or {}), **job_labels(job)},
            "annotations": annotations,
        },
    }
    if kind in ("ConfigMap", "Secret"):
        if kind == "Secret" and obj.get("type") == "kubernetes.io/service-account-token":
            return None  # minted per cluster by the token controller
        for key in ("data", "binaryData", "stringData", "type", "immutable"):
            if key in obj:
                out[key] = obj[key]
    elif kind == "PersistentVolumeClaim":
        spec = dict(obj.get("spec") or {})
        spec.pop("volumeName", None)  # bound to a volume of the source cluster
        out["spec"] = spec
    elif kind == "ServiceAccount":
        for key in ("imagePullSecrets", "automountServiceAccountToken"):
            if key in obj:
                out[key] = obj[key]
    return out


def _drop_none(value: Any) -> Any:
    """Drop null fields (pydantic dumps unset optionals as None; structural CRD schemas
    would reject or prune them)."""
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


def _pod_ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    for cond in status.get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == "Ready":
            return cond.get("status") == "True"
    cs = status.get("containerStatuses") or []
    return bool(cs) and all(isinstance(c, dict) and c.get("ready") for c in cs)


def pod_restarts(pod: Mapping[str, Any]) -> int:
    """Container restarts of a pod, summed (kubectl's RESTARTS)."""
    total = 0
    for c in (pod.get("status") or {}).get("containerStatuses") or []:
        if isinstance(c, dict):
            with contextlib.suppress(TypeError, ValueError):
                total += int(c.get("restartCount") or 0)
    return total


_PHASE_OF_CONDITION = {
    "Created": "Created",
    "Running": "Running",
    "Restarting": "Running",
    "Succeeded": "Succeeded",
    "Failed": "Failed",
}


def job_phase(job_obj: Mapping[str, Any]) -> tuple[str, str]:
    """``(phase, message)`` from a PyTorchJob's conditions: the last True one wins; a
    job without conditions yet is ``Created``."""
    phase, message = "Created", ""
    for cond in (job_obj.get("status") or {}).get("conditions") or []:
        if not isinstance(cond, dict) or cond.get("status") != "True":
            continue
        mapped = _PHASE_OF_CONDITION.get(str(cond.get("type")))
        if mapped:
            phase = mapped
            message = str(cond.get("message") or cond.get("reason") or "")
    return phase, message


def _owned_by(pod: Mapping[str, Any], uid: str) -> bool:
    return any(
        isinstance(ref, dict) and ref.get("uid") == uid
        for ref in _meta(pod).get("ownerReferences") or []
    )


# --------------------------------------------------------------------------- the adapter


class _ReserveFailed(Exception):
    pass


class KubernetesMemberCluster:
    """One member cluster reached through a kubeconfig context.

    ``capacity()`` reads the watch-fed :class:`~activities.capacity_cache.CapacityCache`;
    every other method talks to the API server directly."""

    def __init__(
        self,
        name: str,
        api: KubeApi,
        *,
        labels: Mapping[str, str] | None = None,
        reservation: bool = False,
        taints: tuple[Taint, ...] = (),
        source: KubeApi | None = None,
        cache_ttl_s: float = 2.0,
        cache: CapacityCache | None = None,
        start_cache: bool = True,
        reserve_poll_s: float = 5.0,
        unschedulable_grace_s: float = 60.0,
        recheck_s: float = 15.0,
        heartbeat_s: float = 5.0,
        failover: TaintSettings | None = None,
    ) -> None:
        self.name = name
        self.labels = dict(labels or {})
        self.reservation = reservation
        self.taints = taints
        self.api = api
        self.source = source
        self.reserve_poll_s = reserve_poll_s
        self.unschedulable_grace_s = unschedulable_grace_s
        self.recheck_s = recheck_s
        self.heartbeat_s = heartbeat_s
        if cache is None:
            from activities.capacity_cache import CapacityCache

            cache = CapacityCache(
                api,
                name=name,
                labels=self.labels,
                taints=taints,
                reservation=reservation,
                ttl_s=cache_ttl_s,
                failover=failover,
            )
        self.cache = cache
        if start_cache:
            self.cache.start()

    def close(self) -> None:
        self.cache.close()

    def __repr__(self) -> str:
        return f"KubernetesMemberCluster({self.name!r})"

    # -- paths

    @staticmethod
    def _job_path(ns: str, name: str = "") -> str:
        base = f"{PYTORCHJOB_API}/namespaces/{_q(ns)}/pytorchjobs"
        return f"{base}/{_q(name)}" if name else base

    @staticmethod
    def _reservation_path(name: str = "") -> str:
        base = f"{RESERVATION_API}/reservations"
        return f"{base}/{_q(name)}" if name else base

    @staticmethod
    def _core_path(ns: str, plural: str, name: str = "") -> str:
        base = f"/api/v1/namespaces/{_q(ns)}/{plural}"
        return f"{base}/{_q(name)}" if name else base

    # -- capacity

    def capacity(self) -> ClusterSnapshot:
        """The cached snapshot (shared, treat as read-only); ``reachable=False`` when
        the cache cannot vouch for the cluster."""
        return self.cache.snapshot()

    def snapshot_by_list(self) -> ClusterSnapshot:
        """Cold path: a fresh LIST of nodes, pods and reservations."""
        return self.cache.snapshot_by_list()

    # -- reservations

    def _reservation_body(self, job: JobRef, pod: PodReservation, ttl_s: int) -> dict[str, Any]:
        template_spec: dict[str, Any] = {
            "nodeName": pod.node,
            "containers": [
                {"name": "reserve", "resources": {"requests": R.to_quantity_map(pod.requests)}}
            ],
        }
        if pod.node_selector:
            template_spec["nodeSelector"] = dict(pod.node_selector)
        if pod.tolerations:
            template_spec["tolerations"] = [dict(t) for t in pod.tolerations]
        return {
            "apiVersion": "scheduling.koordinator.sh/v1alpha1",
            "kind": "Reservation",
            "metadata": {
                "name": reservation_name(job, pod.role, pod.index),
                "labels": job_labels(job),
                "annotations": {WORKFLOW_ANNOTATION: job.workflow_id},
            },
            "spec": {
                "template": {"metadata": {"namespace": job.namespace}, "spec": template_spec},
                "owners": [
                    {
                        "labelSelector": {
                            "matchLabels": {
                                KF_JOB_NAME: job.name,
                                KF_REPLICA_TYPE: pod.role.lower(),
                                KF_REPLICA_INDEX: str(pod.index),
                            }
                        }
                    }
                ],
                "ttl": format_go_duration(ttl_s),
                "allocateOnce": True,
            },
        }

    @staticmethod
    def _reservation_node(obj: Mapping[str, Any]) -> str:
        node = (obj.get("status") or {}).get("nodeName")
        if not node:
            node = (((obj.get("spec") or {}).get("template") or {}).get("spec") or {}).get(
                "nodeName"
            )
        return str(node or "")

    @staticmethod
    def _seconds_left(obj: Mapping[str, Any]) -> float | None:
        spec = obj.get("spec") or {}
        expires = parse_rfc3339(spec.get("expires"))
        if expires is None:
            created = parse_rfc3339(_meta(obj).get("creationTimestamp"))
            ttl = go_duration_or_none(spec.get("ttl"))
            if created is None or ttl is None:
                return None
            return created.timestamp() + ttl - time.time()
        return expires.timestamp() - time.time()

    def _why(self, pod: PodReservation, obj: Mapping[str, Any]) -> str:
        status = obj.get("status") or {}
        phase = status.get("phase") or "Pending"
        msg = status.get("message") or status.get("reason") or ""
        if not msg:
            for cond in status.get("conditions") or []:
                if isinstance(cond, dict) and cond.get("message"):
                    msg = cond["message"]
        where = self._reservation_node(obj) or pod.node
        text = f"reservation {pod.role.lower()}-{pod.index} on node {where}: {phase}"
        return f"{text}: {msg}" if msg else text

    def _ensure_reservation(self, job: JobRef, pod: PodReservation, ttl_s: int) -> dict[str, Any]:
        body = self._reservation_body(job, pod, ttl_s)
        name = body["metadata"]["name"]
        path = self._reservation_path(name)
        for _ in range(5):
            created = self.api.create(self._reservation_path(), body)
            if created is not None:
                return created
            existing = self.api.get(path)
            if existing is None:
                continue  # deleted in between: create again
            theirs = _labels(existing).get(OWNER_LABEL)
            if theirs != job.owner_id:
                raise ConflictError(
                    f"cluster {self.name}: Reservation {name} belongs to another fleet job "
                    f"(fleetq.io/owner {theirs or 'unset'})"
                )
            phase = (existing.get("status") or {}).get("phase") or "Pending"
            left = self._seconds_left(existing)
            fresh = left is None or left > min(60.0, ttl_s / 2)
            if (
                phase in ("Pending", "Available")
                and self._reservation_node(existing) == pod.node
                and fresh
            ):
                return existing  # ours from an earlier attempt, still good
            # Expired, used, failed or pinned elsewhere: never reuse, replace it.
            self.api.delete(path)
            self._wait_gone(path, 2.0)
        raise _ReserveFailed(
            f"reservation {pod.role.lower()}-{pod.index} on node {pod.node}: "
            f"could not replace the previous {name}"
        )

    def _wait_gone(self, path: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.api.get(path) is None:
                return
            time.sleep(0.05)

    def reserve(self, req: ReserveRequest) -> ReserveResult:
        """Hold room for every pod of the gang, or for none.

        One Reservation per pod, pinned to the node placement chose. A reservation that
        ends ``Failed`` (or is not ``Available`` after ``reserve_poll_s``) rolls back all
        of this request's reservations and the result says why. If the cluster stops
        answering midway the result is ``ok=False`` too; anything the rollback could not
        delete expires with its TTL (and ``release_reservations`` is safe to repeat)."""
        job = req.job
        if not self.reservation:
            return ReserveResult(
                ok=False, reason=f"cluster {self.name} does not support Reservations"
            )
        names = [reservation_name(job, p.role, p.index) for p in req.pods]
        state: dict[str, tuple[PodReservation, dict[str, Any]]] = {}
        try:
            for pod, name in zip(req.pods, names, strict=True):
                obj = self._ensure_reservation(job, pod, req.ttl_seconds)
                state[name] = (pod, obj)
                if (obj.get("status") or {}).get("phase") in ("Failed", "Succeeded"):
                    raise _ReserveFailed(self._why(pod, obj))
            deadline = time.monotonic() + self.reserve_poll_s
            step = 0.05
            while True:
                waiting = [
                    n for n, (_, o) in state.items()
                    if (o.get("status") or {}).get("phase") != "Available"
                ]
                if not waiting:
                    break
                if time.monotonic() >= deadline:
                    pod, obj = state[waiting[0]]
                    raise _ReserveFailed(
                        f"{self._why(pod, obj)} (not Available after {self.reserve_poll_s:g}s)"
                    )
                time.sleep(step)
                step = min(step * 2, 0.5)
                for n in waiting:
                    pod, _ = state[n]
                    fresh = self.api.get(self._reservation_path(n))
                    if fresh is None:
                        raise _ReserveFailed(
                            f"reservation {pod.role.lower()}-{pod.index} on node {pod.node}: "
                            "deleted while waiting"
                        )
                    state[n] = (pod, fresh)
                    if (fresh.get("status") or {}).get("phase") in ("Failed", "Succeeded"):
                        raise _ReserveFailed(self._why(pod, fresh))
            return ReserveResult(ok=True, reservations=names)
        except _ReserveFailed as exc:
            self._rollback(names)
            return ReserveResult(ok=False, reason=str(exc))
        except ClusterUnreachable as exc:
            self._rollback(names, retry=False)
            return ReserveResult(ok=False, reason=str(exc))
        except ApiError as exc:  # e.g. the Reservation CRD is not installed
            self._rollback(names)
            return ReserveResult(ok=False, reason=str(exc))
        except ConflictError:
            self._rollback([n for n in names if n in state])
            raise

    def _rollback(self, names: list[str], retry: bool = True) -> None:
        for n in names:
            try:
                self.api.delete(self._reservation_path(n), retry=retry)
            except (ClusterUnreachable, ApiError) as exc:
                # It expires with its TTL; release_reservations() can be repeated later.
                log.warning("cluster %s: could not roll back Reservation %s: %s", self.name, n, exc)
                if not retry:
                    return

    def release_reservations(self, job: JobRef) -> list[str]:
        """Delete every reservation of this job (by owner label); names deleted.
        Safe to repeat; raises :class:`ClusterUnreachable` if it cannot be done now."""
        try:
            items, _ = self.api.list(
                self._reservation_path(), label_selector=f"{OWNER_LABEL}={job.owner_id}"
            )
        except ApiError as exc:
            if exc.status == 404:  # no Reservation API on this cluster: nothing to release
                return []
            raise
        deleted = []
        for obj in items:
            name = str(_meta(obj).get("name") or "")
            if name and self.api.delete(self._reservation_path(name)):
                deleted.append(name)
        return sorted(deleted)

    # -- bind

    def _ensure_namespace(self, ns: str) -> None:
        path = f"/api/v1/namespaces/{_q(ns)}"
        if self.api.get(path) is not None:
            return
        self.api.create(
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        )

    def member_manifest(self, req: BindRequest) -> dict[str, Any]:
        """The PyTorchJob we create on the member, from the user's manifest."""
        job = req.job
        src = _drop_none(json.loads(json.dumps(req.manifest)))  # deep, JSON-clean copy
        meta = src.get("metadata") or {}
        labels = {**(meta.get("labels") or {}), **job_labels(job)}
        annotations = {
            k: v
            for k, v in (meta.get("annotations") or {}).items()
            if k != "kubectl.kubernetes.io/last-applied-configuration"
        }
        spec = src.get("spec") or {}
        # the gang fleetq admitted and placed: every replica, or the minimum the job may
        # start with (minAvailable / elasticPolicy); a minAvailable written stays as is
        minimum = len(gang_of(parse_job(req.manifest)).pods)
        annotations[WORKFLOW_ANNOTATION] = job.workflow_id
        annotations[GROUP_NAME_ANNOTATION] = job.name
        annotations[MIN_MEMBER_ANNOTATION] = str(minimum)
        if req.run_seconds is not None and RUN_SECONDS_ANNOTATION not in annotations:
            annotations[RUN_SECONDS_ANNOTATION] = str(req.run_seconds)
        run_policy = spec.setdefault("runPolicy", {})
        run_policy.setdefault("schedulingPolicy", {}).setdefault("minAvailable", minimum)
        # fleetq carries out runPolicy.suspend itself (no copy while suspended): a copy
        # exists only to run
        run_policy.pop("suspend", None)
        # spec.cleanPodPolicy (the walkthrough writes it there, as PyTorchJobs before
        # runPolicy did) is runPolicy.cleanPodPolicy in kubeflow.org/v1: a real API server
        # would prune it, so the member copy carries it where the operator reads it
        legacy = spec.pop("cleanPodPolicy", None)
        if legacy is not None:
            run_policy.setdefault("cleanPodPolicy", legacy)
        if run_policy.get("managedBy") == MULTIKUEUE_MANAGER:
            # the member's own training-operator must run the copy fleetq placed there
            del run_policy["managedBy"]
        affinity = json.dumps(
            {"reservationSelector": {OWNER_LABEL: job.owner_id}}, separators=(",", ":")
        )
        for _role, template in _templates(src):
            tmeta = template.setdefault("metadata", {})
            tmeta["labels"] = {**(tmeta.get("labels") or {}), **job_labels(job)}
            if req.reserved:
                tmeta["annotations"] = {
                    **(tmeta.get("annotations") or {}),
                    RESERVATION_AFFINITY: affinity,
                }
        return {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {
                "name": job.name,
                "namespace": job.namespace,
                "labels": labels,
                "annotations": annotations,
            },
            "spec": spec,
        }

    def _propagate(self, req: BindRequest) -> list[str]:
        if self.source is None:
            raise FleetConfigError(
                "source: propagateDeps needs a source cluster in the fleet config"
            )
        job = req.job
        out = []
        for kind, name in referenced_deps(req.manifest):
            plural = DEP_KINDS[kind]
            # Same namespace only: a pod template cannot reference another namespace.
            obj = self.source.get(self._core_path(job.namespace, plural, name))
            if obj is None:
                log.warning(
                    "cluster %s: %s %s/%s referenced by %s is missing on the source",
                    self.name, kind, job.namespace, name, job.ref,
                )
                continue
            body = _copy_dep(kind, obj, job)
            if body is None:
                continue
            # An existing copy is left alone: it may be shared with another job.
            self.api.create(self._core_path(job.namespace, plural), body)
            out.append(f"{kind} {job.namespace}/{name}")
        return out

    def bind(self, req: BindRequest) -> BindResult:
        """Create the member PyTorchJob (and its deps); idempotent across retries."""
        job = req.job
        self._ensure_namespace(job.namespace)
        deps = self._propagate(req) if req.propagate_deps else []
        body = self.member_manifest(req)
        path = self._job_path(job.namespace, job.name)
        for _ in range(3):
            created = self.api.create(self._job_path(job.namespace), body)
            if created is not None:
                return BindResult(created=True, uid=str(_meta(created).get("uid") or ""), deps=deps)
            existing = self.api.get(path)
            if existing is None:
                continue
            theirs = _labels(existing).get(OWNER_LABEL)
            if theirs != job.owner_id:
                raise ConflictError(
                    f"cluster {self.name}: PyTorchJob {job.ref} already exists and belongs to "
                    f"another fleet job (fleetq.io/owner {theirs or 'unset'})"
                )
            return BindResult(created=False, uid=str(_meta(existing).get("uid") or ""), deps=deps)
        raise ClusterUnreachable(self.name, f"PyTorchJob {job.ref} kept vanishing")

    # -- status

    def _unknown(self, reason: str) -> JobStatus:
        cond = self.cache.condition()
        if cond.ready == "True":  # the cache still vouches for it: a passing failure
            taints: tuple[Taint, ...] = ()
        else:
            taints = cluster_taints(cond, self.cache.failover)
            reason = cond.reason or reason
        return JobStatus(
            cluster=self.name,
            health="Unknown",
            phase="Unknown",
            reason=reason,
            # no "/" in the token: "health/phase" tokens are told apart by one "/"
            observed=f"Unknown#{cond.ready}" if taints else "Unknown",
            taints=[MemberTaint.of(t) for t in taints],
        )

    def status(self, job: JobRef) -> JobStatus:
        """Where the job stands on this member. Never raises: a member that does not
        answer within the timeout (or keeps failing) yields ``Unknown``."""
        try:
            return self._status(job)
        except ClusterUnreachable as exc:
            return self._unknown(str(exc))
        except ApiError as exc:
            return self._unknown(str(exc))

    def _status(self, job: JobRef) -> JobStatus:
        obj = self.api.get(self._job_path(job.namespace, job.name))
        finished = (
            self.cache.finished_job(job.namespace, job.name, job.owner_id) if obj is None else None
        )
        if finished is not None:  # finished, then deleted by the member (its TTL)
            phase, message = finished
            health: Health = "Healthy" if phase == "Succeeded" else "Unhealthy"
            return JobStatus(
                cluster=self.name,
                health=health,
                phase=phase,
                reason=f"{message or phase} (the member has since deleted its copy, "
                "ttlSecondsAfterFinished)",
                observed=f"{health}/{phase}/deleted",
            )
        if obj is None or _labels(obj).get(OWNER_LABEL) != job.owner_id:
            reason = (
                f"PyTorchJob {job.ref} not found on {self.name}"
                if obj is None
                else f"PyTorchJob {job.ref} on {self.name} belongs to another fleet job"
            )
            return JobStatus(
                cluster=self.name, health="Unhealthy", phase=MISSING_PHASE, reason=reason,
                observed=MISSING_PHASE,
            )
        uid = str(_meta(obj).get("uid") or "")
        items, _ = self.api.list(
            self._core_path(job.namespace, "pods"), label_selector=f"{KF_JOB_NAME}={job.name}"
        )
        pods = [p for p in items if not _meta(p).get("ownerReferences") or _owned_by(p, uid)]
        pods.sort(key=lambda p: str(_meta(p).get("name")))
        phase, message = job_phase(obj)
        health = "Healthy"
        reason = message
        now = time.time()
        pod_statuses = []
        problems: list[str] = []
        for p in pods:
            st = p.get("status") or {}
            pname = str(_meta(p).get("name") or "")
            pphase = str(st.get("phase") or "Pending")
            pod_statuses.append(
                PodStatus(
                    name=pname,
                    node=str((p.get("spec") or {}).get("nodeName") or ""),
                    phase=pphase,
                    ready=_pod_ready(p),
                    restarts=pod_restarts(p),
                    start_time=st.get("startTime"),
                )
            )
            if pphase == "Failed":
                why = st.get("message") or st.get("reason") or "no reason given"
                problems.append(f"pod {pname} Failed: {why}")
            elif pphase == "Pending":
                for cond in st.get("conditions") or []:
                    if (
                        isinstance(cond, dict)
                        and cond.get("type") == "PodScheduled"
                        and cond.get("status") == "False"
                    ):
                        since = parse_rfc3339(cond.get("lastTransitionTime")) or parse_rfc3339(
                            _meta(p).get("creationTimestamp")
                        )
                        waited = now - since.timestamp() if since is not None else 0.0
                        if waited > self.unschedulable_grace_s:
                            why = cond.get("message") or cond.get("reason") or "Unschedulable"
                            problems.append(
                                f"pod {pname} cannot be scheduled for {waited:.0f}s: {why}"
                            )
        if phase == "Failed":
            health = "Unhealthy"
            reason = message or "PyTorchJob Failed"
        elif phase != "Succeeded" and problems:
            health = "Unhealthy"
            reason = "; ".join(problems)
        replica_statuses: dict[str, dict[str, int]] = {}
        for role, counts in ((obj.get("status") or {}).get("replicaStatuses") or {}).items():
            if isinstance(counts, dict):
                replica_statuses[str(role)] = {
                    k: int(v)
                    for k, v in counts.items()
                    if isinstance(v, int) and not isinstance(v, bool)
                }
        digest = hashlib.sha1(
            "|".join(
                f"{_meta(p).get('name')}@{_meta(p).get('resourceVersion')}" for p in pods
            ).encode()
        ).hexdigest()[:12]
        observed = f"{health}/{phase}/{_meta(obj).get('resourceVersion', '')}/{digest}"
        return JobStatus(
            cluster=self.name,
            health=health,
            phase=phase,
            reason=reason,
            pods=pod_statuses,
            replica_statuses=replica_statuses,
            observed=observed,
        )

    def wait_for_change(
        self,
        job: JobRef,
        since: str,
        timeout_s: float,
        heartbeat: Callable[[], None] | None = None,
    ) -> JobStatus:
        """Block until ``status(job).observed != since`` or ``timeout_s`` passes.

        Woken by the cache's watches (the job's pods and the PyTorchJob itself) and by
        reachability changes; re-reads the status only then, or every ``recheck_s`` as a
        safety net (a time-based health change such as the unschedulable grace).
        ``heartbeat`` is called at least every ``heartbeat_s``."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        event = self.cache.subscribe(job.namespace, job.name)
        try:
            while True:
                event.clear()
                st = self.status(job)
                last_check = time.monotonic()
                if observed_changed(st.observed, since) or time.monotonic() >= deadline:
                    return st
                while True:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    woke = event.wait(min(remaining, self.heartbeat_s))
                    if heartbeat is not None:
                        heartbeat()
                    if woke or time.monotonic() - last_check >= self.recheck_s:
                        break
                if time.monotonic() >= deadline and not event.is_set():
                    return self.status(job)
        finally:
            self.cache.unsubscribe(job.namespace, job.name, event)

    # -- purge

    def probe_ready(self, read_s: float | None = None) -> tuple[ReadyStatus, str]:
        """Does the member answer now (one quick request, no retries)?"""
        return self.api.probe_ready(read_s)

    def leftovers(self, job: JobRef) -> list[str]:
        """What of the job is still on the member (its PyTorchJob and pods, terminating
        ones included): empty once a purge is complete."""
        left: list[str] = []
        obj = self.api.get(self._job_path(job.namespace, job.name))
        if obj is not None and _labels(obj).get(OWNER_LABEL) == job.owner_id:
            left.append(f"PyTorchJob {job.ref}")
        items, _ = self.api.list(
            self._core_path(job.namespace, "pods"), label_selector=f"{KF_JOB_NAME}={job.name}"
        )
        for pod in items:
            pm = _meta(pod)
            if (pm.get("labels") or {}).get(OWNER_LABEL) == job.owner_id or any(
                isinstance(r, dict) and r.get("kind") == "PyTorchJob" and r.get("name") == job.name
                for r in pm.get("ownerReferences") or []
            ):
                left.append(f"Pod {job.namespace}/{pm.get('name')}")
        return left

    def purge(self, job: JobRef) -> PurgeResult:
        """Delete the job, its pods and its reservations; safe to repeat. Objects with
        our names that belong to another fleet job are left alone. Propagated deps stay
        (they may be shared by other jobs of the namespace)."""
        try:
            return self._purge(job)
        except ApiError as exc:
            raise ClusterUnreachable(self.name, f"HTTP {exc.status} on purge", str(exc)) from None

    def _purge(self, job: JobRef) -> PurgeResult:
        deleted: list[str] = []
        path = self._job_path(job.namespace, job.name)
        obj = self.api.get(path)
        foreign = False
        if obj is not None:
            if _labels(obj).get(OWNER_LABEL) == job.owner_id:
                if self.api.delete(path, propagation="Background"):
                    deleted.append(f"PyTorchJob {job.ref}")
            else:
                foreign = True
        pods_path = self._core_path(job.namespace, "pods")
        items, _ = self.api.list(pods_path, label_selector=f"{KF_JOB_NAME}={job.name}")
        for pod in items:
            pm = _meta(pod)
            refs = [r for r in pm.get("ownerReferences") or [] if isinstance(r, dict)]
            # Ours: labelled with our owner id, or (unless a foreign job holds the name)
            # owned by a PyTorchJob of this name, which was ours or is already gone.
            ours = (pm.get("labels") or {}).get(OWNER_LABEL) == job.owner_id or (
                not foreign
                and any(r.get("kind") == "PyTorchJob" and r.get("name") == job.name for r in refs)
            )
            pod_path = self._core_path(job.namespace, "pods", str(pm.get("name")))
            if ours and self.api.delete(pod_path):
                deleted.append(f"Pod {job.namespace}/{pm.get('name')}")
        for name in self.release_reservations(job):
            deleted.append(f"Reservation {name}")
        return PurgeResult(deleted=deleted)

