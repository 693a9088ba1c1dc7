"""Whether a pod may go on a node: the kube-scheduler filter predicates the emulator
honours (cordon, nodeSelector and required node affinity, NoSchedule/NoExecute taints,
pod slots, resource requests), worded as kube-scheduler words its reasons."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fleetq import resources as R
from fleetq.emulator.selectors import match_label_selector


@dataclass
class NodeState:
    """What scheduling needs of one Node object."""

    name: str
    allocatable: R.Resources
    pods: int
    labels: dict[str, str]
    taints: list[dict[str, Any]]
    unschedulable: bool


@dataclass
class PodShape:
    """What placement needs of one pod (or reservation template)."""

    requests: R.Resources
    spec: dict[str, Any]
    labels: dict[str, str] = field(default_factory=dict)
    namespace: str = ""
    needs_reservation: bool = False  # reservation affinity: only a reservation will do


def tolerates(tolerations: list[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    for t in tolerations:
        effect = t.get("effect")
        if effect and effect != taint.get("effect"):
            continue
        key = t.get("key")
        if t.get("operator") == "Exists":
            if not key or key == taint.get("key"):
                return True
            continue
        if key == taint.get("key") and (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def node_affinity_ok(spec: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    aff = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if not aff:
        return True
    terms = aff.get("nodeSelectorTerms") or []
    for term in terms:
        exprs = term.get("matchExpressions") or []
        if match_label_selector({"matchExpressions": exprs}, labels):
            return True
    return not terms


def node_reject(st: NodeState, shape: PodShape, free: R.Resources, pods_free: int) -> str | None:
    """Why ``shape`` cannot go on this node (kube-scheduler wording), or None."""
    spec = shape.spec
    if st.unschedulable:
        return "node(s) were unschedulable"
    sel = spec.get("nodeSelector") or {}
    if any(st.labels.get(k) != v for k, v in sel.items()) or not node_affinity_ok(
        spec, st.labels
    ):
        return "node(s) didn't match Pod's node affinity/selector"
    tols = spec.get("tolerations") or []
    for taint in st.taints:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tols, taint):
            shown = f"{taint.get('key')}: {taint.get('value', '')}"
            return f"node(s) had untolerated taint {{{shown}}}"
    if pods_free < 1:
        return "Too many pods"
    short = R.shortfalls(shape.requests, free)
    if short:
        return f"Insufficient {short[0]}"
    return None


def unavailable_message(node_count: int, reasons: Mapping[str, int]) -> str:
    """kube-scheduler's ``0/N nodes are available: 2 Insufficient cpu, ...``."""
    detail = ", ".join(f"{n} {w}" for w, n in sorted(reasons.items()))
    return f"0/{node_count} nodes are available: {detail or 'no nodes'}."
