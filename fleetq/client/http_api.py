"""Reading jobs over Temporal's HTTP/JSON API with the standard library: ``fleetq get
pytorchjob`` without importing the Temporal SDK (BENCHMARKS.md §9).

Routes: the ``google.api.http`` annotations of temporalio/api's
``workflowservice/v1/service.proto``, served by the Web UI's server (temporalio/ui
``server/server/api/handler.go``, ``UnescapingModeAllExceptReserved``), not the frontend's
HTTP port, whose ``UnescapingModeLegacy`` (go.temporal.io/server
``service/frontend/http_api_server.go``) matches no id with a ``/``. A query (POST) passes
the UI's CSRF check by double submit (``server/server/csrf/cookie.go``). Used only for the
``fleetq up`` Web UI or ``FLEETQ_HTTP_API``; anything not understood raises
:class:`Unsupported` and the caller reads through the SDK (same bytes printed). Why:
docs/decisions/012.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import threading
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from fleetq.client.job_reads import (  # noqa: F401 - the constants: re-exported
    JOB_RESOURCE,
    MAX_CONCURRENT_QUERIES,
    REFUSAL_TYPES,
    is_waiting,
    latest_runs,
    queue_label,
    read_view,
    run_now,
)
from fleetq.naming import JOB_PURGE_WORKFLOW, JOB_WORKFLOW

if TYPE_CHECKING:
    from fleetq.job_view import JobView

T = TypeVar("T")

HTTP_API_ENV = "FLEETQ_HTTP_API"
#: ``FLEETQ_HTTP_API`` values that turn the HTTP transport off
OFF = frozenset({"off", "0", "false", "no", "grpc"})
#: Temporal client settings that choose TLS, credentials or a profile: the SDK path
SDK_SETTINGS = ("TEMPORAL_ADDRESS", "TEMPORAL_API_KEY", "TEMPORAL_PROFILE",
                "TEMPORAL_CONFIG_FILE", "TEMPORAL_TLS", "TEMPORAL_TLS_CLIENT_CERT_PATH",
                "TEMPORAL_TLS_CLIENT_KEY_PATH", "TEMPORAL_TLS_SERVER_CA_CERT_PATH",
                "TEMPORAL_TLS_CLIENT_CERT_DATA", "TEMPORAL_TLS_CLIENT_KEY_DATA",
                "TEMPORAL_TLS_SERVER_CA_CERT_DATA", "TEMPORAL_TLS_SERVER_NAME",
                "TEMPORAL_CODEC_ENDPOINT", "TEMPORAL_GRPC_META")
#: seconds for one HTTP call; a query no worker answers in time goes to the SDK path
#: (whose bounded waits say what to run)
TIMEOUT = 5.0
TIMEOUT_ENV = "FLEETQ_HTTP_API_TIMEOUT"
STATUS = "WORKFLOW_EXECUTION_STATUS_"
CLOSE_EVENT = "HISTORY_EVENT_FILTER_TYPE_CLOSE_EVENT"


class Unsupported(Exception):
    """This read cannot be done (or trusted) over HTTP: read through the SDK instead."""


@dataclass(frozen=True)
class Execution:
    """One row of ListWorkflowExecutions / DescribeWorkflowExecution, as JSON gave it."""

    id: str
    status: str  # "RUNNING", "COMPLETED", ... (the enum name without its prefix)
    start_time: datetime | None
    workflow_type: str
    search_attributes: dict[str, Any]


def _config_file() -> Path:
    """Temporal's client config file (``temporal.toml`` in the user config dir), which
    may give the default profile TLS or an API key."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "temporalio" / "temporal.toml"


