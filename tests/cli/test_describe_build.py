"""``describe pytorchjob``'s ``Build:`` line: the worker build Temporal says the job's
workflow is on. The facts are Temporal's own ``DescribeWorkflowExecution`` message
(``temporal.api.workflow.v1.WorkflowExecutionInfo``, SDK 1.35's generated types):
``versioning_info.deployment_version`` (Worker Deployments), the deprecated
``versioning_info.version`` string ``<deployment>.<build>``, a ``versioning_override``,
and the older Build-ID versioning's ``assigned_build_id`` /
``most_recent_worker_version_stamp``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from temporalio.api.common.v1 import WorkerVersionStamp
from temporalio.api.deployment.v1 import WorkerDeploymentVersion
from temporalio.api.enums.v1 import VersioningBehavior
from temporalio.api.workflow.v1 import (
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


def test_the_deprecated_version_string_and_an_override_are_read() -> None:
    pinned_to = WorkerDeploymentVersion(deployment_name="fleetq", build_id="b1")
    override = VersioningOverride(pinned=VersioningOverride.PinnedOverride(version=pinned_to))
    assert build_text(info(behavior=AUTO, version="fleetq.b2", versioning_override=override)) \
        == "b2 (deployment fleetq, AutoUpgrade, override: pinned to b1)"


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
