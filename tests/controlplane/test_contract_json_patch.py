"""Contract: how an emulated and a real member refuse a JSON patch (RFC 6902) they cannot
apply. Pinned when the emulator's hand-written patch code gave way to the ``jsonpatch``
library: kube-apiserver answers 400 for a body that is not a list of operations and 422
Invalid for an operation that fails (a ``test``, a missing path, an unknown op), keeping
nothing of the patch. (A pointer without its leading ``/`` is not pinned: the real server's
evanphx/json-patch drops its first segment and applies the rest; the emulator refuses it.)"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from .conftest import Raw

JSON_PATCH = "application/json-patch+json"


@pytest.fixture
def configmap(api: Raw) -> Any:
    path = "/api/v1/namespaces/default/configmaps"
    name = f"jp-{uuid.uuid4().hex[:8]}"
    r = api("POST", path, {"metadata": {"name": name}, "data": {"a": "1"}})
    assert r.status == 201, r.body
    yield f"{path}/{name}"
    api("DELETE", f"{path}/{name}")


@pytest.mark.parametrize("ops", [
    [{"op": "replace", "path": "/data/a", "value": "3"},
     {"op": "test", "path": "/data/a", "value": "2"}],
    [{"op": "remove", "path": "/data/missing"}],
    [{"op": "frobnicate", "path": "/data/a"}],
], ids=["failed-test", "missing-path", "unknown-op"])
def test_an_operation_that_cannot_apply_is_invalid(api: Raw, configmap: str,
                                                   ops: list[dict[str, Any]]) -> None:
    r = api("PATCH", configmap, ops, content_type=JSON_PATCH)
    assert (r.status, r.body.get("reason")) == (422, "Invalid"), (r.status, r.body)
    assert api("GET", configmap).body["data"] == {"a": "1"}


def test_a_body_that_is_not_a_list_of_operations_is_a_bad_request(api: Raw,
                                                                    configmap: str) -> None:
    r = api("PATCH", configmap, {"op": "remove", "path": "/data"}, content_type=JSON_PATCH)
    assert (r.status, r.body["reason"]) == (400, "BadRequest"), r.body
    assert api("GET", configmap).body["data"] == {"a": "1"}
