"""Calling an activity from a workflow through its ``fleetq.activity_refs`` reference:
by name, its result decoded as the reference's result type, typed end to end.

Same commands as ``workflow.*_activity_method`` on the activities class (the activity
type is the name), so histories are unchanged.
"""

from __future__ import annotations

from typing import Any, TypeVar

from temporalio import workflow
from temporalio.workflow import ActivityHandle

with workflow.unsafe.imports_passed_through():
    from fleetq.activity_refs import ActivityRef

I = TypeVar("I")  # noqa: E741
O = TypeVar("O")  # noqa: E741


def _args(ref: ActivityRef[Any, Any], arg: Any) -> list[Any]:
    return [] if ref.input is None else [arg]


def start(ref: ActivityRef[I, O], arg: I, **options: Any) -> ActivityHandle[O]:
    """Start a regular activity (``options``: ``workflow.start_activity``'s)."""
    handle: ActivityHandle[O] = workflow.start_activity(
        ref.name, args=_args(ref, arg), result_type=ref.result, **options
    )
    return handle


async def execute(ref: ActivityRef[I, O], arg: I, **options: Any) -> O:
    """Run a regular activity to its result."""
    return await start(ref, arg, **options)


async def execute_local(ref: ActivityRef[I, O], arg: I, **options: Any) -> O:
    """Run a local activity to its result (``options``: ``execute_local_activity``'s)."""
    result: O = await workflow.execute_local_activity(
        ref.name, args=_args(ref, arg), result_type=ref.result, **options
    )
    return result
