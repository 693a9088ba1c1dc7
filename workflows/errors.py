"""The Temporal failures fleetq's workflows raise and recognise.

Kept out of the pure core (``fleetq/``), which knows nothing of Temporal: the core says
*what* is wrong (``fleetq.job_input.InvalidJobInput``), a workflow turns it into the
non-retryable failure Temporal records.
"""

from __future__ import annotations

from temporalio.exceptions import ActivityError, ApplicationError, CancelledError

#: the failure type of a workflow whose input can never be run (a client sees it)
INVALID_MANIFEST = "InvalidManifest"


def cancelled_by_delete(exc: BaseException) -> bool:
    """An activity that ended because the workflow itself was cancelled (deleted)."""
    return isinstance(exc, ActivityError) and isinstance(exc.cause, CancelledError)


def invalid_input(message: str) -> ApplicationError:
    """A non-retryable failure of the workflow (never of its workflow task, which
    Temporal would retry forever)."""
    return ApplicationError(message, type=INVALID_MANIFEST, non_retryable=True)
