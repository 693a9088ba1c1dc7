"""Contract tests for ``coordination.k8s.io/v1`` Leases, on an emulated and a real member.

fleetq's bind serialises its fit check per member with a Lease
(``activities.member_cluster``), so the emulator must serve Leases as kube-apiserver
does: an update must name a resourceVersion, a stale one is a 409 Conflict (only one of
two racing writers wins), and the spec is validated the same way."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import Raw, fresh_namespace

GROUP = "/apis/coordination.k8s.io/v1"


@pytest.fixture
def leases(api: Raw) -> Iterator[str]:
    """The Lease collection of a fresh namespace."""
    with fresh_namespace(api, "l-") as ns:
        yield f"{GROUP}/namespaces/{ns}/leases"


def lease(name: str, holder: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                     "acquireTime": "2026-11-30T20:00:00.000000Z",
                     "renewTime": "2026-11-30T20:00:00.000000Z", "leaseTransitions": 0,
                     **spec}}


def test_leases_are_discoverable(api: Raw) -> None:
    r = api("GET", GROUP)
    assert r.status == 200
    names = {res["name"]: res for res in r.body["resources"]}
    assert names["leases"]["namespaced"] is True
    assert names["leases"]["kind"] == "Lease"


def test_only_one_of_two_racing_writers_takes_the_lease(api: Raw, leases: str) -> None:
    """Both writers read the same resourceVersion; the second update is 409 Conflict and
    the Lease keeps the first writer's holder."""
    first = api("POST", leases, lease("bind", "nobody"))
    assert first.status == 201, first.body
    rv = first.body["metadata"]["resourceVersion"]
    again = api("POST", leases, lease("bind", "other"))
    assert (again.status, again.body["reason"]) == (409, "AlreadyExists")

    a = api("PUT", f"{leases}/bind",
            {**lease("bind", "worker-a"), "metadata": {"name": "bind", "resourceVersion": rv}})
    b = api("PUT", f"{leases}/bind",
            {**lease("bind", "worker-b"), "metadata": {"name": "bind", "resourceVersion": rv}})
    assert a.status == 200, a.body
    assert a.body["metadata"]["resourceVersion"] != rv
    assert (b.status, b.body["reason"]) == (409, "Conflict")
    assert "the object has been modified" in b.body["message"]
    assert api("GET", f"{leases}/bind").body["spec"]["holderIdentity"] == "worker-a"


def test_an_update_without_a_resource_version_is_refused(api: Raw, leases: str) -> None:
    """Leases refuse unconditional updates (a ConfigMap would take them)."""
    assert api("POST", leases, lease("bind", "a")).status == 201
    r = api("PUT", f"{leases}/bind", lease("bind", "b"))
    assert (r.status, r.body["reason"]) == (422, "Invalid")
    assert r.body["details"]["causes"] == [{
        "reason": "FieldValueInvalid", "field": "metadata.resourceVersion",
        "message": "Invalid value: 0: must be specified for an update"}]
    assert api("GET", f"{leases}/bind").body["spec"]["holderIdentity"] == "a"


def test_lease_spec_is_validated(api: Raw, leases: str) -> None:
    zero = api("POST", leases, lease("zero", "a", leaseDurationSeconds=0))
    assert (zero.status, zero.body["reason"]) == (422, "Invalid")
    assert zero.body["details"]["causes"][0]["field"] == "spec.leaseDurationSeconds"
    negative = api("POST", leases, lease("neg", "a", leaseTransitions=-1))
    assert (negative.status, negative.body["reason"]) == (422, "Invalid")
    assert negative.body["details"]["causes"][0]["field"] == "spec.leaseTransitions"
    # MicroTime needs exactly six fractional digits: a plain RFC 3339 time cannot decode
    seconds = api("POST", leases, lease("secs", "a", renewTime="2026-11-30T20:00:01Z"))
    assert (seconds.status, seconds.body["reason"]) == (400, "BadRequest")
    assert "cannot be handled as a Lease" in seconds.body["message"]
    assert api("GET", f"{leases}/zero").status == 404
