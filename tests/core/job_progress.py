"""What the lifecycle tests start from: a job's progress made from a few view fields,
and instants counted in seconds from a fixed start."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from fleetq.lifecycle import JobProgress
from fleetq.messages import JobView, Resolution

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def job_progress(**view: Any) -> JobProgress:
    """A job's progress with the view ``default/train``, Running, but for ``view``, and an
    empty resolution."""
    fields: dict[str, Any] = {"namespace": "default", "name": "train", "state": "Running"}
    fields.update(view)
    return JobProgress(view=JobView(**fields), resolution=Resolution())
