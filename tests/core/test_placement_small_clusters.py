"""Clusters of at most ``_EXACT_NODES`` nodes build their columnar view node by node
(cheaper there than numpy's per-call overhead): the view and every placement decision
are the same as the vectorised build's."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetq import placement
from fleetq.capacity import ClusterSnapshot
from fleetq.models import Gang
from fleetq.placement import columns
from tests.core.test_placement_properties import assert_same_columns, gangs, unordered_nodes


@settings(max_examples=150, deadline=None)
@given(gang=gangs(), data=st.data())
def test_small_clusters_built_node_by_node_equal_the_vectorised_build(
    gang: Gang, data: st.DataObject
) -> None:
    n = data.draw(st.integers(1, columns._EXACT_NODES))
    snap = ClusterSnapshot("small", nodes=[data.draw(unordered_nodes(i)) for i in range(n)])
    exact = placement.ClusterColumns(snap)
    assert exact.raw is None  # (built node by node)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(columns, "_EXACT_NODES", 0)
        vectorised = placement.ClusterColumns(snap)
        decided = placement.place_gang(gang, [snap])
    if vectorised.raw is not None:  # (None: quantities past 2**53, built node by node)
        vectorised.raw = None
    assert_same_columns(exact, vectorised)
    assert placement.place_gang(gang, [snap]) == decided