def web_api(fleet_http_api: str | None) -> WebApi | None:
    """The HTTP API to read jobs through, or None (use the SDK); ``fleet_http_api`` is
    what the running ``fleetq up``'s fleetq.json names (the CLI reads it)."""
    setting = os.environ.get(HTTP_API_ENV, "").strip()
    if setting.lower() in OFF:
        return None
    namespace = os.environ.get("TEMPORAL_NAMESPACE") or "default"
    timeout = _timeout()
    if setting and setting.lower() != "auto":
        return WebApi(setting, namespace, timeout)
    if any(os.environ.get(k) for k in SDK_SETTINGS) or _config_file().exists():
        return None
    return WebApi(fleet_http_api, namespace, timeout) if fleet_http_api else None


def _timeout() -> float:
    """Seconds for one HTTP call: ``FLEETQ_HTTP_API_TIMEOUT`` (a positive number), else
    :data:`TIMEOUT`."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    try:
        value = float(raw) if raw else TIMEOUT
    except ValueError:
        return TIMEOUT
    return value if value > 0 else TIMEOUT


def _payload(p: Any) -> Any:
    """The value of one JSON-encoded payload (``json/plain``; ``binary/null`` is None)."""
    if not isinstance(p, dict) or not isinstance(p.get("metadata"), dict):
        raise Unsupported("payload shape")
    encoding = base64.b64decode(p["metadata"].get("encoding", "")).decode()
    if encoding == "binary/null":
        return None
    if encoding != "json/plain":
        raise Unsupported(f"payload encoding {encoding}")
    return base64.b64decode(p.get("data", ""))


def _json_payload(value: Any) -> dict[str, Any]:
    return {"metadata": {"encoding": base64.b64encode(b"json/plain").decode()},
            "data": base64.b64encode(json.dumps(value).encode()).decode()}


def _time(value: Any) -> datetime | None:
    """An RFC 3339 timestamp as the SDK gives it (microseconds, UTC)."""
    if not value:
        return None
    text = str(value).removesuffix("Z")
    head, dot, frac = text.partition(".")
    return datetime.fromisoformat(head + (dot + frac[:6] if dot else "") + "+00:00")


def _search_attributes(raw: Any) -> dict[str, Any]:
    fields = (raw or {}).get("indexedFields") or {}
    out = {}
    for key, p in fields.items():
        data = _payload(p)
        out[key] = None if data is None else json.loads(data)
    return out


def _execution(info: dict[str, Any]) -> Execution:
    return Execution(
        id=(info.get("execution") or {}).get("workflowId", ""),
        status=str(info.get("status", "")).removeprefix(STATUS),
        start_time=_time(info.get("startTime")),
        workflow_type=(info.get("type") or {}).get("name", ""),
        search_attributes=_search_attributes(info.get("searchAttributes")),
    )


class WebApi:
    """Temporal's HTTP API at ``base`` (``http://host:port``) for one namespace; one
    keep-alive connection per thread."""

    def __init__(self, base: str, namespace: str, timeout: float = TIMEOUT) -> None:
        url = urllib.parse.urlsplit(base if "://" in base else f"http://{base}")
        if url.scheme not in ("http", "https") or not url.hostname:
            raise Unsupported(f"{HTTP_API_ENV}={base}: not an http(s) URL")
        self.scheme, self.host, self.port = url.scheme, url.hostname, url.port
        self.prefix = url.path.rstrip("/")
        self.namespace = namespace
        self.timeout = timeout
        self.token = os.urandom(16).hex()
        self._local = threading.local()

    def _conn(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            cls = (http.client.HTTPSConnection if self.scheme == "https"
                   else http.client.HTTPConnection)
            conn = cls(self.host, self.port, timeout=self.timeout)
            self._local.conn = conn
        return conn

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()

    def call(self, method: str, path: str, params: dict[str, str] | None = None,
             body: Any = None) -> tuple[int, dict[str, Any]]:
        """``(HTTP status, JSON body)``; :class:`Unsupported` when nothing (or not JSON)
        answers."""
        url = f"{self.prefix}/api/v1/namespaces/{urllib.parse.quote(self.namespace, safe='')}"
        url += path + (f"?{urllib.parse.urlencode(params)}" if params else "")
        headers = {"Accept": "application/json", "Cookie": f"_csrf={self.token}",
                   "X-CSRF-Token": self.token}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn = self._conn()
        try:
            conn.request(method, url, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            self._local.conn = None
            raise Unsupported(f"{self.host}:{self.port}: {exc}") from None
        try:
            answer = json.loads(raw)
        except ValueError:
            raise Unsupported(f"HTTP {resp.status}: not JSON") from None
        if not isinstance(answer, dict):
            raise Unsupported(f"HTTP {resp.status}: not a JSON object")
        return resp.status, answer

    def ok(self, method: str, path: str, params: dict[str, str] | None = None,
           body: Any = None) -> dict[str, Any] | None:
        """The answer of a call that succeeded; None when the workflow does not exist
        (gRPC NotFound with its NotFoundFailure detail); else :class:`Unsupported`."""
        status, answer = self.call(method, path, params, body)
        if status == 200:
            return answer
        details = [d.get("@type", "") for d in answer.get("details") or []
                   if isinstance(d, dict)]
        if answer.get("code") == 5 and any(t.endswith(".NotFoundFailure") for t in details):
            return None
        raise Unsupported(f"HTTP {status}: {answer.get('message', '')}")

    @staticmethod
    def _wf(workflow_id: str) -> str:
        return "/workflows/" + urllib.parse.quote(workflow_id, safe="")

    # ------------------------------------------------------------------ the calls

    def list_workflows(self, query: str) -> list[Execution]:
        out: list[Execution] = []
        token = ""
        while True:
            params = {"query": query, **({"nextPageToken": token} if token else {})}
            answer = self.ok("GET", "/workflows", params)
            if answer is None:
                raise Unsupported("namespace not found")
            out += [_execution(e) for e in answer.get("executions") or []]
            token = answer.get("nextPageToken") or ""
            if not token:
                return out

    def describe(self, workflow_id: str) -> Execution | None:
        answer = self.ok("GET", self._wf(workflow_id))
        return None if answer is None else _execution(answer.get("workflowExecutionInfo") or {})

    def query(self, workflow_id: str, name: str, *args: Any) -> bytes | None:
        """The JSON bytes of a query's answer (None: it answered null)."""
        query: dict[str, Any] = {"queryType": name}
        if args:
            query["queryArgs"] = {"payloads": [_json_payload(a) for a in args]}
        answer = self.ok("POST", f"{self._wf(workflow_id)}/query/{name}",
                         body={"query": query})
        if answer is None:
            raise Unsupported("workflow vanished")
        if answer.get("queryRejected"):
            raise Unsupported("query rejected")
        payloads = (answer.get("queryResult") or {}).get("payloads") or []
        if len(payloads) != 1:
            raise Unsupported("query answer shape")
        data: bytes | None = _payload(payloads[0])
        return data

    def close_event(self, workflow_id: str) -> dict[str, Any]:
        """The latest run's closing history event."""
        answer = self.ok("GET", f"{self._wf(workflow_id)}/history",
                         {"historyEventFilterType": CLOSE_EVENT})
        events = ((answer or {}).get("history") or {}).get("events") or []
        if not events:
            raise Unsupported("no close event")
        event: dict[str, Any] = events[-1]
        return event


