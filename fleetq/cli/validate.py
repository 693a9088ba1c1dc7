"""``fleetq validate``: check manifests offline, before anything reaches the fleet.

Prints ``OK <Kind> <ns>/<name>`` for every valid object, ``warning: ...`` for each field
upstream defines that fleetq accepts without using, and one line per problem; exits 1
when there is any problem (0 otherwise; warnings do not fail). Output is plain text when it is not a
terminal; on a terminal, OK lines are green and problems red.
When a fleet is reachable, a PyTorchJob its current tree can never admit gets one
``warning:`` line too (:mod:`fleetq.client.admissibility`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from fleetq.models import FleetObject


def _ref(obj: FleetObject) -> str:
    if obj.kind in ("PriorityClass", "ClusterPropagationPolicy"):  # cluster-scoped
        return f"{obj.kind} {obj.metadata.name}"
    return f"{obj.kind} {obj.metadata.namespace}/{obj.metadata.name}"


def _fleet_known() -> bool:
    """A fleet is named (``TEMPORAL_ADDRESS``/``TEMPORAL_PROFILE``, or a running ``fleetq
    up``'s fleetq.json): only then does validate ask it, so an offline validate never
    loads the Temporal client."""
    import os

    from fleetq.runtime.fleet_info import read_info

    named = os.environ.get("TEMPORAL_ADDRESS") or os.environ.get("TEMPORAL_PROFILE")
    return bool(named) or read_info() is not None


async def _fleet_warnings(objects: list[FleetObject]) -> list[str]:
    """Inadmissible-job warnings from the fleet, when one is reachable (else none)."""
    import asyncio

    from fleetq.cli.context import get_client
    from fleetq.client.admissibility import inadmissible_warnings

    try:
        client = await asyncio.wait_for(get_client(), timeout=5)
        return await asyncio.wait_for(inadmissible_warnings(client, objects), timeout=10)
    except Exception:  # no fleet: validate stays an offline check
        return []


def register(app: typer.Typer) -> None:
    @app.command()
    def validate(
        files: list[str] = typer.Option(
            ...,
            "-f",
            "--filename",
            help="Manifest file, directory (read recursively) or - for stdin. Repeatable.",
        ),
    ) -> None:
        """Validate manifests (ElasticQuotaTree, PropagationPolicy, PyTorchJob,
        PriorityClass) without contacting any cluster; warn of jobs the running
        fleet's quota tree would never admit."""
        from fleetq.manifests import load_manifests

        try:
            result = load_manifests(files)
        except Exception as exc:  # a bug of ours must still not print a traceback
            typer.secho(f"internal error while validating: {exc!r}", fg="red", err=True)
            raise typer.Exit(1) from None
        for _, obj in result.objects:
            typer.secho(f"OK {_ref(obj)}", fg="green")
        for note in result.notes:
            typer.secho(f"note: {note}", fg="yellow")
        for line in result.warnings:
            typer.secho(f"warning: {line}", fg="yellow")
        if any(obj.kind == "PyTorchJob" for _, obj in result.objects) and _fleet_known():
            objects = [obj for _, obj in result.objects]
            import asyncio

            for line in asyncio.run(_fleet_warnings(objects)):
                typer.secho(line, fg="yellow")
        for line in result.errors:
            typer.secho(line, fg="red")
        if result.errors:
            raise typer.Exit(1)
