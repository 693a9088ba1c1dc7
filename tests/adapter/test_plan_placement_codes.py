"""plan_placement on live members: every rejection carries its code beside the message
users read, the members the policy rules out included (metrics count by these codes),
and the verdict says whether waiting can help (``never``: no member can ever hold it)."""

from __future__ import annotations

from activities.fleet import Fleet
from activities.scheduling import SchedulingActivities
from fleetq.messages import GangShape, PlacementInput
from fleetq.models import Gang, GangPod
from fleetq.rejection import RejectionCode

CPU = "cpu"


def test_rejections_carry_codes_for_capacity_eviction_and_affinity(
    fleet: Fleet, names: dict[str, str]
) -> None:
    acts = SchedulingActivities(None, fleet)
    huge = GangShape.from_gang(Gang((GangPod("master", 0, {CPU: 10**9 * 1000}),), 0))
    members = list(fleet.clusters)

    verdict = acts.plan_placement(PlacementInput(job_ref="t/huge", gang=huge))
    assert verdict.candidates == []
    assert sorted(r.cluster for r in verdict.rejections) == sorted(members)  # one each
    assert set(verdict.codes().values()) == {RejectionCode.INSUFFICIENT_CLUSTER_RESOURCE}
    assert all(r.startswith("needs cpu 1000000000 in total")
               for r in verdict.messages().values())
    # "never", not "not now": no live member's largest node could ever hold it
    assert not verdict.ever_fits
    assert verdict.never.startswith(
        "no member can ever hold master-0 (cpu 1000000000): the largest eligible node has "
    )
    tiny = GangShape.from_gang(Gang((GangPod("master", 0, {CPU: 1}),), 0))
    fits = acts.plan_placement(PlacementInput(job_ref="t/tiny", gang=tiny))
    assert fits.candidates and fits.ever_fits and fits.never == ""

    a, b = names["a"], names["b"]
    ruled_out = acts.plan_placement(
        PlacementInput(
            job_ref="t/huge", gang=huge, exclude=[a], affinity={"clusterNames": [a, b]}
        )
    )
    assert ruled_out.codes()[a] is RejectionCode.EVICTED
    # worded as the placement rule words it (one scope filter: placement.filters)
    assert ruled_out.messages()[a] == "excluded (evicted)"
    for other in set(members) - {a, b}:
        assert ruled_out.codes()[other] is RejectionCode.AFFINITY_MISMATCH
        assert ruled_out.messages()[other] == "not in clusterAffinity.clusterNames"
        assert f"{other}: not in clusterAffinity.clusterNames" in ruled_out.reason()
    if b != a:
        assert ruled_out.codes()[b] is RejectionCode.INSUFFICIENT_CLUSTER_RESOURCE
