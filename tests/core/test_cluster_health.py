"""Member health taints and NoExecute eviction (``fleetq.cluster_health``): Karmada's
taint keys, Kubernetes' toleration matching and taint-manager timing, and the
DefaultTolerationSeconds defaults a policy gets when it does not tolerate them."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from fleetq.capacity import Taint
from fleetq.cluster_health import (
    TAINT_NOT_READY,
    TAINT_UNREACHABLE,
    ClusterCondition,
    TaintSettings,
    cluster_taints,
    eviction_due,
)

T0 = 1_700_000_000.0
DEFAULTS = TaintSettings()


def unreachable(settings: TaintSettings = DEFAULTS) -> tuple[Taint, ...]:
    return cluster_taints(ClusterCondition("Unknown", T0, "cluster-a: unreachable"), settings)


def test_ready_member_has_no_taints() -> None:
    assert cluster_taints(ClusterCondition("True", T0), DEFAULTS) == ()


def test_unknown_is_unreachable_and_false_is_not_ready_both_effects_by_default() -> None:
    got = [(t.key, t.effect, t.time_added) for t in unreachable()]
    assert got == [(TAINT_UNREACHABLE, "NoSchedule", T0), (TAINT_UNREACHABLE, "NoExecute", T0)]
    not_ready = cluster_taints(ClusterCondition("False", T0), DEFAULTS)
    assert {t.key for t in not_ready} == {TAINT_NOT_READY}


def test_without_no_execute_a_member_only_repels_new_work() -> None:
    taints = unreachable(TaintSettings(no_execute=False))
    assert [t.effect for t in taints] == ["NoSchedule"]
    assert eviction_due(taints, [], DEFAULTS) is None


def test_a_policy_without_tolerations_gets_the_default_300s() -> None:
    ev = eviction_due(unreachable(), [], DEFAULTS)
    assert ev is not None and ev.at == T0 + 300
    assert ev.message == (
        "taint cluster.karmada.io/unreachable:NoExecute outlasted tolerationSeconds 300"
    )


def test_the_policys_own_toleration_replaces_the_default() -> None:
    tol = [{"key": TAINT_UNREACHABLE, "operator": "Exists", "effect": "NoExecute",
            "tolerationSeconds": 30}]
    ev = eviction_due(unreachable(), tol, DEFAULTS)
    assert ev is not None and ev.at == T0 + 30


def test_a_toleration_without_seconds_tolerates_for_ever() -> None:
    tol = [{"key": TAINT_UNREACHABLE, "operator": "Exists", "effect": "NoExecute"}]
    assert eviction_due(unreachable(), tol, DEFAULTS) is None
    # an empty effect matches NoExecute too, and also stops the default being added
    assert eviction_due(unreachable(), [{"key": TAINT_UNREACHABLE, "operator": "Exists"}],
                        DEFAULTS) is None


def test_no_matching_toleration_and_no_default_evicts_at_once() -> None:
    settings = TaintSettings(unreachable_toleration_seconds=0)
    ev = eviction_due(unreachable(settings), [], settings)
    assert ev is not None and ev.at == T0


def test_tolerating_only_noschedule_still_gets_the_default() -> None:
    tol = [{"key": TAINT_UNREACHABLE, "operator": "Exists", "effect": "NoSchedule"}]
    ev = eviction_due(unreachable(), tol, DEFAULTS)
    assert ev is not None and ev.at == T0 + 300


def test_fleet_default_of_none_tolerates_for_ever() -> None:
    settings = TaintSettings(unreachable_toleration_seconds=None)
    assert eviction_due(unreachable(settings), [], settings) is None


toleration = st.fixed_dictionaries(
    {"operator": st.sampled_from(["Exists", "Equal"])},
    optional={
        "key": st.sampled_from([TAINT_UNREACHABLE, TAINT_NOT_READY, "other", ""]),
        "effect": st.sampled_from(["NoExecute", "NoSchedule", ""]),
        "tolerationSeconds": st.integers(min_value=-5, max_value=1000),
    },
)


@given(st.lists(toleration, max_size=4), st.integers(min_value=0, max_value=600))
def test_eviction_is_never_before_the_taint_and_never_later_than_any_matching_limit(
    tols: list[dict[str, Any]], default: int
) -> None:
    settings = TaintSettings(unreachable_toleration_seconds=default)
    taints = unreachable(settings)
    ev = eviction_due(taints, tols, settings)
    noexec = Taint(TAINT_UNREACHABLE, "", "NoExecute")
    from fleetq.placement import tolerates

    matching = [t for t in tols if tolerates(t, noexec)]
    limits = [max(0, t["tolerationSeconds"]) for t in matching if "tolerationSeconds" in t]
    own_noexec = any(t.get("key") == TAINT_UNREACHABLE and t.get("effect", "") in ("", "NoExecute")
                     for t in matching)
    if not own_noexec:
        limits.append(default)
    if not limits:
        assert ev is None
    else:
        assert ev is not None and ev.at == T0 + min(limits)
        assert ev.at >= T0