# --------------------------------------------------------------------------- jobs
# The reads fleetq.client.jobs does through the SDK, over HTTP, by the same routines
# (fleetq.client.job_reads); tests/cli/test_http_transport.py compares the two
# transports' output byte for byte.


#: :data:`fleetq.job_view.JobState`'s values (a test pins the two equal)
JOB_STATES = frozenset({
    "Validating", "Queued", "Inadmissible", "Scheduling", "Pending", "Created", "Running",
    "Unhealthy", "FailingOver", "Suspended", "Unschedulable", "Succeeded", "Failed",
    "Deleted", "Refused"})


@dataclass(frozen=True)
class JobRow:
    """What ``get pytorchjob``'s table (``-o wide`` included) shows of a
    :class:`~fleetq.job_view.JobView`, read from the view's JSON without pydantic (whose
    import and schema cost about as much CPU as the rest of the command);
    :meth:`view` is the whole view, validated, for ``-o json|yaml``."""

    namespace: str
    name: str
    state: str
    reason: str = ""
    cluster: str | None = None
    queue: str | None = None
    queued: bool = False
    admitted: bool = False
    priority: int = 0
    created_at: datetime | None = None
    #: the view's JSON (a status query's answer or the result); None: a view made from
    #: the workflow's execution alone
    source: bytes | None = None

    def view(self) -> JobView:
        """The :class:`~fleetq.job_view.JobView`; :class:`Unsupported` when it does not
        validate (the SDK path reports it)."""
        from fleetq.job_view import JobView

        if self.source is None:
            return JobView(namespace=self.namespace, name=self.name,
                           state=self.state,  # type: ignore[arg-type]
                           reason=self.reason, created_at=self.created_at,
                           cluster=self.cluster)
        try:
            return JobView.model_validate_json(self.source)
        except ValueError:
            raise Unsupported("view does not validate") from None


