"""``fleetq describe pytorchjob NAME``: everything a user asks about one job, in
``kubectl describe``'s layout — what it is, where it runs, why it waits (queue position
and the quota short, or each cluster's placement rejection) and its Events.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from fleetq.cli.context import CliError, get_client, guarded, run
from fleetq.cli.get import pod_rows, resource_kind
from fleetq.cli.output import age, plain_table
from fleetq.naming import job_workflow_id

if TYPE_CHECKING:  # describe imports the client library and the core when it runs
    from temporalio.api.workflow.v1 import WorkflowExecutionInfo
    from temporalio.client import Client

    from fleetq.cli.member_views import MemberSnapshot
    from fleetq.job_view import JobView

EVENT_SOURCE = "fleetq-scheduler"


def _version(deployment: str, build: str, legacy: str = "") -> tuple[str, str]:
    """``(deployment, build)`` of a WorkerDeploymentVersion, else of the deprecated
    ``<deployment>.<build>`` string ``legacy``."""
    if build:
        return deployment, build
    if legacy:
        name, _, bid = legacy.rpartition(".")
        return name, bid
    return "", ""


def build_text(info: WorkflowExecutionInfo) -> str | None:
    """The worker build the job's workflow is on, from Temporal's own description of it
    (``DescribeWorkflowExecution``, ``versioning_info``; temporal/api
    workflow/v1/message.proto): the build it is pinned to and how, e.g.
    ``b2 (deployment fleetq, Pinned by override; last task on b1)``.

    * an override takes precedence over the worker's ``behavior`` (and, Pinned, over its
      ``deployment_version``): ``pinned.version`` (deprecated ``pinned_version``),
      ``auto_upgrade`` (deprecated ``behavior``), or a ``one_time`` move to a version;
    * ``version_transition``: an AutoUpgrade workflow moving to another version;
    * ``deployment_version``, else the deprecated ``version`` string, else the deprecated
      ``deployment``; ``behavior`` UNSPECIFIED with a version is a worker that passes its
      build without versioning (``unversioned``);
    * else the older Build-ID versioning's ``assigned_build_id`` or a stamp with
      ``use_versioning``; None for an unversioned workflow (every SDK stamps its build
      id, with ``use_versioning`` false)."""
    from temporalio.api.enums.v1 import VersioningBehavior

    def behavior_name(value: int) -> str:
        name = VersioningBehavior.Name(value)  # type: ignore[arg-type]
        name = name.removeprefix("VERSIONING_BEHAVIOR_")
        return name.replace("_", " ").title().replace(" ", "")  # AUTO_UPGRADE: AutoUpgrade

    if info.HasField("versioning_info"):
        vi = info.versioning_info
        deployment, build = _version(vi.deployment_version.deployment_name,
                                     vi.deployment_version.build_id, vi.version)
        if not build and vi.HasField("deployment"):
            deployment, build = vi.deployment.series_name, vi.deployment.build_id
        ran_on = build
        behavior = behavior_name(vi.behavior) if vi.behavior else ""
        notes: list[str] = []
        if vi.HasField("versioning_override"):
            deployment, build, behavior = _override(vi.versioning_override, deployment,
                                                    build, behavior, notes)
        if vi.HasField("version_transition"):
            vt = vi.version_transition
            _, moving_to = _version(vt.deployment_version.deployment_name,
                                    vt.deployment_version.build_id, vt.version)
            notes.append(f"moving to {moving_to}" if moving_to
                         else "moving to unversioned workers")
        if ran_on and ran_on != build:
            notes.append(f"last task on {ran_on}")
        if build:
            head = [f"deployment {deployment}"] if deployment else []
            head.append(behavior or "unversioned")
            text = ", ".join(head)
            return f"{build} ({text}; {'; '.join(notes)})" if notes else f"{build} ({text})"
    stamp = info.most_recent_worker_version_stamp  # every SDK stamps its build, versioned or not
    build = info.assigned_build_id or (stamp.build_id if stamp.use_versioning else "")
    return build or None


def _override(override: Any, deployment: str, build: str, behavior: str,
              notes: list[str]) -> tuple[str, str, str]:
    """``(deployment, build, behavior)`` after a ``versioning_override``
    (:func:`build_text`); a pending one-time move is added to ``notes``."""
    from temporalio.api.enums.v1 import VersioningBehavior

    which = override.WhichOneof("override")
    if which == "pinned" or (which is None and override.behavior
                             == VersioningBehavior.VERSIONING_BEHAVIOR_PINNED):
        pin = override.pinned.version
        pinned_deployment, pinned = _version(pin.deployment_name, pin.build_id,
                                             override.pinned_version)
        if not pinned and override.HasField("deployment"):
            pinned_deployment = override.deployment.series_name
            pinned = override.deployment.build_id
        if pinned:
            deployment, build = pinned_deployment or deployment, pinned
        return deployment, build, "Pinned by override"
    if which == "auto_upgrade" or override.behavior:
        return deployment, build, "AutoUpgrade by override"
    if which == "one_time":
        target = override.one_time.target_deployment_version
        notes.append(f"one-time move to {target.build_id} pending")
    return deployment, build, behavior


def describe_lines(view: JobView, waiting: Any | None = None,
                   members: MemberSnapshot | None = None, build: str | None = None) -> list[str]:
    """The text of ``describe pytorchjob`` for one job view; with ``members`` (what the
    member clusters report) its Copies line and Pods section come from the members; with
    ``build`` (:func:`build_text`) a ``Build:`` line."""
    return [*_job_fields(view, build), *_placement_fields(view, members),
            *_queue_fields(view, waiting), *_rejection_lines(view),
            *_pod_lines(view, members), *_event_lines(view)]


def _field(label: str, value: Any) -> str:
    return f"{label + ':':<14}{value}"


def _job_fields(view: JobView, build: str | None) -> list[str]:
    """Name to Deadline: what the job is and its state."""
    out = [_field("Name", view.name), _field("Namespace", view.namespace),
           _field("Kind", "PyTorchJob (kubeflow.org/v1)"),
           _field("Workflow", job_workflow_id(view.namespace, view.name))]
    if build:
        out.append(_field("Build", build))
    if view.summary:
        out.append(_field("Spec", view.summary))
    gang = getattr(view, "gang", None)
    if gang:
        out.append(_field("Gang", gang))
    out += [_field("Priority", view.priority), _field("Policy", view.policy or "<none>"),
            _field("Created",
                   f"{view.created_at.isoformat() if view.created_at else '<unknown>'}"
                   f" ({age(view.created_at)} ago)"),
            _field("State", view.state)]
    if view.reason:
        out.append(_field("Reason", view.reason))
    if view.deadline_at is not None and view.state not in ("Succeeded", "Failed", "Deleted"):
        out.append(_field("Deadline", f"{view.deadline_at.isoformat(timespec='seconds')} "
                                      "(runPolicy.activeDeadlineSeconds)"))
    return out


def _placement_fields(view: JobView, members: MemberSnapshot | None) -> list[str]:
    """Cluster, Copies, Evicted from, Purge pending."""
    from fleetq.cli.member_views import copies_line

    group = f" (group {view.cluster_group})" if view.cluster and view.cluster_group else ""
    out = [_field("Cluster", (view.cluster or "<none>") + group)]
    copies = copies_line(view, members) if members is not None else ", ".join(view.copies)
    if copies:
        out.append(_field("Copies", copies))
    if view.evicted:
        out.append(_field("Evicted from", ", ".join(view.evicted)))
    if view.pending_purges:
        out.append(_field("Purge pending", ", ".join(view.pending_purges)))
    return out


def _queue_fields(view: JobView, waiting: Any | None) -> list[str]:
    """Queue (and Inadmissible or Waiting while it waits)."""
    if not view.queued:
        return [_field("Queue", "<none> (policy does not queue)")]
    if view.queue:
        return [_field("Queue", f"{view.queue} (admitted)")]
    if waiting is not None and waiting.inadmissible is not None:
        return [_field("Queue", f"{waiting.queue} (inadmissible: in no position)"),
                _field("Inadmissible",
                       f"{waiting.reason} (never admitted under the current tree)")]
    if waiting is not None:
        return [_field("Queue", f"{waiting.queue} (position {waiting.position})"),
                _field("Waiting", waiting.reason)]
    return [_field("Queue", "waiting for admission")]


def _rejection_lines(view: JobView) -> list[str]:
    """Placement: why each member was rejected, while the job is not placed."""
    if not view.rejections or view.state not in ("Pending", "Scheduling", "Failed",
                                                 "FailingOver", "Unschedulable"):
        return []
    out = ["Placement:"]
    for cluster, why in sorted(view.rejections.items()):
        text = why if why.startswith(f"{cluster}:") else f"{cluster}: {why}"
        out.append(f"  {text}")
    return out


def _pod_lines(view: JobView, members: MemberSnapshot | None) -> list[str]:
    from fleetq.cli.member_views import member_pod_rows

    if members is not None:
        headers, rows = member_pod_rows([view], members, all_namespaces=False, wide=True,
                                        job=(view.namespace, view.name))
    else:
        headers, rows = pod_rows([view], all_namespaces=False, wide=True)
    if not rows:
        return ["Pods:         <none>"]
    return ["Pods:", *(f"  {line}" for line in plain_table(headers, rows))]


def _event_lines(view: JobView) -> list[str]:
    if not view.events:
        return ["Events:       <none>"]
    rows_e = []
    for e in view.events:
        when = age(e.time)
        if e.count > 1:  # kubectl describe: "<last> (x<count> over <first>)"
            first = f" over {age(e.first_time)}" if e.first_time is not None else ""
            when = f"{when} (x{e.count}{first})"
        rows_e.append([e.type, e.reason, when, EVENT_SOURCE, e.message])
    table = plain_table(["Type", "Reason", "Age", "From", "Message"],
                        [["----", "------", "----", "----", "-------"], *rows_e])
    return ["Events:", *(f"  {line}" for line in table)]


async def describe_job(client: Client, namespace: str, name: str,
                       fleet_config: str | None = None) -> list[str]:
    """``describe pytorchjob``: the job's workflow view, its queue position when it
    waits, and its copies and pods as the member clusters of ``fleet_config`` (default:
    ``FLEETQ_CONFIG`` or the running ``fleetq up``) report them."""
    import asyncio

    from fleetq.cli.member_views import read_members
    from fleetq.client.jobs import require_job, wait_info

    view, members, build = await asyncio.gather(
        require_job(client, namespace, name),
        asyncio.to_thread(read_members, namespace, fleet_config),
        _build(client, namespace, name))
    waiting = None
    if view.state in ("Queued", "Inadmissible") or (view.queued and not view.admitted):
        waiting = await wait_info(client, view)
    return describe_lines(view, waiting, members, build)


async def _build(client: Client, namespace: str, name: str) -> str | None:
    """:func:`build_text` of the job's workflow; None when Temporal cannot describe it
    (``require_job`` reports a missing job)."""
    from temporalio.service import RPCError

    try:
        described = await client.get_workflow_handle(job_workflow_id(namespace, name)).describe()
    except RPCError:
        return None
    return build_text(described.raw_description.workflow_execution_info)


def register(app: typer.Typer) -> None:
    @app.command()
    @guarded
    def describe(
        resource: str = typer.Argument(..., help="pytorchjob"),
        name: str = typer.Argument(..., help="Job name"),
        namespace: str = typer.Option("default", "-n", "--namespace", help="Namespace"),
    ) -> None:
        """Show a PyTorchJob's state, placement, queue position and events."""
        if resource_kind(resource) != "pytorchjob":
            raise CliError("error: fleetq describe supports pytorchjob only "
                           "(use fleetq get <kind> -o yaml for the others)")

        async def body() -> list[str]:
            client = await get_client()
            return await describe_job(client, namespace, name)

        for line in run(body):
            typer.echo(line)
