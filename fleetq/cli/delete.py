"""``fleetq delete``: remove jobs, policies, PriorityClasses and the quota tree.

Deleting a job cancels its workflow, which purges every member copy and returns its
quota; like ``kubectl delete`` (``--wait`` by default) the command returns once that is
done. Policies and PriorityClasses leave the registry. The ElasticQuotaTree is refused
while any job holds or waits for its quota (delete those jobs first); otherwise it leaves
the registry and its quota workflow is stopped.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import typer
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from fleetq.cli.apply import RESOURCE_NAMES, load_for_apply, registry
from fleetq.cli.context import CliError, get_client, guarded, not_found, run
from fleetq.cli.get import JOB_RESOURCE, existing_job, get_registry, quota_view, resource_kind
from fleetq.models import FleetObject
from fleetq.naming import quota_workflow_id

PLURALS = {
    "pytorchjob": (JOB_RESOURCE, "PyTorchJob"),
    "propagationpolicy": ("propagationpolicies.policy.one.alibabacloud.com", "PropagationPolicy"),
    "priorityclass": ("priorityclasses.scheduling.k8s.io", "PriorityClass"),
    "elasticquotatree": ("elasticquotatrees.scheduling.sigs.k8s.io", "ElasticQuotaTree"),
}


def deleted_line(kind: str, name: str) -> str:
    return f'{RESOURCE_NAMES[kind]} "{name}" deleted'


async def delete_job(client: Client, namespace: str, name: str, *, wait: bool,
                     timeout: float) -> str:
    handle, status = await existing_job(client, namespace, name)
    if status != WorkflowExecutionStatus.RUNNING:
        # A finished job: forget it, as deleting a completed Kubernetes object does.
        return deleted_line("PyTorchJob", name)
    await handle.cancel()
    if wait:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            desc = await handle.describe()
            if desc.status != WorkflowExecutionStatus.RUNNING:
                break
            await asyncio.sleep(0.2)
        else:
            raise CliError(f"error: timed out after {timeout:g}s waiting for PyTorchJob "
                           f"{namespace}/{name} to purge its member copies (it continues "
                           "in the background)")
    return deleted_line("PyTorchJob", name)


async def delete_registry_object(client: Client, kind: str, namespace: str,
                                 name: str) -> str:
    from workflows.fleet_registry import DeleteRequest

    if kind == "ElasticQuotaTree":
        found = await quota_view(client)
        if found is not None and found[0] == f"{namespace}/{name}":
            view = found[1]
            if view.holders or view.waiting:
                raise CliError(
                    f"error: ElasticQuotaTree {namespace}/{name}: {view.holders} job(s) hold "
                    f"quota and {view.waiting} wait in its queues; delete those PyTorchJobs "
                    "first")
    handle = await registry(client)
    removed: bool = await handle.execute_update(
        "delete", DeleteRequest(kind=kind, namespace=namespace, name=name), result_type=bool)
    if not removed:
        raise not_found(PLURALS[kind.lower()][0], name)
    if kind == "ElasticQuotaTree":
        quota = client.get_workflow_handle(quota_workflow_id(namespace, name))
        try:
            await quota.signal("stop")
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise
    return deleted_line(kind, name)


async def delete_objects(client: Client, objects: list[tuple[FleetObject, dict[str, Any]]],
                         *, wait: bool, timeout: float) -> tuple[list[str], list[str]]:
    """``delete -f``: jobs first, then policies and classes, the tree last."""
    order = {"PyTorchJob": 0, "PropagationPolicy": 1, "PriorityClass": 2, "ElasticQuotaTree": 3}
    done: list[str] = []
    errors: list[str] = []
    for obj, _ in sorted(objects, key=lambda o: order.get(o[0].kind, 9)):
        ns = getattr(obj.metadata, "namespace", None) or "default"
        try:
            if obj.kind == "PyTorchJob":
                done.append(await delete_job(client, ns, obj.metadata.name, wait=wait,
                                             timeout=timeout))
            else:
                done.append(await delete_registry_object(client, obj.kind, ns,
                                                         obj.metadata.name))
        except CliError as exc:
            errors.append(exc.message)
    return done, errors


def register(app: typer.Typer) -> None:
    @app.command()
    @guarded
    def delete(
        resource: str | None = typer.Argument(None, help="pytorchjob | propagationpolicy | "
                                                         "priorityclass | elasticquotatree"),
        names: list[str] | None = typer.Argument(None, help="Object names"),
        files: list[str] | None = typer.Option(None, "-f", "--filename",
                                               help="Delete the objects in these manifests"),
        namespace: str = typer.Option("default", "-n", "--namespace", help="Namespace"),
        wait: bool = typer.Option(True, "--wait/--no-wait",
                                  help="Wait until member copies are purged"),
        timeout: float = typer.Option(60.0, "--timeout", help="Seconds to wait"),
    ) -> None:
        """Delete PyTorchJobs (purging member copies), policies, classes or the tree."""
        if files:
            if resource:
                raise CliError("error: names cannot be provided when a path is specified")
            objects, _, _ = load_for_apply(files)

            async def body_f() -> tuple[list[str], list[str]]:
                client = await get_client()
                return await delete_objects(client, objects, wait=wait, timeout=timeout)

            done, errors = run(body_f)
            for line in done:
                typer.echo(line)
            for line in errors:
                typer.echo(line, err=True)
            if errors:
                raise typer.Exit(1)
            return
        if not resource or not names:
            raise CliError("error: you must specify the type and name of the object to delete, "
                           "or -f FILE (e.g. fleetq delete pytorchjob pytorch-test)")
        kind = resource_kind(resource)
        if kind not in PLURALS:
            raise CliError(f"error: fleetq cannot delete {resource}")
        tree_ns = "kube-system" if kind == "elasticquotatree" else namespace

        async def body() -> tuple[list[str], list[str]]:
            client = await get_client()
            if kind != "pytorchjob":
                await get_registry(client)  # surfaces a missing fleet as one line
            out, errs = [], []
            for n in names or []:
                try:
                    if kind == "pytorchjob":
                        out.append(await delete_job(client, namespace, n, wait=wait,
                                                    timeout=timeout))
                    else:
                        out.append(await delete_registry_object(
                            client, PLURALS[kind][1], tree_ns, n))
                except CliError as exc:
                    errs.append(exc.message)
            return out, errs

        done, errors = run(body)
        for line in done:
            typer.echo(line)
        for line in errors:
            typer.echo(line, err=True)
        if errors:
            raise typer.Exit(1)