_ROW_TYPES: dict[str, tuple[type, ...]] = {
    "namespace": (str,), "name": (str,), "state": (str,), "reason": (str,),
    "cluster": (str, type(None)), "queue": (str, type(None)), "queued": (bool,),
    "admitted": (bool,), "priority": (int,), "created_at": (str, type(None))}


def _decode_view(data: bytes | None) -> JobRow | None:
    """The row of a view's JSON, its fields checked as :class:`JobView` types them
    (anything else is :class:`Unsupported`: the SDK path validates and reports it)."""
    from fleetq.kube_values import parse_rfc3339

    if data is None:
        return None
    try:
        raw = json.loads(data)
    except ValueError:
        raise Unsupported("view is not JSON") from None
    if not isinstance(raw, dict):
        raise Unsupported("view does not validate")
    fields = {k: raw[k] for k in _ROW_TYPES if k in raw}
    for key, types in _ROW_TYPES.items():
        value = fields.get(key)
        if (key in ("namespace", "name", "state") and value is None) or (
                value is not None and (not isinstance(value, types) or (
                    key == "priority" and isinstance(value, bool)))):
            raise Unsupported(f"view does not validate ({key})")
    if fields["state"] not in JOB_STATES:
        raise Unsupported("view does not validate (state)")
    created = fields.get("created_at")
    if created is not None:
        fields["created_at"] = parse_rfc3339(created)
        if fields["created_at"] is None:
            raise Unsupported("view does not validate (created_at)")
    return JobRow(**fields, source=bytes(data))


class _HttpReads:
    """:class:`~fleetq.client.job_reads.JobReads` of one execution over HTTP; a read not
    understood raises :class:`Unsupported` (the caller reads through the SDK)."""

    def __init__(self, api: WebApi, ex: Execution) -> None:
        self.api, self.ex = api, ex

    def fallback(self, ns: str, name: str, state: str, reason: str,
                 cluster: str | None = None) -> JobRow:
        return JobRow(namespace=ns, name=name, state=state, reason=reason,
                      created_at=self.ex.start_time, cluster=cluster or None)

    async def status(self, ns: str, name: str) -> JobRow | None:
        return _decode_view(self.api.query(self.ex.id, "status"))

    async def result(self, ns: str, name: str) -> JobRow:
        attrs = self.api.close_event(self.ex.id).get("workflowExecutionCompletedEventAttributes")
        payloads = ((attrs or {}).get("result") or {}).get("payloads") or []
        view = _decode_view(_payload(payloads[0])) if len(payloads) == 1 else None
        if view is None:
            raise Unsupported("completed without a view")
        return view

    async def failure(self) -> tuple[str, str | None]:
        attrs = self.api.close_event(self.ex.id).get("workflowExecutionFailedEventAttributes")
        failure = (attrs or {}).get("failure")
        if not isinstance(failure, dict) or failure.get("encodedAttributes"):
            raise Unsupported("failure shape")
        return (failure.get("message") or "",
                (failure.get("applicationFailureInfo") or {}).get("type"))


