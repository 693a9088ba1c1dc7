"""``fleetq validate``: check manifests offline, before anything reaches the fleet.

Prints ``OK <Kind> <ns>/<name>`` for every valid object, ``warning: ...`` for each field
upstream defines that fleetq accepts without using, and one line per problem; exits 1
when there is any problem (0 otherwise; warnings do not fail). Output is plain text when it is not a
terminal; on a terminal, OK lines are green and problems red.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from fleetq.models import FleetObject


def _ref(obj: FleetObject) -> str:
    if obj.kind == "PriorityClass":
        return f"{obj.kind} {obj.metadata.name}"
    return f"{obj.kind} {obj.metadata.namespace}/{obj.metadata.name}"


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
        PriorityClass) without contacting any cluster."""
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
        for line in result.errors:
            typer.secho(line, fg="red")
        if result.errors:
            raise typer.Exit(1)
