"""The ``bind`` activity with the copy's first watch (``BindInput.watch``): one activity
makes the copy and waits out the settle window after it, so a job's history carries no
separate watch and no workflow task between the two (issue 28 item 3). Read on the
member itself, on both kinds of member.

The first watch wakes on a phase or health change only (``lifecycle.FIRST_WATCH_SINCE``):
the training-operator turns a PyTorchJob ``Running`` once its master pod runs
(kubeflow/training-operator v1.9.4 pkg/controller.v1/pytorch/pytorchjob_controller.go,
``UpdateJobStatus``), and that is the change the bind answers with.
"""

from __future__ import annotations

from collections.abc import Callable

from temporalio.testing import ActivityEnvironment

from activities.fleet import Fleet
from activities.scheduling import SchedulingActivities
from fleetq import lifecycle
from fleetq.messages import BindInput, BindRequest, FirstWatch, JobRef

from .conftest import eventually, manifest, member


def first_watch(seconds: float) -> FirstWatch:
    return FirstWatch(since=lifecycle.FIRST_WATCH_SINCE, timeout_seconds=seconds)


def test_the_bind_answers_with_the_copys_first_change(
    fleet: Fleet, names: dict[str, str], job_factory: Callable[..., JobRef]
) -> None:
    """The copy is made and the bind returns once the member reports it Running: the
    status it answers with is the member's."""
    a = names["a"]
    acts = SchedulingActivities(None, fleet)
    job = job_factory("first")
    inp = BindInput(cluster=a, request=BindRequest(job=job, manifest=manifest(job),
                                                     run_seconds=120),
                    watch=first_watch(120))
    result = ActivityEnvironment().run(acts.bind, inp)
    assert result.created and result.status is not None
    assert result.status.cluster == a and result.status.phase == "Running"
    assert result.status.observed != lifecycle.FIRST_WATCH_SINCE
    on_member = member(fleet, a).status(job)
    assert on_member.phase == "Running" and on_member.health == "Healthy"


def test_a_bind_without_a_watch_returns_once_bound(
    fleet: Fleet, names: dict[str, str], job_factory: Callable[..., JobRef]
) -> None:
    """No ``watch``: the answer carries no status (the job's own watch reads the copy),
    and the copy is on the member."""
    a = names["a"]
    acts = SchedulingActivities(None, fleet)
    job = job_factory("nowatch")
    result = ActivityEnvironment().run(acts.bind, BindInput(
        cluster=a, request=BindRequest(job=job, manifest=manifest(job), run_seconds=60)))
    assert result.created and result.status is None
    assert member(fleet, a).status(job).phase != "Missing"


def test_a_worker_shutting_down_cuts_the_watch_short_but_not_the_bind(
    fleet: Fleet, names: dict[str, str], job_factory: Callable[..., JobRef]
) -> None:
    """The worker shuts down while the bind's first watch waits (its pods cannot schedule:
    a nodeSelector no node has, so the copy stays Created): the bind still answers, with
    the copy made and no status, so the job records the bind instead of binding again
    elsewhere; the job's own watch reads the copy next."""
    a = names["a"]
    acts = SchedulingActivities(None, fleet)
    job = job_factory("shutdown")
    body = manifest(job, extra_spec={"nodeSelector": {"fleetq.io/test-no-such-node": "x"}})
    env = ActivityEnvironment()
    env.worker_shutdown()
    result = env.run(acts.bind, BindInput(
        cluster=a,
        # reserved: the room is not re-checked (it could never fit), the copy is made
        request=BindRequest(job=job, manifest=body, run_seconds=60, reserved=True),
        watch=first_watch(120)))
    assert result.created and result.status is None
    m = member(fleet, a)
    assert eventually(lambda: m.status(job).phase == "Created", timeout_s=20)
