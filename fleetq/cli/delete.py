"""``fleetq delete``: remove jobs, policies, PriorityClasses and the quota tree.

Deleting a job cancels its workflow, which purges every member copy and returns its
quota; like ``kubectl delete`` (``--wait`` by default) the command returns once that is
done. Policies and PriorityClasses leave the registry. The ElasticQuotaTree is refused
while any job holds or waits for its quota (delete those jobs first); otherwise it leaves
the registry and its quota workflow is stopped. The work is the client library's
(:mod:`fleetq.client`); this command prints kubectl's lines.
"""

from __future__ import annotations

import typer

from fleetq.cli.context import CliError, get_client, guarded, run
from fleetq.cli.get import resource_kind
from fleetq.client.errors import ClientError

#: what ``delete`` accepts (after alias resolution) and the registry kind it names
KINDS = {
    "pytorchjob": "PyTorchJob",
    "propagationpolicy": "PropagationPolicy",
    "clusterpropagationpolicy": "ClusterPropagationPolicy",
    "priorityclass": "PriorityClass",
    "elasticquotatree": "ElasticQuotaTree",
}


def deleted_line(kind: str, name: str) -> str:
    from fleetq.client.apply import RESOURCE_NAMES

    return f'{RESOURCE_NAMES[kind]} "{name}" deleted'


def _print(done: list[str], errors: list[str]) -> None:
    for line in done:
        typer.echo(line)
    for line in errors:
        typer.echo(line, err=True)
    if errors:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    @app.command()
    @guarded
    def delete(
        resource: str | None = typer.Argument(None, help="pytorchjob | propagationpolicy | "
                                                         "clusterpropagationpolicy | "
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
            _delete_files(files, wait=wait, timeout=timeout)
            return
        if not resource or not names:
            raise CliError("error: you must specify the type and name of the object to delete, "
                           "or -f FILE (e.g. fleetq delete pytorchjob pytorch-test)")
        _delete_named(resource, names, namespace, wait=wait, timeout=timeout)


def _delete_files(files: list[str], *, wait: bool, timeout: float) -> None:
    """``delete -f FILE...``: the objects of the manifests."""
    from fleetq.client.apply import delete_objects, load_for_apply

    objects, _, _ = load_for_apply(files)

    async def body() -> tuple[list[tuple[str, str]], list[str]]:
        client = await get_client()
        return await delete_objects(client, objects, wait=wait, timeout=timeout)

    deleted, errors = run(body)
    _print([deleted_line(k, n) for k, n in deleted], errors)


def _delete_named(resource: str, names: list[str], namespace: str, *, wait: bool,
                  timeout: float) -> None:
    """``delete KIND NAME...``."""
    from fleetq.client.apply import delete_object
    from fleetq.client.registry import get_registry

    kind = KINDS.get(resource_kind(resource))
    if kind is None:
        raise CliError(f"error: fleetq cannot delete {resource}")
    tree_ns = "kube-system" if kind == "ElasticQuotaTree" else namespace

    async def body() -> tuple[list[str], list[str]]:
        client = await get_client()
        if kind != "PyTorchJob":
            await get_registry(client)  # surfaces a missing fleet as one line
        out, errs = [], []
        for n in names:
            try:
                await delete_object(client, kind, tree_ns, n, wait=wait, timeout=timeout)
                out.append(deleted_line(kind, n))
            except ClientError as exc:
                errs.append(exc.message)
        return out, errs

    _print(*run(body))
