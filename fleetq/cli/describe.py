"""``fleetq describe pytorchjob NAME``: everything a user asks about one job, in
``kubectl describe``'s layout — what it is, where it runs, why it waits (queue position
and the quota short, or each cluster's placement rejection) and its Events.
"""

from __future__ import annotations

from typing import Any

import typer
from temporalio.client import Client
from temporalio.service import RPCError

from fleetq.cli.context import CliError, get_client, guarded, run
from fleetq.cli.get import (
    QUERY_TIMEOUT,
    get_registry,
    pod_rows,
    require_job,
    resource_kind,
)
from fleetq.cli.output import age, plain_table
from fleetq.messages import JobView
from fleetq.naming import job_workflow_id, tree_workflow_id

EVENT_SOURCE = "fleetq-scheduler"


async def wait_info(client: Client, view: JobView) -> Any | None:
    """The quota workflow's ``wait_info`` for a queued job (position and reason)."""
    from fleetq.admission import WaitInfo

    reg = await get_registry(client)
    if reg is None or reg.tree is None:
        return None
    handle = client.get_workflow_handle(tree_workflow_id(reg.tree))
    try:
        return await handle.query("wait_info", job_workflow_id(view.namespace, view.name),
                                  result_type=WaitInfo, rpc_timeout=QUERY_TIMEOUT)
    except (RPCError, Exception):
        return None


def describe_lines(view: JobView, waiting: Any | None = None) -> list[str]:
    """The text of ``describe pytorchjob`` for one job view."""
    out: list[str] = []

    def field(label: str, value: Any) -> None:
        out.append(f"{label + ':':<14}{value}")

    field("Name", view.name)
    field("Namespace", view.namespace)
    field("Kind", "PyTorchJob (kubeflow.org/v1)")
    field("Workflow", job_workflow_id(view.namespace, view.name))
    if view.summary:
        field("Spec", view.summary)
    field("Priority", view.priority)
    field("Policy", view.policy or "<none>")
    field("Created", f"{view.created_at.isoformat() if view.created_at else '<unknown>'}"
                     f" ({age(view.created_at)} ago)")
    field("State", view.state)
    if view.reason:
        field("Reason", view.reason)
    field("Cluster", view.cluster or "<none>")
    if view.copies:
        field("Copies", ", ".join(view.copies))
    if view.evicted:
        field("Evicted from", ", ".join(view.evicted))
    if view.pending_purges:
        field("Purge pending", ", ".join(view.pending_purges))
    if view.queued:
        if view.queue:
            field("Queue", f"{view.queue} (admitted)")
        elif waiting is not None:
            field("Queue", f"{waiting.queue} (position {waiting.position})")
            field("Waiting", waiting.reason)
        else:
            field("Queue", "waiting for admission")
    else:
        field("Queue", "<none> (policy does not queue)")
    if view.rejections and view.state in ("Pending", "Scheduling", "Failed", "FailingOver"):
        out.append("Placement:")
        for cluster, why in sorted(view.rejections.items()):
            text = why if why.startswith(f"{cluster}:") else f"{cluster}: {why}"
            out.append(f"  {text}")
    headers, rows = pod_rows([view], all_namespaces=False, wide=True)
    out.append("Pods:" if rows else "Pods:         <none>")
    if rows:
        out.extend(f"  {line}" for line in plain_table(headers, rows))
    if view.events:
        out.append("Events:")
        rows_e = []
        for e in view.events:
            when = age(e.time)
            if e.count > 1:
                when = f"{when} (x{e.count})"
            rows_e.append([e.type, e.reason, when, EVENT_SOURCE, e.message])
        table = plain_table(["Type", "Reason", "Age", "From", "Message"],
                            [["----", "------", "----", "----", "-------"], *rows_e])
        out.extend(f"  {line}" for line in table)
    else:
        out.append("Events:       <none>")
    return out


async def describe_job(client: Client, namespace: str, name: str) -> list[str]:
    view = await require_job(client, namespace, name)
    waiting = None
    if view.state == "Queued" or (view.queued and not view.admitted):
        waiting = await wait_info(client, view)
    return describe_lines(view, waiting)


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
