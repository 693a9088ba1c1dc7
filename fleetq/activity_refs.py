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

from fleetq import messages as m

I = TypeVar("I")  # noqa: E741  (the input)
O = TypeVar("O")  # noqa: E741  (the result)


@dataclass(frozen=True)
class ActivityRef(Generic[I, O]):
    """One activity: its registered name, its input's type (``None``: it takes none) and
    its result's type (what the payload converter decodes the result as)."""

    name: str
    input: Any
    result: Any


RESOLVE_POLICY: ActivityRef[m.ResolveInput, m.Resolution] = ActivityRef(
    "resolve_policy", m.ResolveInput, m.Resolution
)
#: the grant comes back in the answer when an enqueue is admitted at once
SIGNAL_QUOTA: ActivityRef[m.QuotaSignal, m.QuotaAck] = ActivityRef(
    "signal_quota", m.QuotaSignal, m.QuotaAck
)
CHECK_HOLDERS: ActivityRef[m.HolderCheck, m.HolderVerdict] = ActivityRef(
    "check_holders", m.HolderCheck, m.HolderVerdict
)
PLAN_PLACEMENT: ActivityRef[m.PlacementInput, m.PlacementVerdict] = ActivityRef(
    "plan_placement", m.PlacementInput, m.PlacementVerdict
)
#: reserves first when ``BindInput.reserve`` is set, then binds: one member write
BIND: ActivityRef[m.BindInput, m.BindResult] = ActivityRef("bind", m.BindInput, m.BindResult)
PURGE: ActivityRef[m.PurgeInput, m.PurgeResult] = ActivityRef("purge", m.PurgeInput, m.PurgeResult)
PURGE_WHEN_REACHABLE: ActivityRef[m.PurgeInput, m.PurgeResult] = ActivityRef(
    "purge_when_reachable", m.PurgeInput, m.PurgeResult
)
#: a pass's grace-0 victims purged on every member for the quota workflow
#: (docs/decisions/023): the workflow ids of those every member asked answered for
PURGE_FOR_PREEMPTION: ActivityRef[m.VictimsPurge, list[str]] = ActivityRef(
    "purge_for_preemption", m.VictimsPurge, list[str]
)
MEMBER_NAMES: ActivityRef[None, list[str]] = ActivityRef("member_names", None, list[str])
WATCH_STATUS: ActivityRef[m.WatchInput, m.JobStatus] = ActivityRef(
    "watch_status", m.WatchInput, m.JobStatus
)

ALL: tuple[ActivityRef[Any, Any], ...] = (
    RESOLVE_POLICY, SIGNAL_QUOTA, CHECK_HOLDERS, PLAN_PLACEMENT, BIND, PURGE,
    PURGE_WHEN_REACHABLE, PURGE_FOR_PREEMPTION, MEMBER_NAMES, WATCH_STATUS,
)
