"""The input of a PyTorchJob workflow, and what it carries across continue-as-new.

Kept out of the workflow module so the Temporal sandbox does not rebuild these pydantic
models for every job (they are passed through, like the rest of ``fleetq``).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from fleetq.lifecycle import JobProgress
from fleetq.models import errors_from_validation


class InvalidJobInput(ValueError):
    """Workflow input that can never be run; the workflow fails with this message."""


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
        ``{"manifest": ..., "policy": ...}``. Bad input raises ``InvalidJobInput``."""
        if isinstance(arg, dict) and "manifest" in arg and "kind" not in arg:
            try:
                return cls.model_validate(arg)
            except ValidationError as exc:
                raise InvalidJobInput(str(errors_from_validation("workflow input", exc))) from None
        if isinstance(arg, dict):
            return cls(manifest=arg)
        raise InvalidJobInput("workflow input must be a PyTorchJob manifest (a JSON object)")
