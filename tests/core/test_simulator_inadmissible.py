"""``fleetq sim replay`` answers "would this tree stall?" for impossible jobs (issue 24):
a job whose gang minimum exceeds a ``max`` of its chain is reported inadmissible, by
reason, and the jobs behind it run as if it were not there (Kueue keeps such workloads
out of the heads: kueue pkg/queue/cluster_queue.go, ``inadmissibleWorkloads``)."""

from __future__ import annotations

from fleetq.simulator import parse_trace, simulate
from tests.core.test_simulator import ONE_NODE, by_group, group, tree


def test_an_over_max_job_is_reported_and_blocks_nobody() -> None:
    doc = {
        "topology": ONE_NODE,
        "quota": tree({"cpu": 8}, [{"name": "team", "max": {"cpu": 4},
                                    "namespaces": ["team"]}]),
        "starvationSeconds": 1,
        "jobs": [
            group("huge", requests={"cpu": "6"}),
            group("small", count=5, start=1, interval=1, requests={"cpu": "4"}),
        ],
    }
    s = simulate(parse_trace(doc)).summary(timeline_points=20)
    assert s["inadmissible"] == {
        "jobs": 1, "reasons": [{"reason": "quota team: cpu 6 exceeds max 4", "jobs": 1}]
    }
    assert s["jobs"]["completed"] == 5
    assert s["jobs"]["waitingForQuotaAtEnd"] == 0
    assert by_group(s)["small"]["timeToAdmission"]["max"] == 36.0  # one after the other
    team = next(q for q in s["queues"] if q["node"] == "team")
    assert (team["waitingAtEnd"], team["inadmissibleAtEnd"]) == (0, 1)
