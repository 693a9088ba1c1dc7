"""Kubernetes toleration matching (``Toleration.ToleratesTaint``), for node and cluster
taints: placement keeps a pod off nodes whose NoSchedule/NoExecute taints it does not
tolerate, and a gang off clusters whose taints its clusterTolerations do not."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fleetq.capacity import Taint
from fleetq.models import Toleration

#: Taint effects that keep a pod off a node (PreferNoSchedule is only a preference).
HARD_EFFECTS = frozenset({"NoSchedule", "NoExecute"})

TolerationLike = Toleration | Mapping[str, Any]


def _tol_fields(t: TolerationLike) -> tuple[str, str, str, str]:
    if isinstance(t, Toleration):
        return (t.key or "", t.operator or "Equal", t.value or "", t.effect or "")
    get = t.get
    return (
        str(get("key") or ""),
        str(get("operator") or "Equal"),
        str(get("value") or ""),
        str(get("effect") or ""),
    )


def _tolerates_fields(tol: tuple[str, str, str, str], taint: Taint) -> bool:
    key, op, value, effect = tol
    if effect and effect != taint.effect:
        return False
    if key and key != taint.key:
        return False
    if op == "Exists":
        return True
    if op == "Equal":
        return value == (taint.value or "")
    return False


def tolerates(toleration: TolerationLike, taint: Taint) -> bool:
    """Kubernetes ``Toleration.ToleratesTaint``: effects must match unless the toleration
    has none; keys must match unless the toleration's key is empty (with ``Exists`` that
    tolerates every taint); ``Exists`` ignores the value, ``Equal`` compares it."""
    return _tolerates_fields(_tol_fields(toleration), taint)


def untolerated_taints(
    taints: Sequence[Taint], tolerations: Sequence[TolerationLike]
) -> list[Taint]:
    """The NoSchedule/NoExecute taints none of ``tolerations`` tolerates."""
    fields = [_tol_fields(t) for t in tolerations]
    return [
        taint
        for taint in taints
        if taint.effect in HARD_EFFECTS and not any(_tolerates_fields(f, taint) for f in fields)
    ]


def _taint_text(t: Taint) -> str:
    return f"{t.key}={t.value}:{t.effect}" if t.value else f"{t.key}:{t.effect}"

