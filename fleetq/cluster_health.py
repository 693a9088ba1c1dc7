"""Member-cluster health in Karmada's vocabulary: a Ready condition, the taints it puts
on the member, and when a workload there must be evicted.

Karmada taints a cluster whose Ready is ``Unknown`` with ``cluster.karmada.io/unreachable``
and one whose Ready is ``False`` with ``cluster.karmada.io/not-ready``; ``NoExecute``
evicts once the taint outlasts the matching ``placement.clusterTolerations`` entry's
``tolerationSeconds`` (none: for ever; no match: at once). Like Kubernetes'
``DefaultTolerationSeconds`` plugin (Karmada's ``--default-unreachable-toleration-seconds``),
a policy tolerating neither taint gets 300 s, so a job leaves a dead member after five
minutes. Pure: the capacity cache computes the condition, the watch activity asks
:func:`eviction_due`, the workflow sets the timer (docs/member-contract.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from fleetq.capacity import Taint
from fleetq.placement import TolerationLike, tolerates

TAINT_UNREACHABLE = "cluster.karmada.io/unreachable"
TAINT_NOT_READY = "cluster.karmada.io/not-ready"
NO_SCHEDULE = "NoSchedule"
NO_EXECUTE = "NoExecute"

ReadyStatus = Literal["True", "False", "Unknown"]


@dataclass(frozen=True)
class ClusterCondition:
    """A member's Ready condition as fleetq sees it: ``True``, ``False`` (its API answers
    but reports errors) or ``Unknown`` (it does not answer), since ``since`` (epoch
    seconds), with a one-line ``reason``."""

    ready: ReadyStatus
    since: float
    reason: str = ""


READY = ClusterCondition("True", 0.0)


@dataclass(frozen=True)
class TaintSettings:
    """The fleet's cluster-failover settings (``clusterFailover`` in fleet.yaml).

    ``no_execute``: an unreachable or not-ready member is also tainted ``NoExecute``, so
    its workloads are evicted once their toleration runs out (Karmada: a
    ClusterTaintPolicy). The default toleration seconds are added to a policy that does
    not tolerate the taint itself; ``None`` tolerates for ever."""

    no_execute: bool = True
    unreachable_toleration_seconds: int | None = 300
    not_ready_toleration_seconds: int | None = 300


def cluster_taints(condition: ClusterCondition, settings: TaintSettings) -> tuple[Taint, ...]:
    """The taints a member carries because of its Ready condition."""
    if condition.ready == "True":
        return ()
    key = TAINT_UNREACHABLE if condition.ready == "Unknown" else TAINT_NOT_READY
    effects = (NO_SCHEDULE, NO_EXECUTE) if settings.no_execute else (NO_SCHEDULE,)
    return tuple(Taint(key, "", effect, condition.since) for effect in effects)


def _default_tolerations(
    tolerations: Sequence[TolerationLike], settings: TaintSettings
) -> list[dict[str, object]]:
    """What ``DefaultTolerationSeconds`` adds: a ``key:NoExecute`` toleration for each of
    the two health taints the policy does not already tolerate with effect NoExecute (or
    with no effect)."""
    out: list[dict[str, object]] = []
    for key, seconds in (
        (TAINT_UNREACHABLE, settings.unreachable_toleration_seconds),
        (TAINT_NOT_READY, settings.not_ready_toleration_seconds),
    ):
        probe = Taint(key, "", NO_EXECUTE)
        if any(_key_and_effect(t) == (key, True) and tolerates(t, probe) for t in tolerations):
            continue
        default: dict[str, object] = {"key": key, "operator": "Exists", "effect": NO_EXECUTE}
        if seconds is not None:
            default["tolerationSeconds"] = seconds
        out.append(default)
    return out


def _key_and_effect(t: TolerationLike) -> tuple[str, bool]:
    if isinstance(t, dict):
        key, effect = str(t.get("key") or ""), str(t.get("effect") or "")
    else:
        key, effect = str(getattr(t, "key", "") or ""), str(getattr(t, "effect", "") or "")
    return key, effect in ("", NO_EXECUTE)


def _seconds(t: TolerationLike) -> int | None:
    value = t.get("tolerationSeconds") if isinstance(t, dict) else getattr(
        t, "tolerationSeconds", None
    )
    return None if value is None else max(0, int(value))  # type: ignore[call-overload]


@dataclass(frozen=True)
class Eviction:
    """When a workload on a tainted member must go, and why (one line)."""

    at: float
    taint: Taint
    message: str
    #: the tolerationSeconds that tolerate the taint until ``at`` (None: not tolerated)
    tolerated: int | None = None


def eviction_due(
    taints: Sequence[Taint],
    tolerations: Sequence[TolerationLike],
    settings: TaintSettings,
) -> Eviction | None:
    """The earliest eviction the member's ``NoExecute`` taints impose on a workload with
    these cluster tolerations, or None when every such taint is tolerated for ever.

    Kubernetes' taint manager semantics: a taint no toleration matches evicts at once;
    of the matching tolerations the smallest ``tolerationSeconds`` counts, and only if
    none of them has one is the taint tolerated for ever."""
    effective = list(tolerations) + _default_tolerations(tolerations, settings)
    best: Eviction | None = None
    for taint in taints:
        if taint.effect != NO_EXECUTE:
            continue
        added = taint.time_added or 0.0
        matching = [t for t in effective if tolerates(t, taint)]
        text = f"{taint.key}:{taint.effect}"
        if not matching:
            ev = Eviction(added, taint, f"taint {text} is not tolerated")
        else:
            limits = [s for s in (_seconds(t) for t in matching) if s is not None]
            if not limits:
                continue
            limit = min(limits)
            ev = Eviction(
                added + limit, taint, f"taint {text} outlasted tolerationSeconds {limit}", limit
            )
        if best is None or ev.at < best.at:
            best = ev
    return best


def taint_text(taint: Taint) -> str:
    """``key:Effect`` (``key=value:Effect`` with a value), as kubectl prints taints."""
    return f"{taint.key}={taint.value}:{taint.effect}" if taint.value else (
        f"{taint.key}:{taint.effect}"
    )