def view_of(api: WebApi, ex: Execution) -> JobRow | None:
    """:func:`fleetq.client.jobs.view_of` over HTTP."""
    return run_now(read_view(_HttpReads(api, ex), ex.id, ex.status, ex.workflow_type))


def _bounded(fn: Callable[[Any], T], items: Iterable[Any]) -> list[T]:
    """``fn`` of each item, at most MAX_CONCURRENT_QUERIES at a time (threads: each its
    own connection); in order."""
    items = list(items)
    if len(items) <= 1:
        return [fn(i) for i in items]
    from concurrent.futures import ThreadPoolExecutor  # (imports logging: not for one job)

    with ThreadPoolExecutor(min(MAX_CONCURRENT_QUERIES, len(items))) as pool:
        return list(pool.map(fn, items))


def list_jobs(api: WebApi, namespace: str | None) -> list[JobRow]:
    """:func:`fleetq.client.jobs.list_jobs` over HTTP."""

    query = f'WorkflowType = "{JOB_WORKFLOW}" OR WorkflowType = "{JOB_PURGE_WORKFLOW}"'
    latest = latest_runs(api.list_workflows(query), namespace)
    views = _bounded(lambda ex: view_of(api, ex), latest)
    return sorted((v for v in views if v is not None), key=lambda v: (v.namespace, v.name))


def get_job(api: WebApi, namespace: str, name: str) -> JobRow | None:
    """:func:`fleetq.client.jobs.get_job` over HTTP."""
    from fleetq.naming import job_workflow_id

    ex = api.describe(job_workflow_id(namespace, name))
    return None if ex is None else view_of(api, ex)


def _running_query(api: WebApi, workflow_id: str, name: str, *args: Any) -> Any:
    """As ``fleetq.client.registry._query_running``: the JSON answer of a running
    workflow's query, None when it is not running or does not exist."""
    ex = api.describe(workflow_id)
    if ex is None or ex.status != "RUNNING":
        return None
    data = api.query(workflow_id, name, *args)
    return None if data is None else json.loads(data)


def waiting_queues(api: WebApi, views: list[JobRow]) -> dict[tuple[str, str], str]:
    """:func:`fleetq.client.jobs.waiting_queues` over HTTP."""
    from fleetq.naming import REGISTRY_WORKFLOW_ID, job_workflow_id, tree_workflow_id

    waiting = [v for v in views if is_waiting(v)]
    if not waiting:
        return {}
    state = _running_query(api, REGISTRY_WORKFLOW_ID, "state")
    tree = state.get("tree") if isinstance(state, dict) else None
    if not tree:
        return {}
    wid = tree_workflow_id(tree)

    def one(v: JobRow) -> tuple[tuple[str, str], str] | None:
        try:
            data = api.query(wid, "wait_info", job_workflow_id(v.namespace, v.name))
        except Unsupported:  # as wait_info: an unanswered query shows no queue
            return None
        info = None if data is None else json.loads(data)
        if not isinstance(info, dict):
            return None
        return (v.namespace, v.name), queue_label(info.get("queue"), info.get("position"),
                                                  info.get("inadmissible") is not None)

    return dict(f for f in _bounded(one, waiting) if f is not None)


__all__ = ["JOB_RESOURCE", "Execution", "JobRow", "Unsupported", "WebApi", "get_job",
           "list_jobs", "view_of", "waiting_queues", "web_api"]
