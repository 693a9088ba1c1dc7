"""``describe pytorchjob``'s ``Build:`` line: the worker build Temporal says the job's
workflow is on. The facts are Temporal's own ``DescribeWorkflowExecution`` message
(``temporal.api.workflow.v1.WorkflowExecutionInfo``, SDK 1.35's generated types):
``versioning_info.deployment_version`` (Worker Deployments), the deprecated
``versioning_info.version`` string ``<deployment>.<build>``, a ``versioning_override``
(pinned, auto_upgrade, one_time, and their deprecated forms), a ``version_transition``,
and the older Build-ID versioning's ``assigned_build_id`` /
``most_recent_worker_version_stamp``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from temporalio.api.common.v1 import WorkerVersionStamp
from temporalio.api.deployment.v1 import WorkerDeploymentVersion
from temporalio.api.enums.v1 import VersioningBehavior
from temporalio.api.workflow.v1 import (
    DeploymentVersionTransition,
    VersioningOverride,
    WorkflowExecutionInfo,
    WorkflowExecutionVersioningInfo,
)

from fleetq.cli.describe import build_text, describe_lines
from fleetq.messages import JobView

PINNED = VersioningBehavior.VERSIONING_BEHAVIOR_PINNED
AUTO = VersioningBehavior.VERSIONING_BEHAVIOR_AUTO_UPGRADE


def info(**versioning: Any) -> WorkflowExecutionInfo:
    return WorkflowExecutionInfo(versioning_info=WorkflowExecutionVersioningInfo(**versioning))


def test_a_pinned_workflow_shows_its_deployment_version_and_behavior() -> None:
    version = WorkerDeploymentVersion(deployment_name="fleetq", build_id="0.1.0-g1a2b3c")
    assert build_text(info(behavior=PINNED, deployment_version=version)) == \
        "0.1.0-g1a2b3c (deployment fleetq, Pinned)"
    assert build_text(info(behavior=AUTO, deployment_version=version)) == \
        "0.1.0-g1a2b3c (deployment fleetq, AutoUpgrade)"


def test_a_pinned_override_is_the_build_the_job_is_pinned_to() -> None:
    # message.proto: the override "takes precedence over SDK-sent `behavior` (and
    # `version` when override is PINNED)"; until a task completes on b1, the last one ran
    # on b2 (the deprecated version string)
    pinned_to = WorkerDeploymentVersion(deployment_name="fleetq", build_id="b1")
    override = VersioningOverride(pinned=VersioningOverride.PinnedOverride(version=pinned_to))
    assert build_text(info(behavior=AUTO, version="fleetq.b2", versioning_override=override)) \
        == "b1 (deployment fleetq, Pinned by override; last task on b2)"
    # what `temporal workflow update-options --versioning-override-behavior pinned` left on
    # the dev server (1.32.0) once the next task ran on b2: both the oneof and the
    # deprecated fields set
    both = VersioningOverride(pinned=VersioningOverride.PinnedOverride(
        version=WorkerDeploymentVersion(deployment_name="fleetq", build_id="b2")),
        behavior=PINNED, pinned_version="fleetq.b2")
    b2 = WorkerDeploymentVersion(deployment_name="fleetq", build_id="b2")
    assert build_text(info(behavior=PINNED, deployment_version=b2, version="fleetq.b2",
                           versioning_override=both)) == \
        "b2 (deployment fleetq, Pinned by override)"
    # an older server: only the deprecated pinned_version string
    legacy = VersioningOverride(behavior=PINNED, pinned_version="fleetq.b3")
    assert build_text(info(behavior=PINNED, deployment_version=b2, versioning_override=legacy)) \
        == "b3 (deployment fleetq, Pinned by override; last task on b2)"


def test_an_auto_upgrade_override_and_moves_between_versions() -> None:
    b2 = WorkerDeploymentVersion(deployment_name="fleetq", build_id="b2")
    # update-options --versioning-override-behavior auto_upgrade: the worker said Pinned
    auto = VersioningOverride(auto_upgrade=True)
    assert build_text(info(behavior=PINNED, deployment_version=b2, versioning_override=auto)) \
        == "b2 (deployment fleetq, AutoUpgrade by override)"
    deprecated = VersioningOverride(behavior=AUTO)
    assert build_text(info(behavior=PINNED, deployment_version=b2,
                           versioning_override=deprecated)) \
        == "b2 (deployment fleetq, AutoUpgrade by override)"
    b3 = WorkerDeploymentVersion(deployment_name="fleetq", build_id="b3")
    moving = DeploymentVersionTransition(deployment_version=b3)
    assert build_text(info(behavior=AUTO, deployment_version=b2, version_transition=moving)) \
        == "b2 (deployment fleetq, AutoUpgrade; moving to b3)"
    once = VersioningOverride(one_time=VersioningOverride.OneTimeOverride(
        target_deployment_version=b3))
    assert build_text(info(behavior=PINNED, deployment_version=b2, versioning_override=once)) \
        == "b2 (deployment fleetq, Pinned; one-time move to b3 pending)"


def test_a_build_passed_without_versioning_says_unversioned() -> None:
    # message.proto: a deployment_version with behavior UNSPECIFIED is a worker that is
    # "not using versioning but _is_ passing Deployment Name and Build ID"
    b1 = WorkerDeploymentVersion(deployment_name="fleetq", build_id="b1")
    assert build_text(info(deployment_version=b1)) == "b1 (deployment fleetq, unversioned)"


def test_build_id_versioning_and_an_unversioned_workflow() -> None:
    assert build_text(WorkflowExecutionInfo(assigned_build_id="legacy-7")) == "legacy-7"
    stamp = WorkerVersionStamp(build_id="stamped-3", use_versioning=True)
    assert build_text(WorkflowExecutionInfo(most_recent_worker_version_stamp=stamp)) == \
        "stamped-3"
    assert build_text(WorkflowExecutionInfo()) is None
    # an unversioned worker stamps its tasks with the SDK's build id all the same
    unversioned = WorkerVersionStamp(build_id="aed431dc31427461352c89be3f01e73e")
    assert build_text(WorkflowExecutionInfo(most_recent_worker_version_stamp=unversioned)) \
        is None


def test_describe_prints_a_build_line_only_when_there_is_a_build() -> None:
    view = JobView(namespace="default", name="pytorch-test", state="Running",
                   created_at=datetime(2026, 1, 1, tzinfo=UTC))
    with_build = describe_lines(view, build="0.1.0-g1a2b3c (deployment fleetq, Pinned)")
    assert "Build:        0.1.0-g1a2b3c (deployment fleetq, Pinned)" in with_build
    assert with_build.index(next(x for x in with_build if x.startswith("Build:"))) == \
        with_build.index(next(x for x in with_build if x.startswith("Workflow:"))) + 1
    assert not any(line.startswith("Build:") for line in describe_lines(view))
