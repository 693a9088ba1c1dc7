"""The signals, queries and updates each workflow takes, named with their types.

Callers (other workflows, activities, the client library) signal, query and update a
workflow through one of these, never by a bare string: a renamed handler or a changed
argument type is then one edit here, and ``tests/core/test_handler_refs.py`` checks every
reference against the handler the workflow class registers (name, argument and result
types) and that every handler has one. The activity counterpart is ``activity_refs``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from fleetq.admission import AdmissionRequest, Grant, QueueInfo, WaitInfo
from fleetq.job_view import JobView
from fleetq.messages import (
    AdmissibilitySignal,
    DeleteRequest,
    PreemptSignal,
    QuotaBatch,
    QuotaReceipt,
    QuotaView,
    Resolution,
    ResolveInput,
)
from fleetq.quota import Inadmissible
from fleetq.registry import RegistryState
from fleetq.room_claims import RoomClaim

A = TypeVar("A")  # the argument
R = TypeVar("R")  # the result


@dataclass(frozen=True)
class SignalRef(Generic[A]):
    """A signal: its name and its argument's type (``None``: it takes none)."""

    name: str
    arg: Any


@dataclass(frozen=True)
class QueryRef(Generic[A, R]):
    """A query: its name, its argument's type (``None``: none) and its result's type."""

    name: str
    arg: Any
    result: Any


@dataclass(frozen=True)
class UpdateRef(Generic[A, R]):
    """An update: its name, its argument's type and its result's type."""

    name: str
    arg: Any
    result: Any


class JobHandlers:
    """``PyTorchJobWorkflow`` (``pytorchjob/<namespace>/<name>``)."""

    ADMITTED: SignalRef[Grant] = SignalRef("admitted", Grant)
    ADMISSIBILITY: SignalRef[AdmissibilitySignal] = SignalRef(
        "admissibility", AdmissibilitySignal)
    SUSPEND: SignalRef[None] = SignalRef("suspend", None)
    RESUME: SignalRef[None] = SignalRef("resume", None)
    PREEMPT: SignalRef[PreemptSignal] = SignalRef("preempt", PreemptSignal)
    RETRY_PLACEMENT: SignalRef[None] = SignalRef("retry_placement", None)
    STATUS: QueryRef[None, JobView | None] = QueryRef("status", None, JobView | None)


class QuotaTreeHandlers:
    """``QuotaTreeWorkflow`` (``quota/kube-system/<tree>``)."""

    APPLY_TREE: UpdateRef[dict[str, Any], str] = UpdateRef("apply_tree", dict[str, Any], str)
    SUBMIT: UpdateRef[QuotaBatch, QuotaReceipt] = UpdateRef("submit", QuotaBatch, QuotaReceipt)
    ENQUEUE: SignalRef[AdmissionRequest] = SignalRef("enqueue", AdmissionRequest)
    REQUEUE: SignalRef[AdmissionRequest] = SignalRef("requeue", AdmissionRequest)
    RELEASE: SignalRef[str] = SignalRef("release", str)
    CANCEL: SignalRef[str] = SignalRef("cancel", str)
    STOP: SignalRef[None] = SignalRef("stop", None)
    QUEUES: QueryRef[None, list[QueueInfo]] = QueryRef("queues", None, list[QueueInfo])
    WAIT_INFO: QueryRef[str, WaitInfo | None] = QueryRef("wait_info", str, WaitInfo | None)
    NEVER_FITS: QueryRef[AdmissionRequest, Inadmissible | None] = QueryRef(
        "never_fits", AdmissionRequest, Inadmissible | None)
    HOLDERS: QueryRef[None, list[str]] = QueryRef("holders", None, list[str])
    USAGE: QueryRef[str, dict[str, int]] = QueryRef("usage", str, dict[str, int])
    VIEW: QueryRef[None, QuotaView] = QueryRef("view", None, QuotaView)


class RegistryHandlers:
    """``FleetRegistryWorkflow`` (``fleetq/registry``)."""

    APPLY: UpdateRef[dict[str, Any], str] = UpdateRef("apply", dict[str, Any], str)
    DELETE: UpdateRef[DeleteRequest, bool] = UpdateRef("delete", DeleteRequest, bool)
    CLAIM_ROOM: UpdateRef[RoomClaim, RoomClaim] = UpdateRef("claim_room", RoomClaim, RoomClaim)
    RELEASE_ROOM: UpdateRef[str, bool] = UpdateRef("release_room", str, bool)
    RESOLVE: QueryRef[ResolveInput, Resolution] = QueryRef("resolve", ResolveInput, Resolution)
    ROOM_CLAIMS: QueryRef[None, list[RoomClaim]] = QueryRef(
        "room_claims", None, list[RoomClaim])
    STATE: QueryRef[None, RegistryState] = QueryRef("state", None, RegistryState)
