"""The activity references workflows call (``fleetq.activity_refs``) name the activities
the worker registers, with the input and result types those take and return: a rename or
a changed signature on either side fails here, not as a job stuck on an unknown
activity type."""

from __future__ import annotations

import inspect
import typing
from typing import Any

from temporalio import activity

from activities.scheduling import SchedulingActivities
from fleetq import activity_refs


def _registered() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for _, fn in inspect.getmembers(SchedulingActivities, inspect.isfunction):
        defn = activity._Definition.from_callable(fn)
        if defn is not None and defn.name is not None:
            out[defn.name] = fn
    return out


def test_every_reference_names_a_registered_activity_with_its_types() -> None:
    registered = _registered()
    for ref in activity_refs.ALL:
        assert ref.name in registered, ref.name
        hints = typing.get_type_hints(registered[ref.name])
        params = [p for p in inspect.signature(registered[ref.name]).parameters if p != "self"]
        assert hints["return"] == ref.result, ref.name
        if ref.input is None:
            assert params == [], ref.name
        else:
            assert [hints[p] for p in params] == [ref.input], ref.name


def test_every_registered_activity_has_a_reference() -> None:
    assert set(_registered()) == {ref.name for ref in activity_refs.ALL}
