"""The history a small job costs (issue 28 item 3): every event is stored, replayed on each
cache miss and counted against the history limit, so the events of a job that is queued,
admitted at once, runs and succeeds are pinned here. A change that adds events to the
common path fails this test and must say why (BENCHMARKS.md, events per job)."""

from __future__ import annotations

from collections import Counter

from temporalio.api.enums.v1 import EventType

from fleetq.messages import JobView
from tests.workflows.fakes import load, policy, walkthrough_job
from tests.workflows.test_e2e import Stack, stack  # noqa: F401  (the module's real stack)

#: events of a small queued job from submit to Succeeded (was 41: a 600 s pods-ready
#: timer started beside the first watch and cancelled when its pods ran; 39: reserve and
#: bind were two activities, one workflow task apart; 33: the grant came as an
#: ``admitted`` signal and woke the job in a workflow task of its own; 29: the first
#: watch after the bind was an activity of its own, one workflow task after the bind)
SMALL_JOB_EVENTS = 23


async def test_a_small_queued_job_costs_a_pinned_number_of_history_events(
    stack: Stack,  # noqa: F811
) -> None:
    await stack.apply(load("elasticquotatree.yaml"), policy(queued=True))
    handle = await stack.start(walkthrough_job("budget-0"), run_seconds=2)
    view = JobView.model_validate(await handle.result())
    assert view.state == "Succeeded" and view.admitted
    events = (await handle.fetch_history()).events
    kinds = Counter(EventType.Name(e.event_type).removeprefix("EVENT_TYPE_") for e in events)
    assert len(events) == SMALL_JOB_EVENTS, sorted(kinds.items())
    # no timer is started for a deadline the watch returns before (job_machine.arms_timer)
    assert kinds["TIMER_STARTED"] == 0 and kinds["TIMER_CANCELED"] == 0
    # admitted at once: the grant came in the enqueue's answer (the quota workflow's
    # ``submit`` reply), so no ``admitted`` signal and no task to take it
    assert kinds["WORKFLOW_EXECUTION_SIGNALED"] == 0
    # two activities: the bind with the copy's first watch (its settle window), and the
    # watch that sees it end
    scheduled = [e.activity_task_scheduled_event_attributes.activity_type.name
                 for e in events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]
    assert scheduled == ["bind", "watch_status"]
    # one upsert per lasting state (Running, Succeeded)
    assert kinds["UPSERT_WORKFLOW_SEARCH_ATTRIBUTES"] == 2
