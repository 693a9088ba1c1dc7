"""What the fleet registry holds, and how a job resolves its policy from it (pure).

The ``FleetRegistryWorkflow`` keeps a :class:`RegistryState`; its ``resolve`` query and the
worker's cached snapshot of it (``activities/scheduling.py``) both answer with
:func:`resolve_from_state`, so the two can never disagree.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from fleetq.naming import tree_workflow_id
from fleetq.policy_match import match_policy
from fleetq.preemption import PREEMPTION_ANNOTATION, PreemptionMode
from fleetq.room_claims import RoomClaims

if TYPE_CHECKING:  # the contracts only where a job resolves: a client that reads the
    # registry's state (fleetq apply of a job) builds no Temporal contract
    from fleetq.messages import Resolution, ResolveInput
    from fleetq.models import PropagationPolicy


class RegistryState(BaseModel):
    #: "ns/name" -> a PropagationPolicy's manifest; "name" -> a ClusterPropagationPolicy's
    #: (a namespace has no "/", so the two never collide; both kinds parse with
    #: fleetq.models.parse_policy, so a reader of the policies needs no second list)
    policies: dict[str, dict[str, Any]] = Field(default_factory=dict)
    priority_classes: dict[str, int] = Field(default_factory=dict)
    tree: str | None = None  # "kube-system/<name>"
    #: the tree's metadata.annotations (its fleetq.io/... settings, e.g. the requeue
    #: overrides of fleetq.fleet_config.requeue_settings)
    tree_annotations: dict[str, str] = Field(default_factory=dict)
    #: when each object was first applied (:func:`created_key` -> time), kept when it is
    #: re-applied as Kubernetes keeps metadata.creationTimestamp, dropped on delete: the
    #: AGE ``fleetq get`` shows (an object applied before this was kept has none:
    #: ``<unknown>``)
    created: dict[str, datetime] = Field(default_factory=dict)
    #: when the tree's fleetq.io/preemption last changed (applied, changed, deleted)
    preemption_changed: datetime | None = None
    #: room capacity preemptions made, held for their preemptors (fleetq.room_claims)
    room_claims: RoomClaims = Field(default_factory=RoomClaims)
    max_history_events: int = 2000


def lower_priority(state: RegistryState) -> bool:
    """Whether the tree's fleetq.io/preemption is LowerPriority (capacity preemption on)."""
    return state.tree_annotations.get(PREEMPTION_ANNOTATION) == PreemptionMode.LOWER_PRIORITY.value


def may_hold_claims(state: RegistryState) -> bool:
    """Whether a placement must read the room claims: some are recorded, or capacity
    preemption is on (one may be recorded since ``state`` was read)."""
    return bool(state.room_claims.claims) or lower_priority(state)


def may_claim(state: RegistryState, now: datetime, max_age: float) -> bool:
    """Whether a capacity preemption may claim room now: preemption has been on for
    longer than ``max_age``, the oldest registry snapshot a placement decides by, so every
    placement from now on reads the claims (:func:`may_hold_claims`)."""
    changed = state.preemption_changed
    return lower_priority(state) and changed is not None and (
        (now - changed).total_seconds() > max_age)


def preempts_for_capacity(
    state: RegistryState, tree_id: str, now: datetime, max_age: float
) -> bool:
    """Whether a job of the quota tree ``tree_id`` (its workflow id) may plan a capacity
    preemption now: the registry holds that tree, and its fleetq.io/preemption has been
    LowerPriority for longer than ``max_age`` (:func:`may_claim`)."""
    return (
        state.tree is not None
        and tree_workflow_id(state.tree) == tree_id
        and may_claim(state, now, max_age)
    )


def created_key(kind: str, key: str) -> str:
    """``RegistryState.created``'s key: ``Kind/`` and the object's key in its own map
    (``PropagationPolicy/ns/name``, ``ClusterPropagationPolicy/name``, ``PriorityClass/name``,
    ``ElasticQuotaTree/kube-system/name``)."""
    return f"{kind}/{key}"


def resolve_from_state(
    state: RegistryState, policies: list[PropagationPolicy], inp: ResolveInput
) -> Resolution:
    """What a job needs from the registry (pure; the ``resolve`` query and the worker's
    cached registry snapshot both use it). ``policies`` are ``state.policies`` parsed."""
    from fleetq.messages import Resolution

    policy = match_policy(
        policies,
        api_version=inp.api_version,
        kind=inp.kind,
        namespace=inp.namespace,
        name=inp.name,
        labels=inp.labels,
    )
    tree_id = tree_workflow_id(state.tree) if state.tree else None
    if policy is None:
        reason = (
            f"no PropagationPolicy in namespace {inp.namespace} (nor any "
            f"ClusterPropagationPolicy) selects {inp.kind} {inp.namespace}/{inp.name}"
        )
        return Resolution(
            policy_reason=reason,
            tree_workflow_id=tree_id,
            priority_classes=dict(state.priority_classes),
        )
    return Resolution(
        policy=state.policies[policy.registry_key],
        policy_reason=policy.ref,
        tree_workflow_id=tree_id,
        priority_classes=dict(state.priority_classes),
    )
