"""The transport's typed errors: each HTTP answer outside 2xx becomes the error class its
status names, so the adapter catches types (NotFound, AlreadyExists, Gone...) instead of
comparing status codes; what kept failing is chained to ClusterUnreachable."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from activities.kube_api import (
    AlreadyExists,
    ApiError,
    ClusterUnreachable,
    Conflict,
    Gone,
    KubeApi,
    NotFound,
    ServerError,
    TooManyRequests,
    api_error,
    request_kind,
)
from activities.member_cluster import KubernetesMemberCluster


def _status_body(code: int, reason: str) -> dict[str, Any]:
    return {"kind": "Status", "status": "Failure", "code": code, "reason": reason,
            "message": f"the {reason} message"}


@pytest.mark.parametrize(
    ("status", "reason", "cls"),
    [
        (400, "BadRequest", ApiError),
        (403, "Forbidden", ApiError),
        (404, "NotFound", NotFound),
        (409, "AlreadyExists", AlreadyExists),
        (409, "Conflict", Conflict),
        (410, "Expired", Gone),
        (422, "Invalid", ApiError),
        (429, "TooManyRequests", TooManyRequests),
        (500, "InternalError", ServerError),
        (501, "NotImplemented", ServerError),
        (503, "ServiceUnavailable", ServerError),
    ],
)
def test_each_status_maps_to_its_error_class(status: int, reason: str, cls: type) -> None:
    err = api_error(status, _status_body(status, reason), "one line")
    assert type(err) is cls
    assert isinstance(err, ApiError)
    assert (err.status, err.reason, err.message, str(err)) == (
        status, reason, f"the {reason} message", "one line")


def test_a_conflict_is_not_already_exists_but_already_exists_is_a_conflict() -> None:
    stale = api_error(409, _status_body(409, "Conflict"), "x")
    assert isinstance(stale, Conflict) and not isinstance(stale, AlreadyExists)
    # a 409 without a Status reason is what a create meets when the name is taken
    assert isinstance(api_error(409, None, "x"), AlreadyExists)


def test_throttling_and_server_errors_carry_retry_after() -> None:
    busy = api_error(429, None, "x", {"Retry-After": "2"})
    assert isinstance(busy, TooManyRequests) and busy.retry_after == 2.0
    down = api_error(503, None, "x", {"retry-after": "junk"})
    assert isinstance(down, ServerError) and down.retry_after is None


def test_a_watch_error_event_is_typed_by_its_status_code(source_api: KubeApi) -> None:
    gone = source_api.watch_error("/api/v1/pods", _status_body(410, "Expired"))
    assert isinstance(gone, Gone) and gone.reason == "Expired"
    assert isinstance(source_api.watch_error("/api/v1/pods", {"message": "?"}), ServerError)


@pytest.fixture
def namespace(source_api: KubeApi) -> Iterator[str]:
    ns = f"t-{uuid.uuid4().hex[:6]}"
    source_api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                             "metadata": {"name": ns}})
    yield ns
    source_api.delete(f"/api/v1/namespaces/{ns}")


def test_a_live_server_answers_with_typed_errors(source_api: KubeApi, namespace: str) -> None:
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"},
          "data": {"k": "v"}}
    with pytest.raises(NotFound) as missing:
        source_api.request("GET", f"{path}/cm")
    assert missing.value.reason == "NotFound" and "cm" in missing.value.message
    assert source_api.get(f"{path}/cm") is None

    assert source_api.create(path, cm) is not None
    with pytest.raises(AlreadyExists):
        source_api.request("POST", path, body=cm)
    assert source_api.create(path, cm) is None  # create answers "already there"

    stale = {**cm, "metadata": {"name": "cm", "resourceVersion": "1"}}
    with pytest.raises(Conflict) as conflict:
        source_api.request("PUT", f"{path}/cm", body=stale)
    assert not isinstance(conflict.value, AlreadyExists)

    assert source_api.delete(f"{path}/cm") is True
    assert source_api.delete(f"{path}/cm") is False


@pytest.mark.parametrize(("status", "cls"), [(429, TooManyRequests), (503, ServerError)])
def test_what_kept_failing_is_the_cause_of_cluster_unreachable(
    emulator: Any, faulty: KubernetesMemberCluster, status: int, cls: type
) -> None:
    emulator.inject_errors(faulty.name, status=status, rate=1.0, retry_after=1)
    with pytest.raises(ClusterUnreachable) as failed:
        faulty.api.request("GET", "/api/v1/namespaces/default/pods", retry=False)
    assert failed.value.status == status
    cause = failed.value.__cause__
    assert isinstance(cause, TooManyRequests | ServerError) and type(cause) is cls
    assert (cause.status, cause.retry_after) == (status, 1.0)


@pytest.mark.parametrize("method,path,kind", [
    ("GET", "/api/v1/namespaces/t-1/pods?labelSelector=a%3Db", "LIST pods"),
    ("GET", "/api/v1/namespaces/t-1/pods/p-0", "GET pods"),
    ("GET", "/api/v1/nodes", "LIST nodes"),
    ("POST", "/apis/kubeflow.org/v1/namespaces/t-1/pytorchjobs", "POST pytorchjobs"),
    ("GET", "/api/v1/nodes?watch=true&resourceVersion=7", "WATCH nodes"),
    ("GET", "/version", "GET version"),
    ("GET", "/api/v1/namespaces/t-1", "GET namespaces"),
    ("PUT", "/api/v1/namespaces/t-1/finalize", "PUT namespaces/finalize"),
    ("PUT", "/apis/kubeflow.org/v1/namespaces/t-1/pytorchjobs/j/status",
     "PUT pytorchjobs/status"),
    ("POST", "/apis/scheduling.koordinator.sh/v1alpha1/reservations", "POST reservations"),
])
def test_requests_are_counted_by_verb_and_resource(method: str, path: str, kind: str) -> None:
    """``fleetq bench e2e`` reports what fleetq asks of its members per job by these
    kinds (the namespace and name left out, a subresource kept)."""
    assert request_kind(method, path) == kind


def test_a_client_counts_what_it_sends(source_api: KubeApi, namespace: str) -> None:
    before = source_api.sent_snapshot()
    source_api.get(f"/api/v1/namespaces/{namespace}/configmaps/none-such")
    source_api.list(f"/api/v1/namespaces/{namespace}/configmaps")
    assert source_api.sent_snapshot() - before == {"GET configmaps": 1, "LIST configmaps": 1}
