"""What a job looks like from outside: :class:`JobView`, the answer of a job workflow's
``status`` query and its result once it ended, shown by ``fleetq get/describe`` and
``temporal workflow query --name status``.

Pure core, and on its own (pydantic and nothing else of fleetq) so that ``fleetq get
pytorchjob`` decodes a view without building every Temporal contract in
:mod:`fleetq.messages`, which re-exports these names.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

JobState = Literal[
    "Validating",
    "Queued",
    # waiting, but its gang minimum exceeds a max of its quota chain: never admitted
    # under the current tree (re-evaluated when the tree changes)
    "Inadmissible",
    "Scheduling",
    "Pending",
    "Created",
    "Running",
    # the bound copy is unhealthy and failover.application's tolerationSeconds has not
    # run out: it fails over then, or goes back to Running if the copy recovers first
    "Unhealthy",
    "FailingOver",
    # runPolicy.suspend (or fleetq suspend): no copy, no quota, until resumed
    "Suspended",
    # no member could hold the gang even empty: no quota held, placed again (queued with
    # its original submit time) once a member's nodes change (issue 24)
    "Unschedulable",
    "Succeeded",
    "Failed",
    "Deleted",
    # Only the CLI shows it: a workflow started by hand and refused (InvalidManifest).
    "Refused",
]
TERMINAL_STATES = ("Succeeded", "Failed", "Deleted")


class JobEvent(BaseModel):
    """One event, aggregated as Kubernetes does: ``count`` occurrences of the same type,
    reason and message, the first at ``first_time`` (None: ``time``), the last at
    ``time`` (kubectl describe: ``FailedScheduling (x7 over 21m)``)."""

    type: Literal["Normal", "Warning"] = "Normal"
    reason: str
    message: str
    time: datetime
    count: int = 1
    first_time: datetime | None = None


class JobView(BaseModel):
    """What ``fleetq get/describe`` and ``temporal workflow query --name status`` show."""

    namespace: str
    name: str
    state: JobState
    reason: str = ""
    cluster: str | None = None
    #: the placement.clusterAffinities group of ``cluster`` (kept after a failover: the
    #: next placement starts there, as Karmada's schedulerObservedAffinityName)
    cluster_group: str = ""
    queue: str | None = None
    queued: bool = False
    admitted: bool = False
    priority: int = 0
    policy: str | None = None
    summary: str = ""
    created_at: datetime | None = None
    bound_at: datetime | None = None
    finished_at: datetime | None = None
    copies: list[str] = Field(default_factory=list)  # clusters holding a copy of the job
    #: each copy's ``metadata.creationTimestamp`` as last read from its member (its AGE,
    #: also while the member does not answer)
    copy_created: dict[str, datetime] = Field(default_factory=dict)
    evicted: list[str] = Field(default_factory=list)
    pending_purges: list[str] = Field(default_factory=list)
    #: members holding a copy of the job that did not answer, since when (the time
    #: their health taint was added, else when the job first saw them silent)
    unreachable: dict[str, datetime] = Field(default_factory=dict)
    unhealthy_since: datetime | None = None
    #: runPolicy.activeDeadlineSeconds after the first bind (reset by a suspension)
    deadline_at: datetime | None = None
    #: "gang minimum 3 of 5 pods (elasticPolicy.minReplicas)" / "gang of 3 pods ..."
    gang: str = ""
    pods: list[dict[str, Any]] = Field(default_factory=list)
    rejections: dict[str, str] = Field(default_factory=dict)
    events: list[JobEvent] = Field(default_factory=list)
