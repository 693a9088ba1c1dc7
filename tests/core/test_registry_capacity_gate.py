"""Capacity preemption is planned only for a job of the tree the fleet registry holds,
and only once that tree's ``fleetq.io/preemption: LowerPriority`` has been on for
longer than the oldest registry snapshot a placement decides by (so every placement that
could take the claimed room reads the claims first)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fleetq.preemption import PREEMPTION_ANNOTATION
from fleetq.registry import RegistryState, preempts_for_capacity

NOW = datetime(2026, 12, 6, 10, 0, tzinfo=UTC)
TREE_ID = "quota/kube-system/t"


def state(
    mode: str | None, on_for: float | None, tree: str | None = "kube-system/t"
) -> RegistryState:
    return RegistryState(
        tree=tree,
        tree_annotations={PREEMPTION_ANNOTATION: mode} if mode else {},
        preemption_changed=None if on_for is None else NOW - timedelta(seconds=on_for),
    )


def test_on_for_longer_than_the_snapshot_age_for_the_registrys_tree() -> None:
    assert preempts_for_capacity(state("LowerPriority", 5.0), TREE_ID, NOW, 1.0)


def test_off_when_never_just_switched_on_or_another_tree() -> None:
    assert not preempts_for_capacity(state("Never", 5.0), TREE_ID, NOW, 1.0)
    assert not preempts_for_capacity(state(None, None), TREE_ID, NOW, 1.0)
    assert not preempts_for_capacity(state("LowerPriority", 0.5), TREE_ID, NOW, 1.0)
    assert not preempts_for_capacity(state("LowerPriority", 5.0), "quota/kube-system/other",
                                     NOW, 1.0)
    assert not preempts_for_capacity(state("LowerPriority", 5.0, tree=None), TREE_ID, NOW, 1.0)
