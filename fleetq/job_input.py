"""The input of a PyTorchJob workflow, and what it carries across continue-as-new.

Kept out of the workflow module so the Temporal sandbox does not rebuild these pydantic
models for every job (they are passed through, like the rest of ``fleetq``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ValidationError
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError

from fleetq.admission import Grant
from fleetq.messages import JobView, Resolution
from fleetq.models import errors_from_validation


class JobProgress(BaseModel):
    """Everything a run hands to the next one on continue-as-new."""

    view: JobView
    resolution: Resolution
    grant: Grant | None = None
    since: str = ""
    graceful_old: str | None = None
    grace_deadline: datetime | None = None
    #: a NoExecute health taint on the current member evicts the job at this time
    evict_at: datetime | None = None
    evict_reason: str = ""


class JobInput(BaseModel):
    manifest: dict[str, Any]
    policy: dict[str, Any] | None = None
    run_seconds: int | None = None  # emulator hint (demos, benchmarks): pods run this long
    #: pause (durable timer) after a watch window ends without change
    rewatch_seconds: float = 10.0
    progress: JobProgress | None = None

    @classmethod
    def from_arg(cls, arg: Any) -> JobInput:
        """The plain ``temporal`` CLI passes the PyTorchJob manifest itself; our CLI passes
        ``{"manifest": ..., "policy": ...}``. Bad input is a non-retryable failure of the
        workflow (never of its workflow task, which Temporal would retry forever)."""
        if isinstance(arg, dict) and "manifest" in arg and "kind" not in arg:
            try:
                return cls.model_validate(arg)
            except ValidationError as exc:
                raise invalid_input(str(errors_from_validation("workflow input", exc))) from None
        if isinstance(arg, dict):
            return cls(manifest=arg)
        raise invalid_input("workflow input must be a PyTorchJob manifest (a JSON object)")


def cancelled_by_delete(exc: BaseException) -> bool:
    """An activity that ended because the workflow itself was cancelled (deleted)."""
    return isinstance(exc, ActivityError) and isinstance(exc.cause, CancelledError)


def invalid_input(message: str) -> ApplicationError:
    return ApplicationError(message, type="InvalidManifest", non_retryable=True)
