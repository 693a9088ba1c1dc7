"""``describe pytorchjob`` shows an aggregated event as kubectl does: kubectl's
DescribeEvents (staging/src/k8s.io/kubectl/pkg/describe/describe.go) prints
``<age of last> (x<count> over <age of first>)`` for an event counted more than once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fleetq import lifecycle
from fleetq.cli.describe import describe_lines
from fleetq.lifecycle import Reason
from fleetq.messages import JobView


def test_a_repeated_failed_scheduling_reads_x7_over_21m() -> None:
    now = datetime.now(UTC)
    view = JobView(namespace="default", name="big", state="Pending", queued=True)
    for i in range(7):
        at = now - timedelta(minutes=21) + timedelta(minutes=i * 3)
        lifecycle.record_event(view, "Warning", Reason.FAILED_SCHEDULING, "no room", at)
        lifecycle.record_event(view, "Normal", Reason.QUEUED, "other", at)
    (line,) = [row for row in describe_lines(view) if "FailedScheduling" in row]
    assert "3m (x7 over 21m)" in line
    assert line.rstrip().endswith("no room")


def test_an_unschedulable_job_shows_each_members_rejection() -> None:
    view = JobView(namespace="default", name="big", state="Unschedulable",
                   reason="no member can ever hold master-0 (cpu 40): the largest eligible "
                          "node has 32; holds no quota, placed again when a member's nodes "
                          "change",
                   rejections={"cluster-a": "master-0 needs cpu 40, largest free node has 2"})
    lines = describe_lines(view)
    assert "Placement:" in lines
    assert "  cluster-a: master-0 needs cpu 40, largest free node has 2" in lines
