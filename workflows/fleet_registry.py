"""The fleet's durable registry of applied PropagationPolicies (and
ClusterPropagationPolicies), PriorityClasses and the ElasticQuotaTree's name.

A job started with only its manifest (e.g. by the plain ``temporal`` CLI) resolves its
policy here, through a query from the ``resolve_policy`` activity. One small workflow
(id ``fleetq/registry``) instead of a database keeps the product to Temporal alone.
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from fleetq.fleet_config import RequeueSettings, requeue_settings
    from fleetq.messages import DeleteRequest, Resolution, ResolveInput
    from fleetq.models import (
        ClusterPropagationPolicy,
        ManifestError,
        ManifestErrors,
        PriorityClass,
        PropagationPolicy,
        parse_object,
        parse_policy,
        parse_tree,
    )
    from fleetq.preemption import PREEMPTION_ANNOTATION, tree_policy
    from fleetq.registry import RegistryState, created_key, resolve_from_state
    from fleetq.room_claims import RoomClaim

__all__ = ["DeleteRequest", "FleetRegistryWorkflow", "RegistryState"]


@workflow.defn(name="FleetRegistryWorkflow")
class FleetRegistryWorkflow:
    @workflow.init
    def __init__(self, state: RegistryState) -> None:
        self._s = state
        self._policies: dict[str, PropagationPolicy] = {
            k: parse_policy(v) for k, v in state.policies.items()
        }

    @workflow.run
    async def run(self, state: RegistryState) -> None:
        await workflow.wait_condition(
            lambda: (
                workflow.info().is_continue_as_new_suggested()
                or workflow.info().get_current_history_length() > self._s.max_history_events
            )
        )
        await workflow.wait_condition(workflow.all_handlers_finished)
        self._s.room_claims.expire(workflow.now())
        workflow.continue_as_new(self._s)

    # ---------------------------------------------------------------- apply / delete
    @workflow.update
    def apply(self, manifest: dict[str, Any]) -> str:
        obj = parse_object(manifest)
        if isinstance(obj, ClusterPropagationPolicy) and "namespace" in (
                manifest.get("metadata") or {}):
            # cluster-scoped: kept without the namespace the API server would clear
            manifest = dict(manifest, metadata={
                k: v for k, v in manifest["metadata"].items() if k != "namespace"})
        if isinstance(obj, PropagationPolicy):  # either kind: the same spec
            key = obj.registry_key
            before = self._s.policies.get(key)
            self._s.policies[key] = manifest
            self._policies[key] = obj
            self._created(obj.kind, key, new=before is None)
            return (
                "created"
                if before is None
                else ("unchanged" if before == manifest else "configured")
            )
        if isinstance(obj, PriorityClass):
            before_v = self._s.priority_classes.get(obj.metadata.name)
            self._s.priority_classes[obj.metadata.name] = obj.value
            self._created("PriorityClass", obj.metadata.name, new=before_v is None)
            return (
                "created"
                if before_v is None
                else ("unchanged" if before_v == obj.value else "configured")
            )
        tree = parse_tree(manifest)
        name = f"{tree.metadata.namespace}/{tree.metadata.name}"
        before_t = self._s.tree
        self._s.tree = name
        self._preemption_now(dict(tree.metadata.annotations))
        self._created("ElasticQuotaTree", name, new=before_t is None)
        return "created" if before_t is None else "unchanged"

    def _preemption_now(self, annotations: dict[str, str]) -> None:
        """The tree's annotations are now ``annotations``; note when preemption changed."""
        key = PREEMPTION_ANNOTATION
        if annotations.get(key) != self._s.tree_annotations.get(key):
            self._s.preemption_changed = workflow.now()
        self._s.tree_annotations = annotations

    def _created(self, kind: str, key: str, *, new: bool) -> None:
        """Record when ``key`` was first applied (kept on re-apply, as Kubernetes keeps
        metadata.creationTimestamp; an object the state holds from before this was kept
        gets none rather than a wrong one)."""
        if new:
            self._s.created[created_key(kind, key)] = workflow.now()

    @apply.validator
    def _validate_apply(self, manifest: dict[str, Any]) -> None:
        try:
            obj = parse_object(manifest)
        except ManifestErrors as exc:
            raise ValueError(str(exc)) from None
        kind = manifest.get("kind")
        if kind not in ("PropagationPolicy", "ClusterPropagationPolicy", "PriorityClass",
                        "ElasticQuotaTree"):
            raise ValueError(f"{kind} objects are not kept in the fleet registry")
        if kind == "ElasticQuotaTree":
            try:  # fleetq.io/preemption, reclaim and fair-share-weight, as the quota workflow
                tree_policy(obj)  # type: ignore[arg-type]
            except ManifestError as exc:
                raise ValueError(str(exc)) from None
            # fleetq.io/... requeue overrides (placement and pods-ready timeouts, backoff)
            requeue_settings(
                RequeueSettings(),
                obj.metadata.annotations,  # type: ignore[union-attr]
                f"ElasticQuotaTree {obj.metadata.namespace}/{obj.metadata.name}",  # type: ignore[union-attr]
            )
            name = f"{obj.metadata.namespace}/{obj.metadata.name}"  # type: ignore[union-attr]
            if self._s.tree is not None and self._s.tree != name:
                raise ValueError(
                    f"ElasticQuotaTree {name}: only one ElasticQuotaTree is supported "
                    f"and {self._s.tree} exists"
                )

    @workflow.update
    def delete(self, req: DeleteRequest) -> bool:
        if req.kind in ("PropagationPolicy", "ClusterPropagationPolicy"):
            key = req.name if req.kind == "ClusterPropagationPolicy" else (
                f"{req.namespace}/{req.name}")
            self._policies.pop(key, None)
            self._s.created.pop(created_key(req.kind, key), None)
            return self._s.policies.pop(key, None) is not None
        if req.kind == "PriorityClass":
            self._s.created.pop(created_key(req.kind, req.name), None)
            return self._s.priority_classes.pop(req.name, None) is not None
        if req.kind == "ElasticQuotaTree" and self._s.tree == f"{req.namespace}/{req.name}":
            self._s.created.pop(created_key(req.kind, self._s.tree), None)
            self._s.tree = None
            self._preemption_now({})
            return True
        return False

    # ---------------------------------------------------------------- room claims
    @workflow.update
    def claim_room(self, claim: RoomClaim) -> RoomClaim:
        """Hold ``claim`` for its preemptor until ``bound_seconds`` of workflow time
        pass (a placement activity records it before the preemptor evicts anyone)."""
        return self._s.room_claims.claim(claim, workflow.now())

    @workflow.update
    def release_room(self, preemptor: str) -> bool:
        self._s.room_claims.expire(workflow.now())
        return self._s.room_claims.release(preemptor)

    # ---------------------------------------------------------------- queries
    @workflow.query
    def resolve(self, inp: ResolveInput) -> Resolution:
        return resolve_from_state(self._s, list(self._policies.values()), inp)

    @workflow.query
    def room_claims(self) -> list[RoomClaim]:
        """Every recorded claim (readers drop the expired ones by their own clock)."""
        return list(self._s.room_claims.claims.values())

    @workflow.query
    def state(self) -> RegistryState:
        return self._s

