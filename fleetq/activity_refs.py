"""The activities workflows call, named with their input and result types.

A workflow references an activity through one of these (``workflows.activity_calls``
calls it by name, decoding its result as ``result``), never through the activities
module: the workflow sandbox then imports no adapter (the kubernetes client, HTTP).
The names are the ones ``activities.scheduling.SchedulingActivities`` registers
(``tests/core/test_activity_refs.py`` checks each against its signature).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from fleetq.messages import (
    BindInput,
    BindResult,
    HolderCheck,
    HolderVerdict,
    JobStatus,
    PlacementInput,
    PlacementVerdict,
    PurgeInput,
    PurgeResult,
    QuotaSignal,
    Resolution,
    ResolveInput,
    WatchInput,
)

I = TypeVar("I")  # noqa: E741  (the input)
O = TypeVar("O")  # noqa: E741  (the result)


@dataclass(frozen=True)
class ActivityRef(Generic[I, O]):
    """One activity: its registered name, its input's type (``None``: it takes none) and
    its result's type (what the payload converter decodes the result as)."""

    name: str
    input: Any
    result: Any


RESOLVE_POLICY: ActivityRef[ResolveInput, Resolution] = ActivityRef(
    "resolve_policy", ResolveInput, Resolution
)
SIGNAL_QUOTA: ActivityRef[QuotaSignal, bool] = ActivityRef("signal_quota", QuotaSignal, bool)
CHECK_HOLDERS: ActivityRef[HolderCheck, HolderVerdict] = ActivityRef(
    "check_holders", HolderCheck, HolderVerdict
)
PLAN_PLACEMENT: ActivityRef[PlacementInput, PlacementVerdict] = ActivityRef(
    "plan_placement", PlacementInput, PlacementVerdict
)
#: reserves first when ``BindInput.reserve`` is set, then binds: one member write
BIND: ActivityRef[BindInput, BindResult] = ActivityRef("bind", BindInput, BindResult)
PURGE: ActivityRef[PurgeInput, PurgeResult] = ActivityRef("purge", PurgeInput, PurgeResult)
PURGE_WHEN_REACHABLE: ActivityRef[PurgeInput, PurgeResult] = ActivityRef(
    "purge_when_reachable", PurgeInput, PurgeResult
)
MEMBER_NAMES: ActivityRef[None, list[str]] = ActivityRef("member_names", None, list[str])
WATCH_STATUS: ActivityRef[WatchInput, JobStatus] = ActivityRef(
    "watch_status", WatchInput, JobStatus
)

ALL: tuple[ActivityRef[Any, Any], ...] = (
    RESOLVE_POLICY, SIGNAL_QUOTA, CHECK_HOLDERS, PLAN_PLACEMENT, BIND, PURGE,
    PURGE_WHEN_REACHABLE, MEMBER_NAMES, WATCH_STATUS,
)
