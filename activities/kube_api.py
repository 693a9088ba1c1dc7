"""The transport to one Kubernetes API server: raw JSON requests, retries, watch streams,
and typed errors.

Every member-cluster adapter (member cluster, capacity cache, control-plane tools, the
CLI's direct reads) talks through :class:`KubeApi`, so everywhere every request has
``(connect, read)`` timeouts; 429/5xx and dropped connections are retried with jittered
backoff (honouring ``Retry-After``), bounded in attempts and total time, then raise
:class:`ClusterUnreachable` (retryable), as a timeout does at once; any other non-2xx
raises an :class:`ApiError` subclass by status (:func:`api_error`, as kopf's
``clients/errors.py``), so callers never compare codes or parse messages. Why not
urllib3's ``Retry``: docs/decisions/011.
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack
from urllib.parse import urlencode

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.watch.watch import iter_resp_lines
from opentelemetry import trace

from fleetq.cluster_health import ReadyStatus
from fleetq.fleet_config import FleetConfigError

__all__ = [
    "AlreadyExists",
    "ApiError",
    "ClusterUnreachable",
    "Conflict",
    "Gone",
    "KubeApi",
    "NotFound",
    "RetryPolicy",
    "ServerError",
    "TooManyRequests",
    "WatchStream",
    "api_error",
    "request_kind",
    "unreachable_why",
]

_TRACER = trace.get_tracer("fleetq.member")

# --------------------------------------------------------------------------- errors


class ApiError(Exception):
    """A definite answer from the API server outside 2xx.

    ``status`` is the HTTP status, ``reason`` the Status object's ``reason``
    (``NotFound``, ``AlreadyExists``, ``Invalid``...; "" when the body has none) and
    ``message`` its ``message``; ``str()`` is one line naming the cluster and request."""

    def __init__(self, status: int, text: str, *, reason: str = "", message: str = "") -> None:
        self.status = status
        self.reason = reason
        self.message = message
        super().__init__(text)


class NotFound(ApiError):
    """404: the object (or its API, e.g. a CRD that is not installed) does not exist."""


class Conflict(ApiError):
    """409: the write conflicts with the object's current state (a stale
    ``resourceVersion``, an object being deleted...)."""


class AlreadyExists(Conflict):
    """409 ``AlreadyExists``: a create found an object of that name."""


class Gone(ApiError):
    """410: the ``resourceVersion`` a watch or list asked for is too old (compacted)."""


class TooManyRequests(ApiError):
    """429: the server throttles us; ``retry_after`` is its ``Retry-After`` in seconds."""

    retry_after: float | None = None


class ServerError(ApiError):
    """5xx: the server failed (or an aggregated API is unavailable); ``retry_after`` is
    its ``Retry-After`` in seconds, if any."""

    retry_after: float | None = None


def api_error(
    status: int,
    body: Any,
    text: str,
    headers: Mapping[str, str] | None = None,
) -> ApiError:
    """The typed error for a definite answer: its class chosen by ``status`` (and, for a
    409, the Status ``reason``), carrying ``reason``/``message`` from the Status body."""
    reason = str(body.get("reason") or "") if isinstance(body, dict) else ""
    message = str(body.get("message") or "") if isinstance(body, dict) else ""
    cls: type[ApiError]
    if status == 404:
        cls = NotFound
    elif status == 409:
        # a Status without a reason counts as AlreadyExists, as it did for create
        cls = AlreadyExists if reason in ("AlreadyExists", "") else Conflict
    elif status == 410:
        cls = Gone
    elif status == 429:
        cls = TooManyRequests
    elif status >= 500:
        cls = ServerError
    else:
        cls = ApiError
    err = cls(status, text, reason=reason, message=message)
    if isinstance(err, TooManyRequests | ServerError):
        err.retry_after = _retry_after(headers)
    return err


def request_kind(method: str, path: str) -> str:
    """What a request asks of which resource, for counting: ``"GET pytorchjobs"`` (one
    object), ``"LIST pods"`` (a collection), ``"WATCH nodes"``, ``"POST reservations"``,
    ``"GET version"`` (a subresource after the name: ``"PUT pytorchjobs/status"``)."""
    bare, _, query = path.partition("?")
    segs = [s for s in bare.split("/") if s]
    verb = "WATCH" if "watch=true" in query else method
    if not segs:
        return verb
    # /api/v1/..., /apis/<group>/<version>/...: the rest names the resource
    rest = segs[2:] if segs[0] == "api" else segs[3:] if segs[0] == "apis" else segs
    if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in ("status", "finalize"):
        rest = rest[2:]  # namespaces/<ns>/<plural>[/<name>[/<sub>]]
    if not rest:
        return f"{verb} {segs[-1]}"
    if verb == "GET" and len(rest) == 1 and segs[0] in ("api", "apis"):
        verb = "LIST"
    return f"{verb} {rest[0]}" + (f"/{rest[2]}" if len(rest) >= 3 else "")


class ClusterUnreachable(Exception):
    """The member did not answer in time (or kept failing with 429/5xx): try later.

    ``str()`` is one human line, ``cluster-a: unreachable (connection refused)``;
    ``why`` is the part in brackets and ``request`` the call that failed (for logs).
    Raised ``from`` what failed last: the transport error, or the 429/5xx
    :class:`ApiError`."""

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


# --------------------------------------------------------------------------- retries

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


def _decode(data: bytes) -> Any:
    try:
        return json.loads(data) if data else None
    except ValueError:
        return {"message": data[:200].decode("utf-8", "replace")}


# --------------------------------------------------------------------------- watch streams


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


# --------------------------------------------------------------------------- the client


class CallOptions(TypedDict, total=False):
    """How :meth:`KubeApi.call` and :meth:`KubeApi.request` send one request: the JSON
    ``body`` (None: none) and its ``content_type`` (default ``application/json``), the
    (connect, read) ``timeout`` (default the client's) and whether to ``retry`` (True).
    """

    body: Any
    content_type: str
    timeout: tuple[float, float] | None
    retry: bool


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
        #: requests sent, by ``request_kind`` (``GET pods``, ``WATCH pytorchjobs``...):
        #: what fleetq asks of the member (``fleetq bench e2e`` prints it per job)
        self.sent: Counter[str] = Counter()
        self._sent_lock = threading.Lock()

    def sent_snapshot(self) -> Counter[str]:
        """A copy of :attr:`sent`, taken while no request is being counted."""
        with self._sent_lock:
            return self.sent.copy()

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
            ) from None  # the message names the cause; the config error is the user's
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
        kind = request_kind(method, path)
        with self._sent_lock:
            self.sent[kind] += 1
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

    def call(self, method: str, path: str, **options: Unpack[CallOptions]) -> tuple[int, Any]:
        """One request with retries; returns ``(status, decoded JSON or None)`` for any
        definite answer (for tools that want the raw status; the verbs below raise
        typed errors instead); raises :class:`ClusterUnreachable` otherwise. A write is
        one OpenTelemetry span (``member POST``...), a child of the activity's span when
        tracing is on (a no-op otherwise)."""
        args = (options.get("body"), options.get("content_type", "application/json"),
                options.get("timeout"), options.get("retry", True))
        if method == "GET":
            return self._call(method, path, *args)
        with _TRACER.start_as_current_span(
            f"member {method}",
            attributes={"fleetq.member": self.name, "http.target": path.split("?", 1)[0]},
        ):
            return self._call(method, path, *args)

    def request(self, method: str, path: str, **options: Unpack[CallOptions]) -> Any:
        """:meth:`call` for a 2xx answer: its decoded body; any other definite answer
        raises its :class:`ApiError` subclass."""
        status, obj = self.call(method, path, **options)
        if status >= 300:
            raise self._error(method, path, status, obj)
        return obj

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
            cause: BaseException
            try:
                resp = self._send(method, path, body, content_type, tmo)
                data = resp.read()
                status = int(resp.status)
                headers = resp.headers
                with contextlib.suppress(Exception):
                    resp.response.release_conn()
            except urllib3.exceptions.NewConnectionError as exc:
                # Refused: one quick retry (an API server restarting), then give up.
                cause = exc
                failure = ClusterUnreachable(self.name, unreachable_why(exc), f"{method} {path}")
                if attempt >= 2:
                    raise failure from exc
            except urllib3.exceptions.TimeoutError as exc:
                raise ClusterUnreachable(
                    self.name, f"no answer within {tmo[0]:g}s/{tmo[1]:g}s", f"{method} {path}"
                ) from exc
            except (urllib3.exceptions.HTTPError, OSError, k8s_client.ApiException) as exc:
                cause = exc
                failure = ClusterUnreachable(self.name, unreachable_why(exc), f"{method} {path}")
            else:
                decoded = _decode(data)
                if status not in RETRY_STATUSES:
                    return status, decoded
                answer = api_error(
                    status, decoded, self._text(method, path, status, decoded), headers
                )
                assert isinstance(answer, TooManyRequests | ServerError)
                retry_after = answer.retry_after
                cause = answer
                failure = ClusterUnreachable(
                    self.name,
                    f"HTTP {status} after {attempt} attempt{'s' if attempt > 1 else ''}",
                    f"{method} {path}",
                    status=status,
                )
            if not retry or attempt >= policy.attempts:
                raise failure from cause
            delay = policy.delay(attempt, retry_after)
            if time.monotonic() - start + delay > policy.budget_s:
                raise failure from cause
            time.sleep(delay)

    def _text(self, method: str, path: str, status: int, obj: Any) -> str:
        msg = obj.get("message", "") if isinstance(obj, dict) else ""
        return f"cluster {self.name}: {method} {path}: HTTP {status}: {msg}"

    def _error(self, method: str, path: str, status: int, obj: Any) -> ApiError:
        return api_error(status, obj, self._text(method, path, status, obj))

    # -- verbs

    def get(self, path: str) -> dict[str, Any] | None:
        """GET; None if there is no such object."""
        try:
            return self.request("GET", path)  # type: ignore[no-any-return]
        except NotFound:
            return None

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """POST; the created object, or None if it already exists (409 AlreadyExists)."""
        try:
            return self.request("POST", path, body=body)  # type: ignore[no-any-return]
        except AlreadyExists:
            return None

    def replace(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """PUT; the stored object. With ``metadata.resourceVersion`` in ``body`` this is a
        compare-and-swap: :class:`Conflict` when the object changed since that version."""
        return self.request("PUT", path, body=body)  # type: ignore[no-any-return]

    def delete(self, path: str, propagation: str | None = None, retry: bool = True) -> bool:
        """DELETE; False if it was already gone."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if propagation:
            body["propagationPolicy"] = propagation
        try:
            self.request("DELETE", path, body=body, retry=retry)
        except NotFound:
            return False
        return True

    def list(
        self,
        path: str,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
        retry: bool = True,
    ) -> tuple[list[dict[str, Any]], str]:
        """Paginated LIST; returns ``(items, resourceVersion)``. ``retry=False`` for a
        caller with its own backoff loop (retries nested in retries multiply requests)."""
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
            status, obj = self.call("GET", full, retry=retry)
            if status >= 300 or not isinstance(obj, dict):
                raise self._error("GET", path, status, obj)
            items.extend(obj.get("items") or [])
            meta = obj.get("metadata") or {}
            rv = str(meta.get("resourceVersion") or rv)
            cont = str(meta.get("continue") or "")
            if not cont:
                return items, rv

    def watch(self, path: str, resource_version: str, timeout_s: int) -> WatchStream:
        """Open a watch from ``resource_version``; :class:`Gone` when it is too old."""
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
            raise ClusterUnreachable(self.name, unreachable_why(exc), f"watch {path}") from exc
        status = int(resp.status)
        if status != 200:
            try:
                obj = json.loads(resp.read() or b"null")
            except ValueError:
                obj = None
            answer = self._error("WATCH", path, status, obj)
            if status in RETRY_STATUSES:
                raise ClusterUnreachable(
                    self.name, f"HTTP {status}", f"watch {path}", status=status
                ) from answer
            raise answer
        return WatchStream(resp.response)

    def watch_error(self, path: str, event_object: Any) -> ApiError:
        """The typed error of a watch's ``ERROR`` event (its object is a Status:
        ``code`` 410 when the watch's resourceVersion is too old)."""
        code = event_object.get("code") if isinstance(event_object, dict) else None
        try:
            status = int(code or 500)
        except (TypeError, ValueError):
            status = 500
        return api_error(status, event_object, f"watch {path}: {event_object}")

    def probe_ready(self, read_s: float | None = None) -> tuple[ReadyStatus, str]:
        """The member's Ready condition from one ``GET /version`` (read timeout
        ``read_s``, default the configured one): ``True`` (it answers), ``False`` (it
        answers with 5xx/429: up but not serving) or ``Unknown`` (no answer), with a
        one-line reason."""
        timeout = None if read_s is None else (self.connect_s, min(self.read_s, read_s))
        try:
            self.request("GET", "/version", retry=False, timeout=timeout)
        except ClusterUnreachable as exc:
            if isinstance(exc.__cause__, TooManyRequests | ServerError):
                return "False", f"{self.name}: not ready (HTTP {exc.__cause__.status})"
            return "Unknown", str(exc)
        except ServerError as exc:
            return "False", f"{self.name}: not ready (HTTP {exc.status})"
        except ApiError:
            return "True", ""  # it answers, if only to say no (401, 403, 404...)
        return "True", ""
